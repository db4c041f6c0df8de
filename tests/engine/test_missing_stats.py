"""A statistic the run's spec did not ask for reads as missing in `HeadStats`, never as a measured 0:
its arrays are None (not allocated, not merged, not saved), fresh and after save/load, and `mean`
of one raises `NotComputedError`. Generated from the kernels' table, so a new summed statistic is
covered without editing this file."""
import json

import numpy as np
import pytest
import torch

from bertscope.engine.accumulate import ARRAYS, COUNTS, TOKEN_ARRAYS, HeadStats, NotComputedError
from bertscope.engine.batch import BatchContext
from bertscope.files import write_npz
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import ROW_STATS, StatsSpec
from bertscope.text.token_classes import TokenClasses

B, H, L, D = 2, 3, 7, 8
CLASSES = TokenClasses.of(("a", "b", "c"))
C = CLASSES.n_classes
OFFSETS = (-1, 0, 2)
SUMMED = [s for s in ROW_STATS if s.sums]  # the statistics HeadStats adds up


def spec_of(switches) -> StatsSpec:
    """A spec asking for the table's summed statistics whose switch is in `switches`."""
    return StatsSpec(n_key_classes=C, **{w: OFFSETS if w == "offsets" else True for w in switches})


def arrays_of(stats) -> set[str]:
    return {m.array for s in stats for m in s.sums}


def batch(spec: StatsSpec) -> BatchContext:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g) for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor([L, 4])[:, None]
    key_class = torch.randint(0, C, (B, L), generator=g)
    ids = torch.randint(0, 3, (B, L), generator=g)  # token ids with repeats (the token relations)
    norms = torch.rand(B, H, L, generator=g) + 0.1  # per-key value norms (the norm-based twins)
    _, stats = attention_stats_eager(q, k, v, key_valid, key_class, spec, token_ids=ids, norms=norms)
    return BatchContext(indices=[0, 1], segments=[None, None], inputs={}, key_valid=key_valid, key_class=key_class,
                        classes=CLASSES, spec=spec, layers=[stats, stats], token_ids=ids)


def check_missing(acc: HeadStats, asked: list):
    """The arrays of `asked` hold sums (rows were seen: not all 0); every other one is missing."""
    have = arrays_of(asked)
    # the token relations' eligible-row counts come with their sums
    assert set(acc.arrays) == set(COUNTS) | have | (set(TOKEN_ARRAYS) if acc.spec.token_relations else set())
    assert set(acc.computed) == have
    for name in ARRAYS:
        if name in COUNTS:
            continue
        if name in have:
            assert getattr(acc, name) is not None and np.abs(acc.mean(name)).sum() > 0, name
        else:
            assert getattr(acc, name) is None, name
            with pytest.raises(NotComputedError, match=f"{name} was not computed.*StatsSpec"):
                acc.mean(name)


@pytest.mark.parametrize("stat", SUMMED, ids=lambda s: s.name)
@pytest.mark.parametrize("alone", [True, False], ids=["only-it", "all-but-it"])
def test_a_statistic_not_asked_for_is_missing_fresh_and_after_save_and_load(stat, alone, tmp_path):
    switches = {s.switch for s in SUMMED}
    own = {stat.switch} | ({stat.twin_of.switch} if stat.twin_of is not None else set())  # a twin needs its base
    spec = spec_of(own if alone else switches - {stat.switch})
    asked = [s for s in SUMMED if s.asked(spec)]
    assert (stat in asked) == alone
    acc = HeadStats(2, H, spec, CLASSES)
    acc.add(batch(spec))
    check_missing(acc, asked)

    acc.save(tmp_path / "stats.npz")
    with np.load(tmp_path / "stats.npz") as f:
        saved = set(f.files)
    assert saved & (set(ARRAYS) | set(TOKEN_ARRAYS)) == set(acc.arrays)  # a missing statistic has no array in the file
    back = HeadStats.load(tmp_path / "stats.npz")
    assert back.meta() == acc.meta()
    assert all(getattr(back.spec, w) == getattr(spec, w) for w in switches)
    check_missing(back, asked)
    for name in acc.arrays:
        np.testing.assert_array_equal(getattr(back, name), getattr(acc, name), err_msg=name)
    back.merge(acc)  # the same spec: merges, and stays missing
    check_missing(back, asked)


def test_accumulators_of_different_statistics_do_not_merge():
    a = HeadStats(2, H, spec_of({"entropy"}), CLASSES)
    b = HeadStats(2, H, spec_of({"entropy", "class_mass"}), CLASSES)
    with pytest.raises(ValueError, match="different"):
        a.merge(b)


def test_the_error_names_the_switch_to_turn_on():
    acc = HeadStats(1, H, StatsSpec(n_key_classes=C, entropy=True), CLASSES)
    with pytest.raises(NotComputedError, match=r"class_mass_sum was not computed: .* \(StatsSpec.class_mass\)"):
        acc.mean("class_mass_sum")
    with pytest.raises(NotComputedError, match=r"offset_mass \(StatsSpec.offsets\)"):
        acc.mean("offset_mass_sum", group=acc.group_names[-1])
    assert acc.mean("entropy_sum").shape == (1, H)  # asked, no rows yet: 0 where no rows, as before


@pytest.mark.parametrize("class_mass", [True, False])
def test_a_file_of_the_previous_version_reads_class_mass_from_its_sums(class_mass, tmp_path):
    """The previous version saved every array (zeros for what was not asked) and no "class_mass" in
    its meta; entropy and argmax were in it. Class mass was asked iff its sums are not all 0."""
    spec = spec_of({"offsets", "entropy", "class_mass"} if class_mass else {"offsets", "entropy"})
    acc = HeadStats(2, H, spec, CLASSES)
    acc.add(batch(spec))
    meta = acc.meta()
    del meta["class_mass"]
    G = len(acc.group_names)
    zeros = {"class_mass_sum": np.zeros((2, H, G, C)), "argmax_offset_count": np.zeros((2, H, G, len(OFFSETS) + 1)),
             "argmax_class_count": np.zeros((2, H, G, C))}
    write_npz(tmp_path / "old.npz", meta=json.dumps(meta), n_segments=acc.n_segments, batches_done=0,
              **{**zeros, **{name: getattr(acc, name) for name in acc.arrays}})
    back = HeadStats.load(tmp_path / "old.npz")
    assert back.spec.class_mass is class_mass and back.spec.argmax is False
    assert (back.class_mass_sum is not None) is class_mass and back.argmax_class_count is None
    np.testing.assert_array_equal(back.entropy_sum, acc.entropy_sum)
