"""Differential tests: the numba interpreter against the pure-Python twin on random programs.

Programs come from hypothesis: typed register pools (i64, f32, f16x2, bf16x2, f64), every ALU,
MUFU, conversion and shuffle opcode, guards, if/else diamonds and loops with per-lane trip
counts (divergence and reconvergence). Both engines must leave the same registers and predicates
(NaNs compare equal whatever their payload: the engines do not model payloads).
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.engine.functional import run_functional
from archsim.isa.asm import disassemble
from archsim.isa.builder import Builder
from archsim.isa.check import check_program
from archsim.isa.program import Launch

POOLS = {"i64": range(0, 4), "f32": range(4, 8), "f16x2": range(8, 10), "bf16x2": range(10, 12),
         "f64": range(12, 14)}
BIN = {"i64": ["add", "sub", "mul", "min", "max", "div", "rem"],
       "f32": ["add", "sub", "mul", "min", "max"], "f16x2": ["add", "sub", "mul", "min", "max"],
       "bf16x2": ["add", "sub", "mul", "min", "max"], "f64": ["add", "sub", "mul", "min", "max"]}
BITS = ["and.b64", "or.b64", "xor.b64", "shl.b64", "shr.u64", "shr.s64"]
CVT = [("cvt.f32.f16", "f32", "f16x2"), ("cvt.f32.f16h", "f32", "f16x2"), ("cvt.f32.bf16", "f32", "bf16x2"),
       ("cvt.f32.bf16h", "f32", "bf16x2"), ("cvt.f32.i64", "f32", "i64"), ("cvt.i64.f32", "i64", "f32"),
       ("cvt.f64.f32", "f64", "f32"), ("cvt.f32.f64", "f32", "f64"), ("cvt.f64.i64", "f64", "i64"),
       ("cvt.i64.f64", "i64", "f64")]
MUFU = ["ex2.f32", "lg2.f32", "rcp.f32", "rsqrt.f32", "sqrt.f32", "tanh.f32"]
CMPS = ["eq", "ne", "lt", "le", "gt", "ge"]


def _reg(draw, b, pool):
    return b.regs(0) + draw(st.sampled_from(list(POOLS[pool])))  # Reg(n) via offset from r0


@st.composite
def programs(draw):
    b = Builder("diff", params=())
    base = b.regs(16)  # r0..r15; r14, r15 loop counters
    preds = [b.pred() for _ in range(4)]

    def R(pool):
        return base + draw(st.sampled_from(list(POOLS[pool])))

    def imm(pool):
        if pool == "i64":
            return draw(st.integers(-300, 300))
        return draw(st.floats(min_value=-8, max_value=8, allow_nan=False, width=16))

    # initialise every pool from thread ids so lanes differ
    tid, lane = base + 0, base + 1
    b.s2r(tid, "%tid.x")
    b.s2r(lane, "%laneid")
    b.s2r(base + 2, "%ctaid.x")
    b.mov_b64(base + 3, draw(st.integers(-(2 ** 40), 2 ** 40)))
    for k in POOLS["f32"]:
        b.cvt_f32_i64(base + k, tid)
        b.mul_f32(base + k, base + k, imm("f32"))
    b.cvt_f16x2_f32(base + 8, base + 4, base + 5)
    b.cvt_f16x2_f32(base + 9, base + 6, base + 7)
    b.cvt_bf16x2_f32(base + 10, base + 5, base + 4)
    b.cvt_bf16x2_f32(base + 11, base + 7, base + 6)
    b.cvt_f64_f32(base + 12, base + 4)
    b.cvt_f64_i64(base + 13, tid)
    for i, p in enumerate(preds):
        b.setp_lt_i64(p, lane, draw(st.integers(0, 33)))

    def body(depth, n):
        for _ in range(n):
            kind = draw(st.sampled_from(["bin", "bin", "bin", "fma", "bits", "cvt", "mufu", "setp", "shfl",
                                         "un", "if", "loop", "vote", "selp"]))
            guard = draw(st.sampled_from([None, None, None] + preds[:3]))
            neg = draw(st.booleans())
            if kind == "bin":
                pool = draw(st.sampled_from(list(POOLS)))
                src2 = R(pool) if draw(st.booleans()) else imm(pool)
                b.emit(f"{draw(st.sampled_from(BIN[pool]))}.{pool}", R(pool), R(pool), src2, pred=guard, neg=neg)
            elif kind == "fma":
                pool = draw(st.sampled_from(list(POOLS)))
                m = "mad.i64" if pool == "i64" else f"fma.{pool}"
                b.emit(m, R(pool), R(pool), R(pool) if draw(st.booleans()) else imm(pool), R(pool), pred=guard, neg=neg)
            elif kind == "bits":
                b.emit(draw(st.sampled_from(BITS)), R("i64"), R("i64"),
                       R("i64") if draw(st.booleans()) else draw(st.integers(-70, 70)), pred=guard, neg=neg)
            elif kind == "un":
                pool = draw(st.sampled_from(["f32", "f16x2", "bf16x2", "f64"]))
                b.emit(f"{draw(st.sampled_from(['neg', 'abs']))}.{pool}", R(pool), R(pool), pred=guard, neg=neg)
            elif kind == "cvt":
                m, dst, src = draw(st.sampled_from(CVT))
                b.emit(m, R(dst), R(src), pred=guard, neg=neg)
            elif kind == "mufu":
                b.emit(draw(st.sampled_from(MUFU)), R("f32"), R("f32"), pred=guard, neg=neg)
            elif kind == "setp":
                pool = draw(st.sampled_from(["i64", "f32"]))
                b.emit(f"setp.{draw(st.sampled_from(CMPS))}.{pool}", draw(st.sampled_from(preds)), R(pool),
                       R(pool) if draw(st.booleans()) else imm(pool), pred=guard, neg=neg)
            elif kind == "shfl":
                m = draw(st.sampled_from(["shfl.bfly.b64", "shfl.down.b64", "shfl.up.b64", "shfl.idx.b64"]))
                pool = draw(st.sampled_from(list(POOLS)))
                b.emit(m, R(pool), R(pool), R("i64") if draw(st.booleans()) else draw(st.integers(0, 40)),
                       pred=guard, neg=neg)
            elif kind == "vote":
                b.emit(draw(st.sampled_from(["vote.any.pred", "vote.all.pred"])), draw(st.sampled_from(preds)),
                       draw(st.sampled_from(preds)), pred=guard, neg=neg)
            elif kind == "selp":
                b.selp_b64(R("i64"), R("i64"), draw(st.integers(-5, 5)), draw(st.sampled_from(preds)))
            elif kind == "if" and depth < 2:
                k = len(b)
                b.bra(f"ELSE{k}", pred=draw(st.sampled_from(preds)), neg=neg)
                body(depth + 1, draw(st.integers(0, 3)))
                b.bra(f"JOIN{k}")
                b.label(f"ELSE{k}")
                b.nop()
                body(depth + 1, draw(st.integers(0, 3)))
                b.label(f"JOIN{k}")
                b.nop()
            elif kind == "loop" and depth < 2:
                k = len(b)
                ctr = base + 14 + depth
                b.mov_b64(ctr, 0)
                b.label(f"LOOP{k}")
                body(depth + 1, draw(st.integers(0, 3)))
                b.add_i64(ctr, ctr, 1)
                b.and_b64(base + 3, lane, 3)  # per-lane trip count 1..4: divergent back edge
                b.setp_le_i64(preds[3], ctr, base + 3)
                b.bra(f"LOOP{k}", pred=preds[3])
    body(0, draw(st.integers(1, 14)))
    if draw(st.booleans()):
        b.exit(pred=preds[0])
        body(0, draw(st.integers(0, 4)))
    b.exit()
    return b.build()


def _same(a, b, pool):
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    if pool in ("i64",):
        return np.array_equal(a, b)
    if pool == "f64":
        fa, fb = a.view(np.float64), b.view(np.float64)
        return bool(np.all((a == b) | (np.isnan(fa) & np.isnan(fb))))
    if pool == "f32":
        fa = (a & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
        fb = (b & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
        return bool(np.all((a == b) | (np.isnan(fa) & np.isnan(fb))))
    for sh in (0, 16):  # halves
        ha = (a >> sh) & 0xFFFF
        hb = (b >> sh) & 0xFFFF
        exp_mask, man_mask = (0x7C00, 0x3FF) if pool == "f16x2" else (0x7F80, 0x7F)
        na = ((ha & exp_mask) == exp_mask) & ((ha & man_mask) != 0)
        nb = ((hb & exp_mask) == exp_mask) & ((hb & man_mask) != 0)
        if not np.all((ha == hb) | (na & nb)):
            return False
    return np.array_equal(a >> 32, b >> 32)


@settings(max_examples=int(__import__("os").environ.get("ARCHSIM_DIFF_EXAMPLES", "30")))
@given(programs())
def test_numba_engine_matches_reference_on_random_programs(prog):
    check_program(prog)
    launch = Launch((2, 1, 1), (48, 1, 1))  # a partial second warp in each block
    fast = run_functional(prog, {}, launch, engine="numba")
    slow = run_functional(prog, {}, launch, engine="reference")
    assert fast.warp_instructions == slow.warp_instructions
    assert np.array_equal(fast.preds, slow.preds)
    for pool, regs in POOLS.items():
        for r in regs:
            if not _same(fast.regs[:, r, :], slow.regs[:, r, :], pool):
                w, lane = np.argwhere(fast.regs[:, r, :] != slow.regs[:, r, :])[0]
                raise AssertionError(f"{pool} r{r} warp {w} lane {lane}: numba {int(fast.regs[w, r, lane]):#x} "
                                     f"reference {int(slow.regs[w, r, lane]):#x}\n{disassemble(prog)}")
    for r in (14, 15):
        assert np.array_equal(fast.regs[:, r, :], slow.regs[:, r, :])


def test_integer_division_truncates_at_int64_min():
    """div/rem truncate toward zero at the edge of the range (abs(INT64_MIN) overflows in 64 bits)."""
    b = Builder("divedge", params=())
    r = b.regs(8)
    b.mov_b64(r + 0, -(2 ** 63))
    for k, d in enumerate((2, 3, -3)):
        b.emit("div.i64", r + 1 + 2 * k, r + 0, d)
        b.emit("rem.i64", r + 2 + 2 * k, r + 0, d)
    b.emit("div.i64", r + 7, r + 0, -7)
    b.exit()
    prog = b.build()
    launch = Launch((1, 1, 1), (32, 1, 1))
    want = [-(2 ** 62), 0, -3074457345618258602, -2, 3074457345618258602, -2, 1317624576693539401]
    for engine in ("numba", "reference"):
        got = run_functional(prog, {}, launch, engine=engine).regs[0, 1:8, 0].tolist()
        assert got == want, engine
