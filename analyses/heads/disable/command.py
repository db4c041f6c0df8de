"""`bertscope heads disable`: Kovaleva et al. (2019) section 4.6, Figures 8-9.

The task metric with each single head, and each whole layer, disabled (attention replaced by
the uniform distribution over the valid tokens), against the baseline, with an exact
interval (McNemar's test inverted) and McNemar's exact test per variant, through `run_variants`.
"""
from __future__ import annotations

from bertscope.analyses.heads.common import (
    add_variant_arguments,
    figure_title,
    run_variants,
)
from bertscope.analyses.heads.disable.outputs import (
    DISABLE_FILE,
    HEADS_FIGURE,
    LAYERS_FIGURE,
)

HELP = "task accuracy with each head and each layer disabled (uniform attention), against the baseline"
DESCRIPTION = (
    "Kovaleva et al. (2019), section 4.6: a disabled head attends uniformly to every valid token (its output is "
    "the mean of V), which removes its learned pattern but keeps the information flow. Evaluates the "
    "fine-tuned model (--model, a checkpoint with a sequence-classification head) on the task split with no "
    "head disabled, with each single head disabled and with each whole layer disabled. Per variant: "
    "accuracy, its change against the baseline with an exact interval (McNemar's test inverted), McNemar's "
    "exact test, and "
    "Benjamini-Hochberg-adjusted q over all variants. Writes disable.csv, fig_disable_heads.png, "
    "fig_disable_layers.png and run.json['analyses']['disable'].")




def add_arguments(p):
    add_variant_arguments(p)


def main(args) -> int:
    from bertscope.kernels.spec import Gate  # torch: imported when the command runs, not when its parser is built

    run_variants(args, "disable", Gate.UNIFORM, outputs=disable_figures, table=DISABLE_FILE)
    return 0


def disable_figures(run, rows: list[dict], results: dict):
    """`heads disable`'s outputs: the layer x head and the per-layer figures."""
    if run.args.no_figures:
        return
    from bertscope.analyses.heads.disable.plots import plot_heads, plot_layers

    L, H, gate, title = run.loaded.n_layers, run.loaded.n_heads, results["gate"], figure_title(run)
    run.save_figure(plot_heads(rows, L, H, title, gate), HEADS_FIGURE)
    run.save_figure(plot_layers(rows, title, gate), LAYERS_FIGURE)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, the disabled variants run
    gated SDPA outside an analysis (heads/variants.py)."""
    return {}
