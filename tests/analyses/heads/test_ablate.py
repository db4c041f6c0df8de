"""`bertscope heads ablate` (Michel et al. 2019): zero-gated variants against models built by
hand, a head with a zero output projection, all-but-one variants against one-by-one
evaluation, the rank correlation and the per-layer table on known inputs, the command end to
end on a tiny checkpoint, and its one-line errors."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import TINY_HEADS, TINY_LAYERS
from test_disable import LOGIT_TOL, blas, classifier, random_inputs, tiny_classifier_checkpoint, toy_task  # noqa: F401 (fixtures)

from bertscope.analyses.heads.ablate.stats import (
    BUT_ONE_COLUMNS,
    but_one_table,
    head_deltas,
    one_head_suffices,
    rank_correlation,
)
from bertscope.analyses.heads.common import variant_rows
from bertscope.analyses.heads.importance.outputs import COLUMNS as IMPORTANCE_COLUMNS
from bertscope.analyses.heads.importance.outputs import importance_grid, read_importance
from bertscope.analyses.heads.variants import (
    all_but_one,
    baseline,
    evaluate_variants,
    forward_variants,
    single_heads,
)
from bertscope.errors import UserError
from bertscope.kernels.spec import Gate
from bertscope.models.loading import wrap_model

pytestmark = pytest.mark.usefixtures("single_thread")
L_, H_ = TINY_LAYERS, TINY_HEADS
D_ = 32 // TINY_HEADS  # head width of the tiny BERT


def zeroed_by_hand(tokenizer, heads_by_layer: dict[int, list[int]]):
    """The sdpa twin of the tiny classifier with the listed heads' slices of the attention
    output (the context, before W_o) set to zero by a forward hook: Michel's xi_h = 0."""
    twin = classifier(tokenizer, attn="sdpa")
    for layer, heads in heads_by_layer.items():
        def hook(mod, args, out, heads=heads):
            context = out[0].clone()  # (B, L, H * D)
            for h in heads:
                context[..., h * D_: (h + 1) * D_] = 0
            return (context, *out[1:])

        twin.bert.encoder.layer[layer].attention.self.register_forward_hook(hook)
    return twin


def test_zero_gated_single_heads_equal_the_hand_zeroed_model(minilm_tokenizer):
    loaded = wrap_model(classifier(minilm_tokenizer), minilm_tokenizer)
    inputs = random_inputs(minilm_tokenizer)
    variants = single_heads(L_, H_, Gate.ZERO)
    got = forward_variants(loaded, inputs, [baseline(L_, H_)] + variants)
    with torch.no_grad():
        plain = classifier(minilm_tokenizer, attn="sdpa")(**inputs).logits
        torch.testing.assert_close(got[0], plain, atol=1e-5, rtol=1e-5)
        for v, logits in zip(variants, got[1:]):
            want = zeroed_by_hand(minilm_tokenizer, {v.layer - 1: [v.head - 1]})(**inputs).logits
            assert not torch.allclose(want, plain, atol=1e-4), v.name  # every head matters: the test can fail
            torch.testing.assert_close(logits, want, atol=1e-5, rtol=1e-5)


def test_a_head_with_a_zero_output_projection_has_delta_exactly_zero(minilm_tokenizer, blas):  # noqa: F811
    """W_o's columns of head (2, 3) set to zero: masking it leaves the logits (to the BLAS's
    rounding for another batch shape, LOGIT_TOL) and every prediction, so b, c and delta are
    exactly the baseline's; masking a live head does not."""
    model = classifier(minilm_tokenizer)
    layer, head = 1, 2
    with torch.no_grad():
        model.bert.encoder.layer[layer].attention.output.dense.weight[:, head * D_: (head + 1) * D_] = 0
    loaded = wrap_model(model, minilm_tokenizer)
    variants = [baseline(L_, H_)] + single_heads(L_, H_, Gate.ZERO)
    dead = 1 + layer * H_ + head
    inputs = random_inputs(minilm_tokenizer)
    logits = forward_variants(loaded, inputs, variants)
    torch.testing.assert_close(logits[dead], logits[0], **LOGIT_TOL)
    assert not torch.allclose(logits[dead - 1], logits[0], atol=1e-4)  # the head beside it is alive
    res = evaluate_variants(loaded, toy_task(minilm_tokenizer, n=40), variants, batch_size=8, progress=False)
    rows = variant_rows(res, alpha=0.05)
    assert rows[dead]["variant"] == f"{layer + 1}-{head + 1}"
    assert (rows[dead]["delta"], rows[dead]["b"], rows[dead]["c"]) == (0.0, 0, 0)
    assert (rows[dead]["ci_low"], rows[dead]["ci_high"], rows[dead]["p"]) == (0.0, 0.0, 1.0)
    assert any(r["b"] + r["c"] > 0 for r in rows[1:])  # other heads flip predictions


def test_all_but_one_variants_mask_the_rest_of_their_layer():
    variants = all_but_one(3, 4, Gate.ZERO)
    assert len(variants) == 12 and {v.kind for v in variants} == {"but-one"}
    v = variants[4 + 2]  # layer 2, head 3 kept
    assert (v.name, v.layer, v.head) == ("layer 2 only 3", 2, 3)
    want = torch.full((3, 4), int(Gate.KEEP), dtype=torch.int8)
    want[1] = int(Gate.ZERO)
    want[1, 2] = int(Gate.KEEP)
    assert torch.equal(v.codes, want)
    assert single_heads(3, 4, Gate.ZERO)[0].kind == "head"  # disable's rows keep their kind


@pytest.mark.parametrize("kind", ["bert", "albert"])  # cached prefixes, and the batch replicated per variant
def test_all_but_one_batched_equals_one_by_one_and_the_hand_zeroed_model(minilm_tokenizer, kind):
    loaded = wrap_model(classifier(minilm_tokenizer, kind=kind), minilm_tokenizer)
    task = toy_task(minilm_tokenizer)
    variants = [baseline(L_, H_)] + all_but_one(L_, H_, Gate.ZERO)
    one = evaluate_variants(loaded, task, variants, batch_size=6, max_rows=0, progress=False)
    many = evaluate_variants(loaded, task, variants, batch_size=6, max_rows=50, progress=False)
    assert many.forwards < one.forwards
    np.testing.assert_array_equal(many.predictions, one.predictions)
    assert (one.predictions != one.predictions[0]).any()
    if kind != "bert":
        return
    inputs = random_inputs(minilm_tokenizer)
    got = forward_variants(loaded, inputs, variants)
    with torch.no_grad():
        for v, logits in zip(variants[1:], got[1:]):
            others = [h for h in range(H_) if h != v.head - 1]
            want = zeroed_by_hand(minilm_tokenizer, {v.layer - 1: others})(**inputs).logits
            torch.testing.assert_close(logits, want, atol=1e-5, rtol=1e-5)


# --- the numbers on known inputs ------------------------------------------------------------


def test_rank_correlation_known_values():
    imp = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert rank_correlation(imp, -imp / 100)["spearman"] == pytest.approx(1.0)  # effect = -delta: same order
    assert rank_correlation(imp, imp / 100)["spearman"] == pytest.approx(-1.0)
    # ties take their mean rank: x ranks 1..5, y ranks (1.5, 1.5, 3, 4.5, 4.5) -> 9 / sqrt(10 * 9)
    got = rank_correlation(np.arange(1.0, 6.0), -np.array([0.0, 0.0, 0.01, 0.02, 0.02]))
    assert got["spearman"] == pytest.approx(9 / np.sqrt(90)) and got["heads"] == 5 and 0 < got["p"] < 1
    # heads without a delta (nan) are left out; a constant side has no correlation
    part = rank_correlation(np.array([1.0, 2.0, 3.0, 4.0]), -np.array([0.1, 0.3, 0.2, np.nan]))
    assert part["heads"] == 3 and part["spearman"] == pytest.approx(0.5)
    assert rank_correlation(imp, np.zeros((2, 2))) == {"spearman": None, "p": None, "heads": 4}


def but_one_rows(deltas: dict[tuple[int, int], float], q: float = 0.5) -> list[dict]:
    return [{"variant": f"layer {lay} only {h}", "kind": "but-one", "layer": lay, "head": h, "accuracy": 0.8 + d,
             "delta": d, "ci_low": d - 0.02, "ci_high": d + 0.02, "q": q} for (lay, h), d in deltas.items()]


def test_but_one_table_picks_each_layers_best_kept_head():
    rows = [{"kind": "baseline", "layer": "", "head": ""}] + but_one_rows(
        {(1, 1): -0.01, (1, 2): 0.0, (1, 3): 0.0, (2, 1): -0.2, (2, 2): -0.004, (2, 3): -0.1})
    table = but_one_table(rows, alpha=0.05)
    assert [tuple(r) for r in table] == [BUT_ONE_COLUMNS] * 2
    one, two = table
    assert (one["best_head"], one["delta"], one["worst_head"], one["heads_within"]) == (2, 0.0, 1, 2)  # tie: lower head
    assert (two["best_head"], two["worst_head"], two["worst_delta"], two["heads_within"]) == (2, 1, -0.2, 1)
    assert two["mean_delta"] == pytest.approx((-0.2 - 0.004 - 0.1) / 3)
    assert one_head_suffices(table) == [1, 2]  # q = 0.5: not significant
    significant = but_one_table(but_one_rows({(1, 1): -0.05, (2, 1): 0.01}, q=0.001), alpha=0.05)
    assert one_head_suffices(significant) == [2]  # a significant drop in layer 1; layer 2 gains


def test_head_deltas_grid_from_rows():
    rows = [{"kind": "head", "layer": 2, "head": 1, "delta": -0.25}, {"kind": "but-one", "layer": 1, "head": 1,
                                                                        "delta": 0.5}]
    grid = head_deltas(rows, 2, 2)
    assert grid[1, 0] == -0.25 and np.isnan(grid[0]).all() and np.isnan(grid[1, 1])


def write_importance(path, n_layers=L_, n_heads=H_, columns=IMPORTANCE_COLUMNS, seed=0):
    """A tiny importance.csv in `bertscope heads importance`'s format (layer/head from 1)."""
    rng = np.random.default_rng(seed)
    raw = rng.random((n_layers, n_heads))
    norm = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    ranks = np.empty(raw.size, int)
    ranks[np.argsort(-norm.ravel())] = np.arange(1, raw.size + 1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for lay in range(n_layers):
            for h in range(n_heads):
                values = {"layer": lay + 1, "head": h + 1, "importance": norm[lay, h], "importance_raw": raw[lay, h],
                          "rank": ranks[lay * n_heads + h]}
                w.writerow([values.get(c, 0) for c in columns])
    return norm, raw


def test_read_importance_and_its_errors(tmp_path):
    norm, raw = write_importance(tmp_path / "importance.csv")
    table = read_importance(tmp_path)  # a run directory: its importance.csv
    np.testing.assert_allclose(importance_grid(table, L_, H_), norm)
    np.testing.assert_allclose(importance_grid(table, L_, H_, "importance_raw"), raw)
    with pytest.raises(UserError, match="no importance file at .*nowhere"):
        read_importance(tmp_path / "nowhere")
    write_importance(tmp_path / "bad.csv", columns=("layer", "head", "score"))
    with pytest.raises(UserError, match="lacks the column.s. importance, importance_raw, rank"):
        read_importance(tmp_path / "bad.csv")
    (tmp_path / "text.csv").write_text("layer,head,importance,importance_raw,rank\n1,one,0.5,0.5,1\n")
    with pytest.raises(UserError, match="line 2: layer and head must be integers"):
        read_importance(tmp_path / "text.csv")
    (tmp_path / "twice.csv").write_text("layer,head,importance,importance_raw,rank\n1,1,1,1,1\n1,1,2,2,2\n")
    with pytest.raises(UserError, match="head 1-1 appears twice"):
        read_importance(tmp_path / "twice.csv")
    write_importance(tmp_path / "big.csv", n_layers=3)
    with pytest.raises(UserError, match="covers 12 heads .up to layer 3, head 4.; the model has 2 layers x 4 heads"):
        importance_grid(read_importance(tmp_path / "big.csv"), L_, H_)


# --- the command --------------------------------------------------------------------------


def read_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_ablate_command_on_rte_with_importance_in_the_run_directory(tiny_classifier_checkpoint, tmp_path):  # noqa: F811
    from conftest import require_data

    from bertscope.cli.main import main
    from bertscope.run.analysis_run import AnalysisRun

    require_data("rte")
    out = tmp_path / "run"
    # a run directory that `heads importance` already wrote to: run.json and importance.csv
    AnalysisRun("importance", type("A", (), {"out": str(out), "quiet": True})())
    norm, _ = write_importance(out / "importance.csv")
    assert main(["heads", "ablate", "--model", str(tiny_classifier_checkpoint), "--task", "rte", "--limit", "30",
                 "--out", str(out), "--quiet"]) == 0
    rows = read_csv(out / "ablate.csv")
    assert len(rows) == 1 + 2 * L_ * H_
    assert [r["kind"] for r in rows] == ["baseline"] + ["head"] * L_ * H_ + ["but-one"] * L_ * H_
    assert (rows[1]["variant"], rows[1 + L_ * H_]["variant"]) == ("1-1", "layer 1 only 1")
    base = float(rows[0]["accuracy"])
    for r in rows[1:]:
        assert float(r["ci_low"]) <= float(r["delta"]) + 1e-9 <= float(r["ci_high"]) + 2e-9
        assert abs(float(r["delta"]) - (int(r["c"]) - int(r["b"])) / 30) < 1e-5
        assert abs(float(r["accuracy"]) - base - float(r["delta"])) < 1e-5
    table = read_csv(out / "ablate_but_one.csv")
    for t in table:
        layer_rows = [r for r in rows if r["kind"] == "but-one" and r["layer"] == t["layer"]]
        assert float(t["delta"]) == pytest.approx(max(float(r["delta"]) for r in layer_rows))
    entry = json.loads((out / "run.json").read_text())["analyses"]["ablate"]
    results = entry["results"]
    assert entry["status"] == "complete" and results["gate"] == "zero" and results["variant_set"] == "both"
    assert [r["layer"] for r in results["but_one"]["per_layer"]] == list(range(1, L_ + 1))
    deltas = np.array([float(r["delta"]) for r in rows if r["kind"] == "head"]).reshape(L_, H_)
    assert results["importance"]["file"] == str(out / "importance.csv")
    assert results["importance"]["importance"] == rank_correlation(norm, deltas)
    assert {"ablate.csv", "ablate_but_one.csv", "fig_ablate_heads.png", "fig_ablate_hist.png",
            "fig_ablate_but_one.png", "fig_ablate_importance.png"} <= set(entry["outputs"])
    assert "Ablating heads (Michel et al. 2019)" in (out / "index.html").read_text()


def test_ablate_command_single_heads_then_but_one_only(tiny_classifier_checkpoint, tmp_path):  # noqa: F811
    from conftest import require_data

    from bertscope.cli.main import main

    require_data("rte")
    write_importance(tmp_path / "imp.csv", seed=3)
    out = tmp_path / "run"
    assert main(["heads", "ablate", "--model", str(tiny_classifier_checkpoint), "--task", "rte", "--limit", "12",
                 "--variants", "single", "--importance", str(tmp_path / "imp.csv"), "--out", str(out), "--quiet",
                 "--no-figures"]) == 0
    rows = read_csv(out / "ablate.csv")
    assert len(rows) == 1 + L_ * H_ and not (out / "ablate_but_one.csv").exists()
    results = json.loads((out / "run.json").read_text())["analyses"]["ablate"]["results"]
    assert "but_one" not in results and results["importance"]["importance_raw"]["heads"] == L_ * H_
    # but-one alone: the importance file in the run directory is not used (no single heads to compare)
    (out / "importance.csv").write_text((tmp_path / "imp.csv").read_text())
    assert main(["heads", "ablate", "--model", str(tiny_classifier_checkpoint), "--task", "rte", "--limit", "12",
                 "--variants", "but-one", "--out", str(out), "--quiet", "--no-figures"]) == 0
    rows = read_csv(out / "ablate.csv")
    assert [r["kind"] for r in rows] == ["baseline"] + ["but-one"] * L_ * H_
    results = json.loads((out / "run.json").read_text())["analyses"]["ablate"]["results"]
    assert "importance" not in results and "heads_within_half_point" not in results
    assert len(results["but_one"]["per_layer"]) == L_


def test_ablate_command_user_errors(tiny_classifier_checkpoint, tmp_path, capsys):  # noqa: F811
    from conftest import require_data

    from bertscope.cli.main import main

    require_data("rte")
    write_importance(tmp_path / "cols.csv", columns=("layer", "head", "score"))
    write_importance(tmp_path / "big.csv", n_layers=L_ + 1)
    write_importance(tmp_path / "ok.csv")
    cases = ((["--importance", str(tmp_path / "missing")], "no importance file at"),
             (["--importance", str(tmp_path / "cols.csv")], "lacks the column(s) importance, importance_raw, rank"),
             (["--importance", str(tmp_path / "big.csv")], "the model has 2 layers x 4 heads"),
             (["--importance", str(tmp_path / "ok.csv"), "--variants", "but-one"], "use --variants single or both"),
             (["--max-rows", "-1"], "--max-rows must be >= 0"))
    for extra, match in cases:
        code = main(["heads", "ablate", "--model", str(tiny_classifier_checkpoint), "--task", "rte", "--limit", "5",
                     "--out", str(tmp_path / "o"), "--quiet", *extra])
        err = capsys.readouterr().err
        assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err, (extra, err)
    assert not (tmp_path / "o" / "ablate.csv").exists()  # every error came before the evaluation
    with pytest.raises(SystemExit) as exit_info:
        main(["heads", "ablate", "--model", str(tiny_classifier_checkpoint), "--task", "rte", "--variants", "two"])
    assert exit_info.value.code == 2 and "invalid choice: 'two'" in capsys.readouterr().err
