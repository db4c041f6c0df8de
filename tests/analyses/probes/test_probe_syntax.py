"""`bertscope probe syntax`: per-head dependency accuracy on planted maps and hand trees,
then end to end on a few UD-EWT sentences with the tiny random BERT."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import require_data

from bertscope.analyses.probes.syntax.stats import (
    ALL,
    OFFSETS,
    SyntaxCounts,
    format_table,
    sentence_dependents,
    summarise,
    word_predictions,
)
from bertscope.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")

# "the cat sat on the mat": heads 1-based (0 = root), UD labels
WORDS = ["the", "cat", "sat", "on", "the", "mat"]
HEADS = [2, 3, 0, 6, 6, 3]
DEPRELS = ["det", "nsubj", "root", "case", "det", "obl"]
N = len(WORDS)
CLS, SEP = N, N + 1  # specials come after the words in a word-level map


def planted_maps(rows_by_head: list[dict[int, dict[int, float]]]) -> np.ndarray:
    """(1, H, N+2, N+2) maps; each row's listed cells get their values, the rest of the row's
    mass goes to [CLS], so every row sums to 1."""
    maps = np.zeros((1, len(rows_by_head), N + 2, N + 2))
    for h, rows in enumerate(rows_by_head):
        for i in range(N + 2):
            for j, value in rows.get(i, {}).items():
                maps[0, h, i, j] = value
            maps[0, h, i, CLS] += 1 - maps[0, h, i].sum()
    return maps


def score(maps: np.ndarray, head_to_dep: str = "column", heads=HEADS, deprels=DEPRELS):
    counts = SyntaxCounts(sorted(set(deprels) - {"root"}), maps.shape[0], maps.shape[1], head_to_dep=head_to_dep)
    counts.add_sentence(*word_predictions(maps, len(heads)), *sentence_dependents(heads, deprels))
    _, table = summarise(counts, "toy")
    return {(row["relation"], row["direction"]): row for row in table}


def test_gold_heads_planted_in_one_head():
    """Head 1 puts most of each word's (non-self, non-special) attention on its gold head,
    but even more on itself and on [CLS]; head 2 always looks at the previous word."""
    gold = {i: {i: 0.4, HEADS[i] - 1: 0.2, SEP: 0.1} for i in range(N) if HEADS[i]}
    gold[2] = {2: 0.9, 0: 0.01}  # the root
    previous = {i: {(i - 1) % N: 0.8} for i in range(N)}  # the first word looks at the last
    table = score(planted_maps([gold, previous]))
    for relation in ("det", "nsubj", "case", "obl", ALL):
        assert table[relation, "dep->head"]["best_head"] == "1-1"
        assert table[relation, "dep->head"]["accuracy"] == 1.0
    assert table[ALL, "dep->head"]["n"] == 5  # the root is not scored
    # the best fixed offsets: det +1 (both), nsubj +1, case +2 (on -> mat), obl -3 (mat -> sat)
    expected = {"det": ("+1", 1.0), "nsubj": ("+1", 1.0), "case": ("+2", 1.0), "obl": ("-3", 1.0)}
    for relation, (offset, accuracy) in expected.items():
        assert (table[relation, "dep->head"]["baseline_offset"], table[relation, "dep->head"]["baseline_accuracy"]) \
            == (offset, accuracy)
        assert table[relation, "head->dep"]["baseline_offset"] == offset  # one baseline per relation
    # "all": right-branching (+1) gets det, det, nsubj of the 5 dependents
    assert (table[ALL, "dep->head"]["baseline_offset"], table[ALL, "dep->head"]["baseline_accuracy"]) == ("+1", 0.6)
    # the previous-word head gets none of them
    heads_rows, _ = summarise(_counts(planted_maps([gold, previous])), "toy")
    prev_all = [r for r in heads_rows if r["relation"] == ALL and r["direction"] == "dep->head" and r["head"] == 2]
    assert prev_all[0]["accuracy"] == 0.0


def _counts(maps):
    counts = SyntaxCounts(sorted(set(DEPRELS) - {"root"}), 1, maps.shape[1])
    counts.add_sentence(*word_predictions(maps, N), *sentence_dependents(HEADS, DEPRELS))
    return counts


def test_self_and_specials_are_never_predicted():
    maps = np.zeros((1, 1, N + 2, N + 2))
    maps[0, 0, :, CLS] = 0.5
    maps[0, 0, :, SEP] = 0.3
    maps[0, 0, np.arange(N + 2), np.arange(N + 2)] += 0.15
    maps[0, 0, :N, 4] += 0.05  # the only other word with any mass: word 4
    row, column = word_predictions(maps, N)
    assert row[0, 0].tolist() == [4, 4, 4, 4, 0, 4]  # word 4 itself: all others tie at 0 -> lowest index
    assert row.shape == column.shape == (1, 1, N)
    # a one-word sentence has no other word
    row, column = word_predictions(maps[:, :, :3, :3], 1)
    assert row.tolist() == [[[-1]]] and column.tolist() == [[[-1]]]


def test_head_to_dependent_column_and_row():
    """Head words attend to their dependents; dependents (leaves) attend to [SEP] only.
    `mat` has two dependents (on 0.4, the 0.3) and `sat` two (cat 0.3, mat 0.5)."""
    rows = {1: {0: 0.6}, 2: {1: 0.3, 5: 0.5}, 5: {3: 0.4, 4: 0.3}, 0: {SEP: 1.0}, 3: {SEP: 1.0}, 4: {SEP: 1.0}}
    maps = planted_maps([rows])
    # column (Clark et al.'s transposed map): the word attending most to each dependent is its head
    column = score(maps, "column")
    for relation in ("det", "nsubj", "case", "obl", ALL):
        assert column[relation, "head->dep"]["accuracy"] == 1.0
    # row: the head word's own most-attended word must be the dependent; each head word
    # picks one: cat -> the (right), sat -> mat (so nsubj cat is wrong), mat -> on (so det the is wrong)
    row = score(maps, "row")
    assert row["det", "head->dep"]["accuracy"] == 0.5
    assert row["nsubj", "head->dep"]["accuracy"] == 0.0
    assert row["case", "head->dep"]["accuracy"] == 1.0
    assert row["obl", "head->dep"]["accuracy"] == 1.0
    assert row[ALL, "head->dep"]["accuracy"] == 0.6
    with pytest.raises(ValueError):
        SyntaxCounts(["det"], 1, 1, head_to_dep="diagonal")


def test_possessive_clitic_reads_the_s_word():
    # John 's dog barked: nmod:poss(dog, John), case(John, 's), nsubj(barked, dog)
    heads, deprels = [3, 1, 4, 0], ["nmod:poss", "case", "nsubj", "root"]
    source, head, relations = sentence_dependents(heads, deprels)
    assert relations == ["nmod:poss", "case", "nsubj"]
    assert source.tolist() == [1, 1, 2] and head.tolist() == [2, 0, 3]
    source, _, _ = sentence_dependents(heads, deprels, poss_clitic=False)
    assert source.tolist() == [0, 1, 2]
    # "his dog": no clitic, the possessor itself is read
    assert sentence_dependents([2, 0], ["nmod:poss", "root"])[0].tolist() == [0]


def test_counts_add_up_over_sentences_and_offsets_leave_the_sentence():
    counts = SyntaxCounts(["det", "nsubj"], 1, 1)
    # two-word sentences: "dogs bark" (nsubj +1), "the dog" (det +1)
    for heads, deprels in (([2, 0], ["nsubj", "root"]), ([2, 0], ["det", "root"])):
        maps = np.zeros((1, 1, 4, 4))
        maps[0, 0, :, 1] = 1.0  # everything on word 1: word 0 predicts 1, word 1 predicts 0
        counts.add_sentence(*word_predictions(maps, 2), *sentence_dependents(heads, deprels))
    assert counts.n.tolist() == [1, 1]
    assert counts.correct[:, 0, 0, 0].tolist() == [1, 1]
    assert counts.baseline[:, OFFSETS.index(1)].tolist() == [1, 1]
    assert counts.baseline[:, OFFSETS.index(-1)].tolist() == [0, 0]  # word 0 - 1 is outside


def test_format_table_leaves_out_rare_relations():
    gold = {i: {HEADS[i] - 1: 0.5} for i in range(N) if HEADS[i]}
    counts = _counts(planted_maps([gold]))
    _, table = summarise(counts, "toy")
    text = format_table(table, min_count=2)
    assert "det" in text.splitlines()[3] and "1-1" in text
    assert "fewer than 2 dependents" in text and "nsubj (1)" in text and "case (1)" in text
    assert text.splitlines()[2].startswith("all (non-root)")


# --- end to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ewt_available():
    require_data("ud-ewt")


def test_row_predictions_are_the_engines_word_argmax(tiny_checkpoint, ewt_available):
    """`word_predictions`' row argmax is exactly `RowStats.word_argmax` of the engine."""
    import torch

    from bertscope.data.readers.treebank import read_ewt_dev
    from bertscope.engine.loop import stream_batches
    from bertscope.kernels.spec import StatsSpec
    from bertscope.models.loading import load_model
    from bertscope.text.word_segments import word_segment

    loaded = load_model(str(tiny_checkpoint))
    segments = [word_segment(s.words, loaded.tokenizer, 128) for s in read_ewt_dev()[:6]]
    spec = StatsSpec(offsets=(), n_key_classes=len(loaded.class_names), entropy=False, argmax=False,
                     word_maps=True, class_mass=True)
    checked = 0
    for ctx in stream_batches(loaded, segments, spec, "mean", batch_size=4, progress=False):
        batch, layers = ctx.indices, ctx.layers
        maps = torch.stack([s.word_map for s in layers], dim=1).float().numpy()  # (B, layers, H, W, W)
        argmax = torch.stack([s.word_argmax for s in layers], dim=1).numpy()  # (B, layers, H, W)
        for b, i in enumerate(batch):
            n = len(segments[i].words)
            row, _ = word_predictions(maps[b], n)
            np.testing.assert_array_equal(row, argmax[b, :, :, :n])
            checked += 1
    assert checked == 6


def test_cli_end_to_end(tiny_checkpoint, ewt_available, tmp_path):
    from bertscope.data.paths import seeded_sample
    from bertscope.data.readers.treebank import read_ewt_dev
    from bertscope.models.loading import load_model
    from bertscope.text.word_segments import word_segment

    out = tmp_path / "run"
    args = ["probe", "syntax", "--model", str(tiny_checkpoint), "--limit", "40", "--max-len", "24",
            "--min-count", "5", "--out", str(out), "--quiet"]
    assert main(args) == 0
    files = {p.name for p in out.iterdir()}
    assert {"run.json", "syntax_heads.csv", "syntax_table.csv", "syntax_table.txt",
            "syntax_best_heads_ewt.png", "syntax_heatmaps_ewt.png"} <= files

    # sentences longer than --max-len tokens are skipped and counted
    tokenizer = load_model(str(tiny_checkpoint)).tokenizer
    sample = seeded_sample(read_ewt_dev(), 40, 0)
    scored = [s for s in sample if any(h != 0 for h in s.heads)]
    long = sum(word_segment(s.words, tokenizer, 24) is None for s in scored)
    result = json.loads((out / "run.json").read_text())["analyses"]["syntax"]
    assert result["status"] == "complete"
    ewt = result["results"]["ewt"]
    assert ewt["sentences"] == 40 and long > 0
    assert ewt["skipped_long"] == long and ewt["used"] == len(scored) - long
    expected_deps = sum(sum(h != 0 for h in s.heads) for s in scored if word_segment(s.words, tokenizer, 24))
    assert ewt["dependents"] == expected_deps

    with open(out / "syntax_heads.csv", newline="") as f:
        heads = list(csv.DictReader(f))
    assert set(heads[0]) == {"treebank", "relation", "sd_label", "direction", "layer", "head", "accuracy", "n"}
    relations = {r["relation"] for r in heads}
    assert len(heads) == len(relations) * 2 * 2 * 4  # relations x directions x layers x heads (tiny: 2 x 4)
    all_rows = [r for r in heads if r["relation"] == "all"]
    assert {int(r["n"]) for r in all_rows} == {expected_deps}
    assert all(0 <= float(r["accuracy"]) <= 1 for r in heads)
    with open(out / "syntax_table.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(relations) * 2
    det = next(r for r in table if r["relation"] == "det")
    assert det["sd_label"] == "det" and det["baseline_offset"] in {f"{k:+d}" for k in OFFSETS}
    best = max(float(r["accuracy"]) for r in all_rows if r["direction"] == "dep->head")
    assert float(next(r for r in table if r["relation"] == "all")["accuracy"]) == best
    assert "all (non-root)" in (out / "syntax_table.txt").read_text()


def test_cli_user_mistakes(tiny_checkpoint, tmp_path, capsys):
    code = main(["probe", "syntax", "--model", str(tiny_checkpoint), "--data-dir", str(tmp_path / "none"),
                 "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bertscope: error: ") and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # the data are read before the run directory is made


def test_counts_merge_save_and_load_like_any_accumulator(tmp_path):
    """Two halves merged equal the whole; a saved state loads back equal (resume, torchrun)."""
    rng = np.random.default_rng(3)
    sentences = []
    for _ in range(6):
        n = int(rng.integers(3, 9))
        heads = [0] + [int(rng.integers(1, n + 1)) for _ in range(n - 1)]  # word 1 is the root
        heads = [h if h != i + 1 else 0 for i, h in enumerate(heads)]
        deprels = ["root" if h == 0 else str(rng.choice(["det", "nsubj", "obj"])) for h in heads]
        maps = rng.random((2, 3, n + 2, n + 2))
        sentences.append((maps / maps.sum(-1, keepdims=True), heads, deprels))

    def counts_of(part):
        counts = SyntaxCounts(["det", "nsubj", "obj"], 2, 3)
        for maps, heads, deprels in part:
            counts.add_sentence(*word_predictions(maps, len(heads)), *sentence_dependents(heads, deprels))
        return counts

    whole, merged = counts_of(sentences), counts_of(sentences[:2]).merge(counts_of(sentences[2:]))
    assert whole.n.sum() > 10 and whole.correct.sum() > 0
    for name in ("correct", "baseline", "n"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(whole, name))
    whole.batches_done = 4
    whole.save(tmp_path / "syntax.npz")
    back = SyntaxCounts.load(tmp_path / "syntax.npz")
    assert (back.relations, back.head_to_dep, back.batches_done) == (whole.relations, "column", 4)
    np.testing.assert_array_equal(back.correct, whole.correct)
    with pytest.raises(ValueError, match="cannot merge"):
        whole.merge(SyntaxCounts(["det"], 2, 3))
