"""A layer call of an analysis never waits for the device (issue 40, part 3), checked on the CPU.

The fused Triton launch is replaced by a stub (`stub_launch`: one fixture, one place to retarget
when the launcher changes), and a `TorchDispatchMode` (`watch`) records every aten op one layer
call dispatches, with the side it comes from: the launcher (`LAUNCHER_MODULES`) or the engine
(everything else: the attention function, masks, padding rows, float32 statistics). It fails on
anything that would synchronise a GPU: an op whose result the host reads (`.item()`, `bool()`,
`nonzero`, a boolean index ...), a tensor built from host data (a host-to-device copy), a copy
between devices, and the Tensor methods that read a tensor on the host without a dispatch of
their own on a CPU (`.cpu()`, `.numpy()`, `.tolist()`).

What is asserted: the engine side of every layer call syncs nothing and, after a warm-up call,
dispatches no op at all, padded or not (the Triton kernel writes padding rows' statistics itself;
another backend's are filled with one masked_fill per statistic); `HeadStats.add` reads nothing
off the device. The issue's budget, at most `OPS_PER_LAYER` ops per layer call all told, views of
the launcher's statistics buffer aside, and no syncing op in the launcher either, is
`test_a_layer_call_fits_the_budget` (its message lists every op it saw and where from).
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from test_engine import TINY_HEADS, TINY_LAYERS, random_segments
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AttentionInterface

from bertscope.engine.accumulate import HeadStats
from bertscope.engine.loop import collate_batch, forward
from bertscope.kernels.common import PaddingRows, known_padding, zero_padding_rows
from bertscope.kernels.spec import AttentionLayout, StatsSpec
from bertscope.models import attention
from bertscope.models.attention import HeadProbe, KeyBand, bertscope_attention
from bertscope.models.loading import wrap_model

pytest.importorskip("triton")
ta = pytest.importorskip("bertscope.kernels.triton_attention")  # TRITON_INTERPRET=1: tests/conftest.py

# the launcher's modules (being rewritten): an op whose innermost bertscope frame is in one of them is the launcher's
LAUNCHER_MODULES = tuple(f"bertscope.kernels.{m}" for m in ("triton_attention", "triton_launch", "triton_config",
                                                              "triton_tiles", "triton_aot"))
# the kernel object the launcher launches, `getattr(*LAUNCHED)[grid](...)`: retarget here when that changes
LAUNCHED = (pytest.importorskip("bertscope.kernels.triton_launch"), "attn_stats_fwd")
OPS_PER_LAYER = 4  # the budget for one layer call, all told, after a warm-up call

# ops whose result the host reads, or whose output size depends on the data (a GPU waits for it)
# (and a boolean index, repeat_interleave by a tensor without output_size: `OpLog`)
SYNCING = {"aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.equal", "aten.allclose",
           "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique", "aten._unique2",
           "aten.unique_dim", "aten.unique_consecutive", "aten.bincount"}
# a tensor made from host data (torch.tensor(list, device=...), torch.from_numpy): a blocking
# host-to-device copy on a GPU
FROM_HOST = {"aten.lift_fresh", "aten.lift_fresh_copy", "aten.lift"}
# Tensor methods that read a tensor on the host (on a CPU some dispatch nothing of their own)
HOST_READS = ("cpu", "numpy", "tolist", "item", "__bool__")

SPEC = StatsSpec(offsets=(-1, 0, 1), n_key_classes=4, entropy=True, argmax=True, class_mass=True)
PADDED_STATS = ("entropy", "offset_mass", "class_mass", "argmax")  # the row statistics of SPEC with a padding value


def _where() -> str:
    """module:function of the innermost frame of bertscope's own code (not torch's, not this test's)
    that led here."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("bertscope."):
            return f"{module}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _devices(tree) -> set:
    return {t.device for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)}


class OpLog(TorchDispatchMode):
    """Every aten op dispatched inside it: (op, where from, why it syncs or None)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, str, str | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = str(func.overloadpacket)
        why = None
        if packet in SYNCING or (packet in {"aten.index", "aten.index_put", "aten.index_put_"} and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))) or (
                str(func) == "aten.repeat_interleave.Tensor" and kwargs.get("output_size") is None):
            why = "reads the device on the host"
        elif packet in FROM_HOST:
            why = "a tensor from host data (host-to-device copy)"
        elif len(_devices((args, kwargs)) | _devices(out)) > 1:
            why = "a copy between devices"
        self.ops.append((str(func), _where(), why))
        return out

    @staticmethod
    def is_view(name: str) -> bool:
        """Whether the op (its str) returns a view of its input (aliasing schema: `Tensor(a)`)."""
        packet, _, overload = name.removeprefix("aten.").partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        return bool(op._schema.returns) and op._schema.returns[0].alias_info is not None

    def host_read(self, name):
        self.ops.append((f"Tensor.{name}", _where(), "reads the tensor on the host"))

    def side(self, launcher: bool) -> list[tuple[str, str, str | None]]:
        return [op for op in self.ops if op[1].startswith(LAUNCHER_MODULES) == launcher]

    @staticmethod
    def syncing(ops) -> list:
        return [op for op in ops if op[2] is not None]

    @staticmethod
    def describe(ops) -> str:
        return "\n".join(f"  {name:<32} {where}" + (f"  SYNC: {why}" if why else "") for name, where, why in ops)


@pytest.fixture
def watch(monkeypatch):
    """watch() -> a context manager: an OpLog over its block, the host-reading Tensor methods
    (`HOST_READS`, wrapped for the test's duration) recorded in it too."""
    current: list[OpLog | None] = [None]
    for name in HOST_READS:
        method = getattr(torch.Tensor, name)

        def wrapper(self, *args, _name=name, _method=method, **kwargs):
            if current[0] is not None:
                current[0].host_read(_name)
            return _method(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, wrapper)

    @contextmanager
    def block():
        log = OpLog()
        with log:
            current[0] = log
            try:
                yield log
            finally:
                current[0] = None
    return block


@pytest.fixture
def stub_launch(monkeypatch):
    """The fused kernel's launch is a no-op (its outputs stay as the launcher allocated them): the
    launcher's own work, its operands and allocations, still runs. Returns the launches seen."""
    module, name = LAUNCHED
    real = getattr(module, name)
    launches = []

    class Stub:
        def __getattr__(self, attr):  # arg_names, fn, ...: what the launcher reads off the kernel
            return getattr(real, attr)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append(grid)
            return launch

    monkeypatch.setattr(module, name, Stub())
    return launches


# --- one layer call of the attention function, called directly --------------------------------


LAYOUTS = {"plain": (False, AttentionLayout(), 4), "causal, grouped-query": (True, AttentionLayout(causal=True), 2)}


def layer_inputs(layout: str, padded: bool, B=2, H=4, L=12, D=8, dtype=torch.float32):
    """(module, q, k, v, mask, key_class): one layer call as transformers makes it under the mask
    function (`key_padding_mask`): a (B, L) padding mask for the plain layout, a KeyBand for a decoder's."""
    causal, band, kv_heads = LAYOUTS[layout]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, D, generator=g).to(dtype)
    k, v = (torch.randn(B, kv_heads, L, D, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(B, L, dtype=torch.long)
    if padded:
        mask[1, L - 3:] = 0
    if causal:
        mask = KeyBand(mask.bool(), band)
    return SimpleNamespace(is_causal=causal), q, k, v, mask, torch.randint(0, 4, (B, L), generator=g)


def layer_calls(watch, layout: str, padded: bool, known: bool, n_layers=3, dtype=torch.float32) -> list[OpLog]:
    """Two forward passes of `n_layers` layer calls (the first a warm-up), one OpLog per call of the second."""
    module, q, k, v, mask, key_class = layer_inputs(layout, padded, dtype=dtype)
    probe = HeadProbe(n_layers, q.shape[1], SPEC, backend="triton")
    seen = []
    with torch.inference_mode():
        for rep in range(2):
            with probe.active(key_class, lambda layer, stats, key_valid: seen.append(stats),
                              padded=padded if known else None):
                for _ in range(n_layers):
                    with watch() as log:
                        bertscope_attention(module, q, k, v, mask, scaling=None)
                    if rep:
                        seen.append(log)
    return [x for x in seen if isinstance(x, OpLog)]


@pytest.mark.parametrize("known", [True, False], ids=["padding known", "padding unknown"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_engine_side_of_a_layer_call_syncs_nothing(watch, stub_launch, layout, padded, known):
    logs = layer_calls(watch, layout, padded, known)
    assert stub_launch, "the stub was not launched: retarget LAUNCHED"
    for log in logs:
        engine = log.side(launcher=False)
        assert not OpLog.syncing(engine), "the engine side syncs:\n" + OpLog.describe(engine)
    engine = [name for name, _, _ in logs[-1].side(launcher=False)]
    # padded or not, known or not: the Triton kernel writes padding rows' statistics itself (rows_zeroed)
    assert engine == [], OpLog.describe(logs[-1].ops)


def test_a_mask_is_read_once_per_forward_pass(watch, stub_launch):
    """A prepared 4-D padding mask: whether its rows differ is read on the host (a sync) in the
    first layer call of a forward pass, never again in it."""
    module, q, k, v, mask, key_class = layer_inputs("plain", padded=True)
    mask4 = torch.where(mask.bool(), 0.0, torch.finfo(q.dtype).min)[:, None, None, :].expand(-1, 1, q.shape[2], -1)
    probe = HeadProbe(3, q.shape[1], SPEC, backend="triton")
    logs = []
    with torch.inference_mode(), probe.active(key_class, lambda *a: None, padded=True):
        for _ in range(3):
            with watch() as log:
                bertscope_attention(module, q, k, v, mask4)
            logs.append(OpLog.syncing(log.side(launcher=False)))
    assert logs[0] and not logs[1] and not logs[2], logs


def test_padding_rows_known_or_not_fill_the_same():
    """`zero_padding_rows` with the host's word for it, without it, and the old `torch.where`: the same
    numbers, bit for bit; the hint is taken only for the very tensor it was made for."""
    B, H, L, O, C = 2, 3, 10, 3, 4
    valid = torch.ones(B, L, dtype=torch.bool)
    valid[0, 7:] = False
    g = torch.Generator().manual_seed(1)
    stats = SimpleNamespace(entropy=torch.rand(B, H, L, generator=g) + 1,
                            offset_mass=torch.rand(B, H, L, O, generator=g),
                            class_mass=torch.rand(B, H, L, C, generator=g) + 1,
                            argmax=torch.randint(1, L, (B, H, L), generator=g))
    raw = {name: getattr(stats, name).clone() for name in PADDED_STATS}

    def fresh():
        return SimpleNamespace(**{name: t.clone() for name, t in raw.items()})
    unknown = zero_padding_rows(fresh(), valid)
    with known_padding(PaddingRows.of(valid, padded=True)):
        known = zero_padding_rows(fresh(), valid)
    with known_padding(PaddingRows.of(valid.clone(), padded=False)):  # another tensor: the hint is not taken
        other = zero_padding_rows(fresh(), valid)
    for name, t in raw.items():
        keep = valid[:, None, :].view(*valid.shape[:1], 1, valid.shape[1], *(1,) * (t.dim() - 3))
        old = torch.where(keep, t, torch.full_like(t, 0))  # what it did before
        for got in (unknown, known, other):
            assert torch.equal(getattr(got, name), old), name
    assert not torch.equal(unknown.entropy, raw["entropy"])  # padding rows were filled
    with known_padding(PaddingRows.of(valid, padded=False)):  # the host says no padding: left as computed
        assert torch.equal(zero_padding_rows(fresh(), valid).entropy, raw["entropy"])


# --- a layer call of a real model, through the engine ----------------------------------------------


def engine_layer_calls(watch, tiny_model, padded: bool, dtype=torch.float32) -> tuple[list[OpLog], list]:
    """Two forward passes of conftest's tiny BERT over one batch through the engine (`collate_batch`,
    `forward`; the second after the warm-up), every layer call watched: (OpLogs of the second, statistics)."""
    model, tokenizer = tiny_model("bert")
    loaded = wrap_model(model.to(dtype), tokenizer)
    segments = random_segments(tokenizer, n=8)
    by_length = sorted(range(len(segments)), key=lambda i: segments[i].n_tokens)
    indices = [by_length[0], by_length[-1]] if padded else [0]  # one segment: no padding
    spec = StatsSpec(offsets=SPEC.offsets, n_key_classes=loaded.classes.n_classes, entropy=True, argmax=True)
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend="triton")
    logs = []

    def watched(*args, **kwargs):
        with watch() as log:
            result = bertscope_attention(*args, **kwargs)
        logs.append(log)
        return result
    AttentionInterface.register(attention.ATTN_IMPLEMENTATION, watched)
    try:
        with torch.inference_mode():
            for _ in range(2):
                batch = forward(loaded, probe, collate_batch(loaded, segments, indices, spec))
    finally:
        AttentionInterface.register(attention.ATTN_IMPLEMENTATION, bertscope_attention)
    assert batch.padded is padded and len(logs) == 2 * TINY_LAYERS and loaded.n_heads == TINY_HEADS
    return logs[TINY_LAYERS:], batch.layers


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_the_engine_side_of_a_model_forward_syncs_nothing(watch, stub_launch, tiny_model, padded):
    logs, layers = engine_layer_calls(watch, tiny_model, padded)
    for log in logs:
        engine = log.side(launcher=False)
        assert not OpLog.syncing(engine), "the engine side syncs:\n" + OpLog.describe(engine)
    engine = [name for name, _, _ in logs[-1].side(launcher=False)]
    assert engine == [], OpLog.describe(logs[-1].ops)  # the kernel writes padding rows itself (rows_zeroed)
    assert all(stats.entropy.dtype == torch.float32 for stats in layers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_a_layer_call_fits_the_budget(watch, stub_launch, tiny_model, padded, dtype):
    """The issue's budget: after a warm-up, one layer call dispatches at most OPS_PER_LAYER aten ops
    and none that syncs, launcher included; statistics in float32 whatever the model's dtype (the
    kernel writes them so, not a cast after it); padding rows set without an op per statistic."""
    logs, layers = engine_layer_calls(watch, tiny_model, padded, dtype)
    ops = logs[-1].ops
    report = f"{len(ops)} ops in one layer call (budget {OPS_PER_LAYER} but views):\n" + OpLog.describe(ops)
    assert not OpLog.syncing(ops), report
    # a view (a statistic's columns of the launcher's one buffer) is metadata: no allocation, no device work
    work = [op for op in ops if not OpLog.is_view(op[0])]
    assert len(work) <= OPS_PER_LAYER, report
    assert all(stats.entropy.dtype == torch.float32 for stats in layers)


# --- the accumulator -------------------------------------------------------------------------------------


def test_head_stats_add_reads_nothing_off_the_device(watch, tiny_model, monkeypatch):
    """`HeadStats.add` as it runs on a GPU (the CPU taken for a device) syncs nothing: its sums
    reach the host arrays only when they are read."""
    monkeypatch.setattr(HeadStats, "HOST_DEVICES", ())
    model, tokenizer = tiny_model("bert")
    loaded = wrap_model(model, tokenizer)
    segments = random_segments(tokenizer, n=6)
    spec = StatsSpec(offsets=SPEC.offsets, n_key_classes=loaded.classes.n_classes, entropy=True, argmax=True)
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend="chunked")
    with torch.inference_mode():
        batches = [forward(loaded, probe, collate_batch(loaded, segments, idx, spec))
                   for idx in ([0, 1], [2, 3], [4, 5])]
        HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes).add(batches.pop(0))  # a warm-up
    for average in ("tokens", "segments"):
        stats = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes, average)
        for batch in batches:
            with torch.inference_mode(), watch() as log:
                stats.add(batch)
            assert not OpLog.syncing(log.ops), OpLog.describe(OpLog.syncing(log.ops))
        assert stats.n_rows[0, 0] > 0 and np.isfinite(stats.entropy_sum).all()


def test_head_stats_sums_on_a_device_reach_the_host_when_read(monkeypatch, tiny_model):
    """The GPU path of `HeadStats` on the CPU (the CPU taken for a device): sums stay in device
    tensors until an array is read, then equal, bit for bit, the sums added on the host directly."""
    model, tokenizer = tiny_model("bert")
    loaded = wrap_model(model, tokenizer)
    segments = random_segments(tokenizer, n=9)
    spec = StatsSpec(offsets=SPEC.offsets, n_key_classes=loaded.classes.n_classes, entropy=True, argmax=True)
    probe = HeadProbe(loaded.n_layers, loaded.n_heads, spec, backend="chunked")
    with torch.inference_mode():
        batches = [forward(loaded, probe, collate_batch(loaded, segments, idx, spec))
                   for idx in ([0, 1, 2], [3, 4], [5, 6, 7, 8])]
    host = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    for batch in batches:
        host.add(batch)
    monkeypatch.setattr(HeadStats, "HOST_DEVICES", ())  # the CPU taken for a device
    device = HeadStats(loaded.n_layers, loaded.n_heads, spec, loaded.classes)
    for batch in batches:
        device.add(batch)
    assert set(device._device) >= {"n_rows", "entropy_sum"} and not device._host["entropy_sum"].any()
    assert np.array_equal(device.entropy_sum, host.entropy_sum) and not device._device  # read: on the host now
    for name in host.arrays:
        assert np.array_equal(getattr(device, name), getattr(host, name)), name
    device.add(batches[0])  # after a read (a checkpoint): added to what the host holds
    host.add(batches[0])
    for name in host.arrays:
        np.testing.assert_allclose(getattr(device, name), getattr(host, name), rtol=1e-15, err_msg=name)
