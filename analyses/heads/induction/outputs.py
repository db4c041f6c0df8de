"""What `bertscope heads induction` writes; the names the command and the report section share.

induction.csv: one row per head, layer-major, `layer, head` from 1; the three scores (mean
attention mass of the repeated half's rows at offsets -T+1, -T, -1), the head's rank by induction
score (1 = highest) and, for the heads zeroed one at a time (--per-head), the change of the mean
next-token loss on the repeated half, on the first half and of the in-context learning score
(empty when not measured).

ablation.csv: one row per gating: `none` (the model as trained), `top` (the k heads of highest
induction score zeroed) and `random` (k heads drawn from the others, one row per draw): the
heads, the mean loss on each half, the ICL score (repeated minus first) and the changes against
`none`.

loss_by_position.csv: the mean next-token loss at each target position, for the model as trained,
with the top-k heads zeroed and with k random heads zeroed (mean over draws), for each k.
"""
from __future__ import annotations

INDUCTION_FILE = "induction.csv"
INDUCTION_COLUMNS = ("layer", "head", "induction", "duplicate", "previous", "rank", "delta_loss_repeated",
                     "delta_loss_first", "delta_icl")
ABLATION_FILE = "ablation.csv"
ABLATION_COLUMNS = ("ablation", "k", "draw", "heads", "loss_first", "loss_repeated", "icl_score",
                    "delta_loss_first", "delta_loss_repeated", "delta_icl")
POSITION_FILE = "loss_by_position.csv"
SCORES_CHECKPOINT = "induction_scores.npz"  # the stream's sums (resume)
LOSSES_CHECKPOINT = "induction_losses.npz"  # the unablated losses of the stream (resume)
VARIANTS_CHECKPOINT = "induction_{name}.npz"  # the losses of the gated variants done so far (resume)
SCORES_FIGURE = "fig_induction_scores.png"
LOSS_FIGURE = "fig_induction_loss.png"
ABLATION_FIGURE = "fig_induction_ablation.png"
PER_HEAD_FIGURE = "fig_induction_per_head.png"
