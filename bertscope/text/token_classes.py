"""Token classes: a class id for every token of a segment, from any source.

The kernels report the attention mass every row puts on each key *class*, and the
accumulators sum rows per *row group* (query rows of one class). What a class means is
decided here, never in the kernels:

    vocab    Clark et al.'s [CLS] / [SEP] / "." and "," / other, by token id (the default;
             one table lookup per token)
    parts    [CLS] / [SEP] / part A / part B of a pair, from the segment's structure:
             Kovaleva et al.'s "block" pattern is attention within the query's own part
    tags     a tag per word (gold UPOS, dependency relations, ...), given to every token of
             the word; special tokens keep their own classes
    words    a word list (negation words, say): its words are one class

Every scheme but `vocab` stores the ids on the segment (`Segment.token_class`) and the
engine checks that they align with the tokens before a forward pass. The first two classes
of every scheme are [CLS] and [SEP] and the last is the catch-all, so analyses of special
tokens read the same columns whatever the scheme.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

KEY_CLASSES = ("cls", "sep", "punct", "other")

# the vocab scheme's table of a tokenizer (`bertscope.models.loading.token_class_table`) is built where the
# model families are known: the spellings of "." and "," differ between their vocabularies

PART_CLASSES = ("cls", "sep", "part_a", "part_b")


@dataclass(frozen=True)
class TokenClasses:
    """The class scheme of a run: class names (id = position) and the row groups to report.

    names:      C class names; a token's class id indexes them
    row_groups: names of the classes whose query rows get sums of their own (e.g. the rows of
                [SEP] for Clark's [SEP] -> [SEP] mass, the rows of nouns for Kovaleva et al.);
                "non_<class>" is every row but that class's (Clark's other -> [SEP] is the
                [SEP] mass of the "non_sep" rows)
    source:     where the ids come from: "vocab" (looked up by token id) or the name of a
                per-segment source ("parts", "tags:upos", "words:negation", ...)
    """

    names: tuple[str, ...] = KEY_CLASSES
    row_groups: tuple[str, ...] = ("cls", "sep", "punct", "non_sep")
    source: str = "vocab"

    def __post_init__(self):
        if not self.names:
            raise ValueError("a class scheme needs at least one class")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"class names must be distinct, got {self.names}")
        unknown = [g for g in self.row_groups if self.group_class(g)[0] not in self.names]
        if unknown:
            raise ValueError(f"row groups {unknown} are not classes of {self.names}")
        if "all" in self.names:
            raise ValueError("'all' is reserved for the group of every row")

    @staticmethod
    def group_class(group: str) -> tuple[str, bool]:
        """(class, complement) of a row group: ("sep", False) for "sep", ("sep", True) for "non_sep"."""
        return (group[4:], True) if group.startswith("non_") else (group, False)

    @property
    def n_classes(self) -> int:
        return len(self.names)

    @property
    def group_names(self) -> tuple[str, ...]:
        """Row groups in accumulator order: every valid row first, then each named group."""
        return ("all",) + self.row_groups

    @property
    def per_segment(self) -> bool:
        return self.source != "vocab"

    def as_dict(self) -> dict:
        return {"names": list(self.names), "row_groups": list(self.row_groups), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> TokenClasses:
        return cls(tuple(d["names"]), tuple(d["row_groups"]), d.get("source", "vocab"))

    @classmethod
    def of(cls, classes) -> TokenClasses:
        """A scheme from a scheme or from bare class names (vocab-style: every class but the
        last catch-all is a row group, and so are the rows that are not [SEP])."""
        if isinstance(classes, TokenClasses):
            return classes
        names = tuple(classes)
        return cls(names, names[:-1] + (("non_sep",) if "sep" in names else ()))


VOCAB = TokenClasses()
PARTS = TokenClasses(PART_CLASSES, ("part_a", "part_b"), "parts")


def first_token_class(key_class: torch.Tensor, key_valid: torch.Tensor, n_classes: int) -> torch.Tensor:
    """A decoder's classes: class 0 (every scheme's [CLS]) becomes the *first* real token of each
    segment, whatever it is (BOS where the tokenizer adds one, else the first word's token); a
    class-0 token anywhere else becomes the catch-all (the last class). A decoder has no [CLS],
    but its first token takes [CLS]'s place in Clark et al.'s reading: every row sees it, and
    heads park their attention on it (the "attention sink").

    key_class: (B, L) int64; key_valid: (B, L) bool (left or right padding). Returns a new (B, L).
    """
    out = key_class.masked_fill(key_class == 0, n_classes - 1)
    first = key_valid.long().argmax(-1, keepdim=True)  # (B, 1) first real position
    has = key_valid.any(-1, keepdim=True)  # (B, 1) a row of padding only keeps its classes
    return out.scatter(-1, first, torch.where(has, 0, out.gather(-1, first)))


# --- per-segment sources ----------------------------------------------------------------


def _special_class(segment, i: int, tokenizer) -> int | None:
    """0 for the [CLS] token, 1 for [SEP], None for a token of a word (shared by the schemes)."""
    if segment.word_ids[i] >= 0:
        return None
    return 0 if segment.input_ids[i] == tokenizer.cls_token_id else 1


def part_ids(segment, tokenizer) -> list[int]:
    """Class ids of the `PARTS` scheme: a word token is part A until the first special token
    after a word (BERT's middle [SEP], RoBERTa's `</s></s>`), part B after it. Special tokens
    other than [CLS] count as [SEP] (RoBERTa's <s> is its [CLS])."""
    ids, seen_word, part = [], False, 0
    for i in range(segment.n_tokens):
        special = _special_class(segment, i, tokenizer)
        if special is None:
            seen_word = True
            ids.append(2 + part)
        else:
            part = 1 if seen_word else 0
            ids.append(special)
    return ids


def tag_scheme(tags: Sequence[str], name: str, row_groups: Sequence[str] | None = None) -> TokenClasses:
    """[CLS], [SEP], one class per tag, then "other" for words whose tag is not listed."""
    tags = tuple(tags)
    return TokenClasses(("cls", "sep") + tags + ("other",), tuple(tags if row_groups is None else row_groups),
                        f"tags:{name}")


def tag_ids(segment, word_tags: Sequence[str], scheme: TokenClasses, tokenizer) -> list[int]:
    """Class ids of a tag scheme: every token of word w gets the class of `word_tags[w]`."""
    if len(word_tags) != len(segment.words):
        raise ValueError(f"{len(word_tags)} tags for the {len(segment.words)} words of segment {segment.doc_id!r}")
    index = {name: c for c, name in enumerate(scheme.names)}
    other = scheme.n_classes - 1
    ids = []
    for i in range(segment.n_tokens):
        special = _special_class(segment, i, tokenizer)
        ids.append(special if special is not None else index.get(word_tags[segment.word_ids[i]], other))
    return ids


def word_list_scheme(name: str) -> TokenClasses:
    """[CLS], [SEP], the words of one list, everything else."""
    return TokenClasses(("cls", "sep", name, "other"), (name,), f"words:{name}")


def word_list_ids(segment, words: set[str], tokenizer) -> list[int]:
    """Class ids of a word-list scheme; words are matched lower-cased."""
    lowered = [w.lower() for w in segment.words]
    ids = []
    for i in range(segment.n_tokens):
        special = _special_class(segment, i, tokenizer)
        ids.append(special if special is not None else (2 if lowered[segment.word_ids[i]] in words else 3))
    return ids


def check_ids(segment, ids: Sequence[int] | None, scheme: TokenClasses) -> None:
    """A one-line ValueError unless `ids` gives a class in range to every token of `segment`."""
    if ids is None:
        raise ValueError(f"segment {segment.doc_id!r} has no token classes for the {scheme.source!r} scheme")
    if len(ids) != segment.n_tokens:
        raise ValueError(f"segment {segment.doc_id!r}: {len(ids)} token classes for {segment.n_tokens} tokens")
    bad = [c for c in ids if not 0 <= c < scheme.n_classes]
    if bad:
        raise ValueError(f"segment {segment.doc_id!r}: class id {bad[0]} outside 0..{scheme.n_classes - 1}")
