"""docs/norms_minilm.png, docs/norms_smollm2.png, docs/norms_gemma3.png and their tables: per layer, the
mean over heads of each key kind's attention weight and norm-based share, read from a `bertscope run
--norms` heads.csv, in the style of Kobayashi et al. (2020)'s weight-based against norm-based comparison.

An encoder's run gives [CLS], [SEP], "." and "," and the other tokens; a decoder's (heads.csv has `first`
where an encoder's has `cls`) gives the first token of the segment (the decoders' attention sink: BOS
where the tokenizer adds one, else the first word), "." and "," and the other tokens.

    python bench/norms_figure.py RUN_DIR [--out docs/norms_minilm.png] [--title TITLE] [--caption TEXT]
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

KINDS = (("cls", "[CLS]"), ("sep", "[SEP]"), ("punct", '"." and ","'), ("other", "other tokens"))
DECODER_KINDS = (("first", "first token"), ("punct", '"." and ","'), ("other", "other tokens"))


def by_layer(rows: list[dict], col: str) -> list[float]:
    layers = sorted({int(r["layer"]) for r in rows})
    return [sum(float(r[col]) for r in rows if int(r["layer"]) == ly) / sum(int(r["layer"]) == ly for r in rows)
            for ly in layers]


def kinds_of(rows: list[dict]) -> tuple[tuple[str, str], ...]:
    """The key kinds of the run's table: a decoder's heads.csv has `first` (and no `cls`); a class no token
    of the corpus has (a decoder's `sep`) is not in it."""
    if "first" not in rows[0]:
        return KINDS
    return tuple((c, name) for c, name in DECODER_KINDS + (("sep", "[SEP]"),) if f"{c}_norm" in rows[0])


def describe(run: Path, rows: list[dict]) -> tuple[str | None, str | None]:
    """A decoder run's default title (the model, the corpus, its segments and tokens) and caption (the
    weights' 4-bit provenance, what the first token is) from its run.json and heads.csv."""
    path = run / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {}
    model = info.get("model") or {}
    converted = model.get("converted") or {}
    settings = info.get("settings") or {}
    name = (converted.get("original") or "").split(" (")[0] or settings.get("model")
    title = None
    if name:
        corpus = {"wiki": "Wikipedia"}.get(settings.get("corpus"), settings.get("corpus") or "corpus")
        segments = (info.get("segments") or {}).get("segments")
        tokens = int(rows[0]["n_tokens"]) if rows and rows[0].get("n_tokens") else None
        title = ", ".join([name, corpus] + ([f"{segments:,} segments"] if segments else [])
                          + ([f"{tokens:,} tokens"] if tokens else []))
    caption = ("first token: the segment's first, BOS where the tokenizer adds one, else the first word")
    if converted:
        caption = (f"weights {converted.get('name')}: dequantized from a 4-bit GGUF "
                   f"({converted.get('quantization')}), not the original checkpoint; {caption}")
    return title, caption


def table(rows: list[dict], kinds) -> tuple[list[int], dict]:
    layers = sorted({int(r["layer"]) for r in rows})
    return layers, {col: (by_layer(rows, col), by_layer(rows, f"{col}_norm")) for col, _ in kinds}


def print_table(layers, values, kinds):
    print("| layer | " + " | ".join(f"{name} weight | {name} norm" for _, name in kinds) + " |")
    print("|---|" + "---|---|" * len(kinds))
    for i, ly in enumerate(layers):
        print(f"| {ly} | " + " | ".join(f"{values[c][0][i]:.3f} | {values[c][1][i]:.3f}" for c, _ in kinds) + " |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path)
    p.add_argument("--out", type=Path, default=None,
                   help="the figure (default: docs/norms_minilm.png for an encoder, docs/norms_decoder.png for a "
                        "decoder)")
    p.add_argument("--title", default=None,
                   help="the model and data in the title (default: all-MiniLM-L6-v2, Wikipedia for an encoder; "
                        "the model run.json names for a decoder)")
    p.add_argument("--caption", default=None,
                   help="a line under the panels (default: none for an encoder; a decoder's 4-bit provenance)")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.run / "heads.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    kinds = kinds_of(rows)
    decoder = kinds is not KINDS
    layers, values = table(rows, kinds)
    print_table(layers, values, kinds)
    if decoder:
        title, caption = describe(args.run, rows)
        title, caption = args.title or title or "decoder", args.caption or caption
        out = args.out or Path("docs/norms_decoder.png")
        fig, axes = plt.subplots(1, len(kinds), figsize=(14, 3.9), sharex=True,
                                 gridspec_kw={"width_ratios": [2] + [1] * (len(kinds) - 1)})
    else:
        title, caption = args.title or "all-MiniLM-L6-v2, Wikipedia", args.caption
        out = args.out or Path("docs/norms_minilm.png")
        fig, axes = plt.subplots(1, len(KINDS), figsize=(13, 3.2), sharex=True)
    step = 1 if len(layers) <= 12 else 3 if len(layers) <= 30 else 5
    for ax, (col, name) in zip(axes, kinds):
        weight, norm = values[col]
        x = range(len(layers))
        ax.bar([i - 0.2 for i in x], weight, width=0.4, label="attention weight", color="#9ab")
        ax.bar([i + 0.2 for i in x], norm, width=0.4, label="norm-based share", color="#c53")
        if step == 1:
            ax.set_xticks(list(x), [str(ly) for ly in layers])
        else:
            ticks = [i for i, ly in enumerate(layers) if ly == layers[0] or ly % step == 0]
            ax.set_xticks(ticks, [str(layers[i]) for i in ticks])
        ax.set_title(name)
        ax.set_xlabel("layer")
        if decoder:
            ax.set_ylim(0, 1)
            ax.grid(axis="y", color="#ddd", linewidth=0.6)
            ax.set_axisbelow(True)
    axes[0].set_ylabel("mean over heads and tokens")
    axes[0].legend(fontsize=8, loc="upper left" if decoder else "best")
    fig.suptitle(f"Weight-based vs norm-based attention by layer ({title})", fontsize=10)
    if caption:
        fig.text(0.5, 0.01, caption, ha="center", va="bottom", fontsize=8, color="#444")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
    else:
        fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
