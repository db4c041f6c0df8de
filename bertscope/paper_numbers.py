"""The papers' reference numbers, as data, each with where it comes from.

The report prints these beside a run's own numbers. Every number is copied from the paper
(/work/shared/papers/clark2019-what-does-bert-look-at.txt), never derived here. Accuracies
are in percent, as printed in the paper. A `Source` says which paper, which table or figure,
on which model and data, so a reader can tell how comparable the two columns are.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    paper: str
    where: str  # table / figure / section
    model: str
    data: str

    def __str__(self) -> str:
        return f"{self.paper} {self.where}: {self.model} on {self.data}"

    @property
    def short(self) -> str:
        return f"{self.paper} {self.where}, {self.model}"


CLARK = "Clark et al. (2019)"  # What Does BERT Look At? An Analysis of BERT's Attention
BERT_BASE = "bert-base-uncased"

SURFACE = Source(CLARK, "section 3 (text)", BERT_BASE, "1,000 Wikipedia segments of 128 tokens")
TABLE1 = Source(CLARK, "Table 1", BERT_BASE, "PTB WSJ, Stanford Dependencies")
TABLE2 = Source(CLARK, "Table 2", BERT_BASE, "CoNLL-2012, documents truncated to 128 tokens")
TABLE3 = Source(CLARK, "Table 3", BERT_BASE, "PTB WSJ dev, Stanford Dependencies")


@dataclass(frozen=True)
class Number:
    value: float
    source: Source


# Section 3, surface-level patterns (numbers quoted in the text)
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

# Table 1: best head per relation (the direction that scored best), accuracy, and the best
# fixed-offset baseline. Keyed by the Stanford Dependencies label as bertscope's
# syntax_table.csv writes it in `sd_label` ("pobj (reversed)" is the paper's pobj).
SYNTAX_TABLE1 = {
    "all": {"best_head": "7-6", "accuracy": Number(34.5, TABLE1), "baseline": Number(26.3, TABLE1), "offset": "+1"},
    "det": {"best_head": "8-11", "accuracy": Number(94.3, TABLE1), "baseline": Number(51.7, TABLE1), "offset": "+1"},
    "dobj": {"best_head": "8-10", "accuracy": Number(86.8, TABLE1), "baseline": Number(40.0, TABLE1), "offset": "-2"},
    "auxpass": {"best_head": "4-10", "accuracy": Number(82.5, TABLE1), "baseline": Number(40.5, TABLE1),
                "offset": "+1"},
    "aux": {"best_head": "4-10", "accuracy": Number(81.1, TABLE1), "baseline": Number(71.5, TABLE1), "offset": "+1"},
    "poss": {"best_head": "7-6", "accuracy": Number(80.5, TABLE1), "baseline": Number(47.7, TABLE1), "offset": "+1"},
    "pobj (reversed)": {"best_head": "9-6", "accuracy": Number(76.3, TABLE1), "baseline": Number(34.6, TABLE1),
                        "offset": "-2"},
    "amod": {"best_head": "4-10", "accuracy": Number(75.6, TABLE1), "baseline": Number(68.3, TABLE1), "offset": "+1"},
    "nn": {"best_head": "4-10", "accuracy": Number(70.4, TABLE1), "baseline": Number(70.2, TABLE1), "offset": "+1"},
    "prep": {"best_head": "7-4", "accuracy": Number(66.7, TABLE1), "baseline": Number(61.8, TABLE1), "offset": "-1"},
    "nsubj": {"best_head": "8-2", "accuracy": Number(58.5, TABLE1), "baseline": Number(45.5, TABLE1), "offset": "+1"},
    "advmod": {"best_head": "7-6", "accuracy": Number(48.8, TABLE1), "baseline": Number(40.2, TABLE1),
               "offset": "+1"},
    "prt": {"best_head": "6-7", "accuracy": Number(99.1, TABLE1), "baseline": Number(91.4, TABLE1), "offset": "-1"},
    "mark": {"best_head": "8-2", "accuracy": Number(50.7, TABLE1), "baseline": Number(14.5, TABLE1), "offset": "+2"},
    "ccomp": {"best_head": "8-1", "accuracy": Number(48.8, TABLE1), "baseline": Number(12.4, TABLE1), "offset": "-2"},
}

# Table 2: antecedent selection accuracy by mention type; BERT's row is head 5-4
COREF_TYPES = ("All", "pronoun", "proper", "nominal")
COREF_TABLE2 = {
    "head 5-4": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (65, 64, 73, 58)))),
    "nearest": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (27, 29, 29, 19)))),
    "head_match": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (52, 47, 67, 40)))),
    "sieve": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (69, 70, 77, 60)))),
}

# Table 3: UAS of the attention-based probing classifiers (bertscope.probes.classifier's model names)
CLASSIFIER_TABLE3 = {name: Number(v, TABLE3) for name, v in (
    ("Right-branching", 26), ("Distances + GloVe", 58), ("Random Init Attn + GloVe", 30),
    ("Attn", 61), ("Attn + GloVe", 77))}


# ----------------------------------------------------------------------------- fine-tuning

KOVALEVA = "Kovaleva et al. (2019)"  # Revealing the Dark Secrets of BERT
NIVEN_KAO = "Niven & Kao (2019)"  # Probing Neural Network Comprehension of Natural Language Arguments
KOVALEVA_TABLE1 = Source(KOVALEVA, "Table 1", BERT_BASE, "GLUE validation sets")
NIVEN_KAO_ARCT = Source(NIVEN_KAO, "section 3-4 (text)", "BERT-base", "ARCT test set")

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


def all_sources() -> list[Source]:
    return [SURFACE, TABLE1, TABLE2, TABLE3, KOVALEVA_TABLE1, NIVEN_KAO_ARCT]
