"""What `bertscope relations` writes: the names its writer (command.py, plots.py) and its
report section share, and the tables' columns."""

HEADS_FILE = "relations_heads.csv"  # one row per (data, analysis, group, head)
SUMMARY_FILE = "relations_summary.csv"  # one row per (data, analysis, group)
SUMMARY_TEXT = "relations_summary.txt"
HEATMAP_FIGURE = "{analysis}_heatmap_{data}.png"  # analysis: relations or tokens; data: ewt, gum, ewt_gum
EXAMPLES_FIGURE = "{analysis}_examples.png"

HEAD_COLUMNS = ("data", "analysis", "group", "layer", "head", "score", "n", "rank", "flagged", "prev", "next",
                "prev_next_head")
SUMMARY_COLUMNS = ("data", "analysis", "group", "n", "mean", "p99", "flagged", "top", "top_k", "top_prev_next",
                   "n_flagged", "flagged_prev_next", "prev_next_heads", "rho_prev_next")

# the paper's filters and the previous/next-token cut, which the command's options default to
# (bertscope.analyses.relations.stats uses them; here, so that the parser is built without torch)
MAX_WORDS = 12
MIN_DISTANCE = 2
ADJACENT_MASS = 0.5  # a previous/next-token head puts more than this on offset -1 or +1, on average
