"""Fused (flash) attention backward for the GPU family: dQ, dK, dV of O = softmax(scale Q K^T + mask) V.

    caps = capabilities(load_machine("a100"))
    g = flash_attention_grad_kernel(caps, batch=2, heads=3, q_len=70, kv_len=70, head_dim=64,
                                    dtype="fp16", causal=True)
    Q, K, V, O, dO, LSE = g.random_inputs(seed=0)
    bufs = g.buffers(Q, K, V, O, dO, LSE)          # + outputs dQ, dK, dV and the workspaces
    for part in g.parts:                           # attn.grad.pre, attn.grad.dkdv, attn.grad.dq
        run_functional(part.program, g.part_args(part, bufs), part.launch, warp_width=32)
    dq, dk, dv = g.outputs(bufs)

The ISA has no atomics (no red / atom in isa/opcodes.yaml), so dQ is not accumulated across key
blocks: as some FlashAttention-2 implementations do, a second kernel parallel over query blocks
recomputes P and dS and accumulates dQ in registers. Three kernels (FlashAttention-2's
backward, Dao 2023, Algorithm 2, split in two):

- ``attn.grad.pre``: grid (q_pad / 128, heads, batch), one thread per query row. D = rowsum(dO o O)
  in fp32 and NL = -LSE * log2(e) into two fp32 workspaces [batch, heads, q_pad] (q_pad = q_len
  rounded up to 64). Rows past q_len get D = 0 and NL = -inf, so every recomputed probability of
  such a row is ex2(-inf) = 0: the query tail needs no mask in the kernels below.
- ``attn.grad.dkdv``: grid (ceil(kv_len / Bk), heads, batch), Bk = 16 x warps key rows a block,
  16 a warp. K and V of the warp's rows are loaded once into mma A-fragment registers straight
  from global memory (rows clamped to kv_len - 1); dK and dV accumulate in registers. Query
  tiles of Br rows (Q and dO) stream through two cp.async shared-memory stages (double
  buffered, swizzled as the forward's K/V tiles). Per tile, all on mma.m16n8k16 in fp32:
  S^T = K Q^T, P^T = ex2(c S^T + NL) (c = scale log2 e), dP^T = V dO^T, dS^T = P^T o (dP^T - D),
  dV += P^T dO, dK += dS^T Q. P^T and dS^T go from the C fragments straight into the A operand
  (the forward's register trick) after one cvt to f16x2 / bf16x2. Causal: a block starts at the
  first query tile that sees its first key, and only tiles crossing the diagonal run the mask.
  Epilogue: dK * scale, both converted to the storage dtype.
- ``attn.grad.dq``: grid (ceil(q_len / Bq), heads, batch), Bq = 16 x warps query rows. Q and dO
  fragments in registers, K and V tiles of Bc rows double-buffered in shared memory; per tile
  S = Q K^T, P = ex2(c S + NL), dP = dO V^T, dS = P o (dP - D), dQ += dS K; causal tiles above
  the diagonal are skipped and key rows past kv_len masked, as in the forward. dQ * scale is
  stored in the storage dtype.

Layout (elements, row-major, as the forward's): Q (b, i, head, j) at Q + q_off + (b q_len + i) q_ld
+ head d + j; K, V with kv_len, kv_ld, k_off / v_off; O and dO with o_ld (o_off, do_off); dQ like
Q (q_ld, dq_off), dK and dV like K (kv_ld, dk_off, dv_off). LSE is fp32 [batch, heads, q_len]
contiguous (the forward's with_lse output, natural log). The op graph's fused QKV buffer [T, 3h]
and its gradient d_qkv [T, 3h] are read and written in place with q_ld = kv_ld = 3h and offsets
0, h, 2h (``qkv_buffers``). fp16 / bf16 only (tensor units); fp32 and targets whose tensor units
lack the dtype are an InputError (there is no FFMA backward).

Tile rule: warps 4 then 2; tiles 64, 32, 16; the first whose shared memory and registers fit.

``flops`` counts the math the three kernels execute: pre 2d per query row; dkdv per unmasked
(query, key) pair 4 matmuls (S, dP, dV, dK: 8d) + 4 (P: 2, dS: 2); dq 3 matmuls (S, dP, dQ: 6d)
+ 4. ``model_flops`` is the textbook 2 x forward = 4 matmuls of 2d per pair over the full
q_len x kv_len: dkdv 3 of them, dq 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program
from archsim.workloads.emit.attention_gpu import (LOG2E, c_to_a, causal_pairs, check_attention_args, kv_tile_counts,
                                                  ldmatrix_bases, pipelined)
from archsim.workloads.emit.common import (CVT_IN, CVT_OUT, ELEM_BYTES, HOST_DTYPE, MMA_OP, Asm, OutOfRegisters,
                                          ceil_div, log2, swizzle_offset)
from archsim.workloads.emit.gemm_gpu import to_float, to_host

__all__ = ["AttentionGradKernel", "GradPart", "flash_attention_grad_kernel", "attention_grad_reference"]

Q_PAD = 64                    # rows of the D / NL workspaces: q_len rounded up to a multiple of this
PRE_THREADS = 128
WARP_CHOICES = (4, 2)         # warps a block (16 rows of the block's own dimension each)
TILE_CHOICES = (64, 32, 16)   # rows of the streamed dimension a tile
SCALARS = ("q_len", "kv_len", "q_pad", "q_ld", "kv_ld", "o_ld",
           "q_off", "k_off", "v_off", "o_off", "do_off", "dq_off", "dk_off", "dv_off")
PRE_PARAMS = ("O", "dO", "LSE", "D", "NL") + SCALARS
DKDV_PARAMS = ("Q", "K", "V", "dO", "D", "NL", "dK", "dV") + SCALARS
DQ_PARAMS = ("Q", "K", "V", "dO", "D", "NL", "dQ") + SCALARS


# ----------------------------------------------------------------------------- shared emit helpers
class _Ctx:
    """Registers every kernel of the backward sets up: thread, lane, warp, block coordinates."""

    def __init__(self, a: Asm):
        self.a = a
        self.tid, self.lane, self.warp = a.reg(), a.reg(), a.reg()
        self.bq, self.hd, self.blk = a.reg(), a.reg(), a.reg()
        a("s2r", self.tid, "%tid.x")
        a("and.b64", self.lane, self.tid, 31)
        a("shr.u64", self.warp, self.tid, 5)
        a("s2r", self.bq, "%ctaid.z")
        a("s2r", self.hd, "%ctaid.y")
        a("s2r", self.blk, "%ctaid.x")


def _row_ptr(a: Asm, dst, buf: str, bq, rows, row, ld_name: str, off_name: str, hd, d: int, colb=None):
    """dst = buf + 2*((bq*rows + row)*ld + hd*d + off) + colb (bytes)."""
    t = a.reg()
    a("mul.i64", t, bq, rows)
    a("add.i64", t, t, row)
    a("ldparam", dst, ld_name)
    a("mul.i64", t, t, dst)
    a("mad.i64", t, hd, d, t)
    a("ldparam", dst, off_name)
    a("add.i64", t, t, dst)
    a("shl.b64", t, t, 1)
    a("ldparam", dst, buf)
    a("add.i64", dst, dst, t)
    if colb is not None:
        a("add.i64", dst, dst, colb)
    a.free(t)


def _load_a_frags(a: Asm, dst, KQ: int, ptrA, ptrB):
    """mma A fragments of a 16 x 16*KQ row-major operand straight from global memory: ptrA / ptrB
    point at element (g, 2t) / (g + 8, 2t) of the operand (rows g, g + 8 of this lane)."""
    for ks in range(KQ):
        a("ld.global.b32", dst + 4 * ks, Mem(ptrA, 32 * ks))
        a("ld.global.b32", dst + 4 * ks + 1, Mem(ptrB, 32 * ks))
        a("ld.global.b32", dst + 4 * ks + 2, Mem(ptrA, 32 * ks + 16))
        a("ld.global.b32", dst + 4 * ks + 3, Mem(ptrB, 32 * ks + 16))


class _TileStream:
    """Two operands (X then Y) of T rows each, double-buffered through two shared-memory stages
    by cp.async.16; source rows clamped to lim."""

    def __init__(self, a: Asm, cx: _Ctx, d: int, T: int, threads: int, lay: str, rows_reg, lim,
                 x: tuple, y: tuple):
        self.a, self.T = a, T
        RB = 2 * d
        self.RB, self.TB = RB, T * RB
        CPR = RB // 16
        self.RS = threads // CPR
        if self.RS > T or T % self.RS:
            raise OutOfRegisters(f"a {T}-row tile of {CPR} chunks a row does not split over {threads} threads")
        r0, cb = a.reg(), a.reg()
        a("shr.u64", r0, cx.tid, log2(CPR))
        a("and.b64", cb, cx.tid, CPR - 1)
        a("shl.b64", cb, cb, 4)
        self.soff = a.reg()
        a("mov.b64", self.soff, cb)
        swizzle_offset(a, self.soff, r0, self.soff, lay, RB, 0)
        zero = a.reg()
        a("mov.b64", zero, 0)
        self.g, self.ld = [], []
        for buf, ld_name, off_name in (x, y):
            g, ldb = a.reg(), a.reg()
            _row_ptr(a, g, buf, cx.bq, rows_reg, zero, ld_name, off_name, cx.hd, d, cb)
            a("ldparam", ldb, ld_name)
            a("shl.b64", ldb, ldb, 1)
            self.g.append(g)
            self.ld.append(ldb)
        a.free(zero, cb)
        self.r0, self.lim = r0, lim
        self.rj = a.reg()

    def release(self):
        """Free the stream's registers (after its last copies)."""
        self.a.free(self.r0, self.rj, self.soff, *self.g, *self.ld)

    def start(self, first_row):
        """The next copy reads tile rows first_row + r0 + RS*i."""
        self.a("add.i64", self.rj, first_row, self.r0)

    def copies(self, stage, guard=None):
        a = self.a
        if isinstance(stage, int):
            sb, imm = self.soff, stage
        else:
            sb, imm = a.reg(), 0
            a("add.i64", sb, stage, self.soff)
        t, p = a.reg(), a.reg()
        for i in range(self.T // self.RS):
            a("add.i64", t, self.rj, self.RS * i)
            a("min.i64", t, t, self.lim)
            for w in range(2):
                a("mad.i64", p, t, self.ld[w], self.g[w])
                a("cp.async.16", Mem(sb, imm + w * self.TB + self.RS * i * self.RB), Mem(p, 0), p=guard)
        a("cp.async.commit")
        a("add.i64", self.rj, self.rj, self.T)
        a.free(t, p)
        if sb is not self.soff:
            a.free(sb)


def _store_rows(a: Asm, cx: _Ctx, acc, NO: int, d: int, cvt: str, row0, rows_len, buf: str, ld_name: str,
                off_name: str, scale: Optional[float]):
    """Store a warp's 16 x d fp32 C-fragment accumulators (rows row0 + g, row0 + g + 8) to buf in
    the storage dtype (times scale), each row under row < rows_len."""
    row, ptr, ptrB, x, t1 = a.reg(), a.reg(), a.reg(), a.reg(), a.reg()
    pm, pB = a.pred(), a.pred()
    a("shr.u64", t1, cx.lane, 2)
    a("add.i64", row, row0, t1)
    a("setp.lt.i64", pm, row, rows_len)
    a("add.i64", t1, row, 8)
    a("setp.lt.i64", pB, t1, rows_len)
    a("and.b64", t1, cx.lane, 3)
    a("shl.b64", t1, t1, 2)
    _row_ptr(a, ptr, buf, cx.bq, rows_len, row, ld_name, off_name, cx.hd, d, t1)
    a("ldparam", x, ld_name)
    a("shl.b64", x, x, 4)                                  # 8 rows
    a("add.i64", ptrB, ptr, x)
    for nt in range(NO):
        for r, (pr, pp) in enumerate(((pm, ptr), (pB, ptrB))):
            c = acc + 4 * nt + 2 * r
            if scale is not None:
                a("mul.f32", c, c, scale)
                a("mul.f32", c + 1, c + 1, scale)
            a(cvt, x, c, c + 1)
            a("st.global.b32", Mem(pp, 16 * nt), x, p=pr)
    a.free(row, ptr, ptrB, x, t1)
    a.pfree(pm, pB)


def _ws_ptr(a: Asm, cx: _Ctx, dst, name: str, row):
    """dst = name + 4*((bq*heads + hd)*q_pad + row) (a D / NL workspace element)."""
    t = a.reg()
    a("s2r", t, "%nctaid.y")
    a("mad.i64", t, cx.bq, t, cx.hd)
    a("ldparam", dst, "q_pad")
    a("mad.i64", t, t, dst, row)
    a("shl.b64", t, t, 2)
    a("ldparam", dst, name)
    a("add.i64", dst, dst, t)
    a.free(t)


# ----------------------------------------------------------------------------- attn.grad.pre
def _emit_pre(dtype: str, d: int) -> Program:
    a = Asm(f"flash_attn_bwd_pre_{dtype}_d{d}", PRE_PARAMS, 0)
    cx = _Ctx(a)
    row, Lq, po, pd, acc, nl, t = (a.reg() for _ in range(7))
    xo, xd = a.reg(4), a.reg(4)
    a("shl.b64", row, cx.blk, log2(PRE_THREADS))
    a("add.i64", row, row, cx.tid)
    pv, pq = a.pred(), a.pred()
    a("ldparam", t, "q_pad")
    a("setp.lt.i64", pq, row, t)
    a("ldparam", Lq, "q_len")
    a("setp.lt.i64", pv, row, Lq)
    a("sub.i64", t, Lq, 1)
    a("min.i64", t, t, row)                                  # loads from a clamped row
    _row_ptr(a, po, "O", cx.bq, Lq, t, "o_ld", "o_off", cx.hd, d)
    _row_ptr(a, pd, "dO", cx.bq, Lq, t, "o_ld", "do_off", cx.hd, d)
    lo, hi = CVT_IN[dtype]
    a("mov.f32", acc, 0.0)
    for ch in range(d // 8):
        a("ld.global.v4.b32", xo, Mem(po, 16 * ch))
        a("ld.global.v4.b32", xd, Mem(pd, 16 * ch))
        for e in range(4):
            for cv in (lo, hi):
                a(cv, nl, xo + e)
                a(cv, t, xd + e)
                a("fma.f32", acc, nl, t, acc)
    # NL = -LSE log2(e) from LSE[(b*heads + h)*q_len + row] (row clamped)
    a("s2r", t, "%nctaid.y")
    a("mad.i64", t, cx.bq, t, cx.hd)
    a("sub.i64", po, Lq, 1)
    a("min.i64", po, po, row)
    a("mad.i64", t, t, Lq, po)
    a("shl.b64", t, t, 2)
    a("ldparam", po, "LSE")
    a("add.i64", po, po, t)
    a("ld.global.b32", nl, Mem(po, 0))
    a("mul.f32", nl, nl, -LOG2E)
    a("mov.f32", acc, 0.0, p=pv, neg=True)                   # padding rows: D = 0, NL = -inf
    a("mov.f32", nl, float("-inf"), p=pv, neg=True)
    _ws_ptr(a, cx, po, "D", row)
    a("st.global.b32", Mem(po, 0), acc, p=pq)
    _ws_ptr(a, cx, po, "NL", row)
    a("st.global.b32", Mem(po, 0), nl, p=pq)
    a("exit")
    return a.build()


# ----------------------------------------------------------------------------- dkdv and dq: shared steps
@dataclass(frozen=True)
class _Cfg:
    dtype: str
    d: int
    causal: bool
    warps: int
    T: int              # rows of a streamed tile (queries in dkdv, keys in dq)
    c: float            # scale * log2(e)
    scale: float
    kv_smem: bool = False   # dkdv: K / V of the block staged in shared memory, A fragments by ldmatrix per use


class _GradCtx:
    """A dkdv / dq kernel being emitted: the tile geometry (from _Cfg: `T` rows of the streamed
    dimension a tile, 16 rows of the block's own dimension a warp), its Asm, and the registers
    that more than one step of the kernel uses. kvs: K / V in shared memory (dkdv's kv_smem)."""

    def __init__(self, c: _Cfg, kvs: bool):
        self.c = c
        self.d, self.T, self.W = d, T, W = c.d, c.T, c.warps
        self.threads, self.Bown = 32 * W, 16 * W  # threads; rows of the block's own dimension
        self.RB = RB = 2 * d
        self.lay = "sw64" if RB == 64 else "sw128"
        self.TB = T * RB
        self.SB = 2 * self.TB                     # a stage: the two streamed tiles
        self.KQ, self.NS, self.NO, self.KP, self.NP = d // 16, T // 8, d // 8, T // 16, d // 16
        self.mma, self.cvt = MMA_OP[c.dtype], CVT_OUT[c.dtype]
        self.kvs = kvs
        # the registers are attributes set by the steps that allocate them


def _block_rows(ctx: _GradCtx) -> None:
    """Emit the block coordinates, the shapes, the block's first row and this lane's row g (scratch t1, t2)."""
    a = ctx.a
    ctx.cx = cx = _Ctx(a)
    Lq, Lk, first, lane_row, t1, t2 = (a.reg() for _ in range(6))
    a("ldparam", Lq, "q_len")
    a("ldparam", Lk, "kv_len")
    a("shl.b64", first, cx.blk, log2(ctx.Bown))
    a("shl.b64", lane_row, cx.warp, 4)
    a("add.i64", lane_row, lane_row, first)
    a("shr.u64", t1, cx.lane, 2)
    a("add.i64", lane_row, lane_row, t1)          # this lane's row g (unclamped)
    ctx.Lq, ctx.Lk, ctx.first, ctx.lane_row, ctx.t1, ctx.t2 = Lq, Lk, first, lane_row, t1, t2


def _frags_from_rows(ctx: _GradCtx, rows, lim, srcs: tuple, pA, pB) -> None:
    """Emit A fragments of the warp's 16 rows (clamped to lim) of each source, straight from global memory."""
    # srcs: (buffer, ld, offset, destination); rows lane_row and lane_row + 8
    a, cx, t1, t2 = ctx.a, ctx.cx, ctx.t1, ctx.t2
    a("and.b64", t2, cx.lane, 3)
    a("shl.b64", t2, t2, 2)                       # column byte 4t (elements 2t, 2t+1)
    for buf, ld, off, dst in srcs:
        a("min.i64", t1, ctx.lane_row, lim)
        _row_ptr(a, pA, buf, cx.bq, rows, t1, ld, off, cx.hd, ctx.d, t2)
        a("add.i64", t1, ctx.lane_row, 8)
        a("min.i64", t1, t1, lim)
        _row_ptr(a, pB, buf, cx.bq, rows, t1, ld, off, cx.hd, ctx.d, t2)
        _load_a_frags(a, dst, ctx.KQ, pA, pB)


def _stream_next(ctx: _GradCtx, label: str, tile, ntiles) -> None:
    """Emit the head of the loop over streamed tiles: wait for this tile, copy the next into the other stage."""
    a, t1 = ctx.a, ctx.t1
    a.label(label)
    a("cp.async.wait", 0)                         # this tile landed (this thread's copies) ...
    a("bar.sync")                                 # ... everyone's; the stage of the previous tile is free
    a("add.i64", t1, tile, 1)
    a("setp.lt.i64", ctx.pn, t1, ntiles)
    a("xor.b64", t1, ctx.rs, ctx.SB)
    ctx.st.copies(t1, ctx.pn)


def _product(ctx: _GradCtx, acc, afr, part: int) -> None:
    """Emit acc (16 x T) = A (16 x d) times the part's tile rows transposed."""
    # A: fragments in registers at afr, or (kv_smem) read per k-step from the shared region at afr
    a, t1, kf, kvs = ctx.a, ctx.t1, ctx.kf, ctx.kvs

    def load(stp, buf):
        ks, jp = stp
        if jp == 0:
            if kvs:
                a("xor.b64", ctx.ta, ctx.abase, 32 * ks)
                a("ldmatrix.x4", ctx.af[ks % 2], Mem(ctx.ta, afr))
            a("xor.b64", t1, ctx.kx0, 32 * ks)
            a("add.i64", t1, t1, ctx.rs)
        a("ldmatrix.x4", kf[buf], Mem(t1, part * ctx.TB + 16 * jp * ctx.RB))

    def comp(stp, buf):
        ks, jp = stp
        for h in range(2):
            x = acc + 4 * (2 * jp + h)
            a(ctx.mma, x, ctx.af[ks % 2] if kvs else afr + 4 * ks, kf[buf] + 2 * h, ctx.zero if ks == 0 else x)
    pipelined([(ks, jp) for ks in range(ctx.KQ) for jp in range(ctx.NS // 2)], load, comp)


def _accumulate(ctx: _GradCtx, acc, afr, part: int) -> None:
    """Emit acc (16 x d) += A (16 x T, fragments at afr + 8kk) times the part's tile (T x d)."""
    a, t1, kf = ctx.a, ctx.t1, ctx.kf

    def load(stp, buf):
        np_, kk = stp
        if kk == 0:
            a("xor.b64", t1, ctx.vx0, 32 * np_)
            a("add.i64", t1, t1, ctx.rs)
        a("ldmatrix.x4.trans", kf[buf], Mem(t1, part * ctx.TB + 16 * kk * ctx.RB))

    def comp(stp, buf):
        np_, kk = stp
        for h in range(2):
            x = acc + 4 * (2 * np_ + h)
            a(ctx.mma, x, afr + 8 * kk, kf[buf] + 2 * h, x)
    pipelined([(np_, kk) for np_ in range(ctx.NP) for kk in range(ctx.KP)], load, comp)


# ----------------------------------------------------------------------------- attn.grad.dkdv
def _dkdv_registers(ctx: _GradCtx) -> None:
    """Create the Asm; allocate the big register blocks first (dK, dV, K / V, S^T, dP^T); zero dK, dV."""
    c, d, Br, W, Bk, RB, NO, NS, KQ = ctx.c, ctx.d, ctx.T, ctx.W, ctx.Bown, ctx.RB, ctx.NO, ctx.NS, ctx.KQ
    kvs = ctx.kvs
    ctx.KVB = KVB = 2 * ctx.SB                    # kv_smem: K rows then V rows of the block
    ctx.a = a = Asm(f"flash_attn_bwd_dkdv_{c.dtype}_d{d}_w{W}_br{Br}{'_kvs' if kvs else ''}"
                    f"{'_causal' if c.causal else ''}", DKDV_PARAMS, 2 * ctx.SB + (2 * Bk * RB if kvs else 0))
    ctx.dk, ctx.dv = dk, dv = a.reg(4 * NO), a.reg(4 * NO)   # accumulators: n-tile nt at +4nt
    if kvs:                                       # shared offsets of the K / V regions; A fragments per k-step
        ctx.kq, ctx.vq = KVB, KVB + Bk * RB
        ctx.af = [a.reg(4), a.reg(4)]
    else:
        ctx.kq, ctx.vq = a.reg(4 * KQ), a.reg(4 * KQ)   # K / V A fragments of the warp's 16 keys
    ctx.s, ctx.dp = a.reg(4 * NS), a.reg(4 * NS)  # S^T -> P^T, dP^T -> dS^T (16 keys x Br queries)
    ctx.lv = a.reg(2 * NS)                        # NL, then D, of this lane's query columns
    ctx.kf = [a.reg(4), a.reg(4)]
    ctx.zero = zero = a.reg(4)
    for i in range(4 * NO):
        a("mov.f32", dk + i, 0.0)
        a("mov.f32", dv + i, 0.0)
    for i in range(4):
        a("mov.f32", zero + i, 0.0)


def _dkdv_load_kv(ctx: _GradCtx) -> None:
    """Emit K and V of the block's keys (rows clamped): into registers, or (kv_smem) into shared memory."""
    a, cx, Lk = ctx.a, ctx.cx, ctx.Lk
    klim = a.reg()
    a("sub.i64", klim, Lk, 1)
    if ctx.kvs:
        kst = _TileStream(a, cx, ctx.d, ctx.Bown, ctx.threads, ctx.lay, Lk, klim, ("K", "kv_ld", "k_off"),
                          ("V", "kv_ld", "v_off"))
        kst.start(ctx.first)
        kst.copies(ctx.KVB)
        kst.release()
    else:
        pA, pB = a.reg(), a.reg()
        _frags_from_rows(ctx, Lk, klim, (("K", "kv_ld", "k_off", ctx.kq), ("V", "kv_ld", "v_off", ctx.vq)), pA, pB)
        a.free(pA, pB)


def _dkdv_query_tiles(ctx: _GradCtx) -> None:
    """Emit the query tile range (it .. nq) and nmask, the tiles that run the causal mask."""
    # causal blocks start at the first tile that sees key j0; tiles before nmask have some (key, query)
    # pair hidden. Key row k sees query i iff i >= k - diff: lane_row becomes lim(row g).
    a, c, Br, t1, Lq, Lk, j0, kA = ctx.a, ctx.c, ctx.T, ctx.t1, ctx.Lq, ctx.Lk, ctx.first, ctx.lane_row
    ctx.qlim, ctx.it, ctx.nq, ctx.nmask = qlim, it, nq, nmask = a.reg(), a.reg(), a.reg(), a.reg()
    a("sub.i64", qlim, Lq, 1)
    a("add.i64", nq, Lq, Br - 1)
    a("shr.u64", nq, nq, log2(Br))
    if c.causal:
        diff = t1
        a("sub.i64", diff, Lk, Lq)
        a("sub.i64", it, j0, diff)
        a("max.i64", it, it, 0)
        a("shr.u64", it, it, log2(Br))
        a("add.i64", nmask, j0, ctx.Bown - 1 + Br - 1)
        a("sub.i64", nmask, nmask, diff)
        a("shr.s64", nmask, nmask, log2(Br))
        a("sub.i64", kA, kA, diff)                # lim(row g): the first query row g sees
    else:
        a("mov.b64", it, 0)
        a("mov.b64", nmask, 0)
    a.free(Lk, j0)


def _dkdv_stream_start(ctx: _GradCtx) -> None:
    """Emit the Q / dO stream's first copies, the NL / D pointers, the fragment bases and stage rs."""
    a, cx, t2, RB = ctx.a, ctx.cx, ctx.t2, ctx.RB
    ctx.st = st = _TileStream(a, cx, ctx.d, ctx.T, ctx.threads, ctx.lay, ctx.Lq, ctx.qlim, ("Q", "q_ld", "q_off"),
                              ("dO", "o_ld", "do_off"))
    i0 = a.reg()
    a("shl.b64", i0, ctx.it, log2(ctx.T))
    st.start(i0)
    st.copies(0)
    # NL / D pointers of this lane's first column (query i0 + 2t)
    ctx.pl, ctx.pdd = pl, pdd = a.reg(), a.reg()
    a("and.b64", t2, cx.lane, 3)
    a("shl.b64", t2, t2, 1)
    a("add.i64", t2, t2, i0)
    _ws_ptr(a, cx, pl, "NL", t2)
    _ws_ptr(a, cx, pdd, "D", t2)
    ctx.qcol = t2                                 # i0 + 2t, kept in t2 through the loop
    ctx.vx0, ctx.kx0 = ldmatrix_bases(a, cx.lane, ctx.lay, RB)
    if ctx.kvs:
        abase, ctx.ta = a.reg(), a.reg()
        ctx.abase = abase
        a("mul.i64", abase, cx.warp, 16 * RB)
        a("add.i64", abase, abase, ctx.vx0)       # row 16w + L%16 keeps the swizzle of row L%16
    ctx.rs = a.reg()
    a("mov.b64", ctx.rs, 0)
    ctx.pn, ctx.pm = a.pred(), a.pred()


def _dkdv_mask(ctx: _GradCtx) -> None:
    """Causal: S^T -> -inf where the query is hidden from the key (query tiles before nmask)."""
    a, s, NS = ctx.a, ctx.s, ctx.NS
    a("setp.ge.i64", ctx.pm, ctx.it, ctx.nmask)
    a("bra", "UNMASKED", p=ctx.pm)
    pe, lim = a.pred(), a.reg()
    for r in range(2):                            # rows g (e = 0, 1) and g + 8 (e = 2, 3)
        a("sub.i64", lim, ctx.lane_row, ctx.qcol)
        if r:
            a("add.i64", lim, lim, 8)
        for nt in range(NS):
            for e in (2 * r, 2 * r + 1):          # hidden iff i0 + 2t + 8nt + (e & 1) < lim
                a("setp.gt.i64", pe, lim, 8 * nt + (e & 1))
                a("mov.f32", s + 4 * nt + e, float("-inf"), p=pe)
    a.pfree(pe)
    a.free(lim)
    a.label("UNMASKED")


def _dkdv_q_loop(ctx: _GradCtx) -> None:
    """Emit the loop over query tiles (Q_LOOP): S^T, P^T, dP^T, dS^T, dV += P^T dO, dK += dS^T Q."""
    a, c, s, dp, lv, NS, KP, Br = ctx.a, ctx.c, ctx.s, ctx.dp, ctx.lv, ctx.NS, ctx.KP, ctx.T
    it, rs, pm = ctx.it, ctx.rs, ctx.pm
    _stream_next(ctx, "Q_LOOP", it, ctx.nq)
    for nt in range(NS):
        a("ld.global.v2.b32", lv + 2 * nt, Mem(ctx.pl, 32 * nt))
    _product(ctx, s, ctx.kq, 0)                   # S^T = K Q^T
    if c.causal:
        _dkdv_mask(ctx)
    for nt in range(NS):                          # P^T = 2^(c S^T - LSE log2 e)
        for e in range(4):
            x = s + 4 * nt + e
            a("fma.f32", x, x, c.c, lv + 2 * nt + (e & 1))
            a("ex2.f32", x, x)
    _product(ctx, dp, ctx.vq, 1)                  # dP^T = V dO^T
    for nt in range(NS):
        a("ld.global.v2.b32", lv + 2 * nt, Mem(ctx.pdd, 32 * nt))
    for nt in range(NS):                          # dS^T = P^T (dP^T - D)
        for e in range(4):
            x = dp + 4 * nt + e
            a("sub.f32", x, x, lv + 2 * nt + (e & 1))
            a("mul.f32", x, x, s + 4 * nt + e)
    c_to_a(a, ctx.cvt, s, KP)
    _accumulate(ctx, ctx.dv, s, 1)                # dV += P^T dO
    c_to_a(a, ctx.cvt, dp, KP)
    _accumulate(ctx, ctx.dk, dp, 0)               # dK += dS^T Q

    a("xor.b64", rs, rs, ctx.SB)
    a("add.i64", ctx.qcol, ctx.qcol, Br)
    a("add.i64", ctx.pl, ctx.pl, 4 * Br)
    a("add.i64", ctx.pdd, ctx.pdd, 4 * Br)
    a("add.i64", it, it, 1)
    a("setp.lt.i64", pm, it, ctx.nq)
    a("bra", "Q_LOOP", p=pm)


def _dkdv_epilogue(ctx: _GradCtx) -> None:
    """dK * scale and dV in the storage dtype, rows j0 + 16w + g (+8) < kv_len."""
    a, cx, t1 = ctx.a, ctx.cx, ctx.t1
    row0, Lk2 = a.reg(), a.reg()
    a("shl.b64", row0, cx.blk, log2(ctx.Bown))
    a("shl.b64", t1, cx.warp, 4)
    a("add.i64", row0, row0, t1)
    a("ldparam", Lk2, "kv_len")
    _store_rows(a, cx, ctx.dk, ctx.NO, ctx.d, ctx.cvt, row0, Lk2, "dK", "kv_ld", "dk_off", ctx.c.scale)
    _store_rows(a, cx, ctx.dv, ctx.NO, ctx.d, ctx.cvt, row0, Lk2, "dV", "kv_ld", "dv_off", None)
    a("exit")


def _emit_dkdv(c: _Cfg) -> Program:
    """dK and dV of a block of 16*warps keys, streaming the query tiles (Q, dO) past them."""
    ctx = _GradCtx(c, c.kv_smem)
    _dkdv_registers(ctx)
    _block_rows(ctx)
    _dkdv_load_kv(ctx)
    _dkdv_query_tiles(ctx)
    _dkdv_stream_start(ctx)
    _dkdv_q_loop(ctx)
    _dkdv_epilogue(ctx)
    return ctx.a.build()


# ----------------------------------------------------------------------------- attn.grad.dq
def _dq_registers(ctx: _GradCtx) -> None:
    """Create the Asm; allocate the big register blocks first (dQ, Q / dO, S, dP, NL / D); zero dQ."""
    c, d, Bc, W, NO, NS, KQ = ctx.c, ctx.d, ctx.T, ctx.W, ctx.NO, ctx.NS, ctx.KQ
    ctx.a = a = Asm(f"flash_attn_bwd_dq_{c.dtype}_d{d}_w{W}_bc{Bc}{'_causal' if c.causal else ''}", DQ_PARAMS,
                    2 * ctx.SB)
    ctx.dq = dq = a.reg(4 * NO)
    ctx.qf, ctx.of = a.reg(4 * KQ), a.reg(4 * KQ)   # Q / dO A fragments of the warp's 16 query rows
    ctx.s, ctx.dp = a.reg(4 * NS), a.reg(4 * NS)  # S -> P, dP -> dS (16 queries x Bc keys)
    ctx.kf = [a.reg(4), a.reg(4)]
    ctx.zero = zero = a.reg(4)
    ctx.rv = a.reg(4)                             # NL rows g, g + 8; D rows g, g + 8
    for i in range(4 * NO):
        a("mov.f32", dq + i, 0.0)
    for i in range(4):
        a("mov.f32", zero + i, 0.0)


def _dq_load_rows(ctx: _GradCtx) -> None:
    """Q and dO fragments of the warp's 16 query rows (clamped to q_len - 1) and their NL and D."""
    a, cx, rv, qA = ctx.a, ctx.cx, ctx.rv, ctx.lane_row
    qlim, pA, pB = a.reg(), a.reg(), a.reg()
    a("sub.i64", qlim, ctx.Lq, 1)
    _frags_from_rows(ctx, ctx.Lq, qlim, (("Q", "q_ld", "q_off", ctx.qf), ("dO", "o_ld", "do_off", ctx.of)), pA, pB)
    _ws_ptr(a, cx, pA, "NL", qA)                  # padded workspaces: rows < q_pad always
    a("ld.global.b32", rv, Mem(pA, 0))
    a("ld.global.b32", rv + 1, Mem(pA, 32))
    _ws_ptr(a, cx, pA, "D", qA)
    a("ld.global.b32", rv + 2, Mem(pA, 0))
    a("ld.global.b32", rv + 3, Mem(pA, 32))
    a.free(pA, pB, qlim)


def _dq_key_tiles(ctx: _GradCtx) -> None:
    """Emit the key tile counts and the mask limits limA, limB of rows g, g + 8 (as the forward)."""
    # causal blocks stop at the last tile their last row sees; tiles nfull.. need the mask (diagonal and
    # kv tail). Key j visible to row i iff j <= lim(i).
    a, c, t2, Lk = ctx.a, ctx.c, ctx.t2, ctx.Lk
    klim, ntl, nfull, limA, limB = (a.reg() for _ in range(5))
    ctx.klim, ctx.ntl, ctx.nfull, ctx.limA, ctx.limB = klim, ntl, nfull, limA, limB
    a("sub.i64", klim, Lk, 1)
    kv_tile_counts(a, ntl, nfull, ctx.first, ctx.Lq, Lk, ctx.Bown, ctx.T, c.causal, ctx.t1, t2)
    if c.causal:
        diff = t2
        a("add.i64", limA, ctx.lane_row, diff)
        a("add.i64", limB, limA, 8)
    else:
        a("mov.b64", limA, klim)
        a("mov.b64", limB, klim)
    a.free(ctx.lane_row, ctx.first)


def _dq_stream_start(ctx: _GradCtx) -> None:
    """Emit the K / V stream's first copies, the lane's first key column jkey, fragment bases, stage rs."""
    a, cx = ctx.a, ctx.cx
    ctx.st = st = _TileStream(a, cx, ctx.d, ctx.T, ctx.threads, ctx.lay, ctx.Lk, ctx.klim, ("K", "kv_ld", "k_off"),
                              ("V", "kv_ld", "v_off"))
    ctx.j, ctx.jkey, ctx.rs = j, jkey, rs = a.reg(), a.reg(), a.reg()
    a("mov.b64", j, 0)
    st.start(j)
    st.copies(0)
    a("and.b64", jkey, cx.lane, 3)
    a("shl.b64", jkey, jkey, 1)                   # key of this lane's first S column: j*Bc + 2t
    ctx.vx0, ctx.kx0 = ldmatrix_bases(a, cx.lane, ctx.lay, ctx.RB)
    a("mov.b64", rs, 0)
    ctx.pn, ctx.pm = a.pred(), a.pred()


def _dq_kv_loop(ctx: _GradCtx) -> None:
    """Emit the loop over key tiles (KV_LOOP): S (masked from nfull on), P, dP, dS, dQ += dS K."""
    a, c, t1, t2, s, dp, rv, NS, pm = ctx.a, ctx.c, ctx.t1, ctx.t2, ctx.s, ctx.dp, ctx.rv, ctx.NS, ctx.pm
    j, jkey, rs = ctx.j, ctx.jkey, ctx.rs
    _stream_next(ctx, "KV_LOOP", j, ctx.ntl)
    _product(ctx, s, ctx.qf, 0)                   # S = Q K^T
    a("setp.lt.i64", pm, j, ctx.nfull)
    a("bra", "UNMASKED", p=pm)
    pe = a.pred()
    a("sub.i64", t1, ctx.limA, jkey)
    a("sub.i64", t2, ctx.limB, jkey)
    for nt in range(NS):
        for e in range(4):
            a("setp.lt.i64", pe, t2 if e >= 2 else t1, 8 * nt + (e & 1))
            a("mov.f32", s + 4 * nt + e, float("-inf"), p=pe)
    a.pfree(pe)
    a.label("UNMASKED")
    for nt in range(NS):                          # P = 2^(c S - LSE log2 e)
        for e in range(4):
            x = s + 4 * nt + e
            a("fma.f32", x, x, c.c, rv + (e >> 1))
            a("ex2.f32", x, x)
    _product(ctx, dp, ctx.of, 1)                  # dP = dO V^T
    for nt in range(NS):                          # dS = P (dP - D)
        for e in range(4):
            x = dp + 4 * nt + e
            a("sub.f32", x, x, rv + 2 + (e >> 1))
            a("mul.f32", x, x, s + 4 * nt + e)
    c_to_a(a, ctx.cvt, dp, ctx.KP)
    _accumulate(ctx, ctx.dq, dp, 0)               # dQ += dS K (K tile rows are the k dimension)

    a("xor.b64", rs, rs, ctx.SB)
    a("add.i64", jkey, jkey, ctx.T)
    a("add.i64", j, j, 1)
    a("setp.lt.i64", pm, j, ctx.ntl)
    a("bra", "KV_LOOP", p=pm)


def _dq_epilogue(ctx: _GradCtx) -> None:
    """dQ * scale in the storage dtype, rows i0 + 16w + g (+8) < q_len."""
    a, cx, t1 = ctx.a, ctx.cx, ctx.t1
    row0 = a.reg()
    a("shl.b64", row0, cx.blk, log2(ctx.Bown))
    a("shl.b64", t1, cx.warp, 4)
    a("add.i64", row0, row0, t1)
    _store_rows(a, cx, ctx.dq, ctx.NO, ctx.d, ctx.cvt, row0, ctx.Lq, "dQ", "q_ld", "dq_off", ctx.c.scale)
    a("exit")


def _emit_dq(c: _Cfg) -> Program:
    """dQ of a block of 16*warps query rows, streaming the key tiles (K, V) past them."""
    ctx = _GradCtx(c, False)
    _dq_registers(ctx)
    _block_rows(ctx)
    _dq_load_rows(ctx)
    _dq_key_tiles(ctx)
    _dq_stream_start(ctx)
    _dq_kv_loop(ctx)
    _dq_epilogue(ctx)
    return ctx.a.build()


# ----------------------------------------------------------------------------- configuration
def _fits(prog: Program, caps, threads: int) -> bool:
    return (prog.shared_bytes <= caps.scratchpad_bytes and prog.nregs <= caps.max_regs_per_thread
            and prog.nregs * threads <= caps.regs_per_core and threads // 32 <= caps.warp_slots)


def _choose(caps, emit, what: str, dtype: str, d: int, causal: bool, c: float, scale: float,
            kv_smem=(False,)):
    tried = []
    for kvs in kv_smem:
        for W in WARP_CHOICES:
            for T in TILE_CHOICES:
                tag = f"{W} warps, tile {T}{', K/V in shared memory' if kvs else ''}"
                shared = 2 * 2 * T * 2 * d + (2 * 16 * W * 2 * d if kvs else 0)
                if shared > caps.scratchpad_bytes:
                    tried.append(f"{tag}: {shared} B scratchpad")
                    continue
                cfg = _Cfg(dtype, d, causal, W, T, c, scale, kvs)
                try:
                    prog = emit(cfg)
                except OutOfRegisters as e:
                    tried.append(f"{tag}: {e}")
                    continue
                if _fits(prog, caps, 32 * W):
                    return cfg, prog
                tried.append(f"{tag}: {prog.nregs} registers x {32 * W} threads")
    raise InputError(f"attention backward on {caps.name}", f"head_dim {d} {dtype} ({what}): no tile fits a core ("
                     + "; ".join(dict.fromkeys(tried)) + ")", "a smaller head_dim or a larger target")


# ----------------------------------------------------------------------------- the kernel object
@dataclass(frozen=True)
class GradPart:
    """One kernel of the backward: its name (attn.grad.pre / .dkdv / .dq), program, launch,
    the math it executes and its share of the textbook count."""

    name: str
    program: Program
    launch: Launch
    flops: int
    model_flops: int
    outputs: tuple          # buffer parameters it writes


@dataclass(frozen=True)
class AttentionGradKernel:
    """The fused attention backward: three kernels (``parts``) run in order."""

    parts: tuple
    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str
    causal: bool
    scale: float
    q_ld: int
    kv_ld: int
    o_ld: int
    q_pad: int
    tiles: dict = field(default_factory=dict)    # part -> (warps, tile rows)
    kv_smem: bool = False                         # dkdv stages K / V in shared memory (head_dim 128)

    @property
    def flops(self) -> int:
        return sum(p.flops for p in self.parts)

    @property
    def model_flops(self) -> int:
        return sum(p.model_flops for p in self.parts)

    @property
    def programs(self) -> list:
        return [p.program for p in self.parts]

    @property
    def host_dtype(self):
        return HOST_DTYPE[self.dtype]

    def part(self, name: str) -> GradPart:
        for p in self.parts:
            if p.name == name or p.name.endswith("." + name):
                return p
        raise KeyError(name)

    def _need(self, rows: int, ld: int, off: int) -> int:
        return off + (rows - 1) * ld + self.heads * self.head_dim

    def buffer_bytes(self, **offs) -> dict:
        """Bytes each buffer must hold (offsets in elements as in ``args``); D and NL are the fp32
        workspaces [batch, heads, q_pad]."""
        o = {k: int(offs.get(k, 0)) for k in ("q_off", "k_off", "v_off", "o_off", "do_off", "dq_off", "dk_off",
                                               "dv_off")}
        B, Lq, Lk = self.batch, self.q_len, self.kv_len
        ws = 4 * B * self.heads * self.q_pad
        es = ELEM_BYTES[self.dtype]                 # fp32 storage: the Sunway backward
        return {"Q": es * self._need(B * Lq, self.q_ld, o["q_off"]), "K": es * self._need(B * Lk, self.kv_ld, o["k_off"]),
                "V": es * self._need(B * Lk, self.kv_ld, o["v_off"]), "O": es * self._need(B * Lq, self.o_ld, o["o_off"]),
                "dO": es * self._need(B * Lq, self.o_ld, o["do_off"]), "LSE": 4 * B * self.heads * Lq,
                "dQ": es * self._need(B * Lq, self.q_ld, o["dq_off"]),
                "dK": es * self._need(B * Lk, self.kv_ld, o["dk_off"]),
                "dV": es * self._need(B * Lk, self.kv_ld, o["dv_off"]), "D": ws, "NL": ws}

    def workspaces(self) -> dict:
        """Scratch buffers the caller allocates (name -> (shape, host dtype)); no contents needed."""
        return {"D": ((self.batch, self.heads, self.q_pad), np.float32),
                "NL": ((self.batch, self.heads, self.q_pad), np.float32)}

    def args(self, Q, K, V, O, dO, LSE, dQ, dK, dV, D, NL, **offs) -> dict:
        """Every buffer and scalar of the three kernels (``part_args`` picks a part's). Buffers:
        numpy arrays (C-contiguous; the host dtype, LSE / D / NL float32) or anything with
        ``nbytes``; offsets (q_off, k_off, v_off, o_off, do_off, dq_off, dk_off, dv_off) in
        elements, multiples of 8."""
        where = f"attention backward b{self.batch} h{self.heads} {self.q_len}x{self.kv_len} d{self.head_dim}"
        names = ("q_off", "k_off", "v_off", "o_off", "do_off", "dq_off", "dk_off", "dv_off")
        for n in offs:
            if n not in names:
                raise InputError(where, f"unknown argument {n!r}", ", ".join(names))
        o = {n: offs.get(n, 0) for n in names}
        for n, v in o.items():
            if isinstance(v, bool) or int(v) != v or v < 0 or v % 8:
                raise InputError(where, f"{n} = {v!r}", "an element offset >= 0, a multiple of 8 (16-byte copies)")
        want = self.buffer_bytes(**o)
        bufs = {"Q": Q, "K": K, "V": V, "O": O, "dO": dO, "LSE": LSE, "dQ": dQ, "dK": dK, "dV": dV, "D": D, "NL": NL}
        for name, v in bufs.items():
            dt = np.float32 if name in ("LSE", "D", "NL") else self.host_dtype
            if isinstance(v, np.ndarray) and (v.dtype != np.dtype(dt) or not v.flags.c_contiguous):
                raise InputError(where, f"{name} is a {'non-contiguous ' if not v.flags.c_contiguous else ''}"
                                 f"{v.dtype} array", f"a C-contiguous {np.dtype(dt)} array")
            if int(getattr(v, "nbytes", -1)) < want[name]:
                raise InputError(where, f"{name} has {getattr(v, 'nbytes', None)} bytes", f"at least {want[name]}")
        return {**bufs, "q_len": self.q_len, "kv_len": self.kv_len, "q_pad": self.q_pad, "q_ld": self.q_ld,
                "kv_ld": self.kv_ld, "o_ld": self.o_ld, **{n: int(v) for n, v in o.items()}}

    def qkv_args(self, QKV, O, dO, LSE, dQKV, D, NL) -> dict:
        """Q, K, V read in place from a fused QKV buffer [batch*s, 3*heads*d] and dQ, dK, dV
        written in place into d_qkv of the same layout (needs q_len == kv_len and
        q_ld == kv_ld == 3*heads*d)."""
        hd = self.heads * self.head_dim
        if self.q_len != self.kv_len or self.q_ld != 3 * hd or self.kv_ld != 3 * hd:
            raise InputError("attention backward qkv_args", f"q_len {self.q_len}, kv_len {self.kv_len}, q_ld "
                             f"{self.q_ld}, kv_ld {self.kv_ld}",
                             f"q_len == kv_len and q_ld == kv_ld == 3*heads*d = {3 * hd}")
        return self.args(QKV, QKV, QKV, O, dO, LSE, dQKV, dQKV, dQKV, D, NL, q_off=0, k_off=hd, v_off=2 * hd,
                         dq_off=0, dk_off=hd, dv_off=2 * hd)

    @staticmethod
    def part_args(part: GradPart, args: dict) -> dict:
        """The arguments of one part, from ``args`` / ``qkv_args``."""
        return {k: args[k] for k in part.program.params}

    def random_inputs(self, seed: int = 0, qkv: bool = False) -> tuple:
        """(Q, K, V, O, dO, LSE): standard-normal Q, K, V, dO in the host dtype ([rows, ld]
        arrays, columns past heads*d random too), and O and LSE consistent with them (float64
        attention rounded to the dtype / float32). With qkv, Q, K and V are one fused QKV buffer
        (the same array; Q, K, V at column offsets 0, h, 2h), as ``qkv_args`` reads it."""
        rng = np.random.default_rng(seed)
        B, hd = self.batch, self.heads * self.head_dim

        def normal(rows, ld):
            return to_host(rng.standard_normal((rows, ld)).astype(np.float32), self.dtype)

        if qkv:
            Q = K = V = normal(B * self.q_len, self.q_ld)
            offs = (0, hd, 2 * hd)
        else:
            Q, K, V = normal(B * self.q_len, self.q_ld), normal(B * self.kv_len, self.kv_ld), \
                normal(B * self.kv_len, self.kv_ld)
            offs = (0, 0, 0)
        dO = normal(B * self.q_len, self.o_ld)
        q = self._heads(Q, self.q_len, self.q_ld, offs[0])
        k = self._heads(K, self.kv_len, self.kv_ld, offs[1])
        v = self._heads(V, self.kv_len, self.kv_ld, offs[2])
        o, lse = _attention_lse(q, k, v, self.causal, self.scale)
        O = np.zeros((B * self.q_len, self.o_ld), np.float32)
        O[:, :hd] = merge_heads(o)
        return Q, K, V, to_host(O, self.dtype), dO, np.ascontiguousarray(lse, np.float32)

    def _heads(self, X, rows: int, ld: int, off: int = 0) -> np.ndarray:
        """[batch, heads, rows, d] float64 view of a buffer's exact values."""
        flat = to_float(np.asarray(X).ravel(), self.dtype)
        hd = self.heads * self.head_dim
        idx = off + np.arange(self.batch * rows)[:, None] * ld + np.arange(hd)[None, :]
        return flat[idx].reshape(self.batch, rows, self.heads, self.head_dim).transpose(0, 2, 1, 3)

    def reference(self, Q, K, V, dO, **offs) -> tuple:
        """(dQ, dK, dV) in float64 from the exact inputs, each [batch*rows, heads*d]."""
        q = self._heads(Q, self.q_len, self.q_ld, offs.get("q_off", 0))
        k = self._heads(K, self.kv_len, self.kv_ld, offs.get("k_off", 0))
        v = self._heads(V, self.kv_len, self.kv_ld, offs.get("v_off", 0))
        do = self._heads(dO, self.q_len, self.o_ld, offs.get("do_off", 0))
        return tuple(merge_heads(x) for x in attention_grad_reference(q, k, v, do, self.causal, self.scale))

    def outputs(self, dQ, dK, dV, **offs) -> tuple:
        """The written parts of dQ, dK, dV as float64 [batch*rows, heads*d]."""
        return (merge_heads(self._heads(dQ, self.q_len, self.q_ld, offs.get("dq_off", 0))),
                merge_heads(self._heads(dK, self.kv_len, self.kv_ld, offs.get("dk_off", 0))),
                merge_heads(self._heads(dV, self.kv_len, self.kv_ld, offs.get("dv_off", 0))))


def merge_heads(x) -> np.ndarray:
    """[batch, heads, rows, d] -> [batch*rows, heads*d] (each row's heads side by side)."""
    b, n, L, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(b * L, n * d)


def _attention_lse(q, k, v, causal: bool, scale: float):
    from archsim.workloads.reference import ref_attention
    return ref_attention(q, k, v, causal, scale, return_lse=True)


def attention_grad_reference(q, k, v, do, causal: bool, scale: float) -> tuple:
    """float64 (dq, dk, dv) of softmax(scale q k^T + mask) v, [..., L, d] arrays
    (reference.ref_attention_grad)."""
    from archsim.workloads.reference import ref_attention_grad
    return ref_attention_grad(q, k, v, do, causal, scale)


# ----------------------------------------------------------------------------- API
def flash_attention_grad_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                                dtype: str = "fp16", causal: bool = False, scale: Optional[float] = None,
                                q_ld: Optional[int] = None, kv_ld: Optional[int] = None,
                                o_ld: Optional[int] = None, name: str = "attn.grad") -> AttentionGradKernel:
    """Emit the fused attention backward (see the module docstring) for a GPU-family target.
    Parts are named ``<name>.pre``, ``<name>.dkdv``, ``<name>.dq`` and run in that order."""
    where = "attention backward"
    batch, heads, q_len, kv_len, d, dt, lds, scale = check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld, "fp16, bf16")
    if dt not in MMA_OP:
        raise InputError(where, f"dtype {dt}: the fused backward runs on tensor units only (no FFMA variant)",
                         "fp16, bf16")
    if not (dt in caps.tensor_dtypes and "tensor" in caps.units and caps.warp_width == 32):
        raise InputError(f"attention backward on {caps.name}", f"no {dt} tensor units (the fused backward has no "
                         "FFMA variant)", "a target with fp16 / bf16 mma")
    c = scale * LOG2E
    q_pad = ceil_div(q_len, Q_PAD) * Q_PAD
    pre = _emit_pre(dt, d)
    ckv, pkv = _choose(caps, _emit_dkdv, "dK, dV kernel", dt, d, bool(causal), c, scale, kv_smem=(False, True))
    cq, pq = _choose(caps, _emit_dq, "dQ kernel", dt, d, bool(causal), c, scale)
    for p in (pre, pkv, pq):
        check(p, caps)
    pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    cells, full = batch * heads * pairs, batch * heads * q_len * kv_len
    parts = (
        GradPart(f"{name}.pre", pre, Launch((ceil_div(q_pad, PRE_THREADS), heads, batch), (PRE_THREADS, 1, 1)),
                 2 * d * batch * heads * q_len, 0, ("D", "NL")),
        GradPart(f"{name}.dkdv", pkv, Launch((ceil_div(kv_len, 16 * ckv.warps), heads, batch), (32 * ckv.warps, 1, 1)),
                 cells * (4 * 2 * d + 4), 3 * 2 * d * full, ("dK", "dV")),
        GradPart(f"{name}.dq", pq, Launch((ceil_div(q_len, 16 * cq.warps), heads, batch), (32 * cq.warps, 1, 1)),
                 cells * (3 * 2 * d + 4), 2 * d * full, ("dQ",)),
    )
    return AttentionGradKernel(parts=parts, batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=d,
                               dtype=dt, causal=bool(causal), scale=scale, q_pad=q_pad,
                               tiles={"dkdv": (ckv.warps, ckv.T), "dq": (cq.warps, cq.T)},
                               kv_smem=ckv.kv_smem, **lds)
