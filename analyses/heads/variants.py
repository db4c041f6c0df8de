"""Many gated variants of one model, evaluated on shared batches: no model copies.

A variant is one `Gate` code per head, (layers, H): KEEP, ZERO (Michel et al.'s masking) or
UNIFORM (Kovaleva et al.'s disabling). Every variant runs on the same weights: the model's
`HeadGates` take per-sequence xi and uniform (rows, layers, H), so one forward pass carries
several variants, each in its own block of rows.

Shared prefixes. A variant whose first gated layer is l computes layers 0..l-1 exactly as the
baseline does. So each batch runs the baseline once, with a forward pre-hook on every layer
keeping that layer's input (hidden states, padding mask); then the variants that start at
layer l, up to `max_rows` rows at a time, run one forward in which pre-hooks shrink layers
0..l-1 to a single row (a layer cannot take zero rows) and hand layer l the cached input,
once per variant (variant-major blocks of the batch's rows):

    baseline:             every layer on b rows                         -> logits (b, C)
    variants from l:      layers < l on 1 row, layers >= l on V_l * b rows -> logits (V_l * b, C)

The per-sequence gates hold the variants' rows; a layer takes the first rows it has
(`HeadGates.prefix_rows`), which before l are KEEP for every variant. For one variant per head
and per layer of a 6-layer model (79 variants with the baseline) this is 279/474 = 59% of the
layer work of running them one by one, in batches no bigger than `max_rows`. Families whose
layers are not one module each (ALBERT's shared groups) replicate the batch from the inputs on
instead (`share_prefix=False` does that everywhere). Each row's arithmetic is its own, so a
variant's predictions are those of evaluating it alone (its logits to the BLAS's rounding, which
may differ per batch shape: tested to 1e-5).

`evaluate_variants` returns the predictions of every variant on every example, (V, N): the
per-example correctness that paired tests need (`bertscope.analyses.heads.paired`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from bertscope.kernels.spec import Gate
from bertscope.models.architectures import architecture_of
from bertscope.tasks.inputs import EncodedTask


@dataclass(frozen=True)
class Variant:
    """A gating of every head. layer / head (from 1, as the papers write `layer-head`) name
    what the variant changes, for tables; None where it is not one layer / one head. A
    `but_one` variant gates every head of `layer` except `head`, the one it keeps."""

    name: str
    codes: torch.Tensor  # (layers, H) int8 Gate codes
    layer: int | None = None
    head: int | None = None
    but_one: bool = False

    @property
    def kind(self) -> str:
        if self.layer is None:
            return "baseline"
        return "layer" if self.head is None else "but-one" if self.but_one else "head"


def baseline(n_layers: int, n_heads: int) -> Variant:
    return Variant("baseline", torch.full((n_layers, n_heads), int(Gate.KEEP), dtype=torch.int8))


def gated(name: str, n_layers: int, n_heads: int, heads, gate: Gate, layer=None, head=None,
          but_one: bool = False) -> Variant:
    """The variant with `gate` on every (layer, head) of `heads` (0-based), the rest kept."""
    codes = torch.full((n_layers, n_heads), int(Gate.KEEP), dtype=torch.int8)
    for lay, h in heads:
        codes[lay, h] = int(gate)
    return Variant(name, codes, layer, head, but_one)


def single_heads(n_layers: int, n_heads: int, gate: Gate) -> list[Variant]:
    """One variant per head, that head alone gated: `layer-head`, from 1."""
    return [gated(f"{lay + 1}-{h + 1}", n_layers, n_heads, [(lay, h)], gate, lay + 1, h + 1)
            for lay in range(n_layers) for h in range(n_heads)]


def whole_layers(n_layers: int, n_heads: int, gate: Gate) -> list[Variant]:
    """One variant per layer, all its heads gated: `layer L`, from 1."""
    return [gated(f"layer {lay + 1}", n_layers, n_heads, [(lay, h) for h in range(n_heads)], gate, lay + 1)
            for lay in range(n_layers)]


def all_but_one(n_layers: int, n_heads: int, gate: Gate) -> list[Variant]:
    """Michel et al.'s "all heads but one": per layer and per head kept, every other head of that
    layer gated: `layer L only h`, from 1 (layer and head name the layer and the kept head)."""
    return [gated(f"layer {lay + 1} only {h + 1}", n_layers, n_heads,
                  [(lay, o) for o in range(n_heads) if o != h], gate, lay + 1, h + 1, but_one=True)
            for lay in range(n_layers) for h in range(n_heads)]


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
    """The model's per-layer modules in call order (each called once per forward) where the
    architecture table (`bertscope.models.architectures`, `Architecture.prefix_layers`) says
    variants may start from a cached layer input; None where the family shares modules between
    layers (ALBERT) or its task head reads more than the hidden states (ModernBERT, decoders)."""
    return architecture_of(model.config).prefix_layers(model)


def evaluate_variants(loaded, task: EncodedTask, variants: list[Variant], batch_size: int = 32,
                      max_rows: int = 512, progress: bool = True, desc: str = "variants",
                      share_prefix: bool = True) -> VariantResults:
    """Predictions of every variant on every example of `task`, several variants per forward.

    batch_size: examples per batch (their rows: examples x task.per_example).
    max_rows: model rows per forward, at least one variant's (the batch's rows). `max_rows=0`
      evaluates the variants one by one, each in a full forward of its own with (layers, H)
      gates: the reference the shared forwards are measured against.
    share_prefix: each variant starts from the baseline's cached hidden states at its first
      gated layer (module docstring); False replicates the batch from the inputs on.
    The model's gates are reset afterwards, also on an error or Ctrl-C.
    """
    model, gates = loaded.model, loaded.gates
    device = next(model.parameters()).device
    pad = loaded.tokenizer.pad_token_id or 0
    layers = layer_modules(model) if share_prefix else None
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
                for chunk, outputs in _forwards(loaded, inputs, variants, layers, max_rows):
                    forwards += 1
                    for i, logits in zip(chunk, outputs):
                        preds[i, examples] = task.predict(logits).cpu().numpy()
                    bar.update(len(chunk))
    finally:
        gates.reset()
        gates.prefix_rows = False
    return VariantResults(list(variants), preds, task.labels, forwards, time.perf_counter() - t0)


def forward_variants(loaded, inputs: dict, variants: list[Variant], share_prefix: bool = True,
                     max_rows: int | None = None) -> list[torch.Tensor]:
    """The logits of `inputs` (rows, L) under every variant, (rows, C) each, in the order given,
    from as few forwards as `max_rows` allows (None: no cap). The gates are reset afterwards."""
    layers = layer_modules(loaded.model) if share_prefix else None
    out = [None] * len(variants)
    try:
        with torch.no_grad():
            for chunk, logits in _forwards(loaded, inputs, variants, layers, max_rows or 1 << 62):
                for i, t in zip(chunk, logits):
                    out[i] = t
    finally:
        loaded.gates.reset()
        loaded.gates.prefix_rows = False
    return out


def _forwards(loaded, inputs: dict, variants: list[Variant], layers: list | None, max_rows: int):
    """(variant indices, their logits) of each forward pass over one batch."""
    model, gates = loaded.model, loaded.gates
    rows = inputs["input_ids"].shape[0]
    per_forward = max(1, max_rows // rows)
    if max_rows == 0:  # one by one: each variant's gates shared by the batch
        for i, v in enumerate(variants):
            gates.xi, gates.uniform = (t[0] for t in variant_gates([v], 1))
            yield [i], [model(**inputs).logits]
        return
    if layers is None:  # no layer list: the batch replicated from the inputs on, per-row gates
        for s in range(0, len(variants), per_forward):
            chunk = list(range(s, min(s + per_forward, len(variants))))
            gates.xi, gates.uniform = variant_gates([variants[i] for i in chunk], rows)
            logits = model(**{k: t.repeat(len(chunk), 1) for k, t in inputs.items()}).logits  # (V * rows, C)
            yield chunk, list(logits.split(rows))
        return
    # shared prefixes: the baseline once, caching each layer's input; then each variant from its first gated layer
    starts = [first_gated_layer(v) for v in variants]
    gates.reset()
    cache = {}
    handles = [layer.register_forward_pre_hook(_record(cache, k), with_kwargs=True) for k, layer in enumerate(layers)]
    try:
        base = model(**inputs).logits  # (rows, C)
    finally:
        for h in handles:
            h.remove()
    same = [i for i, s in enumerate(starts) if s is None]
    if same:
        yield same, [base] * len(same)
    gates.prefix_rows = True  # the layers before the start run one row (KEEP there), the gates hold the variants'
    for start in sorted({s for s in starts if s is not None}):
        group = [i for i, s in enumerate(starts) if s == start]
        for g in range(0, len(group), per_forward):
            chunk = group[g: g + per_forward]
            gates.xi, gates.uniform = variant_gates([variants[i] for i in chunk], rows)
            hooks = [(k, _skip(rows)) for k in range(start)] + [(start, _resume(rows, len(chunk), cache[start]))] \
                + [(k, _tile(rows)) for k in range(start + 1, len(layers))]
            handles = [layers[k].register_forward_pre_hook(hook, with_kwargs=True) for k, hook in hooks]
            try:
                logits = model(**inputs).logits  # (V * rows, C)
            finally:
                for h in handles:
                    h.remove()
            yield chunk, list(logits.split(rows))
    gates.prefix_rows = False


# Layer pre-hooks for shared prefixes. A per-row tensor argument of a layer is one whose first
# dimension is the batch's rows (the hidden states, the padding mask the encoder hands every
# layer); anything else passes as it is.

def _per_row(t, rows: int) -> bool:
    return torch.is_tensor(t) and t.dim() > 0 and t.shape[0] == rows


def _record(cache: dict, k: int):
    """Keep layer k's arguments (the baseline's input to it)."""
    def hook(module, args, kwargs):
        cache[k] = (args, kwargs)
    return hook


def _skip(rows: int):
    """A layer before the variants' start: one row to compute, not the batch (a layer cannot
    take zero rows: attention reshapes with -1); its output is dropped at the start layer."""
    def hook(module, args, kwargs):
        cut = lambda t: t[:1] if _per_row(t, rows) else t  # noqa: E731
        return tuple(map(cut, args)), {k: cut(v) for k, v in kwargs.items()}
    return hook


def _resume(rows: int, copies: int, cached):
    """The start layer: the baseline's input to it, once per variant (variant-major blocks)."""
    args, kwargs = cached

    def hook(module, _args, _kwargs):
        tile = lambda t: t.repeat(copies, *([1] * (t.dim() - 1))) if _per_row(t, rows) else t  # noqa: E731
        return tuple(map(tile, args)), {k: tile(v) for k, v in kwargs.items()}
    return hook


def _tile(rows: int):
    """A layer after the start: the encoder hands it the batch's padding mask; tile it to the
    variants' rows (every block holds the same examples)."""
    def hook(module, args, kwargs):
        n = args[0].shape[0]
        tile = lambda t: (t.repeat(n // rows, *([1] * (t.dim() - 1)))  # noqa: E731
                          if n != rows and _per_row(t, rows) else t)
        return tuple(map(tile, args)), {k: tile(v) for k, v in kwargs.items()}
    return hook
