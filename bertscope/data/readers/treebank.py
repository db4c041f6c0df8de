"""CoNLL-U treebanks: UD English-EWT dev and the GUM documents.

Files are parsed with the `conllu` package after a light validation pass of our own, so a
malformed line is reported as a `UserError` naming the file and its line number (the
package reports neither, and accepts some broken lines silently, e.g. a missing column).

Only syntactic words are kept: multiword-token lines (`1-2`) and empty nodes (`1.1`) are
skipped, so `heads` index `words` directly (1-based, 0 = root, as in CoNLL-U).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import conllu
from conllu.exceptions import ParseException

from bertscope.data.paths import dataset_dir
from bertscope.errors import UserError

EWT_DEV = "en_ewt-ud-dev.conllu"

_WORD_ID = re.compile(r"[1-9][0-9]*")
_RANGE_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*")
_EMPTY_ID = re.compile(r"[0-9]+\.[1-9][0-9]*")
_HEAD = re.compile(r"0|[1-9][0-9]*")


def _raw(line: list[str], i: int) -> str:
    return line[i]


# keep feats and enhanced deps as raw strings: nothing here needs them parsed, and it is faster
_FIELD_PARSERS = {"feats": _raw, "deps": _raw}


@dataclass
class Sentence:
    """One sentence of syntactic words (multiword tokens and empty nodes left out).

    `heads[i]` is the 1-based index of word i's head, 0 for the root; `deprels` are full
    UD labels with subtypes (`nmod:poss`). `misc[i]` is word i's MISC column as a dict
    (`{}` for `_`; a key without `=` maps to None); GUM's coreference brackets are in
    `misc[i]["Entity"]` (see `bertscope.data.readers.coref`).
    """

    sent_id: str
    words: list[str]
    lemmas: list[str]
    upos: list[str]
    xpos: list[str]
    feats: list[str]  # raw FEATS column, "_" when empty
    heads: list[int]
    deprels: list[str]
    misc: list[dict]
    doc_id: str = ""
    text: str = ""  # the `# text` comment
    newpar: bool = False  # a `# newpar` comment opens a paragraph at this sentence
    path: str = ""
    line: int = 0  # 1-based line of the sentence's first word in `path`

    def __len__(self) -> int:
        return len(self.words)

    @property
    def space_after(self) -> list[bool]:
        """Per word, whether a space follows it in the original text (MISC `SpaceAfter=No`)."""
        return [m.get("SpaceAfter") != "No" for m in self.misc]


@dataclass
class Document:
    """One GUM document: id (`# newdoc id`), genre (from the file name), sentences."""

    id: str
    genre: str
    sentences: list[Sentence] = field(default_factory=list)
    path: str = ""

    @property
    def n_words(self) -> int:
        return sum(len(s) for s in self.sentences)


def read_treebank(path: str | Path) -> list[Sentence]:
    """All sentences of a CoNLL-U file, in file order.

    Raises UserError for a missing file or a malformed line ("FILE, line N: ...").
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"CoNLL-U file not found: {path}") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    first_lines = _validate(text, path)
    try:
        # a block of comments alone (no token line) is not a sentence
        token_lists = [t for t in conllu.parse(text, field_parsers=_FIELD_PARSERS) if len(t)]
    except ParseException as error:  # _validate should have caught it first
        raise UserError(f"{path}: malformed CoNLL-U: {error}") from None
    if len(token_lists) != len(first_lines):
        raise UserError(f"{path}: found {len(token_lists)} sentences, expected {len(first_lines)}")

    sentences = []
    doc_id = ""
    for index, (tokens, line) in enumerate(zip(token_lists, first_lines)):
        meta = tokens.metadata
        doc_id = meta.get("newdoc id", doc_id) or doc_id
        words = [t for t in tokens if isinstance(t["id"], int)]
        sentences.append(Sentence(
            sent_id=meta.get("sent_id") or f"{path.stem}-{index + 1}",
            words=[t["form"] for t in words],
            lemmas=[t["lemma"] for t in words],
            upos=[t["upos"] for t in words],
            xpos=[t["xpos"] for t in words],
            feats=[t["feats"] for t in words],
            heads=[t["head"] for t in words],
            deprels=[t["deprel"] for t in words],
            misc=[dict(t["misc"] or {}) for t in words],
            doc_id=doc_id,
            text=meta.get("text", ""),
            newpar="newpar" in meta or "newpar id" in meta,
            path=str(path),
            line=line,
        ))
    return sentences


def read_ewt_dev(data_dir: str | None = None) -> list[Sentence]:
    """UD English-EWT dev: 2,001 sentences, 25,147 syntactic words."""
    return read_treebank(dataset_dir("ud-ewt", data_dir) / EWT_DEV)


def read_gum(data_dir: str | None = None) -> list[Document]:
    """The GUM documents (160 in the shared data), sorted by file name."""
    folder = dataset_dir("gum", data_dir)
    return [read_gum_document(path) for path in sorted(folder.glob("GUM_*.conllu"))]


def read_gum_document(path: str | Path) -> Document:
    """One GUM file `GUM_<genre>_<name>.conllu` as a Document."""
    path = Path(path)
    sentences = read_treebank(path)
    parts = path.stem.split("_")
    genre = parts[1] if len(parts) >= 3 and parts[0] == "GUM" else ""
    doc_id = sentences[0].doc_id if sentences and sentences[0].doc_id else path.stem
    return Document(id=doc_id, genre=genre, sentences=sentences, path=str(path))


def _validate(text: str, path: Path) -> list[int]:
    """Check every line's shape; the 1-based line number of each sentence's first token line.

    Token lines need 10 tab-separated columns and a well-formed ID; syntactic words also
    need an integer HEAD within the sentence and a DEPREL, and their IDs must run 1, 2, 3...
    """
    first_lines: list[int] = []
    heads: list[tuple[int, int]] = []  # (line number, head) of the current sentence
    in_sentence = False

    def fail(number: int, message: str):
        raise UserError(f"{path.name}, line {number}: {message} ({path})")

    def end_sentence():
        for number, head in heads:
            if head > len(heads):
                fail(number, f"head {head} is not a word of this sentence ({len(heads)} words)")
        heads.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            end_sentence()
            in_sentence = False
            continue
        if line.startswith("#"):
            continue
        if not in_sentence:
            first_lines.append(number)
            in_sentence = True
        columns = line.split("\t")
        if len(columns) != 10:
            fail(number, f"expected 10 tab-separated columns, found {len(columns)}")
        word_id, head, deprel = columns[0], columns[6], columns[7]
        if _RANGE_ID.fullmatch(word_id) or _EMPTY_ID.fullmatch(word_id):
            continue
        if not _WORD_ID.fullmatch(word_id):
            fail(number, f"bad word ID {word_id!r}")
        if int(word_id) != len(heads) + 1:
            fail(number, f"word ID {word_id} out of sequence (expected {len(heads) + 1})")
        if not _HEAD.fullmatch(head):
            fail(number, f"HEAD must be an integer, not {head!r}")
        if not deprel or deprel == "_":
            fail(number, "missing DEPREL")
        heads.append((number, int(head)))
    end_sentence()
    return first_lines
