"""Whole-map statistics (column mass, word-level maps) and Jensen-Shannon divergence between
heads: every backend against the eager reference, the reference against first principles."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.pooling import word_argmax, word_pooling
from bertscope.kernels.spec import StatsSpec

MAP_SPEC = StatsSpec(offsets=(0,), n_key_classes=2, entropy=False, argmax=False, column_mass=True,
                     word_maps=True, class_mass=True)
ROW_PASSES = ["compiled", "torch"]


def random_units(B, L, lengths, g, n_special=2):
    """Units for a batch: the first and last valid token are specials; words span 1-3 tokens."""
    unit = torch.full((B, L), -1, dtype=torch.long)
    n_units = []
    for b, n in enumerate(lengths):
        ids, w, i = [], 0, 1
        while i < n - 1:
            span = int(torch.randint(1, 4, (1,), generator=g))
            span = min(span, n - 1 - i)
            ids += [w] * span
            w, i = w + 1, i + span
        # words first, then the specials as units of their own
        row = ([w] if n > 0 else []) + ids + ([w + 1] if n > 1 else [])
        unit[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        n_units.append((w, len(row) - len(ids)))
    W = max(nw + ns for nw, ns in n_units)
    candidate = torch.zeros(B, W, dtype=torch.bool)
    for b, (nw, _) in enumerate(n_units):
        candidate[b, :nw] = True
    return unit, candidate


def make_inputs(B, H, L, D, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, L, D, generator=g) * 2 for _ in range(3))
    key_valid = torch.arange(L)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
    key_class = torch.randint(0, 2, (B, L), generator=g)
    unit, candidate = random_units(B, L, lengths, g)
    return (q, k, v, key_valid, key_class), unit, candidate


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), H=st.integers(1, 3), L=st.integers(1, 50), data=st.data(),
       from_word=st.sampled_from(["mean", "first"]), chunk_maps=st.integers(1, 4))
@pytest.mark.parametrize("row_pass", ROW_PASSES)
def test_chunked_maps_match_eager(row_pass, B, H, L, data, from_word, chunk_maps):
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    inputs, unit, candidate = make_inputs(B, H, L, 8, lengths, seed=data.draw(st.integers(0, 10**6)))
    pooling = word_pooling(unit, candidate, from_word)
    _, ref = attention_stats_eager(*inputs, MAP_SPEC, pooling=pooling)
    _, fast = attention_stats_chunked(*inputs, MAP_SPEC, pooling=pooling, chunk_bytes=chunk_maps * L * L * 4,
                                      row_pass=row_pass)
    torch.testing.assert_close(fast.column_mass, ref.column_mass, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(fast.word_map, ref.word_map, atol=2e-5, rtol=1e-5)
    # argmax of nearly tied word scores may differ by rounding; where the scores differ clearly it may not
    top2 = ref.word_map.sort(-1, descending=True).values
    ties = ((top2[..., 0] - top2[..., 1] < 1e-5) if top2.shape[-1] > 1
            else torch.zeros(top2.shape[:-1], dtype=torch.bool))
    assert torch.equal(fast.word_argmax[~ties], ref.word_argmax[~ties])


def test_column_mass_from_first_principles():
    inputs, _, _ = make_inputs(2, 2, 7, 4, [7, 4], seed=3)
    spec = StatsSpec(offsets=(0,), n_key_classes=2, column_mass=True, class_mass=True, entropy=True, argmax=True)
    _, stats = attention_stats_eager(*inputs, spec)
    q, k, _, key_valid, _ = inputs
    for b, n in enumerate([7, 4]):
        for h in range(2):
            p = torch.softmax(q[b, h, :n] @ k[b, h, :n].T / 2, dim=-1)  # (n, n), D=4 -> scale 1/2
            torch.testing.assert_close(stats.column_mass[b, h, :n], p.sum(0))
            assert torch.all(stats.column_mass[b, h, n:] == 0)
    # every valid row gives away exactly 1
    torch.testing.assert_close(stats.column_mass.sum(-1), key_valid.sum(-1, keepdim=True).float().expand(2, 2))


def test_word_map_sums_to_first_and_means_from():
    """Tokens [CLS] a1 a2 b [SEP]: word a is split in two. A row of the word map sums to 1;
    'to a' is the sum over a1, a2; 'from a' is their mean (or a1's row for 'first')."""
    p = torch.tensor([[0.2, 0.3, 0.1, 0.3, 0.1],
                      [0.1, 0.1, 0.5, 0.2, 0.1],
                      [0.3, 0.3, 0.1, 0.2, 0.1],
                      [0.1, 0.6, 0.1, 0.1, 0.1],
                      [0.2, 0.2, 0.2, 0.2, 0.2]])[None, None]  # (1, 1, 5, 5)
    unit = torch.tensor([[2, 0, 0, 1, 3]])  # words a=0, b=1; [CLS]=2, [SEP]=3
    candidate = torch.tensor([[True, True, False, False]])
    from bertscope.kernels.pooling import pool_map

    wm = pool_map(p, word_pooling(unit, candidate, "mean"))[0, 0]  # (4, 4)
    torch.testing.assert_close(wm.sum(-1), torch.ones(4))
    # from a (mean of rows 1 and 2): to a = (0.1+0.5 + 0.3+0.1)/2, to b = (0.2+0.2)/2, [CLS] = (0.1+0.3)/2
    torch.testing.assert_close(wm[0], torch.tensor([0.5, 0.2, 0.2, 0.1]))
    first = pool_map(p, word_pooling(unit, candidate, "first"))[0, 0]
    torch.testing.assert_close(first[0], torch.tensor([0.6, 0.2, 0.1, 0.1]))
    torch.testing.assert_close(first[1], wm[1])  # b has a single token
    # the argmax excludes the word itself and non-candidates: from a -> b, from b -> a
    assert word_argmax(wm[None, None], candidate).tolist() == [[[1, 0, 0, 0]]]


def test_word_argmax_lowest_index_on_ties_and_none_left():
    wm = torch.tensor([[0.0, 0.4, 0.4, 0.2], [0.5, 0.0, 0.25, 0.25], [0.3, 0.3, 0.4, 0.0], [0.1, 0.1, 0.1, 0.7]])
    candidate = torch.tensor([[True, True, True, False]])
    assert word_argmax(wm[None, None], candidate)[0, 0].tolist() == [1, 0, 0, 0]
    only = torch.tensor([[True, False, False, False]])
    assert word_argmax(wm[None, None], only)[0, 0].tolist() == [-1, 0, 0, 0]


def test_word_maps_need_a_pooling():
    inputs, _, _ = make_inputs(1, 1, 5, 4, [5])
    with pytest.raises(ValueError, match="WordPooling"):
        attention_stats_eager(*inputs, MAP_SPEC)
    with pytest.raises(ValueError, match="WordPooling"):
        attention_stats_chunked(*inputs, MAP_SPEC)


def test_js_chunked_matches_eager_with_padding():
    from bertscope.kernels.js import pairwise_js

    g = torch.Generator().manual_seed(5)
    B, N, L, D = 3, 5, 11, 4
    q, k = (torch.randn(B, N, L, D, generator=g) * 2 for _ in range(2))
    key_valid = torch.arange(L)[None, :] < torch.tensor([11, 6, 1])[:, None]
    ref = pairwise_js(q, k, key_valid, 0.5, backend="eager")
    fast = pairwise_js(q, k, key_valid, 0.5, backend="chunked", pair_bytes=2 * 11 * 11 * 4)
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)
    assert torch.all(ref.diagonal() == 0) and torch.all(ref[~torch.eye(N, dtype=torch.bool)] > 0)


def test_js_from_first_principles():
    """Two heads over two keys: one attends (1, 0), the other (1/2, 1/2); one query row.
    JS = H(3/4, 1/4) - (0 + ln 2) / 2."""
    from bertscope.kernels.js import pairwise_js_chunked, pairwise_js_eager

    q = torch.tensor([[[[1.0], [0.0]], [[0.0], [0.0]]]])  # (1, 2, 2, 1)
    k = torch.tensor([[[[100.0], [-100.0]], [[1.0], [1.0]]]])  # head 0 puts all mass on key 0
    key_valid = torch.tensor([[True, True]])
    # count only row 0: row 1 of head 0 has q = 0 (uniform, like head 1), so its JS is 0
    expected = (-(0.75 * torch.log(torch.tensor(0.75)) + 0.25 * torch.log(torch.tensor(0.25)))
                - torch.log(torch.tensor(2.0)) / 2)
    for fn in (pairwise_js_eager, pairwise_js_chunked):
        js = fn(q, k, key_valid, 1.0)
        torch.testing.assert_close(js[0, 1].float(), expected, atol=1e-6, rtol=0)
