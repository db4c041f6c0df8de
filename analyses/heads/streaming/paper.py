"""Xiao et al. (2024), "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and
Streaming Heads", as `bertscope heads streaming`'s section quotes it. Their statement is on their
models (Llama-2-7B-32K-Instruct, MHA; Llama-3-8B-Instruct-Gradient-1048k, GQA) and their needle
test; ours are measured on other models and text, so the two are set side by side, not compared
number for number."""
from __future__ import annotations

from bertscope.report.quotes import Source

DUO = "Xiao et al. (2024)"
DUO_ATTENTION = Source(DUO, "README of mit-han-lab/duo-attention, 'Needle in a Haystack (NIAH)' and 'Efficiency'",
                       "Llama-2-7B-32K-Instruct (MHA) and Llama-3-8B-Instruct-Gradient-1048k (GQA)",
                       "their needle-in-a-haystack benchmark")
DUO_TEXT = {
    "definition": "retrieval heads need full attention over every token; streaming heads, which attend mostly to "
                  "the first tokens (attention sinks) and the recent ones, keep a constant-length KV cache of the "
                  "sink and recent tokens; the split is learnt per key/value head from synthetic passkey data",
    "ratio": "comparable accuracy to full attention on the needle-in-a-haystack benchmark with a 25% full-attention "
             "ratio on the MHA model and 50% on the GQA model",
}
