"""bertscope's attention function, plugged into transformers through `AttentionInterface`.

Loading a model with `attn_implementation="bertscope"` routes every self-attention call
through `bertscope_attention`. Outside an analysis it is plain attention (torch SDPA, with
its dropout in training mode); inside `HeadProbe.active(...)` it computes the layer's output
*and* its row statistics with the chosen kernel backend and hands the statistics to a sink.
On both paths the model's head gates (`bertscope.models.gates`, attached by `load_model`) scale
each head's output. A really pruned layer (`bertscope.models.head_removal`) computes fewer heads: its
gates are those of the heads it kept, and its statistics go to the sink in the layer's
original head slots, a removed head's as NaN (-1 for argmax). Nothing in transformers is
edited or patched: we register two functions by name.

Gradients. The statistics backends' fast paths cannot be differentiated (out= writes, the
compiled C row pass, a Triton kernel without backward). When autograd needs the output
(grad enabled and q, k, v or the gates require grad) `attention_stats` computes the
statistics without grad with the chosen backend and the output by SDPA with autograd:
d loss / d xi is exact. `kernels.output_path` names the choice; `HeadProbe.output_paths`
collects the ones a run took (for run.json).

The mask function registered under the same name hands the attention function the plain
(B, L) key-padding mask instead of an (B, 1, L, L) additive bias: the kernels only need
to know which keys are real, and a 2-D mask costs nothing to build. That holds for an
encoder's bidirectional mask only: any other mask (causal, sliding window, custom) is handed
over in full, as transformers' boolean (B, 1, Lq, Lk) mask, so that it is seen.

Every call builds the call's `kernels.AttentionLayout` from what the module, its arguments
and the mask say (`call_layout`: `module.is_causal`, a `sliding_window` argument, fewer key
than query heads, a 4-D mask whose query rows differ) and hands it to `attention_stats`.
Until the kernels compute them, a causal or windowed attention or fewer key/value heads than
query heads is refused in one line (`UserError`), on every path, never read as an encoder's.

Attention gradients. Inside `GradProbe.active(...)` (and no `HeadProbe`), the plain path runs
`kernels.attention_grad` instead of SDPA: the same output and exact gradients, and during
backward every layer hands the sums of |dL/dP_ij| per head and key class to a sink (Clark et
al.'s gradient test of attention to [SEP]); the gates scale its output afterwards, so autograd
carries xi as on the plain path.
"""
from __future__ import annotations

import contextvars
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, bidirectional_mask_function, sdpa_mask

from bertscope.errors import UserError
from bertscope.kernels import (
    PLAIN,
    AttentionLayout,
    GradSums,
    RowStats,
    StatsSpec,
    WordPooling,
    apply_gates,
    attention_grad,
    attention_grad_eager,
    attention_stats,
    gated_sdpa,
    needs_grad,
    output_path,
    resolve_backend,
)
from bertscope.models.gates import layer_gates
from bertscope.models.head_removal import head_slots, spread_grad_sums, spread_heads

ATTN_IMPLEMENTATION = "bertscope"

# (layer, row statistics, key_valid (B, L)) -> None
Sink = Callable[[int, RowStats, torch.Tensor], None]


@dataclass
class _Forward:
    """What the attention function needs to know during one forward pass."""

    probe: HeadProbe
    key_class: torch.Tensor  # (B, L) int64
    sink: Sink
    pooling: WordPooling | None = None
    layer: int = 0


_ACTIVE: contextvars.ContextVar[_Forward | None] = contextvars.ContextVar("bertscope_forward", default=None)


class HeadProbe:
    """Owns what stays fixed across forwards: statistics spec and backend (head gates live on
    the model: `bertscope.models.gates`).

    Layers are numbered by call order within a forward, not read from the module:
    DistilBERT's attention modules carry no `layer_idx`, and ALBERT calls one shared
    module for every layer.
    """

    def __init__(self, n_layers: int, n_heads: int, spec: StatsSpec, backend: str = "auto", device="cpu"):
        self.n_layers, self.n_heads, self.spec = n_layers, n_heads, spec
        self.backend = resolve_backend(backend, torch.device(device))
        self.output_paths: set[str] = set()  # where layer outputs came from (`output_path`), for run.json

    @contextmanager
    def active(self, key_class: torch.Tensor, sink: Sink, pooling: WordPooling | None = None):
        """Run one forward pass of the model inside this block; `pooling` for spec.word_maps."""
        fwd = _Forward(self, key_class, sink, pooling)
        token = _ACTIVE.set(fwd)
        try:
            yield
        finally:
            _ACTIVE.reset(token)
        if fwd.layer != self.n_layers:
            raise RuntimeError(f"expected {self.n_layers} attention calls in a forward pass, saw {fwd.layer}")


LayerGradSink = Callable[[int, GradSums], None]  # (layer, sums of that layer) -> None, called during backward
GRAD_BACKENDS = {"fused": attention_grad, "eager": attention_grad_eager}


@dataclass
class _GradForward:
    probe: GradProbe
    key_class: torch.Tensor  # (B, L) int64
    sink: LayerGradSink
    layer: int = 0


_GRADS: contextvars.ContextVar[_GradForward | None] = contextvars.ContextVar("bertscope_grads", default=None)


class GradProbe:
    """Sums of |dL/dP_ij| per layer, head and key class, delivered during backward.

    Run the forward inside `active(key_class, sink)`, then call backward (after the block is
    fine): each layer's `GradSums` reaches `sink(layer, sums)`, layers numbered by call order
    (as `HeadProbe`), last layer first. backend: "fused" (`kernels.attention_grad`, no maps
    kept) or "eager" (the oracle: autograd on the materialised maps).
    """

    def __init__(self, n_layers: int, n_classes: int, backend: str = "fused"):
        if backend not in GRAD_BACKENDS:
            raise ValueError(f"unknown gradient backend {backend!r}; choose one of {', '.join(GRAD_BACKENDS)}")
        self.n_layers, self.n_classes, self.backend = n_layers, n_classes, backend

    @contextmanager
    def active(self, key_class: torch.Tensor, sink: LayerGradSink):
        fwd = _GradForward(self, key_class, sink)
        token = _GRADS.set(fwd)
        try:
            yield
        finally:
            _GRADS.reset(token)
        if fwd.layer != self.n_layers:
            raise RuntimeError(f"expected {self.n_layers} attention calls in a forward pass, saw {fwd.layer}")


def _grad_attention(fwd: _GradForward, query, key, value, key_valid, gates, scaling, dropout, module=None):
    """The plain path's output through `kernels.attention_grad` (or its oracle), gated after.
    A pruned layer's sums go to the sink in the original head slots (removed heads NaN)."""
    probe = fwd.probe
    if dropout > 0:
        raise RuntimeError(f"attention gradients need the model in eval mode: it is training, with attention "
                           f"dropout {dropout} (call model.eval())")
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))):
        raise RuntimeError("attention gradients need autograd through q, k and v: grad is disabled or nothing "
                           "before the attention requires grad")
    if fwd.key_class.shape != key_valid.shape:
        raise ValueError(f"key_class has shape {tuple(fwd.key_class.shape)}, the batch {tuple(key_valid.shape)}")
    layer = fwd.layer
    if layer >= probe.n_layers:
        raise RuntimeError(f"expected {probe.n_layers} attention calls in a forward pass, saw more")
    fwd.layer += 1
    sink, slots = fwd.sink, head_slots(module)

    def layer_sink(sums):
        sink(layer, sums if slots is None else spread_grad_sums(sums, slots, module.bertscope_n_heads))
    out = GRAD_BACKENDS[probe.backend](query, key, value, key_valid, fwd.key_class, probe.n_classes,
                                       layer_sink, scaling)  # (B, H, L, D)
    return apply_gates(out, value, key_valid, gates).transpose(1, 2).contiguous()


def key_valid_from_mask(attention_mask, query) -> torch.Tensor:
    """(B, L) bool, True for real keys, from whatever mask the model handed over.

    A 4-D (B, 1, Lq, Lk) mask must be a padding mask, the same for every query row (the first
    is read): `call_layout` refuses one whose rows differ before this is called."""
    B, _, _, _ = query.shape
    L = query.shape[-2]
    if attention_mask is None:
        return torch.ones(B, L, dtype=torch.bool, device=query.device)
    if attention_mask.dim() == 2:
        return attention_mask.bool()
    if attention_mask.dim() == 4:  # a prepared (B, 1, Lq, Lk) mask: read the first query row
        row = attention_mask[:, 0, 0, :]
        return row if row.dtype == torch.bool else row == 0
    raise ValueError(f"unsupported attention mask of shape {tuple(attention_mask.shape)}")


def rows_differ(attention_mask) -> bool:
    """Whether a 4-D mask lets different query rows see different keys (causal, windowed, custom);
    False for any other mask (a 2-D mask is a key-padding mask)."""
    if attention_mask is None or attention_mask.dim() != 4:
        return False
    return not bool((attention_mask == attention_mask[:, :, :1, :]).all())


def call_layout(module, query, key, attention_mask, kwargs) -> AttentionLayout:
    """The `AttentionLayout` of one attention call, from what the module, the call's arguments and
    the mask say; a 4-D mask whose query rows differ counts as causal (it is not a padding mask)."""
    causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False))) or rows_differ(attention_mask)
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if window is not None:
        window = (window - 1, 0) if causal else (window, window)
    kv_heads = key.shape[1] if key.shape[1] != query.shape[1] else None
    if causal is False and window is None and kv_heads is None:
        return PLAIN
    return AttentionLayout(causal=causal, window=window, n_key_value_heads=kv_heads)


def check_call(module, query, key, attention_mask, kwargs) -> AttentionLayout:
    """The call's layout, or a one-line UserError naming the model type and what bertscope does
    not compute yet."""
    layout = call_layout(module, query, key, attention_mask, kwargs)
    if layout is PLAIN:
        return layout
    missing = layout.unsupported(query.shape[1])
    declared_causal = bool(kwargs.get("is_causal", getattr(module, "is_causal", False)))
    if rows_differ(attention_mask) and not declared_causal:  # the mask alone says it: say so
        missing = [m for m in missing if m != "causal attention"] + [
            "an attention mask that differs between query rows (causal, sliding-window or custom)"]
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    raise UserError(f"{'model type ' + repr(model_type) if model_type else type(module).__name__} has "
                    f"{' and '.join(missing)}, which bertscope does not analyse yet (bidirectional encoders only)")


def bertscope_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query, key, value: (B, H, L, D). Returns (out (B, L, H, D), None)."""
    layout = check_call(module, query, key, attention_mask, kwargs)  # refuses what would be misread
    key_valid = key_valid_from_mask(attention_mask, query)  # (B, L)
    slots = head_slots(module)  # a pruned layer's original head of each head it computes, else None
    gates = layer_gates(query, slots)  # this call's LayerGates from the model's HeadGates, or None
    fwd = _ACTIVE.get()
    if fwd is None:
        grads = _GRADS.get()
        if grads is not None:  # -- plain attention, its backward measuring |dL/dP| (GradProbe)
            return _grad_attention(grads, query, key, value, key_valid, gates, scaling, dropout, module), None
        # -- plain attention, for a model used outside an analysis
        return gated_sdpa(query, key, value, key_valid, gates, scaling, dropout), None
    if query.shape[-2] != key.shape[-2]:
        raise ValueError("bertscope analyses self-attention only (query and key lengths differ)")
    if dropout > 0:
        raise RuntimeError(f"attention statistics need the model in eval mode: it is training, with attention "
                           f"dropout {dropout}, which the statistics would not see (call model.eval())")
    layer, probe = fwd.layer, fwd.probe
    if layer >= probe.n_layers:
        raise RuntimeError(f"expected {probe.n_layers} attention calls in a forward pass, saw more")
    fwd.layer += 1
    probe.output_paths.add(output_path(probe.backend, needs_grad(query, key, value, gates)))
    out, stats = attention_stats(
        query, key, value, key_valid, fwd.key_class, probe.spec,
        gates=gates, scale=scaling, backend=probe.backend, pooling=fwd.pooling, layout=layout,
    )
    if slots is not None:  # statistics back in the original head slots, pruned heads missing (NaN)
        stats = spread_heads(stats, slots, probe.n_heads)
    fwd.sink(layer, stats, key_valid)
    return out, None


def key_padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                     attention_mask=None, **kwargs):
    """The mask interface's answer for our implementation: for an encoder's bidirectional mask,
    the (B, L) padding mask as is; for any other (causal, sliding window, overlays) the full
    boolean (B, 1, Lq, Lk) mask transformers means, so that the attention function sees it
    (`call_layout`) instead of reading a padding mask."""
    if mask_function is None or mask_function is bidirectional_mask_function:
        return attention_mask
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function=mask_function,
                     attention_mask=attention_mask, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                     **{k: v for k, v in kwargs.items() if k in ("local_size", "use_vmap", "device")})


AttentionInterface.register(ATTN_IMPLEMENTATION, bertscope_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, key_padding_mask)
