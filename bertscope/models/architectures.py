"""What differs between model architectures, in one table: `ARCHITECTURES`, one `Architecture` per
transformers `model_type`.

Everything else in bertscope reads an architecture from here (`architecture_of(config)`), never a
`model_type` string of its own:

    positions    the maximum input length (`max_len`): RoBERTa-style models number positions
                 from padding_idx + 1, which costs two places of `max_position_embeddings`
    template     the special tokens the tokenizer's post-processor adds around one and two
                 parts (`bertscope.text.segments` makes room for them), the spellings of "."
                 and "," in the family's vocabulary (`bertscope.text.token_classes`)
    modules      where each layer's attention and its q / k / v / output projections are
                 (`bertscope.models.head_removal`), and the module that holds the whole block
    sharing      ALBERT runs one layer's weights for several layers (`shared_layer`)
    attention    what the attention function is handed (`layout(config)` ->
                 `kernels.AttentionLayout`): whether it is causal, a sliding window, how many
                 key/value heads

bertscope's statistics are those of bidirectional self-attention with one key/value head per
query head. An architecture whose layout is anything else is in the table so that it is
refused in one line, naming what is missing (`check_analysable`), instead of being misread;
the decoder issue implements those layouts. Adding a family: docs/architecture.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from bertscope.errors import UserError
from bertscope.kernels.spec import AttentionLayout


@dataclass(frozen=True)
class AttentionModules:
    """Where one layer's attention lives, as dotted attribute paths.

    layer:       from the base model (`model.base_model`) to layer `{i}`'s module; `{i}` is the
                 layer index, or for a weight-sharing family the index `Architecture.shared_layer`
                 gives (ALBERT: the layer group)
    module:      from the layer to the module that calls the attention function; head removal
                 writes its head slots (`bertscope_head_slots`) there
    q, k, v, out: from the layer to each projection (an `nn.Linear`)
    block:       from the layer to the module that holds projections, attention and output
                 (what a benchmark times as "the attention")
    count_attrs: attributes of `module` that hold its head count
    size_attr:   attribute of `module` that holds heads * head_dim, if any
    """

    layer: str
    module: str
    q: str
    k: str
    v: str
    out: str
    block: str
    count_attrs: tuple[str, ...]
    size_attr: str | None


BERT_MODULES = AttentionModules(
    layer="encoder.layer.{i}", module="attention.self", q="attention.self.query", k="attention.self.key",
    v="attention.self.value", out="attention.output.dense", block="attention",
    count_attrs=("num_attention_heads",), size_attr="all_head_size")


@dataclass(frozen=True)
class Architecture:
    """The facts of one `model_type` that bertscope needs.

    model_type:      transformers' name for it (`config.model_type`)
    modules:         `AttentionModules`; None where heads cannot be removed
    shared_layer:    (config, layer) -> index of the weights that layer runs; None when every
                     layer has its own (weight sharing: ALBERT)
    layers_attr, heads_attr: the config attributes holding the layer count and the heads per layer
    position_offset: places of `max_position_embeddings` that are not input positions
    n_special:       special tokens the template adds to (one part, two parts); None: no
                     pair template (such a family cannot make Clark's sentence pairs)
    template:        the pair template, in words (for docs and messages)
    punct_tokens:    the spellings of "." and "," in the family's vocabulary (the "punct" key class)
    causal:          every query sees only the keys before it (a decoder)
    window_attr:     the config attribute holding a sliding window, if the family has one
    kv_heads_attr:   the config attribute holding the key/value head count, if it may differ from
                     the query heads (grouped-query attention)
    """

    model_type: str
    modules: AttentionModules | None = BERT_MODULES
    shared_layer: Callable[[object, int], int] | None = None
    layers_attr: str = "num_hidden_layers"
    heads_attr: str = "num_attention_heads"
    position_offset: int = 0
    n_special: tuple[int, int] | None = (2, 3)
    template: str = "[CLS] A [SEP] B [SEP]"
    punct_tokens: tuple[str, ...] = (".", ",")  # WordPiece
    causal: bool = False
    window_attr: str | None = None
    kv_heads_attr: str | None = None

    def n_layers_heads(self, config) -> tuple[int, int]:
        """The layer count and heads per layer, whatever the family calls them."""
        return getattr(config, self.layers_attr), getattr(config, self.heads_attr)

    def max_len(self, config) -> int:
        """The longest input the position embeddings allow."""
        return config.max_position_embeddings - self.position_offset

    def layout(self, config) -> AttentionLayout:
        """What the attention function is handed in a model of this config.

        A BERT-family config may make a decoder of an encoder (`is_decoder`): then it is causal
        too, whatever the table says."""
        causal = self.causal or bool(getattr(config, "is_decoder", False))
        window = getattr(config, self.window_attr, None) if self.window_attr else None
        if window is not None:
            window = (window - 1, 0) if causal else (window, window)
        kv_heads = getattr(config, self.kv_heads_attr, None) if self.kv_heads_attr else None
        heads = getattr(config, self.heads_attr)
        return AttentionLayout(causal=causal, window=window,
                               n_key_value_heads=kv_heads if kv_heads not in (None, heads) else None)

    # --- the modules of one layer ------------------------------------------------------------

    def layer_module(self, model, layer: int):
        """The module of `layer` (0-based) in `model` (a bare model or one with a task head)."""
        if self.modules is None:
            raise ValueError(f"bertscope does not know where the attention of model type {self.model_type!r} is")
        base = getattr(model, "base_model", model)
        index = layer if self.shared_layer is None else self.shared_layer(model.config, layer)
        return attribute(base, self.modules.layer.format(i=index))


def attribute(obj, path: str):
    """obj.a.b.0.c for path "a.b.0.c" (a number indexes a module list)."""
    return reduce(lambda o, name: o[int(name)] if name.isdigit() else getattr(o, name), path.split("."), obj)


def albert_group(config, layer: int) -> int:
    """The weight group ALBERT's encoder runs for `layer` (its own formula)."""
    if config.inner_group_num != 1:
        raise ValueError(f"ALBERT with inner_group_num = {config.inner_group_num} runs several attention modules "
                         "per layer; bertscope prunes only inner_group_num = 1")
    return int(layer / (config.num_hidden_layers / config.num_hidden_groups))


ROBERTA = dict(position_offset=2, n_special=(2, 4), template="<s> A </s></s> B </s>")
SENTENCEPIECE = ("▁.", "▁,")

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("bert"),
    Architecture("roberta", **ROBERTA, punct_tokens=("Ġ.", "Ġ,")),  # byte-level BPE: a leading-space marker
    Architecture("xlm-roberta", **ROBERTA, punct_tokens=SENTENCEPIECE),
    Architecture("camembert", **ROBERTA, punct_tokens=SENTENCEPIECE),
    Architecture("distilbert", AttentionModules(
        layer="transformer.layer.{i}", module="attention", q="attention.q_lin", k="attention.k_lin",
        v="attention.v_lin", out="attention.out_lin", block="attention", count_attrs=("n_heads",), size_attr="dim"),
        layers_attr="n_layers", heads_attr="n_heads"),
    Architecture("albert", AttentionModules(
        layer="encoder.albert_layer_groups.{i}.albert_layers.0", module="attention", q="attention.query",
        k="attention.key", v="attention.value", out="attention.dense", block="attention",
        count_attrs=("num_attention_heads",), size_attr="all_head_size"),
        shared_layer=albert_group, punct_tokens=SENTENCEPIECE),
    Architecture("electra"),
    # A decoder, in the table so that it is refused by name (causal, grouped-query) rather than
    # misread as an encoder; the decoder issue gives it modules, a template and kernels.
    Architecture("llama", modules=None, n_special=None, template="<s> A", punct_tokens=SENTENCEPIECE,
                 causal=True, kv_heads_attr="num_key_value_heads"),
)}

# The types bertscope analyses: those whose attention the kernels compute (see `check_analysable`).
SUPPORTED_MODEL_TYPES = tuple(t for t, a in ARCHITECTURES.items() if not a.causal and a.window_attr is None
                              and a.kv_heads_attr is None)

# Every family's spellings of "." and ",", in table order: a vocabulary is looked up for all of them.
PUNCT_TOKENS = tuple(dict.fromkeys(t for a in ARCHITECTURES.values() for t in a.punct_tokens))

# The most special tokens any supported template adds to a sentence pair.
MAX_SPECIAL = max(ARCHITECTURES[t].n_special[1] for t in SUPPORTED_MODEL_TYPES)


def architecture_of(config_or_type) -> Architecture:
    """The `Architecture` of a config (or of a model_type string); a UserError for a type not in the table."""
    model_type = config_or_type if isinstance(config_or_type, str) else config_or_type.model_type
    if model_type not in ARCHITECTURES:
        raise UserError(f"model type {model_type!r} is not supported; bertscope supports encoders of type "
                        + ", ".join(SUPPORTED_MODEL_TYPES))
    return ARCHITECTURES[model_type]


def check_analysable(config) -> Architecture:
    """The config's `Architecture`, or a one-line UserError when bertscope cannot analyse it: a type
    not in the table, or an attention layout the kernels do not compute yet (causal, sliding
    window, fewer key/value heads than query heads)."""
    arch = architecture_of(config)
    missing = arch.layout(config).unsupported(getattr(config, arch.heads_attr))
    if missing:
        raise UserError(f"model type {arch.model_type!r} has {' and '.join(missing)}, which bertscope does not "
                        "analyse yet: it supports bidirectional encoders of type " + ", ".join(SUPPORTED_MODEL_TYPES))
    return arch
