"""Documents -> model inputs, in Clark et al.'s format `[CLS] part-1 [SEP] part-2 [SEP]`.

Each part is tokenized on its own, without special tokens, and the tokenizer's own
post-processor then adds them, so every model family gets its own template: BERT's
`[CLS] a [SEP] b [SEP]` with token types 0/1, RoBERTa's `<s> a </s></s> b </s>` with token
types all 0 (its model has a single token-type embedding).

Running text (Wikipedia) becomes sentence pairs in one of two ways (`SegmentOptions.packing`):
- "clark", the default, packs a document as Clark et al.'s `preprocess_unlabeled.py` did
  (BERT's pre-training recipe): sentences are gathered into a chunk until it reaches the
  token budget (max_len minus the specials) or the document ends; the chunk is split into
  part A and part B at a random sentence boundary; the longer part loses a word at its
  front or back, at random, until the pair fits. A long document gives several segments,
  one per chunk; a chunk of one sentence ends the document. Randomness is seeded per
  document (`seed` and document id). The one deliberate difference: Clark cut single
  word-pieces, bertscope cuts whole words, so every token keeps its word.
- "balanced" takes the leading sentences of the document that fit and splits them where
  the two parts are closest to equal length: one segment per document.

Segments longer than `max_len` are cut where a reader would cut them: trailing sentences
go first; a single sentence that still does not fit loses trailing words, never part of
a word's word-pieces, unless one word alone is longer than the room left (then, and only
then, the cut falls inside that word).

Decoders (`SegmentOptions.causal`: the model's architecture is causal) have no pair template:
a segment is one text wrapped in whatever the tokenizer's own template adds around a single
text (`template_ids`: SmolLM2's adds nothing, Gemma-3's a BOS at the start), never an encoder's
[CLS]/[SEP]. Their segments are made so that `max_len` can be the model's whole context:
- running text (Wikipedia) is packed: consecutive documents of the stream (the seeded sample's
  order with a limit, corpus order without) are joined with a blank line until the next one
  would not fit, so a segment falls short of `max_len` by less than one article. A blank line
  is how separate texts are laid out in plain text, which is what a language model reads
  during pre-training; a special token between the articles (BOS, EOS, SmolLM2's chat
  <|im_end|>) would put the tokens that the statistics single out (the mass on the first
  token / BOS) in the middle of a segment, where the template never puts them. Queries see
  the earlier articles (there is no per-article mask): the segment is one long text. Its
  tokens are the tokenization of that whole text, as the tokenizer gives it.
- a line (a document of a user's corpus) is one segment, as for encoders;
- a text longer than the budget alone is cut as above (its last sentence end that fits, else
  its last word end) and the rest is dropped; the segment counts as truncated;
- a pair of texts is refused (sentence pairs are an encoder's template).
Documents are tokenized one at a time (a segment's text once more as a whole), so memory holds
at most one segment's documents and tokenizing a 32k-token segment costs time linear in it.
A decoder's words are the pre-tokenizer's words, split further at whitespace (SentencePiece
tokenizers such as Gemma-3's pre-tokenize whole lines).
"""
from __future__ import annotations

import random
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from itertools import accumulate

import torch
from tokenizers import Encoding

from bertscope.errors import UserError
from bertscope.text.corpus import Document
from bertscope.text.sentences import sentence_spans

TOKEN_TYPES = ("pair", "zeros")
PACKINGS = ("clark", "balanced")
# the most special tokens any family's template adds to a sentence pair (RoBERTa's <s> A </s></s> B </s>):
# `bertscope.models.architectures` holds the families, above this module; tests/models/test_architectures.py holds
# this to its table
MAX_SPECIAL = 4
MIN_MAX_LEN = MAX_SPECIAL + 4  # room for the specials of any template (architectures) plus a few tokens of each part


@dataclass
class Segment:
    """One model input: token ids, token types, and which word each token belongs to."""

    input_ids: list[int]
    token_type_ids: list[int]
    word_ids: list[int]  # per token, an index into `words`; -1 for special tokens
    words: list[str]  # the tokenizer's pre-tokenizer words (punctuation is a word of its own)
    doc_id: str
    truncated: bool = False
    token_class: list[int] | None = None  # per token, a class id of a per-segment scheme (token_classes.py)
    document: int | None = None  # the document's index in the corpus (`iter_segments` sets it)

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)


@dataclass
class SegmentOptions:
    """How to turn documents into segments.

    token_types: "pair" takes token types from the tokenizer's pair template (BERT: 0 for
    `[CLS] part-1 [SEP]`, 1 for `part-2 [SEP]`); "zeros" makes them all 0, which is what
    Clark et al.'s released code did. allow_single: a one-sentence document meant to become
    a sentence pair (`Document.pair_from_sentences`) becomes a single-part segment instead
    of being skipped. packing: how running text becomes sentence pairs, "clark" (several
    full-length segments per long document) or "balanced" (one per document); see the
    module docstring.
    """

    max_len: int = 128
    limit: int | None = 1000
    seed: int = 0
    token_types: str = "pair"
    allow_single: bool = False
    packing: str = "clark"
    causal: bool = False  # a decoder's segments (see the module docstring); token_types, packing do not apply

    def __post_init__(self):
        if self.token_types not in TOKEN_TYPES:
            raise UserError(f"token types must be one of {', '.join(TOKEN_TYPES)}, not {self.token_types!r}")
        if self.packing not in PACKINGS:
            raise UserError(f"packing must be one of {', '.join(PACKINGS)}, not {self.packing!r}")
        if self.max_len < MIN_MAX_LEN:
            raise UserError(f"maximum segment length must be at least {MIN_MAX_LEN} tokens, not {self.max_len}")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"the number of segments must be at least 1, not {self.limit}")


@dataclass
class SegmentReport:
    """What making segments did, recorded in run.json next to the results."""

    documents_seen: int = 0
    segments: int = 0
    truncated: int = 0  # segments cut to fit max_len
    empty: int = 0  # documents skipped: a part without any token
    too_short: int = 0  # documents skipped: one sentence where a sentence pair was wanted
    length_counts: Counter = field(default_factory=Counter, repr=False)  # segments per token count

    def count(self, segment: Segment):
        self.segments += 1
        self.truncated += segment.truncated
        self.length_counts[segment.n_tokens] += 1

    @property
    def lengths(self) -> dict:
        """`length_summary` of the segments' token counts."""
        return length_summary(self.length_counts)

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "length_counts"}
        return {**d, "lengths": self.lengths}


def length_summary(lengths: Sequence[int] | Mapping[int, int], bin_width: int = 16) -> dict:
    """Mean and distribution of segment lengths in tokens, specials included.

    Entropy, its uniform baseline ln L and every 1/L mass depend on L, so a result is only
    comparable to another one with the same length distribution. `histogram` counts
    segments per bin of `bin_width` tokens ("1-16", "17-32", ...). `lengths` is every
    segment's length, or a count of segments per length (what a streamed run keeps).
    """
    counts = lengths if isinstance(lengths, Mapping) else Counter(lengths)
    values = sorted(n for n, c in counts.items() if c > 0)
    if not values:
        return {}
    cumulative = list(accumulate(counts[n] for n in values))
    total = cumulative[-1]

    def quantile(q: float) -> int:  # the k-th smallest length, k = int(q * total)
        return values[bisect_right(cumulative, min(total - 1, int(q * total)))]

    histogram: dict[str, int] = {}
    for n in values:
        low = (n - 1) // bin_width * bin_width + 1
        key = f"{low}-{low + bin_width - 1}"
        histogram[key] = histogram.get(key, 0) + counts[n]
    return {"mean": round(sum(n * counts[n] for n in values) / total, 2), "min": values[0], "p10": quantile(0.1),
            "p25": quantile(0.25), "median": quantile(0.5), "p75": quantile(0.75), "p90": quantile(0.9),
            "max": values[-1], "histogram": histogram}


def describe_lengths(lengths: dict) -> str:
    """One line for the terminal from `length_summary`."""
    if not lengths:
        return "no segments"
    return (f"segment length {lengths['mean']:.1f} tokens on average (min {lengths['min']}, quartiles "
            f"{lengths['p25']} / {lengths['median']} / {lengths['p75']}, max {lengths['max']})")


def sample_order(n: int, seed: int) -> array:
    """The documents' sampled order: `random.Random(seed).shuffle` of 0..n-1, the same
    permutation as a shuffled list, held in 8 bytes per document."""
    order = array("q", range(n))
    random.Random(seed).shuffle(order)
    return order


def iter_segments(documents, tokenizer, options: SegmentOptions, report: SegmentReport | None = None):
    """Segments of a seeded sample of `documents`, made lazily, in the order they are drawn.

    With `options.limit`, the document order is shuffled with `random.Random(options.seed)`
    (`sample_order`) and documents, read by index, are turned into segments in that order
    until `limit` are made (a document packed Clark's way may give several, in text order;
    skipped documents do not count). Without a limit, every document in corpus order, read
    sequentially. `documents` is a list or a lazy corpus (`corpus.open_corpus`: `len`,
    `[i]`, iteration). Each segment's `document` is its document's corpus index. The
    result depends on nothing but the arguments; `report` is filled as segments are made.
    With `options.causal`, a decoder's segments (`_decoder_segments`): a packed segment's
    `document` is its first article's index, its `doc_id` the articles' ids joined by " + ".
    """
    report = report if report is not None else SegmentReport()
    if options.limit is None:
        indexed = enumerate(documents)
    else:
        indexed = ((i, documents[i]) for i in sample_order(len(documents), options.seed))
    if options.causal:
        yield from _decoder_segments(indexed, tokenizer, options, report)
        return
    made_total = 0
    for index, doc in indexed:
        if options.limit is not None and made_total >= options.limit:
            break
        report.documents_seen += 1
        made = _document_segments(doc, tokenizer, options, report)
        if options.limit is not None:
            made = made[: options.limit - made_total]
        made_total += len(made)
        for segment in made:
            segment.document = index
            report.count(segment)
            yield segment


def make_segments(
    documents: Sequence[Document], tokenizer, options: SegmentOptions
) -> tuple[list[Segment], SegmentReport]:
    """Every segment of `iter_segments` in a list, and the report."""
    report = SegmentReport()
    segments = list(iter_segments(documents, tokenizer, options, report))
    return segments, report


def pad_rows(rows: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None, pad_id: int,
             with_types: bool = True) -> dict[str, torch.Tensor]:
    """Token rows padded on the right to the longest: input_ids, attention_mask and (with_types)
    token_type_ids, each (R, L). Missing `types` are zeros. Every batch bertscope feeds a model is
    made here: segments, task rows, fine-tuning batches."""
    if not rows:
        raise ValueError("cannot collate an empty batch")
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)  # (R, L)
    token_type_ids = torch.zeros((len(rows), length), dtype=torch.long)  # (R, L)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)  # (R, L)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention_mask[i, : len(row)] = 1
        if types is not None:
            token_type_ids[i, : len(types[i])] = torch.tensor(types[i], dtype=torch.long)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if with_types:
        batch["token_type_ids"] = token_type_ids
    return batch


def collate(segments: Sequence[Segment], pad_id: int) -> dict[str, torch.Tensor]:
    """A batch padded on the right to its longest segment: input_ids, token_type_ids, attention_mask."""
    return pad_rows([s.input_ids for s in segments], [s.token_type_ids for s in segments], pad_id)


# --- one document ----------------------------------------------------------------------


@dataclass
class _Part:
    """One part tokenized without special tokens, with the places it may be cut.

    `n` is how many leading tokens are kept; `sentence_ends` and `word_ends` are token
    counts at which a sentence or a word ends (increasing, the last one is all tokens).
    """

    text: str
    encoding: Encoding
    sentence_ends: list[int]
    word_ends: list[int]
    n: int = field(init=False)

    def __post_init__(self):
        self.n = len(self.encoding.ids)


def _document_segments(doc: Document, tokenizer, options: SegmentOptions, report: SegmentReport) -> list[Segment]:
    """The segments of one document; none (counted in `report`) when it is skipped."""
    if not 1 <= len(doc.parts) <= 2:
        raise ValueError(f"document {doc.id!r} has {len(doc.parts)} parts; segments take one or two")
    texts = doc.parts
    if doc.pair_from_sentences and len(texts) == 1:
        if options.packing == "clark" and len(sentence_spans(texts[0])) >= 2:
            pairs = _clark_pairs(texts[0], tokenizer, options.max_len, random.Random(f"{options.seed}:{doc.id}"))
            if not pairs:  # the first sentence alone fills the budget: no part B
                report.too_short += 1
                return []
            made = [_text_segment(pair, tokenizer, doc.id, options, cut) for pair, cut in pairs]
            made = [segment for segment in made if segment is not None]
            report.empty += not made
            return made
        texts = _sentence_pair(texts[0], tokenizer, options)
        if texts is None:
            report.too_short += 1
            return []
    segment = _text_segment(texts, tokenizer, doc.id, options)
    if segment is None:
        report.empty += 1
        return []
    return [segment]


def _text_segment(texts: Sequence[str], tokenizer, doc_id: str, options: SegmentOptions,
                  truncated: bool = False) -> Segment | None:
    """One segment of one or two texts, cut to fit; None when a part has no token."""
    parts = _tokenize(tokenizer, texts)
    if not parts or any(p.n == 0 for p in parts):
        return None
    truncated = _fit(parts, options.max_len - n_special(tokenizer, len(parts))) or truncated
    return _assemble(parts, tokenizer, doc_id, truncated, options)


def _clark_pairs(text: str, tokenizer, max_len: int, rng: random.Random) -> list[tuple[list[str], bool]]:
    """Clark et al.'s packing of running text: ([part A, part B], whether words were cut) per chunk.

    Sentences are added to a chunk until its tokens reach the budget or the text ends (so a
    chunk usually overshoots and is cut back); part A is the chunk's first 1..k-1 sentences,
    k drawn uniformly; while the pair is too long, its longer part (B on ties) loses its
    first or its last word, each with probability 1/2. A chunk of a single sentence has no
    part B and ends the text, as in Clark's code.
    """
    spans = sentence_spans(text)
    budget = max_len - n_special(tokenizer, 2)
    sentences = _tokenize(tokenizer, [text[start:end] for start, end in spans])
    pairs, chunk, length = [], [], 0
    for i, sentence in enumerate(sentences):
        chunk.append(i)
        length += sentence.n
        if i < len(sentences) - 1 and length < budget:
            continue
        if len(chunk) < 2:
            break
        a_end = rng.randint(1, len(chunk) - 1)
        a = [w for k in chunk[:a_end] for w in _word_spans(sentences[k], spans[k][0])]
        b = [w for k in chunk[a_end:] for w in _word_spans(sentences[k], spans[k][0])]
        words, totals, cut = (a, b), [sum(n for *_, n in a), sum(n for *_, n in b)], False
        while sum(totals) > budget and a and b:
            k = 0 if totals[0] > totals[1] else 1  # the longer part, B on ties
            totals[k] -= words[k].pop(0 if rng.random() < 0.5 else -1)[2]
            cut = True
        if not a or not b:
            break
        pairs.append(([text[a[0][0] : a[-1][1]], text[b[0][0] : b[-1][1]]], cut))
        chunk, length = [], 0
    return pairs


def _word_spans(part: _Part, offset: int) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of each word of a tokenized text, in characters of the text
    that starts at `offset`."""
    spans, _ = _word_groups(part.encoding, part.n)
    return [(offset + start, offset + end, n) for start, end, n in spans]


def _sentence_pair(text: str, tokenizer, options: SegmentOptions) -> list[str] | None:
    """Two runs of consecutive sentences from the start of `text`, as close to equal as possible.

    Takes the leading sentences that fit a pair segment and splits them at the sentence
    boundary that best balances the two parts' token counts (ties: the earlier boundary).
    When even the first two sentences do not fit together they become the two parts and
    `_fit` cuts them at word boundaries (the segment then counts as truncated). Returns []
    for a text without sentences (skipped as empty) and None for a single sentence
    (skipped as too short) unless `options.allow_single` makes it a single-part segment.
    """
    spans = sentence_spans(text)
    if len(spans) < 2:
        if spans and options.allow_single:
            return [text[slice(*spans[0])]]
        return [] if not spans else None
    budget = options.max_len - n_special(tokenizer, 2)
    counts = [p.n for p in _tokenize(tokenizer, [text[start:end] for start, end in spans])]
    taken, total = 0, 0
    while taken < len(counts) and total + counts[taken] <= budget:
        total += counts[taken]
        taken += 1
    if taken < 2:
        return [text[slice(*spans[0])], text[slice(*spans[1])]]
    split = min(range(1, taken), key=lambda j: abs(2 * sum(counts[:j]) - total))
    return [text[spans[0][0] : spans[split - 1][1]], text[spans[split][0] : spans[taken - 1][1]]]


def _tokenize(tokenizer, texts: Sequence[str]) -> list[_Part]:
    """Each text tokenized alone, without special tokens, padding or truncation.

    Special-token spellings inside the text ("[SEP]") are tokenized as ordinary text, so
    only the template's [CLS]/[SEP] ever count as such in the attention statistics.
    """
    if not texts:
        return []
    batch = tokenizer(list(texts), add_special_tokens=False, padding=False, truncation=False,
                      split_special_tokens=True, verbose=False)
    parts = []
    for text, encoding in zip(texts, batch.encodings):
        token_ends = [end for _, end in encoding.offsets]
        sentence_ends = sorted({bisect_right(token_ends, end) for _, end in sentence_spans(text)})
        word_ids = encoding.word_ids
        word_ends = [i for i in range(1, len(word_ids)) if word_ids[i] != word_ids[i - 1]] + [len(word_ids)]
        parts.append(_Part(text, encoding, sentence_ends, word_ends))
    return parts


def n_special(tokenizer, n_parts: int) -> int:
    return post_processor(tokenizer).num_special_tokens_to_add(n_parts == 2)


def post_processor(tokenizer):
    processor = getattr(getattr(tokenizer, "backend_tokenizer", None), "post_processor", None)
    if processor is None:
        raise ValueError(f"{type(tokenizer).__name__} has no fast-tokenizer post-processor to add special tokens")
    return processor


def _fit(parts: list[_Part], budget: int) -> bool:
    """Shorten the parts until their tokens fit `budget`; whether anything was cut.

    The longer part (the later one on ties, so the start of the text survives) loses its
    last sentence; once it holds a single sentence it is cut at the last word boundary that
    leaves room for the other part, but never below half the budget, so two long parts
    share the room instead of one vanishing.
    """
    truncated = False
    while sum(p.n for p in parts) > budget:
        truncated = True
        longer = max(reversed(parts), key=lambda p: p.n)
        sentence_cuts = [c for c in longer.sentence_ends if 0 < c < longer.n]
        if sentence_cuts:
            longer.n = sentence_cuts[-1]
            continue
        others = sum(p.n for p in parts) - longer.n
        target = max(budget - others, budget // len(parts))
        word_cuts = [c for c in longer.word_ends if 0 < c <= target]
        longer.n = word_cuts[-1] if word_cuts else target
    return truncated


def _assemble(parts: list[_Part], tokenizer, doc_id: str, truncated: bool, options: SegmentOptions) -> Segment:
    """The parts (cut to their kept length) wrapped in the tokenizer's special-token template."""
    words: list[str] = []
    token_words = []  # per kept token, part-1 then part-2: index into `words`
    for part in parts:
        part.encoding.truncate(part.n)
        part_words, part_token_words = _words(part)
        token_words += [len(words) + w for w in part_token_words]
        words += part_words
    second = parts[1].encoding if len(parts) == 2 else None
    encoding = post_processor(tokenizer).process(parts[0].encoding, second, add_special_tokens=True)

    # Templates keep the parts' tokens in order and mark only the tokens they add as special
    # (the encoding's sequence ids cannot be used: TemplateProcessing leaves part-1's unset).
    text_tokens = iter(token_words)
    word_ids = [-1 if special else next(text_tokens) for special in encoding.special_tokens_mask]
    token_types = list(encoding.type_ids) if options.token_types == "pair" else [0] * len(encoding.ids)
    return Segment(list(encoding.ids), token_types, word_ids, words, doc_id, truncated)


def _words(part: _Part) -> tuple[list[str], list[int]]:
    """The words of a part's kept tokens, and per kept token the index of its word.

    A word is the text spanned by the tokens sharing a pre-tokenizer word id; a token
    without a word id (an added token) is a word of its own.
    """
    spans, token_words = _word_groups(part.encoding, part.n)
    return [part.text[start:end].strip() for start, end, _ in spans], token_words


def _word_groups(encoding: Encoding, n: int) -> tuple[list[list[int]], list[int]]:
    """The first `n` tokens grouped into words: [start, end, tokens] of each word in
    characters, and per token the index of its word."""
    spans: list[list[int]] = []
    token_words = []
    previous = object()
    # each read of encoding.word_ids / .offsets copies the whole list out of the tokenizer
    for word_id, (start, end) in zip(encoding.word_ids[:n], encoding.offsets[:n]):
        if word_id is None or word_id != previous:
            spans.append([start, end, 1])
        else:
            spans[-1][1] = max(spans[-1][1], end)
            spans[-1][2] += 1
        previous = word_id
        token_words.append(len(spans) - 1)
    return spans, token_words


# --- decoders ----------------------------------------------------------------------------

DECODER_SEPARATOR = "\n\n"  # between packed documents: a blank line (see the module docstring)


def template_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The token ids a tokenizer's own template puts before and after one text (SmolLM2: none,
    none; Gemma-3: [<bos>], none), read off a probe encoded with and without special tokens."""
    probe = "a"
    plain = tokenizer(probe, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True, split_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    raise ValueError(f"{type(tokenizer).__name__}'s template does not keep a text's tokens together: {full}")


def _decoder_segments(indexed, tokenizer, options: SegmentOptions, report: SegmentReport):
    """A decoder's segments of the documents `indexed` yields ((corpus index, Document)), at
    most `options.limit`: packed running text or one segment per line (module docstring).

    Each document is tokenized alone to plan the packing; the articles taken are then tokenized
    once more as one text (`_close`), which is what the segment holds. `pending` holds the
    articles of the segment being filled, never more than one segment's worth.
    """
    prefix, suffix = template_ids(tokenizer)
    budget = options.max_len - len(prefix) - len(suffix)
    separator = _separator_cost(tokenizer)
    pending: list[tuple[int, Document, _Part]] = []
    made = 0

    def close():
        nonlocal made
        segment = _close(pending, tokenizer, prefix, suffix, budget, report)
        report.count(segment)
        made += 1
        return segment

    def done() -> bool:
        return options.limit is not None and made >= options.limit

    for index, doc in indexed:
        if done():
            return
        if len(doc.parts) != 1:
            raise UserError(f"document {doc.id!r} is a pair of texts; a decoder takes one text per segment "
                            "(sentence pairs are an encoder's template)")
        (part,) = _tokenize(tokenizer, doc.parts)
        if part.n == 0 or not doc.parts[0].strip():  # a decoder's tokenizer has tokens for whitespace
            report.documents_seen += 1
            report.empty += 1
            continue
        article = (index, doc, part)
        if doc.pair_from_sentences:  # running text: packed
            while pending and sum(p.n + separator for _, _, p in pending) + part.n > budget:
                yield close()
                if done():
                    return
            pending.append(article)
            continue
        while pending:  # a line of its own: the articles before it first, in stream order
            yield close()
            if done():
                return
        pending.append(article)
        yield close()
    while pending and not done():
        yield close()


def _separator_cost(tokenizer) -> int:
    """The tokens a blank line between two texts adds (SmolLM2 tokenizes it as two newlines
    between texts, as one alone)."""
    def n(text):
        return len(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    return max(0, n(f"a{DECODER_SEPARATOR}b") - n("a") - n("b"))


def _close(pending: list, tokenizer, prefix: list[int], suffix: list[int], budget: int,
           report: SegmentReport) -> Segment:
    """The segment of the leading articles of `pending` that fit `budget` as one text, joined
    with blank lines; they are removed from `pending`. The planned articles fit unless the
    tokens at their joins differ from those of the texts alone: then the last ones wait for
    the next segment. A single article is cut to fit."""
    k = len(pending)
    while True:
        if k == 1:
            index, doc, part = pending[0]
            truncated = _cut(part, budget)
            doc_id = doc.id
            break
        text = DECODER_SEPARATOR.join(doc.parts[0] for _, doc, _ in pending[:k])
        (part,) = _tokenize(tokenizer, [text])
        if part.n <= budget:
            truncated = False
            index, doc_id = pending[0][0], " + ".join(doc.id for _, doc, _ in pending[:k])
            break
        k -= 1
    del pending[:k]
    report.documents_seen += k
    spans, token_words = _decoder_word_groups(part, part.n)
    words = [part.text[start:end].strip() or part.text[start:end] for start, end, _ in spans]
    ids = prefix + part.encoding.ids[: part.n] + suffix
    word_ids = [-1] * len(prefix) + token_words + [-1] * len(suffix)
    return Segment(ids, [0] * len(ids), word_ids, words, doc_id, truncated, document=index)


def _cut(part: _Part, budget: int) -> bool:
    """Keep a text's tokens up to its last sentence end within `budget`, else its last word end,
    else `budget` (one word longer than the budget); whether anything was cut."""
    if part.n <= budget:
        return False
    sentence_ends = part.sentence_ends[: bisect_right(part.sentence_ends, budget)]
    if sentence_ends and sentence_ends[-1] > 0:
        part.n = sentence_ends[-1]
        return True
    _, token_words = _decoder_word_groups(part, budget + 1)  # token `budget` starts a word, or not
    starts = [i for i in range(1, budget + 1) if token_words[i] != token_words[i - 1]]
    part.n = starts[-1] if starts else budget
    return True


def _decoder_word_groups(part: _Part, n: int) -> tuple[list[list[int]], list[int]]:
    """Like `_word_groups`, for a decoder: a token also starts a word where its text starts with
    whitespace or follows whitespace, so SentencePiece's whole-line pre-tokenizer words (Gemma-3)
    become words as byte-level BPE's are (SmolLM2)."""
    text = part.text
    spans: list[list[int]] = []
    token_words = []
    previous = object()
    for word_id, (start, end) in zip(part.encoding.word_ids[:n], part.encoding.offsets[:n]):
        if (word_id is None or word_id != previous or text[start : start + 1].isspace()
                or (start > 0 and text[start - 1].isspace())):
            spans.append([start, end, 1])
        else:
            spans[-1][1] = max(spans[-1][1], end)
            spans[-1][2] += 1
        previous = word_id
        token_words.append(len(spans) - 1)
    return spans, token_words
