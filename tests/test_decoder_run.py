"""End to end on a decoder: a tiny random Llama (grouped-query, causal) with a word-level tokenizer
that adds a BOS, through `bertscope run`, the report, the Python API and the viewer.

Every number of the decoder's heads.csv (first token, previous token, self, entropy, its
per-layer uniform baseline ln n_visible and the KL from it) is recomputed from the model's own
eager attention (`output_attentions`) of each segment alone; the columns that are 0 by
construction are absent; the viewer's maps are those same maps, drawn as triangles.
"""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from tiny_decoders import TEXTS, gemma3_config, llama_config, save_tiny

from bertscope.kernels.reference import stats_from_probs
from bertscope.kernels.spec import StatsSpec

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A folder with a 2-layer Llama (4 query heads, 2 key/value heads) and the word tokenizer."""
    return save_tiny(tmp_path_factory.mktemp("tiny-llama"), llama_config())


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    """A 2-layer Gemma-3: a sliding-window layer (4 keys: itself and 3 before) then a global one."""
    return save_tiny(tmp_path_factory.mktemp("tiny-gemma3"), gemma3_config())


def reference(path, segments, window=(None, None)):
    """Pooled over every row of every segment (each alone, no padding), from the model's eager maps:
    first, prev, self, entropy, uniform (ln n_visible) per (layer, head); `window`: the keys each
    layer's rows see at most (None: all before them)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    rows = {k: [] for k in ("first", "prev", "self", "entropy", "uniform")}
    maps = []
    for s in segments:
        with torch.no_grad():
            out = model(torch.tensor([s.input_ids]), output_attentions=True)
        p = torch.stack(out.attentions)[:, 0].double()  # (layers, H, L, L)
        maps.append(p)
        n_layers, L = p.shape[0], p.shape[-1]
        i = torch.arange(L)
        # the oracle's rows, each layer's maps taken as one sequence of a batch
        ref = stats_from_probs(p, torch.ones(n_layers, L, dtype=torch.bool), torch.zeros(n_layers, L, dtype=torch.long),
                               StatsSpec(offsets=(-1, 0), entropy=True))
        rows["first"].append(p[..., :, 0])  # the mass on the first token: read off the map
        rows["prev"].append(ref.offset_mass[..., 0])
        rows["self"].append(ref.offset_mass[..., 1])
        rows["entropy"].append(ref.entropy)
        seen = torch.stack([(i + 1).clamp_max(w or L) for w in window]).double()  # (layers, L)
        rows["uniform"].append(torch.log(seen)[:, None, :].expand_as(p[..., 0]))
    return {k: torch.cat(v, -1).mean(-1).numpy() for k, v in rows.items()}, maps


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_run_report_and_api_on_a_decoder(tiny_llama, tmp_path, capsys, backend):
    import bertscope
    from bertscope.cli.main import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", "--model", str(tiny_llama), "--corpus", str(corpus), "--limit", "all", "--max-len", "24",
                 "--backend", backend, "--batch-size", "2", "--argmax", "--per-example", "--out", str(out)]) == 0
    stdout = capsys.readouterr()
    with open(out / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cols = list(rows[0])
    assert cols[:11] == ["layer", "head", "prev", "self", "first", "punct", "other", "entropy", "uniform_entropy",
                         "kl_uniform", "n_tokens"]
    assert not {"next", "cls", "sep", "sep_sep", "rest_sep", "cls_entropy", "offset_+2", "argmax_next"} & set(cols)
    assert "first token" in stdout.out + stdout.err

    scope = bertscope.load(tiny_llama, backend=backend)
    segments = scope.segments(TEXTS, max_len=24)
    assert all(s.input_ids[0] == 1 for s in segments)  # the BOS
    want, _ = reference(tiny_llama, segments)
    table = scope.stats(TEXTS, max_len=24)
    for df in (table, {c: np.array([float(r[c]) for r in rows]) for c in cols}):
        for col, key in (("first", "first"), ("prev", "prev"), ("self", "self"), ("entropy", "entropy"),
                         ("uniform_entropy", "uniform")):
            np.testing.assert_allclose(np.asarray(df[col], dtype=float), want[key].ravel(), atol=2e-5, err_msg=col)
        np.testing.assert_allclose(np.asarray(df["kl_uniform"], dtype=float),
                                   (want["uniform"] - want["entropy"]).ravel(), atol=2e-5)
    words, word_maps = scope.word_maps(TEXTS[0], max_len=24)  # words, then the BOS (a unit of its own)
    W = len(words)
    assert word_maps.shape == (2, 4, W + 1, W + 1) and np.allclose(word_maps.sum(-1), 1, atol=1e-5)
    assert np.triu(word_maps[..., :W, :W], 1).max() == 0  # no word sees a later word
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete" and run["attention"] == ["causal, 2 key/value heads"] * 2
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "Surface-level attention patterns of a causal model" in page and "first-token heads" in page
    assert "keys seen" in page and "causal, 2 key/value heads (layers 1-2)" in page
    examples = pd.read_parquet(out / "examples.parquet")
    assert "uniform_entropy" in examples and "first" in examples and "next" not in examples
    assert not [c for c in examples.columns if "sep" in c]
    n = examples.groupby(["layer", "head"]).apply(lambda g: np.average(g["first"], weights=g["n_tokens"]),
                                                  include_groups=False)
    np.testing.assert_allclose(n.to_numpy(), want["first"].ravel(), atol=2e-5)


def test_view_of_a_decoder(tiny_llama):
    import bertscope
    from bertscope.view import SCALE, view_data

    scope = bertscope.load(tiny_llama)
    data = view_data(scope, TEXTS[1], max_len=24)
    (segment,) = scope.segments([TEXTS[1]], max_len=24)
    _, maps = reference(tiny_llama, [segment])
    n = len(data["tokens"])
    got = np.asarray(data["token_maps"]).reshape(2, 4, n, n) / SCALE
    np.testing.assert_allclose(got, maps[0].numpy(), atol=1.5 / SCALE)
    assert np.triu(got, 1).max() == 0  # nothing above the diagonal
    assert data["token_bands"][0] == [[0, i] for i in range(n)] and data["layouts"][0].startswith("causal")
    assert "first" in data["columns"] and "next" not in data["columns"]
    assert data["uniform_entropy"] == pytest.approx(np.mean([math.log(i + 1) for i in range(n)]), abs=1e-4)


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_gemma3_windowed_and_global_layers(tiny_gemma3, tmp_path, backend):
    """Each layer's own baseline: ln min(i + 1, 4) on the sliding layer, ln(i + 1) on the global one;
    the viewer draws the first as a band, the second as a triangle."""
    import bertscope
    from bertscope.view import SCALE, view_data

    scope = bertscope.load(tiny_gemma3, backend=backend)
    segments = scope.segments(TEXTS, max_len=24)
    want, _ = reference(tiny_gemma3, segments, window=(4, None))
    table = scope.stats(TEXTS, max_len=24)
    for col, key in (("first", "first"), ("prev", "prev"), ("self", "self"), ("entropy", "entropy"),
                     ("uniform_entropy", "uniform")):
        np.testing.assert_allclose(table[col].to_numpy(dtype=float), want[key].ravel(), atol=2e-5, err_msg=col)
    assert table["uniform_entropy"].iloc[0] < table["uniform_entropy"].iloc[-1]  # the window sees fewer keys
    data = view_data(scope, TEXTS[1], max_len=24)
    n = len(data["tokens"])
    assert data["token_bands"][0] == [[max(0, i - 3), i] for i in range(n)]
    assert data["token_bands"][1] == [[0, i] for i in range(n)]
    got = np.asarray(data["token_maps"]).reshape(2, 4, n, n) / SCALE
    assert np.tril(got[0], -4).max() == 0 and np.triu(got[1], 1).max() == 0
