"""Sentence splitting for Wikipedia text (`bertscope.text.segments` packs sentences into segments).

A sentence ends at a run of . ! ? (plus any closing quotes or brackets) that is followed
by whitespace and then, after any opening quotes or brackets, an uppercase letter or a
digit. A single "." does not end a sentence after an abbreviation: a listed word
("Mr.", "No.", "Sept."), a single letter ("J." in "J. R. R. Tolkien") or a dotted
acronym ("U.S.", "e.g.", "i.e."). Decimals ("3.14") never qualify, as no whitespace
follows their point. Line breaks always end a sentence.
"""
from __future__ import annotations

import re

_END = re.compile(r"""(?P<punct>[.!?]+)["'”’)\]]*(?=\s+["'“‘(\[]*(?P<next>\w))""")
_WORD_BEFORE = re.compile(r"(?<![\w.])[A-Za-z][A-Za-z.]*\Z")
_DOTTED = re.compile(r"[A-Za-z](?:\.[A-Za-z])*")  # "J", "U.S", "e.g"
_LINE = re.compile(r"[^\r\n]+")
_ABBREVIATIONS = frozenset(
    "Mr Mrs Ms Dr Prof St Jr Sr Mt Ft Gen Col Lt Sgt Capt Rev Hon Gov Sen Rep "
    "No Nos Fig Vol Ch vs ca cf approx "
    "Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec".split()
)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, in order (see the rules above)."""
    return [text[start:end] for start, end in sentence_spans(text)]


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the sentences of `text`, whitespace excluded."""
    spans = []
    for line in _LINE.finditer(text):
        start = line.start()
        for end in _ends(text, line.start(), line.end()):
            spans.append((start, end))
            start = end
        spans.append((start, line.end()))
    return [stripped for span in spans if (stripped := _strip(text, *span))]


def _ends(text: str, start: int, stop: int):
    """Offsets just after each sentence-final punctuation run within text[start:stop]."""
    for m in _END.finditer(text, start, stop):
        nxt = m.group("next")
        if not (nxt.isupper() or nxt.isdigit()):
            continue
        if m.group("punct") == "." and _is_abbreviation(text, max(start, m.start() - 16), m.start()):
            continue
        yield m.end()


def _is_abbreviation(text: str, start: int, dot: int) -> bool:
    """Whether the word ending at the "." at `dot` is an abbreviation (looked at from `start`)."""
    word = _WORD_BEFORE.search(text, start, dot)
    return word is not None and (word.group() in _ABBREVIATIONS or _DOTTED.fullmatch(word.group()) is not None)


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The span without surrounding whitespace, None when nothing is left."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None
