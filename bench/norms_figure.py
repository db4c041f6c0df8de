"""docs/norms_minilm.png and its table: per layer, the mean over heads of each key kind's attention weight
and norm-based share ([CLS], [SEP], "." and ",", the other tokens), read from a `bertscope run --norms`
heads.csv, in the style of Kobayashi et al. (2020)'s weight-based against norm-based comparison.

    python bench/norms_figure.py RUN_DIR [--out docs/norms_minilm.png]
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

KINDS = (("cls", "[CLS]"), ("sep", "[SEP]"), ("punct", '"." and ","'), ("other", "other tokens"))


def by_layer(rows: list[dict], col: str) -> list[float]:
    layers = sorted({int(r["layer"]) for r in rows})
    return [sum(float(r[col]) for r in rows if int(r["layer"]) == ly) / sum(int(r["layer"]) == ly for r in rows)
            for ly in layers]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--out", type=Path, default=Path("docs/norms_minilm.png"))
    p.add_argument("--title", default="all-MiniLM-L6-v2, Wikipedia")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.run / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    layers = sorted({int(r["layer"]) for r in rows})
    fig, axes = plt.subplots(1, len(KINDS), figsize=(13, 3.2), sharex=True)
    print("| layer | " + " | ".join(f"{name} weight | {name} norm" for _, name in KINDS) + " |")
    print("|---|" + "---|---|" * len(KINDS))
    table = {col: (by_layer(rows, col), by_layer(rows, f"{col}_norm")) for col, _ in KINDS}
    for i, ly in enumerate(layers):
        print(f"| {ly} | " + " | ".join(f"{table[c][0][i]:.3f} | {table[c][1][i]:.3f}" for c, _ in KINDS) + " |")
    for ax, (col, name) in zip(axes, KINDS):
        weight, norm = table[col]
        x = range(len(layers))
        ax.bar([i - 0.2 for i in x], weight, width=0.4, label="attention weight", color="#9ab")
        ax.bar([i + 0.2 for i in x], norm, width=0.4, label="norm-based share", color="#c53")
        ax.set_xticks(list(x), [str(ly) for ly in layers])
        ax.set_title(name)
        ax.set_xlabel("layer")
    axes[0].set_ylabel("mean over heads and tokens")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Weight-based vs norm-based attention by layer ({args.title})", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
