"""What `bertscope finetune` writes: the results of every model, their mean and sd over seeds,
the training curves, the per-head cosine between pre-trained and fine-tuned attention, one
figure per configuration, and the fine-tuned checkpoints; the names the command, its figures
and the report section share."""
from __future__ import annotations

RESULTS_FILE = "finetune_results.csv"  # one row per configuration, init, seed and split
SUMMARY_FILE = "finetune_summary.csv"  # mean and sd over the seeds
EPOCHS_FILE = "finetune_epochs.csv"  # the training curves
COSINE_FILE = "finetune_cosine.csv"  # per head: cosine between pre-trained and fine-tuned attention
COSINE_FIGURE = "fig_finetune_cosine_{name}.png"  # name: the task, or arct-<data>-<input>
CHECKPOINT_DIR = "checkpoints/{name}-{init}-seed{seed}"  # a saved model, relative to the run directory
CHECKPOINT_RECORD = "bertscope_finetune.json"  # in a checkpoint: how it was trained
