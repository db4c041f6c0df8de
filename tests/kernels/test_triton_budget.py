"""The instruction budget of issue 40, read from compiled SASS (kernels/triton_aot.py, triton_sass.py):
the fused forward with the default statistics (entropy, class masses; the offsets are the epilogue's)
at D = 64 and 128, plain and causal grouped-query, fp16 and bf16, sm_80 and sm_90, against the best
spill-free tile of the flash-attention baseline (bench/flash_baseline.py) for the same D, dtype,
target and causal-ness.

Each specialisation must meet the targets (main loop <= 1.3x the baseline's warp-instructions per
1,000 scores, <= 1.1 MUFU per score, sm_90 wgmma N >= 64 for QK^T and P V, no spill), or, where it
does not yet, stay within the ceiling `BUDGET_CEILINGS` records for it: a ratchet, so a change that
makes the kernel issue more fails here, on any machine, without a GPU.

The compiles run in one child process per target, in parallel, without TRITON_INTERPRET (which
other modules of this session set); Triton's on-disk cache makes a repeated run fast.
"""
import json
import os
import subprocess
import sys

import pytest

from bertscope.kernels.triton_aot import ARCHS, BUDGET_CEILINGS, budget_rows, budget_specialisations, over_budget


@pytest.fixture(scope="module")
def budget():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = [subprocess.Popen([sys.executable, "-m", "bertscope.kernels.triton_aot", "--budget", "--json",
                               "--arch", str(arch)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for arch in ARCHS]
    rows, baseline = [], []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        out = json.loads(stdout)
        rows += out["rows"]
        baseline += out["baseline"]
    return budget_rows(rows, baseline)


@pytest.mark.full  # tests/tiers.py
def test_the_budget_covers_its_matrix(budget):
    """Every (target, D, layout, dtype) of the issue has a row, and every ceiling names a real one."""
    assert len(budget_specialisations()) == 8
    seen = {(r["arch"], r["D"], r["layout"], r["spec"].split()[6 if r["layout"] != "plain" else 5]) for r in budget}
    assert seen == {(f"sm_{a}", D, layout, t) for a in ARCHS for D in (64, 128)
                    for layout in ("plain", "causal GQA") for t in ("fp16", "bf16")}
    assert set(BUDGET_CEILINGS) <= {(r["arch"], r["D"], r["layout"]) for r in budget}


@pytest.mark.parametrize("key", [(f"sm_{a}", D, layout) for a in ARCHS for D in (64, 128)
                                 for layout in ("plain", "causal GQA")], ids=lambda k: f"{k[0]}-D{k[1]}-{k[2]}")
@pytest.mark.full  # tests/tiers.py
def test_budget(budget, key):
    for row in (r for r in budget if (r["arch"], r["D"], r["layout"]) == key):
        problems = over_budget(row)
        assert not problems, f"{row['spec']} on {row['arch']}: " + "; ".join(problems)


def test_over_budget_says_what_is_wrong():
    """The checker on hand-made rows: within the targets, over a target unlisted, over a ceiling,
    listed while meeting every target, spilling."""
    ok = {"spec": "plain", "arch": "sm_90", "ratio": 1.2, "mufu_per_score": 1.03, "within_ratio": True,
          "within_mufu": True, "wgmma_n_ok": True, "no_spill": True, "spill_stores": 0, "spill_loads": 0,
          "ceiling": None}
    assert over_budget(ok) == []
    assert over_budget({**ok, "ratio": 1.5, "within_ratio": False}) == ["main loop 1.5x the baseline (target 1.3x)"]
    capped = {**ok, "ratio": 1.5, "within_ratio": False, "ceiling": {"ratio": 1.6, "mufu": 1.1}}
    assert over_budget(capped) == []
    assert over_budget({**capped, "ratio": 1.7}) == ["main loop 1.7x the baseline, over its ceiling 1.6x"]
    assert over_budget({**ok, "ceiling": {"ratio": 1.6, "mufu": 1.1}}) == [
        "meets every target: delete its BUDGET_CEILINGS line"]
    assert over_budget({**ok, "no_spill": False, "spill_stores": 8, "spill_loads": 8}) == ["spills 8/8 B"]
    assert over_budget({**ok, "wgmma_n_ok": False}) == ["a QK^T or P V wgmma narrower than 64"]
