"""Every backend against the eager reference, and the reference against first principles."""
import dataclasses
import functools
import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.kernels import cpu_rows
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.chunked import CLASS_MATMUL_MIN, attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import Gate, LayerGates, StatsSpec

SPEC = StatsSpec(offsets=(-3, -1, 0, 1, 2), n_key_classes=4, class_mass=True, entropy=True, argmax=True)

# The chunked backend has two row passes (compiled C and pure torch); every test of it runs
# both. The compiled one must build here: without a C compiler these tests fail, not skip.
ROW_PASSES = ["compiled", "torch"]


def chunked(row_pass):
    return functools.partial(attention_stats_chunked, row_pass=row_pass)


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
@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_chunked_matches_eager_on_random_shapes(row_pass, B, H, L, D, data, chunk_maps):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs = make_inputs(B, H, L, D, lengths, seed=data.draw(st.integers(0, 10**6)))
    ref = attention_stats_eager(*inputs, SPEC)
    fast = chunked(row_pass)(*inputs, SPEC, chunk_bytes=chunk_maps * L * L * 4)
    assert_same(ref, fast, inputs[3])


@pytest.mark.parametrize("row_pass", ROW_PASSES)
@pytest.mark.parametrize("L", [1, 16, 37, 128, 200])
def test_chunked_matches_eager_at_odd_lengths_with_padding(L, row_pass):
    lengths = [L, max(1, L // 2), 1]
    inputs = make_inputs(3, 12, L, 32, lengths, seed=L)
    assert_same(attention_stats_eager(*inputs, SPEC), chunked(row_pass)(*inputs, SPEC), inputs[3])


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_long_sequence_512(row_pass):
    inputs = make_inputs(1, 2, 512, 32, [509], seed=5)
    assert_same(attention_stats_eager(*inputs, SPEC), chunked(row_pass)(*inputs, SPEC), inputs[3])


def test_reference_statistics_from_first_principles():
    """A 1x1x3 map with known probabilities: check every statistic by hand."""
    # scores (after scaling) row 0: [ln 1, ln 2, ln 1] -> p = [1/4, 1/2, 1/4]
    q = torch.tensor([[[[1.0], [0.0], [0.0]]]])  # (1, 1, 3, 1)
    k = torch.tensor([[[[0.0], [math.log(2)], [0.0]]]])
    v = torch.tensor([[[[1.0], [2.0], [3.0]]]])
    key_valid = torch.ones(1, 3, dtype=torch.bool)
    key_class = torch.tensor([[0, 1, 1]])
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=2, class_mass=True, entropy=True, argmax=True)
    for fn in (attention_stats_eager, *map(chunked, ROW_PASSES)):
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
    for fn in (attention_stats_eager, *map(chunked, ROW_PASSES)):
        out, s = fn(q, k, v, key_valid, key_class, SPEC)
        assert torch.all(s.entropy[1, :, 0].abs() < 1e-6)
        assert torch.allclose(s.offset_mass[1, :, 0, SPEC.offsets.index(0)], torch.ones(3))
        assert torch.equal(s.argmax[1, :, 0], torch.zeros(3, dtype=torch.long))
        torch.testing.assert_close(out[1, 0], v[1, :, 0])  # output = the only value


def test_padding_rows_are_zero_and_finite():
    q, k, v, key_valid, key_class = make_inputs(2, 2, 11, 4, [11, 4])
    for fn in (attention_stats_eager, *map(chunked, ROW_PASSES)):
        out, s = fn(q, k, v, key_valid, key_class, SPEC)
        assert torch.isfinite(out).all()
        for t in (s.entropy, s.offset_mass, s.class_mass, s.argmax):
            assert t[1, :, 4:].abs().sum() == 0


def test_sequence_without_any_valid_key_stays_finite():
    q, k, v, key_valid, key_class = make_inputs(2, 2, 6, 4, [6, 1])
    key_valid[1] = False  # an all-padding row in the batch
    for fn in (attention_stats_eager, *map(chunked, ROW_PASSES)):
        out, s = fn(q, k, v, key_valid, key_class, SPEC)
        assert torch.isfinite(out).all() and torch.isfinite(s.entropy).all()


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_padding_does_not_change_statistics(row_pass):
    """The same sequence alone and padded inside a longer batch gives the same rows."""
    q, k, v, key_valid, key_class = make_inputs(1, 3, 20, 8, [20])
    alone = chunked(row_pass)(q[..., :13, :], k[..., :13, :], v[..., :13, :], key_valid[:, :13],
                                    key_class[:, :13], SPEC)
    padded_valid = key_valid.clone()
    padded_valid[:, 13:] = False
    padded = chunked(row_pass)(q, k, v, padded_valid, key_class, SPEC)
    torch.testing.assert_close(alone[1].entropy, padded[1].entropy[..., :13], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone[1].class_mass, padded[1].class_mass[..., :13, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(alone[0], padded[0][:, :13], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L", [5, 16, 33])
@pytest.mark.parametrize("fn", [attention_stats_eager, *map(chunked, ROW_PASSES)], ids=["eager", *ROW_PASSES])
def test_argmax_takes_the_lowest_index_on_ties(L, fn):
    q, k, v, key_valid, key_class = make_inputs(1, 1, L, 4, [L])
    q[..., 0, :] = 0.0  # row 0: uniform, every key tied -> 0
    k[..., L // 2, :] = k[..., L - 1, :] = 100.0  # two identical dominant keys
    q[..., 1, :] = 1.0  # row 1: ties between L//2 and L-1 -> L//2
    _, s = fn(q, k, v, key_valid, key_class, SPEC)
    assert s.argmax[0, 0, 0].item() == 0
    assert s.argmax[0, 0, 1].item() == L // 2


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_planted_ties_agree_across_backends(row_pass):
    """Identical keys give exactly tied probabilities: both backends pick the first."""
    q, k, v, key_valid, key_class = make_inputs(1, 2, 40, 8, [40])
    k[..., 7, :] = k[..., 30, :] = k[..., 3, :] * 0 + 5.0
    q = q.abs()
    eager = attention_stats_eager(q, k, v, key_valid, key_class, SPEC)[1].argmax
    fast = chunked(row_pass)(q, k, v, key_valid, key_class, SPEC)[1].argmax
    assert torch.equal(eager, fast)
    assert (eager == 7).any() and not (eager == 30).any()


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_gates(backend):
    q, k, v, key_valid, key_class = make_inputs(2, 3, 10, 4, [10, 6])
    gates = LayerGates.from_codes([Gate.KEEP, Gate.ZERO, Gate.UNIFORM])
    kept, s_kept = attention_stats(q, k, v, key_valid, key_class, SPEC, backend=backend)
    out, s = attention_stats(q, k, v, key_valid, key_class, SPEC, gates=gates, backend=backend)
    torch.testing.assert_close(out[:, :, 0], kept[:, :, 0])
    assert out[:, :, 1].abs().sum() == 0
    mean_v = v[1, 2, :6].mean(0)  # second sequence has 6 valid keys
    torch.testing.assert_close(out[1, :, 2], mean_v.expand(10, -1))
    torch.testing.assert_close(s.entropy, s_kept.entropy)  # statistics ignore the gate


@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_large_logits_entropy_is_accurate(row_pass):
    """Peaked heads (large scores) must not lose the entropy to cancellation."""
    inputs = make_inputs(2, 4, 64, 16, [64, 50], scale=6.0)
    ref, fast = attention_stats_eager(*inputs, SPEC), chunked(row_pass)(*inputs, SPEC)
    torch.testing.assert_close(ref[1].entropy, fast[1].entropy, atol=1e-4, rtol=0)


def test_float64_inputs_match_tightly():
    inputs = make_inputs(2, 2, 33, 8, [33, 20], dtype=torch.float64)
    ref, fast = attention_stats_eager(*inputs, SPEC), attention_stats_chunked(*inputs, SPEC)  # torch row pass
    torch.testing.assert_close(ref[1].entropy, fast[1].entropy, atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match="float32"):
        chunked("compiled")(*inputs, SPEC)


def test_compiled_row_pass_is_the_default_for_float32():
    """auto must pick the compiled pass here, or the benchmarked speed is not what users get."""
    assert cpu_rows.load() is not None, cpu_rows.unavailable_reason()
    inputs = make_inputs(2, 3, 40, 8, [40, 22], seed=3)
    auto, compiled = attention_stats_chunked(*inputs, SPEC), chunked("compiled")(*inputs, SPEC)
    assert torch.equal(auto[0], compiled[0]) and torch.equal(auto[1].entropy, compiled[1].entropy)


@pytest.mark.parametrize("C", [CLASS_MATMUL_MIN - 1, CLASS_MATMUL_MIN, 32])
def test_compiled_class_masses_by_row_passes_and_by_matmul(C):
    """Below CLASS_MATMUL_MIN classes the row pass sums each class, from it on a matmul
    P @ onehot does: both against eager, with padding, in chunks of several maps."""
    spec = dataclasses.replace(SPEC, n_key_classes=C)
    inputs = make_inputs(3, 4, 45, 8, [45, 30, 1], seed=C, C=C)
    ref, fast = attention_stats_eager(*inputs, spec), chunked("compiled")(*inputs, spec, chunk_bytes=3 * 45 * 45 * 4)
    assert_same(ref, fast, inputs[3])
    assert fast[1].class_mass.shape == (3, 4, 45, C) and fast[1].class_mass[0].sum(-1).allclose(torch.ones(4, 45))


def test_compiled_spec_without_entropy_offsets_or_argmax():
    spec = StatsSpec(offsets=(), n_key_classes=3, entropy=False, argmax=False, class_mass=True)
    inputs = make_inputs(2, 2, 19, 8, [19, 7], seed=9, C=3)
    ref, fast = attention_stats_eager(*inputs, spec), chunked("compiled")(*inputs, spec)
    torch.testing.assert_close(ref[0], fast[0], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ref[1].class_mass, fast[1].class_mass, atol=2e-5, rtol=1e-5)
    assert fast[1].entropy is None and fast[1].offset_mass is None and fast[1].argmax is None


def test_compiled_exp_is_accurate_over_the_whole_range():
    """Scores spanning [-100, 0]: the C exp (a polynomial) gives torch's probabilities.

    Every query row sees the same scores (q = e_0, k_j = scores_j e_0); V = I makes the
    output row the probability row itself.
    """
    L = 1201
    scores = torch.linspace(-100.0, 0.0, L)
    q, k = torch.zeros(1, 1, L, L), torch.zeros(1, 1, L, L)  # (1, 1, L, D=L)
    q[..., 0], k[..., 0] = 1.0, scores
    v = torch.eye(L).view(1, 1, L, L)
    key_valid, key_class = torch.ones(1, L, dtype=torch.bool), torch.zeros(1, L, dtype=torch.long)
    spec = StatsSpec(offsets=(), n_key_classes=1, entropy=True, class_mass=True, argmax=True)
    out, stats = chunked("compiled")(q, k, v, key_valid, key_class, spec, scale=1.0)
    ref = torch.softmax(scores.double(), 0)
    torch.testing.assert_close(out[0, 0, 0].double(), ref, atol=1e-30, rtol=5e-6)
    entropy = -torch.special.xlogy(ref, ref).sum()
    assert stats.entropy[0, 0, 0].item() == pytest.approx(entropy.item(), rel=1e-5)


def test_without_a_compiler_auto_falls_back_to_torch(tmp_path):
    """No C compiler: a clear reason, and the chunked backend still works (pure torch)."""
    code = (
        "import torch; from bertscope.kernels import cpu_rows; from bertscope.kernels.spec import StatsSpec; "
        "from bertscope.kernels.chunked import attention_stats_chunked as f; "
        "q = torch.randn(1, 2, 5, 4); kv = torch.ones(1, 5, dtype=torch.bool); kc = torch.zeros(1, 5, "
        "dtype=torch.long); from bertscope.kernels.eager import attention_stats_eager as ref; "
        "spec = StatsSpec(n_key_classes=1, entropy=True); out, s = f(q, q, q, kv, kc, spec); r = ref(q, q, q, kv, kc, "
        "spec)[1]; print(cpu_rows.load() is None, cpu_rows.unavailable_reason(), bool(torch.allclose(s.entropy, "
        "r.entropy, atol=1e-5)))"
    )
    env = {**os.environ, "CC": str(tmp_path / "no-such-cc"), "BERTSCOPE_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True ") and done.stdout.strip().endswith("True"), done.stdout
    assert "no-such-cc" in done.stdout
