"""What `bertscope patterns` writes: classify's type proportions (tidy and per head), the counts
of each data set (its checkpoint), the printed table and the figures; label's labels files;
train's CNN and its scores. The names the command and the report section share."""
from __future__ import annotations

from dataclasses import asdict, dataclass

PATTERNS_FILE = "patterns.csv"  # type proportions per data set, overall and per layer
HEADS_FILE = "patterns_heads.csv"  # type proportions per data set and head
# the PatternCounts of one data set; suffix: the rank's under torchrun ("" in one process and
# for the merged counts)
COUNTS_CHECKPOINT = "patterns_{data}{suffix}.npz"
TABLE_TEXT = "patterns_table.txt"  # the proportions as printed
OVERALL_FIGURE = "fig_patterns.png"  # the paper's Figure 2
LAYERS_FIGURE = "fig_patterns_layers.png"
EXAMPLES_FIGURE = "fig_patterns_examples_{data}.png"  # one real map per type (the paper's Figure 1)
LABELS_FILE = "labels_{data}.npz"  # patterns label: resized maps with their rule labels
CNN_FILE = "pattern_cnn.pt"  # patterns train: the CNN
CNN_SCORES_FILE = "pattern_cnn.json"  # patterns train: its held-out scores

# the analysis's name and its rules' thresholds (bertscope.analyses.patterns.stats uses them; here, so
# that the command's parser is built without torch)
NAME = "patterns"


@dataclass(frozen=True)
class Thresholds:
    """The rules' cut points (bertscope.analyses.patterns.stats's docstring: why these); the
    command's options default to them."""

    structured: float = 0.6  # special + diagonal at least this: a striped / lined map
    mix: float = 0.25  # each of vertical and diagonal at least this share of it: Vertical+Diagonal
    own: float = 0.8  # share of word mass on the query's own part, for Block
    spread: float = 0.8  # word-row entropy / ln(own part length), for Block

    def as_dict(self) -> dict:
        return asdict(self)
