"""The compiled row pass (`cpu_rows.c`): build on first use, load with ctypes, call.

The C file has no torch headers, so building it is one `cc` call of about a second; the
library is cached under `$BERTSCOPE_CACHE` (default `~/.cache/bertscope`) keyed by the
source, the flags and the CPU, and written atomically so concurrent ranks of a torchrun
job cannot see half a file. It is compiled with `-fopenmp` but loaded after torch, so its
`libgomp.so.1` resolves to the OpenMP runtime torch already has in the process: one thread
pool, sized by `torch.set_num_threads`.

Without a C compiler (or with BERTSCOPE_CPU_KERNEL=0) `load()` returns None and the chunked
backend uses its pure-torch row pass instead; `unavailable_reason()` says why.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("cpu_rows.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11"]

_lib = None
_reason = None
_tried = False


def cache_dir() -> Path:
    root = os.environ.get("BERTSCOPE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bertscope"
    )
    return Path(root)


def _cpu_id() -> str:
    """What -march=native depends on: a library built for one CPU may not run on another."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


def _build(compiler: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler, *FLAGS]).encode() + _cpu_id().encode()).hexdigest()[:16]
    target = cache_dir() / f"cpu_rows-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
        os.replace(tmp, target)  # atomic: a concurrent rank sees the old name or the whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load():
    """The loaded library, or None when it cannot be built here (see `unavailable_reason`)."""
    global _lib, _reason, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("BERTSCOPE_CPU_KERNEL", "1") == "0":
        _reason = "disabled by BERTSCOPE_CPU_KERNEL=0"
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        _reason = "no C compiler found (set CC)"
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except OSError as err:
        _reason = str(err)
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    f = lib.bertscope_softmax_stats_band
    f.argtypes = [ptr, i64, i64, i64, i64, i64, i64, i64, i64, ptr, ptr, i64, ctypes.c_int, ptr, ctypes.c_int, i64,
                  ptr, ptr, ptr, ptr, ctypes.c_int]
    f.restype = None
    g = lib.bertscope_norm_sums
    g.argtypes = [ptr, i64, i64, i64, ptr, i64, ptr, i64, ctypes.c_int, i64, ptr, ptr, ctypes.c_int]
    g.restype = None
    _lib = lib
    return _lib


def unavailable_reason() -> str | None:
    load()
    return _reason


def _ptr(t):
    return None if t is None else t.data_ptr()


def softmax_stats_band_(scores, q0, k0, band, key_bias, class_mask, offsets, entropy, class_mass, offset_mass,
                        argmax, threads: int | None = None):
    """The row pass of one block of the chunked backend (`chunked._chunked`), in place: every
    layout's, an encoder's whole maps (band (None, None), q0 = k0 = 0) included.

    scores:      (n, Lq, Lk) float32 contiguous: n heads' scores of queries q0 .. q0+Lq-1
                 against keys k0 .. k0+Lk-1 (absolute positions in a sequence of L)
    band:        (left, right) of `AttentionLayout.reach`, None for no limit: query i sees keys
                 max(0, i - left) .. min(L - 1, i + right); the rest of its row becomes 0
    key_bias:    (Lk,) float32 (finfo.min on padding) or None
    class_mask:  (C, Lk) 0/1 float32 with contiguous rows (a view from key k0 on)
    entropy, argmax: (n, L) or None; class_mass: (n, L, C); offset_mass: (n, L, O): the n heads'
                 statistics of the whole sequence, each head's rows contiguous (a slice of
                 a contiguous (B, H, L, ...) tensor); rows q0 .. q0+Lq-1 are written, argmax as
                 absolute key positions.
    threads:     OpenMP threads of the pass (default torch.get_num_threads())
    """
    n, Lq, Lk = scores.shape
    L = offset_mass.shape[1]
    C, O = class_mask.shape[0], offsets.numel()
    if scores.dtype != torch.float32 or class_mask.dtype != torch.float32 or not scores.is_contiguous():
        raise TypeError("the compiled row pass takes contiguous float32 scores and class masks")
    if C and class_mask.shape[1] > 1 and class_mask.stride(1) != 1:
        raise ValueError("the class mask's rows must be contiguous")
    for t, width in ((entropy, 1), (argmax, 1), (class_mass, C), (offset_mass, O)):
        if t is not None and t.numel() and (t.shape[:2] != (n, L) or t[0].numel() > 1 and not t[0].is_contiguous()
                                            or n > 1 and t.stride(0) != L * width):
            raise ValueError("the banded row pass needs (n, L, ...) statistics with contiguous heads")

    def at(t, width):  # the address of row q0 of the first head
        return None if t is None else t.data_ptr() + q0 * width * t.element_size()

    left, right = band
    _lib.bertscope_softmax_stats_band(
        _ptr(scores), n, Lq, Lk, q0, k0, -1 if left is None else left, -1 if right is None else right, L,
        _ptr(key_bias), _ptr(class_mask), class_mask.stride(0) if C else 0, C, _ptr(offsets), O, L,
        at(entropy, 1), at(class_mass, C), at(offset_mass, O), at(argmax, 1),
        torch.get_num_threads() if threads is None else threads,
    )


def norm_sums_(probs, q0, norms, class_mask, weighted, class_sums, threads: int | None = None):
    """The norm-based twins' sums of one block of probabilities (`chunked._NormPass`), written in place:
    weighted[g, i] = sum_j p_ij n_gj and class_sums[g, i, c] = sum_j p_ij n_gj [class_j = c] for the rows
    i = q0 .. q0+Lq-1 of each head g.

    probs: (n, Lq, Lk) float32 contiguous; norms: (n, Lk) float32, each head's row contiguous (0 on padding);
    class_mask: (C, Lk) 0/1 float32 with contiguous rows (C may be 0); weighted: (n, L); class_sums: (n, L, C),
    each head's rows contiguous (slices of contiguous (B, H, L, ...) tensors)."""
    n, Lq, Lk = probs.shape
    L, C = weighted.shape[1], class_mask.shape[0]
    if probs.dtype != torch.float32 or not probs.is_contiguous() or norms.dtype != torch.float32:
        raise TypeError("the norm sums take contiguous float32 probabilities and norms")
    if Lk > 1 and (norms.stride(1) != 1 or (C and class_mask.stride(1) != 1)):
        raise ValueError("the norms' and the class mask's rows must be contiguous")
    if (n > 1 and weighted.stride(0) != L) or (C and n > 1 and class_sums.stride(0) != L * C):
        raise ValueError("the norm sums need (n, L, ...) outputs with contiguous heads")
    _lib.bertscope_norm_sums(
        _ptr(probs), n, Lq, Lk, _ptr(norms), norms.stride(0), _ptr(class_mask), class_mask.stride(0) if C else 0, C,
        L, weighted.data_ptr() + q0 * weighted.element_size(),
        class_sums.data_ptr() + q0 * C * class_sums.element_size() if C else None,
        torch.get_num_threads() if threads is None else threads,
    )
