"""What every probe shares: options, model, run directory, outputs and the run.json line.

A probe writes into a run directory like `bertscope run` does. Given `--out DIR` of an
existing run (one with run.json), it adds its files there and its entry under
`run.json["probes"][name]`, so one directory can hold the surface analysis and every
probe of the same model; otherwise it makes a new directory.
"""
from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path

import torch
import transformers

import bertscope
from bertscope.errors import UserError
from bertscope.kernels import BACKEND_CHOICES
from bertscope.results import new_run_dir, read_json, write_csv, write_json


def add_threads_argument(p: argparse.ArgumentParser):
    from bertscope.args import positive_int

    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch intra-op threads (default: torch's choice, one per core); on a busy shared "
                   "machine 1 can be several times faster, as idle-spinning worker threads fight for the cores")


def add_common_arguments(p: argparse.ArgumentParser, from_word: bool = True):
    from bertscope.args import positive_int

    p.add_argument("--model", metavar="PATH", default=None,
                   help="local Hugging Face checkpoint directory (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder of the annotated data sets (default: $BERTSCOPE_DATA, then ../shared/data)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="run directory; an existing run's directory gains this probe's outputs "
                   "(default: runs/<timestamp>)")
    if from_word:
        p.add_argument("--from-word", choices=("mean", "first"), default="mean",
                       help="attention *from* a split word: the mean of its tokens' rows, as the paper "
                       "defines it, or its first token's row, as Clark et al.'s released code did (default: mean)")
    p.add_argument("--max-len", type=positive_int, default=128,
                   help="maximum tokens per model input (default: 128); what happens to longer inputs "
                   "depends on the probe and is counted")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="inputs per forward pass (default: 32)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="attention-statistics kernel; auto picks triton on a CUDA device, chunked on the CPU (default: auto)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    add_threads_argument(p)
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def seeded_sample(items: list, limit: int | None, seed: int) -> list:
    """All items, or a seeded sample of `limit` of them kept in their original order (a
    prefix would be biased: GUM's files, for one, are sorted by genre)."""
    if limit is None or limit >= len(items):
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def recorded_run(run_dir, name: str) -> dict:
    """The run.json record of analysis `name` in `run_dir` (its settings, world size, ...), which
    `--resume DIR` continues; a UserError when DIR holds none."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise UserError(f"cannot resume: {path} not found")
    record = read_json(path).get("probes", {}).get(name)
    if not record:
        raise UserError(f"cannot resume: {run_dir} holds no '{name}' run")
    return record


class AnalysisRun:
    """One analysis's run: the run directory and the record it adds to run.json under
    `probes[name]`. Analyses without a model (e.g. `bertscope cues`) use it as is; `ProbeRun`
    adds the model."""

    def __init__(self, name: str, args: argparse.Namespace, log=print, model: dict | None = None):
        self.name, self.args, self.t0 = name, args, time.perf_counter()
        self.log = (lambda *a, **k: None) if getattr(args, "quiet", False) else log
        self.progress = not getattr(args, "quiet", False)
        self.dir = self._run_dir(getattr(args, "out", None))
        self.outputs: list[str] = []
        self.record = {
            "command": " ".join(sys.argv),
            "status": "running",
            "settings": {k: v for k, v in vars(args).items() if k not in ("command", "probe", "func")},
            "model": model,
        }
        self._save_record()

    def _run_dir(self, out: str | None) -> Path:
        if out and (Path(out) / "run.json").is_file():
            return Path(out)
        path = new_run_dir(out)
        write_json(path / "run.json", {
            "bertscope_version": bertscope.__version__,
            "model": None,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__},
            "probes": {},
        })
        return path

    def _save_record(self):
        path = self.dir / "run.json"
        run = read_json(path)
        run.setdefault("probes", {})[self.name] = self.record
        write_json(path, run)

    # -- outputs

    def write_csv(self, filename: str, rows: list[dict], columns: tuple[str, ...]) -> Path:
        path = self.dir / filename
        write_csv(path, rows, columns)
        self.outputs.append(filename)
        return path

    def write_text(self, filename: str, text: str) -> Path:
        path = self.dir / filename
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        self.outputs.append(filename)
        return path

    def save_figure(self, fig, filename: str) -> Path | None:
        """Save a matplotlib figure (unless --no-figures) and close it."""
        import matplotlib.pyplot as plt

        path = None
        if not getattr(self.args, "no_figures", False):
            path = self.dir / filename
            fig.savefig(path, dpi=130, bbox_inches="tight")
            self.outputs.append(filename)
        plt.close(fig)
        return path

    def finish(self, results: dict):
        """Record the probe's headline results and outputs in run.json."""
        self.record.update(status="complete", results=results, outputs=self.outputs,
                           elapsed_s=round(time.perf_counter() - self.t0, 2))
        self._save_record()
        self.log(f"wrote {', '.join(self.outputs)} to {self.dir}")
        from bertscope.report import refresh_report

        refresh_report(self.dir, self.log)


class ProbeRun(AnalysisRun):
    """One probe's run: the loaded model, the run directory and the record it adds to run.json."""

    def __init__(self, name: str, args: argparse.Namespace, log=print, task: str | None = None,
                 command: str | None = None):
        from bertscope.args import check_device
        from bertscope.models import load_model

        check_device(args.device, args.backend)
        if args.threads:
            torch.set_num_threads(args.threads)
        self.loaded = load_model(args.model, device=args.device, task=task)  # task: models.TASKS
        if args.max_len > self.loaded.max_len:
            raise UserError(f"--max-len {args.max_len} is longer than the model allows ({self.loaded.max_len})")
        super().__init__(name, args, log, model=self.loaded.record())
        torch.manual_seed(args.seed)
        self.log(f"bertscope {command or 'probe ' + name}: model {self.loaded.path} ({self.loaded.n_layers} layers x "
                 f"{self.loaded.n_heads} heads), run directory {self.dir}")
