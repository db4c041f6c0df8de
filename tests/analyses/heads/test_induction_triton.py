"""The induction scores through the Triton kernels (Triton's interpreter on the CPU): planted heads
score exactly 1 and 0, and random heads as the eager oracle, under a causal and a windowed layout.

TRITON_INTERPRET=1 must be set before triton is imported (see tests/kernels/test_triton_attention.py).
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import pytest
import torch
from test_induction import batch_of, planted_qk

import bertscope.kernels.triton_attention as ta
from bertscope.analyses.heads.induction.stats import (
    SCORES,
    InductionScores,
    RepeatedSequence,
    induction_spec,
    score_offsets,
)
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.spec import AttentionLayout

if not ta.INTERPRETED:
    pytest.fail("bertscope.kernels.triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def scores_of(q, k, layout: RepeatedSequence, attention: AttentionLayout, backend: str) -> np.ndarray:
    B, H, L, _ = q.shape
    spec = induction_spec(layout.seq_len, 1)
    _, stats = attention_stats(q, k, torch.randn_like(k), torch.ones(B, L, dtype=torch.bool),
                               torch.zeros(B, L, dtype=torch.long), spec, scale=1.0, backend=backend,
                               layout=attention)
    acc = InductionScores(1, H, layout)
    acc.add(batch_of([stats], spec, L, B))
    return np.stack([acc.scores()[s][0] for s in SCORES], 1)  # (H, 3)


def test_planted_heads_through_triton():
    T = 6
    layout = RepeatedSequence(T, True)
    off = score_offsets(T)
    q, k = planted_qk(2, layout.length, [off["induction"], off["duplicate"], off["previous"]])
    q, k = (torch.nn.functional.pad(t, (0, 16 - layout.length)) for t in (q, k))  # D = 16
    got = scores_of(q, k, layout, AttentionLayout(causal=True), "triton")
    np.testing.assert_allclose(got, np.eye(3), atol=1e-6)
    # a causal window of 4 keys: the induction and duplicate keys (T - 1 and T back) are out of sight
    got = scores_of(q, k, layout, AttentionLayout(causal=True, window=(3, 0)), "triton")
    assert got[0, 0] == 0 and got[1, 1] == 0 and got[2, 2] == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("attention", [AttentionLayout(causal=True), AttentionLayout(causal=True, window=(6, 0))])
def test_random_heads_as_eager(attention):
    layout = RepeatedSequence(5, False)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(3, 2, layout.length, 16, generator=g) for _ in range(2))
    np.testing.assert_allclose(scores_of(q, k, layout, attention, "triton"),
                               scores_of(q, k, layout, attention, "eager"), atol=1e-5)


def test_the_command_stream_through_triton(tiny_gemma3_lm_dir, tmp_path):
    """The whole stream (tiny Gemma-3: a windowed layer, then a global one) with --backend triton:
    the scores as transformers' eager maps give them."""
    from test_induction import eager_reference, stream

    from bertscope.analyses.heads.induction.stats import random_sequences

    layout = RepeatedSequence(6, True)
    ids = random_sequences(3, 6, np.arange(6, 25), bos=1, seed=1)
    _, scores, losses = stream(tiny_gemma3_lm_dir, ids, layout, "triton", tmp_path)
    ref, ref_losses = eager_reference(tiny_gemma3_lm_dir, ids, layout)
    for name in SCORES:
        np.testing.assert_allclose(scores[name], ref[name], atol=2e-5)
    assert (scores["induction"][0] == 0).all() and scores["induction"][1].min() > 0
    np.testing.assert_allclose(losses, ref_losses, atol=1e-4)
