"""`bertscope relations`: hand-built word maps with known scores, the accumulator against the
model's own attention maps, and the command end to end on real EWT/GUM sentences."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import interrupt_on_call, require_data, run_one_and_two_ranks

from bertscope.analyses.relations import stats as rel
from bertscope.cli.main import main
from bertscope.data.readers.coref import CorefDocument, Mention

pytestmark = pytest.mark.usefixtures("single_thread")

L, H = 2, 3  # layers, heads of the hand-built maps


def uniform_maps(W: int) -> np.ndarray:
    return np.full((L, H, W, W), 1.0 / W)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- gold links and their filters --------------------------------------------------------


def test_relation_links_filters():
    # "He was becoming agitated": he <-nsubj- agitated is 3 words away; "was" (aux) is not core
    heads, deprels = [4, 4, 4, 0], ["nsubj", "aux", "cop", "root"]
    assert rel.relation_links(heads, deprels) == [("nsubj", 3, 0)]
    # a pair 1 word apart is dropped, one 2 apart kept; obl:tmod is not core
    heads, deprels = [2, 0, 2, 5, 2, 2], ["nsubj", "root", "obj", "case", "obl", "obl:tmod"]
    assert rel.relation_links(heads, deprels) == [("obl", 1, 4)]
    assert rel.relation_links(heads, deprels, min_distance=1) == [("nsubj", 1, 0), ("obj", 1, 2), ("obl", 1, 4)]
    # 12 words are kept, 13 dropped (None), whatever the links
    twelve = ([2, 0] + [2] * 10, ["nsubj", "root"] + ["obl"] * 10)
    assert len(rel.relation_links(*twelve)) == 9  # words 4..12 are 2+ from word 2
    assert rel.relation_links([2, 0] + [2] * 11, ["nsubj", "root"] + ["obl"] * 11) is None


def test_control_pairs_are_unrelated_words_at_the_links_distance():
    import random

    # The old man saw a dog in the park .   saw(4) <- nsubj man(3), obj dog(6), obl park(9)
    heads = [3, 3, 4, 0, 6, 4, 9, 9, 4, 4]
    upos = ["DET", "ADJ", "NOUN", "VERB", "DET", "NOUN", "ADP", "DET", "NOUN", "PUNCT"]
    deprels = ["det", "amod", "nsubj", "root", "det", "obj", "case", "det", "obl", "punct"]
    links = rel.relation_links(heads, deprels)
    assert links == [("obj", 3, 5), ("obl", 3, 8)]  # nsubj "man" is next to "saw": dropped
    for seed in range(20):
        pairs = rel.control_links(heads, upos, links, random.Random(seed))
        # never a dependent of "saw" (man, dog, park, '.'), never punctuation, never adjacent ("a");
        # the same distance when possible: 2 from "saw" is "old"(1) only; 5 from "saw": none -> any free word
        assert pairs[0] == (3, 1)
        assert pairs[1][0] == 3 and pairs[1][1] in (0, 1, 6, 7)
    seen = {rel.control_links(heads, upos, links, random.Random(seed))[1][1] for seed in range(40)}
    assert seen == {0, 1, 6, 7}
    # a seeded generator draws the same pairs again (resume)
    assert rel.control_links(heads, upos, links, random.Random("0:s1")) == rel.control_links(
        heads, upos, links, random.Random("0:s1"))


def test_verb_subject_needs_a_verb_head():
    # "She is happy": nsubj of an ADJ predicate is no verb -> subject link; "Dogs bark" is
    assert rel.verb_subject_links([3, 3, 0], ["nsubj", "cop", "root"], ["PRON", "AUX", "ADJ"], offset=1) == []
    assert rel.verb_subject_links([2, 0], ["nsubj", "root"], ["NOUN", "VERB"], offset=1) == [(1, 0)]
    # 0-based document heads (-1 = root), passive subjects count
    assert rel.verb_subject_links([2, 2, -1], ["nsubj:pass", "aux:pass", "root"], ["NOUN", "AUX", "VERB"]) == [(2, 0)]


def test_pronoun_antecedent_is_the_nearest_noun_mention():
    # The dog saw Mary . It barked ; it slept .     entity d: dog, It, it ; entity m: Mary
    words = ["The", "dog", "saw", "Mary", ".", "It", "barked", ";", "it", "slept", "."]
    upos = ["DET", "NOUN", "VERB", "PROPN", "PUNCT", "PRON", "VERB", "PUNCT", "PRON", "VERB", "PUNCT"]
    mentions = [Mention(0, 2, "d", 1, "nominal"), Mention(3, 4, "m", 3, "proper"),
                Mention(5, 6, "d", 5, "pronoun", sentence=1), Mention(8, 9, "d", 8, "pronoun", sentence=1)]
    doc = CorefDocument("x", "", words, upos, [-1] * len(words), [(0, 5), (5, 11)], mentions)
    # both pronouns link to "dog" (the pronoun "It" in between is passed over), never to "Mary"
    assert rel.pronoun_antecedent_links(doc) == [(5, 1), (8, 1)]
    # in a window without the noun mention there is no antecedent
    assert rel.pronoun_antecedent_links(doc.window(5, 11)) == []


# --- scores on hand-built maps ------------------------------------------------------------


def test_verb_attending_only_to_its_subject_scores_one():
    W = 5
    maps = uniform_maps(W)
    maps[1, 2, 3] = 0.0
    maps[1, 2, 3, 0] = 1.0  # head 2-3: the verb (word 3) puts all its attention on its subject (word 0)
    scores = rel.LinkScores(list(rel.TOKEN_GROUPS), L, H, unit="link")
    scores.add_maps(maps, rel.token_input({rel.VERB_SUBJECT: [(3, 0)]}))
    means = scores.means()
    vs, far = rel.TOKEN_GROUPS.index(rel.VERB_SUBJECT), rel.TOKEN_GROUPS.index(rel.VERB_SUBJECT + "_far")
    assert means[vs, 1, 2] == 1.0 and means[far, 1, 2] == 1.0  # 3 words apart: also a "far" link
    other = np.ones((L, H), dtype=bool)
    other[1, 2] = False
    np.testing.assert_allclose(means[vs][other], 1 / W)
    assert list(scores.n) == [1, 1, 0, 0]
    assert np.isnan(means[2]).all()  # no pronoun links: NaN, never 0
    # directed: the subject attending to the verb does not count for verb -> subject
    maps = uniform_maps(W)
    maps[0, 0, 0] = 0.0
    maps[0, 0, 0, 3] = 1.0
    scores = rel.LinkScores(list(rel.TOKEN_GROUPS), L, H, unit="link")
    scores.add_maps(maps, rel.token_input({rel.VERB_SUBJECT: [(3, 0)]}))
    assert scores.means()[vs, 0, 0] == pytest.approx(1 / W)


def test_relation_score_is_the_max_over_links_and_both_directions():
    W = 6
    groups = ["all", *rel.CORE]
    maps = uniform_maps(W)  # 1/6 everywhere
    maps[0, 1, 4, 1] = 0.8  # head 1-2: argument 4 -> predicate 1 (the map's other direction)
    maps[0, 1, 1, 4] = 0.1
    maps[1, 0, 1, 3] = 0.5  # head 2-1: predicate 1 -> argument 3
    links = rel.relation_input([("nsubj", 1, 4), ("obj", 1, 3)], groups)
    scores = rel.LinkScores(groups, L, H, unit="sentence")
    scores.add_maps(maps, links)
    means, g = scores.means(), {name: k for k, name in enumerate(groups)}
    assert means[g["all"], 0, 1] == pytest.approx(0.8)  # either direction
    assert means[g["nsubj"], 0, 1] == pytest.approx(0.8)
    assert means[g["obj"], 0, 1] == pytest.approx(1 / 6)
    assert means[g["all"], 1, 0] == pytest.approx(0.5) and means[g["obj"], 1, 0] == pytest.approx(0.5)
    assert means[g["all"], 0, 0] == pytest.approx(1 / 6)
    # a second sentence averages per sentence (not per link), per relation where present
    maps2 = np.zeros((L, H, W, W))
    scores.add_maps(maps2, rel.relation_input([("obj", 0, 2), ("obj", 5, 2)], groups))
    assert list(scores.n) == [2, 1, 0, 2, 0, 0]
    assert scores.means()[g["all"], 0, 1] == pytest.approx(0.4)
    assert scores.means()[g["obj"], 1, 0] == pytest.approx(0.25)


def test_flagged_heads_are_above_the_99th_percentile():
    rng = np.random.default_rng(0)
    for n_layers, n_heads, expect in ((6, 12, 1), (12, 12, 2)):
        values = rng.random((n_layers, n_heads))
        flags = rel.flag_heads(values)
        assert flags.sum() == expect  # MiniLM: 1 of 72; bert-base: 2 of 144, as the paper found
        assert set(map(tuple, np.argwhere(flags))) == set(rel.top_heads(values, expect))
    values = np.full((6, 12), 0.1)
    assert not rel.flag_heads(values).any()  # all equal: nothing is above the percentile
    values[2, 3] = np.nan
    values[0, 0] = 0.9
    assert np.argwhere(rel.flag_heads(values)).tolist() == [[0, 0]]


def test_summary_counts_previous_next_token_heads():
    values = np.arange(72, dtype=float).reshape(6, 12) / 100  # head 6-12 best, then 6-11, ...
    scores = rel.LinkScores([rel.VERB_SUBJECT], 6, 12, unit="link")
    scores.sums[0], scores.n[0] = values * 4, 4
    prev, next_ = np.zeros((6, 12)), np.zeros((6, 12))
    prev[5, 11], next_[5, 9], next_[0, 0] = 0.7, 0.51, 0.9  # two in the top 3, one far below
    prev[5, 10] = 0.5  # not above 0.5
    (row,) = rel.summary_rows("ewt", "tokens", scores, 3, prev, next_)
    assert row["top"] == "6-12:0.710 6-11:0.700 6-10:0.690" and row["flagged"] == "6-12:0.710"
    assert (row["top_prev_next"], row["flagged_prev_next"], row["n_flagged"], row["prev_next_heads"]) == (2, 1, 1, 3)
    # rank correlation: scores rise with the head index; a mass that does too correlates fully, its reverse -1
    assert row["rho_prev_next"] == pytest.approx(rel.rank_correlation(values, np.maximum(prev, next_)), abs=1e-3)
    assert rel.rank_correlation(values, values ** 2) == pytest.approx(1.0)
    assert rel.rank_correlation(values, -values) == pytest.approx(-1.0)
    from scipy.stats import spearmanr

    x, y = np.random.default_rng(0).random((2, 6, 12))
    assert rel.rank_correlation(x, y) == pytest.approx(spearmanr(x.ravel(), y.ravel())[0])


def test_link_scores_merge_save_load(tmp_path):
    rng = np.random.default_rng(1)
    groups = ["all", *rel.CORE]
    inputs = []
    for _ in range(6):
        W = int(rng.integers(4, 9))
        maps = rng.dirichlet(np.ones(W), size=(L, H, W))  # (L, H, W, W) rows sum to 1
        links = rel.relation_input([("obj", 0, W - 1), ("nsubj", W - 1, 1)], groups)
        inputs.append((maps, links))
    whole, a, b = (rel.LinkScores(groups, L, H) for _ in range(3))
    for k, (maps, links) in enumerate(inputs):
        whole.add_maps(maps, links)
        (a if k < 3 else b).add_maps(maps, links)
    a.merge(b)
    np.testing.assert_allclose(a.sums, whole.sums)
    assert (a.n == whole.n).all()
    whole.batches_done = 7
    whole.save(tmp_path / "s.npz")
    back = rel.LinkScores.load(tmp_path / "s.npz")
    np.testing.assert_array_equal(back.sums, whole.sums)
    assert (back.groups, back.unit, back.batches_done) == (groups, "sentence", 7)
    with pytest.raises(ValueError):
        back.merge(rel.LinkScores(groups, L, H, unit="link"))


# --- the accumulator against the model's own maps -------------------------------------------


def word_pool(token_map: np.ndarray, word_ids: list[int]) -> np.ndarray:
    """(layers, H, W, W) from (layers, H, T, T): rows averaged over a word's tokens, columns summed."""
    n_words = max(word_ids) + 1
    units, extra = [], n_words
    for w in word_ids:
        units.append(w if w >= 0 else extra)
        extra += w < 0
    U = max(units) + 1
    to_word = np.zeros((len(units), U))
    to_word[np.arange(len(units)), units] = 1
    from_word = to_word.T / to_word.sum(0)[:, None]  # (U, T)
    return from_word @ token_map @ to_word


def test_accumulator_equals_direct_computation_from_output_attentions(tiny_model):
    from bertscope.analyses.relations.command import offsets_spec
    from bertscope.analyses.relations.stats import prev_next
    from bertscope.engine.accumulate import HeadStats
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.models.loading import wrap_model
    from bertscope.text.segments import collate
    from bertscope.text.word_segments import word_segment

    model, tokenizer = tiny_model("bert")
    twin, _ = tiny_model("bert", attn_implementation="eager")
    twin.load_state_dict(model.state_dict())
    loaded = wrap_model(model, tokenizer)
    sentences = [["The", "unaffordable", "dog", "barked", "at", "Washington", "."],
                 ["She", "gave", "him", "a", "book", "yesterday"],
                 ["Attention", "heads", "attend"],
                 ["Mr.", "Smith", "went", "to", "Washington", "and", "liked", "it", "there", "!"]]
    segments = [word_segment(w, tokenizer, 40) for w in sentences]
    assert any(len(s.input_ids) > len(s.words) + 2 for s in segments)  # split words are pooled
    groups = ["all", *rel.CORE]
    links = [rel.relation_input([("nsubj", 3, 0), ("obl", 3, 5)], groups),
             rel.relation_input([("nsubj", 1, 0), ("iobj", 1, 2), ("obj", 1, 4)], groups),
             rel.relation_input([("nsubj", 2, 0)], groups),
             rel.relation_input([("nsubj", 2, 1), ("obl", 2, 4), ("obj", 6, 7)], groups)]
    token_links = [rel.token_input({rel.VERB_SUBJECT: [(3, 0)]}), rel.token_input({rel.VERB_SUBJECT: [(1, 0)]}),
                   rel.token_input({rel.VERB_SUBJECT: [(2, 0), (2, 1)]}),
                   rel.token_input({rel.VERB_SUBJECT: [(2, 1)], rel.PRONOUN_ANTECEDENT: [(7, 4)]})]
    sentence_scores = rel.LinkScores(groups, loaded.n_layers, loaded.n_heads, links=links)
    link_scores = rel.LinkScores(list(rel.TOKEN_GROUPS), loaded.n_layers, loaded.n_heads, unit="link",
                                 links=token_links)
    spec = offsets_spec(loaded)
    offsets = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    fold(loaded, segments, spec, [sentence_scores, link_scores, offsets], EngineOptions(batch_size=3, progress=False),
         from_word="mean")

    want_sentence = rel.LinkScores(groups, loaded.n_layers, loaded.n_heads)
    want_link = rel.LinkScores(list(rel.TOKEN_GROUPS), loaded.n_layers, loaded.n_heads, unit="link")
    prev_sum, next_sum, rows = 0, 0, 0
    for segment, lk, tk in zip(segments, links, token_links):
        with torch.no_grad():
            maps = twin(**collate([segment], tokenizer.pad_token_id), output_attentions=True).attentions
        token_map = torch.stack(maps, dim=1)[0].double().numpy()  # (layers, H, T, T)
        word_map = word_pool(token_map, segment.word_ids)
        want_sentence.add_maps(word_map, lk)
        want_link.add_maps(word_map, tk)
        T = token_map.shape[-1]
        prev_sum = prev_sum + np.diagonal(token_map, offset=-1, axis1=2, axis2=3).sum(-1)
        next_sum = next_sum + np.diagonal(token_map, offset=1, axis1=2, axis2=3).sum(-1)
        rows += T
    np.testing.assert_allclose(sentence_scores.means(), want_sentence.means(), atol=2e-6)
    np.testing.assert_allclose(link_scores.means(), want_link.means(), atol=2e-6)
    assert list(link_scores.n) == [5, 2, 1, 1]  # far: 3 -> 0 and 2 -> 0 of the verb links
    assert sentence_scores.means()[0].std() > 0.05  # attention far from uniform: a real check
    prev, next_ = prev_next(offsets)
    np.testing.assert_allclose(prev, prev_sum / rows, atol=2e-6)
    np.testing.assert_allclose(next_, next_sum / rows, atol=2e-6)


# --- the command on real sentences --------------------------------------------------------


@pytest.fixture(scope="module")
def data_available():
    require_data("ud-ewt", "gum")


def relations_args(checkpoint, out, *extra):
    return ["relations", "--model", str(checkpoint), "--limit", "6", "--max-len", "64", "--batch-size", "4",
            "--out", str(out), "--quiet", *extra]


def test_cli_end_to_end(tiny_checkpoint, data_available, tmp_path):
    out = tmp_path / "run"
    assert main(relations_args(tiny_checkpoint, out)) == 0
    files = {p.name for p in out.iterdir()}
    assert {"run.json", "relations_heads.csv", "relations_summary.csv", "relations_summary.txt",
            "relations_heatmap_ewt_gum.png", "tokens_heatmap_gum.png", "relations_examples.png",
            "tokens_examples.png", "index.html"} <= files
    record = json.loads((out / "run.json").read_text())["analyses"]["relations"]
    assert record["status"] == "complete"
    results = record["results"]
    for analysis in ("relations", "tokens"):
        for data in ("ewt", "gum", "ewt+gum"):
            assert results[analysis][data]["inputs"] == (12 if data == "ewt+gum" else 6)
    assert results["relations"]["ewt"]["report"]["too_many_words"] > 0
    heads = read_csv(out / "relations_heads.csv")
    assert len(heads) == 3 * (len(rel.CORE) + 2 + len(rel.TOKEN_GROUPS)) * 2 * 4  # data x groups x layers x heads
    scored = [r for r in heads if r["score"] != "nan"]
    assert scored and all(0 <= float(r["score"]) <= 1 for r in scored)
    alls = [r for r in heads if r["group"] == "all" and r["data"] == "ewt+gum"]
    assert {int(r["n"]) for r in alls} == {12} and sum(int(r["flagged"]) for r in alls) == 1
    # pooled = the sentence-weighted mean of the two data sets
    for pooled in alls:
        parts = [r for r in heads if r["group"] == "all" and r["layer"] == pooled["layer"]
                 and r["head"] == pooled["head"] and r["data"] in ("ewt", "gum")]
        assert float(pooled["score"]) == pytest.approx(sum(float(r["score"]) for r in parts) / 2, abs=2e-6)
    report = (out / "index.html").read_text()
    assert "Relation heads and token-to-token attention" in report and "Other figures" not in report
    assert "relations_heatmap_gum.png" in report and "473 FrameNet sentences" in report
    summary = read_csv(out / "relations_summary.csv")
    vs = next(r for r in summary if r["group"] == rel.VERB_SUBJECT and r["data"] == "ewt+gum")
    assert int(vs["top_k"]) == 8 and 0 <= int(vs["top_prev_next"]) <= 8  # the tiny model has 8 heads


def test_interrupted_run_resumes_to_the_same_result(tiny_checkpoint, data_available, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    args = ("--analysis", "relations", "--data", "ewt", "--batch-size", "2", "--checkpoint-every", "1", "--no-figures")
    assert main(relations_args(tiny_checkpoint, whole, *args)) == 0
    original = interrupt_on_call(monkeypatch, rel.LinkScores, 2)
    cut = tmp_path / "cut"
    assert main(relations_args(tiny_checkpoint, cut, *args)) == 130  # Ctrl-C
    assert rel.LinkScores.load(cut / "relations_state" / "relations-ewt.scores.npz").batches_done == 1
    monkeypatch.setattr(rel.LinkScores, "add", original)
    assert main(["relations", "--resume", str(cut), "--quiet"]) == 0
    assert read_csv(cut / "relations_heads.csv") == read_csv(whole / "relations_heads.csv")
    assert rel.LinkScores.load(cut / "relations_state" / "relations-ewt.scores.npz").batches_done == 3
    # checkpoints are per rank: a run started by two ranks is not resumed by one
    record = json.loads((cut / "run.json").read_text())
    assert record["analyses"]["relations"]["world_size"] == 1
    record["analyses"]["relations"]["world_size"] = 2
    (cut / "run.json").write_text(json.dumps(record))
    assert main(["relations", "--resume", str(cut), "--quiet"]) == 2


def test_cli_user_mistakes(tiny_checkpoint, tmp_path, capsys):
    code = main(["relations", "--model", str(tiny_checkpoint), "--data-dir", str(tmp_path / "none"),
                 "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("bertscope: error: ") and "Traceback" not in err
    assert not (tmp_path / "run").exists()
    code = main(["relations", "--resume", str(tmp_path / "nowhere"), "--quiet"])
    assert code == 2 and "cannot resume" in capsys.readouterr().err


@pytest.mark.full  # tests/tiers.py
def test_two_ranks_equal_one_process(tiny_checkpoint, data_available, tmp_path):
    args = ["relations", "--model", str(tiny_checkpoint), "--limit", "8", "--max-len", "64",
            "--batch-size", "2", "--data", "ewt", "--quiet", "--no-figures"]
    run_one_and_two_ranks(args, tmp_path, port=29549)  # 29547 is the patterns test's
    halves = [rel.LinkScores.load(tmp_path / "two" / "relations_state" / f"relations-ewt.rank{r}.scores.npz")
              for r in (0, 1)]
    assert [h.n[0] for h in halves] == [4, 4]  # 4 batches of 2 sentences, two per rank
    a, b = read_csv(tmp_path / "one" / "relations_heads.csv"), read_csv(tmp_path / "two" / "relations_heads.csv")
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if k in ("score", "prev", "next"):
                assert float(x[k]) == pytest.approx(float(y[k]), abs=1e-6, nan_ok=True)
            else:
                assert x[k] == y[k]
