"""`bertscope patterns`: Kovaleva et al. (2019) section 4.1, five attention pattern types per head.

    bertscope patterns --data wiki,rte,arct,polarity     type proportions per head, layer, data set
    bertscope patterns label --data wiki --limit 300     a labels file of resized real maps + rule labels
    bertscope patterns train --labels FILE               the paper's CNN on a labels file; F1 held out

Classifying streams per-example statistics through `engine.fold` (`analyses.patterns`: the
rules and why), so it checkpoints every few batches, resumes with `--resume DIR` and shards
under torchrun like `bertscope run`. Only the maps drawn as Figure 1-style examples (the
first `--examples` segments of each data set) and the maps of `label` are materialised.

Data sets, each `[CLS] A [SEP] B [SEP]` (token classes from `token_classes.PARTS`):
    wiki      Clark-style Wikipedia segments (two runs of sentences), as `bertscope run`
    rte       premise / hypothesis
    arct      claim + " " + reason / one warrant: two segments per argument, one per warrant
    polarity  a single sentence `[CLS] S [SEP]`: no part B, so no Block
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bertscope.analyses.patterns.outputs import (
    CNN_FILE,
    CNN_SCORES_FILE,
    COUNTS_CHECKPOINT,
    EXAMPLES_FIGURE,
    HEADS_FILE,
    LABELS_FILE,
    LAYERS_FIGURE,
    NAME,
    OVERALL_FIGURE,
    PATTERNS_FILE,
    TABLE_TEXT,
    Thresholds,
)
from bertscope.cli.args import add_common_arguments, limit_arg, positive_int
from bertscope.data.readers.tasks import read_task
from bertscope.errors import UserError
from bertscope.files import write_json
from bertscope.run.analysis_run import ModelRun
from bertscope.run.rundir import new_run_dir
from bertscope.text.corpus import Document, open_corpus

if TYPE_CHECKING:
    import numpy as np

    from bertscope.analyses.patterns import stats as P

# numpy, torch and what imports them (the statistics, the CNN, the figures, the engine, the kernels, the
# segments, the model loader) are imported inside the functions that run the analysis: the command line
# imports this module to build the command's parser, so a mistyped option is refused at once, not after the
# seconds those imports take (tests/cli/test_new_user.py)

ENCODERS_ONLY = "Kovaleva et al.'s five pattern types are read off [CLS] ... [SEP] inputs (section 4.1)"

logger = logging.getLogger(__name__)

DATA = ("wiki", "rte", "arct", "polarity")
ACTIONS = ("classify", "label", "train")
HELP = "five attention pattern types per head (Kovaleva et al. 2019, section 4.1, Figures 1-2)"
DESCRIPTION = (
    "classify (default): sort every (example, head) map into Vertical, Diagonal, Vertical+Diagonal, Block or "
    "Heterogeneous by rules on streamed statistics, and report the proportions per head, layer and data set "
    "(patterns.csv, fig_patterns.png). label: write resized real maps with their rule labels (labels_<data>.npz). "
    "train: train the paper's 8-layer CNN on a labels file, with F1 and Cohen's kappa on held-out segments.")
CHECKPOINT_EVERY = 20  # batches between checkpoints of the counts
# settings a resumed run takes from run.json
RESUMED = ("data", "split", "arct_version", "limit", "seed", "max_len", "batch_size", "model", "revision", "examples",
           "structured", "mix", "own", "spread", "data_dir")


def add_arguments(p):
    p.add_argument("action", nargs="?", choices=ACTIONS, default="classify", help="what to do (default: classify)")
    add_common_arguments(p, from_word=False)
    p.set_defaults(batch_size=16)
    p.add_argument("--data", "--corpus", dest="data", default="wiki", metavar="NAMES",
                   help=f"comma-separated data sets of {', '.join(DATA)} (default: wiki)")
    p.add_argument("--split", choices=("train", "dev", "test"), default="dev",
                   help="split of the task data (rte, arct, polarity; bertscope.data.readers.tasks) (default: dev)")
    p.add_argument("--arct-version", choices=("original", "adversarial"), default="original",
                   help="ARCT data: the original or Niven & Kao's adversarial set (default: original)")
    p.add_argument("--limit", type=limit_arg, default=1000, metavar="N",
                   help="segments per data set, sampled with --seed; 'all' for every one (default: 1000, as the paper)")
    p.add_argument("--examples", type=int, default=16, metavar="N",
                   help="classify: segments whose maps are materialised to draw one example map per type (default: 16; "
                   "0: none)")
    t = Thresholds()
    p.add_argument("--structured", type=float, default=t.structured,
                   help=f"special + diagonal mass that makes a map striped/lined (default: {t.structured})")
    p.add_argument("--mix", type=float, default=t.mix,
                   help=f"least share of each of vertical and diagonal in a Vertical+Diagonal map (default: {t.mix})")
    p.add_argument("--own", type=float, default=t.own,
                   help=f"share of word mass on the query's own part for Block (default: {t.own})")
    p.add_argument("--spread", type=float, default=t.spread,
                   help=f"word-row entropy over ln(own part length) for Block (default: {t.spread})")
    p.add_argument("--resume", metavar="DIR", default=None, help="classify: continue an interrupted run in DIR")
    p.add_argument("--labels", metavar="FILE", default=None,
                   help="train: a labels file (.npz: maps (N, G, G), labels (N,), types; see analyses/pattern_cnn.py)")
    p.add_argument("--eval-labels", metavar="FILE", default=None,
                   help="train: also score the CNN against the labels of another file (other maps)")
    p.add_argument("--held-out", type=float, default=0.25,
                   help="train: share of the labels file's segments held out for F1 and kappa (default: 0.25)")
    p.add_argument("--epochs", type=positive_int, default=8, help="train: passes over the training maps (default: 8)")
    p.add_argument("--balanced", action="store_true",
                   help="train: weigh each type by its inverse frequency in the loss (default: plain cross entropy)")


def thresholds(args) -> Thresholds:
    t = Thresholds(args.structured, args.mix, args.own, args.spread)
    for name, value in t.as_dict().items():
        if not 0 <= value <= 1:
            raise UserError(f"--{name} must lie in [0, 1], not {value}")
    return t


def data_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in DATA]
    if bad or not names:
        raise UserError(f"--data (or --corpus) takes names of data sets, {', '.join(DATA)} (comma-separated), not "
                        f"{text!r}: bertscope patterns reads no corpus file")
    return list(dict.fromkeys(names))


# ----------------------------------------------------------------------------- segments


def documents(name: str, args) -> list:
    """The data set's inputs as `Document`s of one or two parts."""
    if name == "arct":
        return [Document(f"{ex.id}:w{k}", [f"{ex.claim} {ex.reason}", w])
                for ex in read_task("arct", args.split, args.data_dir, args.seed, args.arct_version)
                for k, w in enumerate(ex.warrants)]
    examples = read_task(name, args.split, args.data_dir, args.seed)
    return [Document(ex.id, [ex.text_a] if ex.text_b is None else [ex.text_a, ex.text_b]) for ex in examples]


def segment_stream(name: str, args, tokenizer, report):
    """Segments of one data set, made lazily, each with its PARTS class ids."""
    from bertscope.text.segments import SegmentOptions, iter_segments
    from bertscope.text.token_classes import part_ids

    docs = open_corpus("wiki") if name == "wiki" else documents(name, args)
    options = SegmentOptions(max_len=args.max_len, limit=args.limit, seed=args.seed)
    for segment in iter_segments(docs, tokenizer, options, report):
        segment.token_class = part_ids(segment, tokenizer)
        yield segment


def first_segments(name: str, args, tokenizer, n: int) -> list:
    from bertscope.text.segments import SegmentReport

    out = []
    for segment in segment_stream(name, args, tokenizer, SegmentReport()):
        if len(out) >= n:
            break
        out.append(segment)
    return out


# ----------------------------------------------------------------------------- materialised maps


def iter_maps(loaded, segments, t: Thresholds, batch_size: int = 8, progress: bool = False, desc: str = "maps"):
    """(segment, maps (layers, H, L, L) float32, types (layers, H), features) for each segment:
    the batch's own statistics classify, the maps come from the kept q and k."""
    import numpy as np
    import torch

    from bertscope.analyses.patterns import stats as P
    from bertscope.engine.loop import stream_batches
    from bertscope.kernels.common import masked_scores

    spec = P.MAP_SPEC
    for batch in stream_batches(loaded, segments, spec, batch_size=batch_size, classes=P.CLASSES,
                                progress=progress, desc=desc):
        kinds, feats, maps = [], [], []
        for layer, stats in enumerate(batch.layers):
            kind, feat = P.batch_types(batch, layer, t)
            kinds.append(kind)
            feats.append(feat)
            scores = masked_scores(stats.queries, stats.keys, batch.key_valid, stats.scale)  # (B, H, L, L)
            maps.append(torch.softmax(scores.float(), dim=-1))
        kinds = torch.stack(kinds, 1).cpu().numpy()  # (B, layers, H)
        maps = torch.stack(maps, 1).cpu().numpy()  # (B, layers, H, L, L)
        for row, segment in enumerate(batch.segments):
            n = segment.n_tokens
            feat = {k: np.stack([f[k][row].double().cpu().numpy() for f in feats]) for k in P.FEATURES}  # (layers, H)
            yield batch.indices[row], segment, maps[row, :, :, :n, :n], kinds[row], feat


def typicality(kind: str, f: dict) -> float:
    """How clearly a map shows its type, to pick the example drawn for it."""
    return {"Vertical": f["special"], "Diagonal": f["diagonal"], "Vertical+Diagonal": min(f["special"], f["diagonal"]),
            "Block": f["own"] * min(1.0, f["spread"]),
            "Heterogeneous": (1 - f["special"] - f["diagonal"]) / (1 + f["entropy"])}[kind]  # unlined, yet peaked


def pick_examples(loaded, segments, t: Thresholds) -> list[dict]:
    """For each type, the clearest map of it among `segments` (only five maps are kept)."""
    import numpy as np

    from bertscope.analyses.patterns import stats as P

    best: dict[str, dict] = {}
    for index, segment, maps, kinds, feat in iter_maps(loaded, segments, t):
        for layer, head in np.ndindex(*kinds.shape):
            kind = P.TYPES[kinds[layer, head]]
            f = {k: float(v[layer, head]) for k, v in feat.items()}
            score = typicality(kind, f)
            if kind not in best or score > best[kind]["score"]:
                best[kind] = dict(type=kind, score=score, map=maps[layer, head].copy(), layer=layer + 1, head=head + 1,
                                  segment=index, doc_id=segment.doc_id, features=f,
                                  tokens=loaded.tokenizer.convert_ids_to_tokens(segment.input_ids))
    return [best[k] for k in P.TYPES if k in best]


# ----------------------------------------------------------------------------- classify


def classify(args) -> int:
    if args.resume:
        args = ModelRun.resumed_args(NAME, args, add_arguments, keys=RESUMED, command="patterns")
    names, t = data_names(args.data), thresholds(args)
    for name in names:  # missing data fails before a run directory exists
        if name != "wiki":
            documents(name, args)
    with ModelRun(NAME, args, distributed=True, resumable=True, encoders_only=ENCODERS_ONLY) as run:
        return count(run, args, names, t)


def count(run: ModelRun, args, names: list[str], t: Thresholds) -> int:
    """`classify` once the model has loaded (on every rank): each data set's counts, then the outputs."""
    from bertscope.analyses.patterns import stats as P
    from bertscope.engine.loop import EngineOptions, fold
    from bertscope.text.segments import SegmentReport

    loaded, log, progress, run_dir, world = run.loaded, run.log, run.progress, run.dir, run.world
    results, by_data = {"thresholds": t.as_dict(), "types": list(P.TYPES), "data": {}}, {}
    for name in names:
        t0 = time.perf_counter()
        path = run_dir / COUNTS_CHECKPOINT.format(data=name, suffix=world.suffix())
        counts = P.PatternCounts(loaded.n_layers, loaded.n_heads, t)
        if args.resume and path.exists():
            counts = P.PatternCounts.load(path)
            if counts.thresholds != t:
                raise UserError(f"{path} was counted with other thresholds")
            log(f"{name}: resuming after batch {counts.batches_done}")
        report = SegmentReport()
        options = EngineOptions(batch_size=args.batch_size, backend=args.backend, progress=progress, total=args.limit,
                                checkpoint_every=CHECKPOINT_EVERY)
        fold(loaded, segment_stream(name, args, loaded.tokenizer, report), P.SPEC, [counts], options,
             classes=P.CLASSES, checkpoint=lambda counts=counts, path=path: counts.save(path),
             shard=(world.rank, world.size),
             desc=f"patterns {name}")
        counts = all_reduce_counts(world, counts)
        by_data[name] = counts
        results["data"][name] = dict(examples=counts.n_examples, overall=P.overall(counts),
                                     segments=report.as_dict(), wall_s=round(time.perf_counter() - t0, 2))
    run.shutdown()
    if not world.is_main:
        return 0
    write_outputs(run, by_data, results, names, args, t)
    return 0


def all_reduce_counts(world, counts: P.PatternCounts) -> P.PatternCounts:
    import torch
    import torch.distributed as dist

    if world.size == 1:
        return counts

    for name in ("counts", "feature_sums"):
        dist.all_reduce(torch.from_numpy(getattr(counts, name)))  # in place on the numpy buffer
    n = torch.tensor([counts.n_examples], dtype=torch.int64)
    dist.all_reduce(n)
    counts.n_examples = int(n.item())
    return counts


def write_outputs(run, by_data: dict, results: dict, names: list[str], args, t: Thresholds):
    from bertscope.analyses.patterns import plots
    from bertscope.analyses.patterns import stats as P
    from bertscope.models.loading import model_name

    label = model_name(run.loaded.path)
    run.write_csv(PATTERNS_FILE, [r for n in names for r in by_data[n].tidy_rows(n)], P.TIDY_COLUMNS)
    run.write_csv(HEADS_FILE, [r for n in names for r in by_data[n].head_rows(n)], P.HEAD_COLUMNS)
    for name in names:
        by_data[name].save(run.dir / COUNTS_CHECKPOINT.format(data=name, suffix=""))
    table = format_table({n: results["data"][n]["overall"] for n in names}, {n: by_data[n].n_examples for n in names})
    logger.info(table.rstrip("\n"))
    run.write_text(TABLE_TEXT, table)
    if not args.no_figures:
        run.save_figure(plots.plot_overall({n: results["data"][n]["overall"] for n in names},
                                       f"{label}: attention pattern types (rules on streamed statistics)"),
                        OVERALL_FIGURE)
        run.save_figure(plots.plot_layers(by_data, f"{label}: pattern types by layer"), LAYERS_FIGURE)
        if args.examples > 0:
            results["example_maps"] = {}
            for name in names:
                picked = pick_examples(run.loaded, first_segments(name, args, run.loaded.tokenizer, args.examples), t)
                results["example_maps"][name] = [{k: ex[k] for k in ("type", "layer", "head", "segment", "doc_id",
                                                                      "features")} for ex in picked]
                run.save_figure(plots.plot_examples(picked, f"{label}, {name}: one map per type (first {args.examples} "
                                                "segments)"), EXAMPLES_FIGURE.format(data=name))
    run.finish(results)


def format_table(shares: dict[str, dict[str, float]], n: dict[str, int]) -> str:
    from bertscope.analyses.patterns import stats as P

    head = f"{'data':<10}{'examples':>9}" + "".join(f"{t:>19}" for t in P.TYPES)
    lines = [head] + [f"{d:<10}{n[d]:>9}" + "".join(f"{100 * shares[d][t]:>18.1f}%" for t in P.TYPES) for d in shares]
    return "Pattern types, % of (example, head) maps\n" + "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- label / train


def label(args) -> int:
    """A labels file per data set: every head's map of --limit segments, resized, with its rule label."""
    names, t = data_names(args.data), thresholds(args)
    with ModelRun(NAME + "_label", args, encoders_only=ENCODERS_ONLY) as run:
        write_labels(run, args, names, t)
    return 0


def write_labels(run: ModelRun, args, names: list[str], t: Thresholds):
    import numpy as np

    from bertscope.analyses.patterns import cnn as C
    from bertscope.analyses.patterns import stats as P
    from bertscope.models.loading import model_name

    results = {}
    for name in names:
        maps, labels, source = [], [], []
        for index, _segment, m, kinds, _feat in iter_maps(run.loaded, first_segments(name, args, run.loaded.tokenizer,
                                                                                      args.limit or 10**9),
                                                         t, progress=run.progress, desc=f"label {name}"):
            for layer, head in np.ndindex(*kinds.shape):
                maps.append(C.resize_map(m[layer, head]).astype(np.float16))
                labels.append(int(kinds[layer, head]))
                source.append((index, layer + 1, head + 1))
        path = run.dir / LABELS_FILE.format(data=name)
        C.save_labels(path, np.stack(maps), np.array(labels), np.array(source),
                      dict(model=model_name(run.loaded.path), data=name, split=args.split, seed=args.seed,
                           labeller="rules", thresholds=t.as_dict()))
        run.outputs.append(path.name)
        results[name] = dict(maps=len(labels), counts=dict(zip(P.TYPES, map(int, np.bincount(labels, minlength=5)))))
        run.log(f"{name}: {len(labels)} maps -> {path}")
    run.finish(results)


def train(args) -> int:
    import numpy as np
    import torch

    from bertscope.analyses.patterns import cnn as C

    if not args.labels:
        raise UserError("patterns train needs --labels FILE")
    if not 0 < args.held_out < 1:
        raise UserError(f"--held-out must lie in (0, 1), not {args.held_out}")
    try:
        maps, labels, meta = C.load_labels(args.labels)
        other = C.load_labels(args.eval_labels) if args.eval_labels else None
    except (ValueError, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    if args.threads:
        torch.set_num_threads(args.threads)
    with np.load(args.labels) as f:  # which segment each map came from (-1: generated maps, split by map)
        source = f["source"] if "source" in f else np.full((len(labels), 3), -1)
    train_idx, test_idx = held_out_split(source[:, 0], args.held_out, args.seed)
    t0 = time.perf_counter()
    model = C.train_cnn(maps[train_idx], labels[train_idx], epochs=args.epochs, seed=args.seed,
                        progress=not args.quiet, balanced=args.balanced)
    results = dict(labels=str(args.labels), labels_meta=meta, train_maps=len(train_idx), held_out_maps=len(test_idx),
                   epochs=args.epochs, balanced=args.balanced, train_s=round(time.perf_counter() - t0, 2),
                   held_out=C.scores(labels[test_idx], C.predict(model, maps[test_idx])))
    if other is not None:
        results["eval"] = dict(labels=str(args.eval_labels), **C.scores(other[1], C.predict(model, other[0])))
    out = Path(args.out) if args.out else new_run_dir(None)
    out.mkdir(parents=True, exist_ok=True)
    C.save_model(model, out / CNN_FILE, dict(labels=str(args.labels)))
    write_json(out / CNN_SCORES_FILE, results)
    for key in ("held_out", "eval"):
        if key in results:
            s = results[key]
            logger.info(f"{key}: {s['n']} maps, accuracy {s['accuracy']:.3f}, macro F1 {s['f1_macro']:.3f}, "
                  f"weighted F1 {s['f1_weighted']:.3f}, Cohen's kappa {s['kappa']:.3f}")
    logger.info(f"wrote {CNN_FILE} and {CNN_SCORES_FILE} to {out}")
    return 0


def held_out_split(segment: np.ndarray, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of training and held-out maps, split by segment: all heads of a segment fall on
    one side, so the held-out maps are maps of other inputs (generated maps: split by map)."""
    import numpy as np

    from bertscope.analyses.patterns.cnn import split_indices

    if (segment < 0).all():
        return split_indices(len(segment), held_out, seed)
    units = np.unique(segment)
    _, test_units = split_indices(len(units), held_out, seed)
    test = np.isin(segment, units[test_units])
    return np.flatnonzero(~test), np.flatnonzero(test)


def main(args) -> int:
    return {"classify": classify, "label": label, "train": train}[args.action](args)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the pattern counts'
    and the map pass's."""
    from bertscope.analyses.patterns import stats as P

    return {"patterns": P.SPEC, "maps": P.MAP_SPEC}
