"""`bertscope patterns` end to end on a few real Wikipedia segments with a tiny random BERT:
outputs, resume after an interruption, the streamed types against materialised maps, label
and train."""
import csv
import json

import numpy as np
import pytest
import torch
from conftest import interrupt_on_call, run_one_and_two_ranks

from bertscope.analyses.patterns import stats as P
from bertscope.cli.main import main


@pytest.fixture
def run_args(tiny_checkpoint, wiki, single_thread):
    return ["--model", str(tiny_checkpoint), "--data", "wiki", "--threads", "1", "--quiet"]


def counts_of(run_dir):
    return P.PatternCounts.load(run_dir / "patterns_wiki.npz")


def test_patterns_writes_proportions_and_figures(tmp_path, run_args):
    out = tmp_path / "run"
    assert main(["patterns", *run_args, "--limit", "6", "--out", str(out), "--examples", "3"]) == 0
    rows = list(csv.DictReader(open(out / "patterns.csv")))
    heads = {}
    for r in rows:
        if r["scope"] == "head":
            heads.setdefault((r["layer"], r["head"]), []).append(float(r["proportion"]))
    assert len(heads) == 2 * 4 and all(sum(v) == pytest.approx(1.0) for v in heads.values())
    overall = [float(r["proportion"]) for r in rows if r["scope"] == "all"]
    assert sum(overall) == pytest.approx(1.0) and len(overall) == 5
    counts = counts_of(out)
    assert counts.n_examples == 6 and (counts.counts.sum(-1) == 6).all()
    record = json.loads((out / "run.json").read_text())["analyses"]["patterns"]
    assert record["status"] == "complete" and record["results"]["data"]["wiki"]["examples"] == 6
    for name in ("fig_patterns.png", "fig_patterns_layers.png", "fig_patterns_examples_wiki.png", "index.html"):
        assert (out / name).is_file(), name
    assert "Attention pattern types (Kovaleva et al. 2019" in (out / "index.html").read_text()


def test_patterns_resumes_after_an_interruption(tmp_path, run_args, monkeypatch):
    from bertscope.analyses.patterns import command as patterns

    full = tmp_path / "full"
    assert main(["patterns", *run_args, "--limit", "10", "--batch-size", "2", "--examples", "0",
                 "--out", str(full)]) == 0
    monkeypatch.setattr(patterns, "CHECKPOINT_EVERY", 2)
    add = interrupt_on_call(monkeypatch, P.PatternCounts, 4)
    part = tmp_path / "part"
    assert main(["patterns", *run_args, "--limit", "10", "--batch-size", "2", "--examples", "0",
                 "--out", str(part)]) == 130  # Ctrl-C
    assert counts_of(part).batches_done == 2
    monkeypatch.setattr(P.PatternCounts, "add", add)
    assert main(["patterns", "--resume", str(part), "--quiet", "--threads", "1"]) == 0
    a, b = counts_of(full), counts_of(part)
    assert b.n_examples == 10 and (a.counts == b.counts).all()
    assert np.allclose(a.feature_sums, b.feature_sums)


def test_streamed_types_match_the_eager_maps(tiny_checkpoint, wiki, single_thread):
    """Types the accumulator gets from the chunked kernel's sums = types of the materialised maps
    read by the eager reference (map_features)."""
    import argparse

    from bertscope.analyses.patterns import command as patterns
    from bertscope.models.loading import load_model

    loaded = load_model(str(tiny_checkpoint))
    args = argparse.Namespace(max_len=64, limit=5, seed=0, split="dev", data_dir=None, arct_version="original")
    segments = patterns.first_segments("wiki", args, loaded.tokenizer, 5)
    seen = 0
    for _, segment, maps, kinds, feat in patterns.iter_maps(loaded, segments, P.Thresholds()):
        classes = torch.tensor(segment.token_class)[None]  # (1, L)
        for layer in range(maps.shape[0]):
            ref = P.map_features(torch.from_numpy(maps[layer])[None].double(), classes)
            for k in P.FEATURES:
                assert np.allclose(ref[k][0].numpy(), feat[k][layer], atol=1e-4), k
            assert (P.classify(ref)[0].numpy() == kinds[layer]).all()
            seen += 1
    assert seen == 5 * 2


def test_label_then_train(tmp_path, run_args):
    out = tmp_path / "labels"
    assert main(["patterns", "label", *run_args, "--limit", "4", "--out", str(out)]) == 0
    from bertscope.analyses.patterns.cnn import load_labels

    maps, _, meta = load_labels(out / "labels_wiki.npz")
    assert maps.shape == (4 * 2 * 4, 32, 32) and meta["labeller"] == "rules"
    trained = tmp_path / "cnn"
    assert main(["patterns", "train", "--labels", str(out / "labels_wiki.npz"), "--eval-labels",
                 str(out / "labels_wiki.npz"), "--epochs", "1", "--out", str(trained), "--quiet", "--threads",
                 "1"]) == 0
    result = json.loads((trained / "pattern_cnn.json").read_text())
    assert result["held_out_maps"] == 8 and result["train_maps"] == 24  # one of 4 segments held out, all heads
    assert result["eval"]["n"] == 32 and (trained / "pattern_cnn.pt").is_file()


def test_user_mistakes_are_one_line(tmp_path, capsys):
    assert main(["patterns", "--data", "wiki,imdb", "--out", str(tmp_path / "x")]) == 2
    assert "--data (or --corpus) takes" in capsys.readouterr().err
    assert main(["patterns", "train", "--out", str(tmp_path / "y")]) == 2
    assert "needs --labels" in capsys.readouterr().err
    assert main(["patterns", "--own", "1.5", "--out", str(tmp_path / "z")]) == 2


@pytest.mark.full  # tests/tiers.py
def test_two_ranks_equal_one_process(tmp_path, tiny_checkpoint, wiki):
    args = ["patterns", "--model", str(tiny_checkpoint), "--data", "wiki", "--limit", "12", "--batch-size", "2",
            "--quiet", "--no-figures", "--threads", "1"]
    run_one_and_two_ranks(args, tmp_path, port=29547)
    halves = [P.PatternCounts.load(tmp_path / "two" / f"patterns_wiki.rank{r}.npz") for r in (0, 1)]
    assert [h.n_examples for h in halves] == [6, 6]
    a, b = counts_of(tmp_path / "one"), counts_of(tmp_path / "two")
    assert a.n_examples == b.n_examples == 12 and (a.counts == b.counts).all()
    np.testing.assert_allclose(a.feature_sums, b.feature_sums, rtol=1e-9)


def test_patterns_runs_on_a_fine_tuned_style_checkpoint(tmp_path, tiny_model, wiki, single_thread):
    """--model takes a sequence-classification checkpoint (as the fine-tuning helper saves them): its encoder's maps."""
    from conftest import tiny_config
    from transformers import BertForSequenceClassification

    _, tokenizer = tiny_model("bert")
    torch.manual_seed(0)
    clf = BertForSequenceClassification(tiny_config("bert", tokenizer))
    clf.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "run"
    assert main(["patterns", "--model", str(tmp_path / "ckpt"), "--data", "wiki", "--limit", "3", "--quiet",
                 "--no-figures", "--out", str(out)]) == 0
    assert counts_of(out).n_examples == 3
