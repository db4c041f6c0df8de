"""The papers' reference numbers, as data, each with where it comes from.

The report prints these beside a run's own numbers. Every number is copied from the paper
(../shared/papers: clark2019-what-does-bert-look-at.txt, michel2019-niven2019-definitions.txt),
never derived here. Accuracies
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
NIVEN = "Niven & Kao (2019)"  # Probing Neural Network Comprehension of Natural Language Arguments
CUES = Source(NIVEN, "section 3 (strongest unigram cue)", "no model (data statistics)", "ARCT, all splits")


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

# Table 3: UAS of the attention-based probing classifiers (bertscope.analyses.probes.classifier.command's model names)
CLASSIFIER_TABLE3 = {name: Number(v, TABLE3) for name, v in (
    ("Right-branching", 26), ("Distances + GloVe", 58), ("Random Init Attn + GloVe", 30),
    ("Attn", 61), ("Attn + GloVe", 77))}

# Niven & Kao: "not", the strongest unigram cue in ARCT's warrants
NOT_CUE = {"productivity": Number(0.61, CUES), "coverage": Number(0.64, CUES)}


# Kovaleva et al. (2019), section 4.4 (attention to linguistic features): the paper gives
# figures only (Figures 6-7, per-task heatmaps), so its findings are kept as the text it states
KOVALEVA = "Kovaleva et al. (2019)"  # Revealing the Dark Secrets of BERT
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


# ----------------------------------------------------------------------------- Kovaleva et al. (2019)

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


# Kovaleva et al. (2019), Revealing the Dark Secrets of BERT, section 4.6 (disabling heads and
# layers), ../shared/papers/kovaleva2019-revealing-dark-secrets.txt: changes of the task
# metric in points, from the text beside Figures 8-9 (single runs on the GLUE dev sets).
DISABLE = Source(KOVALEVA, "section 4.6, Figures 8-9", BERT_BASE, "GLUE dev sets, one fine-tuned model per task")
DISABLE_NUMBERS = {
    "head_gain_max": Number(1.2, DISABLE),  # the largest gain from disabling one head (MRPC)
    "head_gain_min": Number(0.1, DISABLE),  # the smallest such best gain over the tasks (STS-B)
    "rte_layer1_gain": Number(3.2, DISABLE),  # RTE with the first layer disabled
    "layer_drop_max": Number(-0.2, DISABLE),  # the largest drop from disabling a layer (QNLI, MNLI)
}
DISABLE_TEXT = {
    "heads": ("disabling some single head improves every task, by 0.1 (STS-B) to 1.2 points (MRPC); on MRPC "
              "and RTE disabling a random head helps on average"),
    "layers": ("disabling a whole layer also helps; on RTE disabling the first layer gives +3.2 points; on QNLI "
               "and MNLI it costs up to 0.2 points"),
}


# ----------------------------------------------------------------------------- fine-tuning

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

# Clark et al. (2019) section 3, Figure 5: gradient of the masked-LM loss with respect to the
# attention weights, by key ([SEP], ". or ,", other). The figure prints no values: only the text's
# claim is kept, and the layer it names.
CLARK_GRADIENT = Source(CLARK, "section 3, Figure 5", BERT_BASE, "Wikipedia segments, masked-LM loss")
CLARK_GRADIENT_FROM_LAYER = Number(5, CLARK_GRADIENT)  # of 12: "starting in layer 5" [SEP] gradients are very small
CLARK_GRADIENT_TEXT = ("starting in layer 5 (of 12), the gradients of the masked-LM loss for attention to [SEP] "
                       "become very small, although over half of the attention in layers 6-10 goes to [SEP]: "
                       "changing it barely changes BERT's outputs (a no-op)")


# Michel, Levy, Neubig (2019), "Are Sixteen Heads Really Better than One?" (michel2019-niven2019-definitions.txt,
# slides-clark-kovaleva-michel-niven.txt): head importance and iterative pruning, bert-base fine-tuned on MultiNLI
MICHEL = "Michel et al. (2019)"
MICHEL_PRUNING = Source(MICHEL, "section 4 (iterative pruning)", BERT_BASE, "MultiNLI, fine-tuned")
MICHEL_IMPORTANCE = Source(MICHEL, "section 4 (head importance score)", BERT_BASE, "MultiNLI, fine-tuned")
MICHEL_PRUNING_PRUNABLE = Number(40, MICHEL_PRUNING)  # percent of heads prunable by importance with little loss
MICHEL_PRUNING_TEXT = ("about 40% of bert-base's heads can be pruned by importance on MultiNLI with little loss of "
                       "accuracy (20% of the WMT Transformer's); accuracy then falls off")
MICHEL_IMPORTANCE_TEXT = ("important heads tend to be the same across data sets: heads with the largest effect on one "
                          "domain tend to have it on the other (their test: ablation effects, MNLI matched vs "
                          "mismatched, WMT vs MTNT)")
# real pruning's speed-up (michel2019-niven2019-definitions.txt, "Real pruning ... up to about 17.5% for BERT at large
# batch size with half the heads gone"); the device and exact batch sizes are not in our source
MICHEL_REAL_PRUNING = Source(MICHEL, "section 'real pruning' (text)", BERT_BASE + ", fine-tuned",
                             "MultiNLI, inference at large batch size")
MICHEL_PRUNING_SPEEDUP = Number(17.5, MICHEL_REAL_PRUNING)  # percent faster inference, 50% of heads removed
MICHEL_PRUNING_FRACTION = Number(0.5, MICHEL_REAL_PRUNING)  # fraction of heads removed for that speed-up


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


def all_sources() -> list[Source]:
    return [SURFACE, TABLE1, TABLE2, TABLE3, CUES, NIVEN_KAO_ARCT, PATTERNS_SOURCE, FEATURES, KOVALEVA_42,
            KOVALEVA_45, KOVALEVA_TABLE1, DISABLE, CLARK_GRADIENT, MICHEL_IMPORTANCE, MICHEL_PRUNING,
            MICHEL_REAL_PRUNING, MICHEL_ABLATION]
