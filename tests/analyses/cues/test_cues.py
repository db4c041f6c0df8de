"""Niven & Kao's cue statistics on hand-made data whose answer is known, and the command."""
import csv
import json

import pytest
from conftest import require_data

from bertscope.analyses.cues.stats import (
    label_cues,
    strongest,
    warrant_cues,
    word_tokens,
)
from bertscope.cli.main import main

# five ARCT-like points: (warrant0, warrant1, index of the correct warrant)
POINTS = [
    ("it is not safe", "it is safe", 0),      # "not" only in w0, w0 correct
    ("they do help", "they do not help", 1),  # "not" only in w1, w1 correct
    ("not good", "good", 1),                  # "not" only in w0, w1 correct
    ("not fair", "not right", 0),             # "not" in both: not applicable
    ("cats purr", "dogs bark", 0),            # no "not"
]


def by_cue(cues):
    return {c.cue: c for c in cues}


def test_tokens_keep_contractions_apart_from_not():
    assert word_tokens("Don't stop, it's NOT over—long-term.") == ["don't", "stop", "it's", "not", "over", "long",
                                                                   "term"]
    assert word_tokens("Don’t, can't, cannot, won't", expand_not=True) == ["do", "not", "can", "not", "can", "not",
                                                                           "will", "not"]


def test_warrant_unigram_cues():
    cues = by_cue(warrant_cues(POINTS, 1))
    assert (cues["not"].applicability, cues["not"].productivity, cues["not"].coverage) == (3, pytest.approx(2 / 3), 0.6)
    assert "safe" not in cues and "it" not in cues  # in both warrants of their point: never applicable
    assert (cues["cats"].applicability, cues["cats"].productivity) == (1, 1.0)
    assert (cues["dogs"].applicability, cues["dogs"].productivity) == (1, 0.0)
    assert (cues["fair"].applicability, cues["right"].productivity) == (1, 0.0)


def test_warrant_bigram_cues():
    cues = by_cue(warrant_cues(POINTS, 2))
    assert (cues["is not"].applicability, cues["is not"].productivity) == (1, 1.0)
    assert cues["not safe"].applicability == 1 and "it is" not in cues
    assert cues["not good"].n == 5


def test_label_cues_pick_the_majority_label():
    points = [("a cat sat", 1), ("a dog sat", 1), ("a dog ran", 0), ("no cat", 0)]
    cues = by_cue(label_cues(points, 1))
    assert (cues["a"].applicability, cues["a"].productivity, cues["a"].label) == (3, pytest.approx(2 / 3), 1)
    assert (cues["sat"].productivity, cues["sat"].label, cues["sat"].base_rate) == (1.0, 1, 0.5)
    assert cues["sat"].strength == pytest.approx(0.5 * (1.0 - 0.5))
    assert (cues["cat"].productivity, cues["cat"].label) == (0.5, 0)  # a tie goes to the smaller label
    # strength = coverage x (productivity - base rate): sat 0.5 x 0.5 beats a 0.75 x (2/3 - 1/2)
    top = strongest(cues.values(), top=10)
    assert top[0].cue == "sat" and "cat" not in [c.cue for c in top]  # cat: no better than its base rate


def test_strongest_ranks_by_coverage_times_productivity():
    top = strongest(warrant_cues(POINTS, 1), top=3)
    assert [c.cue for c in top][:1] == ["not"]  # 0.6 x 2/3 beats 0.2 x 1.0
    assert all(c.productivity > 0.5 for c in top)


def test_cues_command_on_arct(tmp_path, capsys):
    require_data("arct")
    out = tmp_path / "run"
    assert main(["cues", "--task", "arct", "--out", str(out), "--no-figures", "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "arct original all: n = 1970" in printed
    rows = list(csv.DictReader(open(out / "cues.csv")))
    nots = {(r["data"], r["split"]): r for r in rows if r["cue"] == "not"}
    assert nots["original", "all"]["n"] == "1970" and nots["original", "train"]["n"] == "1210"
    assert float(nots["original", "all"]["productivity"]) > 0.6
    # the adversarial dev and test sets take every cue's signal away
    assert {r["productivity"] for r in rows if r["data"] == "adversarial" and r["split"] == "test"} == {"0.5"}
    run = json.loads((out / "run.json").read_text())
    assert run["analyses"]["cues"]["status"] == "complete"
    assert run["analyses"]["cues"]["results"]["original/all"]["top"][0]["cue"] == "not"
    page = (out / "index.html").read_text()
    assert "Dataset cues (Niven &amp; Kao 2019), ARCT" in page and "report 0.61 and 0.64" in page
    assert "every cue&#x27;s productivity lies in [0.50, 0.50]" in page


def test_cues_command_on_rte_and_missing_data(tmp_path, capsys, monkeypatch):
    require_data("rte")
    assert main(["cues", "--task", "rte", "--out", str(tmp_path / "rte"), "--quiet", "--min-n", "20"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "rte" / "cues.csv")))
    assert {r["split"] for r in rows} == {"train", "dev", "test", "all"}
    assert all(int(r["applicability"]) >= 20 and r["label"] in ("0", "1") for r in rows)
    monkeypatch.setenv("BERTSCOPE_DATA", str(tmp_path))
    assert main(["cues", "--task", "arct", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().startswith("bertscope: error: ARCT")
