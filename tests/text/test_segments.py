"""Documents -> `[CLS] a [SEP] b [SEP]` segments: templates, truncation, sampling, collation."""
import hashlib
import json
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch

from bertscope.errors import UserError
from bertscope.text.corpus import Document, open_corpus
from bertscope.text.segments import (
    Segment,
    SegmentOptions,
    SegmentReport,
    collate,
    iter_segments,
    length_summary,
    make_segments,
    sample_order,
)

THREE_SENTENCES = "One two three four five. Six seven. Eight nine ten."  # 6 + 3 + 4 MiniLM tokens
LONG_WORDS = "The unbelievably photosynthesising hippopotamus ate."  # 16 tokens in 6 words


def tokens(tokenizer, segment: Segment) -> list[str]:
    return tokenizer.convert_ids_to_tokens(segment.input_ids)


def one(documents, tokenizer, **options) -> tuple[Segment, SegmentReport]:
    segments, report = make_segments(documents, tokenizer, SegmentOptions(limit=None, **options))
    assert len(segments) == 1, report
    return segments[0], report


# --- templates -------------------------------------------------------------------------


def test_bert_pair_template(minilm_tokenizer):
    segment, report = one([Document("d", ["Hello world.", "Bye now."])], minilm_tokenizer)
    assert tokens(minilm_tokenizer, segment) == ["[CLS]", "hello", "world", ".", "[SEP]", "bye", "now", ".", "[SEP]"]
    assert segment.input_ids == [101, 7592, 2088, 1012, 102, 9061, 2085, 1012, 102]
    assert segment.token_type_ids == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert segment.word_ids == [-1, 0, 1, 2, -1, 3, 4, 5, -1]
    assert segment.words == ["Hello", "world", ".", "Bye", "now", "."]
    assert segment.doc_id == "d" and not segment.truncated and segment.n_tokens == 9
    assert report.as_dict() == {"documents_seen": 1, "segments": 1, "truncated": 0, "empty": 0, "too_short": 0,
                                "lengths": length_summary([9])}


def test_bert_single_part_template(minilm_tokenizer):
    segment, _ = one([Document("d", ["Hello world. Bye now."])], minilm_tokenizer)
    assert tokens(minilm_tokenizer, segment) == ["[CLS]", "hello", "world", ".", "bye", "now", ".", "[SEP]"]
    assert segment.token_type_ids == [0] * 8
    assert segment.word_ids == [-1, 0, 1, 2, 3, 4, 5, -1]


def test_zeros_token_types(minilm_tokenizer):
    segment, _ = one([Document("d", ["Hello world.", "Bye now."])], minilm_tokenizer, token_types="zeros")
    assert segment.input_ids == [101, 7592, 2088, 1012, 102, 9061, 2085, 1012, 102]
    assert segment.token_type_ids == [0] * 9


def test_roberta_pair_template(roberta_tokenizer):
    tok = roberta_tokenizer
    first, second = "The quick fox.", "He went to Washington."
    segment, _ = one([Document("r", [first, second])], tok)
    a, b = tok.tokenize(first), tok.tokenize(second)
    assert tokens(tok, segment) == ["<s>", *a, "</s>", "</s>", *b, "</s>"]
    assert segment.input_ids[0] == tok.cls_token_id == 0 and segment.input_ids[-1] == tok.sep_token_id == 2
    assert segment.token_type_ids == [0] * segment.n_tokens  # RoBERTa's template: one token type
    specials = [i for i, w in enumerate(segment.word_ids) if w == -1]
    assert specials == [0, len(a) + 1, len(a) + 2, segment.n_tokens - 1]
    assert segment.words == ["The", "quick", "fox", ".", "He", "went", "to", "Washington", "."]


def test_special_token_spellings_in_text_stay_text(minilm_tokenizer):
    segment, _ = one([Document("d", ["a [SEP] b [CLS]"])], minilm_tokenizer)
    assert tokens(minilm_tokenizer, segment) == ["[CLS]", "a", "[", "sep", "]", "b", "[", "cl", "##s", "]", "[SEP]"]
    assert segment.words == ["a", "[", "SEP", "]", "b", "[", "CLS", "]"]


# --- truncation ------------------------------------------------------------------------


def test_pair_drops_trailing_sentences_of_the_longer_part(minilm_tokenizer):
    documents = [Document("d", [THREE_SENTENCES, "Hello world."])]
    segment, report = one(documents, minilm_tokenizer, max_len=15)  # room for 12 of 13 + 3 tokens
    assert tokens(minilm_tokenizer, segment) == [
        "[CLS]", "one", "two", "three", "four", "five", ".", "six", "seven", ".", "[SEP]",
        "hello", "world", ".", "[SEP]",
    ]  # fmt: skip
    assert segment.truncated and report.truncated == 1
    assert segment.words[-3:] == ["Hello", "world", "."] and len(segment.words) == 12

    segment, report = one(documents, minilm_tokenizer, max_len=19)  # everything fits
    assert segment.n_tokens == 19 and not segment.truncated and report.truncated == 0


@pytest.mark.parametrize("max_len, kept", [(8, 6), (11, 6), (12, 10), (16, 14), (17, 15), (18, 16)])
def test_single_sentence_is_cut_between_words_never_inside_one(minilm_tokenizer, max_len, kept):
    segment, report = one([Document("d", [LONG_WORDS])], minilm_tokenizer, max_len=max_len)
    full = minilm_tokenizer.tokenize(LONG_WORDS)
    assert tokens(minilm_tokenizer, segment) == ["[CLS]", *full[:kept], "[SEP]"]
    assert kept == len(full) or not full[kept].startswith("##")
    assert segment.truncated == (kept < len(full)) and report.truncated == (kept < len(full))


def test_two_long_single_sentences_share_the_room(minilm_tokenizer):
    documents = [Document("d", [LONG_WORDS, "The putsch failed in Algiers."])]
    segment, report = one(documents, minilm_tokenizer, max_len=15)
    assert tokens(minilm_tokenizer, segment) == [
        "[CLS]", "the", "un", "##bel", "##ie", "##va", "##bly", "[SEP]",
        "the", "puts", "##ch", "failed", "in", "algiers", "[SEP]",
    ]  # fmt: skip
    assert segment.words == ["The", "unbelievably", "The", "putsch", "failed", "in", "Algiers"]
    assert report.truncated == 1


def test_a_word_longer_than_the_room_is_cut_inside(minilm_tokenizer):
    segment, _ = one([Document("d", ["Xqzjvkwpxqzjvkwpzz now."])], minilm_tokenizer, max_len=10)
    assert tokens(minilm_tokenizer, segment) == ["[CLS]", "x", "##q", "##z", "##j", "##v", "##k", "##w", "##p", "[SEP]"]
    assert segment.words == ["Xqzjvkwp"] and segment.truncated


# --- pairs from running text (the Wikipedia format) --------------------------------------


def test_sentence_pair_splits_where_the_parts_are_closest_to_equal(minilm_tokenizer):
    doc = Document("w", [THREE_SENTENCES], pair_from_sentences=True)
    segment, _ = one([doc], minilm_tokenizer, packing="balanced")  # 6 | 3+4 beats 6+3 | 4
    assert tokens(minilm_tokenizer, segment) == [
        "[CLS]", "one", "two", "three", "four", "five", ".", "[SEP]",
        "six", "seven", ".", "eight", "nine", "ten", ".", "[SEP]",
    ]  # fmt: skip
    assert segment.token_type_ids == [0] * 8 + [1] * 8 and not segment.truncated


def test_sentence_pair_takes_the_leading_sentences_that_fit(minilm_tokenizer):
    doc = Document("w", [THREE_SENTENCES], pair_from_sentences=True)
    segment, report = one([doc], minilm_tokenizer, max_len=12, packing="balanced")  # 6 + 3 fit, the third does not
    assert tokens(minilm_tokenizer, segment) == [
        "[CLS]", "one", "two", "three", "four", "five", ".", "[SEP]", "six", "seven", ".", "[SEP]",
    ]  # fmt: skip
    assert not segment.truncated and report.truncated == 0  # later sentences are not part of the segment


def test_sentence_pair_whose_first_two_sentences_do_not_fit_is_cut(minilm_tokenizer):
    doc = Document("w", [THREE_SENTENCES], pair_from_sentences=True)
    segment, report = one([doc], minilm_tokenizer, max_len=11, packing="balanced")
    assert tokens(minilm_tokenizer, segment) == [
        "[CLS]", "one", "two", "three", "four", "five", "[SEP]", "six", "seven", ".", "[SEP]",
    ]  # fmt: skip
    assert segment.truncated and report.truncated == 1


def test_single_sentence_text_is_too_short_for_a_pair(minilm_tokenizer):
    documents = [Document("w", ["Just one sentence here."], pair_from_sentences=True)]
    segments, report = make_segments(documents, minilm_tokenizer, SegmentOptions())
    assert segments == [] and report.too_short == 1 and report.documents_seen == 1

    segment, report = one(documents, minilm_tokenizer, allow_single=True)
    assert tokens(minilm_tokenizer, segment) == ["[CLS]", "just", "one", "sentence", "here", ".", "[SEP]"]
    assert report.too_short == 0


def test_empty_documents_are_skipped_and_counted(minilm_tokenizer):
    documents = [
        Document("blank", ["   "]),
        Document("half", ["Left only.", ""]),
        Document("wiki-blank", [" \n "], pair_from_sentences=True),
        Document("control", ["\x00\x01"]),
        Document("ok", ["Fine."]),
    ]
    segments, report = make_segments(documents, minilm_tokenizer, SegmentOptions(limit=None))
    assert [s.doc_id for s in segments] == ["ok"]
    assert report.as_dict() == {"documents_seen": 5, "segments": 1, "truncated": 0, "empty": 4, "too_short": 0,
                                "lengths": length_summary([4])}  # [CLS] fine . [SEP]


def test_more_than_two_parts_is_a_programming_error(minilm_tokenizer):
    with pytest.raises(ValueError, match="3 parts"):
        make_segments([Document("d", ["a", "b", "c"])], minilm_tokenizer, SegmentOptions())


@pytest.mark.parametrize(
    "options, message",
    [({"token_types": "ones"}, "token types must be one of pair, zeros"), ({"max_len": 4}, "at least 8"),
     ({"limit": 0}, "at least 1"), ({"packing": "greedy"}, "packing must be one of clark, balanced")],
)
def test_bad_options_are_user_errors(options, message):
    with pytest.raises(UserError, match=message):
        SegmentOptions(**options)


# --- sampling ----------------------------------------------------------------------------


def test_sample_follows_the_seeded_shuffle_and_skips_do_not_count(minilm_tokenizer):
    documents = [Document(str(i), ["" if i % 3 == 0 else f"Text number {i}."]) for i in range(12)]
    order = list(range(12))
    random.Random(7).shuffle(order)
    usable = [str(i) for i in order if i % 3]

    # no limit: every document in corpus order (a sequential read), whatever the seed
    segments, report = make_segments(documents, minilm_tokenizer, SegmentOptions(limit=None, seed=7))
    assert [s.doc_id for s in segments] == sorted(usable, key=int) and report.empty == 4
    assert [s.document for s in segments] == sorted(map(int, usable))

    segments, report = make_segments(documents, minilm_tokenizer, SegmentOptions(limit=12, seed=7))
    assert [s.doc_id for s in segments] == usable and report.empty == 4
    assert [s.document for s in segments] == [int(i) for i in usable]

    segments, report = make_segments(documents, minilm_tokenizer, SegmentOptions(limit=5, seed=7))
    assert [s.doc_id for s in segments] == usable[:5]
    assert report.documents_seen == order.index(int(usable[4])) + 1
    assert report.segments == 5 and report.documents_seen - report.empty == 5


# --- Clark et al.'s packing ----------------------------------------------------------------

# 45 words that MiniLM keeps whole: sentences of three of them and a full stop, 4 tokens each
NOUNS = ("apple bread chair dog eagle fish grape house iron jacket kite lemon mouse nest orange pencil queen river "
         "stone table umbrella violin water yellow zebra anchor bottle candle desk engine forest garden hammer "
         "island jungle kettle ladder mirror needle ocean piano rabbit saddle tiger valley").split()


def running_text(n_sentences: int) -> tuple[str, list[str]]:
    """n sentences of 3 distinct words + "." (4 tokens each), and the text's words in order."""
    words, sentences = [], []
    for k in range(n_sentences):
        three = NOUNS[3 * k : 3 * k + 3]
        sentences.append(" ".join([three[0].capitalize(), *three[1:]]) + ".")
        words += [three[0].capitalize(), *three[1:], "."]
    return " ".join(sentences), words


def parts(segment: Segment) -> tuple[list[str], list[str]]:
    """The words of part A and part B (split at the middle special token)."""
    middle = [i for i, w in enumerate(segment.word_ids) if w == -1][1]
    a = sorted({w for w in segment.word_ids[:middle] if w >= 0})
    b = sorted({w for w in segment.word_ids[middle:] if w >= 0})
    return [segment.words[w] for w in a], [segment.words[w] for w in b]


def is_run_of(part: list[str], words: list[str]) -> int:
    """Where `part` lies in `words` as one contiguous run; fails the test if it does not."""
    starts = [i for i in range(len(words) - len(part) + 1) if words[i : i + len(part)] == part]
    assert len(starts) == 1, (part, words)
    return starts[0]


def test_clark_packing_fills_chunks_and_cuts_them_back(minilm_tokenizer):
    # max_len 24: a budget of 21 tokens; chunks close once they reach it: 6 sentences (24
    # tokens, cut back by 3), 6 more, then the last 3 at the end of the text (12 tokens, uncut)
    text, words = running_text(15)
    segments, report = make_segments([Document("w", [text], pair_from_sentences=True)], minilm_tokenizer,
                                     SegmentOptions(max_len=24, limit=None))
    assert [s.n_tokens for s in segments] == [24, 24, 15] and [s.truncated for s in segments] == [True, True, False]
    assert report.segments == 3 and report.truncated == 2 and report.documents_seen == 1
    assert report.lengths["mean"] == pytest.approx((24 + 24 + 15) / 3, abs=0.01)
    chunks = [words[:24], words[24:48], words[48:]]
    for segment, chunk in zip(segments, chunks):
        a, b = parts(segment)
        assert a and b and segment.token_type_ids.count(1) == len(b) + 1
        # each part is one run of the chunk's words, A before B: words only go at a part's ends
        assert is_run_of(a, chunk) + len(a) <= is_run_of(b, chunk)
    a, b = parts(segments[2])
    assert a + b == chunks[2] and a[-1] == "." and len(a) in (4, 8)  # uncut: whole sentences, random split


def test_clark_packing_is_seeded_and_the_split_is_random(minilm_tokenizer):
    text, _ = running_text(15)
    doc = [Document("w", [text], pair_from_sentences=True)]
    runs = {seed: make_segments(doc, minilm_tokenizer, SegmentOptions(max_len=24, limit=None, seed=seed))[0]
            for seed in range(8)}
    assert runs[3] == make_segments(doc, minilm_tokenizer, SegmentOptions(max_len=24, limit=None, seed=3))[0]
    splits = {len(parts(segments[2])[0]) for segments in runs.values()}
    assert splits == {4, 8}  # part A of the last chunk: one sentence or two, both drawn


def test_clark_packing_ends_a_text_at_a_one_sentence_chunk(minilm_tokenizer):
    text, _ = running_text(13)  # chunks of 6, 6, then the 13th sentence alone: no part B
    segments, report = make_segments([Document("w", [text], pair_from_sentences=True)], minilm_tokenizer,
                                     SegmentOptions(max_len=24, limit=None))
    assert len(segments) == 2 and report.too_short == 0
    # a first sentence that fills the budget alone gives nothing at all
    long_first = " ".join(NOUNS[:25]).capitalize() + ". Short one here."
    segments, report = make_segments([Document("w", [long_first], pair_from_sentences=True)], minilm_tokenizer,
                                     SegmentOptions(max_len=24, limit=None))
    assert segments == [] and report.too_short == 1


def test_limit_counts_segments_not_documents(minilm_tokenizer):
    text, _ = running_text(15)
    documents = [Document("w", [text], pair_from_sentences=True), Document("x", ["Other text. And more."])]
    segments, report = make_segments(documents, minilm_tokenizer, SegmentOptions(max_len=24, limit=2, seed=0))
    assert len(segments) == 2 and report.segments == 2


def test_length_summary():
    lengths = [10, 20, 30, 40, 128, 128, 128, 128, 17, 16]
    summary = length_summary(lengths)
    assert summary["mean"] == 64.5 and summary["min"] == 10 and summary["max"] == 128
    assert summary["median"] == 40 and summary["p25"] == 17 and summary["p90"] == 128
    assert summary["histogram"] == {"1-16": 2, "17-32": 3, "33-48": 1, "113-128": 4}
    assert length_summary([]) == {}


# --- Wikipedia ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["clark", "balanced"])
def wiki_segments(request, wiki, minilm_tokenizer):
    return *make_segments(wiki, minilm_tokenizer, SegmentOptions(limit=50, packing=request.param)), request.param


def test_wiki_segments_are_clark_pairs(wiki_segments, minilm_tokenizer):
    segments, report, _ = wiki_segments
    cls, sep = minilm_tokenizer.cls_token_id, minilm_tokenizer.sep_token_id
    assert len(segments) == 50 and report.segments == 50
    docs = list(dict.fromkeys(s.doc_id for s in segments))
    assert report.documents_seen == len(docs) + report.too_short + report.empty
    assert report.truncated == sum(s.truncated for s in segments)
    assert report.lengths == length_summary([s.n_tokens for s in segments])
    if wiki_segments[2] == "balanced":
        assert len(docs) == 50  # one segment per article
    else:
        assert len(docs) < 50  # clark: long articles give several
    for s in segments:
        assert s.n_tokens <= 128
        specials = [i for i, t in enumerate(s.input_ids) if t in (cls, sep)]
        middle = specials[1]
        assert len(specials) == 3 and specials[0] == 0 and 1 < middle < s.n_tokens - 2 and specials[2] == s.n_tokens - 1
        assert s.input_ids[0] == cls and s.input_ids[middle] == sep and s.input_ids[-1] == sep
        assert s.token_type_ids == [0] * (middle + 1) + [1] * (s.n_tokens - middle - 1)
        assert [i for i, w in enumerate(s.word_ids) if w == -1] == specials


def test_wiki_word_ids_point_at_the_words_holding_each_token(wiki_segments, minilm_tokenizer):
    normalize = minilm_tokenizer.backend_tokenizer.normalizer.normalize_str  # lowercase, strip accents
    for s in wiki_segments[0]:
        assert sorted(set(w for w in s.word_ids if w >= 0)) == list(range(len(s.words)))
        for token, w in zip(tokens(minilm_tokenizer, s), s.word_ids):
            if w >= 0 and token != "[UNK]":
                assert token.removeprefix("##") in normalize(s.words[w]), (token, s.words[w])


def test_wiki_sample_is_deterministic(wiki, wiki_segments, minilm_tokenizer):
    segments, report, packing = wiki_segments
    again, again_report = make_segments(wiki, minilm_tokenizer, SegmentOptions(limit=50, packing=packing))
    assert again == segments and again_report == report
    other, _ = make_segments(wiki, minilm_tokenizer, SegmentOptions(limit=50, seed=1, packing=packing))
    assert [s.doc_id for s in other] != [s.doc_id for s in again]


# --- collation ---------------------------------------------------------------------------


def test_collate_pads_on_the_right_to_the_longest(minilm_tokenizer):
    segments, _ = make_segments(
        [Document("a", ["Hello world."]), Document("b", ["Hello world.", "Bye now."])],
        minilm_tokenizer,
        SegmentOptions(limit=None),
    )
    short, long = sorted(segments, key=lambda s: s.n_tokens)
    batch = collate([short, long], pad_id=minilm_tokenizer.pad_token_id)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask"}
    for t in batch.values():
        assert t.shape == (2, 9) and t.dtype == torch.long
    assert batch["input_ids"].tolist() == [
        [101, 7592, 2088, 1012, 102, 0, 0, 0, 0],
        [101, 7592, 2088, 1012, 102, 9061, 2085, 1012, 102],
    ]
    assert batch["attention_mask"].tolist() == [[1] * 5 + [0] * 4, [1] * 9]
    assert batch["token_type_ids"].tolist() == [[0] * 9, [0] * 5 + [1] * 4]

    alone = collate([short], pad_id=minilm_tokenizer.pad_token_id)
    assert alone["input_ids"].shape == (1, 5) and alone["attention_mask"].all()
    with pytest.raises(ValueError):
        collate([], pad_id=0)


# --- the lazy stream: the same sample as holding every document -------------------------


def reference_sample(documents, tokenizer, options):
    """The sample as bertscope made it before streaming: every document in a list, the
    list of indices shuffled with random.Random(seed), segments until the limit."""
    order = list(range(len(documents)))
    if options.limit is not None:
        random.Random(options.seed).shuffle(order)
    out = []
    for i in order:
        one = replace(options, limit=None)
        made, _ = make_segments([documents[i]], tokenizer, one)
        for s in made:
            s.document = i
        out += made
        if options.limit is not None and len(out) >= options.limit:
            return out[: options.limit]
    return out


def test_sample_order_is_the_shuffled_list():
    for n, seed in [(0, 0), (1, 5), (10, 0), (1000, 123)]:
        order = list(range(n))
        random.Random(seed).shuffle(order)
        assert list(sample_order(n, seed)) == order


@pytest.mark.parametrize("limit, seed", [(None, 0), (1, 0), (7, 1), (40, 2), (500, 3)])
def test_lazy_text_file_sample_equals_the_in_memory_reference(tmp_path, minilm_tokenizer, limit, seed):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(NOUNS) for _ in range(rng.randint(0, 12))) + ("\t" + "a pair ." if i % 4 == 0 else "")
             for i in range(60)]  # some blank lines, some pairs
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = SegmentOptions(limit=limit, seed=seed, max_len=12)
    documents = list(open_corpus(str(path)))
    lazy_report = SegmentReport()
    lazy = list(iter_segments(open_corpus(str(path)), minilm_tokenizer, options, lazy_report))
    assert lazy == reference_sample(documents, minilm_tokenizer, options)
    assert lazy == make_segments(documents, minilm_tokenizer, options)[0]
    assert lazy_report.segments == len(lazy) == min(limit or len(lazy), len(lazy))
    assert lazy_report.lengths == length_summary([s.n_tokens for s in lazy])


@pytest.mark.parametrize("limit", [1, 13, 60])
def test_clark_sample_stops_inside_a_document_as_before(wiki, minilm_tokenizer, limit):
    """Wikipedia articles give several segments each: the limit may cut an article short."""
    documents = wiki[:120]
    options = SegmentOptions(limit=limit, seed=4, max_len=48)
    lazy = list(iter_segments(documents, minilm_tokenizer, options))
    assert lazy == reference_sample(documents, minilm_tokenizer, options)
    assert len(lazy) == limit and (limit == 1 or len({s.document for s in lazy}) < limit)  # several per article
    assert all(documents[s.document].id == s.doc_id for s in lazy)


def test_length_summary_of_counts_equals_that_of_lengths():
    rng = random.Random(0)
    for n in (1, 2, 5, 99, 1000):
        lengths = [rng.randint(3, 128) for _ in range(n)]
        assert length_summary(Counter(lengths)) == length_summary(lengths)


# --- encoder segments, pinned --------------------------------------------------------------


def segments_digest(segments) -> str:
    """The first 16 hex digits of the SHA-256 of every field of every segment."""
    rows = [[s.input_ids, s.token_type_ids, s.word_ids, s.words, s.doc_id, s.truncated, s.document] for s in segments]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:16]


@pytest.mark.parametrize("options, digest, truncated", [
    (dict(limit=40), "1c14be6e57b1e664", 5),
    (dict(limit=40, packing="balanced", max_len=64, token_types="zeros", seed=3), "089dffea40e5cfca", 14),
    (dict(limit=40, allow_single=True, max_len=200, seed=7), "04d829fe992ae004", 0),
])
def test_encoder_wiki_segments_are_pinned(wiki, minilm_tokenizer, options, digest, truncated):
    """MiniLM's Wikipedia segments, byte for byte as before decoders came (issue 29): a change
    here moves every encoder result."""
    segments, report = make_segments(wiki, minilm_tokenizer, SegmentOptions(**options))
    assert len(segments) == 40 and report.truncated == truncated
    assert segments_digest(segments) == digest


def test_encoder_line_segments_are_pinned(tmp_path, minilm_tokenizer):
    lines = ["One short line.", "A pair's first part.\tIts second part.", "",
             " ".join(f"Sentence number {i} is here." for i in range(12)), "An " + "supercalifragilistic" * 4 + "."]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    segments, _ = make_segments(open_corpus(str(path)), minilm_tokenizer, SegmentOptions(limit=None, max_len=24))
    assert [s.n_tokens for s in segments] == [6, 14, 20, 3] and [s.truncated for s in segments] == [0, 0, 1, 1]
    assert segments_digest(segments) == "9210d18f840e3592"
