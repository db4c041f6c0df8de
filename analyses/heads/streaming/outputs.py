"""What `bertscope heads streaming` writes; the names the command and the report section share.

streaming_heads.csv: one row per query head, layer-major, `layer, head, kv_head` from 1: the head's
relative streaming error sqrt(sum_i ||o_i - o_L,i||^2 / sum_i ||o_i||^2) over every row of the
LM segments (o its output, o_L its output over the first --sink and the last --recent keys only),
the error of its key/value head group (the G query heads sharing one key/value head, summed
together: what is ranked), the group's rank (1 = lowest error, the first made streaming) and
whether the DuoAttention pattern written keeps it full (`full`, 1) or streams it (0).

streaming_curve.csv: one row per variant: `order` "none" (every head full), "error" (the k key/value
groups of lowest error streaming) or "random" (k random groups, one row per draw), k, the fraction
k / all groups (no random draw when k is every group: it would repeat the lowest-error row), the
mean next-token loss on the evaluation segments and its change against none,
the needle test's accuracy (haystacks whose every answer token is the argmax), its token accuracy
and mean answer log-probability.

duo_attention/: the split in the format of DuoAttention's released patterns (mit-han-lab/duo-attention,
attn_patterns/<model>/...): full_attention_heads.tsv (one line per layer, one tab-separated value per
key/value head, 1 full attention, 0 streaming) and config.json (sink_size, recent_size and what the
split was made from).
"""
from __future__ import annotations

NAME = "streaming"
HEADS_FILE = "streaming_heads.csv"
HEADS_COLUMNS = ("layer", "head", "kv_head", "error", "kv_error", "kv_rank", "full")
CURVE_FILE = "streaming_curve.csv"
CURVE_COLUMNS = ("order", "k", "fraction", "draw", "groups", "loss", "delta_loss", "needle_accuracy",
                 "needle_token_accuracy", "answer_logprob")
PATTERN_DIR = "duo_attention"
PATTERN_FILE = "full_attention_heads.tsv"
PATTERN_CONFIG = "config.json"
STATS_CHECKPOINT = "streaming_stats.npz"  # the error pass's sums (resume)
VARIANTS_DIR = "streaming_variants"  # one JSON per variant done (resume)
ERROR_FIGURE = "fig_streaming_error.png"
CURVE_FIGURE = "fig_streaming_curve.png"
