"""GAP coreference (Webster et al. 2018): a pronoun and two candidate names per snippet.

Each row of `gap-<split>.tsv` holds a Wikipedia snippet, the pronoun with its character
offset, names A and B with their offsets and whether each corefers with the pronoun.
Rows are split into words the way BERT's basic tokenizer splits text (runs of letters and
digits, every other non-space character a word of its own), with a forced word boundary
at the start and end of the pronoun and of both names, so that each maps to whole words.
`bertscope.text.word_segments.word_segment(example.words, ...)` then turns a row into model input.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from bertscope.data.paths import dataset_dir
from bertscope.errors import UserError

SPLITS = ("development", "validation", "test")
COLUMNS = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref", "URL"]
_WORD = re.compile(r"\w+|[^\w\s]")
_BOOL = {"TRUE": True, "FALSE": False}


@dataclass
class GapExample:
    """One GAP row with its word segmentation.

    words / word_spans: the words of `text` and their (start, end) character spans.
    pronoun_word: index of the pronoun's word; a_words / b_words: (first, end) word range
    of each name, end exclusive; `a_word` / `b_word` are the first words.
    """

    id: str
    text: str
    pronoun: str
    pronoun_offset: int
    a: str
    a_offset: int
    a_coref: bool
    b: str
    b_offset: int
    b_coref: bool
    url: str
    words: list[str] = field(default_factory=list)
    word_spans: list[tuple[int, int]] = field(default_factory=list)
    pronoun_word: int = -1
    a_words: tuple[int, int] = (-1, -1)
    b_words: tuple[int, int] = (-1, -1)

    @property
    def a_word(self) -> int:
        return self.a_words[0]

    @property
    def b_word(self) -> int:
        return self.b_words[0]

    @property
    def label(self) -> str:
        """"A", "B" or "neither": which name the pronoun refers to."""
        return "A" if self.a_coref else "B" if self.b_coref else "neither"


def gap_path(split: str = "development", data_dir: str | None = None) -> Path:
    if split not in SPLITS:
        raise UserError(f"GAP split must be one of {', '.join(SPLITS)}, not {split!r}")
    path = dataset_dir("gap", data_dir) / f"gap-{split}.tsv"
    if not path.is_file():
        raise UserError(f"GAP {split} split not found: {path}")
    return path


def read_gap(split: str = "development", data_dir: str | None = None) -> list[GapExample]:
    """The rows of one GAP split (development: 2,000; validation: 454)."""
    return read_gap_file(gap_path(split, data_dir))


def read_gap_file(path: str | Path) -> list[GapExample]:
    """Every row of a GAP TSV file; a malformed row is a UserError naming file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UserError(f"GAP file not found: {path}") from None
    if not lines or lines[0].split("\t") != COLUMNS:
        raise UserError(f"{path.name}, line 1: expected the GAP header {' '.join(COLUMNS)} ({path})")
    examples = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            examples.append(_example(line))
        except ValueError as error:
            raise UserError(f"{path.name}, line {number}: {error} ({path})") from None
    return examples


def _example(line: str) -> GapExample:
    columns = line.split("\t")
    if len(columns) != len(COLUMNS):
        raise ValueError(f"expected {len(COLUMNS)} tab-separated columns, found {len(columns)}")
    id_, text, pronoun, p_off, a, a_off, a_coref, b, b_off, b_coref, url = columns
    offsets = {}
    for name, value, what in ((pronoun, p_off, "pronoun"), (a, a_off, "A"), (b, b_off, "B")):
        if not value.isdigit():
            raise ValueError(f"{what} offset must be a number, not {value!r}")
        offset = int(value)
        if text[offset : offset + len(name)] != name:
            raise ValueError(f"{what} {name!r} is not at offset {offset} of the text")
        offsets[what] = (offset, offset + len(name))
    for value, what in ((a_coref, "A-coref"), (b_coref, "B-coref")):
        if value.upper() not in _BOOL:
            raise ValueError(f"{what} must be TRUE or FALSE, not {value!r}")
    spans = split_text(text, [edge for span in offsets.values() for edge in span])
    starts = {start: i for i, (start, _) in enumerate(spans)}
    ends = {end: i + 1 for i, (_, end) in enumerate(spans)}

    def word_range(what: str) -> tuple[int, int]:
        start, end = offsets[what]
        if start not in starts or end not in ends:
            raise ValueError(f"{what} does not start and end at word boundaries")
        return starts[start], ends[end]

    return GapExample(
        id=id_, text=text, pronoun=pronoun, pronoun_offset=offsets["pronoun"][0],
        a=a, a_offset=offsets["A"][0], a_coref=_BOOL[a_coref.upper()],
        b=b, b_offset=offsets["B"][0], b_coref=_BOOL[b_coref.upper()], url=url,
        words=[text[s:e] for s, e in spans], word_spans=spans,
        pronoun_word=word_range("pronoun")[0], a_words=word_range("A"), b_words=word_range("B"),
    )


def split_text(text: str, boundaries=()) -> list[tuple[int, int]]:
    """(start, end) character spans of the words of `text`: runs of word characters, and
    every other non-space character alone; a word is also cut at each given boundary."""
    cuts = sorted(set(boundaries))
    spans = []
    for match in _WORD.finditer(text):
        start, end = match.span()
        for cut in cuts:
            if start < cut < end:
                spans.append((start, cut))
                start = cut
        spans.append((start, end))
    return spans
