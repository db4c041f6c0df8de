"""Many gated variants of one model, evaluated on shared batches: no model copies.

A variant is one `Gate` code per head, (layers, H): KEEP, ZERO (Michel et al.'s masking) or
UNIFORM (Kovaleva et al.'s disabling). Every variant runs on the same weights: the model's
`HeadGates` take per-sequence xi and uniform (B, layers, H), so a batch of b examples is
replicated once per variant, variant-major, and row v * b + i carries variant v's gates:

    inputs (b, L) -> (V * b, L)     gates (V, layers, H) -> (V * b, layers, H)

One forward then evaluates V variants. Each row's computation is that row's alone, so a
variant's predictions are those of evaluating it by itself (tested exactly); only the
matrix products get bigger, which is what makes it faster than V forwards of b rows.
`max_rows` caps V * b per forward (memory grows with it), so V is chosen per batch.

`evaluate_variants` returns the predictions of every variant on every example, (V, N): the
per-example correctness that paired tests need (`bertscope.analyses.paired`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.kernels import Gate
from bertscope.task_inputs import EncodedTask


@dataclass(frozen=True)
class Variant:
    """A gating of every head. layer / head (from 1, as the papers write `layer-head`) name
    what the variant changes, for tables; None where it is not one layer / one head."""

    name: str
    codes: torch.Tensor  # (layers, H) int8 Gate codes
    layer: int | None = None
    head: int | None = None

    @property
    def kind(self) -> str:
        return "baseline" if self.layer is None else "layer" if self.head is None else "head"


def baseline(n_layers: int, n_heads: int) -> Variant:
    return Variant("baseline", torch.full((n_layers, n_heads), int(Gate.KEEP), dtype=torch.int8))


def gated(name: str, n_layers: int, n_heads: int, heads, gate: Gate, layer=None, head=None) -> Variant:
    """The variant with `gate` on every (layer, head) of `heads` (0-based), the rest kept."""
    codes = torch.full((n_layers, n_heads), int(Gate.KEEP), dtype=torch.int8)
    for lay, h in heads:
        codes[lay, h] = int(gate)
    return Variant(name, codes, layer, head)


def single_heads(n_layers: int, n_heads: int, gate: Gate) -> list[Variant]:
    """One variant per head, that head alone gated: `layer-head`, from 1."""
    return [gated(f"{lay + 1}-{h + 1}", n_layers, n_heads, [(lay, h)], gate, lay + 1, h + 1)
            for lay in range(n_layers) for h in range(n_heads)]


def whole_layers(n_layers: int, n_heads: int, gate: Gate) -> list[Variant]:
    """One variant per layer, all its heads gated: `layer L`, from 1."""
    return [gated(f"layer {lay + 1}", n_layers, n_heads, [(lay, h) for h in range(n_heads)], gate, lay + 1)
            for lay in range(n_layers)]


def variant_gates(variants: list[Variant], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row gates of `rows` rows per variant, variant-major: xi (V * rows, layers, H) float
    and uniform (V * rows, layers, H) bool."""
    codes = torch.stack([v.codes for v in variants]).long()  # (V, layers, H)
    xi = (codes != Gate.ZERO).float().repeat_interleave(rows, dim=0)  # (V * rows, layers, H)
    uniform = (codes == Gate.UNIFORM).repeat_interleave(rows, dim=0)  # (V * rows, layers, H)
    return xi, uniform


@dataclass
class VariantResults:
    """predictions (V, N) int64 of every variant on every example; labels (N,)."""

    variants: list[Variant]
    predictions: np.ndarray
    labels: np.ndarray
    forwards: int = 0
    elapsed_s: float = 0.0

    @property
    def correct(self) -> np.ndarray:
        """(V, N) bool: whether each variant got each example right."""
        return self.predictions == self.labels[None, :]

    @property
    def accuracy(self) -> np.ndarray:
        """(V,) the share of examples each variant gets right."""
        return self.correct.mean(1)


def example_batches(task: EncodedTask, batch_size: int) -> list[list[int]]:
    """Example indices in batches of similar length (sorted, ties by index): little padding."""
    lengths = task.lengths()  # (N,)
    order = sorted(range(task.n_examples), key=lambda i: (lengths[i], i))
    return [order[s: s + batch_size] for s in range(0, len(order), batch_size)]


def evaluate_variants(loaded, task: EncodedTask, variants: list[Variant], batch_size: int = 32,
                      max_rows: int = 512, progress: bool = True, desc: str = "variants") -> VariantResults:
    """Predictions of every variant on every example of `task`, several variants per forward.

    batch_size: examples per batch (their rows: examples x task.per_example).
    max_rows: model rows per forward; ceil(max_rows / rows of the batch) variants share one
      forward (at least 1). `max_rows=0` evaluates the variants one by one, each a forward of
      its own with (layers, H) gates: the reference the shared batches are measured against.
    The model's gates are reset afterwards, also on an error or Ctrl-C.
    """
    model, gates = loaded.model, loaded.gates
    device = next(model.parameters()).device
    pad = loaded.tokenizer.pad_token_id or 0
    preds = np.zeros((len(variants), task.n_examples), dtype=np.int64)
    batches = example_batches(task, batch_size)
    forwards, t0 = 0, time.perf_counter()
    try:
        # no_grad, not inference_mode: HeadGates tracks its tensors by version, which inference tensors lack
        with torch.no_grad(), tqdm(total=len(batches) * len(variants), unit="variant-batch",
                                          disable=not progress, desc=desc) as bar:
            for examples in batches:
                inputs = task.batch(examples, pad, device)
                if not loaded.takes_token_types:
                    inputs.pop("token_type_ids", None)
                rows = inputs["input_ids"].shape[0]
                per_forward = 1 if max_rows == 0 else max(1, max_rows // rows)
                for start in range(0, len(variants), per_forward):
                    chunk = variants[start: start + per_forward]
                    if max_rows == 0:  # one variant, its gates shared by the batch
                        gates.xi, gates.uniform = (t[0] for t in variant_gates(chunk, 1))
                        batch_inputs = inputs
                    else:
                        gates.xi, gates.uniform = variant_gates(chunk, rows)
                        batch_inputs = {k: t.repeat(len(chunk), 1) for k, t in inputs.items()}  # (V * R, L)
                    logits = model(**batch_inputs).logits  # (V * R, C)
                    forwards += 1
                    for k in range(len(chunk)):
                        preds[start + k, examples] = task.predict(logits[k * rows: (k + 1) * rows]).cpu().numpy()
                    bar.update(len(chunk))
    finally:
        gates.reset()
    return VariantResults(list(variants), preds, task.labels, forwards, time.perf_counter() - t0)
