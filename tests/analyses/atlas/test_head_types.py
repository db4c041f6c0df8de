"""The atlas's typing rules and comparison maths on hand-built inputs whose answer is known."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bertscope.analyses.atlas import card
from bertscope.analyses.atlas import head_types as T
from bertscope.analyses.atlas.compare import pca

NAN = math.nan


def table(**columns):
    return {k: np.asarray(v, dtype=float) for k, v in columns.items()}


def test_each_rule_at_its_threshold_and_nan_types_nothing():
    t = table(sink_mass=[T.SINK, T.SINK - 1e-9, NAN, 0.9], prev_mass=[T.PREVIOUS, 0.49, 0.0, NAN],
              induction_score=[0.0, T.INDUCTION, NAN, 0.0], duplicate_score=[T.DUPLICATE, 0.0, 0.0, 0.0],
              retrieval_score=[NAN] * 4, local_mass=[0.9, 0.9, 0.1, 0.0], entropy_ratio=[0.1, 0.1, T.BROAD, 1.0],
              streaming_error=[T.STREAMING_SAFE, 0.2, NAN, 0.0])
    types = T.assign(t)
    assert types["sink"].tolist() == [True, False, False, True]
    assert types["previous-token"].tolist() == [True, False, False, False]
    assert types["induction"].tolist() == [False, True, False, False]
    assert types["duplicate"].tolist() == [True, False, False, False]
    assert not types["retrieval"].any()  # NaN: not measured, never typed
    assert types["local"].tolist() == [False, True, False, False]  # head 0 is local by mass but a sink
    assert types["broad"].tolist() == [False, False, True, True]
    assert types["streaming-safe"].tolist() == [True, False, False, True]  # an error: at or below
    assert T.type_strings(types) == ["duplicate+previous-token+sink+streaming-safe", "induction+local", "broad",
                                     "sink+broad+streaming-safe"]
    assert T.first_type(types) == ["duplicate", "induction", "broad", "sink"]
    measured = T.measured(t)
    assert not measured["retrieval"] and measured["sink"]


def past(rule: T.Rule) -> float:
    """Just on the wrong side of a rule's threshold."""
    return rule.threshold + (1e-9 if rule.below else -1e-9)


@pytest.mark.parametrize("rule", T.RULES, ids=lambda r: r.name)
def test_each_rule_holds_at_its_threshold_not_past_it_and_not_on_nan(rule):
    """Every type of the table: at its threshold, just past it, not measured; a type that refines another
    (`Rule.within`) holds only on that type's heads."""
    columns = {rule.column: [rule.threshold, past(rule), NAN]}
    parent = T.RULE.get(rule.within)
    if parent is not None:
        columns[parent.column] = [parent.threshold] * 3
    assert T.assign(table(**columns))[rule.name].tolist() == [True, False, False]
    if parent is not None:  # the same column, on heads that are not of the type it refines
        columns[parent.column] = [past(parent)] * 3
        assert not T.assign(table(**columns))[rule.name].any()
    assert T.measured(table(**{rule.column: [NAN] * 3}))[rule.name] is False


def test_a_no_op_sink_is_a_sink_whose_sink_tokens_add_little_by_norm():
    """Kobayashi et al.'s contrast on four heads: a sink by weight whose sink tokens give 0.05 of its weighted
    value norms (a no-op sink); a sink whose norm share is 0.6 (a sink that reads its sink token: not); a head
    with a small norm share that is no sink by weight (not); a sink whose norm share was not measured (not)."""
    t = table(sink_mass=[0.9, 0.9, 0.1, 0.6], sink_mass_norm=[0.05, 0.6, 0.01, NAN])
    types = T.assign(t)
    assert types["sink"].tolist() == [True, True, False, True]
    assert types["no-op-sink"].tolist() == [True, False, False, False]
    assert T.type_strings(types)[:2] == ["no-op-sink+sink", "sink"]
    assert T.first_type(types)[:2] == ["no-op-sink", "sink"]  # the finer type colours the grid
    assert T.overlap(types) == []  # a type and the one it refines are no pair: every no-op sink is a sink
    assert T.measured(t)["no-op-sink"]
    assert T.RULE["no-op-sink"].text() == f"sink_mass_norm <= {T.NOOP_SINK:g}, and sink"
    unmeasured = table(sink_mass=[0.9, 0.9], sink_mass_norm=[NAN, NAN])  # --no-norms, or the triton backend
    assert not T.assign(unmeasured)["no-op-sink"].any() and not T.measured(unmeasured)["no-op-sink"]


def test_a_missing_column_types_nothing():
    types = T.assign(table(sink_mass=[0.5, 0.1]))
    assert types["sink"].tolist() == [True, False]
    assert not any(types[n].any() for n in T.TYPES if n != "sink")


def test_every_threshold_is_documented_in_one_place():
    import inspect

    source = inspect.getsource(T)
    for name in ("SINK", "PREVIOUS", "DUPLICATE", "INDUCTION", "RETRIEVAL", "STREAMING_SAFE", "BROAD", "LOCAL",
                 "NOOP_SINK"):
        assert f'{name} = {getattr(T, name)}\n"""' in source, name
    assert {r.threshold for r in T.RULES} == {T.SINK, T.PREVIOUS, T.DUPLICATE, T.INDUCTION, T.RETRIEVAL,
                                              T.STREAMING_SAFE, T.BROAD, T.LOCAL, T.NOOP_SINK}
    assert f'MIN_ANSWERED = {T.MIN_ANSWERED}\n"""' in source  # the retrieval type's answered haystacks


@pytest.mark.parametrize("decoder", [True, False])
def test_the_card_says_what_was_not_measured_and_why(decoder):
    n = 4
    cols = {name: [0.0] * n for name in ("sink_mass", "prev_mass", "induction_score", "duplicate_score",
                                          "local_mass", "entropy_ratio")}
    cols.update(retrieval_score=[NAN] * n, streaming_error=[NAN] * n)
    tab = {**cols, "layer": [1, 1, 2, 2], "head": [1, 2, 1, 2]}
    types = T.assign({k: np.asarray(v, float) for k, v in tab.items()})
    tab.update({f"type_{k}": v.astype(int).tolist() for k, v in types.items()})
    why = card.status(tab, {"decoder": decoder})
    assert why["sink"] == ""
    assert why["no-op-sink"].startswith(card.NOT_MEASURED) and "--no-norms" in why["no-op-sink"]
    if decoder:
        assert why["retrieval"] == why["streaming-safe"] == card.NOT_MEASURED
    else:
        assert why["retrieval"].startswith("not applicable") and why["streaming-safe"].startswith("not applicable")


def test_pca_separates_two_clusters_and_drops_empty_or_flat_features():
    rng = np.random.default_rng(0)
    a = rng.normal(0, 0.01, (10, 3)) + [1, 0, 1]
    b = rng.normal(0, 0.01, (10, 3)) + [0, 1, 0]
    X = np.concatenate([np.concatenate([a, b]), np.full((20, 1), np.nan), np.ones((20, 1))], 1)
    pts, explained, used = pca(X)
    assert used.tolist() == [True, True, True, False, False]
    assert explained[0] > 0.9
    side = np.sign(pts[:, 0])
    assert (side[:10] == side[0]).all() and (side[10:] == -side[0]).all()


def test_the_streaming_columns_repeat_each_kv_groups_error_over_its_heads():
    """`HeadStats.streaming_error` per query head and per KV group (2 layers, 4 query heads in 2 groups):
    the columns are the per-head errors and each group's, repeated over its heads; NaN when the run did
    not compute the statistic."""
    from types import SimpleNamespace

    from bertscope.analyses.atlas.stats import streaming_columns
    from bertscope.engine.accumulate import NotComputedError

    per = np.array([[0.5, 1.0, 0.0, 1.0], [0.0, 0.0, 0.5, 0.5]])
    kv = np.array([[0.8, 0.9], [0.0, 0.5]])
    heads = SimpleNamespace(n_layers=2, n_heads=4, streaming_error=lambda kv_heads=False: kv if kv_heads else per)
    cols = streaming_columns(heads, n_kv_heads=2)
    np.testing.assert_array_equal(cols["streaming_error"], per)
    np.testing.assert_array_equal(cols["streaming_error_kv"], [[0.8, 0.8, 0.9, 0.9], [0.0, 0.0, 0.5, 0.5]])

    def not_computed(kv_heads=False):
        raise NotComputedError("streaming_error")

    missing = streaming_columns(SimpleNamespace(n_layers=2, n_heads=4, streaming_error=not_computed), n_kv_heads=2)
    assert np.isnan(missing["streaming_error"]).all() and missing["streaming_error"].shape == (2, 4)


def test_the_token_match_columns_are_nan_where_no_row_has_such_a_key():
    """`HeadStats.token_relation_means` gives each head's mean over its rows that have an earlier copy of
    their token, and those rows per layer: a layer with no such row is NaN, not 0; the row counts come
    once per layer (`token_match_rows`); the statistic not computed is NaN throughout (rows: None)."""
    from types import SimpleNamespace

    from bertscope.analyses.atlas import stats as A
    from bertscope.engine.accumulate import NotComputedError

    mean = np.array([[0.5, 0.25], [0.0, 0.0]])
    rows = np.array([[6.0, 6.0], [0.0, 0.0]])
    means = {"duplicate_mass": (mean, rows), "prefix_match_mass": (mean / 2, rows),
             "duplicate_mass_norm": (mean / 4, rows), "prefix_match_mass_norm": (mean / 8, rows)}  # with norms
    heads = SimpleNamespace(n_layers=2, n_heads=2, token_relation_means=lambda: means)
    assert A.token_match_spec() == {"token_relations": True}
    cols = A.token_match_columns(heads)
    np.testing.assert_allclose(cols["duplicate_mass"], [[0.5, 0.25], [np.nan, np.nan]])
    np.testing.assert_allclose(cols["prefix_match_mass"], [[0.25, 0.125], [np.nan, np.nan]])
    assert set(cols) == {"duplicate_mass", "prefix_match_mass"}  # the row counts are per layer, not per head
    assert A.token_match_rows(heads) == {"duplicate_rows": [6, 0], "prefix_match_rows": [6, 0]}  # not the twins'

    def not_computed():
        raise NotComputedError("duplicate_mass")

    missing = SimpleNamespace(n_layers=2, n_heads=2, token_relation_means=not_computed)
    assert all(np.isnan(v).all() for v in A.token_match_columns(missing).values())
    assert A.token_match_rows(missing) is None
