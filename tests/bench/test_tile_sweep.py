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


def test_the_commands_sweep_takes_only_legal_switches():
    """`--commands`: SUMS_BY_DOT's modes where the kernel may take them (a free ones column; L_AND_T with the
    entropy and no argmax; none on sm_80), G compiled in only for grouped layouts, one change
    at a time around a candidate; the budget's rows are never searched."""
    from bertscope.kernels.triton_config import L_AND_T, L_ONLY, PER_SCORE

    default = kernel_stats("default")
    spec = triton_aot.LayoutSpec(128, "bf16", default, 4, 1)
    assert tile_sweep.sums_modes(spec, 90) == [PER_SCORE, L_ONLY, L_AND_T]
    assert tile_sweep.sums_modes(spec, 80) == [PER_SCORE]
    assert tile_sweep.sums_modes(triton_aot.LayoutSpec(128, "bf16", (*default, "argmax"), 4, 1), 90) == \
        [PER_SCORE, L_ONLY]
    assert tile_sweep.sums_modes(triton_aot.LayoutSpec(128, "bf16", ("class_mass",), 32, 4), 90) == [PER_SCORE]
    c = tile_sweep._candidate(spec, 128, 64, 8, 2, PER_SCORE, True, False)
    assert c.config(90)["MASKED_FIRST"] and c.config(90)["BLOCK_N"] == 64 and c.config(90)["num_stages"] == 2
    near = tile_sweep._variants(spec, 90, c)
    assert {x.tiles for x in near} == {(128, 64, 8, 1), (128, 64, 8, 2), (128, 64, 8, 3)}
    assert not any(dict(x.switches)["FIXED_G"] for x in near)  # G = 1: nothing to compile in
    g4 = triton_aot.LayoutSpec(128, "bf16", default, 4, 4)
    near = tile_sweep._variants(g4, 90, tile_sweep._candidate(g4, 128, 64, 8, 2, PER_SCORE, True, False))
    assert [dict(x.switches)["FIXED_G"] for x in near].count(True) == 1
    runs = {cs.shape.name: cs for cs in triton_aot.command_specialisations(("bf16",)) if cs.statistics == "+".join(
        default)}
    assert tile_sweep.in_budget(runs["Llama-3-8B"]) and not tile_sweep.in_budget(runs["Llama-2-7B"])
    rows = [{"ratio": 1.0, "ratio_masked": 1.1, "num_stages": 1}, {"ratio": 1.02, "ratio_masked": 1.2,
                                                                   "num_stages": 2},
            {"ratio": 1.2, "ratio_masked": 1.0, "num_stages": 3}]
    assert tile_sweep.choose(rows) is rows[1]  # within TIE of the fewest: pipelined loads win
