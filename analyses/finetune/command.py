"""`bertscope finetune --task rte|polarity|arct`: fine-tuning and what it changes (Kovaleva et al.
2019, section 4.3, Table 1, Figure 5; Niven & Kao 2019 for ARCT).

For every configuration (ARCT: data original/adversarial x input full/W/RW/CW) it reports the
three columns of Kovaleva's Table 1:
- `probe`: the pre-trained model without fine-tuning, a logistic regression on its frozen
  final [CLS] vector (C picked on dev). Frozen features and a convex fit: no seed changes it,
  so it runs once (seed "-").
- `random`: fine-tuned from weights drawn from the architecture's normal initialiser.
- `pretrained`: fine-tuned from the checkpoint.
and, for every pre-trained fine-tune, the per-head cosine between the attention maps of the
pre-trained and the fine-tuned model on dev inputs (bertscope.analyses.finetune.attention_change, Figure 5).

Outputs (run directory): finetune_results.csv (one row per configuration, init, seed and split),
finetune_summary.csv (mean, sd over seeds), finetune_epochs.csv (training curves),
finetune_cosine.csv and fig_finetune_cosine_*.png, checkpoints/<name>/ (save_pretrained +
tokenizer: every other command takes them with --model). Rows are written as each model
finishes, so an interrupted run keeps what it finished; an existing run directory given as
--out keeps its rows (a configuration run again replaces its own).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import logging
import time
from pathlib import Path

from tqdm import tqdm

from bertscope.analyses.finetune.outputs import (
    CHECKPOINT_DIR,
    CHECKPOINT_RECORD,
    COSINE_FILE,
    EPOCHS_FILE,
    RESULTS_FILE,
    SUMMARY_FILE,
)
from bertscope.cli.args import add_common_arguments, limit_arg, non_negative_int, positive_int
from bertscope.data.paths import dataset_dir, seeded_sample
from bertscope.data.readers.tasks import ARCT_INPUTS, TASKS, read_task
from bertscope.errors import UserError
from bertscope.files import write_csv, write_json
from bertscope.run.analysis_run import ModelRun

# numpy, transformers and what imports them or torch (the attention change, the figures, the model loader, the
# task inputs and model) are imported inside the functions that run the analysis: the command line imports
# this module to build the command's parser, so a mistyped option is refused at once, not after the seconds
# those imports take (tests/cli/test_new_user.py)

ENCODERS_ONLY = "it fine-tunes a [CLS] sentence classifier (Kovaleva et al. section 4.3)"

logger = logging.getLogger(__name__)
INITS = ("pretrained", "random", "probe")
DATASET = {"rte": "rte", "polarity": "sentence_polarity", "arct": "arct"}  # bertscope.data.paths names
ARCT_DATA = ("original", "adversarial")
LABELS = {"rte": ("not_entailment", "entailment"), "polarity": ("negative", "positive"), "arct": ("warrant_score",)}
RESULT_COLUMNS = ("task", "data", "input", "init", "seed", "split", "accuracy", "f1", "n", "best_epoch",
                  "dev_accuracy", "train_s", "checkpoint")
SUMMARY_COLUMNS = ("task", "data", "input", "init", "split", "n_seeds", "accuracy_mean", "accuracy_sd", "f1_mean",
                   "f1_sd")
EPOCH_COLUMNS = ("task", "data", "input", "init", "seed", "epoch", "train_loss", "dev_accuracy", "seconds")
COSINE_COLUMNS = ("task", "data", "input", "seed", "layer", "head", "cosine", "n_inputs")
KEY = ("task", "data", "input", "init", "seed")
# The training recipe of each task: what --epochs, --lr, --batch-size, --warmup and --patience default to
# (None on the command line = this). RTE's and ARCT's come from the dev search of issue 23
# (tools/finetune_search.py, docs/finetune_search.csv, docs/finetune.md "Recipe search"): 5 epochs at 3e-5,
# batch 16 beat the papers' 3 epochs at 5e-5, batch 32 on dev for every seed; polarity was not searched.
PAPERS_RECIPE = {"epochs": 3, "lr": 5e-5, "batch_size": 32, "warmup": 0.1, "patience": 0}
SEARCHED_RECIPE = dict(PAPERS_RECIPE, epochs=5, lr=3e-5, batch_size=16)
# Sequences per forward pass when the linear probe reads the frozen [CLS] vectors. Fixed, not
# --batch-size: a training setting must not move the probe, whose C is picked on dev among
# values that often tie, so float noise from another padding of the batches can change the pick
# (RTE: C 0.1 -> 1.0 and test 50.4 -> 49.75 with batches of 16).
PROBE_BATCH = 32
RECIPES = {"rte": SEARCHED_RECIPE, "polarity": PAPERS_RECIPE, "arct": SEARCHED_RECIPE}
HELP = "fine-tune a classifier on RTE, sentence polarity or ARCT; Table 1 and attention change (Kovaleva 4.3)"
DESCRIPTION = HELP + ". " + __doc__.split("\n\n")[1]


def num_labels(task: str) -> int:
    return len(LABELS[task])


def check_task(task: str):
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")


def check_labels(model, task: str, revision: str | None = None):
    """A checkpoint with a classification head must have the task's number of outputs."""
    from transformers import AutoConfig

    from bertscope.models.loading import model_dir

    path = model_dir(model, revision)
    if not (path / "config.json").is_file():
        return  # load_model says what is wrong
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    has_head = any(a.endswith("ForSequenceClassification") for a in (config.architectures or ()))
    if has_head and config.num_labels != num_labels(task):
        raise UserError(f"the classification head in {path} has {config.num_labels} labels; task {task} needs "
                        f"{num_labels(task)}")


def csv_list(choices):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)} (comma-separated), not {text!r}")
        return items
    return parse


def seed_list(text: str) -> list[int]:
    """Comma-separated seeds, each a whole number >= 0, at least one."""
    try:
        seeds = sorted({non_negative_int(t.strip()) for t in text.split(",") if t.strip()})
    except argparse.ArgumentTypeError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f"seeds are comma-separated whole numbers >= 0, not {text!r}")
    return seeds


def add_arguments(p):
    p.add_argument("--task", required=True, choices=tuple(TASKS), metavar="TASK", help=f"one of {', '.join(TASKS)}")
    p.add_argument("--inits", type=csv_list(INITS), default=list(INITS),
                   help="what to run: pretrained, random (fine-tuned from that init), probe (linear probe on the "
                   "frozen pre-trained model); comma-separated (default: all three)")
    p.add_argument("--seeds", type=seed_list, default=[0, 1, 2], help="training seeds (default: 0,1,2)")
    p.add_argument("--arct-data", type=csv_list(ARCT_DATA), default=["original"],
                   help="ARCT data: original, adversarial (train-swapped / dev,test-adv-negated) (default: original)")
    p.add_argument("--arct-inputs", type=csv_list(ARCT_INPUTS), default=["full"],
                   help="ARCT input: full (claim+reason, warrant), RCW (reason+claim, warrant), W (warrant only), "
                   "RW (reason, warrant), CW (claim, warrant); comma-separated (default: full)")
    p.add_argument("--epochs", type=positive_int, default=None,
                   help="training epochs; the linear decay spans them (default: " + per_task("epochs") + ")")
    p.add_argument("--lr", type=float, default=None, help="peak AdamW learning rate (default: " + per_task("lr") + ")")
    p.add_argument("--warmup", type=float, default=None,
                   help="linear warm-up, fraction of the steps (default: " + per_task("warmup") + ")")
    p.add_argument("--patience", type=non_negative_int, default=None, metavar="N",
                   help="stop once the best dev epoch is N epochs old (the schedule still spans --epochs); 0: never "
                   "(default: " + per_task("patience") + ")")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default: 0.01)")
    # --precision fp32|bf16: the option's name before --dtype, kept as a hidden alias
    p.add_argument("--precision", choices=tuple(PRECISION), default=None, help=argparse.SUPPRESS)
    p.add_argument("--save", choices=("all", "pretrained", "none"), default="all",
                   help="which fine-tuned models to keep under checkpoints/ (default: all)")
    p.add_argument("--cosine-examples", type=non_negative_int, default=1000, metavar="N",
                   help="dev inputs (sequences) for the attention-change cosine, seeded sample; 0 skips it "
                   "(default: 1000, as the paper)")
    p.add_argument("--limit", type=limit_arg, default=None, metavar="N",
                   help="at most N data points per split, seeded sample (smoke tests; default: all)")
    add_common_arguments(p, from_word=False, overrides={
        "seed": {"help": "seed of the data splits (RTE dev, polarity 80/10/10) (default: 0)"},
        "batch_size": {"default": None, "help": "data points per training step (ARCT: arguments, two sequences each) "
                       "(default: " + per_task("batch_size") + ")"},
        "dtype": {"choices": ("float32", "bfloat16"),
                  "help": "bfloat16: autocast matmuls to bfloat16 (float32 weights and optimizer), ~1.6x faster on a "
                  "CPU with AVX512-BF16 (default: float32)"},
    })


# the deprecated --precision's values -> --dtype
PRECISION = {"fp32": "float32", "bf16": "bfloat16"}


def autocast_precision(args) -> str:
    """task_model's precision ("fp32" or "bf16" autocast) from --dtype, or the deprecated --precision."""
    if args.precision is not None:
        logger.warning("--precision is deprecated: use --dtype %s", PRECISION[args.precision])
        args.dtype = PRECISION[args.precision]
    return "bf16" if args.dtype == "bfloat16" else "fp32"


def per_task(setting: str) -> str:
    """`rte 2e-05, polarity and arct 5e-05`: a setting's default per task, for --help."""
    by_value: dict = {}
    for task, recipe in RECIPES.items():
        by_value.setdefault(recipe[setting], []).append(task)
    if len(by_value) == 1:
        return f"{next(iter(by_value)):g}, every task"
    names = lambda tasks: " and ".join([", ".join(tasks[:-1]), tasks[-1]] if len(tasks) > 1 else tasks)  # noqa: E731
    return ", ".join(f"{names(tasks)} {value:g}" for value, tasks in by_value.items())


def resolve_recipe(args):
    """Fill the training settings left at None with the task's recipe (RECIPES)."""
    for setting, value in RECIPES.get(args.task, PAPERS_RECIPE).items():
        if getattr(args, setting, None) is None:
            setattr(args, setting, value)
    return args


def main(args) -> int:
    check_task(args.task)
    args.precision = autocast_precision(args)  # the weights stay float32: ModelRun loads them so
    resolve_recipe(args)
    dataset_dir(DATASET[args.task], args.data_dir)  # a missing data set is refused before any work
    check_labels(args.model, args.task, args.revision)
    with ModelRun("finetune", args, dtype="float32", encoders_only=ENCODERS_ONLY) as run:
        run.interrupted_message = "interrupted; the finished configurations are written in the run directory"
        FineTuneRun(args, run).execute()
    return 0


class FineTuneRun:
    """Every configuration of one `bertscope finetune` call, written as it finishes."""

    def __init__(self, args, run):
        from bertscope.tasks import model as task_model

        self.args, self.run = args, run
        self.rows = read_rows(run.dir / RESULTS_FILE)
        self.epochs = read_rows(run.dir / EPOCHS_FILE)
        self.cosine = read_rows(run.dir / COSINE_FILE)

        self.cfg = task_model.TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                          warmup=args.warmup, weight_decay=args.weight_decay,
                                          precision=args.precision, device=args.device,
                                          patience=args.patience or None)
        self.timing: dict[str, float] = {}

    def bar(self, desc):
        return lambda items, d=desc: tqdm(items, desc=d, unit="batch", leave=False, disable=not self.run.progress)

    def configurations(self):
        if self.args.task != "arct":
            return [("-", "-")]
        return list(itertools.product(self.args.arct_data, self.args.arct_inputs))

    def data(self, version, variant):
        import numpy as np

        from bertscope.tasks.inputs import encode_task

        a, tok = self.args, self.run.loaded.tokenizer
        arct = a.task == "arct"
        splits = {s: read_task(a.task, s, a.data_dir, seed=a.seed, version=version if arct else "original")
                  for s in ("train", "dev", "test")}
        if a.limit:
            splits = {s: seeded_sample(ex, a.limit, a.seed) for s, ex in splits.items()}
        enc = {s: encode_task(a.task, ex, tok, a.max_len, arct_input=variant if arct else "full")
               for s, ex in splits.items()}
        self.run.record.setdefault("data", {})[f"{version}/{variant}"] = {
            s: {"n": e.n_examples, "truncated": e.truncated,
                "labels": {str(k): int(v) for k, v in zip(*np.unique(e.labels, return_counts=True))}}
            for s, e in enc.items()}
        return enc

    def execute(self):
        a = self.args
        t0 = time.perf_counter()
        try:
            for version, variant in self.configurations():
                name = a.task if a.task != "arct" else f"arct-{version}-{variant}"
                self.run.log(f"{name}: reading and encoding the data")
                enc = self.data(version, variant)
                self.run.log("  " + ", ".join(f"{s} {e.n_examples}" for s, e in enc.items()))
                if "probe" in a.inits:
                    self.probe(enc, version, variant)
                for init in ("pretrained", "random"):
                    if init in a.inits:
                        for seed in a.seeds:
                            self.fine_tune(enc, version, variant, init, seed, name)
        except KeyboardInterrupt:  # what finished is written, figures too, and run.json says so
            self.timing["interrupted"] = True
            raise
        finally:
            self.timing["total_s"] = round(time.perf_counter() - t0, 1)
            self.write(final=True)

    # -- the three columns

    def probe(self, enc, version, variant):
        from bertscope.tasks import model as task_model

        a, loaded = self.args, self.run.loaded
        t0 = time.perf_counter()
        pad, types = loaded.tokenizer.pad_token_id, loaded.takes_token_types
        feats = {s: task_model.cls_features(loaded.model, e, PROBE_BATCH, pad, types, a.device, self.bar(f"[CLS] {s}"))
                 for s, e in enc.items()}
        predict, C, dev_acc = task_model.linear_probe(feats["train"], enc["train"].labels, feats["dev"],
                                                      enc["dev"].labels, enc["train"].pairwise)
        seconds = round(time.perf_counter() - t0, 1)
        for split in ("dev", "test"):
            m = task_model.metrics(predict(feats[split]), enc[split].labels, f1=a.task != "arct")
            self.add_row(version, variant, "probe", "-", split, m, best_epoch=f"C={C}", dev=dev_acc, seconds=seconds)
        self.run.log(f"  probe (logistic regression on frozen [CLS], C={C}): dev {dev_acc:.4f}, "
                     f"test {self.rows[-1]['accuracy']:.4f} ({seconds} s)")
        self.write()

    def fine_tune(self, enc, version, variant, init, seed, name):
        from bertscope.tasks import model as task_model

        a = self.args
        loaded = task_model.classifier_model(a.model, num_labels(a.task), init, seed, a.device, revision=a.revision)
        model, pad, types = loaded.model, loaded.tokenizer.pad_token_id, loaded.takes_token_types
        desc = f"{name} {init} seed {seed}"
        self.run.log(f"  fine-tuning {desc}")
        result = task_model.fine_tune(model, enc["train"], enc["dev"], self.cfg, seed, pad, types,
                           progress=lambda items, d: self.bar(d)(items), log=self.run.log, desc=desc)
        checkpoint = ""
        if a.save == "all" or (a.save == "pretrained" and init == "pretrained"):
            checkpoint = self.save(loaded, name, init, seed, result)
        for split in ("dev", "test"):
            pred = task_model.predict(model, enc[split], a.batch_size, pad, types, a.precision, a.device)
            m = task_model.metrics(pred, enc[split].labels, f1=a.task != "arct")
            self.add_row(version, variant, init, seed, split, m, best_epoch=result.best_epoch, dev=result.best_dev,
                         seconds=result.seconds, checkpoint=checkpoint)
        for h in result.history:
            self.epochs = [r for r in self.epochs if not same(r, self.key(version, variant, init, seed))
                           or str(r["epoch"]) != str(h["epoch"])]
            self.epochs.append(dict(self.key(version, variant, init, seed), **h))
        self.run.log(f"  {desc}: best epoch {result.best_epoch} (dev {result.best_dev:.4f}), test accuracy "
                     f"{self.rows[-1]['accuracy']:.4f} ({result.seconds:.0f} s)")
        if init == "pretrained" and a.cosine_examples > 0:
            self.attention_change(loaded, enc["dev"], version, variant, seed)
        self.write()

    def attention_change(self, tuned, dev, version, variant, seed):
        import numpy as np

        from bertscope.analyses.finetune.attention_change import attention_cosine
        from bertscope.tasks import model as task_model
        from bertscope.tasks.inputs import EncodedTask

        a, ref = self.args, self.run.loaded
        t0 = time.perf_counter()
        keep = seeded_sample(list(range(len(dev.rows))), a.cosine_examples, a.seed)  # sequences, not data points
        flat = EncodedTask(dev.task, rows=[dev.rows[i] for i in keep],
                           types=None if dev.types is None else [dev.types[i] for i in keep],
                           labels=np.zeros(len(keep), dtype=np.int64), per_example=1, kind="classify")
        batches = [flat.batch(idx, ref.tokenizer.pad_token_id, a.device, with_types=ref.takes_token_types)
                   for idx in task_model.eval_batches(flat, a.batch_size)]
        sums = attention_cosine(ref, tuned, batches, progress=self.bar("attention cosine"))
        key = {"task": a.task, "data": version, "input": variant, "seed": seed}
        self.cosine = [r for r in self.cosine if not same(r, key)]
        self.cosine += [dict(key, layer=l + 1, head=h + 1, cosine=float(sums.mean[l, h]), n_inputs=sums.n)
                        for l in range(sums.mean.shape[0]) for h in range(sums.mean.shape[1])]
        self.run.log(f"  attention cosine over {sums.n} dev inputs: mean {sums.mean.mean():.3f}, per layer "
                     + " ".join(f"{v:.3f}" for v in sums.mean.mean(1)) + f" ({time.perf_counter() - t0:.0f} s)")

    # -- outputs

    def key(self, version, variant, init, seed):
        return {"task": self.args.task, "data": version, "input": variant, "init": init, "seed": seed}

    def add_row(self, version, variant, init, seed, split, m, best_epoch="", dev=float("nan"), seconds=0.0,
                checkpoint=""):
        key = self.key(version, variant, init, seed)
        self.rows = [r for r in self.rows if not (same(r, key) and r["split"] == split)]
        self.rows.append(dict(key, split=split, accuracy=m["accuracy"], f1=m.get("f1", ""), n=m["n"],
                              best_epoch=best_epoch, dev_accuracy=dev, train_s=seconds, checkpoint=checkpoint))

    def save(self, loaded, name, init, seed, result) -> str:
        rel = CHECKPOINT_DIR.format(name=name, init=init, seed=seed)
        path = self.run.dir / rel
        model = loaded.model
        labels = LABELS[self.args.task]
        model.config.id2label = dict(enumerate(labels))
        model.config.label2id = {v: k for k, v in enumerate(labels)}
        model.save_pretrained(path)
        loaded.tokenizer.save_pretrained(path)
        write_json(path / CHECKPOINT_RECORD, {
            "task": self.args.task, "name": name, "init": init, "seed": seed, "best_epoch": result.best_epoch,
            "dev_accuracy": result.best_dev, "history": result.history, "train": vars(self.cfg),
            "base_model": str(self.run.loaded.path), "data_split_seed": self.args.seed})
        return rel

    def write(self, final: bool = False):
        from bertscope.analyses.finetune.plots import cosine_figures

        d = self.run.dir
        write_csv(d / RESULTS_FILE, self.rows, RESULT_COLUMNS)
        summary = summarise(self.rows)
        write_csv(d / SUMMARY_FILE, summary, SUMMARY_COLUMNS)
        write_csv(d / EPOCHS_FILE, self.epochs, EPOCH_COLUMNS)
        names = [RESULTS_FILE, SUMMARY_FILE, EPOCHS_FILE]
        if self.cosine:
            write_csv(d / COSINE_FILE, self.cosine, COSINE_COLUMNS)
            names.append(COSINE_FILE)
        self.run.outputs = sorted(set(self.run.outputs) | set(names))
        results = {"test": [r for r in self.rows if r["split"] == "test"],
                   "summary": [r for r in summary if r["split"] == "test"],
                   "train": vars(self.cfg), "timing": self.timing}
        if not final:
            self.run.record["results"] = results
            self.run.save_record()
            return
        if not self.args.no_figures and self.cosine:
            for fig, filename in cosine_figures(self.cosine):
                self.run.save_figure(fig, filename)
        self.run.finish(results)
        if self.timing.get("interrupted"):
            self.run.record["status"] = "interrupted"
            self.run.save_record()


def same(row: dict, key: dict) -> bool:
    return all(str(row[k]) == str(v) for k, v in key.items())


def read_rows(path: Path) -> list[dict]:
    """Rows of an earlier call's CSV in the same run directory (kept unless run again)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            try:
                r[k] = float(v) if k in ("accuracy", "f1", "dev_accuracy", "train_s", "cosine", "train_loss") and v \
                    else v
            except ValueError:
                pass
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Mean and sample sd over seeds of every (task, data, input, init, split)."""
    import numpy as np

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in ("task", "data", "input", "init", "split")), []).append(r)
    out = []
    for key, rs in groups.items():
        acc = np.array([float(r["accuracy"]) for r in rs])
        f1 = np.array([float(r["f1"]) for r in rs if r["f1"] not in ("", None)])
        out.append(dict(zip(("task", "data", "input", "init", "split"), key), n_seeds=len(rs),
                        accuracy_mean=float(acc.mean()), accuracy_sd=float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                        f1_mean=float(f1.mean()) if len(f1) else "",
                        f1_sd=(float(f1.std(ddof=1)) if len(f1) > 1 else 0.0) if len(f1) else ""))
    return out


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, fine-tuning runs torch's
    attention, the attention change reads queries and keys with the eager backend."""
    return {}
