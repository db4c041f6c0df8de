"""The Triton kernels: resources from the ahead-of-time compile, memory traffic on paper,
and (on a GPU) real timings against eager, chunked and SDPA.

    python bench/bench_triton.py                 # AOT table + traffic model (+ timings when torch sees a GPU)
    python bench/bench_triton.py --out bench/results_triton.md

No GPU is lent to this project, so the table in results_triton.md was made without one:
registers, spills and shared memory come from compiling every shipped specialisation for
sm_80 and sm_90 (`bertscope.kernels.triton_aot`), and the speed-up is *on paper*: bytes
each kernel must move per (batch, head) against the eager path, which writes and re-reads
the full L x L maps. On a machine with a GPU the same command adds measured times
(`triton.testing.do_bench`, median ms) for B x H x L = 8x12x128, 4x12x512 and 1x12x2048:
the one command a GPU user runs to get the real table. Run `bertscope selftest` first.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile real kernels, never the interpreter's

import torch

from bertscope.kernels.spec import StatsSpec

SHAPES = [(8, 12, 128), (4, 12, 512), (1, 12, 2048)]  # (B, H, L)
D = 64  # bert-base head size (MiniLM's is 32)
# offsets -2..2, 4 key classes, entropy and argmax: what `bertscope run --argmax` asks for
SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, entropy=True, class_mass=True, argmax=True)
# peak DRAM bandwidth (bytes/s) and dense throughput (flop/s: fp32 FMA units, fp16 tensor cores)
GPUS = {"A100 (sm_80)": (1.555e12, 19.5e12, 312e12), "H100 SXM (sm_90)": (3.35e12, 67e12, 989e12)}


def traffic_per_head(L: int, D: int, elem: int, spec: StatsSpec = SPEC) -> dict[str, float]:
    """Bytes per (batch, head) map that must cross DRAM, on paper.

    eager: scores, masked scores, P and xlogy(P, P) written (4 maps) and read back 7 times
        (masked_fill, softmax, P @ V, xlogy, its sum, P @ onehot, argmax), plus q, k, v in
        and the output out (see bench/test_bench_kernels.py, `paper_bytes_per_head`).
    fused (triton_attention): q, k, v in once (K and V tiles are re-read per query block,
        from L2), the output, the row statistics and the fp32 row lse out; no L x L map.
    column pass (triton_maps): q, k and lse in, the column mass out.
    JS pair kernel (triton_js), per pair of heads: both heads' q and k and lse in.
    """
    O, C = len(spec.offsets), spec.n_key_classes
    linear = 3 * L * D * elem + L * D * elem  # q, k, v in; out
    eager = 11 * L * L * elem + linear + L * (2 + O + C) * elem
    fused = linear + L * (1 + O + C) * elem + L * 8 + L * 4 + L * 5  # stats, argmax int64, lse, valid + class
    column = 2 * L * D * elem + L * 4 + L * elem + L
    js_pair = 2 * (2 * L * D * elem + L * 4) + L * 8
    return {"eager": eager, "fused": fused, "column": column, "js_pair": js_pair}


def flops_per_head(L: int, D: int) -> float:
    return 4.0 * L * L * D  # Q K^T and P V


def paper_table() -> str:
    lines = ["| B x H x L | dtype | eager bytes/head | fused bytes/head | ratio | column pass | JS per pair | "
             + " | ".join(f"{g}: eager / fused us per head" for g in GPUS) + " |",
             "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(GPUS)]
    for B, H, L in SHAPES:
        for dtype, elem in (("fp32", 4), ("fp16", 2)):
            t = traffic_per_head(L, D, elem)
            cells = []
            for bw, fp32_peak, fp16_peak in GPUS.values():
                peak = fp32_peak if elem == 4 else fp16_peak
                # roofline: memory time vs compute time; eager's matmuls run at the same peak
                eager_us = max(t["eager"] / bw, flops_per_head(L, D) / peak) * 1e6
                fused_us = max(t["fused"] / bw, flops_per_head(L, D) / peak) * 1e6
                cells.append(f"{eager_us:.2f} / {fused_us:.2f} ({eager_us / fused_us:.1f}x)")
            lines.append(f"| {B}x{H}x{L} | {dtype} | {t['eager'] / 2**20:.2f} MiB | {t['fused'] / 2**10:.1f} KiB | "
                         f"{t['eager'] / t['fused']:.0f}x | {t['column'] / 2**10:.1f} KiB | "
                         f"{t['js_pair'] / 2**10:.1f} KiB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def aot_table() -> str:
    from bertscope.kernels import triton_aot

    rows = triton_aot.compile_all()  # the fused forward, column, word-map and JS kernels, sm_80 and sm_90
    lines = ["| kernel | specialisation | D | arch | registers | spill st/ld (B) | shared (B) |",
             "|---|---|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['kernel']} | {r['spec']} | {r.get('D', '')} | {r['arch']} | {r['registers']} | "
                     f"{r['spill_stores']}/{r['spill_loads']} | {r['shared']} |")
    spilled = sum(1 for r in rows if r["spill_stores"] or r["spill_loads"])
    return "\n".join(lines) + f"\n\n{len(rows)} compiled kernels, {spilled} with register spills."


def gpu_table() -> str:
    """Median ms per call on the GPU: eager, chunked (torch row pass), triton, and bare SDPA."""
    import triton

    from bertscope.kernels.backends import attention_stats

    lines = ["| B x H x L | dtype | sdpa (no stats) | eager | chunked | triton | triton vs eager | triton vs sdpa |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for B, H, L in SHAPES:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
            key_valid = torch.ones(B, L, dtype=torch.bool, device="cuda")
            key_valid[-1, L - L // 8:] = False
            key_class = torch.randint(0, 4, (B, L), device="cuda", generator=g)
            ms = {"sdpa": triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=key_valid[:, None, None, :]))}  # noqa: B023  (do_bench calls it at once)
            for backend in ("eager", "chunked", "triton"):
                ms[backend] = triton.testing.do_bench(
                    lambda: attention_stats(q, k, v, key_valid, key_class, SPEC, backend=backend))  # noqa: B023  (do_bench calls it at once)
            lines.append(f"| {B}x{H}x{L} | {str(dtype)[6:]} | {ms['sdpa']:.3f} | {ms['eager']:.3f} | "
                         f"{ms['chunked']:.3f} | {ms['triton']:.3f} | {ms['eager'] / ms['triton']:.1f}x | "
                         f"{ms['sdpa'] / ms['triton']:.2f}x |")
    return "\n".join(lines)


def triton_version() -> str:
    import triton

    return triton.__version__


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the markdown here")
    parser.add_argument("--no-aot", action="store_true", help="skip the ahead-of-time compile table")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    parts = [
        "# bertscope Triton kernels: resources, traffic and timings",
        "\n```\n$ python bench/bench_triton.py"
        f"{' ' + ' '.join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ''}\n"
        f"torch {torch.__version__}, triton {triton_version()}, python {platform.python_version()}, "
        f"GPU: {gpu or 'none'}\n```",
        f"\n## Memory traffic per (batch, head) on paper (D={D}, offsets -2..2, 4 key classes, entropy, argmax)\n",
        paper_table(),
        "\nRoofline times are max(bytes / DRAM bandwidth, 4 L^2 D flop / peak) per head; eager's matmuls "
        "are given the same peak, so the ratio is the traffic saved, not a measurement.",
    ]
    if not args.no_aot:
        parts += ["\n## Ahead-of-time compilation (triton.compile + ptxas -v, no GPU needed)\n", aot_table()]
    if gpu:
        parts += [f"\n## Measured on {gpu} (triton.testing.do_bench, median ms per call)\n", gpu_table()]
    else:
        parts += ["\n## Measured timings\n",
                  "No GPU here: run `python bench/bench_triton.py` on a GPU machine for the measured table "
                  "(after `bertscope selftest`). Interpreter times are not speed and are not reported."]
    parts.append(f"\n(total {time.perf_counter() - t0:.0f} s)")
    text = "\n".join(parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
