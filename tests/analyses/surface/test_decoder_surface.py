"""What `bertscope run` writes for a decoder beside heads.csv: examples.parquet's columns and
values against the eager oracle's maps, the five figures, and the report's findings on a planted
table (first-token, previous-token and broad heads against each layer's own baseline)."""
from __future__ import annotations

import csv
import json
import math
from types import SimpleNamespace

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
import torch
from test_decoder_stats import CAUSAL, SPEC, WINDOW, batch_of

from bertscope.analyses.surface.plots import plot_surface
from bertscope.analyses.surface.section import DECODER_FIGURES, decoder_findings
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.per_example import PerExampleWriter
from bertscope.kernels.spec import StatsSpec, visible_counts, visible_mask
from bertscope.report.writer import build_sections
from bertscope.text.token_classes import VOCAB

COLUMN_SPEC = StatsSpec(offsets=SPEC.offsets, n_key_classes=4, entropy=True, class_mass=True, argmax=True,
                        column_mass=True)


def test_per_example_rows_of_a_decoder(tmp_path):
    layouts = [WINDOW, CAUSAL]
    batch, maps = batch_of(layouts, q_scale=3.0, seed=3, spec=COLUMN_SPEC)
    batch.segments = [SimpleNamespace(document=b, doc_id=f"doc{b}") for b in range(2)]
    writer = PerExampleWriter(tmp_path / "parts", COLUMN_SPEC, VOCAB)
    writer.add(batch)
    writer.batches_done = 1
    writer.save()
    assert writer.finish(tmp_path / "examples.parquet") == 2 * 2 * 2
    df = pd.read_parquet(tmp_path / "examples.parquet")
    cols = set(df.columns)
    # 0 by construction under a causal mask: next, positive offsets, the first token's row group
    assert not cols & {"next", "offset_+2", "argmax_next", "cls", "n_cls", "cls_entropy", "cls_first"}
    # no token of the corpus is a [SEP]: its class and row groups go
    assert not [c for c in cols if "sep" in c]
    assert {"first", "argmax_first", "punct_first", "uniform_entropy", "column_max", "kl_uniform"} <= cols
    np.testing.assert_allclose(df["kl_uniform"], df["uniform_entropy"] - df["entropy"], atol=1e-12)
    valid = batch.key_valid
    for layer, (layout, p) in enumerate(zip(layouts, maps)):
        n_visible, n_seeing = visible_counts(valid, layout)
        for b in range(2):
            idx = valid[b].nonzero().flatten()
            for h in range(2):
                row = df[(df["segment"] == b) & (df["layer"] == layer + 1) & (df["head"] == h + 1)].iloc[0]
                pb = p[b, h]
                assert row["first"] == pytest.approx(float(pb[idx, idx[0]].mean()), abs=1e-6)
                assert row["uniform_entropy"] == pytest.approx(float(torch.log(n_visible[b, idx].double()).mean()),
                                                               abs=1e-12)
                column = pb[idx][:, idx].sum(0) / n_seeing[b, idx]  # mean over the rows that see each key
                assert row["column_max"] == pytest.approx(float(column.max()), abs=1e-6)
                assert row["column_argmax"] == int(idx[column.argmax()])
    # the windowed layer: the first token is seen by two rows only, the mean is over those two
    assert visible_mask(valid, WINDOW)[0, 0, :, 0].sum() == 2


def decoder_table(n_layers=2, n_heads=3):
    rng = np.random.default_rng(0)
    shape = (n_layers, n_heads)
    t = {"layer": np.repeat(np.arange(1, n_layers + 1)[:, None], n_heads, 1),
         "head": np.repeat(np.arange(1, n_heads + 1)[None, :], n_layers, 0)}
    for c in ("prev", "self", "first", "punct", "other"):
        t[c] = rng.uniform(0, 0.2, shape)
    t["first"][0, 0] = 0.9  # 1-1 an attention sink
    t["prev"][1, 2] = 0.8  # 2-3 looks back
    baseline = np.array([1.5, 3.0])[:, None] * np.ones(shape)  # a windowed layer, then a global one
    t["entropy"] = baseline * 0.5
    t["entropy"][1, 1] = 2.9  # 2-2 near its layer's baseline: broad
    t["entropy"][0, 1] = 1.45  # 1-2 too, though its entropy is lower than every head of layer 2
    t["uniform_entropy"], t["kl_uniform"] = baseline, baseline - t["entropy"]
    t["n_tokens"] = np.full(shape, 500)
    return t


def test_decoder_figures(tmp_path):
    paths = plot_surface(decoder_table(), tmp_path, "tiny-llama")
    assert {p.name for p in paths} == set(DECODER_FIGURES)
    for p in paths:
        height, width = mpimg.imread(p).shape[:2]
        assert height > 100 and width > 100


def rows_of(table):
    L, H = table["layer"].shape
    return [{c: str(v[l, h]) for c, v in table.items()} for l in range(L) for h in range(H)]


def test_decoder_findings_read_entropy_against_each_layer():
    findings, per_layer = decoder_findings(rows_of(decoder_table()))
    text = "\n".join(findings)
    assert "1 first-token heads (more than 50.0% of their attention on the first token): 1-1." in text
    assert "1 previous-token heads" in text and ": 2-3." in text
    # broad: above 90% of the layer's own baseline (1-2 at 1.45 of 1.5 counts, 2-1 at 1.5 of 3.0 does not)
    assert "2 broad heads" in text and "1-2, 2-2" in text
    assert "Most focused heads" in text and "2-1 (1.50)" in text
    assert per_layer.columns[:2] == ["layer", "first token"] and "keys seen" not in per_layer.columns
    assert [r[per_layer.columns.index("uniform (nats)")] for r in per_layer.rows] == [1.5, 3.0]
    _, per_layer = decoder_findings(rows_of(decoder_table()), n_visible=np.array([3.5, 60.25]))
    assert [r[-1] for r in per_layer.rows] == [3.5, 60.2] and per_layer.columns[-1] == "keys seen"


def test_report_section_of_a_decoder_run(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({
        "status": "complete", "command": "bertscope run", "settings": {"corpus": "wiki"},
        "model": {"path": "/models/tiny-llama", "type": "llama", "layers": 2, "heads": 3}, "n_tokens": 500,
        "outputs": ["heads.csv"]}))
    rows = rows_of(decoder_table())
    with open(d / "heads.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot_surface(decoder_table(), d, "tiny-llama")
    section = dict(build_sections(d))["surface"]
    assert "causal" in section.title and len(section.figures) == 5
    assert all(f.caption == DECODER_FIGURES[f.file] for f in section.figures)
    assert "next" not in section.tables[1].columns and "first" in section.tables[1].columns


def test_uniform_entropy_of_an_accumulator_is_per_layer():
    stats = HeadStats(2, 2, SPEC, VOCAB)
    stats.add(batch_of([WINDOW, CAUSAL])[0])
    n_causal = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4]
    n_window = [1, 2, 2, 2, 2, 2, 1, 2, 2, 2]
    want = [np.mean(np.log(n_window)), np.mean(np.log(n_causal))]
    np.testing.assert_allclose(stats.layer_uniform_entropy(), want, atol=1e-12)
    assert stats.uniform_entropy() == pytest.approx(np.mean(want), abs=1e-12)
    assert math.isclose(stats.layer_n_visible()[1], np.mean(n_causal))
