"""What per-example statistics cost: the surface suite with and without examples.parquet,
against the bare SDPA forward, as ratios in one run.

    python bench/bench_engine.py [--lengths 128 512] [--batch-size 16] [--batches 4] [--repeats 5] [--threads N]

Three methods on the same Wikipedia segments of exactly L tokens (`common.wiki_token_stream`),
the real all-MiniLM-L6-v2, interleaved batch by batch in rotated order:
    floor        AutoModel(attn_implementation="sdpa"), no statistics
    surface      bertscope's fold into HeadStats (what `bertscope run` does)
    per-example  the same fold into PerExampleWriter + HeadStats, with the writer's Parquet
                 part written after every `--batches` batches (a checkpoint), as
                 `bertscope run --per-example` does
Reported: median over repeats of each method's time, as throughput ratios: surface and
per-example to the floor, and per-example to surface (the target: at most 10% slower).
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import make_batches, wiki_token_stream

METHODS = ("floor", "surface", "per-example")


class Engine:
    def __init__(self, folder: Path):
        import torch
        from transformers import AutoModel

        from bertscope.analyses.surface.command import RunSettings
        from bertscope.models.attention import HeadProbe
        from bertscope.models.loading import load_model

        self.torch, self.folder = torch, folder
        self.loaded = load_model()
        self.spec = RunSettings().spec()
        self.probe = HeadProbe(self.loaded.n_layers, self.loaded.n_heads, self.spec, backend="chunked")
        self.floor = AutoModel.from_pretrained(self.loaded.path, attn_implementation="sdpa",
                                               local_files_only=True).eval()

    def accumulators(self, method):
        from bertscope.engine.accumulate import HeadStats
        from bertscope.engine.per_example import PerExampleWriter

        ld = self.loaded
        accs = [HeadStats(ld.n_layers, ld.n_heads, self.spec, ld.classes)]
        if method == "per-example":
            accs.insert(0, PerExampleWriter(Path(tempfile.mkdtemp(dir=self.folder)), self.spec, ld.classes))
        return accs

    def step(self, method, batch, accs, number):
        from bertscope.engine.loop import collate_batch, forward
        from bertscope.text.segments import collate

        with self.torch.inference_mode():
            if method == "floor":
                self.floor(**collate(batch, self.loaded.tokenizer.pad_token_id))
                return
            ctx = forward(self.loaded, self.probe, collate_batch(self.loaded, batch, range(len(batch)), self.spec,
                                                                 number=number))
            for acc in accs:
                acc.add(ctx)
                acc.batches_done = number

    def checkpoint(self, accs):
        for acc in accs[:-1]:
            acc.save()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads (default: torch's); 1 is steadier on a shared machine")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Path(tmp))
        stream = wiki_token_stream(engine.loaded.tokenizer, (max(args.lengths) - 3) * args.batch_size * args.batches)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch_size}, "
              f"{args.batches} batches x {args.repeats} repeats, load {os.getloadavg()[0]:.2f}")
        rows = []
        for L in args.lengths:
            batches = make_batches(engine.loaded.tokenizer, L, args.batch_size, args.batches, stream)
            for m in METHODS:  # warm-up
                engine.step(m, batches[0], engine.accumulators(m), 1)
            spent = {m: [] for m in METHODS}
            for r in range(args.repeats):
                accs = {m: engine.accumulators(m) for m in METHODS}
                t = dict.fromkeys(METHODS, 0.0)
                for i, batch in enumerate(batches):
                    k = (r + i) % len(METHODS)
                    for m in METHODS[k:] + METHODS[:k]:
                        gc.collect()
                        t0 = time.perf_counter()
                        engine.step(m, batch, accs[m], i + 1)
                        if i == len(batches) - 1 and m != "floor":
                            engine.checkpoint(accs[m])  # the parquet part is part of the cost
                        t[m] += time.perf_counter() - t0
                for m in METHODS:
                    spent[m].append(t[m])
            med = {m: statistics.median(v) for m, v in spent.items()}
            paired = statistics.median(a / b for a, b in zip(spent["surface"], spent["per-example"]))
            rows.append((L, med, paired))
            print(f"L={L}: floor {med['floor']:.3f}s  surface {med['surface']:.3f}s  per-example "
                  f"{med['per-example']:.3f}s  (load {os.getloadavg()[0]:.2f})", flush=True)
    print("\n| L | surface / floor | per-example / floor | per-example / surface (paired) |")
    print("|---:|---:|---:|---:|")
    for L, med, paired in rows:
        print(f"| {L} | {med['floor'] / med['surface']:.2f}x | {med['floor'] / med['per-example']:.2f}x | "
              f"{med['surface'] / med['per-example']:.2f}x ({paired:.2f}x) |")


if __name__ == "__main__":
    main()
