"""Tiles, warps and stages of the fused forward (`triton_kernel.attn_stats_fwd`), per target.

Chosen from the instruction budget `triton_aot` reads off the compiled SASS (warp-instructions
of the main loop per 1,000 scores, against a plain flash-attention loop compiled the same way:
bench/flash_baseline.py) with no register spill; the measured tables are in docs/kernels.md.

    half precision (fp16, bf16), tensor-core dots with fp32 accumulation: `HALF_TILES`, by target,
        head dimension and layout (on sm_90 at D <= 64: 128 x 128, 8 warps, 3 stages with the row sums
        on the tensor cores, `SUMS_BY_DOT`, below) (BLOCK_N at most 64 for a wide feature dot or the argmax); D = 256
        (Gemma-3) 32 x 32, 4 warps, 2 stages (16 x 32 wide); uniform head gates (a second pass in the epilogue)
        64 x 64 (sm_90) or 64 x 32 (sm_80), 8 warps, 2 stages
    position statistics on (distance, position mass: two more (BLOCK_M, 32) and (BLOCK_M, 16)
        accumulators and a loop over buckets) or token relations on (duplicate, prefix-match mass: two id
        loads and two (BLOCK_M, BLOCK_N) matches per block): the family's row of `FAMILY_TILES` (128 x 64 or
        128 x 32 with 8 warps at D <= 128 where they fit, from a sweep: below), else the narrow 64 x 32, 8 warps,
        2 stages; banded, the masked stage first (its operands dead before the main loop). D = 256: 16 x 16
        with token relations, 4 warps, 2 stages. Not spill-free everywhere (Triton 3.7.1, ptxas -v):
        `COMMAND_CEILINGS` records the few bytes that remain, and `triton_aot` ships the token relations at
        D = 64 only (docs/contributing.md, closing note)
    fp32, exact IEEE dots (FMA loops, no tensor cores: far more registers per score):
        16 x 32, 8 warps, 2 stages (D <= 64), 16 x 16, 8 warps, 1 stage above, at most 128 registers
        per thread (`maxnreg`) above; TF32 dots (torch.get_float32_matmul_precision() "high" or
        "medium") take the half-precision tiles.

SUMS_BY_DOT (a constexpr of the kernel, in the config; its modes below): how the softmax's row sum l
and the entropy's sum are taken. PER_SCORE: an FADD and an FFMA per score, fp32. L_AND_T: both from
tensor-core dots with the P that P V takes (l from a ones column of the key features, T as
q . (P K)); it takes a (BLOCK_M, D) accumulator but frees the raw scores beside P, and on sm_90 at
D <= 64 that fits 128 x 128 tiles (about 1.07x the flash baseline's instructions, from 1.63x at
128 x 64 per score). L_ONLY: l from the ones column, the entropy's t = sum p (z - m) per score,
relative to the running max (no D-wide accumulator): sm_90 at D = 128 for the default statistics.
On sm_80 (mma.sync keeps P in registers in another layout) neither pays. A ones column needs a free
column in the key features (at most 15 classes); L_AND_T also no argmax, no position statistics and
no uniform gate (those keep the tiles they had).

MASKED_FIRST (a constexpr of the kernel, in the config): the masked key blocks (band edges, padding,
the row end) run before the main loop instead of after it, so that what only their masks need holds
no register through the main loop.

FIXED_G (in the config; the kernel's constexpr GROUP = G): the group size compiled in instead of
read at run time, one compile per model; the stacked rows' divisions by G are then a multiply and a
shift.

The default statistics (entropy, class masses, offsets: the calls of `bertscope run` and of most
analyses) have their own tiles and switches, `DEFAULT_TILES`, chosen from the budget table
(docs/kernels.md) where they fit a wider tile than `HALF_TILES` without a spill; every row of the
budget then meets its targets (at most 1.25x the flash baseline's instructions): sm_80 at D = 64,
128 x 128 with the masked stage first (1.17x); sm_80 at D = 128, 64 x 64 with 4 warps, plain with
the masked stage first, causal with G compiled in (1.22x, 1.21x); sm_90 at D = 128, 128 x 128 with
L_ONLY and the masked stage first (1.23x, 1.25x). Which tiles fit in 255 registers is ptxas's
outcome and is not monotone in the work: with fewer statistics (none at all, the entropy alone) the
same tiles spilled 8-16 B, with the argmax or at D = 32 and 256 more; so every other call keeps
`HALF_TILES` with every switch off, as AOT-checked before.

Under Triton's interpreter (no GPU) every call takes 16 x 16 blocks: no register file to fit,
and short test rows then span several blocks, so both stages of the loop and the band's edges
are exercised on the CPU, with SUMS_BY_DOT where a GPU would take it for the dtype (half precision,
TF32: a P rounded to the input dtype anyway; with exact fp32 dots the row sums per score are the more
accurate, about 3x on the entropy), and tests force each way through `blocks` on the same inputs.
"""
from __future__ import annotations

import functools

import torch
import triton

from . import spec as _spec

# the half-precision input dtypes: tensor-core dots with fp32 accumulation, the same tiles
HALF_DTYPES = (torch.float16, torch.bfloat16)
# the statistics whose accumulators change which tiles fit in registers: the table's tile families
# (`spec.KernelTraits.tiles`), read off it, never listed here
POSITION_STATS = _spec.kernel_stats("positions")
# the token relations (StatsSpec.token_relations): their own tiles too
TOKEN_STATS = _spec.kernel_stats("tokens")
# the register cap of the fp32 blocks above D = 64 (see the module docstring)
MAXNREG_FP32 = 128
# the interpreter's blocks (see the module docstring)
INTERPRETER_BLOCK = 16
# SUMS_BY_DOT, how the kernel takes the softmax's row sum l and the entropy's sum (module docstring)
PER_SCORE = 0  # l and T per score, in fp32: an FADD and an FFMA per score
L_AND_T = 1  # l from the key features' ones column and T = q . (P K): both on the tensor cores
L_ONLY = 2  # l from the ones column; the entropy's t = sum p (z - m) per score, relative to the running max


def forward_config(D: int, dtype=torch.float16, arch: int = 90, positions: bool = False, tf32: bool = False,
                   interpreted: bool = False, banded: bool = False, uniform: bool = False,
                   wide: bool = False, n_classes: int = 4, tokens: bool = False,
                   switched_on: frozenset | None = None, grouped: bool = False) -> dict:
    """BLOCK_M, BLOCK_N, BLOCK_D, num_warps, num_stages (and `maxnreg` where it applies) of a
    launch for head dimension D, input dtype, target sm_<arch> (80 or 90; newer targets take
    sm_90's tiles), whether position statistics are asked, whether fp32 dots run on TF32
    tensor cores, and whether the layout is banded (causal, windowed or grouped-query: the band's
    and the stacked heads' row vectors take registers the plain layout's largest tiles need), whether
    the call has uniform head gates (the epilogue's second pass over the keys), and whether its
    key-feature dot is wide (more than 32 key classes: 64 columns) or it asks for the argmax, its
    number of key classes (whether the features have a free column for SUMS_BY_DOT's ones), and
    whether it asks for the token relations, and the statistics whose kernel switches are on (names of
    the table, `triton_launch.kernel_outputs`: the default statistics have their own tiles, per layout:
    plain, banded with one query head per key/value head, or `grouped`, banded with G >= 2).
    BLOCK_M counts stacked rows (G heads x BLOCK_M / G positions under grouped-query attention)."""
    block_d = max(16, triton.next_power_of_2(D))
    target = 90 if arch >= 90 else 80  # newer targets take sm_90's tiles
    ones_fit = feature_width(n_classes, ones=True) == feature_width(n_classes)
    if interpreted:
        return _config(INTERPRETER_BLOCK, INTERPRETER_BLOCK, 4, 1, block_d,
                       sums_by_dot=L_AND_T if ones_fit and (dtype in HALF_DTYPES or tf32) else PER_SCORE)
    if dtype in HALF_DTYPES or tf32:
        if block_d > 128:
            return _config(*((16, 16, 4, 2) if tokens else (16, 32, 4, 2) if wide else (32, 32, 4, 2)), block_d)
        family = next((f for f, on in (("tokens", tokens), ("positions", positions)) if on), None)
        if family is not None:  # FAMILY_TILES: keyed data, the heaviest family first; else the narrow fallback
            tiles = FAMILY_TILES.get((target, block_d, banded, family), FAMILY_FALLBACK)
            return _config(*tiles, block_d, masked_first=banded)
        if uniform:
            return _config(*((64, 64, 8, 2) if arch >= 90 else (64, 32, 8, 2)), block_d)
        if not wide and ones_fit and (target, block_d <= 64) in SUMS_BY_DOT_TILES:
            return _config(*SUMS_BY_DOT_TILES[(target, block_d <= 64)], block_d, sums_by_dot=L_AND_T)
        kind = "grouped" if banded and grouped else "banded" if banded else "plain"
        tiles = DEFAULT_TILES.get((target, block_d, kind))
        if not wide and switched_on == DEFAULT_SWITCHES and tiles is not None and (
                ones_fit or tiles.get("sums_by_dot", PER_SCORE) == PER_SCORE):
            return _config(*tiles["tiles"], block_d, **{k: v for k, v in tiles.items() if k != "tiles"})
        m, n, w, s = HALF_TILES[(target, block_d <= 64, banded)]
        if wide and n > 64:
            n, s = 64, 3
        return _config(m, n, w, s, block_d)
    if block_d <= 64:
        return _config(16, 32, 8, 2, block_d, maxnreg=MAXNREG_FP32)
    return _config(16, 16, 8 if block_d <= 128 else 16, 1, block_d, maxnreg=MAXNREG_FP32)


def kernel_config(D: int, dtype, arch: int, switched_on: frozenset, n_classes: int, banded: bool = False,
                  grouped: bool = False, uniform: bool = False, tf32: bool = False, interpreted: bool = False) -> dict:
    """The config of one launch of the fused forward from what it computes: the kernel switches it turns on
    (names of the table, `triton_launch.kernel_outputs`), its key classes, its layout (banded; grouped: G >= 2)
    and uniform gates. The one reading of a call's statistics into `forward_config`'s arguments, for the
    launcher (`triton_launch.launch_config`) and the ahead-of-time compile (`triton_aot.Specialisation`)
    alike: the tile families of the statistics switched on (`spec.KernelTraits.tiles`: "positions", "tokens",
    "wide"), and a wide feature dot for more than 32 classes."""
    on = frozenset(switched_on)
    # the table read at call time: an entry without kernel traits (one being added) brings no family
    families = {s.kernel.tiles for s in _spec.ROW_STATS if s.name in on and s.kernel is not None}
    return forward_config(D, dtype, arch, "positions" in families, tf32=tf32, interpreted=interpreted,
                          banded=banded, uniform=uniform, wide=feature_width(n_classes) > 32 or "wide" in families,
                          n_classes=n_classes, tokens="tokens" in families, switched_on=on,
                          grouped=banded and grouped)


def _config(m: int, n: int, warps: int, stages: int, block_d: int, sums_by_dot: int = 0, masked_first: bool = False,
            fixed_g: bool = False, **caps) -> dict:
    """One launch config: tiles, warps, stages and the kernel's constexpr switches (module docstring)."""
    return dict(BLOCK_M=m, BLOCK_N=n, BLOCK_D=block_d, num_warps=warps, num_stages=stages, SUMS_BY_DOT=sums_by_dot,
                MASKED_FIRST=masked_first, FIXED_G=fixed_g, **caps)


# half precision, D <= 128: (target, D <= 64, banded) -> BLOCK_M, BLOCK_N, warps, stages; the fastest tiles
# by the instruction budget that compile without a register spill (Triton 3.7.1; docs/kernels.md)
HALF_TILES = {
    (90, True, False): (128, 64, 8, 2), (90, True, True): (128, 64, 8, 2),
    (90, False, False): (128, 64, 8, 2), (90, False, True): (128, 32, 8, 2),
    (80, True, False): (128, 64, 8, 2), (80, True, True): (128, 32, 8, 2),
    (80, False, False): (128, 32, 8, 2), (80, False, True): (32, 32, 4, 2),
}
# half precision, D <= 128, a call that switches on a statistic of the "positions" or "tokens" tile family
# (`spec.KernelTraits.tiles`; tokens first: a call with both, the atlas's union, takes the tokens' tiles):
# (target, BLOCK_D, banded, family) -> BLOCK_M, BLOCK_N, warps, stages; the fewest warp-instructions per score
# without a spill among 128 x 64 and 128 x 32 with 8 warps, 64 x 64 and 64 x 32 with 4 or 8 (Triton 3.7.1,
# sweep of 2026-12-07, docs/kernels.md "Tiles of the position and token statistics"), for the tokens family
# chosen on the atlas's union (positions and tokens: what the commands launch), checked on the commands' own
# specialisations (`triton_aot --commands`: their class counts move the registers). Where every fast candidate
# spills, the tiles that halve the instructions were kept with a few bytes of spill, recorded in
# COMMAND_CEILINGS (`heads positions` at D = 128 with G = 4: sm_80 24 B where the narrow tiles spilled 12 at
# twice the instructions, sm_90 4 B where they spilled none; the atlas union at D = 128 on sm_80, 8 B against
# 12). Missing keys take
# FAMILY_FALLBACK, the narrow tiles these statistics had before the sweep (spill-free or nearly everywhere,
# at about twice the instructions per score)
FAMILY_FALLBACK = (64, 32, 8, 2)
FAMILY_TILES = {
    (80, 64, False, "positions"): (128, 64, 8, 2), (80, 64, True, "positions"): (128, 64, 8, 2),
    (80, 64, False, "tokens"): (128, 32, 8, 2), (80, 64, True, "tokens"): (128, 32, 8, 2),
    (80, 128, True, "positions"): (128, 32, 8, 2),
    (80, 128, False, "tokens"): (128, 32, 8, 2), (80, 128, True, "tokens"): (128, 32, 8, 2),
    (90, 64, False, "positions"): (128, 64, 8, 2), (90, 64, True, "positions"): (128, 64, 8, 2),
    (90, 64, False, "tokens"): (128, 64, 8, 2), (90, 64, True, "tokens"): (128, 32, 8, 2),
    (90, 128, False, "positions"): (128, 32, 8, 2), (90, 128, True, "positions"): (64, 32, 4, 2),
    (90, 128, False, "tokens"): (128, 32, 8, 2), (90, 128, True, "tokens"): (64, 32, 4, 2),
}
# half precision with SUMS_BY_DOT (module docstring): (target, D <= 64) -> BLOCK_M, BLOCK_N, warps, stages,
# plain and banded alike; only where it beats the row sums without a spill
SUMS_BY_DOT_TILES = {(90, True): (128, 128, 8, 3)}
# half precision, the default statistics' calls (module docstring): kernel switches exactly DEFAULT_SWITCHES
# (offsets have none), no wide feature dot, no uniform gates, no SUMS_BY_DOT_TILES entry (checked first):
# (target, BLOCK_D, layout: "plain", "banded" with G = 1 (causal or windowed multi-head attention) or "grouped"
# (banded, G >= 2)) -> tiles (BLOCK_M, BLOCK_N, warps, stages) and the switches that differ from their
# defaults (`_config`); one with L_ONLY needs a free key-feature column (else HALF_TILES)
DEFAULT_SWITCHES = frozenset(_spec.kernel_stats("default"))
DEFAULT_TILES = {
    (80, 64, "plain"): dict(tiles=(128, 128, 8, 2), masked_first=True),
    (80, 64, "banded"): dict(tiles=(128, 128, 8, 2), masked_first=True),
    (80, 64, "grouped"): dict(tiles=(128, 128, 8, 2), masked_first=True),
    (80, 128, "plain"): dict(tiles=(64, 64, 4, 2), masked_first=True),
    (80, 128, "banded"): dict(tiles=(64, 64, 4, 2), masked_first=True),
    (80, 128, "grouped"): dict(tiles=(64, 64, 4, 1), fixed_g=True),
    (90, 128, "plain"): dict(tiles=(128, 128, 8, 2), masked_first=True, sums_by_dot=L_ONLY),
    (90, 128, "banded"): dict(tiles=(128, 64, 8, 2), masked_first=True, sums_by_dot=L_ONLY),
    (90, 128, "grouped"): dict(tiles=(128, 128, 8, 2), masked_first=True, sums_by_dot=L_ONLY),
}


@functools.cache
def device_arch(device: torch.device) -> int:
    """sm_<major><minor> of a CUDA device as an int (90 for an H100 or H200), read once per device."""
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def feature_width(n_classes: int, ones: bool = False) -> int:
    """F_PAD, the key-feature matrix's width: the n_classes one-hot columns (and with `ones` a column of
    ones, the last: SUMS_BY_DOT's row sum) padded to a power of two >= 16 (tl.dot's smallest N)."""
    return max(16, triton.next_power_of_2(n_classes + int(ones)))
