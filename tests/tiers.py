"""The suite's two tiers, and the one rule that splits a generated matrix between them.

`make test` runs the quick tier (`-m "not full"`): every entry of every table (statistics, backends,
layouts, families, commands) is checked at least once there, on every backend path, so a change that
breaks one fails in minutes. `make test-full` runs the rest (`-m full`): the same checks on the other
cases of each matrix (the other layouts and paddings of an entry, the other compile targets, two
torchrun ranks against one process, the real-weight slices of the slower families). CI (`.ci/run`)
runs both, so nothing the suite checks goes unchecked before a change lands; a plain `pytest` runs
everything.

Two rules put a test in the full tier, and no list kept by hand:
- a generated matrix's cases: `rotated` hands them out in turn, so that each entry has one quick case
  and each case is quick for some entries, and a new entry or case lands in both tiers by construction;
  a few whole kinds are marked `full` where they are written (the compile matrices, the analyses'
  torchrun runs);
- time: a test that took more than `QUICK_SECONDS` in the recorded run (`DURATIONS`, written by
  `python tools/tiers.py record`) goes to the full tier (`mark_slow`, from tests/conftest.py), unless it
  is a smoke test (`make test-latest`'s: one per command, family and backend path), which stays quick.
  A new test is quick until a recorded run finds it slow.
tests/test_tiers.py checks both rules.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

FULL = pytest.mark.full
# the recorded run's slow tests (tools/tiers.py), and the bar: seconds of setup, call and teardown in that run,
# at the load it states (a whole-suite run with two workers on a 2-core machine)
DURATIONS = Path(__file__).with_name("tier_durations.json")
QUICK_SECONDS = 3.0


def rotated(entries: Sequence, cases: Sequence, offset: int = 0) -> dict:
    """{entry: its quick case}: the cases in turn, entry i takes case (i + offset) mod len(cases).
    Every entry has one; every case is some entry's once there are at least as many entries as
    cases. `offset` shifts the turn (a second matrix over the same entries, e.g. another backend
    path, then meets other cases first)."""
    if not cases:
        raise ValueError("rotated: no cases to hand out")
    return {entry: cases[(i + offset) % len(cases)] for i, entry in enumerate(entries)}


def full_unless(quick: bool, *values, **kw):
    """A pytest.param of `values`, marked for the full tier unless `quick`."""
    return pytest.param(*values, marks=() if quick else FULL, **kw)


def recorded_slow() -> dict[str, float]:
    """{node id: seconds} of the recorded run's tests over the bar (`DURATIONS`; empty without the file)."""
    return json.loads(DURATIONS.read_text())["slow"] if DURATIONS.exists() else {}


def mark_slow(items, slow: dict[str, float] | None = None) -> int:
    """Mark `full` every collected item the recorded run found slow, but smoke tests; the number marked."""
    slow = recorded_slow() if slow is None else slow
    marked = 0
    for item in items:
        if item.nodeid in slow and item.get_closest_marker("smoke") is None and item.get_closest_marker("full") is None:
            item.add_marker(FULL)
            marked += 1
    return marked


__all__ = ["DURATIONS", "FULL", "QUICK_SECONDS", "full_unless", "mark_slow", "recorded_slow", "rotated"]
