"""`bertscope heads disable` (Kovaleva et al. 2019, section 4.6): gated variants against
models built by hand, batched variants against one-by-one evaluation, and the paired tests
on correctness vectors whose answers are known."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForSequenceClassification

from bertscope.analyses.heads.paired import (
    disagreements,
    mcnemar_exact,
    mcnemar_interval,
)
from bertscope.analyses.heads.variants import (
    baseline,
    evaluate_variants,
    forward_variants,
    gated,
    layer_modules,
    single_heads,
    variant_gates,
    whole_layers,
)
from bertscope.kernels.spec import Gate
from bertscope.models.loading import wrap_model
from bertscope.tasks.inputs import EncodedTask, encode_task

pytestmark = pytest.mark.usefixtures("single_thread")
L_, H_ = TINY_LAYERS, TINY_HEADS
D_ = 32 // TINY_HEADS  # head width of the tiny BERT


def classifier(tokenizer, attn="bertscope", num_labels=2, seed=0, kind="bert"):
    torch.manual_seed(seed)
    config = tiny_config(kind, tokenizer)
    config.num_labels = num_labels
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=attn).eval()


def random_inputs(tokenizer, lengths=(9, 5, 7, 3, 11), seed=0):
    g = torch.Generator().manual_seed(seed)
    L = max(lengths) + 2
    ids = torch.full((len(lengths), L), tokenizer.pad_token_id)
    for b, n in enumerate(lengths):
        words = torch.randint(1000, 5000, (n,), generator=g)
        ids[b, : n + 2] = torch.cat([torch.tensor([tokenizer.cls_token_id]), words,
                                     torch.tensor([tokenizer.sep_token_id])])
    mask = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None] + 2).long()  # (B, L)
    return dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=mask)


def hand_built(tokenizer, heads_by_layer: dict[int, list[int]], mask):
    """The sdpa twin of the tiny classifier whose listed heads are recomputed by hand with a
    constant attention matrix A[i, j] = 1 / n_valid on the valid keys (0 on padding)."""
    twin = classifier(tokenizer, attn="sdpa")
    valid = mask.bool()  # (B, L)
    A = valid[:, None, :].float() / valid.sum(1)[:, None, None]  # (B, L, L): every row uniform over valid keys
    for layer, heads in heads_by_layer.items():
        block = twin.bert.encoder.layer[layer].attention.self

        def hook(mod, args, out, heads=heads):
            hidden = args[0]  # (B, L, E)
            B, L, _ = hidden.shape
            v = mod.value(hidden).view(B, L, H_, D_)  # (B, L, H, D)
            context = out[0].clone()  # (B, L, H * D)
            for h in heads:
                context[..., h * D_: (h + 1) * D_] = torch.bmm(A, v[:, :, h, :])  # (B, L, D)
            return (context, *out[1:])

        block.register_forward_hook(hook)
    return twin


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 3)])
def test_uniform_disabling_a_head_equals_constant_attention_by_hand(minilm_tokenizer, layer, head):
    loaded = wrap_model(classifier(minilm_tokenizer), minilm_tokenizer)
    inputs = random_inputs(minilm_tokenizer)
    with torch.no_grad():
        before = loaded.model(**inputs).logits
        loaded.gates.set(layer, head, Gate.UNIFORM)
        got = loaded.model(**inputs).logits
        want = hand_built(minilm_tokenizer, {layer: [head]}, inputs["attention_mask"])(**inputs).logits
    assert not torch.allclose(before, want, atol=1e-3)  # the head mattered: the test can fail
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layer", range(L_))
def test_disabling_a_whole_layer_equals_the_hand_built_model(minilm_tokenizer, layer):
    """All heads of a layer uniform, through the per-row gates of `variant_gates`, in one batch
    with the baseline and the other layer: each block of rows equals its hand-built model."""
    loaded = wrap_model(classifier(minilm_tokenizer), minilm_tokenizer)
    inputs = random_inputs(minilm_tokenizer)
    variants = [baseline(L_, H_)] + whole_layers(L_, H_, Gate.UNIFORM)
    B = inputs["input_ids"].shape[0]
    with torch.no_grad():
        loaded.gates.xi, loaded.gates.uniform = variant_gates(variants, B)
        logits = loaded.model(**{k: t.repeat(len(variants), 1) for k, t in inputs.items()}).logits  # (3B, C)
        want = hand_built(minilm_tokenizer, {layer: list(range(H_))}, inputs["attention_mask"])(**inputs).logits
        plain = classifier(minilm_tokenizer, attn="sdpa")(**inputs).logits
    block = logits[(1 + layer) * B: (2 + layer) * B]
    assert not torch.allclose(plain, want, atol=1e-3)
    torch.testing.assert_close(block, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[:B], plain, atol=1e-6, rtol=1e-6)  # the baseline rows: no gate


@pytest.fixture(params=["this CPU's BLAS", "a BLAS that rounds per shape"])
def blas(request, monkeypatch):
    """The matrix products as this machine computes them, and as a BLAS that picks a different
    kernel per batch shape does (MKL or oneDNN on a CPU with AVX-512 and AMX): each `nn.Linear`
    result moved by up to a few float32 ulps, by an amount that depends on its number of rows."""
    if request.param != "this CPU's BLAS":
        linear = torch.nn.functional.linear

        def per_shape(x, weight, bias=None):
            out = linear(x, weight, bias)
            rows = out.numel() // max(out.shape[-1], 1)
            return out * (1 + (rows % 7) * 2.0**-23)  # 0 to 6 ulps, by the number of rows

        monkeypatch.setattr(torch.nn.functional, "linear", per_shape)
    return request.param


def toy_task(tokenizer, n=23, seed=1) -> EncodedTask:
    """n random RTE-like pairs of varied lengths with random labels."""
    from bertscope.data.readers.tasks import TaskExample

    rng = np.random.default_rng(seed)
    words = "the cat dog sat on a mat and it was not happy over there with some big red ball".split()
    examples = [TaskExample(str(i), " ".join(rng.choice(words, rng.integers(2, 15))),
                            " ".join(rng.choice(words, rng.integers(1, 8))), int(rng.integers(0, 2))) for i in range(n)]
    return encode_task("rte", examples, tokenizer, max_len=24)


def variant_set():
    return [baseline(L_, H_)] + single_heads(L_, H_, Gate.UNIFORM) + whole_layers(L_, H_, Gate.UNIFORM) \
        + [gated("zero 2-1", L_, H_, [(1, 0)], Gate.ZERO), gated("mixed", L_, H_, [(1, 2)], Gate.UNIFORM)]


@pytest.mark.parametrize("kind", ["bert", "distilbert", "albert"])  # a layer list, another one, shared layers
@pytest.mark.parametrize("share_prefix", [True, False])
@pytest.mark.parametrize("max_rows", [40, 10_000])
def test_batched_variants_equal_one_by_one_evaluation(minilm_tokenizer, kind, share_prefix, max_rows):
    loaded = wrap_model(classifier(minilm_tokenizer, kind=kind), minilm_tokenizer)
    assert (layer_modules(loaded.model) is None) == (kind == "albert")
    task = toy_task(minilm_tokenizer)
    variants = variant_set()
    one = evaluate_variants(loaded, task, variants, batch_size=5, max_rows=0, progress=False)
    many = evaluate_variants(loaded, task, variants, batch_size=5, max_rows=max_rows, progress=False,
                             share_prefix=share_prefix)
    assert many.forwards < one.forwards == len(variants) * 5
    np.testing.assert_array_equal(many.predictions, one.predictions)
    assert (one.predictions != one.predictions[0]).any()  # variants disagree somewhere: the check has teeth
    # and the predictions are those of the gated model run by hand, per variant
    inputs = task.batch(range(task.n_examples), minilm_tokenizer.pad_token_id)
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids")
    for v, row in zip(variants, one.predictions):
        loaded.gates.xi, loaded.gates.uniform = (t[0] for t in variant_gates([v], 1))
        with torch.no_grad():
            np.testing.assert_array_equal(task.predict(loaded.model(**inputs).logits).numpy(), row)
    loaded.gates.reset()
    assert bool((loaded.gates.xi == 1).all()) and not loaded.gates.uniform.any()


# The logits of a variant in a shared forward and in its own forward are equal to this tolerance,
# not bit for bit: the BLAS may pick a different kernel for each batch shape (MKL on a CPU with
# AVX-512 and AMX does, and so do several threads), which moves float32 logits by ~1e-6. What
# the analyses use, each variant's predictions, must be identical.
LOGIT_TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_shared_forward_logits_equal_own_forward_logits_and_predictions(minilm_tokenizer, share_prefix, blas):
    """Each row's arithmetic does not depend on the batch around it beyond the BLAS's rounding:
    a variant's logits in a shared forward are those of its own forward to LOGIT_TOL, and its
    predictions are the same, on this CPU's BLAS and on one that rounds differently per shape."""
    loaded = wrap_model(classifier(minilm_tokenizer), minilm_tokenizer)
    task = toy_task(minilm_tokenizer)
    inputs = task.batch(range(12), minilm_tokenizer.pad_token_id)
    variants = variant_set()[::-1]  # any order: the baseline last
    shared = forward_variants(loaded, inputs, variants, share_prefix)
    assert not loaded.gates.prefix_rows and not loaded.gates.uniform.any()
    with torch.no_grad():
        for v, logits in zip(variants, shared):
            loaded.gates.xi, loaded.gates.uniform = (t[0] for t in variant_gates([v], 1))
            own = loaded.model(**inputs).logits
            torch.testing.assert_close(logits, own, **LOGIT_TOL, msg=v.name)
            assert torch.equal(task.predict(logits), task.predict(own)), v.name
    loaded.gates.reset()


def test_shared_prefix_runs_each_layer_on_the_rows_it_needs(minilm_tokenizer):
    """The baseline runs once (5 rows per layer); the 4 variants gated from layer 2 on start from
    its cached input to layer 2 (5 x 4 rows there) and leave layer 1 a single row."""
    loaded = wrap_model(classifier(minilm_tokenizer), minilm_tokenizer)
    seen = []
    for layer in layer_modules(loaded.model):
        # a forward hook runs after every pre-hook, the growing one included
        layer.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    inputs = random_inputs(minilm_tokenizer)
    later = [v for v in single_heads(L_, H_, Gate.UNIFORM) if v.layer == 2]
    forward_variants(loaded, inputs, [baseline(L_, H_)] + later)
    assert seen == [5, 5, 1, 5 * len(later)]


def test_choice_task_picks_the_higher_scored_candidate():
    task = EncodedTask("arct", rows=[[1]] * 6, types=None, labels=np.array([0, 1, 1]), per_example=2, kind="choice")
    one_logit = torch.tensor([[0.3], [0.1], [-2.0], [1.0], [0.5], [0.6]])
    assert task.predict(one_logit).tolist() == [0, 1, 1]
    two_logits = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 0.0], [3.0, 0.0], [0.0, 0.0], [0.0, -1.0]])
    assert task.predict(two_logits).tolist() == [1, 0, 0]  # log-odds logit[1] - logit[0]


# --- the paired tests on hand-made correctness ------------------------------------------


def test_mcnemar_exact_known_values():
    base = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1], bool)
    var = np.array([0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1], bool)
    b, c = disagreements(var, base)
    assert (b.tolist(), c.tolist()) == ([1], [5])
    # Binomial(6, 1/2): P(X <= 1) = 7/64, two-sided 14/64
    np.testing.assert_allclose(mcnemar_exact(b, c), [14 / 64])
    np.testing.assert_allclose(mcnemar_exact([0, 1, 3, 0], [5, 9, 3, 0]), [2 / 32, 2 * 11 / 1024, 1.0, 1.0])


def test_mcnemar_interval_of_the_issue_example_includes_zero():
    """Issue 23: b = 4, c = 0 of n = 200 has p = 0.125; the percentile bootstrap gave
    [-0.045, -0.005]. The exact interval must hold 0 (and the observed delta -0.02)."""
    np.testing.assert_allclose(mcnemar_exact(4, 0), [0.125])
    low, high = mcnemar_interval(4, 0, 200)
    assert low[0] <= -0.02 < 0 < high[0]
    # by hand: Clopper-Pearson for 0 of 4 is [0, 1 - 0.025 ** (1 / 4)]; delta = 4/200 * (2 pi - 1)
    np.testing.assert_allclose([low[0], high[0]], [-0.02, 0.02 * (2 * (1 - 0.025 ** 0.25) - 1)], rtol=1e-9)


def test_mcnemar_interval_known_answers():
    from scipy.stats import binomtest

    # no disagreement: delta is exactly 0 given m = 0; all disagreements one way: delta = -m/n is the low end
    low, high = mcnemar_interval([0, 7], [0, 0], 50)
    assert (low[0], high[0]) == (0.0, 0.0) and low[1] == -7 / 50 and high[1] < 0  # p = 2/128 < 0.05
    # the interval is scipy's Clopper-Pearson of c out of m, mapped to m/n (2 pi - 1)
    for b, c, n, level in [(3, 9, 40, 0.95), (20, 11, 300, 0.99), (1, 1, 10, 0.9)]:
        ci = binomtest(c, b + c).proportion_ci(level, method="exact")
        low, high = mcnemar_interval(b, c, n, level)
        np.testing.assert_allclose([low[0], high[0]], [(b + c) / n * (2 * ci.low - 1), (b + c) / n * (2 * ci.high - 1)],
                                   rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError):
        mcnemar_interval(5, 6, 10)


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 2000), data=st.data(), alpha=st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.2]))
def test_mcnemar_interval_excludes_zero_iff_the_exact_test_rejects(n, data, alpha):
    b = data.draw(st.integers(0, n))
    c = data.draw(st.integers(0, n - b))
    p = mcnemar_exact(b, c)[0]
    low, high = mcnemar_interval(b, c, n, level=1 - alpha)
    assert (low[0] > 0 or high[0] < 0) == (p < alpha), (b, c, n, alpha, p, low, high)
    assert low[0] <= (c - b) / n <= high[0] and -1 <= low[0] <= high[0] <= 1


def test_mcnemar_interval_agrees_with_the_test_for_every_split_of_small_m():
    for m in range(0, 80):
        b = np.arange(m + 1)
        p = mcnemar_exact(b, m - b)
        low, high = mcnemar_interval(b, m - b, 100)
        assert (((low > 0) | (high < 0)) == (p < 0.05)).all(), m


# --- the command --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_classifier_checkpoint(tmp_path_factory, minilm_tokenizer):
    path = tmp_path_factory.mktemp("tiny-cls")
    classifier(minilm_tokenizer).save_pretrained(path)
    minilm_tokenizer.save_pretrained(path)
    return path


def test_disable_command_on_rte(tiny_classifier_checkpoint, tmp_path):
    from conftest import require_data

    from bertscope.cli.main import main

    require_data("rte")
    out = tmp_path / "run"
    assert main(["heads", "disable", "--model", str(tiny_classifier_checkpoint), "--task", "rte", "--limit", "30",
                 "--out", str(out), "--quiet"]) == 0
    import csv

    rows = list(csv.DictReader(open(out / "disable.csv")))
    assert [r["variant"] for r in rows[:3]] == ["baseline", "1-1", "1-2"] and rows[-1]["variant"] == f"layer {L_}"
    assert len(rows) == 1 + L_ * H_ + L_
    base = float(rows[0]["accuracy"])
    for r in rows[1:]:
        assert float(r["ci_low"]) <= float(r["delta"]) + 1e-9 <= float(r["ci_high"]) + 2e-9
        assert abs(float(r["accuracy"]) - base - float(r["delta"])) < 1e-5
        # delta is (c - b) / N exactly
        assert abs(float(r["delta"]) - (int(r["c"]) - int(r["b"])) / 30) < 1e-5
    entry = json.loads((out / "run.json").read_text())["analyses"]["disable"]
    assert entry["status"] == "complete" and entry["results"]["examples"] == 30
    assert {"fig_disable_heads.png", "fig_disable_layers.png", "disable.csv"} <= set(entry["outputs"])
    assert "Disabling heads and layers (Kovaleva et al. 2019, section 4.6)" in (out / "index.html").read_text()


def test_disable_command_user_errors(tiny_checkpoint, tmp_path, minilm_tokenizer, capsys):
    from conftest import require_data

    from bertscope.cli.main import main

    require_data("rte")
    three = tmp_path / "three"
    classifier(minilm_tokenizer, num_labels=3).save_pretrained(three)
    minilm_tokenizer.save_pretrained(three)
    cases = ((tiny_checkpoint, "has no sequence-classification head"), (three, "has 3 labels; task rte needs 2"))
    for model, match in cases:
        code = main(["heads", "disable", "--model", str(model), "--task", "rte", "--limit", "5", "--out",
                     str(tmp_path / "o"), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["heads", "disable", "--model", str(three), "--task", "mnli"])
    assert exit_info.value.code == 2 and "invalid choice: 'mnli'" in capsys.readouterr().err


def test_disable_command_on_arct_scores_warrant_pairs(tmp_path, minilm_tokenizer):
    """ARCT: a one-logit head scores each warrant (claim + reason first); two rows per example."""
    import csv

    from conftest import require_data

    from bertscope.cli.main import main

    require_data("arct")
    ckpt = tmp_path / "arct"
    classifier(minilm_tokenizer, num_labels=1).save_pretrained(ckpt)
    minilm_tokenizer.save_pretrained(ckpt)
    out = tmp_path / "run"
    assert main(["heads", "disable", "--model", str(ckpt), "--task", "arct", "--split", "dev", "--limit", "12",
                 "--out", str(out), "--quiet", "--no-figures"]) == 0
    rows = list(csv.DictReader(open(out / "disable.csv")))
    assert len(rows) == 1 + L_ * H_ + L_
    assert all(abs(float(r["accuracy"]) * 12 - round(float(r["accuracy"]) * 12)) < 1e-4 for r in rows)
    entry = json.loads((out / "run.json").read_text())["analyses"]["disable"]["results"]
    assert entry["examples"] == 12 and entry["task"] == "arct" and entry["arct_version"] == "original"
