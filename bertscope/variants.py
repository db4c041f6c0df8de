"""Many gated variants of one model, evaluated on shared batches: no model copies.

A variant is one `Gate` code per head, (layers, H): KEEP, ZERO (Michel et al.'s masking) or
UNIFORM (Kovaleva et al.'s disabling). Every variant runs on the same weights: the model's
`HeadGates` take per-sequence xi and uniform (rows, layers, H), so one forward pass carries
several variants, each in its own block of rows.

Shared prefixes. A variant whose first gated layer is l computes layers 0..l-1 exactly as the
baseline does. So a forward starts with the batch's b rows alone (the prefix block, which is
the baseline), and at the input of layer l a forward pre-hook on that layer appends one copy
of the prefix block's hidden states (and of every per-row tensor the layer gets, the padding
mask) for each variant that starts there:

    layer 0 .. l-1:  b rows                     (baseline)
    layer l ..    :  b + n_l * b rows            (+ the variants first gated at l)
    ...              b * (1 + V) rows at the end, variant-major blocks -> logits

The per-sequence gates hold the final rows; each layer takes the rows it has (their first
ones: `HeadGates.prefix_rows`). Single-head and single-layer variants of a 6-layer model then
cost 21/36 of replicating the batch from the embeddings on; families whose layer list is not
found (ALBERT's shared groups) replicate the inputs instead (every variant "starts" at layer 0).
Each row's arithmetic is its own, so a variant's predictions are those of evaluating it alone
(tested bit for bit on one thread). `max_rows` caps the rows of a forward (memory grows with it).

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


def first_gated_layer(variant: Variant) -> int | None:
    """The first layer with a head not KEEP (None: the variant is the baseline)."""
    gated_layers = (variant.codes != Gate.KEEP).any(1).nonzero()
    return int(gated_layers[0]) if len(gated_layers) else None


def layer_modules(model) -> list | None:
    """The encoder's per-layer modules in call order (each called once per forward), or None
    where the family shares modules between layers (ALBERT) or keeps them elsewhere."""
    base = getattr(model, "base_model", model)
    for owner in ("encoder", "transformer"):
        layers = getattr(getattr(base, owner, None), "layer", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) == model.config.num_hidden_layers:
            return list(layers)
    return None


def evaluate_variants(loaded, task: EncodedTask, variants: list[Variant], batch_size: int = 32,
                      max_rows: int = 512, progress: bool = True, desc: str = "variants",
                      share_prefix: bool = True) -> VariantResults:
    """Predictions of every variant on every example of `task`, several variants per forward.

    batch_size: examples per batch (their rows: examples x task.per_example).
    max_rows: model rows at the end of a forward: the batch's rows times (1 + the gated variants
      it carries), at least one variant per forward. `max_rows=0` evaluates the variants one
      by one, each a forward of its own with (layers, H) gates: the reference the shared
      forwards are measured against.
    share_prefix: start each variant's rows at its first gated layer (module docstring); False
      replicates the batch from the inputs on.
    The model's gates are reset afterwards, also on an error or Ctrl-C.
    """
    model, gates = loaded.model, loaded.gates
    device = next(model.parameters()).device
    pad = loaded.tokenizer.pad_token_id or 0
    layers = layer_modules(model) if share_prefix else None
    starts = [first_gated_layer(v) for v in variants]
    order = sorted(range(len(variants)), key=lambda i: -1 if starts[i] is None else starts[i])  # prefix first
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
                for chunk in _chunks(order, starts, rows, max_rows):
                    if max_rows == 0:  # one variant, its gates shared by the batch
                        gates.xi, gates.uniform = (t[0] for t in variant_gates([variants[chunk[0]]], 1))
                        outputs = [model(**inputs).logits]
                    else:
                        outputs = _forward(loaded, inputs, [variants[i] for i in chunk], [starts[i] for i in chunk],
                                           layers)
                    forwards += 1
                    for i, logits in zip(chunk, outputs):
                        preds[i, examples] = task.predict(logits).cpu().numpy()
                    bar.update(len(chunk))
    finally:
        gates.reset()
        gates.prefix_rows = False
    return VariantResults(list(variants), preds, task.labels, forwards, time.perf_counter() - t0)


def _chunks(order: list[int], starts: list, rows: int, max_rows: int) -> list[list[int]]:
    """Variant indices per forward: as many gated variants as fit in max_rows beside the prefix
    block (at least one); baseline variants ride along for free."""
    if max_rows == 0:
        return [[i] for i in order]
    per_forward = max(1, max_rows // rows - 1)
    chunks, current, n = [], [], 0
    for i in order:
        if starts[i] is not None and n == per_forward:
            chunks.append(current)
            current, n = [], 0
        current.append(i)
        n += starts[i] is not None
    return chunks + [current] if current else chunks


def forward_variants(loaded, inputs: dict, variants: list[Variant], share_prefix: bool = True) -> list[torch.Tensor]:
    """One forward pass of `inputs` (rows, L) under every variant: their logits, (rows, C) each,
    in the order given (see the module docstring). The gates are reset afterwards."""
    layers = layer_modules(loaded.model) if share_prefix else None
    try:
        with torch.no_grad():
            return _forward(loaded, inputs, variants, [first_gated_layer(v) for v in variants], layers)
    finally:
        loaded.gates.reset()


def _forward(loaded, inputs: dict, variants: list[Variant], starts: list, layers: list | None) -> list[torch.Tensor]:
    """forward_variants with the variants' first gated layers known; the gates are left set."""
    model, gates = loaded.model, loaded.gates
    rows = inputs["input_ids"].shape[0]
    gated_ = sorted((i for i, s in enumerate(starts) if s is not None), key=lambda i: starts[i])  # block k + 1
    gates.xi, gates.uniform = variant_gates([baseline(gates.n_layers, gates.n_heads)] + [variants[i] for i in gated_],
                                            rows)
    handles = []
    if layers is None:  # no layer list: every block from the inputs on
        inputs = {k: t.repeat(1 + len(gated_), 1) for k, t in inputs.items()}  # (rows * (1 + V), L)
    else:
        gates.prefix_rows = True
        first = min((starts[i] for i in gated_), default=len(layers))
        for layer in range(first, len(layers)):
            copies = sum(starts[i] == layer for i in gated_)
            handles.append(layers[layer].register_forward_pre_hook(_grow(rows, copies), with_kwargs=True))
    try:
        logits = model(**inputs).logits  # (rows * (1 + V), C)
    finally:
        for h in handles:
            h.remove()
        gates.prefix_rows = False
    if logits.shape[0] != rows * (1 + len(gated_)):
        raise RuntimeError(f"expected {rows * (1 + len(gated_))} rows of logits, got {logits.shape[0]}")
    block = {i: k + 1 for k, i in enumerate(gated_)}  # the baseline's rows are block 0
    return [logits[block.get(i, 0) * rows: (block.get(i, 0) + 1) * rows] for i in range(len(variants))]


def _grow(rows: int, copies: int):
    """A layer pre-hook for shared prefixes. The layer's hidden states (its first argument) hold
    n rows: the prefix block of `rows` and the variant blocks started so far. Per-row tensors the
    encoder hands every layer as it got them (the padding mask: `rows` rows) are tiled to n rows
    (every block holds the same examples); then `copies` copies of the prefix block's rows are
    appended to every per-row tensor, for the variants that start at this layer."""
    def hook(module, args, kwargs):
        n = args[0].shape[0]

        def fit(t):
            if not torch.is_tensor(t) or t.dim() == 0:
                return t
            if t.shape[0] == rows and n != rows:
                t = t.repeat(n // rows, *([1] * (t.dim() - 1)))
            if copies and t.shape[0] == n:
                t = torch.cat([t, t[:rows].repeat(copies, *([1] * (t.dim() - 1)))])
            return t

        return tuple(fit(a) for a in args), {k: fit(v) for k, v in kwargs.items()}
    return hook
