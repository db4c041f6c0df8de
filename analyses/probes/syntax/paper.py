"""Clark et al. (2019) Table 1, as `bertscope probe syntax`'s section quotes it
(../shared/papers/clark2019-what-does-bert-look-at.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, CLARK, Number, Source

TABLE1 = Source(CLARK, "Table 1", BERT_BASE, "PTB WSJ, Stanford Dependencies")

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
