"""The position-dependent row statistics of the table (`distance_mass`, `mean_distance`,
`position_mass`, kernels/spec.py) against values worked out by hand, in every backend path;
the Triton kernel's exact integer buckets against `DISTANCE_EDGES` up to and past the last edge;
and every backend against the oracle at distances the generated tests' short rows never reach
(several key blocks, buckets up to 128-255, band edges, stacked grouped-query rows).

The generated tests (test_stats_table.py, test_triton_table.py) check each backend against the
oracle on every case; these check the oracle's definition itself (a definition that is wrong
in the oracle is wrong the same way in every backend, which no comparison between them sees).
Triton runs under its interpreter (TRITON_INTERPRET=1, set by tests/conftest.py).
"""
import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (tests/conftest.py sets it too)

import pytest
import torch
import triton
import triton.language as tl

from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.spec import (
    DISTANCE_EDGES,
    FIXED_WIDTHS,
    AttentionLayout,
    StatsSpec,
    distance_bucket_names,
    position_bin_names,
)
from bertscope.kernels.triton_attention import INTERPRETED, attention_stats_triton
from bertscope.kernels.triton_kernel import DB, _distance_bucket

if not INTERPRETED:
    pytest.fail("bertscope.kernels.triton_attention was imported before TRITON_INTERPRET=1 was set", pytrace=False)

SPEC = StatsSpec(n_key_classes=1, distance=True, position_mass=True)


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter reads it again while a kernel runs


def triton_backend(*args, **kw):
    return attention_stats_triton(*args, **kw)


def chunked(row_pass):
    return lambda *a, **kw: attention_stats_chunked(*a, row_pass=row_pass, **kw)


RUNS = {"eager": attention_stats_eager, "chunked-compiled": chunked("compiled"), "chunked-torch": chunked("torch"),
        "triton": triton_backend}


def weighted_rows(weights, layout):
    """One sequence, one head, D = 1: q = 1 and k_j = ln w_j (scale 1), so each row's weights are
    w_j over the keys it sees, normalised."""
    L = len(weights)
    q = torch.ones(1, 1, L, 1)
    k = torch.log(torch.tensor(weights)).view(1, 1, L, 1)
    args = (q, k, k.clone(), torch.ones(1, L, dtype=torch.bool), torch.zeros(1, L, dtype=torch.long))
    return args, layout


def run(backend, args, layout):
    args = tuple(a.float() if a.is_floating_point() else a for a in args)  # the compiled row pass takes fp32
    return RUNS[backend](*args, SPEC, scale=1.0, layout=layout)[1]


def bucket(d):
    """The spec's distance bucket of d by hand: 0 | 1 | 2-3 | 4-7 | ... | 32768+."""
    return 0 if d == 0 else min(int(math.log2(d)) + 1, len(DISTANCE_EDGES))


def test_the_widths_and_column_names():
    assert FIXED_WIDTHS == {"DB": 17, "PB": 11}
    names = distance_bucket_names()
    assert names[:5] == ["0", "1", "2-3", "4-7", "8-15"] and names[-1] == "32768+" and len(names) == 17
    bins = position_bin_names()
    assert bins[0] == "0-10%" and bins[-1] == "after" and len(bins) == 11
    assert [bucket(d) for d in (0, 1, 2, 3, 4, 7, 8, 32767, 32768, 10**6)] == [0, 1, 2, 2, 3, 3, 4, 15, 16, 16]


@pytest.mark.parametrize("backend", list(RUNS))
def test_bidirectional_rows_by_hand(backend):
    """Plain layout, weights 1, 2, 3, 4 on keys 0..3: every row reads p = (0.1, 0.2, 0.3, 0.4).
    Row 1: distances 1, 0, 1, 2 -> buckets 0: 0.2, 1: 0.1 + 0.3, 2 (2-3): 0.4; mean distance
    0.1 + 0.3 + 0.8 = 1.2; positions floor(10 j / 2) = 0, 5 for keys 0, 1, keys 2, 3 after it.
    Row 3: distances 3, 2, 1, 0 -> buckets 0: 0.4, 1: 0.3, 2: 0.1 + 0.2; mean 0.3 + 0.4 + 0.3 = 1.0;
    positions floor(10 j / 4) = 0, 2, 5, 7."""
    s = run(backend, *weighted_rows([1.0, 2.0, 3.0, 4.0], AttentionLayout()))
    dist, mean, pos = s.distance_mass[0, 0], s.mean_distance[0, 0], s.position_mass[0, 0]
    assert dist.shape == (4, 17) and mean.shape == (4,) and pos.shape == (4, 11)
    want = torch.zeros(4, 17)
    want[1, :3] = torch.tensor([0.2, 0.4, 0.4])
    want[3, :3] = torch.tensor([0.4, 0.3, 0.3])
    torch.testing.assert_close(dist[[1, 3]], want[[1, 3]], atol=1e-6, rtol=0)
    torch.testing.assert_close(mean[[1, 3]], torch.tensor([1.2, 1.0]), atol=1e-6, rtol=0)
    want = torch.zeros(4, 11)
    want[1, [0, 5, 10]] = torch.tensor([0.1, 0.2, 0.7])
    want[3, [0, 2, 5, 7]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    torch.testing.assert_close(pos[[1, 3]], want[[1, 3]], atol=1e-6, rtol=0)
    # row 0 sees keys at distances 0..3 (buckets 0, 1, 2, 2) and all but itself after it
    torch.testing.assert_close(dist[0, :3], torch.tensor([0.1, 0.2, 0.7]), atol=1e-6, rtol=0)
    assert pos[0, 0].item() == pytest.approx(0.1, abs=1e-6) and pos[0, 10].item() == pytest.approx(0.9, abs=1e-6)


@pytest.mark.parametrize("backend", list(RUNS))
def test_causal_rows_by_hand(backend):
    """Causal, weights 1, 1, 2, 4, 8 on keys 0..4 (row i sees keys 0..i). Row 1: p = 1/2, 1/2 at
    distances 1, 0; positions floor(10 j / 2) = 0, 5. Row 4: p = (1, 1, 2, 4, 8) / 16 at distances
    4, 3, 2, 1, 0 -> buckets 0: 8/16, 1: 4/16, 2 (2-3): 3/16, 3 (4-7): 1/16; mean distance
    (4 + 3 + 4 + 4) / 16 = 15/16; positions floor(10 j / 5) = 0, 2, 4, 6, 8; nothing after the
    query (a causal row never has mass in the last bin)."""
    s = run(backend, *weighted_rows([1.0, 1.0, 2.0, 4.0, 8.0], AttentionLayout(causal=True)))
    dist, mean, pos = s.distance_mass[0, 0], s.mean_distance[0, 0], s.position_mass[0, 0]
    torch.testing.assert_close(dist[1, :2], torch.tensor([0.5, 0.5]), atol=1e-6, rtol=0)
    torch.testing.assert_close(dist[4, :4], torch.tensor([8, 4, 3, 1]) / 16, atol=1e-6, rtol=0)
    assert dist[1, 2:].abs().max() < 1e-7 and dist[4, 4:].abs().max() < 1e-7
    # rows 2, 3: (2 * 1 + 1 * 1 + 0 * 2) / 4 and (3 * 1 + 2 * 1 + 1 * 2 + 0 * 4) / 8
    torch.testing.assert_close(mean, torch.tensor([0.0, 0.5, 3 / 4, 7 / 8, 15 / 16]),
                               atol=1e-6, rtol=0)
    want = torch.zeros(5, 11)
    want[0, 0] = 1.0  # row 0 reads only key 0: floor(0 / 1) = 0
    want[1, [0, 5]] = 0.5
    want[4, [0, 2, 4, 6, 8]] = torch.tensor([1, 1, 2, 4, 8]) / 16
    torch.testing.assert_close(pos[[0, 1, 4]], want[[0, 1, 4]], atol=1e-6, rtol=0)
    assert pos[:, 10].abs().max() < 1e-7
    torch.testing.assert_close(dist.sum(-1), torch.ones(5), atol=1e-6, rtol=0)
    torch.testing.assert_close(pos.sum(-1), torch.ones(5), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", list(RUNS))
def test_far_keys_land_in_their_log2_buckets(backend):
    """A causal row of 300 keys whose weight sits on three keys (k = 30 there, 0 elsewhere): row
    299 puts 1/3 at each of the distances 128, 255 (bucket 128-255, 8) and 256 (256-511, 9), edges
    of buckets several key blocks away; its mean distance is (128 + 255 + 256) / 3; the keys
    171, 44, 43 are in the tenths floor(10 j / 300) = 5, 1, 1 of its context."""
    L = 300
    w = [1.0] * L
    for far in (128, 255, 256):
        w[L - 1 - far] = math.exp(30.0)
    s = run(backend, *weighted_rows(w, AttentionLayout(causal=True)))
    dist = s.distance_mass[0, 0, L - 1]
    assert dist[8].item() == pytest.approx(2 / 3, abs=1e-6) and dist[9].item() == pytest.approx(1 / 3, abs=1e-6)
    assert s.mean_distance[0, 0, L - 1].item() == pytest.approx((128 + 255 + 256) / 3, rel=1e-5)
    pos = s.position_mass[0, 0, L - 1]
    assert pos[1].item() == pytest.approx(2 / 3, abs=1e-6) and pos[5].item() == pytest.approx(1 / 3, abs=1e-6)


# --- the Triton kernel's integer buckets against DISTANCE_EDGES, up to and past the last edge --------


@triton.jit
def _bucket_kernel(Dist, Bucket, Beyond, n):
    """Bucket[k] = _distance_bucket(Dist[k]); Beyond[k, b] = Dist[k] >= 2^b, the compare `_position_sums` takes for
    "past bucket b" (bucket b + 1's low edge), b < DB - 1."""
    for k in range(0, n):
        d = tl.load(Dist + k)
        tl.store(Bucket + k, _distance_bucket(d))
        for b in range(0, DB - 1):
            tl.store(Beyond + k * (DB - 1) + b, (d >= (1 << b)).to(tl.int32))


def test_the_kernel_buckets_are_the_spec_buckets_past_the_last_edge():
    """The kernel's bucket of a distance (the number of edges <= d, read off d's exponent as a float) and the
    edges its sums compare against (d >= 2^b: past bucket b), on every edge, either side of it and far past the
    last one (2^15 and beyond, 2^24 + 1 and 2^31 - 2 whose floats round: rows longer than the interpreter can run),
    against torch.bucketize on DISTANCE_EDGES."""
    edges = torch.tensor(DISTANCE_EDGES)
    dist = sorted({0, 1, 2, 3, 5, 2**24 + 1, 2**31 - 2} | {e + s for e in DISTANCE_EDGES for s in (-1, 0, 1)} | {2**20})
    dist = torch.tensor(dist, dtype=torch.int32)
    want = torch.bucketize(dist.long(), edges, right=True)
    n_buckets = len(DISTANCE_EDGES) + 1
    got = torch.full_like(dist, -1)
    beyond = torch.full((len(dist), n_buckets - 1), -1, dtype=torch.int32)
    _bucket_kernel[(1,)](dist, got, beyond, len(dist))
    assert torch.equal(got.long(), want)
    assert torch.equal(beyond.long(), (want[:, None] > torch.arange(n_buckets - 1)[None, :]).long())


# --- every backend against the oracle at long distances, over several blocks and band edges --------


LONG = {
    "plain": (AttentionLayout(), 1),
    "causal-window-gqa": (AttentionLayout(causal=True, window=(90, 0), n_key_value_heads=1), 2),
    "window": (AttentionLayout(window=(40, 70)), 1),
}


@pytest.mark.parametrize("name", list(LONG))
@pytest.mark.parametrize("backend", ["chunked-compiled", "chunked-torch", "triton"])
def test_long_rows_against_the_oracle(backend, name):
    """L = 150 with left or right padding: distances up to 149 (bucket 128-255), many key blocks
    (the band's middle visited first), position bins of rows far into the sequence."""
    layout, H = LONG[name]
    g = torch.Generator().manual_seed(7)
    B, L, D = 2, 150, 8
    H_kv = layout.n_key_value_heads or H
    q = torch.randn(B, H, L, D, generator=g) * 0.3
    k, v = (torch.randn(B, H_kv, L, D, generator=g) * 0.3 for _ in range(2))
    pos = torch.arange(L)[None, :]
    key_valid = (pos >= torch.tensor([0, 17])[:, None]) if layout.causal else (pos < torch.tensor([L, 133])[:, None])
    args = (q, k, v, key_valid, torch.zeros(B, L, dtype=torch.long))
    _, ref = attention_stats_eager(*args, SPEC, layout=layout)
    _, got = RUNS[backend](*args, SPEC, layout=layout)
    for name_ in ("distance_mass", "mean_distance", "position_mass"):
        torch.testing.assert_close(getattr(got, name_), getattr(ref, name_), atol=2e-5, rtol=1e-5, msg=name_)
    far = ref.distance_mass[..., 8].amax()  # bucket 128-255 is reached
    assert (far > 1e-3) == (name == "plain"), far


def test_the_position_statistics_take_their_own_configurations():
    """Their accumulators ((BLOCK_M, 32) and (BLOCK_M, 16) fp32) and bucket loops call for tiles of their own:
    `forward_config` gives half-precision calls that ask for one of them the position family's row of
    `TILES` on every target and layout, and the ahead-of-time compile checks those configurations
    (`triton_aot`)."""
    import bertscope.kernels.triton_attention as ta
    from bertscope.kernels import triton_aot
    from bertscope.kernels.triton_config import TILES, forward_config

    assert set(ta.POSITION_STATS) == {"distance_mass", "mean_distance", "position_mass"}
    for arch in (80, 90):
        for banded in (False, True):
            c = forward_config(64, torch.bfloat16, arch, True, banded=banded)
            got = (c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"])
            assert got == TILES[(arch, 64, "banded" if banded else "plain", "positions")].tiles
            assert c["MASKED_FIRST"] == banded
    on = [s for s in triton_aot.shipped_specialisations(layouts="core", maps=False)
          if set(ta.POSITION_STATS) <= s.switched_on()]
    assert {s.banded for s in on} == {False, True} and {s.dtype for s in on} >= {"fp32", "bf16"}
    m, n, w, st = TILES[(90, 64, "plain", "positions")].tiles
    assert any(s.name(90).startswith(f"plain M{m} N{n} D64 w{w}s{st} bf16") for s in on)


def test_the_mean_distance_by_dot_where_it_is_taken_and_the_same_either_way():
    """MEAN_BY_DOT (`triton_config.mean_by_dot`): a banded call with the mean distance and three free key-feature
    columns takes sum_j p_j (i - j) = i l - P j from the key features' dot (the ones column and the key positions,
    256 hi + lo), and only the keys after the row per score; a plain call, one whose classes leave no room, or one
    at D = 256 does not. Forced on and off on the same inputs (a causal row of 200 with left padding, 64 x 64
    blocks: the unmasked blocks before every row take nothing per score; fp32 and fp16: P rounded to fp16 in the
    dot) both give the oracle's mean distance, and the position columns do not move the class masses."""
    from bertscope.kernels.triton_config import mean_by_dot

    on = frozenset({"mean_distance"})
    assert mean_by_dot(on, 4, True) and mean_by_dot(on, 13, True)
    assert not mean_by_dot(on, 14, True) and not mean_by_dot(on, 4, False) and not mean_by_dot(frozenset(), 4, True)
    assert mean_by_dot(on, 29, True) and not mean_by_dot(on, 30, True)  # 32 columns
    assert mean_by_dot(on, 4, True, 128) and not mean_by_dot(on, 4, True, 256)  # D = 256 spilled more with it
    g = torch.Generator().manual_seed(3)
    B, H, L, D = 2, 2, 200, 16
    layout = AttentionLayout(causal=True, n_key_value_heads=1)
    spec = StatsSpec(n_key_classes=4, distance=True, class_mass=True)
    key_valid = torch.arange(L)[None, :] >= torch.tensor([0, 17])[:, None]
    key_class = torch.randint(0, 4, (B, L), generator=g)
    for dtype, tol in ((torch.float32, 2e-5), (torch.float16, 2e-3)):
        q = (torch.randn(B, H, L, D, generator=g) * 0.5).to(dtype)
        k, v = ((torch.randn(B, 1, L, D, generator=g) * 0.5).to(dtype) for _ in range(2))
        args = (q, k, v, key_valid, key_class)
        exact = [a.float() if a.is_floating_point() else a for a in args]
        _, ref = attention_stats_eager(*exact, spec, layout=layout)
        blocks = {"BLOCK_M": 64, "BLOCK_N": 64}
        got = {flag: attention_stats_triton(*args, spec, layout=layout, blocks={**blocks, "MEAN_BY_DOT": flag})[1]
               for flag in (True, False)}
        seen = key_valid[:, None, :].expand(B, H, L)
        for flag, s in got.items():
            err = ((s.mean_distance - ref.mean_distance).abs() / (1 + ref.mean_distance))[seen]
            assert float(err.max()) < tol, (dtype, flag, float(err.max()))
        torch.testing.assert_close(got[True].class_mass, got[False].class_mass, atol=0, rtol=0)
        assert float(ref.mean_distance[seen].max()) > 50  # rows far into the sequence
