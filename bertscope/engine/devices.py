"""The checks of `--device` and `--dtype` that every command with a model runs before loading it
(`bertscope.run.analysis_run.ModelRun`, `bertscope selftest`): the device exists here and the backend
runs on it, torch runs matmuls in the dtype there. A mistake is a one-line `UserError`."""
from __future__ import annotations

from bertscope.errors import UserError

# torch and bertscope.kernels (hence torch) are imported inside the functions: `bertscope --help` imports
# this module (through bertscope.cli.main) and must start without torch


def check_device(device: str, backend: str):
    """A `UserError` unless `device` exists here and `backend` can run on it."""
    import torch  # see the note above check_device

    from bertscope.kernels.backends import resolve_backend

    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown --device {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for, but torch sees no GPU")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(f"--device {device}: torch sees {torch.cuda.device_count()} GPU(s) (cuda:0 .. "
                        f"cuda:{torch.cuda.device_count() - 1})")
    if dev.type not in ("cpu", "cuda"):  # mps, xpu, ...: a device this torch was not built for, or this machine lacks
        # (cuda is checked above by torch's own count, without touching the GPU)
        try:
            torch.empty(1, device=dev)
        except (RuntimeError, AssertionError, AttributeError) as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"--device {device} cannot be used here ({reason}); use --device cpu"
                            + (" or cuda" if torch.cuda.is_available() else "")) from None
    try:
        resolve_backend(backend, dev)
    except ValueError as e:
        raise UserError(str(e)) from None


def check_dtype(dtype: str, device: str):
    """A `UserError` unless torch can run matmuls in `dtype` on `device` (float16 on an old CPU build)."""
    import torch  # see the note above check_device

    if dtype == "float32":
        return
    t = getattr(torch, dtype)
    try:
        a = torch.ones(2, 2, dtype=t, device=device)
        torch.nn.functional.linear(a, a)
        torch.bmm(a[None], a[None])
    except (RuntimeError, NotImplementedError) as e:
        raise UserError(f"--dtype {dtype} is not supported on {device} by this torch: "
                        f"{str(e).splitlines()[0]}") from None
