"""Clark et al. (2019)'s numbers on surface-level patterns, as `bertscope run`'s section quotes them
(section 3, numbers quoted in the text; ../shared/papers/clark2019-what-does-bert-look-at.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, CLARK, Number, Source

SURFACE = Source(CLARK, "section 3 (text)", BERT_BASE, "1,000 Wikipedia segments of 128 tokens")

SURFACE_NUMBERS = {
    "prev_heads": Number(4, SURFACE),  # heads with > 50% on the previous token (layers 2, 4, 7, 8)
    "next_heads": Number(5, SURFACE),  # heads with > 50% on the next token (layers 1, 2, 2, 3, 6)
    "sep_sep": Number(0.90, SURFACE),  # [SEP] attends to [SEP] with > 90% in many heads
    "sep_layers_half": Number(0.5, SURFACE),  # "over half" of attention on [SEP] in layers 6-10
    "cls_entropy_last": Number(3.89, SURFACE),  # entropy of [CLS] in the last layer, nats
}
SURFACE_TEXT = {
    "prev_heads": "four heads (layers 2, 4, 7, 8) put > 50% on the previous token",
    "next_heads": "five heads (layers 1, 2, 2, 3, 6) put > 50% on the next token",
    "sep_layers": "over half of the attention in layers 6-10 goes to [SEP]",
    "sep_sep": "[SEP] attends to itself and the other [SEP] with > 90% of its attention",
    "cls_entropy_last": "[CLS] in the last layer has entropy 3.89 nats",
    "no_op": ("from layer 5 on, gradients of the loss with respect to attention to [SEP] become very small: "
              "attention to [SEP] looks like a no-op"),
}
