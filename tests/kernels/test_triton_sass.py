"""kernels/triton_sass.py on hand-written SASS listings whose answers are known: the parser, the loops,
the choice of the main loop and the budget figures read from it. (The real compiles are
tests/kernels/test_triton_budget.py's.)"""
import pytest

from bertscope.kernels import triton_sass as ts


def sass(*lines: str, name: str = "_attn") -> str:
    """A `cuobjdump -sass` listing of one function: each line an instruction at 0x0, 0x10, ..."""
    body = "\n".join(f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x000fe200078e00ff */\n"
                     f"                                                  /* 0x000fe200078e00ff */"
                     for i, ins in enumerate(lines))
    return f"\n\tcode for sm_80\n\t\tFunction : {name}\n\t.headerflags\t@\"EF_CUDA_SM80\"\n{body}\n"


# two attention loops (the first unmasked, the second masked), a loop without an MMA (the offsets'
# epilogue) and ptxas's closing self-branch; addresses are 16 x the line index
LISTING = sass(
    "S2R R0, SR_TID.X",                        # 0x00
    "BAR.SYNC.DEFER_BLOCKING 0x0",             # 0x10  loop 1 head
    "LDSM.16.M88.4 R4, [R2]",                  # 0x20
    "HMMA.16816.F32.BF16 R8, R4, R6, RZ",      # 0x30
    "NOP",                                     # 0x40  padding: not counted
    "@!PT LDS RZ, [RZ]",                       # 0x50  a never-true placeholder: not counted
    "FMUL R9, R8, 1.44",                       # 0x60
    "MUFU.EX2 R9, R9",                         # 0x70
    "MUFU.EX2 R10, R9",                        # 0x80
    "STS [R3], R9",                            # 0x90
    "HMMA.16816.F32.BF16 R12, R4, R6, R12",    # 0xa0
    "@P0 BRA 0x10",                            # 0xb0  loop 1 latch: 9 counted
    "BAR.SYNC.DEFER_BLOCKING 0x0",             # 0xc0  loop 2 head
    "HMMA.16816.F32.BF16 R8, R4, R6, RZ",      # 0xd0
    "ISETP.GE.AND P1, PT, R0, R1, PT",         # 0xe0
    "@P1 BRA 0x100",                           # 0xf0  a forward branch: no loop
    "FSEL R8, R8, -INF, P1",                   # 0x100
    "MUFU.EX2 R9, R8",                         # 0x110
    "HMMA.16816.F32.BF16 R12, R4, R6, R12",    # 0x120
    "@!P0 BRA 0xc0",                           # 0x130 loop 2 latch: 8 counted
    "MUFU.EX2 R1, R2",                         # 0x140 loop 3: no MMA
    "STG.E [R4], R1",                          # 0x150
    "@P2 BRA 0x140",                           # 0x160
    "EXIT",                                    # 0x170
    "BRA 0x180",                               # 0x180 ptxas's closing self-branch: no loop
)


def test_parse_reads_addresses_predicates_opcodes_and_operands():
    ins = ts.parse(LISTING)
    assert len(ins) == 23  # 25 lines, less the NOP and the @!PT placeholder
    assert [i.address for i in ins[:4]] == [0x0, 0x10, 0x20, 0x30]
    hmma = ins[3]
    assert (hmma.base, hmma.opcode, hmma.operands, hmma.predicate) == (
        "HMMA", "HMMA.16816.F32.BF16", "R8, R4, R6, RZ", "")
    latch = next(i for i in ins if i.address == 0xb0)
    assert (latch.base, latch.predicate, latch.operands) == ("BRA", "@P0", "0x10")
    assert not any(i.address in (0x40, 0x50) for i in ins)


def test_loops_are_closed_by_backward_branches_only():
    found = ts.loops(ts.parse(LISTING))
    assert [(lp.start, lp.end) for lp in found] == [(0x10, 0xb0), (0xc0, 0x130), (0x140, 0x160)]
    assert [len(lp.body) for lp in found] == [9, 8, 3]


def test_main_loop_and_its_metrics():
    main = ts.main_loop(ts.parse(LISTING))
    assert (main.start, main.end) == (0x10, 0xb0)
    m = ts.loop_metrics(main, {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8})
    # 9 instructions x 8 warps / 2,048 scores; 2 MUFU x 32 threads x 8 warps / 2,048 scores
    assert m["loop_instructions"] == 9
    assert m["insn_per_1k_scores"] == round(9 * 8 / 2048 * 1000, 1)
    assert m["mufu_per_score"] == 0.25
    assert (m["barriers"], m["shared_ld_st"], m["local_ld_st"]) == (1, 2, 0)  # LDSM + STS
    assert m["mma"] == [{"op": "HMMA", "M": 16, "N": 8, "K": 16, "types": "F32.BF16", "count": 2}]


def test_main_loop_is_the_declared_stage_not_the_smallest():
    """The main loop is the first loop in program order, or the last one when the kernel declares its
    unmasked stage last (the fused forward), whatever their sizes: a rule by size would read whichever
    loop a change made shorter."""
    first = ["BAR.SYNC 0x0", "HMMA.16816.F32 R8, R4, R6, RZ", "MUFU.EX2 R9, R8", "FADD R1, R1, R9",
             "FADD R1, R1, R9", "@P0 BRA 0x0"]
    second = ["HMMA.16816.F32 R8, R4, R6, RZ", "MUFU.EX2 R9, R8", "@P0 BRA 0x60"]
    third = ["HMMA.16816.F32 R8, R4, R6, RZ", "MUFU.EX2 R9, R8", "FADD R1, R1, R9", "FADD R1, R1, R9",
             "@P0 BRA 0x90"]
    ins = ts.parse(sass(*first, *second, *third))
    main = ts.main_loop(ins)
    assert (main.start, len(main.body)) == (0x0, 6)
    last = ts.main_loop(ins, stage="last")
    assert (last.start, len(last.body)) == (0x90, 5)
    with pytest.raises(ValueError, match="first' or 'last"):
        ts.main_loop(ins, stage="smallest")


def test_each_kernel_declares_its_main_stage():
    """The tutorial's flash loop runs its unmasked blocks first; the fused forward runs them first, or
    last where its config puts the masked stage first (MASKED_FIRST): the stage each declares is the one
    its kernel source runs the main loop in (a reorder of either must move its declaration)."""
    import inspect

    from bertscope.kernels import triton_aot, triton_kernel

    src = inspect.getsource(triton_kernel)
    src = src[src.index("def attn_stats_fwd("):]
    # the two stages, in one static loop: stage 0 is the masked one exactly when MASKED_FIRST
    assert "for stage in tl.static_range(2):" in src and "(stage == 0) == MASKED_FIRST" in src
    specs = triton_aot.budget_specialisations()
    for arch in triton_aot.ARCHS:
        for spec in specs:
            assert spec.main_stage(arch) == ("last" if spec.config(arch)["MASKED_FIRST"] else "first")
    assert {spec.main_stage(80) for spec in specs} == {"first", "last"}  # both orders are budgeted
    assert {b.main_stage() for b in triton_aot.baseline_specialisations()} == {"first"}


def test_nested_loops_keep_the_innermost():
    ins = ts.parse(sass("S2R R0, SR_TID.X", "HMMA.16816.F32 R8, R4, R6, RZ", "MUFU.EX2 R9, R8",
                        "@P0 BRA 0x10", "IADD3 R0, R0, 0x1, RZ", "@P1 BRA 0x0"))
    assert sorted((lp.start, lp.end) for lp in ts.loops(ins)) == [(0x0, 0x50), (0x10, 0x30)]
    main = ts.main_loop(ins)
    assert (main.start, main.end) == (0x10, 0x30)


def test_a_loop_without_mma_or_exp2_is_no_main_loop():
    for body in (["MUFU.EX2 R1, R2", "@P0 BRA 0x0"], ["HMMA.16816.F32 R8, R4, R6, RZ", "@P0 BRA 0x0"]):
        try:
            ts.main_loop(ts.parse(sass(*body)))
        except ValueError as e:
            assert "no loop" in str(e)
        else:
            raise AssertionError(f"{body}: a main loop was found")


def test_hopper_wgmma_shapes():
    listing = sass("WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R9, R8",
                   "HGMMA.64x64x16.F32.BF16 R88, R60, gdesc[UR8].tnspB, R88, gsb0",
                   "HGMMA.64x16x16.F32 R56, R64, gdesc[UR12].tnspB, R56", "@P0 BRA 0x0", name="_flash")
    m = ts.loop_metrics(ts.main_loop(ts.parse(listing)), {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8})
    assert [(d["op"], d["M"], d["N"], d["K"], d["types"]) for d in m["mma"]] == [
        ("HGMMA", 64, 128, 16, "F32.BF16"), ("HGMMA", 64, 16, 16, "F32"), ("HGMMA", 64, 64, 16, "F32.BF16")]
    assert m["mufu_per_score"] == round(32 * 8 / (128 * 128), 3)
    assert ts.mma_shape("HMMA.1688.F32.TF32") == {"op": "HMMA", "M": 16, "N": 8, "K": 8, "types": "F32.TF32"}
