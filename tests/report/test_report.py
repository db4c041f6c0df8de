"""The report's sections on hand-built run directories: known findings come out, the paper's
numbers appear beside ours, absent analyses are skipped, bad directories give one-line errors."""
from __future__ import annotations

import base64
import csv
import html
import json
import logging
import re
from pathlib import Path

import pytest

from bertscope.cli.main import main
from bertscope.report.writer import REPORT_NAME, build_sections, refresh_report, write_report

# a 1x1 PNG: the report embeds bytes, it does not draw
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5E"
                       "rkJggg==")
SURFACE_COLS = ("layer", "head", "prev", "self", "next", "cls", "sep", "punct", "other", "sep_sep", "rest_sep",
                "entropy", "cls_entropy", "n_tokens")


def write_rows(path: Path, rows: list[dict]):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def head_row(layer, head, **kw) -> dict:
    row = {"layer": layer, "head": head, "prev": 0.1, "self": 0.1, "next": 0.1, "cls": 0.1, "sep": 0.1,
           "punct": 0.1, "other": 0.7, "sep_sep": 0.5, "rest_sep": 0.1, "entropy": 2.0, "cls_entropy": 3.0,
           "n_tokens": 100}
    return {**row, **kw}


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """2 layers x 3 heads: 1-2 a previous-token head, 2-3 a next-token head, layer 2 on [SEP]."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({
        "status": "complete", "command": "bertscope run --limit 4",
        "model": {"path": "/models/tiny", "type": "bert", "layers": 2, "heads": 3},
        "settings": {"corpus": "wiki", "max_len": 128}, "n_tokens": 100, "outputs": ["heads.csv"]}))
    rows = [head_row(1, 1, cls=0.6), head_row(1, 2, prev=0.8, entropy=0.3), head_row(1, 3),
            head_row(2, 1, sep=0.7, sep_sep=0.95), head_row(2, 2, sep=0.6, sep_sep=0.5),
            head_row(2, 3, next=0.55, sep=0.6, cls_entropy=3.5)]
    write_rows(d / "heads.csv", rows)
    (d / "fig_tokens_by_layer.png").write_bytes(PNG)
    return d


def sections(d: Path) -> dict:
    return dict(build_sections(d))


def text_of(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text(encoding="utf-8")))


def test_surface_findings(run_dir):
    s = sections(run_dir)
    assert list(s) == ["provenance", "surface"]
    f = "\n".join(s["surface"].findings)
    assert "1 previous-token heads (more than 50.0% of their attention on the previous token): 1-2." in f
    assert "1 next-token heads" in f and "next token): 2-3." in f
    assert "four heads (layers 2, 4, 7, 8)" in f  # the paper's number beside ours
    # layer 2's mean [SEP] mass is (0.7 + 0.6 + 0.6) / 3 = 63.3%, layer 1's 10%
    assert "from 10.0% to 63.3% (highest in layer 2); layers with over half of it on [SEP]: 2." in f
    assert "1 of 6 heads have [SEP] rows putting more than 90.0% on [SEP]" in f
    assert "3 heads put more than half of all attention on [SEP], and in 1 of them" in f
    assert "Most focused heads (lowest entropy, nats): 1-2 (0.30)" in f
    assert "[CLS] entropy in the last layer: 3.17 nats. Paper: [CLS] in the last layer has entropy 3.89" in f
    assert "broad heads" not in f  # no stats.npz: no uniform entropy to compare with
    per_layer = s["surface"].tables[0]
    assert per_layer.rows[1][2] == pytest.approx(1.9 / 3)


def test_page_is_self_contained(run_dir):
    (run_dir / "fig_unknown.png").write_bytes(PNG)
    path = write_report(run_dir)
    assert path == run_dir / REPORT_NAME
    page = path.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 2 and "http" not in page and "<script" not in page
    text = text_of(path)
    assert "Clark et al. Fig. 2" in text  # the known figure's caption
    assert "Other figures" in text and "fig_unknown.png: no caption" in text  # no figure is left out
    assert "bertscope run --limit 4" in text and "/models/tiny (bert, 2 layers x 3 heads)" in text


def test_old_heads_csv_without_the_newer_columns(run_dir):
    with open(run_dir / "heads.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    write_rows(run_dir / "heads.csv", [{k: v for k, v in r.items() if k not in ("sep_sep", "cls_entropy")}
                                       for r in rows])
    f = "\n".join(sections(run_dir)["surface"].findings)
    assert "0 of 6 heads have [SEP] rows" in f and "[CLS] entropy" not in f


def test_missing_parts_are_skipped(tmp_path):
    d = tmp_path / "probe-only"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"model": None, "probes": {}}))
    assert list(sections(d)) == ["provenance"]
    assert "Settings and provenance" in text_of(write_report(d))


def test_probe_tables_beside_the_paper(run_dir):
    write_rows(run_dir / "syntax_table.csv", [
        {"treebank": "ewt", "relation": "det", "sd_label": "det", "direction": "dep->head", "best_head": "3-1",
         "accuracy": 0.9, "baseline_offset": 1, "baseline_accuracy": 0.5, "n": 40},
        {"treebank": "ewt", "relation": "det", "sd_label": "det", "direction": "head->dep", "best_head": "2-2",
         "accuracy": 0.4, "baseline_offset": 1, "baseline_accuracy": 0.5, "n": 40}])
    write_rows(run_dir / "coref_table.csv", [
        {"dataset": "gum", "type": "All", "best_head": "2-1", "accuracy": 0.5, "overall_head": "2-1",
         "overall_head_accuracy": 0.5, "nearest": 0.2, "head_match": 0.4, "sieve": 0.6, "first_name": "", "n": 10}])
    with open(run_dir / "coref_table.csv", "a", encoding="utf-8") as f:  # GAP is not Table 2's task: no paper numbers
        f.write("gap,All,1-1,0.9,0.9,0.5,,,,,3\n")
    write_rows(run_dir / "classifier_table.csv", [{"model": "Attn + GloVe", "uas": 63.1, "uas_with_punct": 60.0}])
    s = sections(run_dir)
    syn = s["syntax"].tables[0].rows
    assert s["syntax"].findings[0] == ("ewt: 1 of 1 relations (those with 20+ words) have a head at least 10 points "
                                       "above the best fixed-offset baseline: det (+40.0).")
    assert syn == [["ewt", "det", "det", "dep->head", "3-1", 90.0, 50.0, 40, "8-11", 94.3, 51.7]]  # better direction
    assert s["coref"].tables[0].rows[0][3:7] == [50.0, 50.0, 20.0, 40.0] and s["coref"].tables[0].rows[0][8:12] == \
        [65, 27, 52, 69]
    assert s["coref"].tables[0].rows[1][8:12] == ["", "", "", ""]
    assert s["coref"].findings[1] == ("gap: best head 1-1 picks a correct antecedent 90.0% of the time (n = 3); "
                                      "no paper number: not Table 2's task.")
    assert s["classifier"].findings == ["Attn + GloVe: UAS 63.1 vs the paper's 77 [Table 3]."]
    assert "paper accuracy" in text_of(write_report(run_dir))


def test_compare_section(run_dir):
    rec = json.loads((run_dir / "run.json").read_text())
    rec["compare"] = {"a": "A", "b": "B", "model_a": "m", "model_b": "m", "test": None}
    (run_dir / "run.json").write_text(json.dumps(rec))
    write_rows(run_dir / "compare_heads.csv", [
        {"source": "heads.csv", "statistic": s, "layer": 1, "head": h, "a": 0.1, "b": 0.1 + d, "diff": d,
         "test": "", "n_a": "", "n_b": "", "p": "", "q": "", "significant": ""}
        for s, h, d in (("prev", 1, 0.05), ("sep", 2, -0.4), ("cls", 3, 0.2))])
    rows = sections(run_dir)["compare"].tables[0].rows
    assert [(r[0], r[2]) for r in rows] == [("sep", 2), ("cls", 3), ("prev", 1)]  # largest |diff| first


@pytest.mark.parametrize("make, message", [
    (lambda d: None, "is not a directory"),
    (lambda d: d.mkdir(), "run.json not found"),
    (lambda d: (d.mkdir(), (d / "run.json").write_text("{")), "is not valid JSON"),
])
def test_bad_run_dir_is_one_line(tmp_path, capsys, make, message):
    d = tmp_path / "x"
    make(d)
    assert main(["report", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: ") and message in err and err.count("\n") == 1


def test_refresh_after_a_probe_or_comparison(run_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="bertscope")
    assert refresh_report(run_dir) == run_dir / REPORT_NAME
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "wrote the report "
                                                                                f"{run_dir / REPORT_NAME}")]
    caplog.clear()
    assert refresh_report(run_dir) == run_dir / REPORT_NAME  # a report there already is updated
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("INFO", "updated the report "
                                                                                f"{run_dir / REPORT_NAME}")]
    caplog.clear()
    assert refresh_report(tmp_path / "gone") is None  # said, not raised: the probe's outputs stand
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert "was not updated" in record.getMessage() and "is not a directory" in record.getMessage()
