"""Segments of pre-split gold words (`word_segment`, `split_words`) for BERT and RoBERTa."""
from __future__ import annotations

import pytest
from conftest import require_data

from bertscope.text.corpus import Document
from bertscope.text.segments import SegmentOptions, make_segments
from bertscope.text.word_segments import split_words, word_segment

WORDS = ["The", "sheikh", "in", "wheel", "-", "chair", "has", "been", "attacked", "."]
SECOND = ["He", "did", "n't", "flinch", "!"]


def tokens_of_word(segment, w: int) -> list[int]:
    return [t for t, i in zip(segment.input_ids, segment.word_ids) if i == w]


def test_bert_single(minilm_tokenizer):
    tok = minilm_tokenizer
    s = word_segment(WORDS, tok, 128, doc_id="s1")
    assert s.words == WORDS and s.doc_id == "s1" and not s.truncated
    assert tok.convert_ids_to_tokens(s.input_ids) == [
        "[CLS]", "the", "sheikh", "in", "wheel", "-", "chair", "has", "been", "attacked", ".", "[SEP]"]
    assert s.word_ids == [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1]
    assert s.token_type_ids == [0] * 12


def test_bert_split_words_keep_their_word(minilm_tokenizer):
    tok = minilm_tokenizer
    words = ["Zurbarán", "'s", "unbelievably", "eye-tracking", "paintings"]
    s = word_segment(words, tok, 128)
    for w, word in enumerate(words):  # each word's tokens are the word's own WordPieces
        assert tokens_of_word(s, w) == tok(word, add_special_tokens=False)["input_ids"]
    assert len(s.input_ids) > len(words) + 2
    assert sorted(set(s.word_ids)) == [-1, 0, 1, 2, 3, 4]
    inner = s.word_ids[1:-1]
    assert inner == sorted(inner)


def test_bert_pair(minilm_tokenizer):
    tok = minilm_tokenizer
    s = word_segment(WORDS, tok, 128, second=SECOND)
    assert s.words == WORDS + SECOND
    toks = tok.convert_ids_to_tokens(s.input_ids)
    sep = len(WORDS) + 1
    assert toks[sep:] == ["[SEP]", "he", "did", "n", "'", "t", "flinch", "!", "[SEP]"]
    assert s.word_ids[sep + 1 :] == [10, 11, 12, 12, 12, 13, 14, -1]
    assert s.token_type_ids == [0] * (sep + 1) + [1] * (len(toks) - sep - 1)
    zeros = word_segment(WORDS, tok, 128, second=SECOND, token_types="zeros")
    assert zeros.input_ids == s.input_ids and zeros.token_type_ids == [0] * len(toks)


def test_roberta_single_and_pair(roberta_tokenizer):
    tok = roberta_tokenizer
    words = ["The", "quick", "fox", "jumps", "."]
    s = word_segment(words, tok, 64)
    toks = tok.convert_ids_to_tokens(s.input_ids)
    assert toks[0] == "<s>" and toks[-1] == "</s>"
    # byte-level BPE: the first word has no space before it, the others carry "Ġ"
    assert tok.convert_ids_to_tokens(tokens_of_word(s, 0)) == ["The"]
    for w in range(1, len(words)):
        pieces = tok.convert_ids_to_tokens(tokens_of_word(s, w))
        assert pieces[0].startswith("Ġ")
        assert "".join(pieces).replace("Ġ", " ") == " " + words[w]
    # the same ids as running text through make_segments
    text = "The quick fox jumps ."
    (reference,), _ = make_segments([Document("d", [text])], tok, SegmentOptions(max_len=64, limit=None))
    assert s.input_ids == reference.input_ids
    pair = word_segment(words, tok, 64, second=["He", "liked", "it"])
    toks = tok.convert_ids_to_tokens(pair.input_ids)
    assert toks.count("</s>") == 3 and toks[len(s.input_ids)] == "</s>"  # <s> a </s></s> b </s>
    assert pair.word_ids[len(s.input_ids) + 1] == 5 and pair.word_ids[-2] == 7
    assert set(pair.token_type_ids) == {0}


@pytest.mark.parametrize("fixture", ["minilm_tokenizer", "roberta_tokenizer"])
def test_fits_exactly_or_returns_none(request, fixture):
    tok = request.getfixturevalue(fixture)
    s = word_segment(WORDS, tok, 512)
    assert word_segment(WORDS, tok, s.n_tokens).input_ids == s.input_ids
    assert word_segment(WORDS, tok, s.n_tokens - 1) is None
    assert word_segment(WORDS, tok, len(WORDS)) is None  # below one token per word


@pytest.mark.parametrize("fixture", ["minilm_tokenizer", "roberta_tokenizer"])
def test_every_word_gets_a_token(request, fixture):
    tok = request.getfixturevalue(fixture)
    words = ["a", "\u200b", "b"]  # BERT's normaliser drops the zero-width space entirely
    s = word_segment(words, tok, 16)
    assert sorted(set(s.word_ids) - {-1}) == [0, 1, 2]
    if fixture == "minilm_tokenizer":
        assert tokens_of_word(s, 1) == [tok.unk_token_id]
    alone = word_segment(["\u200b"], tok, 16)
    assert alone.words == ["\u200b"] and alone.word_ids[1:-1] and set(alone.word_ids[1:-1]) == {0}


def test_special_token_spellings_are_text(minilm_tokenizer):
    tok = minilm_tokenizer
    s = word_segment(["a", "[SEP]", "b"], tok, 16)
    assert tok.convert_ids_to_tokens(s.input_ids) == ["[CLS]", "a", "[", "sep", "]", "b", "[SEP]"]
    assert s.word_ids == [-1, 0, 1, 1, 1, 2, -1]


def test_empty_part_is_a_caller_error(minilm_tokenizer):
    with pytest.raises(ValueError):
        word_segment([], minilm_tokenizer, 16)
    with pytest.raises(ValueError):
        word_segment(["a"], minilm_tokenizer, 16, second=[])


# --- windows -----------------------------------------------------------------------------

TEXT = ("The quick brown fox jumps over the lazy dog . He liked it there ! "
        "Mr. Smith went to Washington . Attention heads attend to the separator token .").split() * 3


@pytest.mark.parametrize("fixture", ["minilm_tokenizer", "roberta_tokenizer"])
def test_split_words_windows_fit_and_cover(request, fixture):
    tok = request.getfixturevalue(fixture)
    for max_len in (8, 16, 40):
        windows = split_words(TEXT, tok, max_len)
        assert windows[0][0] == 0 and windows[-1][1] == len(TEXT)
        assert all(a < b for a, b in windows)
        assert all(windows[k][1] == windows[k + 1][0] for k in range(len(windows) - 1))
        for a, b in windows:
            s = word_segment(TEXT[a:b], tok, max_len)
            assert s is not None and s.words == TEXT[a:b]
        # greedy: adding the next word would not fit
        for a, b in windows[:-1]:
            assert word_segment(TEXT[a : b + 1], tok, max_len) is None


def test_split_words_prefers_boundaries(minilm_tokenizer):
    tok = minilm_tokenizer
    starts = [0] + [i + 1 for i, w in enumerate(TEXT[:-1]) if w in (".", "!")]
    windows = split_words(TEXT, tok, 40, boundaries=starts)
    assert all(a in starts for a, _ in windows)
    assert all(word_segment(TEXT[a:b], tok, 40) is not None for a, b in windows)
    # a stretch between boundaries longer than the room is cut at a word instead
    windows = split_words(TEXT, tok, 8, boundaries=starts)
    assert windows[0] == (0, 6) and windows[-1][1] == len(TEXT)


def test_split_words_lone_long_word(minilm_tokenizer):
    words = ["a", "supercalifragilisticexpialidocious", "b"]  # 11 WordPieces
    windows = split_words(words, minilm_tokenizer, 8)
    assert windows == [(0, 1), (1, 2), (2, 3)]
    assert word_segment(words[1:2], minilm_tokenizer, 8) is None
    assert split_words([], minilm_tokenizer, 8) == []


# --- real treebank sentences -------------------------------------------------------------


def need(name: str):
    return require_data(name)


def test_ewt_sentences(minilm_tokenizer, roberta_tokenizer):
    need("ud-ewt")
    from bertscope.data.readers.treebank import read_ewt_dev

    sentences = read_ewt_dev()[:200]
    for s in sentences:
        seg = word_segment(s.words, minilm_tokenizer, 128, doc_id=s.sent_id)
        assert seg.words == s.words
        inner = seg.word_ids[1:-1]
        assert inner[0] == 0 and inner[-1] == len(s) - 1 and inner == sorted(inner)
        assert set(inner) == set(range(len(s)))
        # WordPiece of running text = each word's own pieces
        pieces = minilm_tokenizer(s.words, add_special_tokens=False)["input_ids"]  # each word alone
        assert seg.input_ids[1:-1] == [t for word in pieces for t in word]
        rob = word_segment(s.words, roberta_tokenizer, 512)
        assert set(rob.word_ids) - {-1} == set(range(len(s)))


def test_gum_document_windows(minilm_tokenizer):
    """GUM_news_worship (167 words) in sentence-aligned windows of at most 64 tokens."""
    folder = need("gum")
    from bertscope.data.readers.coref import coref_document
    from bertscope.data.readers.treebank import read_gum_document

    doc = coref_document(read_gum_document(folder / "GUM_news_worship.conllu"))
    starts = [a for a, _ in doc.sentence_spans]
    windows = split_words(doc.words, minilm_tokenizer, 64, boundaries=starts)
    assert windows[0][0] == 0 and windows[-1][1] == len(doc.words) == 167
    assert all(a in starts for a, _ in windows) and len(windows) >= 3
    n_mentions = 0
    for a, b in windows:
        segment = word_segment(doc.words[a:b], minilm_tokenizer, 64, doc_id=doc.id)
        assert segment is not None and segment.n_tokens <= 64
        window = doc.window(a, b)
        n_mentions += len(window.mentions)
        for m in window.mentions:  # a mention's head word has tokens in the segment
            assert m.head in segment.word_ids
    assert n_mentions == len(doc.mentions) == 44  # mentions never cross sentences
