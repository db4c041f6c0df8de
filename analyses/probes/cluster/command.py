"""`bertscope probe cluster`: heads of all layers compared by Jensen-Shannon divergence and
laid out in 2-D by multidimensional scaling (Clark et al. 2019, section 6, Fig. 6).

One pass over the corpus sample: each batch's forward pass hands over every layer's queries
and keys (`StatsSpec.keep_qk`) together with the surface statistics; the JS sums between all
layers x heads heads are computed from the q/k of all layers stacked along the head axis
(`bertscope.kernels.js.pairwise_js`), and the surface sums (`HeadStats`) give each head's
behaviour label. Segments are made exactly as `bertscope run` makes them.

The JS pass costs O(pairs x L^2) per segment (2,556 head pairs for 6 x 12 heads), far more
than the forward pass: the default sample is 200 segments of up to 128 tokens.
"""
from __future__ import annotations

from bertscope.analyses.probes.cluster.outputs import (
    JS_FILE,
    LAYERS_FIGURE,
    LAYERS_FILE,
    MDS_FIGURE,
    MDS_FILE,
)
from bertscope.cli.args import JS_BACKEND_CHOICES as JS_BACKENDS
from bertscope.cli.args import add_common_arguments, limit_arg
from bertscope.errors import UserError
from bertscope.run.analysis_run import ModelRun
from bertscope.text.corpus import load_corpus

# torch and what imports it (the statistics, the figures, the segments, the model loader) are imported inside
# the functions that run the analysis: the command line imports this module to build the command's parser, so
# a mistyped option is refused at once, not after the seconds those imports take (tests/cli/test_new_user.py)

NAME = "cluster"
DEFAULT_LIMIT = 200
HELP = "cluster heads by the Jensen-Shannon divergence of their attention, MDS to 2-D (Clark et al. 2019, section 6)"
DESCRIPTION = (
    "Sum the Jensen-Shannon divergence between the attention of every pair of heads (all layers) over "
    "the query tokens of a corpus sample, embed the heads in 2-D by multidimensional scaling, and mark "
    "each head's surface behaviour (broad, previous, next, [CLS], [SEP], punctuation). Writes "
    "cluster_js.csv (every pair), cluster_mds.csv (coordinates, behaviour and the surface numbers behind it), "
    "cluster_layers.csv (mean JS between the heads of two layers), fig_cluster_mds.png and "
    "fig_cluster_layers.png. Segments are made as `bertscope run` makes them."
)


def add_arguments(p):
    add_common_arguments(p, from_word=False)
    p.add_argument("--corpus", default="wiki",
                   help="'wiki' (Wikipedia lead sections) or a UTF-8 text file with one segment per line; "
                   "a tab separates the two parts of a pair (default: wiki)")
    p.add_argument("--limit", type=limit_arg, default=DEFAULT_LIMIT, metavar="N",
                   help=f"number of segments, sampled with --seed; 'all' for every one (default: {DEFAULT_LIMIT}; "
                   "the JS pass costs about 0.2 s of one CPU core per Wikipedia segment for 6 x 12 heads)")
    p.add_argument("--token-types", choices=("pair", "zeros"), default="pair",
                   help="token type ids, as in `bertscope run` (default: pair)")
    p.add_argument("--packing", choices=("clark", "balanced"), default="clark",
                   help="how Wikipedia text becomes segments, as in `bertscope run` (default: clark)")
    p.add_argument("--labels", choices=("clark", "bertscope"), default="clark",
                   help="behaviour label rules: 'clark', the cut-offs of Clark et al.'s released notebook "
                   "(next/previous > 0.5, [CLS]/[SEP]/punctuation > 0.6, entropy > 3.8 nats scaled with "
                   "ln L; the last test passed wins), or 'bertscope', the earlier rules of this project "
                   "(default: clark)")
    p.add_argument("--js-backend", choices=JS_BACKENDS, default="chunked",
                   help="pairwise JS kernel: eager (the reference, slow), chunked (CPU) or triton (GPU) "
                   "(default: chunked)")


def check_js_backend(name: str):
    import torch

    if name != "triton":
        return
    try:
        from bertscope.kernels import triton_js  # noqa: F401
    except ImportError:
        raise UserError("--js-backend triton is not available here (bertscope.kernels.triton_js is not "
                        "built or triton is not installed); use chunked") from None
    if not torch.cuda.is_available():
        raise UserError("--js-backend triton needs a CUDA GPU; use chunked on CPU")


def main(args) -> int:
    check_js_backend(args.js_backend)
    documents, corpus_report = load_corpus(args.corpus)  # a bad corpus should not leave a run directory
    with ModelRun(NAME, args) as probe:
        cluster_heads(probe, args, documents, corpus_report)
    return 0


def cluster_heads(probe: ModelRun, args, documents, corpus_report):
    from bertscope.analyses.probes.cluster import plots
    from bertscope.analyses.probes.cluster import stats as cluster
    from bertscope.analyses.surface import stats as surface
    from bertscope.models.loading import model_name
    from bertscope.text.segments import SegmentOptions, make_segments

    loaded = probe.loaded
    options = SegmentOptions(max_len=args.max_len, limit=args.limit, seed=args.seed, token_types=args.token_types,
                             packing=args.packing)
    segments, seg_report = make_segments(documents, loaded.tokenizer, options)
    if not segments:
        raise UserError(f"no usable segments in corpus {args.corpus!r}: {seg_report.as_dict()}")
    probe.record.update(corpus=corpus_report.as_dict(), segments=seg_report.as_dict())
    Ly, H = loaded.n_layers, loaded.n_heads
    probe.log(f"{len(segments)} segments from {args.corpus}; JS between {Ly * H} heads "
              f"({Ly * H * (Ly * H - 1) // 2} pairs), backend {args.js_backend}")

    sums = cluster.js_sums(loaded, segments, args.js_backend, args.batch_size, args.backend, probe.progress)
    js_mean = cluster.mean_per_token(sums.js_sum, sums.n_tokens)  # (N, N)
    table = surface.head_table(sums.stats)
    uniform = sums.stats.uniform_entropy()
    thresholds = cluster.thresholds_for(args.labels)
    labels = cluster.behaviours(table, uniform, thresholds)  # (layers, H)
    xy = cluster.embed(js_mean, seed=args.seed)  # (N, 2)
    layer_js = cluster.layer_mean_js(js_mean, Ly, H)  # (layers, layers)

    probe.write_csv(JS_FILE, cluster.js_rows(sums.js_sum, sums.n_tokens, Ly, H), cluster.JS_COLUMNS)
    probe.write_csv(MDS_FILE, cluster.mds_rows(xy, labels, table, Ly, H), cluster.mds_columns(table))
    probe.write_csv(LAYERS_FILE,
                    [{"layer_a": a + 1, "layer_b": b + 1, "js_mean_per_token": float(layer_js[a, b])}
                     for a in range(Ly) for b in range(Ly)], ("layer_a", "layer_b", "js_mean_per_token"))
    if not args.no_figures:
        title = model_name(loaded.path)
        probe.save_figure(plots.plot_mds(xy, labels, Ly, H, title), MDS_FIGURE)
        probe.save_figure(plots.plot_layer_js(layer_js, title), LAYERS_FIGURE)

    closeness = cluster.layer_closeness(js_mean, Ly, H)
    probe.log(f"head clustering over {sums.n_tokens} tokens of {len(segments)} segments "
              f"(head = layer-head, from 1):")
    probe.log(cluster.summary(js_mean, labels, Ly, H))
    probe.finish({
        "n_segments": len(segments),
        "n_tokens": sums.n_tokens,
        "js_backend": args.js_backend,
        "uniform_entropy": round(uniform, 4),
        "js_mean_within_layer": round(closeness["within"], 4),
        "js_mean_between_layers": round(closeness["between"], 4),
        "js_mean_adjacent_layers": round(closeness["adjacent"], 4),
        "nearest_head_same_layer": closeness["nearest_same_layer"],
        "nearest_head_same_layer_chance": round(closeness["nearest_chance"], 4),
        "closest_pairs_across_layers": [[a, b, round(v, 4)] for a, b, v in
                                        cluster.closest_pairs(js_mean, Ly, H, 5, True)],
        "behaviours": {b: int((labels == b).sum()) for b in cluster.behaviour_names(table)},
        "label_rules": args.labels,
        "thresholds": {**vars(thresholds), **({"broad_cut_nats": round(thresholds.broad_cut(uniform), 4)}
                                              if args.labels == "clark" else {})},
    })


def kernel_specs(model) -> dict:
    """The statistics specs this command hands the engine, for `model` (analyses/registry.py): the surface sums
    beside the queries and keys (JS)."""
    from bertscope.analyses.probes.cluster.stats import spec_for

    return {"surface, queries and keys": spec_for(model)}
