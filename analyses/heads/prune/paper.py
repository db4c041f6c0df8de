"""Michel, Levy, Neubig (2019), "Are Sixteen Heads Really Better than One?", on iterative and real
pruning, as `bertscope heads prune`'s section and bench/bench_prune.py quote it
(../shared/papers/michel2019-niven2019-definitions.txt, slides-clark-kovaleva-michel-niven.txt;
bert-base fine-tuned on MultiNLI)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, MICHEL, Number, Source

MICHEL_PRUNING = Source(MICHEL, "section 4 (iterative pruning)", BERT_BASE, "MultiNLI, fine-tuned")
MICHEL_PRUNING_PRUNABLE = Number(40, MICHEL_PRUNING)  # percent of heads prunable by importance with little loss
MICHEL_PRUNING_TEXT = ("about 40% of bert-base's heads can be pruned by importance on MultiNLI with little loss of "
                       "accuracy (20% of the WMT Transformer's); accuracy then falls off")
# real pruning's speed-up (michel2019-niven2019-definitions.txt, "Real pruning ... up to about 17.5% for BERT at large
# batch size with half the heads gone"); the device and exact batch sizes are not in our source
MICHEL_REAL_PRUNING = Source(MICHEL, "section 'real pruning' (text)", BERT_BASE + ", fine-tuned",
                             "MultiNLI, inference at large batch size")
MICHEL_PRUNING_SPEEDUP = Number(17.5, MICHEL_REAL_PRUNING)  # percent faster inference, 50% of heads removed
MICHEL_PRUNING_FRACTION = Number(0.5, MICHEL_REAL_PRUNING)  # fraction of heads removed for that speed-up
