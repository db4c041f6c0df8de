"""Kovaleva et al. (2019)'s numbers on the types of attention maps, as `bertscope patterns`'s section
quotes them (../shared/papers/kovaleva2019-revealing-dark-secrets.txt)."""
from __future__ import annotations

from bertscope.report.quotes import KOVALEVA, Number, Source

PATTERNS_SOURCE = Source(KOVALEVA, "section 4.1 and Figure 2", "bert-base-uncased fine-tuned per GLUE task",
                         "up to 1,000 validation examples of MRPC, STS-B, SST-2, QQP, RTE, QNLI, MNLI")
# Numbers stated in the text of section 4.1 (Figure 2's bar heights are not printed: none are read off it)
PATTERNS = {
    "heterogeneous_min": Number(32, PATTERNS_SOURCE),  # % Heterogeneous on MRPC, the smallest share
    "heterogeneous_max": Number(61, PATTERNS_SOURCE),  # % Heterogeneous on QQP, the largest share
    "vertical_share_annotated": Number(30, PATTERNS_SOURCE),  # % Vertical among the ~400 hand-labelled maps
    "cnn_f1": Number(0.86, PATTERNS_SOURCE),  # F1 of their CNN on the annotated maps
    "annotated_maps": Number(400, PATTERNS_SOURCE),  # "around 400" hand-labelled maps
}
PATTERNS_TEXT = ("Kovaleva et al.: the first three types (Vertical, Diagonal, Vertical+Diagonal) hold a large "
                 "portion of the maps; the Heterogeneous share, an upper bound on heads that could capture "
                 "linguistic structure, ranges from 32% (MRPC) to 61% (QQP) across tasks; their CNN reached F1 0.86 "
                 "on ~400 hand-labelled maps (30% Vertical).")
