"""Argument types, checks and option groups that every `bertscope` command shares: a user
mistake here becomes argparse's usage error or a `UserError`, never a traceback."""
from __future__ import annotations

import argparse
import logging
import math
import os
import time

from bertscope.errors import UserError

logger = logging.getLogger(__name__)

# torch and bertscope.kernels (hence torch) are imported inside the functions that need them, not here:
# `bertscope --help` and `--version` import this module and must start without torch


def whole_number(text: str, minimum: int) -> int:
    """`text` as an int >= minimum, or argparse's one-line error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (a count, a size, a batch)."""
    return whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number >= 0 (a seed, a patience where 0 means never, a count where 0 skips)."""
    return whole_number(text, 0)


def fraction(text: str) -> float:
    """A number strictly between 0 and 1 (an FDR level, a share of heads)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {value}")
    return value


def non_negative_float(text: str) -> float:
    """A number >= 0 (a tolerance)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def limit_arg(text: str) -> int | None:
    """A count, or 'all'/'none' for no limit; 0 is refused like any number below 1."""
    return None if text.lower() in ("all", "none") else positive_int(text)


def check_streaming_window(sink: int, recent: int, longest: int, options: tuple[str, str] = ("--sink", "--recent"),
                           length_option: str = "--max-len"):
    """One rule for the streaming window (StreamingLLM's attention sink + recent window) of every
    command that measures it (`heads streaming --sink/--recent`, `atlas --streaming-sink/--streaming-recent`):
    the sink may be 0 (a plain sliding window), the recent window holds at least the query's own
    key (>= 1; the argparse types say so), and the two together must leave out some key of the
    longest segment (`longest` tokens), else every head's streaming output equals its full one
    and every head would come out streaming-safe with error 0. A `UserError` naming the options."""
    sink_opt, recent_opt = options
    if recent < 1:
        raise UserError(f"{recent_opt} must be at least 1 (the recent window holds the query's own key), not {recent}")
    if sink < 0:
        raise UserError(f"{sink_opt} must be 0 or more, not {sink}")
    if sink + recent >= longest:
        raise UserError(f"{sink_opt} {sink} + {recent_opt} {recent} keep every key of a segment of up to {longest} "
                        f"tokens ({length_option} {longest}): the streaming error would be 0 for every head; give a "
                        f"smaller {recent_opt} or a longer {length_option}")


DTYPE_CHOICES = ("float32", "float16", "bfloat16")  # bertscope.models.loading.DTYPES
# --backend: "auto" and bertscope.kernels.BACKENDS, named here because importing the kernels imports torch
# (tests/cli/test_new_user.py checks the two agree)
BACKEND_CHOICES = ("auto", "eager", "chunked", "triton")
# `probe cluster --js-backend`: bertscope.kernels.js.JS_BACKENDS, named here for the same reason
JS_BACKEND_CHOICES = ("eager", "chunked", "triton")
# `bertscope view --max-len`'s default, bertscope.view's DEFAULT_MAX_LEN: named here because bertscope.view
# imports torch
VIEW_MAX_LEN = 128


def add_dtype_argument(p: argparse.ArgumentParser, help: str | None = None, choices: tuple[str, ...] = DTYPE_CHOICES):
    p.add_argument("--dtype", choices=choices, default="float32",
                   help=help or "the model's weights and activations (default: float32); the attention statistics "
                   "are computed and summed in float32 (sums in float64) whatever it is")


def add_quiet_argument(p: argparse.ArgumentParser):
    """--quiet, the same for every command (`bertscope.log.configure`)."""
    p.add_argument("--quiet", action="store_true", help="no progress bars; warnings and errors only")


# --threads above this is refused: far more threads than any machine has cores asks torch's
# thread pool for stacks it cannot allocate (--threads 100000: a MemoryError)
MAX_THREADS = 1024


def thread_count(text: str) -> int:
    """--threads: a whole number from 1 to `MAX_THREADS`."""
    value = positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} threads (one per core is torch's own "
                                         f"choice: this machine has {os.cpu_count()}), got {value}")
    return value


# whether the commands with norm-based columns (`run`, `sinks`, `atlas`) compute them unless told (--norms /
# --no-norms): on, as they cost at most 5% of a run on the CPU (about 3.5%, bench/results_norms.md); on the triton
# backend off unless asked (`resolve_norms`): there the twins add 6-15% to the fused kernel's main loop (its SASS,
# docs/norms.md), and spill at some banded tiles. The library's defaults (RunSettings, StatsSpec, the notebook
# API) keep them off: a caller asks for them.
NORMS_DEFAULT = True


def add_norms_argument(p: argparse.ArgumentParser, columns: str):
    p.add_argument("--norms", action=argparse.BooleanOptionalAction, default=None,
                   help=f"also report the norm-based twins of the attention masses ({columns}: Kobayashi et al. "
                   f"2020, docs/norms.md); {'on' if NORMS_DEFAULT else 'off'} by default (bench/results_norms.md: "
                   "what they cost), but on the triton backend, where they are off unless asked")


def resolve_norms(args) -> bool:
    """--norms as given, else the default (`NORMS_DEFAULT`); the default is off on the triton backend, where the
    twins cost the fused kernel more than the CPU backends' 5% (docs/norms.md): --norms turns them on there."""
    if args.norms is not None:
        return bool(args.norms)
    if not NORMS_DEFAULT:
        return False
    from bertscope.kernels.backends import resolve_backend  # torch: only once the run starts

    try:
        backend = resolve_backend(args.backend, args.device)
    except (ValueError, RuntimeError):  # an unknown backend or --device: the run refuses it, in its own words
        return True
    if backend == "triton":
        logging.getLogger(__name__).info("the norm-based columns are off by default on the triton backend "
                                         "(--norms turns them on: docs/norms.md)")
        return False
    return True


def add_threads_argument(p: argparse.ArgumentParser):
    p.add_argument("--threads", type=thread_count, default=None, metavar="N",
                   help="torch intra-op threads (default: the cores that other work leaves idle at the start, "
                   "from the processes running at that moment: torch's choice, one per core, on an idle machine, "
                   "down to 1 on a busy one, where waiting worker threads would fight for the cores; "
                   "OMP_NUM_THREADS, when set, decides instead)")


# How the default reads the machine: this many looks at the run queue, this far apart (0.1 s in all)
RUN_QUEUE_SAMPLES = 10
RUN_QUEUE_INTERVAL_S = 0.01


def idle_cores(cores: int, busy: float) -> int:
    """Of `cores`, how many other work leaves idle: `busy` (how many other tasks are running or
    waiting to run, on average) taken off, a core busy half the time or more counting as busy;
    at least 1."""
    return max(1, cores - math.floor(busy + 0.5))


def running_now(path: str = "/proc/loadavg") -> int:
    """How many tasks (threads) of the whole machine are running or waiting for a core at this
    instant, the caller included: the first half of /proc/loadavg's fourth field, "running/total"
    (Linux; OSError or ValueError elsewhere)."""
    with open(path, encoding="ascii") as f:
        return int(f.read().split()[3].split("/")[0])


def others_running(samples: int = RUN_QUEUE_SAMPLES, interval: float = RUN_QUEUE_INTERVAL_S,
                   read=None, sleep=None) -> float:
    """The mean number of other tasks running or waiting to run over `samples` looks at the run
    queue, `interval` seconds apart: the caller, running while it reads, is not counted.

    The run queue now, not the load average: the 1-minute average still counts, for a minute
    after it ended, the user's own previous run (on an idle 2-core machine a run started right
    after another got 1 thread and took 0.58x of the bare forward's speed instead of 1.0x), while
    a competing job that keeps running is in every sample. A few samples, not one, so that a short
    job passing by does not decide a long run."""
    read, sleep = read or running_now, sleep or time.sleep
    counts = []
    for i in range(samples):
        if i:
            sleep(interval)
        counts.append(max(0, read() - 1))
    return sum(counts) / len(counts)


def default_threads() -> int | None:
    """torch's intra-op threads when --threads is not given: its own choice (one per physical
    core) capped at the cores other work leaves idle now (`others_running`). Threads beyond those
    do not add speed on a busy machine, they take it: the chunked kernel runs thousands of
    short parallel regions per batch, and each waits at its barrier for a worker whose core runs
    another job (48 segments of 512 tokens on 2 cores at a load of 9-13: 138 s with 2 threads,
    54 s with 1). None (torch decides) where OMP_NUM_THREADS is set or the run queue cannot be read."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    try:
        cores, busy = len(os.sched_getaffinity(0)), others_running()
    except (AttributeError, OSError, ValueError, IndexError):  # not Linux: no affinity mask or /proc/loadavg
        return None
    import torch  # see the note above whole_number

    threads = min(torch.get_num_threads(), idle_cores(cores, busy))
    logger.debug("torch threads: %d (%d cores, %.1f other tasks running)", threads, cores, busy)
    return threads


def apply_default_threads(args: argparse.Namespace):
    """Set torch's threads for a command whose --threads was not given (the commands set the
    ones given); args.threads stays None, as run.json records it."""
    if "threads" in vars(args) and args.threads is None:
        threads = default_threads()
        if threads is not None:
            import torch  # see the note above whole_number

            torch.set_num_threads(threads)


def add_model_arguments(p: argparse.ArgumentParser, add=None):
    """--model and --revision, the same for every command that loads a model
    (`bertscope.models.source` resolves them). `add` is the add_argument to use (default p's)."""
    add = add or p.add_argument
    add("--model", metavar="FOLDER|ID", default=None,
        help="the model: a local Hugging Face checkpoint folder or a Hub id (bert-base-uncased, "
        "org/name), read from the Hugging Face cache ($HF_HUB_CACHE) and downloaded there first "
        "unless HF_HUB_OFFLINE=1 (default: the embedded all-MiniLM-L6-v2)")
    add("--revision", metavar="REV", default=None,
        help="with a Hub id: its branch, tag or commit (default: main); run.json records the commit")


def add_corpus_stream_arguments(p: argparse.ArgumentParser, limit_note: str = ""):
    """The options of a command that streams a corpus segment by segment into per-head sums
    (`sinks`, `heads positions`): the common ones with their streaming defaults, then --corpus,
    --text-field and --limit as `bertscope run` reads a corpus. `limit_note` ends --limit's help
    ("; with --bos both each is run twice")."""
    add_common_arguments(p, from_word=False, overrides={
        "batch_size": {"default": 8, "help": "segments per forward pass (default: 8); results do not depend on it"},
        "max_len": {"help": "maximum tokens per segment (default: 128); a decoder's Wikipedia articles are packed up "
                    "to it, so it can be the model's whole context"},
        "seed": {"help": "seed of the segment sample (default: 0)"}})
    p.add_argument("--corpus", default="wiki",
                   help="'wiki' (Wikipedia lead sections), a UTF-8 text file with one document per line, JSON Lines, "
                   "Parquet or a Hugging Face datasets directory, as `bertscope run` reads it (default: wiki)")
    p.add_argument("--text-field", metavar="NAME", default=None,
                   help="the text column of a JSON Lines, Parquet or datasets corpus (default: 'text')")
    p.add_argument("--limit", type=limit_arg, default=100, metavar="N",
                   help=f"number of segments (texts), sampled with --seed; 'all' for every one{limit_note} "
                   "(default: 100)")


def add_common_arguments(p: argparse.ArgumentParser, from_word: bool = True, overrides: dict | None = None):
    """The options every model-running command shares. `overrides` maps an option's dest to the
    keyword arguments of `add_argument` that this command declares differently (its help, default,
    choices, ...), e.g. {"seed": {"help": ...}, "dtype": {"choices": (...)}}."""
    overrides = dict(overrides or {})

    def add(*names, **kwargs):
        dest = kwargs.get("dest") or names[0].lstrip("-").replace("-", "_")
        p.add_argument(*names, **{**kwargs, **overrides.pop(dest, {})})

    add_model_arguments(p, add)
    add("--data-dir", metavar="DIR", default=None,
        help="folder of the annotated data sets (default: $BERTSCOPE_DATA, then the user data "
        "folder, then ../shared/data; `bertscope data download` fills the user data folder)")
    add("--out", metavar="DIR", default=None,
        help="run directory; an existing run's directory gains this probe's outputs "
        "(default: runs/<timestamp>)")
    if from_word:
        add("--from-word", choices=("mean", "first"), default="mean",
            help="attention *from* a split word: the mean of its tokens' rows, as the paper "
            "defines it, or its first token's row, as Clark et al.'s released code did (default: mean)")
    add("--max-len", type=positive_int, default=128,
        help="maximum tokens per model input (default: 128); what happens to longer inputs "
        "depends on the probe and is counted")
    add("--batch-size", type=positive_int, default=32, metavar="N", help="inputs per forward pass (default: 32)")
    add("--backend", choices=BACKEND_CHOICES, default="auto",
        help="attention-statistics kernel; auto picks triton on a CUDA device, chunked on the CPU (default: auto)")
    add("--device", default="cpu", help="torch device (default: cpu)")
    dtype = overrides.pop("dtype", {})
    add_dtype_argument(p, help=dtype.pop("help", None), choices=dtype.pop("choices", DTYPE_CHOICES))
    if dtype:
        raise ValueError(f"--dtype takes help and choices overrides only, not {', '.join(dtype)}")
    add("--seed", type=non_negative_int, default=0, help="random seed (default: 0)")
    threads = overrides.pop("threads", None)
    if threads:
        raise ValueError("--threads takes no overrides")
    add_threads_argument(p)
    add("--no-figures", action="store_true", help="skip the PNG figures")
    if overrides:
        raise ValueError(f"no common option has the dest {', '.join(overrides)}")
    add_quiet_argument(p)
