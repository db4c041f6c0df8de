"""The Triton column-mass and word-map passes (kernels/triton_maps.py) against the eager
reference, run by Triton's interpreter on the CPU.

TRITON_INTERPRET=1 must be in the environment before the kernel module is imported
(@triton.jit reads it when the module runs), so it is set before any import below.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernel_maps import MAP_SPEC, make_inputs
from triton_interpreter import emulate_bf16_dots

from bertscope.kernels.common import masked_scores
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import StatsSpec, WordPooling
from bertscope.kernels.triton_maps import (
    INTERPRETED,
    column_mass_triton,
    word_maps_triton,
)

if not INTERPRETED:
    pytest.fail("bertscope.kernels.triton_maps was imported before TRITON_INTERPRET=1 was set", pytrace=False)
emulate_bf16_dots()  # the interpreter's bf16 tl.dot multiplies raw bits (tests/triton_interpreter.py)


def torch_lse(q, k, key_valid, scale):
    """The lse the fused forward stores: log-sum-exp of the masked scaled scores, fp32."""
    return torch.logsumexp(masked_scores(q.float(), k.float(), key_valid, scale), dim=-1)  # (B, H, L)


def model_layout(t):
    """The same values as a strided (B, H, L, D) view of a (B, L, H, D) tensor, as the model hands them over."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def run_both(inputs, pooling, dtype=torch.float32):
    """(eager RowStats on the fp32 values, triton column mass, word map, word argmax)."""
    q, k, v, key_valid, key_class = inputs
    q, k = q.to(dtype), k.to(dtype)
    D = q.shape[-1]
    ref_inputs = (q.float(), k.float(), v, key_valid, key_class)
    _, ref = attention_stats_eager(*ref_inputs, MAP_SPEC, pooling=pooling)
    lse = torch_lse(q, k, key_valid, D**-0.5)
    qs, ks = model_layout(q), model_layout(k)
    col = column_mass_triton(qs, ks, key_valid, lse)
    wmap, warg = word_maps_triton(qs, ks, key_valid, lse, pooling)
    return ref, col, wmap, warg


def assert_argmax_matches(warg, ref):
    """Equal wherever the top two scores of the reference are not (nearly) tied."""
    top = ref.word_map.sort(-1, descending=True).values
    ties = (top[..., 0] - top[..., 1] < 1e-5) if top.shape[-1] > 1 else torch.zeros(top.shape[:-1], dtype=torch.bool)
    assert torch.equal(warg[~ties], ref.word_argmax[~ties])


@pytest.mark.parametrize("L,from_word", [(1, "mean"), (16, "first"), (37, "mean"), (130, "first")])
def test_maps_match_eager_at_odd_lengths_with_padding(L, from_word):
    """Full, half, single-key and key-less sequences; q and k read through model-layout strides."""
    lengths = [L, max(1, L // 2), 1, 0]
    inputs, unit, candidate = make_inputs(4, 2, L, 8, lengths, seed=L)
    pooling = word_pooling(unit, candidate, from_word)
    ref, col, wmap, warg = run_both(inputs, pooling)
    torch.testing.assert_close(col, ref.column_mass, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wmap, ref.word_map, atol=1e-5, rtol=1e-5)
    assert_argmax_matches(warg, ref)
    assert torch.isfinite(col).all() and torch.isfinite(wmap).all()
    # every valid query row gives away exactly 1; the key-less sequence gives nothing
    torch.testing.assert_close(col.sum(-1), torch.tensor(lengths, dtype=torch.float32)[:, None].expand(4, 2))
    assert torch.all(col[3] == 0) and torch.all(col[2, :, 1:] == 0)
    # word-map rows of real units sum to 1 (to_word covers every valid key)
    real = pooling.from_word.sum(-1) > 0  # (B, W)
    torch.testing.assert_close(wmap.sum(-1)[real[:, None].expand_as(wmap[..., 0])],
                               torch.ones(int(real.sum()) * 2), atol=1e-5, rtol=0)


def test_sequence_without_valid_keys_is_uniform_like_eager():
    """Units over a sequence whose keys are all padding: eager's rows are uniform over the L
    keys (every score is the same finite fill), and so are the kernel's (its lse rounds to
    the fill, which the kernel recognises)."""
    inputs, unit, candidate = make_inputs(2, 2, 9, 8, [9, 9], seed=4)
    q, k, v, _, key_class = inputs
    key_valid = torch.tensor([[True] * 9, [False] * 9])
    pooling = word_pooling(unit, candidate, "mean")  # units on both sequences
    ref, col, wmap, warg = run_both((q, k, v, key_valid, key_class), pooling)
    torch.testing.assert_close(wmap, ref.word_map, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(col, ref.column_mass, atol=1e-5, rtol=1e-5)
    # uniform rows: mass on a unit is its share of the 9 tokens
    n_tokens = pooling.to_word[1].sum(0)  # (W,)
    torch.testing.assert_close(wmap[1, 0, 0], n_tokens / 9)
    assert torch.all(col[1] == 0)
    assert torch.equal(warg, ref.word_argmax)


def single_token_units(B, L):
    """Every token its own unit; the first and last are specials (not candidates)."""
    unit = torch.arange(L).expand(B, L).clone()
    candidate = torch.ones(B, L, dtype=torch.bool)
    candidate[:, 0] = candidate[:, -1] = False
    return unit, candidate


def test_word_argmax_planted_ties():
    """40 single-token units, so the map spans two 32-unit tiles. Head 0: q = 0, every row
    is uniform and all candidates tie -> lowest other candidate. Head 1: keys 3 and 36 (in
    different tiles) are the same vector, the best for every query, so rows tie between
    units 3 and 36 -> 3 (the earlier tile keeps the tie), except row 3 (itself excluded) -> 36."""
    B, H, L, D = 1, 2, 40, 16
    g = torch.Generator().manual_seed(0)
    u = torch.randn(D, generator=g)
    q = torch.zeros(B, H, L, D)
    q[0, 1] = u  # every row of head 1 asks for u
    k = torch.randn(B, H, L, D, generator=g) * 0.1
    k[0, 1, 3] = k[0, 1, 36] = 3 * u / u.norm()
    key_valid = torch.ones(B, L, dtype=torch.bool)
    unit, candidate = single_token_units(B, L)
    pooling = word_pooling(unit, candidate, "mean")
    ref, _, wmap, warg = run_both((q, k, q, key_valid, torch.zeros(B, L, dtype=torch.long)), pooling)
    expected0 = [1, 2] + [1] * (L - 2)
    expected1 = [3] * L
    expected1[3] = 36
    assert warg[0].tolist() == [expected0, expected1]
    assert torch.equal(warg, ref.word_argmax)
    assert torch.equal(wmap[0, 1, :, 3], wmap[0, 1, :, 36])  # the tie is exact in the kernel too


def test_word_argmax_none_left_is_minus_one():
    """One candidate unit only: its own row has no other candidate (-1); the others pick it."""
    B, H, L, D = 1, 1, 5, 8
    inputs, _, _ = make_inputs(B, H, L, D, [L], seed=2)
    unit = torch.arange(L)[None]
    candidate = torch.tensor([[False, False, True, False, False]])
    pooling = word_pooling(unit, candidate, "first")
    ref, _, _, warg = run_both(inputs, pooling)
    assert warg[0, 0].tolist() == [2, 2, -1, 2, 2]
    assert torch.equal(warg, ref.word_argmax)


# (column mass, word map) tolerances against eager in fp32 on the same rounded q, k: the maps
# are fp32 in the kernel and only stored in the input dtype, within one ulp of it (bf16:
# 2^-7 relative; the interpreter truncates where a GPU rounds, tests/triton_interpreter.py)
HALF_TOL = {torch.float16: (dict(atol=5e-3, rtol=2e-3), dict(atol=2e-3, rtol=2e-3)),
            torch.bfloat16: (dict(atol=5e-3, rtol=1.6e-2), dict(atol=1e-3, rtol=1.6e-2))}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs(dtype):
    inputs, unit, candidate = make_inputs(2, 2, 37, 16, [37, 20], seed=7)
    pooling = word_pooling(unit, candidate, "mean")
    ref, col, wmap, warg = run_both(inputs, pooling, dtype=dtype)
    assert col.dtype == wmap.dtype == dtype
    col_tol, map_tol = HALF_TOL[dtype]
    torch.testing.assert_close(col.float(), ref.column_mass, **col_tol)
    torch.testing.assert_close(wmap.float(), ref.word_map, **map_tol)
    assert_argmax_matches(warg, ref)  # the argmax reads the fp32 map, before it is stored


def test_with_lse_from_the_triton_row_pass():
    """Chained with a Triton lse (the JS row pass), not torch's: same maps."""
    from bertscope.kernels.triton_js import row_lse_triton

    inputs, unit, candidate = make_inputs(2, 3, 21, 8, [21, 5], seed=11)
    q, k, _, key_valid, _ = inputs
    pooling = word_pooling(unit, candidate, "mean")
    _, ref = attention_stats_eager(*inputs, MAP_SPEC, pooling=pooling)
    lse, _ = row_lse_triton(q, k, key_valid, 8**-0.5)
    torch.testing.assert_close(column_mass_triton(q, k, key_valid, lse), ref.column_mass, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(word_maps_triton(q, k, key_valid, lse, pooling)[0], ref.word_map, atol=1e-5, rtol=1e-5)


def test_bad_arguments():
    inputs, unit, candidate = make_inputs(1, 1, 5, 8, [5])
    q, k, _, key_valid, _ = inputs
    lse = torch_lse(q, k, key_valid, 8**-0.5)
    with pytest.raises(ValueError, match="lse"):
        column_mass_triton(q, k, key_valid, lse.double())
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        column_mass_triton(q.double(), k.double(), key_valid, lse)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        column_mass_triton(q.bfloat16(), k.half(), key_valid, lse)
    with pytest.raises(ValueError, match="WordPooling"):
        word_maps_triton(q, k, key_valid, lse, None)
    bad = word_pooling(unit, candidate)
    with pytest.raises(ValueError, match="pooling does not fit"):
        word_maps_triton(q, k, key_valid, lse, WordPooling(bad.from_word[..., :4], bad.to_word, bad.candidate))


@settings(max_examples=6, deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 2), L=st.integers(1, 40), D=st.sampled_from([4, 16, 24]), data=st.data(),
       from_word=st.sampled_from(["mean", "first"]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_maps_match_eager_on_random_shapes(B, H, L, D, data, from_word, dtype):
    lengths = data.draw(st.lists(st.integers(0, L), min_size=B, max_size=B))
    lengths[0] = max(1, lengths[0])  # at least one unit in the batch (key-less sequences allowed after it)
    inputs, unit, candidate = make_inputs(B, H, L, D, lengths, seed=data.draw(st.integers(0, 10**6)))
    pooling = word_pooling(unit, candidate, from_word)
    ref, col, wmap, warg = run_both(inputs, pooling, dtype=dtype)
    col_tol, map_tol = HALF_TOL.get(dtype, (dict(atol=1e-5, rtol=1e-5),) * 2)
    torch.testing.assert_close(col.float(), ref.column_mass, **col_tol)
    torch.testing.assert_close(wmap.float(), ref.word_map, **map_tol)
    assert_argmax_matches(warg, ref)


def test_through_the_triton_backend_with_the_fused_lse():
    """attention_stats(backend="triton"): the fused forward's lse feeds both passes; a
    key-less sequence with units on it (uniform rows in eager) included."""
    from bertscope.kernels.backends import attention_stats

    inputs, unit, candidate = make_inputs(3, 2, 37, 16, [37, 1, 0], seed=21)
    unit[2, :5] = torch.tensor([0, 1, 1, 2, 3])
    candidate[2, :4] = True
    pooling = word_pooling(unit, candidate, "mean")
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=2, column_mass=True, word_maps=True, class_mass=True,
                     entropy=True, argmax=True)
    _, ref = attention_stats(*inputs, spec, backend="eager", pooling=pooling)
    _, got = attention_stats(*inputs, spec, backend="triton", pooling=pooling)
    torch.testing.assert_close(got.column_mass, ref.column_mass, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.word_map, ref.word_map, atol=1e-5, rtol=1e-5)
    assert_argmax_matches(got.word_argmax, ref)
    torch.testing.assert_close(got.word_map[2, :, 1, :4], torch.tensor([1, 2, 1, 1]).float().div(37).expand(2, 4))
