"""Corpora read lazily: JSON Lines, Parquet, datasets directories and text files, by
iteration (corpus order) and by index (a sampled run), from hand-built files."""
from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertscope.errors import UserError
from bertscope.text.corpus import Document, open_corpus

RECORDS = [
    {"text": "The cat sat on the mat.", "label": 1},
    {"text": "  Mr. Smith went to Washington.  ", "label": 0},
    {"text": None, "label": 1},  # a null text: a document without text (make_segments skips it as empty)
    {"text": "Short.", "label": 0},
]
PAIRS = [
    {"text_a": "Left part.", "text_b": "Right part."},
    {"text_a": "Alone.", "text_b": ""},  # an empty second part leaves a single-part document
    {"text_a": "Also alone.", "text_b": None},
]


def parts(corpus) -> list[list[str]]:
    return [d.parts for d in corpus]


def check_random_access(corpus):
    """corpus[i] in a shuffled order equals the i-th document of a sequential read."""
    documents = list(corpus)
    order = list(range(len(documents)))
    random.Random(3).shuffle(order)
    assert len(corpus) == len(documents)
    assert [corpus[i] for i in order] == [documents[i] for i in order]
    return documents


def write_jsonl(path, records, blank_lines=False):
    lines = [json.dumps(r) for r in records]
    if blank_lines:
        lines = [lines[0], "", "   ", *lines[1:]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- JSON Lines --------------------------------------------------------------------------


def test_jsonl_text_field_ids_and_blank_lines(tmp_path):
    corpus = open_corpus(str(write_jsonl(tmp_path / "c.jsonl", RECORDS, blank_lines=True)))
    documents = check_random_access(corpus)
    assert documents == [
        Document("c.jsonl:1", ["The cat sat on the mat."]),
        Document("c.jsonl:4", ["Mr. Smith went to Washington."]),
        Document("c.jsonl:5", [""]),
        Document("c.jsonl:6", ["Short."]),
    ]
    assert corpus.report.as_dict() == {"source": str(tmp_path / "c.jsonl"), "documents": 4, "pairs": 0,
                                       "empty_lines": 2, "format": "jsonl", "fields": ["text"]}


def test_jsonl_pairs_from_text_a_and_text_b(tmp_path):
    corpus = open_corpus(str(write_jsonl(tmp_path / "p.ndjson", PAIRS)))
    assert parts(check_random_access(corpus)) == [["Left part.", "Right part."], ["Alone."], ["Also alone."]]
    assert corpus.report.pairs == 1 and corpus.report.fields == ["text_a", "text_b"]


def test_jsonl_text_field_names_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "Who?", "answer": "Me.", "text": "ignored"}])
    assert parts(open_corpus(str(path), "question")) == [["Who?"]]
    assert parts(open_corpus(str(path), "question, answer")) == [["Who?", "Me."]]
    assert parts(open_corpus(str(path))) == [["ignored"]]


@pytest.mark.parametrize("lines, text_field, message", [
    (['{"body": "x"}'], None, r"c\.jsonl, line 1: no field 'text' or 'text_a'/'text_b' \(fields: body\); name the text "
                              r"column with --text-field$"),
    (['{"body": "x"}'], "content", r"c\.jsonl, line 1: no field 'content' \(fields: body\)$"),
    (['{"text": "x"}', '{"body": "y"}'], None, r"c\.jsonl, line 2: no field 'text' \(fields: body\)$"),
    (['{"text": "x"}', '{"text": 3}'], None, r"c\.jsonl, line 2: field 'text' is not text but int$"),
    (['{"text": "x"}', '{"text": "y"'], None, r"c\.jsonl, line 2: not JSON \(.*\)$"),
    (['["a list"]'], None, r"c\.jsonl, line 1: not a JSON object$"),
    (["", "  "], None, r"corpus file has no text \(only blank lines\): .*c\.jsonl$"),
    (['{"text": "x"}'], "a,b,c", r"--text-field takes one column name, or two for a pair"),
])
def test_jsonl_mistakes_are_user_errors(tmp_path, lines, text_field, message):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=message) as info:
        corpus = open_corpus(str(path), text_field)
        len(corpus)  # later lines are checked when the corpus is first indexed
    assert "\n" not in str(info.value)


# --- Parquet -----------------------------------------------------------------------------


def test_parquet_row_groups_by_index_and_in_order(tmp_path):
    path = tmp_path / "c.parquet"
    table = pa.table({"text": [f"Sentence number {i}." for i in range(10)], "n": list(range(10))})
    pq.write_table(table, path, row_group_size=3)  # row groups of 3, 3, 3, 1 rows
    corpus = open_corpus(str(path))
    documents = check_random_access(corpus)
    assert [d.id for d in documents] == [f"c.parquet:{i}" for i in range(10)]
    assert parts(documents) == [[f"Sentence number {i}."] for i in range(10)]
    assert corpus.report.as_dict() == {"source": str(path), "documents": 10, "pairs": None, "empty_lines": 0,
                                       "format": "parquet", "fields": ["text"]}


def test_parquet_pairs_and_text_field(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(PAIRS), path)
    assert parts(check_random_access(open_corpus(str(path)))) == [["Left part.", "Right part."], ["Alone."],
                                                                  ["Also alone."]]
    assert parts(open_corpus(str(path), "text_b")) == [["Right part."], [""], [""]]


@pytest.mark.parametrize("make, text_field, message", [
    (lambda p: pq.write_table(pa.table({"body": ["x"]}), p), None,
     r"no field 'text' or 'text_a'/'text_b' \(fields: body\)"),
    (lambda p: pq.write_table(pa.table({"text": ["x"]}), p), "body", r"no field 'body' \(fields: text\)$"),
    (lambda p: pq.write_table(pa.table({"text": pa.array([], pa.string())}), p), None, r"^corpus has no rows: "),
    (lambda p: pq.write_table(pa.table({"text": [1, 2]}), p), None, r"row 0: field 'text' is not text but int$"),
    (lambda p: p.write_bytes(b"not a parquet file at all"), None, r"^cannot read Parquet file .*c\.parquet: "),
])
def test_parquet_mistakes_are_user_errors(tmp_path, make, text_field, message):
    path = tmp_path / "c.parquet"
    make(path)
    with pytest.raises(UserError, match=message) as info:
        list(open_corpus(str(path), text_field))
    assert "\n" not in str(info.value)


# --- a datasets directory ----------------------------------------------------------------


def need_datasets():
    """The datasets package: a skip when missing, a failure in CI (setup.py's test extra installs it)."""
    try:
        import datasets
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the datasets package is not installed")
        pytest.skip("the datasets package is not installed")
    return datasets


def test_datasets_directory_saved_with_save_to_disk(tmp_path):
    datasets = need_datasets()
    data = datasets.Dataset.from_list(RECORDS)
    data.save_to_disk(str(tmp_path / "ds"))
    corpus = open_corpus(str(tmp_path / "ds"))
    documents = check_random_access(corpus)
    assert [d.id for d in documents] == [f"ds:{i}" for i in range(4)]
    assert parts(documents) == [["The cat sat on the mat."], ["Mr. Smith went to Washington."], [""], ["Short."]]
    assert corpus.report.format == "datasets" and corpus.report.documents == 4

    pairs = datasets.Dataset.from_list([{"q": "Who?", "a": "Me."}])
    pairs.save_to_disk(str(tmp_path / "qa"))
    assert parts(open_corpus(str(tmp_path / "qa"), "q,a")) == [["Who?", "Me."]]
    with pytest.raises(UserError, match=r"qa: no field 'text' or 'text_a'/'text_b' \(fields: q, a\)"):
        open_corpus(str(tmp_path / "qa"))


def test_datasets_dict_asks_for_one_split(tmp_path):
    datasets = need_datasets()
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS[:2]),
                                   "test": datasets.Dataset.from_list(RECORDS[2:])})
    splits.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UserError, match=r"dd holds several splits \(train, test\): pass the directory of one, "
                                        r"e\.g\. .*dd/train$"):
        open_corpus(str(tmp_path / "dd"))
    assert parts(open_corpus(str(tmp_path / "dd" / "test"))) == [[""], ["Short."]]


# --- text files and wiki -----------------------------------------------------------------


def test_text_file_by_index_equals_in_order(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes("\ufeffFirst line.\r\n\nLeft\tRight\n  \nCaf\u00e9 au lait.\nlast".encode("utf-8"))
    corpus = open_corpus(str(path))
    documents = check_random_access(corpus)
    assert [(d.id, d.parts) for d in documents] == [("t.txt:1", ["First line."]), ("t.txt:3", ["Left", "Right"]),
                                                    ("t.txt:5", ["Caf\u00e9 au lait."]), ("t.txt:6", ["last"])]
    assert (corpus.report.documents, corpus.report.pairs, corpus.report.empty_lines) == (4, 1, 2)


def test_text_field_only_for_columnar_corpora(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("x\n", encoding="utf-8")
    with pytest.raises(UserError, match="--text-field names a column of a JSON Lines, Parquet or datasets corpus, "
                                        "not of a text file"):
        open_corpus(str(path), "text")


def test_a_plain_directory_is_not_a_corpus(tmp_path):
    with pytest.raises(UserError, match=r"^corpus path is a directory, not a text file: .*save_to_disk"):
        open_corpus(str(tmp_path))
