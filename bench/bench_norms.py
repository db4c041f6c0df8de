"""The per-key value norms of the norm-based twins (`kernels.norms`), three ways, on the CPU: the product
f_h(x_j) = v_j W_h^T itself (hidden entries per key and head), the Gram form v_j M_h v_j^T (a D x D
product and a dot) and the Gram factor ||R_h v_j|| (a D x D product and a norm, what the engine runs).
Median of interleaved calls, one layer's values of a batch; bench/results_norms.md has the numbers.

    python bench/bench_norms.py [--threads N] [--repeats R]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bertscope.kernels.norms import head_factors, head_grams, value_norms, value_norms_direct, value_norms_gram

SHAPES = {  # name: (B, H, H_kv, L, D, hidden)
    "MiniLM 16 x 128 (H 12, D 32, hidden 384)": (16, 12, 12, 128, 32, 384),
    "BERT-base 16 x 128 (H 12, D 64, hidden 768)": (16, 12, 12, 128, 64, 768),
    "GQA 4 x 512 (H 8 / 2 kv, D 64, hidden 512)": (4, 8, 2, 512, 64, 512),
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print("| shape | product (ms) | Gram v M v^T (ms) | Gram factor ||R v|| (ms) | factor / product |")
    print("|---|---|---|---|---|")
    for name, (B, H, H_kv, L, D, hidden) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        v = torch.randn(B, H_kv, L, D, generator=g)
        w = torch.randn(hidden, H * D, generator=g) / hidden**0.5
        grams, factors = head_grams(w, H), head_factors(w, H)
        runs = {"product": (value_norms_direct, v, w), "gram": (value_norms_gram, v, grams),
                "factor": (value_norms, v, factors)}
        ref = value_norms_direct(v, w)
        for f, *a in runs.values():
            torch.testing.assert_close(f(*a), ref, rtol=1e-3, atol=1e-4)
        times = {k: [] for k in runs}
        for _ in range(args.repeats):
            for k, (f, *a) in runs.items():
                t = time.perf_counter()
                f(*a)
                times[k].append((time.perf_counter() - t) * 1e3)
        med = {k: statistics.median(t) for k, t in times.items()}
        print(f"| {name} | {med['product']:.2f} | {med['gram']:.2f} | {med['factor']:.2f} | "
              f"{med['factor'] / med['product']:.2f} |")


if __name__ == "__main__":
    main()
