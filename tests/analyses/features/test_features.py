"""`bertscope features` (Kovaleva et al. 4.4): the feature score on hand-built attention whose
score is known, against output_attentions maps of a tiny random BERT, and end to end."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import require_data, run_one_and_two_ranks

from bertscope.analyses.features.stats import (
    FEATURES,
    SCHEME,
    TASK_FEATURES,
    FeatureScores,
    feature_classes,
    negation_words,
    set_classes,
    word_tags,
)
from bertscope.cli.main import main
from bertscope.engine.batch import BatchContext
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import RowStats, StatsSpec
from bertscope.text.word_segments import word_segment

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = StatsSpec(offsets=(), n_key_classes=SCHEME.n_classes, entropy=False, argmax=False, column_mass=True,
                 class_mass=True)
CLS, SEP = 0, 1
NOUN = SCHEME.names.index("noun|-|-")
NOUN_SUBJ = SCHEME.names.index("noun|nsubj|-")
VERB = SCHEME.names.index("verb|-|-")
OTHER = SCHEME.n_classes - 1


# ----------------------------------------------------------------------------- word tags


def test_negation_matches_the_papers_list_in_every_tokenisation():
    # a treebank's syntactic words (do + n't), a pre-tokenizer's pieces (don ' t), curly apostrophes
    assert negation_words(["I", "do", "n't", "know"]) == [False, True, True, False]
    assert negation_words(["I", "don", "'", "t", "know"]) == [False, True, True, True, False]
    assert negation_words(["it", "wasn", "\u2019", "t", "Never"]) == [False, True, True, True, True]
    assert negation_words(["ca", "n't", "nor", "nothing", "nowhere"]) == [True] * 5
    # the list, literally: "doesn't" and "cannot" are not in it; no apostrophe, no joining
    assert negation_words(["does", "n't", "cannot"]) == [False, False, False]
    assert negation_words(["no", "t", "non", "e"]) == [False, False, False, False]


def test_word_tags_from_gold_tags_and_from_raw_text():
    tags = word_tags(["He", "did", "n't", "eat", "apples", "."], ["PRON", "AUX", "PART", "VERB", "NOUN", "PUNCT"],
                     ["nsubj", "aux", "advmod", "root", "obj", "punct"])
    assert tags == ["pron|nsubj|-", "-|-|neg", "-|-|neg", "verb|-|-", "noun|obj|-", "punct|-|-"]
    assert word_tags(["The", "car"], ["DET", "NOUN"], ["det", "nsubj:pass"])[1] == "noun|nsubj|-"  # subtypes count
    assert word_tags(["not", "...", "a"]) == ["-|-|neg", "punct|-|-", "-|-|-"]  # raw text: no POS, no relation
    classes = feature_classes()
    assert NOUN_SUBJ in classes["noun"] and NOUN_SUBJ in classes["nsubj"] and NOUN_SUBJ not in classes["obj"]
    assert OTHER not in sum(classes.values(), [])


def test_a_split_word_gives_its_class_to_every_token(minilm_tokenizer):
    segment = word_segment(["Unbelievably", "cats"], minilm_tokenizer, 16)
    set_classes(segment, word_tags(segment.words, ["ADV", "NOUN"], ["advmod", "nsubj"]), minilm_tokenizer)
    n_first = segment.word_ids.count(0)
    assert n_first > 1  # split into several word pieces
    assert segment.token_class == [CLS] + [OTHER] * n_first + [NOUN_SUBJ] * segment.word_ids.count(1) + [SEP]


# ----------------------------------------------------------------------------- hand-built attention


def context(maps: torch.Tensor, key_class: torch.Tensor, key_valid: torch.Tensor) -> BatchContext:
    """A batch whose one layer's statistics come from the given (B, H, L, L) maps."""
    rows = key_valid[:, None, :, None].double()  # (B, 1, L, 1) valid query rows
    one_hot = torch.nn.functional.one_hot(key_class, SCHEME.n_classes).double()  # (B, L, C)
    stats = RowStats(column_mass=(maps * rows).sum(-2),  # (B, H, L)
                     class_mass=torch.einsum("bhij,bjc->bhic", maps, one_hot))  # (B, H, L, C)
    B = maps.shape[0]
    return BatchContext(list(range(B)), [None] * B, {}, key_valid, key_class, SCHEME, SPEC, layers=[stats])


def one_hot_rows(B, H, L, target):
    """Maps where every row of (b, h) attends only to key target[b][h]."""
    maps = torch.zeros(B, H, L, L, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            maps[b, h, :, target[b][h]] = 1.0
    return maps


def test_a_token_receiving_all_the_attention_scores_one_and_inputs_without_the_feature_are_skipped():
    L = 6
    # input 0: [CLS] noun verb noun other [SEP]; input 1: [CLS] verb other [SEP] + 2 padding
    key_class = torch.tensor([[CLS, NOUN, VERB, NOUN, OTHER, SEP], [CLS, VERB, OTHER, SEP, OTHER, OTHER]])
    key_valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    # head 0: everything on token 3 (a noun) in input 0, on token 1 (the verb) in input 1;
    # head 1: everything on [SEP]
    maps = one_hot_rows(2, 2, L, [[3, 5], [1, 3]])
    maps[1, :, 4:] = 0  # padding rows attend nowhere
    acc = FeatureScores(1, 2, features=FEATURES)
    acc.add(context(maps, key_class, key_valid))
    f = {name: i for i, name in enumerate(acc.features)}
    score = acc.scores()[:, 0]  # (F, H)
    assert acc.n_inputs[f["noun"]] == 1 and acc.n_inputs[f["verb"]] == 2 and acc.n_inputs[f["neg"]] == 0
    assert score[f["noun"], 0] == pytest.approx(1.0)  # all 6 rows on one noun token / 6 tokens
    assert score[f["noun"], 1] == 0.0  # no noun column receives anything in head 1
    assert score[f["verb"], 0] == pytest.approx((0 + 1.0) / 2)  # input 1: 4 valid rows on the verb / 4 tokens
    assert score[f["sep"], 1] == pytest.approx(1.0)
    assert np.isnan(score[f["neg"]]).all()  # no input had the feature
    assert acc.top_shares()[f["sep"], 0, 1] == 1.0 and acc.top_shares()[f["noun"], 0, 0] == 0.5
    # Figure 7: the [CLS] row's mass on each feature
    assert acc.cls_scores()[f["noun"], 0, 0] == 1.0 and acc.cls_scores()[f["verb"], 0, 0] == 0.5
    assert acc.uniform_sum == pytest.approx(1 / 6 + 1 / 4)  # uniform attention's score of any token, summed
    assert {r["feature"] for r in acc.rows("toy")} == set(FEATURES) - {"neg", "pron", "punct", "nsubj", "obj"}


def test_the_maximum_over_several_feature_tokens_and_a_split_word():
    """Two noun tokens (say the two pieces of one split word) get 2/5 and 1/5 of the rows'
    mass: the score is the larger column, 2/5 * 5 rows / 5 tokens, not their sum."""
    key_class = torch.tensor([[CLS, NOUN, NOUN, VERB, SEP]])
    key_valid = torch.ones(1, 5, dtype=torch.bool)
    row = torch.tensor([0.2, 0.4, 0.2, 0.1, 0.1], dtype=torch.float64)
    maps = row.expand(1, 1, 5, 5).clone()
    acc = FeatureScores(1, 1)
    acc.add(context(maps, key_class, key_valid))
    f = acc.features.index
    assert acc.scores()[f("noun"), 0, 0] == pytest.approx(0.4)
    assert acc.cls_scores()[f("noun"), 0, 0] == pytest.approx(0.6)  # the [CLS] row's mass on both noun tokens
    assert acc.scores()[f("cls"), 0, 0] == pytest.approx(0.2)
    assert acc.top_shares()[f("noun"), 0, 0] == 1.0


def test_the_eager_oracle_key_that_takes_all_attention_scores_one():
    torch.manual_seed(0)
    B, H, L, D = 2, 3, 7, 4
    q = torch.ones(B, H, L, D, dtype=torch.float64)
    k = torch.zeros(B, H, L, D, dtype=torch.float64)
    k[:, :, 4] = 50.0  # key 4 wins every row by a logit of 100
    key_class = torch.tensor([[CLS, OTHER, VERB, OTHER, NOUN, OTHER, SEP]] * B)
    key_valid = torch.ones(B, L, dtype=torch.bool)
    key_valid[1, 5:] = False
    key_class[1, 5:] = OTHER
    _, stats = attention_stats_eager(q, k, k, key_valid, key_class, SPEC)
    batch = BatchContext([0, 1], [None, None], {}, key_valid, key_class, SCHEME, SPEC, layers=[stats])
    acc = FeatureScores(1, H)
    acc.add(batch)
    f = acc.features.index
    np.testing.assert_allclose(acc.scores()[f("noun")], 1.0, atol=1e-12)
    np.testing.assert_allclose(acc.scores()[f("verb")], 0.0, atol=1e-12)
    np.testing.assert_allclose(acc.cls_scores()[f("noun")], 1.0, atol=1e-12)


def test_merge_save_load(tmp_path):
    key_class = torch.tensor([[CLS, NOUN, VERB, SEP]])
    key_valid = torch.ones(1, 4, dtype=torch.bool)
    a, b, whole = FeatureScores(1, 2), FeatureScores(1, 2), FeatureScores(1, 2)
    for acc, target in ((a, [[1, 2]]), (b, [[2, 3]])):
        batch = context(one_hot_rows(1, 2, 4, target), key_class, key_valid)
        acc.add(batch)
        whole.add(batch)
        acc.batches_done += 1
    a.save(tmp_path / "a.npz")
    loaded = FeatureScores.load(tmp_path / "a.npz")
    assert loaded.batches_done == 1 and loaded.n_total == 1 and loaded.uniform_sum == 0.25
    loaded.merge(b)
    for name in FeatureScores.ARRAYS:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(whole, name))
    np.testing.assert_allclose(loaded.scores()[loaded.features.index("noun"), 0], [0.5, 0.0])
    with pytest.raises(ValueError, match="cannot merge"):
        loaded.merge(FeatureScores(1, 2, features=TASK_FEATURES))
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a feature-score checkpoint"):
        FeatureScores.load(tmp_path / "bad.npz")


# ----------------------------------------------------------------------------- a tiny model


SENTENCES = [
    (["The", "cat", "did", "n't", "chase", "unbelievably", "fast", "mice", "."],
     ["DET", "NOUN", "AUX", "PART", "VERB", "ADV", "ADJ", "NOUN", "PUNCT"],
     ["det", "nsubj", "aux", "advmod", "root", "advmod", "amod", "obj", "punct"]),
    (["She", "never", "sleeps"], ["PRON", "ADV", "VERB"], ["nsubj", "advmod", "root"]),
    (["Dogs", "bark", "!"], ["NOUN", "VERB", "PUNCT"], ["nsubj", "root", "punct"]),
]


def direct_scores(maps: list[torch.Tensor], segment, features) -> tuple[np.ndarray, np.ndarray]:
    """Score and [CLS]-row mass per (feature, layer, head) of one input, from its full maps
    (layers of (H, L, L)), written out from the paper's definition; NaN without the feature."""
    classes = feature_classes()
    token_class = segment.token_class
    L = len(token_class)
    score = np.full((len(features), len(maps), maps[0].shape[0]), np.nan)
    cls_mass = score.copy()
    for f, name in enumerate(features):
        tokens = [j for j in range(L) if token_class[j] in classes[name]]
        if not tokens:
            continue
        for layer, m in enumerate(maps):
            for h in range(m.shape[0]):
                score[f, layer, h] = max(m[h, :, j].sum().item() / L for j in tokens)
                cls_mass[f, layer, h] = sum(m[h, 0, j].item() for j in tokens)
    return score, cls_mass


@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_the_accumulator_matches_output_attentions_of_a_tiny_model(tiny_model, backend):
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.models.loading import wrap_model
    from bertscope.text.segments import collate

    eager, tokenizer = tiny_model("bert", attn_implementation="eager")
    loaded = wrap_model(tiny_model("bert")[0], tokenizer)
    segments = [set_classes(word_segment(w, tokenizer, 32, doc_id=str(i)), word_tags(w, u, d), tokenizer)
                for i, (w, u, d) in enumerate(SENTENCES)]
    acc = FeatureScores(loaded.n_layers, loaded.n_heads)
    fold(loaded, segments, SPEC, [acc], EngineOptions(batch_size=2, backend=backend, progress=False), classes=SCHEME)

    per_input = []
    for segment in segments:
        with torch.no_grad():
            out = eager(**collate([segment], tokenizer.pad_token_id), output_attentions=True)
        per_input.append(direct_scores([a[0].double() for a in out.attentions], segment, acc.features))
    scores = np.stack([s for s, _ in per_input])  # (N, F, Ly, H)
    cls = np.stack([c for _, c in per_input])
    np.testing.assert_array_equal(acc.n_inputs, (~np.isnan(scores[:, :, 0, 0])).sum(0))
    np.testing.assert_allclose(acc.scores(), np.nanmean(scores, 0), atol=1e-5)
    np.testing.assert_allclose(acc.cls_scores(), np.nanmean(cls, 0), atol=1e-5)
    assert acc.n_inputs[acc.features.index("neg")] == 2  # n't, never
    assert np.nanmax(acc.scores()) > 0.2  # not a uniform model: the check has teeth


# ----------------------------------------------------------------------------- end to end


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_command_end_to_end(tiny_checkpoint, tmp_path):
    require_data("ud-ewt", "rte")
    common = ["--model", str(tiny_checkpoint), "--limit", "6", "--batch-size", "2", "--max-len", "64", "--quiet"]
    out = tmp_path / "run"
    assert main(["features", "--data", "ewt", "--out", str(out)] + common) == 0
    assert main(["features", "--data", "rte", "--out", str(out)] + common) == 0  # adds to the same run
    rows = read_csv(out / "features_scores.csv")
    assert set(rows[0]) == {"data", "feature", "layer", "head", "score", "cls_mass", "top_share", "n_inputs"}
    assert {r["data"] for r in rows} == {"ewt", "rte"}
    assert {r["feature"] for r in rows if r["data"] == "ewt"} >= {"cls", "sep", "noun", "verb", "nsubj"}
    assert {r["feature"] for r in rows if r["data"] == "rte"} <= set(TASK_FEATURES)
    assert all(0 <= float(r["score"]) <= 1 and 0 <= float(r["cls_mass"]) <= 1 for r in rows)
    assert {int(r["n_inputs"]) for r in rows if r["feature"] in ("cls", "sep")} == {6}
    assert len(rows) % (2 * 4) == 0  # tiny model: 2 layers x 4 heads per feature
    assert {int(r["layer"]) for r in read_csv(out / "features_cls_last_layer.csv")} == {2}
    record = json.loads((out / "run.json").read_text())["analyses"]["features"]
    assert record["status"] == "complete" and record["results"]["rte"]["inputs"] == 6
    assert record["results"]["ewt"]["used"] == 6
    assert {"fig_features_ewt.png", "fig_features_rte.png", "fig_features_cls_last_layer.png",
            "features_rte.npz"} <= set(record["outputs"])
    assert all((out / name).is_file() for name in record["outputs"])

    # the report section: one table row per (data, feature), every figure claimed
    from bertscope.report.writer import build_sections

    section = dict(build_sections(out))["features"]
    features_seen = {(r["data"], r["feature"]) for r in rows}
    assert len(section.tables[0].rows) == len(features_seen)
    assert section.findings[0].startswith("ewt: in ") and "of 8 heads" in section.findings[0]
    assert "other_figures" not in dict(build_sections(out))


def test_command_resumes_an_interrupted_run_to_the_same_numbers(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    require_data("ud-ewt")
    import bertscope.analyses.features.command as command

    common = ["--model", str(tiny_checkpoint), "--data", "ewt", "--limit", "6", "--batch-size", "2", "--quiet"]
    assert main(["features", "--out", str(tmp_path / "a")] + common) == 0
    # checkpoints after every batch; the run is stopped in its third (last) batch
    monkeypatch.setattr(command, "CHECKPOINT_EVERY", 1)
    real_add, calls, state = FeatureScores.add, [], {"stop": True}

    def add(self, batch):
        calls.append(batch.number)
        if state["stop"] and len(calls) == 3:
            raise KeyboardInterrupt
        real_add(self, batch)

    monkeypatch.setattr(FeatureScores, "add", add)
    assert main(["features", "--out", str(tmp_path / "b")] + common) == 130  # Ctrl-C
    assert FeatureScores.load(tmp_path / "b" / "features_ewt.npz").batches_done == 2
    state["stop"], calls[:] = False, []
    assert main(["features", "--resume", str(tmp_path / "b"), "--quiet"]) == 0
    assert calls == [3]  # only the batch not done yet ran
    a, b = read_csv(tmp_path / "a" / "features_scores.csv"), read_csv(tmp_path / "b" / "features_scores.csv")
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert ra["feature"] == rb["feature"]
        assert float(ra["score"]) == pytest.approx(float(rb["score"]), abs=1e-12)
    # per-rank checkpoints: a run resumes only with the number of processes it started with
    run_json = tmp_path / "b" / "run.json"
    record = json.loads(run_json.read_text())
    record["analyses"]["features"]["world_size"] = 2
    run_json.write_text(json.dumps(record))
    assert main(["features", "--resume", str(tmp_path / "b"), "--quiet"]) == 2
    assert "started with 2 processes" in capsys.readouterr().err


def test_command_user_errors(tiny_checkpoint, tmp_path, capsys):
    assert main(["features", "--resume", str(tmp_path / "nothing")]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert main(["features", "--model", str(tiny_checkpoint), "--data-dir", str(tmp_path / "none"), "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("bertscope: error:")


@pytest.mark.full  # tests/tiers.py
def test_two_torchrun_ranks_equal_one_process(tiny_checkpoint, tmp_path):
    require_data("ud-ewt")
    args = ["features", "--model", str(tiny_checkpoint), "--data", "ewt", "--limit", "8", "--batch-size", "2",
            "--quiet", "--no-figures"]
    run_one_and_two_ranks(args, tmp_path, port=29541)
    halves = [FeatureScores.load(tmp_path / "two" / f"features_ewt.rank{r}.npz") for r in (0, 1)]
    assert [h.n_total for h in halves] == [4, 4]
    one, two = FeatureScores.load(tmp_path / "one" / "features_ewt.npz"), FeatureScores.load(tmp_path / "two" /
                                                                                           "features_ewt.npz")
    assert one.n_total == two.n_total == 8 and two.uniform_sum == pytest.approx(one.uniform_sum, rel=1e-12)
    for name in FeatureScores.ARRAYS:
        np.testing.assert_allclose(getattr(two, name), getattr(one, name), rtol=1e-9, atol=1e-12)
    assert read_csv(tmp_path / "one" / "features_scores.csv") == read_csv(tmp_path / "two" / "features_scores.csv")
