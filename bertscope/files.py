"""Files written so that a crash loses little, and read with one-line errors: the lowest layer of the
core's file handling, below the engine's checkpoints (`HeadStats.save`), the report (which reads run.json)
and the run directory (`bertscope.run.rundir`).

Every file is written to a temporary name beside it and renamed over it (`atomic_write`, and the writers
built on it: `write_text`, `write_json`, `write_csv`, `write_npz`), so a reader or a resumed run sees the
old file or the new one, never half of one. `read_json` reads a JSON file; `read_run` is the one checked
reader of every run.json.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from bertscope.errors import UserError


def atomic_write(path, write: Callable[[Path], object], suffix: str = ".tmp", unique: bool = False) -> Path:
    """Write `path` atomically: `write(tmp)` writes the whole file at a temporary name in the same folder,
    which then replaces `path` (`os.replace`). The temporary name is `path`'s with `suffix` added (numpy's
    savez wants ".npz" at the end), or, with `unique=True`, a name of its own (`tempfile.mkstemp`: two
    writers at once never share one). A write that fails removes its temporary file. Returns `path`."""
    path = Path(path)
    if unique:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=suffix)
        os.close(fd)
        tmp = Path(name)
    else:
        tmp = path.with_name(path.name + suffix)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path, text: str, encoding: str = "utf-8") -> Path:
    """Write a text file atomically (`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding=encoding))


def write_json(path: Path, data: dict):
    """Write JSON atomically: to a temporary file of its own (two writers never share one), renamed."""
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8"),
                 unique=True)


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...]):
    """A tidy CSV, written atomically: one header line, floats with 6 significant digits."""
    def write(tmp: Path):
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(columns)
            for row in rows:
                w.writerow([f"{row[c]:.6g}" if isinstance(row[c], float) else row[c] for c in columns])
    atomic_write(path, write)


def write_npz(path, compressed: bool = False, **arrays):
    """Write arrays to an .npz atomically: a crash mid-write leaves the old file, as a checkpoint
    must (the temporary name keeps numpy's .npz suffix, so numpy adds none)."""
    import numpy as np  # here: `bertscope --help` imports this module, numpy costs its start-up

    atomic_write(path, lambda tmp: (np.savez_compressed if compressed else np.savez)(tmp, **arrays), suffix=".tmp.npz")


def read_json(path: Path):
    """A JSON file; a one-line `UserError` naming it when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} not found: is this a bertscope run directory?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None


# the fields of run.json (and of each analysis's entry) and the JSON types they may have
RUN_FIELDS = {"settings": dict, "model": (dict, type(None)), "status": str, "command": str, "results": (dict, list),
              "outputs": list, "world_size": int, "corpus": dict, "segments": dict, "versions": dict}


def read_run(path: Path) -> dict:
    """run.json, checked: the one reader of every run.json. A `UserError` that names the file
    when it is not a JSON object or a field has the wrong type (`RUN_FIELDS`). The analyses'
    entries are under "analyses" in the result, also for runs written before that key was
    named ("probes"; their surface run listed its analyses under "analyses" as a list)."""
    path = Path(path)
    return checked_run(read_json(path), path)


def checked_run(run, path: Path) -> dict:
    """`read_run`'s checks and its one name for the analyses' entries, on run.json's contents `run`."""
    if not isinstance(run, dict):
        raise UserError(f"{path} is not a bertscope run.json: a JSON object was expected, not {type(run).__name__}")
    entries = run.get("analyses")
    if not isinstance(entries, dict):  # absent, or a run written before the key was named (a list of names, or null)
        if entries is not None and not isinstance(entries, list):
            raise UserError(f"{path}: \"analyses\" must be an object of analysis records")
        entries = run.pop("probes", None) or {}
        run.pop("analyses", None)
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise UserError(f"{path}: \"analyses\" must be an object of analysis records")
    run["analyses"] = entries
    for where, record in [("", run)] + [(f"analyses.{k}.", v) for k, v in entries.items()]:
        for key, kind in RUN_FIELDS.items():
            if key in record and not isinstance(record[key], kind) or key == "world_size" and \
                    isinstance(record.get(key), bool):
                raise UserError(f"{path}: {where}{key} has the wrong type ({type(record[key]).__name__})")
    return run
