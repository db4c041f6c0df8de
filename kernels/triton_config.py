"""Tiles, warps and stages of the fused forward (`triton_kernel.attn_stats_fwd`), per target.

Chosen from the instruction budget `triton_aot` reads off the compiled SASS (warp-instructions
of the main loop per 1,000 scores, against a plain flash-attention loop compiled the same way:
bench/flash_baseline.py) with no register spill; the measured tables are in docs/kernels.md.

    half precision (fp16, bf16), tensor-core dots with fp32 accumulation (and TF32 dots): one table,
        `TILES`, below
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
column in the key features (at most 15 classes); L_AND_T also no argmax and no position statistics
(those keep the tiles they had). With the commands' statistic sets L_ONLY pays on sm_90 too
(the sweep: `TILES`), where it takes the row sum off the scores (no entropy: no t).

MASKED_FIRST (a constexpr of the kernel, in the config): the masked key blocks (band edges, padding,
the row end) run before the main loop instead of after it, so that what only their masks need holds
no register through the main loop.

FIXED_G (in the config; the kernel's constexpr GROUP = G): the group size compiled in instead of
read at run time, one compile per model; the stacked rows' divisions by G are then a multiply and a
shift.

The one table, `TILES`: (target, D class, layout, statistic-set kind) -> `Entry` (tiles, warps, stages and
the three switches). The target is 80 or 90 (newer GPUs take sm_90's); the D class is BLOCK_D, at least 32
(32, 64, 128, 256); the layout "plain" (encoders), "banded" (causal or windowed, one query head per key/value
head) or "grouped" (banded with G >= 2, which takes the banded entry where it has none of its own:
`LAYOUTS`). The statistic-set kinds and their order of precedence are data too, `KINDS`: a call is every
kind whose test holds, and takes the entry of the first that the table has at its target, D class and
layout and that it can take (`_fits`: SUMS_BY_DOT needs a free ones column, and an entry is for key-feature
matrices no wider than it was compiled for); "any" holds for every call and has an entry everywhere. In order:

    tokens, positions: the token relations (duplicate, prefix-match mass: two id loads and two
        (BLOCK_M, BLOCK_N) matches per block) and the position statistics (distance, position mass: two
        more (BLOCK_M, 32) and (BLOCK_M, 16) accumulators and a loop over buckets); a call with both (the
        atlas's union) takes the tokens'. 128 x 64 or 128 x 32 with 8 warps at D <= 128 where they fit (sweep
        of 2026-12-07, docs/kernels.md), else FAMILY_FALLBACK, 64 x 32, 8 warps; banded, the masked stage first;
        D = 256 the token relations 16 x 16. Not spill-free everywhere: `COMMAND_CEILINGS` records the bytes
        that remain, and `triton_aot` ships the token relations at D = 64 only
    none, argmax, class_mass, default+argmax: the commands' other statistic sets (`triton_aot --commands`),
        exactly those switches, each its entries from the sweep of 2026-12-08
        (bench/tile_sweep.py --commands; docs/kernels.md, "Tiles of the commands' statistic sets")
        at the shapes the commands run: D = 64 grouped and plain, D = 128 grouped and banded, D = 256 grouped
    default+norms, default+class_norms: the default statistics with the norm-based twins (docs/norms.md) of
        `run --norms` (offset, class and weighted norms) and of `sinks --norms` (class and weighted norms), the
        same way (the twins' sweep, later on 2026-12-08: docs/kernels.md "Tiles of the norm-based twins");
        the atlas's union with the twins takes the tokens' entries
    sums by dot: no argmax and no wide feature dot: on sm_90 at D <= 64, 128 x 128 with L_AND_T, 3 stages
    default: the budget's statistics (entropy, class masses; offsets have no switch), `triton_aot --budget`,
        every row within its targets (at most 1.25x the flash baseline): sm_80 at D = 64, 128 x 128 with the
        masked stage first (1.17x); sm_80 at D = 128, 64 x 64 with 4 warps, plain and banded with the masked
        stage first, grouped with G compiled in (1.22x, 1.21x); sm_90 at D = 128, 128 x 128 with L_ONLY and
        the masked stage first (1.23x, 1.25x); banded with G = 1 (not the budget's) 128 x 64, 1 stage, L_ONLY
        (1.50x); D = 256 grouped (Gemma-3, not the budget's) from the sweep below
    wide: the argmax or a 64-column feature dot, D = 256: 16 x 32, 4 warps
    any: every other call (the tiles every call had before the budget): D <= 64 128 x 64 with 8 warps (sm_80
        banded 128 x 32), D = 128 128 x 64 or 128 x 32 with 8 warps (sm_80 banded 32 x 32, 4 warps), D = 256
        32 x 32, 4 warps; every switch off

Which tiles fit in 255 registers is ptxas's outcome and is not monotone in the work: the old rule, that only
the default statistics got the wide tiles because with fewer statistics the same tiles spilled 8-16 B (measured
on an older kernel), no longer held: the sweep of 2026-12-08 compiled every command row of those sets on a
pruned set of candidates (tile shapes widest first with the masked stage first, then one switch or the stages at
a time) and found a better spill-free config for 45 of its 46 rows, wider tiles for 42 of them (592
compiles, bf16; fp16 checked after):
their main loops went from 1.32-11.7x the flash baseline's instructions to 0.87-3.6x (sm_80 at D <= 128 at
most 1.66x; Gemma-3's D = 256 0.96-1.96x on sm_80, 1.8-3.6x on sm_90), the 4-68 B spilled at D = 256 to none,
and 19 rows now meet every target (`COMMAND_CEILINGS`, 67 lines -> 48). A candidate was taken only with no spill
and no figure of the ratchet (ratio, masked ratio, MUFU per score, spills, narrow wgmma) higher than the
tiles before; ratios within 3% of the lowest were a tie, won by 2 stages or more (pipelined loads, whose
latency an instruction count does not see). 14 of the 45 take 1 stage all the same (2 and 3 stages spilled,
or issued 7-11% more on sm_90): whether the unpipelined K and V loads cost more than the instructions saved
only a GPU's timing can say.

Under Triton's interpreter (no GPU) every call takes 16 x 16 blocks: no register file to fit,
and short test rows then span several blocks, so both stages of the loop and the band's edges
are exercised on the CPU, with SUMS_BY_DOT where a GPU would take it for the dtype (half precision,
TF32: a P rounded to the input dtype anyway; with exact fp32 dots the row sums per score are the more
accurate, about 3x on the entropy), and tests force each way through `blocks` on the same inputs.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

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
# the default statistics' kernel switches (entropy, class masses; offsets have none): the budget's calls
DEFAULT_SWITCHES = frozenset(_spec.kernel_stats("default"))
PER_SCORE = 0  # l and T per score, in fp32: an FADD and an FFMA per score
L_AND_T = 1  # l from the key features' ones column and T = q . (P K): both on the tensor cores
L_ONLY = 2  # l from the ones column; the entropy's t = sum p (z - m) per score, relative to the running max


def _default_twins(*kinds: str) -> frozenset:
    """The norm-based twins (Kobayashi et al. 2020, docs/norms.md) the kernel computes for the default statistics
    (offset and class masses: the table's "default" tile family, `spec.RowStat.twin_of`) whose base is of one of
    `kinds` (`spec.KernelTraits.kind`: "epilogue", "by_dot"), and the twins' denominator (a twin of nothing)."""
    return frozenset(s.name for s in _spec.ROW_STATS if s.switch == "norms" and s.kernel is not None
                     and s.kernel.switch is not None
                     and (s.twin_of is None
                          or (s.twin_of.kernel.tiles == "default" and s.twin_of.kernel.kind in kinds)))


# `run --norms`' twins on top of the default statistics (offset and class masses' twins, weighted_norm), and
# `sinks --norms`' (the class masses' and weighted_norm)
NORM_TWINS = _default_twins("epilogue", "by_dot")
CLASS_NORM_TWINS = _default_twins("by_dot")


def forward_config(D: int, dtype=torch.float16, arch: int = 90, positions: bool = False, tf32: bool = False,
                   interpreted: bool = False, banded: bool = False, wide: bool = False, n_classes: int = 4,
                   tokens: bool = False, switched_on: frozenset | None = None, grouped: bool = False) -> dict:
    """BLOCK_M, BLOCK_N, BLOCK_D, num_warps, num_stages (and `maxnreg` where it applies) of a
    launch for head dimension D, input dtype, target sm_<arch> (80 or 90; newer targets take
    sm_90's tiles), whether position statistics are asked, whether fp32 dots run on TF32
    tensor cores, and whether the layout is banded (causal, windowed or grouped-query: the band's
    and the stacked heads' row vectors take registers the plain layout's largest tiles need), and whether its
    key-feature dot is wide (more than 32 key classes: 64 columns) or it asks for the argmax, its
    number of key classes (whether the features have a free column for SUMS_BY_DOT's ones), and
    whether it asks for the token relations, and the statistics whose kernel switches are on (names of
    the table, `triton_launch.kernel_outputs`; None: not known, no statistic-set kind that names a set
    applies), and whether a banded layout is `grouped` (G >= 2).
    Half precision (and TF32) reads `TILES` (module docstring): the first of the call's kinds (`KINDS`) with
    an entry for its target, D class and layout (`LAYOUTS`) that it can take (`_fits`).
    BLOCK_M counts stacked rows (G heads x BLOCK_M / G positions under grouped-query attention)."""
    block_d = max(16, triton.next_power_of_2(D))
    ones_fit = feature_width(n_classes, ones=True) == feature_width(n_classes)
    if interpreted:
        return _config(INTERPRETER_BLOCK, INTERPRETER_BLOCK, 4, 1, block_d,
                       sums_by_dot=L_AND_T if ones_fit and (dtype in HALF_DTYPES or tf32) else PER_SCORE)
    if dtype in HALF_DTYPES or tf32:
        call = Call(frozenset(switched_on) if switched_on is not None else None, positions, tokens,
                    wide, ones_fit, feature_width(n_classes))
        layout = "grouped" if banded and grouped else "banded" if banded else "plain"
        entry = lookup(90 if arch >= 90 else 80, max(32, block_d), layout, call)
        return _config(*entry.tiles, block_d, sums_by_dot=entry.sums_by_dot, masked_first=entry.masked_first,
                       fixed_g=entry.fixed_g, clamp_keys=entry.clamp_keys)
    if block_d <= 64:
        return _config(16, 32, 8, 2, block_d, maxnreg=MAXNREG_FP32)
    return _config(16, 16, 8 if block_d <= 128 else 16, 1, block_d, maxnreg=MAXNREG_FP32)


def kernel_config(D: int, dtype, arch: int, switched_on: frozenset, n_classes: int, banded: bool = False,
                  grouped: bool = False, tf32: bool = False, interpreted: bool = False) -> dict:
    """The config of one launch of the fused forward from what it computes: the kernel switches it turns on
    (names of the table, `triton_launch.kernel_outputs`), its key classes, its layout (banded; grouped: G >= 2).
    The one reading of a call's statistics into `forward_config`'s arguments, for the
    launcher (`triton_launch.launch_config`) and the ahead-of-time compile (`triton_aot.Specialisation`)
    alike: the tile families of the statistics switched on (`spec.KernelTraits.tiles`: "positions", "tokens",
    "wide"), and a wide feature dot for more than 32 classes; and MEAN_BY_DOT (`mean_by_dot`)."""
    on = frozenset(switched_on)
    # the table read at call time: an entry without kernel traits (one being added) brings no family
    families = {s.kernel.tiles for s in _spec.ROW_STATS if s.name in on and s.kernel is not None}
    config = forward_config(D, dtype, arch, "positions" in families, tf32=tf32, interpreted=interpreted,
                            banded=banded, wide=feature_width(n_classes) > 32 or "wide" in families,
                            n_classes=n_classes, tokens="tokens" in families, switched_on=on,
                            grouped=banded and grouped)
    return {**config, "MEAN_BY_DOT": mean_by_dot(on, n_classes, banded, D)}


def mean_by_dot(switched_on: frozenset, n_classes: int, banded: bool, D: int = 64) -> bool:
    """Whether a call takes the mean distance's sum_j p_j (i - j) = i l - P j from the key features' dot
    (`triton_kernel._position_sums`): the key features then hold a ones column and the key positions as two columns
    (j = 256 hi + lo: exact in bf16), which needs three free columns (at most 13 classes under 16). Banded layouts
    only, whose unmasked blocks lie before every row: there the mean distance costs no work per score (one FFMA
    per score before, and its row sum); a plain layout's unmasked blocks hold keys after the row, which still
    take one per score. D <= 128: at D = 256 (16 x 16 tiles that spill either way) it issued 3-4% fewer
    instructions but spilled 128-188 B more on the positions' rows (`triton_aot --commands`, 2026-12-08); from
    D = 64 to 128 it took 3.2-7.4% off every position and union row and the spills of two of them (sm_80 Llama-3-8B:
    24 -> 4 B, 8 -> 0)."""
    return "mean_distance" in switched_on and banded and D <= 128 and feature_width(n_classes + 2, ones=True) == \
        feature_width(n_classes)


def _config(m: int, n: int, warps: int, stages: int, block_d: int, sums_by_dot: int = 0, masked_first: bool = False,
            fixed_g: bool = False, clamp_keys: bool = False, **caps) -> dict:
    """One launch config: tiles, warps, stages and the kernel's constexpr switches (module docstring)."""
    return dict(BLOCK_M=m, BLOCK_N=n, BLOCK_D=block_d, num_warps=warps, num_stages=stages, SUMS_BY_DOT=sums_by_dot,
                MASKED_FIRST=masked_first, FIXED_G=fixed_g, CLAMP_KEYS=clamp_keys, **caps)


class Call(NamedTuple):
    """What the statistic-set kinds (`KINDS`) read of a half-precision call."""

    switched_on: frozenset | None  # the kernel switches on (names of the table); None: not known
    positions: bool  # a statistic of the "positions" tile family on (`spec.KernelTraits.tiles`)
    tokens: bool  # one of the "tokens" family (the token relations)
    wide: bool  # the argmax, or a 64-column key-feature dot (more than 32 classes)
    ones_fit: bool  # a free key-feature column for SUMS_BY_DOT's ones (at most 15 classes under 16, ...)
    features: int = 16  # F_PAD, the key-feature matrix's width (`feature_width`): 16, 32 or 64


class Entry(NamedTuple):
    """One config of `TILES`: (BLOCK_M, BLOCK_N, num_warps, num_stages) and the kernel's switches."""

    tiles: tuple[int, int, int, int]
    sums_by_dot: int = PER_SCORE
    masked_first: bool = False
    fixed_g: bool = False
    features: int = 64  # the widest key-feature matrix (F_PAD) a call may have to take it: what it was compiled for
    # a spill workaround (`triton_kernel._key_rows`): the masked blocks clamp the key rows past the sequence's end
    # to its last row instead of a masked load of K and V; exact either way, which one compiles without a spill
    # is ptxas's call (Triton 3.7.1: the plain layout's L_ONLY entries, as the sweep compiled them)
    clamp_keys: bool = False


def _is(*names: str):
    """A kind's test: the call's kernel switches are exactly `names`, and a key-feature dot no wider than 32
    columns (wide only through the argmax)."""
    on = frozenset(names)
    return lambda c: c.switched_on == on and c.wide == ("argmax" in on)


# The statistic-set kinds, in order of precedence: a call is every kind whose test holds, and takes the entry of
# the first of them that `TILES` has for its target, D class and layout (and that it can take: `_fits`).
# "any" holds for every call and has an entry everywhere.
KINDS: tuple[tuple[str, Callable[[Call], bool]], ...] = (
    ("tokens", lambda c: c.tokens),  # the token relations (with positions too: the atlas's union)
    ("positions", lambda c: c.positions),  # distance mass, mean distance, position mass
    # the commands' statistic sets (`triton_aot --commands`), each its own tiles (bench/tile_sweep.py --commands)
    ("none", _is()),  # no statistic (the lse only)
    ("argmax", _is("argmax")),
    ("class_mass", _is("class_mass")),
    ("default+argmax", _is(*DEFAULT_SWITCHES, "argmax")),
    ("default+norms", _is(*DEFAULT_SWITCHES, *NORM_TWINS)),  # run --norms
    ("default+class_norms", _is(*DEFAULT_SWITCHES, *CLASS_NORM_TWINS)),  # sinks --norms
    ("sums by dot", lambda c: not c.wide),  # the row sums on the tensor cores (L_AND_T) where they pay
    ("default", _is(*DEFAULT_SWITCHES)),  # the budget's statistics
    ("wide", lambda c: c.wide),  # the argmax or a 64-column feature dot
    ("any", lambda c: True),
)
# a layout's keys in `TILES`, in order: grouped-query attention (banded, G >= 2) takes the banded entry where it
# has none of its own
LAYOUTS = {"plain": ("plain",), "banded": ("banded",), "grouped": ("grouped", "banded")}
# half precision, D <= 128, the position statistics' and token relations' tiles where `TILES` has no family entry
FAMILY_FALLBACK = (64, 32, 8, 2)


def _family(target: int, d: int, kind: str, plain: tuple, banded: tuple) -> dict:
    """A tile family's two entries (their masked stage first when banded)."""
    return {(target, d, "plain", kind): Entry(plain), (target, d, "banded", kind): Entry(banded, masked_first=True)}


# The one table of the half-precision tiles (fp16, bf16; TF32 dots take them too): (target 80 or 90, D class
# (BLOCK_D, at least 32: 32, 64, 128, 256), layout ("plain", "banded": causal or windowed with G = 1,
# "grouped": banded with G >= 2), statistic-set kind (`KINDS`)) -> `Entry`. Each the fewest main-loop
# warp-instructions per score without a register spill that the instruction budget found (Triton 3.7.1,
# `triton_aot --budget` and `--commands`, bench/tile_sweep.py; docs/kernels.md). Where a kind has no entry the
# call falls to its next kind: "any" is what every other call takes.
TILES: dict[tuple[int, int, str, str], Entry] = {
    # -- "any": every call no other entry takes (D <= 64 the same tiles at 32 and 64)
    **{(90, d, "plain", "any"): Entry((128, 64, 8, 2)) for d in (32, 64, 128)},
    **{(90, d, "banded", "any"): Entry((128, 64, 8, 2)) for d in (32, 64)},
    (90, 128, "banded", "any"): Entry((128, 32, 8, 2)),
    **{(80, d, "plain", "any"): Entry((128, 64, 8, 2)) for d in (32, 64)},
    **{(80, d, "banded", "any"): Entry((128, 32, 8, 2)) for d in (32, 64)},
    (80, 128, "plain", "any"): Entry((128, 32, 8, 2)),
    (80, 128, "banded", "any"): Entry((32, 32, 4, 2)),
    **{(t, 256, lay, "any"): Entry((32, 32, 4, 2)) for t in (80, 90) for lay in ("plain", "banded")},
    # -- "wide" (the argmax, a 64-column feature dot): D = 256 only (below it, "any")
    **{(t, 256, lay, "wide"): Entry((16, 32, 4, 2)) for t in (80, 90) for lay in ("plain", "banded")},
    # -- the token relations and the position statistics: 128 x 64 or 128 x 32 with 8 warps where they fit
    # (sweep of 2026-12-07, docs/kernels.md "Tiles of the position and token statistics", checked on the commands'
    # own specialisations; where every fast candidate spilled, the tiles that halve the instructions were kept
    # with a few bytes of spill, recorded in triton_aot.COMMAND_CEILINGS), else FAMILY_FALLBACK; D = 256: the
    # token relations 16 x 16, the position statistics "wide" or "any"
    **_family(80, 32, "positions", FAMILY_FALLBACK, FAMILY_FALLBACK),
    **_family(80, 64, "positions", (128, 64, 8, 2), (128, 64, 8, 2)),
    **_family(80, 128, "positions", FAMILY_FALLBACK, (128, 32, 8, 2)),
    **_family(90, 32, "positions", FAMILY_FALLBACK, FAMILY_FALLBACK),
    **_family(90, 64, "positions", (128, 64, 8, 2), (128, 64, 8, 2)),
    **_family(90, 128, "positions", (128, 32, 8, 2), (64, 32, 4, 2)),
    **_family(80, 32, "tokens", FAMILY_FALLBACK, FAMILY_FALLBACK),
    **_family(80, 64, "tokens", (128, 32, 8, 2), (128, 32, 8, 2)),
    **_family(80, 128, "tokens", (128, 32, 8, 2), (128, 32, 8, 2)),
    **_family(90, 32, "tokens", FAMILY_FALLBACK, FAMILY_FALLBACK),
    **_family(90, 64, "tokens", (128, 64, 8, 2), (128, 32, 8, 2)),
    **_family(90, 128, "tokens", (128, 32, 8, 2), (64, 32, 4, 2)),
    **{(t, 256, lay, "tokens"): Entry((16, 16, 4, 2)) for t in (80, 90) for lay in ("plain", "banded")},
    # -- the row sums on the tensor cores (L_AND_T, a free ones column): sm_90 at D <= 64, plain and banded
    **{(90, d, lay, "sums by dot"): Entry((128, 128, 8, 3), sums_by_dot=L_AND_T) for d in (32, 64)
       for lay in ("plain", "banded")},
    # -- the default statistics (entropy, class masses; offsets have no switch): the budget's tiles and switches
    # (`triton_aot --budget`, every row within its targets); L_ONLY needs a free ones column (`_fits`)
    **{(80, 64, lay, "default"): Entry((128, 128, 8, 2), masked_first=True) for lay in ("plain", "banded")},
    (80, 128, "plain", "default"): Entry((64, 64, 4, 2), masked_first=True),
    (80, 128, "banded", "default"): Entry((64, 64, 4, 2), masked_first=True),
    (80, 128, "grouped", "default"): Entry((64, 64, 4, 1), fixed_g=True),
    (90, 128, "plain", "default"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, clamp_keys=True),
    # banded (G = 1, Llama-2-7B; not the budget's): the sweep of 2026-12-08 (below), 1 stage and the masked stage
    # last (1.50x; 2 stages without the masked stage first spilled 16 B, with it 1.65x)
    (90, 128, "banded", "default"): Entry((128, 64, 8, 1), sums_by_dot=L_ONLY),
    (90, 128, "grouped", "default"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True),
    # -- the commands' other statistic sets (`KINDS`: none, argmax, class_mass, default+argmax; and
    # the default statistics at D = 256): the spill-free config with the fewest main-loop instructions of
    # bench/tile_sweep.py --commands (sweep of 2026-12-08, docs/kernels.md "Tiles of the commands' statistic
    # sets"), at the layouts of the commands' shapes (D = 64: Llama-3.2-1B grouped, bert-base plain; D = 128:
    # Llama-3-8B grouped, Llama-2-7B banded; D = 256: Gemma-3 grouped); where it found none better, none here.
    # Each for the key-feature width it was compiled at (`features`: the commands' 4 classes, the features' 32):
    # with 32 classes the argmax's tiles spilled 36-40 B on sm_80, so a wider call takes the kinds after
    (80, 64, "grouped", "argmax"): Entry((128, 128, 8, 2), masked_first=True, fixed_g=True, features=16),
    (80, 64, "grouped", "class_mass"): Entry((128, 128, 8, 2), masked_first=True, features=32),
    (80, 64, "grouped", "default+argmax"): Entry((128, 64, 8, 2), masked_first=True, fixed_g=True, features=16),
    (80, 64, "grouped", "none"): Entry((128, 128, 8, 2), masked_first=True, features=16),
    (80, 128, "banded", "argmax"): Entry((128, 64, 8, 2), masked_first=True, features=16),
    (80, 128, "banded", "class_mass"): Entry((128, 32, 8, 2), masked_first=True, features=32),
    (80, 128, "banded", "default+argmax"): Entry((128, 64, 8, 1), masked_first=True, features=16),
    (80, 128, "banded", "none"): Entry((128, 128, 8, 1), masked_first=True, features=16),
    (80, 128, "grouped", "argmax"): Entry((128, 64, 8, 2), masked_first=True, features=16),
    (80, 128, "grouped", "class_mass"): Entry((128, 32, 8, 2), masked_first=True, features=32),
    (80, 128, "grouped", "default+argmax"): Entry((128, 64, 8, 1), features=16),
    (80, 128, "grouped", "none"): Entry((128, 64, 8, 2), masked_first=True, features=16),
    (80, 256, "grouped", "argmax"): Entry((64, 64, 8, 2), masked_first=True, features=16),
    (80, 256, "grouped", "class_mass"): Entry((64, 32, 4, 2), masked_first=True, fixed_g=True, features=32),
    (80, 256, "grouped", "default"): Entry((64, 32, 4, 1), masked_first=True, fixed_g=True, features=16),
    (80, 256, "grouped", "default+argmax"): Entry((64, 32, 4, 1), masked_first=True, features=16),
    (80, 256, "grouped", "none"): Entry((64, 64, 8, 2), masked_first=True, features=16),
    (90, 64, "grouped", "argmax"): Entry((128, 128, 8, 3), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 64, "grouped", "default+argmax"): Entry((128, 64, 8, 1), sums_by_dot=L_ONLY, fixed_g=True, features=16),
    (90, 64, "plain", "argmax"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, features=16, clamp_keys=True),
    (90, 64, "plain", "default+argmax"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, features=16, clamp_keys=True),
    (90, 128, "banded", "argmax"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 128, "banded", "class_mass"): Entry((128, 64, 8, 1), features=32),
    (90, 128, "banded", "default+argmax"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 128, "banded", "none"): Entry((128, 128, 8, 3), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 128, "grouped", "argmax"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 128, "grouped", "class_mass"): Entry((128, 64, 8, 1), features=32),
    (90, 128, "grouped", "default+argmax"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 128, "grouped", "none"): Entry((128, 128, 8, 3), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 256, "grouped", "argmax"): Entry((64, 32, 4, 2), masked_first=True, features=16),
    (90, 256, "grouped", "class_mass"): Entry((64, 32, 4, 2), masked_first=True, features=32),
    (90, 256, "grouped", "default"): Entry((64, 64, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 256, "grouped", "default+argmax"): Entry((64, 64, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 256, "grouped", "none"): Entry((64, 32, 4, 2), masked_first=True, features=16),
    # -- the default statistics with the norm-based twins (`KINDS`: "default+norms", run --norms; "default+class_norms",
    # sinks --norms): the spill-free config with the fewest main-loop instructions of bench/tile_sweep.py --commands
    # (the twins' sweep, 2026-12-08, 381 compiles: docs/kernels.md "Tiles of the norm-based twins"), at the commands'
    # shapes and their key classes (run's 4, the sinks' 5: 16 feature columns, 8 norm columns a head). sm_80 at
    # D = 256: every 32- and 64-row candidate spilled (12-2,756 B), 16 x 32 with the masked stage first does not (2.06x)
    **{(80, d, lay, kind): Entry((128, 64, 8, 1), masked_first=True, features=16)
       for d, lay in ((64, "grouped"), (128, "grouped"), (128, "banded"))
       for kind in ("default+norms", "default+class_norms")},
    **{(80, 64, "plain", kind): Entry((128, 128, 8, 2), masked_first=True, features=16)
       for kind in ("default+norms", "default+class_norms")},
    **{(80, 256, "grouped", kind): Entry((16, 32, 4, 2), masked_first=True, features=16)
       for kind in ("default+norms", "default+class_norms")},
    (90, 64, "grouped", "default+norms"): Entry((128, 128, 8, 3), sums_by_dot=L_ONLY, masked_first=True, features=16),
    (90, 64, "grouped", "default+class_norms"):
        Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    **{(90, 64, "plain", kind): Entry((128, 128, 8, 2), sums_by_dot=L_AND_T, masked_first=True, features=16)
       for kind in ("default+norms", "default+class_norms")},
    **{(90, 128, "grouped", kind): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16)
       for kind in ("default+norms", "default+class_norms")},
    (90, 128, "banded", "default+norms"): Entry((128, 128, 8, 2), sums_by_dot=L_ONLY, masked_first=True, features=16),
    # with the sinks' 5 classes 128 x 128 spilled 4 B
    (90, 128, "banded", "default+class_norms"): Entry((128, 64, 8, 1), sums_by_dot=L_ONLY, features=16),
    **{(90, 256, "grouped", kind): Entry((64, 64, 8, 3), masked_first=True, features=16)
       for kind in ("default+norms", "default+class_norms")},
}


def _fits(entry: Entry, call: Call) -> bool:
    """Whether a call can take an entry: SUMS_BY_DOT's ones need a free key-feature column, and its key-feature
    matrix no wider than the entry was compiled for (its (BLOCK_M, F_PAD) accumulator takes registers)."""
    return (entry.sums_by_dot == PER_SCORE or call.ones_fit) and call.features <= entry.features


def kinds(call: Call) -> tuple[str, ...]:
    """The statistic-set kinds of a call (`KINDS`), in order of precedence."""
    return tuple(kind for kind, test in KINDS if test(call))


def lookup(target: int, d_class: int, layout: str, call: Call) -> Entry:
    """`TILES`' entry for a half-precision call: the first kind of the call (`kinds`), in the first of its
    layout's keys (`LAYOUTS`), that has one the call can take (`_fits`)."""
    for kind in kinds(call):
        for lay in LAYOUTS[layout]:
            entry = TILES.get((target, d_class, lay, kind))
            if entry is not None and _fits(entry, call):
                return entry
    raise KeyError(f"no tiles for sm_{target}, D class {d_class}, {layout}: TILES lacks its 'any' entry")


@functools.cache
def device_arch(device: torch.device) -> int:
    """sm_<major><minor> of a CUDA device as an int (90 for an H100 or H200), read once per device."""
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def feature_width(n_classes: int, ones: bool = False) -> int:
    """F_PAD, the key-feature matrix's width: the n_classes one-hot columns (and with `ones` a column of
    ones, the last: SUMS_BY_DOT's row sum) padded to a power of two >= 16 (tl.dot's smallest N)."""
    return max(16, triton.next_power_of_2(n_classes + int(ones)))
