"""What the accumulators and heads.csv make of a decoder's rows (causal, windowed, grouped-query).

Known answers first: queries of zero make every head uniform over the keys its row sees, so
entropy is ln n_visible(i) row by row, the KL from uniform is 0, and the mass on the first token,
on self and on the previous token is 1 / n_visible(i) (0 where the previous token is not seen).
Then random heads, every number recomputed from the eager oracle's maps by its definition,
over two layers of different layouts (Gemma-3 alternates windowed and global layers), with left
padding, both averages, a save/load round trip and a merge.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.analyses.surface.stats import head_table, summary
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.batch import BatchContext
from bertscope.kernels.backends import attention_stats
from bertscope.kernels.reference import stats_from_probs, visible_probs
from bertscope.kernels.spec import AttentionLayout, StatsSpec, visible_mask
from bertscope.text.token_classes import VOCAB, first_token_class

SPEC = StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4, entropy=True, class_mass=True, argmax=True)
CAUSAL = AttentionLayout(causal=True)
WINDOW = AttentionLayout(causal=True, window=(1, 0), n_key_value_heads=1)  # sees itself and the previous token
# two segments, the second left-padded by 2; classes: 2 punct, 3 other (a decoder tokenizer without [SEP])
VALID = torch.tensor([[True] * 6, [False, False, True, True, True, True]])
RAW_CLASS = torch.tensor([[3, 3, 2, 3, 3, 2], [3, 3, 3, 2, 3, 3]])


def batch_of(layouts, q_scale=1.0, seed=0, rows=(0, 1), H=2, D=4, spec=SPEC):
    """A BatchContext whose layers come from the eager oracle, and the maps (per layer, (B, H, L, L))."""
    g = torch.Generator().manual_seed(seed)
    valid, raw = VALID[list(rows)], RAW_CLASS[list(rows)]
    key_class = first_token_class(raw, valid, 4)
    B, L = valid.shape
    layers, maps = [], []
    for layout in layouts:  # drawn for both segments, then the rows asked for: the same heads either way
        kv = layout.n_key_value_heads or H
        q = torch.randn(2, H, L, D, generator=g, dtype=torch.float64)[list(rows)] * q_scale
        k = torch.randn(2, kv, L, D, generator=g, dtype=torch.float64)[list(rows)]
        v = torch.randn(2, kv, L, D, generator=g, dtype=torch.float64)[list(rows)]
        _, stats = attention_stats(q, k, v, valid, key_class, spec, backend="eager", layout=layout)
        layers.append(stats)
        maps.append(visible_probs(q, k, valid, layout))  # (B, H, L, L) the oracle's maps
    batch = BatchContext(list(rows), [None] * B, {}, valid, key_class, VOCAB, spec, layers=layers)
    return batch, maps


def test_first_token_class_by_hand():
    key_class = torch.tensor([[3, 0, 2, 1, 0], [2, 2, 3, 0, 3], [0, 1, 3, 3, 3]])
    valid = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]).bool()
    out = first_token_class(key_class, valid, 4)
    assert out.tolist() == [[3, 0, 2, 1, 3], [0, 2, 3, 3, 3], [3, 1, 3, 3, 3]]


@pytest.mark.parametrize("layout", [CAUSAL, WINDOW])
def test_uniform_heads_give_known_numbers(layout):
    batch, _ = batch_of([layout], q_scale=0.0)  # q = 0: every row uniform over what it sees
    stats = HeadStats(1, 2, SPEC, VOCAB)
    stats.add(batch)
    table = head_table(stats)
    # rows of the 6-token segment then of the 4-token one: what each sees
    n = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4] if layout is CAUSAL else [1, 2, 2, 2, 2, 2, 1, 2, 2, 2]
    n = np.array(n, dtype=float)
    first_seen = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1] if layout is CAUSAL else [1, 1, 0, 0, 0, 0, 1, 1, 0, 0])
    prev_seen = (np.array([0, 1, 1, 1, 1, 1, 0, 1, 1, 1]))
    expect = {"entropy": np.log(n).mean(), "uniform_entropy": np.log(n).mean(), "kl_uniform": 0.0,
              "self": (1 / n).mean(), "prev": (prev_seen / n).mean(), "first": (first_seen / n).mean(),
              "offset_-2": (np.array([0, 0, 1, 1, 1, 1, 0, 0, 1, 1]) * (layout is CAUSAL) / n).mean()}
    for col, value in expect.items():  # the statistics are float32 (the baseline is float64: exact)
        atol = 1e-12 if col == "uniform_entropy" else 1e-6
        np.testing.assert_allclose(table[col], np.full((1, 2), value), rtol=0, atol=atol, err_msg=col)
    assert stats.layer_n_visible().tolist() == [n.mean()]
    # columns that are 0 by construction under a causal mask, and the classes no token has, are left out
    assert list(table) == ["layer", "head", "prev", "self", "first", "punct", "other", "entropy", "uniform_entropy",
                           "kl_uniform", "n_tokens", "offset_-2", "argmax_prev", "argmax_self", "argmax_first",
                           "argmax_punct"]
    text = summary(table)
    assert "first token" in text and "[SEP]" not in text and "next" not in text
    assert f"uniform entropy            {np.log(n).mean():.2f} (every layer)" in text


@pytest.mark.parametrize("average", ["tokens", "segments"])
def test_random_heads_against_the_maps(average):
    layouts = [WINDOW, CAUSAL]
    batch, maps = batch_of(layouts, q_scale=3.0, seed=1)
    stats = HeadStats(2, 2, SPEC, VOCAB, average=average)
    stats.add(batch)
    table = head_table(stats)
    valid, key_class = batch.key_valid, batch.key_class
    for layer, (layout, p) in enumerate(zip(layouts, maps)):
        ref = stats_from_probs(p, valid, key_class, SPEC, layout)  # the oracle's rows
        rows = {k: [[], []] for k in ("entropy", "uniform", "first", "prev", "punct")}
        for b in range(2):
            idx = valid[b].nonzero().flatten().tolist()
            seen = visible_mask(valid, layout)[b, 0]
            for h in range(2):
                pb = p[b, h].numpy()
                per = {"entropy": ref.entropy[b, h, idx].numpy(),
                       "uniform": [math.log(int(seen[i].sum())) for i in idx],
                       "first": [pb[i, idx[0]] for i in idx],  # the mass on the first real token: read off the map
                       "prev": ref.offset_mass[b, h, idx, SPEC.offsets.index(-1)].numpy(),
                       "punct": ref.class_mass[b, h, idx, 2].numpy()}
                for k, v in per.items():
                    rows[k][h].append(v)
        for k, col in (("entropy", "entropy"), ("uniform", "uniform_entropy"), ("first", "first"),
                       ("prev", "prev"), ("punct", "punct")):
            for h in range(2):
                segs = rows[k][h]
                want = np.mean([np.mean(s) for s in segs]) if average == "segments" else np.mean(np.concatenate(segs))
                assert table[col][layer, h] == pytest.approx(want, abs=1e-6), (col, layer, h)
        np.testing.assert_allclose(table["kl_uniform"][layer], table["uniform_entropy"][layer]
                                   - table["entropy"][layer], atol=1e-12)
        assert (table["kl_uniform"][layer] >= -1e-6).all()
    # the windowed layer's baseline is lower than the global one's
    assert table["uniform_entropy"][0, 0] < table["uniform_entropy"][1, 0]
    assert "uniform entropy by layer" in summary(table)


def test_save_load_merge_and_encoders_unchanged(tmp_path):
    layouts = [WINDOW, CAUSAL]
    whole = HeadStats(2, 2, SPEC, VOCAB)
    whole.add(batch_of(layouts, seed=2)[0])
    first, second = HeadStats(2, 2, SPEC, VOCAB), HeadStats(2, 2, SPEC, VOCAB)
    first.add(batch_of(layouts, seed=2, rows=(0,))[0])
    second.add(batch_of(layouts, seed=2, rows=(1,))[0])
    # one batch of both segments or one each: the same sums (the oracle's rows do not depend on the batch)
    merged = HeadStats(2, 2, SPEC, VOCAB).merge(first).merge(second)
    for col, values in head_table(whole).items():
        np.testing.assert_allclose(head_table(merged)[col], values, atol=1e-6, err_msg=col)
    whole.save(tmp_path / "stats.npz")
    back = HeadStats.load(tmp_path / "stats.npz")
    assert back.layouts == layouts and back.meta() == whole.meta() and back.causal
    np.testing.assert_array_equal(back.visible_entropy_sum, whole.visible_entropy_sum)
    # an encoder's accumulator holds none of it: the same meta and arrays as before decoders
    encoder = HeadStats(2, 2, SPEC, VOCAB)
    assert "layouts" not in encoder.meta() and encoder.layouts is None
    encoder.save(tmp_path / "enc.npz")
    with np.load(tmp_path / "enc.npz") as f:
        assert "visible_entropy_sum" not in f and "n_visible_sum" not in f


def test_layouts_must_not_change():
    stats = HeadStats(2, 2, SPEC, VOCAB)
    stats.add(batch_of([WINDOW, CAUSAL])[0])
    with pytest.raises(ValueError, match="layouts changed"):
        stats.add(batch_of([CAUSAL, CAUSAL])[0])


@st.composite
def layouts(draw):
    causal = draw(st.booleans())
    window = draw(st.none() | st.tuples(st.integers(0, 5), st.integers(0, 5)))
    if causal and window is not None:
        window = (window[0], 0)
    return AttentionLayout(causal=causal, window=window, n_key_value_heads=draw(st.sampled_from([None, 1])))


@settings(max_examples=30, deadline=None)
@given(first=layouts(), second=layouts(), L=st.integers(1, 11), pads=st.lists(st.integers(0, 10), min_size=1,
       max_size=3), left=st.booleans(), average=st.sampled_from(["tokens", "segments"]), seed=st.integers(0, 99))
def test_random_layouts_and_padding_against_the_oracle(first, second, L, pads, left, average, seed):
    """Any two layouts (a plain one included), left or right padding, rows that see one key: each
    layer's entropy, baseline, KL and first-token mass are the pooled (or per-segment) means of the
    eager maps' rows, by definition."""
    B, H, D = len(pads), 2, 4
    pos = torch.arange(L)[None, :]
    n_pad = torch.tensor([min(p, L - 1) for p in pads])[:, None]
    valid = pos >= n_pad if left else pos < L - n_pad  # every segment has at least one token
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(1, 4, (B, L), generator=g)
    key_class = first_token_class(raw, valid, 4)
    layers, maps = [], []
    for layout in (first, second):
        kv = layout.n_key_value_heads or H
        q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64) * 2
        k, v = (torch.randn(B, kv, L, D, generator=g, dtype=torch.float64) for _ in range(2))
        layers.append(attention_stats(q, k, v, valid, key_class, SPEC, backend="eager", layout=layout)[1])
        maps.append(visible_probs(q, k, valid, layout))  # (B, H, L, L) the oracle's maps
    stats = HeadStats(2, H, SPEC, VOCAB, average=average)
    stats.add(BatchContext(list(range(B)), [None] * B, {}, valid, key_class, VOCAB, SPEC, layers=layers))
    if first.is_plain and second.is_plain:
        assert stats.layouts is None and "first" not in head_table(stats)
        return
    table = head_table(stats)
    assert ("first" in table) == (first.causal or second.causal)
    for layer, (layout, p) in enumerate(zip((first, second), maps)):
        seen = visible_mask(valid, layout)[:, 0]  # (B, L, L)
        entropy = stats_from_probs(p, valid, key_class, StatsSpec(n_key_classes=4, entropy=True), layout).entropy
        for h in range(H):
            per = {"entropy": [], "uniform": [], "first": []}
            for b in range(B):
                idx = valid[b].nonzero().flatten()
                pb = p[b, h][idx]  # (n, L) every real row; no NaN (a real row sees itself or its band)
                per["entropy"].append(entropy[b, h][idx].numpy())
                per["uniform"].append(torch.log(seen[b][idx].sum(-1).double()).numpy())
                per["first"].append(pb[:, idx[0]].numpy())
            mean = (lambda v: np.mean([x.mean() for x in v])) if average == "segments" \
                else (lambda v: np.concatenate(v).mean())
            assert table["entropy"][layer, h] == pytest.approx(mean(per["entropy"]), abs=2e-6)
            assert table["uniform_entropy"][layer, h] == pytest.approx(mean(per["uniform"]), abs=1e-12)
            assert table["kl_uniform"][layer, h] == pytest.approx(mean(per["uniform"]) - mean(per["entropy"]),
                                                                  abs=2e-6)
            if "first" in table:
                assert table["first"][layer, h] == pytest.approx(mean(per["first"]), abs=2e-6)
