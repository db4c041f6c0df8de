"""Head gates (bertscope/models/gates.py, kernels/gates.py): exact gradients, identities, every backend.

xi scales each head's output, uniform replaces its attention by the uniform distribution over
valid keys (Michel et al. 2019; Kovaleva et al. 2019). The gates live on the model, so they
work on a plain forward as well as inside an analysis, and autograd gives d loss / d xi.
"""
from __future__ import annotations

import functools
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, tiny_config
from transformers import AutoModel
from triton_interpreter import one_block_cfg

from bertscope.kernels.backends import attention_stats
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import Gate, LayerGates, StatsSpec
from bertscope.models.attention import HeadProbe
from bertscope.models.gates import HeadGates
from bertscope.models.loading import wrap_model

pytestmark = pytest.mark.usefixtures("single_thread")

SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, entropy=True, argmax=True, column_mass=True, class_mass=True)
KINDS = ("bert", "roberta", "distilbert", "albert", "electra")


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it again while a kernel runs


def triton_backend(one_block):
    from bertscope.kernels.triton_attention import attention_stats_triton

    return functools.partial(attention_stats_triton, blocks=one_block_cfg(one_block))


BACKENDS = {
    "eager": attention_stats_eager,
    "chunked-compiled": functools.partial(attention_stats_chunked, row_pass="compiled"),
    "chunked-torch": functools.partial(attention_stats_chunked, row_pass="torch"),
    "triton-single": triton_backend(True),
    "triton-online": triton_backend(False),
}


def batch(tokenizer, lengths=(9, 5, 7), seed=0):
    """Random token ids between the tokenizer's [CLS] and [SEP], padded: model inputs."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths) + 2
    input_ids = torch.full((len(lengths), L), tokenizer.pad_token_id)
    for b, n in enumerate(lengths):
        words = torch.randint(10, len(tokenizer), (n,), generator=g)
        input_ids[b, : n + 2] = torch.cat([torch.tensor([tokenizer.cls_token_id]), words,
                                           torch.tensor([tokenizer.sep_token_id])])
    attention_mask = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None] + 2).long()  # (B, L)
    return dict(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids), attention_mask=attention_mask)


def tiny(tiny_model, kind="bert", dtype=torch.float32):
    model, tokenizer = tiny_model(kind)
    loaded = wrap_model(model.to(dtype), tokenizer)
    inputs = batch(tokenizer)
    if not loaded.takes_token_types:
        inputs.pop("token_type_ids", None)
    return loaded, inputs


def loss_of(loaded, inputs):
    """A fixed scalar of the real tokens' hidden states (stands in for a task loss)."""
    hidden = loaded.model(**inputs).last_hidden_state  # (B, L, E)
    w = torch.linspace(-1, 1, hidden.shape[-1], dtype=hidden.dtype)
    real = inputs["attention_mask"].to(hidden.dtype)[..., None]  # (B, L, 1)
    return ((hidden * w).tanh() * real).sum()


# --- gradients ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ("bert", "distilbert", "albert"))
def test_dxi_equals_a_finite_difference(tiny_model, kind):
    """float64 throughout, central differences: agreement to ~1e-7 relative."""
    loaded, inputs = tiny(tiny_model, kind, torch.float64)
    g = torch.Generator().manual_seed(1)
    xi0 = 0.5 + torch.rand(TINY_LAYERS, TINY_HEADS, generator=g, dtype=torch.float64)
    loaded.gates.xi = xi0.clone().requires_grad_()
    loss_of(loaded, inputs).backward()
    grad = loaded.gates.xi.grad.clone()
    assert grad.abs().min() > 1e-4  # every head matters a little: the test can fail
    eps = 1e-6
    for layer, head in ((0, 0), (0, 3), (TINY_LAYERS - 1, 1)):
        losses = []
        for sign in (1, -1):
            xi = xi0.clone()
            xi[layer, head] += sign * eps
            loaded.gates.xi = xi
            with torch.no_grad():
                losses.append(float(loss_of(loaded, inputs)))
        fd = (losses[0] - losses[1]) / (2 * eps)
        assert fd == pytest.approx(float(grad[layer, head]), rel=1e-6, abs=1e-9), (layer, head)


def capture_contexts(model):
    """Each BERT layer's gated head outputs, as fed to the output projection, retaining grad."""
    seen = []

    def hook(module, args):
        args[0].retain_grad()
        seen.append(args[0])

    return seen, [block.attention.output.dense.register_forward_pre_hook(hook) for block in model.encoder.layer]


def test_dxi_equals_the_inner_product_of_output_and_its_gradient(tiny_model):
    """dL/dxi_h = sum over tokens of <dL/d(xi_h O_h), O_h>, O_h the un-gated head output."""
    loaded, inputs = tiny(tiny_model, "bert", torch.float64)
    xi = 0.5 + torch.rand(TINY_LAYERS, TINY_HEADS, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    loaded.gates.xi = xi.clone().requires_grad_()
    seen, handles = capture_contexts(loaded.model)
    try:
        loss_of(loaded, inputs).backward()
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == TINY_LAYERS
    for layer, ctx in enumerate(seen):
        B, L, E = ctx.shape
        gated = ctx.detach().view(B, L, TINY_HEADS, E // TINY_HEADS)  # (B, L, H, D): xi_h O_h
        d_gated = ctx.grad.view(B, L, TINY_HEADS, E // TINY_HEADS)
        want = (d_gated * gated).sum((0, 1, 3)) / xi[layer]  # (H,)
        torch.testing.assert_close(loaded.gates.xi.grad[layer], want, rtol=1e-10, atol=1e-12)


def test_per_sequence_gates_give_per_sequence_gradients(tiny_model):
    """xi of shape (B, layers, H): row b is the gradient of sequence b alone (Michel et al.
    take |dL(x)/dxi| per example); the rows sum to the shared gate's gradient."""
    loaded, inputs = tiny(tiny_model, "bert", torch.float64)
    B = inputs["input_ids"].shape[0]
    loaded.gates.xi = torch.ones(TINY_LAYERS, TINY_HEADS, dtype=torch.float64, requires_grad=True)
    loss_of(loaded, inputs).backward()
    shared = loaded.gates.xi.grad
    loaded.gates.xi = torch.ones(B, TINY_LAYERS, TINY_HEADS, dtype=torch.float64, requires_grad=True)
    loss_of(loaded, inputs).backward()
    per = loaded.gates.xi.grad  # (B, layers, H)
    torch.testing.assert_close(per.sum(0), shared, rtol=1e-10, atol=1e-12)
    for b in range(B):
        one = {k: v[b : b + 1, : int(inputs["attention_mask"][b].sum())] for k, v in inputs.items()}
        loaded.gates.xi = torch.ones(TINY_LAYERS, TINY_HEADS, dtype=torch.float64, requires_grad=True)
        loss_of(loaded, one).backward()
        torch.testing.assert_close(per[b], loaded.gates.xi.grad, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("backend", ["eager", "chunked", "triton"])
def test_inside_an_analysis_gradients_and_statistics_are_exact(tiny_model, backend):
    """With grad, an analysed forward gives the plain forward's gradient bit for bit (the
    output comes from SDPA with autograd), and the statistics of an inference-mode pass."""
    loaded, inputs = tiny(tiny_model, "bert")
    key_class = loaded.class_table[inputs["input_ids"]]
    loaded.gates.requires_grad_()
    loss_of(loaded, inputs).backward()
    plain_grad = loaded.gates.xi.grad.clone()

    def analysed(grad: bool):
        probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC, backend=backend)
        sunk = []
        loaded.gates.requires_grad_()
        with torch.set_grad_enabled(grad), probe.active(key_class, lambda layer, s, kv: sunk.append(s)):
            loss = loss_of(loaded, inputs)
        if grad:
            loss.backward()  # the compiled row pass or a Triton output here would fail or give no grad
        return sunk, probe.output_paths, loaded.gates.xi.grad

    sunk, paths, grad = analysed(True)
    assert torch.equal(grad, plain_grad)
    assert paths == {f"sdpa with autograd (statistics: {backend}, without grad)"}
    ref, ref_paths, _ = analysed(False)
    assert ref_paths == {f"{backend} (output fused with the statistics)"}
    for got, want in zip(sunk, ref, strict=True):
        for name in ("entropy", "offset_mass", "class_mass", "argmax", "column_mass"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=1e-5, atol=1e-6, msg=name)
            assert not getattr(got, name).requires_grad


def test_fine_tuning_through_an_analysis_backpropagates_to_the_weights(tiny_model):
    loaded, inputs = tiny(tiny_model, "bert")
    probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC, backend="chunked")
    with probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
        loss_of(loaded, inputs).backward()
    grads = [p.grad for p in loaded.model.encoder.layer[0].attention.self.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


# --- identities -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_xi_one_is_bit_identical_to_sdpa(tiny_model, kind):
    loaded, inputs = tiny(tiny_model, kind)
    twin, _ = tiny_model(kind, attn_implementation="sdpa")
    with torch.no_grad():
        want = twin(**inputs).last_hidden_state
        assert torch.equal(loaded.model(**inputs).last_hidden_state, want)
    loaded.gates.requires_grad_()  # xi = 1 that requires grad multiplies, by exactly 1
    assert torch.equal(loaded.model(**inputs).last_hidden_state, want)


@pytest.mark.parametrize("layer", range(TINY_LAYERS))
def test_zero_gating_a_layer_removes_its_attention_output(tiny_model, layer):
    loaded, inputs = tiny(tiny_model, "bert")
    twin, _ = tiny_model("bert", attn_implementation="sdpa")
    block = twin.encoder.layer[layer].attention.self
    handle = block.register_forward_hook(lambda mod, args, out: (torch.zeros_like(out[0]), *out[1:]))
    with torch.no_grad():
        want = twin(**inputs).last_hidden_state
        handle.remove()
        before = loaded.model(**inputs).last_hidden_state
        loaded.gates.xi[layer] = 0.0  # an in-place edit is seen by the next forward
        got = loaded.model(**inputs).last_hidden_state
    assert not torch.allclose(before, want, atol=1e-3)
    assert torch.equal(got, want)


def test_gates_follow_call_order_in_albert(tiny_model):
    """ALBERT calls one shared attention module for every layer: zeroing layer 1 only must
    differ from zeroing layer 0 only, and from zeroing both."""
    loaded, inputs = tiny(tiny_model, "albert")
    outs = []
    with torch.no_grad():
        for layers in ((0,), (1,), (0, 1)):
            loaded.gates.reset()
            for layer in layers:
                loaded.gates.xi[layer] = 0.0
            outs.append(loaded.model(**inputs).last_hidden_state)
    assert not torch.allclose(outs[0], outs[1], atol=1e-3) and not torch.allclose(outs[1], outs[2], atol=1e-3)


# --- every backend: gates change the output, never the statistics ------------------------


def kernel_inputs(B=3, H=4, L=11, D=8, lengths=(11, 6, 1), seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) * 2 for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.randint(0, 4, (B, L), generator=g)
    return q, k, v, key_valid, key_class


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_sequence", [False, True])
def test_gates_on_every_backend(backend, per_sequence):
    q, k, v, key_valid, key_class = kernel_inputs()
    B, H, L, D = q.shape
    g = torch.Generator().manual_seed(3)
    xi = torch.rand(B, H, generator=g) * 2 - 0.5 if per_sequence else torch.tensor([0.0, 1.7, -0.4, 1.0])
    uniform = torch.tensor([False, True, False, True])
    if per_sequence:  # a different choice per sequence: several model variants in one batch
        uniform = torch.tensor([[False, True, False, True], [True, False, False, True], [False, False, True, False]])
    gates = LayerGates(xi=xi, uniform=uniform)
    fn = BACKENDS[backend]
    out0, s0 = fn(q, k, v, key_valid, key_class, SPEC)
    out, s = fn(q, k, v, key_valid, key_class, SPEC, gates=gates)
    # -- the statistics are those of the un-gated heads, bit for bit
    for name in ("entropy", "offset_mass", "class_mass", "argmax", "column_mass"):
        assert torch.equal(getattr(s, name), getattr(s0, name)), name
    # -- the output: xi times (mean of V over the valid keys for uniform heads, else the head)
    xi_bh = xi.expand(B, H)  # (B, H)
    real = key_valid.float()  # (B, L)
    mean_v = torch.einsum("bl,bhld->bhd", real, v) / real.sum(-1)[:, None, None]  # (B, H, D)
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1) in the output layout
    uniform_bh = uniform.expand(B, H)  # (B, H)
    for h in range(H):
        head = torch.where(uniform_bh[:, h, None, None], mean_v[:, h, None, :], out0[:, :, h])  # (B, L, D)
        want = xi_bh[:, h, None, None] * head  # (B, L, D)
        torch.testing.assert_close(out[:, :, h] * rows[..., 0], want * rows[..., 0], atol=1e-5, rtol=1e-5, msg=str(h))
    # -- and what the eager oracle gives
    ref, _ = attention_stats_eager(q, k, v, key_valid, key_class, SPEC, gates=gates)
    torch.testing.assert_close(out * rows, ref * rows, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "chunked", "triton"])
def test_attention_stats_is_differentiable_on_every_backend(backend):
    """With grad, attention_stats returns an output autograd can go through (SDPA beside the
    backend's statistics): the gradients of q, k, v and xi are those of the eager oracle's
    autograd graph, and the statistics those of a no-grad call."""
    q, k, v, key_valid, key_class = kernel_inputs(lengths=(11, 6, 2))
    xi = torch.tensor([0.5, 1.0, -1.5, 2.0])
    gates = LayerGates(xi=xi, uniform=torch.tensor([False, True, False, False]))
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1)
    w = torch.randn(q.shape[0], q.shape[2], q.shape[1], q.shape[3], generator=torch.Generator().manual_seed(4))

    def grads(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, xi)]
        out, stats = fn(*leaves[:3], key_valid, key_class, SPEC,
                        gates=LayerGates(xi=leaves[3], uniform=gates.uniform))
        ((out * w) * rows).sum().backward()
        return [t.grad for t in leaves], stats

    want, _ = grads(attention_stats_eager)  # eager is differentiable as it stands
    got, stats = grads(functools.partial(attention_stats, backend=backend))
    for name, a, b in zip("q k v xi".split(), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=name)
    assert bool((got[3] != 0).all())
    _, ref = attention_stats(q, k, v, key_valid, key_class, SPEC, backend=backend)
    for name in ("entropy", "class_mass", "argmax", "column_mass"):
        assert torch.equal(getattr(stats, name), getattr(ref, name)), name


def test_gate_codes_map_onto_xi_and_uniform():
    gates = LayerGates.from_codes([Gate.KEEP, Gate.ZERO, Gate.UNIFORM])
    assert gates.xi.tolist() == [1.0, 0.0, 1.0] and gates.uniform.tolist() == [False, False, True]
    hg = HeadGates(2, 3)
    hg.set(1, 2, Gate.UNIFORM)
    hg.set(0, 1, Gate.ZERO)
    assert hg.xi.tolist() == [[1, 0, 1], [1, 1, 1]] and hg.uniform.tolist() == [[False] * 3, [False, False, True]]


# --- bad input ----------------------------------------------------------------------------


def test_bad_gates_give_clear_errors(tiny_model):
    loaded, inputs = tiny(tiny_model, "bert")
    gates = loaded.gates
    with pytest.raises(ValueError, match=r"shape \(2, 4\)"):
        gates.xi = torch.ones(3, 4)
    with pytest.raises(ValueError, match="NaN"):
        gates.xi = torch.full((2, 4), float("nan"))
    with pytest.raises(ValueError, match="float tensor"):
        gates.xi = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="bool tensor"):
        gates.uniform = torch.ones(2, 4)
    gates.xi[1, 2] = float("nan")  # in place: caught by the next forward
    with pytest.raises(ValueError, match="NaN"):
        loaded.model(**inputs)
    gates.reset()
    gates.xi = torch.ones(5, 2, 4)  # per sequence, for a batch of 5
    with pytest.raises(ValueError, match="5 sequences, the batch 3"):
        loaded.model(**inputs)
    gates.reset()
    gates.uniform = torch.zeros(4, 2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="uniform holds 4 sequences, the batch 3"):
        loaded.model(**inputs)
    with pytest.raises(ValueError, match=r"bool tensor of shape \(2, 4\)"):
        gates.uniform = torch.zeros(3, 4, dtype=torch.bool)
    gates.reset()
    loaded.model(**inputs)  # and the model works again after the errors
    q = torch.randn(1, 4, 3, 8)
    valid, classes = torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(TypeError, match="LayerGates"):
        attention_stats(q, q, q, valid, classes, SPEC, gates=torch.zeros(4, dtype=torch.int8))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        attention_stats(q, q, q, valid, classes, SPEC, gates=LayerGates(xi=torch.ones(3)))


# --- training mode ------------------------------------------------------------------------


def test_training_mode_honours_dropout_and_trains(tiny_model, minilm_tokenizer):
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config("bert", minilm_tokenizer), attn_implementation="bertscope")
    assert model.config.attention_probs_dropout_prob > 0
    loaded = wrap_model(model.train(), minilm_tokenizer)
    inputs = batch(minilm_tokenizer)
    first, second = (loaded.model(**inputs).last_hidden_state for _ in range(2))
    assert not torch.allclose(first, second, atol=1e-4)
    # attention dropout alone (hidden dropout off) still changes the output: SDPA's dropout_p
    for m in loaded.model.modules():
        if isinstance(m, torch.nn.Dropout) and m not in [b.attention.self.dropout for b in loaded.model.encoder.layer]:
            m.p = 0.0
    a, b = (loaded.model(**inputs).last_hidden_state for _ in range(2))
    assert not torch.allclose(a, b, atol=1e-4)
    loss_of(loaded, inputs).backward()
    assert all(p.grad is not None for p in loaded.model.encoder.parameters())
    loaded.model.eval()
    with torch.no_grad():
        assert torch.equal(loaded.model(**inputs).last_hidden_state, loaded.model(**inputs).last_hidden_state)


def test_statistics_refuse_training_mode_dropout(tiny_model, minilm_tokenizer):
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_config("bert", minilm_tokenizer), attn_implementation="bertscope").train()
    loaded = wrap_model(model, minilm_tokenizer)
    inputs = batch(minilm_tokenizer)
    probe = HeadProbe(TINY_LAYERS, TINY_HEADS, SPEC)
    with pytest.raises(RuntimeError, match="eval mode.*dropout 0.1"):
        with probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
            loaded.model(**inputs)
    model.eval()
    with torch.no_grad(), probe.active(loaded.class_table[inputs["input_ids"]], lambda *a: None):
        loaded.model(**inputs)


def test_gradient_checkpointing_is_refused(tiny_model):
    """Checkpointed layers re-run in backward, outside the forward that set the gates: that
    would silently drop them, so it is an error."""
    loaded, inputs = tiny(tiny_model, "bert")
    model = loaded.model
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    loaded.model.train()
    loss_of(loaded, inputs).backward()  # gates as trained: nothing to lose
    loaded.gates.requires_grad_()
    with pytest.raises(RuntimeError, match="checkpointing"):
        loaded.model(**inputs)
