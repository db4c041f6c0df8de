"""Kovaleva et al. (2019)'s numbers on heads that link FrameNet's frame elements, as `bertscope
relations`'s section quotes them (../shared/papers/kovaleva2019-revealing-dark-secrets.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, KOVALEVA, Number, Source

# Kovaleva et al. (2019), sections 4.2 and 4.5 (kovaleva2019-revealing-dark-secrets.txt)
KOVALEVA_42 = Source(KOVALEVA, "section 4.2, Figure 3", BERT_BASE + " (pre-trained)",
                     "473 FrameNet sentences of <= 12 tokens, predicate <-> core frame element links >= 2 tokens apart")
KOVALEVA_45 = Source(KOVALEVA, "section 4.5 (text)", BERT_BASE, "not stated")
RELATION_HEADS = {
    "sentences": Number(473, KOVALEVA_42),
    "flagged_heads": Number(2, KOVALEVA_42),  # of 144, above the 99th percentile
    "heads": Number(144, KOVALEVA_42),
    "flagged_scores": (Number(0.201, KOVALEVA_42), Number(0.209, KOVALEVA_42)),  # mean max weight of the two
}
TOKEN_TO_TOKEN_TEXT = ("the candidate heads for verb -> subject and noun <-> pronoun links coincided with "
                       "diagonally structured (previous/following token) attention maps; no head counts given")
