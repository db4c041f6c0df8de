"""The host side of the fused forward: operands, outputs and the one launch of `attn_stats_fwd`.

A layer call must cost the GPU nothing but the kernel: no host-device copy, no `.item()`,
`.all()`, `.cpu()` or `.tolist()` (each one a device sync), nothing that a CUDA graph could not
capture. So:

- what is the same for every layer of a batch (the key mask as int8, the sequences' valid key
  ranges, the one-hot key-feature matrix) is built once per batch, from the batch's own
  `key_valid` / `key_class` tensors, on the device, and kept while the engine hands the same
  tensors to the next layer (`OperandCache`); so are the token ids the token relations compare
  (int32, -1 on padding), from the batch's `token_ids`;
- the offsets are a device tensor cached per (offsets, device); xi head gates are read in place
  (a per-head xi has batch stride 0); uniform heads' rows are written after the launch, from running
  sums of V on the device (`uniform_rows`: no map, no second pass in the kernel);
- the outputs are two allocations: the attention output, and one fp32 buffer holding every
  statistic (lse included) as contiguous views, written by the kernel in fp32 (plus an int64
  one when the argmax is asked).

The statistics the kernel writes are read off the table (`kernel_outputs`): a statistic of
`spec.ROW_STATS` with kernel traits (`spec.KernelTraits`) has its output pointer in the kernel's
`Stats` tuple, at the index named after it (entropy -> Entropy), and, when its traits name one, its
constexpr switch in the kernel's `STATS` tuple, at the index named by the switch (ENTROPY); both in
the table's order. The kernel's other tuple arguments are packed from named elements
(`kernel_arguments`, `triton_kernel.ARGUMENT_TUPLES`).
"""
from __future__ import annotations

import ast
import functools
import inspect
import operator
import textwrap
from dataclasses import dataclass

import torch
import triton

from . import triton_maps
from .gates import uniform_output
from .precision import TF32, fp32_dot_precision
from .spec import FIXED_WIDTHS, ROW_STATS, AttentionLayout, StatsSpec, asked_stats, padded_ids
from .triton_config import device_arch, feature_width, kernel_config
from .triton_kernel import ARGUMENT_TUPLES, INTERPRETED, attn_stats_fwd
from .triton_tiles import DTYPES, launch_caps


def output_argument(stat) -> str:
    """The name of a statistic's output in the kernel, its name in CamelCase (entropy -> Entropy,
    offset_mass -> OffsetMass): the index of its pointer in the kernel's `Stats` tuple."""
    return "".join(w.capitalize() for w in stat.name.split("_"))


@functools.cache
def kernel_outputs() -> tuple:
    """(RowStat, output name, constexpr switch or None) for each statistic of the table the fused
    kernel writes: those with kernel traits (`RowStat.kernel`), in the table's order, which is the order
    of the kernel's `Stats` tuple of output pointers; the output name (`output_argument`) is the kernel
    module's index of its pointer there, the switch (as the traits name it) the index of its switch in the
    kernel's `STATS` tuple (`kernel_switches_order`). The launcher, the check before a launch
    (`check_computed`) and `triton_aot` all read this.

    An entry whose traits name an index the kernel's module lacks (or holds at another place than the
    table's order gives it), or an output the kernel's body never reads (an output declared and forgotten),
    is a NotImplementedError here, before any launch: its tensor would come back as whatever memory it was
    given."""
    found = [(stat, output_argument(stat), stat.kernel.switch) for stat in ROW_STATS if stat.kernel is not None]
    switches = list(dict.fromkeys(flag for _, _, flag in found if flag is not None))
    places = {arg: i for i, (_, arg, _) in enumerate(found)} | {flag: i for i, flag in enumerate(switches)}
    index = _indices(attn_stats_fwd)
    missing = [f"{stat.name} ({name})" for stat, arg, flag in found for name in (arg, flag)
               if name is not None and name not in index]
    moved = [f"{stat.name} ({name} = {index[name]}, not {places[name]})" for stat, arg, flag in found
             for name in (arg, flag) if name in index and index[name] != places[name]]
    used = _names_used(attn_stats_fwd)
    unused = [f"{stat.name} ({arg})" for stat, arg, _ in found if arg in index and arg not in used]
    if missing or moved or unused:
        raise NotImplementedError(
            "the triton kernel attn_stats_fwd " + "; ".join(
                ([f"lacks {', '.join(missing)}, named by the table's kernel traits"] if missing else [])
                + ([f"reads {', '.join(moved)}: out of the table's order"] if moved else [])
                + ([f"takes {', '.join(unused)} but never writes it"] if unused else []))
            + " (see docs/contributing.md)")
    return tuple(found)


def kernel_switches_order() -> tuple[str, ...]:
    """The kernel's `STATS` tuple, by name: each distinct switch of `kernel_outputs`, in the table's order."""
    return tuple(dict.fromkeys(flag for _, _, flag in kernel_outputs() if flag is not None))


def argument_paths() -> dict[str, tuple[int, ...]]:
    """Where each named value of a launch sits in `attn_stats_fwd`'s arguments: (i,) argument i itself,
    (i, j) element j of tuple argument i: the elements of `triton_kernel.ARGUMENT_TUPLES`, `Stats`' by
    output name and `STATS`' by switch name (`kernel_outputs`, `kernel_switches_order`). The paths are
    those Triton keys a tuple element's specialisation by (a constant, a divisibility hint)."""
    paths = {}
    for i, (name, elements) in enumerate(_packing(*_packing_key())):
        paths.update({name: (i,)} if elements is None else {e: (i, j) for j, e in enumerate(elements)})
    return paths


def kernel_arguments(named: dict) -> dict:
    """The arguments of `attn_stats_fwd`, by name, from named values (`argument_paths`: each tuple
    argument packed from its elements, the statistics' outputs by output name, their switches by name).
    `triton_aot` packs a compile's signature and constants the same way."""
    key = _packing_key()
    return {name: get(named) for name, get in zip(key[0], _getters(*key))}


def _packing_key() -> tuple:
    """(the kernel's argument names, (output name, switch) of each of `kernel_outputs`): what the packing
    depends on, as strings (cheap to hash at every launch, where the table's entries are not)."""
    return tuple(attn_stats_fwd.arg_names), tuple((arg, flag) for _, arg, flag in kernel_outputs())


@functools.cache
def _packing(names: tuple, outputs: tuple) -> tuple:
    """(argument, its elements' names or None) for each argument of the kernel (`names`), its statistics'
    (output name, switch) being `outputs` (`_packing_key`): worked out once, not at every launch."""
    switches = tuple(dict.fromkeys(flag for _, flag in outputs if flag is not None))
    elements = {**ARGUMENT_TUPLES, "Stats": tuple(arg for arg, _ in outputs), "STATS": switches}
    return tuple((name, elements.get(name)) for name in names)


@functools.cache
def _getters(names: tuple, outputs: tuple) -> tuple:
    """For each argument of `_packing`, a function of the named values that gives it (an itemgetter: the
    launch's packing costs about what passing the same values as keywords does)."""
    def tuple_of(elements):
        get = operator.itemgetter(*elements)
        return get if len(elements) > 1 else lambda named: (get(named),)
    return tuple(operator.itemgetter(name) if elements is None else tuple_of(elements)
                 for name, elements in _packing(names, outputs))


def _indices(kernel) -> dict[str, int]:
    """The integer constexprs of the module of a @triton.jit kernel (compiled or interpreted): the indices
    into its tuples it reads, by name."""
    return {name: value.value for name, value in kernel.fn.__globals__.items()
            if isinstance(value, triton.language.constexpr) and type(value.value) is int}


def _names_used(kernel) -> set[str]:
    """The names the body of a @triton.jit kernel reads (its source, compiled or interpreted)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn)))
    body = tree.body[0].body
    return {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}


# -- operands built once per batch ------------------------------------------------------------------


@dataclass
class KeyOperands:
    """The kernel's per-key operands of one batch, on its device.

    valid:    (B, L) int8, 0 for padding keys (a view of a bool mask: no copy)
    ranges:   (B, 2) int32, each sequence's valid keys [lo, hi) when they are one contiguous run
              (left or right padding), else (0, 0): the kernel's unmasked stage lies inside it
    features: (B, L, F) in the inputs' dtype (F = `feature_width`): the one-hot key classes, and with
              `ones` a last column of ones (SUMS_BY_DOT: the softmax's row sum as a column of P U)
    """

    valid: torch.Tensor
    ranges: torch.Tensor
    features: torch.Tensor


def key_ranges(valid: torch.Tensor) -> torch.Tensor:
    """(B, 2) int32: [first valid key, last valid key + 1) of each sequence when its valid keys are
    contiguous, else (0, 0). Computed on the device (argmax finds the first True), no sync."""
    B, L = valid.shape
    v = valid.to(torch.int32)
    lo = v.argmax(-1)  # first valid key (0 when there is none)
    hi = L - v.flip(-1).argmax(-1)  # one past the last one (L when there is none)
    contiguous = (hi - lo) == v.sum(-1)  # no hole between them (false when there is no valid key)
    return torch.where(contiguous[:, None], torch.stack([lo, hi], -1), 0).to(torch.int32)


class OperandCache:
    """The last batch's `KeyOperands`, kept while the engine hands every layer the same
    `key_valid` and `key_class` tensors (compared by identity: a new batch is new tensors). A
    call with other tensors rebuilds them: correct, a few more device ops."""

    def __init__(self):
        self._key = None
        self._operands = None
        self._offsets = {}
        self._ids = (None, None, None)  # (token_ids, key_valid, (B, L) int32 ids): the last batch's

    def keys(self, key_valid, key_class, n_classes: int, dtype, dev, ones: bool = False,
             positions: bool = False) -> KeyOperands:
        key = (key_valid, key_class, n_classes, dtype, dev, ones, positions)
        old = self._key
        if old is not None and old[0] is key_valid and old[1] is key_class and old[2:] == key[2:]:
            return self._operands
        valid = key_valid.to(dev)
        valid = valid.view(torch.int8) if valid.dtype == torch.bool else (valid != 0).view(torch.int8)
        width = feature_width(n_classes)
        feats = torch.nn.functional.one_hot(key_class.to(dev, torch.long), width).to(dtype)  # (B, L, F)
        if ones:  # the config put SUMS_BY_DOT on only where this column is free (n_classes < F)
            feats[..., width - 1] = 1
        if positions:  # the key positions j = 256 hi + lo (exact in bf16): MEAN_BY_DOT (`triton_config.mean_by_dot`)
            j = torch.arange(feats.shape[1], device=dev)
            feats[..., width - 2] = (j % 256).to(dtype)
            feats[..., width - 3] = (j // 256).to(dtype)
        self._key, self._operands = key, KeyOperands(valid, key_ranges(valid), feats)
        return self._operands

    def token_ids(self, token_ids, key_valid, dev) -> torch.Tensor:
        """(B, L) int32 contiguous on `dev`: the batch's token ids, -1 on padding (`spec.padded_ids`),
        made once per batch (the same `token_ids` and `key_valid` tensors)."""
        if token_ids is None:
            raise ValueError("spec.token_relations needs the batch's token ids (token_ids=...)")
        old_ids, old_valid, ids = self._ids
        if old_ids is not token_ids or old_valid is not key_valid:
            ids = padded_ids(token_ids.to(dev), key_valid.to(dev)).to(torch.int32).contiguous()
            self._ids = (token_ids, key_valid, ids)
        return ids

    def offsets(self, offsets: tuple, dev) -> torch.Tensor:
        """The offsets as an int32 device tensor, made once per (offsets, device)."""
        key = (offsets, str(dev))
        if key not in self._offsets:
            self._offsets[key] = torch.tensor(offsets or (0,), dtype=torch.int32, device=dev)
        return self._offsets[key]


CACHE = OperandCache()
# a per-head xi of ones for calls without gates, per (H, device)
_ONES: dict = {}


def gate_operands(gates, H: int, dev) -> tuple[torch.Tensor, int]:
    """(xi, its batch stride): read in place, a (H,) gate with batch stride 0; fp32 xi on the device costs no
    op. A head's uniform gate is not the kernel's (`uniform_rows`)."""
    xi = None if gates is None else gates.xi
    if xi is None:
        key = (H, str(dev))
        if key not in _ONES:
            _ONES[key] = torch.ones(H, dtype=torch.float32, device=dev)
        xi = _ONES[key]
    if xi.requires_grad:
        xi = xi.detach()
    if xi.device != dev or xi.dtype != torch.float32:
        xi = xi.to(dev, torch.float32)
    if xi.stride(-1) != 1:
        raise ValueError("head gates must be contiguous in the head dimension")
    return xi, 0 if xi.dim() == 1 else xi.stride(0)


def uniform_rows(out, v, key_valid, gates, layout: AttentionLayout):
    """Write the uniform heads' rows of the kernel's output out (B, L, H, D) in place: xi times the mean of V over
    the keys each row sees, as `gates.apply_gates` gives every other backend. Uniform attention is no attention:
    its output is a plain (plain layout) or running (banded) sum of V, O(L D) on the device (`uniform_output`),
    so the kernel carries no second pass over the keys for it, nor that pass's registers. v (B, H_kv, L, D);
    gates.uniform (H,) or (B, H) bool."""
    o = out.transpose(1, 2)  # (B, H, L, D) view
    H = o.shape[1]
    per_head = lambda t: t[None, :, None, None] if t.dim() == 1 else t[:, :, None, None]  # noqa: E731 (1|B, H, 1, 1)
    mean_v = uniform_output(v, key_valid, layout).to(out.dtype)  # (B, H_kv, 1 or L, D)
    mean_v = mean_v.repeat_interleave(H // v.shape[1], dim=1)  # (B, H, 1 or L, D)
    if gates.xi is not None:
        mean_v = mean_v * per_head(gates.xi.detach().to(out.device, out.dtype))
    o.copy_(torch.where(per_head(gates.uniform.to(out.device)), mean_v, o))


# -- outputs ------------------------------------------------------------------------------------


def allocate_outputs(spec: StatsSpec, dims: dict, dev, need_lse: bool = True) -> tuple[dict, dict, torch.Tensor, int]:
    """(pointer arguments, constexpr switches, lse, the buffer's row stride) of a launch. One fp32
    buffer (B, H, L, F) holds every float statistic the kernel writes that `spec` asks for, each a
    view of its columns (a per-row value a (B, H, L) view, a width one (B, H, L, width)), each view
    starting on a 16-byte boundary; an int64 statistic (the argmax) gets its own tensor; a statistic
    not asked for gets lse as a placeholder pointer the kernel never writes. lse (B, H, L) fp32 is a
    fresh tensor when a pass after the kernel reads it (`need_lse`), else a scratch buffer kept per
    shape and device. So a call allocates the output, this buffer, and the argmax when asked. Under
    the interpreter the buffers start as NaN (-2 for an index), so a value the kernel skips fails
    every comparison with eager; compiled, they are left uninitialised."""
    dims = {**FIXED_WIDTHS, **dims}
    make = torch.full if INTERPRETED else (lambda size, fill, **kw: torch.empty(size, **kw))
    B, H, L = dims["B"], dims["H"], dims["L"]
    if need_lse:
        lse = make((B, H, L), float("nan"), dtype=torch.float32, device=dev)
    else:
        key = ((B, H, L), str(dev))
        if key not in _SCRATCH:
            _SCRATCH.clear()  # one shape at a time: the engine's batches share theirs
            _SCRATCH[key] = torch.empty(B, H, L, dtype=torch.float32, device=dev)
        lse = _SCRATCH[key]
    outputs, flags, columns, width = {}, {}, {}, 0
    for stat, arg, flag in kernel_outputs():
        on = stat.asked(spec)
        if flag is not None:
            flags[flag] = on
        if not on:
            outputs[arg] = lse
            continue
        unknown = [d for d in stat.shape if d not in dims]
        if unknown:
            raise NotImplementedError(f"{stat.name} has dimension {', '.join(unknown)}, which the triton launcher "
                                      f"does not size (it knows {', '.join(dims)})")
        if stat.dtype == "int64":
            outputs[arg] = make([dims[d] for d in stat.shape], -2, dtype=torch.int64, device=dev)
            continue
        trailing = [dims[d] for d in stat.shape[3:]]  # () or (width,)
        columns[arg] = (width, trailing)
        width += -(-max([1, *trailing]) // ALIGN) * ALIGN
    if columns:
        buf = make((B, H, L, width), float("nan"), dtype=torch.float32, device=dev)
        for arg, (at, trailing) in columns.items():
            outputs[arg] = buf[..., at:at + trailing[0]] if trailing else buf[..., at]
    return outputs, flags, lse, max(width, 1)


# each statistic's columns in the buffer start at a multiple of this many floats (16 bytes)
ALIGN = 4
# the lse of launches whose lse nobody reads, per (shape, device)
_SCRATCH: dict = {}


# -- the launch -----------------------------------------------------------------------------------


def norm_widths(n_classes: int, G: int) -> tuple[int, int]:
    """(NORM_W, NORM_F) of the norm features (`norm_features`): each query head's columns, its key classes and
    its norm, padded to a power of two; and the whole width, the G heads' groups side by side padded to a power
    of two >= 16 (tl.dot's smallest N)."""
    w = triton.next_power_of_2(n_classes + 1)
    return w, max(16, triton.next_power_of_2(G) * w)


def norm_features(norms, key_valid, key_class, n_classes: int, G: int, dtype) -> torch.Tensor:
    """(B, H_kv, L, NORM_F) contiguous in `dtype`: the norm-based twins' key features (Kobayashi et al. 2020),
    the one-hot key classes times each key's value norm n_j = ||f_h(x_j)|| and, as each head's last column
    (NORM_W - 1), n_j itself; the G query heads that share a key/value head side by side, head g's columns
    g NORM_W .. g NORM_W + NORM_W - 1 (`norm_widths`), so that one dot P @ U n gives every stacked row its own
    head's sums. Padding keys count 0, whatever their norm (as eager's `spec.norm_weights`). Built per layer
    call on the device: n changes with the layer. norms: (B, H, L) (`kernels.norms.value_norms`)."""
    if norms is None:
        raise ValueError("spec.norms needs the per-key value norms (norms=...)")
    B, H, L = norms.shape
    dev = norms.device
    w, width = norm_widths(n_classes, G)
    n = torch.where(key_valid.to(dev, torch.bool)[:, None, :], norms.float(), 0.0)  # (B, H, L)
    one_hot = torch.nn.functional.one_hot(key_class.to(dev, torch.long), w).float()  # (B, L, w)
    one_hot[..., w - 1] = 1.0  # the norm itself (the classes are < n_classes <= w - 1)
    per_head = n[..., None] * one_hot[:, None]  # (B, H, L, w)
    feats = torch.zeros(B, H // G, L, width, dtype=dtype, device=dev)
    feats[..., :G * w] = per_head.view(B, H // G, G, L, w).permute(0, 1, 3, 2, 4).reshape(B, H // G, L, G * w)
    return feats


def dot_precision(dtype) -> str:
    """The kernel's dot precision: fp32 dots as torch's own matmuls (`precision.fp32_dot_precision`:
    exact IEEE under "highest", TF32 tensor cores under "high" or "medium"); half-precision dots are
    tensor-core dots with fp32 accumulation either way (Triton's default name for them, "tf32")."""
    return fp32_dot_precision() if dtype == torch.float32 else TF32


def launch_config(q, spec: StatsSpec, layout: AttentionLayout) -> dict:
    """The tiles of a launch on q's device (`triton_config.kernel_config`, as `triton_aot` reads them)."""
    interpreted = INTERPRETED or q.device.type != "cuda"
    arch = 90 if interpreted else device_arch(q.device)
    return kernel_config(q.shape[-1], q.dtype, arch, kernel_switches(spec), spec.n_key_classes,
                         banded=not layout.is_plain, grouped=layout.group_size(q.shape[1]) > 1,
                         tf32=dot_precision(q.dtype) == "tf32", interpreted=interpreted)


def kernel_switches(spec: StatsSpec) -> frozenset:
    """The names of the statistics whose kernel switches `spec` turns on (`kernel_outputs`)."""
    return frozenset(stat.name for stat, _, flag in kernel_outputs() if flag is not None and stat.asked(spec))


def check_dtypes(q, k, v):
    if q.dtype not in DTYPES:
        raise TypeError(f"the triton backend takes float32, float16 or bfloat16 inputs, not {q.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError("q, k and v must have the same dtype")


def fused_forward(q, k, v, key_valid, key_class, spec: StatsSpec, layout: AttentionLayout, gates=None, scale=None,
                  blocks: dict | None = None, need_lse: bool = True, token_ids=None, norms=None):
    """One launch of `attn_stats_fwd` for any layout.

    q: (B, H, L, D); k, v: (B, H_kv, L, D), H_kv = layout.n_key_value_heads or H; fp32, fp16 or
    bf16, any strides (read in place). key_valid (B, L) bool; key_class (B, L) integer class ids.
    gates: `LayerGates` or None. blocks: override the tiles (BLOCK_M, BLOCK_N, num_warps, ...).
    need_lse: False when nothing reads the lse it returns (it is then a scratch buffer the next
    launch of the same shape overwrites). token_ids: (B, L) integer token ids, needed when
    spec.token_relations. norms: (B, H, L) the keys' value norms per query head, needed when spec.norms
    (`norm_features`).
    Returns (out (B, L, H, D) in the input dtype, {statistic: fp32 (or int64) tensor} for the
    statistics of `kernel_outputs` that spec asks for, lse (B, H, L) fp32). Rows of padding
    queries are left as computed (finite).
    """
    check_dtypes(q, k, v)
    B, H, L, D = q.shape
    G = layout.group_size(H)
    if k.shape != (B, H // G, L, D) or v.shape != k.shape:
        raise ValueError(f"k and v must be (B, H_kv, L, D) = {(B, H // G, L, D)}; got {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    cfg = {**launch_config(q, spec, layout), **(blocks or {})}
    band = triton_maps.band_args(layout, H, L)  # G, win_left, win_right (L: no limit), BANDED
    scale = D**-0.5 if scale is None else float(scale)
    dev = q.device
    C, O = spec.n_key_classes, len(spec.offsets)
    outputs, flags, lse, stat_stride = allocate_outputs(spec, {"B": B, "H": H, "L": L, "O": O, "C": C}, dev, need_lse)
    out = torch.empty(B, L, H, D, dtype=q.dtype, device=dev)  # written as (B, H, L, D) through strides
    stats = {stat.name: outputs[arg] for stat, arg, _ in kernel_outputs() if stat.asked(spec)}
    if out.numel() == 0:
        return out, stats, lse
    sums_by_dot = int(cfg.get("SUMS_BY_DOT", 0))  # a mode of `triton_config` (True: L_AND_T)
    if sums_by_dot and feature_width(C, ones=True) != feature_width(C):
        raise ValueError(f"SUMS_BY_DOT needs a free key-feature column: {C} key classes fill all {feature_width(C)}")
    mean_by_dot = bool(cfg.get("MEAN_BY_DOT", False))
    keys = CACHE.keys(key_valid, key_class, C, q.dtype, dev, ones=sums_by_dot != 0 or mean_by_dot,
                      positions=mean_by_dot)
    features = keys.features
    xi, stride_xb = gate_operands(gates, H, dev)
    ids = CACHE.token_ids(token_ids, key_valid, dev) if spec.token_relations else keys.ranges  # (B, L) int32
    norm_w, norm_f = norm_widths(C, G)
    # the norm features when the twins are asked (the weighted norm always is with them: its dot holds their sums);
    # else any pointer of the inputs' dtype, never read
    key_norms = norm_features(norms, key_valid, key_class, C, G, q.dtype) if flags.get("WEIGHTED_NORM") else features
    grid = (triton.cdiv(L * G, cfg["BLOCK_M"]), B * (H // G))
    named = dict(
        Q=q, K=k, V=v, KeyValid=keys.valid, KeyRange=keys.ranges, KeyFeatures=features, KeyNorms=key_norms,
        TokenIds=ids,  #
        GateXi=xi, Offsets=CACHE.offsets(spec.offsets, dev),  #
        Out=out, Lse=lse, sm_scale=scale,  #
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_ql=q.stride(2), stride_qd=q.stride(3),  #
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_kl=k.stride(2), stride_kd=k.stride(3),  #
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vl=v.stride(2), stride_vd=v.stride(3),  #
        stride_ob=out.stride(0), stride_oh=out.stride(2), stride_ol=out.stride(1), stride_od=out.stride(3),  #
        stride_mb=keys.valid.stride(0), stride_ml=keys.valid.stride(1),  #
        stride_fb=features.stride(0), stride_fl=features.stride(1), stride_xb=stride_xb,
        stride_sr=stat_stride,  #
        H=H, L=L, n_offsets=O, n_classes=C, G=G, win_left=band["win_left"], win_right=band["win_right"],  #
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"], HEAD_DIM=D, F_PAD=feature_width(C),
        NORM_W=norm_w, NORM_F=norm_f, CLAMP_KEYS=bool(cfg.get("CLAMP_KEYS", False)),
        MEAN_BY_DOT=mean_by_dot,
        BANDED=band["BANDED"], DOT_PRECISION=dot_precision(q.dtype),
        SUMS_BY_DOT=sums_by_dot, MASKED_FIRST=bool(cfg.get("MASKED_FIRST", False)),  #
        GROUP=G if band["BANDED"] and cfg.get("FIXED_G", False) else 0,
    )
    attn_stats_fwd[grid](**kernel_arguments({**named, **outputs, **flags}), num_warps=cfg["num_warps"],
                         num_stages=cfg["num_stages"], **launch_caps(cfg))
    if gates is not None and gates.uniform is not None:
        uniform_rows(out, v, key_valid, gates, layout)
    return out, stats, lse


def check_computed(spec: StatsSpec, extra: tuple = ()):
    """A NotImplementedError naming every statistic `spec` asks for that neither the fused kernel
    (`kernel_outputs`) nor a pass of `extra` computes: raised before a launch, so a statistic
    added to the table but not to the kernel never comes back as garbage."""
    done = {stat.name for stat, _, _ in kernel_outputs()} | set(extra)
    missing = [stat.name for stat in asked_stats(spec) if stat.name not in done]
    if missing:
        raise NotImplementedError(f"the triton backend does not compute {', '.join(missing)} "
                                  "(see docs/contributing.md); use another --backend")
