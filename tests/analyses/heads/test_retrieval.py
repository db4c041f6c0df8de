"""`bertscope heads retrieval`: the score on hand-built argmax keys (exactly k/|needle| and 0 where
it must be), the haystack's layout (length exact, the needle at the sentence boundary nearest the
depth, the answer span the needle's tokens), the argmax keys and the answer's predictions against
the model's own eager attention and logits (tiny Llama; Gemma-3 with a sliding window), and the
command end to end: no answered haystack on a random model, answered ones forced, a grid killed
mid-way and resumed equal to an uninterrupted one, two torchrun ranks equal to one process, and
the user's mistakes refused in one line."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.analyses.heads.retrieval import stats as retrieval_stats
from bertscope.analyses.heads.retrieval.command import default_lengths, layer_kinds
from bertscope.analyses.heads.retrieval.haystack import (
    QUESTION,
    Haystack,
    HaystackBuilder,
    Needle,
    load_needles,
)
from bertscope.analyses.heads.retrieval.stats import GridScores, row_hits, score_haystack
from bertscope.cli.main import main
from bertscope.errors import UserError

pytestmark = pytest.mark.usefixtures("single_thread")

DOG = Needle("dog", "The dog ran far away and then came back home.", "Where was the dog?",
             "ran far away and then came back home")
# running text in the word tokenizer's vocabulary (tests/tiny_decoders.py): several sentences per line
CORPUS_LINES = ["The cat sat on a mat. It was happy. Then the cat ran home.",
                "A dog ran far away, and then came back home quickly. The dog sat on the cat, and it was happy.",
                "It was happy. The cat sat on a mat. Then the dog ran home."] * 4


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def word_tokenizer():
    from tiny_decoders import word_tokenizer

    return word_tokenizer("bos")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from conftest import corpus_and_needles

    needle = {k: getattr(DOG, k) for k in ("name", "needle", "question", "answer")}
    return corpus_and_needles(tmp_path_factory.mktemp("retrieval-files"), CORPUS_LINES, [needle])


# ----------------------------------------------------------------------------- the score


def test_row_hits_on_hand_built_keys():
    """Needle span [10, 14) holding tokens 50..53; the answer rows 29..32 must produce 50..53.
    Head 0 points at the matching needle token at every row (4/4), head 1 at it on two rows (2/4),
    head 2 inside the needle but at the wrong token (0), head 3 at a matching token outside the
    needle (0)."""
    ids = np.arange(34) + 100
    ids[10:14] = [50, 51, 52, 53]
    ids[30:34] = [50, 51, 52, 53]
    ids[3] = 51  # the same token as needle[1], outside the needle
    rows = range(29, 33)
    keys = np.array([[[10, 11, 12, 13],
                      [10, 0, 12, 5],
                      [11, 12, 13, 10],
                      [3, 3, 3, 3]]])  # (layers 1, H 4, R 4)
    hits, far = row_hits(keys, ids, rows, (10, 14), far=18)
    assert hits.tolist() == [[4, 2, 0, 0]]
    # every hit here is 19 tokens back: far beyond 18, not beyond 19
    assert far.tolist() == [[4, 2, 0, 0]]
    assert row_hits(keys, ids, rows, (10, 14), far=19)[1].tolist() == [[0, 0, 0, 0]]
    score = retrieval_stats.HaystackScore(hits=hits, needle_len=4, predicted=(), copied=False, answer_logprob=0.0,
                                          far_hits=far)
    np.testing.assert_array_equal(score.score, [[1.0, 0.5, 0.0, 0.0]])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), start=st.integers(1, 20))
def test_row_hits_count_exactly_the_matching_needle_keys(seed, n, start):
    """Random keys: the count is the number of rows whose key is inside the span and holds the row's next token."""
    rng = np.random.default_rng(seed)
    L = start + n + 10 + n
    ids = rng.integers(0, 5, L)
    a0 = L - n
    rows = list(range(a0 - 1, L - 1))
    keys = rng.integers(0, L, (2, 3, n))
    hits, _ = row_hits(keys, ids, rows, (start, start + n))
    want = np.zeros((2, 3), int)
    for lay in range(2):
        for h in range(3):
            for r, p in enumerate(rows):
                j = keys[lay, h, r]
                want[lay, h] += int(start <= j < start + n and ids[j] == ids[p + 1])
    np.testing.assert_array_equal(hits, want)


def test_grid_scores_average_answered_haystacks_only():
    recs = [{"hits": [[2, 0]], "far_hits": [[1, 0]], "needle_len": 4, "copied": True},
            {"hits": [[4, 4]], "far_hits": [[0, 0]], "needle_len": 4, "copied": False},
            {"hits": [[1, 2]], "far_hits": [[0, 2]], "needle_len": 2, "copied": True}]
    g = GridScores.of(recs, 1, 2)
    np.testing.assert_allclose(g.answered, [[0.5, 0.5]])  # (0.5 + 0.5) / 2, (0 + 1) / 2
    np.testing.assert_allclose(g.all, [[(0.5 + 1 + 0.5) / 3, (0 + 1 + 1) / 3]])
    np.testing.assert_allclose(g.far, [[0.125, 0.5]])
    np.testing.assert_allclose(g.far_all, [[0.25 / 3, 1 / 3]])
    assert (g.n_answered, g.n_cells) == (2, 3)
    none = GridScores.of([recs[1]], 1, 2)
    assert none.n_answered == 0 and none.answered.tolist() == [[0.0, 0.0]] and none.all.tolist() == [[1.0, 1.0]]


# ----------------------------------------------------------------------------- needles and haystacks


def test_default_needles_and_needle_files(tmp_path):
    needles = load_needles()
    assert needles[0].name == "san-francisco" and "Dolores Park" in needles[0].needle and len(needles) >= 3
    for n in needles:
        a0, a1 = n.answer_offsets()
        assert (" " + n.needle)[a0:a1].strip() == n.answer.strip()
    yaml_file = tmp_path / "n.yaml"
    yaml_file.write_text("- name: a\n  needle: The sky is green.\n  question: What colour?\n  answer: green\n")
    assert load_needles(yaml_file) == [Needle("a", "The sky is green.", "What colour?", "green")]
    bad = {"not json": "{nope\n", "missing key": '{"name": "a", "needle": "x"}\n',
           "not in needle": '{"name": "a", "needle": "The sky.", "question": "q", "answer": "green"}\n',
           "duplicate": '{"name": "a", "needle": "b c", "question": "q", "answer": "c"}\n' * 2, "empty": "\n"}
    for what, text in bad.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(text)
        with pytest.raises(UserError) as e:
            load_needles(path)
        assert "--needles" in str(e.value) and "\n" not in str(e.value), what
    # names of the default needles, when no file has that name; anything else is one line naming them
    assert load_needles("san-francisco") == needles[:1]
    assert load_needles("wmo, beijing") == [needles[2], needles[1]]
    with pytest.raises(UserError) as e:
        load_needles(tmp_path / "no-such-needles.jsonl")
    assert "san-francisco, beijing, wmo" in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=20, deadline=None)
@given(length=st.integers(40, 120), depth=st.integers(0, 100))
def test_haystack_layout(word_tokenizer, length, depth):
    """Length exact; the needle sentence stands at the sentence boundary nearest depth% of the haystack
    text, after whole sentences; the needle span holds the answer's tokens and the answer is those
    tokens again, last; the question right before it."""
    b = HaystackBuilder(word_tokenizer, iter(CORPUS_LINES), "plain")
    hay = b.build(DOG, length, depth)
    ids = list(hay.input_ids)
    assert len(ids) == hay.length == length and ids[0] == word_tokenizer.bos_token_id
    enc = lambda t: word_tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    answer = enc(" " + DOG.answer)
    assert ids[hay.answer[0]:hay.answer[1]] == answer and hay.answer[1] == length
    assert ids[hay.needle[0]:hay.needle[1]] == answer
    assert ids[hay.sentence[0]:hay.sentence[1]] == enc(" " + DOG.needle)
    question = enc("\n" + QUESTION.format(question=DOG.question))
    assert ids[hay.answer[0] - len(question):hay.answer[0]] == question
    assert list(hay.answer_rows) == list(range(hay.answer[0] - 1, length - 1))
    # the text before the needle is whole sentences, and its boundary is the nearest to depth%
    budget = length - (hay.sentence[1] - hay.sentence[0]) - len(question) - len(answer) - 1
    before = ids[1:hay.sentence[0]]
    bounds, n = [0], 0
    for s in b._sentences:
        n = min(budget, n + len(s))
        bounds.append(n)
        if n == budget:
            break
    assert len(before) in bounds
    target = budget * depth / 100
    assert abs(len(before) - target) == min(abs(x - target) for x in bounds)
    flat = [t for s in b._sentences for t in s]
    assert before == flat[:len(before)]
    assert ids[hay.sentence[1]:hay.answer[0] - len(question)] == flat[len(before):budget]


def test_chat_prompt_puts_the_turn_in_the_template(word_tokenizer):
    from tiny_decoders import word_tokenizer as make

    tok = make("bos")
    tok.chat_template = ("{% for m in messages %}<s> {{ m['content'] }} </s>{% endfor %}"
                         "{% if add_generation_prompt %} <s>{% endif %}")
    hay = HaystackBuilder(tok, iter(CORPUS_LINES), "chat").build(DOG, 60, 50)
    ids = list(hay.input_ids)
    assert len(ids) == 60 and ids[0] == tok.bos_token_id and ids[hay.answer[0] - 1] == tok.bos_token_id
    assert ids[hay.answer[0]:] == tok(DOG.answer, add_special_tokens=False)["input_ids"]


def test_user_mistakes_in_the_haystack(word_tokenizer):
    b = HaystackBuilder(word_tokenizer, iter(CORPUS_LINES[:1]), "plain")
    with pytest.raises(UserError, match="a haystack needs more"):
        b.build(DOG, 20, 50)
    with pytest.raises(UserError, match="the corpus has"):
        b.build(DOG, 500, 50)
    with pytest.raises(UserError, match="0 to 100"):
        b.build(DOG, 40, 101)


def test_default_lengths():
    assert default_lengths(8192) == [1024, 2048, 4096, 8192]
    assert default_lengths(3000) == [1024, 2048, 3000]
    assert default_lengths(64) == [64]


# ----------------------------------------------------------------------------- against the model's own attention


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_keys_and_predictions_equal_the_eager_model(family, tiny_llama_lm_dir, tiny_gemma3_lm_dir):
    """The kernels' argmax keys at the answer rows, and the LM head's predictions and answer
    log-probability on those rows, equal the model's own eager attention maps and logits over the
    whole input (Gemma-3: its window hides keys more than 3 back on the sliding layer)."""
    from transformers import AutoModelForCausalLM

    from bertscope.models.loading import load_model

    path = tiny_llama_lm_dir if family == "llama" else tiny_gemma3_lm_dir
    loaded = load_model(path, task="causal-lm")
    eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    b = HaystackBuilder(loaded.tokenizer, iter(CORPUS_LINES), "plain")
    for length, depth in [(40, 0), (52, 50), (64, 100)]:
        hay = b.build(DOG, length, depth)
        got = score_haystack(loaded, hay, backend="chunked")
        with torch.no_grad():
            out = eager(torch.tensor([hay.input_ids]), output_attentions=True)
        rows = list(hay.answer_rows)
        p = torch.stack(out.attentions)[:, 0][:, :, rows].double()  # (layers, H, R, L)
        top2 = p.topk(2, -1).values
        clear = (top2[..., 0] - top2[..., 1] > 1e-5).numpy()  # rows without a near-tie
        keys = p.argmax(-1).numpy()
        np.testing.assert_array_equal(got.keys[clear], keys[clear])
        hits, _ = row_hits(keys, hay.input_ids, rows, hay.needle)
        np.testing.assert_array_equal(got.hits, hits)
        logits = out.logits[0, rows].double()
        assert got.predicted == tuple(logits.argmax(-1).tolist())
        ref = torch.tensor(hay.input_ids[hay.answer[0]:])
        want = torch.log_softmax(logits, -1).gather(1, ref[:, None]).sum().item()
        assert got.answer_logprob == pytest.approx(want, abs=1e-4)
        assert got.copied == (got.predicted == tuple(ref.tolist()))


def test_gated_pass_zeroes_the_heads(tiny_llama_lm_dir):
    """Gates of zeros on every head: the answer's log-probability moves, and the gates are reset after."""
    from bertscope.models.loading import load_model

    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    hay = HaystackBuilder(loaded.tokenizer, iter(CORPUS_LINES), "plain").build(DOG, 48, 50)
    base = score_haystack(loaded, hay)
    zeroed = score_haystack(loaded, hay, gates=torch.zeros(loaded.n_layers, loaded.n_heads))
    assert zeroed.answer_logprob != pytest.approx(base.answer_logprob, abs=1e-3)
    assert score_haystack(loaded, hay).answer_logprob == pytest.approx(base.answer_logprob, abs=1e-6)
    assert bool((loaded.gates.xi == 1).all())


def test_layer_kinds(tiny_gemma3_lm_dir, tiny_llama_lm_dir):
    from bertscope.models.loading import load_model

    assert layer_kinds(load_model(tiny_gemma3_lm_dir, task="causal-lm")) == ["window 4", "global"]
    assert layer_kinds(load_model(tiny_llama_lm_dir, task="causal-lm")) == ["global", "global"]


# ----------------------------------------------------------------------------- the command


def grid_args(model, files, out, *more):
    corpus, needles = files
    return ["heads", "retrieval", "--model", str(model), "--corpus", str(corpus), "--needles", str(needles),
            "--lengths", "40,56", "--depths", "0,50,100", "--ablate", "1,2", "--draws", "2", "--no-figures",
            "--quiet", "--out", str(out), *more]


def test_command_end_to_end_no_answer(tiny_gemma3_lm_dir, files, tmp_path):
    """A random model copies no answer: every cell says so, the answered score is 0 over 0
    haystacks, the heads are ranked by the score over all haystacks, which is each cell's hits over
    |needle| averaged."""
    out = tmp_path / "run"
    assert main(grid_args(tiny_gemma3_lm_dir, files, out)) == 0
    cells = read_csv(out / "retrieval_cells.csv")
    assert [(int(c["length"]), int(c["depth"])) for c in cells] == [(40, 0), (40, 50), (40, 100), (56, 0), (56, 50),
                                                                    (56, 100)]
    assert all(c["copied"] == "0" for c in cells)
    records = [json.loads(p.read_text()) for p in sorted((out / "retrieval_cells").glob("*.json"))]
    assert len(records) == 6
    heads = read_csv(out / "retrieval_heads.csv")
    assert len(heads) == 8 and {h["layer_kind"] for h in heads} == {"window 4", "global"}
    want = np.mean([np.asarray(r["hits"]) / r["needle_len"] for r in records], 0).ravel()
    np.testing.assert_allclose([float(h["score_all"]) for h in heads], want, rtol=1e-5)
    assert all(float(h["score"]) == 0 and h["n_answered"] == "0" for h in heads)
    result = json.loads((out / "run.json").read_text())["analyses"]["retrieval"]
    assert result["status"] == "complete" and result["results"]["answered"] == 0
    assert result["results"]["ranked_by"].startswith("all haystacks")
    assert result["results"]["far"]["over"] == "all haystacks" and result["results"]["far"]["heads"] == []  # 56 tokens
    scoring = int(sum(float(h["score_all"]) > 0 for h in heads))
    assert [a["top_scoring"] for a in result["results"]["ablation"]["by_k"].values()] == [min(1, scoring),
                                                                                         min(2, scoring)]
    ablation = read_csv(out / "retrieval_ablation.csv")
    assert [(a["ablation"], a["k"]) for a in ablation] == [("none", "0"), ("top", "1"), ("random", "1"),
                                                           ("random", "1"), ("top", "2"), ("random", "2"),
                                                           ("random", "2")]
    assert all(a["cells"] == "3" for a in ablation)  # the shortest length's haystacks
    none = [c for c in cells if c["length"] == "40"]
    assert float(ablation[0]["answer_logprob"]) == pytest.approx(np.mean([float(c["answer_logprob"]) for c in none]),
                                                                 rel=1e-5)


def test_answered_haystacks_forced(tiny_llama_lm_dir, files, tmp_path, monkeypatch):
    """The model made to predict the reference on the 50%-deep haystacks only: those count as
    answered, and the retrieval score is their mean hits over |needle|."""
    original = retrieval_stats.answer_predictions
    depth50 = set()

    def forced(loaded, hidden, reference):
        predicted, logprob = original(loaded, hidden, reference)
        return (tuple(reference), logprob) if len(depth50) else (predicted, logprob)

    real_score = retrieval_stats.score_haystack

    def scored(loaded, hay, *args, **kwargs):
        depth50.clear()
        if hay.depth == 50:
            depth50.add(1)
        return real_score(loaded, hay, *args, **kwargs)

    monkeypatch.setattr(retrieval_stats, "answer_predictions", forced)
    monkeypatch.setattr(retrieval_stats, "score_haystack", scored)
    out = tmp_path / "run"
    assert main(grid_args(tiny_llama_lm_dir, files, out, "--ablate", "0")) == 0
    cells = read_csv(out / "retrieval_cells.csv")
    assert [c["copied"] for c in cells] == ["0", "1", "0"] * 2
    records = [json.loads(p.read_text()) for p in (out / "retrieval_cells").glob("*.json")]
    answered = [np.asarray(r["hits"]) / r["needle_len"] for r in records if r["depth"] == 50]
    heads = read_csv(out / "retrieval_heads.csv")
    np.testing.assert_allclose([float(h["score"]) for h in heads], np.mean(answered, 0).ravel(), rtol=1e-5)
    assert {h["n_answered"] for h in heads} == {"2"}
    assert not (out / "retrieval_ablation.csv").exists()


def test_grid_killed_then_resumed_equals_uninterrupted(tiny_llama_lm_dir, files, tmp_path, monkeypatch):
    """Ctrl-C after 2 haystacks (exit 130, the 2 saved), then --resume: the same tables as a run
    never interrupted; a rerun into the finished directory runs no haystack."""
    whole = tmp_path / "whole"
    assert main(grid_args(tiny_llama_lm_dir, files, whole)) == 0
    real_score, calls = retrieval_stats.score_haystack, []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_score(*args, **kwargs)

    monkeypatch.setattr(retrieval_stats, "score_haystack", dying)
    out = tmp_path / "cut"
    assert main(grid_args(tiny_llama_lm_dir, files, out)) == 130
    assert len(list((out / "retrieval_cells").glob("*.json"))) == 2
    assert json.loads((out / "run.json").read_text())["analyses"]["retrieval"]["status"] == "interrupted"
    monkeypatch.setattr(retrieval_stats, "score_haystack", real_score)
    assert main(["heads", "retrieval", "--resume", str(out), "--quiet"]) == 0
    for name in ("retrieval_cells.csv", "retrieval_heads.csv", "retrieval_ablation.csv"):
        assert read_csv(out / name) == read_csv(whole / name), name

    def never(*args, **kwargs):
        raise AssertionError("a finished haystack was run again")

    monkeypatch.setattr(retrieval_stats, "score_haystack", never)
    assert main(grid_args(tiny_llama_lm_dir, files, out)) == 0
    assert read_csv(out / "retrieval_heads.csv") == read_csv(whole / "retrieval_heads.csv")


def refused_in_one_line(capsys, argv, *parts):
    """`bertscope argv` exits 2 with one line on stderr that starts with "bertscope" and holds every part
    (the heads commands' user-mistake tests share it: test_heads_streaming imports it)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's refusal of an option's value
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("bertscope"), (code, err)
    for part in parts:
        assert part in err[0], err[0]


def test_user_mistakes_are_one_line(tiny_llama_lm_dir, tiny_checkpoint, files, tmp_path, capsys):
    def refused(argv, *parts):
        refused_in_one_line(capsys, argv, *parts)

    refused(grid_args(tiny_llama_lm_dir, files, tmp_path / "a", "--depths", "10,120"), "depth", "0 to 100")
    refused(grid_args(tiny_llama_lm_dir, files, tmp_path / "b", "--lengths", "40,4096"), "--lengths 4096",
            "longer than the model allows")
    refused(grid_args(tiny_checkpoint, files, tmp_path / "c"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    refused(grid_args(tiny_llama_lm_dir, (files[0], bad), tmp_path / "d"), "--needles", "not JSON")
    refused(grid_args(tiny_llama_lm_dir, files, tmp_path / "e", "--lengths", "20"), "a haystack needs more")
    assert not any((tmp_path / x).exists() for x in "abcde")


@pytest.mark.full  # tests/tiers.py
def test_two_torchrun_ranks_equal_one_process(tiny_gemma3_lm_dir, files, tmp_path):
    from conftest import run_one_and_two_ranks

    corpus, needles = files
    args = ["heads", "retrieval", "--model", str(tiny_gemma3_lm_dir), "--corpus", str(corpus), "--needles",
            str(needles), "--lengths", "40,56", "--depths", "0,50,100", "--ablate", "1", "--draws", "2",
            "--no-figures", "--quiet"]
    one, two = run_one_and_two_ranks(args, tmp_path, port=29563)
    for name in ("retrieval_cells.csv", "retrieval_heads.csv", "retrieval_ablation.csv"):
        a, b = read_csv(one / name), read_csv(two / name)
        assert len(a) == len(b) and a
        for ra, rb in zip(a, b):
            for col in ra:
                try:
                    assert float(ra[col]) == pytest.approx(float(rb[col]), rel=1e-5, abs=1e-6), (name, col)
                except ValueError:
                    assert ra[col] == rb[col], (name, col)
    assert json.loads((two / "run.json").read_text())["analyses"]["retrieval"]["world_size"] == 2


def test_haystack_is_frozen_api():
    """The names the decode-time oracle imports."""
    hay = Haystack(input_ids=(1, 2, 3, 4), needle=(1, 2), answer=(3, 4), length=4, depth=50, needle_name="x")
    assert list(hay.answer_rows) == [2] and hay.needle_len == 1
    with pytest.raises(AttributeError):
        hay.length = 5


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_top_lists_hold_scoring_heads_and_kinds_only_with_windows(family, tiny_llama_lm_dir, tiny_gemma3_lm_dir,
                                                                   files, tmp_path, monkeypatch, capsys):
    """The top lists (log, run.json, the report's findings and table) hold only the heads that score
    (> 0), with the score they were ranked by (here over all haystacks: none is answered), never
    "1-1 0.00" padding; the layer kind follows a layer or head only where the model has windowed
    layers (tiny Gemma-3), not on a model whose layers are all global (tiny Llama, as SmolLM2).
    The far distance is cut from 512 to 4 tokens so that the tiny haystacks have far hits."""
    from bertscope.analyses.heads.retrieval import section
    from bertscope.report.page import RunFiles

    real = retrieval_stats.score_haystack
    monkeypatch.setattr(retrieval_stats, "score_haystack", lambda *a, **k: real(*a, **{**k, "far": 4}))
    monkeypatch.setattr(retrieval_stats, "FAR", 4)
    out = tmp_path / "run"
    argv = [a for a in grid_args(tiny_llama_lm_dir if family == "llama" else tiny_gemma3_lm_dir, files, out,
                                 "--ablate", "0") if a != "--quiet"]
    capsys.readouterr()
    assert main(argv) == 0
    log = capsys.readouterr().out.splitlines()
    heads = sorted(read_csv(out / "retrieval_heads.csv"), key=lambda h: int(h["rank"]))
    scoring = [h for h in heads if float(h["score_all"]) > 0]
    assert 0 < len(scoring) < len(heads)  # some heads score 0: a padded list would show them
    name = lambda h: f"{h['layer']}-{h['head']}"  # noqa: E731
    want = ", ".join(f"{name(h)} {float(h['score_all']):.2f}" for h in scoring[:5])
    (top_line,) = [line for line in log if line.startswith("retrieval score > 0.1")]
    assert f"top: {want} (no haystack answered" in top_line, top_line
    results = json.loads((out / "run.json").read_text())["analyses"]["retrieval"]["results"]
    assert [t["head"] for t in results["top_heads"]] == [name(h) for h in scoring[:10]]
    assert all(t["ranked_score"] > 0 for t in results["top_heads"])
    (far_line,) = [line for line in log if line.startswith("heads that retrieve from more than 4 tokens back")]
    report = section.build(RunFiles(out))
    (top_finding,) = [f for f in report.findings if f.startswith("Retrieval score above 0.1")]
    table = report.tables[0]
    assert [f"{row[0]}-{row[1]}" for row in table.rows] == [name(h) for h in scoring[:10]]
    if family == "gemma3":  # window 4, then global: kinds said
        assert "(global)" in far_line and "global)" in top_finding and "layer kind" in table.columns
    else:  # every layer global: no "(global)" anywhere
        assert "global" not in far_line and "global" not in top_finding and "layer kind" not in table.columns
        assert far_line.endswith("in layers 2"), far_line


def test_an_encoder_is_refused_saying_what_the_command_needs(tiny_checkpoint, files, tmp_path, capsys):
    """Without --model (the default encoder, all-MiniLM-L6-v2) or with an encoder's folder: one line
    saying that the needle test needs a causal model and how to get one, not the loader's words about
    the language-modelling loss; no run directory."""
    from bertscope.data.decoders import INSTALL_COMMAND

    corpus, needles = files
    cases = {"the default model (no --model given)": [], tiny_checkpoint.name: ["--model", str(tiny_checkpoint)]}
    for i, (which, model) in enumerate(cases.items()):
        out = tmp_path / f"run{i}"
        capsys.readouterr()
        assert main(["heads", "retrieval", *model, "--corpus", str(corpus), "--needles", str(needles), "--lengths",
                     "40", "--quiet", "--out", str(out)]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert "needs a causal language model (a decoder) for the needle test" in err, err
        assert f"{which} is a bert encoder" in err and f"`{INSTALL_COMMAND}`" in err, err
        assert "--model smollm2-135m-instruct-q4_1" in err and "language-modelling loss" not in err
        assert not out.exists()


def test_pass_work_counts_weights_and_query_key_pairs(tiny_llama_lm_dir, tiny_gemma3_lm_dir):
    """The estimate's unit: per token every weight of the base model but the embeddings, and per layer
    and head 2 x head_dim per (query, key) pair seen (a window of 4 keys on Gemma-3's first layer),
    counted here pair by pair."""
    from bertscope.analyses.heads.retrieval.command import pass_work
    from bertscope.models.loading import load_model

    for path, windows in ((tiny_llama_lm_dir, [None, None]), (tiny_gemma3_lm_dir, [4, None])):
        loaded = load_model(path, task="causal-lm")
        base = loaded.model.base_model
        weights = sum(p.numel() for name, p in base.named_parameters() if "embed_tokens" not in name)
        head_dim = loaded.model.config.head_dim if path == tiny_gemma3_lm_dir else 32 // 4
        for length in (3, 40):
            pairs = sum(min(i + 1, w or length) for w in windows for i in range(length))
            assert pass_work(loaded, layer_kinds(loaded), length) == weights * length + 2 * 4 * head_dim * pairs


def test_plan_and_time_estimate_logged_before_the_grid(tiny_llama_lm_dir, files, tmp_path, monkeypatch, capsys):
    """Before any pass the log (INFO: shown without --quiet) says the cells planned, the ablation's
    passes and how to cut them; after the first haystack, its time (a clock that advances 10 s a
    reading) and the rest's estimate: 10 s x the multiply-adds left over the first pass's. A rerun
    into the finished directory says they are done and estimates nothing."""
    from types import SimpleNamespace

    import bertscope.analyses.heads.retrieval.command as command
    from bertscope.models.loading import load_model

    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(command, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    out = tmp_path / "run"
    argv = [a for a in grid_args(tiny_llama_lm_dir, files, out) if a != "--quiet"]  # --ablate 1,2 --draws 2
    capsys.readouterr()
    assert main(argv) == 0
    log = capsys.readouterr().out.splitlines()
    plan = [i for i, line in enumerate(log) if line.startswith("planned: ")]
    first = [i for i, line in enumerate(log) if line.startswith("the first haystack (40 tokens) took 10 s: ")]
    result = [i for i, line in enumerate(log) if line.startswith("6 haystacks (plain prompt)")]
    assert len(plan) == len(first) == len(result) == 1 and plan[0] < first[0] < result[0], log
    planned = log[plan[0]]
    assert planned.startswith("planned: 6 haystacks (1 needle x 2 lengths x 3 depths; lengths 40, 56 tokens, 288 in "
                              "all), one forward pass each; then the ablation, 18 passes (the top k and 2 random "
                              "draws of k heads zeroed, k = 1, 2, over 3 haystacks of 40 tokens"), planned
    for option in ("--lengths", "--depths", "--needles", "--ablate 0", "--draws"):
        assert option in planned
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    work = lambda n: command.pass_work(loaded, ["global", "global"], n)  # noqa: E731
    rest = 2 * work(40) + 3 * work(56) + 18 * work(40)  # the grid's other 5 haystacks, the ablation's 18 passes
    assert f"the rest of this call, about {command.duration(10 * rest / work(40))} (an estimate" in log[first[0]]
    assert command.duration(10 * rest / work(40)) == "4 min"  # 23 passes, the 56-token ones ~1.4 x the first
    capsys.readouterr()
    assert main(argv) == 0
    log = capsys.readouterr().out
    assert "6 haystacks (1 needle x 2 lengths x 3 depths; lengths 40, 56 tokens, 288 in all), one forward pass " \
        "each, 6 of them done before" in log and "the first" not in log
