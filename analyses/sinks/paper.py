"""The papers' statements on attention sinks that `bertscope sinks`'s section and docs/sinks.md quote
(Xiao et al. 2023, Gu et al. 2024, Sun et al. 2024; Clark et al. 2019 for [SEP])."""
from __future__ import annotations

from bertscope.report.quotes import Number, Source

XIAO = "Xiao et al. (2023)"  # Efficient Streaming Language Models with Attention Sinks (StreamingLLM)
GU = "Gu et al. (2024)"  # When Attention Sink Emerges in Language Models: An Empirical View (ICLR 2025)
SUN = "Sun et al. (2024)"  # Massive Activations in Large Language Models (COLM 2024)

STREAMING = Source(XIAO, "section 3.1 and Figure 2", "Llama-2-7B", "sentences of 16 tokens, averaged over 256")
GU_TABLE1 = Source(GU, "Table 1 (right), Sink^eps_1 with eps = 0.3", "base LMs",
                   "100 natural-text inputs of T = 64 tokens (their code: each input's alpha_1 thresholded, the "
                   "indicator averaged over inputs, layers and heads)")
MASSIVE = Source(SUN, "Figure 1 and section 2", "LLaMA2-7B", "the hidden states of each layer's output")

# Gu et al.'s Sink^0.3_1 in percent, base models (Table 1, right; chat models close to them)
GU_SINK = {
    "Mistral-7B": Number(97.49, GU_TABLE1),
    "LLaMA2-7B": Number(92.47, GU_TABLE1),
    "LLaMA2-13B": Number(91.69, GU_TABLE1),
    "LLaMA3-8B": Number(99.02, GU_TABLE1),
}

TEXT = {
    "streaming": ("StreamingLLM (Llama-2-7B): the first two layers attend locally; beyond the bottom two layers "
                  "most attention, in every head, goes to the initial token; keeping 4 initial tokens as sinks "
                  "restores the perplexity that a plain sliding window loses."),
    "gu": ("Gu et al.: alpha_1 is a head's mean attention to the first token over the queries that see it; "
           "Sink^0.3_1, the share of heads with alpha_1 > 0.3, is 92.47% (LLaMA2-7B), 91.69% (LLaMA2-13B), "
           "99.02% (LLaMA3-8B) and 97.49% (Mistral-7B) on natural text of 64 tokens; sinks exist even in "
           "Pythia-14M, and in a sliding-window model the sink stays on the absolute first token."),
    "massive": ("Sun et al.: a few activations of the residual stream are up to 100,000 times the median, in fixed "
                "dimensions (LLaMA2-7B: 1415 and 2533), at the starting token and the first '.' or newline; "
                "they act as biases and concentrate attention on their tokens."),
    "clark": ("Clark et al. (BERT-base): over half of the attention in layers 6-10 goes to [SEP], which looks "
              "like a no-op (the encoder's sink)."),
}

SOURCES = (STREAMING, GU_TABLE1, MASSIVE)
