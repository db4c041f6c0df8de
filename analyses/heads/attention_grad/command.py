"""`bertscope heads attention-grad`: Clark et al. (2019) section 3, Figure 5.

Is attention to [SEP] a "no-op"? Clark et al. measured, per layer, the mean magnitude of the
gradient of the masked-LM loss with respect to each attention weight, by the kind of key
attended to: from layer 5 of 12 on, the gradients for attention to [SEP] become very small,
although [SEP] takes most of the attention there. Changing that attention barely changes
the output.

The definition of the statistic, the masking and the accumulator are in `stats.py`.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from bertscope.analyses.heads.attention_grad.outputs import (
    HEADS_FIGURE,
    HEADS_FILE,
    LAYERS_FIGURE,
    LAYERS_FILE,
)
from bertscope.analyses.heads.common import add_task_data_arguments, load_split
from bertscope.cli.args import add_common_arguments, limit_arg
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun
from bertscope.text.corpus import open_corpus

if TYPE_CHECKING:
    from bertscope.analyses.heads.attention_grad.stats import GradStats

# numpy, torch and what imports them (the statistics, the figures, the engine, the model loader, the
# task inputs and segments) are imported inside the functions that run the analysis, so that building
# this command's parser does not, and a mistyped option is refused at once (tests/cli/test_new_user.py)

ENCODERS_ONLY = "it differentiates an encoder's bidirectional maps by [CLS] / [SEP] key class (Clark et al. Fig. 5)"

NAME = "attention_grad"
MLM_SEGMENTS = 1000  # corpus segments of --objective mlm without --limit, as Clark's 1,000
CLASS_LABELS = {"cls": "[CLS]", "sep": "[SEP]", "punct": ". or ,", "other": "other"}
LAYER_COLUMNS = ("layer", "key_class", "mean_abs_grad", "grad_vs_other", "attention", "pairs", "rows")
HEAD_COLUMNS = ("layer", "head", "key_class", "mean_abs_grad", "attention")
HELP = "Clark et al. (2019) Fig. 5: mean |d loss / d attention weight| per layer, by key ([SEP], [CLS], '. ,', other)"
DESCRIPTION = (
    "Clark et al. (2019), section 3: the gradient of the loss with respect to every attention weight P_ij, in "
    "magnitude, averaged per layer (and per head) over the valid (query, key) pairs whose key is [CLS], [SEP], "
    "'.' or ',' , or any other token, beside the attention mass on that class. The loss: the masked-LM loss "
    "(--objective mlm, on --corpus, as Clark) for a checkpoint with an MLM head, else the fine-tuned task loss "
    "(--objective task, on --task --split). The maps are never kept: the sums are made inside backward. "
    "--backend eager computes them from autograd on materialised maps (the oracle); any other value uses the "
    "fused function. Writes attention_grad_layers.csv, attention_grad_heads.csv, fig_attention_grad.png, "
    "fig_attention_grad_heads.png and "
    "run.json['analyses']['attention_grad'].")


def add_arguments(p):
    p.add_argument("--objective", choices=("task", "mlm"), default=None,
                   help="the loss: the fine-tuned task's or the masked-LM loss (default: mlm when the checkpoint "
                   "has an MLM head, else task)")
    add_task_data_arguments(p, "dev", "task split (default: dev)", task_required=False,
                            task_help="the task of --objective task (the model's fine-tuning task)", limit_help=None)
    p.add_argument("--corpus", default="wiki",
                   help="text of --objective mlm: 'wiki' or a corpus file, segmented as `bertscope run` does "
                   "(default: wiki)")
    p.add_argument("--limit", type=limit_arg, default=None, metavar="N",
                   help="a seeded sample of N task examples (default: all of the split), or N corpus segments for "
                   "--objective mlm (default: 1000, as Clark)")
    add_common_arguments(p, from_word=False)


def main(args) -> int:
    from bertscope.analyses.atlas.command import model_is_causal  # reads the config only, no torch

    if model_is_causal(args.model, args.revision):  # said before the objective: a decoder has neither
        raise UserError(f"bertscope heads attention-grad runs on encoders only ({ENCODERS_ONLY}); --model "
                        f"{args.model} is a causal decoder (docs/decoders.md lists what runs on decoders)")
    objective = args.objective or default_objective(args.model, args.revision)
    if objective == "task" and args.task is None:
        which = "the embedded MiniLM" if args.model is None else f"--model {args.model}"
        raise UserError(f"--objective task needs --task (the task the checkpoint was fine-tuned on); {which} has no "
                        "masked-LM head for --objective mlm, so give its --task, or a --model with an MLM head")
    if objective == "mlm" and args.task is not None:
        raise UserError("--objective mlm reads --corpus, not --task (leave --task out, or use --objective task)")
    args.objective = objective
    data = load_data(args)  # a missing data set fails before the model loads
    with ModelRun(NAME, args, task="sequence-classification" if objective == "task" else "masked-lm",
                  command="heads attention-grad", encoders_only=ENCODERS_ONLY) as run:
        measure_run(run, args, objective, data)
    return 0


def measure_run(run: ModelRun, args, objective: str, data):
    from bertscope.analyses.heads.attention_grad.plots import plot_heads, plot_layers
    from bertscope.analyses.heads.attention_grad.stats import GradStats, measure
    from bertscope.models.loading import model_name

    loaded = run.loaded
    if objective == "mlm" and loaded.head_initialised:
        raise UserError(f"{loaded.path} has no masked-LM head (a fresh one would give a meaningless loss): use "
                        "--objective task with a fine-tuned checkpoint")
    batches = task_batches(loaded, args, data, run) if objective == "task" else mlm_batches(loaded, args, data, run)
    stats = GradStats(loaded.n_layers, loaded.n_heads)
    measure(loaded, batches, stats, backend="eager" if args.backend == "eager" else "fused",
            progress=run.progress, total=len(data) if objective == "task" else args.limit or MLM_SEGMENTS)
    layers, heads = stats.layer_rows(), stats.head_rows()
    run.write_csv(LAYERS_FILE, layers, LAYER_COLUMNS)
    run.write_csv(HEADS_FILE, heads, HEAD_COLUMNS)
    if not args.no_figures:
        source = f"{args.task} {args.split}" if objective == "task" else args.corpus
        title = f"{model_name(loaded.path)}, {objective} loss on {source} ({stats.examples} inputs)"
        run.save_figure(plot_layers(layers, title), LAYERS_FIGURE)
        run.save_figure(plot_heads(heads, loaded.n_layers, loaded.n_heads, title), HEADS_FIGURE)
    results = summarise(stats, layers, objective, args)
    for line in summary_lines(layers):
        run.log(line)
    run.finish(results)


# --- the loss and its data ---------------------------------------------------------------


def default_objective(model, revision: str | None = None) -> str:
    """mlm when the checkpoint's architectures name a masked-LM (or pre-training) head, else task."""
    from bertscope.models.loading import model_dir

    path = model_dir(model, revision)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "task"  # load_model gives the clear error
    heads = config.get("architectures") or []
    return "mlm" if any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in heads) else "task"


def load_data(args):
    """The task examples (objective task) or the opened corpus (mlm)."""
    if args.objective == "task":
        return load_split(args)

    return open_corpus(args.corpus)


def task_batches(loaded, args, examples, run):
    """(inputs, loss_fn) per batch of the task split: loss_fn(outputs) -> sum of per-example losses."""
    from bertscope.analyses.heads.variants import example_batches
    from bertscope.tasks.inputs import check_head, encode_task

    check_head(args.task, loaded)
    task = encode_task(args.task, examples, loaded.tokenizer, args.max_len)
    run.log(f"{args.task} {args.split}: {task.n_examples} examples ({task.truncated} rows cut to {args.max_len} "
            f"tokens), task loss")
    return _task_batches(loaded, task, example_batches(task, args.batch_size))


def _task_batches(loaded, task, batches):
    import torch

    from bertscope.tasks.model import point_loss

    device = next(loaded.model.parameters()).device
    pad = loaded.tokenizer.pad_token_id or 0
    for batch in batches:
        inputs = task.batch(batch, pad, device)
        if not loaded.takes_token_types:
            inputs.pop("token_type_ids", None)
        labels = torch.as_tensor(task.labels[batch], device=device)
        yield inputs, len(batch), (
            lambda out, labels=labels: point_loss(task.example_logits(out.logits), labels, "sum"))


def mlm_batches(loaded, args, corpus, run):
    """(inputs, loss_fn) per batch of corpus segments (as `bertscope run` makes them), masked as BERT."""
    from bertscope.analyses.surface.command import segment_stream
    from bertscope.engine.loop import windowed_batches
    from bertscope.text.segments import SegmentOptions, SegmentReport

    limit = args.limit or MLM_SEGMENTS
    options = SegmentOptions(max_len=args.max_len, limit=limit, seed=args.seed)
    stream = segment_stream(corpus, loaded.tokenizer, options, SegmentReport(), window_batches=64)
    run.log(f"{limit} segments of {args.corpus} (at most {args.max_len} tokens), masked-LM loss")
    tok = loaded.tokenizer
    if tok.mask_token_id is None:
        raise UserError(f"the tokenizer of {loaded.path} has no mask token: no masked-LM loss")
    return _mlm_batches(loaded, windowed_batches(stream, args.batch_size), args.seed)


def _mlm_batches(loaded, batches, seed: int):
    import numpy as np
    import torch

    from bertscope.analyses.heads.attention_grad.stats import mask_tokens, mlm_loss
    from bertscope.text.segments import collate

    tok = loaded.tokenizer
    device = next(loaded.model.parameters()).device
    for indices, segments in batches:
        inputs = collate(segments, tok.pad_token_id or 0)
        labels = torch.full_like(inputs["input_ids"], -100)  # (B, L)
        for row, (i, s) in enumerate(zip(indices, segments)):
            ids, lab = mask_tokens(s.input_ids, s.word_ids, tok.mask_token_id, len(tok),
                                   np.random.default_rng([seed, i]))
            inputs["input_ids"][row, : s.n_tokens] = torch.tensor(ids)
            labels[row, : s.n_tokens] = torch.tensor(lab)
        if not loaded.takes_token_types:
            inputs.pop("token_type_ids", None)
        inputs = {k: t.to(device) for k, t in inputs.items()}
        labels = labels.to(device)
        yield inputs, len(segments), (lambda out, labels=labels: mlm_loss(out.logits, labels))


# --- results ---------------------------------------------------------------------------


def summarise(stats: GradStats, layers: list[dict], objective: str, args) -> dict:
    """run.json's results: what the loss was, on what, its mean, and the per-layer table."""
    from bertscope.analyses.heads.attention_grad.stats import MASK_RATE, MASK_TOKEN, RANDOM_TOKEN

    by = {(r["layer"], r["key_class"]): r for r in layers}
    n = stats.grad.shape[0]
    return {
        "objective": objective, "task": args.task, "split": args.split if objective == "task" else None,
        "corpus": args.corpus if objective == "mlm" else None, "inputs": stats.examples,
        "mean_loss": stats.loss_sum / max(1, stats.examples),
        "punct_tokens": [".", ","],
        "masking": {"rate": MASK_RATE, "mask_token": MASK_TOKEN, "random_token": RANDOM_TOKEN, "seed": args.seed}
        if objective == "mlm" else None,
        "layers": {str(lay): {c: {k: _finite(by[(lay, c)][k]) for k in ("mean_abs_grad", "grad_vs_other", "attention")}
                              for c in stats.classes} for lay in range(1, n + 1)},
    }


def _finite(x: float) -> float | None:
    """None for NaN (a class without keys): run.json stays valid JSON."""
    import numpy as np

    return None if np.isnan(x) else x


def summary_lines(layers: list[dict]) -> list[str]:
    from bertscope.text.token_classes import KEY_CLASSES

    by = {(r["layer"], r["key_class"]): r for r in layers}
    n = max(r["layer"] for r in layers)
    lines = ["mean |dL/dP| per layer (x other's), attention mass: " + ", ".join(CLASS_LABELS.values())]
    for lay in range(1, n + 1):
        cells = [f"{CLASS_LABELS[c]} {by[(lay, c)]['mean_abs_grad']:.3g} (x{by[(lay, c)]['grad_vs_other']:.2f}), "
                 f"{by[(lay, c)]['attention']:.2f}" for c in KEY_CLASSES]
        lines.append(f"  layer {lay}: " + "; ".join(cells))
    return lines


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, the gradients run
    kernels.attention_grad, not the statistics kernel."""
    return {}
