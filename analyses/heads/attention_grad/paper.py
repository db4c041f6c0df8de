"""Clark et al. (2019)'s claim on the gradients of attention to [SEP], as `bertscope heads
attention-grad`'s section quotes it (../shared/papers/clark2019-what-does-bert-look-at.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, CLARK, Number, Source

# Clark et al. (2019) section 3, Figure 5: gradient of the masked-LM loss with respect to the
# attention weights, by key ([SEP], ". or ,", other). The figure prints no values: only the text's
# claim is kept, and the layer it names.
CLARK_GRADIENT = Source(CLARK, "section 3, Figure 5", BERT_BASE, "Wikipedia segments, masked-LM loss")
CLARK_GRADIENT_FROM_LAYER = Number(5, CLARK_GRADIENT)  # of 12: "starting in layer 5" [SEP] gradients are very small
CLARK_GRADIENT_TEXT = ("starting in layer 5 (of 12), the gradients of the masked-LM loss for attention to [SEP] "
                       "become very small, although over half of the attention in layers 6-10 goes to [SEP]: "
                       "changing it barely changes BERT's outputs (a no-op)")
