"""`bertscope heads importance` and `bertscope heads prune` (Michel et al. 2019) end to end on a
tiny classifier and a few real task examples, and the pruning schedule's bookkeeping."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, require_data
from test_disable import classifier, toy_task

from bertscope.analyses.heads.importance.stats import head_importance
from bertscope.analyses.heads.prune.stats import (
    importance_order,
    prunable_fraction,
    prune_counts,
    random_order,
)
from bertscope.models.loading import wrap_model

pytestmark = pytest.mark.usefixtures("single_thread")
L_, H_ = TINY_LAYERS, TINY_HEADS


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_prune_counts_round_half_up_of_the_original_total():
    assert prune_counts(72, 0.1, 0.9) == [7, 14, 22, 29, 36, 43, 50, 58, 65]
    assert prune_counts(8, 0.1, 0.9) == [1, 2, 2, 3, 4, 5, 6, 6, 7]
    assert prune_counts(144, 0.25, 0.75) == [36, 72, 108]


def test_prunable_fraction_stops_at_the_first_step_below_tolerance():
    fr = [0.0, 0.1, 0.2, 0.3, 0.4]
    assert prunable_fraction(fr, [0.80, 0.80, 0.795, 0.78, 0.80], 0.80, 0.01) == 0.2  # 0.4 is back up: not counted
    assert prunable_fraction(fr, [0.80, 0.70, 0.80, 0.80, 0.80], 0.80, 0.01) == 0.0
    assert prunable_fraction(fr, [0.80, 0.81, 0.82, 0.83, 0.80], 0.80, 0.01) == 0.4


def test_random_order_is_a_seeded_permutation():
    a = random_order(L_, H_, [1, 3, 7], seed=4)
    assert [len(s) for s in a] == [1, 2, 4]
    flat = [h for s in a for h in s]
    assert len(set(flat)) == 7 and all(0 <= lay < L_ and 0 <= h < H_ for lay, h in flat)
    assert a == random_order(L_, H_, [1, 3, 7], seed=4) and a != random_order(L_, H_, [1, 3, 7], seed=5)


def test_importance_order_never_repicks_and_grows_by_the_schedule(minilm_tokenizer):
    loaded = wrap_model(classifier(minilm_tokenizer), minilm_tokenizer)
    task = toy_task(minilm_tokenizer, n=12)
    counts = prune_counts(L_ * H_, 0.1, 0.9)  # 1, 2, 2, 3, ... : one step removes none
    removed, steps = importance_order(loaded, task, counts, batch_size=5, progress=False)
    assert [len(r) for r in removed] == list(np.diff([0] + counts))
    flat = [h for r in removed for h in r]
    assert len(flat) == len(set(flat)) == counts[-1]  # never the same head twice
    dead = set()
    for r, imp in zip(removed, steps):
        # each step scores exactly the live heads, and removes the lowest-scoring of them
        assert {(int(a), int(b)) for a, b in zip(*np.nonzero(np.isnan(imp.scores)))} == dead
        live_scores = sorted(imp.scores[~np.isnan(imp.scores)])
        assert sorted(imp.scores[lay, h] for lay, h in r) == live_scores[:len(r)]
        dead |= set(r)
    # step 1 is plain head importance of the unpruned model
    first = head_importance(loaded, task, batch_size=5, progress=False)
    np.testing.assert_allclose(steps[0].scores, first.scores)
    assert bool((loaded.gates.xi == 1).all())


@pytest.fixture(scope="module")
def rte_checkpoint(tmp_path_factory, minilm_tokenizer):
    path = tmp_path_factory.mktemp("tiny-rte")
    classifier(minilm_tokenizer, seed=3).save_pretrained(path)
    minilm_tokenizer.save_pretrained(path)
    return path


def test_importance_command_and_compare(rte_checkpoint, tmp_path):
    from scipy.stats import spearmanr

    from bertscope.cli.main import main

    require_data("rte")
    one, two = tmp_path / "michel", tmp_path / "batch"
    base = ["heads", "importance", "--model", str(rte_checkpoint), "--task", "rte", "--limit", "10", "--quiet",
            "--batch-size", "4"]
    assert main(base + ["--out", str(one)]) == 0
    assert main(base + ["--out", str(two), "--convention", "batch", "--no-normalise"]) == 0
    rows = read(one / "importance.csv")
    assert list(rows[0]) == ["layer", "head", "importance", "importance_raw", "rank"]
    grid = [(i, j) for i in range(1, L_ + 1) for j in range(1, H_ + 1)]
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == grid
    assert sorted(int(r["rank"]) for r in rows) == list(range(1, L_ * H_ + 1))
    imp = np.array([float(r["importance"]) for r in rows]).reshape(L_, H_)
    raw = np.array([float(r["importance_raw"]) for r in rows]).reshape(L_, H_)
    np.testing.assert_allclose(np.linalg.norm(imp, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(imp, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-4)
    best = max(rows, key=lambda r: float(r["importance"]))
    assert best["rank"] == "1"
    entry = json.loads((one / "run.json").read_text())["analyses"]["importance"]
    assert entry["status"] == "complete" and entry["results"]["examples"] == 10
    assert entry["results"]["split"] == "dev" and {"importance.csv", "fig_importance.png"} <= set(entry["outputs"])
    assert "Head importance (Michel et al. 2019)" in (one / "index.html").read_text()
    rows2 = read(two / "importance.csv")
    assert all(r["importance"] == r["importance_raw"] for r in rows2)  # --no-normalise

    cmp = tmp_path / "cmp"
    assert main(["heads", "importance", "--compare", str(one), str(two), str(one), "--out", str(cmp), "--quiet"]) == 0
    pairs = read(cmp / "importance_correlation.csv")
    assert len(pairs) == 3 and pairs[0]["label_a"] == "rte (michel)"
    want = spearmanr([float(r["importance"]) for r in rows], [float(r["importance"]) for r in rows2])[0]
    assert float(pairs[0]["spearman"]) == pytest.approx(want)
    assert float(pairs[1]["spearman"]) == pytest.approx(1.0) and float(pairs[1]["top_overlap"]) == 1.0  # itself
    assert (cmp / "fig_importance_correlation.png").is_file()
    page = (cmp / "index.html").read_text()
    assert "Rank correlation of head importance between runs" in page and "rte (batch)" in page


def test_prune_command_matches_the_gated_model_by_hand(rte_checkpoint, tmp_path):
    from bertscope.cli.main import main
    from bertscope.data.paths import seeded_sample
    from bertscope.data.readers.tasks import read_task
    from bertscope.models.loading import load_model
    from bertscope.tasks.inputs import encode_task

    require_data("rte")
    out = tmp_path / "prune"
    assert main(["heads", "prune", "--model", str(rte_checkpoint), "--task", "rte", "--limit", "16", "--step", "0.25",
                 "--max-fraction", "0.75", "--random-seeds", "2", "--seed", "1", "--out", str(out), "--quiet"]) == 0
    rows = read(out / "prune.csv")
    assert list(rows[0]) == ["step", "fraction_pruned", "heads_pruned", "order", "seed", "accuracy", "delta"]
    assert len(rows) == 3 * 4  # importance + 2 random orders, steps 0..3
    assert [r["heads_pruned"] for r in rows[:4]] == ["0", "2", "4", "6"]
    assert {r["seed"] for r in rows if r["order"] == "random"} == {"1", "2"}
    order = read(out / "prune_order.csv")
    assert list(order[0]) == ["step", "fraction_pruned", "layer", "head"]
    assert [sum(r["step"] == str(s) for r in order) for s in (1, 2, 3)] == [2, 2, 2]
    assert len({(r["layer"], r["head"]) for r in order}) == 6
    # each importance step's accuracy is that of the model with its heads zero-gated, run by hand on the test split
    loaded = load_model(rte_checkpoint, task="sequence-classification")
    test = seeded_sample(read_task("rte", "test"), 16, 1)
    task = encode_task("rte", test, loaded.tokenizer, 128)
    inputs = task.batch(range(task.n_examples), loaded.tokenizer.pad_token_id)
    xi = torch.ones(L_, H_)
    for step in range(4):
        for r in order:
            if r["step"] == str(step):
                xi[int(r["layer"]) - 1, int(r["head"]) - 1] = 0
        loaded.gates.xi = xi.clone()
        with torch.no_grad():
            acc = (task.predict(loaded.model(**inputs).logits).numpy() == task.labels).mean()
        assert float(rows[step]["accuracy"]) == pytest.approx(acc, abs=1e-6), step
    results = json.loads((out / "run.json").read_text())["analyses"]["prune"]["results"]
    assert results["heads_pruned"] == [2, 4, 6] and results["importance_split"] == "dev" and results["split"] == "test"
    assert (out / "fig_prune.png").is_file()
    page = (out / "index.html").read_text()
    assert "Accuracy (%) on test with the heads pruned" in page and "fig_prune.png" in page


def test_user_errors_are_one_line(rte_checkpoint, tiny_checkpoint, tmp_path, capsys):
    from bertscope.cli.main import main

    require_data("rte")
    cases = [
        (["heads", "importance", "--model", str(rte_checkpoint)], "heads importance needs --task"),
        (["heads", "importance", "--compare", str(tmp_path)], "--compare needs at least two run directories"),
        (["heads", "importance", "--compare", str(tmp_path), str(tmp_path)], "no importance file at"),
        (["heads", "importance", "--task", "rte", "--model", str(tiny_checkpoint), "--limit", "4"],
         "has no sequence-classification head"),
        (["heads", "prune", "--task", "rte", "--model", str(rte_checkpoint), "--split", "dev"],
         "--importance-split and --split are both dev"),
        (["heads", "prune", "--task", "rte", "--model", str(rte_checkpoint), "--step", "0.5", "--max-fraction", "0.3"],
         "nothing to prune"),
    ]
    for argv, match in cases:
        code = main(argv + ["--out", str(tmp_path / "o"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    with pytest.raises(SystemExit) as exit_info:
        main(["heads", "prune", "--task", "rte", "--step", "1.5"])
    assert exit_info.value.code == 2 and "between 0 and 1" in capsys.readouterr().err


def test_importance_command_on_arct_scores_warrant_pairs(tmp_path, minilm_tokenizer):
    """ARCT through the command: a one-logit head, two rows per example, the loss of each pair."""
    from bertscope.cli.main import main
    from bertscope.data.paths import seeded_sample
    from bertscope.data.readers.tasks import read_task
    from bertscope.models.loading import load_model
    from bertscope.tasks.inputs import encode_task

    require_data("arct")
    ckpt = tmp_path / "arct"
    classifier(minilm_tokenizer, num_labels=1).save_pretrained(ckpt)
    minilm_tokenizer.save_pretrained(ckpt)
    out = tmp_path / "run"
    assert main(["heads", "importance", "--model", str(ckpt), "--task", "arct", "--limit", "6", "--no-normalise",
                 "--out", str(out), "--quiet", "--no-figures"]) == 0
    rows = read(out / "importance.csv")
    results = json.loads((out / "run.json").read_text())["analyses"]["importance"]["results"]
    assert results["examples"] == 6 and results["arct_version"] == "original"
    # the same numbers from the library on the same six arguments
    loaded = load_model(ckpt, task="sequence-classification")
    task = encode_task("arct", seeded_sample(read_task("arct", "dev"), 6, 0), loaded.tokenizer, 128)
    want = head_importance(loaded, task, normalise=False, progress=False)
    got = np.array([float(r["importance_raw"]) for r in rows]).reshape(L_, H_)
    np.testing.assert_allclose(got, want.raw, rtol=1e-5)
    assert results["loss"] == pytest.approx(want.loss, rel=1e-6)
