"""`bertscope heads retrieval --answer greedy`: Wu et al.'s criterion (the word recall of the model's
own greedy answer against the needle's answer) on hand-made strings; the greedy answer and the
hits of the teacher-forced pass over prompt + that answer equal Wu et al.'s eager decode loop
(tests/analyses/heads/retrieval_decode.py) on a tiny Llama and a tiny Gemma-3; and the command end
to end (the cells' own answers, recall, answered; another --answer mode into the same --out
refused in one line; the reference mode's outputs as before)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from retrieval_decode import decode_score, rouge1_recall
from test_retrieval import files, grid_args  # noqa: F401  (the fixture and the argv of the grid)

from bertscope.analyses.heads.retrieval import plots, section
from bertscope.analyses.heads.retrieval.command import own_answer
from bertscope.analyses.heads.retrieval.haystack import HaystackBuilder, Needle, corpus_texts
from bertscope.analyses.heads.retrieval.outputs import escape_text, unescape_text
from bertscope.analyses.heads.retrieval.stats import (
    MAX_NEW_TOKENS,
    greedy_answer,
    score_haystack,
    stop_tokens,
    word_recall,
)
from bertscope.cli.main import main
from bertscope.report.page import RunFiles

pytestmark = pytest.mark.usefixtures("single_thread")


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_word_recall_on_hand_made_strings():
    sf = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
    gemma = " Eat a sandwich and sit in Dolores Park on a sunny day."
    # 21 reference words; the answer has 12 of them ("a" twice in both): 12/21
    assert word_recall(sf, gemma) == pytest.approx(12 / 21)
    assert word_recall(sf, gemma) > 0.5  # Wu et al. count it
    assert word_recall("eat a sandwich", "EAT, a... Sandwich!") == 1.0  # case and punctuation dropped
    assert word_recall("a a b c", "a b") == 0.5  # each answer word counted at most as often as it occurs
    assert word_recall("one two", "") == 0.0 and word_recall("...", "anything") == 0.0
    assert word_recall("sit in the park", "sitting in parks") == 0.25  # no stemming
    for ref, got in [(sf, gemma), ("a a b c", "a b"), ("x y z w", "w z x q q")]:
        assert word_recall(ref, got) * 100 == pytest.approx(rouge1_recall(ref, got))  # the test oracle's


@pytest.mark.parametrize("which", ["llama", "gemma3"])
def test_greedy_cell_hits_equal_the_decode_loop(which, tiny_llama_lm_dir, tiny_gemma3_lm_dir, files):  # noqa: F811
    """The grid's greedy cell: its answer is the eager loop's generated tokens (stop token
    included), and its teacher-forced hits equal the loop's decode-time hits, head by head."""
    from transformers import AutoModelForCausalLM

    from bertscope.models.loading import load_model

    path = tiny_llama_lm_dir if which == "llama" else tiny_gemma3_lm_dir
    loaded = load_model(path, task="causal-lm")
    eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    corpus, _ = files
    needle = Needle("dog", "The dog ran far away and then came back home.", "Where was the dog?",
                    "ran far away and then came back home")
    builder = HaystackBuilder(loaded.tokenizer, corpus_texts(str(corpus)), "plain")
    _, stop = stop_tokens(loaded)
    checked = 0
    for depth in (0, 50, 100):
        hay = builder.build(needle, 48, depth)
        own, record = own_answer(loaded, hay, needle)
        # the answer stops where the model's positions end (own_answer's room): the loop gets the same
        room = min(MAX_NEW_TOKENS, loaded.max_len - len(hay.prompt_ids))
        assert 0 < room
        dec = decode_score(eager, hay.prompt_ids, hay.needle, stop, max_new_tokens=room)
        assert own.input_ids == hay.prompt_ids + dec.generated and own.answer == (hay.answer[0], len(own.input_ids))
        assert len(dec.generated) <= room and (dec.stopped or len(dec.generated) == room)
        assert len(own.input_ids) <= loaded.max_len
        got = score_haystack(loaded, own, backend="chunked")
        assert got.copied  # the pass reproduces the model's own answer
        np.testing.assert_array_equal(got.hits, dec.hits)
        assert record["recall"] == word_recall(needle.answer, loaded.tokenizer.decode(list(dec.generated),
                                                                                      skip_special_tokens=True))
        checked += int(dec.hits.sum())
    if which == "llama":  # hits to compare (the Gemma-3's window layer cannot reach the needle past the question)
        assert checked > 0
    assert greedy_answer(loaded, hay.prompt_ids, room) == dec.generated
    assert loaded.model.config._attn_implementation == "bertscope"  # given back after decoding


def test_command_greedy_end_to_end(tiny_llama_lm_dir, files, tmp_path, monkeypatch, capsys):  # noqa: F811
    """--answer greedy through the command: every cell holds its own answer, recall and answered
    (recall > 0.5), the retrieval score averages the answered cells; the ablation teacher-forces
    each cell's own answer; a reference call into the same --out is refused in one line."""
    import bertscope.analyses.heads.retrieval.command as command

    real = command.own_answer

    def answering(loaded, hay, needle):  # the random model's own answer; the 50%-deep ones made to count
        hay2, rec = real(loaded, hay, needle)
        assert rec["answered"] == (rec["recall"] > 0.5)
        recall = 0.75 if hay.depth == 50 else 0.25
        # a real model's answer ends with its stop token's newline (the tiny word tokenizer has none)
        return hay2, {**rec, "recall": recall, "answered": recall > 0.5, "answer_text": rec["answer_text"] + ".\n"}

    needle_maps = []
    real_plot = plots.plot_needle

    def plot_needle(rows, title):
        needle_maps.append(real_plot(rows, title))
        return needle_maps[-1]

    monkeypatch.setattr(command, "own_answer", answering)
    monkeypatch.setattr(plots, "plot_needle", plot_needle)
    out = tmp_path / "run"
    argv = [a for a in grid_args(tiny_llama_lm_dir, files, out, "--answer", "greedy", "--ablate", "1")
            if a != "--no-figures"]
    assert main(argv) == 0
    cells = read_csv(out / "retrieval_cells.csv")
    assert list(cells[0])[-3:] == ["answered", "answer_text", "recall"]
    assert [c["answered"] for c in cells] == ["0", "1", "0"] * 2
    # answer_text on one line: the newline escaped as backslash-n, so the file has a line per row
    text = (out / "retrieval_cells.csv").read_text(encoding="utf-8")
    assert len(text.splitlines()) == len(cells) + 1
    by_cell = {(c["length"], c["depth"]): c for c in cells}
    for p in (out / "retrieval_cells").glob("*.json"):
        r = json.loads(p.read_text())
        got = by_cell[(str(r["length"]), str(r["depth"]))]["answer_text"]
        assert r["answer_text"].endswith(".\n") and got == r["answer_text"][:-1] + "\\n"
        assert "\n" not in got and unescape_text(got) == r["answer_text"]
    # the needle map shows the word recall of the reference (not the token accuracy of the model's own
    # answer, 1 everywhere by construction) and a star on the answered haystacks
    (fig,) = needle_maps
    shown = np.ma.getdata(fig.axes[0].images[0].get_array())  # depths 0, 50, 100 x lengths 40, 56
    np.testing.assert_array_equal(shown, [[0.25, 0.25], [0.75, 0.75], [0.25, 0.25]])
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["0.25"] * 4 + ["0.75 *"] * 2
    # the report says what was counted: recall of the model's own words, not a copy of the reference
    report = section.build(RunFiles(out))
    assert "copies the reference" not in report.findings[0]
    assert "own words" in report.findings[0] and "recalls more than half of the reference answer's words" in \
        report.findings[0] and "40 tokens 1/3 (mean recall 0.42)" in report.findings[0], report.findings[0]
    assert "word recall" in report.figures[0].caption
    records = {p.stem: json.loads(p.read_text()) for p in (out / "retrieval_cells").glob("*.json")}
    assert all(r["setup"]["answer"] == "greedy" for r in records.values())
    assert all(r["answer_span"][1] - r["answer_span"][0] == len(r["reference"]) for r in records.values())
    heads = read_csv(out / "retrieval_heads.csv")
    answered = [np.asarray(r["hits"]) / r["needle_len"] for r in records.values() if r["depth"] == 50]
    np.testing.assert_allclose([float(h["score"]) for h in heads], np.mean(answered, 0).ravel(), rtol=1e-5)
    assert {h["n_answered"] for h in heads} == {"2"}
    result = json.loads((out / "run.json").read_text())["analyses"]["retrieval"]["results"]
    assert result["answer"] == "greedy" and result["answered"] == 2
    assert result["accuracy_by_length"]["40"]["copied"] == 1
    ablation = read_csv(out / "retrieval_ablation.csv")
    none = [r for r in records.values() if r["length"] == 40]
    assert float(ablation[0]["accuracy"]) == np.mean([r["copied"] for r in none]) == 1.0  # own answers reproduced
    capsys.readouterr()
    assert main(grid_args(tiny_llama_lm_dir, files, out, "--ablate", "0")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--answer greedy" in err[0] and "--answer reference" in err[0]


def test_reference_mode_unchanged(tiny_llama_lm_dir, files, tmp_path):  # noqa: F811
    """--answer reference (the default, or said) writes the same outputs as no option, with no
    greedy columns and no --answer in the cells' setup."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(grid_args(tiny_llama_lm_dir, files, a, "--ablate", "0", "--depths", "50")) == 0
    assert main(grid_args(tiny_llama_lm_dir, files, b, "--ablate", "0", "--depths", "50",
                          "--answer", "reference")) == 0
    for name in ("retrieval_cells.csv", "retrieval_heads.csv"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert "answer_text" not in read_csv(a / "retrieval_cells.csv")[0]
    assert all("answer" not in json.loads(p.read_text())["setup"] for p in (a / "retrieval_cells").glob("*.json"))


def test_greedy_prefill_keeps_one_row_of_logits(tiny_llama_lm_dir, files):  # noqa: F811
    """The greedy decode's prefill asks the model for the last row's logits only (logits_to_keep=1):
    no (prompt x vocabulary) logits, which on Gemma-3 at 2k tokens doubled the decode's peak memory.
    Every call (prefill and steps) returns logits of one row."""
    from bertscope.models.loading import load_model

    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    corpus, _ = files
    needle = Needle("dog", "The dog ran far away and then came back home.", "Where was the dog?",
                    "ran far away and then came back home")
    hay = HaystackBuilder(loaded.tokenizer, corpus_texts(str(corpus)), "plain").build(needle, 48, 50)
    calls = []

    def spy(module, args, kwargs, output):
        calls.append((kwargs.get("logits_to_keep"), kwargs["input_ids"].shape[1], tuple(output.logits.shape)))

    handle = loaded.model.register_forward_hook(spy, with_kwargs=True)
    try:
        answer = greedy_answer(loaded, hay.prompt_ids)
    finally:
        handle.remove()
    vocab = loaded.model.config.vocab_size
    prefill = calls[0]
    assert prefill[1] == len(hay.prompt_ids) > 1  # the first call is the whole prompt
    assert prefill[0] == 1 and prefill[2] == (1, 1, vocab)  # one row of logits, not one per prompt token
    assert len(calls) in (len(answer), len(answer) + 1)  # a call per token (and one past the last at the cap)
    assert all(c[0] == 1 and c[2] == (1, 1, vocab) for c in calls)
    # the answer is the decode loop's (test_greedy_cell_hits_equal_the_decode_loop: against eager attention)


def test_escape_text_round_trip():
    """A decoded text in a CSV cell: one line (every break str.splitlines knows escaped), and the text back."""
    for text in [" Eat a sandwich.\n", "a\\nb", "x\r\ny\u2028z\x85", "back\\slash\\", "", "plain"]:
        once = escape_text(text)
        assert len(once.splitlines()) <= 1 and unescape_text(once) == text
    assert escape_text(" Eat.\n") == " Eat.\\n" and escape_text("a\\nb") == "a\\\\nb"
