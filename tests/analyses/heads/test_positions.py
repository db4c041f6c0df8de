"""`bertscope heads positions`: the accumulator against answers worked out by hand.

Synthetic attention maps go through the kernels' own definitions (`stats_from_probs`, the eager
oracle) into a `BatchContext`, so the sums are checked against maps whose answer is known exactly:
previous-token attention (all mass at distance 1), uniform causal rows (row i puts 1 / (i + 1) on
each key: the mass per tenth is the count of keys in it over i + 1, 1/10 each where 10 divides
i + 1; the mean distance is i / 2), a sliding window (nothing beyond it), bidirectional rows
(the "after" bin), left padding (refused), merging, saving and loading.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertscope.analyses.heads.positions import stats as P
from bertscope.engine.batch import BatchContext
from bertscope.kernels.reference import stats_from_probs
from bertscope.kernels.spec import AttentionLayout, distance_bucket_names, position_bin_names, visible_mask
from bertscope.text.segments import Segment

pytestmark = pytest.mark.usefixtures("single_thread")

CAUSAL = AttentionLayout(causal=True)
BIDIRECTIONAL = AttentionLayout()
D = {name: b for b, name in enumerate(distance_bucket_names())}
PB = {name: b for b, name in enumerate(position_bin_names())}


def batch_of(maps: list[torch.Tensor], layout: AttentionLayout, left: bool = False) -> BatchContext:
    """One layer: `maps[b]` (H, n_b, n_b) attention of segment b, padded to the longest on the right
    (or left), through the kernels' definitions of the row statistics."""
    B, H, L = len(maps), maps[0].shape[0], max(m.shape[-1] for m in maps)
    p = torch.zeros(B, H, L, L, dtype=torch.float64)
    valid = torch.zeros(B, L, dtype=torch.bool)
    for b, m in enumerate(maps):
        n = m.shape[-1]
        s = slice(L - n, L) if left else slice(0, n)
        p[b, :, s, s] = m
        valid[b, s] = True
    key_class = torch.ones(B, L, dtype=torch.long)
    key_class[torch.arange(B), valid.long().argmax(-1)] = P.FIRST
    spec = P.spec_for()
    stats = stats_from_probs(p, valid, key_class, spec, layout)
    segments = [Segment([0] * m.shape[-1], [0] * m.shape[-1], [], [], "d") for m in maps]
    return BatchContext(list(range(B)), segments, {}, valid, key_class, P.FIRST_CLASSES, spec, layers=[stats])


def previous_token(n: int, heads: int = 1) -> torch.Tensor:
    """Row i on key i - 1 (row 0 on itself)."""
    m = torch.zeros(n, n, dtype=torch.float64)
    m[0, 0] = 1
    m[torch.arange(1, n), torch.arange(n - 1)] = 1
    return m.expand(heads, n, n)


def uniform(n: int, layout: AttentionLayout) -> torch.Tensor:
    """Every row uniform over the keys `layout` lets it see."""
    seen = visible_mask(torch.ones(1, n, dtype=torch.bool), layout)[0, 0].double()  # (n, n)
    return (seen / seen.sum(-1, keepdim=True))[None]


def test_late_rows_are_the_last_ceil_of_the_share():
    valid = torch.tensor([[True] * 10 + [False] * 2, [True] * 12, [True] + [False] * 11])
    late = P.late_rows(valid, 0.1)
    assert late.sum(-1).tolist() == [1, 2, 1]  # ceil(1.0) = 1, ceil(1.2) = 2, at least one
    assert late[0, 9] and late[1, 10] and late[1, 11] and late[2, 0]
    assert P.late_rows(torch.ones(1, 8192, dtype=torch.bool), 0.1).sum() == 820
    assert torch.equal(P.late_rows(valid, 1.0), valid)


def test_previous_token_attention_is_all_at_distance_one():
    stats = P.PositionStats(1, 2, [None], late=0.1)
    stats.add(batch_of([previous_token(7, 2), previous_token(5, 2)], CAUSAL))  # right-padded to 7
    assert stats.n_segments == 2 and stats.n_rows == 12 and stats.n_late == 2
    want = np.zeros(len(D))
    want[D["0"]], want[D["1"]] = 2 / 12, 10 / 12  # the two first rows on themselves, every other at distance 1
    np.testing.assert_allclose(stats.distance_profile()[0], [want, want], atol=1e-12)
    np.testing.assert_allclose(stats.mean_distance()[0], [10 / 12] * 2, atol=1e-12)
    # the late rows: i = 6 of 7 reads key 5, bin floor(50 / 7) = 7; i = 4 of 5 reads key 3, bin floor(30 / 5) = 6
    want = np.zeros(len(PB))
    want[PB["70-80%"]] = want[PB["60-70%"]] = 0.5
    np.testing.assert_allclose(stats.position_profile()[0], [want, want], atol=1e-12)
    assert stats.first_mass().max() == 0
    # every row but the first of a 9-token segment: 8 rows at distance 1, 8 tokens of distance in all
    one = P.PositionStats(1, 1, [None])
    one.add(batch_of([previous_token(9)], CAUSAL))
    assert one.distance_sum[0, 0, D["1"]] == pytest.approx(8) and one.mean_distance_sum[0, 0] == pytest.approx(8)
    assert one.distance_sum[0, 0].sum() == pytest.approx(9)


def test_uniform_causal_rows_give_the_counts_per_tenth():
    n, late = 40, 0.25  # the late rows: i = 30 .. 39
    stats = P.PositionStats(1, 1, [None], late=late)
    stats.add(batch_of([uniform(n, CAUSAL)], CAUSAL))
    rows = range(30, 40)
    want = np.zeros(len(PB))
    for i in rows:
        for j in range(i + 1):
            want[10 * j // (i + 1)] += 1 / (i + 1)
    want /= len(rows)
    got = stats.position_profile()[0, 0]
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(got[:10], 0.1, atol=1 / 31)  # uniform to within one key of the shortest row, 1 / 31
    assert got.sum() == pytest.approx(1)
    # one row with i + 1 = 40, a multiple of 10: exactly 1/10 each
    exact = P.PositionStats(1, 1, [None], late=1 / 40)
    exact.add(batch_of([uniform(n, CAUSAL)], CAUSAL))
    np.testing.assert_allclose(exact.position_profile()[0, 0][:10], 0.1, atol=1e-12)
    # the first token: 1 / (i + 1) over the late rows; the mean distance i / 2 over every row
    assert stats.first_mass()[0, 0] == pytest.approx(np.mean([1 / (i + 1) for i in rows]))
    assert stats.mean_distance()[0, 0] == pytest.approx(np.mean([i / 2 for i in range(n)]))
    without = stats.position_profile(without_first=True)[0, 0]
    assert without[0] == pytest.approx(got[0] - stats.first_mass()[0, 0])
    shape = P.u_shape(got)
    assert not shape["u_shaped"] and shape["middle"] == pytest.approx(np.mean(got[3:7]))


def test_a_window_puts_nothing_beyond_it():
    """A window of 4 keys (3 to the left): distances 0..3 only; a global layer reaches 39."""
    window = AttentionLayout(causal=True, window=(3, 0))
    stats = P.PositionStats(2, 1, [3, None])
    b = batch_of([uniform(40, window)], window)
    g = batch_of([uniform(40, CAUSAL)], CAUSAL)
    b.layers.append(g.layers[0])
    stats.add(b)
    prof = stats.distance_profile()[:, 0]
    assert prof[0, D["4-7"]:].sum() == 0 and prof[1, D["32-63"]] > 0
    assert stats.beyond_window()[0, 0] == 0 and np.isnan(stats.beyond_window()[1, 0])
    assert stats.layer_kinds() == ["window 4", "global"]
    # rows 3.. see 4 keys at distances 0..3: mean 1.5; rows 0, 1, 2: 0, .5, 1
    assert stats.mean_distance()[0, 0] == pytest.approx((0 + .5 + 1 + 37 * 1.5) / 40)
    assert P.reach(prof[0], 0.9) == 3 and P.reach(prof[1], 0.9) == 31  # 0.76 within 15, 0.98 within 31
    results = P.headline(stats)
    assert results["kinds"]["window 4"]["beyond_window"] == 0
    assert results["kinds"]["global"]["reach_90"] == 31 and results["kinds"]["global"]["farthest_layer"] == 2
    # windowed late rows (i = 36..39) see keys i-3..i, the last tenth and the one before
    assert stats.position_profile()[0, 0, :8].sum() == 0


def test_bidirectional_rows_put_the_keys_after_the_query_in_after():
    n = 20
    stats = P.PositionStats(1, 1, [None], late=0.1)
    stats.add(batch_of([uniform(n, BIDIRECTIONAL)], BIDIRECTIONAL))
    # late rows i = 18, 19: (n - 1 - i) / n after the query
    assert stats.position_profile()[0, 0, PB["after"]] == pytest.approx(np.mean([1 / n, 0]))
    # |i - j| both ways: the mean over rows of the mean over keys
    want = np.mean([np.mean([abs(i - j) for j in range(n)]) for i in range(n)])
    assert stats.mean_distance()[0, 0] == pytest.approx(want)


def test_left_padding_is_refused():
    stats = P.PositionStats(1, 1, [None])
    with pytest.raises(ValueError, match="right-padded"):
        stats.add(batch_of([previous_token(7), previous_token(5)], CAUSAL, left=True))


def test_the_batches_do_not_change_the_sums():
    maps = [uniform(9, CAUSAL), previous_token(4), uniform(13, CAUSAL)]
    together, apart = P.PositionStats(1, 1, [None]), P.PositionStats(1, 1, [None])
    together.add(batch_of(maps, CAUSAL))
    for m in maps:
        apart.add(batch_of([m], CAUSAL))
    for name in P.ARRAYS:
        np.testing.assert_allclose(getattr(together, name), getattr(apart, name), rtol=1e-12, err_msg=name)


def test_merge_save_and_load(tmp_path):
    a, b, both = (P.PositionStats(1, 1, [None], late=0.2) for _ in range(3))
    one, two = batch_of([uniform(11, CAUSAL)], CAUSAL), batch_of([previous_token(6)], CAUSAL)
    a.add(one)
    b.add(two)
    both.add(one)
    both.add(two)
    a.merge(b)
    for name in P.ARRAYS:
        np.testing.assert_allclose(getattr(a, name), getattr(both, name), rtol=1e-12, err_msg=name)
    a.batches_done = 7
    a.save(tmp_path / "p.npz")
    loaded = P.PositionStats.load(tmp_path / "p.npz")
    assert loaded.meta() == a.meta() and loaded.batches_done == 7
    for name in P.ARRAYS:
        assert np.array_equal(getattr(loaded, name), getattr(a, name)), name
    with pytest.raises(ValueError, match="different models or settings"):
        a.merge(P.PositionStats(1, 1, [None], late=0.1))
    with pytest.raises(ValueError, match="late"):
        P.PositionStats(1, 1, [None], late=0)


def test_the_tables():
    stats = P.PositionStats(2, 1, [3, None])
    window = AttentionLayout(causal=True, window=(3, 0))
    b = batch_of([uniform(12, window)], window)
    b.layers.append(batch_of([uniform(12, CAUSAL)], CAUSAL).layers[0])
    stats.add(b)
    distance, profile = P.head_rows(stats)
    assert [r["attention"] for r in distance] == ["window 4", "global"]
    assert all(set(r) == set(P.DISTANCE_COLUMNS) for r in distance)
    assert sum(distance[1][c] for c in P.distance_columns()) == pytest.approx(1)
    assert sum(profile[1][c] for c in P.position_columns()) == pytest.approx(1)
    layers = P.layer_rows(stats)
    assert set(layers[0]) == set(P.LAYER_COLUMNS) and layers[0]["beyond_window"] == 0
    assert np.isnan(layers[1]["beyond_window"])
