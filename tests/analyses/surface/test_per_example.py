"""Per-example statistics: each row against the model's own attention maps of that segment
alone, token-weighted means against the corpus sums, checkpoints, resume and the CLI."""
from __future__ import annotations

import functools
import json

import numpy as np
import pandas as pd
import pytest
from test_engine import (
    SPEC,
    eager_twin,
    hand_segments,
    random_segments,
    reference_table,
)

import bertscope.analyses.surface.command
import bertscope.engine.loop
from bertscope.analyses.surface.stats import head_table
from bertscope.cli.main import main
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.loop import EngineOptions, fold
from bertscope.engine.per_example import PerExampleWriter, stat_columns
from bertscope.kernels.spec import StatsSpec

pytestmark = pytest.mark.usefixtures("single_thread")

MAP_SPEC = StatsSpec(offsets=SPEC.offsets, n_key_classes=4, entropy=True, argmax=True, column_mass=True,
                     class_mass=True)


def fold_both(loaded, segments, spec, directory, batch_size=3, backend="chunked"):
    writer = PerExampleWriter(directory / "parts", spec, loaded.classes)
    stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    fold(loaded, segments, spec, [writer, stats], EngineOptions(batch_size=batch_size, backend=backend, progress=False),
         checkpoint=lambda: (writer.save(), stats.save(directory / "stats.npz")))
    n = writer.finish(directory / "examples.parquet")
    return pd.read_parquet(directory / "examples.parquet"), stats, n


@pytest.mark.parametrize("backend", ("eager", "chunked"))
def test_each_row_equals_the_maps_of_that_segment_alone(tiny_model, tmp_path, backend):
    loaded, twin = eager_twin(tiny_model, "bert")
    segments = hand_segments(loaded.tokenizer)
    df, _, n = fold_both(loaded, segments, MAP_SPEC, tmp_path, backend=backend)
    assert n == len(df) == len(segments) * loaded.n_layers * loaded.n_heads
    assert sorted(df["segment"].unique()) == list(range(len(segments)))
    for i, segment in enumerate(segments):
        want = reference_table(twin, loaded, [segment])
        rows = df[df["segment"] == i].sort_values(["layer", "head"])
        assert (rows["doc_id"] == segment.doc_id).all() and (rows["n_tokens"] == segment.n_tokens).all()
        assert (rows["n_cls"] == 1).all()
        assert (rows["n_sep"] == segment.input_ids.count(loaded.tokenizer.sep_token_id)).all()
        for col in ("prev", "self", "next", "offset_-2", "offset_+2", "cls", "sep", "punct", "other", "sep_sep"):
            np.testing.assert_allclose(rows[col].to_numpy(), want[col].ravel(), atol=2e-6, rtol=0, err_msg=col)
        for col in ("entropy", "cls_entropy"):
            np.testing.assert_allclose(rows[col].to_numpy(), want[col].ravel(), atol=2e-5, rtol=0, err_msg=col)
        for col in ("argmax_prev", "argmax_cls"):
            np.testing.assert_allclose(rows[col].to_numpy(), want[col].ravel(), atol=1.01 / segment.n_tokens,
                                       err_msg=col)
    # column mass: the most-attended key's share of the segment's attention, in (1/L, 1]
    assert ((df["column_max"] >= 1 / df["n_tokens"] - 1e-6) & (df["column_max"] <= 1 + 1e-6)).all()
    assert ((df["column_argmax"] >= 0) & (df["column_argmax"] < df["n_tokens"])).all()


def test_token_weighted_means_give_back_the_corpus_table(tiny_model, tmp_path):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer)
    df, stats, _ = fold_both(loaded, segments, SPEC, tmp_path, batch_size=5)
    table = head_table(stats)
    for col, weight in (("prev", "n_tokens"), ("cls", "n_tokens"), ("entropy", "n_tokens"), ("argmax_next", "n_tokens"),
                        ("sep_sep", "n_sep"), ("cls_entropy", "n_cls")):
        rows = df[df[weight] > 0]
        got = rows.groupby(["layer", "head"]).apply(
            lambda g: np.average(g[col], weights=g[weight]), include_groups=False).to_numpy()  # noqa: B023  (apply calls it at once)
        np.testing.assert_allclose(got, table[col].ravel(), rtol=1e-12, atol=1e-15, err_msg=col)
    # every segment has [SEP] rows; "." / "," rows are missing from some: NaN there, never 0
    assert df["sep_sep"].notna().all() and df["punct_punct"].isna().any()
    assert ((df["n_punct"] == 0) == df["punct_punct"].isna()).all()


def test_the_norm_columns_give_back_the_corpus_tables_too(tiny_model, tmp_path):
    """With spec.norms (docs/norms.md) each row has the norm-based twins heads.csv has, named as there, and their
    token-weighted means are heads.csv's; the weight-based columns are the same as without norms."""
    import dataclasses

    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer)
    spec = dataclasses.replace(SPEC, norms=True)
    df, stats, _ = fold_both(loaded, segments, spec, tmp_path / "on", batch_size=5)
    plain, _, _ = fold_both(loaded, segments, SPEC, tmp_path / "off", batch_size=5)
    table = head_table(stats)
    norms = [c for c in table if c.endswith("_norm")]
    assert {"prev_norm", "self_norm", "cls_norm", "sep_norm", "weighted_norm"} <= set(norms)
    assert set(norms) <= set(df.columns) and "sep_cls_norm" in df.columns
    assert [c for c in df.columns if not c.endswith("_norm")] == list(plain.columns)  # each group's twins after it
    for col in norms:
        got = df.groupby(["layer", "head"]).apply(
            lambda g: np.average(g[col], weights=g["n_tokens"]), include_groups=False).to_numpy()  # noqa: B023
        np.testing.assert_allclose(got, table[col].ravel(), rtol=1e-12, atol=1e-15, err_msg=col)
    for col in plain.columns:
        if col != "doc_id":
            np.testing.assert_array_equal(df[col].to_numpy(), plain[col].to_numpy(), err_msg=col)


def test_columns_follow_the_spec_and_the_class_scheme():
    from bertscope.text.token_classes import PARTS, VOCAB

    cols = stat_columns(StatsSpec(offsets=(-1, 1), n_key_classes=4, entropy=True, argmax=False, class_mass=True), VOCAB)
    assert cols[:7] == ["prev", "next", "cls", "sep", "punct", "other", "entropy"]
    assert "sep_sep" in cols and "cls_entropy" in cols and "n_punct" in cols
    parts = stat_columns(StatsSpec(offsets=(), n_key_classes=4, entropy=False, argmax=False, class_mass=True), PARTS)
    assert parts == ["cls", "sep", "part_a", "part_b", "n_part_a", "part_a_cls", "part_a_sep", "part_a_part_a",
                     "part_a_part_b", "n_part_b", "part_b_cls", "part_b_sep", "part_b_part_a", "part_b_part_b"]


def test_rewind_drops_parts_beyond_the_checkpoint(tiny_model, tmp_path):
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=9)
    writer = PerExampleWriter(tmp_path, SPEC, loaded.classes)
    stats = HeadStats(loaded.n_layers, loaded.n_heads, SPEC, loaded.classes)
    # a crash between the two saves of the third checkpoint: parts cover 3 batches, sums 2
    calls = []
    fold(loaded, segments, SPEC, [writer, stats], EngineOptions(batch_size=3, checkpoint_every=1, progress=False),
         checkpoint=lambda: (writer.save(), calls.append(1), len(calls) < 3 and stats.save(tmp_path / "stats.npz")))
    assert sorted(p.name for p in tmp_path.glob("part-*")) == [
        "part-r000-b000001-000001.parquet", "part-r000-b000002-000002.parquet", "part-r000-b000003-000003.parquet"]
    resumed = PerExampleWriter.load(tmp_path, SPEC, loaded.classes)
    assert resumed.batches_done == 3
    resumed.rewind(HeadStats.load(tmp_path / "stats.npz").batches_done)
    assert resumed.batches_done == 2 and len(list(tmp_path.glob("part-*"))) == 2


def test_interrupted_per_example_run_resumes_to_the_same_rows(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    corpus = tmp_path / "lines.txt"
    words = "the quick brown fox jumps over the lazy dog , and then it sleeps .".split()
    corpus.write_text("\n".join(" ".join(words[: 3 + i]) + ("\n" if i == 4 else "") for i in range(12)) + "\n")
    args = ["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--limit", "all", "--batch-size", "4",
            "--quiet", "--no-figures", "--per-example"]
    monkeypatch.setattr(bertscope.engine.loop, "EngineOptions",
                        functools.partial(EngineOptions, checkpoint_every=1))
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0

    real_forward, calls = bertscope.engine.loop.forward, []

    def crash_on_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_forward(*a, **k)

    monkeypatch.setattr(bertscope.engine.loop, "forward", crash_on_third)
    assert main([*args, "--out", str(tmp_path / "broken")]) == 130  # Ctrl-C
    assert len(list((tmp_path / "broken" / "examples").glob("part-*.parquet"))) == 2
    monkeypatch.setattr(bertscope.engine.loop, "forward", real_forward)
    assert main(["run", "--resume", str(tmp_path / "broken"), "--quiet", "--no-figures"]) == 0
    capsys.readouterr()

    whole = pd.read_parquet(tmp_path / "whole" / "examples.parquet").sort_values(["segment", "layer", "head"])
    broken = pd.read_parquet(tmp_path / "broken" / "examples.parquet").sort_values(["segment", "layer", "head"])
    assert len(whole) == 12 * 2 * 4
    pd.testing.assert_frame_equal(whole.reset_index(drop=True), broken.reset_index(drop=True))
    assert not (tmp_path / "broken" / "examples").exists()  # parts merged and removed
    # `document` is the n-th non-blank line of the file (line 6 is blank)
    assert whole.groupby("segment")["document"].first().tolist() == list(range(12))
    assert whole.loc[whole["document"] == 5, "doc_id"].iloc[0] == "lines.txt:7"
    record = json.loads((tmp_path / "broken" / "run.json").read_text())
    assert record["per_example"] == {"file": "examples.parquet", "rows": 96} and "examples.parquet" in record["outputs"]


def test_writer_memory_is_one_checkpoint(tiny_model, tmp_path):
    """Rows leave memory at every save: the pending buffer never holds more than the batches
    since the last checkpoint."""
    loaded, _ = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=12)
    writer = PerExampleWriter(tmp_path, SPEC, loaded.classes)
    seen = []
    fold(loaded, segments, SPEC, [writer], EngineOptions(batch_size=2, checkpoint_every=2, progress=False),
         checkpoint=lambda: (seen.append(len(writer._pending)), writer.save()))
    assert seen == [2, 2, 2] and writer._pending == []
