"""The run directory: everything an analysis leaves behind, written so that a crash loses little.

    run.json     model, data, settings, versions, status and the list of outputs; each
                 analysis adds its record under run.json["analyses"][name]
                 (`bertscope.run.analysis_run.AnalysisRun`; runs written before that key was
                 named filed them under "probes", which `read_run` still reads)
    stats.npz    the raw per-head sums (`HeadStats`), rewritten at every checkpoint
    heads.csv    the tidy per-head table of the surface analysis
    fig_*.png    figures
Every file is written to a temporary name and renamed (`bertscope.files`, below the engine and the
report, which write and read these files too), so a reader (or a resumed run) never sees half a file.
An analysis given `--out DIR` of an existing run (one with
run.json) adds its files there, so one directory can hold the surface analysis and every
probe of the same model; otherwise it makes a new directory. run.json is read, changed and
written under a lock on the run directory itself (`update_json`, `locked`: no lock file is left
behind), so analyses running at the same time in one directory never lose each other's entries.
"""
from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from filelock import FileLock

from bertscope.errors import UserError
from bertscope.files import (
    read_json,
    read_run,
    write_csv,  # noqa: F401  (analyses/surface/command.py imports it here: its old home)
    write_json,
)

logger = logging.getLogger(__name__)

RUNNING, COMPLETE, INTERRUPTED, FAILED = "running", "complete", "interrupted", "failed"  # run.json "status"


def check_run_dir(out: str | None):
    """Refuse a used `--out` early, before any work, without creating anything. A folder that
    holds only a failed run's run.json (`AnalysisRun` marks a run that failed before its first
    result "failed") is taken: it is cleared, with a log line."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {path} is a file, not a folder: give the folder the run should go to")
    if path.exists() and any(path.iterdir()):
        if only_failed(path):
            logger.info(f"{path} holds only a failed run: starting afresh there")
            clear_run_dir(path)
            return
        # --resume only where there is a run to resume
        resume = f", or --resume {path}" if (path / "run.json").is_file() else ""
        raise UserError(f"{path} already exists and is not empty: choose another --out{resume}")


# what a run that failed before its first result leaves (run.json.lock: by runs of bertscope before
# the run directory itself was locked)
RUN_FILES = ("run.json", "run.json.lock")


def only_failed(path: Path) -> bool:
    """True when `path` holds nothing but the run.json of runs that all failed before a result."""
    if {p.name for p in path.iterdir()} - set(RUN_FILES) or not (path / "run.json").is_file():
        return False
    try:
        run = read_run(path / "run.json")
    except UserError:
        return False
    statuses = [run.get("status")] if "settings" in run else []
    statuses += [entry.get("status") for entry in run["analyses"].values()]
    return bool(statuses) and all(status == FAILED for status in statuses)


def clear_run_dir(path: Path):
    """Remove a run directory that holds nothing but run.json (and its lock)."""
    for name in RUN_FILES:
        (path / name).unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:  # something appeared meanwhile: leave it
        pass


def new_run_dir(out: str | None) -> Path:
    """The run's directory: `out`, or runs/<timestamp>; refuses to overwrite a used one."""
    path = Path(out) if out else Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S")
    check_run_dir(str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the run directory {path}: {e.strerror}") from None
    return path


def update_json(path: Path, update: Callable[[dict], dict | None]) -> dict:
    """Read-modify-write of a JSON file (run.json) under the lock of its folder (`locked`):
    `update` gets the file's contents ({} when there is none yet) and changes them in place or
    returns new ones, which are written atomically. Returns what was written. A folder that
    cannot be written (read-only, a full disk) is a one-line `UserError`."""
    path = Path(path)
    try:
        with locked(path.parent):
            data = read_json(path) if path.exists() else {}
            new = update(data)
            data = data if new is None else new
            write_json(path, data)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
    return data


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on `folder` while the block runs: flock(2) on the folder's own
    descriptor, released when it closes (also when the process dies), so nothing is left in the
    folder. A lock file beside run.json would stay behind in every run directory: deleting it
    after use lets a waiting process lock a file that a third one has already replaced. Where
    flock cannot lock a folder (Windows, some network file systems), a lock file it is."""
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None
    fd = os.open(folder, os.O_RDONLY) if fcntl is not None else None
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a file system that does not lock folders
                os.close(fd)
                fd = None
        if fd is None:
            with FileLock(str(Path(folder) / "run.json.lock")):
                yield
        else:
            yield
    finally:
        if fd is not None:
            os.close(fd)


def recorded_run(run_dir, name: str, command: str | None = None) -> dict:
    """The run.json record of analysis `name` in `run_dir` (its settings, world size, ...), which
    `--resume DIR` continues; a UserError when DIR holds none."""
    path = Path(run_dir) / "run.json"
    if not path.is_file():
        raise UserError(f"cannot resume: {path} not found")
    record = read_run(path)["analyses"].get(name)
    if not record or not isinstance(record.get("settings"), dict):
        raise UserError(f"cannot resume: {run_dir} holds no '{name}' run"
                        + (f" (was it made by another command than `bertscope {command}`?)" if command else ""))
    return record


def changed_on_resume(given: dict, defaults: dict, recorded: dict, options: dict | None = None) -> list[str]:
    """The options of a `--resume` command line that the resumed run would ignore: each one given
    (not at its default) whose value is not the one `recorded` in the run, as "--max-len 64 (the
    run's: 128)". `given`, `defaults` and `recorded` map option dests to values; `options` names
    the option of a dest that is not its dest with dashes ({"window_batches": "--window"})."""
    changed = []
    for key, value in given.items():
        if key in recorded and key in defaults and value != defaults[key] and value != recorded[key]:
            option = (options or {}).get(key) or f"--{key.replace('_', '-')}"
            changed.append(f"{option} {_shown(value)} (the run's: {_shown(recorded[key])})")
    return changed


def refuse_changed_settings(run_dir, changed: list[str], out: str | None = None):
    """A one-line `UserError` when a `--resume DIR` command line gives settings other than the
    run's (`changed_on_resume`) or another --out: a resumed run takes them all from run.json, and
    an option that is silently dropped is worse than one refused."""
    if out is not None and Path(out) != Path(run_dir):
        changed = [*changed, f"--out {out} (the run's folder: {run_dir})"]
    if changed:
        raise UserError(f"--resume {run_dir} continues that run with its recorded settings, so it does not take "
                        f"{', '.join(changed)}: leave {'it' if len(changed) == 1 else 'them'} out, or start a new "
                        "run without --resume")


def _shown(value) -> str:
    """A setting as the command line would give it."""
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return "none" if value is None else str(value)


def resumed_revision(record: dict, revision: str | None) -> str | None:
    """The revision a resumed run loads its model at: a Hub model's recorded commit (its branch
    may have moved since the run began: one run's sums come from one set of weights), else the
    revision recorded."""
    return (record.get("model") or {}).get("commit") or revision


class SettingsParser(argparse.ArgumentParser):
    """A command's parser that raises `SettingRefused` instead of exiting: `check_settings` reads
    recorded settings through it."""

    def error(self, message):
        raise SettingRefused(message)


class SettingRefused(Exception):
    pass


def settings_parser(add_arguments) -> SettingsParser:
    """The parser of a command's options (`add_arguments(parser)`), for `check_settings`."""
    parser = SettingsParser(add_help=False)
    add_arguments(parser)
    return parser


def check_settings(path: Path, settings: dict, parser: SettingsParser) -> dict:
    """Recorded settings checked against the command's options (`settings_parser`): each value of
    an option is one the command line could have given (its JSON type is its default's, and the
    option's type and choices take it), else a one-line `UserError` that names the file.
    Returns `settings`."""
    for key, value in settings.items():
        default = parser.get_default(key)
        if value is None or value == default:
            continue
        refused = None
        if default is not None and not _same_kind(value, default) or isinstance(value, dict):
            refused = f"{type(value).__name__} given"
        elif not isinstance(value, bool):
            argv = [f"--{key.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
            try:
                parsed, _ = parser.parse_known_args(argv)
                if key in vars(parsed) and getattr(parsed, key) not in (value, default):
                    refused = "not a value the option takes"
            except SettingRefused as e:
                if not str(e).startswith("the following arguments are required"):  # read the option, missed another
                    refused = str(e)
        if refused:
            raise UserError(f"{path}: the recorded setting {key} = {value!r} is not valid ({refused})")
    return settings


def _same_kind(value, default) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))
