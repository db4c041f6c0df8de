"""`bertscope atlas` end to end on tiny models: a decoder (Gemma-3: a sliding-window layer, grouped-query
heads) with every probe, an encoder (tiny BERT) with the rows that apply, the per-head numbers equal to
the analyses that own them (`heads positions`, `sinks`, `heads induction`; the norm-based twins those of
`sinks`), a run killed after the streamed pass and resumed without redoing it, `atlas compare` on two
runs, and one-line refusals."""
from __future__ import annotations

import csv
import json

import pandas as pd
import pytest
from conftest import NEEDLE, interrupt_on_call
from conftest import NEEDLE_LINES as LINES

from bertscope.analyses.atlas import stats as A
from bertscope.analyses.atlas.outputs import CARD_HTML, CARD_MD, HEADS_FILE, LAYERS_FILE, PARQUET_FILE
from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")



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
        for name in ("entropy", "prev_mass", "alpha_1", "mean_distance", "induction_score", "importance"):
            assert r[name] != "", (name, r)
        assert r["sep_mass"] == r["sep_mass_norm"] == ""  # a decoder has no [SEP]
        for name in ("alpha_1_norm", "first_mass_norm", "sink_mass_norm"):  # norms: on by default on a CPU
            assert 0 <= float(r[name]) <= 1 + 1e-6, (name, r)
        assert r["sink_mass_norm"] == r["alpha_1_norm"]  # a decoder's sink type reads alpha_1
        assert float(r["next_mass"]) == 0.0  # causal: nothing after the query
        # the distance profile sums to 1 over the buckets its rows could reach
        assert abs(sum(float(r[c]) for c in r if c.startswith("d_") and r[c] != "") - 1) < 1e-5
    # the windowed layer sees 4 keys (3 to the left): no distance of 4 or more is reached
    assert all(r["d_2-3"] != "" and r["d_4-7"] == "" for r in rows[:4])
    frame = pd.read_parquet(gemma_run / PARQUET_FILE)
    assert list(frame.columns) == list(A.column_order()) and len(frame) == 8
    md = (gemma_run / CARD_MD).read_text()
    assert "| key/value heads per layer | 2 |" in md and "window 4: 1" in md and "## Top heads of each type" in md
    html = (gemma_run / CARD_HTML).read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
    results = json.loads((gemma_run / "run.json").read_text())["analyses"]["atlas"]["results"]
    assert results["decoder"] and results["counts"]["sink"] is not None
    assert results["counts"]["no-op-sink"] is not None and "## Sinks: weight against norm" in md


def test_the_pending_statistics_are_empty_until_their_kernels_exist(gemma_run):
    from dataclasses import fields

    from bertscope.kernels.spec import STAT, StatsSpec

    rows = rows_of(gemma_run / HEADS_FILE)
    streaming = "streaming" in {f.name for f in fields(StatsSpec)}
    assert all((r["streaming_error"] != "") == streaming for r in rows)
    layers = {int(r["layer"]): r for r in rows_of(gemma_run / LAYERS_FILE)}
    if "duplicate_mass" in STAT:  # a mean over the rows that have an earlier copy: empty where none has
        assert all((r["duplicate_mass"] != "") == (float(layers[int(r["layer"])]["duplicate_rows"]) > 0)
                   for r in rows)
        assert any(r["duplicate_mass"] != "" for r in rows)
    else:
        assert all(r["duplicate_mass"] == "" for r in rows)
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
        for name in ("alpha_1_norm", "first_mass_norm"):  # `sinks --norms`, its default on a CPU
            assert float(a[name]) == pytest.approx(float(s[name]), rel=1e-5, abs=1e-9), name


def test_an_encoder_gets_the_rows_that_apply(tiny_checkpoint, tmp_path):
    out = tmp_path / "enc"
    assert main(["atlas", "--model", str(tiny_checkpoint), "--limit", "4", "--max-len", "24", "--induction-sequences",
                 "2", "--induction-len", "8", "--quiet", "--out", str(out)]) == 0
    rows = rows_of(out / HEADS_FILE)
    assert all(r["retrieval_score"] == r["importance"] == r["streaming_error"] == "" for r in rows)
    assert all(r["sep_mass"] != "" and r["induction_score"] != "" for r in rows)
    for r in rows:
        assert float(r["sink_mass"]) == pytest.approx(float(r["alpha_1"]) + float(r["sep_mass"]), abs=2e-6)
        assert float(r["sink_mass_norm"]) == pytest.approx(float(r["alpha_1_norm"]) + float(r["sep_mass_norm"]),
                                                           abs=2e-6)
    md = (out / CARD_MD).read_text()
    assert "An encoder" in md and "not applicable" in md and "encoder (bidirectional)" in md


ENCODER = ["--limit", "4", "--max-len", "24", "--induction-sequences", "2", "--induction-len", "8", "--quiet",
           "--no-figures"]


def test_with_every_value_vector_of_one_length_the_norm_shares_are_the_weights(tiny_checkpoint, tmp_path,
                                                                              monkeypatch):
    """n_j the same for every key: a_ij n_j / sum_j a_ij n_j is a_ij, so each twin equals its weight-based
    column, and a sink is never a no-op sink (its norm share is its weight, at least 0.3)."""
    import torch

    from bertscope.models.attention import ValueNorms

    def one_length(self, module, value, n_heads):  # value (B, H_kv, L, D) -> norms (B, H, L)
        return torch.full((value.shape[0], n_heads, value.shape[2]), 2.5, dtype=torch.float32, device=value.device)

    monkeypatch.setattr(ValueNorms, "__call__", one_length)
    out = tmp_path / "equal"
    assert main(["atlas", "--model", str(tiny_checkpoint), *ENCODER, "--out", str(out)]) == 0
    rows = rows_of(out / HEADS_FILE)
    for r in rows:
        for name in ("alpha_1", "first_mass", "sep_mass", "sink_mass"):
            assert float(r[f"{name}_norm"]) == pytest.approx(float(r[name]), abs=1e-5), (name, r)
        assert r["type_no-op-sink"] == "0"


def test_no_norms_leaves_the_twins_empty_and_the_no_op_sink_not_measured(tiny_checkpoint, tmp_path, capsys,
                                                                       monkeypatch):
    out = tmp_path / "off"
    assert main(["atlas", "--model", str(tiny_checkpoint), *ENCODER, "--no-norms", "--out", str(out)]) == 0
    rows = rows_of(out / HEADS_FILE)
    assert all(r[c] == "" for r in rows for c in ("alpha_1_norm", "first_mass_norm", "sep_mass_norm",
                                                  "sink_mass_norm"))
    assert all(r["sink_mass"] != "" and r["type_no-op-sink"] == "0" for r in rows)
    results = json.loads((out / "run.json").read_text())["analyses"]["atlas"]["results"]
    assert results["counts"]["no-op-sink"] is None
    assert results["not_measured"]["no-op-sink"].startswith("not measured in this run")
    assert "No-op sinks: not measured in this run" in (out / CARD_MD).read_text()


@pytest.mark.full  # two atlas runs, one through Triton's interpreter: about 35 s
def test_norms_on_the_triton_backend_are_the_chunked_backends(tiny_checkpoint, tmp_path):
    """`atlas --norms --backend triton` (the fused kernel's class twins, its interpreter here): the sink twins of
    the chunked backend. The atlas asks for the class masses' twins alone (`sinks.stats.spec_for`), which the
    kernel computes, not those of the distance, position and token statistics."""
    runs = {}
    for backend in ("triton", "chunked"):
        out = tmp_path / backend
        assert main(["atlas", "--model", str(tiny_checkpoint), *ENCODER, "--norms", "--backend", backend,
                     "--out", str(out)]) == 0
        runs[backend] = rows_of(out / HEADS_FILE)
    for name in ("alpha_1_norm", "first_mass_norm", "sep_mass_norm", "sink_mass_norm"):
        a, b = ([float(r[name]) for r in runs[k]] for k in ("triton", "chunked"))
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5), name
        assert all(0 <= x <= 1 + 1e-6 for x in a), name


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


@pytest.mark.full  # tests/tiers.py
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


# --- the card read as a researcher would (issue 47, part 3) ------------------------------------------------------


def test_the_csv_holds_the_numbers_of_the_parquet_file_exactly(gemma_run):
    """The CSV once rounded to 6 significant figures while the Parquet file kept float64: now both hold the
    same values, every digit (an empty cell is the Parquet file's NaN)."""
    import math

    rows = rows_of(gemma_run / HEADS_FILE)
    frame = pd.read_parquet(gemma_run / PARQUET_FILE)
    text = {"model", "attention", "types"}
    checked = 0
    for i, r in enumerate(rows):
        for c, v in r.items():
            if c in text:
                continue
            want = float(frame[c].iloc[i])
            if math.isnan(want):
                assert v == "", (c, v)
            else:
                assert float(v) == want, (c, v, want)  # exact: no rounding
                checked += 1
    assert checked > 100
    assert any(len(v.replace("-", "").lstrip("0.").replace(".", "")) > 6 for r in rows for v in r.values()
               if v[:1].isdigit())  # more than 6 significant digits do appear


def test_distance_buckets_no_row_reaches_are_empty_not_zero(gemma_run):
    """Segments of at most 24 tokens: no query-key distance of 24 or more exists, so in the global layer
    every bucket from 32-63 on is empty ("not reached"), while 16-31 holds a measured number; in the
    windowed layer (3 keys to the left) every bucket from 4-7 on."""
    from bertscope.analyses.heads.positions.stats import bucket_bounds

    rows = rows_of(gemma_run / HEADS_FILE)
    names = [c for c in rows[0] if c.startswith("d_")]
    lows = [lo for lo, _ in bucket_bounds()]
    for r in rows[4:]:  # the global layer
        assert [r[c] == "" for c in names] == [lo >= 32 for lo in lows]
        assert r["d_16-31"] != "" and r["d_32-63"] == "" and r["d_32768+"] == ""
    for r in rows[:4]:
        assert [r[c] == "" for c in names] == [lo > 3 for lo in lows]


def brute_force_rows(ids: list[int], left: int | None) -> tuple[int, int]:
    """(rows with an earlier copy of their token among the keys they see, rows that see the key right after
    one): position by position, a row i seeing keys i - left .. i (all before it when left is None)."""
    dup = pre = 0
    for i in range(len(ids)):
        lo = 0 if left is None else max(0, i - left)
        earlier = [m for m in range(i) if ids[m] == ids[i]]
        dup += any(m >= lo for m in earlier)
        pre += any(m + 1 >= lo for m in earlier)
    return dup, pre


def test_the_rows_behind_the_duplicate_mass_are_counted_per_layer_not_repeated_per_head(gemma_run,
                                                                                      tiny_gemma3_lm_dir, files):
    """duplicate_rows repeated one count on every head's row; it is a count of the corpus's rows, the same
    for every head of a layer (a window sees fewer earlier copies than a global layer). It is gone from
    atlas_heads.csv and is in atlas_layers.csv, run.json and the card, equal to a count by brute force over
    the pass's segments."""
    from argparse import Namespace

    from bertscope.analyses.sinks import stats as S
    from bertscope.analyses.sinks.command import bos_plan, checked_sink_segments
    from bertscope.models.loading import load_model

    if "duplicate_rows" not in A.layer_columns():
        pytest.fail("atlas_layers.csv has no duplicate_rows")
    assert "duplicate_rows" not in rows_of(gemma_run / HEADS_FILE)[0]
    assert "prefix_match_rows" not in rows_of(gemma_run / HEADS_FILE)[0]
    corpus, _ = files
    loaded = load_model(tiny_gemma3_lm_dir)
    seg_args = Namespace(max_len=24, limit=6, seed=0, initial=S.INITIAL, bos="auto", bos_token=None,
                         corpus=str(corpus), text_field=None)
    stream, _ = checked_sink_segments(loaded, seg_args, True, bos_plan(loaded, seg_args, True))
    segments = [s.input_ids for s in stream]
    assert len(segments) == 6
    want = {}
    for layer, left in ((1, 3), (2, None)):  # the window of 4 keys sees 3 to the left
        counts = [brute_force_rows(ids, left) for ids in segments]
        want[layer] = (sum(c[0] for c in counts), sum(c[1] for c in counts))
    assert want[2][0] > want[1][0] and want[2][0] > 0
    layers = rows_of(gemma_run / LAYERS_FILE)
    assert [(int(r["duplicate_rows"]), int(r["prefix_match_rows"])) for r in layers] == [want[1], want[2]]
    results = json.loads((gemma_run / "run.json").read_text())["analyses"]["atlas"]["results"]
    assert results["corpus_rows"] == {"duplicate_rows": [want[1][0], want[2][0]],
                                      "prefix_match_rows": [want[1][1], want[2][1]]}
    md = (gemma_run / CARD_MD).read_text()
    assert f"| duplicate_mass is over | {want[1][0]:,} rows (layer 1), {want[2][0]:,} rows (layer 2)" in md


def retrieval_cells(run_dir) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "retrieval_cells").glob("*.json"))]


def test_retrieval_is_not_measured_over_too_few_answered_haystacks(gemma_run):
    """The tiny random model answers (almost) no haystack in its own words: with fewer than 3 answered,
    retrieval_score is empty on every head, no head is a retrieval head, and the card says how many of
    the 2 haystacks were answered and why that is not enough."""
    cells = retrieval_cells(gemma_run)
    assert len(cells) == 2 and all("answer_text" in c and c["setup"]["answer"] == "greedy" for c in cells)
    answered = sum(bool(c["answered"]) for c in cells)
    rows = rows_of(gemma_run / HEADS_FILE)
    assert all(r["retrieval_score"] == "" and r["type_retrieval"] == "0" for r in rows)
    results = json.loads((gemma_run / "run.json").read_text())["analyses"]["atlas"]["results"]
    assert results["counts"]["retrieval"] is None
    why = results["not_measured"]["retrieval"]
    assert why.startswith(f"not measured: {answered} of 2 haystacks answered") and "at least 3" in why
    assert why in (gemma_run / CARD_MD).read_text()


def test_retrieval_over_three_answered_haystacks_is_wu_et_als_score(tiny_llama_lm_dir, files, tmp_path, monkeypatch):
    """Every greedy answer counted as answered (the word recall patched to 1): with 3 depths the type rests
    on 3 answered haystacks, and retrieval_score is the mean of the cells' hits / |needle| over them."""
    import numpy as np

    from bertscope.analyses.heads.retrieval import stats as R

    monkeypatch.setattr(R, "word_recall", lambda reference, answer: 1.0)
    out = tmp_path / "answered"
    args = decoder_args(tiny_llama_lm_dir, files, out)
    args[args.index("--depths") + 1] = "0,50,100"
    assert main(args + ["--no-figures", "--no-importance"]) == 0
    cells = retrieval_cells(out)
    assert len(cells) == 3 and all(c["answered"] for c in cells)
    want = np.mean([np.asarray(c["hits"], float) / c["needle_len"] for c in cells], axis=0).ravel()
    got = [float(r["retrieval_score"]) for r in rows_of(out / HEADS_FILE)]
    np.testing.assert_allclose(got, want, rtol=0, atol=0)
    results = json.loads((out / "run.json").read_text())["analyses"]["atlas"]["results"]
    assert "retrieval" not in results["not_measured"] and results["retrieval_probe"]["answered"] == {
        "answered": 3, "haystacks": 3}
    assert "3 of 3 haystacks answered in the model's own words" in (out / CARD_MD).read_text()


def test_a_bidirectional_window_says_its_keys_on_each_side(files, tmp_path):
    """ModernBERT's local layer sees 2 keys on each side: its attention column reads "window ±2 (5 keys)",
    not a bare "window 3", and its distance buckets from 4-7 on are empty (not reached)."""
    from tiny_decoders import save_family

    model = save_family(tmp_path / "modernbert", "modernbert")
    corpus, _ = files
    out = tmp_path / "mb"
    assert main(["atlas", "--model", str(model), "--corpus", str(corpus), "--limit", "3", "--max-len", "24",
                 "--induction-sequences", "1", "--induction-len", "4", "--no-figures", "--quiet",
                 "--out", str(out)]) == 0
    rows = rows_of(out / HEADS_FILE)
    kinds = [r["attention"] for r in rows]
    assert set(kinds) == {"global", "window ±2 (5 keys)"}
    local = [r for r in rows if r["attention"] != "global"]
    assert all(r["d_2-3"] != "" and r["d_4-7"] == "" for r in local)
    assert "window ±2 (5 keys)" in (out / CARD_MD).read_text()
