"""Every statistic of the table (`spec.ROW_STATS`) from the Triton backend against the eager
oracle, under every layout and each of its kernel paths, run by Triton's interpreter on the CPU.

Generated from the table: a statistic added to `ROW_STATS` (and to eager) is checked here
without a line of this file changing, and fails here, with an error naming it, until the
Triton kernel computes it. The layouts are the plain one (the encoders': single-tile and online
paths), causal, causal with a window, bidirectional windowed, grouped-query (bidirectional and
causal windowed); each with left and right padding, a one-token sequence and, under causal left
padding, rows that see one key; the layout paths with the shipped blocks and with 16 x 16 blocks
(several key blocks and band edges at short L).

TRITON_INTERPRET=1 must be set before triton is imported (see test_triton_attention.py).
"""
import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernel_maps import random_units
from test_layout import layouts, padded
from tiers import full_unless, rotated
from triton_interpreter import one_block_cfg

import bertscope.kernels.spec as spec_module
import bertscope.kernels.triton_attention as ta
import bertscope.kernels.triton_launch as launch
from bertscope.kernels import triton_aot
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import PLAIN, ROW_STATS, AttentionLayout, KernelTraits, RowStat, StatsSpec, asked_stats

if not ta.INTERPRETED:
    pytest.fail("bertscope.kernels.triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)

OFFSETS = (-2, -1, 0, 1, 3)
C = 3
SMALL = dict(BLOCK_M=16, BLOCK_N=16)  # tl.dot's smallest tiles: several key blocks at short L
LAYOUTS = {
    "plain": PLAIN,
    "causal": AttentionLayout(causal=True),
    "causal-window": AttentionLayout(causal=True, window=(5, 0)),
    "window": AttentionLayout(window=(4, 6)),
    "gqa": AttentionLayout(n_key_value_heads=2),
    "causal-window-gqa": AttentionLayout(causal=True, window=(7, 0), n_key_value_heads=1),
}
# each layout's kernel tiles: the default (under the interpreter 16 x 16: several key blocks, both
# stages of the loop), one key block per row (`one_block_cfg(True)`)
PATHS = {name: ("default", "one-block") for name in LAYOUTS}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


# the entries the table says the triton backend computes (`RowStat.backends`: not the norm-based twins of the
# distance, position and token statistics); the others are refused in one line (tests/kernels/test_stats_table.py)
TRITON_STATS = tuple(s for s in ROW_STATS if s.computed_by("triton"))


def spec_asking(stats) -> StatsSpec:
    """The spec that switches on exactly the given entries of the table (offsets gets OFFSETS; a norm-based
    twin its base too, and `norms` names the twins asked: True for the weighted norm alone)."""
    twins = [s.twin_of for s in stats if s.twin_of is not None]
    on = {s.switch: OFFSETS if s.switch == "offsets" else True  # streaming=True: STREAMING_ON
          for s in [*stats, *twins] if s.switch != "norms"}
    if any(s.switch == "norms" for s in stats):
        on["norms"] = tuple(t.name for t in twins) or True
    return StatsSpec(n_key_classes=C, **on)


def norms_of(inputs) -> torch.Tensor:
    """(B, H, L) per-key value norms for the norm-based twins: positive, a few exactly 0."""
    q = inputs[0]
    g = torch.Generator().manual_seed(q.shape[2])
    n = torch.rand(q.shape[:3], generator=g) * 3 + 0.05
    return n * (torch.rand(q.shape[:3], generator=g) > 0.15)


def make_inputs(layout, H, L, pads, left, seed, D=8):
    """q, k, v, key_valid, key_class and a word pooling; pads[b] padding positions (capped at L - 1:
    at least one real token)."""
    g = torch.Generator().manual_seed(seed)
    H_kv = layout.n_key_value_heads or H
    q, k, v = (torch.randn(len(pads), h, L, D, generator=g) * 2 for h in (H, H_kv, H_kv))
    key_valid = padded(len(pads), L, [min(p, L - 1) for p in pads], left)
    key_class = torch.randint(0, C, (len(pads), L), generator=g)
    lengths = key_valid.sum(-1).tolist()
    unit, candidate = random_units(len(pads), L, lengths, g)
    if left:  # units follow the real tokens, which start after the padding
        for b, n in enumerate(lengths):
            unit[b] = torch.cat([unit[b, n:], unit[b, :n]]) if n < L else unit[b]
    return (q, k, v, key_valid, key_class), word_pooling(unit, candidate, "mean")


def run_triton(inputs, spec, layout, path, pooling):
    """The Triton backend on one of the layout's tiles (`PATHS`)."""
    # token ids: the key classes, a vocabulary of C tokens, so that the token relations have many matches
    return ta.attention_stats_triton(*inputs, spec, layout=layout, pooling=pooling, token_ids=inputs[4],
                                     blocks=one_block_cfg(path == "one-block"), norms=norms_of(inputs))


def assert_table_matches(ref, got, spec, key_valid):
    """Every statistic `spec` asks for: present, eager's shape and dtype, eager's values (floats to
    1e-5; indices exactly), and the output on real rows."""
    (out_r, sr), (out_g, sg) = ref, got
    rows = key_valid[:, :, None, None]  # (B, L, 1, 1): padding rows' outputs are not compared
    torch.testing.assert_close(out_g * rows, out_r * rows, atol=1e-5, rtol=1e-5)
    asked = asked_stats(spec)
    assert asked
    for stat in asked:
        a, b = getattr(sg, stat.name), getattr(sr, stat.name)
        assert a is not None, f"triton did not compute {stat.name}"
        assert a.shape == b.shape and a.dtype == b.dtype, (stat.name, a.shape, b.shape, a.dtype, b.dtype)
        if stat.dtype == "int64":
            assert torch.equal(a, b), stat.name
        else:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=stat.name)
    assert sg.layout == sr.layout


CASES = [(name, path, left) for name in LAYOUTS for path in PATHS[name] for left in (True, False)]
# the tiers (tests/tiers.py): each layout on one of its tiles and paddings in the quick tier, in turn
QUICK = rotated(list(LAYOUTS), [(path, left) for path in ("default", "one-block") for left in (True, False)])


@pytest.mark.parametrize("name,path,left", [full_unless(QUICK[n] == (p, lf), n, p, lf,
                                                         id=f"{n}-{p}-{'left' if lf else 'right'}")
                                             for n, p, lf in CASES])
def test_every_statistic_of_the_table_under_every_layout_and_path(name, path, left):
    """All entries at once, L = 37 (three 16-key blocks, two 32-key ones), pads 0 / 6 / 36 (a
    one-token sequence)."""
    layout = LAYOUTS[name]
    spec = spec_asking(TRITON_STATS)
    inputs, pooling = make_inputs(layout, 4, 37, [0, 6, 36], left, seed=len(name) + left)
    ref = attention_stats_eager(*inputs, spec, layout=layout, pooling=pooling, token_ids=inputs[4],
                                norms=norms_of(inputs))
    assert_table_matches(ref, run_triton(inputs, spec, layout, path, pooling), spec, inputs[3])


ALONE = [(stat, name, path) for stat in TRITON_STATS for name, path in (("plain", "online"),
                                                                     ("causal-window-gqa", "small"))]


@pytest.mark.parametrize("stat,name,path", ALONE, ids=[f"{s.name}-{n}" for s, n, _ in ALONE])
def test_each_statistic_alone(stat, name, path):
    """Each entry asked alone (its switch only), on the plain layout and a causal windowed
    grouped-query one with left padding: a statistic that is only right beside another fails."""
    layout = LAYOUTS[name]
    spec = spec_asking([stat])
    inputs, pooling = make_inputs(layout, 2, 21, [0, 5], True, seed=3)
    ref = attention_stats_eager(*inputs, spec, layout=layout, pooling=pooling, token_ids=inputs[4],
                                norms=norms_of(inputs))
    got = run_triton(inputs, spec, layout, path, pooling)
    assert_table_matches(ref, got, spec, inputs[3])
    for other in ROW_STATS:  # nothing asked for comes back
        if not other.asked(spec):
            assert getattr(got[1], other.name) is None, other.name


def test_single_key_rows_of_every_statistic():
    """Under causal left padding the first real token sees itself only: every row statistic of
    the table is eager's there (entropy 0, all mass on offset 0, argmax itself)."""
    layout = LAYOUTS["causal-window-gqa"]
    spec = spec_asking(TRITON_STATS)
    inputs, pooling = make_inputs(layout, 2, 20, [0, 13], True, seed=1)
    ref = attention_stats_eager(*inputs, spec, layout=layout, pooling=pooling, token_ids=inputs[4],
                                norms=norms_of(inputs))
    got = run_triton(inputs, spec, layout, "small", pooling)
    assert_table_matches(ref, got, spec, inputs[3])
    assert got[1].entropy[1, :, 13].abs().max() < 1e-6 and torch.all(got[1].argmax[1, :, 13] == 13)


@settings(max_examples=6, deadline=None)
@given(layout=layouts(), L=st.integers(1, 40), pads=st.lists(st.integers(0, 5), min_size=1, max_size=2),
       left=st.booleans(), small=st.booleans(), seed=st.integers(0, 10**6))
def test_every_statistic_on_random_layouts(layout, L, pads, left, small, seed):
    spec = spec_asking(TRITON_STATS)
    H = 2 * (layout.n_key_value_heads or 1)
    inputs, pooling = make_inputs(layout, H, L, pads, left, seed, D=4)
    path = ("single" if small else "online") if layout.is_plain else ("small" if small else "shipped")
    ref = attention_stats_eager(*inputs, spec, layout=layout, pooling=pooling, token_ids=inputs[4],
                                norms=norms_of(inputs))
    assert_table_matches(ref, run_triton(inputs, spec, layout, path, pooling), spec, inputs[3])


# --- a statistic added to the table: the kernel says what it lacks, before any launch ---------------


def new_statistic(monkeypatch):
    """A statistic added to the table (and to StatsSpec) but to no Triton kernel: (its spec class, entry)."""

    @dataclasses.dataclass(frozen=True)
    class NewSpec(StatsSpec):
        attention_rollout: bool = False

    new = RowStat("attention_rollout", ("B", "H", "L"), "attention_rollout")
    monkeypatch.setattr(spec_module, "ROW_STATS", ROW_STATS + (new,))
    return NewSpec, new


@pytest.mark.parametrize("name", ["plain", "causal-window-gqa"])
def test_a_statistic_the_kernel_lacks_is_an_error_before_the_launch(name, monkeypatch):
    """Compiled or interpreted: `check_computed` names it before `attn_stats_fwd` is launched
    (a launch here would fail the test with an AssertionError instead)."""
    NewSpec, _ = new_statistic(monkeypatch)
    layout = LAYOUTS[name]
    inputs, pooling = make_inputs(layout, 2, 9, [0], True, seed=0)

    class NoLaunch:
        arg_names, fn = launch.attn_stats_fwd.arg_names, launch.attn_stats_fwd.fn

        def __getitem__(self, grid):
            raise AssertionError("the kernel was launched")

    monkeypatch.setattr(launch, "attn_stats_fwd", NoLaunch())
    with pytest.raises(NotImplementedError, match="triton backend does not compute attention_rollout"):
        ta.attention_stats_triton(*inputs, NewSpec(n_key_classes=C, entropy=True, attention_rollout=True),
                                  layout=layout)


# the indices of the stand-in kernel below, in its module as triton_kernel's are in its own: outputs into its
# `Stats` tuple, switches into its `STATS` tuple
Entropy, AttentionRollout, ENTROPY, ATTENTION_ROLLOUT = (tl.constexpr(i) for i in (0, 1, 0, 1))


def test_an_output_the_kernel_declares_but_never_writes_is_an_error(monkeypatch):
    """An output index named after a statistic of the table that the kernel's body never reads
    (a forgotten store): `kernel_outputs` refuses the kernel, before any launch."""

    @triton.jit
    def kernel(Lse, Stats, STATS: tl.constexpr):
        if STATS[ENTROPY]:
            tl.store(Stats[Entropy], 0.0)
        tl.store(Lse, 0.0)

    _, new = new_statistic(monkeypatch)
    new = dataclasses.replace(new, kernel=KernelTraits("per_score", "ATTENTION_ROLLOUT"))  # its entry: in the kernel
    monkeypatch.setattr(launch, "ROW_STATS", (spec_module.STAT["entropy"], new))  # this kernel's two statistics
    monkeypatch.setattr(launch, "attn_stats_fwd", kernel)
    with pytest.raises(NotImplementedError, match=r"takes attention_rollout \(AttentionRollout\) but never writes it"):
        launch.kernel_outputs.__wrapped__()


def test_the_kernel_writes_every_output_it_declares():
    outputs = ta.kernel_outputs.__wrapped__()
    computed = {stat.name for stat, _, _ in outputs} | set(ta.EXTRA_STATS)
    assert not {s.name for s in TRITON_STATS} - computed, "the triton backend does not compute every entry it should"
    assert computed <= {s.name for s in ROW_STATS}
    assert all(flag == stat.name.upper() for stat, _, flag in outputs if flag)


def test_the_aot_signature_switches_on_only_what_a_specialisation_asks(monkeypatch):
    """A new statistic's switch is compiled off unless a specialisation names it (`extra`); off, its
    pointer is the fp32 lse placeholder the launcher passes."""
    _, new = new_statistic(monkeypatch)
    outputs = launch.kernel_outputs() + ((new, "AttentionRollout", "ATTENTION_ROLLOUT"),)
    monkeypatch.setattr(launch, "kernel_outputs", lambda: outputs)
    plain = triton_aot.Specialisation(64, "bf16", ("entropy",))
    sig, flags = triton_aot._forward_signature(plain, "bf16")
    assert flags.pop("ENTROPY") and not any(flags.values())  # argmax, attention_rollout and any other: off
    assert (sig["Entropy"], sig["Argmax"], sig["AttentionRollout"]) == ("*fp32", "*fp32", "*fp32")
    sig, flags = triton_aot._forward_signature(dataclasses.replace(plain, stats=("entropy", "attention_rollout")),
                                               "bf16")
    assert flags["ATTENTION_ROLLOUT"] and sig["AttentionRollout"] == "*fp32"  # statistics are written in fp32
    band = triton_aot.LayoutSpec(64, "fp32", ("entropy", "argmax", "attention_rollout"))
    flags = triton_aot._forward_signature(band, "fp32")[1]
    assert {flag for flag, on in flags.items() if on} == {"ENTROPY", "ARGMAX", "ATTENTION_ROLLOUT"}
    assert band.name().endswith("entropy+argmax+attention_rollout")


def test_an_output_of_a_dimension_the_launcher_does_not_size_is_an_error(monkeypatch):
    """A statistic with a new symbolic dimension (distance buckets, say) needs its size in `_launch`:
    a NotImplementedError naming both, not a KeyError."""
    _, new = new_statistic(monkeypatch)
    new = dataclasses.replace(new, shape=("B", "H", "L", "NB"))
    outputs = launch.kernel_outputs() + ((new, "AttentionRollout", "ATTENTION_ROLLOUT"),)
    monkeypatch.setattr(launch, "kernel_outputs", lambda: outputs)

    # every switch of StatsSpec off (its defaults, whatever the table holds by then), the new one on
    Asks = dataclasses.make_dataclass("Asks", [("attention_rollout", bool, dataclasses.field(default=True))],
                                      bases=(StatsSpec,), frozen=True)

    with pytest.raises(NotImplementedError, match="attention_rollout has dimension NB"):
        launch.allocate_outputs(Asks(), {"B": 1, "H": 1, "L": 4, "O": 0, "C": 1}, "cpu")


def test_plain_left_padding_over_whole_key_blocks_is_finite():
    """A left-padded plain row whose first 32-key blocks are all padding: the entropy's running
    shift from m = FMIN to a real score would be -inf * 0 (main before issue 35 gave NaN here).
    Under the interpreter's 16-key blocks the first two are padding and take the masked stage."""
    inputs, pooling = make_inputs(PLAIN, 1, 70, [40], True, seed=0)
    spec = spec_asking(TRITON_STATS)
    got = run_triton(inputs, spec, PLAIN, "default", pooling)
    assert torch.isfinite(got[1].entropy).all()
    ref = attention_stats_eager(*inputs, spec, pooling=pooling, token_ids=inputs[4], norms=norms_of(inputs))
    assert_table_matches(ref, got, spec,
                         inputs[3])
