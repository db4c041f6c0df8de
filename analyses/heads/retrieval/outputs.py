"""What `bertscope heads retrieval` writes; the names the command and the report section share.

retrieval_cells.csv: one row per haystack (needle, length, depth): where the needle span and the
answer start, the distance between them, whether the model copies the reference answer (every
answer row's argmax prediction is the reference token), its token accuracy, the reference
answer's log-probability (nats), what the model predicts, and the highest head score there. With
--answer greedy the teacher-forced answer is the model's own greedy one (the "reference" columns
then read it), and three columns follow: answered (Wu et al.'s criterion: its words recall more
than half of the needle's answer), answer_text (the greedy answer, decoded) and recall. The decoded
texts (predicted, answer_text) are escaped onto one line (`escape_text`: a newline is the two
characters backslash-n), so that every row is one line of the file.

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

import re

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


def ranked_score(top_head: dict, results: dict) -> float:
    """The score a head of results["top_heads"] was ranked by: over the answered haystacks, or over
    all of them when none was answered (for a record written before "ranked_score" was kept)."""
    fallback = top_head["score"] if results["answered"] else top_head["score_all"]
    return top_head.get("ranked_score", fallback)


# a decoded text in a CSV cell: on one line. The characters str.splitlines breaks at, and the backslash
# itself (so that `unescape_text` gives the text back), as Python writes them in a string literal.
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\x0b": "\\x0b", "\x0c": "\\x0c", "\x1c": "\\x1c",
            "\x1d": "\\x1d", "\x1e": "\\x1e", "\x85": "\\x85", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_ESCAPED = re.compile("|".join(re.escape(c) for c in _ESCAPES))
_UNESCAPE = {v: k for k, v in _ESCAPES.items()}
_ESCAPE_SEQUENCE = re.compile("|".join(re.escape(v) for v in sorted(_UNESCAPE, key=len, reverse=True)))


def escape_text(text: str) -> str:
    """`text` on one line: a backslash written as two, a newline as backslash-n, a carriage return as
    backslash-r, the other line breaks of str.splitlines as \\x0b, \\x85, \\u2028 ... (Python's spelling)."""
    return _ESCAPED.sub(lambda m: _ESCAPES[m.group()], text)


def unescape_text(text: str) -> str:
    """The text `escape_text` was given."""
    return _ESCAPE_SEQUENCE.sub(lambda m: _UNESCAPE[m.group()], text)
