"""`bertscope patterns` against `bertscope run` on the same Wikipedia segments, whole process.

    python bench/bench_patterns.py                       # 1,000 segments, 3 interleaved repeats, --threads 1
    python bench/bench_patterns.py --limit 200 --repeats 2 --out /tmp/p.md
    python bench/bench_patterns.py --inprocess           # the per-batch work only, batch by batch

Both commands read the same 1,000 segments (`--corpus wiki` / `--data wiki`, Clark packing,
--max-len 128, seed 0) and are timed from launch to exit in fresh processes, as a user runs
them (figures included; `patterns` also materialises the maps of its first 16 segments for
the example figure). They take turns (run first in even repeats, patterns first in odd
ones), so both see the same stretch of machine load. Reported: every repeat's wall times,
the medians, the ratio of medians and the paired ratio (median over repeats of
patterns / run within a repeat). The target is patterns within 1.3x of run.

`--inprocess` times the per-batch work alone, in one process, so machine load hits both
alike: the same segments and batch plan; for every batch, `run`'s work (collate with the
vocabulary classes, forward with `RunSettings().spec()`, `HeadStats.add`) and `patterns`'
work (collate with the PARTS classes, forward with `patterns.SPEC`, `PatternCounts.add`),
in an order that alternates from batch to batch. Making the segments is shared and not
timed; `--repeats` passes over the plan.
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


def inprocess(limit: int, repeats: int, threads: int) -> str:
    import torch

    from bertscope.analyses.patterns import stats as P
    from bertscope.analyses.surface.command import RunSettings
    from bertscope.engine.accumulate import HeadStats
    from bertscope.engine.loop import _collate, forward, windowed_batches
    from bertscope.models.attention import HeadProbe
    from bertscope.models.loading import load_model
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentOptions, iter_segments
    from bertscope.text.token_classes import part_ids

    torch.set_num_threads(threads)
    loaded = load_model(None)
    segments = list(iter_segments(open_corpus("wiki"), loaded.tokenizer, SegmentOptions(limit=limit)))
    for s in segments:
        s.token_class = part_ids(s, loaded.tokenizer)
    plan = list(windowed_batches(segments, 16))
    run_spec = RunSettings().spec()
    jobs = {
        "run": (run_spec, None, HeadProbe(loaded.n_layers, loaded.n_heads, run_spec, backend="chunked"),
                lambda: HeadStats(loaded.n_layers, loaded.n_heads, run_spec, loaded.classes)),
        "patterns": (P.SPEC, P.CLASSES, HeadProbe(loaded.n_layers, loaded.n_heads, P.SPEC, backend="chunked"),
                     lambda: P.PatternCounts(loaded.n_layers, loaded.n_heads)),
    }
    rows = []
    with torch.inference_mode():
        for r in range(repeats):
            spent = {"run": 0.0, "patterns": 0.0}
            accs = {name: make() for name, (_, _, _, make) in jobs.items()}
            for k, (indices, batch) in enumerate(plan):
                for name in (("run", "patterns") if (k + r) % 2 == 0 else ("patterns", "run")):
                    spec, classes, probe, _ = jobs[name]
                    t0 = time.perf_counter()
                    ctx = _collate(loaded, batch, indices, spec, classes, None, "cpu", k + 1)
                    accs[name].add(forward(loaded, probe, ctx))
                    spent[name] += time.perf_counter() - t0
            load = os.getloadavg()[0]
            print(f"repeat {r + 1}: run {spent['run']:.1f} s, patterns {spent['patterns']:.1f} s, "
                  f"ratio {spent['patterns'] / spent['run']:.3f} (load average {load:.2f})", flush=True)
            rows.append((spent["run"], spent["patterns"], load))
    ratio = statistics.median(p / q for q, p, _ in rows)
    return "\n".join([
        "## In process, batch by batch (`--inprocess`)",
        "",
        f"{len(segments)} segments in {len(plan)} batches of 16, `--threads {threads}`; per batch: collate, forward "
        "with the statistics, accumulate; the two alternate batch by batch.",
        "",
        "| repeat | run (s) | patterns (s) | patterns / run | load average |",
        "|---|---:|---:|---:|---:|",
        *[f"| {i + 1} | {q:.1f} | {p:.1f} | {p / q:.3f} | {l:.2f} |" for i, (q, p, l) in enumerate(rows)],
        "",
        f"Median ratio patterns / run: {ratio:.3f}.",
        "",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-figures", action="store_true", help="pass --no-figures to both commands")
    ap.add_argument("--inprocess", action="store_true", help="time the per-batch work only (see above) and "
                    "append it to --out")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results_patterns.md"))
    args = ap.parse_args(argv)
    if args.inprocess:
        text = inprocess(args.limit, args.repeats, args.threads)
        out = Path(args.out)
        out.write_text((out.read_text() + "\n" if out.exists() else "") + text)
        print(text)
        return 0
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
