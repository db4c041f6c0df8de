"""Wu et al. (2024), "Retrieval Head Mechanistically Explains Long-Context Factuality"
(arXiv:2404.15574; code nightdessert/Retrieval_Head), as `bertscope heads retrieval`'s section
quotes it: their definitions and statements; their models (Llama-2, Yi, Qwen, Mistral, 6-14B
parameters) are not the ones measured here, so no number of theirs is compared with ours."""
from __future__ import annotations

from bertscope.report.quotes import Source

WU = "Wu et al. (2024)"
WU_RETRIEVAL = Source(WU, "sections 2-3 (detection, properties) and 4 (masking)",
                      "Llama-2-7B-80K, Yi-6B/34B-200K, Qwen1.5-14B, Mistral-7B, Mixtral-8x7B and others",
                      "needle-in-a-haystack, 20 lengths x 10 depths per needle, 3 needles")
WU_TEXT = {
    "definition": "a head scores 1/|needle| at each decoding step where its most-attended token lies inside the "
                  "needle and is the token just generated; its retrieval score is the mean over the haystacks the "
                  "model answers",
    "sparse": "fewer than 5% of the attention heads are retrieval heads (retrieval score above 0.1)",
    "universal": "retrieval heads exist in every model family and size they tested, and they are intrinsic: the "
                 "same heads in a base model and its long-context or chat derivatives",
    "masking": "masking the top retrieval heads makes the needle test fail, while masking as many random heads "
               "barely changes it",
}
