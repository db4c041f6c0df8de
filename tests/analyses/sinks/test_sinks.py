"""`bertscope sinks`: the accumulator against known answers and against the model's own eager maps.

- hand-built RowStats whose sums are worked out by hand;
- a tiny Gemma-3 (a sliding-window layer of 4 keys, then a global one; 4 query heads on 2 key/value
  heads) whose queries are zeroed, so every row attends uniformly to the keys it sees: row i puts
  1 / (i + 1) on the first token, and a windowed row that cannot see it 1 / 4 on each of its keys;
- random tiny decoders (Llama, Gemma-3 with random windows and key/value heads) against
  `output_attentions` of each segment alone, left- and right-padded;
- Sun et al.'s hook against `output_hidden_states`.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertscope.analyses.sinks import stats as S
from bertscope.engine.batch import BatchContext
from bertscope.kernels.backends import BACKENDS as ALL_BACKENDS
from bertscope.kernels.spec import AttentionLayout, RowStats
from bertscope.models.attention import ATTN_IMPLEMENTATION, HeadProbe
from bertscope.text.token_classes import first_token_class

pytestmark = pytest.mark.usefixtures("single_thread")

BACKENDS = sorted(set(ALL_BACKENDS) - {"triton"})


# --- the small pieces ---------------------------------------------------------------------------


def test_buckets_are_log2_with_position_zero_alone():
    pos = torch.tensor([0, 1, 2, 3, 4, 7, 8, 63, 64, 511, 512, 32767])
    assert S.bucket_of(pos).tolist() == [0, 1, 2, 2, 3, 3, 4, 6, 7, 9, 10, 15]
    assert S.n_buckets(32768) == 16 and S.n_buckets(8192) == 14 and S.n_buckets(512) == 10
    assert S.bucket_bounds(5) == [(0, 0), (1, 1), (2, 3), (4, 7), (8, 15)]
    # Gu et al.'s T = 64 queries are buckets 0..6 exactly
    assert sum(hi - lo + 1 for lo, hi in S.bucket_bounds(7)) == 64


def test_segment_classes():
    # vocabulary classes: 0 [CLS], 1 [SEP], 2 punct, 3 other
    table = torch.tensor([3, 0, 1, 2, 3, 3])
    assert S.segment_classes([1, 4, 3, 2, 5, 2], table, 4) == [S.FIRST, S.INIT, S.INIT, S.SEP, S.OTHER, S.SEP]
    assert S.segment_classes([4, 1, 5], table, 1) == [S.FIRST, S.OTHER, S.OTHER]  # a [CLS] not first is "other"
    assert S.segment_classes([4, 3], table, 4) == [S.FIRST, S.INIT]


def test_spec_asks_for_the_window_edge():
    spec = S.spec_for([3, None, 511])
    assert spec.offsets == (-511, -3, -1, 0) and spec.class_mass and spec.entropy


# --- hand-built row statistics --------------------------------------------------------------------


def hand_batch(first_mass, valid, layout, variants=None, entropy=None, offsets=(-1, 0)):
    """A BatchContext of one layer, one head, with the given first-token mass per row."""
    first_mass = torch.tensor(first_mass, dtype=torch.float32)  # (B, L)
    valid = torch.tensor(valid)
    B, L = valid.shape
    cm = torch.zeros(B, 1, L, 5)
    cm[:, 0, :, S.FIRST] = first_mass
    cm[:, 0, :, S.OTHER] = (1 - first_mass) * valid
    om = torch.zeros(B, 1, L, len(offsets))
    ent = torch.zeros(B, 1, L) if entropy is None else torch.tensor(entropy, dtype=torch.float32)[:, None]
    stats = RowStats(class_mass=cm, offset_mass=om, entropy=ent, layout=layout)
    segments = [S.SinkSegment([0] * int(v.sum()), [0] * int(v.sum()), [], [], "d", variant=(variants or [0] * B)[b])
                for b, v in enumerate(valid)]
    return BatchContext(list(range(B)), segments, {}, valid, torch.zeros(B, L, dtype=torch.long), S.SINK_CLASSES,
                        S.spec_for([None]), layers=[stats])


def test_hand_built_rows_give_the_sums_worked_out_by_hand():
    causal = AttentionLayout(causal=True)
    stats = S.SinkStats(1, 1, [None], ["with", "without"], buckets=4, hidden_size=2, epsilon=0.3, gu_length=2)
    # segment 0 (variant 0): rows see first with 1, .5, .1; segment 1 (variant 0) right-padded: 1, .2;
    # segment 2 (variant 1): 1, 0, 0, 0
    stats.add(hand_batch([[1, .5, .1, 0], [1, .2, 0, 0], [1, 0, 0, 0]],
                         [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], causal, variants=[0, 0, 1]))
    assert stats.n_segments.tolist() == [2, 1] and stats.n_rows.tolist() == [5, 4]
    assert stats.alpha(0)[0, 0] == pytest.approx((1 + .5 + .1 + 1 + .2) / 5)
    assert stats.alpha(1)[0, 0] == pytest.approx(1 / 4)
    # per segment: alpha 1.6/3 > .3, 1.2/2 > .3 -> share 1; variant 1: .25 < .3 -> 0
    assert stats.sink_share(0)[0, 0] == 1 and stats.sink_share(1)[0, 0] == 0
    # first T = 2 queries: (1 + .5)/2, (1 + .2)/2 > .3; (1 + 0)/2 > .3
    assert stats.sink_share(0, gu=True)[0, 0] == 1 and stats.sink_share(1, gu=True)[0, 0] == 1
    assert stats.sink_metric(1) == 0 and stats.pooled_metric(0) == 1
    # buckets [0], [1], [2, 3]: variant 0 rows 2, 2, 1
    assert stats.rows_bucket[0].tolist() == [2, 2, 1, 0]
    np.testing.assert_allclose(stats.position_mass(0)[0], [1, .35, .1, np.nan])
    np.testing.assert_allclose(stats.position_mass(1)[0], [1, 0, 0, np.nan])
    assert stats.n_unseeing.sum() == 0


def test_hand_built_window_rows_that_cannot_see_the_first_token():
    """A window of 2 keys (left 1): row 0 sees the first token, rows 1.. do not... row 1 does (keys 0, 1)."""
    windowed = AttentionLayout(causal=True, window=(1, 0))
    stats = S.SinkStats(1, 1, [1], ["x"], buckets=3, hidden_size=2)
    stats.add(hand_batch([[1, .4, 0, 0]], [[1, 1, 1, 1]], windowed, entropy=[[0, .5, .7, .9]]))
    assert stats.n_seeing[0, 0] == 2 and stats.n_unseeing[0, 0] == 2
    assert stats.alpha(0)[0, 0] == pytest.approx(.7)
    assert stats.unseeing_entropy[0, 0, 0] / stats.n_unseeing[0, 0] == pytest.approx(.8)
    assert stats.layer_first_mass(0)[0] == pytest.approx(1.4 / 4)
    rows = S.head_rows(stats)
    assert rows[0]["attention"] == "window 2" and rows[0]["n_unseeing"] == 2


def test_merge_save_and_load(tmp_path):
    causal = AttentionLayout(causal=True)
    a = S.SinkStats(1, 1, [None], ["x"], buckets=3, hidden_size=2)
    b = S.SinkStats(1, 1, [None], ["x"], buckets=3, hidden_size=2)
    both = S.SinkStats(1, 1, [None], ["x"], buckets=3, hidden_size=2)
    one, two = hand_batch([[1, .5, 0]], [[1, 1, 0]], causal), hand_batch([[1, .2, .3]], [[1, 1, 1]], causal)
    a.add(one)
    b.add(two)
    both.add(one)
    both.add(two)
    a.merge(b)
    a.batches_done = 7
    a.save(tmp_path / "s.npz")
    c = S.SinkStats.load(tmp_path / "s.npz")
    assert c.batches_done == 7 and c.meta() == both.meta()
    for name in S.ARRAYS:
        np.testing.assert_allclose(getattr(c, name), getattr(both, name), err_msg=name)
    with pytest.raises(ValueError):
        a.merge(S.SinkStats(1, 1, [None], ["x", "y"], buckets=3, hidden_size=2))


# --- tiny decoders through the plug-in ------------------------------------------------------------


def gemma3(window=4, kv_heads=2, layer_types=("sliding_attention", "full_attention"), seed=0, vocab=50):
    from transformers import AutoModel, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=len(layer_types), num_attention_heads=4, num_key_value_heads=kv_heads,
                              head_dim=8, max_position_embeddings=64, initializer_range=0.4, sliding_window=window,
                              query_pre_attn_scalar=12, layer_types=list(layer_types))
    torch.manual_seed(seed)
    return AutoModel.from_config(config, attn_implementation=ATTN_IMPLEMENTATION).eval()


def llama(kv_heads=2, seed=0, vocab=50):
    from transformers import AutoModel, LlamaConfig

    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                         initializer_range=0.4)
    torch.manual_seed(seed)
    return AutoModel.from_config(config, attn_implementation=ATTN_IMPLEMENTATION).eval()


def random_segments(lengths, seed=0, initial=3):
    g = torch.Generator().manual_seed(seed)
    table = torch.full((50,), 3)
    table[4] = 2  # token 4 is punctuation
    out = []
    for n in lengths:
        ids = torch.randint(3, 50, (n,), generator=g).tolist()
        out.append(S.SinkSegment(ids, [0] * n, list(range(n)), [str(i) for i in ids], "d",
                                 token_class=S.segment_classes(ids, table, initial)))
    return out


def add_batch(stats: S.SinkStats, model, segments, left: bool, backend: str, probe: S.HiddenProbe | None = None):
    """Pad `segments` on one side, run the plug-in, fold the batch into `stats` (as the engine does)."""
    B, L = len(segments), max(s.n_tokens for s in segments)
    ids = torch.zeros(B, L, dtype=torch.long)
    valid = torch.zeros(B, L, dtype=torch.bool)
    key_class = torch.full((B, L), S.OTHER)
    for b, s in enumerate(segments):
        sl = slice(L - s.n_tokens, L) if left else slice(0, s.n_tokens)
        ids[b, sl] = torch.tensor(s.input_ids)
        valid[b, sl] = True
        key_class[b, sl] = torch.tensor(s.token_class)
    key_class = first_token_class(key_class, valid, S.SINK_CLASSES.n_classes)
    positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    inputs = {"input_ids": ids, "attention_mask": valid.long(), "position_ids": positions}
    layers = []
    head_probe = HeadProbe(stats.n_layers, stats.n_heads, stats.spec, backend=backend)
    stats.probe = probe
    with torch.no_grad(), head_probe.active(key_class, lambda layer, st, kv: layers.append(st)):
        if probe is not None:
            with probe.attached(model, list(model.layers)):
                model(**inputs, use_cache=False)
        else:
            model(**inputs, use_cache=False)
    stats.add(BatchContext(list(range(B)), segments, inputs, valid, key_class, S.SINK_CLASSES, stats.spec,
                           layers=layers))


def windows_of(model):
    from bertscope.models.architectures import architecture_of

    layouts = architecture_of(model.config).layouts(model.config)
    return [None if lay.window is None else lay.window[0] for lay in layouts]


def new_stats(model, variants=("x",), gu_length=4, initial=3):
    return S.SinkStats(model.config.num_hidden_layers, model.config.num_attention_heads, windows_of(model),
                       list(variants), buckets=S.n_buckets(64), hidden_size=model.config.hidden_size,
                       gu_length=gu_length, initial=initial)


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_uniform_attention_gives_the_known_answer(left, backend):
    """Zero queries: every row is uniform over the keys it sees. Row i of the global layer puts
    1 / (i + 1) on the first token; in the windowed layer (4 keys) rows 0..3 do too, and rows 4..
    cannot see it and put 1/4 on each of their keys (the oldest one, themselves, the previous one)."""
    model = gemma3()
    for layer in model.layers:
        layer.self_attn.q_proj.weight.data.zero_()
    lengths = [9, 3, 6]
    stats = new_stats(model)
    add_batch(stats, model, random_segments(lengths), left, backend)
    i = np.concatenate([np.arange(n) for n in lengths])
    share = 1 / (i + 1)
    seeing_w = i < 4
    np.testing.assert_allclose(stats.alpha(0)[1], np.full(4, share.mean()), rtol=1e-5)  # global
    np.testing.assert_allclose(stats.alpha(0)[0], np.full(4, share[seeing_w].mean()), rtol=1e-5)  # windowed
    assert stats.n_unseeing[0].tolist() == [(~seeing_w).sum(), 0]
    uns = stats.n_unseeing[0, 0]
    for name in ("unseeing_edge", "unseeing_self", "unseeing_prev"):
        np.testing.assert_allclose(getattr(stats, name)[0, 0] / uns, 0.25, rtol=1e-5, err_msg=name)
    np.testing.assert_allclose(stats.unseeing_entropy[0, 0] / uns, math.log(4), rtol=1e-5)
    # initial tokens (the first 3): row i sees min(i + 1, 3) of them, each 1 / (i + 1) (global layer)
    np.testing.assert_allclose(stats.initial_sum[0, 1] / stats.n_seeing[0, 1],
                               (np.minimum(i + 1, 3) / (i + 1)).mean(), rtol=1e-5)
    # per segment: alpha_1 = mean of 1/(i+1) over its rows; over 0.3 for n <= 6 (H_n / n), not for 9
    per_seg = [np.mean(1 / np.arange(1, n + 1)) for n in lengths]
    np.testing.assert_allclose(stats.sink_share(0)[1], np.full(4, np.mean([a > .3 for a in per_seg])))
    # the heatmap: bucket b holds positions 2^(b-1)..2^b - 1 of every segment
    pos_mass = stats.position_mass(0)
    for b, (lo, hi) in enumerate(S.bucket_bounds(5)):
        rows = (i >= lo) & (i <= hi)
        assert pos_mass[1, b] == pytest.approx(share[rows].mean(), rel=1e-5)
        assert pos_mass[0, b] == pytest.approx(np.where(seeing_w, share, 0)[rows].mean(), rel=1e-5)


def reference(model, segments, stats: S.SinkStats) -> dict:
    """The statistics by their definitions from the eager maps of each segment alone (no padding)."""
    from bertscope.models.architectures import architecture_of

    eager = type(model)(model.config).eval()
    eager.load_state_dict(model.state_dict())
    eager.set_attn_implementation("eager")
    layouts = architecture_of(model.config).layouts(model.config)
    Ly, H = stats.n_layers, stats.n_heads
    first, seeing, initial = np.zeros((Ly, H)), np.zeros(Ly), np.zeros((Ly, H))
    share, share_gu, n_gu = np.zeros((Ly, H)), np.zeros((Ly, H)), 0
    edge, uns = np.zeros((Ly, H)), np.zeros(Ly)
    bucket_mass, bucket_rows = np.zeros((Ly, stats.buckets)), np.zeros(stats.buckets)
    for s in segments:
        with torch.no_grad():
            out = eager(torch.tensor([s.input_ids]), output_attentions=True, use_cache=False)
        n = s.n_tokens
        n_gu += n >= stats.gu_length
        i = torch.arange(n)
        b = S.bucket_of(i).numpy()
        np.add.at(bucket_rows, b, 1)
        for layer, att in enumerate(out.attentions):
            p = att[0].double().numpy()  # (H, n, n)
            lo, _ = layouts[layer].key_band(i, n)
            sees = (lo == 0).numpy()
            a = p[:, sees, 0]  # (H, rows that see the first token)
            first[layer] += a.sum(-1)
            seeing[layer] += sees.sum()
            initial[layer] += p[:, sees, : stats.initial].sum(-1).sum(-1)
            share[layer] += a.mean(-1) > stats.epsilon
            if n >= stats.gu_length:
                early = sees & (i.numpy() < stats.gu_length)
                share_gu[layer] += p[:, early, 0].mean(-1) > stats.epsilon
            np.add.at(bucket_mass[layer], b, p[:, :, 0].mean(0))
            if layouts[layer].window is not None and (~sees).any():
                left = layouts[layer].window[0]
                rows = np.flatnonzero(~sees)
                edge[layer] += p[:, rows, rows - left].sum(-1)
                uns[layer] += len(rows)
    with np.errstate(invalid="ignore"):
        return {"alpha": first / seeing[:, None], "initial": initial / seeing[:, None], "share": share / len(segments),
                "share_gu": share_gu / n_gu if n_gu else np.full((Ly, H), np.nan),
                "edge": np.where(uns[:, None] > 0, edge / np.maximum(uns, 1)[:, None], np.nan),
                "positions": np.where(bucket_rows > 0, bucket_mass / np.maximum(bucket_rows, 1), np.nan)}


def check_against_reference(model, segments, stats):
    want = reference(model, segments, stats)
    np.testing.assert_allclose(stats.alpha(0), want["alpha"], atol=2e-5)
    np.testing.assert_allclose(stats.initial_sum[0] / stats.n_seeing[0][:, None], want["initial"], atol=2e-5)
    np.testing.assert_allclose(stats.sink_share(0), want["share"])
    np.testing.assert_allclose(stats.sink_share(0, gu=True), want["share_gu"])
    np.testing.assert_allclose(stats.position_mass(0), want["positions"], atol=2e-5)
    with np.errstate(invalid="ignore"):
        edge = stats.unseeing_edge[0] / stats.n_unseeing[0][:, None]
    np.testing.assert_allclose(np.where(np.isnan(want["edge"]), np.nan, edge), want["edge"], atol=2e-5)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 13), min_size=1, max_size=4), left=st.booleans(),
       window=st.integers(2, 6), kv_heads=st.sampled_from([1, 2, 4]), gemma=st.booleans(),
       seed=st.integers(0, 99), backend=st.sampled_from(BACKENDS))
def test_statistics_equal_the_eager_maps(lengths, left, window, kv_heads, gemma, seed, backend):
    """Random shapes, padding side, windows and key/value grouping: the streamed sums equal the
    definitions read off `output_attentions` (single-token segments included)."""
    model = gemma3(window, kv_heads, ("sliding_attention", "full_attention", "sliding_attention"), seed) if gemma \
        else llama(kv_heads, seed)
    segments = random_segments(lengths, seed)
    stats = new_stats(model)
    add_batch(stats, model, segments, left, backend)
    check_against_reference(model, segments, stats)


def test_hidden_probe_equals_the_models_hidden_states():
    """Sun et al.'s numbers from the hook, against `output_hidden_states` of each segment alone
    (every layer's output but the last, which transformers hands over after the final norm)."""
    model = llama()
    segments = random_segments([7, 1, 5])
    stats = new_stats(model)
    probe = S.HiddenProbe()
    add_batch(stats, model, segments, left=True, backend=BACKENDS[0], probe=probe)
    want = np.zeros((2, 4))
    rest, n_rest = np.zeros(2), 0
    for s in segments:
        with torch.no_grad():
            hs = model(torch.tensor([s.input_ids]), output_hidden_states=True, use_cache=False).hidden_states
        for layer in range(1):  # layer 1's output is hs[1]; hs[2] is after the final norm
            a = hs[layer + 1][0].abs().double()
            want[layer] += [a[0].max(), 0, a.flatten().median(), float(a[0].max() >= a.max())]
            if s.n_tokens > 1:
                rest[layer] += a[1:].max()
        n_rest += s.n_tokens > 1
    assert stats.n_hidden[0] == 3 and stats.n_hidden_rest[0, 0] == n_rest
    np.testing.assert_allclose(stats.hidden_sum[0, 0, [0, 2, 3]], want[0, [0, 2, 3]], rtol=1e-4)
    np.testing.assert_allclose(stats.hidden_sum[0, 0, 1], rest[0], rtol=1e-4)
    assert stats.first_dim_count[0].sum(-1).tolist() == [3, 3]


def test_hidden_summary_by_hand():
    h = torch.zeros(2, 3, 4)
    h[0, 0, 2] = -50  # the first token's largest, dimension 2
    h[0, 1, 1] = 3
    h[0, 2] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    h[1, 1, 3] = 7  # segment 1, left-padded: its first token is position 1
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    out = S.hidden_summary(h, mask)
    assert out[0].tolist() == [50, 3, 0.0, 1, 2]  # median of 12 values, 7 zeros: 0
    assert out[1].tolist() == [7, 0, 0, 1, 3]
