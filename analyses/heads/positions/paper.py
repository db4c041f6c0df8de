"""The papers' statements on positional attention that `bertscope heads positions`'s section and
docs/positions.md quote: Liu et al. 2023 (lost in the middle) and Hsieh et al. 2024 (found in the middle)."""
from __future__ import annotations

from bertscope.report.quotes import Source

LIU = "Liu et al. (2023)"  # Lost in the Middle: How Language Models Use Long Contexts (TACL 2024)
# Found in the Middle: Calibrating Positional Attention Bias Improves Long Context Utilization
HSIEH = "Hsieh et al. (2024)"

LOST = Source(LIU, "Figure 1 and section 2", "GPT-3.5-Turbo, Claude-1.3, MPT-30B-Instruct, LongChat-13B and others",
              "multi-document question answering (the document with the answer moved among 10, 20, 30 retrieved "
              "documents) and key-value retrieval")
FOUND = Source(HSIEH, "Figure 1(b) and abstract", "the open LLMs of their study",
               "the attention weights on each retrieved document of a RAG prompt, by the document's place in it")

TEXT = {
    "liu": ("Liu et al.: accuracy is highest when the relevant document comes first or last in the context and "
            "drops when it lies in the middle: a U-shaped curve over its position, also for models built for long "
            "contexts. They measure answers, not attention."),
    "hsieh": ("Hsieh et al.: the attention itself is U-shaped, whatever the relevance: the tokens at the beginning "
              "and at the end of the input draw more attention than those in the middle; calibrating this "
              "positional bias away lets a model find what lies in the middle (up to 15 points in RAG)."),
}

SOURCES = (LOST, FOUND)
