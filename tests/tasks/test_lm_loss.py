"""The chunked language-modelling loss (`bertscope.tasks.lm_loss`) against transformers' own: the model
with its LM head run whole, in eager attention, with `labels` (its loss is the mean next-token
cross-entropy over the targets that are not -100). Right padding, one-token rows, chunks that do
not divide the positions, a soft-capped head, and the gradient that reaches the head gates."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from bertscope.errors import UserError
from bertscope.models.loading import load_model
from bertscope.tasks.lm_loss import chunk_size, head_losses, token_losses

pytestmark = pytest.mark.usefixtures("single_thread")


def right_padded(lengths, L, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (len(lengths), L), generator=g)
    mask = (torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids.masked_fill(mask == 0, 3), mask


def reference_losses(path, ids, mask):
    """(B,) mean next-token loss of each row: transformers' model alone, eager attention, row by row."""
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    out = []
    for row, m in zip(ids, mask):
        n = int(m.sum())
        if n < 2:
            out.append(0.0)
            continue
        with torch.no_grad():
            out.append(float(model(row[None, :n], labels=row[None, :n]).loss))
    return torch.tensor(out)


@pytest.mark.parametrize("fixture", ["tiny_llama_lm_dir", "tiny_gemma3_lm_dir"])
@pytest.mark.parametrize("chunk", [None, 3])
def test_token_losses_match_transformers(fixture, chunk, request):
    path = request.getfixturevalue(fixture)
    loaded = load_model(path, task="causal-lm")
    ids, mask = right_padded([9, 1, 6, 9], 9, loaded.model.config.vocab_size)
    with torch.no_grad():
        out = token_losses(loaded, ids, mask, chunk=chunk)
    assert out.loss.shape == out.valid.shape == (4, 8)
    assert out.valid.sum(1).tolist() == [8, 0, 5, 8]
    assert out.n_targets == 21
    assert (out.loss[~out.valid] == 0).all()
    torch.testing.assert_close(out.per_sequence(), reference_losses(path, ids, mask), atol=2e-5, rtol=1e-5)


def test_gate_gradients_flow_through_the_chunks(tiny_llama_lm_dir):
    """d(sum of losses)/d xi with checkpointed pieces equals the gradient computed with whole logits."""
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    ids, mask = right_padded([7, 5], 7, loaded.model.config.vocab_size, seed=1)
    grads = []
    for chunk in (2, 1000):
        xi = torch.ones(loaded.n_layers, loaded.n_heads, requires_grad=True)
        loaded.gates.xi = xi
        out = token_losses(loaded, ids, mask, chunk=chunk)
        (g,) = torch.autograd.grad(out.loss.sum(), xi)
        grads.append(g)
        loaded.gates.reset()
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-5)
    # and a head gated off changes the loss the way the gradient's sign says, to first order
    with torch.no_grad():
        base = token_losses(loaded, ids, mask).loss.sum()
        xi = torch.ones(loaded.n_layers, loaded.n_heads)
        xi[0, 0] = 0.999
        loaded.gates.xi = xi
        nudged = token_losses(loaded, ids, mask).loss.sum()
        loaded.gates.reset()
    torch.testing.assert_close(nudged - base, -0.001 * grads[1][0, 0], atol=2e-5, rtol=0.05)


def test_soft_capped_head(tiny_llama_lm_dir):
    loaded = load_model(tiny_llama_lm_dir, task="causal-lm")
    loaded.model.config.final_logit_softcapping = 0.5
    hidden = torch.randn(5, loaded.model.config.hidden_size)
    targets = torch.tensor([4, 5, 6, 7, 8])
    with torch.no_grad():
        logits = loaded.model.lm_head(hidden)
        want = F.cross_entropy(torch.tanh(logits / 0.5) * 0.5, targets, reduction="none")
        torch.testing.assert_close(head_losses(loaded, hidden, targets, chunk=2), want)


def test_chunk_size_and_refusals(tiny_llama_lm_dir, minilm_path):
    assert chunk_size(262144) == 128 and chunk_size(49152) == 682 and chunk_size(10**9) == 1
    with pytest.raises(ValueError, match="causal-lm"):
        token_losses(load_model(tiny_llama_lm_dir), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(UserError, match="needs a decoder"):
        load_model(minilm_path, task="causal-lm")
