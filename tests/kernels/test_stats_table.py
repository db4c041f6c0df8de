"""The kernels' table of statistics (`kernels/spec.py: ROW_STATS`) against every backend.

Each statistic of the table is asked for alone and must come back from eager, chunked
(both row passes) and triton (under Triton's interpreter) with the table's shape and dtype,
its padding rows set, and the oracle's values; a statistic added to the table that a
backend does not compute fails loudly in every backend, not only in Triton's. The
plumbing that loops over the table (segment sums, HeadStats, head-slot spreading, the
float32 cast) is checked against the table here too.
"""
import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (tests/conftest.py sets it too)

import numpy as np
import pytest
import torch

import bertscope.kernels.spec as spec_module
from bertscope.engine.accumulate import ARRAYS, HeadStats
from bertscope.engine.batch import BatchContext
from bertscope.kernels import BACKENDS, StatsSpec, word_pooling
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import ROW_STATS, SEGMENT_SUMS, RowStat, RowStats, asked_stats
from bertscope.models import head_removal
from bertscope.text.token_classes import TokenClasses

B, H, L, D, C = 2, 3, 11, 8, 3
LENGTHS = [11, 6]
OFFSETS = (-1, 0, 2)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it again while a kernel runs


def triton(*args, **kw):
    import bertscope.kernels.triton_attention as ta

    if not ta.INTERPRETED:
        pytest.fail("triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)
    return ta.attention_stats_triton(*args, **kw)


def chunked(row_pass):
    return lambda *a, **kw: attention_stats_chunked(*a, row_pass=row_pass, **kw)


# every backend of `kernels.BACKENDS`, the chunked one with each row pass
RUNS = {"eager": attention_stats_eager, "chunked-compiled": chunked("compiled"), "chunked-torch": chunked("torch"),
        "triton": triton}


def test_every_backend_is_checked():
    assert {name.split("-")[0] for name in RUNS} == set(BACKENDS)


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) * 1.5 for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, L)
    key_class = torch.randint(0, C, (B, L), generator=g)
    unit = torch.where(key_valid, torch.arange(L)[None, :] // 2, -1)  # words of two tokens
    pooling = word_pooling(unit, torch.ones(B, (L + 1) // 2, dtype=torch.bool))
    return (q, k, v, key_valid, key_class), pooling


def only(stat: RowStat) -> StatsSpec:
    """A spec that asks for `stat` and nothing else."""
    value = OFFSETS if stat.switch == "offsets" else True
    return StatsSpec(n_key_classes=C, **{stat.switch: value})


def dims(pooling) -> dict:
    return {"B": B, "H": H, "L": L, "O": len(OFFSETS), "C": C, "W": pooling.n_units}


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("stat", ROW_STATS, ids=lambda s: s.name)
def test_each_statistic_of_the_table_comes_back_from_each_backend(stat, run):
    args, pooling = inputs()
    spec = only(stat)
    _, ref = attention_stats_eager(*args, spec, pooling=pooling)
    _, got = RUNS[run](*args, spec, pooling=pooling)
    t = getattr(got, stat.name)
    assert t is not None, f"{run} did not compute {stat.name}"
    assert tuple(t.shape) == tuple(dims(pooling)[d] for d in stat.shape)
    assert (t.dtype == torch.int64) == (stat.dtype == "int64")
    if stat.dtype == "int64":
        assert torch.equal(t, getattr(ref, stat.name))
    else:
        torch.testing.assert_close(t, getattr(ref, stat.name), atol=2e-5, rtol=1e-5)
    if stat.padding is not None:  # the second sequence's rows past its length are padding
        assert bool((t[1, :, LENGTHS[1]:] == stat.padding).all())
    # nothing that was not asked for
    others = [s.name for s in ROW_STATS if s.switch != stat.switch and getattr(got, s.name) is not None]
    assert others == []


@pytest.mark.parametrize("run", RUNS)
def test_a_statistic_no_backend_computes_fails_loudly_in_each(run, monkeypatch):
    """A contributor who adds a statistic to the table and forgets a backend hears of it
    from that backend, whichever it is."""

    @dataclasses.dataclass(frozen=True)
    class NewSpec(StatsSpec):
        attention_rollout: bool = False

    new = RowStat("attention_rollout", ("B", "H", "L"), "attention_rollout")
    monkeypatch.setattr(spec_module, "ROW_STATS", ROW_STATS + (new,))
    args, pooling = inputs()
    RUNS[run](*args, NewSpec(n_key_classes=C, entropy=True), pooling=pooling)  # not asked: fine
    with pytest.raises(NotImplementedError, match="attention_rollout"):
        RUNS[run](*args, NewSpec(n_key_classes=C, entropy=True, attention_rollout=True), pooling=pooling)


def test_default_spec_asks_for_nothing():
    assert asked_stats(StatsSpec()) == ()
    args, pooling = inputs()
    _, stats = attention_stats_eager(*args, StatsSpec(n_key_classes=C))
    assert all(getattr(stats, s.name) is None for s in ROW_STATS)


def test_union_turns_on_what_either_asks_for():
    a = StatsSpec(offsets=(1, -1), n_key_classes=C, entropy=True)
    b = StatsSpec(offsets=(0,), n_key_classes=C, word_maps=True)
    assert {s.name for s in asked_stats(a.union(b))} == {"entropy", "offset_mass", "word_map", "word_argmax"}
    assert a.union(b).offsets == (-1, 0, 1)


def all_on() -> StatsSpec:
    return StatsSpec(offsets=OFFSETS, n_key_classes=C,
                     **{s.switch: True for s in ROW_STATS if s.switch != "offsets"})


def test_as_float32_widens_the_float_statistics_of_the_table_only():
    args, pooling = inputs()
    _, stats = attention_stats_eager(*args, all_on(), pooling=pooling)
    half = RowStats(**{s.name: getattr(stats, s.name).half() if s.dtype == "float" else getattr(stats, s.name)
                       for s in ROW_STATS})
    half.as_float32()
    for s in ROW_STATS:
        assert getattr(half, s.name).dtype == (torch.int64 if s.dtype == "int64" else torch.float32), s.name


def test_removed_heads_hold_the_table_value():
    args, pooling = inputs()
    _, stats = attention_stats_eager(*args, all_on(), pooling=pooling)
    spread = head_removal.spread_heads(stats, (0, 2, 3), 5)  # physical heads 0, 1, 2 -> slots 0, 2, 3 of 5
    for s in ROW_STATS:
        t = getattr(spread, s.name)
        removed = t[:, [1, 4]]
        if np.isnan(s.removed):
            assert bool(removed.isnan().all()), s.name
        else:
            assert bool((removed == s.removed).all()), s.name
        assert torch.equal(t[:, [0, 2, 3]], getattr(stats, s.name)), s.name


def test_segment_sums_and_head_stats_cover_every_sum_of_the_table():
    """One segment sum per `SegmentSum` of each asked statistic, each equal to a plain sum of
    the statistic's rows; one HeadStats array per segment sum."""
    args, pooling = inputs()
    spec = all_on()
    _, stats = attention_stats_eager(*args, spec, pooling=pooling)
    classes = TokenClasses.of(("a", "b", "c"))
    batch = BatchContext(indices=[0, 1], segments=[None, None], inputs={}, key_valid=args[3], key_class=args[4],
                         classes=classes, spec=spec, layers=[stats])
    sums = batch.segment_sums(0)
    assert list(sums) == [m.name for m in SEGMENT_SUMS]
    valid = args[3].double()  # (B, L): group 0 is every valid row
    torch.testing.assert_close(sums["entropy"][:, :, 0, 0], (stats.entropy.double() * valid[:, None]).sum(-1))
    torch.testing.assert_close(sums["class_mass"][:, :, 0],
                               (stats.class_mass.double() * valid[:, None, :, None]).sum(2))
    assert torch.equal(sums["argmax_offset"][:, :, 0].sum(-1), valid.sum(-1)[:, None].expand(B, H))
    acc = HeadStats(1, H, spec, classes)
    acc.add(batch)
    assert set(ARRAYS) >= {m.array for m in SEGMENT_SUMS}
    np.testing.assert_allclose(acc.entropy_sum[0, :, 0], sums["entropy"][:, :, 0, 0].sum(0).numpy())
    np.testing.assert_allclose(acc.offset_mass_sum[0, :, 0], sums["offset_mass"][:, :, 0].sum(0).numpy())


def test_row_stats_has_one_attribute_per_entry():
    names = [f.name for f in dataclasses.fields(RowStats)]
    assert names[:len(ROW_STATS)] == [s.name for s in ROW_STATS]
    assert "queries" in names and "keys" in names
