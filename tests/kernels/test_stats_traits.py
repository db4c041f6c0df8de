"""The table's statistics as data (`spec.KernelTraits`, `RowStat.pass_kind`, `twinned`, `meta`): the traits
hold values the readers know, the kernel has what each entry's traits name, the readers (the launch's
config, the AOT matrix, chunked's passes, HeadStats' file meta, the atlas) follow them, and no statistic of
the table is listed by name anywhere else in the source (a list the next statistic would be missing from)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from bertscope.engine.accumulate import META_ALWAYS, META_WHEN_ON, TOKEN_RELATIONS, HeadStats
from bertscope.kernels import spec as spec_module
from bertscope.kernels.spec import (
    KERNEL_KINDS,
    KERNEL_READS,
    KERNEL_TILES,
    PASS_KINDS,
    ROW_STATS,
    STAT,
    KernelTraits,
    RowStat,
    StatsSpec,
    kernel_stats,
)
from bertscope.text.token_classes import TokenClasses

ROOT = Path(__file__).resolve().parents[2]
# the source the search reads: the package and its two top-level folders (bertscope/kernels and
# bertscope/analyses are links to them: read once)
SOURCE = [p for top in ("bertscope", "kernels", "analyses") for p in sorted((ROOT / top).rglob("*.py"))
          if not p.relative_to(ROOT).as_posix().startswith(("bertscope/kernels/", "bertscope/analyses/"))]
# the one place a list of statistics' names is a format: the examples file's column order
FORMATS = {"bertscope/engine/per_example.py": "EXAMPLE_SUMS, examples.parquet's columns in the file's order",
           "analyses/atlas/compare.py": "FEATURES, atlas_compare.csv's columns (some named as statistics are)"}
# analyses name their own output columns, some of which are called as a statistic is (atlas_heads.csv's
# entropy, duplicate_mass): a dict of column descriptions or a tuple of column names there is an output
# format, not a list of the table's statistics. The core (bertscope/, kernels/) may name none.
CORE = ("bertscope/", "kernels/")


@pytest.mark.parametrize("stat", ROW_STATS, ids=lambda s: s.name)
def test_traits_hold_known_values(stat: RowStat):
    assert stat.pass_kind in PASS_KINDS
    t = stat.kernel
    if t is None:
        return
    assert t.kind in KERNEL_KINDS and t.tiles in KERNEL_TILES and set(t.reads) <= set(KERNEL_READS)
    assert stat.pass_kind in ("row", "blocks", "norm"), "the kernel computes it in its loop or epilogue"
    assert t.kind == "epilogue" or t.switch is not None, "a loop statistic is compiled in by its switch"
    if stat.switch == "norms":  # the norm-based twins and the weighted norm: the norm features read
        assert t.switch == stat.name.upper() and "value_norms" in t.reads
    else:
        assert (t.kind == "epilogue") == (t.switch is None), "an epilogue statistic is there when asked"
    assert t.registers >= 0 and not t.second_pass


def test_the_kernel_has_what_the_traits_name():
    """Each entry with kernel traits has its output's index (into the kernel's `Stats` tuple) and its switch's
    index (into `STATS`) in the kernel's module, at the places the table's order gives them, and every switch
    index of the module named after a statistic belongs to an entry (kernel_outputs reads the table, not names)."""
    from bertscope.kernels import triton_kernel
    from bertscope.kernels.triton_launch import _indices, kernel_outputs, kernel_switches_order, output_argument

    index = _indices(triton_kernel.attn_stats_fwd)
    outputs = kernel_outputs()
    assert [s for s, _, _ in outputs] == [s for s in ROW_STATS if s.kernel is not None]
    order = kernel_switches_order()
    for i, (stat, arg, flag) in enumerate(outputs):
        assert arg == output_argument(stat) and index[arg] == i
        assert flag is None or index[flag] == order.index(flag)
    switches = {s.kernel.switch for s in ROW_STATS if s.kernel is not None}
    assert set(order) == switches - {None}
    for name in index:
        if name.isupper() and name.lower() in STAT:
            assert name in switches, f"{name}: a kernel switch no table entry names"


@pytest.fixture
def uncached_outputs(monkeypatch):
    """`kernel_outputs` read afresh while a test's patches hold, and afresh again after them (it is cached)."""
    from bertscope.kernels import triton_launch

    triton_launch.kernel_outputs.cache_clear()
    yield
    triton_launch.kernel_outputs.cache_clear()


def test_an_index_out_of_the_tables_order_fails_before_any_launch(monkeypatch, uncached_outputs):
    """The kernel's module takes its indices from the table; one written by hand at another place is refused."""
    import triton.language as tl

    from bertscope.kernels import triton_kernel, triton_launch

    monkeypatch.setattr(triton_kernel, "Argmax", tl.constexpr(0))
    with pytest.raises(NotImplementedError, match=r"reads argmax \(Argmax = 0, not 3\)"):
        triton_launch.kernel_outputs()


def test_a_trait_naming_what_the_kernel_lacks_fails_before_any_launch(monkeypatch, uncached_outputs):
    from bertscope.kernels import triton_launch

    broken = dataclasses.replace(STAT["entropy"], kernel=dataclasses.replace(STAT["entropy"].kernel,
                                                                             switch="ENTROPY_V7"))
    monkeypatch.setattr(triton_launch, "ROW_STATS", tuple(broken if s.name == "entropy" else s for s in ROW_STATS))
    with pytest.raises(NotImplementedError, match=r"lacks entropy \(ENTROPY_V7\)"):
        triton_launch.kernel_outputs()


def test_the_config_and_the_aot_matrix_read_the_tile_families():
    from bertscope.kernels import triton_aot, triton_config

    families = {f: kernel_stats(f) for f in KERNEL_TILES}
    assert set().union(*families.values()) == set(kernel_stats())
    assert triton_config.DEFAULT_SWITCHES == frozenset(families["default"]) == frozenset(triton_aot.DEFAULT_STATS)
    assert triton_config.POSITION_STATS == families["positions"] == triton_aot.position_stats()
    assert triton_config.TOKEN_STATS == families["tokens"] == triton_aot.TOKEN_STATS
    # a statistic's family picks the tiles: the same config as the family's first member alone
    for family, names in families.items():
        for name in names:
            one = triton_config.kernel_config(64, torch.float16, 90, frozenset({name}), 4)
            first = triton_config.kernel_config(64, torch.float16, 90, frozenset({names[0]}), 4)
            assert one == first, (family, name)


def test_a_new_statistic_of_a_family_takes_its_tiles(monkeypatch):
    """A statistic added to the table with the position family's traits gets the position tiles, with no
    list to update (the config reads the traits)."""
    from bertscope.kernels import triton_config

    near = RowStat("near_mass", ("B", "H", "L"), "distance",
                   kernel=KernelTraits("per_bucket", "NEAR_MASS", reads=("positions",), tiles="positions"))
    monkeypatch.setattr(spec_module, "ROW_STATS", ROW_STATS + (near,))
    got = triton_config.kernel_config(64, torch.float16, 90, frozenset({"near_mass"}), 4)
    assert got == triton_config.kernel_config(64, torch.float16, 90, frozenset({"distance_mass"}), 4)
    assert got != triton_config.kernel_config(64, torch.float16, 90, frozenset({"entropy"}), 4)


def test_chunked_passes_follow_the_table():
    from bertscope.kernels.chunked import by_block

    every = StatsSpec(n_key_classes=4, offsets=(0,), entropy=True, class_mass=True, argmax=True, distance=True,
                      position_mass=True, token_relations=True, column_mass=True, norms=True)
    assert [s.name for s in by_block(every)] == [s.name for s in ROW_STATS if s.asked(every)
                                                 and s.pass_kind == "blocks"]
    assert {s.name for s in by_block(every)} >= {"distance_mass", "duplicate_mass", "distance_mass_norm"}
    assert not {s.name for s in by_block(every)} & {"entropy", "column_mass", "class_mass_norm"}


def test_head_stats_meta_records_the_switches_of_its_sums(tmp_path):
    """Every switch of a statistic with segment sums is in the file's meta and read back: always for the
    entries marked `meta`, when on for the others."""
    with_sums = {s.switch for s in ROW_STATS if s.sums and s.twin_of is None} - {"offsets"}
    assert set(META_ALWAYS) | set(META_WHEN_ON) == with_sums and not set(META_ALWAYS) & set(META_WHEN_ON)
    classes = TokenClasses.of(("a", "b", "c", "d"))
    on = StatsSpec(n_key_classes=4, offsets=(-1, 1), entropy=True, class_mass=True, argmax=True,
                   token_relations=True, norms=True, streaming=(2, 8))
    off = StatsSpec(n_key_classes=4, offsets=(0,), entropy=False, class_mass=True)
    for spec in (on, off):
        acc = HeadStats(2, 3, spec, classes)
        acc.save(tmp_path / "h.npz")
        assert HeadStats.load(tmp_path / "h.npz").spec == spec
        meta = acc.meta()
        assert set(META_ALWAYS) <= set(meta)
        assert {w for w in META_WHEN_ON if w in meta} == {w for w in META_WHEN_ON if getattr(spec, w)}


def test_the_token_relations_of_the_accumulator_and_the_atlas_are_the_tables():
    from bertscope.analyses.atlas.stats import TOKEN_MATCH

    relations = tuple(s.name for s in ROW_STATS if s.switch == "token_relations")
    assert tuple(TOKEN_RELATIONS) == TOKEN_MATCH == relations and len(relations) == 2
    assert spec_module.NORM_TWINNED == tuple(s.name for s in ROW_STATS if s.twinned)


def named_lists(source: str, rel: str) -> list[tuple[int, list[str]]]:
    """(line, names) of each literal collection in `source` (the file `rel`) naming two or more distinct
    statistics of the table: a tuple, list or set of strings anywhere, a dict's keys in the core (`CORE`)."""
    names = set(STAT)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict) and rel.startswith(CORE):
            items = node.keys
        else:
            continue
        hit = sorted({e.value for e in items if isinstance(e, ast.Constant) and e.value in names})
        if len(hit) >= 2:
            found.append((node.lineno, hit))
    return found


def test_no_statistic_is_listed_outside_its_entry():
    """The statistics are data: a list of them written by hand is what the next one would be missing from.
    Only the table (kernels/spec.py, whose entries name one statistic each) and a file format may name them."""
    assert len(SOURCE) > 100
    bad = []
    for path in SOURCE:
        rel = path.relative_to(ROOT).as_posix()
        found = named_lists(path.read_text(encoding="utf-8"), rel)
        if rel in FORMATS:
            assert len(found) == 1, f"{rel}: its one exempt list ({FORMATS[rel]}), found {found}"
            continue
        bad += [f"{rel}:{line}: {', '.join(hit)}" for line, hit in found]
    assert not bad, "statistics listed by name outside the table (read its traits instead):\n" + "\n".join(bad)


def test_the_search_finds_a_hand_kept_list():
    """The search above is not blind: lists like the ones it replaced are found (a dict's keys in the core
    only: an analysis describes its output columns in dicts)."""
    src = 'POSITIONS = ("distance_mass", "mean_distance")\nOK = ("entropy",)\nD = {"entropy": 1, "class_mass": 2}\n'
    assert named_lists(src, "kernels/x.py") == [(1, ["distance_mass", "mean_distance"]),
                                                (3, ["class_mass", "entropy"])]
    assert named_lists(src, "analyses/x/outputs.py") == [(1, ["distance_mass", "mean_distance"])]


def test_family_tiles_are_keyed_data_the_config_reads():
    """The tile families' entries of `triton_config.TILES`: keys of known targets, D classes, layouts and kinds;
    a call whose switches fall in a family takes its entry (the tokens' when it has both, as the atlas's union),
    the masked stage first when banded; a D class without tiles of its own takes FAMILY_FALLBACK's, written in."""
    from bertscope.kernels import triton_config as tc

    kinds = [kind for kind, _ in tc.KINDS]
    assert {"positions", "tokens"} <= set(kinds) and kinds.index("tokens") < kinds.index("positions")
    for (target, d_class, layout, kind), entry in tc.TILES.items():
        assert target in (80, 90) and d_class in (32, 64, 128, 256) and layout in tc.LAYOUTS and kind in kinds
        m, n, w, s = entry.tiles
        assert m % 16 == 0 and n % 16 == 0 and w in (4, 8) and s >= 1
    positions, tokens = frozenset(kernel_stats("positions")), frozenset(kernel_stats("tokens"))
    for banded, layout in ((False, "plain"), (True, "banded")):
        for on, family in ((positions, "positions"), (tokens, "tokens"), (positions | tokens, "tokens")):
            cfg = tc.kernel_config(64, torch.bfloat16, 90, on | {"entropy"}, 4, banded=banded)
            entry = tc.TILES[(90, 64, layout, family)]
            assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]) == entry.tiles
            assert cfg["MASKED_FIRST"] == banded == entry.masked_first
    fallback = tc.kernel_config(128, torch.bfloat16, 80, positions, 4, banded=False)
    assert tc.TILES[(80, 128, "plain", "positions")].tiles == tc.FAMILY_FALLBACK == (64, 32, 8, 2)
    assert (fallback["BLOCK_M"], fallback["BLOCK_N"], fallback["num_warps"], fallback["num_stages"]) == \
        tc.FAMILY_FALLBACK
