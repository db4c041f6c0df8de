"""Sweep the fused forward's tiles for one tile family of the statistics table, without a GPU.

Compiles the kernel (`triton_aot`: `triton.compile` for sm_80 / sm_90) for each candidate tile and
layout, and prints the main loop's warp-instructions per 1,000 scores and the bytes spilled: how
`triton_config.FAMILY_TILES` was chosen (docs/kernels.md, "Tiles of the position and token
statistics"). The statistics of a family are read off the table's traits (`KernelTraits.tiles`), on
top of the default statistics and the argmax, as the commands launch them.

    python bench/tile_sweep.py --family positions --arch 80 --head-dim 64
    python bench/tile_sweep.py --family tokens --family positions --arch 90 --head-dim 128
"""
from __future__ import annotations

import argparse
import os

os.environ.pop("TRITON_INTERPRET", None)  # compiled for a GPU target, never interpreted

from bertscope.kernels import triton_aot
from bertscope.kernels.spec import kernel_stats

CANDIDATES = ("128x64x8x2", "128x32x8x2", "64x64x4x2", "64x32x4x2", "64x32x8x2")


def statistics(families: list[str]) -> tuple[str, ...]:
    """The switches of a call asking for `families`: the default statistics, the argmax, then each family's."""
    names = [*kernel_stats("default"), *kernel_stats("wide")]
    for family in families:
        names += [n for n in kernel_stats(family) if n not in names]
    return tuple(names)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", choices=("positions", "tokens"), required=True,
                        help="tile families of the statistics switched on (repeat for a union)")
    parser.add_argument("--arch", type=int, choices=triton_aot.ARCHS, default=80)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=4, help="key classes (they move the registers)")
    parser.add_argument("--group", type=int, default=4, help="G of the banded layout")
    parser.add_argument("--tiles", nargs="+", default=list(CANDIDATES), help="BLOCK_MxBLOCK_NxWARPSxSTAGES")
    args = parser.parse_args(argv)
    stats = statistics(args.family)
    print(f"sm_{args.arch}, D = {args.head_dim}, bf16, {args.classes} classes: {'+'.join(stats)}")
    print("| tiles | layout | insn / 1k scores | spilled (B) |\n|---|---|---:|---:|")
    for text in args.tiles:
        tiles = tuple(int(x) for x in text.split("x"))
        for banded, group in ((False, 1), (True, args.group)):
            spec = triton_aot.Specialisation(args.head_dim, "bf16", stats, args.classes, banded, group, tiles=tiles)
            row = triton_aot.compile_one(spec, args.arch)
            print(f"| {text} | {'banded' if banded else 'plain'} | {row.get('insn_per_1k_scores')} | "
                  f"{row.get('spill_stores')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
