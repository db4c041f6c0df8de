"""`bertscope view`: the data the page embeds, against the model's own attention maps, the
engine's word maps and the engine's head table; the command line's user errors."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bertscope
from bertscope.cli.main import main
from bertscope.view import SCALE, quantize_rows, render, view_data

pytestmark = pytest.mark.usefixtures("single_thread")

TEXT, PAIR = "Tokenization splits unbelievably long words, doesn't it?", "Yes."
TOL = 1.5 / SCALE  # rounding to thousandths moves an entry by less than one unit


@pytest.fixture(scope="module")
def scope(minilm_path):
    return bertscope.load(minilm_path)


@pytest.fixture(scope="module")
def data(scope):
    return view_data(scope, TEXT, PAIR)


@pytest.fixture(scope="module")
def reference(minilm_path, scope):
    """transformers' own eager attention maps of the input, (layers, H, L, L) float64."""
    from transformers import AutoModel

    twin = AutoModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
    inputs = scope.tokenizer(TEXT, PAIR, return_tensors="pt")
    with torch.inference_mode():
        maps = twin(**inputs, output_attentions=True).attentions
    return torch.stack(maps)[:, 0].double().numpy()


def as_maps(flat, n):
    return np.asarray(flat, dtype=np.float64).reshape(len(flat), len(flat[0]), n, n) / SCALE


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), rows=st.integers(1, 5), seed=st.integers(0, 10**6), peaked=st.booleans())
def test_quantized_rows_sum_to_scale_and_stay_within_one_unit(n, rows, seed, peaked):
    g = np.random.default_rng(seed)
    p = g.dirichlet(np.full(n, 0.05 if peaked else 1.0), size=rows)  # (rows, n)
    q = quantize_rows(p)
    assert q.dtype == np.int64 and (q >= 0).all()
    assert (q.sum(-1) == SCALE).all()
    assert np.abs(q / SCALE - p).max() < 1 / SCALE


def test_quantized_one_hot_and_uniform_rows():
    np.testing.assert_array_equal(quantize_rows(np.eye(3)), np.eye(3, dtype=np.int64) * SCALE)
    q = quantize_rows(np.full((1, 3), 1 / 3))
    assert sorted(q[0]) == [333, 333, 334]


def test_labels_and_shapes(data, scope):
    ids = scope.tokenizer(TEXT, PAIR)["input_ids"]
    assert data["tokens"] == scope.tokenizer.convert_ids_to_tokens(ids)
    n, words = len(data["tokens"]), data["words"]
    assert words[0] == "[CLS]" and words.count("[SEP]") == 2 and words[-1] == "[SEP]"
    assert "unbelievably" in words and "unbelievably" not in data["tokens"]  # a split word is one word
    assert len(words) < n and len(data["token_word"]) == n and data["token_word"] == sorted(data["token_word"])
    assert (data["layers"], data["heads"]) == (6, 12)
    for key, size in (("token_maps", n), ("word_maps", len(words))):
        maps = np.asarray(data[key])
        assert maps.shape == (6, 12, size * size)
        assert (maps.reshape(6, 12, size, size).sum(-1) == SCALE).all()  # every row sums to exactly 1
    assert data["uniform_entropy"] == pytest.approx(np.log(n), abs=1e-4)


def test_token_maps_equal_the_models_eager_attention(data, reference):
    got = as_maps(data["token_maps"], len(data["tokens"]))
    assert got.shape == reference.shape
    assert np.abs(got - reference).max() < TOL


def test_word_maps_equal_the_engines_and_pooled_attention(data, scope, reference):
    W = len(data["words"])
    got = as_maps(data["word_maps"], W)
    # the engine's word maps (its own kernel), units: words first, then [CLS], [SEP], [SEP]
    words, engine = scope.word_maps((TEXT, PAIR))
    n_a = data["words"].index("[SEP]") - 1  # words of part A
    order = [len(words), *range(n_a), len(words) + 1, *range(n_a, len(words)), len(words) + 2]
    assert [data["words"][i] for i in np.argsort(order)] == words + ["[CLS]", "[SEP]", "[SEP]"]
    assert np.abs(got - engine[..., order, :][..., :, order]).max() < TOL
    # by hand from the model's maps: to a word, the sum of its tokens; from a word, their mean
    member = np.eye(W)[data["token_word"]]  # (L, W)
    pooled = (member / member.sum(0)).T @ reference @ member  # (layers, H, W, W)
    assert np.abs(got - pooled).max() < TOL


def test_statistics_equal_the_engines_head_table(data, scope):
    table = scope.stats([(TEXT, PAIR)])
    for c, column in enumerate(data["columns"]):
        got = np.asarray(data["stats"])[..., c].ravel()  # layer-major, as the table
        np.testing.assert_allclose(got, table[column].to_numpy(), atol=1e-4, err_msg=column)
    top = np.asarray(data["top_class"]).ravel()
    masses = table[["cls", "sep", "punct", "other"]].to_numpy()
    assert list(top) == [("cls", "sep", "punct", "other")[i] for i in masses.argmax(1)]
    prev = np.asarray(data["stats"])[..., data["columns"].index("prev")]
    assert prev[0, 2] > 0.9  # MiniLM's previous-token head 1-3


def test_pattern_hook_is_labelled_and_fillable(data, scope):
    assert data["patterns"] is None and "not computed yet" in data["pattern_note"]
    kinds = np.full((6, 12), "vertical", dtype=object)
    filled = view_data(scope, "A cat.", patterns=kinds)
    assert filled["patterns"][5][11] == "vertical"
    with pytest.raises(ValueError, match="shape"):
        view_data(scope, "A cat.", patterns=kinds[:2])


def test_page_is_offline_and_embeds_the_data(data):
    page = render(data)
    assert not re.search(r"<script[^>]+src|<link[^>]+href=\"http|https?://", page)
    payload = re.search(r"const DATA = (.*);\n", page).group(1)
    assert json.loads(payload) == data
    assert len(page) < 200_000  # 33 tokens: maps in thousandths keep the file small


def test_word_maps_are_not_repeated_when_every_word_is_one_token(scope):
    data = view_data(scope, "The cat sat on the mat.")
    assert data["word_maps"] is None and len(data["words"]) == len(data["tokens"]) == 9
    assert data["words"][1] == "The" and data["tokens"][1] == "the"  # labels still are the words
    _, engine = scope.word_maps("The cat sat on the mat.")  # words, then [CLS], [SEP]
    order = [7, *range(7), 8]
    assert np.abs(as_maps(data["token_maps"], 9) - engine[..., order, :][..., :, order]).max() < TOL


def test_script_end_tags_in_text_cannot_break_the_page(scope):
    page = render(view_data(scope, "a </script><b>bold</b>"))
    assert page.count("</script>") == 1
    assert json.loads(re.search(r"const DATA = (.*);\n", page).group(1))["text"] == "a </script><b>bold</b>"


def check_error(capsys, code: int, fragment: str):
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: ") and err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize("args, fragment", [
    (["", "--out", "{tmp}/v.html"], "TEXT is empty"),
    (["  \n", "--out", "{tmp}/v.html"], "TEXT is empty"),
    (["A cat.", "--pair", " ", "--out", "{tmp}/v.html"], "--pair is empty"),
    (["A cat.", "--out", "{tmp}"], "is a directory"),
    (["A cat.", "--out", "{tmp}/no/v.html"], "does not exist"),
    (["word " * 200, "--out", "{tmp}/v.html"], "202 tokens with its special tokens, more than --max-len 128"),
    (["A cat.", "--max-len", "600", "--out", "{tmp}/v.html"], "more than the model takes (512 tokens)"),
    (["A cat.", "--model", "{tmp}", "--out", "{tmp}/v.html"], "no config.json"),
])
def test_user_errors_exit_2_with_one_line(args, fragment, tmp_path, capsys, minilm_path):
    check_error(capsys, main(["view", *[a.replace("{tmp}", str(tmp_path)) for a in args]]), fragment)
    assert not (tmp_path / "v.html").exists()


def test_cli_writes_one_page(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "v.html"
    assert main(["view", "The cat sat.", "--pair", "It purred.", "--model", str(tiny_checkpoint),
                 "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    data = json.loads(re.search(r"const DATA = (.*);\n", out.read_text(encoding="utf-8")).group(1))
    assert data["tokens"] == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "it", "pu", "##rred", ".", "[SEP]"]
    assert data["words"][6:8] == ["It", "purred"] and data["pair"] == "It purred."


def test_help_describes_the_page(capsys):
    with pytest.raises(SystemExit):
        main(["view", "--help"])
    out = capsys.readouterr().out
    for fragment in ("TEXT", "--pair", "--model", "--out", "--max-len", "offline"):
        assert fragment in out


def test_roberta_template_and_its_special_tokens(tiny_model):
    from bertscope.api import Scope
    from bertscope.models.loading import wrap_model

    model, tokenizer = tiny_model("roberta")
    data = view_data(Scope(wrap_model(model, tokenizer)), "The cat sat.", "It purred!", max_len=40)
    words = data["words"]
    assert words[0] == "<s>" and words.count("</s>") == 3 and words[-1] == "</s>"  # <s> a </s></s> b </s>
    assert [w for w in words if w not in ("<s>", "</s>")] == ["The", "cat", "sat", ".", "It", "purred", "!"]
    n = len(data["tokens"])
    assert (np.asarray(data["token_maps"]).reshape(-1, n, n).sum(-1) == SCALE).all()
    assert "<s>" not in render(data).split("const DATA")[0]  # labels reach the page only as JSON text
