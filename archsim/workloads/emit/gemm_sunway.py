"""GEMM kernels for the Sunway family (SW26010-Pro CPEs): C = alpha * op(A) @ op(B), LDM-tiled,
DMA double-buffered, vector FMA. The public API mirrors ``gemm_gpu`` (same ``gemm_kernel``
signature, the same ``GemmKernel`` object and kernel parameters ``PARAMS``), so the block composer
can pick the module by machine family.

    caps = capabilities(load_machine("sw26010pro"))
    k = gemm_kernel(caps, 1024, 1024, 1024, dtype="fp16", out_dtype="f32")
    run_functional(k.program, k.args(A, B, C), k.launch, warp_width=32, ncores=caps.cores_total)

Execution model: a thread block is one CPE (one warp: the 32 lanes are the 512-bit vector; an
f16x2 / bf16x2 register of a lane carries two halves, so one vector op works on 64 halves, an f32
op on 32 floats). Block (x, y, z) of the launch owns the C tile of rows y*BM .. y*BM+BM-1 and
columns x*BN .. x*BN+BN-1 of GEMM z (z < nb*nh: the (batch, head) pair, as on the GPU: A, B, C of
GEMM z start (z // nh)*stride[0] + (z % nh)*stride[1] elements into their buffers); the grid's
blocks are dispatched over the machine's CPEs. The program's size does not depend on the problem
size: M, N, K, leading dimensions and strides are kernel parameters, loops carry the rest.

LDM (``.shared``) of one CPE:
- ``Cs``: the f32 C tile, BM x BN, row-major (zeroed at the start of the tile);
- two stages (double buffering), each an A panel and a B panel of BK k-steps (BK = 128 halves or
  32 floats; 64 / 16 when the LDM is small). A is kept as stored: rows of A (BM rows of BK k) or, with
  ``trans_a``, rows of A^T (BK rows of BM m); likewise B as BK rows of BN n, or with ``trans_b``
  BN rows of BK k, their pitch padded by 4 (halves) / 8 (floats) bytes so that the lanes' reads
  of 32 different rows spread over the 8 LDM banks.
- Panels travel by DMA. A panel whose rows are as long as their LDM pitch (every panel of an
  interior tile but the K residue) is one strided get, ``dma.get.s`` (athread's
  dma_iget_stride: count rows of pitch bytes, ld apart in memory, packed in the LDM); the
  others (edge tiles, the residue panel, and B^T, whose LDM rows are padded) take one
  ``dma.get`` per row (a row of a tile is contiguous in memory only along the leading
  dimension). Only the rows inside the matrix are fetched (min(BM, M-m0)
  rows of A, ...) and only the valid length of each (the K residue panel fetches its kn < BK
  k-steps, an edge tile its columns < N), so the kernel never reads outside A or B; LDM bytes
  outside the fetched part only ever feed C rows / columns that are not stored. The descriptor
  FIFO is the engine's (8 per 2x2 cluster): a CPE issuing into a full FIFO stalls, as modelled.
- Pipeline, per panel p: ``dma.wait 0`` (panel p is in), queue the rows of panel p+1 (into the
  other stage), compute panel p from LDM issuing one queued get every ``_pace`` k-iterations
  from inside the FMA loop, then issue what is left. Issuing a whole panel at once would park
  the in-order CPE on the full descriptor FIFO for most of the panel; paced, the gets fly while
  the FMAs run. ``_Queue.setup`` is the one place that turns a panel into transfers (the hook
  for broadcast / strided DMA: swDNN shares A and B panels across a mesh row / column, which
  the engine does not model yet).

Compute (the CPE has no tensor unit): register tiles of RM rows x RV vectors of 32 columns of C,
lane l of vector j holding column sj + 32j + l. f16 / bf16 run in k-pairs: the two halves of
an accumulator are the even-k and odd-k partial sums of the same element, so one
``fma.f16x2 acc, (A[i,k], A[i,k+1]), (B[k,n], B[k+1,n]), acc`` does 64 multiply-adds. The A pair
is one ``ld.shared.b32`` that every lane reads at the same address (a broadcast: one wavefront)
when A is stored [M, K]; with ``trans_a`` its halves sit in two panel rows: two broadcast
``ld.shared.u16`` joined by one ``mad.i64 x, hi, 0x10000, lo``. The B pair is one
``ld.shared.b32`` a lane from the lane's B^T row (``trans_b``), else two ``ld.shared.u16`` from
B's rows k and k+1 (32 lanes, 64 contiguous bytes) and a ``mad.i64``. Per k-pair of an (8, 4)
tile: 32 FMAs (64 vector cycles) against 8 A and 4-8 B loads and at most 12 integer ops. fp32:
one k-step an iteration, ``ld.shared.b32`` of A broadcast, B one float a lane, ``fma.f32``.
RM x RV = 32 accumulator registers: (8, 4) when N > 64, (16, 2) / (16, 1) for narrow C; A loads
run one or two rows ahead of their FMAs (an in-order core stalls on the first operand not
ready). A panel of odd length (the K residue) gets a zero A and B element at k = kn, so its
last pair adds 0 * 0. The modelled integer pipe charges every integer op a full 32-lane issue
(2 cycles), which is why the layout avoids per-row integer work (a k-per-instruction layout
needs a ``mul.i64`` to duplicate every A element: int-bound).

Accumulation (the swDNN / swBLAS-style mixed-precision choice): fp16 / bf16 products are summed
in the vector registers in the input format (``fma.f16x2`` / ``fma.bf16x2``, one rounding per
k-step, 64 halves an instruction: the full 55 TFLOP/s rate of sw26010pro) within one panel of
BK = 128 k-steps (64 on a small LDM), i.e. two chains of at most 64 products per element (the
even and odd k halves); after each panel the register tile is flushed into the f32 tile in LDM
(two ``cvt.f32.f16[h]`` and two ``add.f32`` per register at the f32 rate: 16 vector cycles per
128 cycles of FMA, 12 %), so errors do not grow with K beyond the f32 sum of K/128 blocks. An all-f32
accumulation would run at the f32 rate, a quarter of the f16 one. fp32 inputs accumulate with
``fma.f32`` within the panel and add into the f32 tile the same way. The result error is thus
bounded by u_in * sum over panels and k of |partial sum| + u32 * (K/BK sums) + the output
rounding (u_in = 2^-11 fp16, 2^-8 bf16, 2^-24 fp32); tests/test_emit_gemm_sunway.py checks every
element against that bound computed from the exact partial sums. bf16's 8-bit significand makes
its panel sums ~8x less accurate than fp16's.

Epilogue: alpha (an f32 multiply) and the conversion to the output dtype (``cvt.f16x2.f32`` /
``cvt.bf16x2.f32``, in place in the f32 rows) for the tile's valid rows, then one ``dma.put``
per row of min(BN, N-n0) elements and ``dma.wait 0`` before the CPE exits.

Tile rule (``choose_tile``): (RM, RV) from N as above; BM a multiple of RM (<= 256), BN of RM's
vector width (<= 512); the candidate must fit the LDM (``caps.scratchpad_bytes``:
BM*BN*4 + 2 stages) and its program the registers (``caps.max_regs_per_thread``). The smallest
estimated time wins, ties to the larger tile:

    cost = max(tiles * (BM' + BN') * K * es / (BW * min(tiles, cores)),  waves * 2 * BM' * BN' * K / F)
           + waves * T0

with BM' = min(BM, M), BN' = min(BN, N), waves = ceil(tiles / cores) (wave quantization over
``caps.cores_total`` CPEs): the DRAM bytes of all tiles over the bandwidth of the CPEs that run
them (blocks fill the core groups one after the other, and a core group's DMA is bounded by its
controller and ring stop, so a launch of few tiles gets a share of the machine's bandwidth), or
the busiest CPE's FMA time, whichever is longer. BW = 0.356 B/cycle per CPE and F = 64 (16-bit) /
16 (f32) flops per cycle are sw26010pro's balance (307.2 GB/s over 384 CPEs at 2.25 GHz; one
f16x2 / f32 FMA of 32 lanes per 2 / 4 cycles): a choice, since capabilities carry no rates; the
rule only ranks tiles, the timing engine measures them. The bandwidth term assumes the buffers
are spread over the controllers (the cross segment); with every buffer in one core group's
private segment (the engine's placement today) all traffic meets at one controller and the
total bytes alone decide, which favours bigger tiles than this rule picks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program

from .gemm_gpu import (MAX_BATCH, PARAMS, GemmKernel, Tile, _Asm, _batch_index, _batch_ptr, _ceil, _int,
                       _log2, _one_to_one, _OutOfRegisters, _pair)

__all__ = ["gemm_kernel", "choose_tile", "SunwayCfg", "ACC_BITS", "PARAMS"]

_DTYPES = {"fp16": "fp16", "f16": "fp16", "half": "fp16", "float16": "fp16", "bf16": "bf16", "bfloat16": "bf16",
           "fp32": "fp32", "f32": "fp32", "float32": "fp32"}
_OUTS = {"f32": "f32", "fp32": "f32", "float32": "f32", "f16": "f16", "fp16": "f16", "half": "f16",
         "float16": "f16", "bf16": "bf16", "bfloat16": "bf16"}
_ES = {"fp16": 2, "bf16": 2, "fp32": 4}
_OS = {"f32": 4, "f16": 2, "bf16": 2}
_UNIT = {"fp16": "fp16", "bf16": "fp16", "fp32": "fp32"}       # ISA unit class of the dtype's FMA
_FMA = {"fp16": "fma.f16x2", "bf16": "fma.bf16x2", "fp32": "fma.f32"}
_CVT_LO = {"fp16": "cvt.f32.f16", "bf16": "cvt.f32.bf16"}
_CVT_HI = {"fp16": "cvt.f32.f16h", "bf16": "cvt.f32.bf16h"}
_PACK = {"f16": "cvt.f16x2.f32", "bf16": "cvt.bf16x2.f32"}
# significand bits of the accumulation within a panel (the test's error bound uses 2^-ACC_BITS)
ACC_BITS = {"fp16": 11, "bf16": 8, "fp32": 24}



def accumulation_error(g) -> float:
    """First-order relative error of this kernel's accumulation beyond what f32 adds: each output
    element is off by at most about this times sum_k |A[i,k] B[k,j]| (an f16 / bf16 chain of up to
    BK/2 products per half, flushed into f32 per panel; fp32 inputs accumulate in f32: 0)."""
    if g.dtype not in ("fp16", "bf16"):
        return 0.0
    return (g.tile.BK // 2) * 2.0 ** -ACC_BITS[g.dtype]


ACC_REGS = 32          # choice: accumulator registers of the register tile (half the 64 a CPE thread has)
BM_MAX, BN_MAX = 256, 512
# tile-rule balance (see the module docstring): sw26010pro, per CPE and core cycle
_BW_CPE = 307.2 / 2.25 / 384        # DRAM bytes per cycle per CPE
_FLOPS_CPE = {2: 64.0, 4: 16.0}     # vector FMA flops per cycle (16-bit pairs / f32)
_T0 = 2000.0                        # choice: per-tile fixed cycles (DMA start-up, C zeroing, puts)


@dataclass(frozen=True)
class SunwayCfg:
    dtype: str         # fp16 bf16 fp32
    out: str           # f32 f16 bf16
    trans_a: bool
    trans_b: bool
    BM: int
    BN: int
    BK: int            # k-steps per panel (and per f16 accumulation chain)
    RM: int            # register tile rows
    RV: int            # register tile vectors (32 columns of C each)
    alpha: float = 1.0
    strided: bool = True   # full-pitch panels of A and B by one strided get (dma.get.s)

    @property
    def es(self) -> int:
        return _ES[self.dtype]

    @property
    def half(self) -> bool:
        return self.es == 2

    @property
    def vw(self) -> int:
        """C columns per vector register: one a lane (f16 / bf16: the two halves of a lane are the
        even-k and odd-k partial sums of the same element)."""
        return 32

    @property
    def RN(self) -> int:
        return self.RV * self.vw

    # ---- LDM layout (bytes)
    @property
    def cs_bytes(self) -> int:
        return self.BM * self.BN * 4

    @property
    def pa(self) -> int:
        """Pitch of an A panel row: BK k (A) or BM m (A^T)."""
        return self.BM * self.es if self.trans_a else self.BK * self.es

    @property
    def a_rows(self) -> int:
        return self.BK if self.trans_a else self.BM

    @property
    def pb(self) -> int:
        """Pitch of a B panel row: BN n (B) or BK k + pad (B^T: 32 lanes read 32 different rows)."""
        if self.trans_b:
            return self.BK * self.es + (4 if self.es == 2 else 8)
        return self.BN * self.es

    @property
    def b_rows(self) -> int:
        return self.BN if self.trans_b else self.BK

    @property
    def a_panel(self) -> int:
        return _ceil(self.a_rows * self.pa, 128) * 128

    @property
    def stage(self) -> int:
        return _ceil(self.a_panel + self.b_rows * self.pb, 128) * 128

    @property
    def ldm_bytes(self) -> int:
        return self.cs_bytes + 2 * self.stage


# ----------------------------------------------------------------------------- emission
class _Queue:
    """The rows of the next panel still to fetch: one operand at a time (A, then B), as
    (src, dst, count, length, src step, dst step) registers plus ``ph`` = 1 while A's rows are
    queued (B's come next). ``setup`` is the one place a panel becomes transfers: broadcast or
    strided DMA forms would replace it."""

    def __init__(self, a: _Asm, c: "SunwayCfg", p, gA, gB, mv, nv, p0, lbl):
        self.a, self.c, self.p, self.p0, self.lbl = a, c, p, p0, lbl
        self.strided = c.strided
        self.g = {"A": (gA, mv), "B": (gB, nv)}
        self.src, self.dst, self.cnt, self.len, self.ss, self.ds, self.ph = (a.reg() for _ in range(7))

    def setup(self, op: str) -> None:
        """Queue operand op's rows of panel p+1 (into stage (p+1) % 2)."""
        a, c, lbl = self.a, self.c, self.lbl
        es = c.es
        g, ext = self.g[op]
        trans = c.trans_a if op == "A" else c.trans_b
        kmajor = trans if op == "A" else not trans        # panel rows are k-steps
        k0, kn = a.reg(), a.reg()
        a("add.i64", k0, self.p, 1)
        a("and.b64", self.dst, k0, 1)
        a("mul.i64", self.dst, self.dst, c.stage)
        a("add.i64", self.dst, self.dst, c.cs_bytes + (0 if op == "A" else c.a_panel))
        a("shl.b64", k0, k0, _log2(c.BK))
        a("ldparam", kn, "K")
        a("sub.i64", kn, kn, k0)
        a("min.i64", kn, kn, c.BK)                        # k-steps of that panel
        a("ldparam", self.ss, "lda" if op == "A" else "ldb")
        a("shl.b64", self.ss, self.ss, _log2(es))         # bytes between rows in memory
        if kmajor:                                        # rows k0 .. k0+kn-1, ext elements each
            a("mul.i64", self.src, k0, self.ss)
            a("mov.b64", self.cnt, kn)
            a("shl.b64", self.len, ext, _log2(es))
        else:                                             # ext rows, k0 .. k0+kn-1 of each
            a("shl.b64", self.src, k0, _log2(es))
            a("mov.b64", self.cnt, ext)
            a("shl.b64", self.len, kn, _log2(es))
        a("add.i64", self.src, self.src, g)
        pitch = c.pa if op == "A" else c.pb
        a("mov.b64", self.ds, pitch)
        a("mov.b64", self.ph, 1 if op == "A" else 0)
        if self.strided and not (op == "B" and c.trans_b):
            # rows as long as the LDM pitch (every panel but an edge tile's or the K residue's):
            # one strided get for the whole panel (athread's dma_iget_stride), packed at the
            # pitch. B^T rows keep their padded pitch (bank spread), so they go row by row.
            skip = lbl("QROWS")
            p0 = self.p0
            a("setp.ne.i64", p0, self.len, pitch)
            a("bra", skip, p=p0)
            pair = a.reg(2)
            a("mov.b64", pair, self.len)                  # block size
            a("mov.b64", pair + 1, self.ss)               # stride
            a("dma.get.s", Mem(self.dst, 0), Mem(self.src, 0), self.cnt, pair)
            a("mov.b64", self.cnt, 0)
            a.free(pair, k=2)
            a.label(skip)
        a.free(k0, kn)

    def issue(self, pred=None) -> None:
        a = self.a
        a("dma.get", Mem(self.dst, 0), Mem(self.src, 0), self.len, p=pred)
        a("add.i64", self.dst, self.dst, self.ds, p=pred)
        a("add.i64", self.src, self.src, self.ss, p=pred)
        a("sub.i64", self.cnt, self.cnt, 1, p=pred)

    def switch(self, p0, lbl) -> None:
        """A's rows all issued: queue B's."""
        a = self.a
        skip = lbl("QSW")
        a("setp.ne.i64", p0, self.cnt, 0)
        a("bra", skip, p=p0)
        a("setp.eq.i64", p0, self.ph, 0)
        a("bra", skip, p=p0)
        self.setup("B")
        a.label(skip)

    def drain(self, p0, lbl) -> None:
        """Issue every row still queued (A's, then B's), back to back."""
        a = self.a
        top, go, done = lbl("DRAIN"), lbl("DGET"), lbl("DDONE")
        a.label(top)
        a("setp.gt.i64", p0, self.cnt, 0)
        a("bra", go, p=p0)
        a("setp.eq.i64", p0, self.ph, 0)
        a("bra", done, p=p0)
        self.setup("B")
        a("bra", top)
        a.label(go)
        self.issue()
        a("bra", top)
        a.label(done)


def _pace(c: "SunwayCfg") -> int:
    """k-steps between two queued gets inside the compute loop: the full tile's k-steps of a
    panel (sub-tiles x BK) spread over its rows, at most one get every 4 k-steps (choice: a
    sw26010pro CPE's share of its engine is 2 of 8 descriptors over a ~490-cycle get, one get per
    ~245 cycles, ~4 k-steps of a 32-register f16 tile; issuing faster only stalls the CPE on the
    full FIFO while its FMAs wait)."""
    rows = c.a_rows + c.b_rows
    sub = (c.BM // c.RM) * (c.BN // c.RN)
    r = max(1, sub * c.BK // rows)
    pace = 1
    while pace * 2 <= min(r, 4):
        pace *= 2
    return pace


def _emit(c: SunwayCfg, max_regs: int) -> Program:
    es, os_ = c.es, _OS[c.out]
    name = f"sw_gemm_{c.dtype}_{c.out}_{'t' if c.trans_a else 'n'}{'t' if c.trans_b else 'n'}_{c.BM}x{c.BN}"
    a = _Asm(name, PARAMS, c.ldm_bytes, limit=max_regs)
    labels = iter(range(10**6))

    def lbl(s: str) -> str:
        return f"{s}_{next(labels)}"

    p0 = a.pred()
    # ---- tile coordinates, valid extents and operand origins
    gA, gB, mv, nv, t, u = (a.reg() for _ in range(6))
    a("s2r", t, "%ctaid.y")
    a("mul.i64", t, t, c.BM)                             # m0
    a("ldparam", mv, "M")
    a("sub.i64", mv, mv, t)
    a("min.i64", mv, mv, c.BM)                           # rows of C in this tile
    a("s2r", u, "%ctaid.x")
    a("mul.i64", u, u, c.BN)                             # n0
    a("ldparam", nv, "N")
    a("sub.i64", nv, nv, u)
    a("min.i64", nv, nv, c.BN)                           # columns of C in this tile
    z = _batch_index(a)
    _batch_ptr(a, gA, "A", "sa_b", "sa_h", es, z)
    _batch_ptr(a, gB, "B", "sb_b", "sb_h", es, z)
    a.free(*z)
    w = a.reg()
    if c.trans_a:                                        # A^T [K, M]: the tile's m0 columns
        a("shl.b64", w, t, _log2(es))
    else:                                                # A [M, K]: rows from m0
        a("ldparam", w, "lda")
        a("mul.i64", w, w, t)
        a("shl.b64", w, w, _log2(es))
    a("add.i64", gA, gA, w)
    if c.trans_b:                                        # B^T [N, K]: rows from n0
        a("ldparam", w, "ldb")
        a("mul.i64", w, w, u)
        a("shl.b64", w, w, _log2(es))
    else:                                                # B [K, N]: columns from n0
        a("shl.b64", w, u, _log2(es))
    a("add.i64", gB, gB, w)
    a.free(t, u, w)

    # ---- prologue: panel 0's gets (p = -1: the queue fetches panel p+1), then zero the C tile
    p = a.reg()
    q = _Queue(a, c, p, gA, gB, mv, nv, p0, lbl)
    a("mov.b64", p, -1)
    q.setup("A")
    q.drain(p0, lbl)
    a("mov.b64", p, 0)
    zr = a.reg(4)
    for i in range(4):
        a("mov.b64", zr + i, 0)
    zp = a.reg()
    a("s2r", zp, "%laneid")
    a("shl.b64", zp, zp, 4)
    unroll = next(u for u in (4, 2, 1) if c.cs_bytes % (512 * u) == 0)
    a.label("ZERO")
    for i in range(unroll):
        a("st.shared.v4.b32", Mem(zp, 512 * i), zr)
    a("add.i64", zp, zp, 512 * unroll)
    a("setp.lt.i64", p0, zp, c.cs_bytes)
    a("bra", "ZERO", p=p0)
    a.free(zp)
    a.free(zr, k=4)

    # ---- panel loop: wait for panel p, queue panel p+1 (issued a row at a time between the
    # FMAs of panel p, the rest after it), compute panel p
    sb, kn = a.reg(), a.reg()
    a.label("PANEL")
    a("dma.wait", 0)                                     # panel p is in the LDM
    a("add.i64", sb, p, 1)
    a("shl.b64", sb, sb, _log2(c.BK))
    a("ldparam", kn, "K")
    a("mov.b64", q.cnt, 0)
    a("mov.b64", q.ph, 0)
    a("setp.lt.i64", p0, sb, kn)
    a("bra", "COMPUTE", p=p0, neg=True)
    q.setup("A")                                         # panel p+1 into the other stage
    a.label("COMPUTE")
    a("and.b64", sb, p, 1)
    a("mul.i64", sb, sb, c.stage)
    a("add.i64", sb, sb, c.cs_bytes)                     # this panel's stage
    t = a.reg()
    a("shl.b64", t, p, _log2(c.BK))
    a("ldparam", kn, "K")
    a("sub.i64", kn, kn, t)
    a("min.i64", kn, kn, c.BK)                           # k-steps of this panel
    a.free(t)
    if c.half:
        _pad_odd(a, c, sb, kn, p0, lbl)
    _compute_panel(a, c, sb, kn, mv, nv, p0, lbl, q)
    q.drain(p0, lbl)
    a("add.i64", p, p, 1)
    t = a.reg()
    a("shl.b64", sb, p, _log2(c.BK))
    a("ldparam", t, "K")
    a("setp.lt.i64", p0, sb, t)
    a.free(t)
    a("bra", "PANEL", p=p0)
    a.free(sb, kn, p, gA, gB, q.src, q.dst, q.cnt, q.len, q.ss, q.ds, q.ph)

    # ---- epilogue: alpha, conversion in place, one put per row
    gC, t, lane, row, ldc, ln = (a.reg() for _ in range(6))
    z = _batch_index(a)
    _batch_ptr(a, gC, "C", "sc_b", "sc_h", os_, z)
    a.free(*z)
    a("s2r", t, "%ctaid.y")
    a("mul.i64", t, t, c.BM)
    a("ldparam", ldc, "ldc")
    a("mul.i64", t, t, ldc)
    a("s2r", row, "%ctaid.x")
    a("mad.i64", t, row, c.BN, t)
    a("shl.b64", t, t, _log2(os_))
    a("add.i64", gC, gC, t)                              # C[m0, n0]
    a("shl.b64", ldc, ldc, _log2(os_))
    a("shl.b64", ln, nv, _log2(os_))
    a("s2r", lane, "%laneid")
    a("mov.b64", row, 0)
    rb = c.BN * 4
    x, t2 = a.reg(2), a.reg()
    a.label("OUT")
    if c.out != "f32":
        a("shl.b64", t, lane, 3)
        a("add.i64", t, t, row)                          # this row's f32 pairs at 8*lane
        a("shl.b64", t2, lane, 2)
        a("add.i64", t2, t2, row)                        # its packed pairs at 4*lane
        for j in range(_ceil(c.BN, 64)):                 # (fp32 in: BN may end in half a vector)
            a("ld.shared.v2.b32", x, Mem(t, 256 * j))
            if c.alpha != 1.0:
                a("mul.f32", x, x, c.alpha)
                a("mul.f32", x + 1, x + 1, c.alpha)
            a(_PACK[c.out], x, x, x + 1)
            # columns 64j+2l, 64j+2l+1 go to byte 128j+4l of the row: below every f32 pair
            # not yet read (256j' for j' > j), so the conversion runs in place
            a("st.shared.b32", Mem(t2, 128 * j), x)
    elif c.alpha != 1.0:
        a("shl.b64", t, lane, 2)
        a("add.i64", t, t, row)
        for j in range(c.BN // 32):
            a("ld.shared.b32", x, Mem(t, 128 * j))
            a("mul.f32", x, x, c.alpha)
            a("st.shared.b32", Mem(t, 128 * j), x)
    a("dma.put", Mem(gC, 0), Mem(row, 0), ln)
    a("add.i64", gC, gC, ldc)
    a("add.i64", row, row, rb)
    a("sub.i64", mv, mv, 1)
    a("setp.gt.i64", p0, mv, 0)
    a("bra", "OUT", p=p0)
    a("dma.wait", 0)
    a("exit")
    return a.build()


def _pad_odd(a: _Asm, c: SunwayCfg, sb, kn, p0, lbl) -> None:
    """A panel of odd kn k-steps (the K residue) is read in k-pairs: its element kn of A and of B
    (past what the DMA fetched) is set to zero so the last pair's odd half adds 0 * 0."""
    skip = lbl("NOPAD")
    t, u, lane = a.reg(), a.reg(), a.reg()
    z = a.reg()
    a("and.b64", t, kn, 1)
    a("setp.eq.i64", p0, t, 0)
    a("bra", skip, p=p0)
    a("mov.b64", z, 0)
    a("s2r", lane, "%laneid")
    # A: column kn of BM rows (A), or row kn of BM halves (A^T); B: row kn of BN (B), column kn of BN rows (B^T)
    for op, rows, pitch, base, kmajor in (("A", c.BM, c.pa, 0, c.trans_a), ("B", c.BN, c.pb, c.a_panel, not c.trans_b)):
        if kmajor:                                   # row kn, element lane + 32r
            a("mul.i64", t, kn, pitch)
            a("mad.i64", t, lane, 2, t)
        else:                                        # row lane + 32r, element kn
            a("mul.i64", t, lane, pitch)
            a("mad.i64", t, kn, 2, t)
        a("add.i64", t, t, sb)
        for r0 in range(0, rows, 32):
            pr = None
            if r0 + 32 > rows:                       # the last lanes past the tile
                a("setp.lt.i64", p0, lane, rows - r0)
                pr = p0
            a("st.shared.b16", Mem(t, base + r0 * (2 if kmajor else pitch)), z, p=pr)
    a.free(t, u, lane, z)
    a.label(skip)


def _compute_panel(a: _Asm, c: SunwayCfg, sb, kn, mv, nv, p0, lbl, q: _Queue) -> None:
    """C tile (f32, LDM) += op(A panel) @ op(B panel) over kn k-steps, register tile by register
    tile (only those holding valid rows / columns); one queued get every _pace(c) iterations.

    f16 / bf16 (c.half): an iteration is a k-pair; lane l of vector j of row i accumulates
    (A[i,k] B[k,n], A[i,k+1] B[k+1,n]) for n = sj + 32j + l in its two halves. fp32: an iteration
    is one k-step, lane l holds column sj + 32j + l."""
    es, RM, RV, half = c.es, c.RM, c.RV, c.half
    kstep = 2 if half else 1                             # k-steps an iteration
    pace = _pace(c)
    pq, pk = a.pred(), a.pred()
    si, sj = a.reg(), a.reg()                            # element offsets of the register tile
    a("mov.b64", si, 0)
    top_i = lbl("SI")
    a.label(top_i)
    a("mov.b64", sj, 0)
    top_j = lbl("SJ")
    a.label(top_j)
    q.switch(p0, lbl)
    a("setp.gt.i64", pq, q.cnt, 0)
    acc = a.reg(RM * RV)
    for r in range(RM * RV):
        a("mov.b64", acc + r, 0)
    aptr, bptr, kc = (a.reg() for _ in range(3))
    t = a.reg() if pace > 1 else None
    # A: element (row si, k 0) of the panel
    a("mul.i64", aptr, si, es if c.trans_a else c.pa)
    a("add.i64", aptr, aptr, sb)
    # B: this lane's element of column sj + lane, k 0
    a("s2r", kc, "%laneid")
    a("add.i64", bptr, sj, kc)
    a("mul.i64", bptr, bptr, c.pb if c.trans_b else es)
    a("add.i64", bptr, bptr, sb)
    a("add.i64", bptr, bptr, c.a_panel)
    a("add.i64", kc, kn, kstep - 1)
    if half:
        a("shr.u64", kc, kc, 1)                          # iterations (k-pairs)
    # operand loads: a pair from two rows of the panel is two ld.shared.u16 joined by a mad
    a_pair_rows = half and c.trans_a                     # A^T: k and k+1 are rows of the panel
    b_pair_rows = half and not c.trans_b                 # B: likewise
    bv = a.reg(RV)
    bt = [a.reg() for _ in range(2)] if b_pair_rows else []
    na = 2 if (a_pair_rows or b_pair_rows) else 3
    av = [a.reg() for _ in range(min(na, RM))]
    at = [a.reg() for _ in range(min(na, RM))] if a_pair_rows else []
    ahead = len(av) - 1                                  # rows an A load runs ahead of its FMAs
    a_row = es if c.trans_a else c.pa                    # bytes between A rows (m) in the panel
    a_k = c.pa if c.trans_a else es                      # bytes between k-steps
    b_col = c.pb if c.trans_b else es                    # bytes between B columns (n)
    b_k = es if c.trans_b else c.pb
    wide = "ld.shared.b32"                               # a pair (k, k+1) adjacent / an f32

    def load_a(i):
        r = av[i % len(av)]
        if a_pair_rows:
            a("ld.shared.u16", r, Mem(aptr, i * a_row))
            a("ld.shared.u16", at[i % len(at)], Mem(aptr, i * a_row + a_k))
        else:
            a(wide, r, Mem(aptr, i * a_row))             # every lane the same address: a broadcast

    def join_a(i):
        if a_pair_rows:
            r = av[i % len(av)]
            a("mad.i64", r, at[i % len(at)], 0x10000, r)

    loop = lbl("K")
    a.label(loop)
    for j in range(RV):
        if b_pair_rows:
            a("ld.shared.u16", bv + j, Mem(bptr, j * 32 * b_col))
            a("ld.shared.u16", bt[j % 2], Mem(bptr, j * 32 * b_col + b_k))
            if j >= 1:
                a("mad.i64", bv + (j - 1), bt[(j - 1) % 2], 0x10000, bv + (j - 1))
        else:
            a(wide, bv + j, Mem(bptr, j * 32 * b_col))
    for i in range(min(ahead, RM)):
        load_a(i)
    if b_pair_rows:
        a("mad.i64", bv + (RV - 1), bt[(RV - 1) % 2], 0x10000, bv + (RV - 1))
    join_a(0)
    for i in range(RM):
        if i + ahead < RM:
            load_a(i + ahead)
        if i + 1 < RM:
            join_a(i + 1)
        for j in range(RV):
            r = acc + i * RV + j
            a(_FMA[c.dtype], r, av[i % len(av)], bv + j, r)
        if i == 0:                                       # the DMA slot: one queued get
            if pace > 1:
                a("and.b64", t, kc, pace - 1)
                a("setp.eq.i64", pk, t, 0)
                a("and.pred", pk, pk, pq)
            q.issue(pk if pace > 1 else pq)
            a("setp.gt.i64", pq, q.cnt, 0)
    a("add.i64", aptr, aptr, kstep * a_k)
    a("add.i64", bptr, bptr, kstep * b_k)
    a("sub.i64", kc, kc, 1)
    a("setp.gt.i64", p0, kc, 0)
    a("bra", loop, p=p0)
    a.free(*av, *at, *bt)
    a.free(bv, k=RV)
    a.free(aptr, bptr, kc)
    if t is not None:
        a.free(t)

    # ---- flush the register tile into the f32 tile: lane l of (i, j) is C[si+i, sj+32j+l]
    cp = a.reg()
    a("s2r", cp, "%laneid")
    a("add.i64", cp, cp, sj)
    a("shl.b64", cp, cp, 2)
    t = a.reg()
    a("mul.i64", t, si, c.BN * 4)
    a("add.i64", cp, cp, t)
    a.free(t)
    rb = c.BN * 4
    regs = [(i, j) for i in range(RM) for j in range(RV)]
    batch = 4
    cv = [a.reg() for _ in range(batch)]
    hv = [a.reg(2) for _ in range(batch)] if half else []
    for g0 in range(0, len(regs), batch):
        grp = list(enumerate(regs[g0:g0 + batch]))
        for n, (i, j) in grp:
            a("ld.shared.b32", cv[n], Mem(cp, i * rb + j * 128))
        if half:
            for n, (i, j) in grp:
                a(_CVT_LO[c.dtype], hv[n], acc + i * RV + j)
                a(_CVT_HI[c.dtype], hv[n] + 1, acc + i * RV + j)
            for n, (i, j) in grp:
                a("add.f32", cv[n], cv[n], hv[n])
            for n, (i, j) in grp:
                a("add.f32", cv[n], cv[n], hv[n] + 1)
        else:
            for n, (i, j) in grp:
                a("add.f32", cv[n], cv[n], acc + i * RV + j)
        for n, (i, j) in grp:
            a("st.shared.b32", Mem(cp, i * rb + j * 128), cv[n])
    a.free(*cv)
    for h in hv:
        a.free(h, k=2)
    a.free(cp)
    a.free(acc, k=RM * RV)
    a("add.i64", sj, sj, c.RN)
    a("setp.lt.i64", p0, sj, nv)
    a("bra", top_j, p=p0)
    a("add.i64", si, si, RM)
    a("setp.lt.i64", p0, si, mv)
    a("bra", top_i, p=p0)
    a.free(si, sj)
    a.pfree(pq, pk)


# ----------------------------------------------------------------------------- tile choice
def _normalize(caps, dtype, out_dtype) -> tuple[str, str]:
    if dtype not in _DTYPES:
        raise InputError("gemm dtype", f"{dtype!r} is not a dtype the Sunway GEMM runs", "fp16, bf16, fp32")
    if out_dtype not in _OUTS:
        raise InputError("gemm out_dtype", f"unknown out_dtype {out_dtype!r}", "f32, f16, bf16")
    dt, out = _DTYPES[dtype], _OUTS[out_dtype]
    unit = _UNIT[dt]
    if unit not in caps.units:
        raise InputError(f"gemm dtype on {caps.name}", f"{dt} needs the {unit} vector unit, which the machine lacks",
                         ", ".join(d for d, u in _UNIT.items() if u in caps.units) or "none")
    return dt, out


def _register_tile(dt: str, N: int) -> tuple[int, int]:
    rv = 4 if N > 64 else (2 if N > 32 else 1)
    return min(ACC_REGS // rv, 16), rv


def _cost(M, N, K, BM, BN, es, cores, nbatch) -> float:
    bm, bn = min(BM, M), min(BN, N)
    tiles = _ceil(M, BM) * _ceil(N, BN) * nbatch
    waves = _ceil(tiles, max(cores, 1))
    mem = tiles * (bm + bn) * K * es / (_BW_CPE * min(tiles, cores))
    comp = waves * 2.0 * bm * bn * K / _FLOPS_CPE[es]
    return max(mem, comp) + waves * _T0


def _build(caps, cfg: SunwayCfg) -> Program:
    try:
        return _emit(cfg, caps.max_regs_per_thread)
    except _OutOfRegisters as e:
        raise InputError(f"gemm tile on {caps.name}", f"tile {cfg.BM}x{cfg.BN}: {e}",
                         f"at most {caps.max_regs_per_thread} registers a thread") from None


def choose_tile(caps, M: int, N: int, K: int, dtype: str = "fp16", out_dtype: str = "f32", trans_b: bool = False,
                *, trans_a: bool = False, alpha: float = 1.0, nbatch: int = 1) -> tuple[SunwayCfg, Program]:
    """The configuration the tile rule picks (module docstring) and its program."""
    dt, out = _normalize(caps, dtype, out_dtype)
    es = _ES[dt]
    RM0, RV0 = _register_tile(dt, N)
    vw = 32
    best = None
    for RV in (4, 2, 1):
        if RV > RV0:
            continue
        RM = min(ACC_REGS // RV, 16)
        for BK in ((128, 64) if es == 2 else (32, 16)):   # 256 / 128-byte panel rows (a small LDM: half)
            for BM in range(RM, BM_MAX + 1, RM):
                if BM > RM and BM - RM >= M:       # no use: a smaller BM covers M already
                    break
                for BN in range(RV * vw, BN_MAX + 1, RV * vw):
                    if BN > RV * vw and BN - RV * vw >= N:
                        break
                    cfg = SunwayCfg(dt, out, bool(trans_a), bool(trans_b), BM, BN, BK, RM, RV, alpha)
                    if cfg.ldm_bytes > caps.scratchpad_bytes:
                        continue
                    key = (_cost(M, N, K, BM, BN, es, caps.cores_total, nbatch), -BM * BN, -BK, -RV, abs(BM - BN))
                    if best is None or key < best[0]:
                        best = (key, cfg)
    if best is None:
        small = SunwayCfg(dt, out, bool(trans_a), bool(trans_b), 16, vw, 64 if es == 2 else 16, 16, 1, alpha)
        raise InputError(f"gemm tile on {caps.name}", f"the smallest tile {small.BM}x{small.BN} needs "
                         f"{small.ldm_bytes} B of LDM", f"at most {caps.scratchpad_bytes} B (caps.scratchpad_bytes)")
    cfg = best[1]
    return cfg, _build(caps, cfg)


# ----------------------------------------------------------------------------- API
def gemm_kernel(caps, M: int, N: int, K: int, dtype: str = "fp16", out_dtype: str = "f32",
                trans_b: bool = False, tile: Optional[Tile] = None, *, trans_a: bool = False,
                lda: Optional[int] = None, ldb: Optional[int] = None, ldc: Optional[int] = None,
                batch=(1, 1), stride_a=(0, 0), stride_b=(0, 0), stride_c=(0, 0), alpha: float = 1.0) -> GemmKernel:
    """Emit C = alpha * op(A) @ op(B) for a Sunway-family target (the same contract as
    ``gemm_gpu.gemm_kernel``): op(A) is A[M,K] (A given as [K,M] with ``trans_a``), op(B) is
    B[K,N] (B given as [N,K] with ``trans_b``), C is [M,N]; leading dimensions, the (nb, nh)
    batch over grid.z with per-batch and per-head element strides, and alpha as there.

    dtype: fp16 | bf16 (fma.f16x2 / fma.bf16x2, panel sums flushed into f32) or fp32 (fma.f32).
    out_dtype: f32, f16 or bf16. ``tile`` forces the CPE tile: BM (a multiple of the register
    tile's rows), BN (of its columns), BK (k-steps per panel, a power of two); warps must be 1 and
    stages 2 (double buffering)."""
    where = "gemm"
    M, N, K = (_int(where, n, v, 0, "an integer") for n, v in (("M", M), ("N", N), ("K", K)))
    for n, v in (("M", M), ("N", N), ("K", K)):
        if v < 1:
            raise InputError(f"gemm {n}", f"shape {M}x{N}x{K}: {n} = {v}", "M, N, K >= 1")
    if caps.family != "sunway" or not caps.has_dma:
        raise InputError(f"gemm on {caps.name}", f"the Sunway GEMM emitter targets the sunway family with DMA, "
                         f"not {caps.family}", "a sunway-family machine")
    dt, out = _normalize(caps, dtype, out_dtype)
    es = _ES[dt]
    a_cols = M if trans_a else K
    b_cols = K if trans_b else N
    lda = a_cols if lda is None else _int("gemm lda", "lda", lda, a_cols, f"lda >= {a_cols} (a row of A as stored)")
    ldb = b_cols if ldb is None else _int("gemm ldb", "ldb", ldb, b_cols, f"ldb >= {b_cols} (a row of B as stored)")
    ldc = N if ldc is None else _int("gemm ldc", "ldc", ldc, N, f"ldc >= {N} (a row of C)")
    nb, nh = _pair("gemm batch", "batch", batch, 1, "integers >= 1")
    if nb * nh > MAX_BATCH:
        raise InputError("gemm batch", f"batch {(nb, nh)}: {nb * nh} GEMMs", f"nb*nh <= {MAX_BATCH} (grid.z)")
    sa = _pair("gemm stride_a", "stride_a", stride_a, 0, "integers >= 0")
    sb = _pair("gemm stride_b", "stride_b", stride_b, 0, "integers >= 0")
    sc = _pair("gemm stride_c", "stride_c", stride_c, 0, "integers >= 0")
    if not _one_to_one(((1, N), (ldc, M), (sc[0], nb), (sc[1], nh))):
        raise InputError("gemm stride_c", f"C layout ldc={ldc}, stride_c={sc} with batch {(nb, nh)} and {M}x{N} "
                         "matrices writes some elements of C more than once",
                         "strides that, sorted, each step past the span of the smaller ones")
    try:
        alpha_f = float(alpha)
    except (TypeError, ValueError):
        raise InputError("gemm alpha", f"alpha = {alpha!r}", "a finite number") from None
    if not np.isfinite(alpha_f) or abs(alpha_f) > float(np.finfo(np.float32).max):
        raise InputError("gemm alpha", f"alpha = {alpha!r}", "a finite number within the f32 range")
    if tile is not None:
        RM, RV = _register_tile(dt, N)
        vw = 32
        ok = (isinstance(tile, tuple) and len(tile) == 5 and all(isinstance(v, (int, np.integer)) for v in tile))
        if not ok or tile[3] != 1 or tile[4] != 2:
            raise InputError("gemm tile", f"tile {tile!r}", "Tile(BM, BN, BK, warps=1, stages=2)")
        BM, BN, BK = int(tile[0]), int(tile[1]), int(tile[2])
        RV = next((v for v in (4, 2, 1) if v <= RV and BN >= v * vw and BN % (v * vw) == 0), RV)
        RM = min(ACC_REGS // RV, 16)
        if BM < RM or BM % RM or BN < RV * vw or BN % (RV * vw) or BK < (2 if es == 2 else 1) or BK & (BK - 1):
            raise InputError("gemm tile", f"tile {BM}x{BN}, BK {BK}",
                             f"BM a multiple of {RM}, BN of {vw}, BK a power of two (>= 2 for 16-bit inputs)")
        cfg = SunwayCfg(dt, out, bool(trans_a), bool(trans_b), BM, BN, BK, RM, RV, alpha_f)
        if cfg.ldm_bytes > caps.scratchpad_bytes:
            raise InputError("gemm tile", f"tile {BM}x{BN}x{BK} needs {cfg.ldm_bytes} B of LDM "
                             f"(f32 C tile {cfg.cs_bytes} + 2 stages of {cfg.stage}), it does not fit",
                             f"at most {caps.scratchpad_bytes} B (caps.scratchpad_bytes)")
        prog = _build(caps, cfg)
    else:
        cfg, prog = choose_tile(caps, M, N, K, dt, out, bool(trans_b), trans_a=bool(trans_a), alpha=alpha_f,
                                nbatch=nb * nh)
    check(prog, caps)
    launch = Launch((_ceil(N, cfg.BN), _ceil(M, cfg.BM), nb * nh), (caps.warp_width, 1, 1))
    return GemmKernel(program=prog, launch=launch, tile=Tile(cfg.BM, cfg.BN, cfg.BK, 1, 2),
                      flops=2 * M * N * K * nb * nh, M=M, N=N, K=K, dtype=dt, out_dtype=out, trans_b=bool(trans_b),
                      kind="vfma", trans_a=bool(trans_a), lda=lda, ldb=ldb, ldc=ldc, batch=(nb, nh), stride_a=sa,
                      stride_b=sb, stride_c=sc, alpha=alpha_f)
