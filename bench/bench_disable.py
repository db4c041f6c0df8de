"""What sharing batches between gated variants saves: `bertscope heads disable`'s evaluation.

    python bench/bench_disable.py --threads 1                    # embedded MiniLM, 64 RTE test pairs
    python bench/bench_disable.py --model runs/ft-rte/checkpoints/rte-pretrained-seed0 --examples 96 \\
        --max-rows 256 512 1024

The same examples (a seeded sample of RTE3 test), the same 79 variants (baseline, each of the
72 heads uniform-disabled, each of the 6 layers), the same length-sorted batches of
`--batch-size` examples, evaluated two ways by `bertscope.analyses.heads.variants.evaluate_variants`:

    one by one   max_rows=0: one forward per variant and batch, the gates (layers, H) shared
                 by the batch (what a loop over variants would do with the gates).
    shared prefixes    max_rows=N: the baseline once per batch, its input to every layer
                 cached; then N / batch rows variants per forward, each starting from the cached
                 input to its first gated layer (the default of `heads disable`).
    replicated inputs  the same, share_prefix=False: the batch replicated once per variant
                 from the inputs on, with per-row gates.

The modes take turns `--repeats` times (so each sees the same load on a shared machine);
reported: the median seconds of each, the ratio one-by-one / shared, and whether every mode
predicted the same labels (they must: tested bit for bit on one thread in tests/analyses/heads/test_disable.py).
A model without a classification head gets a seeded random one: the timing does not care.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint (default: the embedded MiniLM, seeded random head)")
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-rows", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-replicated", action="store_true", help="skip the replicated-inputs modes")
    ap.add_argument("--variants", type=int, default=None, help="only the first N variants (default: all)")
    ap.add_argument("--out", default="bench/results_disable.md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from bertscope.analyses.heads.variants import (
        baseline,
        evaluate_variants,
        single_heads,
        whole_layers,
    )
    from bertscope.data.paths import seeded_sample
    from bertscope.data.readers.tasks import read_task
    from bertscope.kernels.spec import Gate
    from bertscope.models.loading import load_model
    from bertscope.tasks.inputs import encode_task

    loaded = load_model(args.model, task="sequence-classification", num_labels=None if args.model else 2)
    examples = seeded_sample(read_task("rte", "test"), args.examples, 0)
    task = encode_task("rte", examples, loaded.tokenizer, 128)
    L, H = loaded.n_layers, loaded.n_heads
    variants = [baseline(L, H)] + single_heads(L, H, Gate.UNIFORM) + whole_layers(L, H, Gate.UNIFORM)
    variants = variants[: args.variants]
    modes = {"one by one": (0, True), **{f"shared prefixes, max_rows {n}": (n, True) for n in args.max_rows},
             **({} if args.no_replicated else {f"replicated inputs, max_rows {n}": (n, False) for n in args.max_rows})}
    evaluate_variants(loaded, task, variants[:2], args.batch_size, 0, progress=False)  # warm-up

    times, cpu = {m: [] for m in modes}, {m: [] for m in modes}
    preds, forwards = {}, {}
    for r in range(args.repeats):
        for mode, (max_rows, share) in modes.items():
            t0, c0 = time.perf_counter(), time.process_time()
            res = evaluate_variants(loaded, task, variants, args.batch_size, max_rows, progress=False,
                                    share_prefix=share)
            times[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
            preds[mode], forwards[mode] = res.predictions, res.forwards
            print(f"repeat {r + 1}: {mode}: {times[mode][-1]:.2f} s wall, {cpu[mode][-1]:.2f} s CPU ({res.forwards} "
                  "forwards)", file=sys.stderr)
    ref = preds["one by one"]
    one, one_cpu = statistics.median(times["one by one"]), statistics.median(cpu["one by one"])
    tokens = int(task.lengths().sum())
    lines = [
        "# Shared batches for gated variants (`bertscope heads disable`)",
        "",
        f"`{' '.join(sys.argv)}`",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s), "
        f"{platform.processor() or platform.machine()}, model {'/'.join(Path(str(loaded.path)).parts[-2:])} ({L} "
        f"layers x {H} heads), {task.n_examples} RTE3-test pairs ({tokens} tokens without padding), batches of "
        f"{args.batch_size} examples, {len(variants)} variants (baseline, {L * H} heads, {L} layers, uniform gate), "
        f"median of {args.repeats} alternating repeats.",
        "",
        "| mode | forwards | wall s | one by one / this (wall) | CPU s | one by one / this (CPU) | same predictions |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for mode in modes:
        t, c = statistics.median(times[mode]), statistics.median(cpu[mode])
        same = bool(np.array_equal(preds[mode], ref))
        lines.append(f"| {mode} | {forwards[mode]} | {t:.2f} | {one / t:.2f}x | {c:.2f} | {one_cpu / c:.2f}x | "
                     f"{'yes' if same else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
