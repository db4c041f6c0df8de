"""`bertscope heads attention-grad`: the masked-LM loss on a tiny random BertForMaskedLM, the
task loss on tiny classifiers, BERT's masking, and the per-layer means against the oracle."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, require_data, tiny_config
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

from bertscope.analyses.heads.attention_grad.stats import GradStats, mask_tokens
from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")

TEXT = [
    "The cat sat on the mat. It was warm, and the sun was out.\tThen the dog came in, and the cat left.",
    "Attention heads attend to the separator token. Some attend to periods, others to commas.",
    "A short line.\tAnother one, with a comma.",
    "BERT was trained with masked language modelling. Fifteen percent of the tokens are masked.",
    "Gradients tell how much the loss changes. Small gradients mean little change.\tThat is the idea.",
    "One more segment, to fill a batch. And a second sentence.",
]


def save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def mlm_checkpoint(tmp_path_factory, minilm_tokenizer):
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_config(tiny_config("bert", minilm_tokenizer))
    return save(model, minilm_tokenizer, tmp_path_factory.mktemp("tiny-mlm"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    return path


def rows_of(path):
    return list(csv.DictReader(open(path)))


def run_cli(args, out):
    assert main(["heads", "attention-grad", *args, "--out", str(out), "--quiet"]) == 0
    return rows_of(out / "attention_grad_layers.csv"), json.loads((out / "run.json").read_text())


def test_mlm_objective_by_default_and_fused_equals_the_oracle(mlm_checkpoint, corpus, tmp_path):
    common = ["--model", str(mlm_checkpoint), "--corpus", str(corpus), "--limit", "5", "--batch-size", "2"]
    fused, record = run_cli(common, tmp_path / "fused")
    eager, _ = run_cli(common + ["--backend", "eager", "--no-figures"], tmp_path / "eager")
    entry = record["analyses"]["attention_grad"]
    assert entry["status"] == "complete"
    res = entry["results"]
    assert res["objective"] == "mlm" and res["inputs"] == 5 and res["mean_loss"] > 0
    assert {"attention_grad_layers.csv", "attention_grad_heads.csv", "fig_attention_grad.png",
            "fig_attention_grad_heads.png"} <= set(entry["outputs"])
    assert len(fused) == TINY_LAYERS * 4
    for a, b in zip(fused, eager):
        assert ((a["layer"], a["key_class"], a["pairs"], a["rows"])
                == (b["layer"], b["key_class"], b["pairs"], b["rows"]))
        assert float(a["mean_abs_grad"]) == pytest.approx(float(b["mean_abs_grad"]), rel=1e-4)
        assert float(a["attention"]) == pytest.approx(float(b["attention"]), rel=1e-4, abs=1e-7)
    for lay in range(1, TINY_LAYERS + 1):
        layer = [r for r in fused if int(r["layer"]) == lay]
        assert sum(float(r["attention"]) for r in layer) == pytest.approx(1.0, abs=1e-5)  # every row's mass
        assert all(float(r["mean_abs_grad"]) > 0 for r in layer)
        assert float(next(r for r in layer if r["key_class"] == "other")["grad_vs_other"]) == pytest.approx(1.0)
    heads = rows_of(tmp_path / "fused" / "attention_grad_heads.csv")
    assert len(heads) == TINY_LAYERS * TINY_HEADS * 4
    # the layer mean is the mean of the head means (every head has the same pairs)
    for r in fused:
        mine = [float(h["mean_abs_grad"]) for h in heads
                if (h["layer"], h["key_class"]) == (r["layer"], r["key_class"])]
        assert np.mean(mine) == pytest.approx(float(r["mean_abs_grad"]), rel=1e-4)
    assert "Attention gradients" in (tmp_path / "fused" / "index.html").read_text()


def test_results_do_not_depend_on_the_batch_size(mlm_checkpoint, corpus, tmp_path):
    common = ["--model", str(mlm_checkpoint), "--corpus", str(corpus), "--limit", "6", "--no-figures"]
    one, _ = run_cli(common + ["--batch-size", "1"], tmp_path / "one")
    six, _ = run_cli(common + ["--batch-size", "6"], tmp_path / "six")
    for a, b in zip(one, six):
        assert a["pairs"] == b["pairs"]
        assert float(a["mean_abs_grad"]) == pytest.approx(float(b["mean_abs_grad"]), rel=1e-4)


def test_masking_follows_bert(minilm_tokenizer):
    ids = list(range(1000, 1100))
    word_ids = [-1] + list(range(98)) + [-1]
    masked, kinds = 0, {"mask": 0, "same": 0, "other": 0}
    for seed in range(400):
        new, labels = mask_tokens(ids, word_ids, 103, 30000, np.random.default_rng([7, seed]))
        picked = [i for i, lab in enumerate(labels) if lab != -100]
        assert len(picked) == 15 and 0 not in picked and 99 not in picked  # round(15% of 100), no specials
        assert all(labels[i] == ids[i] for i in picked)
        assert all(new[i] == ids[i] for i in range(100) if i not in picked)
        for i in picked:
            kinds["mask" if new[i] == 103 else "same" if new[i] == ids[i] else "other"] += 1
        masked += len(picked)
    assert kinds["mask"] / masked == pytest.approx(0.8, abs=0.02)
    assert kinds["same"] / masked == pytest.approx(0.1, abs=0.015)
    # seeded, and at least one token of a short segment
    a = mask_tokens(ids[:4], [-1, 0, 1, -1], 103, 30000, np.random.default_rng([1, 2]))
    assert a == mask_tokens(ids[:4], [-1, 0, 1, -1], 103, 30000, np.random.default_rng([1, 2]))
    assert sum(lab != -100 for lab in a[1]) == 1
    assert mask_tokens(ids[:2], [-1, -1], 103, 30000, np.random.default_rng(0)) == (ids[:2], [-100, -100])


def test_task_loss_per_example():
    """The loss each batch sums: every example's own cross-entropy, ARCT's over its two warrants."""
    from types import SimpleNamespace

    from bertscope.tasks.inputs import EncodedTask
    from bertscope.tasks.model import point_loss

    def task_loss(kind, logits, labels):
        task = SimpleNamespace(kind=kind, per_example=1 if kind == "classify" else 2)
        return point_loss(EncodedTask.example_logits(task, logits), labels, "sum")

    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0])
    want = -torch.log_softmax(logits, -1)[[0, 1], [0, 0]].sum()
    assert float(task_loss("classify", logits, labels)) == pytest.approx(float(want))
    # ARCT: one score per warrant row, softmax over an example's two rows
    scores = torch.tensor([[0.5], [1.5], [2.0], [-1.0]])
    want = -(torch.log_softmax(torch.tensor([0.5, 1.5]), 0)[1] + torch.log_softmax(torch.tensor([2.0, -1.0]), 0)[0])
    assert float(task_loss("choice", scores, torch.tensor([1, 0]))) == pytest.approx(float(want))


def test_task_objective_on_rte(tmp_path, minilm_tokenizer):
    require_data("rte")
    torch.manual_seed(0)
    config = tiny_config("bert", minilm_tokenizer)
    ckpt = save(AutoModelForSequenceClassification.from_config(config), minilm_tokenizer, tmp_path / "cls")
    rows, record = run_cli(["--model", str(ckpt), "--task", "rte", "--limit", "8", "--no-figures"], tmp_path / "run")
    res = record["analyses"]["attention_grad"]["results"]
    assert res["objective"] == "task" and res["task"] == "rte" and res["split"] == "dev" and res["inputs"] == 8
    sep = [r for r in rows if r["key_class"] == "sep"]
    assert len(sep) == TINY_LAYERS and all(int(r["pairs"]) > 0 and float(r["mean_abs_grad"]) > 0 for r in sep)


def test_user_errors(mlm_checkpoint, tiny_checkpoint, corpus, tmp_path, capsys):
    cases = (
        (["--model", str(tiny_checkpoint)], "--objective task needs --task"),
        (["--model", str(mlm_checkpoint), "--task", "rte"], "--objective mlm reads --corpus"),
        (["--model", str(tiny_checkpoint), "--objective", "mlm", "--corpus", str(corpus)], "has no masked-LM head"),
    )
    for k, (args, match) in enumerate(cases):
        code = main(["heads", "attention-grad", *args, "--out", str(tmp_path / f"o{k}"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_gradstats_save_load_merge(tmp_path):
    from bertscope.kernels.attention_grad import GradSums

    a, b = GradStats(2, 3), GradStats(2, 3)
    g = torch.Generator().manual_seed(0)
    for stats in (a, b):
        for layer in range(2):
            stats.add_sums(layer, GradSums(torch.rand(3, 4, generator=g, dtype=torch.float64),
                                           torch.rand(3, 4, generator=g, dtype=torch.float64),
                                           torch.tensor([1.0, 2.0, 0.0, 5.0], dtype=torch.float64), 4))
        stats.examples, stats.batches_done, stats.loss_sum = 2, 1, 0.5
    a.save(tmp_path / "a.npz")
    back = GradStats.load(tmp_path / "a.npz")
    assert np.array_equal(back.grad, a.grad) and back.examples == 2 and back.loss_sum == 0.5
    total = back.merge(b)
    assert np.allclose(total.grad, a.grad + b.grad) and total.batches_done == 2 and total.rows.tolist() == [8, 8]
    grad, _ = total.layer_means()
    assert np.isnan(grad[0, 2])  # a class without pairs has no mean, not 0
    assert grad[0, 0] == pytest.approx((a.grad + b.grad)[0, :, 0].sum() / (3 * 2))
