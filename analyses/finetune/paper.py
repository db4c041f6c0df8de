"""The numbers `bertscope finetune`'s section compares with: Kovaleva et al. (2019) Table 1 and
Niven & Kao (2019) on ARCT (../shared/papers/kovaleva2019-revealing-dark-secrets.txt,
michel2019-niven2019-definitions.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, KOVALEVA, NIVEN, Number, Source

KOVALEVA_TABLE1 = Source(KOVALEVA, "Table 1", BERT_BASE, "GLUE validation sets")
NIVEN_KAO_ARCT = Source(NIVEN, "section 3-4 (text)", "BERT-base", "ARCT test set")

# Kovaleva Table 1: pre-trained (no fine-tuning) / fine-tuned from a normal init / fine-tuned
# from pre-trained, per GLUE task, with the table's metric; "F1/Acc" cells are (F1, Acc).
FINETUNE_COLUMNS = ("pretrained_no_ft", "random_ft", "pretrained_ft")
KOVALEVA_TABLE1_ROWS = {
    "MRPC": ("F1/Acc", ((0, 31.6), (81.2, 68.3), (87.9, 82.3))),
    "STS-B": ("Acc", (33.1, 2.9, 82.7)),
    "SST-2": ("Acc", (49.1, 80.5, 92.0)),
    "QQP": ("F1/Acc", ((0, 60.9), (0, 63.2), (65.2, 78.6))),
    "RTE": ("Acc", (52.7, 52.7, 64.6)),
    "QNLI": ("Acc", (52.8, 49.5, 84.4)),
    "MNLI-m": ("Acc", (31.7, 61.0, 78.6)),
}
# bertscope task -> the Table 1 row it is compared with (polarity: the sentences SST-2 was built from)
KOVALEVA_ROW_OF = {"rte": "RTE", "polarity": "SST-2"}


def kovaleva_accuracy(task: str) -> dict[str, Number] | None:
    """Table 1's accuracies (percent) of the row a bertscope task is compared with, by column."""
    row = KOVALEVA_TABLE1_ROWS.get(KOVALEVA_ROW_OF.get(task, ""))
    if row is None:
        return None
    metric, cells = row
    acc = [c[1] if metric == "F1/Acc" else c for c in cells]
    return {col: Number(v, KOVALEVA_TABLE1) for col, v in zip(FINETUNE_COLUMNS, acc)}


# Niven & Kao on ARCT test (accuracy, percent): BERT's peak (max over seeds) and mean where given
NIVEN_KAO_NUMBERS = {
    ("original", "full"): {"peak": Number(77, NIVEN_KAO_ARCT), "mean": Number(71.6, NIVEN_KAO_ARCT)},
    ("original", "W"): {"peak": Number(71, NIVEN_KAO_ARCT)},
    ("original", "RW"): {"peak": Number(75, NIVEN_KAO_ARCT)},
    ("original", "CW"): {"peak": Number(74, NIVEN_KAO_ARCT)},
    ("adversarial", "full"): {"peak": Number(53, NIVEN_KAO_ARCT), "mean": Number(50, NIVEN_KAO_ARCT)},
}
