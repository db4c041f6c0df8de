"""Every backend against the eager reference, and the reference against first principles."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.kernels import Gate, StatsSpec, attention_stats
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager

SPEC = StatsSpec(offsets=(-3, -1, 0, 1, 2), n_key_classes=4)


def make_inputs(B, H, L, D, lengths, seed=0, scale=2.0, C=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype) * scale for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.randint(0, C, (B, L), generator=g)
    return q, k, v, key_valid, key_class


def assert_same(a, b, key_valid, atol=2e-5):
    (out_a, sa), (out_b, sb) = a, b
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1) in the output layout
    torch.testing.assert_close(out_a * rows, out_b * rows, atol=atol, rtol=1e-5)
    for name in ("entropy", "offset_mass", "class_mass"):
        ta, tb = getattr(sa, name), getattr(sb, name)
        assert ta is not None and tb is not None, name
        torch.testing.assert_close(ta, tb, atol=atol, rtol=1e-5, msg=name)
    assert torch.equal(sa.argmax, sb.argmax)


@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 3), H=st.integers(1, 4), L=st.integers(1, 70), D=st.sampled_from([1, 4, 8, 17]),
    data=st.data(), chunk_maps=st.integers(1, 5),
)
def test_chunked_matches_eager_on_random_shapes(B, H, L, D, data, chunk_maps):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs = make_inputs(B, H, L, D, lengths, seed=data.draw(st.integers(0, 10**6)))
    ref = attention_stats_eager(*inputs, SPEC)
    fast = attention_stats_chunked(*inputs, SPEC, chunk_bytes=chunk_maps * L * L * 4)
    assert_same(ref, fast, inputs[3])


@pytest.mark.parametrize("L", [1, 16, 37, 128, 200])
def test_chunked_matches_eager_at_odd_lengths_with_padding(L):
    lengths = [L, max(1, L // 2), 1]
    inputs = make_inputs(3, 12, L, 32, lengths, seed=L)
    assert_same(attention_stats_eager(*inputs, SPEC), attention_stats_chunked(*inputs, SPEC), inputs[3])


def test_long_sequence_512():
    inputs = make_inputs(1, 2, 512, 32, [509], seed=5)
    assert_same(attention_stats_eager(*inputs, SPEC), attention_stats_chunked(*inputs, SPEC), inputs[3])


def test_reference_statistics_from_first_principles():
    """A 1x1x3 map with known probabilities: check every statistic by hand."""
    # scores (after scaling) row 0: [ln 1, ln 2, ln 1] -> p = [1/4, 1/2, 1/4]
    q = torch.tensor([[[[1.0], [0.0], [0.0]]]])  # (1, 1, 3, 1)
    k = torch.tensor([[[[0.0], [math.log(2)], [0.0]]]])
    v = torch.tensor([[[[1.0], [2.0], [3.0]]]])
    key_valid = torch.ones(1, 3, dtype=torch.bool)
    key_class = torch.tensor([[0, 1, 1]])
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=2)
    for fn in (attention_stats_eager, attention_stats_chunked):
        out, s = fn(q, k, v, key_valid, key_class, spec, scale=1.0)
        assert out[0, 0, 0, 0].item() == pytest.approx(0.25 * 1 + 0.5 * 2 + 0.25 * 3)
        assert s.entropy[0, 0, 0].item() == pytest.approx(1.5 * math.log(2))
        assert s.offset_mass[0, 0, 0].tolist() == pytest.approx([0.0, 0.25, 0.5])  # no key at offset -1
        assert s.class_mass[0, 0, 0].tolist() == pytest.approx([0.25, 0.75])
        assert s.argmax[0, 0, 0].item() == 1
        # rows 1 and 2 have q = 0: uniform over three keys
        assert s.entropy[0, 0, 1].item() == pytest.approx(math.log(3))
        assert s.offset_mass[0, 0, 2].tolist() == pytest.approx([1 / 3, 1 / 3, 0.0])  # no next key


def test_single_valid_key_rows():
    """A length-1 sequence in a padded batch: all mass on itself, zero entropy."""
    q, k, v, key_valid, key_class = make_inputs(2, 3, 9, 8, [9, 1])
    for fn in (attention_stats_eager, attention_stats_chunked):
        out, s = fn(q, k, v, key_valid, key_class, SPEC)
        assert torch.all(s.entropy[1, :, 0].abs() < 1e-6)
        assert torch.allclose(s.offset_mass[1, :, 0, SPEC.offsets.index(0)], torch.ones(3))
        assert torch.equal(s.argmax[1, :, 0], torch.zeros(3, dtype=torch.long))
        torch.testing.assert_close(out[1, 0], v[1, :, 0])  # output = the only value


def test_padding_rows_are_zero_and_finite():
    q, k, v, key_valid, key_class = make_inputs(2, 2, 11, 4, [11, 4])
    for fn in (attention_stats_eager, attention_stats_chunked):
        out, s = fn(q, k, v, key_valid, key_class, SPEC)
        assert torch.isfinite(out).all()
        for t in (s.entropy, s.offset_mass, s.class_mass, s.argmax):
            assert t[1, :, 4:].abs().sum() == 0


def test_sequence_without_any_valid_key_stays_finite():
    q, k, v, key_valid, key_class = make_inputs(2, 2, 6, 4, [6, 1])
    key_valid[1] = False  # an all-padding row in the batch
    for fn in (attention_stats_eager, attention_stats_chunked):
        out, s = fn(q, k, v, key_valid, key_class, SPEC)
        assert torch.isfinite(out).all() and torch.isfinite(s.entropy).all()


def test_padding_does_not_change_statistics():
    """The same sequence alone and padded inside a longer batch gives the same rows."""
    q, k, v, key_valid, key_class = make_inputs(1, 3, 20, 8, [20])
    alone = attention_stats_chunked(q[..., :13, :], k[..., :13, :], v[..., :13, :], key_valid[:, :13],
                                    key_class[:, :13], SPEC)
    padded_valid = key_valid.clone()
    padded_valid[:, 13:] = False
    padded = attention_stats_chunked(q, k, v, padded_valid, key_class, SPEC)
    torch.testing.assert_close(alone[1].entropy, padded[1].entropy[..., :13], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone[1].class_mass, padded[1].class_mass[..., :13, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone[0], padded[0][:, :13], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L", [5, 16, 33])
@pytest.mark.parametrize("fn", [attention_stats_eager, attention_stats_chunked])
def test_argmax_takes_the_lowest_index_on_ties(L, fn):
    q, k, v, key_valid, key_class = make_inputs(1, 1, L, 4, [L])
    q[..., 0, :] = 0.0  # row 0: uniform, every key tied -> 0
    k[..., L // 2, :] = k[..., L - 1, :] = 100.0  # two identical dominant keys
    q[..., 1, :] = 1.0  # row 1: ties between L//2 and L-1 -> L//2
    _, s = fn(q, k, v, key_valid, key_class, SPEC)
    assert s.argmax[0, 0, 0].item() == 0
    assert s.argmax[0, 0, 1].item() == L // 2


def test_planted_ties_agree_across_backends():
    """Identical keys give exactly tied probabilities: both backends pick the first."""
    q, k, v, key_valid, key_class = make_inputs(1, 2, 40, 8, [40])
    k[..., 7, :] = k[..., 30, :] = k[..., 3, :] * 0 + 5.0
    q = q.abs()
    eager = attention_stats_eager(q, k, v, key_valid, key_class, SPEC)[1].argmax
    chunked = attention_stats_chunked(q, k, v, key_valid, key_class, SPEC)[1].argmax
    assert torch.equal(eager, chunked)
    assert (eager == 7).any() and not (eager == 30).any()


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_gates(backend):
    q, k, v, key_valid, key_class = make_inputs(2, 3, 10, 4, [10, 6])
    gates = torch.tensor([Gate.KEEP, Gate.ZERO, Gate.UNIFORM], dtype=torch.int8)
    kept, s_kept = attention_stats(q, k, v, key_valid, key_class, SPEC, backend=backend)
    out, s = attention_stats(q, k, v, key_valid, key_class, SPEC, gates=gates, backend=backend)
    torch.testing.assert_close(out[:, :, 0], kept[:, :, 0])
    assert out[:, :, 1].abs().sum() == 0
    mean_v = v[1, 2, :6].mean(0)  # second sequence has 6 valid keys
    torch.testing.assert_close(out[1, :, 2], mean_v.expand(10, -1))
    torch.testing.assert_close(s.entropy, s_kept.entropy)  # statistics ignore the gate


def test_large_logits_entropy_is_accurate():
    """Peaked heads (large scores) must not lose the entropy to cancellation."""
    inputs = make_inputs(2, 4, 64, 16, [64, 50], scale=6.0)
    ref, fast = attention_stats_eager(*inputs, SPEC), attention_stats_chunked(*inputs, SPEC)
    torch.testing.assert_close(ref[1].entropy, fast[1].entropy, atol=1e-4, rtol=0)


def test_float64_inputs_match_tightly():
    inputs = make_inputs(2, 2, 33, 8, [33, 20], dtype=torch.float64)
    ref, fast = attention_stats_eager(*inputs, SPEC), attention_stats_chunked(*inputs, SPEC)
    torch.testing.assert_close(ref[1].entropy, fast[1].entropy, atol=1e-10, rtol=1e-10)
