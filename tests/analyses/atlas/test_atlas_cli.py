"""`bertscope atlas` end to end on tiny models: a decoder (Gemma-3: a sliding-window layer, grouped-query
heads) with every probe, an encoder (tiny BERT) with the rows that apply, the per-head numbers equal to
the analyses that own them (`heads positions`, `sinks`, `heads induction`), a run killed after the
streamed pass and resumed without redoing it, `atlas compare` on two runs, and one-line refusals."""
from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from conftest import interrupt_on_call

from bertscope.analyses.atlas import stats as A
from bertscope.analyses.atlas.outputs import CARD_HTML, CARD_MD, HEADS_FILE, PARQUET_FILE
from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")

LINES = ["The cat sat on a mat. It was happy. Then the cat ran home.",
         "A dog ran far away, and then came back home quickly. The dog sat on the cat, and it was happy.",
         "It was happy. The cat sat on a mat. Then the dog ran home."] * 4
NEEDLE = {"name": "dog", "needle": "The dog ran far away and then came back home.", "question": "Where was the dog?",
          "answer": "ran far away and then came back home"}


def rows_of(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from conftest import corpus_and_needles

    return corpus_and_needles(tmp_path_factory.mktemp("atlas-files"), LINES, [NEEDLE])


def decoder_args(model, files, out):
    corpus, needles = files
    return ["atlas", "--model", str(model), "--corpus", str(corpus), "--limit", "6", "--max-len", "24",
            "--batch-size", "2", "--induction-sequences", "3", "--induction-len", "8", "--needles", str(needles),
            "--retrieval-lengths", "48", "--depths", "0,50", "--importance-segments", "2", "--importance-len", "24",
            "--quiet", "--out", str(out)]


@pytest.fixture(scope="module")
def gemma_run(tiny_gemma3_lm_dir, files, tmp_path_factory):
    out = tmp_path_factory.mktemp("atlas-gemma") / "run"
    assert main(decoder_args(tiny_gemma3_lm_dir, files, out)) == 0
    return out


def test_a_decoder_gets_every_column_and_a_card(gemma_run):
    rows = rows_of(gemma_run / HEADS_FILE)
    assert list(rows[0]) == list(A.column_order())
    assert len(rows) == 2 * 4
    assert [r["attention"] for r in rows] == ["window 4"] * 4 + ["global"] * 4
    assert [r["kv_head"] for r in rows[:4]] == ["1", "1", "2", "2"]
    for r in rows:
        for name in ("entropy", "prev_mass", "alpha_1", "mean_distance", "induction_score", "retrieval_score",
                     "importance"):
            assert r[name] != "", (name, r)
        assert r["sep_mass"] == ""  # a decoder has no [SEP]
        assert float(r["next_mass"]) == 0.0  # causal: nothing after the query
        assert abs(sum(float(r[c]) for c in r if c.startswith("d_")) - 1) < 1e-5  # the distance profile sums to 1
    # the windowed layer sees 4 keys: nothing at distance 4 or more
    assert all(float(r["d_4-7"]) == 0 for r in rows[:4])
    frame = pd.read_parquet(gemma_run / PARQUET_FILE)
    assert list(frame.columns) == list(A.column_order()) and len(frame) == 8
    md = (gemma_run / CARD_MD).read_text()
    assert "| key/value heads per layer | 2 |" in md and "window 4: 1" in md and "## Top heads of each type" in md
    html = (gemma_run / CARD_HTML).read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
    results = json.loads((gemma_run / "run.json").read_text())["analyses"]["atlas"]["results"]
    assert results["counts"]["retrieval"] is not None and results["decoder"]


def test_the_pending_statistics_are_empty_until_their_kernels_exist(gemma_run):
    from dataclasses import fields

    from bertscope.kernels.spec import STAT, StatsSpec

    rows = rows_of(gemma_run / HEADS_FILE)
    streaming = "streaming" in {f.name for f in fields(StatsSpec)}
    assert all((r["streaming_error"] != "") == streaming for r in rows)
    if "duplicate_mass" in STAT:  # a mean over the rows that have an earlier copy: empty where none has
        assert all(r["duplicate_rows"] != "" and (r["duplicate_mass"] != "") == (float(r["duplicate_rows"]) > 0)
                   for r in rows)
        assert any(r["duplicate_mass"] != "" for r in rows)
    else:
        assert all(r["duplicate_mass"] == r["duplicate_rows"] == "" for r in rows)
    if not streaming:
        assert "not measured in this run" in (gemma_run / CARD_MD).read_text()


def test_the_numbers_are_those_of_the_analyses_that_own_them(gemma_run, tiny_gemma3_lm_dir, files, tmp_path):
    corpus, _ = files
    common = ["--model", str(tiny_gemma3_lm_dir), "--corpus", str(corpus), "--limit", "6", "--max-len", "24",
              "--batch-size", "2", "--quiet", "--no-figures"]
    assert main(["heads", "positions", *common, "--out", str(tmp_path / "pos")]) == 0
    assert main(["sinks", *common, "--out", str(tmp_path / "sinks")]) == 0
    atlas = rows_of(gemma_run / HEADS_FILE)
    pos = rows_of(tmp_path / "pos" / "positions_distance.csv")
    sinks = rows_of(tmp_path / "sinks" / "sinks.csv")
    for a, p, s in zip(atlas, pos, sinks):
        assert float(a["mean_distance"]) == pytest.approx(float(p["mean_distance"]), rel=1e-5)
        assert float(a["d_2-3"]) == pytest.approx(float(p["d_2-3"]), rel=1e-5, abs=1e-9)
        assert float(a["alpha_1"]) == pytest.approx(float(s["alpha_1"]), rel=1e-5)
        assert float(a["first_mass"]) == pytest.approx(float(s["first_mass"]), rel=1e-5)


def test_an_encoder_gets_the_rows_that_apply(tiny_checkpoint, tmp_path):
    out = tmp_path / "enc"
    assert main(["atlas", "--model", str(tiny_checkpoint), "--limit", "4", "--max-len", "24", "--induction-sequences",
                 "2", "--induction-len", "8", "--quiet", "--out", str(out)]) == 0
    rows = rows_of(out / HEADS_FILE)
    assert all(r["retrieval_score"] == r["importance"] == r["streaming_error"] == "" for r in rows)
    assert all(r["sep_mass"] != "" and r["induction_score"] != "" for r in rows)
    for r in rows:
        assert float(r["sink_mass"]) == pytest.approx(float(r["alpha_1"]) + float(r["sep_mass"]), abs=2e-6)
    md = (out / CARD_MD).read_text()
    assert "An encoder" in md and "not applicable" in md and "encoder (bidirectional)" in md


def test_a_run_killed_after_the_pass_resumes_without_redoing_it(tiny_llama_lm_dir, files, tmp_path, monkeypatch):
    from bertscope.analyses.heads.induction.stats import InductionScores

    whole = tmp_path / "whole"
    assert main(decoder_args(tiny_llama_lm_dir, files, whole) + ["--no-figures"]) == 0
    part = tmp_path / "part"
    original = interrupt_on_call(monkeypatch, InductionScores, 1)  # dies in the probe after the streamed pass
    assert main(decoder_args(tiny_llama_lm_dir, files, part) + ["--no-figures"]) == 130
    assert json.loads((part / "run.json").read_text())["analyses"]["atlas"]["status"] == "interrupted"
    monkeypatch.setattr(InductionScores, "add", original)

    def no_pass(self, batch):
        raise AssertionError("the streamed pass ran again")

    monkeypatch.setattr(A.StreamStats, "add", no_pass)
    assert main(["atlas", "--resume", str(part), "--quiet"]) == 0
    a, b = rows_of(whole / HEADS_FILE), rows_of(part / HEADS_FILE)
    assert a == b


def test_compare_two_runs(gemma_run, tiny_llama_lm_dir, files, tmp_path):
    llama = tmp_path / "llama"
    assert main(decoder_args(tiny_llama_lm_dir, files, llama) + ["--no-figures", "--no-retrieval",
                                                                 "--no-importance"]) == 0
    out = tmp_path / "cmp"
    assert main(["atlas", "compare", str(gemma_run), str(llama), "--out", str(out), "--quiet"]) == 0
    rows = rows_of(out / "atlas_compare.csv")
    assert len(rows) == 16 and {r["run"] for r in rows} == {str(gemma_run), str(llama)}
    assert all(r["pc1"] != "" for r in rows)
    assert (out / "fig_atlas_compare.png").is_file()
    assert rows_of(llama / HEADS_FILE)[0]["retrieval_score"] == ""  # --no-retrieval: not measured


def test_a_mistyped_subcommand_is_one_line():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "bertscope.cli", "atlas", "compre", "x"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "invalid choice: 'compre'" in err[0]


def one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_the_induction_probe_is_that_of_heads_induction(gemma_run, tiny_gemma3_lm_dir, tmp_path):
    out = tmp_path / "ind"
    assert main(["heads", "induction", "--model", str(tiny_gemma3_lm_dir), "--seq-len", "8", "--limit", "3",
                 "--per-head", "0", "--top-k", "1", "--random-draws", "1", "--quiet", "--no-figures",
                 "--out", str(out)]) == 0
    want = rows_of(out / "induction.csv")
    got = rows_of(gemma_run / HEADS_FILE)
    for w, g in zip(want, got):
        for name in ("induction", "duplicate", "previous"):
            assert float(g[f"{name}_score"]) == pytest.approx(float(w[name]), rel=1e-5, abs=1e-9)


def test_user_mistakes_are_one_line(tiny_llama_lm_dir, files, tmp_path, capsys):
    assert "no atlas_heads.csv" in one_line_error(capsys, ["atlas", "compare", str(tmp_path), str(tmp_path),
                                                            "--out", str(tmp_path / "c")])
    base = decoder_args(tiny_llama_lm_dir, files, tmp_path / "x")
    assert "longer than the model allows" in one_line_error(capsys, base + ["--retrieval-lengths", "5000"])
    assert "--induction-len" in one_line_error(capsys, base + ["--induction-len", "40"])
    assert "--induction-len must be at least 3" in one_line_error(capsys, base + ["--induction-len", "2"])
    assert "at least two" in one_line_error(capsys, ["atlas", "compare", str(tmp_path)])
    assert not (tmp_path / "x").exists()  # nothing left behind by a refused run


def test_two_torchrun_ranks_equal_one_process(tiny_llama_lm_dir, files, tmp_path):
    from conftest import run_one_and_two_ranks

    corpus, needles = files
    args = ["atlas", "--model", str(tiny_llama_lm_dir), "--corpus", str(corpus), "--limit", "6", "--max-len", "24",
            "--batch-size", "1", "--induction-sequences", "3", "--induction-len", "8", "--needles", str(needles),
            "--retrieval-lengths", "48", "--depths", "0,50", "--importance-segments", "2", "--importance-len", "24",
            "--quiet", "--no-figures"]
    one, two = run_one_and_two_ranks(args, tmp_path, port=29571)
    assert (two / "atlas_stream_heads.rank1.npz").is_file()  # each rank folded its own share
    a, b = rows_of(one / HEADS_FILE), rows_of(two / HEADS_FILE)
    assert [r["types"] for r in a] == [r["types"] for r in b]
    for x, y in zip(a, b):
        for k, v in x.items():
            if v not in ("", x["model"], x["attention"], x["types"]):
                assert float(y[k]) == pytest.approx(float(v), rel=1e-6, abs=1e-9), k
