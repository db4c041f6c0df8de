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

The mask function registered under the same name (`key_padding_mask`) never builds an L x L
tensor (a boolean 32k x 32k mask is 1 GiB). For an encoder's bidirectional mask it hands over
the plain (B, L) key-padding mask, as it is. For a causal or sliding-window mask it hands over a
`KeyBand`: the (B, L) padding mask and the band every query sees (causal; a window of so many
keys to the left and right), read off the mask function transformers passes (`read_band`: its
parts are recognised by name, then checked on a few query rows, `check_band`). Anything else
(a chunked, packed, block-wise or custom mask, a cache offset) is refused in one line. Query i
sees key j iff j is a real key and lies in i's band, positions counted in the padded index space
as transformers counts them, so left padding works.

Every call builds the call's `kernels.AttentionLayout` (`call_layout`): the band of its mask (or,
without one, the module's `is_causal`), and fewer key/value than query heads from the shapes
(grouped-query attention: query head h reads key/value head h // (H / H_kv)). What the call says
itself must agree with its mask: a `sliding_window` argument (transformers passes the window as
flash attention counts it, one more than the keys a query sees to its left) exactly when the
mask has a window, `is_causal` as the mask. An argument that changes the attention bertscope
does not compute (a logit soft-cap, an attention-sink logit `s_aux`, anything unknown that is
set) is refused in one line, on every path. Scaling (e.g. Gemma-3's query_pre_attn_scalar) is
the `scaling` argument, honoured as given.

Attention gradients. Inside `GradProbe.active(...)` (and no `HeadProbe`), the plain path runs
`kernels.attention_grad` instead of SDPA: the same output and exact gradients, and during
backward every layer hands the sums of |dL/dP_ij| per head and key class to a sink (Clark et
al.'s gradient test of attention to [SEP]); the gates scale its output afterwards, so autograd
carries xi as on the plain path. `kernels.attention_grad` computes the plain layout only: a
causal, windowed or grouped-query call is refused there in one line.
"""
from __future__ import annotations

import contextvars
import numbers
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.masking_utils import (
    AttentionMaskInterface,
    bidirectional_mask_function,
    causal_mask_function,
    prepare_padding_mask,
)

from bertscope.errors import UserError
from bertscope.kernels.attention_grad import GradSums, attention_grad
from bertscope.kernels.backends import attention_stats, output_path, resolve_backend
from bertscope.kernels.common import PaddingRows, known_padding
from bertscope.kernels.eager import attention_grad_eager
from bertscope.kernels.gates import apply_gates, gated_sdpa, needs_grad
from bertscope.kernels.norms import head_factors, output_weight, value_norms
from bertscope.kernels.spec import PLAIN, AttentionLayout, RowStats, StatsSpec, WordPooling, refuse_unsupported
from bertscope.kernels.streaming import apply_streaming
from bertscope.models.architectures import architecture_of
from bertscope.models.gates import layer_gates
from bertscope.models.head_removal import head_slots, spread_grad_sums, spread_heads

ATTN_IMPLEMENTATION = "bertscope"

# (layer, row statistics, key_valid (B, L)) -> None
Sink = Callable[[int, RowStats, torch.Tensor], None]


class _Masks:
    """The masks of one forward pass, each read once for all its layers: the (B, L) key_valid
    every layer call gets (the same tensor each time, so what a backend prepares from it can be
    kept), whether its query rows differ (`rows_differ`, which reads the mask on the host) and
    its padding rows (`kernels.common.PaddingRows`). A mask is known by identity: transformers
    builds each of a forward's masks once and hands the same object to every layer.

    padded: whether the batch has padding, as the host knows it (`BatchContext.padded`), or None
    when the caller did not say (padding rows are then always filled: right either way)."""

    def __init__(self, padded: bool | None = None):
        self.padded = padded
        self._read = []  # [mask, rows_differ or None, key_valid, PaddingRows] per mask object seen
        self._ones = {}  # (B, L, device) -> (key_valid, PaddingRows) of a call without a mask

    def _entry(self, attention_mask) -> list:
        for entry in self._read:
            if entry[0] is attention_mask:
                return entry
        entry = [attention_mask, None, None, None]  # the mask is held: its id stays its own
        self._read.append(entry)
        return entry

    def rows_differ(self, attention_mask) -> bool:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
            return False
        entry = self._entry(attention_mask)
        if entry[1] is None:
            entry[1] = rows_differ(attention_mask)
        return entry[1]

    def key_valid(self, attention_mask, query) -> tuple[torch.Tensor, PaddingRows]:
        """(key_valid (B, L) bool, its PaddingRows): read from the mask on its first call."""
        if attention_mask is None or (isinstance(attention_mask, KeyBand) and attention_mask.key_valid is None):
            key = (query.shape[0], query.shape[-2], query.device)
            if key not in self._ones:
                key_valid = key_valid_from_mask(None, query)
                self._ones[key] = key_valid, PaddingRows.of(key_valid, padded=False)
            return self._ones[key]
        entry = self._entry(attention_mask.key_valid if isinstance(attention_mask, KeyBand) else attention_mask)
        if entry[2] is None:
            entry[2] = key_valid_from_mask(attention_mask, query)
            entry[3] = PaddingRows.of(entry[2], padded=self.padded)
        return entry[2], entry[3]


@dataclass
class _Forward:
    """What the attention function needs to know during one forward pass."""

    probe: HeadProbe
    key_class: torch.Tensor  # (B, L) int64
    sink: Sink
    pooling: WordPooling | None = None
    layer: int = 0
    masks: _Masks = field(default_factory=_Masks)
    token_ids: torch.Tensor | None = None  # (B, L) int64, for spec.token_relations


_ACTIVE: contextvars.ContextVar[_Forward | None] = contextvars.ContextVar("bertscope_forward", default=None)


class ValueNorms:
    """Each layer call's per-key value norms n_j = ||f_h(x_j)|| (`kernels.norms`, for `spec.norms`),
    from the value states the attention function receives and the module's output projection, found
    through the families table (`Architecture.output_projection`). Each projection's Gram factors are
    computed once per weight (kept until the weight changes: its storage or version), so a layer call
    costs one (D x D) product per key and head. No modelling code is touched: the attention modules are
    looked up by identity (ALBERT's one shared module has one projection)."""

    def __init__(self, model):
        arch = architecture_of(model.config)
        n_layers = arch.n_layers_heads(model.config)[0]
        self._projection = {id(arch.attention_module(model, layer)): arch.output_projection(model, layer)
                            for layer in range(n_layers)}
        self._factors: dict[int, tuple] = {}  # id(projection) -> (weight key, (H, D, D) factors)

    def __call__(self, module, value: torch.Tensor, n_heads: int) -> torch.Tensor:
        """(B, H, L) float32 for value (B, H_kv, L, D) and the call's n_heads query heads (a pruned
        layer's: its output projection has as many heads' columns)."""
        projection = self._projection.get(id(module))
        if projection is None:
            raise RuntimeError(f"no output projection is known for the attention module {type(module).__name__}")
        weight = output_weight(projection)
        key = (weight.data_ptr(), weight._version, tuple(weight.shape), weight.device, n_heads)
        cached = self._factors.get(id(projection))
        if cached is None or cached[0] != key:
            cached = self._factors[id(projection)] = (key, head_factors(weight, n_heads))
        return value_norms(value, cached[1])


class HeadProbe:
    """Owns what stays fixed across forwards: statistics spec and backend (head gates live on
    the model: `bertscope.models.gates`).

    Layers are numbered by call order within a forward, not read from the module:
    DistilBERT's attention modules carry no `layer_idx`, and ALBERT calls one shared
    module for every layer.

    `model`: needed when spec.norms (the norm-based twins read each layer's output projection:
    `ValueNorms`).
    """

    def __init__(self, n_layers: int, n_heads: int, spec: StatsSpec, backend: str = "auto", device="cpu",
                 model=None):
        self.n_layers, self.n_heads, self.spec = n_layers, n_heads, spec
        self.backend = resolve_backend(backend, torch.device(device))
        refuse_unsupported(spec, self.backend)  # before any forward: the norm-based twins on triton
        self.output_paths: set[str] = set()  # where layer outputs came from (`output_path`), for run.json
        self.value_norms = ValueNorms(model) if spec.norms and model is not None else None

    def norms(self, module, value: torch.Tensor, n_heads: int) -> torch.Tensor | None:
        """The call's per-key value norms (B, H, L) when spec.norms, else None."""
        if not self.spec.norms:
            return None
        if self.value_norms is None:
            raise ValueError("spec.norms needs the model's output projections: HeadProbe(..., model=model)")
        return self.value_norms(module, value, n_heads)

    @contextmanager
    def active(self, key_class: torch.Tensor, sink: Sink, pooling: WordPooling | None = None,
               padded: bool | None = None, token_ids: torch.Tensor | None = None):
        """Run one forward pass of the model inside this block; `pooling` for spec.word_maps,
        `token_ids` (B, L) (the model's input_ids) for spec.token_relations, handed to every layer as
        `key_class` is (the kernels build their operands from them once per batch);
        `padded`: whether the batch has padding, when the caller knows it on the host
        (`BatchContext.padded`): a batch without is then never filled, and nothing is read off
        the device to learn it (None: padding rows are always filled)."""
        fwd = _Forward(self, key_class, sink, pooling, masks=_Masks(padded), token_ids=token_ids)
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
    out = apply_streaming(apply_gates(out, value, key_valid, gates), query, key, value, key_valid, gates, scaling)
    return out.transpose(1, 2).contiguous()


@dataclass(frozen=True)
class KeyBand:
    """What the mask function hands the attention function for a causal or windowed mask, in
    place of transformers' (B, 1, L, L) mask: the padding mask and the band of keys each query
    sees. O(L) memory whatever the length.

    key_valid: (B, L) bool, True for real keys; None when the model was given no padding mask
    layout:    causal and window (`kernels.AttentionLayout`; its key/value heads are the call's)
    """

    key_valid: torch.Tensor | None
    layout: AttentionLayout


def key_valid_from_mask(attention_mask, query) -> torch.Tensor:
    """(B, L) bool, True for real keys, from whatever mask the model handed over.

    A 4-D (B, 1, Lq, Lk) mask must be a padding mask, the same for every query row (the first
    is read): `call_layout` refuses one whose rows differ before this is called."""
    B, _, _, _ = query.shape
    L = query.shape[-2]
    if isinstance(attention_mask, KeyBand):
        attention_mask = attention_mask.key_valid
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
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        return False
    return not bool((attention_mask == attention_mask[:, :, :1, :]).all())


# Arguments of an attention call that do not change what it computes (position ids, cache,
# output and flash-attention switches: transformers' TransformersKwargs pass through every
# layer); `sliding_window` and `is_causal` are checked against the mask.
BENIGN_KWARGS = frozenset({"position_ids", "use_cache", "cache_position", "output_attentions", "output_hidden_states",
                           "output_router_logits", "return_dict", "num_items_in_batch", "deterministic",
                           "encoder_hidden_states", "sliding_window", "is_causal", "layer_idx", "head_mask"})
# Arguments that change the attention, in words (refused when set; any other unknown one too).
UNSUPPORTED_KWARGS = {"softcap": "a logit soft-cap (softcap={})", "s_aux": "an attention-sink logit (s_aux)",
                      "sinks": "an attention-sink logit (sinks)",
                      **{k: f"packed sequences ({k})" for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                                                "max_length_k", "seq_idx")}}


def _model_name(module) -> str:
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    return f"model type {model_type!r}" if model_type else type(module).__name__


def check_kwargs(module, kwargs):
    """A one-line UserError for an argument of the call that changes the attention in a way
    bertscope does not compute (set, i.e. not None): a logit soft-cap, an attention sink, any
    argument it does not know."""
    for name, value in kwargs.items():
        if value is None or value is False or name in BENIGN_KWARGS:
            continue
        what = UNSUPPORTED_KWARGS.get(name, f"an attention argument {name!r} it does not know").format(
            value if not isinstance(value, torch.Tensor) else "a tensor")
        raise UserError(f"{_model_name(module)} passes its attention {what}, which bertscope does not compute")


def call_layout(module, query, key, attention_mask, kwargs, masks: _Masks | None = None) -> AttentionLayout:
    """The `AttentionLayout` of one attention call, or a one-line UserError for a call bertscope
    cannot read as padding + causal / window + grouped-query attention.

    The mask decides, as it does for transformers' sdpa and eager attention: a `KeyBand` (the
    mask function's band), else without a mask the module's (or the call's) `is_causal`; a 2-D
    or padding-only 4-D mask is bidirectional. The call's `sliding_window` must be the mask's
    window counted as flash attention counts it (left extent + 1), `is_causal` the mask's."""
    check_kwargs(module, kwargs)
    declared = kwargs.get("is_causal")
    declared = bool(getattr(module, "is_causal", False) if declared is None else declared)
    window_arg = kwargs.get("sliding_window")
    if isinstance(attention_mask, KeyBand):
        band = attention_mask.layout
        if declared != band.causal:
            raise UserError(f"the attention of {_model_name(module)} says is_causal={declared}, its mask is "
                            f"{band.describe()}: bertscope cannot tell which it computes")
        if (window_arg is None) != (band.window is None) or (
                window_arg is not None and window_arg != band.window[0] + 1):
            raise UserError(f"an attention call of {_model_name(module)} says sliding_window={window_arg}, its mask is "
                            f"{band.describe()}: bertscope cannot tell which it computes")
        causal, window = band.causal, band.window
    elif (rows_differ if masks is None else masks.rows_differ)(attention_mask):
        raise UserError(f"{_model_name(module)} hands its attention a prepared 4-D mask that differs between query "
                        "rows, which bertscope does not read (pass a 2-D attention_mask)")
    else:
        if window_arg is not None:
            raise UserError(f"an attention call of {_model_name(module)} says sliding_window={window_arg} without a "
                            "sliding-window mask, which bertscope does not read")
        causal, window = declared and attention_mask is None, None
    if query.shape[-2] != key.shape[-2] and (causal or window is not None):
        raise UserError(f"{_model_name(module)}: bertscope computes causal and windowed attention over the whole "
                        "input in one pass, not with a cache (generation): load the model with "
                        "attn_implementation='sdpa' to generate")
    kv_heads = key.shape[1] if key.shape[1] != query.shape[1] else None
    if not causal and window is None and kv_heads is None:
        return PLAIN
    return AttentionLayout(causal=causal, window=window, n_key_value_heads=kv_heads)


def bertscope_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """query, key, value: (B, H, L, D). Returns (out (B, L, H, D), None).

    Inside an analysis (`HeadProbe.active`) a layer call reads nothing off the device and makes
    no host-to-device copy: its masks are read once per forward pass (`_Masks`), the statistics
    go to the sink as the backend wrote them."""
    fwd = _ACTIVE.get()
    layout = call_layout(module, query, key, attention_mask, kwargs,  # refuses what would be misread
                         masks=None if fwd is None else fwd.masks)
    if fwd is None:
        key_valid, padding = key_valid_from_mask(attention_mask, query), None  # (B, L)
    else:
        key_valid, padding = fwd.masks.key_valid(attention_mask, query)  # (B, L), read once per forward
    slots = head_slots(module)  # a pruned layer's original head of each head it computes, else None
    gates = layer_gates(query, slots)  # this call's LayerGates from the model's HeadGates, or None
    if fwd is None:
        grads = _GRADS.get()
        if grads is not None:  # -- plain attention, its backward measuring |dL/dP| (GradProbe)
            if not layout.is_plain:
                raise UserError(f"attention gradients cover bidirectional attention with one key/value head per "
                                f"query head only, not the attention of {_model_name(module)} ({layout.describe()})")
            return _grad_attention(grads, query, key, value, key_valid, gates, scaling, dropout, module), None
        # -- plain attention, for a model used outside an analysis
        if layout.is_plain:  # the encoders' path, exactly as before
            return gated_sdpa(query, key, value, key_valid, gates, scaling, dropout), None
        return gated_sdpa(query, key, value, key_valid, gates, scaling, dropout, layout=layout), None
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
    norms = probe.norms(module, value, query.shape[1])  # (B, H, L), spec.norms only
    with known_padding(padding):
        out, stats = attention_stats(
            query, key, value, key_valid, fwd.key_class, probe.spec,
            gates=gates, scale=scaling, backend=probe.backend, pooling=fwd.pooling, layout=layout,
            token_ids=fwd.token_ids, norms=norms,
        )
    if slots is not None:  # statistics back in the original head slots, pruned heads missing (NaN)
        stats = spread_heads(stats, slots, probe.n_heads)
    fwd.sink(layer, stats, key_valid)
    return out, None


def key_padding_mask(batch_size, q_length=None, kv_length=None, q_offset=0, kv_offset=0, mask_function=None,
                     attention_mask=None, cache_position=None, **kwargs):
    """The mask interface's answer for our implementation, never an L x L tensor: for an encoder's
    bidirectional mask the (B, L) padding mask as it is; for a causal or sliding-window mask a
    `KeyBand` (the padding mask and the band, read off `mask_function`). Anything else, or a
    cache offset (generation), is a one-line UserError.

    The queries are (q_length, q_offset) from transformers 5.x's later releases, `cache_position`
    (the queries' positions) in the first ones (5.0: tools/releases.py oldest found it)."""
    if q_length is None and cache_position is not None:
        q_length = cache_position.shape[0]
        q_offset = int(cache_position[0]) if q_length else 0
    if mask_function is None or mask_function is bidirectional_mask_function:
        return attention_mask
    config = kwargs.get("config")
    name = f"model type {config.model_type!r}" if getattr(config, "model_type", None) else "the model"
    if q_offset or kv_offset or q_length != kv_length:
        raise UserError(f"{name}: bertscope computes causal and windowed attention over the whole input in one "
                        "pass, not with a cache (generation): load the model with attn_implementation='sdpa' "
                        "to generate")
    layout = read_band(mask_function, kv_length)
    if layout is None:
        raise UserError(f"{name} masks its attention with {describe_mask_function(mask_function)}, which bertscope "
                        "does not read (it reads padding, causal and sliding-window masks)")
    check_band(mask_function, layout, batch_size, kv_length, kwargs.get("device", "cpu"), name)
    key_valid = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if key_valid is not None:
        key_valid = key_valid[:, :kv_length].bool()
    return KeyBand(key_valid, layout)


# transformers' mask parts, by the name of the function that makes them (masking_utils)
_OVERLAYS = {"sliding_window_overlay": "causal", "sliding_window_bidirectional_overlay": "bidirectional"}


def _closure(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in (fn.__closure__ or ()))))


def _band_parts(fn) -> tuple[bool, int | None, int | None] | None:
    """(causal, left, right) of a mask function built from transformers' parts (None: no limit),
    or None for anything else. Parts: causal_mask_function, bidirectional_mask_function, the two
    sliding-window overlays and and_masks of them (their intersection)."""
    if fn is causal_mask_function:
        return True, None, 0
    if fn is bidirectional_mask_function:
        return False, None, None
    module, qualname = getattr(fn, "__module__", ""), getattr(fn, "__qualname__", "")
    if module != causal_mask_function.__module__:
        return None
    maker = qualname.split(".<locals>.")[0]
    if maker in _OVERLAYS and isinstance(_closure(fn).get("sliding_window"), numbers.Integral):
        w = int(_closure(fn)["sliding_window"])
        # sliding_window_overlay: kv > q - w; the bidirectional one: |q - kv| <= w
        return (False, w - 1, None) if _OVERLAYS[maker] == "causal" else (False, w, w)
    if maker == "and_masks":
        parts = [_band_parts(f) for f in _closure(fn).get("mask_functions", ())]
        if not parts or any(p is None for p in parts):
            return None
        tighter = lambda a, b: b if a is None else a if b is None else min(a, b)  # noqa: E731
        causal, left, right = False, None, None
        for c, lo, hi in parts:
            causal, left, right = causal or c, tighter(left, lo), tighter(right, hi)
        return causal, left, right
    return None


def read_band(mask_function, length: int) -> AttentionLayout | None:
    """The causal / window layout `mask_function` means for sequences of `length`, or None when it
    is not made of transformers' padding, causal and sliding-window parts."""
    parts = _band_parts(mask_function)
    if parts is None:
        return None
    causal, left, right = parts
    if causal:
        right = None  # a causal query sees nothing after itself, whatever else limits it
    if left is None and right is None:
        return AttentionLayout(causal=causal)
    window = (length if left is None else max(left, 0), 0 if causal else length if right is None else max(right, 0))
    return AttentionLayout(causal=causal, window=window)


def probe_rows(length: int, layout: AttentionLayout) -> torch.Tensor:
    """The query rows `check_band` tries: the ends, the middle, both sides of each band edge, a few
    spread between (O(1) rows, each O(L) keys)."""
    left, right = layout.reach
    edges = [0, 1, 2, length // 2, length - 3, length - 2, length - 1]
    for e in (left, right):
        if e is not None:
            edges += [e - 1, e, e + 1, length - 1 - e, length - e]
    edges += [round(i * (length - 1) / 15) for i in range(16)]
    return torch.tensor(sorted({r for r in edges if 0 <= r < length}), dtype=torch.long)


def check_band(mask_function, layout: AttentionLayout, batch_size: int, length: int, device, name: str):
    """Evaluate `mask_function` on a few query rows (all keys, every sequence) and compare it with
    the band `read_band` read: a one-line UserError when they differ (a mask part that changed
    meaning). O(rows x L), never L x L."""
    rows = probe_rows(length, layout).to(device)
    b = torch.arange(batch_size, device=device)[:, None, None, None]
    h = torch.zeros(1, dtype=torch.long, device=device)[None, :, None, None]
    kv = torch.arange(length, device=device)
    got = mask_function(b, h, rows[None, None, :, None], kv[None, None, None, :])  # (B|1, 1, R, L)
    lo, hi = layout.key_band(rows, length)
    want = (kv[None, :] >= lo[:, None]) & (kv[None, :] <= hi[:, None])  # (R, L)
    if not bool((torch.as_tensor(got, device=device).bool() == want).all()):
        raise UserError(f"{name} masks its attention with {describe_mask_function(mask_function)}, which does not "
                        f"keep to the band bertscope read from it ({layout.describe()}); bertscope does not analyse it")


def describe_mask_function(fn) -> str:
    """A mask function in words, for messages: its parts' names."""
    names = []

    def walk(f):
        qualname = getattr(f, "__qualname__", type(f).__name__)
        maker = qualname.split(".<locals>.")[0]
        parts = _closure(f).get("mask_functions") if hasattr(f, "__code__") else None
        names.append(maker)
        for part in parts or ():
            walk(part)
    walk(fn)
    return "a mask made of " + ", ".join(dict.fromkeys(names))


AttentionInterface.register(ATTN_IMPLEMENTATION, bertscope_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, key_padding_mask)
