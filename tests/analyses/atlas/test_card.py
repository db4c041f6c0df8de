"""The head card read as a researcher reads it (issue 47, part 3), on hand-built tables whose answer is
known: the types' overlap, the grid's letters, retrieval only over enough answered haystacks, LM
importance shown, the layers figure's sliding-window note, the induction input's length, the
attention column's window, the distance buckets no row could reach, the CSV's precision, and the sinks
by weight against norm (the no-op sinks)."""
from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bertscope.analyses.atlas import card, plots
from bertscope.analyses.atlas import head_types as T
from bertscope.analyses.atlas import stats as A
from bertscope.kernels.spec import AttentionLayout, distance_bucket_names

NAN = math.nan
DOCS = Path(__file__).resolve().parents[3] / "docs" / "atlas.md"


def typed_table(**columns) -> dict:
    """A per-head table of 2 layers x 3 heads with the given rule columns (others 0) and its types."""
    n = 6
    tab = {name: [0.0] * n for name in ("sink_mass", "prev_mass", "induction_score", "duplicate_score",
                                         "local_mass", "entropy_ratio", "retrieval_score", "streaming_error",
                                         "importance")}
    tab["streaming_error"] = [1.0] * n
    tab.update({k: list(v) for k, v in columns.items()})
    tab.update(layer=[1, 1, 1, 2, 2, 2], head=[1, 2, 3, 1, 2, 3], model=["m"] * n, attention=["global"] * n)
    types = T.assign({k: np.asarray(v, float) for k, v in tab.items() if k not in ("model", "attention")})
    tab["types"] = T.type_strings(types)
    tab.update({f"type_{k}": v.astype(int).tolist() for k, v in types.items()})
    return tab


ABOUT = {"model": "m", "decoder": True, "layers": 2, "heads": 3, "kv_heads": 3, "kinds": ["global", "global"],
         "segments": 4, "tokens": 100, "max_len": 32, "quantised": None, "corpus": "wiki",
         "induction": {"sequences": 8, "seq_len": 64, "first": "BOS"}, "retrieval": None,
         "importance": {"segments": 4, "max_len": 256}, "streaming": [4, 256]}


def test_the_grid_letters_differ_without_regard_to_case_and_the_card_has_a_legend():
    """S (sink) and s (streaming-safe) were one key apart in the grid: every letter now differs from every
    other in upper case too, and the Markdown card names them all under the grid."""
    letters = [r.letter for r in T.RULES]
    assert len({x.upper() for x in letters}) == len(letters) == len(T.RULES)
    assert T.RULE["sink"].letter == "S" and T.RULE["streaming-safe"].letter == "W"
    tab = typed_table(sink_mass=[0.9] * 6)
    md = card.markdown(tab, ABOUT, card.headline(tab, ABOUT), figures={"grid": "fig_atlas_grid.png"})
    assert "S sink" in md and "W streaming-safe" in md and card.legend_text() in md


def test_the_card_shows_which_types_share_heads():
    """Sink heads 1-1, 1-2, 1-3, 2-1; streaming-safe 1-1, 1-2, 2-1 (3 of them sinks) and 2-2; broad 2-3."""
    tab = typed_table(sink_mass=[0.9, 0.9, 0.9, 0.9, 0, 0], streaming_error=[0.01, 0.01, 1, 0.01, 0.01, 1],
                      entropy_ratio=[0, 0, 0, 0, 0, 0.9])
    pairs = T.overlap({name: np.asarray(tab[f"type_{name}"], bool) for name in T.TYPES})
    assert pairs == [("sink", "streaming-safe", 3)]
    results = card.headline(tab, ABOUT)
    assert results["overlap"] == [{"types": ["sink", "streaming-safe"], "heads": 3}]
    md = card.markdown(tab, ABOUT, results, figures={})
    assert "## Types that share heads" in md
    assert "| sink + streaming-safe | 3 | 3 of 4 sink, 3 of 4 streaming-safe |" in md
    html = card.html(tab, ABOUT, results, Path("."), {})
    assert "Types that share heads" in html and "3 of 4 sink, 3 of 4 streaming-safe" in html
    alone = typed_table(sink_mass=[0.9] * 6)
    assert "No head carries two types." in card.markdown(alone, ABOUT, card.headline(alone, ABOUT), {})


def cell(answered: bool, hits) -> dict:
    return {"hits": hits, "far_hits": [[0] * 3] * 2, "needle_len": 4, "copied": False, "answered": answered}


@pytest.mark.parametrize("n_answered", [0, 1, 2, 3, 4])
def test_retrieval_rests_on_at_least_three_answered_haystacks(n_answered):
    """Wu et al.'s score is over the retrievals that succeed: with fewer than MIN_ANSWERED answered haystacks
    the column is not measured (None, NaN in the table) and the card says how many were answered; from
    MIN_ANSWERED on it is the mean over the answered ones only (an unanswered haystack's hits left out)."""
    from bertscope.analyses.heads.retrieval.stats import GridScores

    assert T.MIN_ANSWERED == 3
    hit = [[4, 0, 0], [0, 2, 0]]  # 1.0 and 0.5 of the needle, on every answered haystack
    records = [cell(True, hit) for _ in range(n_answered)] + [cell(False, [[0, 4, 4], [4, 4, 4]])] * 2
    grid = GridScores.of(records, 2, 3)
    column = A.retrieval_column(grid)
    about = {**ABOUT, "retrieval": {"needles": ["san-francisco"], "lengths": [1024], "depths": "10,30,50,70,90",
                                    "answer": "greedy",
                                    "answered": {"answered": n_answered, "haystacks": n_answered + 2}}}
    if n_answered < 3:
        assert column is None
        tab = typed_table(retrieval_score=[NAN] * 6)
        why = card.status(tab, about)["retrieval"]
        assert why.startswith(f"not measured: {n_answered} of {n_answered + 2} haystacks answered")
        assert "at least 3" in why
        assert f"{n_answered} of {n_answered + 2} haystacks answered in the model's own words" in \
            dict(card.run_rows(about))["retrieval probe"]
        assert card.headline(tab, about)["counts"]["retrieval"] is None
    else:
        np.testing.assert_array_equal(column, [[1.0, 0, 0], [0, 0.5, 0]])
        tab = typed_table(retrieval_score=column.ravel())
        assert card.status(tab, about)["retrieval"] == ""
        assert card.headline(tab, about)["counts"]["retrieval"] == 2


def test_the_card_shows_lm_importance_in_a_grid_and_the_top_heads():
    imp = [0.1, 0.7, 0.2, 0.9, 0.05, 0.3]
    tab = typed_table(importance=imp)
    results = card.headline(tab, ABOUT)
    assert [t["head"] for t in results["top_importance"][:3]] == ["2-1", "1-2", "2-3"]
    md = card.markdown(tab, ABOUT, results, figures={})
    assert "## LM importance" in md
    assert "| 1 | 0.10 | 0.70 | 0.20 |" in md and "| 2 | 0.90 | 0.05 | 0.30 |" in md
    assert "| LM importance (not a type) | 2-1 (0.900), 1-2 (0.700), 2-3 (0.300)" in md
    html = card.html(tab, ABOUT, results, Path("."), {})
    assert "<h2>LM importance</h2>" in html and ">0.90</td>" in html
    encoder = {**ABOUT, "decoder": False, "importance": None}
    nothing = typed_table(importance=[NAN] * 6)
    md = card.markdown(nothing, encoder, card.headline(nothing, encoder), figures={})
    assert "not applicable: an encoder" in md.split("## LM importance")[1].split("##")[0]
    off = {**ABOUT, "importance": None}
    assert "not run (--no-importance)" in card.markdown(nothing, off, card.headline(nothing, off), figures={})


def layer_rows(kinds):
    return [{"layer": i + 1, "attention": k, "sink_mass": 0.5, "prev_mass": 0.1, "local_mass": 0.2,
             "entropy_ratio": 0.4, "mean_distance": 3.0, **{f"n_{t}": 1 for t in T.TYPES}} for i, k in enumerate(kinds)]


def test_the_layers_figure_names_sliding_window_layers_only_where_there_are_some():
    import matplotlib.pyplot as plt

    for kinds, grey in ((["global", "global"], False), (["window 512", "global"], True)):
        fig = plots.plot_layers(layer_rows(kinds), {**ABOUT, "kinds": kinds})
        assert ("sliding-window" in fig._suptitle.get_text()) == grey
        plt.close(fig)
        assert ("sliding-window" in card.layers_caption({"kinds": kinds})) == grey


def test_the_induction_input_says_its_length():
    assert card.induction_text({"sequences": 8, "seq_len": 64, "first": "BOS"}) == \
        "8 sequences of 129 tokens each: BOS, then 64 random tokens, then the same 64 again"
    assert card.induction_text({"sequences": 2, "seq_len": 8, "first": None}) == \
        "2 sequences of 16 tokens each: 8 random tokens, then the same 8 again"
    assert "sequences of 129 tokens each" in dict(card.run_rows(ABOUT))["induction probe"]


def test_the_attention_column_says_which_keys_a_window_covers():
    assert A.layer_kind(AttentionLayout(causal=True)) == "global"
    assert A.layer_kind(AttentionLayout(causal=True, window=(511, 0))) == "window 512"  # the query and 511 before
    assert A.layer_kind(AttentionLayout(causal=False, window=(8, 8))) == "window ±8 (17 keys)"  # ModernBERT's
    assert A.layer_kind(AttentionLayout(causal=False, window=(3, 1))) == "window -3/+1 (5 keys)"
    from bertscope.analyses.heads.retrieval.command import window_keys  # the plan's time estimate reads them

    assert [window_keys(A.layer_kind(AttentionLayout(causal=c, window=w))) for c, w in
            ((True, None), (True, (511, 0)), (False, (8, 8)))] == [None, 512, 17]


def test_distance_buckets_no_row_could_reach_are_marked():
    """Rows in position buckets up to 512-1023 (1,024-token segments): every bucket from 1024-2047 on is
    beyond any row; a window of 512 keys (511 to the left) reaches 256-511 and no further."""
    names = distance_bucket_names()
    rows_bucket = np.zeros((1, 11))
    rows_bucket[0, [0, 5, 10]] = 1  # rows at positions 0, 16-31 and 512-1023
    stream = SimpleNamespace(sinks=SimpleNamespace(rows_bucket=rows_bucket),
                             positions=SimpleNamespace(n_layers=2, windows=[None, 511]))
    reached = A.reached_buckets(stream)
    assert [n for n, r in zip(names, reached[0]) if r][-1] == "512-1023"
    assert not reached[0, names.index("1024-2047"):].any()
    assert [n for n, r in zip(names, reached[1]) if r][-1] == "256-511"


def test_the_csv_cells_keep_every_digit():
    rows = A.csv_cells([{"x": 0.1 + 0.2, "y": NAN, "n": 3, "t": "a", "z": np.float64(1 / 3)}])
    assert rows == [{"x": "0.30000000000000004", "y": "", "n": 3, "t": "a", "z": "0.3333333333333333"}]
    assert float(rows[0]["z"]) == 1 / 3


def test_every_column_of_atlas_layers_csv_has_its_unit_in_the_docs():
    """docs/atlas.md's table of atlas_layers.csv names every column (n_<type> once for all types) with a
    unit, as outputs.LAYER_COLUMNS does."""
    from bertscope.analyses.atlas.outputs import LAYER_COLUMNS

    docs = DOCS.read_text(encoding="utf-8")
    section = docs.split("`atlas_layers.csv` columns")[1].split("\n## ")[0]
    documented = {}
    for line in section.splitlines():
        m = re.match(r"\| ([^|]*`[^|]*) \| ([^|]*) \|", line)
        if m:
            for name in re.findall(r"`([^`]+)`", m.group(1)):
                documented[name] = m.group(2).strip()
    want = {("n_<type>" if c.startswith("n_") else c) for c in A.layer_columns()}
    assert want == set(LAYER_COLUMNS)
    assert want <= set(documented), want - set(documented)
    assert all(documented[c] for c in want if c not in ("layer", "attention"))


def test_the_card_sets_each_sink_heads_weight_beside_its_norm_share_and_lists_the_no_op_sinks():
    """Sinks 1-1 (weight 0.9, norm 0.05), 1-2 (0.5, 0.4) and 2-1 (0.4, 0.1: at the bar); 1-3 and 2-2 have tiny
    norm shares but are no sinks: two no-op sinks, 1-1 and 2-1, and the top no-op sinks are sinks only."""
    tab = typed_table(sink_mass=[0.9, 0.5, 0.1, 0.4, 0.0, 0.2], sink_mass_norm=[0.05, 0.4, 0.0, T.NOOP_SINK, 0.0, 0.3])
    assert card.sink_norm_rows(tab) == [("1-1", 0.9, 0.05, pytest.approx(0.05 / 0.9), True),
                                        ("1-2", 0.5, 0.4, pytest.approx(0.8), False),
                                        ("2-1", 0.4, T.NOOP_SINK, pytest.approx(0.25), True)]
    results = card.headline(tab, ABOUT)
    assert results["counts"]["no-op-sink"] == 2 and results["counts"]["sink"] == 3
    assert [t["head"] for t in results["top"]["no-op-sink"]] == ["1-1", "2-1", "1-2"]
    assert results["thresholds"]["no-op-sink"] == {"column": "sink_mass_norm", "threshold": T.NOOP_SINK,
                                                   "at_most": True, "within": "sink"}
    line = "2 of 3 sink heads are no-op sinks: 1-1, 2-1."
    md = card.markdown(tab, ABOUT, results, figures={})
    assert "## Sinks: weight against norm" in md and line in md
    assert "| 1-1 | 0.900 | 0.050 | 0.06 | yes |" in md and "| 1-2 | 0.500 | 0.400 | 0.80 |  |" in md
    assert "| N no-op-sink | `sink_mass_norm <= 0.1, and sink` | 2 of 6 |" in md
    html = card.html(tab, ABOUT, results, Path("."), {})
    assert "<h2>Sinks: weight against norm</h2>" in html and line in html and "Kobayashi et al. 2020" in html
    assert "<tr><td>2-1</td><td>0.400</td><td>0.100</td><td>0.25</td><td>yes</td></tr>" in html


def test_sink_norms_not_measured_say_so_and_type_no_head():
    """No norm shares (--no-norms, or the triton backend): the column is NaN, no head is a no-op sink, the
    type reads "not measured in this run" with why, and the sink table is left out."""
    tab = typed_table(sink_mass=[0.9] * 6, sink_mass_norm=[NAN] * 6)
    assert not any(tab["type_no-op-sink"])
    results = card.headline(tab, ABOUT)
    assert results["counts"]["no-op-sink"] is None and "no-op-sink" not in results["top"]
    assert results["not_measured"]["no-op-sink"] == f"{card.NOT_MEASURED} ({card.NORMS_OFF})"
    assert card.sink_norm_rows(tab) == []
    md = card.markdown(tab, ABOUT, results, figures={})
    assert f"No-op sinks: {card.NOT_MEASURED} (" in md and "| head | sink_mass (weight)" not in md
    html = card.html(tab, ABOUT, results, Path("."), {})
    assert "not measured in this run" in html.split("<h2>Sinks: weight against norm</h2>")[1].split("<h2>")[0]
