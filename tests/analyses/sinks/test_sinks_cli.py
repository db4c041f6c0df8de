"""`bertscope sinks` end to end: a tiny random Llama with a BOS-adding word tokenizer (both BOS variants,
against its own eager maps), resume after Ctrl-C, the embedded MiniLM encoder, and a small real slice
of SmolLM2 (dequantized from 4-bit GGUF)."""
from __future__ import annotations

import argparse
import csv
import json

import numpy as np
import pytest
from conftest import interrupt_on_call
from test_decoder_run import TEXTS, tiny_gemma3, tiny_llama  # noqa: F401 (fixtures)
from test_sinks import reference

from bertscope.analyses.sinks import stats as S
from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")


def rows_of(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_both_bos_variants_on_a_tiny_decoder_equal_its_eager_maps(tiny_llama, corpus, tmp_path):  # noqa: F811
    from bertscope.analyses.sinks import command
    from bertscope.models.loading import load_model
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentReport

    out = tmp_path / "run"
    assert main(["sinks", "--model", str(tiny_llama), "--corpus", str(corpus), "--limit", "all", "--max-len", "24",
                 "--bos", "both", "--batch-size", "2", "--backend", "chunked", "--initial", "2", "--quiet",
                 "--out", str(out)]) == 0
    rows = rows_of(out / "sinks.csv")
    assert len(rows) == 2 * 2 * 4 and {r["bos"] for r in rows} == {"with", "without"}
    assert all(r["attention"] == "global" for r in rows)
    # the segments the command made, each variant against the model's eager maps
    loaded = load_model(str(tiny_llama))
    args = argparse.Namespace(max_len=24, limit=None, seed=0, bos="both", bos_token=None, initial=2)
    plan = command.bos_plan(loaded, args, causal=True)
    assert plan[0] == ["with", "without"] and plan[2] == [1]  # the template's <s>
    segments = list(command.sink_segments(open_corpus(str(corpus)), loaded, args, True, SegmentReport(), plan))
    assert len(segments) == 2 * len(TEXTS)
    saved = S.SinkStats.load(out / "sinks.npz")
    for v, name in enumerate(("with", "without")):
        mine = [s for s in segments if s.variant == v]
        assert all((s.input_ids[0] == 1) == (name == "with") for s in mine)
        want = reference(loaded.model, mine, saved)
        got = np.array([[float(r["alpha_1"]) for r in rows if r["bos"] == name and int(r["layer"]) == layer]
                        for layer in (1, 2)])
        np.testing.assert_allclose(got, want["alpha"], atol=2e-5)
        got = np.array([[float(r["initial_mass"]) for r in rows if r["bos"] == name and int(r["layer"]) == layer]
                        for layer in (1, 2)])
        np.testing.assert_allclose(got, want["initial"], atol=2e-5)
    with_bos, without = (saved.n_rows[v] for v in (0, 1))
    assert with_bos - without == len(TEXTS)  # one BOS more per text
    record = json.loads((out / "run.json").read_text())["analyses"]["sinks"]
    assert record["status"] == "complete" and set(record["results"]["variants"]) == {"with", "without"}
    layers = rows_of(out / "sinks_layers.csv")
    assert len(layers) == 4 and float(layers[0]["first_max"]) > 0 and float(layers[0]["median"]) > 0
    positions = rows_of(out / "sinks_positions.csv")
    assert {int(r["bucket"]) for r in positions} <= set(range(S.n_buckets(64)))
    for name in ("fig_sinks_positions.png", "fig_sinks_heads.png", "fig_sinks_layers.png", "fig_sinks_massive.png"):
        assert (out / name).is_file(), name
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "Attention sinks (Xiao et al. 2023" in page and "BOS effect" in page


def test_windowed_layers_on_a_tiny_gemma3_without_its_bos(tiny_gemma3, corpus, tmp_path):  # noqa: F811
    """Layer 1 sees 4 keys (itself and 3 before), layer 2 all: the rows of layer 1 past position 3
    cannot see the first token and are reported apart; --bos without strips the template's <s>."""
    from bertscope.analyses.sinks import command
    from bertscope.models.loading import load_model
    from bertscope.text.corpus import open_corpus
    from bertscope.text.segments import SegmentReport

    out = tmp_path / "run"
    assert main(["sinks", "--model", str(tiny_gemma3), "--corpus", str(corpus), "--limit", "all", "--max-len", "24",
                 "--bos", "without", "--batch-size", "3", "--backend", "chunked", "--quiet", "--no-figures",
                 "--out", str(out)]) == 0
    rows = rows_of(out / "sinks.csv")
    assert {(r["layer"], r["attention"]) for r in rows} == {("1", "window 4"), ("2", "global")}
    loaded = load_model(str(tiny_gemma3))
    args = argparse.Namespace(max_len=24, limit=None, seed=0, bos="without", bos_token=None, initial=4)
    plan = command.bos_plan(loaded, args, causal=True)
    segments = list(command.sink_segments(open_corpus(str(corpus)), loaded, args, True, SegmentReport(), plan))
    assert all(s.input_ids[0] != 1 for s in segments)
    n_past = sum(max(0, s.n_tokens - 4) for s in segments)
    assert {int(r["n_unseeing"]) for r in rows if r["layer"] == "1"} == {n_past}
    assert {int(r["n_unseeing"]) for r in rows if r["layer"] == "2"} == {0}
    saved = S.SinkStats.load(out / "sinks.npz")
    want = reference(loaded.model, segments, saved)
    for key, col in (("alpha", "alpha_1"), ("edge", "unseeing_edge")):
        got = np.array([[float(r[col] or "nan") for r in rows if int(r["layer"]) == layer] for layer in (1, 2)])
        np.testing.assert_allclose(got, want[key], atol=2e-5, err_msg=col)
    results = json.loads((out / "run.json").read_text())["analyses"]["sinks"]["results"]["variants"]["without"]
    assert results["windowed"]["layers"] == [1] and results["global"]["layers"] == [2]
    punct = np.mean([float(r["unseeing_punct"]) for r in rows if r["layer"] == "1"])
    assert results["windowed"]["unseeing_punct"] == pytest.approx(punct, abs=1e-5)


def test_a_bos_token_outside_the_vocabulary_is_one_line(tiny_llama, corpus, tmp_path, capsys):  # noqa: F811
    assert main(["sinks", "--model", str(tiny_llama), "--corpus", str(corpus), "--bos", "with", "--bos-token", "<nope>",
                 "--max-len", "24", "--quiet", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertscope: error: --bos-token '<nope>' is not a token of ")
    assert not (tmp_path / "no").exists()


def test_sinks_resumes_after_ctrl_c_to_the_same_sums(tiny_llama, corpus, tmp_path, monkeypatch):  # noqa: F811
    from bertscope.analyses.sinks import command

    common = ["sinks", "--model", str(tiny_llama), "--corpus", str(corpus), "--limit", "all", "--max-len", "24",
              "--batch-size", "1", "--backend", "chunked", "--quiet", "--no-figures"]
    full = tmp_path / "full"
    assert main([*common, "--out", str(full)]) == 0
    monkeypatch.setattr(command, "CHECKPOINT_TOKENS", 1)  # a checkpoint after every batch
    add = interrupt_on_call(monkeypatch, S.SinkStats, 3)
    part = tmp_path / "part"
    assert main([*common, "--out", str(part)]) == 130
    assert S.SinkStats.load(part / "sinks.npz").batches_done == 2
    assert json.loads((part / "run.json").read_text())["analyses"]["sinks"]["status"] == "interrupted"
    monkeypatch.setattr(S.SinkStats, "add", add)
    assert main(["sinks", "--resume", str(part), "--quiet"]) == 0
    a, b = S.SinkStats.load(full / "sinks.npz"), S.SinkStats.load(part / "sinks.npz")
    assert b.batches_done == a.batches_done == len(TEXTS)
    for name in S.ARRAYS:
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), rtol=1e-9, err_msg=name)
    assert rows_of(full / "sinks.csv") == rows_of(part / "sinks.csv")


def test_the_encoder_reads_cls_and_sep(minilm_path, wiki, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sinks", "--limit", "4", "--max-len", "48", "--quiet", "--no-figures", "--out", str(out)]) == 0
    rows = rows_of(out / "sinks.csv")
    assert len(rows) == 6 * 12 and {r["bos"] for r in rows} == {"cls"}
    assert all(r["n_unseeing"] == "0" for r in rows)  # every row sees [CLS]
    assert 0 < max(float(r["sep_mass"]) for r in rows) < 0.3  # all-MiniLM parks on [CLS], not on [SEP]
    record = json.loads((out / "run.json").read_text())["analyses"]["sinks"]["results"]["variants"]["cls"]
    first = record["first_mass_by_layer"]
    assert record["segments"] == 4 and first[0] < 0.2 and min(first[1:5]) > 0.3  # [CLS] in layers 2-5
    assert record["massive"]["ratio"] > 10
    capsys.readouterr()
    assert main(["sinks", "--limit", "4", "--bos", "with", "--quiet", "--out", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "bertscope: error: --bos and --bos-token are for decoders: an encoder's first token is [CLS]"
    assert not (tmp_path / "no").exists()


def test_a_real_slice_of_smollm2(smollm2_dir, wiki, tmp_path):
    """Two Wikipedia segments of 48 tokens through the real SmolLM2 (dequantized from 4-bit GGUF): the
    first token draws most of the attention beyond the first layers, and its hidden state holds a
    massive activation (hundreds of times the median; thousands in our longer runs)."""
    out = tmp_path / "run"
    assert main(["sinks", "--model", str(smollm2_dir), "--limit", "2", "--max-len", "48", "--batch-size", "2",
                 "--quiet", "--no-figures", "--out", str(out)]) == 0
    results = json.loads((out / "run.json").read_text())["analyses"]["sinks"]["results"]
    r = results["variants"]["without"]  # SmolLM2's template adds no BOS
    assert r["segments"] == 2 and r["queries"] <= 96
    assert np.mean(r["first_mass_by_layer"][15:]) > 0.4
    assert r["massive"]["ratio"] > 100 and r["massive"]["first_max"] > 10 * r["massive"]["rest_max"]
