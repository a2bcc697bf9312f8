"""GEMM kernels for the Sunway family (SW26010-Pro CPEs): C = alpha * op(A) @ op(B), LDM-tiled,
DMA double-buffered, vector FMA. The public API mirrors ``gemm_gpu`` (same ``gemm_kernel``
signature and ``GemmKernel`` fields; ``SunwayGemmKernel`` is a GemmKernel whose ``args`` add the
parameter ``nz`` = nb*nh, so ``PARAMS`` is gemm_gpu's plus ``nz``), so the block composer can pick
the module by machine family.

    caps = capabilities(load_machine("sw26010pro"))
    k = gemm_kernel(caps, 1024, 1024, 1024, dtype="fp16", out_dtype="f32")
    run_functional(k.program, k.args(A, B, C), k.launch, warp_width=32, ncores=caps.cores_total)

Execution model: a thread block is one CPE (one warp: the 32 lanes are the 512-bit vector; an
f16x2 / bf16x2 register of a lane carries two halves, so one vector op works on 64 halves, an f32
op on 32 floats) and computes BM x BN C tiles of GEMM z (z < nb*nh: the (batch, head) pair, as
on the GPU: A, B, C of GEMM z start (z // nh)*stride[0] + (z % nh)*stride[1] elements into their
buffers). Two layouts, one emitter (``SunwayCfg.bcast``):

- Broadcast layout (swDNN / swBLAS-style; the target has ``row`` and ``column`` in
  ``dma.broadcast_modes`` and a core group is its R x Cc CPE mesh, see ``bcast_layout``): a core
  group's mesh computes a macro tile of (R*BM) x (Cc*BN) of C, the CPE at mesh row r, column cc
  its (r, cc) tile. The CPEs of a mesh row need the same A rows and those of a column the same B
  columns, so every A panel is one row broadcast (``dma.get[.s].bcast.row``) and every B panel
  one column broadcast: DRAM holds each panel once per line instead of once per CPE (A is read
  once per macro-tile column, B once per macro-tile row). Blocks are persistent: the launch is
  one block per CPE of the G core groups used (G = min(groups, macro tiles)), so block b runs on
  CPE b (the engine dispatches a launch no larger than the machine in order, one block a CPE)
  and every member of a line is resident for the whole kernel (no waves mixing in a line). Core
  group g loops over macro tiles g, g+G, g+2G, ... (z-major, then m, then n; the index and the
  tile's coordinates live in LDM slots, ``SLOT_*``); all 64 CPEs of a group take the same
  sequence, so the members of a line issue the same gets, in the same order, with the same
  operands (global address, length, count / stride, LDM stage), as the rendezvous requires. A
  CPE whose tile lies outside C (an edge macro tile) has mv = 0 or nv = 0: it still joins its
  lines (its row shares A rows with CPEs that need them, its column B columns), fetches nothing
  for a line with nothing to fetch (a whole line outside C issues no get, consistently), and
  skips the zeroing, the FMAs and the puts. Deadlock-free: every CPE issues its lines' gets in
  one global order (tile, panel, A then B, row by row), so the earliest unlaunched broadcast has
  every member joined or on its way.
- One tile a block (the fallback: no broadcast on the target, or the tile rule finds it cheaper,
  e.g. a batch of tiny GEMMs where a macro tile would leave most CPEs idle): block (x, y, z) owns
  the C tile of rows y*BM .. and columns x*BN .. of GEMM z; the grid's blocks are dispatched
  over the machine's CPEs in waves, each CPE fetching its own panels with plain / strided gets.

The program's size does not depend on the problem size: M, N, K, leading dimensions, strides and
nz are kernel parameters, loops carry the rest.

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
  the FMAs run. ``_Queue.setup`` is the one place that turns a panel into transfers: in the
  broadcast layout the same gets in their ``.bcast.row`` (A) / ``.bcast.column`` (B) forms
  (the timing engine models the rendezvous, one DRAM read per line and the fan-out over the CPE
  mesh; a functional run treats a broadcast as the issuer's own get).

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
ready), and the next k-iteration's B vectors (and A row 0) load during the last row's FMAs, each
into a register its FMA has just read; the DMA slot, pointer steps and loop count take one
instruction after each FMA (an f16x2 FMA holds the vector pipe two cycles, the CPE issues one
instruction a cycle), so they fill the FMAs' second vector cycles. A panel of odd length (the K
residue) gets a zero A and B element at k = kn, so its last pair adds 0 * 0. The modelled integer
pipe charges every integer op a full 32-lane issue (2 cycles), which is why the layout avoids
per-row integer work (a k-per-instruction layout needs a ``mul.i64`` to duplicate every A
element: int-bound).

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
per row of min(BN, N-n0) elements and ``dma.wait 0`` before the CPE exits. In the broadcast
layout the puts of one macro tile overlap the gets of the next one's first panel; its
``dma.wait 0`` comes before the C tile is zeroed again.

Tile rule (``choose_tile``): (RM, RV) from N as above; BM a multiple of RM (<= 256), BN of RM's
vector width (<= 512); the candidate must fit the LDM (``caps.scratchpad_bytes``:
BM*BN*4 + 2 stages, + 64 bytes of slots in the broadcast layout) and its program the registers
(``caps.max_regs_per_thread``). Every candidate is costed in both layouts (the broadcast one only
where the target has it); the smallest estimated time wins, ties to the broadcast layout, then
to the larger tile. One tile a block:

    cost = max(tiles * (BM' + BN') * K * es / (BW * min(tiles, cores)),  waves * 2 * BM' * BN' * K / F * f)
           + waves * T0

broadcast layout (macro tiles T = nz * ceil(M / (R*BM)) * ceil(N / (Cc*BN)), rounds = ceil(T / groups)):

    cost = max(rounds * (min(R*BM, M) + min(Cc*BN, N)) * K * es / (BW * R * Cc),  rounds * 2 * BM' * BN' * K / F * f)
           + rounds * T0

with BM' = min(BM, M), BN' = min(BN, N), waves = ceil(tiles / cores) (wave quantization over
``caps.cores_total`` CPEs): the DRAM bytes of all tiles over the bandwidth of the CPEs that run
them (blocks fill the core groups one after the other, and a core group's DMA is bounded by its
controller and ring stop, so a launch of few tiles gets a share of the machine's bandwidth), or
the busiest CPE's FMA time, whichever is longer; f = ``_reg_tile_factor`` (>= 1) charges a
register tile whose k-iteration is bound by instruction issue or LDM loads rather than its FMAs
(16 x 1: 1.22, 8 x 4 and 16 x 2: 1). BW (``caps.dram_bytes_per_cycle``: the DRAM's peak over
every CPE) and F (``caps.vector_flops_per_cycle`` of the dtype) are the target's own balance:
0.356 B/cycle and 64 (16-bit) / 16 (f32) flops per cycle on sw26010pro (307.2 GB/s over 384 CPEs
at 2.25 GHz), 0.8 B/cycle on tiny-sunway. The rule only ranks tiles; the timing engine measures
them. The bandwidth term assumes the buffers
are spread over the controllers (the cross segment); with every buffer in one core group's
private segment all traffic meets at one controller and the total bytes alone decide, which
favours bigger tiles than this rule picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program

from .gemm_gpu import PARAMS as _GEMM_PARAMS
from .common import (CVT_IN, CVT_PACK, DTYPE_ALIASES, ELEM_BYTES, OUT_BYTES, OUT_DTYPE_ALIASES, Asm, OutOfRegisters,
                     ceil_div, check_int, check_pair, log2, one_to_one)
from .gemm_gpu import MAX_BATCH, GemmKernel, Tile, batch_index, batch_ptr

__all__ = ["gemm_kernel", "choose_tile", "SunwayCfg", "SunwayGemmKernel", "ACC_BITS", "PARAMS", "bcast_layout"]

# kernel parameters: gemm_gpu's and nz = nb*nh, the GEMMs of the batch (the broadcast layout's
# persistent blocks loop over them, so their count cannot come from the grid)
PARAMS = _GEMM_PARAMS + ("nz",)


@dataclass(frozen=True)
class SunwayGemmKernel(GemmKernel):
    """gemm_gpu.GemmKernel (same fields, views, reference) whose ``args`` add ``nz``."""

    def args(self, A, B, C) -> dict:
        d = super().args(A, B, C)
        d["nz"] = self.batch[0] * self.batch[1]
        return d

_UNIT = {"fp16": "fp16", "bf16": "fp16", "fp32": "fp32"}       # ISA unit class of the dtype's FMA
_FMA = {"fp16": "fma.f16x2", "bf16": "fma.bf16x2", "fp32": "fma.f32"}
_BCAST = {"A": ".bcast.row", "B": ".bcast.column"}   # broadcast layout: A shared along mesh rows, B along columns
# LDM slots of the broadcast layout (8 bytes each, after the two stages)
SLOT_TIX, SLOT_M0, SLOT_N0, SLOT_ZB, SLOT_ZH = 0, 8, 16, 24, 32
SLOT_BYTES = 64
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
# tile-rule balance (see the module docstring): the target's DRAM bytes and vector FLOP per CPE and
# cycle come from its capabilities (dram_bytes_per_cycle, vector_flops_per_cycle)
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
    bcast: bool = False    # broadcast layout: persistent blocks, A panels by row, B by column broadcast
    mesh: tuple = (0, 0)   # (rows, cols) of a core group's CPE mesh (broadcast layout)

    @property
    def es(self) -> int:
        return ELEM_BYTES[self.dtype]

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
        return ceil_div(self.a_rows * self.pa, 128) * 128

    @property
    def stage(self) -> int:
        return ceil_div(self.a_panel + self.b_rows * self.pb, 128) * 128

    @property
    def slot(self) -> int:
        """LDM offset of the broadcast layout's 8-byte slots (SLOT_*: the macro-tile index and the
        tile's coordinates, kept in the LDM across the tile instead of in registers)."""
        return self.cs_bytes + 2 * self.stage

    @property
    def ldm_bytes(self) -> int:
        return self.cs_bytes + 2 * self.stage + (SLOT_BYTES if self.bcast else 0)


# ----------------------------------------------------------------------------- emission
class _Queue:
    """The rows of the next panel still to fetch: one operand at a time (A, then B), as
    (src, dst, count, length, src step, dst step) registers plus ``ph`` = 1 while A's rows are
    queued (B's come next). ``setup`` is the one place a panel becomes transfers.

    Broadcast layout (``c.bcast``): every get of A is a row broadcast (``dma.get[.s].bcast.row``:
    the CPEs of a mesh row own the same C rows, so they fetch the same A rows into the same LDM
    stage), every get of B a column broadcast; ``pph`` mirrors ``ph`` as a predicate to pick the
    mode of a queued row. All members of a line compute the same operands (same macro tile, same
    mesh row / column, same panel), so they issue the same sequence of gets with the same
    operands, as the rendezvous requires."""

    def __init__(self, a: Asm, c: "SunwayCfg", p, gA, gB, mv, nv, p0, lbl):
        self.a, self.c, self.p, self.p0, self.lbl = a, c, p, p0, lbl
        self.strided = c.strided
        self.bcast = c.bcast
        self.g = {"A": (gA, mv), "B": (gB, nv)}
        self.src, self.dst, self.cnt, self.len, self.ss, self.ds, self.ph = (a.reg() for _ in range(7))
        self.pph = a.pred() if c.bcast else None

    def free(self) -> None:
        if self.pph is not None:
            self.a.pfree(self.pph)

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
        a("shl.b64", k0, k0, log2(c.BK))
        a("ldparam", kn, "K")
        a("sub.i64", kn, kn, k0)
        a("min.i64", kn, kn, c.BK)                        # k-steps of that panel
        a("ldparam", self.ss, "lda" if op == "A" else "ldb")
        a("shl.b64", self.ss, self.ss, log2(es))          # bytes between rows in memory
        if kmajor:                                        # rows k0 .. k0+kn-1, ext elements each
            a("mul.i64", self.src, k0, self.ss)
            a("mov.b64", self.cnt, kn)
            a("shl.b64", self.len, ext, log2(es))
            if self.bcast:                                # a tile outside C (ext = 0): nothing to fetch
                a("setp.eq.i64", self.p0, ext, 0)
                a("mov.b64", self.cnt, 0, p=self.p0)
        else:                                             # ext rows, k0 .. k0+kn-1 of each
            a("shl.b64", self.src, k0, log2(es))
            a("mov.b64", self.cnt, ext)
            a("shl.b64", self.len, kn, log2(es))
        a("add.i64", self.src, self.src, g)
        pitch = c.pa if op == "A" else c.pb
        a("mov.b64", self.ds, pitch)
        a("mov.b64", self.ph, 1 if op == "A" else 0)
        if self.bcast:
            a("setp.ne.i64", self.pph, self.ph, 0)
        if self.strided and not (op == "B" and c.trans_b):
            # rows as long as the LDM pitch (every panel but an edge tile's or the K residue's):
            # one strided get for the whole panel (athread's dma_iget_stride), packed at the
            # pitch. B^T rows keep their padded pitch (bank spread), so they go row by row.
            skip = lbl("QROWS")
            p0 = self.p0
            if self.bcast:                                # no rows (a tile outside C): no get
                a("setp.eq.i64", p0, self.cnt, 0)
                a("bra", skip, p=p0)
            a("setp.ne.i64", p0, self.len, pitch)
            a("bra", skip, p=p0)
            pair = a.reg(2)
            a("mov.b64", pair, self.len)                  # block size
            a("mov.b64", pair + 1, self.ss)               # stride
            a("dma.get.s" + (_BCAST[op] if self.bcast else ""), Mem(self.dst, 0), Mem(self.src, 0), self.cnt, pair)
            a("mov.b64", self.cnt, 0)
            a.free(pair, k=2)
            a.label(skip)
        a.free(k0, kn)

    def issue(self, pred=None) -> None:
        a = self.a
        if not self.bcast:
            a("dma.get", Mem(self.dst, 0), Mem(self.src, 0), self.len, p=pred)
        elif pred is None:
            a("dma.get" + _BCAST["A"], Mem(self.dst, 0), Mem(self.src, 0), self.len, p=self.pph)
            a("dma.get" + _BCAST["B"], Mem(self.dst, 0), Mem(self.src, 0), self.len, p=self.pph, neg=True)
        else:
            pa, pb = a.pred(), a.pred()
            a("and.pred", pa, pred, self.pph)             # an A row
            a("xor.pred", pb, pa, pred)                   # a B row
            a("dma.get" + _BCAST["A"], Mem(self.dst, 0), Mem(self.src, 0), self.len, p=pa)
            a("dma.get" + _BCAST["B"], Mem(self.dst, 0), Mem(self.src, 0), self.len, p=pb)
            a.pfree(pa, pb)
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


def _divmod_const(a: Asm, q, r, x, d: int) -> None:
    """q = x // d, r = x % d for x >= 0 and a compile-time d (shift / and when d is a power of two);
    q or r may be None, neither may be x."""
    if d & (d - 1) == 0:
        if q is not None:
            a("shr.u64", q, x, log2(d))
        if r is not None:
            a("and.b64", r, x, d - 1)
    else:
        if q is not None:
            a("div.i64", q, x, d)
        if r is not None:
            a("rem.i64", r, x, d)


def _macro_tile(a: Asm, c: SunwayCfg, p0, done: str):
    """Broadcast layout: decode the core group's current macro tile (LDM slot TIX) into this
    CPE's (m0, n0, zb, zh), stored in the slots; jump to `done` when the group has no tile left.
    Macro tiles run z-major, then m, then n: tile t of the (nz = nb*nh) GEMMs of tm x tn macro
    tiles each. The CPE at mesh (r, cc) owns C rows m0 = im*R*BM + r*BM .. and columns
    n0 = in*Cc*BN + cc*BN .. of it."""
    R, Cc = c.mesh
    MM, NN = R * c.BM, Cc * c.BN
    tix, tm, tn, tpg, w, z = (a.reg() for _ in range(6))
    a("ld.shared.b64", tix, Mem(None, c.slot + SLOT_TIX))
    a("ldparam", tm, "M")
    a("add.i64", tm, tm, MM - 1)
    a("div.i64", tm, tm, MM)                             # macro-tile rows
    a("ldparam", tn, "N")
    a("add.i64", tn, tn, NN - 1)
    a("div.i64", tn, tn, NN)                             # macro-tile columns
    a("mul.i64", tpg, tm, tn)                            # macro tiles per GEMM
    a("ldparam", w, "nz")
    a("mul.i64", w, w, tpg)
    a("setp.ge.i64", p0, tix, w)
    a("bra", done, p=p0)
    a("div.i64", z, tix, tpg)
    a("mul.i64", w, z, tpg)
    a("sub.i64", tix, tix, w)                            # tile within GEMM z
    a("div.i64", w, tix, tn)                             # im
    a("mul.i64", tm, w, tn)
    a("sub.i64", tix, tix, tm)                           # in
    a("s2r", tm, "%ctaid.x")
    _divmod_const(a, None, tm, tm, R * Cc)               # CPE index in the group (block b runs on CPE b)
    _divmod_const(a, tn, tm, tm, Cc)                     # mesh row tn, column tm
    a("mul.i64", w, w, MM)
    a("mad.i64", w, tn, c.BM, w)                         # m0
    a("st.shared.b64", Mem(None, c.slot + SLOT_M0), w)
    a("mul.i64", tix, tix, NN)
    a("mad.i64", tix, tm, c.BN, tix)                     # n0
    a("st.shared.b64", Mem(None, c.slot + SLOT_N0), tix)
    a("ldparam", tn, "nh")
    a("div.i64", w, z, tn)                               # batch
    a("mul.i64", tn, w, tn)
    a("sub.i64", z, z, tn)                               # head
    a("st.shared.b64", Mem(None, c.slot + SLOT_ZB), w)
    a("st.shared.b64", Mem(None, c.slot + SLOT_ZH), z)
    a.free(tix, tm, tn, tpg, w, z)


def _coords(a: Asm, c: SunwayCfg):
    """(m0, n0, (zb, zh)) of this CPE's C tile in new registers: from the slots (broadcast layout)
    or from the block's grid position (one tile a block)."""
    m0, n0 = a.reg(), a.reg()
    if c.bcast:
        zb, zh = a.reg(), a.reg()
        a("ld.shared.b64", m0, Mem(None, c.slot + SLOT_M0))
        a("ld.shared.b64", n0, Mem(None, c.slot + SLOT_N0))
        a("ld.shared.b64", zb, Mem(None, c.slot + SLOT_ZB))
        a("ld.shared.b64", zh, Mem(None, c.slot + SLOT_ZH))
        return m0, n0, (zb, zh)
    a("s2r", m0, "%ctaid.y")
    a("mul.i64", m0, m0, c.BM)
    a("s2r", n0, "%ctaid.x")
    a("mul.i64", n0, n0, c.BN)
    return m0, n0, batch_index(a)


class _Gemm:
    """What the steps of one GEMM program share: the assembler, the configuration, the predicate p0,
    the label maker, and the tile's operand origins (gA, gB) and valid extents (mv, nv)."""

    def __init__(self, a: Asm, c: SunwayCfg):
        self.a, self.c = a, c
        self.labels = iter(range(10**6))
        self.p0 = a.pred()
        self.gA = self.gB = self.mv = self.nv = None

    def lbl(self, s: str) -> str:
        """A new label: s and a running number."""
        return f"{s}_{next(self.labels)}"

    def idle_skip(self, target: str) -> None:
        """Broadcast layout: a CPE whose tile holds no element of C (mv * nv = 0) still takes part
        in its lines' gets but computes and stores nothing."""
        if self.c.bcast:
            a = self.a
            w = a.reg()
            a("mul.i64", w, self.mv, self.nv)
            a("setp.eq.i64", self.p0, w, 0)
            a("bra", target, p=self.p0)
            a.free(w)


def _emit(c: SunwayCfg, max_regs: int) -> Program:
    """The program of configuration c: per tile (per macro tile in the broadcast layout) the
    operand origins, the first panel's gets, the panel loop and the stores."""
    name = (f"sw_gemm_{c.dtype}_{c.out}_{'t' if c.trans_a else 'n'}{'t' if c.trans_b else 'n'}_{c.BM}x{c.BN}"
            + ("_bcast" if c.bcast else ""))
    g = _Gemm(Asm(name, PARAMS, c.ldm_bytes, limit=max_regs), c)
    a = g.a
    if c.bcast:
        _first_macro_tile(g)
    _tile_origins(g)
    p, q = _first_panel(g)
    _panel_loop(g, p, q)
    g.idle_skip("NEXT")
    _store_tile(g)
    a.label("NEXT")
    a.free(g.mv, g.nv)
    if c.bcast:
        _next_macro_tile(g)
    a("dma.wait", 0)
    a("exit")
    return a.build()


def _first_macro_tile(g: _Gemm) -> None:
    """Emits the broadcast layout's start: the core group's first macro tile into slot TIX, the
    TILE loop head, and the tile's decoding (to DONE when the group has none left)."""
    a, c = g.a, g.c
    # persistent blocks: block b is CPE b; core group g takes macro tiles g, g + G, ... (G = the
    # groups launched), its 64 CPEs all the same tile, so a mesh row / column line's members
    # always work on the same A rows / B columns
    t = a.reg()
    a("s2r", t, "%ctaid.x")
    _divmod_const(a, t, None, t, c.mesh[0] * c.mesh[1])
    a("st.shared.b64", Mem(None, c.slot + SLOT_TIX), t)
    a.free(t)
    a.label("TILE")
    _macro_tile(a, c, g.p0, "DONE")


def _tile_origins(g: _Gemm) -> None:
    """Emits the tile's valid extents mv, nv (0 for a broadcast-layout tile outside C) and its
    operands' origins gA, gB, in new registers kept on g."""
    a, c = g.a, g.c
    es = c.es
    gA, gB, mv, nv = (a.reg() for _ in range(4))
    g.gA, g.gB, g.mv, g.nv = gA, gB, mv, nv
    t, u, z = _coords(a, c)
    a("ldparam", mv, "M")
    a("sub.i64", mv, mv, t)
    a("min.i64", mv, mv, c.BM)                           # rows of C in this tile
    a("ldparam", nv, "N")
    a("sub.i64", nv, nv, u)
    a("min.i64", nv, nv, c.BN)                           # columns of C in this tile
    if c.bcast:
        a("max.i64", mv, mv, 0)
        a("max.i64", nv, nv, 0)
    batch_ptr(a, gA, "A", "sa_b", "sa_h", es, z)
    batch_ptr(a, gB, "B", "sb_b", "sb_h", es, z)
    a.free(*z)
    w = a.reg()
    if c.trans_a:                                        # A^T [K, M]: the tile's m0 columns
        a("shl.b64", w, t, log2(es))
    else:                                                # A [M, K]: rows from m0
        a("ldparam", w, "lda")
        a("mul.i64", w, w, t)
        a("shl.b64", w, w, log2(es))
    a("add.i64", gA, gA, w)
    if c.trans_b:                                        # B^T [N, K]: rows from n0
        a("ldparam", w, "ldb")
        a("mul.i64", w, w, u)
        a("shl.b64", w, w, log2(es))
    else:                                                # B [K, N]: columns from n0
        a("shl.b64", w, u, log2(es))
    a("add.i64", gB, gB, w)
    a.free(t, u, w)


def _first_panel(g: _Gemm) -> tuple:
    """Emits the prologue: panel 0's gets (p = -1: the queue fetches panel p+1), then the C tile
    zeroed; returns (p, the queue)."""
    a, c = g.a, g.c
    p = a.reg()
    q = _Queue(a, c, p, g.gA, g.gB, g.mv, g.nv, g.p0, g.lbl)
    a("mov.b64", p, -1)
    q.setup("A")
    q.drain(g.p0, g.lbl)
    a("mov.b64", p, 0)
    if c.bcast:
        a("dma.wait", 0)                                 # the previous tile's puts have read the C tile
    g.idle_skip("ZDONE")
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
    a("setp.lt.i64", g.p0, zp, c.cs_bytes)
    a("bra", "ZERO", p=g.p0)
    a.free(zp)
    a.free(zr, k=4)
    a.label("ZDONE")
    return p, q


def _panel_loop(g: _Gemm, p, q: _Queue) -> None:
    """Emits the panel loop: wait for panel p, queue panel p+1 (issued a row at a time between the
    FMAs of panel p, the rest after it), compute panel p; frees p, the queue and gA, gB."""
    a, c, p0 = g.a, g.c, g.p0
    sb, kn = a.reg(), a.reg()
    a.label("PANEL")
    a("dma.wait", 0)                                     # panel p is in the LDM
    a("add.i64", sb, p, 1)
    a("shl.b64", sb, sb, log2(c.BK))
    a("ldparam", kn, "K")
    a("mov.b64", q.cnt, 0)
    a("mov.b64", q.ph, 0)
    a("setp.lt.i64", p0, sb, kn)
    a("bra", "COMPUTE", p=p0, neg=True)
    q.setup("A")                                         # panel p+1 into the other stage
    a.label("COMPUTE")
    g.idle_skip("CDONE")
    a("and.b64", sb, p, 1)
    a("mul.i64", sb, sb, c.stage)
    a("add.i64", sb, sb, c.cs_bytes)                     # this panel's stage
    t = a.reg()
    a("shl.b64", t, p, log2(c.BK))
    a("ldparam", kn, "K")
    a("sub.i64", kn, kn, t)
    a("min.i64", kn, kn, c.BK)                           # k-steps of this panel
    a.free(t)
    if c.half:
        _pad_odd(a, c, sb, kn, p0, g.lbl)
    _compute_panel(a, c, sb, kn, g.mv, g.nv, p0, g.lbl, q)
    a.label("CDONE")
    q.drain(p0, g.lbl)
    a("add.i64", p, p, 1)
    t = a.reg()
    a("shl.b64", sb, p, log2(c.BK))
    a("ldparam", t, "K")
    a("setp.lt.i64", p0, sb, t)
    a.free(t)
    a("bra", "PANEL", p=p0)
    a.free(sb, kn, p, g.gA, g.gB, q.src, q.dst, q.cnt, q.len, q.ss, q.ds, q.ph)
    q.free()


def _store_tile(g: _Gemm) -> None:
    """Emits the epilogue of a tile: alpha and the conversion to the output dtype in place in the
    f32 tile, then one put a row of C (mv rows of nv elements)."""
    a, c = g.a, g.c
    os_ = OUT_BYTES[c.out]
    gC, lane, row, ldc, ln = (a.reg() for _ in range(5))
    t, u, z = _coords(a, c)
    batch_ptr(a, gC, "C", "sc_b", "sc_h", os_, z)
    a.free(*z)
    a("ldparam", ldc, "ldc")
    a("mul.i64", t, t, ldc)
    a("add.i64", t, t, u)
    a.free(u)
    a("shl.b64", t, t, log2(os_))
    a("add.i64", gC, gC, t)                              # C[m0, n0]
    a("shl.b64", ldc, ldc, log2(os_))
    a("shl.b64", ln, g.nv, log2(os_))
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
        for j in range(ceil_div(c.BN, 64)):              # (fp32 in: BN may end in half a vector)
            a("ld.shared.v2.b32", x, Mem(t, 256 * j))
            if c.alpha != 1.0:
                a("mul.f32", x, x, c.alpha)
                a("mul.f32", x + 1, x + 1, c.alpha)
            a(CVT_PACK[c.out], x, x, x + 1)
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
    a("sub.i64", g.mv, g.mv, 1)
    a("setp.gt.i64", g.p0, g.mv, 0)
    a("bra", "OUT", p=g.p0)
    a.free(gC, lane, row, ldc, ln, t, t2)
    a.free(x, k=2)


def _next_macro_tile(g: _Gemm) -> None:
    """Emits the broadcast layout's step to the group's next macro tile (slot TIX += the groups
    launched), back to TILE, and the DONE label."""
    a, c = g.a, g.c
    t, u = a.reg(), a.reg()
    a("ld.shared.b64", t, Mem(None, c.slot + SLOT_TIX))
    a("s2r", u, "%nctaid.x")
    _divmod_const(a, u, None, u, c.mesh[0] * c.mesh[1])
    a("add.i64", t, t, u)
    a("st.shared.b64", Mem(None, c.slot + SLOT_TIX), t)
    a.free(t, u)
    a("bra", "TILE")
    a.label("DONE")


def _pad_odd(a: Asm, c: SunwayCfg, sb, kn, p0, lbl) -> None:
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


class _Recorder:
    """Stands in for an Asm: records instructions (to be emitted later, spread between FMAs);
    registers and predicates still come from the real pool."""

    def __init__(self, a: Asm):
        self.a, self.out = a, []

    def __call__(self, *args, **kw) -> None:
        self.out.append((args, kw))

    def pred(self):
        return self.a.pred()

    def pfree(self, *ps) -> None:
        self.a.pfree(*ps)


class _Operands:
    """The k loop's operand registers and their loads from the panel: RV vectors of B at bptr and
    A rows at aptr (av, two or three rows in flight). A pair (k, k+1) from two panel rows is two
    ld.shared.u16 joined by a mad (A^T's, B's); adjacent in a row (A's, B^T's) or an f32, one
    ld.shared.b32."""

    def __init__(self, a: Asm, c: SunwayCfg, aptr, bptr):
        es, half = c.es, c.half
        self.a, self.aptr, self.bptr, self.RV = a, aptr, bptr, c.RV
        self.a_pair_rows = half and c.trans_a            # A^T: k and k+1 are rows of the panel
        self.b_pair_rows = half and not c.trans_b        # B: likewise
        self.bv = a.reg(c.RV)
        self.bt = [a.reg() for _ in range(2)] if self.b_pair_rows else []
        na = 2 if (self.a_pair_rows or self.b_pair_rows) else 3
        self.av = [a.reg() for _ in range(min(na, c.RM))]
        self.at = [a.reg() for _ in range(min(na, c.RM))] if self.a_pair_rows else []
        self.ahead = len(self.av) - 1                    # rows an A load runs ahead of its FMAs
        self.a_row = es if c.trans_a else c.pa           # bytes between A rows (m) in the panel
        self.a_k = c.pa if c.trans_a else es             # bytes between k-steps
        self.b_col = c.pb if c.trans_b else es           # bytes between B columns (n)
        self.b_k = es if c.trans_b else c.pb

    def load_a(self, i, pred=None) -> None:
        """Emits the load of A row i (of the register tile) into its av register."""
        a, av, at = self.a, self.av, self.at
        r = av[i % len(av)]
        if self.a_pair_rows:
            a("ld.shared.u16", r, Mem(self.aptr, i * self.a_row), p=pred)
            a("ld.shared.u16", at[i % len(at)], Mem(self.aptr, i * self.a_row + self.a_k), p=pred)
        else:
            a("ld.shared.b32", r, Mem(self.aptr, i * self.a_row), p=pred)   # every lane the same address: a broadcast

    def join_a(self, i, pred=None) -> None:
        """Emits the mad joining A row i's two halves (A^T only)."""
        if self.a_pair_rows:
            r = self.av[i % len(self.av)]
            self.a("mad.i64", r, self.at[i % len(self.at)], 0x10000, r, p=pred)

    def load_b(self, j, pred=None) -> None:
        """Emits the load of vector j of B at bptr into bv + j."""
        a, bv = self.a, self.bv
        if self.b_pair_rows:
            a("ld.shared.u16", bv + j, Mem(self.bptr, j * 32 * self.b_col), p=pred)
            a("ld.shared.u16", self.bt[j % 2], Mem(self.bptr, j * 32 * self.b_col + self.b_k), p=pred)
        else:
            a("ld.shared.b32", bv + j, Mem(self.bptr, j * 32 * self.b_col), p=pred)

    def join_b(self, j, pred=None) -> None:
        """Emits the mad joining vector j of B's two halves (B, not B^T)."""
        if self.b_pair_rows:
            self.a("mad.i64", self.bv + j, self.bt[j % 2], 0x10000, self.bv + j, p=pred)

    def free(self) -> None:
        """Frees the operand registers."""
        self.a.free(*self.av, *self.at, *self.bt)
        self.a.free(self.bv, k=self.RV)


def _compute_panel(a: Asm, c: SunwayCfg, sb, kn, mv, nv, p0, lbl, q: _Queue) -> None:
    """C tile (f32, LDM) += op(A panel) @ op(B panel) over kn k-steps, register tile by register
    tile (only those holding valid rows / columns); one queued get every _pace(c) iterations.

    f16 / bf16 (c.half): an iteration is a k-pair; lane l of vector j of row i accumulates
    (A[i,k] B[k,n], A[i,k+1] B[k+1,n]) for n = sj + 32j + l in its two halves. fp32: an iteration
    is one k-step, lane l holds column sj + 32j + l."""
    RM, RV = c.RM, c.RV
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
    _k_loop(a, c, sb, kn, si, sj, acc, (p0, pq, pk), lbl, q)
    _flush_tile(a, c, si, sj, acc)
    a.free(acc, k=RM * RV)
    a("add.i64", sj, sj, c.RN)
    a("setp.lt.i64", p0, sj, nv)
    a("bra", top_j, p=p0)
    a("add.i64", si, si, RM)
    a("setp.lt.i64", p0, si, mv)
    a("bra", top_i, p=p0)
    a.free(si, sj)
    a.pfree(pq, pk)


def _k_loop(a: Asm, c: SunwayCfg, sb, kn, si, sj, acc, preds, lbl, q: _Queue) -> None:
    """Emits the k loop of the register tile at (si, sj): acc += its A rows x B vectors over the
    panel's kn k-steps, loads running ahead of their FMAs; preds = (p0, pq, pk): the loop, rows
    queued, this iteration's get."""
    es, RM, RV, half = c.es, c.RM, c.RV, c.half
    p0 = preds[0]
    kstep = 2 if half else 1                             # k-steps an iteration
    pace = _pace(c)
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
    o = _Operands(a, c, aptr, bptr)
    # B of the first k-iteration; each iteration loads the next one's B during its last row's FMAs
    for j in range(RV):
        o.load_b(j)
        if j >= 1:
            o.join_b(j - 1)
    o.join_b(RV - 1)
    # A row 0 likewise when its registers are free during the last row (row RM-1 uses others)
    pre_a = o.ahead >= 1 and (RM - 1) % len(o.av) != 0 and (not o.at or (RM - 1) % len(o.at) != 0)
    if pre_a:
        o.load_a(0)
        o.join_a(0)
    loop = lbl("K")
    a.label(loop)
    for i in range(1 if pre_a else 0, min(o.ahead, RM)):
        o.load_a(i)
    if not pre_a:
        o.join_a(0)
    fill = _loop_slots(a, q, t, kc, bptr, preds, pace, kstep * o.b_k)
    _k_iteration(a, c, o, acc, fill, ("add.i64", aptr, aptr, kstep * o.a_k), p0)
    if pre_a:
        o.load_a(0, p0)
    o.join_b(RV - 1, p0)
    if pre_a:
        o.join_a(0, p0)
    a("bra", loop, p=p0)
    o.free()
    a.free(aptr, bptr, kc)
    if t is not None:
        a.free(t)


def _loop_slots(a: Asm, q: _Queue, t, kc, bptr, preds, pace: int, b_step: int) -> list:
    """The k loop's integer work, recorded (not emitted) as (args, kwargs): every pace-th
    iteration one queued get, then the B pointer step and the loop count."""
    p0, pq, pk = preds
    # the DMA slot (one queued get), the pointer steps and the loop count go one instruction into
    # each FMA's second vector cycle (the in-order CPE issues one instruction a cycle; an f16x2
    # FMA holds the vector pipe two), not as a block of integer ops between the FMAs
    rec = _Recorder(a)
    if pace > 1:
        rec("and.b64", t, kc, pace - 1)
        rec("setp.eq.i64", pk, t, 0)
        rec("and.pred", pk, pk, pq)
    q.a = rec
    q.issue(pk if pace > 1 else pq)
    q.a = a
    rec("setp.gt.i64", pq, q.cnt, 0)
    rec("add.i64", bptr, bptr, b_step)
    rec("sub.i64", kc, kc, 1)
    rec("setp.gt.i64", p0, kc, 0)                         # another iteration follows
    return rec.out


def _k_iteration(a: Asm, c: SunwayCfg, o: _Operands, acc, fill: list, a_step: tuple, p0) -> None:
    """Emits the FMAs of one k-iteration, row by row, with the next rows' A loads ahead of them,
    the recorded fill (and the A pointer step a_step, once the last A row is loaded) one
    instruction after an FMA, and the next iteration's B loads during the last row's FMAs."""
    RM, RV = c.RM, c.RV
    for i in range(RM):
        if i + o.ahead < RM:
            o.load_a(i + o.ahead)
            if i + o.ahead == RM - 1:                    # the last A row of this iteration is loaded
                fill.append((a_step, {}))
        if i + 1 < RM:
            o.join_a(i + 1)
        last = i == RM - 1
        if last:                                         # everything before the next B loads
            while fill:
                args, kw = fill.pop(0)
                a(*args, **kw)
        for j in range(RV):
            r = acc + i * RV + j
            a(_FMA[c.dtype], r, o.av[i % len(o.av)], o.bv + j, r)
            if last:                                     # bv + j is free: the next iteration's B
                o.load_b(j, p0)
                if j >= 1:
                    o.join_b(j - 1, p0)
            elif fill:
                args, kw = fill.pop(0)
                a(*args, **kw)


def _flush_tile(a: Asm, c: SunwayCfg, si, sj, acc) -> None:
    """Emits the flush of the register tile into the f32 tile: lane l of (i, j) is
    C[si+i, sj+32j+l] (16-bit accumulators: both halves converted and added)."""
    RM, RV, half = c.RM, c.RV, c.half
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
            lo, hi = CVT_IN[c.dtype]
            for n, (i, j) in grp:
                a(lo, hv[n], acc + i * RV + j)
                a(hi, hv[n] + 1, acc + i * RV + j)
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


# ----------------------------------------------------------------------------- tile choice
def _normalize(caps, dtype, out_dtype) -> tuple[str, str]:
    if dtype not in DTYPE_ALIASES:
        raise InputError("gemm dtype", f"{dtype!r} is not a dtype the Sunway GEMM runs", "fp16, bf16, fp32")
    if out_dtype not in OUT_DTYPE_ALIASES:
        raise InputError("gemm out_dtype", f"unknown out_dtype {out_dtype!r}", "f32, f16, bf16")
    dt, out = DTYPE_ALIASES[dtype], OUT_DTYPE_ALIASES[out_dtype]
    unit = _UNIT[dt]
    if unit not in caps.units:
        raise InputError(f"gemm dtype on {caps.name}", f"{dt} needs the {unit} vector unit, which the machine lacks",
                         ", ".join(d for d, u in _UNIT.items() if u in caps.units) or "none")
    return dt, out


def _register_tile(dt: str, N: int) -> tuple[int, int]:
    rv = 4 if N > 64 else (2 if N > 32 else 1)
    return min(ACC_REGS // rv, 16), rv


def _reg_tile_factor(RM: int, RV: int, es: int) -> float:
    """Cycles of one k-iteration of an RM x RV register tile over its vector-FMA cycles (>= 1): the
    in-order CPE issues one instruction a cycle (RM*RV FMAs, RM + RV operand loads, ~6 loop and
    DMA-slot integer ops) and its LSU takes 2 cycles a 32-lane load (choice: sw26010pro's rates),
    so a 16 x 1 tile is load-bound where an 8 x 4 one is FMA-bound."""
    vec = RM * RV * (2 if es == 2 else 4)
    return max(vec, RM * RV + RM + RV + 6, 2 * (RM + RV)) / vec


def _cost(M, N, K, BM, BN, es, cores, nbatch, bw, flops, f=1.0) -> float:
    """One tile a block: ``bw`` DRAM bytes and ``flops`` vector FLOP per CPE and cycle."""
    bm, bn = min(BM, M), min(BN, N)
    tiles = ceil_div(M, BM) * ceil_div(N, BN) * nbatch
    waves = ceil_div(tiles, max(cores, 1))
    mem = tiles * (bm + bn) * K * es / (bw * min(tiles, cores))
    comp = waves * 2.0 * bm * bn * K / flops * f
    return max(mem, comp) + waves * _T0


def bcast_layout(caps) -> Optional[tuple[int, int]]:
    """The mesh (rows, cols) the broadcast layout uses on this target, or None (fall back to one
    tile a block with per-CPE gets): it needs row and column broadcast gets and a core group that
    is exactly its CPE mesh."""
    R, Cc, P = caps.mesh_rows, caps.mesh_cols, caps.cores_per_group
    if not {"row", "column"} <= set(caps.dma_broadcast_modes) or R < 1 or Cc < 1 or R * Cc != P:
        return None
    if caps.cores_total % P or caps.max_blocks_per_core != 1 or caps.warp_slots != 1:
        return None
    return (R, Cc)


def _macro_tiles(M, N, BM, BN, mesh, nbatch) -> int:
    return ceil_div(M, mesh[0] * BM) * ceil_div(N, mesh[1] * BN) * nbatch


def _cost_bcast(M, N, K, BM, BN, es, mesh, groups, nbatch, bw, flops, f=1.0) -> float:
    """The broadcast layout: a core group computes a (R*BM) x (Cc*BN) macro tile, reading its A
    rows and B columns once (row / column broadcast); groups take macro tiles in rounds."""
    R, Cc = mesh
    bm, bn = min(BM, M), min(BN, N)
    rounds = ceil_div(_macro_tiles(M, N, BM, BN, mesh, nbatch), groups)
    mem = rounds * (min(R * BM, M) + min(Cc * BN, N)) * K * es / (bw * R * Cc)
    comp = rounds * 2.0 * bm * bn * K / flops * f
    return max(mem, comp) + rounds * _T0


def _build(caps, cfg: SunwayCfg) -> Program:
    try:
        return _emit(cfg, caps.max_regs_per_thread)
    except OutOfRegisters as e:
        raise InputError(f"gemm tile on {caps.name}", f"tile {cfg.BM}x{cfg.BN}: {e}",
                         f"at most {caps.max_regs_per_thread} registers a thread") from None


def choose_tile(caps, M: int, N: int, K: int, dtype: str = "fp16", out_dtype: str = "f32", trans_b: bool = False,
                *, trans_a: bool = False, alpha: float = 1.0, nbatch: int = 1) -> tuple[SunwayCfg, Program]:
    """The configuration the tile rule picks (module docstring) and its program."""
    dt, out = _normalize(caps, dtype, out_dtype)
    es = ELEM_BYTES[dt]
    RM0, RV0 = _register_tile(dt, N)
    vw = 32
    mesh = bcast_layout(caps)
    groups = caps.cores_total // caps.cores_per_group if mesh else 0
    bw, flops = caps.dram_bytes_per_cycle, dict(caps.vector_flops_per_cycle)[dt]
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
                    for lay in ((mesh, None) if mesh else (None,)):   # broadcast layout, one tile a block
                        cfg = SunwayCfg(dt, out, bool(trans_a), bool(trans_b), BM, BN, BK, RM, RV, alpha,
                                        bcast=lay is not None, mesh=lay or (0, 0))
                        if cfg.ldm_bytes > caps.scratchpad_bytes:
                            continue
                        f = _reg_tile_factor(RM, RV, es)
                        cost = (_cost_bcast(M, N, K, BM, BN, es, lay, groups, nbatch, bw, flops, f) if lay
                                else _cost(M, N, K, BM, BN, es, caps.cores_total, nbatch, bw, flops, f))
                        key = (cost, lay is None, -BM * BN, -BK, -RV, abs(BM - BN))
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
    M, N, K = (check_int(where, n, v, 0, "an integer") for n, v in (("M", M), ("N", N), ("K", K)))
    for n, v in (("M", M), ("N", N), ("K", K)):
        if v < 1:
            raise InputError(f"gemm {n}", f"shape {M}x{N}x{K}: {n} = {v}", "M, N, K >= 1")
    if caps.family != "sunway" or not caps.has_dma:
        raise InputError(f"gemm on {caps.name}", f"the Sunway GEMM emitter targets the sunway family with DMA, "
                         f"not {caps.family}", "a sunway-family machine")
    dt, out = _normalize(caps, dtype, out_dtype)
    es = ELEM_BYTES[dt]
    a_cols = M if trans_a else K
    b_cols = K if trans_b else N
    lda = a_cols if lda is None else check_int("gemm lda", "lda", lda, a_cols,
                                               f"lda >= {a_cols} (a row of A as stored)")
    ldb = b_cols if ldb is None else check_int("gemm ldb", "ldb", ldb, b_cols,
                                               f"ldb >= {b_cols} (a row of B as stored)")
    ldc = N if ldc is None else check_int("gemm ldc", "ldc", ldc, N, f"ldc >= {N} (a row of C)")
    nb, nh = check_pair("gemm batch", "batch", batch, 1, "integers >= 1")
    if nb * nh > MAX_BATCH:
        raise InputError("gemm batch", f"batch {(nb, nh)}: {nb * nh} GEMMs", f"nb*nh <= {MAX_BATCH} (grid.z)")
    sa = check_pair("gemm stride_a", "stride_a", stride_a, 0, "integers >= 0")
    sb = check_pair("gemm stride_b", "stride_b", stride_b, 0, "integers >= 0")
    sc = check_pair("gemm stride_c", "stride_c", stride_c, 0, "integers >= 0")
    if not one_to_one(((1, N), (ldc, M), (sc[0], nb), (sc[1], nh))):
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
        mesh = bcast_layout(caps)
        cfg = SunwayCfg(dt, out, bool(trans_a), bool(trans_b), BM, BN, BK, RM, RV, alpha_f,
                        bcast=mesh is not None, mesh=mesh or (0, 0))
        if cfg.ldm_bytes > caps.scratchpad_bytes:
            raise InputError("gemm tile", f"tile {BM}x{BN}x{BK} needs {cfg.ldm_bytes} B of LDM "
                             f"(f32 C tile {cfg.cs_bytes} + 2 stages of {cfg.stage}), it does not fit",
                             f"at most {caps.scratchpad_bytes} B (caps.scratchpad_bytes)")
        prog = _build(caps, cfg)
    else:
        cfg, prog = choose_tile(caps, M, N, K, dt, out, bool(trans_b), trans_a=bool(trans_a), alpha=alpha_f,
                                nbatch=nb * nh)
    check(prog, caps)
    if cfg.bcast:      # persistent blocks, one a CPE, of the core groups that get a macro tile
        groups = min(caps.cores_total // caps.cores_per_group, _macro_tiles(M, N, cfg.BM, cfg.BN, cfg.mesh, nb * nh))
        launch = Launch((groups * caps.cores_per_group, 1, 1), (caps.warp_width, 1, 1))
    else:
        launch = Launch((ceil_div(N, cfg.BN), ceil_div(M, cfg.BM), nb * nh), (caps.warp_width, 1, 1), spread=True)
    return SunwayGemmKernel(program=prog, launch=launch, tile=Tile(cfg.BM, cfg.BN, cfg.BK, 1, 2),
                      flops=2 * M * N * K * nb * nh, M=M, N=N, K=K, dtype=dt, out_dtype=out, trans_b=bool(trans_b),
                      kind="vfma", trans_a=bool(trans_a), lda=lda, ldb=ldb, ldc=ldc, batch=(nb, nh), stride_a=sa,
                      stride_b=sb, stride_c=sc, alpha=alpha_f)
