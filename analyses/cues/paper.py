"""Niven & Kao (2019)'s strongest unigram cue, as `bertscope cues`'s section quotes it
(../shared/papers/michel2019-niven2019-definitions.txt)."""
from __future__ import annotations

from bertscope.report.quotes import NIVEN, Number, Source

CUES = Source(NIVEN, "section 3 (strongest unigram cue)", "no model (data statistics)", "ARCT, all splits")

# Niven & Kao: "not", the strongest unigram cue in ARCT's warrants
NOT_CUE = {"productivity": Number(0.61, CUES), "coverage": Number(0.64, CUES)}
