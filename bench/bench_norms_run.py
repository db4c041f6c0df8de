"""`bertscope run` with the norm-based twins against without, on the embedded MiniLM: the cost ratio in one
invocation, runs interleaved (off, on, off, on, ...) so that the machine's load falls on both alike.
Each run's time is run.json's `elapsed_s` (model load, segments, forward passes, outputs; no figures), and
its CPU time (user + system of the child process: steadier than the wall clock on a shared machine).
bench/results_norms.md has the numbers.

    python bench/bench_norms_run.py [--limit 200] [--pairs 3] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one(flag: str, limit: int, threads: int | None, out: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "bertscope.cli", "run", "--limit", str(limit), "--no-figures", "--quiet", flag,
           "--out", str(out)] + (["--threads", str(threads)] if threads else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, check=True, env=os.environ)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads((out / "run.json").read_text())["elapsed_s"], cpu


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    times = {"--no-norms": [], "--norms": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for flag in (times if i % 2 == 0 else reversed(times)):
                times[flag].append(one(flag, args.limit, args.threads, Path(tmp) / f"{flag[2:]}{i}"))
                print(f"{flag:<11} run {i + 1}: {times[flag][-1][0]:.2f} s wall, {times[flag][-1][1]:.2f} s CPU",
                      flush=True)
    for k, what in ((0, "wall (elapsed_s)"), (1, "CPU (user + system)")):
        off, on = (statistics.median(t[k] for t in times[f]) for f in times)
        ratios = [b[k] / a[k] for a, b in zip(times["--no-norms"], times["--norms"])]
        print(f"{what}: median --no-norms {off:.2f} s, --norms {on:.2f} s: ratio {on / off:.3f} "
              f"(per pair {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
