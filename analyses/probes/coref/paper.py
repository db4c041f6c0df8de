"""Clark et al. (2019) Table 2, as `bertscope probe coref`'s section quotes it
(../shared/papers/clark2019-what-does-bert-look-at.txt)."""
from __future__ import annotations

from bertscope.report.quotes import BERT_BASE, CLARK, Number, Source

TABLE2 = Source(CLARK, "Table 2", BERT_BASE, "CoNLL-2012, documents truncated to 128 tokens")

# Table 2: antecedent selection accuracy by mention type; BERT's row is head 5-4
COREF_TYPES = ("All", "pronoun", "proper", "nominal")
COREF_TABLE2 = {
    "head 5-4": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (65, 64, 73, 58)))),
    "nearest": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (27, 29, 29, 19)))),
    "head_match": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (52, 47, 67, 40)))),
    "sieve": dict(zip(COREF_TYPES, (Number(v, TABLE2) for v in (69, 70, 77, 60)))),
}
