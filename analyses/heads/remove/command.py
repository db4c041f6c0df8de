"""`bertscope heads remove`: really remove attention heads and save the smaller model.

The heads' rows of Q, K, V and columns of the output projection go (`bertscope.models.head_removal`);
the result is a Hugging Face checkpoint directory whose config records the pruning, so
`--model DIR` loads it in every bertscope command. Which heads: `--heads 1-3,2-5` (layer-head,
both from 1), or `--from-prune RUN_DIR --fraction F`: the heads `bertscope heads prune` had
removed once a fraction F of them was gone (its prune_order.csv).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from bertscope.analyses.heads.prune.outputs import ORDER_FILE, heads_from_prune_order
from bertscope.cli.args import add_model_arguments, add_quiet_argument, add_threads_argument
from bertscope.errors import UserError
from bertscope.models.source import resolve_model

# torch, the model loader and head removal are imported inside the functions that use them, so that
# building this command's parser does not, and a mistyped option is refused at once
# (tests/cli/test_new_user.py)

logger = logging.getLogger(__name__)

HELP = "remove attention heads for real (smaller Q, K, V and output projections) and save the model"
DESCRIPTION = (
    "Removes the chosen heads' rows of the query, key and value projections and columns of the output "
    "projection, and saves the smaller model with its tokenizer in Hugging Face format into --out; its "
    "config records the kept and pruned heads of each layer (bertscope_kept_heads, bertscope_pruned_heads), "
    "and --model OUT loads it in every bertscope command (removed heads show as missing, NaN, in statistics). "
    "Its outputs equal the unpruned model's with those heads zero-gated. A task head in the checkpoint "
    "(sequence classification, masked LM, a decoder's LM head) is kept. With grouped-query attention (Llama, "
    "Gemma-3, ...) a query head goes only with every query head of its key/value group; a set that would keep part "
    "of a group is refused.")


def add_arguments(p):  # --heads keeps dest "remove_heads": "heads" is the subcommand's own dest

    add_model_arguments(p)
    p.add_argument("--out", metavar="DIR", required=True, help="where to save the pruned model (a new or empty folder)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--heads", dest="remove_heads", metavar="L-H,...",
                       help="heads to remove, layer-head with both from 1, e.g. 1-3,2-5")
    which.add_argument("--from-prune", metavar="RUN_DIR",
                       help="a `bertscope heads prune` run: remove the heads of its prune_order.csv with "
                       "fraction_pruned <= --fraction")
    p.add_argument("--fraction", type=float, default=None, metavar="F",
                   help="with --from-prune: the fraction of heads pruned, 0 < F < 1 (e.g. 0.5)")
    add_threads_argument(p)
    add_quiet_argument(p)


def main(args) -> int:
    import torch

    from bertscope.models import head_removal
    from bertscope.models.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    heads = chosen_heads(args)
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder")
    source = resolve_model(args.model, args.revision)  # once: a Hub id's folder in the cache
    loaded = load_model(source, task=checkpoint_task(source.path))
    if out.resolve() == loaded.path.resolve():
        raise UserError("--out must not be the --model folder")
    before = sum(p.numel() for p in loaded.model.parameters())
    try:
        head_removal.prune_heads(loaded.model, heads)
    except ValueError as e:
        raise UserError(str(e)) from None
    after = sum(p.numel() for p in loaded.model.parameters())
    head_removal.save_pruned(loaded.model, loaded.tokenizer, out)
    info = head_removal.describe(head_removal.pruned_heads(loaded.model), loaded.n_layers, loaded.n_heads)
    logger.info(f"removed {info['heads_removed']} of {info['heads_total']} heads "
                f"({100 * info['fraction_removed']:.1f}%); "
                f"heads per layer: {' '.join(map(str, info['kept_per_layer'].values()))}")
    logger.info(f"parameters: {before:,} -> {after:,} ({100 * (after - before) / before:+.1f}%)")
    logger.info(f"saved to {out} (load it with --model {out})")
    return 0


def chosen_heads(args) -> dict[int, list[int]]:
    """layer -> heads (0-based) that --heads or --from-prune/--fraction name."""
    from bertscope.models import head_removal

    if args.remove_heads is not None:
        if args.fraction is not None:
            raise UserError("--fraction goes with --from-prune, not --heads")
        try:
            return head_removal.parse_heads(args.remove_heads)
        except ValueError as e:
            raise UserError(f"--heads: {e}") from None
    if args.fraction is None or not 0 < args.fraction < 1:
        raise UserError("--from-prune needs --fraction F with 0 < F < 1")
    path = Path(args.from_prune) / ORDER_FILE
    if not path.is_file():
        raise UserError(f"{path} not found: --from-prune takes the run directory of `bertscope heads prune`")
    try:
        heads = heads_from_prune_order(path, args.fraction)
    except ValueError as e:
        raise UserError(str(e)) from None
    if not heads:
        raise UserError(f"{path} prunes no head at fraction <= {args.fraction}")
    return heads


def checkpoint_task(path) -> str | None:
    """The task head a checkpoint carries, so that pruning keeps it (None: a bare encoder)."""
    from bertscope.models.loading import model_dir

    config = model_dir(path) / "config.json"
    try:
        archs = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None  # load_model says what is wrong with the folder
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return "sequence-classification"
    if any(a.endswith("ForMaskedLM") for a in archs):
        return "masked-lm"
    if any(a.endswith("ForCausalLM") for a in archs):
        return "causal-lm"  # a decoder keeps its LM head
    return None


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, it writes a model with
    heads removed."""
    return {}
