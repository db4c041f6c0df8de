"""The architecture table (`bertscope.models.architectures`) and the attention contract's layout:
every supported encoder loads as before; the plug-in reads causal, sliding-window and
grouped-query attention off the model's own mask, and refuses in one line what it cannot read
(a custom mask, a prepared 4-D mask that differs between rows, a soft-cap, an attention sink,
a family with a position bias). The decoders' parity with eager: tests/models/test_decoder_families.py."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS
from torch import nn
from transformers import AutoConfig, BertConfig, CamembertConfig, XLMRobertaConfig
from transformers.masking_utils import (
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    chunked_causal_mask_function,
    or_masks,
    padding_mask_function,
    sliding_window_bidirectional_mask_function,
    sliding_window_causal_mask_function,
)

from bertscope.errors import UserError
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.spec import PLAIN, AttentionLayout, StatsSpec
from bertscope.models import head_removal
from bertscope.models.architectures import (
    ARCHITECTURES,
    PAIR_MODEL_TYPES,
    PUNCT_TOKENS,
    SUPPORTED_MODEL_TYPES,
    architecture_of,
)
from bertscope.models.attention import KeyBand, bertscope_attention, key_padding_mask, key_valid_from_mask
from bertscope.models.loading import load_model
from bertscope.text.segments import MAX_SPECIAL, MIN_MAX_LEN

KINDS = ("bert", "roberta", "distilbert", "albert", "electra")  # the tiny models conftest builds


# --- the table ----------------------------------------------------------------------------


ENCODERS = ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "albert", "electra")


def test_the_supported_types_are_the_encoders_and_decoders_and_each_has_an_entry():
    decoders = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "olmo2", "phi3", "gpt2", "gpt_neox", "opt")
    assert SUPPORTED_MODEL_TYPES == (*ENCODERS, "modernbert", *decoders)
    for model_type in ENCODERS:
        arch = ARCHITECTURES[model_type]
        assert arch.model_type == model_type
        assert arch.removal is not None and arch.n_special is not None
        assert arch.layout(AutoConfig.for_model(model_type)) == PLAIN  # an encoder's attention
    for model_type in decoders:
        arch = ARCHITECTURES[model_type]
        assert arch.layout(AutoConfig.for_model(model_type)).causal and arch.n_special is None


def test_every_analysed_family_says_where_its_layers_are_and_why_heads_cannot_go():
    """The split: `layers` for every family bertscope analyses; `removal` optional, and where it is
    None a reason for the one-line refusal (`no_removal`)."""
    for model_type, arch in ARCHITECTURES.items():
        if arch.refused is None:
            assert arch.layers is not None, model_type
        if arch.removal is None and arch.refused is None:
            assert arch.no_removal and arch.removal_refused().endswith(arch.no_removal), model_type
        else:
            assert arch.removal_refused() is None or arch.refused is not None, model_type
    assert {t for t in SUPPORTED_MODEL_TYPES if ARCHITECTURES[t].removal is None} == {
        "modernbert", "olmo2", "phi3", "gpt2"}
    # shared prefixes of gated variants (bertscope.analyses.heads.variants): the BERT-style task
    # heads, which read the hidden states alone, as before the table said so
    assert {t for t in SUPPORTED_MODEL_TYPES if ARCHITECTURES[t].prefix_sharing} == {
        "bert", "roberta", "xlm-roberta", "camembert", "distilbert", "albert", "electra"}


def test_the_table_gives_each_layer_its_layout():
    from transformers import Gemma3TextConfig, MistralConfig, ModernBertConfig
    gemma = Gemma3TextConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, sliding_window=512,
                             layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    window = AttentionLayout(causal=True, window=(511, 0), n_key_value_heads=1)
    assert architecture_of(gemma).layouts(gemma) == [window, window, AttentionLayout(causal=True, n_key_value_heads=1)]
    mistral = MistralConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, sliding_window=8)
    assert architecture_of(mistral).layouts(mistral) == [AttentionLayout(causal=True, window=(7, 0))] * 2
    modernbert = ModernBertConfig(num_hidden_layers=3, local_attention=8, global_attn_every_n_layers=3)
    assert architecture_of(modernbert).layouts(modernbert) == [PLAIN, AttentionLayout(window=(4, 4)),
                                                               AttentionLayout(window=(4, 4))]


@pytest.mark.parametrize("model_type, bias", [("bloom", "ALiBi"), ("mpt", "ALiBi"), ("t5", "relative position buckets"),
                                              ("deberta", "disentangled"), ("deberta-v2", "disentangled")])
def test_families_with_a_position_bias_are_refused_by_name(model_type, bias):
    from bertscope.models.architectures import check_analysable
    with pytest.raises(UserError) as info:
        check_analysable(AutoConfig.for_model(model_type))
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"model type {model_type!r} adds a position bias")
    assert bias in message


def test_the_facts_moved_here_are_the_old_constants():
    # what segments.py and token_classes.py held before the table
    assert MIN_MAX_LEN == 8
    # text/segments.py names the bound (text lies below models in the core's layers); the table agrees
    assert MAX_SPECIAL == max(ARCHITECTURES[t].n_special[1] for t in PAIR_MODEL_TYPES)
    assert PUNCT_TOKENS == (".", ",", "Ġ.", "Ġ,", "▁.", "▁,")
    # the position offset: two places for the RoBERTa family, none for the others
    for model_type, config in (("xlm-roberta", XLMRobertaConfig(max_position_embeddings=514)),
                               ("camembert", CamembertConfig(max_position_embeddings=514))):
        assert architecture_of(config).max_len(config) == 512, model_type
    assert architecture_of("bert").max_len(BertConfig(max_position_embeddings=512)) == 512


def test_an_unknown_type_is_one_line_naming_the_supported_ones():
    with pytest.raises(UserError) as info:
        architecture_of("gptj")
    message = str(info.value)
    assert "\n" not in message and "'gptj' is not supported" in message
    assert all(t in message for t in SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("kind", KINDS)
def test_every_encoder_loads_as_before(kind, tiny_model, tmp_path):
    """Loaded from a checkpoint: the counts, the maximum length and the attention modules are
    those the per-family code found before the table (written out here as it was)."""
    model, tokenizer = tiny_model(kind)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_model(tmp_path)
    assert (loaded.model_type, loaded.n_layers, loaded.n_heads) == (kind, TINY_LAYERS, TINY_HEADS)
    assert loaded.architecture is ARCHITECTURES[kind]
    assert loaded.max_len == 128  # roberta: its 130 positions less the offset of 2
    assert loaded.model.config.max_position_embeddings == (130 if kind == "roberta" else 128)
    base = loaded.model
    for layer in range(TINY_LAYERS):
        parts = head_removal.attention_parts(loaded.model, layer)
        if kind == "distilbert":
            att = base.transformer.layer[layer].attention
            want = (att, att, "q_lin", att, "k_lin", att, "v_lin", att, "out_lin", ("n_heads",), "dim")
        elif kind == "albert":
            att = base.encoder.albert_layer_groups[0].albert_layers[0].attention
            want = (att, att, "query", att, "key", att, "value", att, "dense", ("num_attention_heads",),
                    "all_head_size")
        else:
            att = base.encoder.layer[layer].attention
            want = (att.self, att.self, "query", att.self, "key", att.self, "value", att.output, "dense",
                    ("num_attention_heads",), "all_head_size")
        got = (parts.module, *parts.q, *parts.k, *parts.v, *parts.out, parts.count_attrs, parts.size_attr)
        assert all(a is b if isinstance(a, nn.Module) else a == b for a, b in zip(got, want)), (kind, layer)


def test_albert_layers_share_their_group(tiny_model):
    model, _ = tiny_model("albert")
    model.config.num_hidden_groups = 1
    modules = {id(head_removal.attention_parts(model, layer).module) for layer in range(TINY_LAYERS)}
    assert len(modules) == 1


def test_a_bert_made_a_decoder_is_causal(tiny_model):
    model, _ = tiny_model("bert")
    model.config.is_decoder = True
    assert architecture_of(model.config).layout(model.config) == AttentionLayout(causal=True)


# --- the attention plug-in, call by call ---------------------------------------------------


def qkv(B=2, H=4, L=6, D=8, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k = torch.randn(B, kv_heads or H, L, D, generator=g)
    v = torch.randn(B, kv_heads or H, L, D, generator=g)
    return q, k, v


def one_line(info, *parts):
    message = str(info.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


def test_the_plug_in_refuses_a_prepared_causal_4d_mask():
    q, k, v = qkv()
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6)  # (B, 1, L, L)
    with pytest.raises(UserError) as info:
        bertscope_attention(nn.Module(), q, k, v, causal)
    one_line(info, "a prepared 4-D mask that differs between query rows", "pass a 2-D attention_mask")
    additive = torch.zeros(2, 1, 6, 6).masked_fill(~causal, torch.finfo(torch.float32).min)
    with pytest.raises(UserError, match="differs between query rows"):
        bertscope_attention(nn.Module(), q, k, v, additive)


def test_grouped_query_shapes_are_read_from_the_call():
    q, k, v = qkv(kv_heads=2)
    out, _ = bertscope_attention(nn.Module(), q, k, v, None)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, want)


def test_a_declared_causal_module_without_a_mask_is_causal():
    """As transformers' sdpa: with no mask, the module's is_causal decides."""
    q, k, v = qkv()
    module = nn.Module()
    module.is_causal = True
    out, _ = bertscope_attention(module, q, k, v, None)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, want)


@pytest.mark.parametrize("kwargs, what", [
    (dict(softcap=50.0), "a logit soft-cap (softcap=50.0)"),
    (dict(s_aux=torch.zeros(4)), "an attention-sink logit (s_aux)"),
    (dict(alibi_slopes=torch.zeros(4)), "an attention argument 'alibi_slopes' it does not know"),
    (dict(sliding_window=3), "says sliding_window=3 without a sliding-window mask"),
])
def test_the_plug_in_refuses_what_it_does_not_compute(kwargs, what):
    q, k, v = qkv()
    with pytest.raises(UserError) as info:
        bertscope_attention(nn.Module(), q, k, v, None, **kwargs)
    one_line(info, what)


def test_arguments_that_change_nothing_pass():
    q, k, v = qkv()
    want, _ = bertscope_attention(nn.Module(), q, k, v, None)
    got, _ = bertscope_attention(nn.Module(), q, k, v, None, softcap=None, s_aux=None, use_cache=True,
                                 position_ids=torch.arange(6)[None], deterministic=True)
    assert torch.equal(got, want)


def test_a_band_must_agree_with_what_the_call_says():
    q, k, v = qkv()
    module = nn.Module()
    module.is_causal = True
    band = KeyBand(None, AttentionLayout(causal=True, window=(2, 0)))
    bertscope_attention(module, q, k, v, band, sliding_window=3)  # the flash count: left extent + 1
    for kwargs in (dict(sliding_window=4), dict(sliding_window=None), dict()):
        with pytest.raises(UserError) as info:
            bertscope_attention(module, q, k, v, band, **kwargs)
        one_line(info, "cannot tell which it computes")
    with pytest.raises(UserError, match="says is_causal=False"):
        bertscope_attention(nn.Module(), q, k, v, band, sliding_window=3)


def test_a_padding_only_4d_mask_reads_as_the_2d_mask():
    q, k, v = qkv()
    valid = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # (B, L)
    as_bool = valid[:, None, None, :].expand(2, 1, 6, 6)
    as_bias = torch.zeros(2, 1, 6, 6).masked_fill(~as_bool, torch.finfo(torch.float32).min)
    for mask in (as_bool, as_bias):
        assert torch.equal(key_valid_from_mask(mask, q), valid)
        out, _ = bertscope_attention(nn.Module(), q, k, v, mask)
        want, _ = bertscope_attention(nn.Module(), q, k, v, valid)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    # and the padding mask changes the output (the test would see a mask read wrong)
    unmasked, _ = bertscope_attention(nn.Module(), q, k, v, None)
    assert not torch.allclose(unmasked[1], want[1])


# --- the mask function: facts, never an L x L tensor -------------------------------------------


def test_the_mask_function_hands_an_encoder_its_padding_mask_as_it_is():
    padding = torch.tensor([[True] * 4, [True, True, True, False]])
    assert key_padding_mask(2, 4, 4, mask_function=bidirectional_mask_function, attention_mask=padding) is padding


@pytest.mark.parametrize("mask_function, layout", [
    (causal_mask_function, AttentionLayout(causal=True)),
    (sliding_window_causal_mask_function(3), AttentionLayout(causal=True, window=(2, 0))),
    (and_masks(causal_mask_function, sliding_window_causal_mask_function(5)), AttentionLayout(causal=True,
                                                                                                window=(4, 0))),
    (sliding_window_bidirectional_mask_function(2), AttentionLayout(window=(2, 2))),
])
def test_the_mask_function_hands_over_padding_and_the_band(mask_function, layout):
    padding = torch.tensor([[False, False, True, True, True, True, True], [True] * 7])  # left padding
    band = key_padding_mask(2, 7, 7, mask_function=mask_function, attention_mask=padding)
    assert isinstance(band, KeyBand) and band.layout == layout
    assert torch.equal(band.key_valid, padding)
    assert key_padding_mask(2, 7, 7, mask_function=mask_function, attention_mask=None).key_valid is None
    # what transformers would have built, row by row, is the band and the padding
    from transformers.masking_utils import sdpa_mask

    from bertscope.kernels.spec import visible_mask
    full = sdpa_mask(2, 7, 7, mask_function=mask_function, attention_mask=padding, allow_is_causal_skip=False)
    assert torch.equal(full, visible_mask(padding, layout))


@pytest.mark.parametrize("mask_function, what", [
    (chunked_causal_mask_function(3, torch.zeros(2, dtype=torch.long)), "chunked_overlay"),
    (or_masks(causal_mask_function, lambda b, h, q, kv: q >= 0), "or_masks"),
    (lambda b, h, q, kv: kv <= q, "<lambda>"),
    (and_masks(causal_mask_function, padding_mask_function(torch.ones(2, 6, dtype=torch.bool))),
     "padding_mask_function"),
])
def test_the_mask_function_refuses_what_it_cannot_read(mask_function, what):
    config = AutoConfig.for_model("llama")
    with pytest.raises(UserError) as info:
        key_padding_mask(2, 6, 6, mask_function=mask_function, attention_mask=None, config=config)
    one_line(info, "model type 'llama' masks its attention with a mask made of", what,
             "which bertscope does not read")


def test_the_mask_function_refuses_a_cache_offset():
    with pytest.raises(UserError) as info:
        key_padding_mask(2, 1, 6, q_offset=5, mask_function=causal_mask_function, attention_mask=None)
    one_line(info, "not with a cache (generation)")


def test_a_mask_part_that_changed_meaning_is_caught_by_the_probe(monkeypatch):
    """The band is read off the parts' names and checked on a few rows: an overlay whose meaning
    changed (here: off by one) is refused, not misread."""
    from transformers import masking_utils

    def sliding_window_overlay(sliding_window):
        def inner_mask(batch_idx, head_idx, q_idx, kv_idx):
            return kv_idx >= q_idx - sliding_window  # one more key than transformers' overlay
        return inner_mask
    inner = sliding_window_overlay(3)
    inner.__module__ = masking_utils.__name__
    inner.__qualname__ = "sliding_window_overlay.<locals>.inner_mask"
    with pytest.raises(UserError) as info:
        key_padding_mask(1, 9, 9, mask_function=and_masks(inner, causal_mask_function), attention_mask=None)
    one_line(info, "does not keep to the band bertscope read from it (causal, window 2 left, 0 right)")


# --- the kernels' contract -------------------------------------------------------------------


def test_attention_stats_refuses_key_heads_the_layout_does_not_name():
    q2, k2, v2 = qkv(kv_heads=2)
    valid, classes = torch.ones(2, 6, dtype=torch.bool), torch.zeros(2, 6, dtype=torch.long)
    spec = StatsSpec(n_key_classes=1, entropy=True)
    with pytest.raises(ValueError, match="k has 2 heads; the layout says 4 key/value heads for 4 query heads"):
        attention_stats(q2, k2, v2, valid, classes, spec, backend="eager")
    # the oracle computes every layout
    _, stats = attention_stats(q2, k2, v2, valid, classes, spec, backend="eager",
                               layout=AttentionLayout(causal=True, n_key_value_heads=2))
    assert float(stats.entropy[:, :, 0].abs().max()) == 0.0  # the first query sees itself only


def test_the_layout_checks_its_fields():
    assert PLAIN.is_plain
    assert not AttentionLayout(causal=True).is_plain
    with pytest.raises(ValueError):
        AttentionLayout(window=(-1, 0))
    with pytest.raises(ValueError):
        AttentionLayout(n_key_value_heads=0)
