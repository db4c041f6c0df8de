"""Segments of pre-split gold words (treebanks, coreference, GAP): one model input per
sentence or passage from its gold word forms, every token keeping its word, for the word-level
probes and analyses.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from tokenizers import Encoding

from bertscope.text.segments import TOKEN_TYPES, Segment, n_special, post_processor


def word_segment(
    words: Sequence[str], tokenizer, max_len: int, doc_id: str = "", second: Sequence[str] | None = None,
    token_types: str = "pair",
) -> Segment | None:
    """The segment `[CLS] words [SEP]` (or `[CLS] words [SEP] second [SEP]`) of gold words.

    Unlike `make_segments`, the words are given (a treebank's or a coreference corpus's),
    so `Segment.words` is `words` (+ `second`) exactly and `Segment.word_ids` maps every
    token to the index of its gold word (`second`'s words come after `words`), -1 for the
    template's special tokens. The words are tokenized as running text joined by single
    spaces, so byte-level BPE (RoBERTa) sees each non-initial word with its leading space
    (`Ġword`) as in ordinary text, and WordPiece/SentencePiece split them as usual. A word
    the tokenizer drops entirely (e.g. a lone zero-width or control character) becomes the
    unknown token, so every word has at least one token. Special-token spellings inside
    the words ("[SEP]") are tokenized as ordinary text.

    Returns None when the tokens do not fit `max_len` (the caller counts those); nothing
    is ever cut.
    """
    if token_types not in TOKEN_TYPES:
        raise ValueError(f"token types must be one of {', '.join(TOKEN_TYPES)}, not {token_types!r}")
    word_lists = [list(words)] if second is None else [list(words), list(second)]
    if any(not part for part in word_lists):
        raise ValueError("word_segment needs at least one word in each part")
    if sum(len(part) for part in word_lists) + n_special(tokenizer, len(word_lists)) > max_len:
        return None  # at least one token per word
    parts = [_gold_word_tokens(part, tokenizer) for part in word_lists]
    if sum(len(ids) for ids, _, _ in parts) + n_special(tokenizer, len(parts)) > max_len:
        return None

    # the template (specials and token types) from the parts' encodings; its non-special
    # positions are part-1's tokens then part-2's, which are replaced by the gold-word tokens
    encodings = [encoding if len(encoding.ids) else _placeholder(tokenizer) for _, _, encoding in parts]
    processed = post_processor(tokenizer).process(encodings[0], encodings[1] if len(encodings) == 2 else None,
                                                  add_special_tokens=True)
    input_ids, type_ids, word_ids = [], [], []
    offset, part_index, left = 0, 0, 0
    for token_id, type_id, special in zip(processed.ids, processed.type_ids, processed.special_tokens_mask):
        if special:
            input_ids.append(token_id)
            type_ids.append(type_id)
            word_ids.append(-1)
            continue
        if left == 0:  # the first template position of the next part: emit all its tokens
            ids, token_words, _ = parts[part_index]
            input_ids += ids
            type_ids += [type_id] * len(ids)
            word_ids += [offset + w for w in token_words]
            offset += len(word_lists[part_index])
            left = len(encodings[part_index].ids)
            part_index += 1
        left -= 1
    if part_index != len(parts) or left != 0:
        raise ValueError(f"{type(tokenizer).__name__}'s template does not keep each part's tokens together")
    if token_types == "zeros":
        type_ids = [0] * len(input_ids)
    all_words = [w for part in word_lists for w in part]
    return Segment(input_ids, type_ids, word_ids, all_words, doc_id, truncated=False)


def split_words(
    words: Sequence[str], tokenizer, max_len: int, boundaries: Sequence[int] | None = None
) -> list[tuple[int, int]]:
    """Consecutive windows (start, end), end exclusive, of whole words covering `words`,
    each of which `word_segment(words[start:end], tokenizer, max_len)` fits.

    Windows are filled greedily. With `boundaries` (word indices where a cut is allowed,
    e.g. the first word of each sentence), a window ends at the last boundary that fits,
    and only at a plain word boundary when not even one boundary-to-boundary stretch fits.
    A word that alone does not fit becomes a window of its own (its segment is None).
    """
    words = list(words)
    n = len(words)
    if n == 0:
        return []
    budget = max_len - n_special(tokenizer, 1)
    counts = _word_token_counts(words, tokenizer)
    allowed = sorted({b for b in boundaries if 0 < b < n}) if boundaries is not None else None
    windows = []
    start = 0
    while start < n:
        # a window's first word has no space before it, which can change its tokens
        # (byte-level BPE): count it alone, the others as in running text
        end, total = start + 1, len(_gold_word_tokens(words[start : start + 1], tokenizer)[0])
        while end < n and total + counts[end] <= budget:
            total += counts[end]
            end += 1
        if total <= budget:
            # a safety check of the whole window's real count
            while end > start + 1 and len(_gold_word_tokens(words[start:end], tokenizer)[0]) > budget:
                end -= 1
            if allowed and end < n:
                cuts = [b for b in allowed if start < b <= end]
                if cuts:
                    end = cuts[-1]
        windows.append((start, end))
        start = end
    return windows


def _gold_word_tokens(words: Sequence[str], tokenizer) -> tuple[list[int], list[int], Encoding]:
    """Token ids of `words` joined by spaces, the gold word of each token, and the encoding."""
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    text = " ".join(words)
    encoding = tokenizer([text], add_special_tokens=False, padding=False, truncation=False,
                         split_special_tokens=True, verbose=False).encodings[0]
    per_word: list[list[int]] = [[] for _ in words]
    for token_id, (start, _end) in zip(encoding.ids, encoding.offsets):
        # a token belongs to the word holding its first non-space character; a token of
        # spaces only (a lone byte-level "Ġ") belongs to the word after it
        while start < len(text) and text[start] == " ":
            start += 1
        per_word[max(0, bisect_right(starts, start) - 1)].append(token_id)
    unk = tokenizer.unk_token_id
    ids, token_words = [], []
    for w, word_tokens in enumerate(per_word):
        if not word_tokens:
            if unk is None:
                raise ValueError(f"{type(tokenizer).__name__} gives no token for the word {words[w]!r} and has no "
                                 "unknown token")
            word_tokens = [unk]
        ids += word_tokens
        token_words += [w] * len(word_tokens)
    return ids, token_words, encoding


def _placeholder(tokenizer) -> Encoding:
    """An encoding of ordinary text, to learn the template of a part whose words all became [UNK]."""
    encoding = tokenizer(["a"], add_special_tokens=False, verbose=False).encodings[0]
    if not encoding.ids:
        raise ValueError(f"{type(tokenizer).__name__} gives no token for 'a'")
    return encoding


def _word_token_counts(words: Sequence[str], tokenizer) -> list[int]:
    """Tokens per word when `words` are tokenized as one running text."""
    _, token_words, _ = _gold_word_tokens(words, tokenizer)
    counts = [0] * len(words)
    for w in token_words:
        counts[w] += 1
    return counts
