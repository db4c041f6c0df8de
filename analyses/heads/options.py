"""The `heads` commands' option values that their parsers need: --task lm's options and the
importance conventions. Apart from the modules that use them (lm_task.py, importance/stats.py),
which import torch, so that building `heads importance`'s and `heads prune`'s parsers does not and
a mistyped option is refused at once (tests/cli/test_new_user.py)."""
from __future__ import annotations

from bertscope.errors import UserError

# Michel et al.'s |dL/dxi| per example then the mean, or the gradient summed over a batch first
# (bertscope.analyses.heads.importance.stats)
CONVENTIONS = ("michel", "batch")

LM = "lm"  # the --task value
# the options only --task lm takes: (dest, default); an encoder run neither takes nor records them
LM_OPTIONS = {"corpus": "wiki", "resume": None}
PRUNE_LM_OPTIONS = {**LM_OPTIONS, "eval_limit": None}


def add_lm_arguments(p, prune: bool = False):
    """--corpus, --resume (and for prune --eval-limit): the options of --task lm."""
    p.add_argument("--corpus", default="wiki", metavar="NAME|PATH",
                   help="--task lm: the running text, 'wiki' (the bundled Wikipedia) or a corpus file, as "
                   "`bertscope run` takes it (default: wiki)")
    if prune:
        p.add_argument("--eval-limit", type=int, default=None, metavar="N",
                       help="--task lm: held-out segments perplexity is measured on, the N segments after the "
                       "--limit importance segments (default: as many as --limit)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="--task lm: continue an interrupted run in DIR (its settings are taken from its run.json)")


def drop_lm_options(args, options: dict):
    """A classifier run: a UserError for an --task lm option that was given, then the options leave
    `args`, so its run.json records what it recorded before --task lm existed."""
    for dest, default in options.items():
        if getattr(args, dest, default) != default:
            raise UserError(f"--{dest.replace('_', '-')} goes with --task lm (a language model on running text), "
                            f"not --task {args.task}")
        if hasattr(args, dest):
            delattr(args, dest)


TASK_DATA_OPTIONS = ("split", "arct_version")  # the task data's options, which --task lm (running text) does not read


def refuse_task_data_options(args, parser_defaults: dict):
    """--task lm: a UserError for --split or --arct-version given (not at its default): the
    language-modelling loss reads --corpus, not a task's split."""
    for dest in TASK_DATA_OPTIONS:
        if dest in parser_defaults and getattr(args, dest, None) != parser_defaults[dest]:
            raise UserError(f"--{dest.replace('_', '-')} is for the task data (--task rte, arct, ...); --task lm "
                            "reads running text from --corpus: leave it out")


def resumed_lm_args(name: str, args, add_arguments, command: str):
    """`--resume DIR`: the settings of the --task lm run recorded in DIR (`ModelRun.resumed_args`);
    a UserError for any other run (a classifier's importance or pruning does not resume)."""
    from bertscope.run.analysis_run import ModelRun

    resumed = ModelRun.resumed_args(name, args, add_arguments, command=command)
    if resumed.task != LM:
        raise UserError(f"cannot resume: {args.resume} holds a --task {resumed.task} run; only --task lm runs resume")
    return resumed
