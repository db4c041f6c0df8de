"""`bertscope selftest`: every statistics backend against the eager reference, on this machine.

The test suite proves the Triton kernels under the interpreter; this command is what a GPU
user runs first, on the GPU itself: the same parity checks with real compiled kernels (and
the real TF32/fp16/bf16 behaviour of the device), a line per case, exit code 1 on any mismatch.
On a CPU it checks `chunked` (and `triton` when TRITON_INTERPRET=1 is set, on small shapes).

Generated from the tables: every statistic of `kernels.spec.ROW_STATS` is switched on and
compared, for every backend of `kernels.BACKENDS`, on every shape of the case list under every
layout of `LAYOUTS` (plain, causal, causal + window, grouped-query, a bidirectional window);
every case has padding (on the right for bidirectional layouts, on the left for causal ones, as
encoders and decoders pad) and a sequence of one token (single-key rows).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from bertscope.kernels.backends import BACKENDS, attention_stats, resolve_backend
from bertscope.kernels.js import pairwise_js
from bertscope.kernels.pooling import word_pooling
from bertscope.kernels.spec import ROW_STATS, AttentionLayout, Gate, LayerGates, StatsSpec

logger = logging.getLogger(__name__)

# every statistic of the kernels' table, switched on
SPEC = replace(StatsSpec(offsets=(-2, -1, 0, 1, 2), n_key_classes=4),
               **{s.switch: True for s in ROW_STATS if s.switch != "offsets"})


# the layouts every case runs under: name -> (layout of H query heads, padding side)
LAYOUTS = {
    "plain": (lambda H: AttentionLayout(), "right"),
    "causal": (lambda H: AttentionLayout(causal=True), "left"),
    "causal+window": (lambda H: AttentionLayout(causal=True, window=(6, 0)), "left"),
    "gqa": (lambda H: AttentionLayout(causal=True, n_key_value_heads=1 if H % 2 else H // 2), "left"),
    "window": (lambda H: AttentionLayout(window=(3, 3)), "right"),
}


@dataclass
class Case:
    B: int
    H: int
    L: int
    D: int
    dtype: torch.dtype = torch.float32
    C: int = 4  # key classes: the vocabulary's 4, or more from tags
    layout: str = "plain"  # a key of LAYOUTS

    def __str__(self):
        return (f"{self.B}x{self.H}x{self.L} D={self.D} C={self.C} {str(self.dtype).replace('torch.', '')} "
                f"{self.layout}")

    @property
    def attention(self) -> AttentionLayout:
        return LAYOUTS[self.layout][0](self.H)


FULL = [Case(2, 3, 1, 32), Case(3, 4, 37, 32), Case(2, 12, 128, 64), Case(2, 4, 200, 32), Case(1, 12, 512, 64),
        Case(2, 12, 128, 64, torch.float16), Case(1, 4, 512, 32, torch.float16),
        Case(3, 4, 37, 32, C=16), Case(2, 4, 200, 64, C=20), Case(2, 12, 128, 64, torch.float16, C=16),
        Case(2, 12, 128, 64, torch.bfloat16), Case(1, 4, 512, 32, torch.bfloat16, C=32)]
QUICK = [Case(2, 3, 1, 16), Case(2, 3, 37, 16), Case(1, 3, 130, 16, C=16)]


def token_ids(case: Case, seed=0) -> torch.Tensor:
    """(B, L) token ids of a case from 5 tokens: repeats everywhere, for the token relations
    (duplicate and prefix-match mass)."""
    return torch.randint(0, 5, (case.B, case.L), generator=torch.Generator().manual_seed(seed + 1))


def inputs(case: Case, seed=0):
    """Random CPU q, k, v (k and v with the layout's key heads) with padding on the layout's side,
    a single-key sequence and uniform, zero and float gates (per sequence); words of two tokens."""
    g = torch.Generator().manual_seed(seed)
    B, H, L, D = case.B, case.H, case.L, case.D
    H_kv = case.attention.n_key_value_heads or H
    q = torch.randn(B, H, L, D, generator=g) * 1.5
    k, v = (torch.randn(B, H_kv, L, D, generator=g) * 1.5 for _ in range(2))
    lengths = [L] + [max(1, L - 1 - 7 * b) for b in range(1, B)]
    lengths[-1] = 1 if B > 1 else lengths[-1]  # a sequence with a single valid key
    pos, n = torch.arange(L)[None, :], torch.tensor(lengths)[:, None]
    left = LAYOUTS[case.layout][1] == "left"
    key_valid = pos >= L - n if left else pos < n  # (B, L)
    key_class = torch.randint(0, case.C, (B, L), generator=g)
    unit = torch.where(key_valid, (pos - (L - n if left else 0)) // 2, -1)  # words of two tokens
    candidate = torch.ones(B, (L + 1) // 2, dtype=torch.bool)
    codes = LayerGates.from_codes(([Gate.KEEP, Gate.ZERO, Gate.UNIFORM] * H)[:H])
    xi = codes.xi * (0.5 + torch.rand(B, H, generator=g))  # per-sequence float gates, 0 where ZERO
    gates = LayerGates(xi=xi, uniform=codes.uniform)
    return (q, k, v, key_valid, key_class), gates, unit, candidate


def key_norms(case: Case, seed=0) -> torch.Tensor:
    """(B, H, L) per-key value norms for the norm-based twins (spec.norms): positive, a few 0."""
    g = torch.Generator().manual_seed(seed + 2)
    n = torch.rand(case.B, case.H, case.L, generator=g) * 3 + 0.05
    return n * (torch.rand(case.B, case.H, case.L, generator=g) > 0.1)


def spec_for(backend: str, C: int) -> StatsSpec:
    """`SPEC` less the switches of the statistics the table says `backend` does not compute
    (`RowStat.backends`), its norm-based twins named (`StatsSpec.norms`: on triton those of the class and
    offset masses)."""
    off = {s.switch for s in ROW_STATS if not s.computed_by(backend) and s.twin_of is None}
    twins = tuple(s.twin_of.name for s in ROW_STATS if s.twin_of is not None and s.computed_by(backend)
                  and s.twin_of.switch not in off)
    return replace(SPEC, n_key_classes=C, **{w: False for w in off}, norms=twins if SPEC.norms else False)


def scaled_error(got, ref) -> float:
    """Largest error, absolute where |ref| <= 1 and relative above: a column mass of 50
    stored in bf16 is 0.125 off after rounding alone, as right as a probability 1e-3 off."""
    return float(((got - ref).abs() / ref.abs().clamp(min=1)).max())


def check(backend: str, case: Case, device) -> dict:
    """Largest error (`scaled_error`) of each statistic against eager (float64 on the CPU)."""
    args, gates, unit, candidate = inputs(case)
    spec = spec_for(backend, case.C)
    layout = case.attention
    ref_args = [a.double() if a.is_floating_point() else a for a in args]
    ids, norms = token_ids(case), key_norms(case)
    out_ref, ref = attention_stats(*ref_args, spec, gates=gates, backend="eager", pooling=word_pooling(unit, candidate),
                                   layout=layout, token_ids=ids, norms=norms.double())
    dev_args = [a.to(device, case.dtype) if a.is_floating_point() else a.to(device) for a in args]
    out, got = attention_stats(*dev_args, spec, gates=LayerGates(gates.xi.to(device), gates.uniform.to(device)),
                               backend=backend,
                               pooling=word_pooling(unit.to(device), candidate.to(device)), layout=layout,
                               token_ids=ids.to(device), norms=norms.to(device, case.dtype))
    valid = args[3]
    err = {"out": scaled_error(out.cpu().double() * valid[:, :, None, None], out_ref * valid[:, :, None, None])}
    agree = []
    for stat in ROW_STATS:
        if not stat.asked(spec):
            continue
        if stat.dtype == "float":
            err[stat.name] = scaled_error(getattr(got, stat.name).cpu().double(), getattr(ref, stat.name))
        else:  # an index: the share of rows that agree
            agree.append(float((getattr(got, stat.name).cpu() == getattr(ref, stat.name)).double().mean()))
    err["argmax_agree"] = min(agree)  # the least of the argmax's and the word argmax's
    return err


def check_js(backend: str, device) -> float:
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 6, 37, 16, generator=g) for _ in range(2))
    key_valid = torch.arange(37)[None, :] < torch.tensor([37, 20])[:, None]
    ref = pairwise_js(q, k, key_valid, 0.25, backend="eager")
    got = pairwise_js(q.to(device), k.to(device), key_valid.to(device), 0.25, backend=backend)
    return float((got.cpu() - ref).abs().max() / ref.abs().max())


def tolerance(case: Case) -> float:
    """Largest `scaled_error` allowed against eager in float64 on the fp32 inputs: half
    inputs are rounded first (fp16 keeps 11 significant bits, bf16 8) and the statistics
    are stored in the input dtype (half a bf16 ulp is 2^-9 relative, 0.4%)."""
    return {torch.float16: 2e-2, torch.bfloat16: 6e-2}.get(case.dtype, 1e-4)


def min_argmax_agreement(case: Case) -> float:
    """Rows whose argmax must agree with eager: rounding the inputs to bf16 moves scores by
    about 1e-2, enough to swap near-tied keys in about 1% of the rows (0.99 measured at 4x512)."""
    return 0.97 if case.dtype == torch.bfloat16 else 0.99


def run_selftest(device: str = "cpu", quick: bool = False, log=logger.info) -> bool:
    dev = torch.device(device)
    backends = []
    for name in BACKENDS:
        if name == "eager":
            continue
        try:
            backends.append(resolve_backend(name, dev))
        except ValueError as e:
            log(f"  {name:<8} skipped: {e}")
    interpreted = dev.type == "cpu"
    ok = True
    for backend in backends:
        cases = QUICK if quick or (backend == "triton" and interpreted) else FULL
        if dev.type == "cpu":
            cases = [c for c in cases if c.dtype == torch.float32]
        cases = [replace(c, layout=name) for c in cases for name in LAYOUTS]  # every shape under every layout
        for case in cases:
            err = check(backend, case, dev)
            tol = tolerance(case)
            worst = max(v for key, v in err.items() if key != "argmax_agree")
            passed = worst <= tol and err["argmax_agree"] >= min_argmax_agreement(case)
            ok &= passed
            log(f"  {backend:<8} {str(case):<42} max err {worst:.1e} (tol {tol:.0e}), argmax agree "
                f"{err['argmax_agree']:.3f}  {'ok' if passed else 'FAIL ' + str(err)}")
        if backend in ("chunked", "triton"):
            rel = check_js(backend, dev)
            ok &= rel <= 1e-4
            log(f"  {backend:<8} {'pairwise JS 2x6x37':<42} max rel err {rel:.1e} (tol 1e-04)  "
                f"{'ok' if rel <= 1e-4 else 'FAIL'}")
    log("all checks passed" if ok else "SOME CHECKS FAILED")
    return ok
