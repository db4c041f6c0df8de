"""The kernels' table of statistics (`kernels/spec.py: ROW_STATS`) against every backend.

Each statistic of the table is asked for alone and must come back from eager, chunked
(both row passes) and triton (under Triton's interpreter) with the table's shape and dtype,
its padding rows set, and the oracle's values; a statistic added to the table that a
backend does not compute fails loudly in every backend, not only in Triton's. The
plumbing that loops over the table (segment sums, HeadStats, head-slot spreading, the
float32 cast) is checked against the table here too.
"""
import dataclasses
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (tests/conftest.py sets it too)

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import FULL, full_unless, rotated

import bertscope.kernels.spec as spec_module
from bertscope.engine.accumulate import HeadStats
from bertscope.engine.batch import BatchContext
from bertscope.kernels.backends import BACKENDS
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import (
    DISTANCE_EDGES,
    N_POSITION_BINS,
    ROW_STATS,
    AttentionLayout,
    RowStat,
    RowStats,
    StatsSpec,
    asked_stats,
)
from bertscope.kernels.triton_config import L_AND_T, L_ONLY
from bertscope.models import head_removal
from bertscope.text.token_classes import TokenClasses

B, H, L, D, C = 2, 3, 11, 8, 3
LENGTHS = [11, 6]
OFFSETS = (-1, 0, 2)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it again while a kernel runs


def triton(*args, **kw):
    import bertscope.kernels.triton_attention as ta

    if not ta.INTERPRETED:
        pytest.fail("triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)
    return ta.attention_stats_triton(*args, **kw)


def triton_sums_by_dot(*args, **kw):
    """The fused kernel with its softmax row sums on the tensor cores (`SUMS_BY_DOT`: sm_90, half
    precision, D <= 64), which the fp32 inputs here would not take by default (`triton_config`)."""
    return triton(*args, blocks={"SUMS_BY_DOT": L_AND_T}, **kw)


def triton_l_by_dot(*args, **kw):
    """The fused kernel with the row sum l on the tensor cores and the entropy's sum per score, relative to
    the running max (`SUMS_BY_DOT` = L_ONLY: sm_90 at D = 128, the default statistics), with the key rows past
    the sequence's end clamped (`CLAMP_KEYS`: that target's plain tile, `triton_kernel._key_rows`)."""
    return triton(*args, blocks={"SUMS_BY_DOT": L_ONLY, "CLAMP_KEYS": True}, **kw)


def triton_masked_first(*args, **kw):
    """The fused kernel with its masked key blocks (band edges, padding, the row end) visited before the
    main loop (`MASKED_FIRST`: the order `triton_config` takes where it fits wider tiles on a GPU)."""
    return triton(*args, blocks={"MASKED_FIRST": True}, **kw)


def triton_fixed_group(*args, **kw):
    """The fused kernel with the layout's group size G compiled in (`FIXED_G`: the decoders' tiles at
    D = 128 on a GPU take it) instead of read at run time."""
    return triton(*args, blocks={"FIXED_G": True}, **kw)


def chunked(row_pass):
    return lambda *a, **kw: attention_stats_chunked(*a, row_pass=row_pass, **kw)


# every path of every backend of `kernels.BACKENDS` but the oracle: the chunked one with each row pass, the
# fused kernel with each way of summing its rows (per score; on the tensor cores) and each order of its stages
PATHS = {"chunked-compiled": chunked("compiled"), "chunked-torch": chunked("torch"), "triton": triton,
         "triton-sums-by-dot": triton_sums_by_dot, "triton-masked-first": triton_masked_first,
         "triton-fixed-group": triton_fixed_group, "triton-l-by-dot": triton_l_by_dot}
RUNS = {"eager": attention_stats_eager, **PATHS}


def test_every_backend_is_checked():
    assert {name.split("-")[0] for name in RUNS} == set(BACKENDS)


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) * 1.5 for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, L)
    key_class = torch.randint(0, C, (B, L), generator=g)
    unit = torch.where(key_valid, torch.arange(L)[None, :] // 2, -1)  # words of two tokens
    pooling = word_pooling(unit, torch.ones(B, (L + 1) // 2, dtype=torch.bool))
    return (q, k, v, key_valid, key_class), pooling


def input_ids(seed=0):
    """(B, L) token ids of `inputs()`' batch, from 4 tokens: repeats, so the token relations have mass."""
    return torch.randint(0, 4, (B, L), generator=torch.Generator().manual_seed(seed + 1))


def only(stat: RowStat, spec_type=StatsSpec) -> StatsSpec:
    """A spec that asks for `stat` and nothing else (a norm-based twin: with its base, which it needs)."""
    switches = [stat.switch] + ([stat.twin_of.switch] if stat.twin_of is not None else [])
    return spec_type(n_key_classes=C, **{w: OFFSETS if w == "offsets" else True for w in switches})


def key_norms(q, seed: int = 0) -> torch.Tensor:
    """(B, H, L) per-key value norms for `spec.norms`: positive, a few exactly 0 (keys whose value
    vector is 0), so the norm-based twins differ from the weights and meet the zero case."""
    g = torch.Generator().manual_seed(seed)
    B, H, L, _ = q.shape
    n = torch.rand(B, H, L, generator=g) * 3 + 0.05
    return n * (torch.rand(B, H, L, generator=g) > 0.15)


def backend_of(path: str) -> str:
    return path.split("-")[0]


# --- every entry x every path x every case, against the oracle ---------------------------------------

# Lengths: long enough to cross the table's own edges, which a length of a dozen tokens never
# reaches (an off-by-one at distance 16 or 32, or at the decile boundaries of a row of 20 or 30
# keys, passed with rows of at most 12), and Triton's key/query tiles (32 rows, fp32).
MAX_L = 40


def _around(edges, max_l: int, lo: int = 1) -> list[int]:
    """e - 1, e and e + 1 for every edge e, within [lo, max_l], longest first."""
    return sorted({e + d for e in edges for d in (-1, 0, 1) if lo <= e + d <= max_l}, reverse=True)


# a sequence of n tokens has rows that reach distance n - 1 and see contexts of 1 .. n keys, so
# n = 2^k - 1, 2^k, 2^k + 1 puts its last row just below, at and past a distance bucket edge, and
# a multiple of the position bins (10, 20, 30, 40 keys) makes every decile boundary of its last row
# exact; derived from the table's constants, so a new edge is drawn without editing this file
EDGE_LENGTHS = _around(set(DISTANCE_EDGES) | set(range(N_POSITION_BINS, MAX_L + 1, N_POSITION_BINS)), MAX_L)
# window radii at the distance edges: the band's last key just inside or just past a bucket edge
EDGE_RADII = _around(DISTANCE_EDGES, MAX_L - 1, lo=0)


def test_edge_lengths_include_every_edge_of_the_table():
    assert {15, 16, 31, 32} <= set(EDGE_LENGTHS) and max(EDGE_LENGTHS) == MAX_L >= 40
    assert {e for e in DISTANCE_EDGES if e < MAX_L} <= set(EDGE_LENGTHS)
    assert {e - 1 for e in DISTANCE_EDGES if e < MAX_L} <= set(EDGE_RADII)


def length_strategy(lo: int = 1) -> st.SearchStrategy[int]:
    """A padded length L in [lo, MAX_L]: an edge length (above) or any. The edges come first, longest
    first: hypothesis's first, simplest example of every test is then the longest row."""
    return st.one_of(st.sampled_from([n for n in EDGE_LENGTHS if n >= lo]), st.integers(lo, MAX_L))


# the cases every statistic must hold on: (layout, padding) strategies. A layout's key heads are
# drawn with it; "single-key rows": a sequence of one token and rows whose window is themselves.
CASES = {
    "plain": dict(layout=st.just(AttentionLayout()), pad="none"),
    "causal": dict(layout=st.just(AttentionLayout(causal=True)), pad="none"),
    "causal+window": dict(layout=st.one_of(st.integers(0, 4), st.sampled_from(EDGE_RADII)).map(
        lambda w: AttentionLayout(causal=True, window=(w, 0))), pad="none"),
    "gqa": dict(layout=st.tuples(st.booleans(), st.sampled_from([1, 2])).map(
        lambda c: AttentionLayout(causal=c[0], n_key_value_heads=c[1])), pad="none"),
    "left-padding": dict(layout=st.sampled_from([AttentionLayout(causal=True), AttentionLayout(
        causal=True, window=(2, 0), n_key_value_heads=1), AttentionLayout()]), pad="left"),
    "right-padding": dict(layout=st.sampled_from([AttentionLayout(), AttentionLayout(window=(1, 2)), AttentionLayout(
        causal=True, n_key_value_heads=2)]), pad="right"),
    "single-key-rows": dict(layout=st.sampled_from([AttentionLayout(), AttentionLayout(causal=True, window=(0, 0)),
                                                    AttentionLayout(window=(0, 0), n_key_value_heads=1)]),
                            pad="single"),
}
# hypothesis examples per test: Triton's interpreter is slow
EXAMPLES = {"chunked-compiled": 6, "chunked-torch": 6, "triton": 2, "triton-sums-by-dot": 2, "triton-masked-first": 2,
            "triton-fixed-group": 2, "triton-l-by-dot": 2}
# query rows x heads of one call at most (None: no limit): the interpreter's time grows with them,
# so a long row is drawn with fewer sequences (and heads) in Triton, as many rows as 3 x 4 x 12
ROWS = {"chunked-compiled": 3 * 4 * 24, "chunked-torch": 3 * 4 * 24, "triton": 3 * 4 * 12,
        "triton-sums-by-dot": 3 * 4 * 12, "triton-masked-first": 3 * 4 * 12,
        "triton-fixed-group": 3 * 4 * 12, "triton-l-by-dot": 3 * 4 * 12}


def draw_case(data, case: str, heads: int = 4, dim: int = 8, rows: int | None = None, layout=None):
    """(layout, (q, k, v, key_valid, key_class), pooling, token_ids) of a drawn case: 1-3 sequences of 1-MAX_L
    tokens (`length_strategy`), 4 query heads, key heads as the layout says; with `rows`, fewer sequences,
    then 2 heads, when sequences x heads x L would be more. Token ids from a vocabulary of 1-6 tokens
    (repeats, and rows with no earlier copy of their token, in every sequence). `layout`: this one
    instead of one drawn from the case's."""
    layout = data.draw(CASES[case]["layout"], label="layout") if layout is None else layout
    pad = CASES[case]["pad"]
    L = data.draw(length_strategy(2 if pad == "single" else 1), label="L")
    if rows is not None and heads * L > rows:
        heads = 2  # the layouts' key heads (1 or 2) still divide it
    most = 3 if rows is None else max(1, min(3, rows // (heads * L)))
    n_seq = data.draw(st.integers(1, most), label="sequences")
    if pad == "none":
        lengths = [L] * n_seq
    elif pad == "single":
        lengths = [1] + data.draw(st.lists(st.integers(1, L), min_size=n_seq - 1, max_size=n_seq - 1))
    else:
        lengths = data.draw(st.lists(st.integers(1, L), min_size=n_seq, max_size=n_seq), label="lengths")
    pos = torch.arange(L)[None, :]
    n = torch.tensor(lengths)[:, None]
    key_valid = pos >= L - n if pad == "left" else pos < n  # (B, L)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    H_kv = layout.n_key_value_heads or heads
    q = torch.randn(n_seq, heads, L, dim, generator=g) * 1.5
    k, v = (torch.randn(n_seq, H_kv, L, dim, generator=g) * 1.5 for _ in range(2))
    key_class = torch.randint(0, C, (n_seq, L), generator=g)
    unit = torch.where(key_valid, (pos - (L - n if pad == "left" else 0)) // 2, -1)  # words of two tokens
    pooling = word_pooling(unit, torch.rand(n_seq, (L + 1) // 2, generator=g) < 0.8)
    token_ids = torch.randint(0, data.draw(st.integers(1, 6), label="vocabulary"), (n_seq, L), generator=g)
    return layout, (q, k, v, key_valid, key_class), pooling, token_ids


def check_entry(stat: RowStat, path: str, case: str, data, spec=None):
    """One entry of the table from one path on one drawn case: the table's shape and dtype, the
    oracle's values, padding rows set, nothing that was not asked for."""
    layout, args, pooling, ids = draw_case(data, case, rows=ROWS[path])
    norms = key_norms(args[0], data.draw(st.integers(0, 2**16), label="norms seed"))
    spec = only(stat) if spec is None else spec
    _, ref = attention_stats_eager(*args, spec, pooling=pooling, layout=layout, token_ids=ids, norms=norms)
    _, got = PATHS[path](*args, spec, pooling=pooling, layout=layout, token_ids=ids, norms=norms)
    check_result(stat, path, got, ref, args, pooling, spec, layout)


def check_result(stat: RowStat, path: str, got: RowStats, ref: RowStats, args, pooling, spec, layout):
    """`check_entry`'s checks of one statistic of a path's result against the oracle's."""
    t, want = getattr(got, stat.name), getattr(ref, stat.name)
    assert t is not None, f"{path} did not compute {stat.name}"
    (q, _, _, key_valid, _) = args
    dims = {"B": q.shape[0], "H": q.shape[1], "L": q.shape[2], "O": len(spec.offsets), "C": C,
            "W": pooling.n_units}
    assert tuple(t.shape) == tuple(dims.get(d, want.shape[i]) for i, d in enumerate(stat.shape)), stat.name
    assert (t.dtype == torch.int64) == (stat.dtype == "int64"), t.dtype
    if stat.dtype == "int64":
        assert torch.equal(t, want), (stat.name, layout)
    else:
        torch.testing.assert_close(t.float(), want.float(), atol=2e-5, rtol=1e-5, msg=f"{stat.name} {layout}")
    if stat.padding is not None:  # rows of padding queries hold the table's padding value
        pad_rows = ~key_valid[:, None, :].expand(-1, q.shape[1], -1)  # (B, H, L)
        assert bool((t[pad_rows] == stat.padding).all()), stat.name
    others = [s.name for s in spec_module.ROW_STATS if not s.asked(spec) and getattr(got, s.name) is not None]
    assert others == [], others
    assert got.layout == layout


def _entry_test(path: str, case: str):
    @settings(max_examples=EXAMPLES[path], deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def test(stat, data):
        check_entry(stat, path, case, data)

    return pytest.mark.parametrize("stat", table_params(path, case), ids=lambda s: s.name)(test)


def table_params(path: str, case: str) -> list:
    """Every entry of the table, those the table says the path's backend does not compute (`backends`:
    the norm-based twins in Triton) skipped, with the reason; in the quick tier on its one quick case of
    the path (`QUICK_CASE`), in the full tier on the others."""
    def marks(s):
        if not s.computed_by(backend_of(path)):
            return pytest.mark.skip(
                reason=f"the table says the {backend_of(path)} backend does not compute {s.name} (RowStat.backends)")
        return () if QUICK_CASE[path][s.name] == case else FULL
    return [pytest.param(s, marks=marks(s)) for s in ROW_STATS]


# the paths each entry is checked on alone, case by case: every backend's own (chunked with each row pass, the
# fused kernel as it launches). The fused kernel's other configurations (`VARIANTS`: its row sums on the tensor
# cores, its stages' order, G compiled in) change the kernel for every statistic at once, so each is checked with
# every statistic at once, case by case (`_variant_test`): the same entries and cases, a seventh of the
# interpreter's time
ENTRY_PATHS = ("chunked-compiled", "chunked-torch", "triton")
VARIANTS = tuple(p for p in PATHS if p not in ENTRY_PATHS)
# the tiers (tests/tiers.py): each entry on each entry path in one case in the quick tier, the cases in turn (each
# path starting one further), the other cases in the full tier; each variant in one case, the same way
QUICK_CASE = {path: rotated([s.name for s in ROW_STATS], list(CASES), offset=i) for i, path in enumerate(ENTRY_PATHS)}
QUICK_VARIANT_CASE = rotated(VARIANTS, list(CASES))

# generated: test_<path>_<case>[<entry>] for every entry of the table, every entry path and every case
for _path in ENTRY_PATHS:
    for _case in CASES:
        globals()[f"test_{_path}_{_case}".replace("-", "_").replace("+", "_")] = _entry_test(_path, _case)


def check_every_entry(path: str, layout, args, pooling, ids, norms_seed: int = 0):
    """Every entry of the table that `path`'s backend computes (the table's `backends`), in one call, against
    the oracle's: the edge-length tests and the smoke tests."""
    spec = all_on(backend_of(path))
    norms = key_norms(args[0], norms_seed)
    _, ref = attention_stats_eager(*args, spec, pooling=pooling, layout=layout, token_ids=ids, norms=norms)
    _, got = PATHS[path](*args, spec, pooling=pooling, layout=layout, token_ids=ids, norms=norms)
    for stat in asked_stats(spec):
        check_result(stat, path, got, ref, args, pooling, spec, layout)


# the smoke test's layout: every feature of a layout at once (causal, a window, grouped-query heads)
SMOKE_LAYOUT = AttentionLayout(causal=True, window=(2, 0), n_key_value_heads=2)


def _smoke_test(path: str):
    """Every statistic of the table that `path`'s backend computes (the table's `backends`), at once, on
    one drawn case of SMOKE_LAYOUT with left padding, against the oracle: the one test per backend path
    that `make test-latest` runs (-m smoke)."""
    @pytest.mark.smoke
    @settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(data=st.data())
    def test(data):
        check_every_entry(path, *draw_case(data, "left-padding", rows=ROWS[path], layout=SMOKE_LAYOUT))

    return test


for _path in PATHS:
    globals()[f"test_{_path}_every_statistic_at_once".replace("-", "_")] = _smoke_test(_path)


def _variant_test(path: str, case: str):
    """Every statistic of the table that `path`'s backend computes, at once, on drawn inputs of `case`,
    against the oracle: a configuration of the fused kernel (`VARIANTS`) on every case."""
    @settings(max_examples=EXAMPLES[path], deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.data())
    def test(data):
        check_every_entry(path, *draw_case(data, case, rows=ROWS[path]))

    return test


# generated: test_<variant>_<case>_every_statistic for every configuration of the fused kernel and every case
for _path in VARIANTS:
    for _case in CASES:
        _test = _variant_test(_path, _case)
        globals()[f"test_{_path}_{_case}_every_statistic".replace("-", "_").replace("+", "_")] = \
            _test if QUICK_VARIANT_CASE[_path] == _case else FULL(_test)


def edge_case(L: int, index: int, n_seq: int = 2):
    """(layout, args, pooling) of the `index`-th edge length L, without hypothesis: `n_seq` sequences of
    L and L // 2 tokens (right padding), 2 query heads; the layout cycles through plain, causal, a causal
    window and a bidirectional one whose radius is the distance edge below L (or one less), and
    grouped-query causal."""
    edge = max([e for e in DISTANCE_EDGES if e < L], default=0) - index % 2
    layout = [AttentionLayout(), AttentionLayout(causal=True), AttentionLayout(causal=True, window=(max(edge, 0), 0)),
              AttentionLayout(window=(max(edge, 0), max(edge, 0) + 1)),
              AttentionLayout(causal=True, n_key_value_heads=1)][index % 5]
    g = torch.Generator().manual_seed(index)
    heads, H_kv = 2, layout.n_key_value_heads or 2
    q = torch.randn(n_seq, heads, L, 8, generator=g) * 1.5
    k, v = (torch.randn(n_seq, H_kv, L, 8, generator=g) * 1.5 for _ in range(2))
    pos = torch.arange(L)[None, :]
    key_valid = pos < torch.tensor([L, max(1, L // 2)][:n_seq])[:, None]  # (n_seq, L)
    key_class = torch.randint(0, C, (n_seq, L), generator=g)
    pooling = word_pooling(torch.where(key_valid, pos // 2, -1), torch.rand(n_seq, (L + 1) // 2, generator=g) < 0.8)
    token_ids = torch.randint(0, 3, (n_seq, L), generator=g)
    return layout, (q, k, v, key_valid, key_class), pooling, token_ids


# the tiers: each edge length on one path in the quick tier, the paths in turn; on the others in the full tier
QUICK_EDGE_PATH = rotated(EDGE_LENGTHS, list(PATHS))


def _edge_test(path: str):
    @pytest.mark.parametrize("L", [full_unless(QUICK_EDGE_PATH[L] == path, L) for L in EDGE_LENGTHS])
    def test(L):
        """Every entry of the table at once, at every edge length: the long rows and the edges
        (`EDGE_LENGTHS`) are checked in every path whatever hypothesis draws."""
        # Triton: the full-length sequence only (the interpreter's time grows with the rows; its
        # padding rows at these lengths come from the drawn cases)
        check_every_entry(path, *edge_case(L, EDGE_LENGTHS.index(L), n_seq=1 if path.startswith("triton") else 2),
                          norms_seed=L)

    return test


# generated: test_<path>_edge_lengths[<L>] for every path
for _path in PATHS:
    globals()[f"test_{_path}_edge_lengths".replace("-", "_")] = _edge_test(_path)


@pytest.mark.parametrize("run", RUNS)
def test_a_statistic_no_backend_computes_fails_loudly_in_each(run, monkeypatch):
    """A contributor who adds a statistic to the table and forgets a backend hears of it
    from that backend, whichever it is."""

    @dataclasses.dataclass(frozen=True)
    class NewSpec(StatsSpec):
        attention_rollout: bool = False

    new = RowStat("attention_rollout", ("B", "H", "L"), "attention_rollout")
    monkeypatch.setattr(spec_module, "ROW_STATS", ROW_STATS + (new,))
    args, pooling = inputs()
    RUNS[run](*args, NewSpec(n_key_classes=C, entropy=True), pooling=pooling)  # not asked: fine
    with pytest.raises(NotImplementedError, match="attention_rollout"):
        RUNS[run](*args, NewSpec(n_key_classes=C, entropy=True, attention_rollout=True), pooling=pooling)


def near_mass(p, i0, k0, keys):
    """A position-dependent per-row statistic, defined once on a block of probabilities: the mass a
    row puts on keys at distance |i - j| = 0, 1, 2-3 and 4 or more (buckets)."""
    n, bq, bk = p.shape
    i = torch.arange(i0, i0 + bq, device=p.device)[:, None]  # (bq, 1) query positions
    j = torch.arange(k0, k0 + bk, device=p.device)[None, :]  # (1, bk) key positions
    bucket = torch.bucketize((i - j).abs(), torch.tensor([1, 2, 4], device=p.device), right=True)  # (bq, bk)
    return torch.einsum("nqk,qkb->nqb", p, torch.nn.functional.one_hot(bucket, 4).to(p.dtype))  # (n, bq, 4)


@dataclasses.dataclass(frozen=True)
class NearSpec(StatsSpec):
    near_mass: bool = False


NEAR = RowStat("near_mass", ("B", "H", "L", "K"), "near_mass", from_probs=near_mass)


@pytest.mark.parametrize("path", ["chunked-compiled", "chunked-torch"])
@pytest.mark.parametrize("case", CASES)
@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_a_position_dependent_statistic_written_once_holds_on_every_layout(path, case, data):
    """A table entry with only its definition `from_probs(p, i0, k0, keys)`: the oracle calls it on
    whole maps, chunked on every query block with the block's offsets, and the two agree on every
    case; the oracle's values are those of the definition by hand."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spec_module, "ROW_STATS", ROW_STATS + (NEAR,))
        spec = NearSpec(n_key_classes=C, near_mass=True)
        check_entry(NEAR, path, case, data, spec=spec)
        layout, args, pooling, _ = draw_case(data, case)
        _, ref = attention_stats_eager(*args, spec, layout=layout)
    from bertscope.kernels.reference import visible_probs

    q, k, _, key_valid, _ = args
    p = visible_probs(q, k, key_valid, layout)  # (B, H, L, L)
    i, j = torch.arange(p.shape[-1])[:, None], torch.arange(p.shape[-1])[None, :]
    for b_, (lo, hi) in enumerate(((0, 1), (1, 2), (2, 4), (4, 10**6))):
        near = ((i - j).abs() >= lo) & ((i - j).abs() < hi)  # (L, L)
        want = (p * near).sum(-1) * key_valid[:, None, :]  # (B, H, L), padding rows 0
        torch.testing.assert_close(ref.near_mass[..., b_], want, atol=1e-6, rtol=1e-6)


def test_a_statistic_the_triton_kernel_lacks_is_an_error_not_a_silent_value():
    """Triton has no per-block definitions: an entry it does not write must be refused, never
    returned unset (the Triton side of the table, kernels/triton_*.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spec_module, "ROW_STATS", ROW_STATS + (NEAR,))
        args, pooling = inputs()
        with pytest.raises(NotImplementedError, match="near_mass"):
            triton(*args, NearSpec(n_key_classes=C, near_mass=True), pooling=pooling)


def test_default_spec_asks_for_nothing():
    assert asked_stats(StatsSpec()) == ()
    args, pooling = inputs()
    _, stats = attention_stats_eager(*args, StatsSpec(n_key_classes=C))
    assert all(getattr(stats, s.name) is None for s in ROW_STATS)


def test_union_turns_on_what_either_asks_for():
    a = StatsSpec(offsets=(1, -1), n_key_classes=C, entropy=True)
    b = StatsSpec(offsets=(0,), n_key_classes=C, word_maps=True)
    assert {s.name for s in asked_stats(a.union(b))} == {"entropy", "offset_mass", "word_map", "word_argmax"}
    assert a.union(b).offsets == (-1, 0, 1)


def all_on(backend: str | None = None) -> StatsSpec:
    """Every switch of the table on; with `backend`, only those of the entries it computes (the table's
    `backends`)."""
    on = {s.switch: True for s in ROW_STATS if s.switch != "offsets" and s.twin_of is None
          and (backend is None or s.computed_by(backend))}
    # the norm-based twins by name (StatsSpec.norms): those the backend computes
    on["norms"] = tuple(s.twin_of.name for s in ROW_STATS if s.twin_of is not None
                        and (backend is None or s.computed_by(backend)))
    return StatsSpec(offsets=OFFSETS, n_key_classes=C, **on)


def test_as_float32_widens_the_float_statistics_of_the_table_only():
    """In place, each half-precision statistic becomes the float32 of the same values; indices and
    float32 ones are left as they are (the same tensors)."""
    args, pooling = inputs()
    _, stats = attention_stats_eager(*args, all_on(), pooling=pooling, token_ids=input_ids(),
                                     norms=key_norms(args[0]))
    half = RowStats(**{s.name: getattr(stats, s.name).to(torch.bfloat16) if s.dtype == "float"
                       else getattr(stats, s.name) for s in ROW_STATS})
    before = {s.name: getattr(half, s.name) for s in ROW_STATS}
    assert half.as_float32() is half
    for s in ROW_STATS:
        t = getattr(half, s.name)
        if s.dtype == "float":
            assert t.dtype == torch.float32, s.name
            assert torch.equal(t, before[s.name].float()), s.name  # the half values, exactly
            assert float((t - getattr(stats, s.name)).abs().max()) <= 2**-8 * max(1.0, float(t.abs().max())), s.name
        else:
            assert t is before[s.name], s.name  # an index is not touched
    already = RowStats(entropy=stats.entropy)
    assert already.as_float32().entropy is stats.entropy  # float32 already: no copy


def test_removed_heads_hold_the_table_value():
    args, pooling = inputs()
    _, stats = attention_stats_eager(*args, all_on(), pooling=pooling, token_ids=input_ids(),
                                     norms=key_norms(args[0]))
    spread = head_removal.spread_heads(stats, (0, 2, 3), 5)  # physical heads 0, 1, 2 -> slots 0, 2, 3 of 5
    for s in ROW_STATS:
        t = getattr(spread, s.name)
        removed = t[:, [1, 4]]
        if np.isnan(s.removed):
            assert bool(removed.isnan().all()), s.name
        else:
            assert bool((removed == s.removed).all()), s.name
        assert torch.equal(t[:, [0, 2, 3]], getattr(stats, s.name)), s.name


def test_segment_sums_and_head_stats_cover_every_sum_of_the_table():
    """Each segment sum is the sum over valid rows of the statistic's per-row values, and each
    HeadStats array adds them up; the argmax's counts are checked against the argmax by hand."""
    args, pooling = inputs()
    spec = all_on()
    _, stats = attention_stats_eager(*args, spec, pooling=pooling, token_ids=input_ids(), norms=key_norms(args[0]))
    classes = TokenClasses.of(("a", "b", "c"))
    key_valid, key_class = args[3], args[4]
    batch = BatchContext(indices=[0, 1], segments=[None, None], inputs={}, key_valid=key_valid, key_class=key_class,
                         classes=classes, spec=spec, layers=[stats], token_ids=input_ids())
    sums = batch.segment_sums(0)
    valid = key_valid.double()  # (B, L): group 0 is every valid row
    acc = HeadStats(1, H, spec, classes)
    acc.add(batch)
    for stat in ROW_STATS:
        if not stat.sums:
            continue
        rows = stat.segment_rows(getattr(stats, stat.name), key_class, spec)  # {name: (B, H, L, F)}
        for m in stat.sums:
            want = (rows[m.name].double() * valid[:, None, :, None]).sum(2)  # (B, H, F)
            got = sums[m.name][:, :, 0]
            torch.testing.assert_close(got.reshape(want.shape), want, msg=m.name)
            np.testing.assert_allclose(getattr(acc, m.array)[0, :, 0].reshape(H, -1), want.sum(0).numpy(),
                                       err_msg=m.array)
    # the argmax's counts by hand: rows whose argmax is at offset o, or of class c
    am, pos = stats.argmax, torch.arange(L)
    for t, o in enumerate(OFFSETS):
        by_hand = ((am - pos == o).double() * valid[:, None]).sum(-1)  # (B, H)
        torch.testing.assert_close(sums["argmax_offset"][:, :, 0, t], by_hand)
    for c in range(C):
        of_class = key_class.gather(1, am.flatten(1)).view_as(am) == c  # (B, H, L)
        torch.testing.assert_close(sums["argmax_class"][:, :, 0, c], (of_class.double() * valid[:, None]).sum(-1))
    assert torch.equal(sums["argmax_offset"][:, :, 0].sum(-1), valid.sum(-1)[:, None].expand(B, H))


# fields of the two record types that are not the table's: what StatsSpec says beside the switches,
# what RowStats hands on beside the statistics
SPEC_EXTRA = ("offsets", "n_key_classes", "keep_qk")
# switches that are tuples, () for off (offsets; streaming's (sink, recent), which True turns on as STREAMING_ON)
TUPLE_SWITCHES = ("offsets", "streaming")
ROW_STATS_EXTRA = ("queries", "keys", "scale", "layout", "extras")


def table_mismatch(record: str, fields: list[str], wanted: list[str], extra: tuple, declare: str) -> list[str]:
    """What `record`'s fields lack of the table (or have that it does not), as instructions."""
    have, table = [f for f in fields if f not in extra], wanted
    problems = [f"{record} has no field {name!r} for ROW_STATS: add `{declare.format(name=name)}` (with a docstring) "
                f"to {record} in kernels/spec.py" for name in table if name not in have]
    problems += [f"{record}.{name} is in no entry of ROW_STATS: add the entry to the table, or remove the field"
                 for name in have if name not in table]
    if not problems and have != table:
        problems.append(f"{record}'s fields are not in the table's order: {have} != {table}")
    return problems


def test_row_stats_has_one_attribute_per_entry():
    """RowStats is written out: one `name: torch.Tensor | None = None` per entry, in the table's order,
    before what it hands on beside them; an entry without its attribute (or the other way round) says
    what to add."""
    names = [f.name for f in dataclasses.fields(RowStats)]
    assert table_mismatch("RowStats", names, [s.name for s in ROW_STATS], ROW_STATS_EXTRA,
                          "{name}: torch.Tensor | None = None") == []
    assert names[:len(ROW_STATS)] == [s.name for s in ROW_STATS] and names[len(ROW_STATS):] == list(ROW_STATS_EXTRA)
    empty = RowStats()
    assert all(getattr(empty, s.name) is None for s in ROW_STATS) and empty.layout == AttentionLayout()
    assert empty.extras == {} and empty.extras is not RowStats().extras


def test_stats_spec_has_one_switch_per_switch_of_the_table():
    """StatsSpec is written out: one field per distinct `switch` of the table (offsets a tuple, the others
    bools), off by default, in the table's order; a switch without its field (or the other way round)
    says what to add."""
    switches = list(dict.fromkeys(s.switch for s in ROW_STATS))
    names = [f.name for f in dataclasses.fields(StatsSpec)]
    assert table_mismatch("StatsSpec", names, [w for w in switches if w != "offsets"], SPEC_EXTRA,
                          "{name}: bool = False") == []
    assert "offsets" in switches and names == ["offsets", "n_key_classes"] + [w for w in switches if w != "offsets"] \
        + ["keep_qk"]
    spec = StatsSpec()
    assert spec.offsets == () and spec.n_key_classes == 1 and asked_stats(spec) == ()
    assert all(getattr(spec, w) is False for w in switches if w not in TUPLE_SWITCHES) and spec.keep_qk is False
    assert all(getattr(spec, w) == () for w in TUPLE_SWITCHES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.entropy = True
    with pytest.raises(ValueError, match="distinct"):
        StatsSpec(offsets=(1, 1))
    with pytest.raises(ValueError, match="n_key_classes"):
        StatsSpec(n_key_classes=0)


def test_a_table_entry_without_its_fields_says_what_to_add():
    """The two checks above, on a table that gained an entry the record types lack."""
    new = RowStat("max_mass", ("B", "H", "L"), "max_mass")
    table = [s.name for s in ROW_STATS + (new,)]
    spec_names = [f.name for f in dataclasses.fields(StatsSpec)]
    assert table_mismatch("RowStats", [f.name for f in dataclasses.fields(RowStats)], table, ROW_STATS_EXTRA,
                          "{name}: torch.Tensor | None = None") == [
        "RowStats has no field 'max_mass' for ROW_STATS: add `max_mass: torch.Tensor | None = None` (with a "
        "docstring) to RowStats in kernels/spec.py"]
    switches = [w for w in dict.fromkeys(s.switch for s in ROW_STATS + (new,)) if w != "offsets"]
    assert table_mismatch("StatsSpec", spec_names, switches, SPEC_EXTRA, "{name}: bool = False") == [
        "StatsSpec has no field 'max_mass' for ROW_STATS: add `max_mass: bool = False` (with a docstring) to "
        "StatsSpec in kernels/spec.py"]
    assert table_mismatch("StatsSpec", spec_names + ["rollout"], switches[:-1], SPEC_EXTRA, "") == [
        "StatsSpec.rollout is in no entry of ROW_STATS: add the entry to the table, or remove the field"]


@pytest.mark.parametrize("record", [StatsSpec, RowStats], ids=lambda r: r.__name__)
def test_every_field_of_the_record_types_has_a_docstring(record):
    """Each field is followed by its docstring (a string literal: what editors and Sphinx show)."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(record)).body[0].body
    documented = {node.target.id for node, after in zip(body, body[1:])
                  if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
                  and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)}
    missing = [f.name for f in dataclasses.fields(record) if f.name not in documented]
    assert missing == [], f"{record.__name__} fields without a docstring in kernels/spec.py: {missing}"
