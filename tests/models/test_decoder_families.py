"""Decoders and windowed encoders through the attention plug-in: every statistic equals what the
model's own eager attention returns with output_attentions, on a padded batch.

Each family of `bertscope.models.architectures` that is not a BERT-style encoder is built tiny and
random here (2 layers, 4 query heads; 2 key/value heads where the family has grouped-query
attention; a sliding window small enough to bite where it has one: Mistral on every layer, Qwen2
and Gemma-3 on the layers `layer_types` names, ModernBERT's bidirectional local layers, Phi-3 on
every layer; the families added after these take the table's `tiny_config`; all of them:
`bertscope.models.tiny.parity_config`, whose models tools/parity.py runs too). KINDS is every such
family of the table: a family added there is tested here without a word. Decoders get a
left-padded batch (their position ids counted from each sequence's first real token, as the
engine hands them), ModernBERT a right-padded one; one sequence is a single token. The
statistics of every backend are compared, on the valid rows, with the same
statistics computed by their definitions from the eager maps; the hidden states too. Then the
refusals, the head gates and the real removal of heads on grouped-query models.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModel, Gemma2Config, Gemma3TextConfig, MistralConfig, ModernBertConfig, Phi3Config

from bertscope.errors import UserError
from bertscope.kernels.backends import BACKENDS
from bertscope.kernels.reference import stats_from_probs
from bertscope.kernels.spec import ROW_STATS, AttentionLayout, StatsSpec, visible_mask
from bertscope.models import head_removal
from bertscope.models.architectures import ARCHITECTURES, architecture_of
from bertscope.models.attention import ATTN_IMPLEMENTATION, GradProbe, HeadProbe
from bertscope.models.gates import attach_gates
from bertscope.models.tiny import (
    HEADS,
    HIDDEN,
    KINDS,
    KV_HEADS,
    LAYERS,
    SPEC,
    build,
    padded_batch,
    parity_config,
    run_both,
)

pytestmark = pytest.mark.usefixtures("single_thread")

COMMON = dict(vocab_size=50, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, max_position_embeddings=64, initializer_range=0.4)
DECODER = dict(COMMON, num_key_value_heads=KV_HEADS)
tiny_config = parity_config  # the configs of this test and tools/parity.py: bertscope/models/tiny.py


def check_parity(kind, lengths, L, backend, left=None, atol=2e-5, make_config=parity_config):
    ref, hidden, layers, valid, key_class, pooling = run_both(kind, lengths, L, backend, left, make_config)
    torch.testing.assert_close(hidden[valid], ref.last_hidden_state[valid], atol=atol, rtol=1e-4)
    rows = valid[:, None, :].expand(-1, HEADS, -1)  # (B, H, L) the valid query rows
    # the batch run_both ran (its token ids: the token relations)
    ids = padded_batch(lengths, L, ARCHITECTURES[kind].causal if left is None else left)["input_ids"]
    for layer, (stats, p) in enumerate(zip(layers, ref.attentions)):
        want = stats_from_probs(p, valid, key_class, SPEC, pooling=pooling, token_ids=ids)  # the oracle, off HF maps
        for stat in ROW_STATS:  # every entry of the table; indices below, where no near-tie decides them
            if not stat.asked(SPEC):  # the streaming error: not read off a map (tiny.SPEC says why)
                continue
            if stat.dtype == "float":
                got, ref_t = getattr(stats, stat.name), getattr(want, stat.name)
                if stat.padding is not None:  # per query row: the valid rows
                    got, ref_t = got[rows], ref_t[rows]
                torch.testing.assert_close(got, ref_t, atol=atol, rtol=1e-4, msg=f"{kind} layer {layer} {stat.name}")
        top2 = torch.cat([p, torch.zeros_like(p[..., :1])], -1).topk(2, dim=-1).values  # argmax but near-ties
        clear = rows & ((top2[..., 0] - top2[..., 1]) > 1e-4)
        assert torch.equal(stats.argmax[clear], want.argmax[clear]), (kind, layer)
    return ref, layers, valid


# the CPU backends here; triton under its interpreter: a tiny Llama in tests/kernels/test_triton_layout.py
CPU_BACKENDS = sorted(set(BACKENDS) - {"triton"})


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_statistic_equals_the_models_own_eager_attention(kind, backend):
    _, layers, valid = check_parity(kind, lengths=(9, 6, 1), L=9, backend=backend)
    arch = architecture_of(tiny_config(kind))
    assert [s.layout for s in layers] == arch.layouts(tiny_config(kind))  # the table says what the mask does
    if arch.causal:  # nothing after itself: offset +1 and +2 are exactly 0, the first real token sees itself only
        assert float(layers[0].offset_mass[..., 3:].abs().max()) == 0.0
        first = (valid.long().cumsum(-1) == 1) & valid  # (B, L)
        assert torch.equal(layers[0].offset_mass[..., 2][first[:, None].expand(-1, HEADS, -1)],
                           torch.ones(int(first.sum()) * HEADS))


@pytest.mark.parametrize("kind", ("llama", "gemma3_text"))
def test_right_padding_works_for_decoders_too(kind):
    check_parity(kind, lengths=(7, 3), L=7, backend="eager", left=False)


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["mistral", "phi3", "gemma3_text", "modernbert"]),
       lengths=st.lists(st.integers(1, 11), min_size=1, max_size=3), extra=st.integers(0, 2),
       left=st.booleans(), window=st.sampled_from([1, 2, 5]), kv_heads=st.sampled_from([1, 2, 4]))
def test_parity_on_random_shapes(kind, lengths, extra, left, window, kv_heads):
    """Odd lengths, left and right padding, single-key rows, windows down to one key (Mistral,
    Phi-3 and Gemma-3: causal; ModernBERT: `window` keys each side), 1, 2 or 4 key/value heads."""
    def config(kind):
        if kind == "mistral":
            return MistralConfig(**dict(DECODER, num_key_value_heads=kv_heads), sliding_window=window)
        if kind == "phi3":  # one fused qkv_proj, split by the key/value head count
            return Phi3Config(**dict(DECODER, num_key_value_heads=kv_heads), sliding_window=window, pad_token_id=0)
        if kind == "gemma3_text":
            return Gemma3TextConfig(**dict(DECODER, num_key_value_heads=kv_heads), head_dim=8, sliding_window=window,
                                    query_pre_attn_scalar=8, layer_types=["full_attention", "sliding_attention"])
        return ModernBertConfig(**COMMON, local_attention=2 * window, global_attn_every_n_layers=2, pad_token_id=0,
                                bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    check_parity(kind, lengths=tuple(lengths), L=max(lengths) + extra, backend="eager", left=left, make_config=config)


@pytest.mark.parametrize("kind", ("llama", "gpt2"))
def test_a_left_padded_sequence_is_the_sequence_alone(kind):
    """With position ids from the first real token, left padding changes nothing (GPT-2's absolute
    position embeddings included)."""
    model = build(kind)
    batch = padded_batch((4, 7), 7, left=True)
    alone = {k: v[:1, 3:] for k, v in batch.items()}
    with torch.no_grad():
        both = model(**batch).last_hidden_state
        one = model(**alone).last_hidden_state
    torch.testing.assert_close(both[0, 3:], one[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_the_plain_path_equals_eager(kind):
    """Outside an analysis (a plain forward, cache on as by default) the output is eager's."""
    inputs = padded_batch((8, 5, 1), 8, left=ARCHITECTURES[kind].causal)
    valid = inputs["attention_mask"].bool()
    with torch.no_grad():
        want = build(kind, "eager")(**inputs).last_hidden_state
        got = build(kind)(**inputs).last_hidden_state
    torch.testing.assert_close(got[valid], want[valid], atol=2e-5, rtol=1e-4)


def test_every_family_of_the_table_has_a_tiny_model():
    """KINDS comes from the table: a family added there without a tiny config here fails."""
    assert {"gpt2", "modernbert", "gpt_neox", "phi3", "olmo2", "opt"} <= set(KINDS)
    for kind in KINDS:
        assert tiny_config(kind).model_type == kind


# --- refusals, one line each ---------------------------------------------------------------------


def one_line(info, *parts):
    message = str(info.value)
    assert "\n" not in message, message
    for part in parts:
        assert part in message, message


def test_a_gemma2_soft_cap_is_refused():
    torch.manual_seed(0)
    config = Gemma2Config(**DECODER, head_dim=8, sliding_window=4, attn_logit_softcapping=50.0)
    model = AutoModel.from_config(config, attn_implementation=ATTN_IMPLEMENTATION).eval()
    with pytest.raises(UserError) as info:
        model(**padded_batch((5, 3), 5, left=True))
    one_line(info, "model type 'gemma2' passes its attention a logit soft-cap (softcap=50.0)")


def test_gemma3_bidirectional_attention_is_refused():
    config = tiny_config("gemma3_text")
    config.use_bidirectional_attention = True
    torch.manual_seed(0)
    model = AutoModel.from_config(config, attn_implementation=ATTN_IMPLEMENTATION).eval()
    with pytest.raises(UserError) as info:
        model(**padded_batch((5, 3), 5, left=False))
    one_line(info, "model type 'gemma3_text' masks its attention with a mask made of", "or_masks",
             "which bertscope does not read")


def test_generation_with_a_cache_is_refused():
    model = build("llama")
    batch = padded_batch((5,), 5, left=True)
    with torch.no_grad():
        out = model(**batch, use_cache=True)
        with pytest.raises(UserError) as info:
            model(input_ids=torch.tensor([[7]]), attention_mask=torch.ones(1, 6, dtype=torch.long),
                  cache=out.past_key_values, position_ids=torch.tensor([[5]]))
    one_line(info, "not with a cache (generation)", "attn_implementation='sdpa'")


def test_attention_gradients_refuse_a_decoder():
    model = build("llama")
    probe = GradProbe(LAYERS, 2)
    batch = padded_batch((5, 3), 5, left=True)
    with pytest.raises(UserError) as info, probe.active(torch.zeros(2, 5, dtype=torch.long), lambda *a: None):
        model(**batch)
    one_line(info, "attention gradients cover bidirectional attention", "causal, 2 key/value heads")


# --- head gates and head removal on grouped-query attention ----------------------------------------


def attention_inputs(model, batch, layer=0):
    """(v (B, H_kv, L, D), o_proj's input (B, L, H * D)) of `layer` in a forward of `batch`."""
    seen = {}
    attn = model.layers[layer].self_attn
    hooks = [attn.v_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("v", out)),
             attn.o_proj.register_forward_hook(lambda m, a, out: seen.__setitem__("o", a[0]))]
    try:
        with torch.no_grad():
            model(**batch)
    finally:
        for h in hooks:
            h.remove()
    B, L, _ = seen["v"].shape
    return seen["v"].view(B, L, -1, 8).transpose(1, 2), seen["o"]


@pytest.mark.parametrize("kind", ("mistral", "gemma3_text"))
@pytest.mark.parametrize("analysed", (False, True))
def test_gates_act_per_query_head(kind, analysed):
    """xi scales one query head's output; a uniform head averages V (its key/value head's) over the
    keys its row sees (the window and the causal band, padding left out); the other head of the
    same key/value group is untouched. On the plain path and inside an analysis alike."""
    model = build(kind)
    gates = attach_gates(model, LAYERS, HEADS)
    batch = padded_batch((9, 6), 9, left=True)
    valid = batch["attention_mask"].bool()
    v, plain = attention_inputs(model, batch)
    gates.xi = torch.tensor([[0.5, 1.0, 1.0, 1.0], [1.0] * 4])
    gates.uniform = torch.tensor([[False, False, True, False], [False] * 4])

    def forward():
        if not analysed:
            return attention_inputs(model, batch)[1]
        probe = HeadProbe(LAYERS, HEADS, StatsSpec(entropy=True), backend="eager")
        with probe.active(torch.zeros_like(batch["input_ids"]), lambda *a: None):
            return attention_inputs(model, batch)[1]
    gated = forward().view(2, 9, HEADS, 8)
    plain = plain.view(2, 9, HEADS, 8)
    D = valid[:, :, None]
    torch.testing.assert_close(gated[..., 0, :] * D, 0.5 * plain[..., 0, :] * D)
    torch.testing.assert_close(gated[..., 1, :] * D, plain[..., 1, :] * D)  # shares key/value head 0 with head 0
    torch.testing.assert_close(gated[..., 3, :] * D, plain[..., 3, :] * D)
    layout = architecture_of(model.config).layout(model.config, 0)
    see = visible_mask(valid, layout)[:, 0].float()  # (B, L, L)
    mean = (see @ v[:, 1]) / see.sum(-1, keepdim=True).clamp_min(1)  # head 2 reads key/value head 1
    torch.testing.assert_close(gated[..., 2, :] * D, mean * D)
    assert not torch.allclose(gated[..., 2, :] * D, plain[..., 2, :] * D)  # the gate did something


def zero_gated(model, heads, batch):
    gates = attach_gates(model, LAYERS, HEADS)
    xi = torch.ones(LAYERS, HEADS)
    for layer, hs in heads.items():
        xi[layer, hs] = 0.0
    gates.xi = xi
    with torch.no_grad():
        out = model(**batch).last_hidden_state
    gates.reset()
    return out


@pytest.mark.parametrize("kind", [k for k in KINDS if ARCHITECTURES[k].removal is not None])
def test_removing_whole_key_value_groups_equals_zero_gating(kind):
    """Every family of the table whose heads can be removed: the pruned model is the zero-gated one."""
    model = build(kind)
    batch = padded_batch((7, 4), 7, left=True)
    valid = batch["attention_mask"].bool()
    heads = {0: [2, 3], 1: [0, 1, 2, 3]}  # one group of layer 0 (key/value head 1), all of layer 1
    want = zero_gated(model, heads, batch)
    with torch.no_grad():
        full = model(**batch).last_hidden_state
    head_removal.prune_heads(model, heads)
    parts = head_removal.attention_parts(model, 0)
    kv_kept = 2 // head_removal.kv_group(model.config)  # one key/value head left with groups of 2, else 2
    if parts.fused:  # one projection, q, k and v rows of each kept head (GPT-NeoX)
        assert getattr(*parts.q).weight.shape[0] == 2 * 3 * 8
    else:
        rows = {name: getattr(*getattr(parts, name)).weight.shape[0] for name in ("q", "k", "v")}
        assert rows == {"q": 2 * 8, "k": kv_kept * 8, "v": kv_kept * 8}
    assert getattr(*parts.out).weight.shape[1] == 2 * 8
    assert head_removal.attention_parts(model, 1).module.bertscope_head_slots == (head_removal.PLACEHOLDER,)
    with torch.no_grad():
        got = model(**batch).last_hidden_state
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    assert (got - full)[valid].abs().max() > 1e-3  # removing heads changed the output
    # statistics: the kept heads' in their slots, the removed ones NaN
    seen = []
    probe = HeadProbe(LAYERS, HEADS, StatsSpec(entropy=True), backend="eager")
    with torch.no_grad(), probe.active(torch.zeros_like(batch["input_ids"]), lambda layer, s, kv: seen.append(s)):
        model(**batch)
    assert seen[0].entropy[:, 2:].isnan().all() and not seen[0].entropy[:, :2].isnan().any()
    assert seen[1].entropy.isnan().all()


def test_a_pruned_gqa_model_saves_and_loads(tmp_path, minilm_tokenizer):
    from bertscope.models.loading import load_model

    model = build("llama")
    batch = padded_batch((6, 3), 6, left=True)
    head_removal.prune_heads(model, {1: [0, 1]})
    with torch.no_grad():
        want = model(**batch).last_hidden_state
    head_removal.save_pruned(model, minilm_tokenizer, tmp_path / "pruned")
    loaded = load_model(tmp_path / "pruned")
    assert loaded.pruned_heads == {1: [0, 1]}
    with torch.no_grad():
        got = loaded.model(**batch).last_hidden_state
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_removing_part_of_a_key_value_group_is_refused():
    model = build("gemma3_text")
    before = {name: p.shape for name, p in model.named_parameters()}
    with pytest.raises(ValueError) as info:
        head_removal.prune_heads(model, {0: [0, 2, 3]})
    one_line(info, "layer 1: 1-1 shares key/value head 1 with kept 1-2: remove all 2 query heads of a key/value "
                   "group (1-1, 1-2) or none")
    assert {name: p.shape for name, p in model.named_parameters()} == before  # nothing was touched


@pytest.mark.parametrize("kind", [k for k in KINDS if ARCHITECTURES[k].removal is None])
def test_families_without_head_removal_refuse_it_in_one_line(kind):
    model = build(kind)
    before = {name: p.shape for name, p in model.named_parameters()}
    with pytest.raises(ValueError) as info:
        head_removal.prune_heads(model, {0: [1]})
    one_line(info, f"cannot remove heads of model type {kind!r}: {ARCHITECTURES[kind].no_removal}")
    assert {name: p.shape for name, p in model.named_parameters()} == before  # nothing was touched
    assert head_removal.kept_heads(model) == {layer: list(range(HEADS)) for layer in range(LAYERS)}


def test_a_layout_per_layer_comes_from_the_table():
    config = tiny_config("gemma3_text")
    assert architecture_of(config).layouts(config) == [
        AttentionLayout(causal=True, window=(3, 0), n_key_value_heads=2), AttentionLayout(causal=True,
                                                                                           n_key_value_heads=2)]


# --- through the engine -------------------------------------------------------------------------------


def loaded_decoder(kind, tokenizer):
    from bertscope.models.loading import wrap_model

    config = tiny_config(kind)
    config.vocab_size = len(tokenizer)
    torch.manual_seed(0)
    return wrap_model(AutoModel.from_config(config, attn_implementation=ATTN_IMPLEMENTATION).eval(), tokenizer)


@pytest.mark.parametrize("kind", ("llama", "gpt2", "gemma3_text"))
def test_the_engine_is_invariant_to_padding_on_decoders(kind, minilm_tokenizer):
    """Segments alone, in one padded batch and in mixed batches: the same sums (the engine hands
    decoders their position ids and no cache)."""
    import random

    from test_engine import SPEC as ENGINE_SPEC
    from test_engine import assert_stats_close, random_segments, stats_over

    loaded = loaded_decoder(kind, minilm_tokenizer)
    assert loaded.forward_options == {"use_cache": False}
    segments = random_segments(minilm_tokenizer, n=9)
    backend = "chunked"
    alone = stats_over(loaded, [[s] for s in segments], spec=ENGINE_SPEC, backend=backend)
    together = stats_over(loaded, [segments], spec=ENGINE_SPEC, backend=backend)
    shuffled = segments[:]
    random.Random(3).shuffle(shuffled)
    mixed = stats_over(loaded, [shuffled[:4], shuffled[4:]], spec=ENGINE_SPEC, backend=backend)
    assert_stats_close(alone, together, rtol=1e-4, atol=1e-6)
    assert_stats_close(alone, mixed, rtol=1e-4, atol=1e-6)
    nxt = ENGINE_SPEC.offsets.index(1)
    assert float(abs(alone.offset_mass_sum[..., nxt]).max()) == 0.0  # causal: never the next token


def test_bertscope_run_on_a_tiny_llama(tmp_path, minilm_tokenizer, monkeypatch):
    import json

    from bertscope.cli.main import main

    path = tmp_path / "tiny-llama"
    loaded_decoder("llama", minilm_tokenizer).model.save_pretrained(path)
    minilm_tokenizer.save_pretrained(path)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat. It was warm.\nA dog ran. It barked at the postman, who ran away.\n"
                      "Short.\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--model", str(path), "--corpus", str(corpus), "--out", str(tmp_path / "out"),
                 "--backend", "chunked", "--max-len", "64", "--quiet", "--no-figures"])
    assert code == 0
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["status"] == "complete" and run["model"]["type"] == "llama"
    assert (tmp_path / "out" / "heads.csv").is_file()


def test_dxi_on_a_grouped_query_decoder_equals_a_finite_difference():
    """The gates' gradient on the plain path (SDPA with the band, then xi) on a GQA decoder."""
    model = build("gemma3_text").double()
    gates = attach_gates(model, LAYERS, HEADS)
    batch = padded_batch((7, 4), 7, left=True)
    valid = batch["attention_mask"].bool()
    weights = torch.randn(int(valid.sum()), HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def loss(xi):  # a random projection: the sum of squares after the final RMS norm is a constant
        gates.xi = xi
        return (model(**batch, use_cache=False).last_hidden_state[valid] * weights).sum()
    xi = torch.ones(LAYERS, HEADS, dtype=torch.float64, requires_grad=True)
    loss(xi).backward()
    eps = 1e-3  # the RMS norms compute in float32 even in a float64 model: a smaller step is noise
    for layer, head in ((0, 1), (1, 2)):
        up, down = torch.ones(LAYERS, HEADS, dtype=torch.float64), torch.ones(LAYERS, HEADS, dtype=torch.float64)
        up[layer, head] += eps
        down[layer, head] -= eps
        with torch.no_grad():
            fd = (loss(up) - loss(down)) / (2 * eps)
        torch.testing.assert_close(xi.grad[layer, head], fd, rtol=2e-3, atol=1e-4)
    assert float(xi.grad.abs().min()) > 0
    gates.reset()


def test_gpt2_gets_no_token_type_ids(minilm_tokenizer):
    """GPT-2 would look token types up in its word embeddings: the engine hands it none."""
    from test_engine import random_segments

    from bertscope.engine.loop import collate_batch

    loaded = loaded_decoder("gpt2", minilm_tokenizer)
    assert not loaded.takes_token_types
    segments = random_segments(minilm_tokenizer, n=4)
    batch = collate_batch(loaded, segments, range(4), StatsSpec(n_key_classes=4))
    assert set(batch.inputs) == {"input_ids", "attention_mask", "position_ids"}


