"""What differs between model architectures, in one table: `ARCHITECTURES`, one `Architecture` per
transformers `model_type`.

Everything else in bertscope reads an architecture from here (`architecture_of(config)`), never a
`model_type` string of its own:

    positions    the maximum input length (`max_len`): RoBERTa-style models number positions
                 from padding_idx + 1, which costs two places of `max_position_embeddings`
    template     the special tokens the tokenizer's post-processor adds around one and two
                 parts (`bertscope.text.segments` makes room for them), the spellings of "."
                 and "," in the family's vocabulary (`bertscope.text.token_classes`)
    layers       where each layer, its attention module and its attention block are: known for
                 every family bertscope analyses (run.json's record, the massive-activation
                 hook of `sinks`, the shared prefixes of `bertscope.analyses.heads.variants`)
    removal      how heads are removed (`bertscope.models.head_removal`): the q / k / v / output
                 projections and the head-count attributes; None where removing a head's rows
                 would not give the zero-gated model (a fused projection, a norm over all
                 heads together), with the reason in `no_removal`
    sharing      ALBERT runs one layer's weights for several layers (`shared_layer`)
    attention    what the attention function is handed (`layouts(config)`, one
                 `kernels.AttentionLayout` per layer): whether it is causal, a sliding window
                 (on which layers), how many key/value heads
    refused      families whose attention bertscope does not compute (a position bias added
                 to the scores: ALiBi, relative buckets), refused in one line by name

Encoders (bidirectional; ModernBERT with local windows) and decoders (causal; grouped-query
attention; sliding windows) alike: the plug-in reads each call's layout from the model's own
mask (`bertscope.models.attention`), and the table says what to expect, for the load-time
check and run.json. Decoders load as the base model (AutoModel), never with the LM head.
Adding a family: docs/architecture.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce

from bertscope.errors import UserError
from bertscope.kernels.spec import AttentionLayout


@dataclass(frozen=True)
class LayerModules:
    """Where one layer and its attention live, as dotted attribute paths (every analysed family).

    layer:     from the base model (`model.base_model`) to layer `{i}`'s module; `{i}` is the
               layer index, or for a weight-sharing family the index `Architecture.shared_layer`
               gives (ALBERT: the layer group)
    attention: from the layer to the module that calls the attention function; head removal
               writes its head slots (`bertscope_head_slots`) there, and run.json reads them back
    block:     from the layer to the module that holds projections, attention and output
               (what a benchmark times as "the attention")
    output:    from the layer to the attention's output projection (an `nn.Linear`, or GPT-2's
               `Conv1D`), whose head h's D input columns are W_O^h: the norm-based twins read it
               (`kernels.norms`, docs/norms.md); None where it is not known (norms refused by name)
    """

    layer: str
    attention: str
    block: str
    output: str | None = None


@dataclass(frozen=True)
class HeadRemoval:
    """How one layer's heads are removed (`bertscope.models.head_removal`): each head's D rows of
    separate q, k and v projections and D columns of the output projection, whose attention module
    reshapes with view(..., -1, head_dim) or reads its head count from `count_attrs`.

    q, k, v, out: from the layer to each projection (an `nn.Linear`)
    count_attrs:  attributes of the attention module that hold its head count
    size_attr:    attribute of the attention module that holds heads * head_dim, if any
    fused:        q names one projection whose rows are grouped per head, [q_h; k_h; v_h] (3 D
                  rows per head: GPT-NeoX's query_key_value, viewed as (..., heads, 3 D) and
                  chunked), k and v empty: a head's 3 D rows go together
    """

    q: str
    k: str
    v: str
    out: str
    count_attrs: tuple[str, ...]
    size_attr: str | None
    fused: bool = False


BERT_LAYERS = LayerModules(layer="encoder.layer.{i}", attention="attention.self", block="attention",
                           output="attention.output.dense")
BERT_REMOVAL = HeadRemoval(q="attention.self.query", k="attention.self.key", v="attention.self.value",
                           out="attention.output.dense", count_attrs=("num_attention_heads",),
                           size_attr="all_head_size")


@dataclass(frozen=True)
class Architecture:
    """The facts of one `model_type` that bertscope needs.

    model_type:      transformers' name for it (`config.model_type`)
    layers:          `LayerModules`: where the layers and their attention are (None only for a
                     family refused by name)
    removal:         `HeadRemoval`: how heads are removed; None where they cannot be, `no_removal`
                     saying why
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
    window_sides:    "left" (a causal window: a query sees `window` keys, itself included, as
                     transformers' sliding_window_overlay) or "both" (ModernBERT's local
                     layers: `window` keys on each side)
    layer_types_attr: the config attribute listing each layer's kind ("sliding_attention" or
                     "full_attention"), where only some layers have the window
    position_ids:    the engine hands the model position ids counted from each sequence's first
                     real token, so that a left-padded sequence gets the positions it has alone
                     (decoders; absolute position embeddings such as GPT-2's need it)
    prefix_sharing:  a task model of the family reads the last hidden states alone after its layers
                     (a BERT-style pooler reads [CLS]), so `bertscope.analyses.heads.variants` may
                     run many gated variants from one cached layer input; False where the head
                     reads the inputs too (ModernBERT's mean pooling reads the padding mask, a
                     decoder's classifier the ids of the last token) or the layers hand each
                     other more than tensors of the batch's rows (a rotary pair, the plug-in's key band)
    no_removal:      why heads cannot be removed where `removal` is None (a fused q/k/v
                     projection, q/k norms over all heads together), for the one-line refusal
    refused:         why bertscope does not analyse the family at all, or None
    """

    model_type: str
    layers: LayerModules | None = BERT_LAYERS
    removal: HeadRemoval | None = BERT_REMOVAL
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
    window_sides: str = "left"
    layer_types_attr: str | None = None
    position_ids: bool = False
    prefix_sharing: bool = True
    no_removal: str | None = None
    refused: str | None = None

    def n_layers_heads(self, config) -> tuple[int, int]:
        """The layer count and heads per layer, whatever the family calls them."""
        return getattr(config, self.layers_attr), getattr(config, self.heads_attr)

    def max_len(self, config) -> int:
        """The longest input the position embeddings allow."""
        return config.max_position_embeddings - self.position_offset

    def is_causal(self, config) -> bool:
        """Whether the model's attention is causal. A BERT-family config may make a decoder of an
        encoder (`is_decoder`); a decoder config may switch causality off (`is_causal` False:
        transformers then builds bidirectional masks)."""
        if not getattr(config, "is_causal", True):
            return False
        return self.causal or bool(getattr(config, "is_decoder", False))

    def layouts(self, config) -> list[AttentionLayout]:
        """What the attention function is handed in each layer of a model of this config."""
        n_layers, heads = self.n_layers_heads(config)
        causal = self.is_causal(config)
        window = getattr(config, self.window_attr, None) if self.window_attr else None
        kinds = getattr(config, self.layer_types_attr, None) if self.layer_types_attr else None
        kv_heads = getattr(config, self.kv_heads_attr, None) if self.kv_heads_attr else None
        kv_heads = kv_heads if kv_heads not in (None, heads) else None
        out = []
        for layer in range(n_layers):
            w = window if kinds is None or kinds[layer] == "sliding_attention" else None
            if w is not None:
                w = (w - 1, 0) if self.window_sides == "left" else (w, w)
                if causal:
                    w = (w[0], 0)
            out.append(AttentionLayout(causal=causal, window=w, n_key_value_heads=kv_heads))
        return out

    def layout(self, config, layer: int = 0) -> AttentionLayout:
        """What the attention function is handed in `layer` of a model of this config."""
        return self.layouts(config)[layer]

    # --- the modules of one layer ------------------------------------------------------------

    def layer_module(self, model, layer: int):
        """The module of `layer` (0-based) in `model` (a bare model or one with a task head)."""
        if self.layers is None:
            raise ValueError(f"bertscope does not analyse model type {self.model_type!r}: {self.refused}")
        base = getattr(model, "base_model", model)
        index = layer if self.shared_layer is None else self.shared_layer(model.config, layer)
        return attribute(base, self.layers.layer.format(i=index))

    def attention_module(self, model, layer: int):
        """The module that calls the attention function in `layer` (0-based) of `model`."""
        return attribute(self.layer_module(model, layer), self.layers.attention)

    def output_projection(self, model, layer: int):
        """The attention's output projection in `layer` (0-based) of `model` (`LayerModules.output`);
        a UserError where the table does not know it."""
        if self.layers is None or self.layers.output is None:
            raise UserError(f"bertscope does not know where the attention output projection of model type "
                            f"{self.model_type!r} is, which the norm-based statistics need (--no-norms)")
        return attribute(self.layer_module(model, layer), self.layers.output)

    def prefix_layers(self, model) -> list | None:
        """The layers from whose cached inputs `bertscope.analyses.heads.variants` may run gated
        variants (`prefix_sharing`), or None where it must replicate the batch from the inputs on."""
        return self.layer_list(model) if self.prefix_sharing else None

    def layer_list(self, model) -> list | None:
        """Every layer's module in call order, each called once per forward pass; None where
        layers share one module (ALBERT), so that a hook on it would fire for several layers."""
        if self.shared_layer is not None:
            return None
        return [self.layer_module(model, layer) for layer in range(self.n_layers_heads(model.config)[0])]

    def removal_refused(self) -> str | None:
        """Why heads of this family cannot be removed, as one line; None where they can."""
        if self.removal is not None:
            return None
        why = f": {self.no_removal}" if self.no_removal else ""
        return f"cannot remove heads of model type {self.model_type!r}{why}"


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
BYTE_BPE = ("Ġ.", "Ġ,")  # byte-level BPE: a leading-space marker

# Llama and the families built like it: layers under `layers`, the attention module `self_attn`.
LLAMA_LAYERS = LayerModules(layer="layers.{i}", attention="self_attn", block="self_attn", output="self_attn.o_proj")
# q_proj, k_proj, v_proj, o_proj under self_attn; the attention module reshapes with
# view(..., -1, head_dim) and holds no head count (the key/value grouping comes from the shapes),
# so removing whole key/value groups works.
LLAMA_REMOVAL = HeadRemoval(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj", out="self_attn.o_proj",
                            count_attrs=(), size_attr=None)
# A decoder: causal, grouped-query, no pair template (the tokenizer's own template adds a BOS or
# nothing: bertscope.text.segments), position ids from the first real token (left padding).
DECODER = dict(layers=LLAMA_LAYERS, removal=LLAMA_REMOVAL, n_special=None, causal=True,
               kv_heads_attr="num_key_value_heads", position_ids=True, prefix_sharing=False)
FUSED = "its q, k and v come out of one fused projection"
QK_NORM = ("its q_norm and k_norm normalise over all heads together, so a layer with fewer heads would "
           "not compute the kept heads as before")
# a family refused by name: nothing of it is reached
REFUSED = dict(layers=None, removal=None, n_special=None)
POSITION_BIAS = "adds a position bias to its attention scores ({}), which bertscope does not compute"

ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("bert"),
    Architecture("roberta", **ROBERTA, punct_tokens=BYTE_BPE),
    Architecture("xlm-roberta", **ROBERTA, punct_tokens=SENTENCEPIECE),
    Architecture("camembert", **ROBERTA, punct_tokens=SENTENCEPIECE),
    Architecture("distilbert", LayerModules(layer="transformer.layer.{i}", attention="attention", block="attention",
                              output="attention.out_lin"),
                 HeadRemoval(q="attention.q_lin", k="attention.k_lin", v="attention.v_lin", out="attention.out_lin",
                             count_attrs=("n_heads",), size_attr="dim"),
                 layers_attr="n_layers", heads_attr="n_heads"),
    Architecture("albert", LayerModules(layer="encoder.albert_layer_groups.{i}.albert_layers.0",
                                        attention="attention", block="attention", output="attention.dense"),
                 HeadRemoval(q="attention.query", k="attention.key", v="attention.value", out="attention.dense",
                             count_attrs=("num_attention_heads",), size_attr="all_head_size"),
                 shared_layer=albert_group, punct_tokens=SENTENCEPIECE),
    Architecture("electra"),
    # an encoder whose local layers see a window of sliding_window (= local_attention // 2) keys
    # on each side; every global_attn_every_n_layers-th layer sees all (config.layer_types)
    Architecture("modernbert", LayerModules(layer="layers.{i}", attention="attn", block="attn", output="attn.Wo"),
                 removal=None,
                 no_removal=FUSED, prefix_sharing=False, punct_tokens=BYTE_BPE, window_attr="sliding_window",
                 window_sides="both", layer_types_attr="layer_types"),
    # decoders (causal; grouped-query attention where num_key_value_heads < num_attention_heads)
    Architecture("llama", **DECODER, template="[BOS] A", punct_tokens=SENTENCEPIECE),
    # a sliding window on every layer when config.sliding_window is set
    Architecture("mistral", **DECODER, template="<s> A", punct_tokens=SENTENCEPIECE, window_attr="sliding_window"),
    # a sliding window on the layers config.layer_types says (use_sliding_window, max_window_layers)
    Architecture("qwen2", **DECODER, template="A", punct_tokens=BYTE_BPE, window_attr="sliding_window",
                 layer_types_attr="layer_types"),
    Architecture("qwen3", **DECODER, template="A", punct_tokens=BYTE_BPE, window_attr="sliding_window",
                 layer_types_attr="layer_types"),
    # five sliding-window layers to one global one (config.layer_types); scaling
    # query_pre_attn_scalar ** -0.5, which the attention call passes as its `scaling`
    Architecture("gemma3_text", **DECODER, template="<bos> A", punct_tokens=SENTENCEPIECE,
                 window_attr="sliding_window", layer_types_attr="layer_types"),
    # OLMo-2: Llama's layout with RMS norms on q and k over all heads (`QK_NORM`)
    Architecture("olmo2", **dict(DECODER, removal=None), no_removal=QK_NORM, template="A", punct_tokens=BYTE_BPE),
    # Phi-3: one qkv_proj (queries, then keys, then values); a sliding window on every layer
    # when config.sliding_window is set
    Architecture("phi3", **dict(DECODER, removal=None), no_removal=FUSED, template="<s> A",
                 punct_tokens=SENTENCEPIECE, window_attr="sliding_window"),
    # absolute position embeddings (position ids matter under left padding); no key/value grouping
    Architecture("gpt2", LayerModules(layer="h.{i}", attention="attn", block="attn", output="attn.c_proj"),
                 removal=None,
                 no_removal=FUSED, n_special=None, template="A", punct_tokens=BYTE_BPE, causal=True,
                 position_ids=True, prefix_sharing=False),
    # GPT-NeoX (Pythia): one query_key_value projection whose rows are grouped per head (q, k, v
    # of head 0, then of head 1, ...), so a head's rows go together; rotary on part of each head
    # (rotary_pct), applied before the attention call, so bertscope sees q and k after it
    Architecture("gpt_neox", LayerModules(layer="layers.{i}", attention="attention", block="attention",
                              output="attention.dense"),
                 HeadRemoval(q="attention.query_key_value", k="", v="", out="attention.dense", count_attrs=(),
                             size_attr=None, fused=True),
                 n_special=None, template="A", punct_tokens=BYTE_BPE, causal=True,
                 position_ids=True, prefix_sharing=False),
    # OPT: learned absolute positions, its embedding table holds max_position_embeddings + 2 rows
    # (OPTLearnedPositionalEmbedding adds its offset of 2 itself: every configured position is an
    # input position); the query is scaled before the attention call (scaling 1.0); the attention
    # module reshapes with its num_heads
    Architecture("opt", LayerModules(layer="decoder.layers.{i}", attention="self_attn", block="self_attn",
                              output="self_attn.out_proj"),
                 HeadRemoval(q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj",
                             out="self_attn.out_proj", count_attrs=("num_heads",), size_attr=None),
                 n_special=None, template="</s> A", punct_tokens=BYTE_BPE, causal=True, position_ids=True,
                 prefix_sharing=False),
    # families refused by name: a position bias on the scores
    Architecture("bloom", **REFUSED, refused=POSITION_BIAS.format("ALiBi")),
    Architecture("mpt", **REFUSED, refused=POSITION_BIAS.format("ALiBi")),
    Architecture("t5", **REFUSED, refused=POSITION_BIAS.format("relative position buckets")),
    Architecture("deberta", **REFUSED,
                 refused=POSITION_BIAS.format("disentangled relative positions")),
    Architecture("deberta-v2", **REFUSED,
                 refused=POSITION_BIAS.format("disentangled relative positions")),
)}

# The types bertscope analyses: every family of the table that is not refused.
SUPPORTED_MODEL_TYPES = tuple(t for t, a in ARCHITECTURES.items() if a.refused is None)
# Those with a pair template ([CLS] A [SEP] B [SEP]): the BERT-family encoders Clark's sentence pairs need.
PAIR_MODEL_TYPES = tuple(t for t in SUPPORTED_MODEL_TYPES if ARCHITECTURES[t].n_special is not None)

# Every family's spellings of "." and ",", in table order: a vocabulary is looked up for all of them.
PUNCT_TOKENS = tuple(dict.fromkeys(t for a in ARCHITECTURES.values() for t in a.punct_tokens))

# The most special tokens any supported template adds to a sentence pair is `bertscope.text.segments.MAX_SPECIAL`
# (text lies below models in the core's layers, docs/architecture.md); tests/models/test_architectures.py holds
# it to this table.


def architecture_of(config_or_type) -> Architecture:
    """The `Architecture` of a config (or of a model_type string); a UserError for a type not in the table."""
    model_type = config_or_type if isinstance(config_or_type, str) else config_or_type.model_type
    if model_type not in ARCHITECTURES:
        raise UserError(f"model type {model_type!r} is not supported; bertscope supports model types "
                        + ", ".join(SUPPORTED_MODEL_TYPES))
    return ARCHITECTURES[model_type]


def check_analysable(config) -> Architecture:
    """The config's `Architecture`, or a one-line UserError when bertscope cannot analyse it: a type
    not in the table, a family refused by name (a position bias), or a layout the table cannot
    express (grouped-query heads that do not divide the query heads)."""
    arch = architecture_of(config)
    if arch.refused is not None:
        raise UserError(f"model type {arch.model_type!r} {arch.refused}; bertscope supports model types "
                        + ", ".join(SUPPORTED_MODEL_TYPES))
    heads = arch.n_layers_heads(config)[1]
    try:
        for layout in arch.layouts(config):
            layout.group_size(heads)
    except ValueError as e:
        raise UserError(f"model type {arch.model_type!r}: {e}") from None
    return arch
