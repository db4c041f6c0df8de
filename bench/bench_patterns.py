"""`bertscope patterns` against `bertscope run` on the same Wikipedia segments, whole process.

    python bench/bench_patterns.py                       # 1,000 segments, 3 interleaved repeats, --threads 1
    python bench/bench_patterns.py --limit 200 --repeats 2 --out /tmp/p.md

Both commands read the same 1,000 segments (`--corpus wiki` / `--data wiki`, Clark packing,
--max-len 128, seed 0) and are timed from launch to exit in fresh processes, as a user runs
them (figures included; `patterns` also materialises the maps of its first 16 segments for
the example figure). They take turns (run first in even repeats, patterns first in odd
ones), so both see the same stretch of machine load. Reported: every repeat's wall times,
the medians, the ratio of medians and the paired ratio (median over repeats of
patterns / run within a repeat). The target is patterns within 1.3x of run.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent / "bertscope"


def commands(limit: int, threads: int, out: Path, extra: list[str]) -> dict[str, list[str]]:
    common = ["--limit", str(limit), "--threads", str(threads), "--quiet", *extra]
    return {"run": [str(BIN), "run", "--corpus", "wiki", *common, "--out", str(out / "run")],
            "patterns": [str(BIN), "patterns", "--data", "wiki", *common, "--out", str(out / "patterns")]}


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-figures", action="store_true", help="pass --no-figures to both commands")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results_patterns.md"))
    args = ap.parse_args(argv)
    extra = ["--no-figures"] if args.no_figures else []
    times: dict[str, list[float]] = {"run": [], "patterns": []}
    lines = []
    for r in range(args.repeats):
        order = ["run", "patterns"] if r % 2 == 0 else ["patterns", "run"]
        with tempfile.TemporaryDirectory() as tmp:
            cmds = commands(args.limit, args.threads, Path(tmp), extra)
            got = {}
            for name in order:
                load = os.getloadavg()[0]
                got[name] = timed(cmds[name])
                times[name].append(got[name])
                print(f"repeat {r + 1} {name:<9} {got[name]:7.1f} s  (load average {load:.2f})", flush=True)
        lines.append(f"| {r + 1} | {' then '.join(order)} | {got['run']:.1f} | {got['patterns']:.1f} | "
                     f"{got['patterns'] / got['run']:.2f} |")
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(p / q for p, q in zip(times["patterns"], times["run"]))
    text = "\n".join([
        "# `bertscope patterns` vs `bertscope run`, whole process",
        "",
        f"Command: `{' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}`",
        "",
        f"{args.limit} Wikipedia segments (Clark packing, --max-len 128, seed 0), `--threads {args.threads}`"
        + (", `--no-figures`" if args.no_figures else ", figures included") + f", {os.cpu_count()} CPU cores "
        "shared with other jobs; each command timed from launch to exit.",
        "",
        "| repeat | order | run (s) | patterns (s) | patterns / run |",
        "|---|---|---:|---:|---:|",
        *lines,
        "",
        f"Medians: run {med['run']:.1f} s, patterns {med['patterns']:.1f} s; ratio of medians "
        f"{med['patterns'] / med['run']:.2f}, paired ratio {paired:.2f} (target: at most 1.3).",
        "",
    ])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
