"""Attention-based probing classifiers (Clark et al. 2019, section 5): hand-built sentences
where the answer is known, the training loop's early stopping and determinism, and one
end-to-end `bertscope probe classifier` run with the tiny random BERT."""
import json

import numpy as np
import pytest
import torch
from conftest import require_data

from bertscope.analyses.probes.classifier import stats as clf

K_LAYERS, K_HEADS = 2, 3
K = K_LAYERS * K_HEADS
PLANTED = 4  # the head (layer 2, head 2) whose dependent -> head attention is the gold tree


def planted_sentence(rng, n: int) -> clf.ProbeExample:
    """A random tree over n words and K random maps, except map PLANTED: each word puts all
    its attention on its gold head ([SEP] for the root)."""
    heads = rng.integers(0, n + 1, size=n)
    for j in range(n):
        while heads[j] == j + 1:  # no word heads itself
            heads[j] = rng.integers(0, n + 1)
    W = n + 2  # words, [CLS], [SEP]
    maps = rng.random((K, W, W))
    maps /= maps.sum(-1, keepdims=True)
    planted = np.full((W, W), 1.0 / W)
    for j, h in enumerate(heads):
        planted[j] = 0
        planted[j, h - 1 if h > 0 else W - 1] = 1
    maps[PLANTED] = planted
    return clf.make_example(heads, ["x"] * n, rng.random((n, 4)), maps)


def planted_data(seed=0, n_train=120, n_heldout=30):
    rng = np.random.default_rng(seed)
    make = lambda count: [planted_sentence(rng, int(rng.integers(2, 10))) for _ in range(count)]  # noqa: E731
    return make(n_train), make(n_heldout)


@pytest.fixture(autouse=True)
def one_thread(single_thread):
    pass


# --- features ----------------------------------------------------------------------------------


def test_batch_features_follow_the_paper_directions():
    """Column i + 1 of row j holds a^k_ij (from candidate i to dependent j) in channel k and
    a^k_ji in channel K + k; the ROOT features are j's attention with [CLS] and [SEP]."""
    n, W = 3, 5
    maps = np.arange(2 * W * W, dtype=np.float64).reshape(2, W, W) / 100  # 2 heads, distinct entries
    example = clf.make_example([2, 0, 2], ["det", "root", "punct"], np.zeros((n, 4)), maps)
    batch = clf.make_batch([example])
    a = torch.from_numpy(example.maps).float()
    for j in range(n):
        for i in range(n):
            for k in range(2):
                assert batch.attn[0, j, i + 1, k] == a[k, i, j]
                assert batch.attn[0, j, i + 1, 2 + k] == a[k, j, i]
        for k in range(2):
            assert batch.root_attn[0, j, 0, k] == a[k, n, j]  # [CLS] -> j
            assert batch.root_attn[0, j, 1, k] == a[k, W - 1, j]  # [SEP] -> j
            assert batch.root_attn[0, j, 0, 2 + k] == a[k, j, n]  # j -> [CLS]
            assert batch.root_attn[0, j, 1, 2 + k] == a[k, j, W - 1]  # j -> [SEP]
    # ROOT and every other word are candidates, never the word itself
    assert batch.cand_valid[0].tolist() == [[True, False, True, True], [True, True, False, True],
                                            [True, True, True, False]]
    assert batch.heads[0].tolist() == [2, 0, 2]
    assert batch.scored[0].tolist() == [True, True, False]


def test_padding_rows_and_columns_are_masked():
    rng = np.random.default_rng(1)
    batch = clf.make_batch([planted_sentence(rng, 2), planted_sentence(rng, 4)])
    assert batch.heads[0].tolist()[2:] == [-100, -100]
    assert not batch.cand_valid[0, :, 3:].any()  # columns of words 3 and 4, absent in sentence 0
    logits = clf.AttentionOnlyProbe(K)(batch)
    assert torch.isinf(logits[0, 0, 3:]).all()


def test_distance_features():
    f = clf.distance_features(4)  # (N, N + 1, F)
    assert f.shape == (4, 5, clf.N_DISTANCE)
    assert f[:, 0, -1].tolist() == [1, 1, 1, 1] and f[:, 1:, -1].sum() == 0  # ROOT indicator
    # dependent 1, candidate 2 (column 3): one word to the right
    assert f[1, 3, 0] == pytest.approx(0.1) and f[1, 3, 1] == 0
    assert f[1, 3, 2:8].tolist() == [0, 0, 0, 1, 0, 0]
    # dependent 3, candidate 0: three words to the left
    assert f[3, 1, 1] == pytest.approx(0.3) and f[3, 1, 2:8].tolist() == [1, 0, 0, 0, 0, 0]


# --- probes on a planted tree ----------------------------------------------------------------------


def test_attention_only_probe_finds_the_planted_head():
    train, heldout = planted_data()
    probe = clf.AttentionOnlyProbe(K)
    result = clf.train_probe(probe, train, heldout, epochs=15, patience=15, lr=0.1, max_cells=200)
    assert result.best_heldout_uas == 1.0
    score = clf.attachment(clf.predict(probe, heldout), heldout)
    assert score.uas == 1.0 and score.uas_all == 1.0
    weights = torch.cat([probe.w, probe.u]).detach()
    assert int(weights.argmax()) == K + PLANTED  # u: the planted head's dependent -> head attention
    weights[K + PLANTED] = float("-inf")
    assert probe.u[PLANTED] > 2 * weights.max()  # and by a margin


def test_attention_and_words_probe_fits_the_planted_tree():
    train, heldout = planted_data()
    probe = clf.AttentionAndWordsProbe(K, 4)
    clf.train_probe(probe, train, heldout, epochs=10, patience=10, lr=0.1, max_cells=200)
    assert clf.attachment(clf.predict(probe, heldout), heldout).uas == 1.0


def test_distances_probe_learns_a_fixed_offset():
    """Every word's head is the next word (the last word is the root): distances alone suffice."""
    rng = np.random.default_rng(2)
    examples = []
    for _ in range(60):
        n = int(rng.integers(2, 9))
        examples.append(clf.make_example(clf.right_branching(n), ["x"] * n, rng.random((n, 4))))
    probe = clf.DistancesGloveProbe(4, hidden=16)
    clf.train_probe(probe, examples[:50], examples[50:], epochs=20, patience=20, lr=0.05, max_cells=200)
    assert clf.attachment(clf.predict(probe, examples[50:]), examples[50:]).uas == 1.0


# --- baselines and scores ----------------------------------------------------------------------------


def test_right_branching_on_a_hand_sentence():
    # "The cat sat ." : The -> cat, cat -> sat, sat = root, . -> sat
    example = clf.make_example([2, 3, 0, 3], ["det", "nsubj", "root", "punct"], np.zeros((4, 1)))
    predicted = clf.right_branching(4)
    assert predicted.tolist() == [2, 3, 4, 0]
    score = clf.attachment([predicted], [example])
    assert (score.correct, score.total) == (2, 3)  # punctuation left out
    assert (score.correct_all, score.total_all) == (2, 4)
    assert score.uas == pytest.approx(2 / 3)
    assert clf.right_branching(1).tolist() == [0]


def test_split_heldout():
    train, heldout = clf.split_heldout(50, 0.1, seed=3)
    assert len(heldout) == 5 and len(train) == 45
    assert sorted(train + heldout) == list(range(50))
    assert clf.split_heldout(50, 0.1, seed=3) == (train, heldout)
    assert clf.split_heldout(50, 0.1, seed=4) != (train, heldout)
    assert clf.split_heldout(2, 0.1, seed=0)[1] and clf.split_heldout(2, 0.1, seed=0)[0]


# --- the training loop -----------------------------------------------------------------------------------


def test_early_stopping_keeps_the_best_epoch(monkeypatch):
    """Held-out UAS 0.5, 0.7, 0.6, 0.65 with patience 2: training stops after epoch 4 and the
    probe is left with epoch 2's weights."""
    train, heldout = planted_data(n_train=20, n_heldout=5)
    scripted = iter([0.5, 0.7, 0.6, 0.65, 0.9, 0.9])
    snapshots = []

    def fake_attachment(predicted, examples):
        snapshots.append(probe.u.detach().clone())
        uas = next(scripted)
        return clf.Attachment(round(uas * 100), 100, 0, 0)

    monkeypatch.setattr(clf, "attachment", fake_attachment)
    probe = clf.AttentionOnlyProbe(K)
    result = clf.train_probe(probe, train, heldout, epochs=6, patience=2, lr=0.1, max_cells=200)
    assert result.best_epoch == 2
    assert result.best_heldout_uas == pytest.approx(0.7)
    assert [h["epoch"] for h in result.history] == [1, 2, 3, 4]
    assert [h["heldout_uas"] for h in result.history] == pytest.approx([0.5, 0.7, 0.6, 0.65])
    assert torch.equal(probe.u.detach(), snapshots[1])
    assert not torch.equal(snapshots[1], snapshots[3])  # training did move the weights after epoch 2


def test_training_is_deterministic_for_a_seed():
    train, heldout = planted_data(n_train=40, n_heldout=10)

    def fit(seed):
        probe = clf.AttentionAndWordsProbe(K, 4)
        result = clf.train_probe(probe, train, heldout, epochs=3, lr=0.05, max_cells=100, seed=seed)
        return result.history, [p.detach().clone() for p in probe.parameters()]

    history_a, params_a = fit(0)
    history_b, params_b = fit(0)
    assert history_a == history_b
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    _, params_c = fit(1)  # another seed: another batch order
    assert not all(torch.equal(a, c) for a, c in zip(params_a, params_c))


def test_batches_group_similar_lengths_under_the_cell_budget():
    rng = np.random.default_rng(5)
    examples = [clf.make_example([0] * n, ["x"] * n, np.zeros((n, 1))) for n in rng.integers(1, 30, size=100)]
    batches = clf.batches_by_length(examples, max_cells=300)
    assert sorted(i for b in batches for i in b) == list(range(100))
    for b in batches:
        longest = max(examples[i].n_words for i in b)
        assert len(b) == 1 or len(b) * longest * (longest + 1) <= 300


# --- end to end -----------------------------------------------------------------------------------------


def data_or_skip():
    require_data("gum", "ud-ewt", glove=True)


def test_cli_end_to_end(tiny_checkpoint, tmp_path, capsys):
    data_or_skip()
    from bertscope.cli.main import main

    out = tmp_path / "run"
    code = main(["probe", "classifier", "--model", str(tiny_checkpoint), "--limit-train", "30", "--limit-eval", "12",
                 "--epochs", "2", "--out", str(out), "--quiet"])
    assert code == 0
    assert capsys.readouterr().out == ""  # --quiet
    rows = (out / "classifier_table.csv").read_text().splitlines()
    assert rows[0].startswith("model,uas,uas_with_punct,n_words")
    models = [r.split(",")[0] for r in rows[1:]]
    assert models == ["Right-branching", "Distances + GloVe", "Random Init Attn + GloVe", "Attn", "Attn + GloVe"]
    record = json.loads((out / "run.json").read_text())["analyses"]["classifier"]
    assert record["status"] == "complete"
    results = record["results"]
    assert results["sentences"]["eval"] == 12 and results["sentences"]["train"] + results["sentences"]["heldout"] == 30
    assert 0 <= results["uas"]["Attn"]["uas"] <= 100
    assert set(results["curves"]) == {"Distances + GloVe", "Attn", "Attn + GloVe", "Random Init Attn + GloVe"}
    assert all(1 <= len(c) <= 2 for c in results["curves"].values())
    assert len((out / "classifier_attn_weights.csv").read_text().splitlines()) == 1 + 2 * 4  # 2 layers x 4 heads
    for name in ("classifier_table.txt", "fig_classifier_training.png", "fig_classifier_head_weights.png"):
        assert (out / name).is_file()


def test_cli_rejects_a_bad_heldout_fraction(tiny_checkpoint, tmp_path, capsys):
    from bertscope.cli.main import main

    code = main(["probe", "classifier", "--model", str(tiny_checkpoint), "--heldout", "1.5",
                 "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 2
    assert "--heldout" in capsys.readouterr().err
