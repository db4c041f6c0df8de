"""Before/after table of two ahead-of-time reports of the fused forward (kernels/triton_aot.py
--json), per target, dtype and code path, at each key-class count.

    python -m bertscope.kernels.triton_aot --json --arch 80 > before_80.json   # and --arch 90, on each tree
    python tools/aot_compare.py before_80.json before_90.json -- after_80.json after_90.json

A cell is the largest registers per thread over the path's specialisations (D 32 and 64,
entropy / argmax on or off) before -> after, then the largest shared memory in KiB; spills
are counted under the table.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def load(paths):
    rows = []
    for p in paths:
        rows += [r for r in json.load(open(p)) if r["kernel"] in ("attn_stats_fwd", "_attn_stats_fwd")]  # new, old name
    return rows


def group(rows):
    """(arch, dtype, path) -> C -> (max registers, max shared, spilled kernels, block sizes)"""
    out = defaultdict(dict)
    for r in rows:
        words = r["spec"].split()
        path, blocks, dtype, C = words[0], " ".join(words[1:3] + words[4:5]), words[5], int(words[6][1:])
        key = (r["arch"], dtype, path)
        regs, shared, spills, seen = out[key].get(C, (0, 0, 0, set()))
        seen.add(blocks)
        out[key][C] = (max(regs, r["registers"]), max(shared, r["shared"]),
                       spills + bool(r["spill_stores"] or r["spill_loads"]), seen)
    return out


def table(before, after) -> str:
    b, a = group(before), group(after)
    classes = sorted({C for v in a.values() for C in v})
    lines = ["| arch | dtype | path (blocks before -> after) | "
             + " | ".join(f"C = {C}: registers, shared KiB" for C in classes) + " |",
             "|---|---|---|" + "---:|" * len(classes)]
    for key in sorted(a, key=lambda k: (k[0], ["fp32", "fp16", "bf16"].index(k[1]), k[2] != "single")):
        arch, dtype, path = key
        blocks_b = "/".join(sorted(set().union(*(v[3] for v in b.get(key, {}).values())) or {"-"}))
        blocks_a = "/".join(sorted(set().union(*(v[3] for v in a[key].values()))))
        label = f"{path} ({blocks_b}" + (f" -> {blocks_a})" if blocks_a != blocks_b else ")")
        cells = []
        for C in classes:
            rb, sb, xb, _ = b.get(key, {}).get(C, (None, None, 0, None))
            ra, sa, xa, _ = a[key][C]
            spill = "" if not (xb or xa) else f" (spills {xb} -> {xa})"
            cells.append(f"{rb} -> {ra}, {sb / 1024:.0f} -> {sa / 1024:.0f}{spill}" if rb is not None
                         else f"{ra}, {sa / 1024:.0f}")
        lines.append(f"| {arch} | {dtype} | {label} | " + " | ".join(cells) + " |")
    n_b = sum(1 for r in before if r["spill_stores"] or r["spill_loads"])
    n_a = sum(1 for r in after if r["spill_stores"] or r["spill_loads"])
    lines.append(f"\nFused-forward kernels with spills: {n_b} of {len(before)} before, {n_a} of {len(after)} after.")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--")
    print(table(load(argv[:split]), load(argv[split + 1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
