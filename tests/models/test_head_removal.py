"""Real head pruning (bertscope/models/head_removal.py): a pruned model is the zero-gated model, smaller.

For every supported family, removing heads must give the outputs of the unpruned model with
those heads' gates xi = 0 (Michel et al.'s masking), directly and after save + load_model;
statistics of a pruned model must be the zero-gated model's for kept heads and NaN for the
removed ones.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import random_segments
from test_gates import batch
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    CamembertConfig,
    XLMRobertaConfig,
)

from bertscope.engine.loop import EngineOptions, run_stats
from bertscope.kernels.spec import Gate, StatsSpec
from bertscope.models import head_removal
from bertscope.models.architectures import ARCHITECTURES
from bertscope.models.loading import SUPPORTED_MODEL_TYPES, load_model, wrap_model

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, entropy=True, argmax=True, column_mass=True, class_mass=True)
ROBERTA_LIKE = {"xlm-roberta": XLMRobertaConfig, "camembert": CamembertConfig}
ATOL = 1e-5
# the encoders whose heads can be removed (the decoders': tests/models/test_decoder_families.py)
ENCODERS = tuple(t for t in SUPPORTED_MODEL_TYPES
                 if ARCHITECTURES[t].removal is not None and not ARCHITECTURES[t].causal)


@pytest.fixture(scope="module")
def family(minilm_tokenizer, roberta_tokenizer):
    """family(kind, auto_class=AutoModel, seed=0) -> (model in eval mode, tokenizer): tiny random
    models of every supported family; ALBERT with one weight group per layer."""

    def make(kind, auto_class=AutoModel, seed=0, groups=TINY_LAYERS):
        roberta_like = kind in ("roberta", *ROBERTA_LIKE)
        tokenizer = roberta_tokenizer if roberta_like else minilm_tokenizer
        config = tiny_config("roberta" if roberta_like else kind, tokenizer)
        if kind in ROBERTA_LIKE:
            config = ROBERTA_LIKE[kind](**{k: v for k, v in config.to_dict().items() if k != "model_type"})
        if kind == "albert":
            config.num_hidden_groups = groups
        torch.manual_seed(seed)
        model = auto_class.from_config(config, attn_implementation="bertscope")
        return model.eval(), tokenizer

    return make


def inputs_for(model, tokenizer):
    inputs = batch(tokenizer)
    if "token_type_ids" not in model.forward.__code__.co_varnames:
        inputs.pop("token_type_ids")
    return inputs


def zero_gated(model, tokenizer, heads, inputs):
    """Outputs of the unpruned model with `heads` gated xi = 0 (gates reset afterwards)."""
    loaded = wrap_model(model, tokenizer)
    xi = torch.ones(loaded.n_layers, loaded.n_heads)
    for layer, hs in heads.items():
        xi[layer, hs] = 0.0
    loaded.gates.xi = xi
    with torch.no_grad():
        out = model(**inputs)
    loaded.gates.reset()
    return out


def head_sets():
    """layer -> heads to remove: any subset per layer, all heads and none included."""
    subset = st.lists(st.integers(0, TINY_HEADS - 1), unique=True, max_size=TINY_HEADS)
    return st.fixed_dictionaries({layer: subset for layer in range(TINY_LAYERS)})


def test_every_supported_family_is_covered(family):
    for kind in ENCODERS:
        model, _ = family(kind)
        assert model.config.model_type == kind


@pytest.mark.parametrize("kind", ENCODERS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(heads=head_sets())
def test_pruned_equals_zero_gated(family, kind, heads):
    model, tokenizer = family(kind)
    inputs = inputs_for(model, tokenizer)
    want = zero_gated(model, tokenizer, heads, inputs).last_hidden_state  # (B, L, E)
    full = model(**inputs).last_hidden_state
    kept = head_removal.prune_heads(model, heads)
    assert kept == {layer: [h for h in range(TINY_HEADS) if h not in heads[layer]] for layer in range(TINY_LAYERS)}
    with torch.no_grad():
        got = model(**inputs).last_hidden_state
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    if any(heads.values()):  # the test can fail: removing heads changes the output
        assert (got - full).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ENCODERS)
def test_projections_shrink_and_slots_are_recorded(family, kind):
    model, _ = family(kind)
    head_removal.prune_heads(model, {0: [1, 3], 1: [0, 1, 2, 3]})
    D = 32 // TINY_HEADS
    parts0, parts1 = head_removal.attention_parts(model, 0), head_removal.attention_parts(model, 1)
    for owner, name in (parts0.q, parts0.k, parts0.v):
        assert getattr(owner, name).weight.shape == (2 * D, 32)
    assert getattr(*parts0.out).weight.shape == (32, 2 * D)
    assert parts0.module.bertscope_head_slots == (0, 2) and parts0.module.bertscope_n_heads == TINY_HEADS
    assert parts1.module.bertscope_head_slots == (head_removal.PLACEHOLDER,)  # an empty layer: one zero head
    assert getattr(*parts1.q).weight.abs().sum() == 0 and getattr(*parts1.out).weight.abs().sum() == 0
    assert head_removal.pruned_heads(model) == {0: [1, 3], 1: [0, 1, 2, 3]}
    assert model.config.bertscope_kept_heads == {"0": [0, 2], "1": []}


def test_pruning_twice_uses_original_indices(family):
    model, tokenizer = family("bert")
    inputs = inputs_for(model, tokenizer)
    want = zero_gated(model, tokenizer, {0: [0, 2, 3]}, inputs).last_hidden_state
    head_removal.prune_heads(model, {0: [2]})
    head_removal.prune_heads(model, {0: [0, 3, 2]})  # 2 again: already gone, nothing changes for it
    assert head_removal.kept_heads(model)[0] == [1]
    torch.testing.assert_close(model(**inputs).last_hidden_state, want, atol=ATOL, rtol=0)


def test_bad_heads_are_refused(family):
    model, _ = family("bert")
    # counted from 1, as the user wrote them (`heads remove --heads 6-1`)
    n_layers = head_removal.n_layers_heads(model.config)[0]
    with pytest.raises(ValueError, match=rf"^layer 6 does not exist: the model has layers 1\.\.{n_layers}$"):
        head_removal.prune_heads(model, {5: [0]})
    with pytest.raises(ValueError, match=rf"^layer 1: head 5 does not exist: the model has heads 1\.\.{TINY_HEADS}$"):
        head_removal.prune_heads(model, {0: [4]})
    with pytest.raises(ValueError, match=r"^layer 2: heads 5, 7 do not exist"):
        head_removal.prune_heads(model, {1: [0, 4, 6]})
    assert head_removal.kept_heads(model)[0] == list(range(TINY_HEADS))  # nothing half done


def test_albert_shared_weights_prune_only_alike(family):
    model, tokenizer = family("albert", groups=1)  # both layers run one attention module
    with pytest.raises(ValueError, match="share one attention module"):
        head_removal.prune_heads(model, {0: [1]})
    inputs = inputs_for(model, tokenizer)
    heads = {0: [1, 2], 1: [1, 2]}
    want = zero_gated(model, tokenizer, heads, inputs).last_hidden_state
    head_removal.prune_heads(model, heads)
    torch.testing.assert_close(model(**inputs).last_hidden_state, want, atol=ATOL, rtol=0)


# --- save and load --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ENCODERS)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(heads=head_sets())
def test_save_and_load_model_give_the_zero_gated_outputs(family, kind, heads, tmp_path_factory):
    model, tokenizer = family(kind)
    inputs = inputs_for(model, tokenizer)
    want = zero_gated(model, tokenizer, heads, inputs).last_hidden_state
    head_removal.prune_heads(model, heads)
    path = head_removal.save_pruned(model, tokenizer, tmp_path_factory.mktemp(kind))
    config = json.loads((path / "config.json").read_text())
    assert config[head_removal.CONFIG_PRUNED] == {str(layer): sorted(hs) for layer, hs in heads.items()}
    loaded = load_model(path)
    assert loaded.n_heads == TINY_HEADS and head_removal.pruned_heads(loaded.model) == \
        {layer: sorted(hs) for layer, hs in heads.items()}
    with torch.no_grad():
        got = loaded.model(**inputs).last_hidden_state
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


def test_task_model_round_trip(family, tmp_path):
    """A classifier pruned and saved loads back with its head (the same logits) and as a bare
    encoder (the same hidden states); a bare pruned encoder loads as a classifier with a
    seeded fresh head."""
    model, tokenizer = family("bert", AutoModelForSequenceClassification)
    inputs = inputs_for(model, tokenizer)
    heads = {0: [0], 1: [1, 2]}
    want = zero_gated(model, tokenizer, heads, inputs)
    head_removal.prune_heads(model, heads)
    head_removal.save_pruned(model, tokenizer, tmp_path / "clf")
    clf = load_model(tmp_path / "clf", task="sequence-classification")
    assert not clf.head_initialised
    with torch.no_grad():
        torch.testing.assert_close(clf.model(**inputs).logits, want.logits, atol=ATOL, rtol=0)
        bare = load_model(tmp_path / "clf").model(**inputs, output_hidden_states=True)
        ref = model(**inputs, output_hidden_states=True)
    torch.testing.assert_close(bare.last_hidden_state, ref.hidden_states[-1], atol=ATOL, rtol=0)
    head_removal.save_pruned(clf.model.base_model, tokenizer, tmp_path / "bare")
    fresh = load_model(tmp_path / "bare", task="sequence-classification", num_labels=3)
    assert fresh.head_initialised and fresh.model.config.num_labels == 3
    assert head_removal.pruned_heads(fresh.model) == {0: [0], 1: [1, 2]}


def test_a_bad_record_is_a_user_error(family, tmp_path):
    from bertscope.errors import UserError

    model, tokenizer = family("bert")
    head_removal.prune_heads(model, {0: [1]})
    head_removal.save_pruned(model, tokenizer, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[head_removal.CONFIG_PRUNED] = {"0": [7]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="do not fit 2 layers x 4 heads"):
        load_model(tmp_path)


# --- gates and statistics on a pruned model --------------------------------------------------


def test_gate_gradients_of_kept_heads_match(family):
    """d loss / d xi through a pruned model: the unpruned model's (with the removed heads at
    xi = 0) for kept heads, 0 for the removed ones."""
    heads = {0: [2], 1: [0, 1, 2, 3]}
    grads = []
    for prune in (False, True):
        model, tokenizer = family("distilbert")
        loaded = wrap_model(model, tokenizer)
        xi = torch.rand(2, TINY_LAYERS, TINY_HEADS, generator=torch.Generator().manual_seed(0)) + 0.5  # (B, layers, H)
        inputs = batch(tokenizer, lengths=(6, 4))
        inputs.pop("token_type_ids")
        for layer, hs in heads.items():
            xi[:, layer, hs] = 0.0
        if prune:
            head_removal.prune_heads(model, heads)
        loaded.gates.xi = xi.requires_grad_()
        model(**inputs).last_hidden_state.tanh().sum().backward()
        grads.append(xi.grad)
    full, pruned = grads
    kept = torch.ones(2, TINY_LAYERS, TINY_HEADS, dtype=torch.bool)
    for layer, hs in heads.items():
        kept[:, layer, hs] = False
    torch.testing.assert_close(pruned[kept], full[kept], atol=1e-5, rtol=1e-4)
    assert (pruned[~kept] == 0).all() and full[~kept].abs().max() > 1e-4  # the removed heads did matter


@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert", "albert"])
@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_run_statistics_of_a_pruned_model(family, kind, backend):
    """HeadStats of a pruned model: the unpruned model's with the heads zero-gated (the gates
    change what later layers see), NaN for the removed heads."""
    heads = {0: [1], 1: [0, 2, 3]}
    model, tokenizer = family(kind)
    loaded = wrap_model(model, tokenizer)
    segments = random_segments(tokenizer, n=9, max_len=24)
    options = EngineOptions(batch_size=4, backend=backend, progress=False)
    for layer, hs in heads.items():
        for h in hs:
            loaded.gates.set(layer, h, Gate.ZERO)
    want = run_stats(loaded, segments, SPEC, options)
    loaded.gates.reset()
    head_removal.prune_heads(model, heads)
    got = run_stats(loaded, segments, SPEC, options)
    removed = np.zeros((TINY_LAYERS, TINY_HEADS), dtype=bool)
    for layer, hs in heads.items():
        removed[layer, hs] = True
    for name in ("entropy_sum", "offset_mass_sum", "class_mass_sum", "argmax_offset_count", "argmax_class_count"):
        a, b = getattr(got, name), getattr(want, name)
        assert np.isnan(a[removed]).all(), name
        np.testing.assert_allclose(a[~removed], b[~removed], rtol=1e-5, atol=1e-6, err_msg=name)
    np.testing.assert_array_equal(got.n_rows, want.n_rows)


def test_spread_heads_puts_heads_back():
    from bertscope.kernels.spec import RowStats

    stats = RowStats(entropy=torch.tensor([[[1.0], [2.0]]]), argmax=torch.tensor([[[0], [1]]]), scale=0.5)  # (1, 2, 1)
    out = head_removal.spread_heads(stats, (3, 1), 4)
    assert out.entropy[0, :, 0].tolist()[1] == 2.0 and out.entropy[0, 3, 0] == 1.0
    assert torch.isnan(out.entropy[0, [0, 2]]).all() and out.argmax[0, :, 0].tolist() == [-1, 1, -1, 0]
    assert out.scale == 0.5
    empty = head_removal.spread_heads(RowStats(entropy=torch.ones(1, 1, 3)), (head_removal.PLACEHOLDER,), 4)
    assert empty.entropy.shape == (1, 4, 3) and torch.isnan(empty.entropy).all()


# --- choosing heads -------------------------------------------------------------------------


def test_parse_heads():
    assert head_removal.parse_heads("1-3, 2-5,1-1,1-3") == {0: [0, 2], 1: [4]}
    for bad in ("0-1", "1-0", "1:3", "a-b", "", "3"):
        with pytest.raises(ValueError):
            head_removal.parse_heads(bad)


def write_prune_order(run_dir, rows):
    """A prune_order.csv as `bertscope heads prune` writes it (layer and head from 1)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = ["step,fraction_pruned,layer,head"] + [",".join(map(str, r)) for r in rows]
    (run_dir / "prune_order.csv").write_text("\n".join(lines) + "\n")
    return run_dir


PRUNE_ORDER = [(1, 0.125, 1, 2), (1, 0.125, 2, 4), (2, 0.25, 2, 1), (2, 0.25, 2, 2), (3, 0.375, 1, 4)]


def test_heads_from_prune_order(tmp_path):
    from bertscope.analyses.heads.prune.outputs import heads_from_prune_order

    run = write_prune_order(tmp_path / "run", PRUNE_ORDER)
    path = run / "prune_order.csv"
    assert heads_from_prune_order(path, 0.1) == {}
    assert heads_from_prune_order(path, 0.125) == {0: [1], 1: [3]}
    assert heads_from_prune_order(path, 0.3) == {0: [1], 1: [0, 1, 3]}
    path.write_text("layer,head\n1,1\n")
    with pytest.raises(ValueError, match="columns"):
        heads_from_prune_order(path, 0.5)


# --- the command ------------------------------------------------------------------------------


def test_heads_remove_command(tiny_checkpoint, tmp_path, capsys):
    from bertscope.cli.main import main

    run = write_prune_order(tmp_path / "prune-run", PRUNE_ORDER)
    out = tmp_path / "pruned"
    assert main(["heads", "remove", "--model", str(tiny_checkpoint), "--from-prune", str(run), "--fraction", "0.25",
                 "--out", str(out)]) == 0
    assert "removed 4 of 8 heads (50.0%); heads per layer: 3 1" in capsys.readouterr().out
    loaded = load_model(out)
    assert head_removal.pruned_heads(loaded.model) == {0: [1], 1: [0, 1, 3]}
    out2 = tmp_path / "pruned2"
    assert main(["heads", "remove", "--model", str(tiny_checkpoint), "--heads", "1-1,2-4", "--out", str(out2)]) == 0
    assert head_removal.pruned_heads(load_model(out2).model) == {0: [0], 1: [3]}


@pytest.mark.parametrize("argv, message", [
    # every message counts layers and heads from 1, as --heads does (the tiny model: 2 layers x 4 heads)
    (["--heads", "1-9"], "layer 1: head 9 does not exist: the model has heads 1..4"),
    (["--heads", "3-3"], "layer 3 does not exist: the model has layers 1..2"),
    (["--heads", "2-1,2-5,2-6"], "layer 2: heads 5, 6 do not exist: the model has heads 1..4"),
    (["--heads", "x"], "--heads: 'x' is not LAYER-HEAD"),
    (["--heads", "1-1", "--fraction", "0.5"], "--fraction goes with --from-prune"),
    (["--from-prune", "RUN"], "--from-prune needs --fraction"),
    (["--from-prune", "NOWHERE", "--fraction", "0.5"], "prune_order.csv not found"),
    (["--from-prune", "RUN", "--fraction", "0.1"], "prunes no head at fraction <= 0.1"),
    (["--heads", "1-1", "--out", "FULL"], "exists and is not an empty folder"),
])
def test_heads_remove_mistakes(tiny_checkpoint, tmp_path, capsys, argv, message):
    from bertscope.cli.main import main

    run = write_prune_order(tmp_path / "run", PRUNE_ORDER)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    paths = {"RUN": str(run), "NOWHERE": str(tmp_path / "nowhere"), "FULL": str(tmp_path / "full")}
    argv = [paths.get(a, a) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    assert main(["heads", "remove", "--model", str(tiny_checkpoint), *argv]) != 0
    err = capsys.readouterr().err
    assert err.startswith("bertscope: error: ") and message in err and "Traceback" not in err


def test_run_command_on_a_pruned_checkpoint(tiny_checkpoint, tmp_path, capsys):
    """`bertscope run --model PRUNED` writes heads.csv with NaN for removed heads, and figures."""
    import csv

    from bertscope.cli.main import main

    pruned = tmp_path / "pruned"
    assert main(["heads", "remove", "--model", str(tiny_checkpoint), "--heads", "1-2,2-1,2-2,2-3,2-4",
                 "--out", str(pruned)]) == 0
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\tIt was happy.\nHello, world. Again.\nA third line, with commas.\n")
    out = tmp_path / "run"
    assert main(["run", "--model", str(pruned), "--corpus", str(corpus), "--limit", "all", "--argmax",
                 "--out", str(out)]) == 0  # not --quiet: the summary it prints is checked
    said = capsys.readouterr()
    by_layer = next(line for line in (said.out + said.err).splitlines() if "[SEP] mass by layer" in line).split()
    assert by_layer[-1] == "nan" and by_layer[-2] != "nan"  # layer 1: the mean of its kept heads
    rows = list(csv.DictReader(open(out / "heads.csv")))
    by_head = {(int(r["layer"]), int(r["head"])): r for r in rows}
    assert len(rows) == TINY_LAYERS * TINY_HEADS
    assert by_head[(1, 2)]["entropy"] == "nan" and all(by_head[(2, h)]["sep"] == "nan" for h in range(1, 5))
    # layer 1's kept heads read the embeddings, as in the unpruned model: their statistics are its
    assert main(["run", "--model", str(tiny_checkpoint), "--corpus", str(corpus), "--limit", "all", "--argmax",
                 "--no-figures", "--quiet", "--out", str(tmp_path / "full")]) == 0
    full = {(int(r["layer"]), int(r["head"])): r for r in csv.DictReader(open(tmp_path / "full" / "heads.csv"))}
    for head in (1, 3, 4):
        for col in ("entropy", "sep", "argmax_self"):
            assert float(by_head[(1, head)][col]) == pytest.approx(float(full[(1, head)][col]), abs=1e-5), (head, col)
    assert float(by_head[(1, 1)]["entropy"]) > 0
    assert (out / "fig_entropy_heatmap.png").stat().st_size > 1000
    record = json.loads((out / "run.json").read_text())["model"]
    assert record["heads"] == TINY_HEADS and record["pruned_heads"] == ["1-2", "2-1", "2-2", "2-3", "2-4"]


def test_the_embedded_minilm_pruned_equals_zero_gated(minilm_path, tmp_path):
    """The real 6 x 12 MiniLM, half of every layer's heads removed, saved and loaded back."""
    loaded = load_model(minilm_path)
    rng = np.random.default_rng(0)
    heads = {layer: sorted(int(h) for h in rng.choice(12, 6, replace=False)) for layer in range(6)}
    enc = loaded.tokenizer(["Attention heads attend to the separator token.", "A second, shorter one."],
                           padding=True, return_tensors="pt")
    want = zero_gated(loaded.model, loaded.tokenizer, heads, enc).last_hidden_state
    head_removal.prune_heads(loaded.model, heads)
    head_removal.save_pruned(loaded.model, loaded.tokenizer, tmp_path)
    with torch.no_grad():
        got = load_model(tmp_path).model(**enc).last_hidden_state
    # float32 rounding of differently shaped matmuls, through 6 layers: 3e-5 on values ~1.5 seen
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    assert (tmp_path / "model.safetensors").stat().st_size < (minilm_path / "model.safetensors").stat().st_size


@pytest.mark.parametrize("kind", ["bert", "albert"])
def test_gated_variants_on_a_pruned_classifier(minilm_tokenizer, kind):
    """`bertscope.analyses.heads.variants` (several gated variants per forward, shared prefixes) on a pruned
    model: the same predictions as one by one; zero-gating a removed head changes nothing,
    zero-gating a kept one does what it does on the unpruned model with the removed heads gated."""
    from test_disable import classifier, toy_task

    from bertscope.analyses.heads.variants import baseline, evaluate_variants, gated, single_heads

    heads = {0: [1, 2], 1: [1, 2]}  # alike in both layers: ALBERT shares one module
    L, H = TINY_LAYERS, TINY_HEADS
    task = toy_task(minilm_tokenizer)
    variants = [baseline(L, H)] + single_heads(L, H, Gate.ZERO)
    pruned = wrap_model(classifier(minilm_tokenizer, kind=kind), minilm_tokenizer)
    head_removal.prune_heads(pruned.model, heads)
    one = evaluate_variants(pruned, task, variants, batch_size=5, max_rows=0, progress=False)
    many = evaluate_variants(pruned, task, variants, batch_size=5, max_rows=40, progress=False)
    np.testing.assert_array_equal(many.predictions, one.predictions)
    full = wrap_model(classifier(minilm_tokenizer, kind=kind), minilm_tokenizer)
    removed = [(layer, h) for layer, hs in heads.items() for h in hs]
    masked = [gated(v.name, L, H, removed + [(v.layer - 1, v.head - 1)] if v.layer else removed, Gate.ZERO)
              for v in variants]
    want = evaluate_variants(full, task, masked, batch_size=5, max_rows=0, progress=False)
    np.testing.assert_array_equal(one.predictions, want.predictions)
    assert (one.predictions != one.predictions[0]).any()  # some kept head matters: the check has teeth
    for i, v in enumerate(variants[1:], start=1):
        if (v.layer - 1, v.head - 1) in removed:
            np.testing.assert_array_equal(one.predictions[i], one.predictions[0])
