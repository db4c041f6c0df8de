"""The kernel parity tests on real CUDA kernels: `pytest -m gpu` on a machine with a GPU.

The interpreter suite (test_triton_*.py) proves the kernels' logic on the CPU; this file runs
the compiled kernels (the device's own dots, TF32 off, fp16/bf16 rounding, block sizes) at
the lengths that matter, L = 128 (single tile in half precision), 512 and 2048 (online),
against the eager reference in float64 on the same inputs, with fresh random inputs on every
run (the seed is in each failure message). Every case has padding (a full, a partial and a
single-key sequence) and KEEP / ZERO / UNIFORM / float head gates.

Collected everywhere, skipped without CUDA. Under `pytest -m gpu`, tests/conftest.py removes
TRITON_INTERPRET and collects this file alone, so the kernels are compiled; in any other
session they are interpreted (other test modules set TRITON_INTERPRET=1) and these tests
skip rather than run the interpreter at L = 2048.
"""
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (pytest -m gpu)")]

LENGTHS = [128, 512, 2048]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CLASSES = [4, 16, 32]
B, H, D = 3, 4, 64
DEVICE = "cuda"  # the check_* helpers run anywhere the kernels do (a CPU dry run: TRITON_INTERPRET=1, "cpu")
# largest error allowed against float64 eager on the same (rounded) inputs, absolute where
# |ref| <= 1 and relative above (`scaled_error`): fp32 accumulates over up to 2048 keys;
# half precision adds P rounded to the input dtype for P V and the class dot, and the
# results stored in it (2^-12 relative fp16, 2^-9 bf16, each)
TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


@pytest.fixture(scope="module")
def kernels():
    """The compiled kernel modules (TF32 off for the reference's fp32 matmuls)."""
    from bertscope.kernels import triton_attention

    if triton_attention.INTERPRETED:
        pytest.skip("the kernels were imported under TRITON_INTERPRET=1 in this session; run `pytest -m gpu`")
    torch.backends.cuda.matmul.allow_tf32 = False
    return triton_attention


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def make_case(L, dtype, C, seed):
    """Random inputs on the GPU: q, k, v (B, H, L, D) in `dtype`, padding, key classes,
    per-sequence float gates with a ZERO and a UNIFORM head, words of two tokens."""
    from bertscope.kernels.pooling import word_pooling
    from bertscope.kernels.spec import Gate, LayerGates

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, device=DEVICE) * 1.5 for _ in range(3))
    lengths = torch.tensor([L, (3 * L) // 5, 1], device=DEVICE)
    key_valid = torch.arange(L, device=DEVICE)[None, :] < lengths[:, None]  # (B, L)
    key_class = torch.randint(0, C, (B, L), generator=g, device=DEVICE)
    codes = LayerGates.from_codes([Gate.KEEP, Gate.ZERO, Gate.UNIFORM, Gate.KEEP])
    xi = codes.xi.to(DEVICE) * (0.5 + torch.rand(B, H, generator=g, device=DEVICE))  # (B, H); 0 where ZERO
    gates = LayerGates(xi=xi, uniform=codes.uniform.to(DEVICE))
    unit = torch.where(key_valid, torch.arange(L, device=DEVICE)[None, :] // 2, -1)  # (B, L)
    candidate = torch.ones(B, (L + 1) // 2, dtype=torch.bool, device=DEVICE)
    return (q.to(dtype), k.to(dtype), v.to(dtype), key_valid, key_class), gates, word_pooling(unit, candidate)


def double(inputs):
    return [t.double() if t.is_floating_point() else t for t in inputs]


def scaled_error(got, ref, rows=None) -> float:
    err = (got.double() - ref).abs() / ref.abs().clamp(min=1)
    return float(err[rows].max() if rows is not None else err.max())


def clear_rows(q, k, key_valid, layout=None):
    """(B, H, L): rows whose two largest scores (of the keys they see) are not within rounding of a tie."""
    from bertscope.kernels.spec import PLAIN, visible_mask

    layout = layout or PLAIN
    k = k.repeat_interleave(layout.group_size(q.shape[1]), dim=1)  # (B, H, L, D): each query head's keys
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * D**-0.5  # (B, H, L, L)
    s = s.masked_fill(~visible_mask(key_valid, layout), torch.finfo(torch.float64).min)
    top2 = s.topk(2, -1).values  # (B, H, L, 2)
    return top2[..., 0] - top2[..., 1] > 1e-3 * top2[..., 0].abs().clamp(min=1)


def check_forward(L, dtype, C, seed, layout=None):
    """The fused forward against eager: the output and every row statistic of the table the
    kernel computes (`kernel_outputs`: entropy, offset / class masses, argmax ...), under
    `layout` (default the plain one; k and v keep its key/value heads, the first of make_case's)."""
    from bertscope.kernels.eager import attention_stats_eager
    from bertscope.kernels.spec import PLAIN, StatsSpec
    from bertscope.kernels.triton_attention import attention_stats_triton, kernel_outputs

    layout = layout or PLAIN
    (q, k, v, key_valid, key_class), gates, _ = make_case(L, dtype, C, seed)
    H_kv = layout.n_key_value_heads or H
    inputs = (q, k[:, :H_kv], v[:, :H_kv], key_valid, key_class)
    stats = [stat for stat, _, _ in kernel_outputs()]
    spec = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=C,
                     **{s.switch: True for s in stats if s.switch != "offsets"})
    ids = torch.randint(0, 5, key_valid.shape, generator=torch.Generator().manual_seed(seed)).to(key_valid.device)
    out_ref, ref = attention_stats_eager(*double(inputs), spec, gates=gates, layout=layout, token_ids=ids)
    out, got = attention_stats_triton(*inputs, spec, gates=gates, layout=layout, token_ids=ids)
    sync()
    errors, agree = {"out": scaled_error(out, out_ref, key_valid)}, True  # (B, L) rows of the (B, L, H, D) output
    clear = clear_rows(q, inputs[1], key_valid, layout) & key_valid[:, None, :]
    for stat in stats:
        t, r = getattr(got, stat.name), getattr(ref, stat.name)
        if stat.dtype == "int64":  # an index: equal wherever the row's top two are not a near-tie
            agree = agree and torch.equal(t[clear], r[clear])
        else:
            assert t.dtype == dtype, stat.name
            errors[stat.name] = scaled_error(t, r)
    return errors, agree


def check_maps(L, dtype, seed):
    """Column mass and word maps (fed by the fused forward's lse) against eager."""
    from bertscope.kernels.eager import attention_stats_eager
    from bertscope.kernels.spec import StatsSpec
    from bertscope.kernels.triton_attention import attention_stats_triton

    inputs, gates, pooling = make_case(L, dtype, 4, seed)
    spec = StatsSpec(offsets=(), n_key_classes=4, entropy=False, argmax=False, column_mass=True,
                     word_maps=True, class_mass=True)
    _, ref = attention_stats_eager(*double(inputs), spec, gates=gates, pooling=pooling)
    _, got = attention_stats_triton(*inputs, spec, gates=gates, pooling=pooling)
    sync()
    errors = {name: scaled_error(getattr(got, name), getattr(ref, name)) for name in ("column_mass", "word_map")}
    # word argmax: equal wherever the reference's top two units are not (nearly) tied
    top2 = ref.word_map.topk(2, -1).values  # (B, H, W, 2)
    clear = top2[..., 0] - top2[..., 1] > 1e-3
    return errors, torch.equal(got.word_argmax[clear], ref.word_argmax[clear])


def check_js(L, dtype, seed):
    """Pairwise JS between the H heads against eager: relative error of the (H, H) sums."""
    from bertscope.kernels.js import pairwise_js_eager
    from bertscope.kernels.triton_js import pairwise_js_triton

    (q, k, _, key_valid, _), _, _ = make_case(L, dtype, 4, seed)
    ref = pairwise_js_eager(q.double(), k.double(), key_valid, D**-0.5)
    got = pairwise_js_triton(q, k, key_valid, D**-0.5)
    off = ~torch.eye(H, dtype=torch.bool)
    assert torch.all(got.diagonal() == 0) and torch.all(ref[off] > 0)
    return float(((got - ref).abs()[off] / ref[off]).max())


@pytest.mark.parametrize("C", CLASSES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L", LENGTHS)
def test_fused_forward_on_cuda(kernels, L, dtype, C):
    seed = fresh_seed()
    errors, argmax_agrees = check_forward(L, dtype, C, seed)
    assert max(errors.values()) <= TOL[dtype], f"seed {seed}: {errors}"
    assert argmax_agrees, f"seed {seed}: argmax differs on a row without a near-tie"


def decoder_layouts():
    from bertscope.kernels.spec import AttentionLayout

    return {"causal-gqa": AttentionLayout(causal=True, n_key_value_heads=2),
            "causal-window-gqa": AttentionLayout(causal=True, window=(100, 0), n_key_value_heads=1),
            "window": AttentionLayout(window=(64, 64))}


@pytest.mark.parametrize("layout", ["causal-gqa", "causal-window-gqa", "window"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L", [512, 2048])
def test_fused_forward_under_layouts_on_cuda(kernels, L, dtype, layout):
    """The same kernel with BANDED on (decoders: causal, windowed, grouped-query)."""
    seed = fresh_seed()
    errors, argmax_agrees = check_forward(L, dtype, 4, seed, decoder_layouts()[layout])
    assert max(errors.values()) <= TOL[dtype], f"seed {seed}: {errors}"
    assert argmax_agrees, f"seed {seed}: an index differs on a row without a near-tie"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L", LENGTHS)
def test_column_mass_and_word_maps_on_cuda(kernels, L, dtype):
    seed = fresh_seed()
    errors, argmax_agrees = check_maps(L, dtype, seed)
    assert max(errors.values()) <= TOL[dtype], f"seed {seed}: {errors}"
    assert argmax_agrees, f"seed {seed}: word argmax differs on a row without a near-tie"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("L", LENGTHS)
def test_pairwise_js_on_cuda(kernels, L, dtype):
    seed = fresh_seed()
    rel = check_js(L, dtype, seed)
    assert rel <= 1e-4 if dtype == torch.float32 else rel <= 1e-3, f"seed {seed}: max relative error {rel:.2e}"


def test_gpu_session_compiles_the_kernels(kernels):
    """Under `pytest -m gpu` nothing turned the interpreter on: the kernels are compiled."""
    assert not kernels.INTERPRETED and os.environ.get("TRITON_INTERPRET", "0") != "1"
