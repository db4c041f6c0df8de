"""One decoder attention layer on the CPU: the chunked backend's statistics vs bare SDPA.

    python bench/bench_layouts.py                      # SmolLM2 at 1k/4k/8k, Gemma-3 at 8k/16k
    python bench/bench_layouts.py --cases smollm2:1024 gemma-window:8192 --repeats 5 --out /tmp/r.md

One attention call per case, random float32 q, k, v (batch 1, no padding), at the shapes of
the two decoders of issue 29:
    smollm2        9 query / 3 key-value heads, head dim 64, causal
    gemma-window   4 / 1 heads, head dim 256, causal sliding window 512 (layout window (511, 0))
    gemma-global   4 / 1 heads, head dim 256, causal (Gemma-3's every 6th layer)
Methods, taking turns within each repeat (order rotated by repeat):
    sdpa      the floor: `gated_sdpa` without gates, i.e. torch SDPA with is_causal (causal) or
              SDPA over query blocks each with a (block x band) mask (window: a full L x L mask
              would not be the floor anyone runs at 32k); no statistics
    chunked   `attention_stats(..., backend="chunked")` with the statistics `bertscope run` asks
              for (`RunSettings().spec()`: entropy, offsets -2..2, 4 key classes, argmax,
              column mass) and the output
Reported: median milliseconds over repeats, and the paired ratio (median over repeats of
sdpa time / chunked time in the same repeat; 1.0 = as fast as the floor). The machine is
shared: `uptime` is printed before and after.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import torch

SHAPES = {  # name: (query heads, key/value heads, head dim, layout kwargs)
    "smollm2": (9, 3, 64, {"causal": True}),
    "gemma-window": (4, 1, 256, {"causal": True, "window": (511, 0)}),
    "gemma-global": (4, 1, 256, {"causal": True}),
}
DEFAULT_CASES = ["smollm2:1024", "smollm2:4096", "smollm2:8192", "gemma-window:8192", "gemma-window:16384",
                 "gemma-global:8192", "gemma-global:16384"]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def case_inputs(name: str, L: int, seed=0):
    from bertscope.kernels.spec import AttentionLayout

    H, H_kv, D, kw = SHAPES[name]
    layout = AttentionLayout(n_key_value_heads=H_kv, **kw)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, L, D, generator=g)
    k, v = (torch.randn(1, H_kv, L, D, generator=g) for _ in range(2))
    key_valid = torch.ones(1, L, dtype=torch.bool)
    key_class = torch.randint(0, 4, (1, L), generator=g)
    return (q, k, v, key_valid, key_class), layout


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=DEFAULT_CASES, help="shape:L, shape one of " + ", ".join(SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-bytes", type=int, default=None, help="the chunked backend's block of scores")
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (both methods; the compiled row pass shares torch's OpenMP pool)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from bertscope.analyses.surface.command import RunSettings
    from bertscope.kernels.backends import attention_stats
    from bertscope.kernels.chunked import attention_stats_chunked
    from bertscope.kernels.gates import gated_sdpa

    spec = RunSettings().spec()
    head = [f"command: `python bench/{' '.join(['bench_layouts.py', *sys.argv[1:]])}`",
            f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, batch 1; spec: {spec}",
            f"load before: `{uptime()}`"]
    print("\n".join(head), flush=True)
    rows = []
    with torch.inference_mode():
        for case in args.cases:
            name, L = case.split(":")
            inputs, layout = case_inputs(name, int(L))
            q, k, v, key_valid, key_class = inputs

            def sdpa(q=q, k=k, v=v, key_valid=key_valid, layout=layout):
                return gated_sdpa(q, k, v, key_valid, None, layout=layout)

            def chunked(inputs=inputs, layout=layout):
                if args.chunk_bytes is None:
                    return attention_stats(*inputs, spec, backend="chunked", layout=layout)
                return attention_stats_chunked(*inputs, spec, layout=layout, chunk_bytes=args.chunk_bytes)

            methods = {"sdpa": sdpa, "chunked": chunked}
            for fn in methods.values():  # warm-up
                fn()
            times = {m: [] for m in methods}
            for r in range(args.repeats):
                order = list(methods) if r % 2 == 0 else list(methods)[::-1]
                for m in order:
                    t0 = time.perf_counter()
                    methods[m]()
                    times[m].append(time.perf_counter() - t0)
            paired = statistics.median(a / b for a, b in zip(times["sdpa"], times["chunked"]))
            row = (case, layout.describe(), *(statistics.median(times[m]) * 1e3 for m in methods), paired,
                   min(times["sdpa"]) / min(times["chunked"]))
            rows.append(row)
            print(f"{row[0]:<20} sdpa {row[2]:9.1f} ms  chunked {row[3]:9.1f} ms  paired {row[4]:.2f}x  "
                  f"best/best {row[5]:.2f}x", flush=True)
    tail = f"load after: `{uptime()}`"
    print(tail)
    table = ["| case | layout | sdpa ms (median) | chunked+stats ms (median) | sdpa/chunked paired | best/best |",
             "|---|---|---:|---:|---:|---:|"]
    table += [f"| {c} | {d} | {a:.1f} | {b:.1f} | {p:.2f}x | {x:.2f}x |" for c, d, a, b, p, x in rows]
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n\n".join(["\n".join(head), "\n".join(table), tail]) + "\n")


if __name__ == "__main__":
    main()
