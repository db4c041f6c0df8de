"""Kovaleva et al. (2019)'s findings on attention to linguistic features, as `bertscope features`'s
section quotes them (../shared/papers/kovaleva2019-revealing-dark-secrets.txt)."""
from __future__ import annotations

from bertscope.report.quotes import KOVALEVA, Source

# Kovaleva et al. (2019), section 4.4 (attention to linguistic features): the paper gives
# figures only (Figures 6-7, per-task heatmaps), so its findings are kept as the text it states
FEATURES = Source(KOVALEVA, "section 4.4, Figures 6-7", "bert-base-uncased, pre-trained and fine-tuned per task",
                  "GLUE dev sets (MRPC, STS-B, SST-2, QQP, RTE, QNLI, MNLI)")
FEATURES_TEXT = {
    "stripes": ("the vertical pattern is associated predominantly, if not exclusively, with attention to [CLS] "
                "and [SEP]"),
    "layers": "earlier layers attend to [CLS], later layers to [SEP], consistently across tasks",
    "features": ("after fine-tuning some heads attend more to nouns and direct objects (MRPC, RTE, QQP) and to "
                 "negation (QNLI), but those weights are negligible compared to [CLS] and [SEP]"),
    "cls_last": ("the last layer's [CLS] attends most to [SEP] in most tasks; in STS-B, RTE and QNLI the largest "
                 "weights go to punctuation"),
}
