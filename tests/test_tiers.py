"""The suite's two tiers (tests/tiers.py): the rule that splits a matrix, and the commands that run them."""
import json
from pathlib import Path

import pytest
from tiers import DURATIONS, QUICK_SECONDS, mark_slow, rotated

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("n_entries,n_cases", [(1, 1), (1, 7), (7, 7), (9, 4), (31, 7), (3, 5)])
def test_every_entry_has_one_quick_case_and_every_case_is_quick_somewhere(n_entries, n_cases):
    entries, cases = [f"e{i}" for i in range(n_entries)], [f"c{j}" for j in range(n_cases)]
    for offset in range(n_cases):
        quick = rotated(entries, cases, offset)
        assert list(quick) == entries and set(quick.values()) <= set(cases)
        if n_entries >= n_cases:
            assert set(quick.values()) == set(cases)
        counts = [list(quick.values()).count(c) for c in cases]  # handed out in turn: no case twice before another once
        assert max(counts) - min(counts) <= 1


def test_the_offset_moves_an_entry_to_the_next_case():
    assert rotated("abc", ["x", "y"]) == {"a": "x", "b": "y", "c": "x"}
    assert rotated("abc", ["x", "y"], offset=1) == {"a": "y", "b": "x", "c": "y"}


def test_no_cases_is_an_error():
    with pytest.raises(ValueError, match="no cases"):
        rotated("abc", [])


def test_the_table_tests_give_every_entry_a_quick_case_on_every_path():
    """tests/kernels/test_stats_table.py: each entry of the table, on each backend path it is checked on alone,
    has a quick case, a case of the matrix; each kernel variant and each edge length one too."""
    import test_stats_table as t

    names = {s.name for s in t.ROW_STATS}
    for path in t.ENTRY_PATHS:
        assert set(t.QUICK_CASE[path]) == names and set(t.QUICK_CASE[path].values()) == set(t.CASES)
    assert set(t.QUICK_VARIANT_CASE) == set(t.VARIANTS) and set(t.QUICK_VARIANT_CASE.values()) <= set(t.CASES)
    assert set(t.QUICK_EDGE_PATH) == set(t.EDGE_LENGTHS) and set(t.QUICK_EDGE_PATH.values()) == set(t.PATHS)


def test_make_test_runs_the_quick_tier_and_ci_runs_both():
    make = (ROOT / "Makefile").read_text()
    assert '-m pytest tests -n 2 -m "not full"' in make.split("\ntest: ")[1].split("\n\n")[0]
    assert "-m pytest tests -n 2 -m full" in make.split("\ntest-full: ")[1].split("\n\n")[0]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if not line.startswith("#")]
    assert {"make test", "make test-full"} <= set(ci)
    assert "full:" in (ROOT / "pytest.ini").read_text()
    assert "mark_slow" in (ROOT / "tests" / "conftest.py").read_text()


class _Item:
    """A collected test as `mark_slow` reads it."""

    def __init__(self, nodeid, *marks):
        self.nodeid, self.marks = nodeid, set(marks)

    def get_closest_marker(self, name):
        return name if name in self.marks else None

    def add_marker(self, mark):
        self.marks.add(mark.name)


def test_a_recorded_slow_test_goes_to_the_full_tier_and_a_smoke_test_never():
    slow = {"a.py::slow": 9.0, "a.py::slow_smoke": 9.0, "a.py::already": 9.0}
    items = [_Item("a.py::slow"), _Item("a.py::slow_smoke", "smoke"), _Item("a.py::fast"),
             _Item("a.py::already", "full")]
    assert mark_slow(items, slow) == 1
    assert [sorted(i.marks) for i in items] == [["full"], ["smoke"], [], ["full"]]


def test_the_record_is_over_its_bar_and_names_tests_that_exist():
    """tests/tier_durations.json: written by tools/tiers.py, every entry over the bar it states; a test it names
    that no longer exists is harmless but says the record is stale, so most of its names must still be collected
    ones (a file renamed wholesale is the sign to re-record)."""
    record = json.loads(DURATIONS.read_text())
    assert record["bar_seconds"] == QUICK_SECONDS and record["load"] and record["recorded"]
    assert all(seconds > record["bar_seconds"] for seconds in record["slow"].values())
    files = {nodeid.split("::")[0] for nodeid in record["slow"]}
    missing = sorted(f for f in files if not (ROOT / f).exists())
    assert len(missing) <= 0.1 * len(files), missing


def test_recording_a_quick_tier_run_adds_to_the_record(tmp_path, monkeypatch):
    """`tools/tiers.py record --add`: a quick-tier run's slow tests join the record, the full tier's (not in the run)
    stay, a test timed again keeps its new seconds, and the record says when and at what load they were added."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiers_tool", ROOT / "tools" / "tiers.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    record = tmp_path / "tier_durations.json"
    record.write_text(json.dumps({"recorded": "2026-12-01", "load": "4 on 2 cores", "bar_seconds": QUICK_SECONDS,
                                  "slow": {"tests/a.py::full_one": 40.0, "tests/a.py::again": 9.0}}))
    monkeypatch.setattr(tool, "DURATIONS", record)
    (tmp_path / "run.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a" name="again" time="5.0"/>'
        '<testcase classname="tests.b" name="new_slow" time="7.25"/>'
        '<testcase classname="tests.b" name="fast" time="0.5"/>'
        '</testsuite></testsuites>')
    assert tool.main(["record", str(tmp_path / "run.xml"), "--add", "--load", "3 on 2 cores"]) == 0
    got = json.loads(record.read_text())
    assert got["slow"] == {"tests/a.py::again": 5.0, "tests/a.py::full_one": 40.0, "tests/b.py::new_slow": 7.3}
    assert got["load"].startswith("4 on 2 cores; 1 added ") and got["load"].endswith("at 3 on 2 cores")
    assert tool.main(["record", str(tmp_path / "run.xml"), "--load", "3 on 2 cores"]) == 0  # replaced whole
    assert json.loads(record.read_text())["slow"] == {"tests/a.py::again": 5.0, "tests/b.py::new_slow": 7.3}
