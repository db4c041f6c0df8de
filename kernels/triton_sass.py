"""What a compiled kernel's main loop issues, read from its SASS: the instruction budget, without a GPU.

A fused attention kernel on a GPU is bound by instruction issue long before memory or tensor cores
when it does too much per score (the first fused forward issued about 8x a flash loop's
instructions and ran at about a tenth of its FLOP rate on an H100). So the budget is counted where
it is spent: the SASS of the loop over key blocks, disassembled with the `cuobjdump` Triton ships.

    metrics = loop_metrics(main_loop(parse(disassemble(compiled.asm["cubin"]))), cfg)

- `parse`: SASS text -> `Instruction`s (address, predicate, opcode with its modifiers, operands);
  NOPs and instructions predicated on `!PT` (never true: ptxas's placeholders) are dropped, as
  padding that does no work.
- `loops`: every backward branch `BRA target` with target < its own address closes a loop whose
  body is [target, branch].
- `main_loop`: the loop whose body holds a tensor-core MMA (HMMA on sm_80, HGMMA on sm_90) and an
  MUFU.EX2, and holds no other such loop (the innermost, where loops nest): the first such loop in
  program order, or the last (`stage="last"`). Which one is the kernel's to declare, by the order of
  its stages: a flash loop (the tutorial's) puts the unmasked key blocks first and the causal diagonal
  after; the fused forward visits its masked blocks first and the unmasked ones last
  (`triton_kernel`'s docstring). Never the smallest: a rule by size would read whichever loop a
  change made shorter.
- `loop_metrics`: per iteration of that loop (one key block of BLOCK_M x BLOCK_N scores), per warp:
  warp-instructions per 1,000 scores = instructions x num_warps / (BLOCK_M BLOCK_N) x 1000; MUFU per
  score = MUFU instructions x 32 threads x num_warps / (BLOCK_M BLOCK_N); barriers (BAR.*); shared
  memory loads and stores; the MMA instructions with their shapes (HGMMA.64x128x16.F32.BF16: M 64,
  N 128, K 16) and operand types.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

# one instruction line of cuobjdump -sass: /*0a40*/   @!P0 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ ;
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_TARGET = re.compile(r"0x([0-9a-f]+)")


@dataclass(frozen=True)
class Instruction:
    address: int
    opcode: str  # with its modifiers: "HGMMA.64x128x16.F32.BF16", "MUFU.EX2", "BAR.SYNC.DEFER_BLOCKING"
    operands: str
    predicate: str = ""  # "@P0", "@!P1", "" when unpredicated

    @property
    def base(self) -> str:
        """The opcode without modifiers: "HGMMA", "MUFU", "BAR"."""
        return self.opcode.split(".")[0]


@dataclass(frozen=True)
class Loop:
    start: int  # the branch target
    end: int  # the backward branch's address
    body: tuple[Instruction, ...]


def tool_path(name: str) -> Path:
    """A binary of the CUDA toolkit Triton ships (cuobjdump, nvdisasm, ptxas)."""
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def disassemble(cubin: bytes) -> str:
    """The SASS text of a cubin (`cuobjdump -sass`)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([str(tool_path("cuobjdump")), "-sass", f.name], capture_output=True, text=True,
                              check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {done.stderr[-2000:]}")
    return done.stdout


def parse(sass: str) -> list[Instruction]:
    """The instructions of SASS text, in address order, NOPs and `@!PT` placeholders left out."""
    found = [Instruction(int(m.group(1), 16), m.group(3), m.group(4).strip(), (m.group(2) or "").strip())
             for m in _LINE.finditer(sass)]
    return [i for i in found if i.opcode != "NOP" and i.predicate != "@!PT"]


def loops(instructions: list[Instruction]) -> list[Loop]:
    """Every loop closed by a backward branch, in the order of their branches."""
    out = []
    for ins in instructions:
        if ins.base != "BRA":
            continue
        target = _TARGET.search(ins.operands)
        if target is None or int(target.group(1), 16) >= ins.address:
            continue
        start = int(target.group(1), 16)
        out.append(Loop(start, ins.address, tuple(i for i in instructions if start <= i.address <= ins.address)))
    return out


def is_mma(ins: Instruction) -> bool:
    return ins.base in ("HMMA", "HGMMA", "IMMA", "IGMMA")


def main_loop(instructions: list[Instruction], stage: str = "first") -> Loop:
    """The first (or, with stage="last", the last) loop by address with a tensor-core MMA and an
    MUFU.EX2 in its body and no other such loop inside it (see the module docstring); a ValueError
    when there is none."""
    if stage not in ("first", "last"):
        raise ValueError(f"stage is 'first' or 'last', not {stage!r}")
    found = [lp for lp in loops(instructions)
             if any(is_mma(i) for i in lp.body) and any(i.opcode.startswith("MUFU.EX2") for i in lp.body)]
    innermost = [lp for lp in found
                 if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in found)]
    if not innermost:
        raise ValueError("no loop with an MMA and an MUFU.EX2: not an attention kernel's SASS?")
    pick = min if stage == "first" else max
    return pick(innermost, key=lambda lp: lp.start)


def other_stage(instructions: list[Instruction], stage: str = "first") -> Loop | None:
    """The attention loop of the other stage than `main_loop(instructions, stage)`: the last such loop
    (with an MMA and an MUFU.EX2, innermost) when the main one is the first, else the first; None when
    the kernel has one such loop only. For the fused forward it is the masked stage (band edges, padding,
    the row end), for the flash baseline the causal diagonal."""
    main = main_loop(instructions, stage)
    found = [lp for lp in loops(instructions)
             if any(is_mma(i) for i in lp.body) and any(i.opcode.startswith("MUFU.EX2") for i in lp.body)]
    innermost = [lp for lp in found if lp.start != main.start
                 and not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in found)]
    if not innermost:
        return None
    pick = max if stage == "first" else min
    return pick(innermost, key=lambda lp: lp.start)


def nested_loops(loop: Loop, instructions: list[Instruction]) -> list[Loop]:
    """The loops inside `loop`'s body (a statistic's loop over buckets inside the key-block loop): the
    main loop's count holds each of their bodies once, however many times it runs."""
    return [lp for lp in loops(instructions) if loop.start <= lp.start and lp.end < loop.end]


def mma_shape(opcode: str) -> dict:
    """{"op", "M", "N", "K", "types"} of an MMA opcode: HGMMA.64x128x16.F32.BF16 (sm_90, M x N x K
    written out), HMMA.16816.F32.BF16 (sm_80: m16 n8 k16; HMMA.1688: k8)."""
    parts = opcode.split(".")
    shape = parts[1] if len(parts) > 1 else ""
    if "x" in shape:
        M, N, K = (int(d) for d in shape.split("x"))
    elif shape.startswith("16") and len(shape) >= 4:
        M, N, K = 16, int(shape[2]), int(shape[3:])
    else:
        M = N = K = None
    return {"op": parts[0], "M": M, "N": N, "K": K, "types": ".".join(parts[2:])}


def loop_metrics(loop: Loop, cfg: dict) -> dict:
    """What one iteration of `loop` issues for BLOCK_M x BLOCK_N scores with num_warps warps."""
    scores = cfg["BLOCK_M"] * cfg["BLOCK_N"]
    warps = cfg["num_warps"]
    body = loop.body
    mufu = sum(i.base == "MUFU" for i in body)
    mmas = sorted({i.opcode for i in body if is_mma(i)})
    return {
        "loop_instructions": len(body),
        "insn_per_1k_scores": round(len(body) * warps / scores * 1000, 1),
        "mufu_per_score": round(mufu * 32 * warps / scores, 3),
        "barriers": sum(i.base == "BAR" for i in body),
        "shared_ld_st": sum(i.base in ("LDS", "STS", "LDSM") for i in body),
        "local_ld_st": sum(i.base in ("LDL", "STL") for i in body),
        "mma": [{**mma_shape(op), "count": sum(i.opcode == op for i in body)} for op in mmas],
    }


def kernel_metrics(cubin: bytes, cfg: dict, stage: str = "first") -> dict:
    """`loop_metrics` of a cubin's main loop (`main_loop`'s stage)."""
    return loop_metrics(main_loop(parse(disassemble(cubin)), stage), cfg)
