"""The fused kernel's signature as data (issue 48): `attn_stats_fwd` takes its statistics' switches as one
constexpr tuple (`STATS`) and their outputs as one tuple of pointers (`Stats`), both in the table's order and
read through indices taken from the table; its other tuples are packed and unpacked in `ARGUMENT_TUPLES`' order;
the kernel and its helpers stay short, and each helper has one call site."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
from triton_interpreter import spy_launches

from bertscope.kernels import triton_kernel, triton_launch
from bertscope.kernels.spec import ROW_STATS, StatsSpec

# the targets: the kernel at most 25 parameters, an inner helper at most 15
MAX_KERNEL_PARAMS = 25
MAX_HELPER_PARAMS = 15


def jit_functions() -> dict:
    """The module's @triton.jit functions by name, compiled (JITFunction) or interpreted (TRITON_INTERPRET=1:
    an interpreter object): both hold the Python function as `.fn`."""
    return {name: obj for name, obj in vars(triton_kernel).items()
            if hasattr(obj, "fn") and inspect.isfunction(obj.fn) and obj.fn.__module__ == triton_kernel.__name__}


def params(obj) -> list[str]:
    names = list(inspect.signature(obj.fn).parameters)
    assert names == list(obj.arg_names)  # what the launcher and triton_aot read
    return names


def kernel_source() -> ast.Module:
    return ast.parse(textwrap.dedent(inspect.getsource(triton_kernel)))


def test_the_kernel_and_its_helpers_are_short():
    fns = jit_functions()
    assert {"attn_stats_fwd", "_key_block", "_stage", "_position_sums"} <= set(fns)
    assert len(params(fns.pop("attn_stats_fwd"))) <= MAX_KERNEL_PARAMS
    long = {name: len(params(f)) for name, f in fns.items() if len(params(f)) > MAX_HELPER_PARAMS}
    assert not long, f"helpers over {MAX_HELPER_PARAMS} parameters: {long}"


def test_each_helper_has_one_call_site():
    """`_key_block` is called from `_stage` alone, `_stage` once (a static loop over the two stages): no
    argument list is written out twice."""
    calls = [n.func.id for n in ast.walk(kernel_source()) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    for helper in ("_key_block", "_stage", "_position_sums"):
        assert calls.count(helper) == 1, helper


def test_the_switches_and_outputs_are_in_the_tables_order():
    """STATS holds one switch per distinct `KernelTraits.switch`, Stats one pointer per entry with kernel traits,
    both in the table's order, and the kernel's module reads each through the index the table gives it."""
    written = [s for s in ROW_STATS if s.kernel is not None]
    switches = tuple(dict.fromkeys(s.kernel.switch for s in written if s.kernel.switch is not None))
    assert [s for s, _, _ in triton_launch.kernel_outputs()] == written
    assert triton_launch.kernel_switches_order() == switches and len(switches) >= 8
    for i, flag in enumerate(switches):
        assert getattr(triton_kernel, flag) == i
    for i, stat in enumerate(written):
        assert getattr(triton_kernel, triton_launch.output_argument(stat)) == i
    # no statistic is an argument of its own any more
    names = set(params(triton_kernel.attn_stats_fwd))
    assert {"STATS", "Stats"} <= names and not names & (set(switches) | {"Entropy", "Argmax"})
    paths = triton_launch.argument_paths()
    stats, on = names_index("Stats"), names_index("STATS")
    assert [paths[triton_launch.output_argument(s)] for s in written] == [(stats, i) for i in range(len(written))]
    assert [paths[w] for w in switches] == [(on, i) for i in range(len(switches))]


def names_index(name: str) -> int:
    return list(triton_kernel.attn_stats_fwd.arg_names).index(name)


def test_the_kernel_unpacks_its_tuples_in_their_order():
    """`ARGUMENT_TUPLES` is the order the launcher packs (`kernel_arguments`) and triton_aot addresses by
    path: the kernel unpacks each runtime tuple argument in it (`a, b = band`) and reads the constexpr TILE by
    index in it (`BLOCK_N: tl.constexpr = TILE[1]`), in the kernel and in every helper that takes TILE."""
    kernel_args = set(params(triton_kernel.attn_stats_fwd))
    assert set(triton_kernel.ARGUMENT_TUPLES) <= kernel_args
    fns = jit_functions()
    unpacked, tile_reads = {}, []
    for name, obj in fns.items():
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj.fn)))
        for node in ast.walk(tree):
            if (name == "attn_stats_fwd" and isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                    and node.value.id in triton_kernel.ARGUMENT_TUPLES and isinstance(node.targets[0], ast.Tuple)):
                unpacked[node.value.id] = tuple(e.id for e in node.targets[0].elts)
            if (isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Subscript)
                    and isinstance(node.value.value, ast.Name) and node.value.value.id == "TILE"):
                tile_reads.append((node.target.id, node.value.slice.value))
    tile = triton_kernel.ARGUMENT_TUPLES["TILE"]
    assert unpacked == {k: v for k, v in triton_kernel.ARGUMENT_TUPLES.items() if k != "TILE"}
    assert tile_reads and all(tile[i] == target for target, i in tile_reads)
    assert {target for target, _ in tile_reads} == set(tile)


def test_kernel_arguments_pack_by_path():
    paths = triton_launch.argument_paths()
    named = {name: name for name in paths}  # each value its own name
    args = triton_launch.kernel_arguments(named)
    assert list(args) == list(triton_kernel.attn_stats_fwd.arg_names)
    for name, path in paths.items():
        value = args[triton_kernel.attn_stats_fwd.arg_names[path[0]]]
        assert (value if len(path) == 1 else value[path[1]]) == name


def test_a_launch_passes_the_switches_and_outputs_by_index(monkeypatch):
    """An interpreted (or compiled) launch: STATS[ARGMAX] is on and STATS[ENTROPY] off for a spec asking the
    argmax alone, and Stats[Argmax] is the tensor the call returns as the argmax."""
    from bertscope.kernels.spec import PLAIN

    if not (triton_kernel.INTERPRETED or torch.cuda.is_available()):
        pytest.skip("needs TRITON_INTERPRET=1 or a GPU")
    launches = spy_launches(monkeypatch)
    dev = "cpu" if triton_kernel.INTERPRETED else "cuda"
    B, H, L, D = 1, 2, 9, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g).to(dev) for _ in range(3))
    valid = torch.ones(B, L, dtype=torch.bool, device=dev)
    classes = torch.zeros(B, L, dtype=torch.long, device=dev)
    spec = StatsSpec(n_key_classes=4, offsets=(), entropy=False, class_mass=False, argmax=True)
    _, stats, lse = triton_launch.fused_forward(q, k, v, valid, classes, spec, PLAIN)
    (kw,) = launches
    on = kw["STATS"]
    assert on[triton_kernel.ARGMAX] and not on[triton_kernel.ENTROPY] and sum(on) == 1
    assert kw["Stats"][triton_kernel.Argmax] is stats["argmax"] and kw["Lse"] is lse
    assert (stats["argmax"] >= 0).all()  # written by the kernel (the interpreter's buffers start at -2)
    assert kw["dims"] == (H, L, 0, 4, 1, L, L)
