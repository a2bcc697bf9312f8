"""What every kernel emitter shares: the assembler with a register pool (``Asm``), small integer
and address helpers, argument checks, and the dtype tables of the storage formats."""

from __future__ import annotations

from typing import Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Builder, Pred, Reg
from archsim.isa.program import Program

__all__ = ["Asm", "OutOfRegisters", "log2", "ceil_div", "pow2_floor", "pow2_ceil", "swizzle_offset", "check_int",
           "check_pair", "one_to_one", "blocks_per_core", "DTYPE_ALIASES", "OUT_DTYPE_ALIASES", "ELEM_BYTES", "OUT_BYTES",
           "HOST_DTYPE", "MMA_OP", "CVT_IN", "CVT_OUT", "CVT_PACK", "INDEX_DTYPE", "MASK_DTYPE", "BUF_BYTES", "BUF_HOST",
           "widen_halves"]

# ----------------------------------------------------------------------------- dtype tables
# a storage dtype's names -> its canonical name (fp16 | bf16 | fp32)
DTYPE_ALIASES = {"fp16": "fp16", "f16": "fp16", "half": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16",
                 "fp32": "fp32", "f32": "fp32", "float32": "fp32"}
# a GEMM output dtype's names -> its canonical name (f32 | f16 | bf16)
OUT_DTYPE_ALIASES = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "half": "f16",
                     "float16": "f16", "bf16": "bf16", "bfloat16": "bf16"}
ELEM_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}                       # bytes of an element of a storage dtype
OUT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}                          # bytes of an element of a GEMM output dtype
HOST_DTYPE = {"fp16": np.float16, "bf16": np.uint16, "fp32": np.float32}   # numpy dtype of a buffer (bf16: bits)
INDEX_DTYPE = "i32"                                                   # index buffers (expert routing): int32
MASK_DTYPE = "u8"                                                     # dropout masks: a byte an element, 0 or 1
BUF_BYTES = {**ELEM_BYTES, INDEX_DTYPE: 4, MASK_DTYPE: 1}             # bytes of an element of any buffer
BUF_HOST = {**HOST_DTYPE, INDEX_DTYPE: np.int32, MASK_DTYPE: np.uint8}   # numpy dtype of any buffer
MMA_OP = {"fp16": "mma.m16n8k16.f32.f16", "bf16": "mma.m16n8k16.f32.bf16"}  # tensor-core mma, f32 accumulators
# 16-bit storage -> f32: (low half, high half) of a 32-bit register
CVT_IN = {"fp16": ("cvt.f32.f16", "cvt.f32.f16h"), "bf16": ("cvt.f32.bf16", "cvt.f32.bf16h")}
# two f32 -> one register of two 16-bit storage elements
CVT_OUT = {"fp16": "cvt.f16x2.f32", "bf16": "cvt.bf16x2.f32"}
# the same, keyed by the GEMM output dtype
CVT_PACK = {"f16": "cvt.f16x2.f32", "bf16": "cvt.bf16x2.f32"}


# ----------------------------------------------------------------------------- the assembler
class Asm:
    """A Builder with a register / predicate pool (registers are freed and reused)."""

    def __init__(self, name: str, params, shared: int, limit: int = 255):
        self.b = Builder(name, params=params, shared_bytes=shared)
        self.busy = [False] * limit
        self.pbusy = [False] * 8

    def __call__(self, mnemonic: str, *ops, p: Optional[Pred] = None, neg: bool = False) -> None:
        self.b.emit(mnemonic, *ops, pred=p, neg=neg)

    def reg(self, k: int = 1) -> Reg:
        """The lowest run of k free registers (first fit), now busy."""
        busy = self.busy
        if k <= 0:
            return Reg(0)         # an empty run: nothing marked busy
        run = 0
        for i, b in enumerate(busy):
            run = 0 if b else run + 1
            if run == k:
                s = i - k + 1
                busy[s:i + 1] = [True] * k
                return Reg(s)
        raise OutOfRegisters(f"needs more than {len(busy)} registers")

    def free(self, *regs, k: int = 1) -> None:
        for r in regs:
            for i in range(r.n, r.n + k):
                assert self.busy[i], f"r{i} freed twice"
                self.busy[i] = False

    def pred(self) -> Pred:
        for i, b in enumerate(self.pbusy):
            if not b:
                self.pbusy[i] = True
                return Pred(i)
        raise OutOfRegisters("needs more than 8 predicates")

    def pfree(self, *ps) -> None:
        for p in ps:
            self.pbusy[p.n] = False

    def label(self, name: str) -> None:
        self.b.label(name)

    def build(self) -> Program:
        return self.b.build()


class OutOfRegisters(Exception):
    """A kernel needs more registers or predicates than its Asm's pool holds."""


def widen_halves(a, dt: str, v, raw, nr: int) -> None:
    """Emit the conversion of ``nr`` registers of packed 16-bit ``dt`` values from ``raw`` on into
    2 nr f32 registers from ``v`` on (each word's low half first)."""
    lo, hi = CVT_IN[dt]
    for i in range(nr):
        a(lo, v + 2 * i, raw + i)
        a(hi, v + 2 * i + 1, raw + i)


# ----------------------------------------------------------------------------- integer helpers
def log2(x: int) -> int:
    """log2 of a power of two."""
    assert x > 0 and x & (x - 1) == 0, x
    return x.bit_length() - 1


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def blocks_per_core(caps, prog: Program, threads: int) -> int:
    """Blocks of a kernel of `threads` threads a core holds at once: its block limit, warp slots,
    registers and (for a kernel with any) scratchpad. 0: a block does not fit."""
    warps = ceil_div(threads, caps.warp_width)
    n = min(caps.max_blocks_per_core, caps.warp_slots // warps,
            caps.regs_per_core // max(prog.nregs * warps * caps.warp_width, 1))
    return min(n, caps.scratchpad_bytes // prog.shared_bytes) if prog.shared_bytes else n


def pow2_floor(x: int) -> int:
    """The largest power of two <= x (1 for x < 1)."""
    return 1 << (max(int(x), 1).bit_length() - 1)


def pow2_ceil(x: int) -> int:
    """The smallest power of two >= x (1 for x < 1)."""
    return 1 << max(int(x) - 1, 0).bit_length()


# ----------------------------------------------------------------------------- addressing
def swizzle_offset(a: Asm, dst: Reg, row: Reg, cb: Reg, lay: str, RB: int, off: int) -> None:
    """dst = off + row*RB + (cb ^ (f(row) << 4)): the byte offset of column byte cb of row `row`
    in a swizzled (or padded) shared-memory tile. dst may be row or cb."""
    t = a.reg()
    if lay == "sw64":        # 64-byte rows: chunk c at c ^ ((row/2) % 4)
        a("shr.u64", t, row, 1)
        a("and.b64", t, t, 3)
        a("shl.b64", t, t, 4)
        a("xor.b64", t, t, cb)
    elif lay == "sw128":     # rows of 128 bytes or more: chunk c at c ^ (row % 8)
        a("and.b64", t, row, 7)
        a("shl.b64", t, t, 4)
        a("xor.b64", t, t, cb)
    else:                    # padded rows, no swizzle
        a("mov.b64", t, cb)
    if RB & (RB - 1) == 0:
        a("shl.b64", dst, row, log2(RB))
    else:
        a("mul.i64", dst, row, RB)
    a("add.i64", dst, dst, t)
    if off:
        a("add.i64", dst, dst, off)
    a.free(t)


def one_to_one(dims) -> bool:
    """Whether offsets sum(i_d * stride_d), 0 <= i_d < count_d, are all different: sorted by stride,
    each stride must step past everything the smaller ones reach (a sufficient test; it accepts
    every nesting of rows, column slices, heads and batches, whatever the order)."""
    reach = 0                                     # the largest offset the smaller dimensions reach
    for stride, count in sorted((s, n) for s, n in dims if n > 1):
        if stride <= reach:
            return False
        reach += stride * (count - 1)
    return True


# ----------------------------------------------------------------------------- argument checks
# split-K of skinny GEMMs (a family's split_k in block.FamilyEmitters; the GPU's today): a GEMM of at most SKINNY_ROWS rows (decode's) whose tiles
# leave cores idle and whose K is at least SPLIT_K_MIN_K is cut into equal slices of K
SKINNY_ROWS = 64
SPLIT_K_ALIGN = 64   # elements: a slice is whole k tiles (64 halves: 128 bytes) and keeps rows 16-byte aligned
SPLIT_K_MIN = 128    # elements of K a slice keeps at least (two k tiles: one copied while one is multiplied)
SPLIT_K_MIN_K = 2048  # shorter K: the reduction's launch and round trip to memory cost what the slices save


def split_k_slices(M: int, K: int, tiles: int, cores: int) -> int:
    """Slices of K for a GEMM of M rows whose unsplit launch has ``tiles`` blocks on ``cores``:
    1 unless it is skinny, its K long enough and its tiles leave cores idle; else the fewest equal
    slices of whole SPLIT_K_ALIGN-element k tiles, at least SPLIT_K_MIN long, whose tiles cover
    every core, or the most there are."""
    if M > SKINNY_ROWS or K < max(2 * SPLIT_K_MIN, SPLIT_K_MIN_K):
        return 1
    best = 1
    for s in range(2, K // SPLIT_K_MIN + 1):
        if tiles * best >= cores:
            break
        if K % s == 0 and (K // s) % SPLIT_K_ALIGN == 0:
            best = s
    return best


def check_int(where: str, what: str, v, lo: int, allowed: str) -> int:
    """v as an int if it is an integer >= lo (not a bool); one InputError line otherwise."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < lo:
        raise InputError(where, f"{what} = {v!r}", allowed)
    return int(v)


def check_pair(where: str, what: str, v, lo: int, allowed: str) -> tuple[int, int]:
    """A pair (per batch, per head) of integers >= lo, as check_int checks each."""
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        raise InputError(where, f"{what} = {v!r}", f"a pair (per batch, per head) of {allowed}")
    return (check_int(where, f"{what}[0]", v[0], lo, allowed), check_int(where, f"{what}[1]", v[1], lo, allowed))
