"""The architecture table (`bertscope.models.architectures`) and the attention contract's layout:
every supported encoder loads as before, and what bertscope does not compute yet (causal,
sliding-window and grouped-query attention) is refused in one line, at load time and in the
attention plug-in, never read as an encoder's attention."""
from __future__ import annotations

import re

import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS
from test_cli import check_error
from torch import nn
from transformers import AutoConfig, AutoModel, BertConfig, CamembertConfig, LlamaConfig, LlamaModel, XLMRobertaConfig
from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

from bertscope.cli.main import main
from bertscope.engine import attention
from bertscope.engine.attention import HeadProbe, bertscope_attention, key_padding_mask, key_valid_from_mask
from bertscope.errors import UserError
from bertscope.kernels import LAYOUT_BACKENDS, PLAIN, AttentionLayout, StatsSpec, attention_stats
from bertscope.models import head_removal
from bertscope.models.architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES, architecture_of
from bertscope.models.loading import load_model, wrap_model
from bertscope.text.segments import MIN_MAX_LEN
from bertscope.text.token_classes import PUNCT_TOKENS

KINDS = ("bert", "roberta", "distilbert", "albert", "electra")  # the tiny models conftest builds


# --- the table ----------------------------------------------------------------------------


def test_the_supported_types_are_todays_encoders_and_each_has_an_entry():
    assert SUPPORTED_MODEL_TYPES == ("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "albert", "electra")
    for model_type in SUPPORTED_MODEL_TYPES:
        arch = ARCHITECTURES[model_type]
        assert arch.model_type == model_type
        assert arch.modules is not None and arch.n_special is not None
        assert arch.layout(AutoConfig.for_model(model_type)) == PLAIN  # an encoder's attention


def test_the_facts_moved_here_are_the_old_constants():
    # what segments.py and token_classes.py held before the table
    assert MIN_MAX_LEN == 8
    assert PUNCT_TOKENS == (".", ",", "Ġ.", "Ġ,", "▁.", "▁,")
    # the position offset: two places for the RoBERTa family, none for the others
    for model_type, config in (("xlm-roberta", XLMRobertaConfig(max_position_embeddings=514)),
                               ("camembert", CamembertConfig(max_position_embeddings=514))):
        assert architecture_of(config).max_len(config) == 512, model_type
    assert architecture_of("bert").max_len(BertConfig(max_position_embeddings=512)) == 512


def test_an_unknown_type_is_one_line_naming_the_supported_ones():
    with pytest.raises(UserError) as info:
        architecture_of("gpt2")
    message = str(info.value)
    assert "\n" not in message and "'gpt2' is not supported" in message
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


def test_a_bert_made_a_decoder_is_refused_at_load(tiny_model, tmp_path):
    model, tokenizer = tiny_model("bert")
    model.config.is_decoder = True
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="model type 'bert' has causal attention"):
        load_model(tmp_path)


# --- a tiny random Llama: refused, not misread -------------------------------------------------


def llama_config(kv_heads: int = 2) -> LlamaConfig:
    return LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64)


@pytest.fixture
def llama_checkpoint(tmp_path, minilm_tokenizer):
    path = tmp_path / "tiny-llama"
    torch.manual_seed(0)
    LlamaModel(llama_config()).save_pretrained(path)
    minilm_tokenizer.save_pretrained(path)  # a tokenizer, so that only the architecture can be refused
    return path


def test_load_model_refuses_a_llama_in_one_line(llama_checkpoint):
    with pytest.raises(UserError) as info:
        load_model(llama_checkpoint)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("model type 'llama' has causal attention and grouped-query attention "
                              "(2 key/value heads for 4 query heads), which bertscope does not analyse yet")


def test_the_cli_refuses_a_llama_exit_2_one_line(llama_checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. It was warm.\nA dog ran. It barked.\n", encoding="utf-8")
    code = main(["run", "--model", str(llama_checkpoint), "--corpus", str(corpus), "--out", str(tmp_path / "out"),
                 "--quiet", "--no-figures"])
    check_error(capsys, code, "model type 'llama' has causal attention and grouped-query attention")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_wrap_model_refuses_a_llama(minilm_tokenizer):
    with pytest.raises(UserError, match="'llama' has causal attention"):
        wrap_model(LlamaModel(llama_config()), minilm_tokenizer)


@pytest.mark.parametrize("kv_heads, what", [(2, "causal attention and grouped-query attention (2 key/value heads "
                                                 "for 4 query heads)"),
                                            (4, "causal attention,")])
def test_the_plug_in_refuses_a_llama_built_past_the_loader(kv_heads, what, single_thread):
    """Built with the bertscope attention directly (no load-time check): the forward pass is
    refused at its first attention call, inside an analysis and outside one."""
    torch.manual_seed(0)
    model = AutoModel.from_config(llama_config(kv_heads), attn_implementation=attention.ATTN_IMPLEMENTATION).eval()
    ids, mask = torch.tensor([[1, 5, 7, 9, 2], [1, 4, 2, 0, 0]]), torch.tensor([[1] * 5, [1, 1, 1, 0, 0]])
    with pytest.raises(UserError, match=re.escape(f"model type 'llama' has {what}")):
        model(input_ids=ids, attention_mask=mask)
    probe = HeadProbe(2, 4, StatsSpec())
    with pytest.raises(UserError, match=re.escape(f"model type 'llama' has {what}")):
        with probe.active(torch.zeros(2, 5, dtype=torch.long), lambda *a: None):
            model(input_ids=ids, attention_mask=mask)


# --- the attention plug-in, call by call ---------------------------------------------------


def qkv(B=2, H=4, L=6, D=8, kv_heads=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k = torch.randn(B, kv_heads or H, L, D, generator=g)
    v = torch.randn(B, kv_heads or H, L, D, generator=g)
    return q, k, v


def test_the_plug_in_refuses_a_causal_4d_mask():
    q, k, v = qkv()
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 1, 6, 6)  # (B, 1, L, L)
    with pytest.raises(UserError) as info:
        bertscope_attention(nn.Module(), q, k, v, causal)
    assert "an attention mask that differs between query rows" in str(info.value)
    assert "\n" not in str(info.value)
    additive = torch.zeros(2, 1, 6, 6).masked_fill(~causal, torch.finfo(torch.float32).min)
    with pytest.raises(UserError, match="differs between query rows"):
        bertscope_attention(nn.Module(), q, k, v, additive)


def test_the_plug_in_refuses_grouped_query_shapes():
    q, k, v = qkv(kv_heads=2)
    with pytest.raises(UserError, match=r"grouped-query attention \(2 key/value heads for 4 query heads\)"):
        bertscope_attention(nn.Module(), q, k, v, None)


def test_the_plug_in_refuses_a_declared_causal_module_and_a_window():
    q, k, v = qkv()
    module = nn.Module()
    module.is_causal = True
    with pytest.raises(UserError, match="has causal attention"):
        bertscope_attention(module, q, k, v, None)
    with pytest.raises(UserError, match=r"sliding-window attention \(window 3 left, 3 right\)"):
        bertscope_attention(nn.Module(), q, k, v, None, sliding_window=3)


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


def test_the_mask_function_hands_other_masks_over_in_full():
    padding = torch.tensor([[True] * 4, [True, True, True, False]])
    assert key_padding_mask(2, 4, 4, mask_function=bidirectional_mask_function, attention_mask=padding) is padding
    full = key_padding_mask(2, 4, 4, mask_function=causal_mask_function, attention_mask=padding)
    assert full.shape == (2, 1, 4, 4)
    assert torch.equal(full[0, 0], torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(full[1, 0, 3], torch.tensor([True, True, True, False]))


# --- the kernels' contract -------------------------------------------------------------------


def test_attention_stats_refuses_a_layout_a_backend_does_not_compute():
    q, k, v = qkv()
    q2, k2, v2 = qkv(kv_heads=2)
    valid, classes = torch.ones(2, 6, dtype=torch.bool), torch.zeros(2, 6, dtype=torch.long)
    spec = StatsSpec(n_key_classes=1, entropy=True)
    for backend in sorted({"chunked"} - LAYOUT_BACKENDS):
        for layout, what in ((AttentionLayout(causal=True), "causal"), (AttentionLayout(window=(2, 0)), "window 2"),
                             (AttentionLayout(n_key_value_heads=2), "2 key/value heads")):
            qkv_ = (q2, k2, v2) if layout.n_key_value_heads else (q, k, v)
            with pytest.raises(ValueError, match=f"the {backend} backend does not compute .*{what}"):
                attention_stats(*qkv_, valid, classes, spec, backend=backend, layout=layout)
    with pytest.raises(ValueError, match="k has 2 heads; the layout says 4 key/value heads for 4 query heads"):
        attention_stats(q2, k2, v2, valid, classes, spec, backend="eager")
    # the oracle computes every layout
    _, stats = attention_stats(q2, k2, v2, valid, classes, spec, backend="eager",
                               layout=AttentionLayout(causal=True, n_key_value_heads=2))
    assert float(stats.entropy[:, :, 0].abs().max()) == 0.0  # the first query sees itself only


def test_the_layout_checks_its_fields():
    assert PLAIN.is_plain and PLAIN.unsupported() == []
    assert not AttentionLayout(causal=True).is_plain
    with pytest.raises(ValueError):
        AttentionLayout(window=(-1, 0))
    with pytest.raises(ValueError):
        AttentionLayout(n_key_value_heads=0)
