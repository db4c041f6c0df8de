"""Argument types and checks that the `bertscope` command and every probe share: a user
mistake here becomes argparse's usage error or a `UserError`, never a traceback. Kept out of
`cli.py` so that the probes, which `cli.py` imports, need not import it back."""
from __future__ import annotations

import argparse

from bertscope.errors import UserError


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
    from bertscope.kernels import resolve_backend

    try:
        resolve_backend(backend, dev)
    except ValueError as e:
        raise UserError(str(e)) from None
