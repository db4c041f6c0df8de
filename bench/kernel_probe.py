"""The fused forward against flash attention, kernel only: the first thing a lent GPU measures.

    python bench/kernel_probe.py [--out bench/results_kernel_probe.md] [--lengths 4096] [--repeats 20]

For each head dimension (64, 128) and layout (plain: an encoder's; causal grouped-query: a
decoder's, 4 query heads per key/value head), in bf16, it times three forwards on the same q, k, v:
    sdpa      torch's scaled_dot_product_attention (flash-attention where torch has it)
    flash     bench/flash_baseline.py, the Triton tutorial's loop without statistics: the yardstick of
              the instruction budget (`python -m bertscope.kernels.triton_aot --budget`)
    fused     bertscope's fused forward with the default statistics (entropy, offsets -1 0 +1, four
              key classes), the kernel `bertscope run` launches
and writes the median milliseconds, TFLOP/s (4 B H L^2 D, halved for causal) and fused / flash. The
budget predicts that ratio where the kernel is bound by instruction issue: the main loop's
warp-instructions per 1,000 scores over the baseline's (docs/gpu.md has the prediction per target).

Without a GPU it refuses in one line (exit code 1), unless --dry-run-cpu: tiny shapes through
Triton's interpreter and torch on the CPU, to check the code paths (the tests do), no timing worth
reading.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

CASES = [(64, "plain"), (64, "causal GQA"), (128, "plain"), (128, "causal GQA")]  # (D, layout)
HEADS, KV_HEADS = 16, 4  # the causal GQA case shares each key/value head between 4 query heads
DEFAULT_LENGTHS = (4096,)
DEFAULT_BATCH = 4


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="write the table here too (markdown)")
    p.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    p.add_argument("--repeats", type=int, default=20, help="timed calls per forward (median)")
    p.add_argument("--dry-run-cpu", action="store_true",
                   help="no GPU: tiny shapes through Triton's interpreter, to check the code paths only")
    return p.parse_args(argv)


# The baseline's tiles: on a GPU, those the budget measures it at (its fewest warp-instructions per score
# without a spill, `python -m bertscope.kernels.triton_aot --budget`: 128 x 128, 8 warps, except 128 x 64 at
# D = 128 on sm_80); under the interpreter 16 x 16 (the baseline needs L a multiple of its blocks).
INTERPRETED_TILES = dict(block_m=16, block_n=16)


def flash_tiles(arch: int, D: int) -> dict:
    return dict(block_m=128, block_n=64 if (arch < 90 and D > 64) else 128, num_warps=8)


def forwards(D: int, layout_name: str, B: int, L: int, device, dtype, flash_blocks: dict):
    """{name: zero-argument callable} of the three forwards on one set of inputs."""
    import flash_baseline
    import torch

    from bertscope.kernels.spec import AttentionLayout, StatsSpec
    from bertscope.kernels.triton_attention import attention_stats_triton

    causal = layout_name != "plain"
    kv = KV_HEADS if causal else HEADS
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(B, HEADS, L, D, generator=g).to(device, dtype)
    k, v = (torch.randn(B, kv, L, D, generator=g).to(device, dtype) for _ in range(2))
    k_full, v_full = (t.repeat_interleave(HEADS // kv, dim=1) for t in (k, v))  # what SDPA and flash read
    key_valid = torch.ones(B, L, dtype=torch.bool, device=device)
    key_class = torch.randint(0, 4, (B, L), generator=g).to(device)
    spec = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, entropy=True, class_mass=True)
    layout = AttentionLayout(causal=True, n_key_value_heads=kv) if causal else AttentionLayout()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return {
        "sdpa": lambda: sdpa(q, k_full, v_full, is_causal=causal),
        "flash": lambda: flash_baseline.flash_attention(q, k_full, v_full, causal=causal, **flash_blocks),
        # out (B, L, H, D), as transformers takes it -> (B, H, L, D)
        "fused": lambda: attention_stats_triton(q, k, v, key_valid, key_class, spec, layout=layout)[0].transpose(1, 2),
    }


def median_ms(fn, repeats: int, cuda: bool):
    """(median milliseconds of `repeats` calls of fn, its output); on a GPU one call first compiles and
    warms up, untimed; in the CPU dry run (the interpreter, slow) there is nothing to warm."""
    import torch

    out = fn() if cuda else None  # compile and warm up
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' modules are imported
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run_cpu
    if not cuda and not args.dry_run_cpu:
        print("kernel_probe: needs a CUDA GPU (torch sees none); --dry-run-cpu checks the code paths", file=sys.stderr)
        return 1
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    lengths = args.lengths if cuda else [48]
    arch = torch.cuda.get_device_capability()[0] * 10 if cuda else 0
    B, repeats = (args.batch_size, args.repeats) if cuda else (1, 1)
    name = torch.cuda.get_device_name() if cuda else "CPU dry run (interpreter: no timing worth reading)"
    lines = [f"# Kernel probe: {name}", "",
             f"B = {B}, {HEADS} query heads ({KV_HEADS} key/value heads when causal GQA), "
             f"{'bf16' if cuda else 'fp32'}; median of {repeats} calls; TFLOP/s = 4 B H L^2 D (causal: half) / time.",
             "", "| D | layout | L | sdpa ms | flash ms | fused ms | sdpa TFLOP/s | flash TFLOP/s | fused TFLOP/s "
             "| fused / flash | fused / sdpa | max abs diff to sdpa |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for L in lengths:
        for D, layout_name in CASES:
            fns = forwards(D, layout_name, B, L, device, dtype, flash_tiles(arch, D) if cuda else INTERPRETED_TILES)
            timed = {k: median_ms(fn, repeats, cuda) for k, fn in fns.items()}
            ms = {k: t for k, (t, _) in timed.items()}
            want = timed["sdpa"][1].float()
            err = max((timed[k][1].float() - want).abs().max().item() for k in ("flash", "fused"))
            flop = 4.0 * B * HEADS * L * L * D / (2 if layout_name != "plain" else 1)
            tf = {k: flop / (t * 1e-3) / 1e12 for k, t in ms.items()}
            lines.append(f"| {D} | {layout_name} | {L} | {ms['sdpa']:.3f} | {ms['flash']:.3f} | {ms['fused']:.3f} | "
                         f"{tf['sdpa']:.1f} | {tf['flash']:.1f} | {tf['fused']:.1f} | "
                         f"{ms['fused'] / ms['flash']:.2f} | {ms['fused'] / ms['sdpa']:.2f} | {err:.1e} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
