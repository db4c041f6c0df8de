"""`bertscope selftest`: passes on correct kernels, fails on a wrong one."""
from dataclasses import replace

import pytest
import torch

from bertscope import selftest
from bertscope.kernels.backends import BACKENDS


def test_selftest_passes_on_this_machine(monkeypatch):
    # the command's flow on every quick shape and layout; its Triton half (the interpreter) is the table
    # tests' (tests/kernels/test_stats_table.py: every statistic, layout and path against eager), and took 30 s
    monkeypatch.delitem(BACKENDS, "triton")
    lines = []
    assert selftest.run_selftest("cpu", quick=True, log=lines.append)
    checked = [line for line in lines if line.strip().startswith("chunked")]
    # every quick shape under every layout, then pairwise JS
    assert len(checked) == len(selftest.QUICK) * len(selftest.LAYOUTS) + 1
    assert all(line.endswith("ok") for line in checked)
    for name in selftest.LAYOUTS:
        under = [line for line in checked if line.split(" max err")[0].rstrip().endswith(" " + name)]
        assert len(under) == len(selftest.QUICK), name
    assert lines[-1] == "all checks passed"


def test_selftest_catches_a_wrong_statistic(monkeypatch):
    right = BACKENDS["chunked"]

    def off_by_a_little(*args, **kwargs):
        out, stats = right(*args, **kwargs)
        stats.entropy = stats.entropy + 1e-3
        return out, stats

    monkeypatch.setitem(BACKENDS, "chunked", off_by_a_little)
    monkeypatch.delitem(BACKENDS, "triton")  # the interpreter's half of the selftest: not what this test is about
    lines = []
    assert not selftest.run_selftest("cpu", quick=True, log=lines.append)
    assert any("FAIL" in line for line in lines) and lines[-1] == "SOME CHECKS FAILED"


@pytest.mark.parametrize("layout", selftest.LAYOUTS)
def test_selftest_cases_cover_padding_single_keys_and_gates(layout):
    case = replace(selftest.QUICK[1], layout=layout)
    (q, k, v, key_valid, key_class), gates, unit, candidate = selftest.inputs(case)
    lengths = key_valid.sum(-1).tolist()
    assert lengths[0] == q.shape[2] and lengths[-1] == 1
    left = selftest.LAYOUTS[layout][1] == "left"  # decoders pad on the left, encoders on the right
    assert bool(key_valid[-1, -1 if left else 0]) and not bool(key_valid[-1, 0 if left else -1])
    assert k.shape[1] == (case.attention.n_key_value_heads or q.shape[1])
    assert gates.uniform.any() and (gates.xi == 0).any() and ((gates.xi != 0) & (gates.xi != 1)).any()
    assert torch.all(unit[~key_valid] == -1)
