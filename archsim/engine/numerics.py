"""Number formats in numba: fp16 / bf16 / tf32 conversions with round-to-nearest-even.

Numba has no float16 on the CPU, so halves are carried as uint16 bit patterns and converted here.
NaN results are canonical quiet NaNs (the engine does not model NaN payloads).
"""

from __future__ import annotations

import math

import numpy as np
from archsim.engine.jit import njit

F16_QNAN = 0x7E00
BF16_QNAN = 0x7FC0


@njit(cache=True)
def half_to_f64(h: int) -> float:
    """IEEE binary16 bits -> exact float64 value."""
    h = h & 0xFFFF
    sign = -1.0 if (h >> 15) & 1 else 1.0
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        return sign * math.ldexp(float(m), -24)
    if e == 31:
        if m == 0:
            return sign * np.inf
        return np.nan
    return sign * math.ldexp(float(m + 1024), e - 25)


@njit(cache=True)
def bf16_to_f64(h: int, tmp_u32, tmp_f32) -> float:
    tmp_u32[0] = np.uint32((h & 0xFFFF) << 16)
    return float(tmp_f32[0])


@njit(cache=True)
def _round_bits(x: float, mant_bits: int, bias: int, emax: int, qnan: int) -> int:
    """Correctly rounded (nearest even) float64 -> a small binary format's bits.

    mant_bits: stored mantissa bits (10 for fp16, 7 for bf16); emin = 1 - bias.
    """
    if x != x:
        return qnan
    sign = 0
    if x < 0.0 or (x == 0.0 and math.copysign(1.0, x) < 0.0):
        sign = 1
        x = -x
    exp_all_ones = (1 << (16 - 1 - mant_bits)) - 1
    signbit = sign << 15
    if x == np.inf:
        return signbit | (exp_all_ones << mant_bits)
    if x == 0.0:
        return signbit
    emin = 1 - bias
    fr, e2 = math.frexp(x)  # x = fr * 2**e2, fr in [0.5, 1)
    E = e2 - 1
    if E < emin:
        # subnormal: units of 2**(emin - mant_bits)
        q = np.rint(math.ldexp(x, mant_bits - emin))
        qi = int(q)
        return signbit | qi  # qi == 2**mant_bits rolls into the smallest normal correctly
    q = np.rint(math.ldexp(x, mant_bits - E))
    qi = int(q)
    if qi == (1 << (mant_bits + 1)):
        qi = 1 << mant_bits
        E += 1
    if E > emax:
        return signbit | (exp_all_ones << mant_bits)
    return signbit | ((E + bias) << mant_bits) | (qi - (1 << mant_bits))


@njit(cache=True)
def f64_to_half(x: float) -> int:
    return _round_bits(x, 10, 15, 15, F16_QNAN)


@njit(cache=True)
def f64_to_bf16(x: float) -> int:
    return _round_bits(x, 7, 127, 127, BF16_QNAN)


@njit(cache=True)
def f32_bits_to_f64(b: int) -> float:
    """IEEE binary32 bits -> exact float64, built from the fields.

    Built by hand, not by a float32 -> float64 cast: LLVM rewrites
    ``(float)f((double)x)`` into the single-precision ``f`` (log2f, 1/sqrtf, ...), which rounds
    differently. With no visible extension there is nothing to shrink.
    """
    b = b & 0xFFFFFFFF
    sign = -1.0 if (b >> 31) & 1 else 1.0
    e = (b >> 23) & 0xFF
    m = b & 0x7FFFFF
    if e == 0:
        return sign * math.ldexp(float(m), -149)
    if e == 255:
        if m == 0:
            return sign * np.inf
        return np.nan
    return sign * math.ldexp(float(m + 0x800000), e - 150)


@njit(cache=True)
def fma_round_to_odd(a: float, b: float, c: float, tmp_i64, tmp_f64) -> float:
    """a*b + c for operands whose product is exact in float64 (fp32, fp16, bf16), returned
    rounded to odd in float64: rounding that once more to a format of at most 51 bits (fp32,
    fp16, bf16) gives the correctly rounded fused result (Boldo & Melquiond)."""
    p = a * b
    s = p + c
    if s != s or s == np.inf or s == -np.inf:
        return s
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # TwoSum: p + c == s + err exactly
    if err == 0.0:
        return s
    tmp_f64[0] = s
    bits = tmp_i64[0]
    if bits & 1:
        return s
    if (err > 0.0) == (s > 0.0):
        tmp_i64[0] = bits + 1
    else:
        tmp_i64[0] = bits - 1
    return tmp_f64[0]
