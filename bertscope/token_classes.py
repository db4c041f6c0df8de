"""Key token classes: which keys count as [CLS], [SEP], punctuation or anything else.

Clark et al. single out attention to [CLS], to [SEP] and to the punctuation marks "." and
",". A class id per vocabulary entry turns that into one lookup per token; a new class is
one more entry in `CLASS_TOKENS` (the last class, "other", catches the rest).
"""
from __future__ import annotations

import torch

KEY_CLASSES = ("cls", "sep", "punct", "other")

# Spellings of the punctuation class across vocabularies: WordPiece ".", byte-level BPE
# with a leading-space marker "Ġ.", SentencePiece "▁.".
PUNCT_TOKENS = (".", ",", "Ġ.", "Ġ,", "▁.", "▁,")


def token_class_table(tokenizer) -> torch.Tensor:
    """(vocab,) int64 class id of every token id, special tokens taken from the tokenizer."""
    size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    table = torch.full((size,), KEY_CLASSES.index("other"), dtype=torch.long)
    vocab = tokenizer.get_vocab()
    for tok in PUNCT_TOKENS:
        if tok in vocab:
            table[vocab[tok]] = KEY_CLASSES.index("punct")
    # special tokens last: they win over any clash
    if tokenizer.sep_token_id is not None:
        table[tokenizer.sep_token_id] = KEY_CLASSES.index("sep")
    if tokenizer.cls_token_id is not None:
        table[tokenizer.cls_token_id] = KEY_CLASSES.index("cls")
    return table
