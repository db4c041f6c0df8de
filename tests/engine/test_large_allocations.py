"""A long input's forward has glibc map its large tensors one by one (`loop.map_large_allocations`),
so freed ones go back to the OS: one 8,192-token SmolLM2 forward peaked 793 MB above its start
with glibc's default, 371 MB with the threshold fixed (bench/bench_longmem.py)."""
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

from bertscope.engine import loop


@pytest.fixture
def libc(monkeypatch):
    """A stand-in C library recording its mallopt calls; the process's own allocator is untouched."""
    calls = []

    def mallopt(param, value):
        calls.append((param, value))
        return 1
    monkeypatch.setattr(loop.ctypes, "CDLL", lambda name: SimpleNamespace(mallopt=mallopt))
    monkeypatch.setattr(loop, "_large_allocations_mapped", False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    return calls


def test_the_threshold_is_fixed_once(libc):
    assert loop.map_large_allocations() is True
    assert loop.map_large_allocations() is True
    assert libc == [(-3, 1 << 20)]  # M_MMAP_THRESHOLD, once per process


def test_the_users_own_threshold_stays(libc, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert loop.map_large_allocations() is False
    assert libc == []


def test_no_mallopt_no_change(monkeypatch):
    def no_libc(name):
        raise OSError("not glibc")
    monkeypatch.setattr(loop.ctypes, "CDLL", no_libc)
    monkeypatch.setattr(loop, "_large_allocations_mapped", False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert loop.map_large_allocations() is False


@pytest.mark.parametrize("length,mapped", [(loop.LONG_INPUT - 1, False), (loop.LONG_INPUT, True)])
def test_only_a_long_input_maps_its_allocations(libc, length, mapped):
    loaded = SimpleNamespace(model=lambda **inputs: "outputs", forward_options={})
    probe = SimpleNamespace(active=lambda key_class, sink, pooling, padded=None, token_ids=None: nullcontext())
    batch = SimpleNamespace(inputs={"input_ids": torch.zeros(2, length, dtype=torch.long)}, key_class=None,
                            token_ids=None, pooling=None, layers=[], padded=False)
    assert loop.forward(loaded, probe, batch).outputs == "outputs"
    assert (libc == [(-3, 1 << 20)]) is mapped
