"""`bertscope probe coref`: antecedent selection and GAP scoring on hand-built examples with
planted attention, the baselines, and the command end to end on a slice of GUM and GAP."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from conftest import require_data

from bertscope.analyses.probes.coref import stats as coref
from bertscope.data.readers.coref import CorefDocument, Mention

pytestmark = pytest.mark.usefixtures("single_thread")


def document(words, mentions, upos=None):
    """A one-sentence CorefDocument; mentions are (start, end, entity, head, kind[, etype])."""
    upos = upos or ["NOUN"] * len(words)
    ms = [Mention(s, e, ent, h, kind, *rest) for s, e, ent, h, kind, *rest in mentions]
    ms.sort(key=lambda m: (m.start, -m.end))
    return CorefDocument("doc", "test", list(words), upos, [-1] * len(words), [(0, len(words))], ms)


def planted_maps(n_layers, n_heads, n_words, rows: dict, n_special=2):
    """Word maps (layers, H, W, W) where row `word` of head (layer, head) puts 0.7 on `target`
    and spreads the rest over every unit, specials included."""
    W = n_words + n_special
    maps = np.full((n_layers, n_heads, W, W), 0.3 / W, dtype=np.float32)
    for (layer, head, word), target in rows.items():
        maps[layer, head, word, target] += 0.7
    return maps


# --- antecedent selection ----------------------------------------------------------------------


def test_two_mention_document_with_planted_attention():
    # "John said he left": "he" (head 2) corefers with "John" (head 0)
    doc = document(["John", "said", "he", "left"], [(0, 1, "1", 0, "proper"), (2, 3, "1", 2, "pronoun")])
    items = coref.anaphors(doc)
    assert [(a.index, a.head, a.kind, set(a.gold)) for a in items] == [(1, 2, "pronoun", {0})]
    # head 1-1: "he" attends to "John"; head 1-2: "he" attends to "left"
    maps = planted_maps(1, 2, 4, {(0, 0, 2): 0, (0, 1, 2): 3})
    argmax = coref.word_argmax(maps, 4)  # (layers, H, W)
    assert argmax[0, :, 2].tolist() == [0, 3]
    gold = coref.gold_matrix(items, 4)
    hits = coref.head_hits(argmax, np.array([a.head for a in items]), gold)  # (1, 2, 1)
    scores = coref.Scores(1, 2)
    scores.add_mentions([a.kind for a in items], hits, {b: np.array([True]) for b in coref.GUM_BASELINES})
    assert scores.accuracy("All").tolist() == [[1.0, 0.0]]
    assert scores.accuracy("pronoun").tolist() == [[1.0, 0.0]]
    assert np.isnan(scores.accuracy("nominal")).all()
    rows = {r["type"]: r for r in scores.table_rows("gum")}
    assert rows["All"]["best_head"] == "1-1" and rows["All"]["accuracy"] == 1.0 and rows["All"]["n"] == 1
    assert rows["proper"]["n"] == 0 and rows["proper"]["best_head"] == ""
    heads = scores.head_rows("gum")
    assert len(heads) == 4 * 2
    assert {(r["mention_type"], r["head"]): r["accuracy"] for r in heads if r["mention_type"] == "All"} == \
        {("All", 1): 1.0, ("All", 2): 0.0}


def test_attention_to_a_special_token_or_to_itself_never_selects():
    doc = document(["John", "said", "he", "left"], [(0, 1, "1", 0, "proper"), (2, 3, "1", 2, "pronoun")])
    maps = planted_maps(1, 2, 4, {(0, 0, 2): 4, (0, 1, 2): 2})  # [CLS]-like unit 4, and itself
    maps[0, 0, 2, 0] += 0.05  # the best *word* after the special
    argmax = coref.word_argmax(maps, 4)
    assert argmax[0, 0, 2] == 0 and argmax[0, 1, 2] != 2
    assert coref.head_hits(np.array([[[-1, -1, -1, -1]]]), np.array([2]), coref.gold_matrix(coref.anaphors(doc), 4)
                           ).tolist() == [[[False]]]


def test_candidates_leave_out_enclosing_mentions_and_shared_heads():
    # "[[his] mother] saw [him]": "his" and "him" corefer; "his mother" encloses "his"
    doc = document(["his", "mother", "saw", "him"],
                   [(0, 2, "2", 1, "nominal"), (0, 1, "1", 0, "pronoun"), (3, 4, "1", 3, "pronoun")])
    items = coref.anaphors(doc)
    assert [(doc.mentions[a.index].start, set(a.gold)) for a in items] == [(3, {0})]
    # candidates of "him": "his" (head 0) and "his mother" (head 1), most recent last
    assert [doc.mentions[j].head for j in items[0].candidates] == [0, 1]
    # a mention with the same head word as its only antecedent is not scored
    same = document(["Obama", "spoke"], [(0, 2, "1", 0, "proper"), (0, 1, "1", 0, "proper")])
    assert coref.anaphors(same) == []


# --- baselines ---------------------------------------------------------------------------------


def test_nearest_and_string_match_baselines():
    words = "The cat sat . The dog saw the cat".split()
    doc = document(words, [(0, 2, "1", 1, "nominal"), (4, 6, "2", 5, "nominal"), (7, 9, "1", 8, "nominal")])
    items = coref.anaphors(doc)
    assert len(items) == 1
    choices = coref.baseline_choices(doc, items, ["DT", "NN"] * 5, ["_"] * len(words))
    assert choices["nearest"].tolist() == [5]  # "dog": the closest earlier mention, wrong
    assert choices["head_match"].tolist() == [1]  # "cat"
    assert choices["sieve"].tolist() == [1]  # exact string match, case-blind
    gold = coref.gold_matrix(items, len(words))
    assert {k: coref.choice_hits(v, gold).tolist() for k, v in choices.items()} == \
        {"nearest": [False], "head_match": [True], "sieve": [True]}


def choose(words, mentions, xpos=None, feats=None, upos=None):
    """Each baseline's chosen head word for the last scored mention, and whether it is right."""
    doc = document(words, mentions, upos)
    items = coref.anaphors(doc)
    xpos = xpos or ["NN"] * len(words)
    choices = coref.baseline_choices(doc, items, xpos, feats or ["_"] * len(words))
    gold = coref.gold_matrix(items, len(words))
    return ({k: int(v[-1]) for k, v in choices.items()},
            {k: bool(coref.choice_hits(v, gold)[-1]) for k, v in choices.items()})


def test_head_match_has_no_fallback():
    # "Barack Obama met Merkel . Obama smiled": UD's head of "Barack Obama" is "Barack"
    words = "Barack Obama met Merkel . Obama smiled".split()
    upos = ["PROPN", "PROPN", "VERB", "PROPN", "PUNCT", "PROPN", "VERB"]
    chosen, right = choose(words, [(0, 2, "1", 0, "proper"), (3, 4, "2", 3, "proper"), (5, 6, "1", 5, "proper")],
                           xpos=["NNP"] * 7, upos=upos)
    assert chosen["nearest"] == 3 and chosen["head_match"] == -1  # no candidate's head is "obama": no choice
    assert right == {"nearest": False, "head_match": False, "sieve": False}  # the sieve: agreement, then Merkel
    # with the last word as the head of a flat name, head-word match finds it
    chosen, right = choose(words, [(0, 2, "1", 1, "proper"), (3, 4, "2", 3, "proper"), (5, 6, "1", 5, "proper")],
                           xpos=["NNP"] * 7, upos=upos)
    assert chosen["head_match"] == 1 and right["head_match"] and right["sieve"]


def test_sieve_rule_1_exact_string_match_decides():
    # "the red car hit a blue car . the red car stopped": head match alone would take "a blue car"
    words = "the red car hit a blue car . the red car stopped".split()
    chosen, right = choose(words, [(0, 3, "1", 2, "nominal"), (4, 7, "2", 6, "nominal"), (8, 11, "1", 10, "nominal")])
    assert chosen == {"nearest": 6, "head_match": 6, "sieve": 2}
    assert right == {"nearest": False, "head_match": False, "sieve": True}


def test_sieve_rule_1_applies_to_pronouns_too():
    # "He met Bill . he smiled": "he" matches "He" exactly, although "Bill" is nearer and agrees
    words = "He met Bill . he smiled".split()
    feats = ["Gender=Masc|Number=Sing|Person=3", "_", "Number=Sing", "_", "Gender=Masc|Number=Sing|Person=3", "_"]
    chosen, right = choose(words, [(0, 1, "1", 0, "pronoun"), (2, 3, "2", 2, "proper"), (4, 5, "1", 4, "pronoun")],
                           feats=feats)
    assert chosen["sieve"] == 0 and chosen["nearest"] == 2 and right["sieve"] and not right["nearest"]


def test_sieve_rule_2_head_word_match_comes_before_agreement():
    # "The dogs saw the cats . Two dogs ran": "the cats" is plural too and nearer
    words = "The dogs saw the cats . Two dogs ran".split()
    xpos = ["DT", "NNS", "VBD", "DT", "NNS", ".", "CD", "NNS", "VBD"]
    chosen, right = choose(words, [(0, 2, "1", 1, "nominal"), (3, 5, "2", 4, "nominal"), (6, 8, "1", 7, "nominal")],
                           xpos=xpos)
    assert chosen == {"nearest": 4, "head_match": 1, "sieve": 1}
    assert right == {"nearest": False, "head_match": True, "sieve": True}


def test_sieve_rule_3_agreement_in_person_number_gender_animacy():
    # "Mary met the boys . She smiled": "She" is singular, "the boys" plural; no string matches
    words = "Mary met the boys . She smiled".split()
    xpos = ["NNP", "VBD", "DT", "NNS", ".", "PRP", "VBD"]
    feats = ["Number=Sing", "_", "_", "Number=Plur", "_", "Case=Nom|Gender=Fem|Number=Sing|Person=3|PronType=Prs", "_"]
    chosen, right = choose(words, [(0, 1, "1", 0, "proper"), (2, 4, "2", 3, "nominal"), (5, 6, "1", 5, "pronoun")],
                           xpos=xpos, feats=feats)
    assert chosen == {"nearest": 3, "head_match": -1, "sieve": 0}
    assert right == {"nearest": False, "head_match": False, "sieve": True}
    # without FEATS the lexicon gives the pronoun's features; nouns are third person, any gender
    doc = document(words, [(0, 1, "1", 0, "proper"), (2, 4, "2", 3, "nominal"), (5, 6, "1", 5, "pronoun")])
    assert coref.agreement(doc, doc.mentions[2], xpos, ["_"] * 7) == coref.Agreement("3", "Sing", "Fem", True)
    assert coref.agreement(doc, doc.mentions[1], xpos, ["_"] * 7) == coref.Agreement("3", "Plur", None, None)

    # "The book fell on John . It broke": "It" is inanimate, John a person (GUM entity types)
    words = "The book fell on John . It broke".split()
    xpos = ["DT", "NN", "VBD", "IN", "NNP", ".", "PRP", "VBD"]
    mentions = [(0, 2, "1", 1, "nominal", "object"), (4, 5, "2", 4, "proper", "person"),
                (6, 7, "1", 6, "pronoun", "object")]
    chosen, right = choose(words, mentions, xpos=xpos)
    assert chosen == {"nearest": 4, "head_match": -1, "sieve": 1} and right["sieve"]
    doc = document(words, mentions)
    assert coref.agreement(doc, doc.mentions[2], xpos, ["_"] * 8) == coref.Agreement("3", "Sing", "Neut", False)


def test_sieve_rule_4_nearest_when_nothing_agrees():
    # "Sue met the boys . She said : I left": first person "I" agrees with no third-person candidate
    words = "Sue met the boys . She said : I left".split()
    xpos = ["NNP", "VBD", "DT", "NNS", ".", "PRP", "VBD", ":", "PRP", "VBD"]
    chosen, right = choose(words, [(0, 1, "1", 0, "proper"), (2, 4, "2", 3, "nominal"), (5, 6, "1", 5, "pronoun"),
                                   (8, 9, "1", 8, "pronoun")], xpos=xpos)
    assert chosen == {"nearest": 5, "head_match": -1, "sieve": 5}
    assert right == {"nearest": True, "head_match": False, "sieve": True}


def test_choice_hits_scores_no_choice_as_wrong():
    gold = np.array([[True, False], [False, True]])
    assert coref.choice_hits(np.array([-1, 1]), gold).tolist() == [False, True]


def test_last_flat_head_word():
    from bertscope.data.readers.coref import head_word

    # "Barack Obama visited New York City": Obama -flat-> Barack; New, York -compound-> City
    heads = [2, 0, -1, 5, 5, 2]
    deprels = ["nsubj", "flat", "root", "compound", "compound", "obj"]
    upos = ["PROPN", "PROPN", "VERB", "PROPN", "PROPN", "PROPN"]
    assert head_word(0, 2, heads) == 0  # UD: the first word
    assert head_word(0, 2, heads, deprels, upos) == 1  # last-flat: "Obama"
    assert head_word(3, 6, heads) == 5 == head_word(3, 6, heads, deprels, upos)  # compounds precede their head
    nominal = ["NOUN", "NOUN", "VERB", "PROPN", "PROPN", "PROPN"]
    assert head_word(0, 2, heads, deprels, nominal) == 0  # only proper names move


# --- GAP ---------------------------------------------------------------------------------------


def test_gap_scoring_with_planted_attention():
    # words: 0 "Anna" 1 "Lee" 2 "met" 3 "Bob" 4 "." 5 "She" 6 "left"; A = Anna Lee (0..2), B = Bob (3..4)
    a, b, pronoun = (0, 2), (3, 4), 5
    maps = planted_maps(1, 3, 7, {(0, 0, pronoun): 0, (0, 1, pronoun): 3})
    # head 1-3: 0.4 on "Bob", 0.25 on each of "Anna" and "Lee": B wins by first word, A by the sum
    maps[0, 2, pronoun] = 0.0
    maps[0, 2, pronoun, [0, 1, 3, 6]] = [0.25, 0.25, 0.4, 0.1]
    assert coref.gap_head_hits(maps, pronoun, a, b, "A").tolist() == [[True, False, True]]
    assert coref.gap_head_hits(maps, pronoun, a, b, "B").tolist() == [[False, True, False]]
    assert coref.gap_head_hits(maps, pronoun, a, b, "A", name="first").tolist() == [[True, False, False]]
    with pytest.raises(ValueError):
        coref.gap_head_hits(maps, pronoun, a, b, "neither")


def test_gap_baselines():
    assert coref.gap_baselines(5, (0, 2), (3, 4)) == {"nearest": "B", "first_name": "A"}
    assert coref.gap_baselines(5, (3, 4), (0, 2)) == {"nearest": "A", "first_name": "B"}
    # cataphora: both names after the pronoun -> the closer one after it
    assert coref.gap_baselines(0, (4, 5), (2, 3)) == {"nearest": "B", "first_name": "B"}
    # one before, one after: the one before
    assert coref.gap_baselines(3, (4, 5), (0, 1)) == {"nearest": "B", "first_name": "B"}


def test_format_table_marks_missing_columns():
    scores = coref.Scores(1, 1, types=("All",), baselines=coref.GAP_BASELINES)
    scores.add_mentions(["masculine"], np.array([[[True]]]),
                        {"nearest": np.array([False]), "first_name": np.array([True])})
    text = coref.format_table(scores.table_rows("gap"))
    header, row = text.splitlines()
    assert row.split() == ["gap", "All", "1-1", "100.0", "1-1", "100.0", "0.0", "-", "-", "100.0", "1"]


# --- GUM segments and the command end to end ----------------------------------------------------


def shared_data_or_skip():
    require_data("gum", "gap")


def test_windows_score_only_antecedents_inside_the_segment(minilm_tokenizer):
    from bertscope.analyses.probes.coref.command import gum_segments

    # two sentences; "it" in the second refers to "the cat" in the first
    words = "The cat sat . It slept .".split()
    doc = document(words, [(0, 2, "1", 1, "nominal"), (4, 5, "1", 4, "pronoun")])
    doc.sentence_spans = [(0, 4), (4, 7)]
    xpos, feats = ["X"] * 7, ["_"] * 7
    segments, scored, report = gum_segments([(doc, xpos, feats)], minilm_tokenizer, 128, "windows")
    assert report["segments"] == 1 and report["scored_mentions"] == 1
    assert segments[0].words == words
    # room for one sentence per window: the antecedent is in another segment, nothing is scored
    segments, scored, report = gum_segments([(doc, xpos, feats)], minilm_tokenizer, 6, "windows")
    assert report["windows"] == 2 and report["windows_without_anaphors"] == 2 and report["segments"] == 0


def test_cli_end_to_end_on_gum_and_gap(tiny_checkpoint, tmp_path, capsys):
    shared_data_or_skip()
    from transformers import AutoTokenizer

    from bertscope.cli.main import main
    from bertscope.data.paths import seeded_sample as sample
    from bertscope.data.readers.gap import read_gap
    from bertscope.text.word_segments import word_segment

    out = tmp_path / "run"
    code = main(["probe", "coref", "--model", str(tiny_checkpoint), "--limit-docs", "2", "--limit-gap", "12",
                 "--max-len", "96", "--out", str(out)])  # not --quiet: the printed table is checked
    assert code == 0
    printed = capsys.readouterr().out
    assert "gum      All" in printed and "gap      All" in printed
    assert {"coref_table.txt", "coref_table.csv", "coref_heads.csv", "coref_bars.png", "coref_heads.png",
            "run.json"} <= {p.name for p in out.iterdir()}

    with open(out / "coref_heads.csv", newline="") as f:
        heads = list(csv.DictReader(f))
    assert len(heads) == (4 + 3) * 2 * 4  # (GUM types + GAP types) x 2 layers x 4 heads
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in heads if r["accuracy"] != "nan")
    with open(out / "coref_table.csv", newline="") as f:
        table = {(r["dataset"], r["type"]): r for r in csv.DictReader(f)}
    n = {k: int(r["n"]) for k, r in table.items()}
    assert n["gum", "All"] == n["gum", "pronoun"] + n["gum", "proper"] + n["gum", "nominal"] > 0
    assert n["gap", "All"] == n["gap", "masculine"] + n["gap", "feminine"]
    best = table["gum", "All"]
    assert max(float(r["accuracy"]) for r in heads if r["dataset"] == "gum" and r["mention_type"] == "All") == \
        pytest.approx(float(best["accuracy"]))

    run = json.loads((out / "run.json").read_text())["analyses"]["coref"]
    assert run["status"] == "complete"
    gum, gap = run["results"]["gum"], run["results"]["gap"]
    assert gum["documents"] == 2 and gum["scored_mentions"] == n["gum", "All"]
    # the GAP skips, recounted from the data
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    rows = sample(read_gap("development"), 12, 0)
    neither = sum(r.label == "neither" for r in rows)
    too_long = sum(r.label != "neither" and word_segment(r.words, tokenizer, 96) is None for r in rows)
    assert (gap["rows"], gap["skipped_neither"], gap["skipped_too_long"]) == (12, neither, too_long)
    assert gap["scored"] == 12 - neither - too_long == n["gap", "All"]
    # a baseline's accuracy, recounted from the data
    nearest = [coref.gap_baselines(r.pronoun_word, r.a_words, r.b_words)["nearest"] == r.label
               for r in rows if r.label != "neither" and word_segment(r.words, tokenizer, 96) is not None]
    if nearest:
        assert float(table["gap", "All"]["nearest"]) == pytest.approx(np.mean(nearest))


def test_kernel_argmax_path_matches_word_maps(tiny_checkpoint):
    """The GUM pass (the kernel's word_argmax via stream_batches) scores like argmaxes taken
    here from the word maps of `iter_word_maps`."""
    shared_data_or_skip()
    from types import SimpleNamespace

    from bertscope.analyses.probes.coref.command import (
        gum_segments,
        probe_gum,
        read_gum_documents,
    )
    from bertscope.engine.loop import iter_word_maps
    from bertscope.models.loading import load_model

    loaded = load_model(str(tiny_checkpoint))
    docs = read_gum_documents(None, 1, 3)
    args = SimpleNamespace(max_len=64, segments="first", from_word="mean", batch_size=8, backend="auto")
    scores, report = probe_gum(loaded, docs, args, progress=False)
    segments, scored, _ = gum_segments(docs, loaded.tokenizer, 64, "first")
    expected = coref.Scores(loaded.n_layers, loaded.n_heads)
    for i, maps in iter_word_maps(loaded, segments, progress=False):
        seg = scored[i]
        argmax = coref.word_argmax(maps, len(segments[i].words))
        expected.add_mentions(seg.kinds, coref.head_hits(argmax, seg.heads, seg.gold), seg.baseline_hits)
    assert report["segments"] == 1
    for t in coref.TYPES:
        assert scores.n[t] == expected.n[t]
        np.testing.assert_array_equal(scores.heads[t], expected.heads[t])


def test_user_mistakes(tiny_checkpoint, tmp_path, capsys):
    from bertscope.cli.main import main

    code = main(["probe", "coref", "--model", str(tiny_checkpoint), "--data-dir", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 2
    assert "bertscope: error:" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_scores_merge_save_and_load_like_any_accumulator(tmp_path):
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(4):
        m = int(rng.integers(1, 5))
        kinds = rng.choice(["pronoun", "proper", "nominal"], m)
        parts.append((kinds, rng.random((2, 3, m)) > 0.5, {b: rng.random(m) > 0.5 for b in coref.GUM_BASELINES}))

    def scores_of(chunk):
        scores = coref.Scores(2, 3)
        for kinds, hits, base in chunk:
            scores.add_mentions(kinds, hits, base)
        return scores

    whole, merged = scores_of(parts), scores_of(parts[:1]).merge(scores_of(parts[1:]))
    assert whole.n["All"] == sum(len(k) for k, _, _ in parts)
    for t in coref.TYPES:
        assert merged.n[t] == whole.n[t] and merged.base[t] == whole.base[t]
        np.testing.assert_array_equal(merged.heads[t], whole.heads[t])
    whole.batches_done = 2
    whole.save(tmp_path / "coref.npz")
    back = coref.Scores.load(tmp_path / "coref.npz")
    assert back.batches_done == 2 and back.n == whole.n and back.base == whole.base
    np.testing.assert_array_equal(back.accuracy("pronoun"), whole.accuracy("pronoun"))
    with pytest.raises(ValueError, match="cannot merge"):
        whole.merge(coref.Scores(2, 3, types=("All",), baselines=coref.GAP_BASELINES))
