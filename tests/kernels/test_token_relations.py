"""The token relations `duplicate_mass` and `prefix_match_mass` (kernels/spec.py), beyond the
generated table tests (which check every backend against the oracle on every case): the oracle's
values on hand-built attention whose answer is obvious, padding that must never match, the
eligible-row counts (`token_relation_rows`) against their brute-force definition on every layout,
`HeadStats`' means over eligible rows, and the issue's equality with the induction analysis's
duplicate and induction scores on repeated random tokens."""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (tests/conftest.py sets it too)

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertscope.engine.accumulate import HeadStats
from bertscope.engine.batch import BatchContext
from bertscope.kernels.chunked import attention_stats_chunked
from bertscope.kernels.eager import attention_stats_eager
from bertscope.kernels.reference import visible_probs
from bertscope.kernels.spec import AttentionLayout, StatsSpec, token_relation_rows
from bertscope.text.token_classes import TokenClasses

SPEC = StatsSpec(token_relations=True)


def triton(*args, **kw):
    import bertscope.kernels.triton_attention as ta

    return ta.attention_stats_triton(*args, **kw)


BACKENDS = {"eager": attention_stats_eager,
            "chunked-compiled": lambda *a, **kw: attention_stats_chunked(*a, row_pass="compiled", **kw),
            "chunked-torch": lambda *a, **kw: attention_stats_chunked(*a, row_pass="torch", **kw),
            "triton": triton}


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def one_hot_attention(targets, valid):
    """q, k (1, n, L, L) with scale 1 whose row i puts all its mass (to 1e-20) on key targets[h][i]:
    k_j = e_j, q_i = 60 e_target. Rows are causal-safe when target <= i."""
    n, L = len(targets), valid.shape[-1]
    k = torch.eye(L).expand(1, n, L, L).contiguous()  # (1, n, L, D = L)
    q = torch.zeros(1, n, L, L)
    for h, row in enumerate(targets):
        for i, t in enumerate(row):
            q[0, h, i, t] = 60.0
    return q, k


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_b_c_a_b_c_with_one_hot_heads(backend):
    """"a b c a b c", causal. Head 0 looks back at the previous copy of its token (i - 3) where there
    is one (a duplicate-token head); head 1 at the token after it (i - 2, an induction head); head 2
    at itself. Rows 3-5 put all their mass on a duplicate (head 0) or a prefix match (head 1); rows 0-2
    have neither; head 2 has none anywhere (itself is not an earlier copy, nor after one)."""
    ids = torch.tensor([[0, 1, 2, 0, 1, 2]])  # a b c a b c
    valid = torch.ones(1, 6, dtype=torch.bool)
    targets = [[0, 1, 2, 0, 1, 2], [0, 1, 2, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    q, k = one_hot_attention(targets, valid)
    _, s = BACKENDS[backend](q, k, k, valid, torch.zeros(1, 6, dtype=torch.long), SPEC, scale=1.0,
                             layout=AttentionLayout(causal=True), token_ids=ids)
    want_dup = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    want_pre = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    torch.testing.assert_close(s.duplicate_mass[0].float(), want_dup, atol=1e-6, rtol=0)
    torch.testing.assert_close(s.prefix_match_mass[0].float(), want_pre, atol=1e-6, rtol=0)
    dup, pre = token_relation_rows(ids, valid, AttentionLayout(causal=True))
    assert dup.tolist() == [[False, False, False, True, True, True]] == pre.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_never_matches_even_with_a_real_tokens_id(backend):
    """Left padding whose id (7) is the first real token's: the first real row (position 2) looks at
    itself, whose predecessor is padding holding 7; row 3 (also 7) looks at the padding run, which it
    cannot see, and at position 2. Only row 3's look at position 2 is a duplicate; nothing is a
    prefix match through padding."""
    ids = torch.tensor([[7, 7, 7, 7, 5]])
    valid = torch.tensor([[False, False, True, True, True]])
    q, k = one_hot_attention([[0, 1, 2, 2, 3]], valid)
    _, s = BACKENDS[backend](q, k, k, valid, torch.zeros(1, 5, dtype=torch.long), SPEC, scale=1.0,
                             layout=AttentionLayout(causal=True), token_ids=ids)
    torch.testing.assert_close(s.duplicate_mass[0, 0].float(), torch.tensor([0, 0, 0, 1.0, 0]), atol=1e-6, rtol=0)
    # row 3 (7) at key 2: its predecessor is padding; row 4 (5) at key 3: predecessor 7 != 5
    torch.testing.assert_close(s.prefix_match_mass[0, 0].float(), torch.zeros(5), atol=1e-6, rtol=0)
    dup, pre = token_relation_rows(ids, valid, AttentionLayout(causal=True))
    assert dup.tolist() == [[False, False, False, True, False]]
    assert pre.tolist() == [[False, False, False, True, False]]  # row 3: key 3 follows the 7 at position 2


def brute_force_rows(ids, valid, layout):
    """(duplicate, prefix) (B, L) bool by the definitions: a real row with a visible real key j < i
    holding its token; with a visible real key 1 <= j <= i whose real predecessor holds it."""
    B, L = ids.shape
    dup = torch.zeros(B, L, dtype=torch.bool)
    pre = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        for i in range(L):
            if not valid[b, i]:
                continue
            lo, hi = layout.key_band(i, L)
            for j in range(lo, hi + 1):
                if not valid[b, j]:
                    continue
                if j < i and ids[b, j] == ids[b, i]:
                    dup[b, i] = True
                if 1 <= j <= i and valid[b, j - 1] and ids[b, j - 1] == ids[b, i]:
                    pre[b, i] = True
    return dup, pre


LAYOUTS = st.one_of(
    st.just(AttentionLayout()), st.just(AttentionLayout(causal=True)),
    st.integers(0, 6).map(lambda w: AttentionLayout(causal=True, window=(w, 0))),
    st.tuples(st.integers(0, 5), st.integers(0, 5)).map(lambda w: AttentionLayout(window=w)),
    st.integers(1, 2).map(lambda n: AttentionLayout(causal=True, n_key_value_heads=n)))


@settings(max_examples=150, deadline=None)
@given(layout=LAYOUTS, L=st.integers(1, 24), B=st.integers(1, 3), vocab=st.integers(1, 6),
       pad=st.sampled_from(["none", "left", "right", "holes"]), data=st.data())
def test_eligible_rows_match_the_brute_force_definition(layout, L, B, vocab, pad, data):
    """`token_relation_rows` (last earlier usable position m(i), eligible iff its key is at or after
    lo(i)) against the definition, on every layout, padding on either side and holes in the middle."""
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, L), generator=g)
    n = torch.randint(1, L + 1, (B, 1), generator=g)
    pos = torch.arange(L)[None, :]
    valid = {"none": torch.ones(B, L, dtype=torch.bool), "left": pos >= L - n, "right": pos < n,
             "holes": torch.rand(B, L, generator=g) < 0.7}[pad]
    got = token_relation_rows(ids, valid, layout)
    want = brute_force_rows(ids, valid, layout)
    assert torch.equal(got[0], want[0]), (ids, valid, layout)
    assert torch.equal(got[1], want[1]), (ids, valid, layout)


@settings(max_examples=40, deadline=None)
@given(layout=LAYOUTS, L=st.integers(1, 20), vocab=st.integers(1, 5), left=st.booleans(), seed=st.integers(0, 999))
def test_the_oracle_is_the_definition_and_zero_on_rows_with_no_such_key(layout, L, vocab, left, seed):
    """The oracle's masses are the brute-force sums over the definition's keys, and a row that
    `token_relation_rows` calls ineligible has mass 0 (so the sum over all rows / the eligible count
    is the mean over eligible rows)."""
    g = torch.Generator().manual_seed(seed)
    B, H, D = 2, 2, 4
    H_kv = layout.n_key_value_heads or H
    q = torch.randn(B, H, L, D, generator=g) * 2
    k = torch.randn(B, H_kv, L, D, generator=g) * 2
    pos = torch.arange(L)[None, :]
    n = torch.tensor([[L], [max(1, L // 2)]])
    valid = pos >= L - n if left else pos < n
    ids = torch.randint(0, vocab, (B, L), generator=g)
    _, s = attention_stats_eager(q, k, k, valid, torch.zeros(B, L, dtype=torch.long), SPEC, layout=layout,
                                 token_ids=ids)
    p = visible_probs(q, k, valid, layout)  # (B, H, L, L)
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    for b in range(B):
        real = torch.where(valid[b], ids[b], -1)
        prev = torch.cat([torch.tensor([-1]), real[:-1]])
        dup = (real[None, :] == real[:, None]) & (j < i) & valid[b][:, None]
        pre = (prev[None, :] == real[:, None]) & (j <= i) & valid[b][:, None]
        torch.testing.assert_close(s.duplicate_mass[b], (p[b] * dup).sum(-1), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(s.prefix_match_mass[b], (p[b] * pre).sum(-1), atol=1e-6, rtol=1e-6)
    elig_dup, elig_pre = token_relation_rows(ids, valid, layout)
    assert float(s.duplicate_mass.masked_fill(elig_dup[:, None], 0).abs().max()) == 0.0
    assert float(s.prefix_match_mass.masked_fill(elig_pre[:, None], 0).abs().max()) == 0.0


def test_a_backend_without_token_ids_says_so():
    q = torch.zeros(1, 1, 3, 2)
    valid = torch.ones(1, 3, dtype=torch.bool)
    for fn in BACKENDS.values():
        with pytest.raises(ValueError, match="token ids"):
            fn(q, q, q, valid, torch.zeros(1, 3, dtype=torch.long), SPEC)


def _batch(spec, layers, ids, valid, classes):
    return BatchContext(indices=list(range(ids.shape[0])), segments=[None] * ids.shape[0], inputs={},
                        key_valid=valid, key_class=torch.zeros_like(ids), classes=classes, spec=spec, layers=layers,
                        token_ids=ids)


def test_head_stats_means_over_eligible_rows_and_their_counts(tmp_path):
    """`HeadStats.token_relation_means`: per head, the masses summed over the rows divided by the
    eligible rows of each layer's layout; saved, loaded and merged like the other sums."""
    classes = TokenClasses.of(("other",))
    spec = StatsSpec(n_key_classes=1, token_relations=True)
    g = torch.Generator().manual_seed(0)
    B, H, L = 3, 2, 12
    ids = torch.randint(0, 3, (B, L), generator=g)
    valid = torch.arange(L)[None, :] >= torch.tensor([[0], [4], [9]])  # left padding
    layouts = [AttentionLayout(causal=True), AttentionLayout(causal=True, window=(2, 0))]
    layers = []
    for layout in layouts:
        q, k = torch.randn(B, H, L, 4, generator=g), torch.randn(B, H, L, 4, generator=g)
        layers.append(attention_stats_eager(q, k, k, valid, torch.zeros(B, L, dtype=torch.long), spec, layout=layout,
                                            token_ids=ids)[1])
    acc = HeadStats(2, H, spec, classes)
    acc.add(_batch(spec, layers, ids, valid, classes))
    means = acc.token_relation_means()
    assert set(means) == {"duplicate_mass", "prefix_match_mass"}
    for layer, (layout, stats) in enumerate(zip(layouts, layers)):
        for name, rows in zip(means, token_relation_rows(ids, valid, layout)):
            mean, count = means[name]
            assert mean.shape == count.shape == (2, H)
            assert (count[layer] == float(rows.sum())).all()
            per_head = (getattr(stats, name).double() * rows[:, None]).sum((0, 2)) / rows.sum()
            np.testing.assert_allclose(mean[layer], per_head.numpy(), rtol=1e-12)
    assert means["duplicate_mass"][1][1, 0] <= means["duplicate_mass"][1][0, 0]  # the window hides copies
    acc.save(tmp_path / "s.npz")
    back = HeadStats.load(tmp_path / "s.npz")
    assert back.spec.token_relations and back.duplicate_rows is not None
    np.testing.assert_array_equal(back.token_relation_means()["prefix_match_mass"][0], means["prefix_match_mass"][0])
    back.merge(acc)
    np.testing.assert_allclose(back.token_relation_means()["duplicate_mass"][0], means["duplicate_mass"][0])
    np.testing.assert_array_equal(back.token_relation_means()["duplicate_mass"][1], 2 * means["duplicate_mass"][1])
    plain = HeadStats(2, H, StatsSpec(n_key_classes=1, entropy=True), classes)
    assert plain.duplicate_rows is None and "duplicate_rows" not in plain.arrays
    from bertscope.engine.accumulate import NotComputedError

    with pytest.raises(NotComputedError, match="token_relations"):
        plain.token_relation_means()


def test_equal_to_the_induction_analysis_scores_on_repeated_random_tokens():
    """The issue's equality: on BOS + x_1..x_T + x_1..x_T, each head's mean `duplicate_mass` and
    `prefix_match_mass` over eligible rows are `heads induction`'s duplicate and induction scores
    (p_{i, i-T} and p_{i, i-T+1} averaged over the repeated rows), on a tiny causal model with grouped
    key/value heads. The halves are drawn *without* repeats (and without the BOS): then the only
    earlier copy of a repeated row's token is at i - T, the only key after a copy is i - T + 1, and
    no row of the first half has either, so the eligible rows are exactly the repeated ones.
    (`random_sequences` draws with replacement: a token repeated inside a half would add mass at
    other keys to the token relations and not to the offset scores.)"""
    from bertscope.analyses.heads.induction.stats import InductionScores, RepeatedSequence, induction_spec
    from bertscope.models.attention import HeadProbe
    from bertscope.models.tiny import HEADS, LAYERS, PARITY_VOCAB, build

    T, N, bos = 7, 3, 1
    rng = np.random.default_rng(0)
    pool = np.arange(4, PARITY_VOCAB)
    seqs = [np.concatenate([[bos], x, x]) for x in (rng.choice(pool, size=T, replace=False) for _ in range(N))]
    ids = torch.tensor(np.stack(seqs))  # (N, 2T + 1)
    layout = RepeatedSequence(T, bos=True)
    spec = induction_spec(T, 1).union(StatsSpec(n_key_classes=1, token_relations=True))
    model = build("llama")
    valid = torch.ones_like(ids, dtype=torch.bool)
    layers = []
    probe = HeadProbe(LAYERS, HEADS, spec, backend="chunked")
    with torch.no_grad(), probe.active(torch.zeros_like(ids), lambda layer, s, kv: layers.append(s), token_ids=ids):
        model(input_ids=ids, attention_mask=valid.long(), use_cache=False)
    classes = TokenClasses.of(("other",))
    batch = _batch(spec, layers, ids, valid, classes)
    scores = InductionScores(LAYERS, HEADS, layout)
    scores.add(batch)
    acc = HeadStats(LAYERS, HEADS, spec, classes)
    acc.add(batch)
    means = acc.token_relation_means()
    got = scores.scores()
    np.testing.assert_allclose(means["duplicate_mass"][0], got["duplicate"], rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(means["prefix_match_mass"][0], got["induction"], rtol=1e-6, atol=1e-9)
    assert (means["duplicate_mass"][1] == N * T).all() and (means["prefix_match_mass"][1] == N * T).all()
    assert float(got["induction"].max()) > 0  # not an empty equality
