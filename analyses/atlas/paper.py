"""The papers the atlas's types follow, as its report section and docs/atlas.md quote them: their
definitions and the numbers they report, each with its source. Their models are not the ones measured
here (except BERT-base's relatives for Clark et al.), so the card puts their statements beside ours
and compares no number of theirs with ours as if it were the same measurement."""
from __future__ import annotations

from bertscope.report.quotes import Source

DUO = Source("Xiao et al. (2024)", "DuoAttention (ICLR 2025), abstract and 'Optimization-based Identification'",
             "Llama-2-7B, Llama-3-8B/70B and Mistral-7B instruct models and their long-context variants",
             "synthetic data for the gates; Needle-in-a-Haystack, LongBench, MMLU, MBPP, MT-Bench for evaluation")
VOITA = Source("Voita et al. (2019)", "specialised heads and pruning (as Clark et al. 2019's related work sums it up)",
               "Transformer translation models", "their translation data")
SOURCES = (DUO, VOITA)  # the other papers the atlas quotes are registered by their own analyses

TEXT = {
    "induction": "Olsson et al. (2022): an induction head attends from a token A to the token after an earlier A "
                 "and copies it ([A][B] ... [A] -> [B]); on repeated random tokens such heads are read off the "
                 "attention to that token.",
    "sink": "Gu et al. (2024): the share of heads whose mean attention to the first token exceeds 0.3 is 92-99% in "
            "the 7-13B base models of their Table 1 on 64-token inputs; Xiao et al. (2023): beyond the bottom two "
            "layers most attention of Llama-2-7B goes to the initial token.",
    "retrieval": "Wu et al. (2024): fewer than 5% of heads are retrieval heads (retrieval score above 0.1), in "
                 "every model family they test; masking them fails the needle test, masking random heads does not.",
    "streaming": "Xiao et al. (2024), DuoAttention: most heads are streaming heads, which need only the attention "
                 "sinks and the recent tokens; a few retrieval heads need the whole context. They find them by "
                 "optimising a gate per KV head, not by a threshold.",
    "positional": "Clark et al. (2019), BERT-base: four heads (layers 2, 4, 7, 8) put over 50% of their attention "
                  "on the previous token and five (layers 1, 2, 2, 3, 6) on the next; broad heads in the lower "
                  "layers; over half of the attention of layers 6-10 on [SEP]. Voita et al. (2019) find syntactic, "
                  "positional and rare-word heads in Transformer translation models, and that most other heads can "
                  "be pruned.",
}
