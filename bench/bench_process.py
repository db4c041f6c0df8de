"""Whole-process time of `bertscope run` against a bare SDPA forward script, start to exit.

    python bench/bench_process.py                          # 96 x 512 tokens, 3 interleaved repeats
    python bench/bench_process.py --repeats 5 --out /tmp/process.md
    python bench/bench_process.py --profile                # + where bertscope's time goes, by phase
    python bench/bench_process.py --importtime             # + where import time goes (python -X importtime)

The job: `--segments` pairs of Wikipedia text (the packaged lead sections, consecutive,
in title order) that tokenize to exactly `--max-len` tokens each as `[CLS] a [SEP] b [SEP]`,
written one pair per line (a tab between the parts) to a temporary text file. Two programs
process it, each in a fresh Python process timed from launch to exit:

    bare       import torch + transformers, load all-MiniLM-L6-v2 with
               attn_implementation="sdpa", read the file, then per batch of 16: tokenize,
               forward under inference_mode. No statistics, nothing written.
    bertscope  `bertscope run --corpus FILE --limit all --max-len L --quiet --out DIR`:
               everything it does, figures and outputs included.

They take turns (bare first in even repeats, bertscope first in odd ones), so both see the
same stretch of machine load; reported are medians, the ratio of medians (bare / bertscope,
1.0 = as fast as the bare script) and the paired ratio (median over repeats of the ratio
within a repeat). The load average is printed with every repeat: the machine is shared.

`--profile` runs bertscope once more in a child that stamps the wall clock around its
phases (imports, model load, corpus, segments, pass, figures, heads.csv + index.html,
run.json), as seconds since the process was launched. `--importtime` runs both programs
once under `python -X importtime` and sums the import time per top-level package.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ENV = dict(os.environ)  # the children's environment (--threads sets OMP_NUM_THREADS in it)

# With a 4th argument, it also writes (phase, start, end) wall-clock stamps there (--profile).
BARE = r"""
import sys, time
t0 = time.time()
import torch
from transformers import AutoModel, AutoTokenizer

model_dir, corpus, batch_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
t1 = time.time()
tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
model = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa", local_files_only=True).eval()
t2 = time.time()
pairs = [line.rstrip("\n").split("\t", 1) for line in open(corpus, encoding="utf-8")]
with torch.inference_mode():
    for i in range(0, len(pairs), batch_size):
        a, b = zip(*pairs[i : i + batch_size])
        model(**tokenizer(list(a), list(b), padding=True, return_tensors="pt"))
t3 = time.time()
if len(sys.argv) > 4:
    import json
    stamps = [("imports", t0, t1), ("model load", t1, t2), ("tokenize + forward", t2, t3), ("exit", t3, t3)]
    json.dump(stamps, open(sys.argv[4], "w"))
"""

# Runs `bertscope run` as the command does, with wall-clock stamps around its phases. The stamps are
# time.time() values; the parent subtracts its own launch time. A module is wrapped when it
# is first imported (a meta-path hook), so the profile imports nothing the run would not;
# phases that do not exist (a function moved, figures drawn elsewhere) are not stamped.
PROFILE = r"""
import importlib.util, json, sys, time
stamps = []
TARGETS = {  # module: (function, phase); any that does not exist is skipped
    "bertscope.analyses.surface.command": [("load_model", "model load"), ("load_corpus", "corpus"),
                      ("make_segments", "segments"), ("fold", "pass"), ("write_outputs", "outputs"),
                      ("write_surface", "figures (wait) + index.html"),
                      ("write_json", "run.json"), ("write_report", "index.html")],
    "bertscope.analyses.surface.plots": [("plot_surface", "figures: draw in this process")],
    "bertscope.report.figure_pool": [("surface_pool", "figures: start helpers"),
                          ("FigurePool.draw", "figures: hand over"), ("FigurePool.wait", "figures: wait for helpers")],
}

def stamp(name, t0):
    stamps.append((name, t0, time.time()))

def wrap(module, path, name):
    owner, attr = module, path
    if "." in path:
        cls, attr = path.split(".")
        owner = getattr(module, cls, None)
    fn = getattr(owner, attr, None)
    if fn is None:
        return
    def wrapper(*args, **kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            stamp(name, t0)
    setattr(owner, attr, wrapper)

class Hook:
    @staticmethod
    def find_spec(fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        sys.meta_path.remove(Hook)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, Hook)
        exec_module = spec.loader.exec_module
        def run(module):
            exec_module(module)
            for attr, name in TARGETS[fullname]:
                wrap(module, attr, name)
        spec.loader.exec_module = run
        return spec

def save():
    stamps.append(("exit handlers", time.time(), time.time()))
    with open(stamps_file, "w") as f:
        json.dump(stamps, f)

sys.meta_path.insert(0, Hook)
t = time.time()
import bertscope.cli.main
stamp("import bertscope.cli.main", t)
import atexit
atexit.register(save)  # main() may end the process itself, after the exit handlers
stamps_file, sys.argv = sys.argv[1], ["bertscope", *sys.argv[2:]]
sys.exit(bertscope.cli.main())
"""


# --- the job ---------------------------------------------------------------------------


def build_corpus(path: Path, n: int, max_len: int, tokenizer) -> None:
    """`n` lines "a<TAB>b" of consecutive Wikipedia words, each pair exactly `max_len` tokens.

    Words are added greedily (half the budget to a, the rest to b); a word that would
    overshoot is skipped, so every pair fills its budget exactly.
    """
    from bertscope.text.corpus import load_wiki

    words = (w for d in load_wiki() for w in d.parts[0].split())
    budget = max_len - 3  # [CLS] a [SEP] b [SEP]
    counts: dict[str, int] = {}

    def pieces(word):
        if word not in counts:
            counts[word] = len(tokenizer(word, add_special_tokens=False)["input_ids"])
        return counts[word]

    def part(size):
        taken, used = [], 0
        for word in words:
            k = pieces(word)
            if used + k <= size:
                taken.append(word)
                used += k
            if used == size:
                return " ".join(taken)
        raise RuntimeError("not enough Wikipedia text")

    lines = []
    for _ in range(n):
        a = part(budget // 2)
        b = part(budget - budget // 2)
        lines.append(f"{a}\t{b}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lengths = [len(tokenizer(a, b)["input_ids"]) for a, b in (line.split("\t") for line in lines)]
    if set(lengths) != {max_len}:
        raise RuntimeError(f"pairs do not tokenize to {max_len} tokens: {sorted(set(lengths))}")


# --- timing ----------------------------------------------------------------------------


def bertscope_command(corpus: Path, max_len: int, out: Path, extra=()) -> list[str]:
    return [sys.executable, "-m", "bertscope.cli", "run", "--corpus", str(corpus), "--limit", "all",
            "--max-len", str(max_len), "--quiet", "--out", str(out), *extra]


def bare_command(model_dir: Path, corpus: Path, batch_size: int) -> list[str]:
    return [sys.executable, "-c", BARE, str(model_dir), str(corpus), str(batch_size)]


def timed_run(command: list[str], env=None) -> tuple[float, float]:
    """Wall seconds from launch to exit, and CPU seconds (user + system) of the process and of
    every process it waited for (the figure helpers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env or ENV, check=False)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command[:4])} ... failed:\n{done.stderr[-3000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def check_run(run_dir: Path, n: int, max_len: int) -> dict:
    """The bertscope run saw n segments of max_len tokens and wrote every output."""
    record = json.loads((run_dir / "run.json").read_text())
    segments = record["segments"]
    assert record["status"] == "complete", record["status"]
    assert segments["segments"] == n, segments
    assert segments["lengths"]["mean"] == max_len, segments["lengths"]
    missing = [name for name in record["outputs"] if not (run_dir / name).is_file()]
    assert not missing, missing
    return record


# --- import time -----------------------------------------------------------------------


def import_summary(command: list[str], top: int = 8) -> tuple[float, list[tuple[str, float]]]:
    """Total import seconds and the packages that took most (self time, summed per top-level name)."""
    done = subprocess.run([command[0], "-X", "importtime", *command[1:]], capture_output=True, text=True, env=ENV,
                          check=False)
    per_package: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line[len("import time:"):].split("|")
        root = name.strip().split(".")[0]
        per_package[root] = per_package.get(root, 0.0) + int(self_us) / 1e6
    ranked = sorted(per_package.items(), key=lambda kv: -kv[1])
    return sum(per_package.values()), ranked[:top]


# --- main ------------------------------------------------------------------------------


def profile(command: list[str], stamps_file: Path) -> list[tuple[str, float, float]]:
    """Run `command` (which writes its stamps to `stamps_file`); stamps in seconds since launch."""
    launch = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, check=False)
    end = time.time()
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    stamps = [(name, t0 - launch, t1 - launch) for name, t0, t1 in json.loads(stamps_file.read_text())]
    return stamps + [("process exit", end - launch, end - launch)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", type=int, default=96)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--per-example", action="store_true", help="bertscope run also writes examples.parquet")
    ap.add_argument("--profile", action="store_true", help="also stamp bertscope's phases (one more run)")
    ap.add_argument("--importtime", action="store_true", help="also sum import time per package (two more runs)")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for both programs (default: as inherited; unset, torch uses every core)")
    ap.add_argument("--out", default=None, help="also write the report (markdown) here")
    args = ap.parse_args(argv)
    if args.threads:
        ENV["OMP_NUM_THREADS"] = str(args.threads)

    from transformers import AutoTokenizer

    from bertscope.models.loading import default_model_dir

    model_dir = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    extra = ["--per-example"] if args.per_example else []
    lines = [f"command: `python {shlex.join(sys.argv)}`",
             f"load average at start {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores, "
             f"OMP_NUM_THREADS={ENV.get('OMP_NUM_THREADS', 'unset')}"]
    print(lines[0])
    print(lines[1])
    with tempfile.TemporaryDirectory(prefix="bench_process_") as tmp:
        tmp = Path(tmp)
        corpus = tmp / "pairs.txt"
        build_corpus(corpus, args.segments, args.max_len, tokenizer)
        print(f"job: {args.segments} pairs of exactly {args.max_len} tokens in {corpus}")
        bare = bare_command(model_dir, corpus, args.batch_size)
        times = {"bare": [], "bertscope": []}  # (wall s, cpu s) per repeat
        for r in range(args.repeats):
            order = ("bare", "bertscope") if r % 2 == 0 else ("bertscope", "bare")
            for name in order:
                out = tmp / f"run{r}"
                command = bare if name == "bare" else bertscope_command(corpus, args.max_len, out, extra)
                times[name].append(timed_run(command))
            check_run(tmp / f"run{r}", args.segments, args.max_len)
            (bw, bc), (sw, sc) = times["bare"][-1], times["bertscope"][-1]
            print(f"  repeat {r + 1}/{args.repeats}: bare {bw:6.2f} s (cpu {bc:6.2f})  bertscope {sw:6.2f} s "
                  f"(cpu {sc:6.2f})  ratio {bw / sw:.2f}  (load {os.getloadavg()[0]:.2f})", flush=True)
        lines += ["", "| program | median wall s | median CPU s | wall s of each repeat |", "|---|---:|---:|---|"]
        for k, v in times.items():
            lines.append(f"| {k} | {statistics.median(w for w, _ in v):.2f} | {statistics.median(c for _, c in v):.2f} "
                         f"| {' '.join(f'{w:.2f}' for w, _ in v)} |")
        for i, what in ((0, "wall"), (1, "CPU")):
            med = {k: statistics.median(t[i] for t in v) for k, v in times.items()}
            paired = statistics.median(b[i] / s[i] for b, s in zip(times["bare"], times["bertscope"]))
            extra_s = statistics.median(s[i] - b[i] for b, s in zip(times["bare"], times["bertscope"]))
            ratio = med["bare"] / med["bertscope"]
            lines.append(f"- {what} time, bare / bertscope: ratio of medians **{ratio:.2f}x**, "
                         f"paired ratio {paired:.2f}x, bertscope's extra seconds (paired median) {extra_s:.2f}")
        lines += ["", f"target: ratio >= 0.85x; load average at end {os.getloadavg()[0]:.2f}"]

        if args.profile:
            profiled = bertscope_command(corpus, args.max_len, tmp / "profile", extra)
            for name, command in (("bare", bare + [str(tmp / "bare.json")]),
                                  ("bertscope run", [sys.executable, "-c", PROFILE, str(tmp / "bertscope.json"),
                                                     *profiled[3:]])):
                stamps = profile(command, Path(command[-1]) if name == "bare" else tmp / "bertscope.json")
                lines += ["", f"{name} by phase (seconds since launch; load {os.getloadavg()[0]:.2f}):", "",
                          "| phase | start | end | seconds |", "|---|---:|---:|---:|"]
                lines += [f"| {phase} | {t0:.2f} | {t1:.2f} | {t1 - t0:.2f} |" for phase, t0, t1 in stamps]
        if args.importtime:
            lines += ["", "import time (python -X importtime, self time summed per top-level package):", ""]
            for name, command in (("bare", bare), ("bertscope", bertscope_command(corpus, args.max_len,
                                                                                   tmp / "importtime", extra))):
                total, ranked = import_summary(command)
                lines.append(f"- {name}: {total:.2f} s in all; " + ", ".join(f"{p} {s:.2f}" for p, s in ranked))
    report = "\n".join(lines)
    print(report[report.index("\n| program"):] if "\n| program" in report else report)
    if args.out:
        Path(args.out).write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
