"""Figures drawn in helper processes, so that a run hardly waits for them.

Drawing a run's figures costs a few seconds of one core: importing matplotlib, then laying
out and rasterising text. `FigurePool.start()` launches its helpers when a run begins: each
imports matplotlib while the main process imports torch and loads the model (mostly on one
core), then waits. Once the table is known, `draw(...)` gives every helper its share of the
figures; they draw side by side while the main process writes its other outputs, and
`wait()` returns the files written, or raises `FigureError` saying what went wrong: a figure
that fails never costs the data outputs.

A helper (`python -m bertscope.report.figure_pool [MODULE:FUNCTION]`) first calls its warm-up function
(importing matplotlib, loading fonts), then reads one job, a list of pickled (function, kwargs),
from stdin and answers one JSON line on stdout. It ignores Ctrl-C, which the
terminal sends to the whole process group: the run decides what an interrupt means, and a
helper whose stdin closes without a job exits quietly.
"""
from __future__ import annotations

import importlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


class FigureError(RuntimeError):
    """A figure could not be drawn (the message says which helper, and why)."""


def split(costs: dict[str, float], n: int) -> list[list[str]]:
    """Names shared among at most n helpers: each in turn, costliest first, goes to the least loaded."""
    shares = [[] for _ in range(max(1, min(n, len(costs))))]
    load = [0.0] * len(shares)
    for name in sorted(costs, key=lambda k: -costs[k]):
        i = load.index(min(load))
        shares[i].append(name)
        load[i] += costs[name]
    return shares


def default_helpers() -> int:
    """Two helpers where two cores are ours, else one; none on torchrun ranks but 0 (rank 0 draws)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 2 if cores >= 2 else 1


class FigurePool:
    """Helper processes that draw figures; with none (`FigurePool([])`), figures are drawn here."""

    def __init__(self, helpers: list[subprocess.Popen]):
        self.helpers = helpers
        self.busy: list[subprocess.Popen] = []
        self.local: list[tuple[str, dict]] = []  # jobs drawn in this process (no helpers)

    @classmethod
    def start(cls, warm_up: str | None = None, n: int | None = None) -> FigurePool:
        """Launch n helpers (default: default_helpers()), each calling `warm_up` ("module:name") now."""
        helpers = []
        for _ in range(default_helpers() if n is None else n):
            log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty helper never blocks
            try:
                helper = subprocess.Popen([sys.executable, "-m", "bertscope.report.figure_pool",
                                           *([warm_up] if warm_up else [])],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
            except OSError:  # no process to spare: draw in this process instead
                log.close()
                break
            helper.log = log
            helpers.append(helper)
        return cls(helpers)

    def draw(self, function: str, shares: list[dict]):
        """Call `function` ("module:name", returning the paths it wrote) once per share of
        keyword arguments, each share in its own helper (several in one when shares outnumber
        helpers; all here when there are no helpers)."""
        if not self.helpers:
            self.local += [(function, kwargs) for kwargs in shares]
            return
        jobs = [[] for _ in self.helpers]
        for i, kwargs in enumerate(shares):
            jobs[i % len(jobs)].append((function, kwargs))
        for helper, job in zip(self.helpers, jobs):
            try:
                if job:
                    self.busy.append(helper)  # a helper that died early is reported by wait()
                    helper.stdin.write(pickle.dumps(job))
                helper.stdin.close()  # EOF: a helper without a job exits
            except OSError:  # BrokenPipeError: the helper is gone
                pass

    def wait(self) -> list[Path]:
        """The paths written by every share, in order; FigureError if any share failed."""
        paths, errors = [], []
        for function, kwargs in self.local:
            try:
                paths += call(function, kwargs)
            except Exception as error:  # as a helper would report it
                errors.append(f"{type(error).__name__}: {error}")
        self.local = []
        for helper in self.busy:
            answer = helper.stdout.read()  # until the helper exits (stdout closes)
            helper.wait()
            try:
                result = json.loads(answer.decode().strip().splitlines()[-1])
            except (ValueError, IndexError):
                helper.log.seek(0)
                tail = helper.log.read().decode(errors="replace").strip().splitlines()[-1:]
                errors.append(f"a figure helper exited with code {helper.returncode}"
                              + (f": {tail[0]}" if tail else ""))
                continue
            if "error" in result:
                errors.append(result["error"])
            else:
                paths += [Path(p) for p in result["paths"]]
        self.busy = []
        self.close()
        if errors:
            raise FigureError("; ".join(errors))
        return paths

    def close(self):
        """Stop every helper: one without a job exits at EOF, one still drawing (the run was
        interrupted or failed) is killed, and so is one that does not exit."""
        for helper in self.helpers:
            if not helper.stdin.closed:
                try:
                    helper.stdin.close()
                except BrokenPipeError:
                    pass
            if helper in self.busy:
                helper.kill()
            try:
                helper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                helper.kill()
                helper.wait()
            helper.stdout.close()
            helper.log.close()
        self.helpers, self.busy = [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def call(function: str, kwargs: dict) -> list[Path]:
    """`function` ("module:name") called with `kwargs`; the paths it returns."""
    module, name = function.split(":")
    return [Path(p) for p in getattr(importlib.import_module(module), name)(**kwargs) or ()]


def helper_main(warm_up: list[str]) -> int:
    """One helper: call `warm_up` (if given), then draw the job from stdin (if any) and answer on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    answer = sys.stdout
    sys.stdout = sys.stderr  # whatever the drawing prints stays out of the answer
    for function in warm_up:
        try:
            call(function, {})
        except Exception:  # a failed warm-up is only slower: the job will say what is wrong
            pass
    data = sys.stdin.buffer.read()
    if not data:
        return 0
    try:
        paths = [str(p) for function, kwargs in pickle.loads(data) for p in call(function, kwargs)]
        result = {"paths": paths}
    except Exception as error:  # every failure goes back to the run, in words
        result = {"error": f"{type(error).__name__}: {error}"}
    answer.write(json.dumps(result) + "\n")
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(helper_main(sys.argv[1:]))
