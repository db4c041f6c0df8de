"""Michel et al. (2019) ablation, the numbers behind `bertscope heads ablate`.

Masking head h of layer l sets its gate xi_h = 0: the head's slice of the attention output is
zeroed before the output projection, so the layer computes sum_{h' != h} W_o^h' Att_h'(x).
Two variant sets, each against the unmasked model on the same examples (`bertscope.analyses.heads.common`
writes one row per variant: accuracy, delta, exact interval (McNemar inverted), McNemar, BH q):

    single    one head masked, every head in turn (Michel's "ablating one head").
    but-one   in one layer, every head masked but h, for every layer and every h ("ablating
              all heads but one"); the layer's best kept head is the one whose variant scores
              highest: Michel's per-layer table gives that head's delta.

Importance vs ablation: Michel's importance I_h is a first-order estimate of the loss change
when h is masked, so it should rank heads as the measured drop does. The check is Spearman's
rank correlation between I_h (from `bertscope heads importance`'s importance.csv) and the
ablation effect -delta (the accuracy the model loses without h); ranks, not values, because
importance is a loss-gradient scale and accuracy moves in steps of 1/N with many ties.
"""
from __future__ import annotations

import numpy as np

BUT_ONE_COLUMNS = ("layer", "best_head", "accuracy", "delta", "ci_low", "ci_high", "q", "significant",
                   "worst_head", "worst_delta", "mean_delta", "heads_within")
HALF_POINT = 0.005  # Michel et al.: most single heads change accuracy by "less than about half a point"


def head_deltas(rows: list[dict], n_layers: int, n_heads: int, kind: str = "head") -> np.ndarray:
    """(layers, H) delta of each `kind` variant row (nan where the run has none)."""
    grid = np.full((n_layers, n_heads), np.nan)  # (layers, H)
    for r in rows:
        if r["kind"] == kind:
            grid[int(r["layer"]) - 1, int(r["head"]) - 1] = float(r["delta"])
    return grid


def rank_correlation(importance: np.ndarray, delta: np.ndarray) -> dict:
    """Spearman's rho (ties ranked by their mean) between importance and the ablation effect
    -delta over the heads where both are known, with its two-sided p; rho None when either
    side is constant (every head scored alike)."""
    from scipy.stats import spearmanr  # here: `bertscope heads ablate --help` must not wait for scipy.stats (~0.5 s)

    x, y = np.ravel(importance), -np.ravel(delta)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"spearman": None, "p": None, "heads": len(x)}
    rho, p = spearmanr(x, y)
    return {"spearman": float(rho), "p": float(p), "heads": len(x)}


def but_one_table(rows: list[dict], alpha: float) -> list[dict]:
    """Per layer, from its but-one rows: the best kept head (highest delta, ties to the lower
    head), its interval and q; the worst kept head; the mean delta over the kept heads; and
    how many kept heads stay within half a point of the baseline (delta >= -0.005)."""
    by_layer: dict[int, list[dict]] = {}
    for r in rows:
        if r["kind"] == "but-one":
            by_layer.setdefault(int(r["layer"]), []).append(r)
    table = []
    for layer, rs in sorted(by_layer.items()):
        rs = sorted(rs, key=lambda r: int(r["head"]))
        best = max(rs, key=lambda r: float(r["delta"]))  # max keeps the first of equals: the lower head
        worst = min(rs, key=lambda r: float(r["delta"]))
        deltas = [float(r["delta"]) for r in rs]
        table.append({"layer": layer, "best_head": int(best["head"]), "accuracy": float(best["accuracy"]),
                      "delta": float(best["delta"]), "ci_low": float(best["ci_low"]),
                      "ci_high": float(best["ci_high"]), "q": float(best["q"]),
                      "significant": bool(float(best["q"]) < alpha), "worst_head": int(worst["head"]),
                      "worst_delta": float(worst["delta"]), "mean_delta": float(np.mean(deltas)),
                      "heads_within": sum(d >= -HALF_POINT for d in deltas)})
    return table


def one_head_suffices(table: list[dict]) -> list[int]:
    """The layers whose best kept head alone is not significantly worse than the full model:
    delta >= 0, or a drop with BH q >= alpha (Michel: "for most layers one head is enough")."""
    return [r["layer"] for r in table if r["delta"] >= 0 or not r["significant"]]
