"""Every command at flash speed (issue 48): the fused forward's specialisation that each command of the
registry launches (`analyses.registry.COMMANDS` -> each module's `kernel_specs`, never a list kept here),
at the shapes of Llama-3.2-1B, Llama-3-8B, Llama-2-7B, Gemma-3 and bert-base, compiled for sm_80 and
sm_90 and read from its SASS (kernels/triton_aot.py `--commands`), against the flash baseline at the same
head size.

Targets: the default statistics <= 1.3x the baseline's main loop (<= 1.4x with the masked stage counted
at a causal 4,096), every other set <= 1.5x (1.6x), MUFU per score <= 1.1, wgmma N >= 64 on sm_90, no
spill. A row that misses one is held to its `COMMAND_CEILINGS` line (a ratchet: issuing more fails, and
so does meeting every target while listed).

The compiles (bf16 only: fp16 compiles to the same loops, docs/kernels.md; one child process per
target, in parallel, without TRITON_INTERPRET) take a few minutes on two cores the first time; Triton's
on-disk cache makes a repeated run fast.
"""
import json
import os
import subprocess
import sys

import pytest

from bertscope.analyses.registry import COMMANDS, KernelModel, kernel_specs
from bertscope.kernels.spec import StatsSpec
from bertscope.kernels.triton_aot import (
    ARCHS,
    CAUSAL_L,
    COMMAND_CEILINGS,
    MODEL_SHAPES,
    causal_insn_per_1k,
    causal_iterations,
    command_problems,
    command_specialisations,
)


def test_every_command_declares_its_kernel_specs():
    """Each command of the registry says what it asks of the kernel ({} for none), for an encoder and a
    decoder; `run` and the decoders' families ask for something."""
    asked = set()
    for command in COMMANDS:
        for causal in (False, True):
            specs = kernel_specs(command, KernelModel(causal=causal))
            assert isinstance(specs, dict), command
            assert all(isinstance(s, StatsSpec) for s in specs.values()), command
            if specs:
                asked.add(command)
    assert {"run", "atlas", "heads positions", "heads retrieval", "heads induction", "features"} <= asked
    assert "heads disable" not in asked  # its variants run gated SDPA


def test_command_specialisations_are_the_registry_s():
    """The rows are the registry's specs, one per kernel: run --argmax, the atlas's union (token relations,
    positions), the positions' set, the statistics-free forward, the norm-based twins of run, sinks and atlas
    (--norms); the default statistics at every shape, also under uniform gates."""
    specs = command_specialisations(("bf16",))
    by_shape = {}
    for cs in specs:
        by_shape.setdefault(cs.shape.name, {})[cs.statistics] = cs
    assert set(by_shape) == {s.name for s in MODEL_SHAPES}
    for shape, sets in by_shape.items():
        assert "run: default" in sets["entropy+class_mass"].uses, shape
        assert sets["entropy+class_mass+argmax"].uses == ("run: --argmax",), shape
        assert "heads retrieval: retrieval" in sets["argmax"].uses, shape
        assert sets["class_mass+distance_mass+mean_distance+position_mass"].uses == ("heads positions: positions",)
        union = "entropy+class_mass+distance_mass+mean_distance+position_mass+duplicate_mass+prefix_match_mass"
        assert sets[union].uses == ("atlas: stream (union)",), shape
        # --norms (the norm-based twins, off by default on the triton backend): run's, sinks' and the atlas's
        assert sets["entropy+class_mass+offset_mass_norm+class_mass_norm+weighted_norm"].uses == ("run: --norms",)
        assert sets["entropy+class_mass+class_mass_norm+weighted_norm"].uses == ("sinks: sinks --norms",), shape
        assert sets[union + "+class_mass_norm+weighted_norm"].uses == ("atlas: stream (union) --norms",), shape
        assert "heads induction: induction" in sets["none"].uses, shape
        # uniform gates launch the default statistics' kernel (their rows are written after it)
        assert "api: default under uniform gates" in sets["entropy+class_mass"].uses, shape
    assert len({(cs.shape, cs.statistics) for cs in specs}) == len(specs)  # one row per kernel


def test_causal_iterations_by_hand():
    """The stages' block counts at a causal L: the baseline's (the diagonal's BLOCK_M / BLOCK_N blocks
    masked) and the fused forward's (G rows stacked per position)."""
    c = {"BLOCK_M": 128, "BLOCK_N": 64}
    # baseline, L = 512: 4 programs of 128 rows; program s has 2 s unmasked blocks and 2 masked ones
    assert causal_iterations(c, 1, 512, baseline=True) == (0 + 2 + 4 + 6, 8, 512 * 513 // 2)
    # fused, G = 1: the same blocks
    assert causal_iterations(c, 1, 512) == (12, 8, 512 * 513 // 2)
    # fused, G = 4 at 128 x 64, L = 128: 4 programs of 32 positions; program s: first 32 s, its row end
    # 32 s + 31 -> masked up to the block holding 32 s + 31, unmasked [0, (32 s + 1) // 64 * 64): 0, 0, 1, 1
    # unmasked blocks and 1, 1, 1, 1 masked ones
    assert causal_iterations(c, 4, 128) == (2, 4, 4 * 128 * 129 // 2)
    row = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "loop_instructions": 100, "masked_loop_instructions": 200}
    assert causal_insn_per_1k(row, 1) == round((causal_iterations(row, 1)[0] * 100 + causal_iterations(row, 1)[1]
                                                 * 200) * 8 / (CAUSAL_L * (CAUSAL_L + 1) // 2) * 1000, 1)
    assert causal_insn_per_1k({**row, "masked_loop_instructions": None}, 1) is None


def test_command_problems_says_what_is_wrong():
    ok = {"ratio": 1.2, "ratio_masked": 1.3, "target_ratio": 1.3, "target_masked": 1.4, "mufu_per_score": 1.03,
          "wgmma_n_ok": True, "no_spill": True, "spill_stores": 0, "spill_loads": 0, "ceiling": None}
    assert command_problems(ok) == []
    assert command_problems({**ok, "ratio": 1.5}) == ["main loop 1.5x the baseline (target 1.3x)"]
    assert command_problems({**ok, "ratio_masked": 1.5}) == [
        f"1.5x with the masked stage at causal {CAUSAL_L} (target 1.4x)"]
    assert command_problems({**ok, "ratio_masked": None}) == []  # the plain layout: no causal stage
    capped = {**ok, "ratio": 2.0, "ceiling": {"ratio": 2.05}}
    assert command_problems(capped) == []
    assert command_problems({**capped, "ratio": 2.1}) == [
        "main loop 2.1x the baseline (target 1.3x), over its ceiling 2.05"]
    assert command_problems({**ok, "ceiling": {"ratio": 2.05}}) == [
        "meets every target: delete its COMMAND_CEILINGS line"]
    assert command_problems({**ok, "no_spill": False, "spill_stores": 8, "spill_loads": 8}) == ["spills 8/8 B"]
    assert command_problems({**ok, "no_spill": False, "spill_stores": 8, "ceiling": {"spills": 8}}) == []
    assert command_problems({**ok, "wgmma_n_ok": False}) == ["a QK^T or P V wgmma narrower than 64"]
    assert command_problems({**ok, "wgmma_n_ok": False, "ceiling": {"narrow_wgmma": True}}) == []


@pytest.fixture(scope="module")
def rows():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = [subprocess.Popen([sys.executable, "-m", "bertscope.kernels.triton_aot", "--commands", "--json",
                               "--dtype", "bf16", "--arch", str(arch)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for arch in ARCHS]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=1800)
        assert proc.returncode == 0, stderr[-3000:]
        out += json.loads(stdout)["rows"]
    return out


@pytest.mark.full  # tests/tiers.py
def test_the_commands_cover_their_shapes(rows):
    """Every shape has rows on every target, each with a baseline and a loop; every ceiling names a row."""
    assert {(r["arch"], r["shape"]) for r in rows} == {(f"sm_{a}", s.name) for a in ARCHS for s in MODEL_SHAPES}
    assert all(r["baseline_best"] and r["ratio"] for r in rows)
    assert all(r["ratio_masked"] for r in rows if r["layout"] != "plain")
    assert set(COMMAND_CEILINGS) <= {(r["arch"], r["shape"], r["statistics"]) for r in rows}


@pytest.mark.full  # tests/tiers.py
@pytest.mark.parametrize("key", [(f"sm_{a}", s.name) for a in ARCHS for s in MODEL_SHAPES], ids=lambda k: "-".join(k))
def test_command_budget(rows, key):
    bad = {f"{r['statistics']} ({r['spec']})": command_problems(r) for r in rows if (r["arch"], r["shape"]) == key}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, "\n".join(f"{k}: {'; '.join(v)}" for k, v in bad.items())
