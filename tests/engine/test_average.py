"""`HeadStats(average=...)` and the rest_sep column against hand computations on planted maps.

Two segments of different lengths, one layer, one head, attention probabilities drawn at
random: every mean that `head_table` reports is recomputed here from the maps by its
definition, pooling tokens or averaging per segment first (Clark et al.'s notebook).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertscope.analyses.surface.stats import head_table
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.batch import BatchContext
from bertscope.kernels.spec import RowStats, StatsSpec
from bertscope.text.token_classes import TokenClasses

CLASSES = ("cls", "sep", "punct", "other")
SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, entropy=True, argmax=False, class_mass=True)
# [CLS] a . [SEP] b [SEP]   and   [CLS] c [SEP] (padded)
KEY_CLASS = [[0, 3, 2, 1, 3, 1], [0, 3, 1, 3, 3, 3]]
LENGTHS = [6, 3]


def planted(seed=0):
    """(key_valid (B, L), key_class (B, L), p (B, 1, L, L)) with rows summing to 1 over valid keys."""
    rng = np.random.default_rng(seed)
    B, L = len(LENGTHS), max(LENGTHS)
    valid = np.zeros((B, L), dtype=bool)
    p = np.zeros((B, 1, L, L))
    for b, n in enumerate(LENGTHS):
        valid[b, :n] = True
        w = rng.uniform(0.05, 1.0, (n, n)) ** 3  # peaky rows, so the averages differ clearly
        p[b, 0, :n, :n] = w / w.sum(-1, keepdims=True)
    return valid, np.array(KEY_CLASS), p


def row_stats(p, key_class, valid) -> RowStats:
    """The spec's statistics of every row, by their textbook definitions."""
    B, H, L, _ = p.shape
    entropy = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0).sum(-1)  # (B, H, L)
    offsets = np.zeros((B, H, L, 3))
    for t, o in enumerate((-1, 0, 1)):
        for i in range(L):
            if 0 <= i + o < L:
                offsets[:, :, i, t] = p[:, :, i, i + o]
    onehot = np.eye(4)[key_class] * valid[..., None]  # (B, L, C)
    class_mass = np.einsum("bhij,bjc->bhic", p, onehot)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return RowStats(entropy=t(entropy), offset_mass=t(offsets), class_mass=t(class_mass))


def accumulate(average, segments=(0, 1)):
    valid, key_class, p = planted()
    stats = HeadStats(1, 1, SPEC, CLASSES, average=average)
    for b in segments:  # one batch per segment: sums must add up to the same as one batch
        kv, kc = torch.tensor(valid[b : b + 1]), torch.tensor(key_class[b : b + 1])
        layers = [row_stats(p[b : b + 1], key_class[b : b + 1], valid[b : b + 1])]
        stats.add(BatchContext([b], [None], {}, kv, kc, TokenClasses.of(CLASSES), SPEC, layers=layers))
    return stats


def by_hand(average):
    """Expected means: pooled over the rows of all segments, or the mean of per-segment means."""
    valid, key_class, p = planted()
    per_segment = {k: [] for k in ("sep", "cls", "sep_sep", "rest_sep", "entropy", "prev", "uniform")}
    pooled = {k: [] for k in per_segment}
    for b, n in enumerate(LENGTHS):
        pb, kc = p[b, 0, :n, :n], key_class[b, :n]
        sep_mass = pb[:, kc == 1].sum(-1)  # (n,) each row's mass on [SEP]
        values = {
            "sep": sep_mass, "cls": pb[:, kc == 0].sum(-1), "sep_sep": sep_mass[kc == 1],
            "rest_sep": sep_mass[kc != 1], "entropy": -(pb * np.log(pb)).sum(-1),
            "prev": np.array([0.0] + [pb[i, i - 1] for i in range(1, n)]), "uniform": np.full(n, np.log(n)),
        }
        for k, v in values.items():
            per_segment[k].append(v.mean())
            pooled[k] += list(v)
    return {k: float(np.mean(v)) for k, v in (per_segment if average == "segments" else pooled).items()}


@pytest.mark.parametrize("average", ["tokens", "segments"])
def test_means_equal_the_hand_computation(average):
    stats = accumulate(average)
    table = head_table(stats)
    want = by_hand(average)
    for col in ("sep", "cls", "sep_sep", "rest_sep", "entropy", "prev"):
        assert table[col][0, 0] == pytest.approx(want[col], abs=1e-12), col
    assert stats.uniform_entropy() == pytest.approx(want["uniform"], abs=1e-12)
    assert table["n_tokens"][0, 0] == sum(LENGTHS)  # query tokens, whatever the averaging
    if average == "segments":
        assert stats.n_rows[0].tolist() == [2, 2, 2, 1, 2]  # all, cls, sep, punct, non_sep: segments
    else:
        assert stats.n_rows[0].tolist() == [9, 2, 3, 1, 6]  # rows


def test_the_two_averages_really_differ_and_rest_sep_is_not_sep():
    tokens, segments = head_table(accumulate("tokens")), head_table(accumulate("segments"))
    for col in ("sep", "rest_sep", "entropy"):
        assert abs(tokens[col][0, 0] - segments[col][0, 0]) > 1e-3, col
    assert abs(tokens["rest_sep"][0, 0] - tokens["sep"][0, 0]) > 1e-3
    # rest_sep pooled = (all rows' [SEP] mass - [SEP] rows' [SEP] mass) / non-[SEP] rows
    stats = accumulate("tokens")
    sep = CLASSES.index("sep")
    derived = (stats.class_mass_sum[0, 0, 0, sep] - stats.class_mass_sum[0, 0, 2, sep]) / (9 - 3)
    assert tokens["rest_sep"][0, 0] == pytest.approx(derived, abs=1e-12)


@pytest.mark.parametrize("average", ["tokens", "segments"])
def test_segment_sums_merge_and_round_trip(average, tmp_path):
    whole = accumulate(average)
    first, second = accumulate(average, (0,)), accumulate(average, (1,))
    merged = first.merge(second)
    for col, values in head_table(whole).items():
        np.testing.assert_allclose(head_table(merged)[col], values, rtol=0, atol=1e-12, err_msg=col)
    whole.save(tmp_path / "stats.npz")
    back = HeadStats.load(tmp_path / "stats.npz")
    assert back.average == average and back.meta() == whole.meta()


def test_averages_do_not_mix():
    with pytest.raises(ValueError, match="cannot merge"):
        accumulate("tokens").merge(accumulate("segments"))
    with pytest.raises(ValueError, match="average must be one of tokens, segments"):
        HeadStats(1, 1, SPEC, CLASSES, average="words")
