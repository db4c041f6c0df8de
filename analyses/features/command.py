"""`bertscope features`: attention to linguistic features per head (Kovaleva et al. 2019,
section 4.4, Figures 6-7). Definitions: `bertscope.analyses.features.stats`.

Inputs: one sentence per input from the treebanks (EWT dev, GUM; gold UPOS and relations),
one pair per input from the task data (RTE: text + hypothesis; ARCT: claim + reason, then
one warrant, both warrants of every argument; polarity: one sentence), where only negation,
punctuation and the special tokens can be found. Each data set is folded by the engine into
one `FeatureScores`, checkpointed as features_<data>.npz: `--resume DIR` continues an
interrupted run, and under torchrun every rank takes its share of the batches.
"""
from __future__ import annotations

from pathlib import Path

from bertscope.analyses.features.outputs import (
    CHECKPOINT,
    CLS_LAST_LAYER_FIGURE,
    FIG7_CSV,
    HEATMAP_FIGURE,
    LAYERS_FIGURE,
    SCORES_CSV,
)
from bertscope.cli.args import add_common_arguments, limit_arg
from bertscope.data.paths import seeded_sample
from bertscope.data.readers import tasks, treebank
from bertscope.errors import UserError
from bertscope.files import read_run
from bertscope.run.analysis_run import ModelRun
from bertscope.text.corpus import Document

# numpy, torch and what imports them (the statistics, the figures, the engine, the segments, the model loader)
# are imported inside the functions that run the analysis: the command line imports this module to build the
# command's parser, so a mistyped option is refused at once, not after the seconds those imports take
# (tests/cli/test_new_user.py)

ENCODERS_ONLY = "Kovaleva et al.'s feature attention is read on [CLS] ... [SEP] inputs (section 4.4)"

NAME = "features"
TREEBANKS = ("ewt", "gum")
TASK_DATA = ("rte", "arct", "polarity")
DATA = TREEBANKS + TASK_DATA
DEFAULT_LIMIT = 1000  # inputs per data set
CHECKPOINT_EVERY = 20  # batches between checkpoints


# ----------------------------------------------------------------------------- inputs

def read_inputs(data: str, data_dir: str | None, split: str) -> list:
    """The raw inputs of one data set: treebank `Sentence`s or `(id, text_a, text_b)`."""
    if data == "ewt":
        return treebank.read_ewt_dev(data_dir)
    if data == "gum":
        return [s for doc in treebank.read_gum(data_dir) for s in doc.sentences]
    if data == "arct":
        return [(f"{ex.id}/w{k}", f"{ex.claim} {ex.reason}", w) for ex in tasks.read_arct(split, data_dir=data_dir)
                for k, w in enumerate(ex.warrants)]
    examples = tasks.read_task(data, split, data_dir)
    return [(ex.id, ex.text_a, ex.text_b) for ex in examples]


def make_segments(data: str, inputs: list, tokenizer, max_len: int) -> tuple[list, dict]:
    """Segments with their feature classes set, and what was dropped or cut."""
    from bertscope.analyses.features.stats import set_classes, word_tags
    from bertscope.text.segments import SegmentOptions
    from bertscope.text.segments import make_segments as text_segments
    from bertscope.text.word_segments import word_segment

    segments, report = [], dict(inputs=len(inputs), too_long=0, truncated=0, empty=0)
    if data in TREEBANKS:
        for s in inputs:
            segment = word_segment(s.words, tokenizer, max_len, doc_id=s.sent_id)
            if segment is None:
                report["too_long"] += 1
                continue
            segments.append(set_classes(segment, word_tags(s.words, s.upos, s.deprels), tokenizer))
    else:
        documents = [Document(doc_id, [a] if b is None else [a, b]) for doc_id, a, b in inputs]
        made, seg_report = text_segments(documents, tokenizer, SegmentOptions(max_len=max_len, limit=None))
        segments = [set_classes(segment, word_tags(segment.words), tokenizer) for segment in made]
        report.update(truncated=seg_report.truncated, empty=seg_report.empty)
    report["used"] = len(segments)
    return segments, report


# ----------------------------------------------------------------------------- the run

def checkpoint_path(run_dir: Path, data: str, world) -> Path:
    return run_dir / CHECKPOINT.format(data=data, suffix=world.suffix())


def score_data(loaded, data: str, segments: list, args, run_dir: Path, world, progress: bool):
    """Fold one data set's segments into a `FeatureScores`, resuming from its checkpoint."""
    from bertscope.analyses.features.stats import FEATURES, NEEDS, SCHEME, TASK_FEATURES, FeatureScores
    from bertscope.engine.loop import EngineOptions, fold

    features = FEATURES if data in TREEBANKS else TASK_FEATURES
    path = checkpoint_path(run_dir, data, world)
    if path.exists():
        try:
            acc = FeatureScores.load(path)
        except ValueError as e:
            raise UserError(f"cannot resume: {e}") from None
    else:
        acc = FeatureScores(loaded.n_layers, loaded.n_heads, SCHEME, features)
    spec = NEEDS
    options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=progress,
                            checkpoint_every=CHECKPOINT_EVERY)
    fold(loaded, segments, spec, [acc], options, classes=SCHEME, checkpoint=lambda: acc.save(path),
         shard=(world.rank, world.size), desc=f"{data} features")
    if world.size > 1:
        acc.all_reduce()
    return acc


def run(args) -> Path:
    datas = DATA if args.data == "all" else (args.data,)
    raw = {d: seeded_sample(read_inputs(d, args.data_dir, args.split), args.limit, args.seed) for d in datas}
    earlier = earlier_results(args.out, datas)
    with ModelRun(NAME, args, distributed=True, resumable=True, encoders_only=ENCODERS_ONLY) as run_:
        return score(run_, args, datas, raw, earlier)


def score(run_: ModelRun, args, datas: tuple[str, ...], raw: dict, earlier: dict) -> Path:
    """`run` once the model has loaded (on every rank): each data set's scores, then the outputs."""
    from bertscope.analyses.features.stats import FeatureScores, summary

    loaded, run_dir, progress, log, world = run_.loaded, run_.dir, run_.progress, run_.log, run_.world
    results, rows = {}, []
    for data in datas:
        segments, report = make_segments(data, raw[data], loaded.tokenizer, args.max_len)
        if not segments:
            raise UserError(f"{data}: no input fits --max-len {args.max_len}")
        log(f"{data}: {report['used']} inputs" + (f", {report['too_long']} sentences longer than {args.max_len} "
                                                   "tokens skipped" if report["too_long"] else "")
            + (f", {report['truncated']} cut to {args.max_len} tokens" if report["truncated"] else ""))
        acc = score_data(loaded, data, segments, args, run_dir, world, progress)
        if world.is_main:
            rows += acc.rows(data)
            results[data] = {**report, **summary(acc)}
            if world.size > 1:
                acc.save(run_dir / CHECKPOINT.format(data=data, suffix=""))
            run_.outputs.append(CHECKPOINT.format(data=data, suffix=""))
    run_.shutdown()
    if not world.is_main:
        return run_dir
    for data, result in earlier.items():  # data sets an earlier command wrote into this directory
        rows += FeatureScores.load(run_dir / CHECKPOINT.format(data=data, suffix="")).rows(data)
        results[data] = result
        run_.outputs.append(CHECKPOINT.format(data=data, suffix=""))
    rows.sort(key=lambda r: DATA.index(r["data"]))  # stable: layers and heads stay in order
    write_outputs(run_, rows, {d: results[d] for d in DATA if d in results})
    return run_dir


def earlier_results(out: str | None, datas: tuple[str, ...]) -> dict:
    """Results of other data sets that an earlier `bertscope features` wrote into `out`
    (their checkpoints still there), so the tables and figures cover all of them."""
    path = Path(out or "") / "run.json"
    if not out or not path.is_file():
        return {}
    record = read_run(path)["analyses"].get(NAME) or {}
    return {data: result for data, result in (record.get("results") or {}).items()
            if data not in datas and (path.parent / CHECKPOINT.format(data=data, suffix="")).is_file()}


def write_outputs(run_, rows: list[dict], results: dict):
    from bertscope.analyses.features import plots
    from bertscope.analyses.features.stats import COLUMNS
    from bertscope.models.loading import model_name

    label = model_name(run_.loaded.path)
    run_.write_csv(SCORES_CSV, rows, COLUMNS)
    last = max(r["layer"] for r in rows)
    run_.write_csv(FIG7_CSV, [{k: r[k] for k in ("data", "feature", "layer", "head", "cls_mass", "n_inputs")}
                              for r in rows if r["layer"] == last],
                   ("data", "feature", "layer", "head", "cls_mass", "n_inputs"))
    for data in results:
        run_.save_figure(plots.plot_feature_heatmaps(rows, data, f"{label} on {data.upper()}: attention to each "
                                                     "feature (Kovaleva et al. Fig. 6)"),
                         HEATMAP_FIGURE.format(data=data))
    run_.save_figure(plots.plot_cls_last_layer(rows, f"{label}: last layer's [CLS] row per feature "
                                               "(Kovaleva et al. Fig. 7)"), CLS_LAST_LAYER_FIGURE)
    run_.save_figure(plots.plot_layer_profile(rows, f"{label}: mean feature score by layer"),
                     LAYERS_FIGURE)
    for data, r in results.items():
        ranked = sorted(r["features"].items(), key=lambda kv: -kv[1]["best"])
        run_.log(f"{data} ({r['used']} inputs): best head per feature: "
                 + ", ".join(f"{f} {v['best_head']} {v['best']:.3f}" for f, v in ranked)
                 + f"; heads whose top feature is [CLS]/[SEP]: {r['heads_won_by_special']} of {r['heads']}")
    run_.finish(results)


# ----------------------------------------------------------------------------- command line

HELP = "attention each head gives to nouns, verbs, pronouns, subjects, objects, negation, [CLS], [SEP]"
DESCRIPTION = (
    "Kovaleva et al. (2019, section 4.4): for every head, the attention all tokens give to one token of a feature, "
    "divided by the input's length, the maximum over the feature's tokens, averaged over the inputs that have the "
    "feature. Tagged features (gold UPOS nouns, verbs, pronouns, punctuation; UD nsubj and obj) on EWT dev and GUM "
    "sentences; negation words (the paper's list), punctuation, [CLS] and [SEP] also on RTE, ARCT and sentence "
    "polarity. Writes features_scores.csv (data, feature, layer, head, score, cls_mass, top_share, n_inputs), "
    "features_cls_last_layer.csv (Figure 7), layer x head heatmaps per data set, and a run.json entry.")


def add_arguments(p):
    p.add_argument("--data", choices=DATA + ("all",), default="ewt", help="data set (default: ewt)")
    p.add_argument("--limit", type=limit_arg, default=DEFAULT_LIMIT, metavar="N",
                   help=f"inputs per data set, a seeded sample, or 'all' (default: {DEFAULT_LIMIT})")
    p.add_argument("--split", choices=("train", "dev", "test"), default="dev",
                   help="split of the task data (RTE, ARCT, polarity; default: dev)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    add_common_arguments(p, from_word=False)


def main(args) -> int:
    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, command="features")
    run(args)
    return 0


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): `NEEDS`."""
    from bertscope.analyses.features.stats import NEEDS

    return {"column and class masses": NEEDS}
