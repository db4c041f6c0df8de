"""`bertscope selftest`: passes on correct kernels, fails on a wrong one."""
import torch

from bertscope import selftest
from bertscope.kernels import BACKENDS


def test_selftest_passes_on_this_machine():
    lines = []
    assert selftest.run_selftest("cpu", quick=True, log=lines.append)
    checked = [line for line in lines if line.strip().startswith("chunked")]
    assert len(checked) == len(selftest.QUICK) + 1 and all(line.endswith("ok") for line in checked)
    assert lines[-1] == "all checks passed"


def test_selftest_catches_a_wrong_statistic(monkeypatch):
    right = BACKENDS["chunked"]

    def off_by_a_little(*args, **kwargs):
        out, stats = right(*args, **kwargs)
        stats.entropy = stats.entropy + 1e-3
        return out, stats

    monkeypatch.setitem(BACKENDS, "chunked", off_by_a_little)
    lines = []
    assert not selftest.run_selftest("cpu", quick=True, log=lines.append)
    assert any("FAIL" in line for line in lines) and lines[-1] == "SOME CHECKS FAILED"


def test_selftest_cases_cover_padding_single_keys_and_gates():
    (q, k, v, key_valid, key_class), gates, unit, candidate = selftest.inputs(selftest.QUICK[1])
    lengths = key_valid.sum(-1).tolist()
    assert lengths[0] == q.shape[2] and lengths[-1] == 1
    assert gates.uniform.any() and (gates.xi == 0).any() and ((gates.xi != 0) & (gates.xi != 1)).any()
    assert torch.all(unit[~key_valid] == -1)
