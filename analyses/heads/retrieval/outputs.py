"""What `bertscope heads retrieval` writes; the names the command and the report section share.

retrieval_cells.csv: one row per haystack (needle, length, depth): where the needle span and the
answer start, the distance between them, whether the model copies the reference answer (every
answer row's argmax prediction is the reference token), its token accuracy, the reference
answer's log-probability (nats), what the model predicts, and the highest head score there. With
--answer greedy the teacher-forced answer is the model's own greedy one (the "reference" columns
then read it), and three columns follow: answered (Wu et al.'s criterion: its words recall more
than half of the needle's answer), answer_text (the greedy answer, decoded) and recall.

retrieval_heads.csv: one row per head, layer-major, `layer, head` from 1: the layer's kind
(global, or its sliding window), the retrieval score over the answered haystacks (Wu et al.'s)
and how many there were, the score over every haystack, the far score (hits whose key lies more
than 512 tokens back, over the answered haystacks and over all of them) and the rank by score (1 =
highest; by the all-haystack score when no haystack was answered).

retrieval_ablation.csv: one row per gating of the ablation: `none` (as trained), `top` (the k
highest-scoring heads zeroed) and `random` (k heads drawn from the others, one row per draw):
the heads, the haystacks run, the fraction copied, the mean token accuracy and answer
log-probability, and the change of the latter against `none`.
"""
from __future__ import annotations

NAME = "retrieval"
CELLS_FILE = "retrieval_cells.csv"
CELLS_COLUMNS = ("needle", "length", "depth", "needle_start", "needle_len", "answer_start", "distance", "copied",
                 "token_accuracy", "answer_logprob", "predicted", "max_head_score")
GREEDY_COLUMNS = ("answered", "answer_text", "recall")  # appended with --answer greedy
HEADS_FILE = "retrieval_heads.csv"
HEADS_COLUMNS = ("layer", "head", "layer_kind", "score", "n_answered", "score_all", "n_cells", "far_score",
                 "far_score_all", "rank")
ABLATION_FILE = "retrieval_ablation.csv"
ABLATION_COLUMNS = ("ablation", "k", "draw", "heads", "cells", "accuracy", "token_accuracy", "answer_logprob",
                    "delta_logprob")
CELLS_DIR = "retrieval_cells"  # one JSON per finished haystack (resume)
ABLATION_DIR = "retrieval_ablation"  # one JSON per finished (gating, haystack) of the ablation (resume)
NEEDLE_FIGURE = "fig_retrieval_needle.png"
HEADS_FIGURE = "fig_retrieval_heads.png"
ABLATION_FIGURE = "fig_retrieval_ablation.png"
