"""Head importance (Michel et al. 2019): gate gradients against finite differences and against
per-example hand loops, a silenced head's zero, ARCT's two-row examples, masks, and the
pruning order's bookkeeping."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS
from test_disable import classifier, toy_task

from bertscope.analyses.heads.importance.stats import (
    example_gradients,
    head_importance,
    layer_normalise,
    least_important,
)
from bertscope.analyses.heads.variants import example_batches
from bertscope.models.loading import wrap_model
from bertscope.tasks.inputs import encode_task
from bertscope.tasks.model import point_loss

pytestmark = pytest.mark.usefixtures("single_thread")
L_, H_ = TINY_LAYERS, TINY_HEADS
D_ = 32 // TINY_HEADS


def tiny(tokenizer, num_labels=2, double=False, seed=0):
    model = classifier(tokenizer, num_labels=num_labels, seed=seed)
    return wrap_model(model.double() if double else model, tokenizer)


def arct_task(tokenizer, n=9, seed=2):
    from bertscope.data.readers.tasks import ArctExample

    rng = np.random.default_rng(seed)
    words = "people should not ban cars because cities are loud and air is dirty so we can walk".split()
    say = lambda k: " ".join(rng.choice(words, k))  # noqa: E731
    examples = [ArctExample(id=str(i), claim=say(4), reason=say(6), warrant0=say(int(rng.integers(2, 7))),
                            warrant1=say(int(rng.integers(2, 7))), label=int(rng.integers(0, 2)))
                for i in range(n)]
    return encode_task("arct", examples, tokenizer, max_len=40)


def example_loss(loaded, task, e: int, xi: torch.Tensor) -> float:
    """L(x_e) with the (layers, H) gates xi, example e alone (its rows in one batch)."""
    inputs = task.batch([e], loaded.tokenizer.pad_token_id)
    loaded.gates.xi = xi
    try:
        with torch.no_grad():
            logits = loaded.model(**inputs).logits
        return float(point_loss(task.example_logits(logits), torch.as_tensor(task.labels[[e]])))
    finally:
        loaded.gates.reset()


def hand_gradient(loaded, task, e: int, keep=None) -> torch.Tensor:
    """dL(x_e)/dxi (layers, H), example e alone with a shared (layers, H) leaf: no per-example gates."""
    dtype = next(loaded.model.parameters()).dtype
    xi = (torch.ones(L_, H_, dtype=dtype) if keep is None else torch.as_tensor(keep, dtype=dtype)).requires_grad_(True)
    loaded.gates.xi = xi
    try:
        logits = loaded.model(**task.batch([e], loaded.tokenizer.pad_token_id)).logits
        point_loss(task.example_logits(logits), torch.as_tensor(task.labels[[e]])).backward()
    finally:
        loaded.gates.reset()
    return xi.grad.double()


@pytest.mark.parametrize("make_task", [toy_task, arct_task])
def test_gate_gradient_equals_a_central_finite_difference(minilm_tokenizer, make_task):
    """float64: dL(x_e)/dxi_h from the batched per-example backward against (L(xi + eps) - L(xi - eps)) / 2 eps."""
    loaded = tiny(minilm_tokenizer, num_labels=1 if make_task is arct_task else 2, double=True)
    task = make_task(minilm_tokenizer)
    examples = list(range(5))
    keep = torch.ones(L_, H_, dtype=torch.float64)
    grads, _ = example_gradients(loaded, task, examples, keep)  # (5, L, H)
    loaded.gates.reset()
    eps = 1e-5
    for e in examples:
        for layer, head in ((0, 1), (1, 3), (1, 0)):
            up, down = keep.clone(), keep.clone()
            up[layer, head] += eps
            down[layer, head] -= eps
            fd = (example_loss(loaded, task, e, up) - example_loss(loaded, task, e, down)) / (2 * eps)
            assert abs(fd) > 1e-4  # the head matters to this loss: the check can fail
            assert grads[e, layer, head].item() == pytest.approx(fd, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("make_task", [toy_task, arct_task])
def test_both_conventions_equal_a_per_example_hand_loop(minilm_tokenizer, make_task):
    loaded = tiny(minilm_tokenizer, num_labels=1 if make_task is arct_task else 2, double=True)
    task = make_task(minilm_tokenizer)
    g = torch.stack([hand_gradient(loaded, task, e) for e in range(task.n_examples)])  # (N, L, H)
    michel = g.abs().mean(0).numpy()
    batch = sum(g[b].sum(0).abs() for b in example_batches(task, 4)).numpy() / task.n_examples
    assert not np.allclose(michel, batch, rtol=1e-3)  # signs cancel within batches: the conventions differ
    for convention, want in (("michel", michel), ("batch", batch)):
        got = head_importance(loaded, task, batch_size=4, convention=convention, normalise=False, progress=False)
        np.testing.assert_allclose(got.raw, want, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(got.scores, got.raw)
        assert got.n_examples == task.n_examples and got.convention == convention
    # at batch size 1 the batch convention is Michel's
    one = head_importance(loaded, task, batch_size=1, convention="batch", normalise=False, progress=False)
    np.testing.assert_allclose(one.raw, michel, rtol=1e-9)


def test_arct_rows_share_their_example_gate(minilm_tokenizer):
    """An ARCT example's loss is the softmax over its two warrant rows: its gradient is that of the
    pair, not of either row, and the mean loss is the pairs' cross-entropy."""
    loaded = tiny(minilm_tokenizer, num_labels=1, double=True)
    task = arct_task(minilm_tokenizer)
    assert task.per_example == 2
    grads, losses = example_gradients(loaded, task, [0, 3, 4], torch.ones(L_, H_, dtype=torch.float64))
    loaded.gates.reset()
    for row, e in enumerate([0, 3, 4]):
        torch.testing.assert_close(grads[row].double(), hand_gradient(loaded, task, e), rtol=1e-9, atol=1e-12)
        ones = torch.ones(L_, H_, dtype=torch.float64)
        assert losses[row].item() == pytest.approx(example_loss(loaded, task, e, ones))


def test_a_head_with_a_zero_output_projection_has_importance_zero(minilm_tokenizer):
    loaded = tiny(minilm_tokenizer)
    layer, head = 1, 2
    with torch.no_grad():
        loaded.model.bert.encoder.layer[layer].attention.output.dense.weight[:, head * D_:(head + 1) * D_] = 0
    imp = head_importance(loaded, toy_task(minilm_tokenizer), batch_size=6, progress=False)
    assert imp.raw[layer, head] == 0.0 and imp.scores[layer, head] == 0.0
    others = np.delete(imp.raw.ravel(), layer * H_ + head)
    assert (others > 1e-4).all()
    assert imp.ranks()[layer, head] == L_ * H_  # the least important


def test_mask_gates_pruned_heads_and_reports_them_as_nan(minilm_tokenizer):
    loaded = tiny(minilm_tokenizer, double=True)
    task = toy_task(minilm_tokenizer, n=10)
    mask = np.ones((L_, H_), int)
    mask[0, 1] = mask[1, 3] = 0
    imp = head_importance(loaded, task, batch_size=4, mask=mask, progress=False)
    assert np.isnan(imp.raw[0, 1]) and np.isnan(imp.scores[1, 3]) and np.isnan(imp.raw).sum() == 2
    g = torch.stack([hand_gradient(loaded, task, e, keep=mask) for e in range(task.n_examples)]).abs().mean(0).numpy()
    live = mask.astype(bool)
    np.testing.assert_allclose(imp.raw[live], g[live], rtol=1e-9)
    # the layer norm runs over the live heads; the masked heads rank last (0)
    np.testing.assert_allclose(np.sqrt(np.nansum(imp.scores ** 2, axis=1)), [1.0, 1.0])
    assert imp.ranks()[0, 1] == 0 and sorted(imp.ranks()[live]) == list(range(1, live.sum() + 1))
    # the gates hold their mask during the forward only
    assert bool((loaded.gates.xi == 1).all()) and not loaded.gates.xi.requires_grad


def test_gates_and_mode_are_restored_after_an_error(minilm_tokenizer):
    loaded = tiny(minilm_tokenizer)
    task = toy_task(minilm_tokenizer, n=6)
    task.labels[3] = 7  # no such class: cross_entropy fails mid-way
    loaded.model.train()
    with pytest.raises((IndexError, RuntimeError)):
        head_importance(loaded, task, batch_size=2, progress=False)
    assert loaded.model.training  # the mode it came in with
    assert bool((loaded.gates.xi == 1).all()) and not loaded.gates.xi.requires_grad
    with pytest.raises(ValueError, match="mask must have shape"):
        head_importance(loaded, task, mask=np.ones((3, 3)), progress=False)
    with pytest.raises(ValueError, match="unknown convention"):
        head_importance(loaded, task, convention="mean", progress=False)


def test_importance_runs_without_dropout(minilm_tokenizer):
    """The model comes in training mode (dropout on): the scores are those of eval mode, twice the same."""
    loaded = tiny(minilm_tokenizer)
    task = toy_task(minilm_tokenizer, n=8)
    want = head_importance(loaded, task, progress=False).raw
    loaded.model.train()
    np.testing.assert_allclose(head_importance(loaded, task, progress=False).raw, want, rtol=1e-5)


def test_layer_normalise():
    raw = np.array([[3.0, 4.0, np.nan], [0.0, 0.0, 0.0]])
    got = layer_normalise(raw)
    np.testing.assert_allclose(got[0, :2], [0.6, 0.8])
    assert np.isnan(got[0, 2]) and (got[1] == 0).all()


def test_least_important_never_picks_a_dead_head():
    scores = np.array([[0.1, np.nan, 0.5], [0.3, 0.1, np.nan]])
    live = ~np.isnan(scores)
    assert least_important(scores, live, 2) == [(0, 0), (1, 1)]  # a tie goes to the lower index
    assert least_important(scores, live, 4) == [(0, 0), (1, 1), (1, 0), (0, 2)]
    with pytest.raises(ValueError, match="cannot prune 5 heads: 4 are left"):
        least_important(scores, live, 5)
    dead = live.copy()
    dead[0, 0] = False  # a dead head with a score is still never picked
    assert (0, 0) not in least_important(np.nan_to_num(scores), dead, 3)
