"""One gap of Triton's interpreter that the bf16 kernel tests need closed.

The interpreter keeps bfloat16 tensors as their raw bits (numpy uint16) and converts them
correctly in casts, but its `tl.dot` multiplies those raw integers (Triton 3.7.1,
`InterpreterBuilder.create_dot`), so any bf16 x bf16 dot comes out as garbage. A GPU's
tensor cores multiply bf16 operands exactly and accumulate in fp32; widening both operands
to fp32 first (exact: a bf16 is the top 16 bits of an fp32) gives that same product, so
this patch makes the interpreter compute what the hardware does, nothing more.

Still different from a GPU, and allowed for in the tests' tolerances: the interpreter
casts fp32 -> bf16 by truncation (`_convert_float` without a rounding mode), where the GPU
rounds to nearest even, so a bf16 value written by a kernel can be one bf16 ulp (2^-7
relative) off instead of half an ulp.
"""
import numpy as np


def emulate_bf16_dots() -> None:
    """Patch the interpreter's dot once per process (no-op when already patched, or when
    the interpreter has no such builder)."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = getattr(interpreter, "InterpreterBuilder", None)
    if builder is None or getattr(builder.create_dot, "_bf16_widened", False):
        return
    dot = builder.create_dot

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        bits = x.data.astype(np.uint32) << 16  # bf16 -> fp32, exactly
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_widened = True
    builder.create_dot = create_dot


def one_block_cfg(one_block):
    """The fused kernel's tiles for a test that runs both stages of its loop on the same inputs:
    None the default (under the interpreter, blocks of 16: `triton_config.INTERPRETER_BLOCK`),
    True one key block for a whole row of up to 128 keys, False blocks of 16 keys."""
    if one_block is None:
        return None
    return dict(BLOCK_M=32, BLOCK_N=128) if one_block else dict(BLOCK_M=16, BLOCK_N=16)


def spy_launches(monkeypatch) -> list[dict]:
    """Record the keyword arguments of every launch of the fused kernel through `triton_launch` (the call still
    runs): the list the launches append to. Tests read what a launch passed (its tuples, its switches)."""
    from bertscope.kernels import triton_launch

    real, launches = triton_launch.attn_stats_fwd, []

    class Spy:
        arg_names, fn = real.arg_names, real.fn

        def __getitem__(self, grid):
            def run(*a, **kw):
                launches.append(kw)
                return real[grid](*a, **kw)
            return run

    monkeypatch.setattr(triton_launch, "attn_stats_fwd", Spy())
    return launches
