"""bench/tile_sweep.py: the statistics a family's sweep switches on come from the table's traits, and a
candidate's tiles reach the compiled config (`triton_aot.Specialisation.tiles`); no compile here (the
commands' ratchet, tests/kernels/test_triton_commands.py, compiles the tiles that ship)."""
from __future__ import annotations

import sys
from pathlib import Path

from bertscope.kernels import triton_aot
from bertscope.kernels.spec import kernel_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import tile_sweep


def test_a_family_switches_on_its_statistics_over_the_commands_base():
    base = (*kernel_stats("default"), *kernel_stats("wide"))
    assert tile_sweep.statistics(["positions"]) == (*base, *kernel_stats("positions"))
    union = tile_sweep.statistics(["tokens", "positions"])
    assert set(union) == set(base) | set(kernel_stats("tokens")) | set(kernel_stats("positions"))
    assert len(union) == len(set(union))


def test_a_candidates_tiles_reach_the_config_and_the_name():
    spec = triton_aot.Specialisation(64, "bf16", tile_sweep.statistics(["positions"]), 4, True, 4)
    swept = triton_aot.Specialisation(64, "bf16", spec.stats, 4, True, 4, tiles=(32, 16, 4, 1))
    c, s = spec.config(80), swept.config(80)
    assert (s["BLOCK_M"], s["BLOCK_N"], s["num_warps"], s["num_stages"]) == (32, 16, 4, 1)
    assert {k: v for k, v in s.items() if k not in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")} == \
        {k: v for k, v in c.items() if k not in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
    assert " M32 N16 " in swept.name(80) and swept.name(80) != spec.name(80)
