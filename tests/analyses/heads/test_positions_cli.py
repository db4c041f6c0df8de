"""`bertscope heads positions` end to end: tiny random decoders (Llama; Gemma-3 with a sliding-window
layer and grouped key/value heads) against their own eager maps of each segment alone, batched with
padding; resume after Ctrl-C; --late out of range in one line; the embedded MiniLM encoder."""
from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest
import torch
from conftest import interrupt_on_call, run_one_and_two_ranks
from tiny_decoders import TEXTS, save_family

from bertscope.analyses.heads.positions import outputs as O
from bertscope.analyses.heads.positions import stats as P
from bertscope.cli.main import main
from bertscope.kernels.spec import DISTANCE_EDGES

pytestmark = pytest.mark.usefixtures("single_thread")


def rows_of(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {kind: str(save_family(root / kind, kind)) for kind in ("llama", "gemma3_text")}


def eager_reference(model_dir, segments, late: float) -> dict:
    """Per (layer, head), from the model's eager maps of each segment alone, by plain loops over
    i and j: the distance profile and mean distance over every row, the late rows' mass per tenth
    of their context and on the first token."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    dist, mean, pos, first, n_rows, n_late = 0, 0, 0, 0, 0, 0
    for s in segments:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([s.input_ids]), output_attentions=True)
        p = torch.stack(out.attentions)[:, 0].double().numpy()  # (layers, H, n, n)
        n = p.shape[-1]
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        d = np.abs(i - j)
        bucket = np.searchsorted(DISTANCE_EDGES, d, side="right")  # the number of edges <= d
        tenth = np.where(j <= i, 10 * j // (i + 1), 10)
        k = max(1, int(np.ceil(late * n - 1e-9)))
        rows = np.arange(n) >= n - k
        dist = dist + np.stack([(p * (bucket == b)).sum((-1, -2)) for b in range(len(DISTANCE_EDGES) + 1)], -1)
        mean = mean + (p * d).sum((-1, -2))
        pos = pos + np.stack([(p * (tenth == b))[..., rows, :].sum((-1, -2)) for b in range(11)], -1)
        first = first + p[..., rows, 0].sum(-1)
        n_rows, n_late = n_rows + n, n_late + rows.sum()
    return {"distance": dist / n_rows, "mean": mean / n_rows, "position": pos / n_late, "first": first / n_late}


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])
def test_a_tiny_decoder_equals_its_eager_maps(kind, tiny, corpus, tmp_path):
    from bertscope.analyses.heads.positions import command
    from bertscope.models.loading import load_model
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentReport

    out = tmp_path / "run"
    assert main(["heads", "positions", "--model", tiny[kind], "--corpus", str(corpus), "--limit", "all",
                 "--max-len", "24", "--late", "0.3", "--batch-size", "2", "--backend", "chunked", "--quiet",
                 "--out", str(out)]) == 0
    loaded = load_model(tiny[kind])
    args = argparse.Namespace(max_len=24, limit=None, seed=0)
    segments = list(command.position_segments(open_corpus(str(corpus)), loaded, args, True, SegmentReport()))
    assert len({s.n_tokens for s in segments}) > 1  # batches of two are padded
    want = eager_reference(tiny[kind], segments, 0.3)
    distance, profile = rows_of(out / O.DISTANCE_FILE), rows_of(out / O.PROFILE_FILE)
    layers, heads = want["mean"].shape
    assert len(distance) == len(profile) == layers * heads
    got = np.array([[float(r[c]) for c in P.distance_columns()] for r in distance]).reshape(layers, heads, -1)
    np.testing.assert_allclose(got, want["distance"], atol=2e-5)
    got = np.array([float(r["mean_distance"]) for r in distance]).reshape(layers, heads)
    np.testing.assert_allclose(got, want["mean"], atol=1e-4)
    got = np.array([[float(r[c]) for c in P.position_columns()] for r in profile]).reshape(layers, heads, -1)
    np.testing.assert_allclose(got, want["position"], atol=2e-5)
    got = np.array([float(r["first_token"]) for r in profile]).reshape(layers, heads)
    np.testing.assert_allclose(got, want["first"], atol=2e-5)
    results = json.loads((out / "run.json").read_text())["analyses"]["positions"]
    assert results["status"] == "complete"
    kinds = results["results"]["kinds"]
    if kind == "gemma3_text":  # layer 1 slides a window, layer 2 is global
        window = next(k for k in kinds if k.startswith("window"))
        assert kinds[window]["layers"] == [1] and kinds[window]["beyond_window"] == 0
        beyond = [lo >= int(window.split()[1]) for lo, _ in P.bucket_bounds()]  # wholly beyond the window
        assert want["distance"][0][:, beyond].sum() == 0 < want["distance"][1][:, beyond].sum()  # the window bites
        assert {r["attention"] for r in distance} == {window, "global"}
    else:
        assert list(kinds) == ["global"]
    for name in (O.DISTANCE_FIGURE, O.PROFILE_FIGURE):
        assert (out / name).is_file(), name
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "Attention by distance and by position" in page


def test_resume_after_ctrl_c_equals_an_uninterrupted_run(tiny, corpus, tmp_path, monkeypatch):
    from bertscope.analyses.heads.positions import command

    common = ["heads", "positions", "--model", tiny["llama"], "--corpus", str(corpus), "--limit", "all",
              "--max-len", "24", "--batch-size", "1", "--backend", "chunked", "--quiet", "--no-figures"]
    full = tmp_path / "full"
    assert main([*common, "--out", str(full)]) == 0
    monkeypatch.setattr(command, "CHECKPOINT_TOKENS", 1)  # a checkpoint after every batch
    add = interrupt_on_call(monkeypatch, P.PositionStats, 3)
    part = tmp_path / "part"
    assert main([*common, "--out", str(part)]) == 130
    assert P.PositionStats.load(part / O.STATS_FILE).batches_done == 2
    assert json.loads((part / "run.json").read_text())["analyses"]["positions"]["status"] == "interrupted"
    monkeypatch.setattr(P.PositionStats, "add", add)
    assert main(["heads", "positions", "--resume", str(part), "--quiet"]) == 0
    a, b = P.PositionStats.load(full / O.STATS_FILE), P.PositionStats.load(part / O.STATS_FILE)
    assert b.batches_done == a.batches_done == len(TEXTS)
    for name in P.ARRAYS:
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9, err_msg=name)
    for name in (O.DISTANCE_FILE, O.PROFILE_FILE, O.LAYERS_FILE):
        assert rows_of(full / name) == rows_of(part / name), name


@pytest.mark.full  # tests/tiers.py
def test_two_torchrun_ranks_give_the_sums_of_one_process(tiny, corpus, tmp_path):
    args = ["heads", "positions", "--model", tiny["gemma3_text"], "--corpus", str(corpus), "--limit", "all",
            "--max-len", "24", "--batch-size", "1", "--backend", "chunked", "--threads", "1", "--quiet"]
    one, two = run_one_and_two_ranks(args, tmp_path, port=29563)
    halves = [P.PositionStats.load(two / f"positions.rank{r}.npz") for r in (0, 1)]
    assert sorted(int(h.n_segments) for h in halves) == [2, 3]  # 5 segments in batches of one, shared out
    a, b = P.PositionStats.load(one / O.STATS_FILE), P.PositionStats.load(two / O.STATS_FILE)
    assert a.n_segments == b.n_segments == len(TEXTS)
    for name in P.ARRAYS:
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9, atol=1e-12, err_msg=name)
    x, y = rows_of(one / O.LAYERS_FILE), rows_of(two / O.LAYERS_FILE)
    assert [r["attention"] for r in x] == [r["attention"] for r in y] == ["window 3", "global"]
    np.testing.assert_allclose([float(r["mean_distance"]) for r in y], [float(r["mean_distance"]) for r in x],
                               rtol=1e-9)


@pytest.mark.parametrize("late", ["0", "1.5", "-0.1"])
def test_late_outside_its_range_is_one_line(late, tiny, corpus, tmp_path, capsys):
    assert main(["heads", "positions", "--model", tiny["llama"], "--corpus", str(corpus), "--late", late,
                 "--quiet", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertscope: error: --late must lie in (0, 1] (the share of each segment's last tokens), not "
                   f"{float(late):g}"]
    assert not (tmp_path / "no").exists()


def test_the_encoder_reads_both_ways(minilm_path, wiki, tmp_path):
    out = tmp_path / "run"
    assert main(["heads", "positions", "--limit", "4", "--max-len", "48", "--quiet", "--no-figures",
                 "--out", str(out)]) == 0
    profile = rows_of(out / O.PROFILE_FILE)
    assert len(profile) == 6 * 12 and {r["attention"] for r in profile} == {"global"}
    for r in profile:  # each late row's mass: its context's tenths and the keys after it
        assert sum(float(r[c]) for c in P.position_columns()) == pytest.approx(1, abs=1e-5)
    assert max(float(r["p_after"]) for r in profile) > 0  # bidirectional: keys after the query
    for r in rows_of(out / O.DISTANCE_FILE):
        assert sum(float(r[c]) for c in P.distance_columns()) == pytest.approx(1, abs=1e-5)
    results = json.loads((out / "run.json").read_text())["analyses"]["positions"]["results"]
    assert results["segments"] == 4 and len(results["mean_distance_by_layer"]) == 6


def test_the_triton_backend_computes_the_statistics_or_is_refused_in_one_line(tiny, corpus, tmp_path, capsys):
    """Where the Triton kernel computes the distance and position statistics (it does since they were
    added to it), --backend triton gives the chunked backend's numbers; where it does not, one line
    (exit 2, nothing written)."""
    from bertscope.kernels.triton_attention import check_computed

    common = ["heads", "positions", "--model", tiny["gemma3_text"], "--corpus", str(corpus), "--limit", "all",
              "--max-len", "24", "--quiet", "--no-figures"]
    try:
        check_computed(P.spec_for())
        computed = True
    except NotImplementedError:
        computed = False
    code = main([*common, "--backend", "triton", "--out", str(tmp_path / "triton")])
    if not computed:
        assert code == 2 and not (tmp_path / "triton").exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("bertscope: error: the triton backend does not compute ")
        assert "distance_mass" in err[0] and "--backend chunked" in err[0]
        return
    assert code == 0
    assert main([*common, "--backend", "chunked", "--out", str(tmp_path / "chunked")]) == 0
    a, b = (P.PositionStats.load(tmp_path / name / O.STATS_FILE) for name in ("triton", "chunked"))
    for name in P.ARRAYS:
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=1e-4, err_msg=name)
