"""Sweep the fused forward's tiles (a tile family of the statistics table, or the commands' rows), without a GPU.

Compiles the kernel (`triton_aot`: `triton.compile` for sm_80 / sm_90) for each candidate tile and
layout, and prints the main loop's warp-instructions per 1,000 scores and the bytes spilled: how
the tile families' entries of `triton_config.TILES` were chosen (docs/kernels.md, "Tiles of the position and token
statistics"). The statistics of a family are read off the table's traits (`KernelTraits.tiles`), on
top of the default statistics and the argmax, as the commands launch them.

    python bench/tile_sweep.py --family positions --arch 80 --head-dim 64
    python bench/tile_sweep.py --family tokens --family positions --arch 90 --head-dim 128

`--commands`: the rows of `triton_aot --commands` (a command's statistics at a model's shape) whose statistic
set is one of `CHEAP_SETS`, each searched over a pruned set of tiles, warps, stages and kernel switches
(`command_candidates`), compared with the flash baseline as `--commands` compares them; two compiles at a
time (`--jobs`). Each compile is a line of the JSON-lines file (`--out`, read back on a rerun: a candidate
already there is not compiled again); a markdown table of each row's config before and its best after.

    python bench/tile_sweep.py --commands --out /tmp/sweep.jsonl              # sm_80 and sm_90, bf16
    python bench/tile_sweep.py --commands --arch 90 --shape Gemma-3 --statistics none
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

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


# -- the commands' rows (`--commands`)

# the statistic sets whose rows the command sweep searches: those without a positions or tokens family
CHEAP_SETS = ("none", "argmax", "class_mass", "entropy+class_mass", "entropy+class_mass+argmax",
              # the norm-based twins: run --norms', sinks --norms' (triton_config's "default+norms",
              # "default+class_norms")
              "entropy+class_mass+offset_mass_norm+class_mass_norm+weighted_norm",
              "entropy+class_mass+class_mass_norm+weighted_norm")
# tile shapes (BLOCK_M, BLOCK_N, num_warps), the widest (fewest instructions per score, as a rule) first
SHAPES = ((128, 128, 8), (128, 64, 8), (64, 64, 4), (64, 64, 8), (128, 32, 8), (64, 32, 4), (64, 32, 8))
SHAPES_WIDE_HEAD = ((64, 64, 8), (64, 32, 4), (64, 32, 8), (32, 64, 4), (32, 32, 4), (16, 32, 4))
# main-loop ratios within this fraction of the lowest are a tie (`choose`)
TIE = 0.03
# a spilling tile shape is searched further (stages, switches) when it spilled at most this many bytes
NEAR_SPILL = 32


def sums_modes(spec, arch: int) -> list[int]:
    """SUMS_BY_DOT's modes a specialisation may take (`triton_config`): PER_SCORE; with a free key-feature
    column L_ONLY, on sm_90 (on sm_80 neither pays, triton_config's docstring), and L_AND_T with the entropy
    and neither argmax nor position statistics (without the entropy it is L_ONLY's loop)."""
    from bertscope.kernels.triton_config import L_AND_T, L_ONLY, PER_SCORE, feature_width

    modes = [PER_SCORE]
    if arch < 90 or feature_width(spec.n_classes, ones=True) != feature_width(spec.n_classes):
        return modes
    modes.append(L_ONLY)
    wide = set(kernel_stats("wide")) | set(kernel_stats("positions")) | set(kernel_stats("tokens"))
    if "entropy" in spec.stats and not wide & set(spec.stats):
        modes.append(L_AND_T)
    return modes


def _candidate(spec, m, n, w, stages, sums, masked_first, fixed_g):
    """One candidate config; the plain layout's L_ONLY clamps its key rows (`triton_config.Entry.clamp_keys`), as
    the kernel did by itself when the sweep of 2026-12-08 ran."""
    from bertscope.kernels.triton_config import L_ONLY

    return dataclasses.replace(spec, tiles=(m, n, w, stages), switches=(
        ("SUMS_BY_DOT", sums), ("MASKED_FIRST", masked_first), ("FIXED_G", fixed_g),
        ("CLAMP_KEYS", sums == L_ONLY and not spec.banded)))


def _variants(spec, arch: int, best) -> list:
    """A candidate's neighbours, one switch or the stages changed at a time."""
    m, n, w, st = best.tiles
    sw = dict(best.switches)
    out = [_candidate(spec, m, n, w, s, sw["SUMS_BY_DOT"], sw["MASKED_FIRST"], sw["FIXED_G"])
           for s in (1, 2, 3) if s != st]
    out.append(_candidate(spec, m, n, w, st, sw["SUMS_BY_DOT"], not sw["MASKED_FIRST"], sw["FIXED_G"]))
    if spec.banded and spec.group > 1:
        out.append(_candidate(spec, m, n, w, st, sw["SUMS_BY_DOT"], sw["MASKED_FIRST"], not sw["FIXED_G"]))
    out += [_candidate(spec, m, n, w, st, mode, sw["MASKED_FIRST"], sw["FIXED_G"])
            for mode in sums_modes(spec, arch) if mode != sw["SUMS_BY_DOT"]]
    return out


def _key(spec, arch: int) -> str:
    return json.dumps([arch, spec.D, spec.dtype, list(spec.stats), spec.n_classes, spec.banded, spec.group,
                       spec.tiles, [list(x) for x in spec.switches]])


def _figures(spec, arch: int, cs, baseline: list[dict], done: dict) -> dict:
    """One candidate's `--commands` row (compiled, or read from `done`, where a compile is kept by `_key`)."""
    from bertscope.kernels import triton_aot

    key = _key(spec, arch)
    if key not in done:
        done[key] = triton_aot.compile_one(spec, arch)
    return triton_aot.compare_with_baseline({**done[key], "shape": cs.shape.name, "layout": cs.shape.layout,
                                             "G": cs.shape.group, "dtype": spec.dtype, "statistics": cs.statistics,
                                             "kind": cs.kind, "uses": list(cs.uses)}, baseline)


def _score(r: dict) -> tuple:
    """Spill-free first, then the fewest instructions: main loop, then with the masked stage."""
    return (not r["no_spill"], r["ratio"] if r["ratio"] is not None else 99, r["ratio_masked"] or 0)


def choose(rows: list[dict]) -> dict:
    """The best of spill-free rows: the fewest main-loop instructions; within TIE of the fewest, pipelined loads
    (2 stages or more: their latency is what an instruction count does not see), then the fewest with the
    masked stage."""
    low = min(r["ratio"] for r in rows)
    close = [r for r in rows if r["ratio"] <= low * (1 + TIE)]
    return min(close, key=lambda r: (r["num_stages"] < 2, r["ratio_masked"] or 0, r["ratio"]))


def _not_worse(r: dict, before: dict) -> bool:
    """No figure of `--commands`' ratchet higher than the launch's config had (ratio, masked, MUFU, spills,
    a narrow wgmma where there was none)."""
    pairs = [(r["ratio"], before["ratio"]), (r["ratio_masked"], before["ratio_masked"]),
             (r.get("mufu_per_score"), before.get("mufu_per_score")), (r["spill_stores"], before["spill_stores"])]
    return all(a is None or b is None or a <= b for a, b in pairs) and (r["wgmma_n_ok"] or not before["wgmma_n_ok"])


def search_row(cs, arch: int, baseline: list[dict], done: dict, near_spill: int = NEAR_SPILL) -> dict:
    """One row's search: the launch's config; each tile shape (`SHAPES`, widest first) with the masked stage
    first, 2 stages, each SUMS_BY_DOT mode, until one is spill-free and one narrower shape after it; then the
    neighbours (`_variants`) of the best spill-free candidate and of the (at most two) candidates that issue
    fewer instructions but spilled at most `near_spill` bytes, a switch at a time while one improves. Returns the
    launch's row, the best (spill-free and no figure worse than the launch's, or any spill-free one where the
    launch's spills; else the launch's) and every row compiled."""
    spec = cs.spec
    seen: dict[str, tuple] = {}  # key -> (candidate, row)

    def run(c):
        k = _key(c, arch)
        if k not in seen:
            seen[k] = (c, {**_figures(c, arch, cs, baseline, done), "candidate": _describe(c, arch), "key": k,
                           "num_stages": c.config(arch)["num_stages"]})
        return seen[k][1]

    before = run(spec)
    found_at = None
    spilling = []
    for i, (m, n, w) in enumerate(SHAPES_WIDE_HEAD if spec.D > 128 else SHAPES):
        tried = [(c, run(c)) for c in (_candidate(spec, m, n, w, 2, mode, True, False)
                                       for mode in sums_modes(spec, arch))]
        if any(r["no_spill"] for _, r in tried):
            found_at = i if found_at is None else found_at
        spilling += [(c, r) for c, r in tried if not r["no_spill"] and r["spill_stores"] <= near_spill]
        if found_at is not None and i >= found_at + 1:
            break
    starts = []
    ok = [(c, r) for c, r in seen.values() if r["no_spill"] and c is not spec]
    if ok:
        starts.append(min(ok, key=lambda x: _score(x[1])))
    # the spilling candidates that issue fewer instructions than the best spill-free one: their neighbours may fit
    bar = starts[0][1]["ratio"] if starts else before["ratio"]
    starts += sorted((x for x in spilling if (x[1]["ratio"] or 99) < (bar or 99)), key=lambda x: x[1]["ratio"])[:2]
    for c, r in starts:
        improved = True
        while improved:
            improved = False
            for v in _variants(spec, arch, c):
                rv = run(v)
                if _score(rv) < _score(r):
                    c, r, improved = v, rv, True
                    break
    # a launch config that spills is no bar: any spill-free candidate may replace it (spill-free is the rule)
    pool = [r for _, r in seen.values() if r["no_spill"] and (not before["no_spill"] or _not_worse(r, before))]
    best = choose(pool) if pool else before
    return {"row": [arch, cs.shape.name, cs.statistics], "before": before, "best": best,
            "compiled": [r for _, r in seen.values()]}


def _describe(c, arch: int) -> str:
    from bertscope.kernels.triton_config import L_AND_T, L_ONLY, PER_SCORE

    cfg = c.config(arch)
    return (f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']}s{cfg['num_stages']}"
            + {PER_SCORE: "", L_AND_T: " L_AND_T", L_ONLY: " L_ONLY"}[int(cfg["SUMS_BY_DOT"])]
            + (" MF" if cfg["MASKED_FIRST"] else "") + (" FIXED_G" if cfg["FIXED_G"] else ""))


def in_budget(cs) -> bool:
    """Whether a row is one of `triton_aot --budget`'s (the default statistics at D 64 or 128, plain or
    grouped with G = 4): their tiles are the budget's, never searched here."""
    from bertscope.kernels import triton_aot

    return any(cs.spec.stats == b.stats and cs.spec.D == b.D and cs.spec.banded == b.banded
               and cs.spec.group == b.group
               for b in triton_aot.budget_specialisations(dtypes=(cs.spec.dtype,)))


def _search_job(args):
    cs, arch, baseline, done, near_spill = args
    done = dict(done)
    known = set(done)
    res = search_row(cs, arch, baseline, done, near_spill)
    return res, {k: v for k, v in done.items() if k not in known}


def commands_main(args) -> int:
    from bertscope.kernels import triton_aot

    archs = tuple(args.arch or triton_aot.ARCHS)
    rows = [(cs, a) for a in archs for cs in triton_aot.command_specialisations((args.dtype,))
            if cs.statistics in (args.statistics or CHEAP_SETS) and (not args.shape or cs.shape.name in args.shape)
            and (args.all_rows or (f"sm_{a}", cs.shape.name, cs.statistics) in triton_aot.COMMAND_CEILINGS)
            and not in_budget(cs)]
    done: dict = {}
    if args.out.exists():  # a rerun: the compiles already made
        for line in args.out.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["key"]] = rec["row"]
    baseline = triton_aot.compile_all(archs, triton_aot.command_baseline(dtypes=(args.dtype,)))
    print(f"{len(rows)} rows, {len(done)} compiles known ({args.out})", flush=True)
    results = []
    with ProcessPoolExecutor(args.jobs) as pool, args.out.open("a") as out:
        for res, new in pool.map(_search_job, [(cs, a, baseline, done, args.near_spill) for cs, a in rows]):
            results.append(res)
            for k, row in new.items():
                out.write(json.dumps({"key": k, "row": row}) + "\n")
            out.flush()
            print(_line(res), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results))
    print("\n" + sweep_table(results))
    return 0


def _line(res: dict) -> str:
    b, a = res["before"], res["best"]
    return (f"{res['row']}: {b['candidate']} {b['ratio']}/{b['ratio_masked']} ({b['spill_stores']} B) -> "
            f"{a['candidate']} {a['ratio']}/{a['ratio_masked']} ({a['spill_stores']} B), {len(res['compiled'])} "
            "compiled")


def sweep_table(results: list[dict]) -> str:
    """Each searched row: the launch's config and its figures, the best candidate's, and the compiles."""
    lines = ["| target | shape | statistics | before | ratio | masked | MUFU | spills (B) | best | ratio | masked "
             "| MUFU | spills (B) | compiled |",
             "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for res in results:
        arch, shape, stats = res["row"]
        b, a = res["before"], res["best"]
        fig = lambda r: (f"{r['ratio']} | {'-' if r['ratio_masked'] is None else r['ratio_masked']} | "  # noqa: E731
                         f"{r.get('mufu_per_score')} | {r['spill_stores']}")
        lines.append(f"| sm_{arch} | {shape} | {stats} | {b['candidate']} | {fig(b)} | "
                     f"{'=' if a is b or a['candidate'] == b['candidate'] else a['candidate']} | {fig(a)} | "
                     f"{len(res['compiled'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", choices=("positions", "tokens"),
                        help="tile families of the statistics switched on (repeat for a union)")
    parser.add_argument("--arch", type=int, choices=triton_aot.ARCHS, action="append",
                        help="target (family sweep: the first, default 80; --commands: each, default all)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=4, help="key classes (they move the registers)")
    parser.add_argument("--group", type=int, default=4, help="G of the banded layout")
    parser.add_argument("--tiles", nargs="+", default=list(CANDIDATES), help="BLOCK_MxBLOCK_NxWARPSxSTAGES")
    parser.add_argument("--commands", action="store_true", help="search the commands' rows (CHEAP_SETS)")
    parser.add_argument("--shape", action="append", help="--commands: only this model shape (repeatable)")
    parser.add_argument("--statistics", action="append", help="--commands: only this statistic set (repeatable)")
    parser.add_argument("--all-rows", action="store_true",
                        help="--commands: rows within their targets too (default: those in COMMAND_CEILINGS)")
    parser.add_argument("--dtype", default="bf16", choices=("fp16", "bf16"), help="--commands: input dtype")
    parser.add_argument("--jobs", type=int, default=2, help="--commands: rows searched at once")
    parser.add_argument("--near-spill", type=int, default=NEAR_SPILL,
                        help="--commands: a spilling candidate that issues fewer instructions than the best spill-free "
                             "one is searched further (stages, switches) when it spilled at most this many bytes")
    parser.add_argument("--out", type=Path, default=Path("tile_sweep.jsonl"),
                        help="--commands: JSON lines of every compile, read back on a rerun")
    parser.add_argument("--json", type=Path, default=None, help="--commands: write the results to this file")
    args = parser.parse_args(argv)
    if args.commands:
        return commands_main(args)
    if not args.family:
        parser.error("--family or --commands")
    args.arch = (args.arch or [80])[0]
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
