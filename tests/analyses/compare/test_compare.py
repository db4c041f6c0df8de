"""`bertscope compare`: differences, test decisions and refusals on hand-built run
directories with known values, and one comparison of two real tiny runs."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats as sps

import bertscope.analyses.compare.command
from bertscope.analyses.compare.command import compare_runs
from bertscope.analyses.compare.stats import (
    PAIRED,
    UNPAIRED,
    bh_adjust,
    paired_test,
    unpaired_test,
)
from bertscope.cli.main import main
from bertscope.errors import UserError
from bertscope.files import write_csv, write_json

LY, H, N = 2, 3, 50
STATS = ("prev", "entropy", "rest_sep")
SHIFTED = (1, 2)  # head 2-3 (0-based layer, head), shifted in b


def make_run(path: Path, per_segment: dict[str, np.ndarray] | None, segments=None, layers=LY, heads=H,
             heads_csv: dict[str, np.ndarray] | None = None, row_group=None) -> Path:
    """A run directory written by hand: run.json, heads.csv (the per-segment means, or
    `heads_csv`) and, with `per_segment` (stat -> (N, layers, heads)), examples.parquet."""
    path.mkdir(parents=True)
    write_json(path / "run.json", {"status": "complete", "model": {"path": "hand", "layers": layers, "heads": heads},
                                   "settings": {"corpus": "hand.txt"}})
    table = heads_csv or {k: v.mean(0) for k, v in per_segment.items()}
    rows = [{"layer": l + 1, "head": h + 1, **{k: float(v[l, h]) for k, v in table.items()}, "n_tokens": 100}
            for l in range(layers) for h in range(heads)]
    write_csv(path / "heads.csv", rows, ("layer", "head", *table, "n_tokens"))
    if per_segment is not None:
        n = len(next(iter(per_segment.values())))
        seg = np.arange(n) if segments is None else np.asarray(segments)
        rep = layers * heads
        cols = {"segment": np.repeat(seg, rep), "document": np.repeat(seg, rep),
                "doc_id": np.repeat(np.array([f"doc{s}" for s in seg], dtype=object), rep),
                "layer": np.tile(np.repeat(np.arange(1, layers + 1, dtype=np.int16), heads), n),
                "head": np.tile(np.arange(1, heads + 1, dtype=np.int16), n * layers),
                "n_tokens": np.repeat(10 + seg % 7, rep).astype(np.int32)}
        for k, v in per_segment.items():
            cols["non_sep_sep" if k == "rest_sep" else k] = v.reshape(-1)
        order = np.random.default_rng(1).permutation(n * rep)  # rows in any order, as batches leave them
        table = pa.table({k: pa.array(v[order]) for k, v in cols.items()})
        pq.write_table(table, path / "examples.parquet", row_group_size=row_group)
    return path


def noise(seed: int, n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s: rng.normal(0.5, 0.1, (n, LY, H)) for s in STATS}


def balanced_noise(seed: int, shape) -> np.ndarray:
    """Per-segment differences of random sizes, each size once up and once down (shuffled):
    the signed ranks cancel exactly, so no test may call them a change."""
    rng = np.random.default_rng(seed)
    m = np.abs(rng.normal(0, 0.02, (shape[0] // 2, *shape[1:])))
    return rng.permuted(np.concatenate([m, -m]), axis=0)


@pytest.fixture
def paired_runs(tmp_path):
    """b = a + symmetric noise everywhere, + 0.3 on head 2-3's prev."""
    a = noise(0)
    b = {k: v + balanced_noise(i + 10, v.shape) for i, (k, v) in enumerate(a.items())}
    b["prev"][:, SHIFTED[0], SHIFTED[1]] += 0.3
    return make_run(tmp_path / "a", a), make_run(tmp_path / "b", b), a, b


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_error(capsys, code: int, fragment: str):
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("bertscope: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert fragment in err, err


# --- the statistics ----------------------------------------------------------------------


def test_bh_matches_scipy():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 40) ** 3
    np.testing.assert_allclose(bh_adjust(p), sps.false_discovery_control(p), rtol=1e-12)
    with_nan = np.concatenate([p, [np.nan]])
    np.testing.assert_allclose(bh_adjust(with_nan)[:-1], sps.false_discovery_control(p), rtol=1e-12)
    assert np.isnan(bh_adjust(with_nan)[-1])


def test_tests_match_scipy_and_edge_cases():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(30, 3))
    b = a + rng.normal(0.2, 1, size=(30, 3))
    b[:, 2] = a[:, 2]  # nothing changed: p = 1, not NaN
    b[4, 1] = np.nan  # that pair is left out
    p, n = paired_test(a, b)
    assert p[0] == pytest.approx(sps.wilcoxon(a[:, 0], b[:, 0]).pvalue)
    assert p[1] == pytest.approx(sps.wilcoxon(np.delete(a[:, 1], 4), np.delete(b[:, 1], 4)).pvalue)
    assert p[2] == 1.0 and list(n) == [30, 29, 30]
    c = rng.normal(0.5, 1, size=(41, 3))
    c[:, 2] = 7.0
    a[:, 2] = 7.0  # constant in both samples: p = 1
    p, n_a, n_b = unpaired_test(a, c)
    assert p[0] == pytest.approx(sps.mannwhitneyu(a[:, 0], c[:, 0]).pvalue)
    assert p[2] == 1.0 and list(n_a) == [30] * 3 and list(n_b) == [41] * 3


# --- hand-built runs ---------------------------------------------------------------------


def test_paired_shift_is_significant_others_not(paired_runs):
    run_a, run_b, a, b = paired_runs
    comp = compare_runs(run_a, run_b)
    assert comp.test == PAIRED and comp.segments == {"a": N, "b": N, "paired": True, "same_segments": True}
    key = ("heads.csv", "prev")
    np.testing.assert_allclose(comp.diff[key], b["prev"].mean(0) - a["prev"].mean(0), atol=1e-5)
    sig = {s: np.argwhere(comp.tests[("heads.csv", s)]["q"] < 0.05).tolist() for s in STATS}
    assert sig == {"prev": [list(SHIFTED)], "entropy": [], "rest_sep": []}
    # the p-value is scipy's Wilcoxon on the 50 pairs, read back through the parquet (rest_sep is non_sep_sep)
    l, h = SHIFTED
    assert comp.tests[key]["p"][l, h] == pytest.approx(sps.wilcoxon(a["prev"][:, l, h], b["prev"][:, l, h]).pvalue)
    p = sps.wilcoxon(a["rest_sep"][:, 0, 1], b["rest_sep"][:, 0, 1]).pvalue
    assert comp.tests[("heads.csv", "rest_sep")]["p"][0, 1] == pytest.approx(p)
    assert comp.summary().splitlines()[5].strip().startswith(f"prev         {l + 1}-{h + 1} (+0.3")


def test_unpaired_when_segments_differ(tmp_path):
    """b: other segments, each of a's values twice (shuffled), so the same distribution,
    except head 1-1's entropy, lowered by 0.2."""
    a = noise(0)
    rng = np.random.default_rng(5)
    b = {k: rng.permuted(np.concatenate([v, v]), axis=0) for k, v in a.items()}
    b["entropy"][:, 0, 0] -= 0.2
    run_a = make_run(tmp_path / "a", a)
    run_b = make_run(tmp_path / "b", b, segments=np.arange(100, 100 + 2 * N))
    comp = compare_runs(run_a, run_b)
    assert comp.test == UNPAIRED and comp.segments["paired"] is False
    t = comp.tests[("heads.csv", "entropy")]
    assert (t["n_a"] == N).all() and (t["n_b"] == 2 * N).all()
    assert np.argwhere(t["q"] < 0.05).tolist() == [[0, 0]]
    assert t["p"][1, 2] == pytest.approx(sps.mannwhitneyu(a["entropy"][:, 1, 2], b["entropy"][:, 1, 2]).pvalue)
    assert not (comp.tests[("heads.csv", "prev")]["q"] < 0.05).any()
    with pytest.raises(UserError, match="same segments"):
        compare_runs(run_a, run_b, test="paired")
    # forced unpaired on shared segments: Mann-Whitney
    assert compare_runs(run_a, run_a, test="unpaired").test == UNPAIRED


def test_streaming_in_small_batches_gives_the_same(paired_runs, tmp_path, monkeypatch):
    run_a, run_b, a, b = paired_runs
    whole = compare_runs(run_a, run_b)
    monkeypatch.setattr(bertscope.analyses.compare.command, "BATCH_ROWS", 7)  # batches cut across segments and heads
    small_a = make_run(tmp_path / "a2", a, row_group=11)
    small_b = make_run(tmp_path / "b2", b, row_group=13)
    assert pq.ParquetFile(small_a / "examples.parquet").num_row_groups > 20
    streamed = compare_runs(small_a, small_b, memory_mb=0)  # one statistic per pass
    for key, t in whole.tests.items():
        for k in ("p", "q", "n_a", "n_b"):
            np.testing.assert_array_equal(streamed.tests[key][k], t[k])


def test_nan_segments_are_left_out(tmp_path):
    a, b = noise(0), noise(1)
    a["rest_sep"][:5, 0, 0] = np.nan  # a group without rows in those segments
    comp = compare_runs(make_run(tmp_path / "a", a, heads_csv={"rest_sep": np.zeros((LY, H))}),
                        make_run(tmp_path / "b", b))
    t = comp.tests[("heads.csv", "rest_sep")]
    assert t["n_a"][0, 0] == N - 5 and t["n_a"][0, 1] == N and np.isfinite(t["p"]).all()


def test_without_examples_no_test(tmp_path, paired_runs):
    run_a, _, a, _ = paired_runs
    other = make_run(tmp_path / "c", None, heads_csv={"prev": np.ones((LY, H)), "cls": np.ones((LY, H))})
    comp = compare_runs(run_a, other)
    assert comp.test is None and comp.tests == {}
    assert list(comp.diff) == [("heads.csv", "prev")]
    assert comp.only_a == [("heads.csv", "entropy"), ("heads.csv", "rest_sep")]
    assert comp.only_b == [("heads.csv", "cls")]
    rows = comp.rows()
    assert len(rows) == LY * H and rows[0]["test"] == ""
    assert rows[0]["diff"] == pytest.approx(1 - a["prev"].mean(0)[0, 0])
    assert "no significance test" in comp.summary()
    with pytest.raises(UserError, match="needs examples.parquet"):
        compare_runs(run_a, other, test="paired")


def test_probe_tables_are_compared(paired_runs):
    run_a, run_b, _, _ = paired_runs
    for run, acc in ((run_a, 0.2), (run_b, 0.5)):
        rows = [{"treebank": "ewt", "relation": "nsubj", "sd_label": "nsubj", "direction": "dep->head", "layer": l + 1,
                 "head": h + 1, "accuracy": acc * (l == 1 and h == 0), "n": 10} for l in range(LY) for h in range(H)]
        write_csv(run / "syntax_heads.csv", rows, tuple(rows[0]))
    comp = compare_runs(run_a, run_b)
    key = ("syntax_heads.csv", "accuracy[ewt/nsubj/dep->head]")
    assert comp.diff[key][1, 0] == pytest.approx(0.3) and comp.diff[key].sum() == pytest.approx(0.3)
    assert key not in comp.tests
    lines = comp.summary().splitlines()
    section = lines[lines.index("largest changes in syntax_heads.csv:") + 1:]
    # unchanged heads not listed
    assert [line.split() for line in section] == [["accuracy[ewt/nsubj/dep->head]", "2-1", "(+0.300)"]]


# --- the command -------------------------------------------------------------------------


def test_command_writes_csv_figures_and_run_json(paired_runs, tmp_path, capsys):
    run_a, run_b, a, b = paired_runs
    out = tmp_path / "cmp"
    assert main(["compare", str(run_a), str(run_b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Wilcoxon signed-rank" in printed and "[1/6 significant]" in printed
    rows = read_rows(out / "compare_heads.csv")
    assert list(rows[0]) == list(bertscope.analyses.compare.command.COLUMNS) and len(rows) == len(STATS) * LY * H
    shifted = [r for r in rows if r["significant"] == "True"]
    assert [(r["statistic"], r["layer"], r["head"]) for r in shifted] == [("prev", "2", "3")]
    assert {r["test"] for r in rows} == {PAIRED} and {r["n_a"] for r in rows} == {str(N)}
    assert float(shifted[0]["diff"]) == pytest.approx(b["prev"].mean(0)[1, 2] - a["prev"].mean(0)[1, 2], abs=1e-5)
    record = json.loads((out / "run.json").read_text())["compare"]
    assert bertscope.analyses.compare.outputs.read_comparison(out) == (record, rows)
    assert bertscope.analyses.compare.outputs.read_comparison(run_b) is None
    assert record["test"] == PAIRED and record["significant"] == {"prev": 1, "entropy": 0, "rest_sep": 0}
    assert record["outputs"] == ["compare_heads.csv"] + [f"fig_compare_{s}.png" for s in STATS]
    for name in record["outputs"][1:]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # an existing run directory gains the outputs and a 'compare' entry beside its own record
    assert main(["compare", str(run_a), str(run_b), "--out", str(run_a), "--no-figures", "--quiet"]) == 0
    record = json.loads((run_a / "run.json").read_text())
    assert record["status"] == "complete" and record["compare"]["outputs"] == ["compare_heads.csv"]
    assert capsys.readouterr().out == ""


def test_default_out_is_a_new_compare_directory(paired_runs, tmp_path, monkeypatch):
    run_a, run_b, _, _ = paired_runs
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(run_a), str(run_b), "--no-figures", "--quiet"]) == 0
    made = list((tmp_path / "runs").iterdir())
    assert len(made) == 1 and made[0].name.startswith("compare-") and (made[0] / "compare_heads.csv").is_file()


def user_error_cases(tmp: Path, run_a: Path) -> dict[str, tuple[list[str], str]]:
    rng = np.random.default_rng(0)
    other_shape = make_run(tmp / "shape", {"prev": rng.normal(size=(5, LY, H + 1))}, layers=LY, heads=H + 1)
    (tmp / "empty").mkdir()
    (tmp / "running").mkdir()
    write_json(tmp / "running" / "run.json", {"status": "running", "model": {"layers": LY, "heads": H}})
    (tmp / "bad-json").mkdir()
    (tmp / "bad-json" / "run.json").write_text("{not json")
    (tmp / "no-shape").mkdir()
    write_json(tmp / "no-shape" / "run.json", {"status": "complete"})
    (tmp / "no-table").mkdir()
    write_json(tmp / "no-table" / "run.json", {"model": {"layers": LY, "heads": H}})
    bad_csv = make_run(tmp / "bad-csv", None, heads_csv={"prev": np.zeros((LY, H))})
    (bad_csv / "heads.csv").write_text("layer,prev\n1,0.5\n")
    broken = make_run(tmp / "broken-parquet", noise(0))
    (broken / "examples.parquet").write_bytes(b"PAR1 not really")
    short = make_run(tmp / "short-parquet", noise(0))
    table = pq.read_table(short / "examples.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), short / "examples.parquet")
    transposed = make_run(tmp / "transposed", {"prev": rng.normal(size=(5, H, LY))}, layers=H, heads=LY)
    write_json(transposed / "run.json", {"model": {"layers": LY, "heads": H}})
    (transposed / "heads.csv").unlink()
    (transposed / "heads.csv").write_bytes((run_a / "heads.csv").read_bytes())
    (tmp / "used").mkdir()
    (tmp / "used" / "x.txt").write_text("x")
    a = str(run_a)
    return {
        "shape mismatch": ([a, str(other_shape)], "layer x head shapes differ"),
        "missing directory": ([a, str(tmp / "nowhere")], "is not a directory"),
        "no run.json": ([a, str(tmp / "empty")], "run.json not found"),
        "invalid run.json": ([a, str(tmp / "bad-json")], "is not valid JSON"),
        "incomplete run": ([str(tmp / "running"), a], "is not complete"),
        "no shape": ([a, str(tmp / "no-shape")], "layers and heads"),
        "no per-head table": ([a, str(tmp / "no-table")], "no per-head table"),
        "heads.csv without head": ([a, str(bad_csv)], "lacks the column(s) head"),
        "damaged parquet": ([a, str(broken)], "not a readable Parquet file"),
        "rows missing": ([a, str(short)], "not one per segment"),
        "parquet of another shape": ([a, str(transposed)], "heads outside the run's 2 layers x 3 heads"),
        "used --out": ([a, a, "--out", str(tmp / "used")], "already exists and is not empty"),
    }


@pytest.mark.parametrize("case", ["shape mismatch", "missing directory", "no run.json", "invalid run.json",
                                  "incomplete run", "no shape", "no per-head table", "heads.csv without head",
                                  "damaged parquet", "rows missing", "parquet of another shape", "used --out"])
def test_user_errors_exit_2_with_one_line(case, paired_runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args, fragment = user_error_cases(tmp_path, paired_runs[0])[case]
    out = [] if "--out" in args else ["--out", str(tmp_path / "new")]  # a fresh --out must stay uncreated
    check_error(capsys, main(["compare", *args, *out, "--quiet"]), fragment)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "new").exists()  # nothing written on a refusal


# --- two real runs -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def second_checkpoint(tmp_path_factory, tiny_model):
    """The tiny BERT of conftest with other weights (seed 1): a 'fine-tuned' stand-in."""
    path = tmp_path_factory.mktemp("tiny-bert-1")
    model, tokenizer = tiny_model("bert", seed=1)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.usefixtures("single_thread")
def test_two_real_runs(tmp_path, tiny_checkpoint, second_checkpoint, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"Sentence number {i} is here, with a comma.\tAnd a second part {i}."
                                for i in range(12)) + "\n", encoding="utf-8")
    runs = []
    for name, model in (("a", tiny_checkpoint), ("b", second_checkpoint)):
        assert main(["run", "--model", str(model), "--corpus", str(corpus), "--limit", "all", "--per-example",
                     "--out", str(tmp_path / name), "--quiet", "--no-figures", "--threads", "1"]) == 0
        runs.append(tmp_path / name)
    capsys.readouterr()
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "cmp"), "--no-figures"]) == 0
    rows = read_rows(tmp_path / "cmp" / "compare_heads.csv")
    heads = [read_rows(r / "heads.csv") for r in runs]
    by_key = {(r["statistic"], r["layer"], r["head"]): r for r in rows}
    for col in ("prev", "sep", "entropy", "sep_sep", "rest_sep", "cls_entropy"):
        for ra, rb in zip(*heads):
            r = by_key[(col, ra["layer"], ra["head"])]
            assert float(r["diff"]) == pytest.approx(float(rb[col]) - float(ra[col]), abs=2e-6)
            assert r["test"] == PAIRED and r["n_a"] == "12" and 0 <= float(r["p"]) <= float(r["q"]) <= 1
    assert {r["statistic"] for r in rows} >= {"prev", "self", "next", "offset_-2", "offset_+2", "other"}
    # a run against itself: nothing changed, nothing significant
    comp = compare_runs(runs[0], runs[0])
    assert all((d == 0).all() for d in comp.diff.values())
    assert all((t["p"] == 1).all() for t in comp.tests.values())
