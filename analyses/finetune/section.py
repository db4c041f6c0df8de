"""Fine-tuning and what it changes, in the report (Kovaleva et al. section 4.3)."""
from __future__ import annotations

import numpy as np

from bertscope.analyses.finetune import paper
from bertscope.analyses.finetune.outputs import COSINE_FIGURE, COSINE_FILE, SUMMARY_FILE
from bertscope.report.page import RunFiles, Section, Table, num


def build(run: RunFiles) -> Section | None:
    """Table 1's three columns per task next to Kovaleva's bert-base row, the ARCT probes next to
    Niven & Kao, and the Figure 5 heatmaps of attention change."""
    rows = run.csv(SUMMARY_FILE)
    if not rows:
        return None
    test = [r for r in rows if r["split"] == "test"]
    cell = {(r["task"], r["data"], r["input"], r["init"]): r for r in test}
    column_init = dict(zip(paper.FINETUNE_COLUMNS, ("probe", "random", "pretrained")))

    def mean_sd(r):
        if r is None:
            return "-"
        return f"{100 * num(r['accuracy_mean']):.1f} ± {100 * num(r['accuracy_sd']):.1f} (n={r['n_seeds']})"

    table_rows, findings = [], []
    for task in ("rte", "polarity"):
        ours = {c: cell.get((task, "-", "-", i)) for c, i in column_init.items()}
        if not any(ours.values()):
            continue
        theirs = paper.kovaleva_accuracy(task) or {}
        table_rows.append([task] + [mean_sd(ours[c]) for c in paper.FINETUNE_COLUMNS]
                          + [paper.KOVALEVA_ROW_OF[task]] + [theirs[c].value if c in theirs else "-"
                                                              for c in paper.FINETUNE_COLUMNS])
        pre, rnd = ours["pretrained_ft"], ours["random_ft"]
        if pre and rnd:
            findings.append(f"{task}: fine-tuned from pre-trained minus fine-tuned from a normal init: "
                            f"{100 * (num(pre['accuracy_mean']) - num(rnd['accuracy_mean'])):+.1f} points "
                            f"(Kovaleva: {theirs['pretrained_ft'].value - theirs['random_ft'].value:+.1f} on "
                            f"{paper.KOVALEVA_ROW_OF[task]}).")
    tables = []
    if table_rows:
        tables.append(Table("Table 1 (Kovaleva et al.): test accuracy %, mean ± sd over seeds; the linear probe is "
                            "deterministic (n=1). Paper: bert-base on GLUE dev (SST-2 for polarity)",
                            ["task", "pre-trained, no FT (probe)", "FT from normal init", "FT from pre-trained",
                             "paper row", "paper: no FT", "paper: normal", "paper: pre-trained"], table_rows, digits=1))
    arct = sorted({(r["data"], r["input"]) for r in test if r["task"] == "arct"},
                  key=lambda k: (k[0] != "original", ("full", "W", "RW", "CW").index(k[1])))
    if arct:
        arct_rows = []
        for data, variant in arct:
            nk = paper.NIVEN_KAO_NUMBERS.get((data, variant), {})
            arct_rows.append([data, variant] + [mean_sd(cell.get(("arct", data, variant, i)))
                                                for i in ("probe", "random", "pretrained")]
                             + [nk["mean"].value if "mean" in nk else "-", nk["peak"].value if "peak" in nk else "-"])
        tables.append(Table("ARCT (Niven & Kao): test accuracy %, one logit per warrant, softmax over the pair; "
                            "W = warrants only, RW = reason + warrant, CW = claim + warrant; adversarial = trained "
                            "on train-swapped, tested on test-adv-negated. Chance is 50%.",
                            ["data", "input", "probe", "FT normal init", "FT pre-trained", "paper mean",
                             "paper peak"], arct_rows, digits=1))
    prefix, _, suffix = COSINE_FIGURE.partition("{name}")
    figures = [run.figure(n, f"Per-head cosine similarity between the attention maps of the pre-trained and the "
                          f"fine-tuned model ({n[len(prefix):-len(suffix)]}), averaged over up to 1,000 dev "
                          "inputs and over the seeds (Kovaleva et al. Fig. 5). Darker cells changed more; in "
                          "bert-base the last two layers changed most.")
               for n in run.figures(COSINE_FIGURE.format(name="*"))]
    cosine = run.csv(COSINE_FILE) or []
    by_task: dict[str, dict[int, list[float]]] = {}
    for r in cosine:
        by_task.setdefault(r["task"] if r["task"] != "arct" else f"arct-{r['data']}-{r['input']}", {}) \
            .setdefault(int(r["layer"]), []).append(num(r["cosine"]))
    for name, layers in sorted(by_task.items()):
        means = {l: float(np.mean(v)) for l, v in layers.items()}
        low = sorted(means, key=means.get)[:2]
        findings.append(f"{name}: mean cosine per layer " + ", ".join(f"{l}: {means[l]:.3f}" for l in sorted(means))
                        + f"; changed most: layers {', '.join(map(str, sorted(low)))}.")
    return Section("Fine-tuning and what it changes (Kovaleva et al. 2019, section 4.3; Niven & Kao 2019)",
                   intro="bertscope finetune: fine-tuned from the pre-trained weights and from a normal init, and a "
                   "linear probe on the frozen pre-trained [CLS] vector; per-head attention change.",
                   findings=findings, tables=tables, figures=[f for f in figures if f])
