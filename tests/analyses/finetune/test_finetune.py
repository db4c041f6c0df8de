"""bertscope finetune: the training loop, ARCT's warrant-pair scoring, the linear probe, the
attention-change cosine, and the command's errors and outputs, on tiny models and tiny data."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import tiny_config
from transformers import AutoModelForSequenceClassification

from bertscope.analyses.finetune.attention_change import attention_cosine
from bertscope.cli.main import main
from bertscope.data.readers.tasks import ArctExample, TaskExample
from bertscope.models.loading import load_model, wrap_model
from bertscope.tasks.inputs import arct_segments, encode_task
from bertscope.tasks.model import (
    TrainConfig,
    eval_batches,
    fine_tune,
    labelled_batch,
    linear_probe,
    linear_schedule,
    make_optimizer,
    metrics,
    point_logits,
    predict,
    train_batches,
)

pytestmark = pytest.mark.usefixtures("single_thread")

GOOD = ["good", "great", "fine", "nice", "happy"]
BAD = ["bad", "awful", "poor", "sad", "ugly"]


def tiny_classifier(tokenizer, num_labels=2, seed=0):
    import bertscope.models.attention  # noqa: F401

    config = tiny_config("bert", tokenizer)
    config.num_labels = num_labels
    config.initializer_range = 0.02  # the usual scale trains smoothly (0.3 is for peaky attention maps)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="bertscope")
    return wrap_model(model.eval(), tokenizer)


def toy_sentences(n=40, seed=0):
    """Label 1 iff the sentence holds a 'good' word: trivially separable."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = i % 2
        words = list(rng.choice(GOOD if label else BAD, size=rng.integers(1, 4)))
        out.append(TaskExample(f"t{i}", "the movie was " + " ".join(words), None, label))
    return out


def toy_arct(n=24, seed=0):
    """The right warrant says 'yes', the wrong one 'no'; the label is its index."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = int(rng.integers(0, 2))
        right, wrong = f"yes it is so {i % 3}", f"no it is not {i % 3}"
        w = (right, wrong) if label == 0 else (wrong, right)
        out.append(ArctExample(f"a{i}", f"claim {i % 5}", f"reason {i % 4}", w[0], w[1], label))
    return out


def encode(tokenizer, examples, max_len, arct_input=None):
    """Toy sentences as a polarity split, toy arguments as ARCT with `arct_input`."""
    if arct_input is None:
        return encode_task("polarity", examples, tokenizer, max_len)
    return encode_task("arct", examples, tokenizer, max_len, arct_input=arct_input)


def run_fit(tokenizer, train, dev, arct_input=None, seed=0, num_labels=2, epochs=10):
    loaded = tiny_classifier(tokenizer, num_labels=num_labels, seed=seed)
    tr, dv = encode(tokenizer, train, 32, arct_input), encode(tokenizer, dev, 32, arct_input)
    cfg = TrainConfig(epochs=epochs, batch_size=8, lr=3e-3, warmup=0.1)
    result = fine_tune(loaded.model, tr, dv, cfg, seed, tokenizer.pad_token_id, True, log=lambda *a: None)
    pred = predict(loaded.model, dv, 8, tokenizer.pad_token_id, True)
    return loaded, result, pred, dv


def test_fine_tune_reaches_100_percent_on_a_separable_toy_task(minilm_tokenizer):
    loaded, result, pred, dev = run_fit(minilm_tokenizer, toy_sentences(40), toy_sentences(20, seed=1))
    assert metrics(pred, np.array(dev.labels), f1=True) == {"accuracy": 1.0, "n": 20, "f1": 1.0}
    assert result.best_dev == 1.0 and 1 <= result.best_epoch <= 10 and len(result.history) == 10
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert not loaded.model.training


def test_same_seed_same_model_other_seed_other_model(minilm_tokenizer):
    train, dev = toy_sentences(24), toy_sentences(12, seed=1)
    a = run_fit(minilm_tokenizer, train, dev, seed=3, epochs=2)
    b = run_fit(minilm_tokenizer, train, dev, seed=3, epochs=2)
    c = run_fit(minilm_tokenizer, train, dev, seed=4, epochs=2)
    assert a[1].history == [dict(h, seconds=a[1].history[i]["seconds"]) for i, h in enumerate(b[1].history)]
    for (name, p), q in zip(a[0].model.state_dict().items(), b[0].model.state_dict().values()):
        assert torch.equal(p, q), name
    assert not torch.equal(a[0].model.classifier.weight, c[0].model.classifier.weight)


def test_arct_scores_each_warrant_and_softmaxes_the_pair(minilm_tokenizer):
    ex = toy_arct(2)
    assert arct_segments(ex[0], "full") == [(f"{ex[0].claim} {ex[0].reason}", w) for w in ex[0].warrants]
    assert arct_segments(ex[0], "W") == [(w, None) for w in ex[0].warrants]
    assert arct_segments(ex[0], "RW")[1] == (ex[0].reason, ex[0].warrant1)
    assert arct_segments(ex[0], "CW")[0] == (ex[0].claim, ex[0].warrant0)
    assert arct_segments(ex[0], "RCW") == [(f"{ex[0].reason} {ex[0].claim}", w) for w in ex[0].warrants]
    loaded = tiny_classifier(minilm_tokenizer, num_labels=1)
    data = encode(minilm_tokenizer, ex, 32, "full")
    batch = labelled_batch(data, [0, 1], minilm_tokenizer.pad_token_id, True)
    assert batch["input_ids"].shape[0] == 4 and batch["labels"].tolist() == [e.label for e in ex]
    with torch.no_grad():
        pair = point_logits(loaded.model, batch, pairwise=True)  # (2, 2)
        one = [loaded.model(**minilm_tokenizer(a, b, return_tensors="pt")).logits.item()
               for e in ex for a, b in arct_segments(e, "full")]
    torch.testing.assert_close(pair.flatten(), torch.tensor(one), atol=1e-5, rtol=1e-5)
    # trained on the pairs it learns the cue; swapping the warrants swaps every prediction
    train, dev = toy_arct(32), toy_arct(16, seed=1)
    loaded, _, pred, dv = run_fit(minilm_tokenizer, train, dev, arct_input="W", num_labels=1, epochs=10)
    assert metrics(pred, np.array(dv.labels), f1=False)["accuracy"] == 1.0
    swapped = [ArctExample(e.id, e.claim, e.reason, e.warrant1, e.warrant0, 1 - e.label) for e in dev]
    pred_swapped = predict(loaded.model, encode(minilm_tokenizer, swapped, 32, "W"), 8, minilm_tokenizer.pad_token_id,
                           True)
    assert (pred_swapped == 1 - pred).all()


def test_schedule_is_linear_warmup_from_zero_then_linear_decay_to_zero(minilm_tokenizer):
    """transformers' get_linear_schedule_with_warmup: 20 steps, 10% warm-up = 2 steps from 0."""
    model = tiny_classifier(minilm_tokenizer).model
    cfg = TrainConfig(epochs=2, lr=1e-3, warmup=0.1)
    optimizer = make_optimizer(model, cfg)
    scheduler = linear_schedule(optimizer, cfg, steps_per_epoch=10)
    lrs = []
    for _ in range(21):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    want = [0.0, 0.5e-3] + [1e-3 * (20 - s) / 18 for s in range(2, 21)]
    np.testing.assert_allclose(lrs, want, rtol=1e-12, atol=1e-15)
    assert max(lrs) == 1e-3 and lrs[-2] > 0 and lrs[-1] == 0.0


def test_head_lr_gives_the_classifier_its_own_rate_and_no_decay_on_vectors(minilm_tokenizer):
    model = tiny_classifier(minilm_tokenizer).model
    groups = make_optimizer(model, TrainConfig(lr=1e-4, head_lr=1e-2, weight_decay=0.01)).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    for g in groups:
        for p in g["params"]:
            name = names[id(p)]
            assert g["lr"] == (1e-4 if name.startswith("bert.") else 1e-2), name
            assert g["weight_decay"] == (0.01 if p.ndim >= 2 else 0.0), name
    assert sum(len(g["params"]) for g in groups) == len(names)
    assert {names[id(p)] for g in groups if g["lr"] == 1e-2 for p in g["params"]} == {
        "classifier.weight", "classifier.bias"}
    # without head_lr: one rate, two groups (decay and no decay), as before
    plain = make_optimizer(model, TrainConfig(lr=1e-4)).param_groups
    assert len(plain) == 2 and {g["lr"] for g in plain} == {1e-4}


def test_patience_stops_early_and_equals_the_start_of_the_full_run(minilm_tokenizer):
    train, dev = toy_sentences(24), toy_sentences(12, seed=1)
    runs = []
    for patience in (None, 1):
        loaded = tiny_classifier(minilm_tokenizer, seed=0)
        tr, dv = encode(minilm_tokenizer, train, 32), encode(minilm_tokenizer, dev, 32)
        cfg = TrainConfig(epochs=6, batch_size=8, lr=1e-7, warmup=0.1, patience=patience)  # too low to move dev
        runs.append(fine_tune(loaded.model, tr, dv, cfg, 0, minilm_tokenizer.pad_token_id, True, log=lambda *a: None))
    full, short = runs
    assert len(full.history) == 6 and short.best_epoch == 1 and len(short.history) == 2
    strip = [{k: v for k, v in h.items() if k != "seconds"} for h in full.history]
    assert [{k: v for k, v in h.items() if k != "seconds"} for h in short.history] == strip[:2]


def test_length_bucketed_batches_cover_every_point_once(minilm_tokenizer):
    data = encode(minilm_tokenizer, toy_sentences(45), 32)
    import random

    batches = train_batches(data, 8, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(45))
    assert batches == train_batches(data, 8, random.Random(0))
    lengths = [data.lengths()[i] for b in eval_batches(data, 8) for i in b]
    assert lengths == sorted(lengths)
    batch = labelled_batch(data, batches[0], minilm_tokenizer.pad_token_id, True)
    assert batch["input_ids"].shape[1] == max(data.lengths()[i] for i in batches[0])  # dynamic padding
    assert batch["labels"].tolist() == data.labels[batches[0]].tolist()


def test_linear_probe_on_separable_features():
    rng = np.random.default_rng(0)
    y = np.arange(60) % 2
    x = rng.normal(size=(60, 1, 5)).astype(np.float32)
    x[:, 0, 0] += 4 * (2 * y - 1)
    predict_fn, _, dev_acc = linear_probe(x[:40], y[:40], x[40:], y[40:], pairwise=False)
    assert dev_acc == 1.0 and (predict_fn(x[40:]) == y[40:]).all()
    # pairs: the warrant whose feature 0 is larger is right
    pairs = rng.normal(size=(60, 2, 5)).astype(np.float32)
    pairs[np.arange(60), y, 0] += 5
    predict_fn, _, dev_acc = linear_probe(pairs[:40], y[:40], pairs[40:], y[40:], pairwise=True)
    assert dev_acc == 1.0 and (predict_fn(pairs[40:]) == y[40:]).all()


def test_attention_cosine_is_one_with_itself_and_matches_eager_by_hand(tiny_model, minilm_tokenizer):
    a_model, tok = tiny_model("bert", seed=0)
    b_model, _ = tiny_model("bert", seed=1)
    a, b = wrap_model(a_model, tok), wrap_model(b_model, tok)
    texts = ["A short one.", "A much longer sentence, with a comma and more words in it.", "Mid length here."]
    inputs = dict(tok(texts, padding=True, return_tensors="pt"))
    same = attention_cosine(a, a, [inputs])
    assert same.n == 3
    np.testing.assert_allclose(same.mean, 1.0, atol=1e-6)
    got = attention_cosine(a, b, [inputs, inputs])
    assert got.n == 6 and got.mean.max() < 0.9999
    # by hand: transformers' eager attention maps, cosine over each text's valid block
    eager = []
    for seed in (0, 1):
        model, _ = tiny_model("bert", attn_implementation="eager", seed=seed)
        with torch.no_grad():
            eager.append(model(**inputs, output_attentions=True).attentions)  # layers x (B, H, L, L)
    lengths = inputs["attention_mask"].sum(1)
    want = np.zeros_like(got.mean)
    for layer in range(a.n_layers):
        for i, n in enumerate(lengths.tolist()):
            x = eager[0][layer][i, :, :n, :n].reshape(a.n_heads, -1).double()
            y = eager[1][layer][i, :, :n, :n].reshape(a.n_heads, -1).double()
            want[layer] += (torch.nn.functional.cosine_similarity(x, y, dim=-1) / len(texts)).numpy()
    np.testing.assert_allclose(got.mean, want, atol=1e-5)


# ----------------------------------------------------------------------------- the command

def write_rte(folder, n=16):
    """A hand-made RTE folder: 'yes' in the hypothesis means entailment."""
    folder.mkdir(parents=True)
    names = ("rte1_dev", "rte1_test", "rte2_dev", "rte2_test", "rte3_dev", "rte3_test")
    for f, name in enumerate(names):
        pairs = "".join(f'<pair id="{i}" entailment="{"YES" if i % 2 else "NO"}"><t>text {i} {f}</t>'
                        f'<h>{"yes" if i % 2 else "no"} {i}</h></pair>' for i in range(n))
        (folder / f"{name}.xml").write_text(f'<entailment-corpus challenge="{f}">{pairs}</entailment-corpus>')


def test_command_writes_results_checkpoints_and_cosine(tmp_path, tiny_checkpoint, capsys):
    write_rte(tmp_path / "data" / "rte")
    out = tmp_path / "run"
    args = ["finetune", "--task", "rte", "--model", str(tiny_checkpoint), "--data-dir", str(tmp_path / "data"),
            "--out", str(out), "--seeds", "0", "--epochs", "2", "--batch-size", "8", "--lr", "1e-3",
            "--threads", "1", "--quiet", "--no-figures", "--cosine-examples", "5"]
    assert main(args) == 0
    with open(out / "finetune_results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["init"], r["split"]) for r in rows} == {(i, s) for i in ("probe", "pretrained", "random")
                                                       for s in ("dev", "test")}
    test = {r["init"]: r for r in rows if r["split"] == "test"}
    assert all(int(r["n"]) == 16 and 0 <= float(r["accuracy"]) <= 1 and r["f1"] != "" for r in test.values())
    record = json.loads((out / "run.json").read_text())["analyses"]["finetune"]
    assert record["status"] == "complete" and len(record["results"]["test"]) == 3
    # the checkpoint loads back as a 2-label classifier that gives the recorded test accuracy
    ckpt = out / test["pretrained"]["checkpoint"]
    loaded = load_model(ckpt, task="sequence-classification")
    assert not loaded.head_initialised and loaded.model.config.num_labels == 2
    with open(out / "finetune_cosine.csv") as f:
        cosine = list(csv.DictReader(f))
    assert len(cosine) == 2 * 4 and all(cos["n_inputs"] == "5" for cos in cosine)
    assert all(-1 <= float(cos["cosine"]) <= 1 + 1e-6 for cos in cosine)
    assert {(cos["layer"], cos["head"]) for cos in cosine} == {(str(l), str(h)) for l in (1, 2) for h in (1, 2, 3, 4)}
    report = (out / "index.html").read_text()
    assert "Table 1 (Kovaleva et al.)" in report and "64.6" in report  # bert-base's RTE number beside ours
    # run again in the same directory: the same seed gives the same numbers (reproducible) and
    # replaces its rows instead of adding to them
    assert main(args[:-4] + ["--inits", "pretrained", "--quiet", "--no-figures", "--cosine-examples", "0"]) == 0
    with open(out / "finetune_results.csv") as f:
        again = list(csv.DictReader(f))
    assert len(again) == len(rows)
    assert [r["accuracy"] for r in again if r["init"] == "pretrained"] == \
        [r["accuracy"] for r in rows if r["init"] == "pretrained"]


def one_line_error(capsys, args) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bertscope: error:")
    return err


def test_user_errors_are_one_line(tmp_path, tiny_checkpoint, capsys, minilm_tokenizer):
    write_rte(tmp_path / "data" / "rte")
    data = ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "o")]
    # an unknown --task is argparse's usage error (choices=): tests/cli/test_cli_conventions.py
    assert "sentence polarity" in one_line_error(capsys, ["finetune", "--task", "polarity"] + data)
    three = tmp_path / "three-labels"
    model = tiny_classifier(minilm_tokenizer, num_labels=3).model
    model.save_pretrained(three)
    minilm_tokenizer.save_pretrained(three)
    err = one_line_error(capsys, ["finetune", "--task", "rte", "--model", str(three)] + data)
    assert "has 3 labels; task rte needs 2" in err
    assert not (tmp_path / "o").exists()  # refused before any work


def test_ctrl_c_keeps_what_finished(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    import bertscope.tasks.model as task_model

    write_rte(tmp_path / "data" / "rte")
    out = tmp_path / "run"
    real, calls = task_model.fine_tune, []

    def second_is_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(task_model, "fine_tune", second_is_interrupted)
    code = main(["finetune", "--task", "rte", "--model", str(tiny_checkpoint), "--data-dir", str(tmp_path / "data"),
                 "--out", str(out), "--seeds", "0,1", "--epochs", "1", "--inits", "pretrained", "--threads", "1",
                 "--quiet", "--cosine-examples", "4"])
    err = capsys.readouterr().err.strip()
    assert code == 130 and len(err.splitlines()) == 1 and err.startswith("bertscope: interrupted"), err
    with open(out / "finetune_results.csv") as f:
        rows = list(csv.DictReader(f))
    assert {(r["seed"], r["split"]) for r in rows} == {("0", "dev"), ("0", "test")}  # seed 0 finished, 1 did not
    record = json.loads((out / "run.json").read_text())["analyses"]["finetune"]
    assert record["status"] == "interrupted" and record["results"]["timing"]["interrupted"]
    assert (out / "fig_finetune_cosine_rte.png").is_file()


def test_training_settings_default_to_the_tasks_recipe():
    from bertscope.analyses.finetune.command import (
        PAPERS_RECIPE,
        RECIPES,
        resolve_recipe,
    )
    from bertscope.cli.main import build_parser

    def settings(*argv):
        args = resolve_recipe(build_parser().parse_args(["finetune", *argv]))
        return {k: getattr(args, k) for k in PAPERS_RECIPE}

    searched = {"epochs": 5, "lr": 3e-5, "batch_size": 16, "warmup": 0.1, "patience": 0}  # issue 23's dev search
    assert settings("--task", "rte") == settings("--task", "arct") == RECIPES["rte"] == searched
    assert settings("--task", "polarity") == PAPERS_RECIPE
    assert PAPERS_RECIPE == {"epochs": 3, "lr": 5e-5, "batch_size": 32, "warmup": 0.1, "patience": 0}
    # what is given wins; the rest comes from the task
    assert settings("--task", "rte", "--lr", "5e-5", "--patience", "0") == dict(RECIPES["rte"], lr=5e-5, patience=0)
    assert settings("--task", "polarity", "--batch-size", "8")["batch_size"] == 8


def test_the_probe_reads_cls_vectors_in_fixed_batches_whatever_the_training_batch(tmp_path, tiny_checkpoint,
                                                                                   monkeypatch):
    """--batch-size is a training setting: the linear probe's [CLS] features are read in batches
    of PROBE_BATCH, so its rows are the same at any --batch-size (with batches of 16 instead of
    32, RTE's probe picked another C among tied dev accuracies and moved from 50.4 to 49.75)."""
    import bertscope.tasks.model as task_model
    from bertscope.analyses.finetune.command import PROBE_BATCH

    write_rte(tmp_path / "data" / "rte")
    seen, real = [], task_model.cls_features
    monkeypatch.setattr(task_model, "cls_features",
                        lambda enc, data, batch, *a, **k: (seen.append(batch), real(enc, data, batch, *a, **k))[1])
    rows = {}
    for batch in (2, 8):
        out = tmp_path / f"run{batch}"
        assert main(["finetune", "--task", "rte", "--inits", "probe", "--model", str(tiny_checkpoint), "--data-dir",
                     str(tmp_path / "data"), "--out", str(out), "--batch-size", str(batch), "--threads", "1",
                     "--quiet", "--no-figures"]) == 0
        with open(out / "finetune_results.csv") as f:
            rows[batch] = [{k: v for k, v in r.items() if k != "train_s"} for r in csv.DictReader(f)]
    assert seen == [PROBE_BATCH] * 6  # train, dev and test, twice
    assert rows[2] == rows[8] and len(rows[2]) == 2
