"""The cue statistics' figure."""
from __future__ import annotations

from bertscope.analyses.cues.stats import Cue, strongest

# matplotlib is imported inside the drawing functions: `bertscope cues` imports this module, and
# its --help and a run with --no-figures must not pay matplotlib's start-up (half a second or more).


def cue_figure(task: str, tables: dict[tuple[str, str], list[Cue]], top: int):
    """Productivity against coverage of the unigram cues over all splits, strongest ones named."""
    import matplotlib  # see the module note

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the original data over all splits; the adversarial test set, where every cue should sit at 0.5
    panels = [key for key in (("original", "all"), ("adversarial", "test")) if key in tables]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False, sharey=True)
    for ax, key in zip(axes[0], panels):
        cues = [c for c in tables[key] if c.ngram == 1 and c.applicability >= 5]
        ax.scatter([c.coverage for c in cues], [c.productivity for c in cues], s=6, alpha=0.35, color="0.4")
        for rank, c in enumerate(strongest(cues, top=top)):
            ax.scatter([c.coverage], [c.productivity], s=14, color="tab:red")
            ax.annotate(c.cue, (c.coverage, c.productivity), fontsize=7, textcoords="offset points",
                        xytext=(4, 8 - 7 * (rank % 3)))  # staggered: strong cues crowd at low coverage
        ax.set_ylim(-0.03, 1.03)
        ax.axhline(0.5, color="0.6", lw=0.8, ls="--")  # chance for a warrant choice; RTE's base rates are ~0.5
        ax.set(xlabel="coverage (share of data points the cue applies to)", ylabel="productivity",
               title=f"{task.upper()} {key[0]}, {'all splits' if key[1] == 'all' else key[1] + ' split'} "
               "(unigrams applicable to >= 5 points)")
        ax.title.set_fontsize(9)
    fig.suptitle("Dataset cues (Niven & Kao 2019): red = the strongest cues above chance (see cues.csv, strength)",
                 fontsize=10)
    fig.tight_layout()
    return fig
