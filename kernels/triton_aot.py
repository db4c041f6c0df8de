"""Ahead-of-time compilation of the shipped Triton specialisations, without a GPU.

Every constexpr combination `triton_attention` launches on a GPU (code path and block
tiles as `triton_config.forward_config` chooses them per target, statistics switches, input dtype, head dimension) is
compiled for real targets (sm_80, sm_90) with `triton.compile`, and the PTX is assembled
by Triton's bundled `ptxas -v` to read the registers per thread and the spill stores and
loads; shared memory comes from the compiled metadata. A spill means the block sizes are
too large for the target: `tests/kernels/test_triton_aot.py` fails on any.

    python -m bertscope.kernels.triton_aot              # table for sm_80 and sm_90
    python -m bertscope.kernels.triton_aot --arch 80    # one target
    python -m bertscope.kernels.triton_aot --classes 32 --dtype bf16   # a part of the matrix
    tools/aot_oldest_triton.sh                          # the same report with the oldest supported Triton

The kernel module must be imported without TRITON_INTERPRET=1 (under the interpreter
@triton.jit returns an interpreted function, which cannot be compiled); the command line
entry removes the variable before importing it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .spec import kernel_stats

# triton and the kernel modules are imported inside the functions, never here: `main` must remove
# TRITON_INTERPRET before they run @triton.jit (triton's own library functions too), see above.
ARCHS = (80, 90)
# key class counts: the vocabulary's [CLS], [SEP], punctuation, other (4), 16 for classes from
# tags (UPOS has 17 tags) and 32 (the features scheme's); the class count is a runtime argument,
# but the key-feature accumulator is (BLOCK_M, F_PAD) registers, F_PAD its padded width, compiled in
CLASS_COUNTS = (4, 16, 32)
# input dtypes (Triton's names); bf16 takes fp16's tiles
DTYPES = ("fp32", "fp16", "bf16")
# head dimensions of the plain layout: MiniLM (32), bert-base and larger (64), 128
HEAD_DIMS = (32, 64, 128)
# head dimensions of the other layouts: the encoders' and SmolLM2 / Llama-3.2's (32, 64), 128, Gemma-3's 256
LAYOUT_HEAD_DIMS = (32, 64, 128, 256)
LAYOUT_MAP_HEAD_DIMS = (64, 256)
# the statistics `bertscope run` and the decoders' analyses ask for by default (offsets are a
# runtime argument: the epilogue's loop), the ones the instruction budget is set for: the table's
# "default" tile family (`spec.KernelTraits`)
DEFAULT_STATS = kernel_stats("default")
# the argmax's family ("wide"), the position statistics' and the token relations' (StatsSpec.token_relations:
# switched on together, on top of the argmax specialisations)
WIDE_STATS = kernel_stats("wide")
TOKEN_STATS = kernel_stats("tokens")


@dataclass(frozen=True)
class Specialisation:
    """One specialisation of the fused forward (`triton_kernel.attn_stats_fwd`) as a launch
    compiles it: the plain (encoder) layout, BANDED off and G = 1 (Triton's launcher specialises
    an integer argument equal to 1 to a constant), or with `banded` the other layouts (causal,
    windowed, grouped-query), whose band (win_left, win_right) is a pair of runtime integers: one
    compiled kernel serves causal and windowed layouts alike. `group` is G: 1, or the model's (3 for
    SmolLM2, 4 for Gemma-3 and Llama-3.2). G is read at run time (the name says "G=G": the check
    holds for any G >= 2) unless the config compiles it in (FIXED_G, `triton_config`: the name
    says "G=3", "G=4"). Tiles depend on the target (`triton_config.forward_config`)."""

    D: int
    dtype: str  # "fp32", "fp16" or "bf16"
    stats: tuple[str, ...] = DEFAULT_STATS  # the statistics switched on (their constexpr switches)
    n_classes: int = 4
    banded: bool = False
    group: int = 1  # G, the query heads per key/value head (banded only)
    # (BLOCK_M, BLOCK_N, num_warps, num_stages) in place of the config's: candidates of a tile sweep
    # (bench/tile_sweep.py); None, the tiles a launch takes
    tiles: tuple[int, int, int, int] | None = None
    # the kernel switches in place of the config's, (name, value) pairs of SUMS_BY_DOT, MASKED_FIRST, FIXED_G,
    # CLAMP_KEYS:
    # a sweep's candidates too; (), the config's
    switches: tuple[tuple[str, int | bool], ...] = ()

    def config(self, arch: int) -> dict:
        from .triton_config import kernel_config  # see the note above ARCHS

        c = kernel_config(self.D, torch_dtype(self.dtype), arch, frozenset(self.stats), self.n_classes,
                          banded=self.banded, grouped=self.group > 1)
        if self.tiles is not None:
            c = {**c, **dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), self.tiles))}
        unknown = {name for name, _ in self.switches} - {"SUMS_BY_DOT", "MASKED_FIRST", "FIXED_G", "CLAMP_KEYS"}
        if unknown:
            raise ValueError(f"not a kernel switch of the config: {sorted(unknown)}")
        return {**c, **dict(self.switches)}

    def switched_on(self) -> set[str]:
        return set(self.stats)

    def main_stage(self, arch: int) -> str:
        """Which loop is the main one (`triton_sass.main_loop`): the last where the config runs the
        masked key blocks first (MASKED_FIRST), else the first."""
        return "last" if self.config(arch)["MASKED_FIRST"] else "first"

    def name(self, arch: int = 90) -> str:
        from .triton_config import L_AND_T, L_ONLY, PER_SCORE  # see the note above ARCHS

        c = self.config(arch)
        kind = f"band G={self.group if c['FIXED_G'] or self.group == 1 else 'G'}" if self.banded else "plain"
        return (f"{kind} M{c['BLOCK_M']} N{c['BLOCK_N']} D{c['BLOCK_D']} w{c['num_warps']}s{c['num_stages']}{_cap(c)} "
                f"{self.dtype} C{self.n_classes} {_flags(self)}"
                + {PER_SCORE: "", L_AND_T: " sums-by-dot", L_ONLY: " l-by-dot"}[int(c["SUMS_BY_DOT"])]
                + (" masked-first" if c["MASKED_FIRST"] else "") + (" mean-by-dot" if c.get("MEAN_BY_DOT") else ""))

    def ast_source(self, arch: int):
        """(ASTSource, config) of this specialisation for sm_<arch> (`_forward_source`)."""
        from .triton_config import feature_width  # see the note above ARCHS
        from .triton_launch import norm_widths

        c = self.config(arch)
        norm_w, norm_f = norm_widths(self.n_classes, self.group if self.banded else 1)
        constexprs = dict(BANDED=self.banded, F_PAD=feature_width(self.n_classes), HEAD_DIM=self.D,
                          NORM_W=norm_w, NORM_F=norm_f, CLAMP_KEYS=bool(c.get("CLAMP_KEYS", False)),
                          MEAN_BY_DOT=bool(c.get("MEAN_BY_DOT", False)),
                          DOT_PRECISION="ieee" if self.dtype == "fp32" else "tf32",
                          SUMS_BY_DOT=int(c["SUMS_BY_DOT"]), MASKED_FIRST=c["MASKED_FIRST"],
                          GROUP=self.group if self.banded and c["FIXED_G"] else 0)
        if not self.banded or self.group == 1:
            constexprs["G"] = 1
        return _forward_source(self, c, constexprs), c


def LayoutSpec(D: int, dtype: str, stats: tuple[str, ...] = DEFAULT_STATS, n_classes: int = 4,
               group: int = 4) -> Specialisation:
    """A banded `Specialisation` (causal, windowed, grouped-query layouts)."""
    return Specialisation(D, dtype, stats, n_classes, True, group)


def _flags(spec) -> str:
    """The switched-on statistics in a specialisation's name, in the table's order ("-" for none)."""
    from .spec import ROW_STATS

    on = spec.switched_on()
    return "+".join(s.name for s in ROW_STATS if s.name in on) or "-"


@dataclass(frozen=True)
class AotSpec:
    """One GPU launch specialisation of a whole-map kernel (triton_maps.py, triton_js.py) for
    the compilation and spill check; it builds its own (ASTSource, config). Block sizes come
    from the same *_config functions the wrappers launch with."""

    kernel: str  # _column_mass_kernel, _word_map_kernel, _row_lse_kernel or _js_pair_kernel
    L: int  # a row length that selects the configuration
    D: int
    dtype: str  # "fp32", "fp16" or "bf16"
    W: int = 0  # units (word maps only)
    banded: bool = False  # the layout variant (BANDED: band skipping, key heads shared by query heads)

    def config(self, arch: int = 90) -> dict:  # the whole-map kernels' blocks do not depend on the target
        from .triton_js import js_config  # see the note above ARCHS
        from .triton_maps import column_mass_config, word_map_config

        if self.kernel == "_word_map_kernel":
            return word_map_config(self.L, self.D, self.W, self.dtype == "fp32")
        if self.kernel == "_column_mass_kernel":
            return column_mass_config(self.L, self.D)
        return js_config(self.L, self.D)

    def name(self, arch: int = 90) -> str:
        c = self.config()
        blocks = (f"M{c['BLOCK_M']} N{c['BLOCK_N']} D{c['BLOCK_D']}" + (f" W{c['BLOCK_W']}" if "BLOCK_W" in c else "")
                  + (f" K{c['BLOCK_DK']}" if c.get("BLOCK_DK", c["BLOCK_D"]) < c["BLOCK_D"] else ""))
        return (f"{self.kernel.strip('_').removesuffix('_kernel')} {blocks} w{c['num_warps']}{_cap(c)} {self.dtype}"
                + (" banded" if self.banded else ""))

    def ast_source(self, arch: int = 90):
        """(ASTSource, config with num_warps and num_stages) as a typical launch specialises
        it: unit strides of the innermost dimensions are constants, pointers and the q/k
        strides 16-divisible."""
        import triton  # see the note above ARCHS
        from triton.compiler import ASTSource

        from . import triton_js, triton_maps

        fn = getattr(triton_maps, self.kernel, None) or getattr(triton_js, self.kernel)
        if not isinstance(fn, triton.runtime.jit.JITFunction):
            raise RuntimeError("the kernel module was imported under TRITON_INTERPRET=1; compile in a process "
                               "without it (python -m bertscope.kernels.triton_aot)")
        t = self.dtype
        pointers = {"Q": f"*{t}", "K": f"*{t}", "KeyValid": "*i8", "Lse": "*fp32", "ColMass": f"*{t}",
                    "FromWord": "*fp32", "ToWord": "*fp32", "Candidate": "*i8", "WordMap": f"*{t}",
                    "WordArgmax": "*i64", "Entropy": "*fp32", "Pairs": "*i32", "Partial": "*fp32",
                    "KvHead": "*i32", "Left": "*i32", "Right": "*i32"}
        unit = {"stride_qd", "stride_kd", "stride_ml", "stride_cw"}
        c = self.config()
        constexprs = {n: 1 for n in unit if n in fn.arg_names}
        blocks = ("BLOCK_M", "BLOCK_N", "BLOCK_D", "BLOCK_W", "BLOCK_DK")
        constexprs.update({n: c[n] for n in blocks if n in fn.arg_names})
        constexprs["IS_FP32"] = t == "fp32"
        if "BANDED" in fn.arg_names:
            constexprs["BANDED"] = self.banded
        sig = {}
        for n in fn.arg_names:
            sig[n] = pointers.get(n) or ("constexpr" if n in constexprs else "fp32" if n == "sm_scale" else "i32")
        aligned = [n for n in fn.arg_names if n in pointers] + [
            n for n in ("stride_qb", "stride_qh", "stride_ql", "stride_kb", "stride_kh", "stride_kl", "D")]
        attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
        return ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs), c


def position_stats() -> tuple[str, ...]:
    """The position-dependent statistics (the table's "positions" tile family), switched on together."""
    return kernel_stats("positions")


def _cap(c: dict) -> str:
    """The register cap in a specialisation's name: r128 for maxnreg=128, nothing without one."""
    return f"r{c['maxnreg']}" if c.get("maxnreg") is not None else ""


def torch_dtype(name: str):
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


def aot_specialisations(dtypes=DTYPES, layouts: str = "all") -> list[AotSpec]:
    """The shipped specialisations of the column-mass, word-map and JS kernels for rows of
    32 keys or more (shorter rows take 16-wide blocks, which hold fewer registers): head
    dimension 64 (the larger of the encoders'; D = 32 holds fewer registers), and
    D = 32 too for the word maps, whose register use does not shrink monotonically.
    layouts: their banded variants too (causal / windowed / grouped-query): "all" at D = 64
    and 256 (Gemma-3's head dimension), "core" at D = 64 in bf16 and fp32 and the fp32 word
    maps at D = 256 (their scores in slices of D, word_map_config), "none"."""
    specs = []
    for t in dtypes:
        specs += [AotSpec("_column_mass_kernel", 128, 64, t), AotSpec("_row_lse_kernel", 128, 64, t),
                  AotSpec("_js_pair_kernel", 128, 64, t)]
        specs += [AotSpec("_word_map_kernel", 128, D, t, W=128) for D in (32, 64)]
        dims = {"all": LAYOUT_MAP_HEAD_DIMS, "core": (64,) if t != "fp16" else (), "none": ()}[layouts]
        specs += [AotSpec(k, 128, D, t, W=128 if k == "_word_map_kernel" else 0, banded=True) for D in dims
                  for k in ("_column_mass_kernel", "_row_lse_kernel", "_js_pair_kernel", "_word_map_kernel")]
        if layouts == "core" and t == "fp32":
            specs.append(AotSpec("_word_map_kernel", 128, 256, t, W=128, banded=True))
    return specs


def forward_specialisations(classes=CLASS_COUNTS, dtypes=DTYPES, which: str = "all") -> list[Specialisation]:
    """The fused forward's specialisations.

    "all": for the plain layout and the banded one (G = 1 and 4): every dtype x head
    dimension with the default statistics (entropy, class masses), with and without the argmax,
    for 4 key classes; 16 and 32 classes, the statistics-free forward and the position-dependent
    statistics at D = 64 (and 256 banded), the token relations at D = 64. "core": the largest of each tile
    configuration, what the test suite compiles (each takes ~10 s on one core)."""
    default, argmax = DEFAULT_STATS, (*DEFAULT_STATS, *WIDE_STATS)
    positions = (*argmax, *position_stats())
    tokens = (*argmax, *TOKEN_STATS)
    if which == "none":
        return []
    if which == "core":
        specs = [Specialisation(64, "bf16", argmax, 32), Specialisation(128, "fp16", default, 4),
                 Specialisation(64, "fp32", argmax, 32),
                 Specialisation(64, "bf16", positions, 4),
                 LayoutSpec(64, "bf16", argmax, 4), LayoutSpec(128, "bf16", default, 4, 3),
                 LayoutSpec(128, "fp16", default, 4, 1),
                 LayoutSpec(256, "bf16", argmax, 32), LayoutSpec(64, "fp16", argmax, 32, 1),
                 LayoutSpec(64, "fp32", argmax, 32), LayoutSpec(256, "fp32", argmax, 32),
                 LayoutSpec(64, "bf16", positions, 4),
                 LayoutSpec(256, "fp32", positions, 4),
                 Specialisation(64, "bf16", tokens, 32), Specialisation(64, "fp32", tokens, 4),
                 LayoutSpec(64, "bf16", tokens, 4), LayoutSpec(256, "fp32", tokens, 4)]
        return [s for s in specs if s.dtype in dtypes and s.n_classes in classes] or specs[:1]
    specs = []
    for t in dtypes:
        for banded, dims in ((False, HEAD_DIMS), (True, LAYOUT_HEAD_DIMS)):
            group = 4 if banded else 1  # the budget's decoder G; the default statistics also at G = 1
            specs += [Specialisation(D, t, stats, 4, banded, g) for D in dims for g in sorted({1, group})
                      for stats in (default, argmax)]
            big = (64, 256) if banded else (64,)
            specs += [Specialisation(D, t, argmax, C, banded, group) for D in big for C in classes
                      if C != 4]
            specs += [Specialisation(D, t, (), 4, banded, group) for D in big]
            specs += [Specialisation(D, t, positions, 4, banded, group) for D in big]
            # the token relations at D = 64 only: larger heads still spill (triton_config's docstring)
            specs += [Specialisation(64, t, tokens, 4, banded, group)]
    return [s for s in specs if s.n_classes in classes]


def shipped_specialisations(classes=CLASS_COUNTS, dtypes=DTYPES, maps=True, layouts: str = "all") -> list:
    """Every specialisation a GPU run of bertscope launches: the fused forward's
    (`forward_specialisations`), then column mass, word maps and JS (kernels/triton_maps.py,
    triton_js.py: their own `AotSpec`). maps=False leaves the whole-map kernels out."""
    return forward_specialisations(classes, dtypes, layouts) + (aot_specialisations(dtypes, layouts) if maps else [])


def _forward_source(spec: Specialisation, c: dict, constexprs: dict):
    """`attn_stats_fwd`'s ASTSource for a specialisation: unit strides of the innermost
    dimensions (q/k/v/out, the (B, L) masks, the key features) are constants, as Triton's launcher
    specialises them; the pointers and the other strides get the 16-divisibility hint the launcher
    derives for 16-aligned allocations and D % 16 == 0; the statistics' switches and outputs from
    the table (`_forward_signature`); every other integer argument is an i32. Named values are packed
    into the kernel's tuple arguments as a launch packs them (`triton_launch.kernel_arguments`): a
    constant or a hint on a tuple's element is keyed by its path (`triton_launch.argument_paths`), a
    constexpr tuple (TILE, STATS) is one constant."""
    from . import triton_kernel, triton_launch

    fn = _compilable(triton_kernel.attn_stats_fwd)
    sig, flags = _forward_signature(spec, spec.dtype)
    constexprs = {**{name: 1 for name in UNIT_STRIDES}, **constexprs, "BLOCK_M": c["BLOCK_M"],
                  "BLOCK_N": c["BLOCK_N"], "BLOCK_D": c["BLOCK_D"], **flags}
    paths = triton_launch.argument_paths()
    types = {name: "constexpr" if name in constexprs else sig.get(name, "i32") for name in paths}
    aligned = [n for n in paths if types[n].startswith("*")] + list(ALIGNED_STRIDES)
    attrs = {paths[n]: [["tt.divisibility", 16]] for n in aligned}
    # constexpr arguments: one constant each (a tuple for TILE and STATS); a runtime tuple's constant element
    # (a unit stride, G = 1): a constant at its path, "constexpr" in the tuple's signature
    values = triton_launch.kernel_arguments({name: constexprs.get(name) for name in paths})
    constants = {(i,): values[p.name] for i, p in enumerate(fn.params) if p.is_constexpr}
    constants.update({paths[n]: constexprs[n] for n in paths if n in constexprs
                      and not fn.params[paths[n][0]].is_constexpr})
    sig = {p.name: "constexpr" if p.is_constexpr else t for p, t in zip(fn.params,
                                                                           triton_launch.kernel_arguments(types).values())}
    from triton.compiler import ASTSource  # see the note above ARCHS

    return ASTSource(fn=fn, signature=sig, constexprs=constants, attrs=attrs)


# unit strides (the innermost dimension of q/k/v/out, the (B, L) masks, the key features): constants, as
# Triton's launcher specialises them
UNIT_STRIDES = ("stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_ml")
# the strides (and D) a 16-aligned allocation with D % 16 == 0 makes divisible by 16, as the pointers
ALIGNED_STRIDES = ("stride_qb", "stride_qh", "stride_ql", "stride_kb", "stride_kh", "stride_kl",
                   "stride_vb", "stride_vh", "stride_vl", "stride_ob", "stride_oh", "stride_ol", "stride_fb",
                   "stride_fl")


def _compilable(fn):
    """The kernel `fn`, or a RuntimeError when its module was imported under the interpreter."""
    if not isinstance(fn, __import__("triton").runtime.jit.JITFunction):
        raise RuntimeError("bertscope.kernels.triton_kernel was imported under TRITON_INTERPRET=1; "
                           "compile in a process without it (python -m bertscope.kernels.triton_aot)")
    return fn


def _forward_signature(spec, t: str) -> tuple[dict, dict]:
    """(signature of the inputs and the statistics' outputs, the statistics' constexpr switches) of
    the fused kernel in dtype `t`, from the kernel's table (`triton_launch.kernel_outputs`) as the
    launcher passes them: statistics in fp32 (int64 for an index); a switched-off statistic gets the
    fp32 lse as a placeholder. Only what `spec` switches on (`switched_on`) is compiled on: a new
    statistic's switch is off unless a specialisation names it."""
    from . import triton_launch

    sig = {"Q": f"*{t}", "K": f"*{t}", "V": f"*{t}", "KeyValid": "*i8", "KeyRange": "*i32", "KeyFeatures": f"*{t}",
           "KeyNorms": f"*{t}", "GateXi": "*fp32", "Offsets": "*i32",
           "Out": f"*{t}",
           "Lse": "*fp32", "TokenIds": "*i32", "sm_scale": "fp32"}
    flags = {}
    for stat, arg, flag in triton_launch.kernel_outputs():
        on = stat.name in spec.switched_on()
        if flag is not None:
            flags[flag] = on
        sig[arg] = "*i64" if on and stat.dtype == "int64" else "*fp32"
    return sig, flags


def ptxas_path() -> Path:
    import triton  # see the note above ARCHS

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers and spills of the PTX's kernel on sm_<arch>, from `ptxas -v`."""
    gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        # the options Triton itself passes to ptxas (backends/nvidia/compiler.py: make_cubin)
        cmd = [str(ptxas_path()), "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={gpu}", str(src),
               "-o", str(Path(tmp) / "k.cubin")]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed for sm_{arch}: {done.stderr[-2000:]}")
    regs, spill = _REGS.search(done.stderr), _SPILL.search(done.stderr)
    if regs is None or spill is None:
        raise RuntimeError(f"unexpected ptxas -v output: {done.stderr[-2000:]}")
    return {"registers": int(regs.group(1)), "spill_stores": int(spill.group(1)), "spill_loads": int(spill.group(2))}


def compile_one(spec, arch: int, dump: Path | None = None) -> dict:
    """Compile one specialisation for sm_<arch>; its resources and its main loop's budget as a row
    (`triton_sass.loop_metrics`: warp-instructions per 1,000 scores, MUFU per score, barriers, MMAs).
    dump: a folder to write its cubin, its SASS and a JSON of its tiles, layout and statistics to."""
    import triton  # see the note above ARCHS
    from triton.backends.compiler import GPUTarget

    from . import triton_sass
    from .triton_tiles import launch_caps

    src, c = spec.ast_source(arch)
    t0 = time.perf_counter()
    options = {"num_warps": c["num_warps"], "num_stages": c["num_stages"], **launch_caps(c)}  # as the launch
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    seconds = time.perf_counter() - t0
    usage = ptxas_usage(compiled.asm["ptx"], arch)
    row = {
        "kernel": compiled.metadata.name, "spec": spec.name(arch), "D": spec.D, "arch": f"sm_{arch}",
        **usage, "shared": compiled.metadata.shared, "cubin_bytes": len(compiled.asm["cubin"]),
        "compile_s": round(seconds, 2), **{k: c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_D", "num_warps") if k in c},
    }
    sass = None
    if isinstance(spec, (Specialisation, BaselineSpec)):  # the attention loops: their budget
        sass = triton_sass.disassemble(compiled.asm["cubin"])
        try:
            instructions = triton_sass.parse(sass)
            loop = triton_sass.main_loop(instructions, spec.main_stage(arch))
            row.update(triton_sass.loop_metrics(loop, c))
            # the other stage (the fused forward's masked blocks, the baseline's causal diagonal) and the loops
            # nested in the main one (a statistic's bucket loop: counted once in its body, run per bucket)
            masked = triton_sass.other_stage(instructions, spec.main_stage(arch))
            row["masked_loop_instructions"] = None if masked is None else len(masked.body)
            row["nested_loops"] = [len(lp.body) for lp in triton_sass.nested_loops(loop, instructions)]
        except ValueError:  # exact fp32 dots are FMA loops, no tensor-core MMA: no budget row
            pass
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^A-Za-z0-9_.=+-]+", "_", f"{row['spec']}_D{spec.D}_sm{arch}")
        (dump / f"{stem}.cubin").write_bytes(compiled.asm["cubin"])
        if sass is not None:
            (dump / f"{stem}.sass").write_text(sass)
        meta = {"config": c, "layout": getattr(spec, "layout_name", lambda: "map kernel")(),
                "statistics": sorted(spec.switched_on()) if hasattr(spec, "switched_on") else [], **row}
        (dump / f"{stem}.json").write_text(json.dumps(meta, indent=1))
    return row


def compile_all(archs=ARCHS, specs=None, dump: Path | None = None) -> list[dict]:
    specs = shipped_specialisations() if specs is None else specs
    return [compile_one(s, a, dump) for a in archs for s in specs]


# -- the baseline and the budget


@dataclass(frozen=True)
class BaselineSpec:
    """The plain flash-attention forward of bench/flash_baseline.py (no statistics), compiled as the
    fused forward is: the budget's yardstick."""

    D: int
    dtype: str
    causal: bool
    tiles: tuple[int, int, int, int]  # BLOCK_M, BLOCK_N, num_warps, num_stages

    def config(self, arch: int = 90) -> dict:
        m, n, w, st = self.tiles
        return dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)

    def name(self, arch: int = 90) -> str:
        m, n, w, st = self.tiles
        return f"flash{' causal' if self.causal else ''} M{m} N{n} D{self.D} w{w}s{st} {self.dtype}"

    def layout_name(self) -> str:
        return "causal" if self.causal else "plain"

    def main_stage(self, arch: int = 90) -> str:
        """The tutorial's order: the unmasked key blocks first, the causal diagonal after."""
        return "first"

    def ast_source(self, arch: int = 90):
        m, n, _, _ = self.tiles
        return _baseline_module().ast_source(self.D, self.dtype, self.causal, m, n), self.config(arch)


def _baseline_module():
    """bench/flash_baseline.py of the checkout (the baseline is a benchmark, not part of the package)."""
    import importlib.util

    path = Path(os.environ.get("BERTSCOPE_FLASH_BASELINE", "bench/flash_baseline.py"))
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run from a checkout of bertscope, or set BERTSCOPE_FLASH_BASELINE")
    spec = importlib.util.spec_from_file_location("flash_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def baseline_specialisations(dims=(64, 128), dtypes=("fp16", "bf16"), warps: int | None = None) -> list[BaselineSpec]:
    """The baseline at each of its tutorial tiles (those with `warps` warps only, when given), plain and
    causal, per head dimension and dtype."""
    return [BaselineSpec(D, t, causal, tiles) for t in dtypes for D in dims for causal in (False, True)
            for tiles in _baseline_module().TILES if warps is None or tiles[2] == warps]


# The baseline tiles `--budget` compiles: the 8-warp ones. At every (target, D, causal-ness) of the budget the
# baseline's best spill-free tile has 8 warps (the 4-warp ones spill or issue more: `--baseline` compiles all of
# them, docs/kernels.md), so the yardstick is the same at less than half the compiles.
BUDGET_BASELINE_WARPS = 8


# What the fused forward's main loop may cost, for the default statistics (entropy, offsets, class
# masses), against the best (fewest instructions per score, no spill) of the baseline's tiles for the
# same head dimension, dtype, target and causal-ness: the targets. `budget_rows` says, per
# specialisation, whether each holds.
BUDGET_RATIO = 1.3  # main loop warp-instructions per 1,000 scores, at most this times the baseline's best
BUDGET_MUFU = 1.1  # MUFU instructions per score (the exp2 of the softmax, one per score)
BUDGET_WGMMA_N = 64  # on sm_90, the QK^T and P V wgmma's N at least this

# The specialisations that do not meet the targets yet, by (target, D, layout): the ratio and MUFU per
# score they were measured at (Triton 3.7.1), which the budget test holds them to until they meet the
# targets, and whether their sm_90 wgmmas are narrower than BUDGET_WGMMA_N. A ratchet: a change that
# makes one of them worse fails, and so does one that brings it within the targets while it is still
# listed (then delete its line). None now: every row meets every target with the tiles and switches of
# `triton_config.TILES`' "default" entries (docs/kernels.md); a new row that does not yet starts here.
BUDGET_CEILINGS: dict[tuple[str, int, str], dict] = {}


def budget_specialisations(dims=(64, 128), dtypes=("fp16", "bf16")) -> list[Specialisation]:
    """The fused forward's specialisations the budget is declared for: the default statistics, plain
    (encoders) and causal grouped-query (decoders), each head dimension and dtype."""
    return [Specialisation(D, t, DEFAULT_STATS, 4, banded, 4 if banded else 1) for t in dtypes for D in dims
            for banded in (False, True)]


def _wide_dots(r: dict) -> bool:
    """On sm_90: the QK^T wgmma (N = BLOCK_N) and the P V one (N = BLOCK_D) are both at least
    BUDGET_WGMMA_N wide and present in the main loop (the key-feature dot P U, N = F_PAD, is the
    statistics' own and may be narrower). Other targets have no wgmma: True."""
    if r["arch"] != "sm_90":
        return True
    widths = {m["N"] for m in r["mma"] if m["op"] == "HGMMA"}
    return min(r["BLOCK_N"], r["BLOCK_D"]) >= BUDGET_WGMMA_N and {r["BLOCK_N"], r["BLOCK_D"]} <= widths


def budget_rows(rows: list[dict], baseline: list[dict]) -> list[dict]:
    """Each fused-forward row of `rows` against the baseline's best for its D, dtype, target and
    causal-ness (a banded specialisation against the causal baseline): the ratio, each check, and
    the ceiling (`BUDGET_CEILINGS`) that holds where a target is not met yet."""
    out = []
    for r in rows:
        if not r["spec"].startswith(("plain", "band")):
            continue
        causal = r["spec"].startswith("band")
        dtype = r["spec"].split()[6 if causal else 5]
        same = [b for b in baseline if b["arch"] == r["arch"] and b["D"] == r["D"] and f" {dtype}" in b["spec"]
                and (" causal " in b["spec"]) == causal and not (b["spill_stores"] or b["spill_loads"])]
        best = min(b["insn_per_1k_scores"] for b in same)
        layout = "causal GQA" if causal else "plain"
        out.append({**r, "layout": layout, "baseline_best": best, "ratio": round(r["insn_per_1k_scores"] / best, 3),
                    "within_ratio": r["insn_per_1k_scores"] <= BUDGET_RATIO * best,
                    "within_mufu": r["mufu_per_score"] <= BUDGET_MUFU,
                    "wgmma_n_ok": _wide_dots(r),
                    "no_spill": not (r["spill_stores"] or r["spill_loads"]),
                    "ceiling": BUDGET_CEILINGS.get((r["arch"], r["D"], layout))})
    return out


def over_budget(row: dict) -> list[str]:
    """What is wrong with one `budget_rows` row, in words (empty: it is within its budget): over a
    target and not listed in `BUDGET_CEILINGS`, over its listed ceiling, or listed while it meets
    every target (the ceiling must go), or spilling."""
    problems, ceiling = [], row["ceiling"]
    meets = row["within_ratio"] and row["within_mufu"] and row["wgmma_n_ok"]
    if not row["no_spill"]:
        problems.append(f"spills {row['spill_stores']}/{row['spill_loads']} B")
    if ceiling is None:
        if not row["within_ratio"]:
            problems.append(f"main loop {row['ratio']}x the baseline (target {BUDGET_RATIO}x)")
        if not row["within_mufu"]:
            problems.append(f"{row['mufu_per_score']} MUFU per score (target {BUDGET_MUFU})")
        if not row["wgmma_n_ok"]:
            problems.append(f"a QK^T or P V wgmma narrower than {BUDGET_WGMMA_N}")
        return problems
    if meets:
        problems.append("meets every target: delete its BUDGET_CEILINGS line")
    if row["ratio"] > ceiling["ratio"]:
        problems.append(f"main loop {row['ratio']}x the baseline, over its ceiling {ceiling['ratio']}x")
    if row["mufu_per_score"] > ceiling["mufu"]:
        problems.append(f"{row['mufu_per_score']} MUFU per score, over its ceiling {ceiling['mufu']}")
    if not row["wgmma_n_ok"] and not ceiling.get("narrow_wgmma"):
        problems.append(f"a QK^T or P V wgmma narrower than {BUDGET_WGMMA_N}")
    return problems


# -- every command's specialisation (issue 48): what each command of the registry launches, at the
# shapes of the models it runs on, against the flash baseline at the same head size


@dataclass(frozen=True)
class ModelShape:
    """A model's attention, as the fused forward specialises for it: head size D, G query heads per
    key/value head, and its layout ("plain": an encoder's; "causal"; "windowed and global": sliding-window
    and global layers, one banded kernel for both, the band a runtime pair)."""

    name: str
    D: int
    group: int
    layout: str

    @property
    def banded(self) -> bool:
        return self.layout != "plain"


MODEL_SHAPES = (
    ModelShape("Llama-3.2-1B", 64, 4, "causal"),
    ModelShape("Llama-3-8B", 128, 4, "causal"),
    ModelShape("Llama-2-7B", 128, 1, "causal"),
    ModelShape("Gemma-3", 256, 4, "windowed and global"),
    ModelShape("bert-base", 64, 1, "plain"),
)
# the causal length at which the masked stage (the diagonal's blocks) is counted beside the main loop
CAUSAL_L = 4096
# the targets: the default statistics' set, and every other command's
COMMAND_RATIO = {"default": 1.3, "other": 1.5}  # main loop, times the baseline's best at the same D
COMMAND_RATIO_MASKED = {"default": 1.4, "other": 1.6}  # with the masked stage, causal CAUSAL_L
# The command rows that do not meet their targets yet, by (target, shape, statistic set): the figures they
# were measured at (Triton 3.7.1, bf16: the test's dtype), which tests/kernels/test_triton_commands.py holds
# them to: a ratchet like BUDGET_CEILINGS (a row that issues more fails; a row that meets its targets while
# listed fails too: delete its line). "ratio": main loop; "masked": with the masked stage at causal CAUSAL_L;
# "mufu": MUFU per score; "spills": bytes stored; "narrow_wgmma": a QK^T or P V wgmma narrower than
# BUDGET_WGMMA_N. `--commands --ceilings` prints the dict today's rows would set.
_UNION = "entropy+class_mass+distance_mass+mean_distance+position_mass+duplicate_mass+prefix_match_mass"
_POSITIONS = "class_mass+distance_mass+mean_distance+position_mass"
# --norms (the norm-based twins, docs/norms.md): run's, sinks' and the atlas union's statistic sets
_RUN_NORMS = "entropy+class_mass+offset_mass_norm+class_mass_norm+weighted_norm"
_SINKS_NORMS = "entropy+class_mass+class_mass_norm+weighted_norm"
_UNION_NORMS = _UNION + "+class_mass_norm+weighted_norm"
# 2026-12-08: the position sums from the nearest bucket out took 2-7% off the position and union rows at
# D <= 128 and put 0.7-2.2% on the atlas union at D = 256 (16 x 16 tiles, spilling either way; sm_90 80 -> 84 B):
# those two rows' ceilings were raised with it, every other figure is the same or lower. Later that day the
# uniform gates' rows went (their calls launch the default statistics' kernel), and the distance buckets from the
# exponent and the position bins' bounds from reciprocals took 7-16% off every position and union row (MUFU per
# score 1.125-1.25 -> 1.062-1.125 at D <= 128); sm_90's atlas union at D = 256 spills 96 B where it spilled 84
# (its instructions 5% fewer): that ceiling was raised with it. Then the mean distance by dot (MEAN_BY_DOT, banded,
# D <= 128) took 3.2-7.4% off those rows' main loops.
COMMAND_CEILINGS: dict[tuple[str, str, str], dict] = {
    ('sm_80', 'Gemma-3', 'argmax'): {'ratio': 1.375, 'masked': 1.397, 'mufu': 1.5},
    ('sm_80', 'Gemma-3', 'class_mass'): {'ratio': 0.955, 'masked': 0.956, 'mufu': 1.125},
    ('sm_80', 'Gemma-3', _POSITIONS): {'ratio': 3.233, 'masked': 3.228, 'mufu': 2.25, 'spills': 240},
    ('sm_80', 'Gemma-3', 'entropy+class_mass'): {'ratio': 0.98, 'masked': 0.981, 'mufu': 1.125},
    ('sm_80', 'Gemma-3', 'entropy+class_mass+argmax'): {'ratio': 1.08, 'masked': 1.081, 'mufu': 1.125},
    ('sm_80', 'Gemma-3', _UNION): {'ratio': 10.225, 'masked': 10.221, 'mufu': 5.0, 'spills': 60},
    ('sm_80', 'Gemma-3', 'none'): {'ratio': 1.116, 'masked': 1.138, 'mufu': 1.5},
    ('sm_80', 'Llama-2-7B', 'class_mass'): {'ratio': 1.341, 'masked': 1.382, 'mufu': 1.125},
    ('sm_80', 'Llama-2-7B', _POSITIONS): {'ratio': 2.503, 'masked': 2.541, 'mufu': 1.125},
    ('sm_80', 'Llama-2-7B', _UNION): {'ratio': 3.138, 'masked': 3.191, 'mufu': 1.125},
    ('sm_80', 'Llama-3-8B', 'class_mass'): {'ratio': 1.341, 'masked': 1.303, 'mufu': 1.125},
    ('sm_80', 'Llama-3-8B', _POSITIONS): {'ratio': 2.519, 'masked': 2.438, 'mufu': 1.125, 'spills': 4},
    ('sm_80', 'Llama-3-8B', _UNION): {'ratio': 3.141, 'masked': 3.042, 'mufu': 1.125},
    ('sm_80', 'Llama-3.2-1B', _POSITIONS): {'ratio': 2.888, 'masked': 2.907, 'mufu': 1.062},
    ('sm_80', 'Llama-3.2-1B', 'entropy+class_mass+argmax'): {'ratio': 1.654, 'masked': 1.676, 'mufu': 1.062},
    ('sm_80', 'Llama-3.2-1B', _UNION): {'ratio': 4.552, 'masked': 4.493, 'mufu': 1.125},
    ('sm_80', 'bert-base', _POSITIONS): {'ratio': 3.69, 'mufu': 1.062},
    ('sm_80', 'bert-base', 'entropy+class_mass+argmax'): {'ratio': 1.66, 'mufu': 1.062},
    ('sm_80', 'bert-base', _UNION): {'ratio': 5.901, 'mufu': 1.125},
    ('sm_90', 'Gemma-3', 'argmax'): {'ratio': 2.074, 'masked': 1.983, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', 'class_mass'): {'ratio': 2.009, 'masked': 1.926, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', _POSITIONS):
        {'ratio': 8.627, 'masked': 8.249, 'mufu': 2.25, 'spills': 192, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', 'entropy+class_mass'): {'ratio': 2.406, 'masked': 2.371, 'mufu': 2.125, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', 'entropy+class_mass+argmax'):
        {'ratio': 2.848, 'masked': 2.795, 'mufu': 2.125, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', _UNION): {'ratio': 28.389, 'masked': 26.908, 'mufu': 5.0, 'spills': 96, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', 'none'): {'ratio': 1.811, 'masked': 1.734, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-2-7B', _POSITIONS): {'ratio': 4.444, 'masked': 4.449, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-2-7B', 'entropy+class_mass'): {'ratio': 1.495, 'masked': 1.616, 'mufu': 1.062},
    ('sm_90', 'Llama-2-7B', 'entropy+class_mass+argmax'): {'ratio': 1.616, 'masked': 1.722, 'mufu': 1.031},
    ('sm_90', 'Llama-2-7B', _UNION): {'ratio': 5.81, 'masked': 5.827, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-3-8B', _POSITIONS): {'ratio': 4.428, 'masked': 4.363, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-3-8B', 'entropy+class_mass'): {'ratio': 1.254, 'masked': 1.42, 'mufu': 1.031},
    ('sm_90', 'Llama-3-8B', 'entropy+class_mass+argmax'): {'ratio': 1.616, 'masked': 1.723, 'mufu': 1.031},
    ('sm_90', 'Llama-3-8B', _UNION): {'ratio': 5.794, 'masked': 5.716, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-3.2-1B', _POSITIONS): {'ratio': 3.723, 'masked': 3.744, 'mufu': 1.062},
    ('sm_90', 'Llama-3.2-1B', 'entropy+class_mass+argmax'): {'ratio': 1.862, 'masked': 1.894, 'mufu': 1.062},
    ('sm_90', 'Llama-3.2-1B', _UNION): {'ratio': 6.079, 'masked': 5.994, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'bert-base', _POSITIONS): {'ratio': 4.776, 'mufu': 1.062},
    ('sm_90', 'bert-base', 'entropy+class_mass+argmax'): {'ratio': 1.58, 'mufu': 1.031},
    ('sm_90', 'bert-base', _UNION): {'ratio': 7.99, 'mufu': 1.062},
    # --norms, the norm-based twins (2026-12-08, `--commands --dtype bf16` with the twins' tiles of
    # bench/tile_sweep.py --commands: triton_config's "default+norms", "default+class_norms"; the atlas's union
    # with the twins on the tokens' tiles): the 15 of their 30 rows that miss a target
    ('sm_80', 'Gemma-3', _SINKS_NORMS): {'ratio': 2.057, 'masked': 2.061, 'mufu': 1.5},
    ('sm_80', 'Gemma-3', _UNION_NORMS): {'ratio': 8.054, 'masked': 7.972, 'mufu': 3.0},
    ('sm_80', 'Gemma-3', _RUN_NORMS): {'ratio': 2.057, 'masked': 2.061, 'mufu': 1.5},
    ('sm_80', 'Llama-2-7B', _UNION_NORMS): {'ratio': 3.265, 'masked': 3.318, 'mufu': 1.125},
    ('sm_80', 'Llama-3-8B', _UNION_NORMS): {'ratio': 3.349, 'masked': 3.243, 'mufu': 1.125, 'spills': 8},
    ('sm_80', 'Llama-3.2-1B', _UNION_NORMS): {'ratio': 4.796, 'masked': 4.731, 'mufu': 1.125},
    ('sm_80', 'bert-base', _UNION_NORMS): {'ratio': 6.04, 'mufu': 1.125},
    ('sm_90', 'Gemma-3', _SINKS_NORMS): {'ratio': 2.636, 'masked': 2.596, 'mufu': 2.125, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', _UNION_NORMS): {'ratio': 22.748, 'masked': 21.549, 'mufu': 3.0, 'narrow_wgmma': True},
    ('sm_90', 'Gemma-3', _RUN_NORMS): {'ratio': 2.636, 'masked': 2.583, 'mufu': 2.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-2-7B', _SINKS_NORMS): {'ratio': 1.592, 'masked': 1.701, 'mufu': 1.062},
    ('sm_90', 'Llama-2-7B', _UNION_NORMS): {'ratio': 6.06, 'masked': 6.072, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-3-8B', _UNION_NORMS): {'ratio': 6.165, 'masked': 6.078, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'Llama-3.2-1B', _UNION_NORMS): {'ratio': 6.439, 'masked': 6.349, 'mufu': 1.125, 'narrow_wgmma': True},
    ('sm_90', 'bert-base', _UNION_NORMS): {'ratio': 8.081, 'mufu': 1.062, 'spills': 4},
}


@dataclass(frozen=True)
class CommandSpec:
    """One compiled specialisation of `--commands`: the fused forward's `Specialisation` at a model's
    shape, and which commands launch it ("command: what", their `kernel_specs`)."""

    spec: Specialisation
    shape: ModelShape
    uses: tuple[str, ...]

    @property
    def statistics(self) -> str:
        """The statistic set's name: its kernel switches joined by "+" ("none")."""
        return "+".join(self.spec.stats) or "none"

    @property
    def kind(self) -> str:
        """"default" for the default statistics (entropy and class masses, offsets at run time), else "other"."""
        return "default" if set(self.spec.stats) == set(DEFAULT_STATS) else "other"


def kernel_switches(spec) -> tuple[str, ...]:
    """The fused kernel's switches a `StatsSpec` turns on, in the table's order (`triton_launch.kernel_switches`,
    as the launcher reads them)."""
    from .spec import ROW_STATS
    from .triton_launch import kernel_switches as switched  # see the note above ARCHS

    on = switched(spec)
    return tuple(stat.name for stat in ROW_STATS if stat.name in on)


def command_specialisations(dtypes=("fp16", "bf16"), shapes=MODEL_SHAPES) -> list[CommandSpec]:
    """Every distinct fused-forward specialisation the commands of the registry launch
    (`analyses.registry.COMMANDS`, each module's `kernel_specs`: the StatsSpecs its `main` hands the engine),
    for each model shape (a decoder's specs for the banded shapes, an encoder's for the plain one) and
    dtype. A call under uniform head gates (`bertscope.api`'s `Model.gates.uniform`: any analysis may run under
    them) launches the same kernel as without (`triton_launch.uniform_rows` writes those heads' rows after it),
    so it is a use of the default statistics' row. Specs that compile to the same kernel (the same switches, feature
    width and free ones column) are one row, with every command that launches it."""
    from bertscope.analyses.registry import COMMANDS, KernelModel, kernel_specs

    from .triton_config import feature_width  # see the note above ARCHS

    found: dict[tuple, tuple[Specialisation, list[str]]] = {}
    for shape in shapes:
        model = KernelModel(causal=shape.banded)
        launches = [(f"{command}: {what}", stats) for command in COMMANDS
                    for what, stats in kernel_specs(command, model).items()]
        launches += [(f"api: {use.split(': ', 1)[1]} under uniform gates", stats)
                     for use, stats in launches if use == "run: default"]
        for use, stats in launches:
            C = stats.n_key_classes
            for t in dtypes:
                key = (shape, t, kernel_switches(stats), feature_width(C), feature_width(C, ones=True))
                spec = Specialisation(shape.D, t, kernel_switches(stats), C, shape.banded,
                                      shape.group if shape.banded else 1)
                found.setdefault(key, (spec, []))[1].append(use)
    return [CommandSpec(spec, key[0], tuple(uses)) for key, (spec, uses) in found.items()]


def causal_iterations(c: dict, G: int, L: int = CAUSAL_L, baseline: bool = False) -> tuple[int, int, int]:
    """(main-loop iterations, masked-stage iterations, scores a row sees) of one key/value head's programs
    over a causal sequence of L tokens: the fused forward's stages (`triton_kernel.attn_stats_fwd`: G heads'
    rows stacked, the unmasked blocks [0, full_hi), the masked ones up to the row end) or the flash
    baseline's (`baseline`: G = 1, the diagonal's BLOCK_M / BLOCK_N blocks masked). Scores: the G heads'
    L (L + 1) / 2 visible ones."""
    m, n = c["BLOCK_M"], c["BLOCK_N"]
    main = masked = 0
    for start_m in range(-(-L * G // m)):
        if baseline:
            main += start_m * m // n
            masked += m // n
            continue
        first, last = start_m * m // G, min((start_m * m + m - 1) // G, L - 1)
        end = -(-(last + 1) // n) * n
        full_hi = (min(first + 1, L) // n) * n
        main += full_hi // n
        masked += (end - full_hi) // n
    return main, masked, G * L * (L + 1) // 2


def causal_insn_per_1k(r: dict, G: int, baseline: bool = False) -> float | None:
    """Warp-instructions per 1,000 visible scores of a causal CAUSAL_L sequence, both stages counted (a row of
    `compile_one` with its loops' sizes); None without a masked-stage loop (a fused row), the main loop's count
    for the baseline's diagonal when it is one block (BLOCK_M = BLOCK_N: straight code, no loop)."""
    masked_loop = r.get("masked_loop_instructions")
    if masked_loop is None and baseline:  # BLOCK_M = BLOCK_N: the diagonal is one block, no loop; counted as the
        masked_loop = r["loop_instructions"]  # main loop's (it masks more: the baseline's figure is a floor)
    if masked_loop is None:
        return None
    main, masked, scores = causal_iterations(r, G, baseline=baseline)
    warps = r["num_warps"]
    return round((main * r["loop_instructions"] + masked * masked_loop) * warps / scores * 1000, 1)


# the baseline's tiles above D = 128 besides the tutorial's: on sm_80 every tutorial tile spills at D = 256
# (280-39,024 B), these narrower ones give it a spill-free yardstick
BASELINE_WIDE_HEAD_TILES = ((64, 64, 8, 2), (64, 32, 8, 2), (64, 32, 4, 2))


def command_baseline(shapes=MODEL_SHAPES, dtypes=("fp16", "bf16")) -> list[BaselineSpec]:
    """The flash baseline at each shape's head size: causal for a banded shape, plain for the plain one,
    at its 8-warp tutorial tiles (`BUDGET_BASELINE_WARPS`); above D = 128 at every tutorial tile and
    `BASELINE_WIDE_HEAD_TILES`."""
    keys = sorted({(s.D, s.banded) for s in shapes})
    tiles = _baseline_module().TILES
    return [BaselineSpec(D, t, causal, tile) for t in dtypes for D, causal in keys
            for tile in (tiles + BASELINE_WIDE_HEAD_TILES if D > 128 else tiles)
            if D > 128 or tile[2] == BUDGET_BASELINE_WARPS]


def command_rows(pairs: list[tuple[CommandSpec, dict]], baseline: list[dict]) -> list[dict]:
    """Each `--commands` row (a `CommandSpec` and its `compile_one` row), named by its shape and statistics
    and compared with the baseline (`compare_with_baseline`)."""
    return [compare_with_baseline({**r, "shape": cs.shape.name, "layout": cs.shape.layout, "G": cs.shape.group,
                                   "dtype": cs.spec.dtype, "statistics": cs.statistics, "kind": cs.kind,
                                   "uses": list(cs.uses)}, baseline) for cs, r in pairs]


def compare_with_baseline(r: dict, baseline: list[dict]) -> dict:
    """A `command_rows` row against the baseline's best spill-free tile at its D, dtype, target and
    causal-ness: the main-loop ratio, the ratio with the masked stage at causal CAUSAL_L (banded shapes),
    MUFU per score, the wgmmas' N, spills, and the targets (`COMMAND_RATIO`, `COMMAND_RATIO_MASKED`) and
    ceiling (`COMMAND_CEILINGS`) it is held to."""
    banded = r["layout"] != "plain"
    same = [b for b in baseline if b["arch"] == r["arch"] and b["D"] == r["D"] and f" {r['dtype']}" in b["spec"]
            and (" causal " in b["spec"]) == banded and not (b["spill_stores"] or b["spill_loads"])
            and "insn_per_1k_scores" in b]
    best = min((b["insn_per_1k_scores"] for b in same), default=None)
    best_causal = min((x for x in (causal_insn_per_1k(b, 1, baseline=True) for b in same) if x is not None),
                      default=None)
    causal = causal_insn_per_1k(r, r["G"]) if banded and "insn_per_1k_scores" in r else None
    ratio = round(r["insn_per_1k_scores"] / best, 3) if best and "insn_per_1k_scores" in r else None
    masked = round(causal / best_causal, 3) if causal and best_causal else None
    return {**r, "baseline_best": best, "ratio": ratio, "causal_insn_per_1k": causal,
            "baseline_causal_best": best_causal, "ratio_masked": masked,
            "wgmma_n": sorted({m["N"] for m in r.get("mma", []) if m["op"] == "HGMMA"}),
            "wgmma_n_ok": _wide_dots(r) if "mma" in r else False,
            "no_spill": not (r["spill_stores"] or r["spill_loads"]),
            "target_ratio": COMMAND_RATIO[r["kind"]], "target_masked": COMMAND_RATIO_MASKED[r["kind"]],
            "ceiling": COMMAND_CEILINGS.get((r["arch"], r["shape"], r["statistics"]))}


def command_problems(row: dict) -> list[str]:
    """What is wrong with one `command_rows` row (empty: within its targets, or within its listed ceiling
    while it misses one): as `over_budget`, with the masked-stage ratio and spills in the ratchet too."""
    c = row["ceiling"]
    checks = {
        "ratio": (row["ratio"] is not None and row["ratio"] <= row["target_ratio"],
                  f"main loop {row['ratio']}x the baseline (target {row['target_ratio']}x)"),
        "masked": (row["ratio_masked"] is None or row["ratio_masked"] <= row["target_masked"],
                   f"{row['ratio_masked']}x with the masked stage at causal {CAUSAL_L} "
                   f"(target {row['target_masked']}x)"),
        "mufu": (row.get("mufu_per_score") is not None and row["mufu_per_score"] <= BUDGET_MUFU,
                 f"{row.get('mufu_per_score')} MUFU per score (target {BUDGET_MUFU})"),
        "narrow_wgmma": (row["wgmma_n_ok"], f"a QK^T or P V wgmma narrower than {BUDGET_WGMMA_N}"),
        "spills": (row["no_spill"], f"spills {row['spill_stores']}/{row['spill_loads']} B"),
    }
    if c is None:
        return [msg for ok, msg in checks.values() if not ok]
    problems = []
    if all(ok for ok, _ in checks.values()):
        problems.append("meets every target: delete its COMMAND_CEILINGS line")
    values = {"ratio": row["ratio"], "masked": row["ratio_masked"], "mufu": row.get("mufu_per_score"),
              "spills": row["spill_stores"]}
    for name, (ok, msg) in checks.items():
        if ok:
            continue
        if name == "narrow_wgmma":
            if not c.get("narrow_wgmma"):
                problems.append(msg)
        elif name not in c or values[name] is None or values[name] > c[name]:
            problems.append(f"{msg}, over its ceiling {c.get(name)}")
    return problems


def command_ceilings(rows: list[dict]) -> dict:
    """`COMMAND_CEILINGS` as today's rows would set it: each (target, shape, statistics) that misses a target,
    with the largest figures over its dtypes (printed by `--commands --ceilings`, for the ratchet's update)."""
    out: dict = {}
    for r in rows:
        if not command_problems({**r, "ceiling": None}):
            continue
        key = (r["arch"], r["shape"], r["statistics"])
        c = out.setdefault(key, {})
        for name, v in (("ratio", r["ratio"]), ("masked", r["ratio_masked"]), ("mufu", r.get("mufu_per_score"))):
            if v is not None:
                c[name] = max(c.get(name, 0), v)
        if r["spill_stores"]:
            c["spills"] = max(c.get("spills", 0), r["spill_stores"])
        if not r["wgmma_n_ok"]:
            c["narrow_wgmma"] = True
    return out


def format_ceilings(ceilings: dict) -> str:
    """`COMMAND_CEILINGS`' lines for `ceilings`, as the source writes them (the two long statistic sets by name)."""
    names = {_UNION: "_UNION", _POSITIONS: "_POSITIONS", _RUN_NORMS: "_RUN_NORMS", _SINKS_NORMS: "_SINKS_NORMS",
             _UNION_NORMS: "_UNION_NORMS"}
    lines = []
    for (arch, shape, stats), c in sorted(ceilings.items()):
        key = f"    ({arch!r}, {shape!r}, {names.get(stats, repr(stats))}): "
        value = "{" + ", ".join(f"{k!r}: {v!r}" for k, v in c.items()) + "},"
        lines.append(key + value if len(key + value) <= 120 else key.rstrip() + "\n        " + value)
    return "\n".join(lines)


def command_table(rows: list[dict]) -> str:
    """`command_rows` as a markdown table (one line per target, shape and statistics; fp16 and bf16 on one
    line when they agree, else the larger figures)."""
    yes = lambda ok: "yes" if ok else "**no**"  # noqa: E731
    lines = [f"| shape | statistics (commands) | arch | tiles | insn / 1k | flash | ratio | masked @{CAUSAL_L} | "
             "MUFU / score | wgmma N | spills | within |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["shape"], r["statistics"], r["arch"]), []).append(r)
    for (shape, stats, arch), rs in groups.items():
        r = max(rs, key=lambda x: (x["ratio"] or 99, x["ratio_masked"] or 0))
        uses = ", ".join(dict.fromkeys(u.split(":")[0] for u in r["uses"]))
        tiles = f"{r['BLOCK_M']}x{r['BLOCK_N']}"
        ok = all(not command_problems({**x, "ceiling": None}) for x in rs)
        lines.append(f"| {shape} (D={r['D']}, G={r['G']}) | {stats} ({uses}) | {arch} | {tiles} | "
                     f"{r.get('insn_per_1k_scores', '-')} | {r['baseline_best']} | **{r['ratio']}** | "
                     f"{'-' if r['ratio_masked'] is None else r['ratio_masked']} | {r.get('mufu_per_score', '-')} | "
                     f"{'/'.join(map(str, r['wgmma_n'])) or '-'} | {max(x['spill_stores'] for x in rs)} | "
                     f"{yes(ok)} |")
    return "\n".join(lines)


def format_table(rows: list[dict]) -> str:
    head = (f"{'kernel':<16} {'spec':<62} {'arch':<6} {'regs':>5} {'spills (st/ld B)':>16} {'shared B':>9} "
            f"{'insn/1k':>8} {'MUFU/sc':>8} {'MMA N':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        loop = (f"{r['insn_per_1k_scores']:>8} {r['mufu_per_score']:>8} "
                f"{'/'.join(str(m['N']) for m in r['mma']):>10}") if "mma" in r else f"{'':>8} {'':>8} {'':>10}"
        lines.append(f"{r['kernel'][:16]:<16} {r['spec'][:62]:<62} {r['arch']:<6} {r['registers']:>5} "
                     f"{str(r['spill_stores']) + '/' + str(r['spill_loads']):>16} {r['shared']:>9} {loop}")
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """The rows as a markdown table (the main loop's budget where the kernel has one)."""
    lines = ["| kernel | specialisation | D | arch | registers | spill st/ld (B) | shared (B) "
             "| main loop insn / 1k scores "
             "| MUFU / score | barriers / iter | MMA (N) |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        loop = (f"{r['insn_per_1k_scores']} | {r['mufu_per_score']} | {r['barriers']} | "
                + ", ".join(f"{m['op']} {m['M']}x{m['N']}x{m['K']} x{m['count']}" for m in r["mma"])) \
            if "mma" in r else " | | | "
        lines.append(f"| {r['kernel']} | {r['spec']} | {r['D']} | {r['arch']} | {r['registers']} | "
                     f"{r['spill_stores']}/{r['spill_loads']} | {r['shared']} | {loop} |")
    return "\n".join(lines)


def budget_table(rows: list[dict]) -> str:
    """`budget_rows` as a markdown table: each target, and the ceiling a specialisation that misses one
    is held to (`BUDGET_CEILINGS`)."""
    yes = lambda ok: "yes" if ok else "**no**"  # noqa: E731
    lines = [f"| specialisation | D | arch | insn / 1k scores | baseline best | ratio (<= {BUDGET_RATIO}) | "
             f"MUFU / score (<= {BUDGET_MUFU}) | wgmma N >= {BUDGET_WGMMA_N} | spills | ceiling (ratio, MUFU) |",
             "|---|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        c = r["ceiling"]
        ceiling = "-" if c is None else f"{c['ratio']}, {c['mufu']}"
        lines.append(f"| {r['spec']} | {r['D']} | {r['arch']} | {r['insn_per_1k_scores']} | {r['baseline_best']} | "
                     f"{r['ratio']} ({yes(r['within_ratio'])}) | {r['mufu_per_score']} ({yes(r['within_mufu'])}) | "
                     f"{yes(r['wgmma_n_ok'])} | {r['spill_stores']}/{r['spill_loads']} | {ceiling} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bertscope.kernels.triton_aot", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, action="append", choices=ARCHS, help="target (default: all of 80, 90)")
    parser.add_argument("--classes", type=int, action="append", help=f"key class counts (default: {CLASS_COUNTS})")
    parser.add_argument("--dtype", action="append", choices=DTYPES, help="input dtypes (default: all)")
    parser.add_argument("--forward-only", action="store_true", help="the fused forward only, no whole-map kernels")
    parser.add_argument("--layouts", choices=("all", "core", "none"), default="all",
                        help="the layout kernel and the banded map kernels (causal / windowed / grouped-query): "
                             "every specialisation (default), the largest of each configuration, or none")
    parser.add_argument("--budget", action="store_true",
                        help="the instruction budget only: the default statistics' specialisations "
                             "(D 64 and 128, plain "
                             "and causal GQA, fp16 and bf16) against the flash baseline (bench/flash_baseline.py)")
    parser.add_argument("--baseline", action="store_true",
                        help="add the flash baseline (bench/flash_baseline.py) at its tutorial tiles")
    parser.add_argument("--commands", action="store_true",
                        help="every command's specialisation (the registry's kernel_specs) at the shapes of "
                             "Llama-3.2-1B, Llama-3-8B, Llama-2-7B, Gemma-3 and bert-base, fp16 and bf16 (or --dtype), "
                             "against the flash baseline at the same head size (docs/kernels.md)")
    parser.add_argument("--ceilings", action="store_true",
                        help="with --commands: print COMMAND_CEILINGS as today's rows would set it")
    parser.add_argument("--dump", type=Path, default=None, metavar="DIR",
                        help="write each specialisation's cubin, SASS and a JSON of its tiles and statistics to DIR")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table instead")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)  # before the kernel module runs @triton.jit
    import triton  # see the note above ARCHS

    specs = shipped_specialisations(tuple(args.classes or CLASS_COUNTS), tuple(args.dtype or DTYPES),
                                    maps=not args.forward_only,
                                    layouts=args.layouts)
    archs = tuple(args.arch or ARCHS)
    if args.budget:
        specs = budget_specialisations(dtypes=tuple(d for d in (args.dtype or ("fp16", "bf16")) if d != "fp32"))
    if args.commands:
        return _commands_main(args, archs)
    rows = compile_all(archs, specs, args.dump)
    baseline = []
    if args.baseline or args.budget:
        baseline = compile_all(archs, baseline_specialisations(warps=None if args.baseline else BUDGET_BASELINE_WARPS),
                               args.dump)
    if args.json:
        print(json.dumps({"rows": rows, "baseline": baseline, "budget": budget_rows(rows, baseline)} if baseline
                         else rows))
    elif args.markdown:
        print(markdown_table(rows + baseline))
        if baseline:
            print("\n" + budget_table(budget_rows(rows, baseline)))
    else:
        print(f"Triton {triton.__version__} ({Path(triton.__file__).parent})")
        print(format_table(rows + baseline))
        if baseline:
            print("\n" + budget_table(budget_rows(rows, baseline)))
        spilled = [r for r in rows if r["spill_stores"] or r["spill_loads"]]
        print(f"\n{len(rows)} kernels, {len(spilled)} with spills (compile s is ~0 when Triton's cache had the kernel)")
    return 0


def _commands_main(args, archs) -> int:
    """`--commands`: compile, compare, print (see `command_specialisations`, `command_rows`)."""
    dtypes = tuple(d for d in (args.dtype or ("fp16", "bf16")) if d != "fp32")
    specs = command_specialisations(dtypes)
    pairs = [(cs, compile_one(cs.spec, a, args.dump)) for a in archs for cs in specs]
    baseline = compile_all(archs, command_baseline(dtypes=dtypes), args.dump)
    rows = command_rows(pairs, baseline)
    if args.json:
        print(json.dumps({"rows": rows, "baseline": baseline}))
    elif args.ceilings:
        print(format_ceilings(command_ceilings(rows)))
    else:
        print(command_table(rows))
        bad = [r for r in rows if command_problems(r)]
        print(f"\n{len(rows)} specialisations, {len(bad)} over their targets or ceilings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
