"""The pure-Python reference interpreter (archsim/engine/reference.py) against hand / numpy values."""

from __future__ import annotations

import math
import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.engine.launch import GLOBAL_BASE, bf16_bits_to_f32, f32_to_bf16_bits
from archsim.engine.functional import run_functional
from archsim.engine.reference import BF16, F16, F32, _round_float, _round_int, run_reference
from archsim.errors import SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

U64 = (1 << 64) - 1


# ------------------------------------------------------------------------------------- helpers
def kern(body: str, params=(), shared=0, grid="1", block="32") -> str:
    head = [".kernel t"] + [f".param {p}" for p in params] + [f".shared {shared}", f".launch grid={grid} block={block}"]
    return "\n".join(head) + "\n" + body


_ENGINE = {"name": "reference"}


@pytest.fixture(autouse=True, params=["reference", "numba"])
def engine(request):
    """Every semantic test runs on the Python twin and on the numba interpreter (the tests that
    check the twin's own error texts call run_reference directly)."""
    _ENGINE["name"] = request.param
    yield request.param
    _ENGINE["name"] = "reference"


def run(body, args=None, params=None, **kw):
    launch_kw = {k: kw.pop(k) for k in ("shared", "grid", "block") if k in kw}
    args = args or {}
    src = kern(body, tuple(params) if params is not None else tuple(args), **launch_kw)
    if _ENGINE["name"] == "numba":
        return run_functional(assemble(src), args, **kw)
    return run_reference(assemble(src), args, **kw)


def ureg(res, reg, warp=0):
    """A register of every lane of a warp as uint64."""
    return res.regs[warp, reg].view(np.uint64)


def sreg(res, reg, warp=0):
    return res.regs[warp, reg]


def f32reg(res, reg, warp=0):
    return (ureg(res, reg, warp) & 0xFFFFFFFF).astype(np.uint32)


def f32bits(x) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f64bits(x) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def same_float_bits(got: np.ndarray, want: np.ndarray, ftype) -> None:
    """Bit-equal, except that any NaN matches any NaN."""
    g = got.view(ftype)
    w = want.view(ftype)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan), (g, w)
    assert np.array_equal(got[~nan], want[~nan]), (g[~nan], w[~nan])


def line_of(src: str, text: str) -> int:
    for i, line in enumerate(src.splitlines(), start=1):
        if text in line:
            return i
    raise AssertionError(text)


LOAD3 = """
        s2r r0, %laneid
        shl.b64 r1, r0, {sh}
        ldparam r2, a
        add.i64 r2, r2, r1
        ld.global.{w} r3, [r2]
        ldparam r2, b
        add.i64 r2, r2, r1
        ld.global.{w} r4, [r2]
        ldparam r2, c
        add.i64 r2, r2, r1
        ld.global.{w} r5, [r2]
"""


def float_kernel(dt: str) -> str:
    sh, w = (3, "b64") if dt == "f64" else (2, "b32")
    return LOAD3.format(sh=sh, w=w) + f"""
        add.{dt} r10, r3, r4
        sub.{dt} r11, r3, r4
        mul.{dt} r12, r3, r4
        min.{dt} r13, r3, r4
        max.{dt} r14, r3, r4
        fma.{dt} r15, r3, r4, r5
        neg.{dt} r16, r3
        abs.{dt} r17, r3
        add.{dt} r18, r3, 1.5
        exit
"""


# ------------------------------------------------------------------------------------- integers
def test_integer_ops_wraparound_division_shifts():
    res = run("""
        mov.b64 r0, 0x7FFFFFFFFFFFFFFF
        add.i64 r1, r0, 1
        sub.i64 r2, r1, 1
        mul.i64 r3, r0, 3
        mov.b64 r4, -7
        div.i64 r5, r4, 2
        rem.i64 r6, r4, 2
        div.i64 r7, r4, 0
        rem.i64 r8, r4, 0
        div.i64 r9, r1, -1
        rem.i64 r10, r1, -1
        min.i64 r11, r4, 3
        max.i64 r12, r4, 3
        mad.i64 r13, r4, 5, r0
        and.b64 r14, r4, 0xFF
        or.b64 r15, r4, 1
        xor.b64 r16, r4, -1
        not.b64 r17, r4
        shl.b64 r18, r4, 65
        shr.u64 r19, r4, 60
        shr.s64 r20, r4, 1
        shl.b64 r21, r0, 64
        mov.b64 r22, 63
        shl.b64 r23, r22, r22
        mov.b64 r24, 0
        div.i64 r25, r22, r24
        rem.i64 r26, r22, r24
        mov.b64 r27, 7
        div.i64 r28, r27, -2
        rem.i64 r29, r27, -2
        sub.i64 r30, r24, r1
        shr.s64 r31, r1, 127
        exit
""", block="1")
    want = {1: -2**63, 2: 2**63 - 1, 3: 2**63 - 3, 5: -3, 6: -1, 7: -1, 8: -7, 9: -2**63, 10: 0, 11: -7, 12: 3,
            13: 2**63 - 1 - 35, 14: 0xF9, 15: -7, 16: 6, 17: 6, 18: -14, 19: 0xF, 20: -4, 21: 2**63 - 1,
            23: -2**63, 25: -1, 26: 63, 28: -3, 29: 1, 30: -2**63, 31: -1}
    for r, v in want.items():
        assert int(sreg(res, r)[0]) == v, f"r{r}"


def test_setp_integer_signed_and_predicate_logic():
    res = run("""
        s2r r0, %laneid
        sub.i64 r1, r0, 16
        setp.lt.i64 p0, r1, 0
        setp.ge.i64 p1, r1, -3
        setp.eq.i64 p2, r1, 5
        setp.ne.i64 p3, r1, 5
        setp.le.i64 p4, r1, -16
        setp.gt.i64 p5, r1, 14
        and.pred p6, p0, p1
        or.pred p7, p2, p5
        exit
""")
    v = np.arange(32) - 16
    P = res.preds[0]
    assert np.array_equal(P[0], v < 0) and np.array_equal(P[1], v >= -3)
    assert np.array_equal(P[2], v == 5) and np.array_equal(P[3], v != 5)
    assert np.array_equal(P[4], v <= -16) and np.array_equal(P[5], v > 14)
    assert np.array_equal(P[6], (v < 0) & (v >= -3)) and np.array_equal(P[7], (v == 5) | (v > 14))
    res = run("""
        s2r r0, %laneid
        and.b64 r1, r0, 1
        setp.eq.i64 p0, r1, 1
        and.b64 r1, r0, 2
        setp.eq.i64 p1, r1, 2
        xor.pred p2, p0, p1
        not.pred p3, p0
        exit
""")
    lane = np.arange(32)
    assert np.array_equal(res.preds[0, 2], ((lane & 1) == 1) ^ ((lane & 2) == 2))
    assert np.array_equal(res.preds[0, 3], (lane & 1) == 0)


def test_setp_f32_nan_and_zero_rules():
    cmps = ("eq", "ne", "lt", "le", "gt", "ge")
    body = ["mov.f32 r0, nan", "mov.f32 r1, 1.0", "mov.f32 r2, 2.0", "mov.f32 r3, -0.0", "mov.f32 r4, 0.0",
            "mov.f32 r5, -inf"]
    pairs = [("r0", "r1"), ("r1", "r0"), ("r0", "r0"), ("r1", "r2"), ("r3", "r4"), ("r5", "r1")]
    for a, b in pairs:
        lines = body[:6] + [f"setp.{c}.f32 p{j}, {a}, {b}" for j, c in enumerate(cmps)] + ["exit"]
        res = run("\n".join(lines), block="1")
        vals = {"r0": math.nan, "r1": 1.0, "r2": 2.0, "r3": -0.0, "r4": 0.0, "r5": -math.inf}
        x, y = vals[a], vals[b]
        want = [x == y, x != y, x < y, x <= y, x > y, x >= y]
        assert list(res.preds[0, :6, 0]) == want, (a, b)
    # an f32 immediate operand
    res = run("mov.f32 r0, 2.5\nsetp.gt.f32 p0, r0, 2.25\nsetp.lt.f32 p1, r0, nan\nsetp.ne.f32 p2, r0, nan\nexit",
              block="1")
    assert list(res.preds[0, :3, 0]) == [True, False, True]


# ------------------------------------------------------------------------------------- floating point
def _f32_data(rng, n=32):
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)
    return x


def test_f32_arithmetic_against_numpy():
    rng = np.random.default_rng(1)
    a, b, c = _f32_data(rng), _f32_data(rng), _f32_data(rng)
    a[:6] = [np.nan, np.inf, -np.inf, 1e-45, 3e38, 0.0]
    b[:6] = [1.0, -np.inf, 2.0, 1e-45, 3e38, np.nan]
    res = run(float_kernel("f32"), dict(a=a, b=b, c=c))
    with np.errstate(all="ignore"):
        want = {10: a + b, 11: a - b, 12: a * b, 13: np.fmin(a, b), 14: np.fmax(a, b),
                15: (a.astype(np.float64) * b + c).astype(np.float32), 16: -a, 17: np.abs(a),
                18: a + np.float32(1.5)}
    for r, v in want.items():
        same_float_bits(f32reg(res, r), v.astype(np.float32).view(np.uint32), np.float32)
        assert np.all(ureg(res, r) >> np.uint64(32) == 0), f"r{r}: upper 32 bits must be zero"
    # neg / abs flip or clear the sign bit of NaN as well
    assert f32reg(res, 16)[0] == (a.view(np.uint32)[0] ^ 0x80000000)
    assert f32reg(res, 17)[0] == (a.view(np.uint32)[0] & 0x7FFFFFFF)


def test_fma_f32_rounds_once():
    # a*b = 2^-24 - 2^-70 exactly; + (1 + 2^-23) lies just below the f32 halfway point.
    # Computing a*b+c in fp64 first would round onto the tie and then to even (1 + 2^-22);
    # the single rounding the spec asks for gives 1 + 2^-23.
    a = np.float32(1 + 2**-23)
    b = np.float32((1 - 2**-23) * 2**-24)
    c = np.float32(1 + 2**-23)
    assert float(a) * float(b) == 2**-24 - 2**-70
    res = run(f"""
        mov.f32 r0, {f32bits(a):#x}
        mov.f32 r1, {f32bits(b):#x}
        mov.f32 r2, {f32bits(c):#x}
        fma.f32 r3, r0, r1, r2
        mul.f32 r4, r0, r1
        add.f32 r4, r4, r2
        mov.f32 r5, {f32bits(1 + 2**-12):#x}
        mov.f32 r6, -1.0
        fma.f32 r7, r5, r5, r6
        mul.f32 r8, r5, r5
        add.f32 r8, r8, r6
        fma.f32 r9, r6, 0.0, r6
        mov.f32 r10, inf
        fma.f32 r11, r10, 0.0, r6
        mov.f32 r12, 3e38
        fma.f32 r13, r12, r12, r6
        exit
""", block="1")
    assert f32reg(res, 3)[0] == 0x3F800001
    assert f32reg(res, 4)[0] == 0x3F800002  # two roundings: product, then sum
    assert f32reg(res, 7)[0] == f32bits(2**-11 + 2**-24)  # fused: the 2^-24 survives
    assert f32reg(res, 8)[0] == f32bits(2**-11)
    assert f32reg(res, 9)[0] == f32bits(-1.0)  # -1*0 + -1
    assert math.isnan(struct.unpack("<f", struct.pack("<I", int(f32reg(res, 11)[0])))[0])
    assert f32reg(res, 13)[0] == 0x7F800000  # overflow to +inf


def test_f64_arithmetic_against_numpy():
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(32) * np.exp2(rng.integers(-300, 300, 32)) for _ in range(3))
    a[:4] = [np.nan, np.inf, -0.0, 5e-324]
    b[:4] = [1.0, -np.inf, np.nan, 5e-324]
    res = run(float_kernel("f64"), dict(a=a, b=b, c=c))
    with np.errstate(all="ignore"):
        want = {10: a + b, 11: a - b, 12: a * b, 13: np.fmin(a, b), 14: np.fmax(a, b), 15: a * b + c, 16: -a,
                17: np.abs(a), 18: a + 1.5}
    for r, v in want.items():
        same_float_bits(ureg(res, r), v.view(np.uint64), np.float64)
    assert ureg(res, 16)[0] == a.view(np.uint64)[0] ^ np.uint64(1 << 63)


def test_float_min_max_nan_and_signed_zero():
    res = run("""
        mov.f32 r0, nan
        mov.f32 r1, -0.0
        mov.f32 r2, 0.0
        min.f32 r3, r0, r1
        max.f32 r4, r2, r0
        min.f32 r5, r1, r2
        min.f32 r6, r2, r1
        max.f32 r7, r1, r2
        max.f32 r8, r2, r1
        min.f64 r9, r10, -0.0
        max.f64 r11, r10, -0.0
        mov.f16x2 r12, 0x7E00BC00
        mov.f16x2 r13, 0x3C007E00
        min.f16x2 r14, r12, r13
        exit
""", block="1")
    assert f32reg(res, 3)[0] == 0x80000000 and f32reg(res, 4)[0] == 0
    assert [f32reg(res, r)[0] for r in (5, 6, 7, 8)] == [0x80000000, 0x80000000, 0, 0]
    assert ureg(res, 9)[0] == 1 << 63 and ureg(res, 11)[0] == 0
    assert ureg(res, 14)[0] == 0x3C00BC00  # each half: a NaN yields the other operand


def _half_data(rng, n=64):
    return (rng.standard_normal(n) * np.exp2(rng.integers(-6, 6, n))).astype(np.float32)


@pytest.mark.parametrize("dt", ["f16x2", "bf16x2"])
def test_packed_half_arithmetic_against_numpy(dt):
    rng = np.random.default_rng(3)
    if dt == "f16x2":
        a, b, c = (_half_data(rng).astype(np.float16) for _ in range(3))
        a[:4] = [np.nan, np.inf, 60000, 1e-7]
        b[:4] = [1.0, 2.0, 60000, 1e-7]
        bits = [x.view(np.uint16) for x in (a, b, c)]
        fa, fb, fc = (x.astype(np.float32) for x in (a, b, c))

        def to_bits(f32):
            return f32.astype(np.float16).view(np.uint16)
    else:
        # values with few exponents so that a*b+c is exact in fp32 (the oracle rounds fp32 -> bf16 once)
        def mk():
            m = rng.integers(128, 256, 64) * rng.choice([-1, 1], 64)
            return f32_to_bf16_bits(np.ldexp(m.astype(np.float32), -7))
        bits = [mk(), mk(), mk()]
        bits[0][:2] = [0x7FC0, 0x7F80]
        fa, fb, fc = (bf16_bits_to_f32(x) for x in bits)

        def to_bits(f32):
            return f32_to_bf16_bits(f32)
    args = {k: v.copy() for k, v in zip("abc", bits)}
    res = run(float_kernel(dt), args)
    imm = np.float32(1.5)
    with np.errstate(all="ignore"):
        want = {10: to_bits(fa + fb), 11: to_bits(fa - fb), 12: to_bits(fa * fb),
                13: np.where(np.isnan(fa) | (fb < fa), bits[1], bits[0]),
                14: np.where(np.isnan(fa) | (fb > fa), bits[1], bits[0]),
                15: to_bits((fa.astype(np.float64) * fb + fc).astype(np.float32)),
                16: bits[0] ^ 0x8000, 17: bits[0] & 0x7FFF, 18: to_bits(fa + imm)}
    ftype = np.float16 if dt == "f16x2" else None
    for r, v in want.items():
        got = ureg(res, r)
        assert np.all(got >> np.uint64(32) == 0)
        halves = np.stack([got & np.uint64(0xFFFF), got >> np.uint64(16)], axis=1).ravel().astype(np.uint16)
        v = np.asarray(v, dtype=np.uint16)
        if ftype is not None:
            same_float_bits(halves, v, ftype)
        else:
            nan = np.isnan(bf16_bits_to_f32(v))
            assert np.array_equal(np.isnan(bf16_bits_to_f32(halves)), nan)
            assert np.array_equal(halves[~nan], v[~nan]), f"r{r}"


def test_packed_half_fma_rounds_once_in_half_format():
    # (1+2^-6)^2 - 1 = 2^-5 + 2^-12 exactly (an f16); an unfused f16 mul rounds the square to 1 + 2^-5 first
    x = np.float16(1 + 2**-6)
    want = np.float16(np.float64(x) * np.float64(x) - 1.0)
    assert float(want) == 2**-5 + 2**-12
    y = f32_to_bf16_bits(np.array([1 + 2**-4], np.float32))[0]  # bf16: (1+2^-4)^2 - 1 = 2^-3 + 2^-8 exactly
    res = run(f"""
        mov.f16x2 r0, {int(x.view(np.uint16)) * 0x10001:#x}
        mov.f16x2 r1, -1.0
        fma.f16x2 r2, r0, r0, r1
        mul.f16x2 r3, r0, r0
        add.f16x2 r3, r3, r1
        mov.bf16x2 r4, {int(y) * 0x10001:#x}
        mov.bf16x2 r5, -1.0
        fma.bf16x2 r6, r4, r4, r5
        exit
""", block="1")
    assert ureg(res, 2)[0] == int(want.view(np.uint16)) * 0x10001
    assert ureg(res, 3)[0] == int(np.float16(2**-5).view(np.uint16)) * 0x10001
    assert ureg(res, 6)[0] == int(f32_to_bf16_bits(np.array([2**-3 + 2**-8], np.float32))[0]) * 0x10001


def test_mufu_against_numpy():
    x = np.array([0.0, -0.0, 1.0, 2.5, -3.25, 1e-40, 1e30, -1e30, np.inf, -np.inf, np.nan, 0.1, 100.0, -100.0,
                  4.0, 0.5] * 2, dtype=np.float32)
    res = run("""
        s2r r0, %laneid
        shl.b64 r1, r0, 2
        ldparam r2, a
        add.i64 r2, r2, r1
        ld.global.b32 r3, [r2]
        ex2.f32 r10, r3
        lg2.f32 r11, r3
        rcp.f32 r12, r3
        rsqrt.f32 r13, r3
        sqrt.f32 r14, r3
        tanh.f32 r15, r3
        exit
""", dict(a=x))
    d = x.astype(np.float64)
    with np.errstate(all="ignore"):
        want = {10: np.exp2(d), 11: np.log2(d), 12: 1.0 / d, 13: 1.0 / np.sqrt(d), 14: np.sqrt(d), 15: np.tanh(d)}
    for r, v in want.items():
        with np.errstate(all="ignore"):
            same_float_bits(f32reg(res, r), v.astype(np.float32).view(np.uint32), np.float32)
    f = f32reg(res, 11).view(np.float32)
    assert f[0] == -np.inf and np.isnan(f[4])
    r = f32reg(res, 12).view(np.float32)
    assert r[0] == np.inf and r[1] == -np.inf
    assert f32reg(res, 13).view(np.float32)[1] == -np.inf


# ------------------------------------------------------------------------------------- conversions
def test_cvt_half_formats():
    res = run("""
        mov.b64 r0, 0x3C00C000
        cvt.f32.f16 r1, r0
        cvt.f32.f16h r2, r0
        mov.b64 r3, 0x3F80C040
        cvt.f32.bf16 r4, r3
        cvt.f32.bf16h r5, r3
        mov.f32 r6, 65520.0
        mov.f32 r7, 0.33333334
        cvt.f16x2.f32 r8, r6, r7
        mov.f32 r9, nan
        mov.f32 r10, -0.0
        cvt.f16x2.f32 r11, r9, r10
        mov.f32 r12, 65519.0
        mov.f32 r13, 1e-8
        cvt.f16x2.f32 r14, r12, r13
        cvt.bf16x2.f32 r15, r7, r9
        mov.f32 r16, 3.4e38
        cvt.bf16x2.f32 r17, r16, r13
        mov.b64 r18, 0x00017C01
        cvt.f32.f16 r19, r18
        cvt.f32.f16h r20, r18
        exit
""", block="1")
    f16 = lambda v: int(np.float16(v).view(np.uint16))  # noqa: E731  (numpy rounds f32 -> f16 correctly)
    assert f32reg(res, 1)[0] == f32bits(-2.0) and f32reg(res, 2)[0] == f32bits(1.0)
    assert f32reg(res, 4)[0] == f32bits(-3.0) and f32reg(res, 5)[0] == f32bits(1.0)
    assert ureg(res, 8)[0] == 0x7C00 | (f16(np.float32(0.33333334)) << 16)  # 65520 is the tie -> even = inf
    assert ureg(res, 11)[0] == 0x7E00 | (0x8000 << 16)
    assert ureg(res, 14)[0] == 0x7BFF | (f16(np.float32(1e-8)) << 16)
    bf16 = lambda v: int(f32_to_bf16_bits(np.array([v], np.float32))[0])  # noqa: E731
    third = bf16(0.33333334)
    assert ureg(res, 15)[0] == third | (0x7FC0 << 16)
    big = bf16(3.4e38)
    assert big == 0x7F80 and ureg(res, 17)[0] == big | (bf16(1e-8) << 16)
    nan19 = int(f32reg(res, 19)[0])
    assert (nan19 & 0x7F800000) == 0x7F800000 and nan19 & 0x7FFFFF  # f16 NaN -> f32 NaN
    if _ENGINE["name"] == "reference":
        assert nan19 == 0x7F802000  # the twin keeps the payload, shifted; the numba engine canonicalizes
    assert f32reg(res, 20)[0] == f32bits(2.0**-24)  # smallest f16 subnormal, exact


def test_cvt_integer_and_f64():
    big = 2**60 + 2**36 + 1
    res = run(f"""
        mov.b64 r0, {big}
        cvt.f32.i64 r1, r0
        mov.b64 r2, {-(2**24 + 1)}
        cvt.f32.i64 r3, r2
        mov.b64 r4, {2**24 + 3}
        cvt.f32.i64 r5, r4
        mov.f32 r6, 1e20
        cvt.i64.f32 r7, r6
        mov.f32 r8, -1e20
        cvt.i64.f32 r9, r8
        mov.f32 r10, nan
        cvt.i64.f32 r11, r10
        mov.f32 r12, -2.75
        cvt.i64.f32 r13, r12
        mov.f32 r14, inf
        cvt.i64.f32 r15, r14
        mov.f32 r16, -9.223372036854775808e18
        cvt.i64.f32 r17, r16
        mov.f64 r18, 1e300
        cvt.i64.f64 r19, r18
        mov.f64 r20, -0.5
        cvt.i64.f64 r21, r20
        mov.f64 r22, 9223372036854774784.0
        cvt.i64.f64 r23, r22
        mov.f64 r24, -inf
        cvt.i64.f64 r25, r24
        mov.f32 r26, 0.1
        cvt.f64.f32 r27, r26
        mov.f64 r28, 0.1
        cvt.f32.f64 r29, r28
        mov.f64 r30, 1e300
        cvt.f32.f64 r31, r30
        mov.f64 r32, -1e-300
        cvt.f32.f64 r33, r32
        mov.b64 r34, {2**53 + 1}
        cvt.f64.i64 r35, r34
        mov.b64 r36, 0x7FFFFFFFFFFFFFFF
        cvt.f64.i64 r37, r36
        mov.f64 r38, nan
        cvt.i64.f64 r39, r38
        mov.f64 r40, 123.9
        cvt.i64.f64 r41, r40
        exit
""", block="1")
    u = lambda r: int(ureg(res, r)[0])  # noqa: E731
    s = lambda r: int(sreg(res, r)[0])  # noqa: E731
    assert u(1) == f32bits(2.0**60 + 2.0**37)  # one rounding (via fp64 it would tie down to 2^60)
    assert u(3) == f32bits(-(2.0**24)) and u(5) == f32bits(2.0**24 + 4)
    assert s(7) == 2**63 - 1 and s(9) == -2**63 and s(11) == 0 and s(13) == -2 and s(15) == 2**63 - 1
    assert s(17) == -2**63
    assert s(19) == 2**63 - 1 and s(21) == 0 and s(23) == 9223372036854774784 and s(25) == -2**63
    assert u(27) == f64bits(float(np.float32(0.1)))
    assert u(29) == f32bits(float(np.float32(0.1))) and u(31) == 0x7F800000 and u(33) == 0x80000000
    assert u(35) == f64bits(2.0**53) and u(37) == f64bits(2.0**63)
    assert s(39) == 0 and s(41) == 123


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, width=64))
def test_rounding_helper_matches_numpy(x):
    # the rounding the interpreter uses for f32 / f16 / bf16 results, against numpy's correctly rounded casts
    with np.errstate(all="ignore"):
        assert _round_float(x, F32) == int(np.array([x]).astype(np.float32).view(np.uint32)[0])
        assert _round_float(x, F16) == int(np.array([x]).astype(np.float16).view(np.uint16)[0])
        f = np.float32(x)
        assert _round_float(float(f), BF16) == int(f32_to_bf16_bits(np.array([f]))[0])


@settings(max_examples=200, deadline=None)
@given(st.integers(-2**63, 2**63 - 1))
def test_integer_to_f32_rounds_once(v):
    assert _round_int(v, F32) == int(np.array([v], np.int64).astype(np.float32).view(np.uint32)[0])


# ------------------------------------------------------------------------------------- warps
def test_shuffles():
    res = run("""
        s2r r0, %laneid
        mul.i64 r1, r0, 10
        shfl.bfly.b64 r2, r1, 5
        shfl.down.b64 r3, r1, 3
        shfl.up.b64 r4, r1, 3
        shfl.idx.b64 r5, r1, 7
        and.b64 r6, r0, 7
        shfl.idx.b64 r7, r1, r6
        shfl.down.b64 r8, r1, r0
        and.b64 r9, r0, 1
        setp.eq.i64 p0, r9, 0
   @p0  shfl.bfly.b64 r10, r1, 1
        mov.b64 r11, r1
        shfl.down.b64 r11, r11, 1
        shfl.idx.b64 r12, r1, -1
        exit
""")
    lane = np.arange(32)
    v = lane * 10
    s = lambda r: sreg(res, r)  # noqa: E731
    assert np.array_equal(s(2), v[lane ^ 5])
    assert np.array_equal(s(3), np.where(lane + 3 < 32, v[np.minimum(lane + 3, 31)], v))
    assert np.array_equal(s(4), np.where(lane >= 3, v[np.maximum(lane - 3, 0)], v))
    assert np.array_equal(s(5), np.full(32, 70))
    assert np.array_equal(s(7), v[lane & 7])
    assert np.array_equal(s(8), np.where(2 * lane < 32, v[np.minimum(2 * lane, 31)], v))
    # even lanes read their odd neighbours, which are not active; odd lanes are not written
    assert np.array_equal(s(10), np.where(lane % 2 == 0, v[lane ^ 1], 0))
    assert np.array_equal(s(11), np.where(lane < 31, v[np.minimum(lane + 1, 31)], v))  # all reads before writes
    assert np.array_equal(s(12), v)


def test_shuffle_inside_divergent_path_reads_inactive_lanes():
    res = run("""
        s2r r0, %laneid
        mul.i64 r1, r0, 3
        setp.lt.i64 p0, r0, 16
   @p0  bra LOW
        shfl.idx.b64 r2, r1, 0
        bra END
LOW:    shfl.idx.b64 r2, r1, 31
END:    exit
""")
    lane = np.arange(32)
    assert np.array_equal(sreg(res, 2), np.where(lane < 16, 93, 0))


def test_vote():
    res = run("""
        s2r r0, %laneid
        setp.lt.i64 p0, r0, 5
        vote.any.pred p1, p0
        vote.all.pred p2, p0
        setp.lt.i64 p3, r0, 16
   @p3  vote.all.pred p4, p0
   @p0  vote.all.pred p5, p3
   @!p0 vote.any.pred p6, p0
        exit
""")
    lane = np.arange(32)
    P = res.preds[0]
    assert P[1].all() and not P[2].any()
    assert not P[4].any()
    assert np.array_equal(P[5], lane < 5)
    assert not P[6].any()


def test_divergent_if_else_reconverges():
    res = run("""
        s2r r0, %laneid
        and.b64 r1, r0, 1
        setp.eq.i64 p0, r1, 0
   @p0  bra EVEN
        mov.b64 r2, 100
        add.i64 r2, r2, r0
        bra JOIN
EVEN:   mov.b64 r2, 200
JOIN:   add.i64 r3, r2, 1
        s2r r4, %clock
        exit
""")
    lane = np.arange(32)
    assert np.array_equal(sreg(res, 3), np.where(lane % 2 == 0, 201, 101 + lane))
    assert np.array_equal(sreg(res, 4), np.full(32, 9))  # both paths joined before JOIN
    assert res.warp_instructions == 11


def test_nested_divergence_in_loop_with_per_lane_trip_counts():
    res = run("""
        s2r r0, %laneid
        rem.i64 r1, r0, 5
        add.i64 r1, r1, 1
        mov.b64 r2, 0
        mov.b64 r3, 0
LOOP:   and.b64 r4, r2, 1
        setp.eq.i64 p1, r4, 0
   @p1  bra EVEN
        add.i64 r3, r3, r2
        bra NEXT
EVEN:   mul.i64 r5, r2, 3
        setp.gt.i64 p2, r0, 15
  @!p2  bra SKIP
        add.i64 r5, r5, 1000
SKIP:   add.i64 r3, r3, r5
NEXT:   add.i64 r2, r2, 1
        setp.lt.i64 p0, r2, r1
   @p0  bra LOOP
        s2r r6, %clock
        exit
""")
    want = []
    for lane in range(32):
        acc = 0
        for i in range(lane % 5 + 1):
            acc += i if i % 2 else 3 * i + (1000 if lane > 15 else 0)
        want.append(acc)
    assert np.array_equal(sreg(res, 3), want)
    assert np.array_equal(sreg(res, 2), np.arange(32) % 5 + 1)
    assert len(set(sreg(res, 6).tolist())) == 1  # every lane reads %clock together after the loop


def test_paths_that_only_reconverge_at_exit():
    res = run("""
        s2r r0, %laneid
        setp.lt.i64 p0, r0, 8
   @p0  bra A
        mov.b64 r1, 1
        exit
A:      mov.b64 r1, 2
        exit
""")
    assert int(assemble(kern("        s2r r0, %laneid\n        setp.lt.i64 p0, r0, 8\n   @p0  bra A\n"
                             "        exit\nA:      exit\n")).reconv[2]) == -1
    assert np.array_equal(sreg(res, 1), np.where(np.arange(32) < 8, 2, 1))
    assert res.warp_instructions == 7


def test_while_loop_with_divergent_exit_branch():
    res = run("""
        s2r r0, %laneid
        mov.b64 r1, 0
LOOP:   setp.ge.i64 p0, r1, r0
   @p0  bra DONE
        add.i64 r1, r1, 2
        bra LOOP
DONE:   s2r r2, %clock
        exit
""")
    lane = np.arange(32)
    assert np.array_equal(sreg(res, 1), lane + lane % 2)
    assert len(set(sreg(res, 2).tolist())) == 1  # reconverged at DONE
    assert res.warp_instructions == 2 + 16 * 4 + 2 + 2


def test_exit_inside_loop():
    res = run("""
        s2r r0, %laneid
        mov.b64 r3, 0
AGAIN:  add.i64 r3, r3, 1
        setp.ge.i64 p1, r3, r0
   @p1  exit
        bra AGAIN
""")
    assert np.array_equal(sreg(res, 3), np.maximum(np.arange(32), 1))
    assert res.warp_instructions == 2 + 31 * 3 + 30  # the last trip exits before bra


def test_shared_memory_tree_reduction_barrier_in_loop():
    res = run("""
        s2r r0, %tid.x
        shl.b64 r1, r0, 3
        st.shared.b64 [r1], r0
        bar.sync
        mov.b64 r2, 64
LOOP:   setp.lt.i64 p0, r0, r2
  @!p0  bra SKIP
        add.i64 r3, r0, r2
        shl.b64 r3, r3, 3
        ld.shared.b64 r4, [r3]
        ld.shared.b64 r5, [r1]
        add.i64 r5, r5, r4
        st.shared.b64 [r1], r5
SKIP:   bar.sync
        shr.u64 r2, r2, 1
        setp.gt.i64 p1, r2, 0
   @p1  bra LOOP
        ld.shared.b64 r6, [0]
        exit
""", block="128", shared=1024)
    assert np.all(res.regs[:, 6, :] == 127 * 128 // 2)


def test_mov_copies_all_64_bits():
    res = run("""
        mov.b64 r0, 0x123456789ABCDEF0
        mov.f32 r1, r0
        mov.f16x2 r2, r0
        mov.f64 r3, r0
        mov.f32 r4, 0xFFFFFFFF00000001
        exit
""", block="1")
    assert [int(ureg(res, r)[0]) for r in (1, 2, 3)] == [0x123456789ABCDEF0] * 3
    assert int(ureg(res, 4)[0]) == 0xFFFFFFFF00000001  # a hex immediate is the raw bit pattern


def test_guarded_exit_and_lanes_past_block():
    res = run("""
        s2r r0, %laneid
        setp.lt.i64 p0, r0, 10
   @p0  exit
        mov.b64 r1, 7
        ldparam r2, out
        shl.b64 r3, r0, 3
        add.i64 r2, r2, r3
        st.global.b64 [r2], r1
        setp.lt.i64 p1, r0, 20
   @p1  bra SKIP
        mov.b64 r4, 9
SKIP:   exit
""", dict(out=np.zeros(40, np.int64)), block="40")
    lane = np.arange(32)
    assert np.array_equal(sreg(res, 1, 0), np.where(lane < 10, 0, 7))
    assert np.array_equal(sreg(res, 4, 0), np.where(lane >= 20, 9, 0))
    assert np.array_equal(sreg(res, 0, 1), np.where(lane < 8, lane, 0))  # warp 1: 8 live lanes
    out = res.output("out")
    assert np.array_equal(out[:32], np.where(lane < 10, 0, 7)) and not out[32:].any()  # warp 1: lanes 0..7 exit


def test_special_registers_3d_launch():
    launch = Launch((2, 2, 2), (4, 3, 3))
    res = run("""
        s2r r0, %tid.x
        s2r r1, %tid.y
        s2r r2, %tid.z
        s2r r3, %ntid.x
        s2r r4, %ntid.y
        s2r r5, %ntid.z
        s2r r6, %ctaid.x
        s2r r7, %ctaid.y
        s2r r8, %ctaid.z
        s2r r9, %nctaid.x
        s2r r10, %nctaid.y
        s2r r11, %nctaid.z
        s2r r12, %laneid
        s2r r13, %warpid
        s2r r14, %nwarpid
        s2r r15, %clock
        s2r r16, %coreid
        exit
""", launch=launch, ncores=3)
    assert res.regs.shape == (16, 17, 32)
    for blk in range(8):
        for w in range(2):
            for lane in range(32):
                t = w * 32 + lane
                r = res.regs[blk * 2 + w, :, lane]
                if t >= 36:
                    assert not r.any()
                    continue
                assert list(r[:3]) == [t % 4, (t // 4) % 3, t // 12]
                assert list(r[3:6]) == [4, 3, 3]
                assert list(r[6:9]) == [blk % 2, (blk // 2) % 2, blk // 4]
                assert list(r[9:12]) == [2, 2, 2]
                assert list(r[12:17]) == [lane, w, 2, 15, blk % 3]
    assert res.warp_instructions == 16 * 18


def test_instruction_count_includes_guarded_off_and_narrow_warps():
    res = run("""
        mov.b64 r0, 1
        setp.eq.i64 p0, r0, 2
   @p0  add.i64 r0, r0, 1
        s2r r1, %laneid
        shfl.bfly.b64 r2, r1, 1
        shfl.idx.b64 r3, r1, 6
        exit
""", block="20", warp_width=8)
    assert res.regs.shape == (3, 4, 8)
    assert res.warp_instructions == 21
    assert np.array_equal(res.regs[2, 1], [0, 1, 2, 3, 0, 0, 0, 0])
    assert np.array_equal(res.regs[0, 2], np.arange(8) ^ 1) and np.array_equal(res.regs[0, 3], np.full(8, 6))
    assert np.array_equal(res.regs[2, 2], [1, 0, 3, 2, 0, 0, 0, 0])
    assert not res.regs[2, 3].any()  # lanes past the block never ran: their registers read as 0


# ------------------------------------------------------------------------------------- barriers
def test_bar_sync_orders_scratchpad_traffic():
    res = run("""
        s2r r0, %tid.x
        shl.b64 r1, r0, 3
        st.shared.b64 [r1], r0
        bar.sync
        add.i64 r2, r0, 32
        and.b64 r2, r2, 63
        shl.b64 r2, r2, 3
        ld.shared.b64 r3, [r2]
        exit
""", block="64", shared=512)
    tid = np.arange(64).reshape(2, 32)
    assert np.array_equal(res.regs[:, 3, :], (tid + 32) % 64)


def test_bar_grid_orders_global_traffic():
    res = run("""
        s2r r0, %ctaid.x
        s2r r1, %tid.x
        shl.b64 r2, r0, 5
        add.i64 r2, r2, r1
        ldparam r3, buf
        shl.b64 r4, r2, 3
        add.i64 r4, r3, r4
        add.i64 r5, r2, 100
        st.global.b64 [r4], r5
        bar.grid
        xor.b64 r6, r0, 1
        shl.b64 r6, r6, 5
        add.i64 r6, r6, r1
        shl.b64 r6, r6, 3
        add.i64 r6, r3, r6
        ld.global.b64 r7, [r6]
        exit
""", dict(buf=np.zeros(64, np.int64)), grid="2")
    gid = np.arange(64).reshape(2, 32)
    assert np.array_equal(res.regs[:, 7, :], gid[::-1] + 100)


DEADLOCK = """
        s2r r0, %warpid
        setp.eq.i64 p0, r0, 1
   @p0  exit
        bar.sync
        exit
"""


def test_deadlock_barrier_after_warp_exit():
    src = kern(DEADLOCK, block="64")
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(src), {})
    assert e.value.where == f"<asm>:{line_of(src, 'bar.sync')}"
    assert "deadlock" in e.value.what and "block 0 warp 0" in e.value.what and "bar.sync" in e.value.what
    assert e.value.partial is not None


def test_deadlock_grid_barrier_and_mixed_barriers():
    src = kern(DEADLOCK.replace("%warpid", "%ctaid.x").replace("bar.sync", "bar.grid"), grid="3")
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(src), {})
    assert "deadlock" in e.value.what and "bar.grid" in e.value.what
    mixed = kern("""
        s2r r0, %warpid
        setp.eq.i64 p0, r0, 1
   @p0  bra GRID
        bar.sync
        exit
GRID:   bar.grid
        exit
""", block="64")
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(mixed), {})
    assert "nothing can make progress" in e.value.what


# ------------------------------------------------------------------------------------- memory
def test_load_store_every_width_and_sign():
    data = np.arange(64, dtype=np.uint8) * 7 + 0x80
    res = run("""
        ldparam r0, src
        ld.global.u8 r1, [r0+3]
        ld.global.u16 r2, [r0+2]
        ld.global.s32 r3, [r0+4]
        ld.global.b32 r4, [r0+4]
        ld.global.b64 r5, [r0+8]
        ld.global.v2.b32 r6, [r0+8]
        ld.global.v4.b32 r8, [r0+16]
        ldparam r20, out
        mov.b64 r21, -1
        st.global.b8 [r20+1], r21
        st.global.b16 [r20+2], r5
        st.global.b32 [r20+4], r5
        st.global.b64 [r20+8], r5
        st.global.v2.b32 [r20+16], r8
        st.global.v4.b32 [r20+32], r8
        st.shared.b64 [0], r5
        st.shared.v4.b32 [16], r8
        st.shared.b16 [34], r21
        ld.shared.s32 r12, [0]
        ld.shared.u8 r13, [7]
        ld.shared.v2.b32 r14, [16]
        ld.shared.b64 r16, [24]
        ld.shared.u16 r17, [34]
        ld.shared.b32 r18, [32]
        exit
""", dict(src=data, out=np.zeros(48, np.uint8)), block="1", shared=64)
    u = lambda r: int(ureg(res, r)[0])  # noqa: E731
    raw = data.tobytes()
    le = lambda o, n: int.from_bytes(raw[o:o + n], "little")  # noqa: E731
    assert u(1) == raw[3] and u(2) == le(2, 2) and u(4) == le(4, 4) and u(5) == le(8, 8)
    assert int(sreg(res, 3)[0]) == np.frombuffer(raw[4:8], np.int32)[0] and int(sreg(res, 3)[0]) < 0
    assert [u(6), u(7)] == [le(8, 4), le(12, 4)]
    assert [u(r) for r in range(8, 12)] == [le(16 + 4 * j, 4) for j in range(4)]
    out = res.output("out").tobytes()
    want = bytearray(48)
    want[1] = 0xFF
    want[2:4] = raw[8:10]
    want[4:8] = raw[8:12]
    want[8:16] = raw[8:16]
    want[16:24] = raw[16:24]
    want[32:48] = raw[16:32]
    assert out == bytes(want)
    assert int(sreg(res, 12)[0]) == np.frombuffer(raw[8:12], np.int32)[0]
    assert u(13) == raw[15] and [u(14), u(15)] == [le(16, 4), le(20, 4)] and u(16) == le(24, 8)
    assert u(17) == 0xFFFF and u(18) == 0xFFFF0000


FAULTS = [
    ("mov.b64 r1, 0\n        ld.global.b32 r2, [r1]", "ld.global.b32", "lane 0", "outside"),
    ("ldparam r1, buf\n        ld.global.b32 r2, [r1+64]", "ld.global.b32", "lane 0", "outside"),
    ("ldparam r1, buf\n        st.global.b32 [r1-4], r0", "st.global.b32", "lane 0", "outside"),
    ("ldparam r1, buf\n        ld.global.v4.b32 r2, [r1+8]", "ld.global.v4", "lane 0", "aligned to 16"),
    ("ld.shared.b64 r2, [64]", "ld.shared.b64", "lane 0", "outside"),
    ("ld.shared.b64 r2, [-8]", "ld.shared.b64", "lane 0", "outside"),
    ("ldmatrix.x1 r2, [8]", "ldmatrix.x1", "lane 0", "aligned to 16"),
    ("mov.b64 r1, 0\n        mov.b64 r2, 8\n        mov.b64 r3, 5\n        rma.put [r1], [r1], r2, r3", "rma.put",
     "block 5", "does not exist"),
    ("mov.b64 r1, 60\n        mov.b64 r2, 8\n        dma.get [r1], [r1], r2", "dma.get", "lane 0", "outside"),
]


@pytest.mark.parametrize("body,at,who,what", FAULTS)
def test_runtime_faults(body, at, who, what):
    src = kern("        s2r r0, %laneid\n        " + body + "\n        exit\n", ("buf",), shared=64)
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(src), dict(buf=np.zeros(16, np.float32)))
    assert e.value.where == f"<asm>:{line_of(src, at)}"
    assert who in e.value.what and what in e.value.what and "block 0" in e.value.what, e.value.what


def test_misaligned_fault_names_the_lane():
    src = kern("""
        s2r r0, %laneid
        setp.eq.i64 p0, r0, 5
        mov.b64 r1, 2
        selp.b64 r1, r1, 0, p0
        ldparam r2, buf
        shl.b64 r3, r0, 2
        add.i64 r2, r2, r3
        add.i64 r2, r2, r1
        st.global.b32 [r2], r0
        exit
""", ("buf",), grid="2")
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(src), dict(buf=np.zeros(40, np.float32)))
    assert "block 0 warp 0 lane 5" in e.value.what and "aligned to 4" in e.value.what
    assert hex(GLOBAL_BASE + 22) in e.value.what


def test_instruction_limit():
    src = kern("L:      bra L\n        exit\n")
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(src), {}, max_instructions=1000)
    assert "1000" in e.value.what and e.value.where == f"<asm>:{line_of(src, 'bra L')}"


# ------------------------------------------------------------------------------------- bulk copies
def test_cp_async():
    src = (np.arange(128, dtype=np.uint64) * 2654435761 % (2**32)).astype(np.uint32)
    res = run("""
        s2r r0, %laneid
        shl.b64 r1, r0, 4
        ldparam r2, src
        add.i64 r2, r2, r1
        cp.async.16 [r1], [r2]
        cp.async.8 [r1+512], [r2]
        cp.async.4 [r1+1024], [r2+12]
        cp.async.commit
        cp.async.wait 0
        add.i64 r3, r0, 1
        and.b64 r3, r3, 31
        shl.b64 r3, r3, 4
        ld.shared.v4.b32 r4, [r3]
        ldparam r8, out
        add.i64 r8, r8, r1
        st.global.v4.b32 [r8], r4
        ld.shared.b64 r9, [r1+512]
        ld.shared.b32 r10, [r1+1024]
        exit
""", dict(src=src.view(np.int32), out=np.zeros(128, np.int32)), shared=2048)
    assert np.array_equal(res.output("out").view(np.uint32), np.roll(src.reshape(32, 4), -1, axis=0).ravel())
    s = src.reshape(32, 4).astype(np.uint64)
    assert np.array_equal(ureg(res, 9), s[:, 0] | (s[:, 1] << np.uint64(32)))
    assert np.array_equal(ureg(res, 10), s[:, 3])


def test_dma_get_put_use_lowest_active_lane():
    src = np.arange(256, dtype=np.uint8)
    res = run("""
        s2r r0, %laneid
        shl.b64 r1, r0, 3
        ldparam r2, src
        add.i64 r2, r2, r1
        add.i64 r3, r0, 40
        setp.ge.i64 p0, r0, 3
   @p0  dma.get [r1], [r2], r3
        dma.wait 0
        ldparam r4, out
        mov.b64 r5, 0
        mov.b64 r6, 128
        dma.put [r4], [r5], r6
        dma.wait 0
        exit
""", dict(src=src, out=np.zeros(128, np.uint8)), shared=128)
    want = np.zeros(128, np.uint8)
    want[24:24 + 43] = src[24:24 + 43]  # lane 3: shared 24, global src+24, 43 bytes
    assert np.array_equal(res.output("out"), want)


def test_rma_put_get_between_blocks():
    res = run("""
        s2r r0, %ctaid.x
        s2r r1, %laneid
        mad.i64 r2, r0, 1000, r1
        shl.b64 r3, r1, 3
        st.shared.b64 [r3], r2
        bar.grid
        xor.b64 r4, r0, 1
        mov.b64 r5, 0
        mov.b64 r6, 128
        mov.b64 r7, 256
        rma.get [r7], [r5], r6, r4
        mov.b64 r8, 384
        rma.put [r8], [r6], r6, r4
        rma.wait 0
        bar.grid
        ldparam r10, out
        mul.i64 r11, r0, 512
        add.i64 r10, r10, r11
        dma.put [r10], [r5], r8
        mov.b64 r12, 128
        dma.put [r10+384], [r8], r12
        exit
""", dict(out=np.zeros(128, np.int64)), grid="2", shared=512)
    out = res.output("out").reshape(2, 64)
    for b in range(2):
        other = 1 - b
        assert np.array_equal(out[b, :32], b * 1000 + np.arange(32))
        assert np.array_equal(out[b, 32:48], other * 1000 + np.arange(16))
        assert np.array_equal(out[b, 48:64], other * 1000 + np.arange(16, 32))


# ------------------------------------------------------------------------------------- ldmatrix / mma
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix(n, trans):
    rng = np.random.default_rng(n + 10 * trans)
    src = rng.integers(0, 2**16, 256, dtype=np.uint16)
    mn = f"ldmatrix.x{n}" + (".trans" if trans else "")
    res = run(f"""
        ldparam r0, src
        mov.b64 r1, 0
        mov.b64 r2, 512
        dma.get [r1], [r0], r2
        s2r r3, %laneid
        mul.i64 r4, r3, 5
        rem.i64 r4, r4, {8 * n}
        shl.b64 r4, r4, 4
        {mn} r10, [r4+0]
        exit
""", dict(src=src), shared=512)
    rows = src.reshape(32, 8)
    mats = np.stack([rows[[((8 * i + r) * 5) % (8 * n) for r in range(8)]] for i in range(n)])
    if trans:
        mats = mats.transpose(0, 2, 1)
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    for i in range(n):
        lo = mats[i][g, 2 * t].astype(np.uint64)
        hi = mats[i][g, 2 * t + 1].astype(np.uint64)
        assert np.array_equal(ureg(res, 10 + i), lo | (hi << np.uint64(16))), i


MMA_LOAD_C_F32 = """
        shl.b64 r7, r1, 3
        add.i64 r7, r7, r4
        shl.b64 r7, r7, 2
        ldparam r8, C
        add.i64 r8, r8, r7
        ld.global.v2.b32 r16, [r8]
        ld.global.v2.b32 r18, [r8+256]
"""
MMA_STORE_D_F32 = """
        ldparam r9, D
        add.i64 r9, r9, r7
        st.global.v2.b32 [r9], r20
        st.global.v2.b32 [r9+256], r22
        exit
"""
MMA_LANE = """
        s2r r0, %laneid
        shr.u64 r1, r0, 2
        and.b64 r2, r0, 3
        shl.b64 r4, r2, 1
"""


def _mma_f32_oracle(A, B, C):
    acc = C.astype(np.float32).copy()
    for k in range(A.shape[1]):
        acc = acc + A[:, k:k + 1].astype(np.float32) * B[k:k + 1, :].astype(np.float32)
    return acc


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_m16n8k16(kind):
    rng = np.random.default_rng(7)
    A32 = rng.standard_normal((16, 16)).astype(np.float32)
    B32 = rng.standard_normal((16, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    if kind == "f16":
        A, Bt = A32.astype(np.float16), np.ascontiguousarray(B32.T).astype(np.float16)
        Af, Bf = A.astype(np.float32), Bt.T.astype(np.float32)
    else:
        A, Bt = f32_to_bf16_bits(A32), f32_to_bf16_bits(np.ascontiguousarray(B32.T))
        Af, Bf = bf16_bits_to_f32(A), bf16_bits_to_f32(Bt).T
    res = run(MMA_LANE + """
        shl.b64 r3, r1, 4
        add.i64 r3, r3, r4
        shl.b64 r3, r3, 1
        ldparam r5, A
        add.i64 r5, r5, r3
        ld.global.b32 r10, [r5]
        ld.global.b32 r11, [r5+256]
        ld.global.b32 r12, [r5+16]
        ld.global.b32 r13, [r5+272]
        ldparam r6, Bt
        add.i64 r6, r6, r3
        ld.global.b32 r14, [r6]
        ld.global.b32 r15, [r6+16]
""" + MMA_LOAD_C_F32 + f"        mma.m16n8k16.f32.{kind} r20, r10, r14, r16\n" + MMA_STORE_D_F32,
              dict(A=A, Bt=Bt, C=C, D=np.zeros((16, 8), np.float32)))
    D = res.output("D")
    assert np.array_equal(D.view(np.uint32), _mma_f32_oracle(Af, Bf, C).view(np.uint32))
    np.testing.assert_allclose(D, Af.astype(np.float64) @ Bf + C, rtol=1e-5, atol=1e-5)


def test_mma_m16n8k8_tf32():
    rng = np.random.default_rng(8)
    A = rng.standard_normal((16, 8)).astype(np.float32)
    B = rng.standard_normal((8, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    Bt = np.ascontiguousarray(B.T)
    res = run(MMA_LANE + """
        shl.b64 r3, r1, 3
        add.i64 r3, r3, r2
        shl.b64 r3, r3, 2
        ldparam r5, A
        add.i64 r5, r5, r3
        ld.global.b32 r10, [r5]
        ld.global.b32 r11, [r5+256]
        ld.global.b32 r12, [r5+16]
        ld.global.b32 r13, [r5+272]
        ldparam r6, Bt
        add.i64 r6, r6, r3
        ld.global.b32 r14, [r6]
        ld.global.b32 r15, [r6+16]
""" + MMA_LOAD_C_F32 + "        mma.m16n8k8.f32.tf32 r20, r10, r14, r16\n" + MMA_STORE_D_F32,
              dict(A=A, Bt=Bt, C=C, D=np.zeros((16, 8), np.float32)))
    tf32 = lambda x: (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)  # noqa: E731
    D = res.output("D")
    assert np.array_equal(D.view(np.uint32), _mma_f32_oracle(tf32(A), tf32(B), C).view(np.uint32))
    assert not np.array_equal(D, _mma_f32_oracle(A, B, C))  # the low mantissa bits really are ignored
    np.testing.assert_allclose(D, A.astype(np.float64) @ B + C, rtol=1e-2, atol=1e-2)


def test_mma_m8n8k4_f64():
    rng = np.random.default_rng(9)
    A = rng.standard_normal((8, 4))
    B = rng.standard_normal((4, 8))
    C = rng.standard_normal((8, 8))
    res = run(MMA_LANE + """
        shl.b64 r3, r1, 2
        add.i64 r3, r3, r2
        shl.b64 r3, r3, 3
        ldparam r5, A
        add.i64 r5, r5, r3
        ld.global.b64 r10, [r5]
        ldparam r6, Bt
        add.i64 r6, r6, r3
        ld.global.b64 r11, [r6]
        shl.b64 r7, r1, 3
        add.i64 r7, r7, r4
        shl.b64 r7, r7, 3
        ldparam r8, C
        add.i64 r8, r8, r7
        ld.global.b64 r12, [r8]
        ld.global.b64 r13, [r8+8]
        mma.m8n8k4.f64 r20, r10, r11, r12
        ldparam r9, D
        add.i64 r9, r9, r7
        st.global.b64 [r9], r20
        st.global.b64 [r9+8], r21
        exit
""", dict(A=A, Bt=np.ascontiguousarray(B.T), C=C, D=np.zeros((8, 8))))
    acc = C.copy()
    for k in range(4):
        acc = acc + A[:, k:k + 1] * B[k:k + 1, :]
    assert np.array_equal(res.output("D"), acc)
    np.testing.assert_allclose(res.output("D"), A @ B + C, rtol=1e-12)


def test_mma_needs_warp_width_32():
    src = kern("        mma.m8n8k4.f64 r0, r2, r3, r4\n        exit\n", block="8")
    with pytest.raises(SimulationError, match="warp width 32"):
        run_reference(assemble(src), {}, warp_width=8)


def test_error_where_matches_source_line():
    src = kern("        nop\n        nop\n        ld.global.u8 r0, [0]\n        exit\n")
    with pytest.raises(SimulationError) as e:
        run_reference(assemble(src), {})
    assert re.fullmatch(r"<asm>:\d+", e.value.where) and e.value.where.endswith(str(line_of(src, "ld.global.u8")))
