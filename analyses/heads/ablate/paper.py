"""Michel, Levy, Neubig (2019), "Are Sixteen Heads Really Better than One?", on ablating heads, as
`bertscope heads ablate`'s section quotes it."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, MICHEL, Number, Source

# ablation of BERT on MultiNLI; ../shared/papers/michel2019-niven2019-definitions.txt (the findings as stated there;
# the per-head tables are not in the shared notes, so no per-layer numbers are quoted)
MICHEL_ABLATION = Source(MICHEL, "section 3 (ablating one head; all heads but one)", BERT_BASE, "MultiNLI, fine-tuned")
MICHEL_ABLATION_NUMBERS = {
    "single_head_change": Number(0.5, MICHEL_ABLATION),  # points: "for most heads, accuracy changes by < ~0.5"
}
MICHEL_ABLATION_TEXT = {
    "single": "masking one head changes accuracy by less than about half a point for most heads; a few heads matter",
    "but_one": "with all heads of a layer but one masked, a single head is enough in most layers at test time",
}
