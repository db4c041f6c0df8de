"""The fused Triton forward (kernels/triton_attention.py) against the eager reference, run
by Triton's interpreter on the CPU.

TRITON_INTERPRET=1 must be in the environment before triton is first imported in the
process: @triton.jit (triton.language's own helpers included) decides between compiled and
interpreted functions when a module runs. tests/conftest.py sets it before any test module
is collected; it is set here as well for a run of this file alone.
"""
import dataclasses
import math
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_interpreter import emulate_bf16_dots, one_block_cfg

import bertscope.kernels.triton_attention as ta
from bertscope.kernels.backends import attention_stats, describe_backend, resolve_backend
from bertscope.kernels.common import masked_scores
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import AttentionLayout, Gate, LayerGates, StatsSpec, asked_stats
from bertscope.kernels.triton_config import L_AND_T, L_ONLY, PER_SCORE

if not ta.INTERPRETED:
    pytest.fail("bertscope.kernels.triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)
emulate_bf16_dots()  # the interpreter's bf16 tl.dot multiplies raw bits (tests/triton_interpreter.py)

SPEC = StatsSpec(offsets=(-3, -1, 0, 1, 2), n_key_classes=4, class_mass=True, entropy=True, argmax=True)
# the float row statistics of the table SPEC asks for (the argmax is compared exactly)
ROW_FIELDS = tuple(s.name for s in asked_stats(SPEC) if s.dtype == "float" and s.padding is not None)
PATHS = [None, True, False]  # by length, single-tile forced, online forced
HALF = [torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it again while a kernel runs


def make_inputs(B, H, L, D, lengths, seed=0, scale=2.0, C=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) * scale for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.randint(0, C, (B, L), generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype), key_valid, key_class


def triton(*inputs, spec=SPEC, **kw):
    return ta.attention_stats_triton(*inputs, spec, **kw)


def assert_same(ref, got, key_valid, atol=1e-5, rtol=1e-5, argmax=True):
    (out_r, sr), (out_g, sg) = ref, got
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1) in the output layout
    torch.testing.assert_close(out_g * rows, out_r * rows, atol=atol, rtol=rtol)
    for name in ROW_FIELDS:
        a, b = getattr(sg, name), getattr(sr, name)
        assert a is not None and b is not None, name
        assert a.dtype == b.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=name)
    if argmax:
        assert torch.equal(sg.argmax, sr.argmax)


def fp32(t):
    return t.float() if t.is_floating_point() else t


def assert_half_close(ref, got, inputs, dtype):
    """Half-precision kernel results against eager in fp32 on the same (rounded) inputs.

    fp16 keeps 11 significant bits, bf16 8. Row statistics are computed and stored in fp32; the
    class masses are a dot with P rounded to the input dtype (the interpreter truncates fp32 -> bf16
    where a GPU rounds, tests/triton_interpreter.py), so within 2^-7 relative for bf16. The output
    also multiplies P cast to the input dtype (as FlashAttention does): P's rounding moves
    it by at most 2^-7 max|v| in bf16, its own rounding by as much again."""
    (out_r, sr), (out_g, sg) = ref, got
    rows = inputs[3][:, :, None, None]  # (B, L, 1, 1) in the output layout
    assert out_g.dtype == dtype and all(getattr(sg, n).dtype == torch.float32 for n in ROW_FIELDS)
    if dtype == torch.float16:
        out_tol, stat_tol = dict(atol=5e-3, rtol=5e-3), dict(atol=2e-3, rtol=2e-3)
    else:
        out_tol, stat_tol = dict(atol=2**-6 * float(inputs[2].abs().max()), rtol=0), dict(atol=1e-3, rtol=1.6e-2)
    torch.testing.assert_close(out_g.float() * rows, out_r * rows, **out_tol)
    for name in ROW_FIELDS:
        torch.testing.assert_close(getattr(sg, name).float(), getattr(sr, name), **stat_tol, msg=name)
    # -- argmax: equal wherever the row's top two scores are not within fp32 rounding of a tie
    q, k = inputs[0].float(), inputs[1].float()
    top2 = masked_scores(q, k, inputs[3], q.shape[-1] ** -0.5).topk(min(2, q.shape[2]), -1).values  # (B, H, L, 2)
    clear = (top2[..., 0] - top2[..., -1] > 1e-4 * top2[..., 0].abs().clamp(min=1)) | (top2.shape[-1] == 1)
    assert sg.argmax.dtype == torch.int64
    assert torch.equal(sg.argmax[clear], sr.argmax[clear])


@pytest.mark.parametrize("L", [1, 16, 37, 128, 200])
def test_matches_eager_at_odd_lengths_with_padding(L):
    inputs = make_inputs(3, 2 if L < 100 else 1, L, 32, [L, max(1, L // 2), 1], seed=L)  # the interpreter is slow
    assert_same(attention_stats_eager(*inputs, SPEC), triton(*inputs), inputs[3])


def test_long_rows_span_many_key_blocks():
    """512 keys in the interpreter's 16-key blocks: 32 blocks per row, most of them unmasked."""
    inputs = make_inputs(1, 1, 512, 32, [509], seed=5)
    assert_same(attention_stats_eager(*inputs, SPEC), triton(*inputs), inputs[3])


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("L", [20, 100])
def test_one_key_block_and_many_agree(L, dtype):
    """The whole row in one (masked) key block, and in blocks of 16 (unmasked ones between masked
    edges), on the same inputs."""
    inputs = make_inputs(2, 2, L, 16, [L, L - 7], seed=L, dtype=dtype)
    single, online = triton(*inputs, blocks=one_block_cfg(True)), triton(*inputs, blocks=one_block_cfg(False))
    _, s_single, lse_single = ta.fused_attention(*inputs, SPEC, blocks=one_block_cfg(True))
    _, s_online, lse_online = ta.fused_attention(*inputs, SPEC, blocks=one_block_cfg(False))
    # half inputs: the row sum l comes from the P that P V takes, rounded to the input dtype (SUMS_BY_DOT, the
    # interpreter's default), and another blocking rounds P against another running max: lse agrees to the
    # dtype's rounding, as the output does; fp32 P is not rounded
    lse_tol = dict(atol=1e-5, rtol=1e-6) if dtype == torch.float32 else dict(atol=4 * torch.finfo(dtype).eps, rtol=0)
    torch.testing.assert_close(lse_single, lse_online, **lse_tol)
    if dtype == torch.float32:  # the online path rescales per key block: a few ulps, more where the CPU's
        # BLAS sums the interpreter's tile products in another order (2e-6 seen on one x86-64 CPU)
        assert_same(single, online, inputs[3], atol=1e-5, rtol=1e-5)
    elif dtype == torch.float16:
        assert_same(single, online, inputs[3], atol=2e-3, rtol=2e-3)
    ref = attention_stats_eager(*map(fp32, inputs), SPEC)
    for got in (single, online):  # and both are right, not just equal
        if dtype == torch.float32:
            assert_same(ref, got, inputs[3], atol=1e-5, rtol=1e-5)
        else:
            assert_half_close(ref, got, inputs, dtype)


def test_reference_statistics_from_first_principles():
    """A 1x1x3 map with known probabilities, on both paths."""
    q = torch.tensor([[[[1.0], [0.0], [0.0]]]])  # (1, 1, 3, 1); row 0 scores [0, ln 2, 0]
    k = torch.tensor([[[[0.0], [math.log(2)], [0.0]]]])
    v = torch.tensor([[[[1.0], [2.0], [3.0]]]])
    key_valid, key_class = torch.ones(1, 3, dtype=torch.bool), torch.tensor([[0, 1, 1]])
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=2, class_mass=True, entropy=True, argmax=True)
    for one_block in (True, False):
        out, s = ta.attention_stats_triton(q, k, v, key_valid, key_class, spec, scale=1.0,
                                           blocks=one_block_cfg(one_block))
        assert out[0, 0, 0, 0].item() == pytest.approx(0.25 * 1 + 0.5 * 2 + 0.25 * 3)
        assert s.entropy[0, 0, 0].item() == pytest.approx(1.5 * math.log(2))
        assert s.offset_mass[0, 0, 0].tolist() == pytest.approx([0.0, 0.25, 0.5])
        assert s.class_mass[0, 0, 0].tolist() == pytest.approx([0.25, 0.75])
        assert s.argmax[0, 0].tolist() == [1, 0, 0]  # rows 1 and 2 are uniform: lowest index
        assert s.entropy[0, 0, 1].item() == pytest.approx(math.log(3))
        assert s.offset_mass[0, 0, 2].tolist() == pytest.approx([1 / 3, 1 / 3, 0.0])


@pytest.mark.parametrize("one_block", [True, False])
def test_single_valid_key_rows(one_block):
    q, k, v, key_valid, key_class = make_inputs(2, 3, 9, 8, [9, 1])
    out, s = triton(q, k, v, key_valid, key_class, blocks=one_block_cfg(one_block))
    assert torch.all(s.entropy[1, :, 0].abs() < 1e-6)
    torch.testing.assert_close(s.offset_mass[1, :, 0, SPEC.offsets.index(0)], torch.ones(3))
    assert torch.equal(s.argmax[1, :, 0], torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(out[1, 0], v[1, :, 0])  # the only value
    for t in (s.entropy, s.offset_mass, s.class_mass, s.argmax):  # padding queries are zero
        assert t[1, :, 1:].abs().sum() == 0


@pytest.mark.parametrize("one_block", [True, False])
def test_sequence_without_any_valid_key_is_uniform_like_eager(one_block):
    q, k, v, key_valid, key_class = make_inputs(2, 2, 6, 4, [6, 1])
    key_valid[1] = False
    ref = attention_stats_eager(q, k, v, key_valid, key_class, SPEC)
    out, s = triton(q, k, v, key_valid, key_class, blocks=one_block_cfg(one_block))
    assert torch.isfinite(out).all() and torch.isfinite(s.entropy).all()
    torch.testing.assert_close(out[1], v[1].mean(1).expand(6, -1, -1))  # uniform over all L keys, as eager
    torch.testing.assert_close(out, ref[0], atol=1e-5, rtol=1e-5)  # every row, padding ones included
    assert_same(ref, (out, s), key_valid)
    _, _, lse = ta.fused_attention(q, k, v, key_valid, key_class, SPEC, blocks=one_block_cfg(one_block))
    assert torch.isfinite(lse).all() and (lse[1] < torch.finfo(torch.float32).min / 2).all()


@pytest.mark.parametrize("one_block", [True, False])
@pytest.mark.parametrize("L", [5, 33, 70])
def test_argmax_takes_the_lowest_index_on_ties(L, one_block):
    """Ties inside one key block and across blocks (online blocks are 32 keys for fp32)."""
    q, k, v, key_valid, key_class = make_inputs(1, 1, L, 4, [L])
    q = q.round()  # integer queries: a planted tie is exact whatever order a BLAS sums the dot products in
    q[..., 0, :] = 0.0  # row 0: uniform -> 0
    k[..., L // 2, :] = k[..., L - 1, :] = 100.0  # two identical dominant keys
    q[..., 1, :] = 1.0  # row 1: ties between L//2 and L-1 -> L//2
    _, s = triton(q, k, v, key_valid, key_class, blocks=one_block_cfg(one_block))
    assert s.argmax[0, 0, 0].item() == 0
    assert s.argmax[0, 0, 1].item() == L // 2
    assert torch.equal(s.argmax, attention_stats_eager(q, k, v, key_valid, key_class, SPEC)[1].argmax)


def test_planted_ties_agree_with_eager():
    q, k, v, key_valid, key_class = make_inputs(1, 2, 40, 8, [40])
    k[..., 7, :] = k[..., 30, :] = 5.0
    q = q.abs().round()  # integer queries: q . k_7 == q . k_30 exactly, whatever order a BLAS sums in
    eager = attention_stats_eager(q, k, v, key_valid, key_class, SPEC)[1].argmax
    for one_block in (True, False):
        got = triton(q, k, v, key_valid, key_class, blocks=one_block_cfg(one_block))[1].argmax
        assert torch.equal(got, eager)
    assert (eager == 7).any() and not (eager == 30).any()


@pytest.mark.parametrize("one_block", [True, False])
def test_gates_in_the_epilogue(one_block):
    q, k, v, key_valid, key_class = make_inputs(2, 3, 10, 4, [10, 6])
    gates = LayerGates.from_codes([Gate.KEEP, Gate.ZERO, Gate.UNIFORM])
    kept, s_kept = triton(q, k, v, key_valid, key_class, blocks=one_block_cfg(one_block))
    out, s = triton(q, k, v, key_valid, key_class, gates=gates, blocks=one_block_cfg(one_block))
    ref = attention_stats_eager(q, k, v, key_valid, key_class, SPEC, gates=gates)
    torch.testing.assert_close(out, ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, :, 0], kept[:, :, 0])
    assert out[:, :, 1].abs().sum() == 0
    torch.testing.assert_close(out[1, :, 2], v[1, 2, :6].mean(0).expand(10, -1))  # mean over the 6 valid keys
    for name in (*ROW_FIELDS, "argmax"):  # statistics ignore the gate
        assert torch.equal(getattr(s, name), getattr(s_kept, name)), name


@pytest.mark.parametrize("C", [4, 32])
@pytest.mark.parametrize("dtype", HALF)
def test_half_inputs(dtype, C):
    """fp16 / bf16 q, k, v with padding, a single-key sequence and KEEP / ZERO / UNIFORM gates."""
    inputs = make_inputs(3, 3, 45, 32, [45, 30, 1], seed=2, C=C, dtype=dtype)
    gates = LayerGates.from_codes([Gate.KEEP, Gate.ZERO, Gate.UNIFORM])
    spec = dataclasses.replace(SPEC, n_key_classes=C)
    ref = attention_stats_eager(*map(fp32, inputs), spec, gates=gates)
    got = triton(*inputs, spec=spec, gates=gates)
    assert_half_close(ref, got, inputs, dtype)
    assert got[0][:, :, 1].abs().sum() == 0  # the ZERO head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("C", [1, 5, 16, 32])
def test_class_masses_by_the_key_feature_dot(C, dtype):
    """One tl.dot per key block with the keys' one-hot classes (`feature_width`: C padded to a power of
    two >= 16; C = 16 fills it, C = 32 takes 32), on both stages of the loop, against eager; every
    valid row's masses add up to 1. bf16: P is rounded to bf16 for the dot (truncated by the
    interpreter, 2^-8 relative) and divided by the fp32 row sum, so 2^-7."""
    from bertscope.kernels.triton_config import feature_width

    inputs = make_inputs(2, 2, 70, 16, [70, 41], seed=C, C=C, dtype=dtype)
    spec = dataclasses.replace(SPEC, n_key_classes=C)
    rows = inputs[3][:, None, :, None]  # (B, 1, L, 1) valid query rows
    ref = attention_stats_eager(*map(fp32, inputs), spec)[1].class_mass * rows
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=2**-7 + 2e-3)
    assert feature_width(C) == max(16, triton_next_pow2(C))
    for one_block in (True, False):
        _, stats, _ = ta.fused_attention(*inputs, spec, blocks=one_block_cfg(one_block))
        got = stats["class_mass"] * rows  # (B, H, L, C) fp32
        assert got.shape == ref.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, ref, **tol, msg=f"one_block={one_block}")
        total = rows[..., 0].expand_as(got[..., 0]).float()  # every valid row gives away 1
        torch.testing.assert_close(got.sum(-1), total, atol=1e-5 if dtype == torch.float32 else 2**-7, rtol=0)


def triton_next_pow2(n):
    return 1 << (n - 1).bit_length()


def test_strided_views_of_the_projections_are_read_in_place():
    """q, k, v as (B, H, L, D) views of a (B, L, 3 H D) projection: same result as contiguous copies."""
    B, H, L, D = 2, 3, 21, 8
    qkv = torch.randn(B, L, 3 * H * D, generator=torch.Generator().manual_seed(1)) * 2
    q, k, v = (t.view(B, L, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))  # strided views
    assert not q.is_contiguous()
    key_valid = torch.arange(L)[None] < torch.tensor([[L], [13]])
    key_class = torch.randint(0, 4, (B, L))
    strided = triton(q, k, v, key_valid, key_class)
    dense = triton(q.contiguous(), k.contiguous(), v.contiguous(), key_valid, key_class)
    assert torch.equal(strided[0], dense[0])
    assert strided[0].is_contiguous() and strided[0].shape == (B, L, H, D)
    assert_same(attention_stats_eager(q, k, v, key_valid, key_class, SPEC), strided, key_valid)


@pytest.mark.parametrize("one_block", [True, False])
def test_row_lse(one_block):
    inputs = make_inputs(2, 2, 40, 8, [40, 25], seed=4)
    _, _, lse = ta.fused_attention(*inputs, SPEC, blocks=one_block_cfg(one_block))
    ref = torch.logsumexp(masked_scores(inputs[0], inputs[1], inputs[3], 8**-0.5), dim=-1)  # (B, H, L)
    assert lse.dtype == torch.float32 and lse.shape == (2, 2, 40)
    torch.testing.assert_close(lse, ref, atol=1e-5, rtol=1e-5)


def test_spec_switches_and_extras():
    """No entropy/argmax/offsets; column mass and kept q/k through the `_extras` hook."""
    inputs = make_inputs(2, 2, 19, 8, [19, 7], seed=9, C=3)
    spec = StatsSpec(offsets=(), n_key_classes=3, entropy=False, argmax=False, column_mass=True, keep_qk=True,
                     class_mass=True)
    ref, got = attention_stats_eager(*inputs, spec), triton(*inputs, spec=spec)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].class_mass, ref[1].class_mass, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].column_mass, ref[1].column_mass, atol=1e-5, rtol=1e-5)
    assert got[1].entropy is None and got[1].offset_mass is None and got[1].argmax is None
    assert got[1].queries is inputs[0] and got[1].keys is inputs[1]


def test_bad_dtypes():
    inputs = make_inputs(1, 1, 4, 16, [4], dtype=torch.float64)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        triton(*inputs)
    q, k, v, key_valid, key_class = make_inputs(1, 1, 4, 16, [4], dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="same dtype"):
        triton(q, k.half(), v, key_valid, key_class)


def test_dispatcher(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", cpu)
    assert resolve_backend("auto", cpu) == "chunked"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("triton", cpu) == "triton"
    assert resolve_backend("auto", cpu) == "chunked"  # the interpreter is for tests, never picked by auto
    assert describe_backend("triton", cpu)["mode"].startswith("interpreter")
    inputs = make_inputs(2, 2, 12, 8, [12, 5], seed=3)
    assert_same(attention_stats_eager(*inputs, SPEC), attention_stats(*inputs, SPEC, backend="triton"), inputs[3])


@settings(max_examples=10, deadline=None)
@given(B=st.integers(1, 2), H=st.integers(1, 2), L=st.integers(1, 48), D=st.sampled_from([1, 4, 8, 17]),
       one_block=st.sampled_from(PATHS), dtype=st.sampled_from([torch.float32, *HALF]), data=st.data())
def test_matches_eager_on_random_shapes(B, H, L, D, one_block, dtype, data):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs = make_inputs(B, H, L, D, lengths, seed=data.draw(st.integers(0, 10**6)), dtype=dtype)
    ref, got = attention_stats_eager(*map(fp32, inputs), SPEC), triton(*inputs, blocks=one_block_cfg(one_block))
    if dtype == torch.float32:
        assert_same(ref, got, inputs[3])
    else:
        assert_half_close(ref, got, inputs, dtype)


@pytest.mark.parametrize("mode", [PER_SCORE, L_AND_T, L_ONLY], ids=["per-score", "l-and-t", "l-only"])
@pytest.mark.parametrize("dtype", HALF)
def test_each_way_of_summing_rows_on_half_inputs_far_from_zero(dtype, mode):
    """Every SUMS_BY_DOT mode against eager on half inputs whose scores sit far from 0: a key offset k0
    shared by every key adds q_i . k0 (up to about 100) to all of row i's scores, which moves no
    probability. With l from P rounded to the input dtype (relative error d), L_ONLY's entropy keeps
    t = sum p (z - m) relative to the running max, so it moves by about d log2 n, not d |m| as a sum of
    raw scores would (c T / l - m)."""
    inputs = make_inputs(2, 2, 70, 32, [70, 41], seed=5, dtype=torch.float32)
    g = torch.Generator().manual_seed(6)
    k0 = torch.randn(32, generator=g) * 6.0
    inputs = (inputs[0].to(dtype), (inputs[1] + k0).to(dtype), inputs[2].to(dtype), *inputs[3:])
    assert float((fp32(inputs[0]) @ fp32(k0)).abs().max()) > 60  # the rows' offsets are large
    ref = attention_stats_eager(*map(fp32, inputs), SPEC)
    got = triton(*inputs, blocks={"SUMS_BY_DOT": mode})
    assert_half_close(ref, got, inputs, dtype)


def test_sums_by_dot_where_it_pays():
    """`forward_config` puts the row sums on the tensor cores (SUMS_BY_DOT) exactly where the budget
    measured it to pay without a spill: sm_90 (and newer), half precision or TF32, D <= 64, a free
    key-feature column, neither argmax nor position statistics; and under the
    interpreter for the dtypes a GPU would take it for."""
    from bertscope.kernels.triton_config import forward_config

    def dot(*args, **kw):
        return forward_config(*args, **kw)["SUMS_BY_DOT"]

    for D in (32, 64):
        assert dot(D, torch.bfloat16, 90) and dot(D, torch.float16, 90, banded=True)
        assert dot(D, torch.float32, 90, tf32=True)
        assert forward_config(D, torch.bfloat16, 90)["BLOCK_N"] == 128
    assert not dot(128, torch.bfloat16, 90) and not dot(64, torch.bfloat16, 80) and not dot(64, torch.float32, 90)
    assert not dot(64, torch.bfloat16, 90, positions=True)
    assert not dot(64, torch.bfloat16, 90, wide=True)
    assert dot(64, torch.bfloat16, 90, n_classes=15) and not dot(64, torch.bfloat16, 90, n_classes=16)
    assert dot(8, torch.bfloat16, interpreted=True) and not dot(8, torch.float32, interpreted=True)


def test_default_tiles_only_for_the_default_statistics(monkeypatch):
    """The budget's tiles and switches for the default statistics (`TILES`' "default" entries: stage order, G
    compiled in, how rows are summed) go to a call whose kernel switches are exactly those (entropy, class
    masses; offsets have no switch), in half precision, and to no other: a call with other statistics takes
    its own kind's entry, a wide feature dot or fp32 none of them; a call whose key classes fill the features
    leaves no column for L_ONLY's ones and takes the next kind's entry ("any"). A launch computes its switches
    from its spec the same way."""
    from bertscope.kernels.triton_config import DEFAULT_SWITCHES, TILES, Call, forward_config, kinds

    default = {key: entry for key, entry in TILES.items() if key[3] == "default"}
    # the budget's (D = 64 and 128) and the sweep's (Gemma-3's D = 256, grouped)
    assert {(t, d) for t, d, _, _ in default} == {(80, 64), (80, 128), (90, 128), (80, 256), (90, 256)}
    assert {lay for t, d, lay, _ in default if d == 256} == {"grouped"}
    for (arch, block_d, layout, _), entry in default.items():
        banded = dict(banded=layout != "plain", grouped=layout == "grouped")
        got = forward_config(block_d, torch.float16, arch, switched_on=DEFAULT_SWITCHES, **banded)
        assert (got["BLOCK_M"], got["BLOCK_N"], got["num_warps"], got["num_stages"]) == entry.tiles
        assert (got["MASKED_FIRST"], got["FIXED_G"], got["SUMS_BY_DOT"]) == (
            entry.masked_first, entry.fixed_g, entry.sums_by_dot)
        for other in (frozenset(), frozenset({"entropy"}), DEFAULT_SWITCHES | {"argmax"}):
            assert "default" not in kinds(Call(other, False, False, "argmax" in other, True))
        for c in (forward_config(block_d, torch.float16, arch, switched_on=DEFAULT_SWITCHES, wide=True, **banded),
                  forward_config(block_d, torch.float32, arch, switched_on=DEFAULT_SWITCHES, **banded)):
            assert not (c["MASKED_FIRST"] or c["FIXED_G"] or c["SUMS_BY_DOT"])
        full = forward_config(block_d, torch.float16, arch, switched_on=DEFAULT_SWITCHES, n_classes=16, **banded)
        if entry.sums_by_dot == PER_SCORE:
            assert full == got
        else:  # no free column for the ones
            assert full == forward_config(block_d, torch.float16, arch, n_classes=16, **banded)
            assert full["SUMS_BY_DOT"] == PER_SCORE
    for switch in ("masked_first", "fixed_g"):  # each switch chosen somewhere, not everywhere
        assert {getattr(entry, switch) for entry in default.values()} == {True, False}, switch
    assert {entry.sums_by_dot for entry in default.values()} == {PER_SCORE, L_ONLY}
    import bertscope.kernels.triton_config as config
    import bertscope.kernels.triton_launch as launch

    seen = {}  # the launch reads its tiles through triton_config.kernel_config, which asks forward_config
    monkeypatch.setattr(config, "forward_config", lambda *a, **kw: seen.update(kw) or forward_config(*a, **kw))
    spec = StatsSpec(n_key_classes=4, entropy=True, offsets=(-1, 0, 1), class_mass=True)
    cfg = launch.launch_config(torch.zeros(1, 2, 8, 64, dtype=torch.float16), spec, AttentionLayout())
    assert seen["switched_on"] == DEFAULT_SWITCHES and not cfg["MASKED_FIRST"] and not cfg["FIXED_G"]  # the interpreter


def test_every_tiles_entry_is_what_a_call_of_its_kind_takes():
    """Generated from `TILES`: for every entry, a half-precision call of its kind (the statistics, gates and key
    classes that kind names), target, D class and layout gets exactly that entry's tiles and switches, so no
    entry is shadowed by a kind before it in `KINDS`; a grouped call without a grouped entry takes the banded
    one (`LAYOUTS`), and every (target, D class, layout) has an "any" entry."""
    from bertscope.kernels.triton_config import (
        CLASS_NORM_TWINS,
        DEFAULT_SWITCHES,
        KINDS,
        LAYOUTS,
        NORM_TWINS,
        TILES,
        forward_config,
    )

    calls = {  # kind -> forward_config's arguments of a call of that kind and of no kind before it
        "tokens": dict(tokens=True, positions=True, wide=True),
        "positions": dict(positions=True),
        "none": dict(switched_on=frozenset()),
        "argmax": dict(switched_on=frozenset({"argmax"}), wide=True),
        "class_mass": dict(switched_on=frozenset({"class_mass"}), n_classes=32),
        "default+argmax": dict(switched_on=DEFAULT_SWITCHES | {"argmax"}, wide=True),
        "default+norms": dict(switched_on=DEFAULT_SWITCHES | set(NORM_TWINS)),
        "default+class_norms": dict(switched_on=DEFAULT_SWITCHES | set(CLASS_NORM_TWINS), n_classes=5),
        "sums by dot": dict(switched_on=frozenset({"entropy"})),
        "default": dict(switched_on=DEFAULT_SWITCHES),
        "wide": dict(wide=True),
        "any": dict(n_classes=16),  # no free ones column: past "sums by dot"
    }
    assert list(calls) == [kind for kind, _ in KINDS]
    for (target, d_class, layout, kind), entry in TILES.items():
        banded = dict(banded=layout != "plain", grouped=layout == "grouped")
        for dtype in (torch.float16, torch.bfloat16):
            c = forward_config(d_class, dtype, target, **banded, **calls[kind])
            assert (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"], c["SUMS_BY_DOT"],
                    c["MASKED_FIRST"], c["FIXED_G"]) == (*entry.tiles, entry.sums_by_dot, entry.masked_first,
                                                         entry.fixed_g), (target, d_class, layout, kind)
            assert c["BLOCK_D"] == d_class
        if entry.features < 64:  # compiled for that key-feature width: a wider call falls to the next kind
            wider = forward_config(d_class, torch.bfloat16, target, **banded, **{**calls[kind],
                                                                              "n_classes": entry.features + 1})
            assert (wider["BLOCK_M"], wider["BLOCK_N"], wider["num_warps"], wider["num_stages"], wider["FIXED_G"],
                    wider["MASKED_FIRST"], wider["SUMS_BY_DOT"]) != (*entry.tiles, entry.fixed_g, entry.masked_first,
                                                                     entry.sums_by_dot), (target, d_class, layout, kind)
        if layout == "banded" and (target, d_class, "grouped", kind) not in TILES:
            assert forward_config(d_class, torch.bfloat16, target, banded=True, grouped=True, **calls[kind]) == c
    assert LAYOUTS["grouped"] == ("grouped", "banded")
    for target in (80, 90):
        for d_class in (32, 64, 128, 256):
            assert all((target, d_class, layout, "any") in TILES for layout in ("plain", "banded")), (target, d_class)


def test_sums_by_dot_needs_a_free_feature_column():
    """Forced on with 16 key classes (the features' 16 columns all taken), the launch says why in one line
    instead of summing a class's mass as the row's."""
    inputs = make_inputs(1, 2, 8, 16, [8], seed=3)
    spec = StatsSpec(n_key_classes=16, entropy=True, class_mass=True)
    with pytest.raises(ValueError, match="free key-feature column"):
        ta.attention_stats_triton(*inputs[:4], torch.zeros(1, 8, dtype=torch.long), spec, blocks={"SUMS_BY_DOT": True})
