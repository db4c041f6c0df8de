"""kernels.attention_grad: exact gradients of softmax attention, and |dL/dP| per key class
equal to autograd's on the materialised map (kernels.eager.attention_grad_eager)."""
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForSequenceClassification

from bertscope.kernels.attention_grad import GradSums, attention_grad
from bertscope.kernels.eager import attention_grad_eager

C = 4
pytestmark = pytest.mark.usefixtures("single_thread")


def make(B, H, L, D, lengths, classes, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.tensor(classes, dtype=torch.long).view(B, L)
    weight = torch.randn(B, H, L, D, generator=g, dtype=dtype)  # a loss with a gradient everywhere
    return q, k, v, key_valid, key_class, weight


def run(fn, q, k, v, key_valid, key_class, weight, **kw):
    got = []
    out = fn(q, k, v, key_valid, key_class, C, got.append, **kw)
    loss = (out * weight * key_valid[:, None, :, None]).sum()  # padding rows do not reach the loss
    dq, dk, dv = torch.autograd.grad(loss, (q, k, v))
    assert len(got) == 1
    return out, (dq, dk, dv), got[0]


def plain(q, k, v, key_valid, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=key_valid[:, None, None, :],
                                                            scale=scale)


@settings(max_examples=80, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), L=st.integers(1, 23), D=st.sampled_from([1, 3, 8]),
       tile=st.sampled_from([1, 7, 1 << 22]), data=st.data())
def test_matches_autograd_and_the_eager_oracle(B, H, L, D, tile, data):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))  # 1: single-key rows
    classes = data.draw(st.lists(st.integers(0, C - 1), min_size=B * L, max_size=B * L))  # any class absent
    q, k, v, key_valid, key_class, weight = make(B, H, L, D, lengths, classes, data.draw(st.integers(0, 10**6)))
    out, grads, sums = run(attention_grad, q, k, v, key_valid, key_class, weight, tile_elements=tile)
    ref_out, ref_grads, ref = run(attention_grad_eager, q, k, v, key_valid, key_class, weight)
    # the output and dq, dk, dv of plain softmax attention (SDPA) through autograd
    sdpa = plain(q, k, v, key_valid)
    rows = key_valid[:, None, :, None]
    torch.testing.assert_close(out * rows, sdpa * rows)
    want = torch.autograd.grad((sdpa * weight * rows).sum(), (q, k, v))
    for a, b in zip(grads, want):
        torch.testing.assert_close(a, b)
    for a, b in zip(ref_grads, want):
        torch.testing.assert_close(a, b)
    # the class sums against autograd's dL/dP
    torch.testing.assert_close(sums.grad, ref.grad)
    torch.testing.assert_close(sums.mass, ref.mass)
    torch.testing.assert_close(sums.pairs, ref.pairs)
    assert sums.rows == ref.rows == sum(lengths)
    # classes with no valid key have no pairs and nothing summed
    for c in range(C):
        if not bool(((key_class == c) & key_valid).any()):
            assert sums.pairs[c] == 0 and float(sums.grad[:, c].abs().sum()) == 0


def test_sums_from_first_principles():
    """One head, L = 3, all keys valid: |dL/dP_ij| = |<dO_i, V_j>| summed by the key's class."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    key_valid = torch.tensor([[True, True, False]])
    key_class = torch.tensor([[1, 3, 1]])  # the padding key's class must not count
    w = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    got = []
    out = attention_grad(q, k, v, key_valid, key_class, C, got.append)
    (out[:, :, :2] * w[:, :, :2]).sum().backward()
    s = got[0]
    # dO_i = w_i for rows 0, 1; dL/dP_ij = <w_i, v_j>
    dp = w[0, 0, :2] @ v[0, 0].detach().T  # (2, 3)
    assert s.grad[0, 1].item() == pytest.approx(dp[:, 0].abs().sum().item())
    assert s.grad[0, 3].item() == pytest.approx(dp[:, 1].abs().sum().item())
    assert s.grad[0, 0].item() == 0 and s.grad[0, 2].item() == 0
    assert s.pairs.tolist() == [0, 2, 0, 2]
    assert s.rows == 2
    assert s.mass[0].sum().item() == pytest.approx(2.0)  # every valid row's mass is 1


def test_float32_sums_match_the_oracle():
    q, k, v, key_valid, key_class, weight = make(2, 3, 40, 16, [40, 17], [c % C for c in range(80)], 3,
                                                  dtype=torch.float32)
    _, grads, sums = run(attention_grad, q, k, v, key_valid, key_class, weight, tile_elements=300)
    _, ref_grads, ref = run(attention_grad_eager, q, k, v, key_valid, key_class, weight)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(sums.grad, ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sums.mass, ref.mass, rtol=1e-5, atol=1e-6)


def test_gradsums_shapes():
    q, k, v, key_valid, key_class, weight = make(1, 2, 5, 4, [5], [0, 1, 2, 3, 1], 1)
    _, _, s = run(attention_grad, q, k, v, key_valid, key_class, weight)
    assert isinstance(s, GradSums)
    assert s.grad.shape == s.mass.shape == (2, C) and s.pairs.shape == (C,)
    assert s.grad.dtype == s.mass.dtype == torch.float64


# --- plugged into a model (attention.GradProbe) ----------------------------------------------


def tiny_task_model(tokenizer, kind="bert", seed=0):
    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(tiny_config(kind, tokenizer),
                                                          attn_implementation="bertscope").eval()


def padded_inputs(tokenizer, lengths=(9, 1, 6), seed=0):
    """[CLS] words with '.' and ',' among them [SEP], padded; length 1: [CLS] [SEP] only."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths) + 2
    vocab = tokenizer.get_vocab()
    ids = torch.full((len(lengths), L), tokenizer.pad_token_id)
    for b, n in enumerate(lengths):
        words = torch.randint(1000, 5000, (n,), generator=g)
        words[::3] = vocab["."]
        words[1::4] = vocab[","]
        ids[b, : n + 2] = torch.cat([torch.tensor([tokenizer.cls_token_id]), words,
                                     torch.tensor([tokenizer.sep_token_id])])
    mask = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None] + 2).long()
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": mask}


def probed_backward(loaded, inputs, backend, labels):
    from bertscope.models.attention import GradProbe

    per_layer = {}
    probe = GradProbe(loaded.n_layers, 4, backend)
    key_class = loaded.class_table[inputs["input_ids"]]
    with probe.active(key_class, lambda layer, sums: per_layer.setdefault(layer, sums)):
        out = loaded.model(**inputs, labels=labels)
    out.loss.backward()
    return per_layer


@pytest.mark.parametrize("kind", ("bert", "distilbert"))
def test_model_gradients_unchanged_and_sums_equal_the_oracle(minilm_tokenizer, kind):
    from bertscope.models.loading import wrap_model

    inputs = padded_inputs(minilm_tokenizer)
    if kind == "distilbert":
        inputs.pop("token_type_ids")
    labels = torch.tensor([0, 1, 1])
    grads, sums = {}, {}
    for mode in ("plain", "fused", "eager"):
        model = tiny_task_model(minilm_tokenizer, kind).double()
        loaded = wrap_model(model, minilm_tokenizer)
        if mode == "plain":
            model(**inputs, labels=labels).loss.backward()
        else:
            sums[mode] = probed_backward(loaded, inputs, mode, labels)
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert len(grads["plain"]) > 10
    for mode in ("fused", "eager"):
        assert grads[mode].keys() == grads["plain"].keys()
        for n, g in grads["plain"].items():
            torch.testing.assert_close(grads[mode][n], g, rtol=1e-9, atol=1e-12, msg=f"{mode} {n}")
    assert sorted(sums["fused"]) == list(range(TINY_LAYERS))
    for layer in range(TINY_LAYERS):
        a, b = sums["fused"][layer], sums["eager"][layer]
        assert a.grad.shape == (TINY_HEADS, 4)
        assert float(a.grad.min()) > 0  # every class is present and every head has a gradient
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-15)
        torch.testing.assert_close(a.mass, b.mass, rtol=1e-9, atol=1e-15)
        assert torch.equal(a.pairs, b.pairs) and a.rows == b.rows == 9 + 2 + 1 + 2 + 6 + 2


def test_gates_are_differentiated_through_the_probe(minilm_tokenizer):
    """xi scales the function's output outside it: d loss / d xi as on the plain path."""
    from bertscope.models.loading import wrap_model

    inputs = padded_inputs(minilm_tokenizer)
    labels = torch.tensor([1, 0, 1])
    got = []
    for probed in (False, True):
        loaded = wrap_model(tiny_task_model(minilm_tokenizer).double(), minilm_tokenizer)
        g = torch.Generator().manual_seed(2)
        loaded.gates.xi = (0.5 + torch.rand(TINY_LAYERS, TINY_HEADS, generator=g, dtype=torch.float64)).requires_grad_()
        if probed:
            probed_backward(loaded, inputs, "fused", labels)
        else:
            loaded.model(**inputs, labels=labels).loss.backward()
        got.append(loaded.gates.xi.grad.clone())
    assert float(got[0].abs().min()) > 0
    torch.testing.assert_close(got[1], got[0], rtol=1e-9, atol=1e-12)


def test_probe_refuses_what_it_cannot_measure(minilm_tokenizer):
    from bertscope.models.attention import GradProbe
    from bertscope.models.loading import wrap_model

    loaded = wrap_model(tiny_task_model(minilm_tokenizer), minilm_tokenizer)
    inputs = padded_inputs(minilm_tokenizer)
    probe = GradProbe(loaded.n_layers, 4)
    key_class = loaded.class_table[inputs["input_ids"]]
    with pytest.raises(RuntimeError, match="need autograd"), torch.no_grad(), probe.active(key_class, print):
        loaded.model(**inputs)
    loaded.model.train()
    with pytest.raises(RuntimeError, match="eval mode"), probe.active(key_class, print):
        loaded.model(**inputs)
    with pytest.raises(ValueError, match="unknown gradient backend"):
        GradProbe(2, 4, "triton")


def test_pruned_model_sums_sit_in_the_original_slots(minilm_tokenizer):
    """A really pruned model's per-head sums are the zero-gated model's for the kept heads and
    NaN for the removed ones (a fully removed layer too); pair and row counts unchanged."""
    from bertscope.models.head_removal import prune_heads
    from bertscope.models.loading import wrap_model

    inputs = padded_inputs(minilm_tokenizer)
    labels = torch.tensor([0, 1, 1])
    removed = {0: [1, 3], 1: list(range(TINY_HEADS))}
    gated = wrap_model(tiny_task_model(minilm_tokenizer).double(), minilm_tokenizer)
    gated.gates.xi = torch.ones(TINY_LAYERS, TINY_HEADS, dtype=torch.float64)
    for layer, heads in removed.items():
        gated.gates.xi[layer, heads] = 0.0
    want = probed_backward(gated, inputs, "fused", labels)
    model = tiny_task_model(minilm_tokenizer).double()
    prune_heads(model, removed)
    got = probed_backward(wrap_model(model, minilm_tokenizer), inputs, "fused", labels)
    for layer in range(TINY_LAYERS):
        gone = removed.get(layer, [])
        kept = [h for h in range(TINY_HEADS) if h not in gone]
        assert got[layer].grad.shape == (TINY_HEADS, 4)
        assert torch.isnan(got[layer].grad[gone]).all() and torch.isnan(got[layer].mass[gone]).all()
        torch.testing.assert_close(got[layer].grad[kept], want[layer].grad[kept], rtol=1e-9, atol=1e-15)
        torch.testing.assert_close(got[layer].mass[kept], want[layer].mass[kept], rtol=1e-9, atol=1e-15)
        assert torch.equal(got[layer].pairs, want[layer].pairs) and got[layer].rows == want[layer].rows
    assert float(got[0].grad[[0, 2]].min()) > 0  # the kept heads below a fully removed layer still have gradients
