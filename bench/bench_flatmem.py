"""Peak memory and throughput of `bertscope run` against the number of segments.

    python bench/bench_flatmem.py [--sizes 1000 10000 100000] [--max-len 32] [--lines 100000]
                                  [--format text|jsonl] [--threads 1] [--out bench/results_flatmem.md]

The corpus is one file of `--lines` lines built by cycling the packaged Wikipedia lead
sections (`load_wiki()`, title order) in a temporary folder: one article's text per line
(text), or per JSON object (`{"text": ...}`, jsonl). Every size runs on that same file:
`bertscope run --corpus FILE --limit N --max-len L --no-figures --quiet --threads T`, each in
a fresh subprocess whose peak RSS is its own `ru_maxrss` (`os.wait4` on that child alone).
The parent never imports torch, so it cannot raise a child's high-water mark.

Throughput is segments (and tokens) per second of the whole run, from run.json's
`elapsed_s`: model load, corpus index, segmentation and the pass. The fixed costs weigh on
the smallest size only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]


def write_corpus(path: Path, n_lines: int, fmt: str) -> None:
    """`n_lines` lines cycling the Wikipedia lead sections (newlines inside an article become spaces)."""
    from bertscope.text.corpus import load_wiki

    texts = [" ".join(d.parts[0].split()) for d in load_wiki()]
    with path.open("w", encoding="utf-8") as f:
        for i in range(n_lines):
            text = texts[i % len(texts)]
            f.write((json.dumps({"text": text}) if fmt == "jsonl" else text) + "\n")


def measure(corpus: Path | str, n: str, args, out: Path) -> dict:
    """One `bertscope run` in a fresh process: its peak RSS, wall time and run.json."""
    command = [str(Path(sys.executable).parent / "bertscope"), "run", "--corpus", str(corpus), "--limit", str(n),
               "--max-len", str(args.max_len), "--batch-size", str(args.batch_size), "--threads", str(args.threads),
               "--no-figures", "--quiet", "--out", str(out)]
    t0 = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, "OMP_NUM_THREADS": str(args.threads), **args.env})
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - t0
    stderr = child.stderr.read().decode()
    child.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {shlex.join(command)}\n{stderr}")
    record = json.loads((out / "run.json").read_text())
    return {"segments": record["segments"]["segments"], "tokens": record["n_tokens"], "elapsed_s": record["elapsed_s"],
            "wall_s": round(wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "command": shlex.join(command)}


def padding(limits, batch_size: int, windows) -> list[str]:
    """Padded tokens per real token of the Wikipedia sample under each window (no model runs:
    padding is a function of the segment lengths and the plan)."""
    from transformers import AutoTokenizer

    from bertscope.engine.loop import windowed_batches
    from bertscope.models.loading import load_model
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentOptions, make_segments

    tokenizer = AutoTokenizer.from_pretrained(load_model(None).path)
    lines = ["| segments (wiki, --max-len 128) | " + " | ".join(f"window {w or 'all'}" for w in windows) + " |",
             "|---:|" + "---:|" * len(windows)]
    for limit in limits:
        segments, _ = make_segments(open_corpus("wiki"), tokenizer, SegmentOptions(limit=limit))
        real = sum(s.n_tokens for s in segments)
        cells = []
        for w in windows:
            padded = sum(len(b) * max(s.n_tokens for s in b) for _, b in windowed_batches(segments, batch_size, w))
            cells.append(f"{100 * (padded / real - 1):.2f}%")
        lines.append(f"| {len(segments):,} | " + " | ".join(cells) + " |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["1000", "10000", "100000"], help="--limit of each run")
    parser.add_argument("--corpus", default=None,
                        help="run on this corpus (e.g. wiki) instead of the file of cycled Wikipedia text")
    parser.add_argument("--lines", type=int, default=100_000, help="lines of the corpus file")
    parser.add_argument("--max-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--format", choices=("text", "jsonl"), default="jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results_flatmem.md")
    parser.add_argument("--malloc-mmap-threshold", type=int, default=None, metavar="BYTES",
                        help="run the children with glibc's MALLOC_MMAP_THRESHOLD_ fixed at BYTES")
    parser.add_argument("--padding", action="store_true",
                        help="only print the padding of the Wikipedia sample (1000 and all segments) per window")
    args = parser.parse_args()
    args.env = {} if args.malloc_mmap_threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(args.malloc_mmap_threshold)}
    if args.padding:
        print("\n".join(padding([1000, None], args.batch_size, [1, 4, 16, 64, None])))
        return

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.corpus:
            corpus, about = args.corpus, f"--corpus {args.corpus}"
        else:
            corpus = Path(tmp) / f"wiki_cycled.{'jsonl' if args.format == 'jsonl' else 'txt'}"
            write_corpus(corpus, args.lines, args.format)
            about = (f"{args.lines:,} lines ({corpus.stat().st_size / 2**20:.1f} MB, {args.format}) cycling the "
                     "packaged Wikipedia lead sections")
        for n in args.sizes:
            row = measure(corpus, n, args, Path(tmp) / f"run{n}")
            rows.append(row)
            print(json.dumps(row), flush=True)

    base = rows[0]["peak_rss_mb"]
    lines = [
        "# Peak memory of `bertscope run` against the corpus size",
        "",
        f"`{shlex.join(['python', 'bench/bench_flatmem.py', *sys.argv[1:]])}`  ",
        f"corpus: {about}; python {platform.python_version()}, {os.cpu_count()} cores, --threads {args.threads}"
        + "".join(f", {k}={v}" for k, v in args.env.items()),
        "",
        "| segments | tokens | peak RSS (MB) | vs smallest | run elapsed (s) | segments/s | tokens/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['segments']:,} | {r['tokens']:,} | {r['peak_rss_mb']:.0f} | "
                     f"{100 * (r['peak_rss_mb'] / base - 1):+.1f}% | {r['elapsed_s']:.0f} | "
                     f"{r['segments'] / r['elapsed_s']:.0f} | {r['tokens'] / r['elapsed_s']:.0f} |")
    command = rows[-1]["command"].replace(str(Path(tmp)), "$TMP").replace(str(Path(sys.executable).parent) + "/", "")
    lines += ["", "Each row: " + command, ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
