"""Real pruning of attention heads: smaller Q, K, V and output projections.

transformers 5 dropped `prune_heads`; this is it again, for every family bertscope supports,
working on module instances only (transformers' code is never edited or patched). Every
supported attention module reshapes its projections with `view(B, L, -1, head_dim)`, so
giving it narrower Linear layers is all it takes for it to run fewer heads.

Removing head h of a layer removes rows h*D .. (h+1)*D - 1 of the query, key and value
weights and biases and the same columns of the output projection (whose bias stays). GPT-NeoX
computes q, k and v in one projection whose rows are grouped per head ([q_h; k_h; v_h], viewed as
(..., heads, 3 D)): there rows 3hD .. 3(h+1)D - 1 go together (`HeadRemoval.fused`). The
pruned model's output is exactly that of the full model with those heads zero-gated
(Michel et al.'s xi_h = 0): a zero-gated head contributes nothing but the output bias,
which the pruned layer keeps.

A layer whose heads are *all* removed keeps one placeholder head whose query, key and value
weights and biases are 0 (uniform attention over a zero V: output exactly 0) and whose
output columns are 0, so the attention block adds only the output bias, as the zero-gated
model does. (The modules' `view(..., -1, D)` cannot take zero heads.) It costs 1/H of the
layer's attention.

Each pruned attention module carries the original slot of each of its heads:

    module.bertscope_head_slots  tuple: original head index of each head it computes, -1 for
                                 the placeholder of an empty layer
    module.bertscope_n_heads     the layer's original head count

which `bertscope.models.gates` (gates of the kept heads) and `bertscope.models.attention` (statistics put
back in their original slots, NaN for pruned heads) read. The config records the pruning
as `bertscope_pruned_heads` and `bertscope_kept_heads` ({"layer": [heads]}, 0-based,
original indices): transformers 5's PretrainedConfig has no `pruned_heads` any more (a
transformers-4 `pruned_heads` in a config is read as well).

Where each family keeps its layers and attention modules (`Architecture.layers`, known for every
family: `kept_heads` reads the slots there), how its heads are removed (`Architecture.removal`:
the projections; None where removal is refused in one line, `check_removable`) and which layers
share weights is `bertscope.models.architectures`' table.

Grouped-query attention (Llama, Mistral, Qwen, Gemma-3: G query heads read one key/value head):
heads are query heads. A query head can only be removed together with the other G - 1 of its
key/value group, and then the group's key and value rows go too (`kv_group`); removing part of
a group is a ValueError that names the group, since the kept heads still read its keys and
values (the pruned model would not be the zero-gated one any cheaper).

ALBERT shares one layer's weights across layers (`num_hidden_groups` groups for
`num_hidden_layers` layers): a group's heads can only be pruned where every layer that
shares it prunes the same heads; anything else is a ValueError.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from bertscope.kernels.spec import STAT
from bertscope.models.architectures import architecture_of, attribute

CONFIG_PRUNED = "bertscope_pruned_heads"
CONFIG_KEPT = "bertscope_kept_heads"
LEGACY_CONFIG_PRUNED = "pruned_heads"  # transformers 4's key, same meaning
PLACEHOLDER = -1  # the slot of an empty layer's placeholder head


@dataclass
class AttentionParts:
    """One layer's attention: the module that calls the attention function (holds the head
    count attribute `count_attr`) and the names of its projections."""

    module: nn.Module  # calls the attention interface; gets bertscope_head_slots
    q: tuple[nn.Module, str]  # (owner, attribute) of each Linear
    k: tuple[nn.Module, str] | None  # None for a fused projection (`fused`)
    v: tuple[nn.Module, str] | None
    out: tuple[nn.Module, str]
    count_attrs: tuple[str, ...]  # attributes of `module` that hold the head count
    size_attr: str | None  # attribute of `module` that holds heads * head_dim, if any
    fused: bool = False  # q is one projection with 3 D rows per head, [q_h; k_h; v_h] (GPT-NeoX)


def kv_group(config) -> int:
    """G: how many query heads share one key/value head (1 without grouped-query attention)."""
    arch = architecture_of(config)
    _, n_heads = arch.n_layers_heads(config)
    kv_heads = getattr(config, arch.kv_heads_attr, None) if arch.kv_heads_attr else None
    return n_heads // kv_heads if kv_heads else 1


def check_groups(want: dict[int, set], n_heads: int, group: int):
    """A one-line ValueError when a layer would keep part of a key/value group (heads from 1)."""
    for layer, hs in sorted(want.items()):
        for g in range(n_heads // group):
            members = set(range(g * group, (g + 1) * group))
            gone = members & hs
            if gone and gone != members:
                def name(heads, layer=layer):
                    return ", ".join(f"{layer + 1}-{h + 1}" for h in sorted(heads))
                raise ValueError(
                    f"layer {layer + 1}: {name(gone)} share{'s' if len(gone) == 1 else ''} key/value head {g + 1} "
                    f"with kept {name(members - gone)}: remove all {group} query heads of a key/value group "
                    f"({name(members)}) or none")


def n_layers_heads(config) -> tuple[int, int]:
    """The model's layer count and original heads per layer, whatever the family calls them."""
    return architecture_of(config).n_layers_heads(config)


def check_removable(config):
    """A one-line ValueError where heads of the config's family cannot be removed (the table's
    `Architecture.removal` is None: a fused q/k/v projection, q/k norms over all heads)."""
    refused = architecture_of(config).removal_refused()
    if refused is not None:
        raise ValueError(refused)


def attention_parts(model, layer: int) -> AttentionParts:
    """The attention of `layer` (0-based) in `model` (a bare encoder or one with a task head),
    where its architecture (`bertscope.models.architectures`) says it is and how its heads go."""
    check_removable(model.config)
    arch = architecture_of(model.config)
    where = arch.removal
    at = arch.layer_module(model, layer)

    def owner_and_name(path: str) -> tuple[nn.Module, str]:
        owner, _, name = path.rpartition(".")
        return (attribute(at, owner) if owner else at), name
    k, v = (None, None) if where.fused else (owner_and_name(where.k), owner_and_name(where.v))
    return AttentionParts(attribute(at, arch.layers.attention), owner_and_name(where.q), k, v,
                          owner_and_name(where.out), where.count_attrs, where.size_attr, where.fused)


def head_slots(module) -> tuple[int, ...] | None:
    """Original head index of each head a pruned attention module computes, or None when it
    was never pruned (then head i is head i)."""
    return getattr(module, "bertscope_head_slots", None)


def kept_heads(model) -> dict[int, list[int]]:
    """layer -> original indices of the heads it still computes (all of them when unpruned). Reads
    the attention modules only, where the table's `layers` says they are: it works for every family,
    those whose heads cannot be removed included (run.json's record reads it)."""
    arch = architecture_of(model.config)
    n_layers, n_heads = n_layers_heads(model.config)
    out = {}
    for layer in range(n_layers):
        slots = head_slots(arch.attention_module(model, layer))
        out[layer] = list(range(n_heads)) if slots is None else [s for s in slots if s != PLACEHOLDER]
    return out


def pruned_heads(model) -> dict[int, list[int]]:
    """layer -> original indices of its removed heads (empty list: none removed)."""
    _, n_heads = n_layers_heads(model.config)
    return {layer: sorted(set(range(n_heads)) - set(kept)) for layer, kept in kept_heads(model).items()}


def prune_heads(model, heads: dict[int, list[int]]) -> dict[int, list[int]]:
    """Remove heads[layer] (0-based, original indices) from each layer's attention, in place.
    A `ValueError` names layers and heads counted from 1, as the command line and the CSVs do.

    Heads already removed may be named again (nothing changes for them). Every layer of a
    shared ALBERT group must name the same heads. Updates the config's record (see the module
    docstring) and returns layer -> kept heads.
    """
    check_removable(model.config)  # first: the family's refusal before anything about the heads asked
    n_layers, n_heads = n_layers_heads(model.config)
    current = pruned_heads(model)
    want = {layer: set(current[layer]) for layer in range(n_layers)}
    for layer, hs in heads.items():  # the messages count from 1, as the user wrote the heads (`parse_heads`)
        if not isinstance(layer, int) or not 0 <= layer < n_layers:
            raise ValueError(f"layer {_from_one(layer)} does not exist: the model has layers 1..{n_layers}")
        bad = [h for h in hs if not isinstance(h, int) or not 0 <= h < n_heads]
        if bad:
            raise ValueError(f"layer {layer + 1}: {'heads' if len(bad) > 1 else 'head'} "
                             f"{', '.join(str(_from_one(h)) for h in bad)} {'do' if len(bad) > 1 else 'does'} not "
                             f"exist: the model has heads 1..{n_heads}")
        want[layer] |= set(hs)
    group = kv_group(model.config)
    check_groups(want, n_heads, group)
    by_module = {}  # id(attention module) -> (parts, layers sharing it)
    for layer in range(n_layers):
        parts = attention_parts(model, layer)
        by_module.setdefault(id(parts.module), (parts, []))[1].append(layer)
    for parts, layers in by_module.values():
        sets = {frozenset(want[layer]) for layer in layers}
        if len(sets) > 1:
            asked = "; ".join(f"layer {layer + 1}: " + (", ".join(f"{layer + 1}-{h + 1}" for h in sorted(want[layer]))
                                                          or "none") for layer in layers)
            raise ValueError(f"layers {', '.join(str(layer + 1) for layer in layers)} share one attention module "
                             f"(ALBERT weight sharing): they can only be pruned alike, not as {asked}")
        _prune_module(parts, sorted(want[layers[0]]), n_heads, group)
    record_pruning(model.config, pruned_heads(model), n_heads)
    return kept_heads(model)


def _prune_module(parts: AttentionParts, remove: list[int], n_heads: int, group: int = 1):
    """Give one attention module the heads of range(n_heads) not in `remove`; with grouped-query
    attention (`group` query heads per key/value head; whole groups removed, `check_groups`) the
    key and value projections keep the groups of the kept heads."""
    module = parts.module
    slots = head_slots(module) or tuple(range(n_heads))
    keep = [s for s in slots if s != PLACEHOLDER and s not in remove]
    if list(slots) == keep:
        return  # nothing new to remove
    owner, name = parts.q
    D = getattr(owner, name).out_features // (len(slots) * (3 if parts.fused else 1))  # head_dim
    rows = torch.cat([torch.arange(i * D, (i + 1) * D) for i, s in enumerate(slots) if s in keep]
                     ) if keep else None  # (len(keep) * D,) rows of the current projections to keep
    if parts.fused:  # one projection, 3 D rows per head ([q_h; k_h; v_h]); no key/value groups
        qkv = torch.cat([torch.arange(i * 3 * D, (i + 1) * 3 * D) for i, s in enumerate(slots) if s in keep]
                        ) if keep else None  # (len(keep) * 3 D,)
        linear = getattr(owner, name)
        setattr(owner, name, select_rows(linear, qkv) if keep else zero_rows(linear, 3 * D))
        _finish(parts, rows, keep, n_heads, D)
        return
    setattr(owner, name, select_rows(getattr(owner, name), rows) if keep else zero_rows(getattr(owner, name), D))
    # key/value rows: the groups of the current heads, in order; those of the kept heads stay
    groups = list(dict.fromkeys(s // group for s in slots if s != PLACEHOLDER)) or [PLACEHOLDER]
    kept_groups = set(s // group for s in keep)
    kv_rows = torch.cat([torch.arange(i * D, (i + 1) * D) for i, g in enumerate(groups) if g in kept_groups]
                        ) if keep else None
    for owner, name in (parts.k, parts.v):
        linear = getattr(owner, name)
        setattr(owner, name, select_rows(linear, kv_rows) if keep else zero_rows(linear, D))
    _finish(parts, rows, keep, n_heads, D)


def _finish(parts: AttentionParts, rows, keep: list[int], n_heads: int, D: int):
    """The output projection's columns of the kept heads (`rows` of the per-head D-wide space, None
    for an empty layer), the module's head count and its head slots."""
    module = parts.module
    owner, name = parts.out
    linear = getattr(owner, name)
    setattr(owner, name, select_columns(linear, rows) if keep else zero_columns(linear, D))
    physical = max(len(keep), 1)
    for attr in parts.count_attrs:
        setattr(module, attr, physical)
    if parts.size_attr is not None:
        setattr(module, parts.size_attr, physical * D)
    module.bertscope_head_slots = tuple(keep) if keep else (PLACEHOLDER,)
    module.bertscope_n_heads = n_heads


def _like(linear: nn.Linear, in_features: int, out_features: int, bias: bool) -> nn.Linear:
    new = nn.Linear(in_features, out_features, bias=bias, device=linear.weight.device, dtype=linear.weight.dtype)
    new.train(linear.training)
    return new


def select_rows(linear: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A Linear computing only output features `rows` of `linear`."""
    new = _like(linear, linear.in_features, len(rows), linear.bias is not None)
    with torch.no_grad():
        new.weight.copy_(linear.weight[rows.to(linear.weight.device)])  # (len(rows), in)
        if linear.bias is not None:
            new.bias.copy_(linear.bias[rows.to(linear.bias.device)])
    return new


def select_columns(linear: nn.Linear, cols: torch.Tensor) -> nn.Linear:
    """A Linear reading only input features `cols` of `linear` (its bias unchanged)."""
    new = _like(linear, len(cols), linear.out_features, linear.bias is not None)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, cols.to(linear.weight.device)])  # (out, len(cols))
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


def zero_rows(linear: nn.Linear, width: int) -> nn.Linear:
    """The placeholder head's projection: `width` output features, weights and bias 0."""
    new = _like(linear, linear.in_features, width, linear.bias is not None)
    with torch.no_grad():
        new.weight.zero_()
        if new.bias is not None:
            new.bias.zero_()
    return new


def zero_columns(linear: nn.Linear, width: int) -> nn.Linear:
    """The output projection of an empty layer: reads `width` zero-weighted features, keeps the bias."""
    new = _like(linear, width, linear.out_features, linear.bias is not None)
    with torch.no_grad():
        new.weight.zero_()
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


# --- the record in the config ------------------------------------------------------------


def record_pruning(config, pruned: dict[int, list[int]], n_heads: int):
    """Write the pruning into the config (saved by save_pretrained): {"layer": [heads]}, 0-based."""
    setattr(config, CONFIG_PRUNED, {str(layer): list(hs) for layer, hs in sorted(pruned.items())})
    setattr(config, CONFIG_KEPT, {str(layer): [h for h in range(n_heads) if h not in hs]
                                  for layer, hs in sorted(pruned.items())})


def recorded_pruning(config) -> dict[int, list[int]]:
    """layer -> pruned heads as the config records them (empty: an unpruned checkpoint).
    Raises ValueError for a record that does not fit the config."""
    record = getattr(config, CONFIG_PRUNED, None)
    if record is None:
        record = getattr(config, LEGACY_CONFIG_PRUNED, None)
    if not record:
        return {}
    n_layers, n_heads = n_layers_heads(config)
    try:
        pruned = {int(layer): sorted(int(h) for h in hs) for layer, hs in dict(record).items()}
    except (TypeError, ValueError):
        raise ValueError(f"the config's {CONFIG_PRUNED} is not a {{layer: [heads]}} mapping: {record!r}") from None
    for layer, hs in pruned.items():
        if not 0 <= layer < n_layers or any(not 0 <= h < n_heads for h in hs):
            raise ValueError(f"the config's pruned heads {record!r} do not fit {n_layers} layers x {n_heads} heads")
    kept = getattr(config, CONFIG_KEPT, None)
    if kept is not None and {int(k): sorted(v) for k, v in dict(kept).items()} != {
            layer: [h for h in range(n_heads) if h not in pruned.get(layer, [])] for layer in map(int, kept)}:
        raise ValueError(f"the config's {CONFIG_KEPT} and {CONFIG_PRUNED} disagree")
    return {layer: hs for layer, hs in pruned.items() if hs}


def is_pruned(config) -> bool:
    return bool(recorded_pruning(config))


# --- statistics of a pruned layer, back in the original slots ------------------------------


def spread_heads(stats, slots: tuple[int, ...], n_heads: int):
    """`RowStats` of a pruned layer's physical heads -> RowStats with the layer's original
    `n_heads`, each kept head in its original slot. A pruned head's statistics hold the
    kernels' table's `removed` value (NaN, or -1 for argmax and word_argmax): it has no
    attention to describe. The
    placeholder head of an empty layer is dropped."""
    changes = {f.name: _spread(getattr(stats, f.name), slots, n_heads, dim=1,
                               fill=STAT[f.name].removed if f.name in STAT else None)
               for f in dataclasses.fields(stats)
               if isinstance(getattr(stats, f.name), torch.Tensor)}  # every per-head statistic has heads on dim 1
    return replace(stats, **changes)


def spread_grad_sums(sums, slots: tuple[int, ...], n_heads: int):
    """`kernels.GradSums` of a pruned layer -> the original `n_heads` (heads on dim 0 of grad
    and mass), removed heads NaN; the pair and row counts are the layer's, unchanged."""
    return replace(sums, grad=_spread(sums.grad, slots, n_heads, dim=0), mass=_spread(sums.mass, slots, n_heads, dim=0))


def _spread(t: torch.Tensor, slots: tuple[int, ...], n_heads: int, dim: int, fill=None) -> torch.Tensor:
    """t with its `dim` (the physical heads) spread to `n_heads` original slots; the rest
    `fill` (the statistic's `removed` value in the kernels' table), by default NaN (float)
    or -1 (int)."""
    src, dst = _slot_indices(tuple(slots), t.device)
    shape = (*t.shape[:dim], n_heads, *t.shape[dim + 1:])
    if fill is None:
        fill = float("nan") if t.is_floating_point() else -1
    full = torch.full(shape, fill, dtype=t.dtype, device=t.device)
    full.index_copy_(dim, dst, t.index_select(dim, src))
    return full


@functools.cache
def _slot_indices(slots: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) int64 on `device`: the physical heads a pruned layer keeps and their original
    slots. Made once per layer and device, not copied to the device on every call."""
    src = [i for i, s in enumerate(slots) if s != PLACEHOLDER]
    with torch.inference_mode(False):  # usable in and out of inference mode
        return (torch.tensor(src, dtype=torch.long, device=device),
                torch.tensor([slots[i] for i in src], dtype=torch.long, device=device))


def _from_one(index) -> str:
    """A 0-based layer or head index as the user wrote it, counted from 1."""
    return str(index + 1) if isinstance(index, int) else repr(index)


# --- parsing what to remove ----------------------------------------------------------------


def parse_heads(text: str) -> dict[int, list[int]]:
    """"1-3,2-5" (layer-head, both from 1, as the CLI and the CSVs write them) -> {0: [2], 1: [4]}."""
    heads: dict[int, list[int]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        layer, sep, head = item.partition("-")
        if not sep or not layer.strip().isdigit() or not head.strip().isdigit() or int(layer) < 1 or int(head) < 1:
            raise ValueError(f"{item!r} is not LAYER-HEAD with both counted from 1 (e.g. 2-5)")
        heads.setdefault(int(layer) - 1, []).append(int(head) - 1)
    if not heads:
        raise ValueError(f"no heads in {text!r}: write LAYER-HEAD,... with both counted from 1 (e.g. 1-3,2-5)")
    return {layer: sorted(set(hs)) for layer, hs in heads.items()}


def describe(pruned: dict[int, list[int]], n_layers: int, n_heads: int) -> dict:
    """run.json / log summary: counts and the heads removed, layer-head from 1."""
    removed = [f"{layer + 1}-{h + 1}" for layer, hs in sorted(pruned.items()) for h in hs]
    per_layer = {str(layer + 1): n_heads - len(pruned.get(layer, [])) for layer in range(n_layers)}
    return {"heads_removed": len(removed), "heads_total": n_layers * n_heads,
            "fraction_removed": len(removed) / (n_layers * n_heads), "kept_per_layer": per_layer,
            "removed": removed}


# --- save and load ---------------------------------------------------------------------------


def save_pruned(model, tokenizer, out: str | Path) -> Path:
    """Write a pruned model in Hugging Face format (save_pretrained, with the tokenizer); its
    config records the pruning, so `bertscope.models.loading.load_model(out)` builds it back. Plain
    transformers cannot load it (the config's head count is the original one)."""
    out = Path(out)
    n_heads = n_layers_heads(model.config)[1]
    record_pruning(model.config, pruned_heads(model), n_heads)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def load_pruned(auto_class, config, path: Path, attn_implementation: str | None = None, **config_kwargs):
    """Build `auto_class` from `config` (with `config_kwargs` set, e.g. num_labels), prune it as
    the config records, load the weights of `path` into it. Returns (model, {"missing_keys":
    [...]}) like from_pretrained's loading info. The checkpoint may hold the bare encoder or the
    encoder under a task model's prefix."""
    config = type(config).from_dict(config.to_dict())  # a copy: from_config writes into it
    for key, value in config_kwargs.items():
        setattr(config, key, value)
    model = auto_class.from_config(config, attn_implementation=attn_implementation)
    prune_heads(model, recorded_pruning(config))
    state = fit_prefix(read_state_dict(path), model)
    missing, _ = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {t.data_ptr() for k, t in own.items() if k in state}
    missing = [k for k in missing if own[k].data_ptr() not in loaded]  # tied weights came with their source
    return model, {"missing_keys": missing}


def fit_prefix(state: dict, model) -> dict:
    """Checkpoint keys named as `model` names them: a task model's encoder lives under
    `base_model_prefix.`, a bare encoder's keys have no prefix."""
    prefix = model.base_model_prefix + "."
    in_ckpt = any(k.startswith(prefix) for k in state)
    is_task = getattr(model, "base_model", model) is not model
    if is_task and not in_ckpt:
        return {prefix + k: v for k, v in state.items()}
    if not is_task and in_ckpt:
        return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return state


def read_state_dict(path: Path) -> dict:
    """Every tensor of a save_pretrained directory (safetensors, sharded or not, or a .bin)."""
    path = Path(path)
    if (path / "model.safetensors").is_file():
        return load_file(path / "model.safetensors")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        state = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            state.update(load_file(path / shard))
        return state
    if (path / "pytorch_model.bin").is_file():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise OSError(f"{path} holds no model weights (model.safetensors or pytorch_model.bin)")
