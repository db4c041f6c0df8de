"""What the norm-based twins cost the fused Triton kernel, read off its compiled SASS (no GPU needed).

    python bench/norms_kernel_cost.py [--out bench/results_norms_kernel.md]

For sm_80 and sm_90, D = 64 and 128, the plain layout (an encoder's) and a causal one with 4 query heads per
key/value head (a decoder's), in bf16, it compiles the fused forward twice with the default statistics' own
tiles and switches (`triton_config`'s choice for entropy and class masses): without the twins, and with the
three the kernel computes (`offset_mass_norm`, `class_mass_norm`, `weighted_norm`: docs/norms.md). It writes the
main loop's warp-instructions per 1,000 scores of both (`triton_aot.compile_one`), their ratio, MUFU per
score, registers and spilled bytes. Like `triton_aot --budget`, a count of the static instructions of the
main loop: what the kernel issues per key block where it is bound by issue.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bertscope.kernels import triton_aot as aot  # noqa: E402
from bertscope.kernels.spec import ROW_STATS  # noqa: E402

DEFAULT = tuple(aot.DEFAULT_STATS)
# the twins the kernel computes: the entries of the table with kernel traits whose switch is the norms'
TWINS = tuple(s.name for s in ROW_STATS if s.switch == "norms" and s.kernel is not None)


@dataclass(frozen=True)
class AtDefaultConfig(aot.Specialisation):
    """A specialisation compiled with the config the default statistics get at its shape, whatever it asks."""

    def config(self, arch: int) -> dict:
        return aot.Specialisation(self.D, self.dtype, DEFAULT, self.n_classes, self.banded, self.group).config(arch)


def rows() -> list[dict]:
    out = []
    for arch in (80, 90):
        for D in (64, 128):
            for banded, group in ((False, 1), (True, 4)):
                got = {}
                for stats in (DEFAULT, DEFAULT + TWINS):
                    got[stats != DEFAULT] = aot.compile_one(AtDefaultConfig(D, "bf16", stats, 4, banded, group), arch)
                off, on = got[False], got[True]
                out.append({"target": f"sm_{arch}", "D": D, "layout": "causal, G = 4" if banded else "plain",
                            "without": off["insn_per_1k_scores"], "with": on["insn_per_1k_scores"],
                            "ratio": round(on["insn_per_1k_scores"] / off["insn_per_1k_scores"], 2),
                            "mufu": f"{off['mufu_per_score']} / {on['mufu_per_score']}",
                            "registers": f"{off['registers']} / {on['registers']}",
                            "spills": f"{off['spill_stores']} / {on['spill_stores']} B"})
                print(out[-1], flush=True)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write the table as Markdown here")
    args = p.parse_args()
    table = rows()
    head = ("| target | D | layout | without twins | with twins | ratio | MUFU / score | registers | spills |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(f"| {r['target']} | {r['D']} | {r['layout']} | {r['without']} | {r['with']} | {r['ratio']} | "
                   f"{r['mufu']} | {r['registers']} | {r['spills']} |\n" for r in table)
    text = ("Main loop, warp-instructions per 1,000 scores (`python bench/norms_kernel_cost.py`), bf16, the "
            "default statistics' tiles; twins: " + ", ".join(TWINS) + ".\n\n" + head + body)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
