"""Every shipped specialisation of the fused Triton forward (4, 16 and 32 key classes; fp32,
fp16, bf16) and of the whole-map kernels compiles for sm_80 and sm_90 without a GPU, and none
spills registers (kernels/triton_aot.py). The layout kernel (causal / windowed / grouped-query)
and the banded map kernels are compiled at the largest specialisation of each block
configuration (`--layouts core`: the whole layout matrix takes ~25 minutes on two cores; it is
the report in docs/kernels.md).

The compiles run in two child processes, one per target, in parallel: the kernel module
must be imported there without TRITON_INTERPRET=1, which other test modules of this
session set. Triton's on-disk cache makes a repeated run fast.
"""
import json
import os
import subprocess
import sys

import pytest

from bertscope.kernels.triton_aot import (
    _REGS,
    _SPILL,
    DTYPES,
    format_table,
    shipped_specialisations,
)

ARCHS = ("80", "90")
# registers per thread and shared memory per block the targets allow
MAX_REGISTERS = 255
MAX_SHARED = {"sm_80": 163 * 1024, "sm_90": 227 * 1024}


@pytest.fixture(scope="module")
def rows():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = [subprocess.Popen([sys.executable, "-m", "bertscope.kernels.triton_aot", "--json", "--arch", arch,
                               "--layouts", "core"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for arch in ARCHS]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        out += json.loads(stdout)
    return out


@pytest.mark.full  # tests/tiers.py
def test_every_specialisation_compiles_for_both_targets(rows):
    """The rows are the declared specialisations (`shipped_specialisations`), named with each
    target's tiles, and the core covers what a run launches: both layouts, every dtype, G = 1, G >= 2 read
    at run time and G = 3 compiled in, the position statistics, every whole-map kernel."""
    for arch in ARCHS:
        want = {(s.name(int(arch)), s.D) for s in shipped_specialisations(layouts="core")}
        assert {(r["spec"], r["D"]) for r in rows if r["arch"] == f"sm_{arch}"} == want
    names = {r["spec"] for r in rows if r["arch"] == "sm_80"}
    for dtype in DTYPES:
        assert any(n.startswith("plain") and f" {dtype} " in n for n in names), dtype
    band = {(D, name.split()[6], name.split()[1]) for name, D in ((r["spec"], r["D"]) for r in rows)
            if name.startswith("band")}
    assert {(64, "bf16", "G=G"), (64, "fp16", "G=1"), (128, "bf16", "G=3"), (256, "bf16", "G=G"),
            (64, "fp32", "G=G"), (256, "fp32", "G=G")} <= band
    for kind in ("plain", "band"):
        assert any(n.startswith(kind) and "position_mass" in n for n in names), kind
        assert any(n.startswith(kind) and "prefix_match_mass" in n for n in names), kind
    for kernel in ("column_mass", "row_lse", "js_pair", "word_map"):
        plain = {n.split()[-1] for n in names if n.startswith(kernel) and not n.endswith("banded")}
        assert plain == set(DTYPES), kernel
        assert {n.split()[-2] for n in names if n.startswith(kernel) and n.endswith("banded")} == {"fp32", "bf16"}
    assert all(r["cubin_bytes"] > 0 for r in rows)


@pytest.mark.full  # tests/tiers.py
def test_no_register_spills(rows):
    spilled = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
    assert not spilled, "register spills:\n" + format_table(spilled)
    assert all(0 < r["registers"] <= MAX_REGISTERS for r in rows)


@pytest.mark.full  # tests/tiers.py
def test_shared_memory_fits(rows):
    for r in rows:
        assert 0 < r["shared"] <= MAX_SHARED[r["arch"]], r


def test_ptxas_report_parsing():
    log = ("ptxas info    : Function properties for attn_stats_fwd\n"
           "    0 bytes stack frame, 16 bytes spill stores, 24 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 544 bytes cmem[0]\n")
    assert _REGS.search(log).group(1) == "168"
    assert _SPILL.search(log).groups() == ("16", "24")
