"""Michel, Levy, Neubig (2019), "Are Sixteen Heads Really Better than One?", on head importance, as
`bertscope heads importance`'s section quotes it (../shared/papers/michel2019-niven2019-definitions.txt,
slides-clark-kovaleva-michel-niven.txt; bert-base fine-tuned on MultiNLI)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, MICHEL, Source

MICHEL_IMPORTANCE = Source(MICHEL, "section 4 (head importance score)", BERT_BASE, "MultiNLI, fine-tuned")
MICHEL_IMPORTANCE_TEXT = ("important heads tend to be the same across data sets: heads with the largest effect on one "
                          "domain tend to have it on the other (their test: ablation effects, MNLI matched vs "
                          "mismatched, WMT vs MTNT)")
