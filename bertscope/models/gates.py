"""Head gates that live on a loaded model and work on any forward pass of it.

Michel et al. (2019) write a layer's output as sum_h xi_h W_o^h Att_h(x), with one mask
variable xi_h per head; I_h = E |dL/d xi_h| at xi = 1 is their head importance. Kovaleva
et al. (2019) "disable" a head by giving it uniform attention over the valid keys.
`HeadGates` holds both for every layer:

    xi       (layers, H) float, or (B, layers, H) for one gate per sequence; 1 = as trained.
             Set it to a tensor that requires grad and d loss / d xi comes out of backward().
    uniform  (layers, H) bool, or (B, layers, H) for one choice per sequence; a uniform head's
             output (the mean of V) is still scaled by xi. Per-sequence xi and uniform let one
             batch hold several variants of the model (`bertscope.analyses.heads.variants`): each sequence gated
             its own way, no model copies.
    streaming (layers, H) bool, with `streaming_span` (sink, recent): heads restricted to
             StreamingLLM's attention sink + recent window (DuoAttention's streaming heads); such
             a head's output is its attention over the first `sink` and the last `recent` keys
             only (`bertscope.kernels.streaming`), still scaled by xi.

`attach_gates(model)` hangs one on the model's encoder (`model.base_model`, so a task head
around it changes nothing) with a forward pre-hook that starts each forward at layer 0 and
a forward hook that ends it. Layers are numbered by call order, not read from the module:
DistilBERT's attention modules carry no `layer_idx`, and ALBERT calls one shared module for
every layer. `bertscope.models.attention` asks `layer_gates()` for the gates of each call, on the
plain path and inside an analysis alike. transformers' own code is never touched.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

import torch

from bertscope.kernels.spec import Gate, LayerGates

_CURRENT: contextvars.ContextVar[_GateForward | None] = contextvars.ContextVar("bertscope_gates", default=None)


class HeadGates:
    """The head gates of one encoder: see the module docstring."""

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads
        self._xi = torch.ones(n_layers, n_heads)
        self._uniform = torch.zeros(n_layers, n_heads, dtype=torch.bool)
        self._streaming = torch.zeros(n_layers, n_heads, dtype=torch.bool)
        self.streaming_span: tuple = ()  # (sink, recent) of the streaming heads
        self._checked = None  # (tensors, versions) last validated; in-place edits bump _version
        self._tokens = []  # contextvar tokens of the forwards in flight (nested calls)
        # per-sequence gates may hold more rows than a layer's batch, the layer taking the first
        # ones: for forwards whose rows change between layers (`bertscope.analyses.heads.variants` shares prefixes)
        self.prefix_rows = False

    # -- the two tensors; a setter checks what it is given, forward() checks in-place edits

    @property
    def xi(self) -> torch.Tensor:
        return self._xi

    @xi.setter
    def xi(self, value: torch.Tensor):
        self._check_xi(value)
        self._xi = value  # kept as given: a leaf that requires grad collects .grad here
        self._checked = None

    @property
    def uniform(self) -> torch.Tensor:
        return self._uniform

    @uniform.setter
    def uniform(self, value: torch.Tensor):
        self._check_uniform(value)
        self._uniform = value
        self._checked = None

    @property
    def streaming(self) -> torch.Tensor:
        return self._streaming

    @streaming.setter
    def streaming(self, value: torch.Tensor):
        if not isinstance(value, torch.Tensor) or value.dtype != torch.bool or \
                tuple(value.shape) != (self.n_layers, self.n_heads):
            got = f"{getattr(value, 'dtype', type(value).__name__)} {tuple(getattr(value, 'shape', ()))}"
            raise ValueError(f"gates.streaming must be a bool tensor of shape ({self.n_layers}, {self.n_heads}) "
                             f"(layers, heads), not {got}")
        self._streaming = value
        self._checked = None

    def set_streaming(self, heads, sink: int, recent: int):
        """Make `heads` streaming (a (layers, H) bool tensor, or (layer, head) pairs), every other head
        full, with the span (sink, recent)."""
        from bertscope.kernels.streaming import check_span

        span = check_span((sink, recent))
        if not isinstance(heads, torch.Tensor):
            mask = torch.zeros(self.n_layers, self.n_heads, dtype=torch.bool)
            for layer, head in heads:
                mask[layer, head] = True
            heads = mask
        self.streaming = heads
        self.streaming_span = span

    def reset(self):
        """Every head as trained: xi = 1 (a fresh tensor, not requiring grad), none uniform or streaming."""
        self.xi = torch.ones(self.n_layers, self.n_heads)
        self.uniform = torch.zeros(self.n_layers, self.n_heads, dtype=torch.bool)
        self.streaming = torch.zeros(self.n_layers, self.n_heads, dtype=torch.bool)

    def set(self, layer: int, head: int, gate: Gate):
        """One head to a `Gate` shorthand: KEEP (xi 1), ZERO (xi 0), UNIFORM (uniform, xi 1)."""
        gate = Gate(gate)
        with torch.no_grad():
            self._xi[..., layer, head] = 0.0 if gate == Gate.ZERO else 1.0
            self._uniform[..., layer, head] = gate == Gate.UNIFORM

    def requires_grad_(self, flag: bool = True) -> torch.Tensor:
        """Make xi a leaf that requires grad (detached from any earlier graph); returns it."""
        self.xi = self._xi.detach().clone().requires_grad_(flag)
        return self._xi

    # -- checks

    def _check_xi(self, xi):
        if not isinstance(xi, torch.Tensor) or not xi.is_floating_point():
            raise ValueError(f"gates.xi must be a float tensor, not {getattr(xi, 'dtype', type(xi).__name__)}")
        shape = (self.n_layers, self.n_heads)
        if tuple(xi.shape) != shape and not (xi.dim() == 3 and tuple(xi.shape[1:]) == shape):
            raise ValueError(f"gates.xi must have shape {shape} (layers, heads) or (batch, {shape[0]}, {shape[1]}), "
                             f"not {tuple(xi.shape)}")
        if bool(torch.isnan(xi.detach()).any()):
            raise ValueError("gates.xi holds NaN")

    def _check_uniform(self, uniform):
        shape = (self.n_layers, self.n_heads)
        fits = isinstance(uniform, torch.Tensor) and (tuple(uniform.shape) == shape or (
            uniform.dim() == 3 and tuple(uniform.shape[1:]) == shape))
        if not fits or uniform.dtype != torch.bool:
            got = f"{getattr(uniform, 'dtype', type(uniform).__name__)} {tuple(getattr(uniform, 'shape', ()))}"
            raise ValueError(f"gates.uniform must be a bool tensor of shape {shape} (layers, heads) or "
                             f"(batch, {shape[0]}, {shape[1]}), not {got}")

    def _check(self) -> tuple[bool, bool]:
        """(xi is all ones, some head is uniform), validated once per change of the tensors
        (in-place edits bump their _version), not once per forward: on a GPU each check
        synchronises."""
        key = (id(self._xi), self._xi._version, id(self._uniform), self._uniform._version, id(self._streaming),
               self._streaming._version)
        if self._checked is None or self._checked[0] != key:
            self._check_xi(self._xi)
            self._check_uniform(self._uniform)
            self._checked = (key, bool((self._xi == 1).all()), bool(self._uniform.any()), bool(self._streaming.any()))
        return self._checked[1:3]

    def _any_streaming(self) -> bool:
        self._check()
        return self._checked[3]

    # -- the forward hooks

    def _enter(self, module, args):
        ones, any_uniform = self._check()
        identity_xi = ones and not self._xi.requires_grad  # xi = 1 that requires grad still multiplies
        if not (identity_xi and not any_uniform) and module.training and _checkpointing(module):
            # the layers would be re-run during backward, after this forward's gates are gone
            raise RuntimeError("bertscope's head gates do not work with activation (gradient) checkpointing "
                               "(model.activation_checkpointing_disable(), or reset the gates)")
        state = _GateForward(self, xi=None if identity_xi else self._xi, uniform=self._uniform if any_uniform else None,
                             streaming=self._streaming if self._any_streaming() else None)
        self._tokens.append(_CURRENT.set(state))

    def _exit(self, module, args, output):
        if self._tokens:  # empty when _enter itself raised
            _CURRENT.reset(self._tokens.pop())


@dataclass
class _GateForward:
    """One forward pass: which layer comes next, and the gates on the device (moved once)."""

    gates: HeadGates
    xi: torch.Tensor | None
    uniform: torch.Tensor | None
    streaming: torch.Tensor | None = None
    layer: int = 0
    moved: dict = field(default_factory=dict)

    def next_layer(self, query, slots=None) -> LayerGates | None:
        layer = self.layer
        if layer >= self.gates.n_layers:
            raise RuntimeError(f"expected {self.gates.n_layers} attention calls in a forward pass, saw more")
        self.layer += 1
        B, H = query.shape[0], query.shape[1]
        if slots is None and H != self.gates.n_heads:
            raise ValueError(f"the gates have {self.gates.n_heads} heads per layer, the model {H}")
        if slots is not None and (len(slots) != H or max(slots) >= self.gates.n_heads):
            raise ValueError(f"the gates have {self.gates.n_heads} heads per layer, the pruned layer {layer} "
                             f"computes {H} of them: heads {list(slots)}")
        for name in ("xi", "uniform"):
            t = getattr(self.gates, name)
            if t.dim() == 3 and t.shape[0] != B and not (self.gates.prefix_rows and t.shape[0] > B):
                raise ValueError(f"gates.{name} holds {t.shape[0]} sequences, the batch {B}")
        if self.xi is None and self.uniform is None and self.streaming is None:
            return None
        xi = None if self.xi is None else self._layer(query.device, "xi", self.xi, layer, B, slots)
        uniform = None if self.uniform is None else self._layer(query.device, "uniform", self.uniform, layer, B, slots)
        streaming = None if self.streaming is None or not bool(self.streaming[layer].any()) else \
            self._layer(query.device, "streaming", self.streaming, layer, B, slots)  # (host tensor: no sync)
        if xi is None and uniform is None and streaming is None:
            return None
        if streaming is not None:
            return LayerGates(xi=xi, uniform=uniform, streaming=streaming, streaming_span=self.gates.streaming_span)
        return LayerGates(xi=xi, uniform=uniform)

    def _layer(self, device, name, t, layer, B, slots=None):
        """(H,) or (B, H): one layer's gates, per sequence the batch's first B rows. A pruned
        layer (`bertscope.models.head_removal`) gets the gates of the heads it kept, in its order; an empty
        layer's placeholder head (slot -1, output identically 0) any gate: slot 0's."""
        t = self._on(device, name, t)[..., layer, :]  # (H,) or (rows, H)
        if slots is not None:
            t = t[..., self._slots(device, slots)]  # (H_kept,) or (rows, H_kept)
        return t if t.dim() == 1 else t[:B]

    def _slots(self, device, slots):
        key = ("slots", slots)
        if key not in self.moved:
            self.moved[key] = torch.tensor(slots, device=device).clamp_min(0)
        return self.moved[key]

    def _on(self, device, name, t):
        if name not in self.moved:
            self.moved[name] = t.to(device)  # differentiable: grad flows back to a CPU leaf
        return self.moved[name]


def _checkpointing(module) -> bool:
    """Whether transformers will re-run the layers in backward (named `is_activation_checkpointing`
    from transformers 5, `is_gradient_checkpointing` before)."""
    name = "is_activation_checkpointing" if hasattr(type(module), "is_activation_checkpointing") else \
        "is_gradient_checkpointing"
    return bool(getattr(module, name, False))


def layer_gates(query, slots=None) -> LayerGates | None:
    """The gates of this attention call (advancing to the next layer), or None when the model
    has no gates attached or every head is as trained. `slots`: the original head of each of
    a pruned layer's heads (`bertscope.models.head_removal.head_slots`), None for an unpruned layer."""
    state = _CURRENT.get()
    return None if state is None else state.next_layer(query, slots)


def attach_gates(model: torch.nn.Module, n_layers: int, n_heads: int) -> HeadGates:
    """The model's `HeadGates`, created and hooked on its encoder the first time."""
    encoder = getattr(model, "base_model", model)
    gates = getattr(encoder, "_bertscope_gates", None)
    if gates is None:
        gates = HeadGates(n_layers, n_heads)
        encoder.register_forward_pre_hook(gates._enter)
        encoder.register_forward_hook(gates._exit, always_call=True)
        encoder._bertscope_gates = gates
    return gates
