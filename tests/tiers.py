"""The suite's two tiers, and the one rule that splits a generated matrix between them.

`make test` runs the quick tier (`-m "not full"`): every entry of every table (statistics, backends,
layouts, families, commands) is checked at least once there, on every backend path, so a change that
breaks one fails in minutes. `make test-full` runs the rest (`-m full`): the same checks on the other
cases of each matrix (the other layouts and paddings of an entry, the other compile targets, two
torchrun ranks against one process, the real-weight slices of the slower families). CI (`.ci/run`)
runs both, so nothing the suite checks goes unchecked before a change lands; a plain `pytest` runs
everything.

Which case of a matrix is quick is not a hand-kept list: `rotated` hands the cases out in turn, so
that each entry has one quick case and each case is quick for some entries, and a new entry or case
lands in both tiers by construction (tests/test_tiers.py checks the rule).
"""
from __future__ import annotations

from collections.abc import Sequence

import pytest

FULL = pytest.mark.full


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


__all__ = ["FULL", "full_unless", "rotated"]
