"""What the benchmark scripts share: real Wikipedia text cut into segments of exactly L tokens.

    from common import packed_segments, make_batches, wiki_token_stream

A bench script run as `python bench/NAME.py` has bench/ first on sys.path, so `common` is
this file (a script that may be imported from elsewhere puts bench/ on sys.path itself).
"""
from __future__ import annotations


def wiki_token_stream(tokenizer, n_tokens: int):
    """Token ids (and per token a global word id) of consecutive Wikipedia lead sections.

    Articles in load_wiki() order (sorted by title), each tokenized without special
    tokens, concatenated until `n_tokens` tokens; words are numbered across articles.
    """
    from bertscope.text.corpus import load_wiki

    docs = load_wiki()
    ids, word_ids, words = [], [], []
    at = 0
    while len(ids) < n_tokens:
        texts = [d.parts[0] for d in docs[at : at + 64]]
        if not texts:
            raise RuntimeError("not enough Wikipedia text")
        at += len(texts)
        for text, enc in zip(texts, tokenizer(texts, add_special_tokens=False, verbose=False).encodings):
            spans = {}  # the article's word id -> [start, end] in characters
            for w, (start, end) in zip(enc.word_ids, enc.offsets):
                span = spans.setdefault(w, [start, end])
                span[1] = max(span[1], end)
            first = len(words)
            words += [text[start:end] for start, end in spans.values()]
            index = {w: first + i for i, w in enumerate(spans)}
            ids += enc.ids
            word_ids += [index[w] for w in enc.word_ids]
    return ids[:n_tokens], word_ids[:n_tokens], words


def packed_segments(tokenizer, L: int, n: int, stream=None):
    """`n` Segments of exactly L tokens: [CLS] a [SEP] b [SEP], a and b consecutive text halves."""
    from bertscope.text.segments import Segment

    body = L - 3
    ids, wids, words = stream if stream is not None else wiki_token_stream(tokenizer, n * body)
    if len(ids) < n * body:
        raise ValueError("token stream too short")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    segments = []
    for s in range(n):
        chunk, cw = ids[s * body : (s + 1) * body], wids[s * body : (s + 1) * body]
        half = len(chunk) // 2
        a, b = chunk[:half], chunk[half:]
        first = {w: i for i, w in enumerate(dict.fromkeys(cw))}  # global word id -> local index
        local_words = [words[w] for w in first]
        wa, wb = [first[w] for w in cw[:half]], [first[w] for w in cw[half:]]
        segments.append(Segment(
            input_ids=[cls, *a, sep, *b, sep],
            token_type_ids=[0] * (len(a) + 2) + [1] * (len(b) + 1),
            word_ids=[-1, *wa, -1, *wb, -1],
            words=local_words,
            doc_id=f"wiki-stream:{s}",
        ))
    assert all(seg.n_tokens == L for seg in segments)
    return segments


def make_batches(tokenizer, L, batch_size, n_batches, stream):
    """`n_batches` lists of `batch_size` packed segments of exactly L tokens, from `stream`."""
    segments = packed_segments(tokenizer, L, batch_size * n_batches, stream)
    return [segments[i : i + batch_size] for i in range(0, len(segments), batch_size)]
