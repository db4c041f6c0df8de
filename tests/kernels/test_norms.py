"""The norm-based twins (Kobayashi et al. 2020, docs/norms.md): the oracle on hand-built inputs with a
known answer, the per-key value norms against the product by hand, and the plug-in's twins on a tiny
model of every family of the table against its own eager maps and norms computed by hand.
(Chunked against the oracle on drawn shapes, padding, causal, windows and GQA: the generated tests of
tests/kernels/test_stats_table.py, which read the twins from the table.)"""
import math

import pytest
import torch

from bertscope.kernels.backends import attention_stats
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.norms import head_factors, head_grams, output_weight, value_norms, value_norms_gram
from bertscope.kernels.spec import AttentionLayout, StatsSpec, refuse_unsupported
from bertscope.kernels.triton_attention import attention_stats_triton
from bertscope.models.architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES, attribute
from bertscope.models.attention import HeadProbe, ValueNorms
from bertscope.models.tiny import build, padded_batch, parity_config

SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=3, class_mass=True, norms=True)
# every backend computes every twin (Triton: in the fused kernel, through the interpreter here)
BACKENDS = [attention_stats_eager, attention_stats_chunked, attention_stats_triton]
BACKEND_IDS = ["eager", "chunked", "triton"]


def one_row(scores, norms, key_class, spec=SPEC, backend=attention_stats_eager):
    """The statistics of one query (row 0) scoring keys with `scores` (k = scores, q = 1, D = 1)."""
    L = len(scores)
    q = torch.zeros(1, 1, L, 1)
    q[0, 0, 0, 0] = 1.0
    k = torch.tensor(scores, dtype=torch.float32).view(1, 1, L, 1)
    valid = torch.ones(1, L, dtype=torch.bool)
    _, s = backend(q, k, k, valid, torch.tensor([key_class]), spec, scale=1.0,
                   norms=torch.tensor(norms, dtype=torch.float32).view(1, 1, L))
    return s


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_equal_value_norms_give_twins_equal_to_the_weights(backend):
    s = one_row([0.3, 1.2, -0.5, 0.0], [2.5] * 4, [0, 1, 2, 1], backend=backend)
    torch.testing.assert_close(s.class_mass_norm, s.class_mass)
    torch.testing.assert_close(s.offset_mass_norm, s.offset_mass)
    torch.testing.assert_close(s.weighted_norm[0, 0, 0], torch.tensor(2.5))  # sum_j p_j 2.5


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_a_key_with_a_zero_value_vector_gets_a_share_of_zero(backend):
    s = one_row([1.0, 0.1, 0.2], [1.0, 0.0, 2.0], [0, 1, 2], backend=backend)
    assert s.class_mass[0, 0, 0, 1] > 0.05  # it has weight
    assert s.class_mass_norm[0, 0, 0, 1].item() == 0.0  # and no norm share
    assert s.offset_mass_norm[0, 0, 0, 2].item() == 0.0  # (row 0's next key is key 1)
    assert s.offset_mass[0, 0, 0, 2] > 0.05


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_three_keys_by_hand(backend):
    """Scores 0, ln 2, ln 3: weights 1/6, 2/6, 3/6; norms 3, 1, 2: p n = 3/6, 2/6, 6/6, summing to 11/6,
    so the norm shares are 3/11, 2/11, 6/11 and the weighted norm 11/6."""
    s = one_row([0.0, math.log(2), math.log(3)], [3.0, 1.0, 2.0], [0, 1, 2], backend=backend)
    torch.testing.assert_close(s.class_mass[0, 0, 0], torch.tensor([1 / 6, 2 / 6, 3 / 6]))
    torch.testing.assert_close(s.class_mass_norm[0, 0, 0], torch.tensor([3 / 11, 2 / 11, 6 / 11]))
    torch.testing.assert_close(s.weighted_norm[0, 0, 0], torch.tensor(11 / 6))
    # row 0: offsets -1 (none), 0 (key 0), +1 (key 1)
    torch.testing.assert_close(s.offset_mass_norm[0, 0, 0], torch.tensor([0.0, 3 / 11, 2 / 11]))


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_the_twins_of_the_position_and_token_statistics_by_hand(backend):
    """The generic twin (the base's definition on p n / sum p n) on two keys with equal weights."""
    spec = StatsSpec(n_key_classes=1, distance=True, position_mass=True, norms=True)
    s = one_row([0.0, 0.0], [1.0, 3.0], [0, 0], spec=spec, backend=backend)
    # row 0: key 0 at distance 0 (bucket 0), key 1 at distance 1 (bucket 1): shares 1/4, 3/4
    torch.testing.assert_close(s.distance_mass_norm[0, 0, 0, :2], torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(s.distance_mass[0, 0, 0, :2], torch.tensor([0.5, 0.5]))
    assert s.mean_distance is not None and getattr(s, "mean_distance_norm", None) is None  # not a mass: no twin


def test_every_backend_computes_every_twin_and_needs_the_norms():
    q = torch.randn(1, 2, 4, 8)
    valid, klass = torch.ones(1, 4, dtype=torch.bool), torch.zeros(1, 4, dtype=torch.long)
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="norms"):
            backend(q, q, q, valid, klass, SPEC)
    every = StatsSpec(offsets=(0,), n_key_classes=3, class_mass=True, distance=True, position_mass=True,
                      token_relations=True, norms=True)
    for name in ("eager", "chunked", "triton"):
        refuse_unsupported(every, name)
    assert attention_stats(q, q, q, valid, klass, SPEC, backend="chunked", norms=torch.ones(1, 2, 4))[1].weighted_norm \
        is not None


@pytest.mark.parametrize("backend", BACKENDS, ids=BACKEND_IDS)
def test_the_twins_asked_by_name_are_the_only_ones_written(backend):
    """norms=("class_mass",) beside the offsets: the class twins and the weighted norm as with norms=True, the
    offsets' twin not computed (in the kernel, not written through a placeholder: its own switch)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 11, 16, generator=g) for _ in range(3))
    valid = torch.arange(11)[None] < torch.tensor([11, 7])[:, None]
    klass = torch.randint(0, 3, (2, 11), generator=g)
    norms = torch.rand(2, 4, 11, generator=g)
    every = StatsSpec(offsets=(-1, 0, 1), n_key_classes=3, class_mass=True, norms=True)
    named = StatsSpec(offsets=(-1, 0, 1), n_key_classes=3, class_mass=True, norms=("class_mass",))
    _, a = attention_stats_eager(q, k, v, valid, klass, every, norms=norms)
    _, b = backend(q, k, v, valid, klass, named, norms=norms)
    assert b.offset_mass_norm is None
    for name in ("offset_mass", "class_mass", "class_mass_norm", "weighted_norm"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-5, atol=1e-6, msg=name)


def test_norms_can_name_the_twins_asked_for():
    """`StatsSpec.norms` as a tuple asks for those bases' twins only (and the weighted norm); the union of two
    specs asks for both's; True for every twin wins; a name without a twin is a ValueError."""
    from bertscope.kernels.spec import asked_stats

    spec = StatsSpec(offsets=(0,), class_mass=True, distance=True, norms=["class_mass"])
    assert spec.norms == ("class_mass",)
    assert [s.name for s in asked_stats(spec) if s.switch == "norms"] == ["class_mass_norm", "weighted_norm"]
    both = spec.union(StatsSpec(offsets=(0,), norms=("offset_mass",)))
    assert both.norms == ("offset_mass", "class_mass")  # the table's order
    assert spec.union(StatsSpec(norms=True)).norms is True
    assert StatsSpec(norms=()).norms is False and StatsSpec(norms=1).norms is True
    with pytest.raises(ValueError, match="mean_distance"):
        StatsSpec(norms=("mean_distance",))


def test_norms_off_leaves_every_statistic_as_it_was():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=g) for _ in range(3))
    valid = torch.arange(9)[None] < torch.tensor([9, 5])[:, None]
    klass = torch.randint(0, 3, (2, 9), generator=g)
    off = StatsSpec(offsets=(-1, 0, 1), n_key_classes=3, class_mass=True, entropy=True)
    on = StatsSpec(offsets=(-1, 0, 1), n_key_classes=3, class_mass=True, entropy=True, norms=True)
    for backend in (attention_stats_eager, attention_stats_chunked):
        out0, a = backend(q, k, v, valid, klass, off)
        out1, b = backend(q, k, v, valid, klass, on, norms=torch.rand(2, 3, 9, generator=g))
        assert torch.equal(out0, out1)
        for name in ("entropy", "offset_mass", "class_mass"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.class_mass_norm is None and a.weighted_norm is None


# --- the per-key norms ------------------------------------------------------------------------------


def test_the_gram_factor_gives_the_product_s_norm_with_gqa():
    g = torch.Generator().manual_seed(0)
    H, H_kv, D, hidden = 6, 2, 4, 10
    w = torch.randn(hidden, H * D, generator=g, dtype=torch.float64)
    v = torch.randn(3, H_kv, 5, D, generator=g, dtype=torch.float64)
    want = torch.empty(3, H, 5, dtype=torch.float64)
    for h in range(H):
        f = v[:, h // (H // H_kv)] @ w[:, h * D:(h + 1) * D].T  # (B, L, hidden): v_j W_O^h, query head h's columns
        want[:, h] = f.norm(dim=-1)
    torch.testing.assert_close(value_norms(v.float(), head_factors(w, H)).double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value_norms_gram(v.float(), head_grams(w, H)).double(), want, rtol=1e-4, atol=1e-4)


def test_a_rank_deficient_output_projection():
    w = torch.zeros(6, 8)  # 2 heads of D = 4; head 1's columns all 0, head 0's of rank 1
    w[:, 0] = 1.0
    v = torch.ones(1, 2, 3, 4)
    n = value_norms(v, head_factors(w, 2))
    torch.testing.assert_close(n[0, 0], torch.full((3,), math.sqrt(6.0)))
    assert torch.equal(n[0, 1], torch.zeros(3))


def _head_outputs(projection, v_all, n_heads: int) -> torch.Tensor:
    """(B, H, L): ||f_h(x_j)|| through the projection module itself: head h's value vector put in its
    slot of a zero input, the projection applied, its bias (the output of a zero input) taken off."""
    B, H_kv, L, D = v_all.shape
    G = n_heads // H_kv
    zero = projection(torch.zeros(1, 1, n_heads * D))
    out = torch.empty(B, n_heads, L)
    for h in range(n_heads):
        z = torch.zeros(B, L, n_heads * D)
        z[..., h * D:(h + 1) * D] = v_all[:, h // G]
        out[:, h] = (projection(z) - zero).norm(dim=-1)
    return out


@pytest.mark.parametrize("kind", SUPPORTED_MODEL_TYPES)
def test_each_family_s_norms_and_twins_against_its_own_maps_and_projection(kind, monkeypatch):
    """A tiny model of every family of the table (GQA where it groups): the norms the plug-in computes
    are ||(x W_V + b_V) W_O^h|| through the family's own output projection (and, where the table knows a
    separate value projection, x W_V + b_V is that projection's output), and the twins the plug-in
    returns are those of the model's own eager maps weighted by those norms."""
    torch.manual_seed(0)
    arch = ARCHITECTURES[kind]
    inputs = padded_batch([7, 5], 7, left=arch.causal)
    valid = inputs["attention_mask"].bool()
    key_class = torch.randint(0, 3, valid.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        maps = build(kind, "eager")(**inputs, output_attentions=True, use_cache=False).attentions
    model = build(kind)
    n_layers, n_heads = arch.n_layers_heads(model.config)
    seen = []  # (layer module, value, norms) per call
    call = ValueNorms.__call__

    def spy(self, module, value, heads):
        n = call(self, module, value, heads)
        seen.append((module, value.clone(), n))
        return n

    monkeypatch.setattr(ValueNorms, "__call__", spy)
    value_out = {}
    if arch.removal is not None and arch.removal.v:  # a separate value projection: x W_V + b_V by hand
        for layer in range(n_layers):
            proj = attribute(arch.layer_module(model, layer), arch.removal.v)
            proj.register_forward_hook(lambda m, a, out, layer=layer: value_out.setdefault(layer, out.detach()))
    layers = []
    probe = HeadProbe(n_layers, n_heads, SPEC, backend="chunked", model=model)
    with torch.no_grad(), probe.active(key_class, lambda layer, stats, kv: layers.append(stats), padded=True,
                                       token_ids=inputs["input_ids"]):
        model(**inputs, use_cache=False)
    assert len(seen) == n_layers == len(layers)
    for layer, (module, v, n) in enumerate(seen):
        assert module is arch.attention_module(model, layer)
        projection = arch.output_projection(model, layer)
        B, H_kv, L, D = v.shape
        if layer in value_out:
            torch.testing.assert_close(v, value_out[layer].view(B, L, H_kv, D).transpose(1, 2))
        with torch.no_grad():
            want = _head_outputs(projection, v, n_heads)  # (B, H, L)
        torch.testing.assert_close(n, want, rtol=1e-4, atol=1e-5, msg=f"{kind} layer {layer}")
        # the twins against the model's own eager map, weighted by the norms by hand
        p = maps[layer].float()  # (B, H, L, L)
        w = p * (want * valid[:, None, :])[:, :, None, :]
        share = w / w.sum(-1, keepdim=True)
        onehot = torch.nn.functional.one_hot(key_class, 3).float()  # (B, L, 3)
        rows = valid[:, None, :, None]
        got = layers[layer]
        torch.testing.assert_close(got.class_mass_norm * rows, (share @ onehot[:, None]) * rows, rtol=1e-4, atol=2e-5)
        torch.testing.assert_close(got.weighted_norm * rows[..., 0], w.sum(-1) * rows[..., 0], rtol=1e-4, atol=2e-5)
        if arch.kv_heads_attr and model.config.num_key_value_heads != n_heads:
            assert H_kv < n_heads  # grouped-query: per query head norms from the shared values


def test_a_family_without_a_known_output_projection_is_refused_by_name(monkeypatch):
    import dataclasses

    from bertscope.errors import UserError

    model = build("bert", make_config=parity_config)
    arch = ARCHITECTURES["bert"]
    monkeypatch.setitem(ARCHITECTURES, "bert", dataclasses.replace(arch, layers=dataclasses.replace(arch.layers,
                                                                                                    output=None)))
    with pytest.raises(UserError, match="output projection of model type 'bert'"):
        ValueNorms(model)


def test_the_gram_factors_are_cached_until_the_weight_changes():
    model = build("llama")
    arch = ARCHITECTURES["llama"]
    norms = ValueNorms(model)
    module = arch.attention_module(model, 0)
    v = torch.randn(1, 2, 3, 8)
    first = norms(module, v, 4)
    assert norms(module, v, 4) is not first and len(norms._factors) == 1
    key = norms._factors[id(arch.output_projection(model, 0))][0]
    with torch.no_grad():
        output_weight(arch.output_projection(model, 0)).mul_(2)  # in place: a new version
    torch.testing.assert_close(norms(module, v, 4), 2 * first)
    assert norms._factors[id(arch.output_projection(model, 0))][0] != key


def test_causal_gqa_layout_chunked_matches_eager_with_left_padding():
    g = torch.Generator().manual_seed(3)
    layout = AttentionLayout(causal=True, window=(2, 0), n_key_value_heads=2)
    q = torch.randn(2, 4, 10, 8, generator=g)
    k, v = (torch.randn(2, 2, 10, 8, generator=g) for _ in range(2))
    valid = torch.arange(10)[None] >= torch.tensor([0, 4])[:, None]
    klass = torch.randint(0, 3, (2, 10), generator=g)
    norms = torch.rand(2, 4, 10, generator=g)
    _, a = attention_stats_eager(q, k, v, valid, klass, SPEC, layout=layout, norms=norms)
    _, b = attention_stats_chunked(q, k, v, valid, klass, SPEC, layout=layout, norms=norms)
    for name in ("class_mass_norm", "offset_mass_norm", "weighted_norm"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), atol=1e-6, rtol=1e-5)
    assert bool((a.class_mass_norm[1, :, :4] == 0).all())  # padding rows
    torch.testing.assert_close(a.class_mass_norm[0].sum(-1), torch.ones(4, 10))
