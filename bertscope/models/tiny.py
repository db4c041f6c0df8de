"""A tiny random model of any family of the architecture table (`bertscope.models.architectures`),
for the tests, tools/parity.py and the checks: one home for the configs, so that the parity tool
reads the very models the parity test asserts on (no tool imports a test).

`tiny_config(model_type, vocab_size)`: 2 layers, 4 query heads of width 8; 2 key/value heads
where the family groups them; a window small enough to bite where it has one (tests/tiny_decoders.py
saves them with a word-level tokenizer for tests/test_families.py).

`parity_config(kind)` is the config of each family of KINDS (decoders and windowed encoders) that
tests/models/test_decoder_families.py and tools/parity.py run: the seven families that test was
written with keep their own configs (vocabulary 50, each config class's own token ids, Gemma-3's
window 4 keys) so that its figures stay as they were; the families added since take
`tiny_config(kind, 50)`. `run_both` runs one through the model's own eager attention (maps
returned) and through the plug-in with every statistic switched on.
"""
from __future__ import annotations

import torch
import transformers

from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import ROW_STATS, StatsSpec
from bertscope.models.architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES
from bertscope.models.attention import ATTN_IMPLEMENTATION, HeadProbe

LAYERS, HEADS, KV_HEADS, HIDDEN = 2, 4, 2, 32
PARITY_VOCAB = 50  # parity_config's vocabulary; padded_batch draws ids below it

IDS = dict(pad_token_id=3, bos_token_id=1, eos_token_id=2)  # the word tokenizer's ids (tests/tiny_decoders.py)

# every family of the table that is not a BERT-style encoder (those: tests/conftest.py's tiny models)
KINDS = tuple(t for t in SUPPORTED_MODEL_TYPES if ARCHITECTURES[t].causal or ARCHITECTURES[t].window_attr)

# every statistic of the kernels' table that can be read off an attention map, switched on: the parity
# test's oracle reads them off the model's own eager maps; the streaming error needs q, k and v, not
# the map (its parity against an eager model with the explicit mask: tests/kernels/test_streaming.py), and
# the norm-based twins need the values and the output projection (their parity: tests/kernels/test_norms.py)
SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=3,
                 **{s.switch: True for s in ROW_STATS if s.switch not in ("offsets", "streaming", "norms")})


def tiny_config(model_type: str, vocab_size: int):
    """A fresh tiny config of `model_type` (configs are mutable: never share one between models):
    2 layers, 4 query heads of width 8; 2 key/value heads where the family groups them; a window
    of 3 keys on a windowed family's sliding layers (ModernBERT: 2 on each side)."""
    common = dict(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, max_position_embeddings=64, initializer_range=0.4, **IDS)
    decoder = dict(common, num_key_value_heads=KV_HEADS)
    make = {
        "bert": lambda: transformers.BertConfig(**common),
        "electra": lambda: transformers.ElectraConfig(embedding_size=16, **common),
        "albert": lambda: transformers.AlbertConfig(embedding_size=16, **common),
        "roberta": lambda: transformers.RobertaConfig(**dict(common, max_position_embeddings=66), type_vocab_size=1),
        "xlm-roberta": lambda: transformers.XLMRobertaConfig(**dict(common, max_position_embeddings=66),
                                                             type_vocab_size=1),
        "camembert": lambda: transformers.CamembertConfig(**dict(common, max_position_embeddings=66),
                                                          type_vocab_size=1),
        "distilbert": lambda: transformers.DistilBertConfig(vocab_size=vocab_size, dim=HIDDEN, n_layers=LAYERS,
                                                            n_heads=HEADS, hidden_dim=48, max_position_embeddings=64,
                                                            initializer_range=0.4, pad_token_id=3),
        "modernbert": lambda: transformers.ModernBertConfig(**common, local_attention=4, global_attn_every_n_layers=2,
                                                            cls_token_id=1, sep_token_id=2),
        "llama": lambda: transformers.LlamaConfig(**decoder),
        "mistral": lambda: transformers.MistralConfig(**decoder, sliding_window=3),
        "qwen2": lambda: transformers.Qwen2Config(**decoder, use_sliding_window=True, sliding_window=3,
                                                  max_window_layers=1),
        "qwen3": lambda: transformers.Qwen3Config(**decoder, head_dim=8),
        "gemma3_text": lambda: transformers.Gemma3TextConfig(**decoder, head_dim=8, sliding_window=3,
                                                             query_pre_attn_scalar=12,
                                                             layer_types=["sliding_attention", "full_attention"]),
        "olmo2": lambda: transformers.Olmo2Config(**decoder),
        "phi3": lambda: transformers.Phi3Config(**decoder, sliding_window=3),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=vocab_size, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                                n_positions=64, initializer_range=0.4, **IDS),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(**common, rotary_pct=0.5),
        "opt": lambda: transformers.OPTConfig(vocab_size=vocab_size, hidden_size=HIDDEN, ffn_dim=48,
                                              num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                              max_position_embeddings=64, word_embed_proj_dim=HIDDEN, init_std=0.4,
                                              **IDS),
    }
    if model_type not in make:
        raise ValueError(f"no tiny config of model type {model_type!r}: add one to bertscope/models/tiny.py")
    return make[model_type]()


def parity_config(kind: str):
    """A fresh tiny config of `kind` for the parity test and tool (see the module docstring)."""
    common = dict(vocab_size=PARITY_VOCAB, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, max_position_embeddings=64, initializer_range=0.4)
    decoder = dict(common, num_key_value_heads=KV_HEADS)
    if kind == "llama":
        return transformers.LlamaConfig(**decoder)
    if kind == "mistral":  # a window of 3 keys (itself and two before) on every layer
        return transformers.MistralConfig(**decoder, sliding_window=3)
    if kind == "qwen2":  # layer 0 full, layer 1 a window of 3
        return transformers.Qwen2Config(**decoder, use_sliding_window=True, sliding_window=3, max_window_layers=1)
    if kind == "qwen3":
        return transformers.Qwen3Config(**decoder, head_dim=8)
    if kind == "gemma3_text":  # a sliding layer (window 4) then a full one; scaling 1 / sqrt(query_pre_attn_scalar)
        return transformers.Gemma3TextConfig(**decoder, head_dim=8, sliding_window=4, query_pre_attn_scalar=12,
                                             layer_types=["sliding_attention", "full_attention"])
    if kind == "gpt2":
        return transformers.GPT2Config(vocab_size=PARITY_VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                       n_positions=64, initializer_range=0.4)
    if kind == "modernbert":  # layer 0 global, layer 1 local: 2 keys on each side
        return transformers.ModernBertConfig(**common, local_attention=4, global_attn_every_n_layers=2,
                                             pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                                             sep_token_id=2)
    return tiny_config(kind, PARITY_VOCAB)  # the families added since


def build(kind: str, attn_implementation: str = ATTN_IMPLEMENTATION, seed: int = 0, make_config=parity_config):
    """A random model of `make_config(kind)` (a fresh config each time), weights drawn after `seed`."""
    torch.manual_seed(seed)
    return transformers.AutoModel.from_config(make_config(kind), attn_implementation=attn_implementation).eval()


def padded_batch(lengths, L: int, left: bool, seed: int = 0) -> dict:
    """input_ids, attention_mask (and position ids from each first real token, for left padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, PARITY_VOCAB, (len(lengths), L), generator=g)
    pos = torch.arange(L)[None, :]
    n = torch.tensor(lengths)[:, None]
    mask = (pos >= L - n) if left else (pos < n)
    inputs = {"input_ids": ids.masked_fill(~mask, 0), "attention_mask": mask.long()}
    if left:
        inputs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)
    return inputs


def pooling_for(valid: torch.Tensor):
    """Words of two tokens each (by padded position), every word a candidate."""
    B, L = valid.shape
    unit = torch.where(valid, torch.arange(L)[None, :] // 2, -1)
    return word_pooling(unit, torch.ones(B, (L + 1) // 2, dtype=torch.bool))


def run_both(kind: str, lengths, L: int, backend: str, left: bool | None = None, make_config=parity_config):
    """(eager outputs with maps, plug-in hidden states, plug-in RowStats per layer, valid, key_class, pooling)
    of a model of `make_config(kind)` on a padded batch (left padding for a causal family unless `left`)."""
    left = ARCHITECTURES[kind].causal if left is None else left
    inputs = padded_batch(lengths, L, left)
    valid = inputs["attention_mask"].bool()
    key_class = torch.randint(0, SPEC.n_key_classes, valid.shape, generator=torch.Generator().manual_seed(1))
    pooling = pooling_for(valid)
    with torch.no_grad():
        ref = build(kind, "eager", make_config=make_config)(**inputs, output_attentions=True, use_cache=False)
    layers = []
    probe = HeadProbe(LAYERS, HEADS, SPEC, backend=backend)
    with torch.no_grad(), probe.active(key_class, lambda layer, stats, kv: layers.append(stats), pooling,
                                           token_ids=inputs["input_ids"]):
        out = build(kind, make_config=make_config)(**inputs, use_cache=False)
    return ref, out.last_hidden_state, layers, valid, key_class, pooling
