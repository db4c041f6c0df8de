"""Olsson et al. (2022), "In-context Learning and Induction Heads" (Transformer Circuits Thread), as
`bertscope heads induction`'s section quotes it: their definitions and statements, no numbers of
theirs are compared with ours (their models are Anthropic's own, not available)."""
from __future__ import annotations

from bertscope.report.quotes import Source

OLSSON = "Olsson et al. (2022)"
OLSSON_INDUCTION = Source(OLSSON, "sections 'Key concepts' and 'Argument 1'/'Argument 2'",
                          "Anthropic's small attention-only and large transformers",
                          "repeated random tokens (prefix matching) and their training data")
OLSSON_TEXT = {
    "definition": "an induction head attends from the current token A to the token that followed an earlier A "
                  "('prefix matching') and raises that token's logit ('copying'): [A][B] ... [A] -> [B]; on "
                  "repeated random tokens they score heads by the attention to that token",
    "icl_score": "the in-context learning score is the loss of the 500th token of the context minus the loss of "
                 "the 50th, averaged over examples: a late token's loss minus an early one's",
    "ablation": "in small attention-only models, removing the induction heads at test time removes most of the "
                "in-context learning (the ICL score moves towards 0); in large models the evidence is "
                "correlational",
}
