"""Clark et al. (2019) Table 3, as `bertscope probe classifier` and its section quote it
(../shared/papers/clark2019-what-does-bert-look-at.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, CLARK, Number, Source

TABLE3 = Source(CLARK, "Table 3", BERT_BASE, "PTB WSJ dev, Stanford Dependencies")

# Table 3: UAS of the attention-based probing classifiers (bertscope.analyses.probes.classifier.command's model names)
CLASSIFIER_TABLE3 = {name: Number(v, TABLE3) for name, v in (
    ("Right-branching", 26), ("Distances + GloVe", 58), ("Random Init Attn + GloVe", 30),
    ("Attn", 61), ("Attn + GloVe", 77))}
