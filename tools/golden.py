"""Golden outputs of the bertscope command line: record them, normalise them, compare two records.

    python tools/golden.py record OUT [--data-dir DIR] [--jobs N] [--only NAME ...]
    python tools/golden.py normalise OUT          # (re)write OUT/golden from OUT/runs and OUT/commands
    python tools/golden.py diff A B               # A, B: two OUT/golden folders; exit 1 on any difference

`record` runs every bertscope command on a small slice of the real data, each as
`sys.executable -m bertscope.cli ...` in a fresh process whose working directory is OUT.
So the interpreter and PYTHONPATH decide which bertscope runs (never the current
directory's): to record another checkout, use its interpreter or put its install first on
PYTHONPATH. Every step writes into OUT/runs/<run dir> (several steps add to one run
directory, as `probe ... --out RUN` does) and leaves its exit code, stdout and stderr in
OUT/commands/<step>.{rc,out,err}. Every torch command gets `--threads 1`, and every process
OMP_NUM_THREADS=1, PYTHONHASHSEED=0 and HF_HUB_OFFLINE=1, so two records of the same code
write the same numbers.

`normalise` (run by `record` at the end) turns what the steps wrote into OUT/golden/, text
files that are equal for two records of the same code and differ where behaviour differs:
- every CSV as written (6 significant digits), but for columns that hold wall-clock
  seconds (`train_s`, ...), which are masked;
- every Parquet file as CSV text, floats as Python's repr (exact), rows sorted;
- every JSON file (run.json, a checkpoint's config.json, ...) with the keys that differ
  between two runs of the same code, or between two checkouts, removed: timings, dates,
  the command line, versions, thread counts, host and process facts; absolute paths in the
  values that remain are written relative to OUT, the data folder or the Python install;
- every HTML report (index.html) as the ids of its `<section id=...>`, in order;
- other text files (tables, the viewer's page) as written, paths masked;
- .npz archives as their arrays' names, dtypes, shapes and SHA-256 of the bytes; other binary
  files (PNG, safetensors) only by name, in the listing;
- per run directory, the sorted list of the files it holds (`<run>/FILES`);
- per step, `commands/<step>.txt`: the argv (relative paths), exit code, stdout and stderr
  with run-directory paths and timings masked.

`diff A B` compares two normalised folders file by file, line by line, prints every
difference (file, line number, both lines) and exits 1 if there is any, else prints
`identical (N files)`.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# the annotated data: $BERTSCOPE_DATA, else the `shared/data` folder beside the checkout (../shared/data)
DEFAULT_DATA = Path(os.environ.get("BERTSCOPE_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
TEXT = "The cat sat on the mat, unbelievably."
PAIR = "It purred."

# --- the steps -----------------------------------------------------------------------------

T1 = ["--threads", "1"]
CKPT = "runs/finetune/checkpoints/polarity-pretrained-seed0"  # `finetune --save pretrained`
HEADS = ["--model", CKPT, "--task", "polarity", *T1]


@dataclass
class Step:
    """One command: `bertscope ARGS` run in OUT; `after`: steps whose outputs it reads."""

    name: str
    args: list[str]
    after: tuple[str, ...] = ()


STEPS = [
    # surface statistics (Clark et al. section 3)
    Step("run", ["run", "--corpus", "wiki", "--limit", "12", "--out", "runs/run", *T1]),
    Step("run_per_example", ["run", "--corpus", "wiki", "--limit", "12", "--per-example", "--argmax",
                             "--out", "runs/run_pe", *T1]),
    Step("run_zeros", ["run", "--corpus", "wiki", "--limit", "12", "--per-example", "--token-types", "zeros",
                       "--average", "segments", "--packing", "balanced", "--no-figures", "--out", "runs/run_zeros",
                       *T1]),
    # probes, added to the first run's directory (Clark et al. sections 4-6)
    Step("probe_syntax", ["probe", "syntax", "--limit", "40", "--min-count", "20", "--out", "runs/run", *T1],
         after=("run",)),
    Step("probe_coref", ["probe", "coref", "--limit-docs", "2", "--limit-gap", "24", "--out", "runs/run", *T1],
         after=("probe_syntax",)),
    Step("probe_classifier", ["probe", "classifier", "--limit-train", "60", "--limit-eval", "30", "--epochs", "2",
                              "--out", "runs/run", *T1], after=("probe_coref",)),
    Step("probe_cluster", ["probe", "cluster", "--limit", "8", "--out", "runs/run", *T1],
         after=("probe_classifier",)),
    Step("compare", ["compare", "runs/run_pe", "runs/run_zeros", "--out", "runs/compare"],
         after=("run_per_example", "run_zeros")),
    Step("compare_into_run", ["compare", "runs/run", "runs/run_pe", "--out", "runs/run_pe"],
         after=("probe_cluster", "compare")),
    Step("report", ["report", "runs/run"], after=("compare_into_run",)),
    Step("view", ["view", TEXT, "--pair", PAIR, "--out", "runs/view/view.html"]),
    # Kovaleva et al. section 4
    Step("patterns", ["patterns", "--data", "wiki,rte,polarity", "--limit", "12", "--examples", "4",
                      "--out", "runs/patterns", *T1]),
    Step("patterns_label", ["patterns", "label", "--data", "wiki", "--limit", "8", "--out", "runs/patterns_label",
                            *T1]),
    Step("patterns_train", ["patterns", "train", "--labels", "runs/patterns_label/labels_wiki.npz", "--epochs", "1",
                            "--out", "runs/patterns_train", *T1], after=("patterns_label",)),
    Step("features", ["features", "--data", "ewt", "--limit", "24", "--out", "runs/features", *T1]),
    Step("features_task", ["features", "--data", "rte", "--limit", "12", "--out", "runs/features", *T1],
         after=("features",)),
    Step("relations", ["relations", "--limit", "12", "--out", "runs/relations", *T1]),
    # Niven & Kao
    Step("cues_arct", ["cues", "--task", "arct", "--out", "runs/cues"]),
    Step("cues_rte", ["cues", "--task", "rte", "--expand-not", "--out", "runs/cues_rte"]),
    # fine-tuning, then the heads commands on its checkpoint
    Step("finetune", ["finetune", "--task", "polarity", "--limit", "32", "--epochs", "1", "--seeds", "0",
                      "--save", "pretrained", "--cosine-examples", "8", "--out", "runs/finetune", *T1]),
    Step("heads_disable", ["heads", "disable", *HEADS, "--limit", "12",
                           "--out", "runs/heads_disable"], after=("finetune",)),
    Step("heads_importance", ["heads", "importance", *HEADS, "--limit", "16", "--out", "runs/heads"],
         after=("finetune",)),
    Step("heads_importance_test", ["heads", "importance", *HEADS, "--split", "test", "--convention", "batch",
                                   "--limit", "16", "--out", "runs/heads_importance_test"], after=("finetune",)),
    Step("heads_importance_compare", ["heads", "importance", "--compare", "runs/heads", "runs/heads_importance_test",
                                      "--out", "runs/heads_importance_compare", *T1],
         after=("heads_ablate", "heads_importance_test")),  # after ablate, which adds to runs/heads
    Step("heads_ablate", ["heads", "ablate", *HEADS, "--limit", "12", "--out", "runs/heads"],
         after=("heads_importance",)),
    Step("heads_prune", ["heads", "prune", *HEADS, "--limit", "12", "--random-seeds", "2", "--step", "0.25",
                         "--out", "runs/heads_prune"], after=("finetune",)),
    Step("heads_remove", ["heads", "remove", "--model", CKPT, "--from-prune", "runs/heads_prune", "--fraction", "0.5",
                          "--out", "runs/heads_remove", *T1], after=("heads_prune",)),
    Step("run_removed", ["run", "--model", "runs/heads_remove", "--corpus", "wiki", "--limit", "4", "--no-figures",
                         "--out", "runs/run_removed", *T1], after=("heads_remove",)),
    # a finished run resumed: its outputs written again, the figures drawn this time
    Step("run_resume", ["run", "--resume", "runs/run_removed", *T1], after=("run_removed",)),
    Step("heads_attention_grad", ["heads", "attention-grad", *HEADS, "--limit", "12",
                                  "--out", "runs/heads_attention_grad"], after=("finetune",)),
    # the rest of the command line
    Step("data", ["data", "--data-dir", "{DATA}"]),
    Step("selftest", ["selftest", "--quick"]),
    # user mistakes: one line on stderr, exit code 2
    Step("error_used_out", ["run", "--limit", "4", "--out", "runs/run", *T1], after=("report",)),
    Step("error_limit", ["run", "--limit", "0"]),
    Step("error_task", ["heads", "disable", "--task", "polarity", "--model", "runs/no_such_checkpoint"]),
]
# every command's --help (argparse wraps it to $COLUMNS, fixed in child_env)
HELP = [[], ["run"], ["data"], ["probe"], ["probe", "syntax"], ["probe", "coref"], ["probe", "classifier"],
        ["probe", "cluster"], ["compare"], ["cues"], ["features"], ["relations"], ["patterns"], ["finetune"],
        ["heads"], ["heads", "disable"], ["heads", "ablate"], ["heads", "importance"], ["heads", "prune"],
        ["heads", "remove"], ["heads", "attention-grad"], ["report"], ["view"], ["selftest"]]
STEPS += [Step("help_" + "_".join(words or ["bertscope"]).replace("-", "_"), [*words, "--help"]) for words in HELP]


def step_argv(step: Step, data_dir: Path) -> list[str]:
    """The step's arguments, with {DATA} filled in."""
    return [a.replace("{DATA}", str(data_dir)) for a in step.args]


def child_env(data_dir: Path) -> dict:
    """This process's environment (PATH, PYTHONPATH) with everything that could change results fixed:
    one thread, offline, the CPU only, the data folder, no inherited bertscope or Triton switches."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERTSCOPE_", "TRITON_"))}
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false", BERTSCOPE_DATA=str(data_dir), MPLBACKEND="Agg",
               PYTHONDONTWRITEBYTECODE="1", COLUMNS="100")
    return env


def run_step(step: Step, out: Path, data_dir: Path) -> tuple[str, float, int]:
    """Run one step in OUT; keep its exit code, stdout, stderr and argv in OUT/commands."""
    argv = [sys.executable, "-m", "bertscope.cli", *step_argv(step, data_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(argv, check=False, cwd=out, env=child_env(data_dir), capture_output=True)
    elapsed = time.perf_counter() - t0
    cmd = out / "commands"
    (cmd / f"{step.name}.out").write_bytes(proc.stdout)  # bytes: keep progress bars' carriage returns
    (cmd / f"{step.name}.err").write_bytes(proc.stderr)
    (cmd / f"{step.name}.rc").write_text(f"{proc.returncode}\n")
    (cmd / f"{step.name}.argv").write_text(json.dumps(step_argv(step, data_dir)) + "\n", encoding="utf-8")
    return step.name, elapsed, proc.returncode


def record(out: Path, data_dir: Path, jobs: int, only: list[str] | None) -> int:
    """Run the steps (at most `jobs` at a time, each after the steps it reads), then normalise."""
    if out.exists() and any(out.iterdir()):
        sys.exit(f"golden: {out} exists and is not empty")
    (out / "commands").mkdir(parents=True)
    (out / "runs").mkdir()
    (out / "runs" / "view").mkdir()  # `bertscope view --out FILE` wants FILE's folder to exist
    which = "import bertscope, bertscope.kernels; print(bertscope.__file__); print(bertscope.kernels.__file__)"
    where = subprocess.run([sys.executable, "-c", which],
                           cwd=out, env=child_env(data_dir), capture_output=True, text=True, check=True).stdout
    (out / "bertscope.txt").write_text(where)
    print(f"recording {sys.executable} with bertscope from {where.split()[0]}", flush=True)
    steps = [s for s in STEPS if only is None or s.name in only]
    names = {s.name for s in steps}
    todo = {s.name: s for s in steps}
    done: set[str] = set()
    running: dict = {}
    t_start = time.perf_counter()
    timings = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        while todo or running:
            ready = [s for s in todo.values() if all(a in done or a not in names for a in s.after)]
            for s in ready[: max(0, jobs - len(running))]:
                del todo[s.name]
                running[pool.submit(run_step, s, out, data_dir)] = s.name
            finished, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for f in finished:
                name, elapsed, rc = f.result()
                del running[f]
                done.add(name)
                timings[name] = elapsed
                print(f"  {name:<26} exit {rc:<3} {elapsed:6.1f} s", flush=True)
    total = time.perf_counter() - t_start
    print(f"recorded {len(done)} steps in {total:.0f} s ({jobs} at a time)")
    (out / "timings.json").write_text(json.dumps({"total_s": round(total, 1), "steps": timings}, indent=1) + "\n")
    n = normalise(out, data_dir)
    print(f"normalised {n} files into {out / 'golden'}")
    return 0


# --- normalisation -------------------------------------------------------------------------

# JSON keys whose values differ between two runs of the same code (or two checkouts of it).
VOLATILE_KEYS = re.compile(
    r"^(command|argv|versions?|python|platform|host(name)?|pid|threads|torch_threads|num_threads|"
    r"created|started|finished|updated|date|time|timestamp|load(_?avg)?|cwd|"
    r"elapsed(_s)?|seconds|wall(_s)?|total_s|[a-z_]*_s|[a-z_]*_per_s|timings?|"
    r"transformers_version|bertscope_version|torch_version)$")
VOLATILE_CSV_COLUMNS = re.compile(r"^([a-z_]*_s|seconds|elapsed)$")


class Masker:
    """Writes absolute paths of this record as placeholders: <OUT>, <DATA>, <PY> (the Python install)."""

    def __init__(self, out: Path, data_dir: Path):
        prefixes = {str(out.resolve()): "<OUT>", str(out): "<OUT>", str(data_dir.resolve()): "<DATA>",
                    str(data_dir): "<DATA>", sys.prefix: "<PY>", sys.base_prefix: "<PY>"}
        for p in sys.path[1:]:  # site-packages, PYTHONPATH entries: where the code and the model live
            if p and os.path.isabs(p) and os.path.isdir(p):
                prefixes.setdefault(p, "<PY>")
        self.prefixes = sorted(prefixes.items(), key=lambda kv: -len(kv[0]))

    def __call__(self, text: str) -> str:
        for prefix, name in self.prefixes:
            text = text.replace(prefix, name)
        return text


def strip_json(value, mask):
    """`value` without its VOLATILE_KEYS (at any depth), paths in its strings masked."""
    if isinstance(value, dict):
        return {k: strip_json(v, mask) for k, v in value.items() if not VOLATILE_KEYS.match(str(k))}
    if isinstance(value, list):
        return [strip_json(v, mask) for v in value]
    if isinstance(value, str):
        return mask(value)
    return value


TIMING_PATTERNS = [  # (pattern, replacement) for stdout/stderr
    (re.compile(r"\d+(\.\d+)?\s*(ms|s|sec|seconds|min|minutes|h)\b(?!/)"), "<TIME>"),
    (re.compile(r"\d+(\.\d+)?\s*(it|its|seg|segments|sentences|inputs|examples|tokens|rows|steps)/s\b"), "<RATE>"),
    (re.compile(r"\d+:\d\d(:\d\d)?"), "<CLOCK>"),
]


PROGRESS_BAR = re.compile(r"\d+%\||\|\s*\d+/\d+\s*\[|^\s*$")


def drop_progress_bars(text: str) -> str:
    """stderr without tqdm's progress bars: how often a bar is redrawn depends on the clock.
    A line is cut at carriage returns and its bar pieces are dropped; a line that held only
    bars goes."""
    lines = []
    for line in text.split("\n"):
        pieces = line.split("\r")
        if len(pieces) == 1 and (not line.strip() or not PROGRESS_BAR.search(line)):
            lines.append(line)  # a plain line, blank ones included
            continue
        kept = [p for p in pieces if not PROGRESS_BAR.search(p)]
        if kept:
            lines.append("".join(kept))
    return "\n".join(lines)


def mask_output(text: str, mask) -> str:
    text = mask(drop_progress_bars(text))
    for pattern, repl in TIMING_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def csv_text(path: Path) -> str:
    """The CSV as written, but for the columns of wall-clock seconds (masked)."""
    import csv
    import io

    raw = path.read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(raw)))
    if not rows:
        return raw
    masked = [i for i, c in enumerate(rows[0]) if VOLATILE_CSV_COLUMNS.match(c)]
    if not masked:
        return raw
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for n, row in enumerate(rows):
        w.writerow([("<TIME>" if n and i in masked and v != "" else v) for i, v in enumerate(row)])
    return buf.getvalue()


def parquet_text(path: Path) -> str:
    """A Parquet file as CSV text: header (name:type), then rows sorted, floats as repr."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    header = ",".join(f"{f.name}:{f.type}" for f in table.schema)
    cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
    lines = sorted(",".join(repr(c[r]) for c in cols) for r in range(table.num_rows))
    return "\n".join([header, *lines]) + "\n"


def npz_text(path: Path) -> str:
    """One line per array of an .npz: name, dtype, shape and the SHA-256 of its bytes."""
    import numpy as np

    lines = []
    with np.load(path, allow_pickle=False) as z:
        for k in sorted(z.files):
            a = z[k]
            digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
            lines.append(f"{k} {a.dtype} {list(a.shape)} {digest}\n")
    return "".join(lines)


SECTION_ID = re.compile(r"<section\b[^>]*\bid=[\"']([^\"']+)[\"']")


def normalised(path: Path, mask) -> tuple[str, str] | None:
    """(what the golden file's name adds to the output's, its text) for one output file, or None
    for a file that is only listed by name (PNG, safetensors, ...)."""
    suffix = path.suffix
    if suffix == ".csv":
        return "", csv_text(path)
    if suffix == ".parquet":
        return ".csv", parquet_text(path)
    if suffix == ".npz":
        return ".txt", npz_text(path)
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if path.name.startswith(("tokenizer", "special_tokens", "vocab")):
            return "", json.dumps(data, indent=1, sort_keys=True) + "\n"  # the tokenizer's, not bertscope's
        return "", json.dumps(strip_json(data, mask), indent=1, sort_keys=True) + "\n"
    if path.name == "index.html":
        ids = SECTION_ID.findall(path.read_text(encoding="utf-8"))
        return ".sections.txt", "".join(f"{i}\n" for i in ids)
    if suffix in (".txt", ".html", ".md", ".tsv"):
        return "", mask(path.read_text(encoding="utf-8"))
    return None


def normalise(out: Path, data_dir: Path) -> int:
    """Write OUT/golden from OUT/runs and OUT/commands; returns the number of files written."""
    mask = Masker(out, data_dir)
    golden = out / "golden"
    if golden.exists():
        shutil.rmtree(golden)
    written = 0

    def put(rel: str, text: str):
        nonlocal written
        target = golden / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written += 1

    runs = out / "runs"
    for run_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
        put(f"runs/{run_dir.name}/FILES", "".join(f"{f}\n" for f in files))
        for rel in files:
            got = normalised(run_dir / rel, mask)
            if got is not None:
                put(f"runs/{run_dir.name}/{rel}{got[0]}", got[1])
    for rc in sorted((out / "commands").glob("*.rc")):
        name = rc.stem
        argv = json.loads((out / "commands" / f"{name}.argv").read_text())
        text = [f"$ bertscope {' '.join(mask(a) for a in argv)}", f"exit {rc.read_text().strip()}"]
        for stream in ("out", "err"):
            text.append(f"--- std{stream}")
            raw = (out / "commands" / f"{name}.{stream}").read_bytes().decode("utf-8", errors="replace")
            text.append(mask_output(raw, mask))
        put(f"commands/{name}.txt", "\n".join(text))
    return written


# --- diff ----------------------------------------------------------------------------------


def diff(a: Path, b: Path) -> int:
    """Print every difference between two normalised folders (file, line numbers, the lines of A
    as `-`, of B as `+`); 1 if there is any, else 0."""
    files_a = {str(p.relative_to(a)) for p in a.rglob("*") if p.is_file()}
    files_b = {str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()}
    differences = 0
    for rel in sorted(files_a - files_b):
        print(f"{rel}: only in {a}")
        differences += 1
    for rel in sorted(files_b - files_a):
        print(f"{rel}: only in {b}")
        differences += 1
    for rel in sorted(files_a & files_b):
        la = (a / rel).read_text(encoding="utf-8").splitlines()
        lb = (b / rel).read_text(encoding="utf-8").splitlines()
        if la == lb:
            continue
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb).get_opcodes():
            if tag == "equal":
                continue
            differences += 1
            print(f"{rel}, line {i1 + 1} (A) / {j1 + 1} (B): {tag}")
            for line in la[i1:i2]:
                print(f"  - {line}")
            for line in lb[j1:j2]:
                print(f"  + {line}")
    if differences:
        print(f"{differences} difference(s)")
        return 1
    print(f"identical ({len(files_a)} files)")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("record", help="run every command into OUT, then normalise into OUT/golden")
    r.add_argument("out", type=Path)
    r.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help=f"annotated data (default: {DEFAULT_DATA})")
    r.add_argument("--jobs", type=int, default=2, help="commands run side by side (default: 2)")
    r.add_argument("--only", nargs="+", metavar="STEP", help="run only these steps (for debugging)")
    n = sub.add_parser("normalise", help="(re)write OUT/golden from a record's raw outputs")
    n.add_argument("out", type=Path)
    n.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    d = sub.add_parser("diff", help="compare two normalised folders (OUT/golden)")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    args = ap.parse_args(argv)
    if args.what == "record":
        return record(args.out.resolve(), args.data_dir.resolve(), args.jobs, args.only)
    if args.what == "normalise":
        print(f"normalised {normalise(args.out.resolve(), args.data_dir.resolve())} files")
        return 0
    return diff(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
