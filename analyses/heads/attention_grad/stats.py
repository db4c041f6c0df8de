"""The maths of `bertscope heads attention-grad` (Clark et al. 2019, section 3, Figure 5).

Definition. For a loss L(x) of one input x and each layer, head, valid query row i and
valid key j, g_ij = |dL(x)/dP_ij|, P the softmax attention map (the output of the softmax,
treated as a free variable: O_i = sum_j P_ij V_j, so g_ij = |<dO_i, V_j>|). Per layer and key
class c ([CLS], [SEP], punctuation = the tokens "." and ",", other; `token_classes`):

    mean |grad|  = sum over inputs, heads and pairs (i, j in c) of g_ij / number of such pairs
    attention    = sum over the same of P_ij / (heads x query rows): the mean mass a row puts on c

L(x) is one input's own loss (not a batch mean), so nothing depends on the batch size:
    task  the fine-tuned model's cross-entropy on the input's label (ARCT: over the softmax of
          its two warrants' scores, as it was fine-tuned)
    mlm   Clark's: BERT's pre-training masking (15% of the word tokens, at least one; of those
          80% [MASK], 10% a random token, 10% unchanged; seeded per segment), L(x) = the mean
          cross-entropy over the segment's masked positions.
The maps are never kept: `kernels.attention_grad` sums g_ij per class inside backward
(through `attention.GradProbe`).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.files import write_npz
from bertscope.models.attention import GradProbe
from bertscope.text.token_classes import KEY_CLASSES

MASK_RATE, MASK_TOKEN, RANDOM_TOKEN = 0.15, 0.8, 0.1  # BERT's pre-training masking


# --- the losses ------------------------------------------------------------------------


def mask_tokens(input_ids, word_ids, mask_id: int, vocab_size: int, rng) -> tuple[list[int], list[int]]:
    """BERT's pre-training masking of one segment: round(15%) of its tokens (at least 1, at most
    the word tokens) drawn among the word tokens; of those 80% -> mask_id, 10% -> a random token,
    10% unchanged. Returns (input ids, labels: the original id at masked positions, else -100)."""
    words = [i for i, w in enumerate(word_ids) if w >= 0]
    ids, labels = list(input_ids), [-100] * len(input_ids)
    if not words:
        return ids, labels
    n = min(len(words), max(1, round(MASK_RATE * len(input_ids))))
    for pos in sorted(rng.choice(words, size=n, replace=False)):
        labels[pos] = ids[pos]
        u = rng.random()
        if u < MASK_TOKEN:
            ids[pos] = mask_id
        elif u < MASK_TOKEN + RANDOM_TOKEN:
            ids[pos] = int(rng.integers(vocab_size))
    return ids, labels


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over segments of each segment's mean cross-entropy over its masked positions."""
    ce = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none",
                                           ignore_index=-100)  # (B, L)
    masked = (labels != -100).float()  # (B, L)
    return ((ce * masked).sum(1) / masked.sum(1).clamp_min(1)).sum()


# --- the pass --------------------------------------------------------------------------


def measure(loaded, batches, stats: GradStats, backend: str = "fused", progress: bool = True,
            total: int | None = None) -> GradStats:
    """One forward and backward per batch with the gradient probe on; sums into `stats`.

    Backward runs from the loss to the token embeddings only: the weights are frozen for the
    pass (restored after) and the embeddings' output is made a leaf that requires grad, so
    every layer's q, k and v are differentiated and no weight gradient is computed."""
    model = loaded.model
    probe = GradProbe(loaded.n_layers, len(KEY_CLASSES), backend)
    table = loaded.class_table.to(next(model.parameters()).device)
    frozen = [p for p in model.parameters() if p.requires_grad]
    leaves = []

    def leaf(module, args, output):
        output = output.detach().requires_grad_()
        leaves.append(output)
        return output

    hook = model.get_input_embeddings().register_forward_hook(leaf)
    try:
        for p in frozen:
            p.requires_grad_(False)
        with tqdm(total=total, unit="input", disable=not progress, desc="attention gradients") as bar:
            for inputs, n, loss_fn in batches:
                seen = set()

                def sink(layer, sums):
                    seen.add(layer)  # noqa: B023  (the sink only lives through this batch's backward)
                    stats.add_sums(layer, sums)

                leaves.clear()
                with probe.active(table[inputs["input_ids"]], sink):
                    loss = loss_fn(model(**inputs))
                torch.autograd.grad(loss, leaves)
                if len(seen) != loaded.n_layers:
                    raise RuntimeError(f"backward reached {len(seen)} of {loaded.n_layers} attention layers")
                stats.examples += n
                stats.loss_sum += float(loss.detach())
                stats.batches_done += 1
                bar.update(n)
    finally:
        hook.remove()
        for p in frozen:
            p.requires_grad_(True)
    return stats


class GradStats:
    """Sums of |dL/dP_ij| and P_ij per layer, head and key class, and their pair and row counts.

    Additive (merge, save, load), so it follows the engine's `Accumulator` bookkeeping.
    """

    def __init__(self, n_layers: int, n_heads: int, classes: tuple[str, ...] = KEY_CLASSES):
        self.classes = tuple(classes)
        C = len(self.classes)
        self.grad = np.zeros((n_layers, n_heads, C))
        self.mass = np.zeros((n_layers, n_heads, C))
        self.pairs = np.zeros((n_layers, C))
        self.rows = np.zeros(n_layers)
        self.examples, self.batches_done, self.loss_sum = 0, 0, 0.0

    def add_sums(self, layer: int, sums):
        self.grad[layer] += sums.grad.cpu().numpy()
        self.mass[layer] += sums.mass.cpu().numpy()
        self.pairs[layer] += sums.pairs.cpu().numpy()
        self.rows[layer] += sums.rows

    def merge(self, other: GradStats) -> GradStats:
        for name in ("grad", "mass", "pairs", "rows"):
            getattr(self, name).__iadd__(getattr(other, name))
        self.examples += other.examples
        self.batches_done += other.batches_done
        self.loss_sum += other.loss_sum
        return self

    def save(self, path):
        write_npz(path, grad=self.grad, mass=self.mass, pairs=self.pairs, rows=self.rows,
                  classes=np.array(self.classes), counts=np.array([self.examples, self.batches_done]),
                  loss_sum=np.array(self.loss_sum))

    @classmethod
    def load(cls, path) -> GradStats:
        with np.load(path) as z:
            new = cls(*z["grad"].shape[:2], tuple(str(c) for c in z["classes"]))
            new.grad, new.mass, new.pairs, new.rows = z["grad"], z["mass"], z["pairs"], z["rows"]
            new.examples, new.batches_done = (int(x) for x in z["counts"])
            new.loss_sum = float(z["loss_sum"])
        return new

    # -- means

    def layer_means(self) -> tuple[np.ndarray, np.ndarray]:
        """(layers, C) mean |grad| per pair over every head (of a pruned model: every kept
        head), and mean attention mass per row. NaN where a class has no pair."""
        grad, mass = self.head_means()
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a layer with every head removed: NaN
            return np.nanmean(grad, 1), np.nanmean(mass, 1)

    def head_means(self) -> tuple[np.ndarray, np.ndarray]:
        """(layers, H, C) the same per head."""
        pairs = np.where(self.pairs > 0, self.pairs, np.nan)[:, None, :]  # (layers, 1, C)
        rows = np.where(self.rows > 0, self.rows, np.nan)[:, None, None]  # (layers, 1, 1)
        return self.grad / pairs, self.mass / rows

    def layer_rows(self) -> list[dict]:
        grad, mass = self.layer_means()
        other = self.classes.index("other")
        rows = []
        for lay in range(grad.shape[0]):
            for c, name in enumerate(self.classes):
                rows.append({"layer": lay + 1, "key_class": name, "mean_abs_grad": float(grad[lay, c]),
                             "grad_vs_other": float(grad[lay, c] / grad[lay, other]), "attention": float(mass[lay, c]),
                             "pairs": int(self.pairs[lay, c]), "rows": int(self.rows[lay])})
        return rows

    def head_rows(self) -> list[dict]:
        grad, mass = self.head_means()
        return [{"layer": lay + 1, "head": h + 1, "key_class": name, "mean_abs_grad": float(grad[lay, h, c]),
                 "attention": float(mass[lay, h, c])}
                for lay in range(grad.shape[0]) for h in range(grad.shape[1]) for c, name in enumerate(self.classes)]
