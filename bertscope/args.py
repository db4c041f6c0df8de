"""Argument types, checks and option groups that every `bertscope` command shares: a user
mistake here becomes argparse's usage error or a `UserError`, never a traceback."""
from __future__ import annotations

import argparse

from bertscope.errors import UserError
from bertscope.kernels import BACKEND_CHOICES, resolve_backend


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def fraction(text: str) -> float:
    """A number strictly between 0 and 1 (an FDR level, a share of heads)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {value}")
    return value


def limit_arg(text: str) -> int | None:
    """A count, or 'all'/'none' for no limit; 0 is refused like any number below 1."""
    return None if text.lower() in ("all", "none") else positive_int(text)


def check_device(device: str, backend: str):
    """A `UserError` unless `device` exists here and `backend` can run on it."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown --device {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but torch sees no GPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s) (cuda:0 .. "
                        f"cuda:{torch.cuda.device_count() - 1})")
    try:
        resolve_backend(backend, dev)
    except ValueError as e:
        raise UserError(str(e)) from None


DTYPE_CHOICES = ("float32", "float16", "bfloat16")  # bertscope.models.DTYPES


def add_dtype_argument(p: argparse.ArgumentParser, help: str | None = None):
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="float32",
                   help=help or "the model's weights and activations (default: float32); the attention statistics "
                   "are computed and summed in float32 (sums in float64) whatever it is")


def check_dtype(dtype: str, device: str):
    """A `UserError` unless torch can run matmuls in `dtype` on `device` (float16 on an old CPU build)."""
    import torch

    if dtype == "float32":
        return
    t = getattr(torch, dtype)
    try:
        a = torch.ones(2, 2, dtype=t, device=device)
        torch.nn.functional.linear(a, a)
        torch.bmm(a[None], a[None])
    except (RuntimeError, NotImplementedError) as e:
        raise UserError(f"--dtype {dtype} is not supported on {device} by this torch: {str(e).splitlines()[0]}") from None


def add_quiet_argument(p: argparse.ArgumentParser):
    """--quiet, the same for every command (`bertscope.log.configure`)."""
    p.add_argument("--quiet", action="store_true", help="no progress bars; warnings and errors only")


def add_threads_argument(p: argparse.ArgumentParser):
    p.add_argument("--threads", type=positive_int, default=None, metavar="N",
                   help="torch intra-op threads (default: torch's choice, one per core); on a busy shared "
                   "machine 1 can be several times faster, as idle-spinning worker threads fight for the cores")


def add_model_arguments(p: argparse.ArgumentParser):
    """--model and --revision, the same for every command that loads a model
    (`bertscope.model_source` resolves them)."""
    p.add_argument("--model", metavar="FOLDER|ID", default=None,
                   help="the model: a local Hugging Face checkpoint folder or a Hub id (bert-base-uncased, "
                   "org/name), read from the Hugging Face cache ($HF_HUB_CACHE) and downloaded there first "
                   "unless HF_HUB_OFFLINE=1 (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--revision", metavar="REV", default=None,
                   help="with a Hub id: its branch, tag or commit (default: main); run.json records the commit")


def add_common_arguments(p: argparse.ArgumentParser, from_word: bool = True):
    add_model_arguments(p)
    p.add_argument("--data-dir", metavar="DIR", default=None,
                   help="folder of the annotated data sets (default: $BERTSCOPE_DATA, then the user data "
                   "folder, then ../shared/data; `bertscope data download` fills the user data folder)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="run directory; an existing run's directory gains this probe's outputs "
                   "(default: runs/<timestamp>)")
    if from_word:
        p.add_argument("--from-word", choices=("mean", "first"), default="mean",
                       help="attention *from* a split word: the mean of its tokens' rows, as the paper "
                       "defines it, or its first token's row, as Clark et al.'s released code did (default: mean)")
    p.add_argument("--max-len", type=positive_int, default=128,
                   help="maximum tokens per model input (default: 128); what happens to longer inputs "
                   "depends on the probe and is counted")
    p.add_argument("--batch-size", type=positive_int, default=32, metavar="N", help="inputs per forward pass (default: 32)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="attention-statistics kernel; auto picks triton on a CUDA device, chunked on the CPU (default: auto)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    add_dtype_argument(p)
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    add_threads_argument(p)
    p.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    add_quiet_argument(p)
