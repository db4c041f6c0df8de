"""The run directory: everything an analysis leaves behind, written so that a crash loses little.

    run.json     model, data, settings, versions, status and the list of outputs; each
                 analysis adds its record under run.json["probes"][name] (`AnalysisRun`)
    stats.npz    the raw per-head sums (`HeadStats`), rewritten at every checkpoint
    heads.csv    the tidy per-head table of the surface analysis
    fig_*.png    figures
Every file is written to a temporary name and renamed, so a reader (or a resumed run)
never sees half a file. An analysis given `--out DIR` of an existing run (one with
run.json) adds its files there, so one directory can hold the surface analysis and every
probe of the same model; otherwise it makes a new directory. run.json is read, changed and
written under a lock (`update_json`, the file run.json.lock beside it), so analyses running at
the same time in one directory never lose each other's entries.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import platform
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from bertscope.errors import UserError
from bertscope.version import __version__


def check_run_dir(out: str | None):
    """Refuse a used `--out` early, before any work, without creating anything."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{path} already exists and is not empty: choose another --out, or --resume {path}")


def new_run_dir(out: str | None) -> Path:
    """The run's directory: `out`, or runs/<timestamp>; refuses to overwrite a used one."""
    path = Path(out) if out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    check_run_dir(str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the run directory {path}: {e.strerror}") from None
    return path


def write_json(path: Path, data: dict):
    """Write JSON atomically: to a temporary file of its own (two writers never share one), renamed."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_json(path: Path, update: Callable[[dict], dict | None]) -> dict:
    """Read-modify-write of a JSON file (run.json) under the lock `path`.lock: `update` gets the
    file's contents ({} when there is none yet) and changes them in place or returns new ones,
    which are written atomically. Returns what was written."""
    from filelock import FileLock

    path = Path(path)
    with FileLock(str(path) + ".lock"):
        data = read_json(path) if path.exists() else {}
        new = update(data)
        data = data if new is None else new
        write_json(path, data)
    return data


def write_npz(path, compressed: bool = False, **arrays):
    """Write arrays to an .npz atomically: a crash mid-write leaves the old file, as a checkpoint
    must (the temporary name keeps numpy's .npz suffix, so numpy adds none)."""
    import numpy as np

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    (np.savez_compressed if compressed else np.savez)(tmp, **arrays)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} not found: is this a bertscope run directory?") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...]):
    """A tidy CSV: one header line, floats with 6 significant digits."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([f"{row[c]:.6g}" if isinstance(row[c], float) else row[c] for c in columns])
    os.replace(tmp, path)


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


def resumed_revision(record: dict, revision: str | None) -> str | None:
    """The revision a resumed run loads its model at: a Hub model's recorded commit (its branch
    may have moved since the run began: one run's sums come from one set of weights), else the
    revision recorded."""
    return (record.get("model") or {}).get("commit") or revision


class AnalysisRun:
    """One analysis's run: the run directory and the record it adds to run.json under
    `probes[name]`. Analyses without a model (e.g. `bertscope cues`) use it as is; `ProbeRun`
    adds the model."""

    def __init__(self, name: str, args: argparse.Namespace, model: dict | None = None):
        self.name, self.args, self.t0 = name, args, time.perf_counter()
        self.log = logging.getLogger(f"bertscope.analyses.{name}").info  # what the analysis reports
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
        new = {
            "bertscope_version": __version__,
            "model": None,
            "versions": {"python": platform.python_version(), "torch": _version("torch"),
                         "transformers": _version("transformers")},
            "probes": {},
        }
        update_json(path / "run.json", lambda run: {**new, **run})  # one written meanwhile is kept
        return path

    def _save_record(self):
        update_json(self.dir / "run.json", lambda run: run.setdefault("probes", {}).update({self.name: self.record}))

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
        """Record the analysis's headline results and outputs in run.json. The command then
        refreshes the report (`bertscope.report.writer.refresh_report`): the run directory knows
        nothing of the report, which reads every analysis's section."""
        self.record.update(status="complete", results=results, outputs=self.outputs,
                           elapsed_s=round(time.perf_counter() - self.t0, 2))
        self._save_record()
        self.log(f"wrote {', '.join(self.outputs)} to {self.dir}")


class ProbeRun(AnalysisRun):
    """One probe's run: the loaded model, the run directory and the record it adds to run.json."""

    def __init__(self, name: str, args: argparse.Namespace, task: str | None = None,
                 command: str | None = None, device: str | None = None, dtype: str | None = None):
        import torch

        from bertscope.cli.args import check_device, check_dtype
        from bertscope.models.loading import load_model

        check_device(args.device, args.backend)
        # dtype: the model's (default: --dtype; finetune keeps float32 weights and autocasts)
        dtype = dtype or getattr(args, "dtype", "float32")
        check_dtype(dtype, args.device)
        if args.threads:
            torch.set_num_threads(args.threads)
        # device: this rank's under torchrun (`distributed.init_world`); args.device is recorded
        self.loaded = load_model(args.model, device=device or args.device, task=task, dtype=dtype,
                                 revision=getattr(args, "revision", None))  # task: models.TASKS
        if args.max_len > self.loaded.max_len:
            raise UserError(f"--max-len {args.max_len} is longer than the model allows ({self.loaded.max_len})")
        super().__init__(name, args, model=self.loaded.record())
        torch.manual_seed(args.seed)
        self.log(f"bertscope {command or 'probe ' + name}: model {self.loaded.origin} ({self.loaded.n_layers} layers x "
                 f"{self.loaded.n_heads} heads), run directory {self.dir}")


def _version(package: str) -> str:
    """The installed version of a library, as its own module reports it (imported only here)."""
    import importlib

    return importlib.import_module(package).__version__
