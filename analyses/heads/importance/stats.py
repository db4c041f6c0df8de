"""Head importance (Michel et al. 2019, section 4): how much the task loss leans on each head.

A layer's output is sum_h xi_h W_o^h Att_h(x), one gate xi_h per head (`bertscope.models.gates`).
Masking head h sets xi_h = 0; the first-order Taylor estimate of the loss change that causes
is |dL/dxi_h| at xi = 1 (Molchanov et al. 2017), so

    I_h = E_x | dL(x) / dxi_h |          (convention "michel")

the absolute value taken per example, then the mean over the examples. It is a sensitivity,
not a measured ablation effect: cheap (one forward and one backward per batch give every
head's score, no per-head re-runs) and exact to first order only.

How one backward gives per-example gradients. The gates are per sequence: xi has shape
(examples-in-batch, layers, H), a leaf that requires grad, repeated to the batch's rows (an
ARCT example's two warrant rows share their example's xi, so both rows' gradients land on the
example). The backward runs on the SUM of the per-example losses: example e's xi only reaches
its own rows, so d sum / d xi[e] = dL(x_e)/dxi. `torch.autograd.grad` asks for xi alone, so the
weights' gradients are never computed.

Convention "batch": the gradient summed over a batch before the absolute value,

    I_h = (1 / N) sum_batches | sum_{x in batch} dL(x) / dxi_h |,

which is what transformers' bertology example (examples/research_projects/bertology/
run_bertology.py, `compute_heads_importance`) computes, up to a constant: it back-propagates
the batch's MEAN loss into a shared (layers, H) head_mask and adds head_mask.grad.abs() per
batch, then divides by the number of non-padding TOKENS of the data (a constant: it cancels
in the per-layer normalisation, not in the raw scores). Two differences we do not copy: it
never zeroes head_mask.grad between batches, so batch t adds |g_1 + ... + g_t| (a running
sum, at its default batch size 1 too); and by default it also min-max normalises all scores
to [0, 1] after the per-layer norm (rank-preserving). Signs cancel inside a batch, so this
convention depends on the batch size and on which examples share a batch (ours: batches of
similar length, `variants.example_batches`); at batch size 1 it equals Michel's.

Normalisation (Michel's default): each layer's scores divided by their L2 norm over the
layer's heads, so that heads of different layers compare; a layer whose scores are all 0
stays 0.

A `mask` of heads already pruned (0) gates them to xi = 0 for the forward; their importance is
reported as NaN (not 0: a pruned head must never look like the least important live head and
be picked again), and the layer norm runs over the live heads only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.analyses.heads.options import CONVENTIONS  # defined there for the parsers, without torch
from bertscope.analyses.heads.variants import example_batches
from bertscope.tasks.inputs import EncodedTask
from bertscope.tasks.model import point_loss


@dataclass
class Importance:
    """Head importance of one model on one task split.

    raw:    (layers, H) I_h before normalisation (NaN for masked heads)
    scores: (layers, H) after the per-layer L2 normalisation when `normalised`, else raw
    loss:   mean per-example task loss of the (masked) model on the data
    """

    raw: np.ndarray
    scores: np.ndarray
    loss: float
    n_examples: int
    convention: str
    normalised: bool
    mask: np.ndarray | None = None

    def ranks(self) -> np.ndarray:
        """(layers, H) rank of each head by score, 1 = most important; 0 for masked heads."""
        flat = self.scores.ravel()
        live = np.flatnonzero(~np.isnan(flat))
        order = live[np.lexsort((live, -flat[live]))]  # descending score, ties by head index
        ranks = np.zeros(flat.size, dtype=np.int64)
        ranks[order] = np.arange(1, len(order) + 1)
        return ranks.reshape(self.scores.shape)


def layer_normalise(raw: np.ndarray) -> np.ndarray:
    """Each layer's scores over their L2 norm (NaN heads left out); an all-zero layer stays 0."""
    norm = np.sqrt(np.nansum(raw ** 2, axis=1, keepdims=True))  # (layers, 1)
    return np.divide(raw, norm, out=np.where(np.isnan(raw), np.nan, 0.0), where=norm > 0)


def check_mask(mask, n_layers: int, n_heads: int) -> np.ndarray:
    """A (layers, H) 0/1 array, or a ValueError saying what is wrong."""
    mask = np.asarray(mask)
    if mask.shape != (n_layers, n_heads):
        raise ValueError(f"mask must have shape ({n_layers}, {n_heads}) (layers, heads), not {mask.shape}")
    if not np.isin(mask, (0, 1)).all():
        raise ValueError("mask must hold only 0 (pruned) and 1 (kept)")
    return mask.astype(bool)


def example_gradients(loaded, task: EncodedTask, examples, keep: torch.Tensor, inputs: dict | None = None):
    """Per-example gate gradients of `examples` (indices of task): (grads (b, layers, H), losses (b,)),
    grads[e] = dL(x_e)/dxi at xi = keep (the module docstring). The caller resets the gates."""
    model, gates = loaded.model, loaded.gates
    device = next(model.parameters()).device
    if inputs is None:
        inputs = task.batch(examples, loaded.tokenizer.pad_token_id or 0, device)
        if not loaded.takes_token_types:
            inputs.pop("token_type_ids", None)
    b = len(examples)
    xi = keep.expand(b, *keep.shape).clone().requires_grad_(True)  # (b, layers, H): one leaf per example
    gates.xi = xi.repeat_interleave(task.per_example, dim=0)  # (rows, layers, H): an example's rows share its xi
    logits = model(**inputs).logits  # (rows, C)
    labels = torch.as_tensor(task.labels[list(examples)], device=logits.device)  # (b,)
    losses = point_loss(task.example_logits(logits), labels, reduction="none")  # (b,)
    (grads,) = torch.autograd.grad(losses.sum(), xi)  # (b, layers, H)
    return grads, losses.detach()


def head_importance(loaded, task: EncodedTask, batch_size: int = 32, convention: str = "michel",
                    normalise: bool = True, mask=None, progress: bool = True) -> Importance:
    """I_h of every head of `loaded` (a model with its task head) on `task` (see the module docstring).

    convention: "michel" (|.| per example, then the mean) or "batch" (summed over a batch first).
    mask: (layers, H) 0/1, 0 = pruned (gated to 0, importance NaN); None keeps every head.
    The model runs in eval mode (no dropout); its gates and mode are restored afterwards, on an
    error or Ctrl-C too.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}: choose one of {', '.join(CONVENTIONS)}")
    if task.n_examples == 0:
        raise ValueError("head importance needs at least one example")
    model, gates = loaded.model, loaded.gates
    L, H = loaded.n_layers, loaded.n_heads
    live = np.ones((L, H), bool) if mask is None else check_mask(mask, L, H)
    dtype = next(model.parameters()).dtype
    keep = torch.as_tensor(live, dtype=dtype)  # (L, H): xi, 0 on pruned heads
    total = torch.zeros(L, H, dtype=torch.float64)
    loss_sum = 0.0
    batches = example_batches(task, batch_size)
    was_training = model.training
    model.eval()
    try:
        for examples in tqdm(batches, unit="batch", disable=not progress, desc="importance"):
            grads, losses = example_gradients(loaded, task, examples, keep)  # (b, L, H), (b,)
            grads = grads.double().cpu()
            total += grads.abs().sum(0) if convention == "michel" else grads.sum(0).abs()
            loss_sum += float(losses.double().sum())
    finally:
        gates.reset()
        model.train(was_training)
    raw = (total / task.n_examples).numpy()
    raw[~live] = np.nan
    scores = layer_normalise(raw) if normalise else raw.copy()
    return Importance(raw=raw, scores=scores, loss=loss_sum / task.n_examples, n_examples=task.n_examples,
                      convention=convention, normalised=normalise, mask=None if mask is None else live.astype(np.int8))


def least_important(scores: np.ndarray, live: np.ndarray, n: int) -> list[tuple[int, int]]:
    """The n live heads (0-based (layer, head)) with the lowest scores, ties by head index;
    masked (dead) heads are never returned."""
    flat, alive = scores.ravel(), np.flatnonzero(np.asarray(live, bool).ravel())
    if n > len(alive):
        raise ValueError(f"cannot prune {n} heads: {len(alive)} are left")
    if np.isnan(flat[alive]).any():
        raise ValueError("a live head has no importance score (NaN)")
    pick = alive[np.lexsort((alive, flat[alive]))][:n]
    H = scores.shape[1]
    return [(int(i // H), int(i % H)) for i in pick]
