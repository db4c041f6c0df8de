"""`bertscope probe cluster`: head clustering by Jensen-Shannon divergence (Clark et al. section 6).

The analysis on planted distance matrices and a hand-made surface table; the JS pass on the
tiny model against JS computed by hand from the model's own attention maps, across batch
sizes (padding) and JS backends; the command end to end on a text file.
"""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from test_engine import eager_twin, inputs_of, random_segments

from bertscope.analyses.probes.cluster import plots as cluster_plots
from bertscope.analyses.probes.cluster import stats as cluster
from bertscope.analyses.probes.cluster.stats import js_sums, spec_for
from bertscope.analyses.surface.stats import head_table
from bertscope.cli.main import main
from bertscope.engine.loop import EngineOptions, run_stats

pytestmark = pytest.mark.usefixtures("single_thread")
TINY_LAYERS, TINY_HEADS = 2, 4
PNG = b"\x89PNG\r\n\x1a\n"


# --- the analysis on planted arrays -----------------------------------------------------------


def planted(n_layers=2, n_heads=6, within=0.05, between=0.6, noise=0.01, seed=0):
    """Mean JS where every layer is one tight cluster far from the others."""
    rng = np.random.default_rng(seed)
    layers = cluster.head_layers(n_layers, n_heads)
    d = np.where(layers[:, None] == layers[None, :], within, between)
    d = d + rng.uniform(0, noise, d.shape)
    d = (d + d.T) / 2
    np.fill_diagonal(d, 0)
    return d


def test_mds_separates_two_planted_clusters():
    d = planted()
    xy = cluster.embed(d, seed=0)
    assert xy.shape == (12, 2) and np.isfinite(xy).all()
    plane = np.linalg.norm(xy[:, None] - xy[None, :], axis=-1)
    same = np.equal.outer(cluster.head_layers(2, 6), cluster.head_layers(2, 6))
    off = ~np.eye(12, dtype=bool)
    assert plane[same & off].max() < 0.2 * plane[~same].min()  # every cluster tight, far apart
    assert plane[~same].mean() == pytest.approx(0.6, rel=0.1)  # metric MDS keeps the scale
    np.testing.assert_allclose(cluster.embed(d, seed=0), xy)  # deterministic


def test_embed_small_and_bad_inputs():
    np.testing.assert_allclose(cluster.embed(np.array([[0, 0.3], [0.3, 0]])), [[0, 0], [0.3, 0]])
    with pytest.raises(ValueError, match="square"):
        cluster.embed(np.zeros((2, 3)))


def test_layer_closeness_and_closest_pairs_on_planted_layers():
    d = planted(n_layers=3, n_heads=4, noise=0.0)
    d[4, 9] = d[9, 4] = 0.01  # 2-1 and 3-2: the closest pair across layers
    c = cluster.layer_closeness(d, 3, 4)
    assert c["within"] == pytest.approx(0.05)
    assert c["adjacent"] == pytest.approx((0.6 * 31 + 0.01) / 32)  # 2 layer pairs x 16 head pairs, both ways
    assert c["nearest_same_layer"] == 10  # all but 2-1 and 3-2
    assert c["nearest_chance"] == pytest.approx(3 / 11)
    assert cluster.closest_pairs(d, 3, 4, k=2)[0] == ("2-1", "3-2", 0.01)
    within = cluster.closest_pairs(d, 3, 4, k=100, across_layers=False)
    assert len(within) == 3 * 6 and all(a.split("-")[0] == b.split("-")[0] for a, b, _ in within)

    layer_js = cluster.layer_mean_js(d, 3, 4)
    np.testing.assert_allclose(np.diag(layer_js), 0.05)  # self-pairs are left out
    assert layer_js[0, 2] == pytest.approx(0.6)
    assert layer_js[1, 2] == layer_js[2, 1] == pytest.approx((0.6 * 15 + 0.01) / 16)


def test_js_rows_long_form():
    js_sum = planted(n_layers=2, n_heads=3) * 50
    rows = cluster.js_rows(js_sum, 50, 2, 3)
    assert len(rows) == 15 and tuple(rows[0]) == cluster.JS_COLUMNS
    assert [(r["head_a"], r["head_b"]) for r in rows[:3]] == [("1-1", "1-2"), ("1-1", "1-3"), ("1-1", "2-1")]
    assert [r["same_layer"] for r in rows[:3]] == [1, 1, 0]
    for r in rows:
        assert r["js_mean_per_token"] == pytest.approx(r["js_sum"] / 50)
    with pytest.raises(ValueError, match="no tokens"):
        cluster.mean_per_token(js_sum, 0)


def test_bertscope_behaviour_thresholds_on_a_hand_table():
    #         prev  next  cls   sep   punct entropy   expected
    heads = [(0.90, 0.01, 0.02, 0.00, 0.05, 0.50, "previous"),
             (0.02, 0.60, 0.05, 0.01, 0.02, 1.20, "next"),
             (0.10, 0.10, 0.70, 0.05, 0.05, 1.50, "[CLS]"),
             (0.05, 0.05, 0.10, 0.80, 0.02, 0.90, "[SEP]"),
             (0.10, 0.10, 0.10, 0.10, 0.40, 2.00, "punctuation"),
             (0.02, 0.02, 0.03, 0.02, 0.08, 3.70, "broad"),  # 3.7 > 0.9 * 4.0
             (0.30, 0.30, 0.30, 0.10, 0.10, 3.50, "other"),  # nothing above its threshold
             (0.50, 0.50, 0.50, 0.50, 0.25, 3.00, "other"),  # thresholds are strict
             (0.55, 0.10, 0.02, 0.02, 0.60, 1.00, "previous")]  # previous comes before punctuation
    cols = ("prev", "next", "cls", "sep", "punct", "entropy")
    table = {c: np.array([[h[i] for h in heads]]) for i, c in enumerate(cols)}  # one layer
    labels = cluster.behaviours(table, 4.0, cluster.Thresholds())
    assert labels.shape == (1, len(heads))
    assert list(labels[0]) == [h[-1] for h in heads]
    looser = cluster.behaviours(table, 4.0, cluster.Thresholds(position=0.25, broad=0.85))
    assert list(looser[0, 6:8]) == ["previous", "previous"]
    assert looser[0, 5] == "broad" and cluster.behaviours(table, 4.2, cluster.Thresholds())[0, 5] == "other"


def test_clark_behaviour_rules_on_a_hand_table():
    ln128 = math.log(128)  # at the reference length the broad cut is 3.8 nats
    #         prev  next  cls   sep   punct entropy   expected
    heads = [(0.90, 0.01, 0.02, 0.00, 0.05, 0.50, "previous"),
             (0.02, 0.60, 0.05, 0.01, 0.02, 1.20, "next"),
             (0.10, 0.10, 0.70, 0.05, 0.05, 1.50, "[CLS]"),
             (0.10, 0.10, 0.55, 0.05, 0.05, 1.50, "other"),  # 0.55 is no [CLS] head (cut 0.6)
             (0.05, 0.05, 0.10, 0.80, 0.02, 0.90, "[SEP]"),
             (0.10, 0.10, 0.10, 0.10, 0.65, 2.00, "punctuation"),
             (0.10, 0.10, 0.10, 0.10, 0.40, 2.00, "other"),  # punctuation needs 0.6 too
             (0.02, 0.02, 0.03, 0.02, 0.08, 3.81, "broad"),
             (0.02, 0.02, 0.03, 0.02, 0.08, 3.79, "other"),
             (0.50, 0.50, 0.60, 0.60, 0.60, 1.00, "other"),  # every mass cut is strict
             (0.55, 0.10, 0.02, 0.02, 0.61, 1.00, "punctuation"),  # the last test passed wins...
             (0.55, 0.60, 0.02, 0.02, 0.02, 1.00, "previous"),  # ...previous is tested after next
             (0.02, 0.02, 0.70, 0.02, 0.02, 3.90, "[CLS]")]  # ...and [CLS] after broad
    cols = ("prev", "next", "cls", "sep", "punct", "entropy")
    table = {c: np.array([[h[i] for h in heads]]) for i, c in enumerate(cols)}
    labels = cluster.behaviours(table, ln128)  # Clark's rules are the default
    assert list(labels[0]) == [h[-1] for h in heads]
    # shorter segments: uniform entropy ln 64, so the cut scales to 3.8 * ln 64 / ln 128 = 3.257 nats
    t = cluster.ClarkThresholds()
    assert t.broad_cut(math.log(64)) == pytest.approx(3.8 * 6 / 7)
    zeros = np.zeros((1, 2))
    short = {"prev": zeros, "next": zeros, "cls": zeros, "sep": zeros, "punct": zeros,
             "entropy": np.array([[3.26, 3.25]])}
    assert list(cluster.behaviours(short, math.log(64))[0]) == ["broad", "other"]
    assert cluster.thresholds_for("bertscope") == cluster.Thresholds()
    with pytest.raises(ValueError, match="label rules"):
        cluster.thresholds_for("kovaleva")


def test_mds_rows_and_figures(tmp_path):
    d = planted()
    xy = cluster.embed(d)
    labels = np.array([["broad"] * 6, ["previous", "next", "[CLS]", "[SEP]", "punctuation", "other"]], dtype=object)
    table = {c: np.arange(12.0).reshape(2, 6) + k / 10 for k, c in enumerate(cluster.LABEL_COLUMNS)}
    rows = cluster.mds_rows(xy, labels, table, 2, 6)
    assert tuple(rows[7]) == cluster.MDS_COLUMNS
    assert rows[7] == {"layer": 2, "head": 2, "x": xy[7, 0], "y": xy[7, 1], "behaviour": "next",
                       "prev": 7.0, "next": 7.1, "cls": 7.2, "sep": 7.3, "punct": 7.4, "entropy": 7.5}
    text = cluster.summary(d, labels, 2, 6)
    assert "nearest head in the same layer: 12 of 12" in text and "broad 6, previous 1" in text
    for fig, name in ((cluster_plots.plot_mds(xy, labels, 2, 6, "planted"), "mds.png"),
                      (cluster_plots.plot_layer_js(cluster.layer_mean_js(d, 2, 6), "planted"), "layers.png")):
        fig.savefig(tmp_path / name)
        assert (tmp_path / name).read_bytes().startswith(PNG)


# --- the JS pass on the tiny model ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model):
    loaded, twin = eager_twin(tiny_model, "bert")
    segments = random_segments(loaded.tokenizer, n=7, max_len=32)
    return loaded, twin, segments


def js_by_hand(twin, loaded, segments) -> tuple[np.ndarray, int]:
    """JS between all heads from the model's own attention maps, one segment at a time."""
    N = TINY_LAYERS * TINY_HEADS
    total, tokens = np.zeros((N, N)), 0
    for segment in segments:
        with torch.no_grad():
            maps = twin(**inputs_of(loaded, [segment]), output_attentions=True).attentions
        p = torch.cat([a[0] for a in maps]).double().numpy()  # (N, L, L), layer-major
        for a in range(N):
            for b in range(N):
                m = (p[a] + p[b]) / 2
                kl = lambda x: np.sum(np.where(x > 0, x * np.log(np.where(x > 0, x, 1) / m), 0))  # noqa: E731, B023  (called at once)
                total[a, b] += (kl(p[a]) + kl(p[b])) / 2
        tokens += segment.n_tokens
    return total, tokens


def test_js_pass_equals_js_of_the_models_own_maps(tiny):
    loaded, twin, segments = tiny
    want, tokens = js_by_hand(twin, loaded, segments[:3])
    got = js_sums(loaded, segments[:3], "eager", batch_size=3, backend="eager", progress=False)
    assert got.n_tokens == tokens
    assert want[0, 5] > 0.1  # heads of different layers really differ
    np.testing.assert_allclose(got.js_sum, want, atol=1e-5, rtol=1e-5)


def test_js_sums_do_not_depend_on_batching_or_js_backend(tiny):
    loaded, _, segments = tiny
    one = js_sums(loaded, segments, "eager", batch_size=len(segments), progress=False)
    singles = js_sums(loaded, segments, "eager", batch_size=1, progress=False)
    pairs_chunked = js_sums(loaded, segments, "chunked", batch_size=2, progress=False)
    assert one.n_tokens == singles.n_tokens == pairs_chunked.n_tokens == sum(s.n_tokens for s in segments)
    np.testing.assert_allclose(singles.js_sum, one.js_sum, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pairs_chunked.js_sum, one.js_sum, rtol=1e-4, atol=1e-4)
    assert np.allclose(one.js_sum, one.js_sum.T) and (np.diag(one.js_sum) == 0).all()
    assert (one.js_sum[~np.eye(8, dtype=bool)] > 0).all()
    assert one.js_sum.max() / one.n_tokens <= math.log(2)


def test_surface_sums_of_the_pass_equal_bertscope_run(tiny):
    loaded, _, segments = tiny
    got = head_table(js_sums(loaded, segments, "chunked", batch_size=3, progress=False).stats)
    want = head_table(run_stats(loaded, segments, spec_for(loaded), EngineOptions(batch_size=5, progress=False)))
    for col in ("prev", "next", "cls", "sep", "punct", "entropy", "n_tokens"):
        np.testing.assert_allclose(got[col], want[col], atol=1e-5, err_msg=col)


# --- the command ------------------------------------------------------------------------------


CORPUS = [
    "The cat sat on the mat.\tIt was happy, very happy.",
    "Mr. Smith went to Washington.\tHe liked it there.",
    "Attention heads attend to the separator token, to periods and to commas.",
    "A single line, without any pair.",
    "",
    "Heads in the same layer are often close.\tThey may be redundant.",
]


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_cli_end_to_end(tmp_path, tiny_checkpoint, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    code = main(["probe", "cluster", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--limit", "4",
                 "--batch-size", "3", "--threads", "1", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    N = TINY_LAYERS * TINY_HEADS
    pairs = read_csv(out / "cluster_js.csv")
    assert len(pairs) == N * (N - 1) // 2 and tuple(pairs[0]) == cluster.JS_COLUMNS
    record = json.loads((out / "run.json").read_text())["analyses"]["cluster"]
    assert record["status"] == "complete" and record["results"]["n_segments"] == 4
    n_tokens = record["results"]["n_tokens"]
    for r in pairs:
        js, mean = float(r["js_sum"]), float(r["js_mean_per_token"])
        assert 0 < mean <= math.log(2) and mean == pytest.approx(js / n_tokens, rel=1e-5)  # both rounded to 6 digits
    mds = read_csv(out / "cluster_mds.csv")
    assert [(int(r["layer"]), int(r["head"])) for r in mds] == [(l, h) for l in (1, 2) for h in (1, 2, 3, 4)]
    assert all(math.isfinite(float(r["x"])) and r["behaviour"] in cluster.BEHAVIOURS for r in mds)
    table = {c: np.array([[float(r[c]) for r in mds]]) for c in cluster.LABEL_COLUMNS}  # labels from their columns
    assert record["results"]["label_rules"] == "clark"
    relabelled = cluster.behaviours(table, record["results"]["uniform_entropy"])[0]
    assert list(relabelled) == [r["behaviour"] for r in mds]
    assert len(read_csv(out / "cluster_layers.csv")) == TINY_LAYERS ** 2
    for name in ("fig_cluster_mds.png", "fig_cluster_layers.png"):
        assert (out / name).read_bytes().startswith(PNG)
    assert set(record["outputs"]) == {"cluster_js.csv", "cluster_mds.csv", "cluster_layers.csv",
                                      "fig_cluster_mds.png", "fig_cluster_layers.png"}
    assert record["segments"]["segments"] == 4 and record["settings"]["js_backend"] == "chunked"


@pytest.mark.parametrize("extra, fragment", [
    (["--js-backend", "triton"], "--js-backend triton"),
    (["--corpus", "/nonexistent/corpus.txt"], "corpus.txt"),
])
def test_cli_user_errors(tmp_path, tiny_checkpoint, capsys, extra, fragment):
    code = main(["probe", "cluster", "--model", str(tiny_checkpoint), "--out", str(tmp_path / "run"), "--quiet",
                 *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bertscope: error: ") and err.count("\n") == 1, err
    assert fragment in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing is left behind


# --- decoders ---------------------------------------------------------------------------------


def test_decoder_labels_read_the_first_token_and_skip_absent_columns():
    """A decoder's surface table has `first` in place of `cls` and no `next` / `sep`: the [CLS]
    test labels "first token", the others are not run (a causal head has no next-token mass)."""
    #         prev  first punct entropy   expected (Clark's rules: the last test passed wins)
    heads = [(0.90, 0.02, 0.05, 0.50, "previous"),
             (0.10, 0.70, 0.05, 1.50, "first token"),
             (0.10, 0.55, 0.05, 1.50, "other"),
             (0.10, 0.10, 0.65, 2.00, "punctuation"),
             (0.02, 0.03, 0.08, 3.81, "broad"),
             (0.02, 0.70, 0.08, 3.90, "first token")]
    cols = ("prev", "first", "punct", "entropy")
    table = {c: np.array([[h[i] for h in heads]]) for i, c in enumerate(cols)}
    assert list(cluster.behaviours(table, math.log(128))[0]) == [h[-1] for h in heads]
    # bertscope's rules: the first test passed wins; [CLS] / first token above 0.5, broad above 0.9 x uniform
    assert list(cluster.behaviours(table, math.log(128), cluster.Thresholds())[0]) == [
        "previous", "first token", "first token", "punctuation", "other", "first token"]
    assert cluster.label_columns(table) == cols
    assert cluster.mds_columns(table) == ("layer", "head", "x", "y", "behaviour") + cols
    assert cluster.label_columns({**table, "sep": table["prev"]}) == ("prev", "first", "sep", "punct", "entropy")
    assert cluster.behaviour_names(table) == ("broad", "previous", "first token", "punctuation", "other")
    assert cluster.behaviour_names({"prev": 0, "next": 0, "cls": 0, "sep": 0, "punct": 0, "entropy": 0}) == (
        "broad", "previous", "next", "[CLS]", "[SEP]", "punctuation", "other")


def test_cli_on_a_decoder_js_equals_its_own_causal_maps(tmp_path, tiny_llama_lm_dir, capsys):
    """The command on a grouped-query causal decoder: the JS sums equal JS computed by hand from
    the model's own eager maps (causal rows: each row's distribution over the keys it sees), and
    cluster_mds.csv carries the decoder's label columns."""
    from transformers import AutoModel

    from bertscope.models.loading import load_model
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["The cat sat on a mat . It was happy .", "A dog ran far away , and then came back.",
                                 "Then the cat ran home ."]) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    code = main(["probe", "cluster", "--model", str(tiny_llama_lm_dir), "--corpus", str(corpus), "--limit", "3",
                 "--max-len", "32", "--batch-size", "2", "--threads", "1", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err
    mds = read_csv(out / "cluster_mds.csv")
    assert tuple(mds[0]) == ("layer", "head", "x", "y", "behaviour", "prev", "first", "punct", "entropy")
    assert all(r["behaviour"] in cluster.BEHAVIOURS for r in mds)
    results = json.loads((out / "run.json").read_text())["analyses"]["cluster"]["results"]
    assert set(results["behaviours"]) == {"broad", "previous", "first token", "punctuation", "other"}
    assert sum(results["behaviours"].values()) == TINY_LAYERS * TINY_HEADS
    # JS by hand from the decoder's eager maps, each segment alone (the same segments: rebuilt here)
    loaded = load_model(tiny_llama_lm_dir)
    twin = AutoModel.from_pretrained(tiny_llama_lm_dir, attn_implementation="eager").eval()
    tok = loaded.tokenizer
    texts = [line for line in corpus.read_text().splitlines() if line]
    N = TINY_LAYERS * TINY_HEADS
    want, tokens = np.zeros((N, N)), 0
    for text in texts:
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            maps = twin(input_ids=ids, output_attentions=True).attentions
        p = torch.cat([a[0] for a in maps]).double().numpy()  # (N, L, L), rows over the keys they see
        for a in range(N):
            for b in range(N):
                m = (p[a] + p[b]) / 2
                kl = lambda x: np.sum(np.where(x > 0, x * np.log(np.where(x > 0, x, 1) / m), 0))  # noqa: E731, B023
                want[a, b] += (kl(p[a]) + kl(p[b])) / 2
        tokens += ids.shape[1]
    record = json.loads((out / "run.json").read_text())["analyses"]["cluster"]["results"]
    assert record["n_tokens"] == tokens
    got = np.zeros((N, N))
    for r in read_csv(out / "cluster_js.csv"):
        a, b = (cluster.head_labels(TINY_LAYERS, TINY_HEADS).index(r[k]) for k in ("head_a", "head_b"))
        got[a, b] = got[b, a] = float(r["js_sum"])
    assert want[0, 5] > 0.01
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
