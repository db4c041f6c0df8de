"""The slow tests of the suite's quick tier, recorded from a timed run (tests/tiers.py).

    python -m pytest tests -n 2 --junitxml=run.xml     # a whole-suite run, timed per test
    python tools/tiers.py record run.xml --load "4.5 on 2 cores"   # -> tests/tier_durations.json
    python -m pytest tests -n 2 -m "not full" --junitxml=quick.xml  # a quick-tier run: new tests timed
    python tools/tiers.py record quick.xml --add --load "4.5 on 2 cores"   # its slow tests added to the record

`make test` runs the quick tier: every test but those marked `full`, and but those that took more than
`QUICK_SECONDS` in the recorded run (`tests/tier_durations.json`, the tests over it with their seconds),
unless they are smoke tests (one per command, family and backend path: always quick). `make test-full`
runs the rest, and CI runs both. A new test is quick until a recorded run finds it slow; re-record when
the suite's balance moves (the file says when, at what load, and the bar it used).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from tiers import DURATIONS, QUICK_SECONDS  # noqa: E402  (tests/tiers.py: the one place of both)


def node_id(testcase: ET.Element) -> str:
    """pytest's node id of a JUnit testcase: tests/x/test_y.py::test_z[param]."""
    return testcase.get("classname").replace(".", "/") + ".py::" + testcase.get("name")


def slow_tests(junit: Path, bar: float = QUICK_SECONDS) -> dict[str, float]:
    """{node id: seconds} of the tests of a JUnit XML report that took more than `bar` (setup, call and
    teardown: a module's fixture counts in its first test), passed or not."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        seconds = float(case.get("time") or 0)
        if seconds > bar and case.find("skipped") is None:
            out[node_id(case)] = math.ceil(seconds * 10) / 10  # rounded up: still over the bar
    return dict(sorted(out.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="write tests/tier_durations.json from a JUnit XML report")
    rec.add_argument("junit", type=Path)
    rec.add_argument("--load", required=True, help="the machine's load during the run, as the record states it")
    rec.add_argument("--bar", type=float, default=QUICK_SECONDS, help="seconds above which a test is slow")
    rec.add_argument("--add", action="store_true",
                     help="add the report's slow tests to the record instead of replacing it (a quick-tier run: the "
                     "full tier's tests are not in it, and they stay recorded)")
    args = parser.parse_args(argv)
    slow = slow_tests(args.junit, args.bar)
    if args.add:
        old = json.loads(DURATIONS.read_text())
        if old["bar_seconds"] != args.bar:
            parser.error(f"the record's bar is {old['bar_seconds']} s, not {args.bar}: re-record it whole")
        added = sorted(set(slow) - set(old["slow"]))
        slow = dict(sorted({**old["slow"], **slow}.items()))
        load = f"{old['load']}; {len(added)} added {datetime.date.today().isoformat()} at {args.load}"
        print(f"{len(added)} tests added over {args.bar} s: {', '.join(added) or 'none'}")
    else:
        load = args.load
    DURATIONS.write_text(json.dumps({"recorded": datetime.date.today().isoformat(), "load": load,
                                     "bar_seconds": args.bar, "slow": slow}, indent=1) + "\n")
    print(f"{len(slow)} tests over {args.bar} s -> {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
