"""Fused attention as FlashAttention-3 runs it on Hopper: warp-specialized, the tensor memory
accelerator feeding warpgroup MMA (targets with wgmma and tma; fp16 / bf16, head_dim 64 or 128).

The math, the layout of Q, K, V and O, the causal rule, the online softmax and the mask are
attention_gpu's tensor-core kernel's (its module docstring); what differs is how the tiles reach
the tensor cores and how O leaves:

- grid = (ceil(q_len / 128), heads, batch); a block is CW = 2 consumer warpgroups, each owning 64
  query rows (warp w of the block rows 16w .. 16w+15, as the mma kernel's warps), and one producer
  warp (the block's last), 288 threads.
- The producer issues every copy as a bulk tensor copy (cp.async.bulk.tensor.4d) from tensor maps
  the kernel object builds (Q, K, V as 4-d tensors: head column, row, head, batch; 128-byte
  swizzle; boxes 64 columns wide, so a head of 128 is two panels): Q once, then K and V tiles of
  BC = 128 keys into two stages, each on its own "full" barrier (arrive.expect_tx of the tile's
  bytes). K and V have their own "empty" barriers (one arrival from each consumer warp): a K
  stage is free once the S that read it is done, a V stage once its P V is, and the producer waits
  on them before it refills a stage. Rows past q_len or kv_len arrive as zeros (the mask hides the
  keys; the rows past q_len are never stored).
- S = Q K^T: wgmma.m64n128k16 with Q and K read from the scratchpad through descriptors (both
  K-major, 128-byte swizzle), head_dim / 16 k-steps. The ISA's wgmma always adds to D, so S is
  zeroed first (PTX's scale-d = 0 is not modelled).
- The accumulator of a wgmma is, warp by warp, the C fragments of 16 x 8 tiles (isa/README.md),
  so the mma kernel's mask and online softmax run on it unchanged; P, converted in place, is the A
  operand of O += P V: wgmma.m64n{d}k16.rs with A from registers and V through an MN-major
  descriptor, 8 k-steps of 16 keys.
- FA3's intra-warpgroup pipeline: after tile 0's S and softmax, each step issues the next tile's
  S and this tile's P V, waits for the S only (wait_group 1), runs the next tile's softmax while P
  V runs, then waits for P V, releases V and rescales O by the new alpha. Two S blocks take turns
  (the loop is written twice, one half for each).
- FA3's ping-pong between the consumer warpgroups: a warpgroup issues its wgmma on its turn (an
  mbarrier that the other warpgroup's four warps arrive on once they have issued theirs; PTX
  uses named barriers, which the ISA lacks), so one warpgroup's softmax runs while the other's
  wgmma do.
- O leaves by bulk tensor stores, as FA3's does, here warp by warp (_o_store): each consumer
  warp writes its 16 rows of O / l over its own rows of Q's panels (free once its last S is
  done) as 128-byte-swizzled boxes and stores them through a fourth map (mapO, 16-row boxes), so
  O leaves in whole lines; the LSE keeps its stores from registers.

The TMA boxes must fit their tensors (isa/README.md), so the kernel needs q_len >= 128 and
kv_len >= 128; ``flash_attention3_kernel`` refuses shorter ones.
"""

from __future__ import annotations

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program
from archsim.workloads.emit import attention_gpu as AG
from archsim.workloads.emit.common import CVT_OUT, Asm, ceil_div, log2
from archsim.workloads.emit.gemm_gpu import box_chunks, box_write, next_stage

CW = 2                         # consumer warpgroups a block
BM = 64 * CW                   # query rows a block
THREADS = 128 * CW + 32        # the consumers and one producer warp
STAGES = 2                     # K / V stages
BC = 128                       # keys a K / V tile
HEAD_DIMS = (64, 128)
PARAMS = AG.PARAMS + ("mapQ", "mapK", "mapV", "mapO")
LSE_PARAMS = PARAMS + ("LSE",)
# descriptor constants: K-major, 128-byte swizzle, 8-row groups 1 KiB apart (SBO)
KMAJ = (1024 >> 4) << 32 | 1 << 62


class _WgCtx:
    """The kernel being emitted: geometry, its Asm, and the registers more than one step uses (the
    names attention_gpu's mask, softmax and epilogue steps read)."""

    def __init__(self, c: AG.FlashCfg):
        self.c = c
        self.d, self.Bc = d, Bc = c.d, c.Bc
        self.MT, self.BR = 1, BM
        self.P = d // 64                           # 64-column panels of a row
        self.NS, self.KQ, self.NO, self.KP = Bc // 8, d // 16, d // 8, Bc // 16
        self.QB = self.P * BM * 128                # Q's bytes (at 0)
        self.PB = self.P * Bc * 128                # a K or V tile's bytes
        self.SB = 2 * self.PB                      # a stage: K then V
        bar = self.QB + STAGES * self.SB
        self.fullQ, self.fullK, self.fullV = bar, bar + 8, bar + 8 + 8 * STAGES
        self.emptyK, self.emptyV = bar + 8 + 16 * STAGES, bar + 8 + 24 * STAGES
        self.turn = bar + 8 + 32 * STAGES          # each consumer warpgroup's turn to issue its wgmma
        self.cvt = CVT_OUT[c.dtype]
        src = "f16" if c.dtype == "fp16" else "bf16"
        self.mn_s = f"wgmma.m64n{Bc}k16.f32.{src}"
        self.mn_o = f"wgmma.m64n{d}k16.f32.{src}.rs"
        name = f"flash_attn3_{c.dtype}_d{d}_br{BM}_bc{Bc}{'_causal' if c.causal else ''}{'_lse' if c.lse else ''}"
        self.a = Asm(name, LSE_PARAMS if c.lse else PARAMS, bar + 8 * (1 + 4 * STAGES) + 8 * CW)

    def free_loop(self) -> None:
        """Free the loop's registers (attention_gpu._mma_row_sums calls this before the epilogue)."""
        self.a.free(self.j, self.jkey, self.ntl, self.nfull, self.si, self.ph, self.dq0, self.da, self.db, self.bar,
                    self.tw, self.to, self.tp)
        if self.limB is not self.limA:
            self.a.free(self.limB)
        self.a.free(self.limA)


def _barriers(ctx: _WgCtx, tid) -> None:
    """Warp 0 sets the barriers up: each full barrier takes the producer's one arrival (and the
    bytes), each empty barrier (K's and V's of a stage apart) one arrival from every consumer warp."""
    a = ctx.a
    p, cnt = a.pred(), a.reg()
    a("setp.lt.i64", p, tid, 32)
    a("mov.b64", cnt, 1)
    a("mbarrier.init", Mem(None, ctx.fullQ), cnt, p=p)
    for s in range(STAGES):
        a("mbarrier.init", Mem(None, ctx.fullK + 8 * s), cnt, p=p)
        a("mbarrier.init", Mem(None, ctx.fullV + 8 * s), cnt, p=p)
    a("mov.b64", cnt, 4 * CW)
    for s in range(STAGES):
        a("mbarrier.init", Mem(None, ctx.emptyK + 8 * s), cnt, p=p)
        a("mbarrier.init", Mem(None, ctx.emptyV + 8 * s), cnt, p=p)
    a("mov.b64", cnt, 4)
    for g in range(CW):
        a("mbarrier.init", Mem(None, ctx.turn + 8 * g), cnt, p=p)
    a.free(cnt)
    a.pfree(p)
    a("bar.sync")


def _producer(ctx: _WgCtx, bq, hd, i0, ntl) -> None:
    """The producer warp: Q's boxes, then each K and V tile into its stage once the stage is free."""
    a, c = ctx.a, ctx.c
    mq, mk, mv, nb, t, sb, eph, j, si, ph = (a.reg() for _ in range(10))
    cq = a.reg(4)                                  # box coordinates: column, row, head, batch
    p = a.pred()
    a("ldparam", mq, "mapQ")
    a("ldparam", mk, "mapK")
    a("ldparam", mv, "mapV")
    a("mov.b64", cq + 1, i0)
    a("mov.b64", cq + 2, hd)
    a("mov.b64", cq + 3, bq)
    a("mov.b64", nb, ctx.QB)
    a("mbarrier.arrive.expect_tx", Mem(None, ctx.fullQ), nb)
    for pn in range(ctx.P):
        a("mov.b64", cq, 64 * pn)
        a("cp.async.bulk.tensor.4d", Mem(None, pn * BM * 128), Mem(None, ctx.fullQ), mq, cq)
    a("mov.b64", nb, ctx.PB)
    for r in (j, si, ph):
        a("mov.b64", r, 0)
    a("mov.b64", cq + 1, 0)                        # the tile's first key row
    a.label("PLOOP")
    a("shl.b64", t, si, 3)
    a("setp.ge.i64", p, j, STAGES)                 # the stage's previous K (V) must be consumed:
    a("xor.b64", eph, ph, 1)                       # its empty barrier's phase of one round ago
    a("mul.i64", sb, si, ctx.SB)
    for empty, full, mp, off in ((ctx.emptyK, ctx.fullK, mk, ctx.QB), (ctx.emptyV, ctx.fullV, mv, ctx.QB + ctx.PB)):
        a("mbarrier.wait", Mem(t, empty), eph, p=p)
        a("mbarrier.arrive.expect_tx", Mem(t, full), nb)
        for pn in range(ctx.P):
            a("mov.b64", cq, 64 * pn)
            a("cp.async.bulk.tensor.4d", Mem(sb, off + pn * c.Bc * 128), Mem(t, full), mp, cq)
    a("add.i64", cq + 1, cq + 1, c.Bc)
    next_stage(a, si, ph, j, STAGES, p)
    a("setp.lt.i64", p, j, ntl)
    a("bra", "PLOOP", p=p)
    a("exit")
    a.free(mq, mk, mv, nb, t, sb, eph, j, si, ph)
    a.free(cq, k=4)
    a.pfree(p)


def _consumer_setup(ctx: _WgCtx, tid, i0, Lk, diff) -> None:
    """The consumers' registers: O zeroed, S, the row state, the mask limits of rows g and g + 8
    (uniform per block), the tile counter and the lane's first key column, the stage and parity,
    and this warpgroup's Q descriptor."""
    a, c = ctx.a, ctx.c
    ctx.o = a.reg(4 * ctx.NO)
    ctx.s, ctx.s2 = a.reg(4 * ctx.NS), a.reg(4 * ctx.NS)    # two S blocks: this tile's P, the next's S
    for i in range(4 * ctx.NO):
        a("mov.f32", ctx.o + i, 0.0)
    ctx.m, ctx.l = a.reg(2), a.reg(2)
    for r in range(2):
        a("mov.f32", ctx.m + r, float("-inf"))
        a("mov.f32", ctx.l + r, 0.0)
    ctx.t1, ctx.t2 = a.reg(), a.reg()
    t1 = ctx.t1
    ctx.limA = a.reg()
    if c.causal:                                   # key j is visible to row i iff j <= i + kv_len - q_len
        ctx.limB = a.reg()
        a("shr.u64", t1, tid, 5)
        a("shl.b64", t1, t1, 4)
        a("add.i64", ctx.limA, t1, i0)
        a("and.b64", t1, tid, 31)
        a("shr.u64", t1, t1, 2)
        a("add.i64", ctx.limA, ctx.limA, t1)       # row g of this lane
        a("add.i64", ctx.limA, ctx.limA, diff)
        a("add.i64", ctx.limB, ctx.limA, 8)
    else:
        a("sub.i64", ctx.limA, Lk, 1)
        ctx.limB = ctx.limA
    ctx.j, ctx.jkey, ctx.si, ctx.ph = a.reg(), a.reg(), a.reg(), a.reg()
    for r in (ctx.j, ctx.si, ctx.ph):
        a("mov.b64", r, 0)
    a("and.b64", ctx.jkey, tid, 3)
    a("shl.b64", ctx.jkey, ctx.jkey, 1)            # key of this lane's first S column: j*Bc + 2t
    ctx.dq0, ctx.da, ctx.db, ctx.bar = a.reg(), a.reg(), a.reg(), a.reg()
    a("shr.u64", ctx.dq0, tid, 7)                  # this warp's warpgroup: Q rows 64 wg ..
    a("mul.i64", ctx.dq0, ctx.dq0, 64 * 128 >> 4)
    a("add.i64", ctx.dq0, ctx.dq0, KMAJ)
    ctx.pm = a.pred()
    # ping-pong: warpgroup g issues its wgmma on its turn (barrier turn + 8 g, parity tp) and then
    # hands the turn to the next one; the last warpgroup hands warpgroup 0 its first turn
    ctx.tw, ctx.to, ctx.tp = a.reg(), a.reg(), a.reg()
    a("shr.u64", ctx.tw, tid, 7)
    a("add.i64", ctx.to, ctx.tw, 1)
    a("setp.ge.i64", ctx.pm, ctx.to, CW)
    a("mov.b64", ctx.to, 0, p=ctx.pm)
    a("shl.b64", ctx.to, ctx.to, 3)
    a("shl.b64", ctx.tw, ctx.tw, 3)
    a("mov.b64", ctx.tp, 0)
    a("mbarrier.arrive", Mem(ctx.to, ctx.turn), p=ctx.pm)


def _k_steps(a: Asm, mn: str, acc, da, db, ksteps: int, a_panel: int, b_panel: int, layout: int) -> None:
    """wgmma over ``ksteps`` k-steps of 16 with K-major descriptors da, db: 32 bytes along a
    128-byte row a step, the next 64-column panel (``a_panel`` / ``b_panel`` bytes on) every four."""
    for ks in range(ksteps):
        a(mn, acc, da, db, layout)
        if ks + 1 < ksteps:
            last = ks % 4 == 3
            a("add.i64", da, da, ((a_panel - 96) >> 4) if last else 2)
            a("add.i64", db, db, ((b_panel - 96) >> 4) if last else 2)


def _turn(ctx: _WgCtx, issue) -> None:
    """Emit ``issue()`` (this warpgroup's wgmma) on its turn, then hand the turn on (FA3's ping-pong:
    one warpgroup's softmax runs while the other's wgmma do)."""
    a = ctx.a
    a("mbarrier.wait", Mem(ctx.tw, ctx.turn), ctx.tp)
    a("xor.b64", ctx.tp, ctx.tp, 1)
    issue()
    a("mbarrier.arrive", Mem(ctx.to, ctx.turn))


def _issue_s(ctx: _WgCtx, s, si, ph, bar) -> None:
    """Wait for the K tile of stage ``si`` (parity ``ph``; ``bar`` = 8 si), zero S, issue S = Q K^T
    as one group."""
    a, c, t1 = ctx.a, ctx.c, ctx.t1
    a("mbarrier.wait", Mem(bar, ctx.fullK), ph)
    for i in range(4 * ctx.NS):
        a("mov.f32", s + i, 0.0)
    a("mul.i64", t1, si, ctx.SB >> 4)
    a("add.i64", ctx.db, t1, (ctx.QB >> 4) + KMAJ)
    a("mov.b64", ctx.da, ctx.dq0)
    a("wgmma.fence")
    _k_steps(a, ctx.mn_s, s, ctx.da, ctx.db, ctx.KQ, BM * 128, c.Bc * 128, 0)
    a("wgmma.commit_group")


def _issue_pv(ctx: _WgCtx, s, si, ph, bar) -> None:
    """Wait for the V tile of stage ``si``, issue O += P V (P: the A fragments in ``s``) as one group."""
    a, c, t1 = ctx.a, ctx.c, ctx.t1
    a("mbarrier.wait", Mem(bar, ctx.fullV), ph)
    # V: MN-major, 64-column panels PB / P bytes apart (LBO), key rows of 128 bytes in 8-row groups
    a("mul.i64", t1, si, ctx.SB >> 4)
    a("add.i64", ctx.db, t1, ((ctx.QB + ctx.PB) >> 4) + ((c.Bc * 128 >> 4) << 16) + KMAJ)
    a("wgmma.fence")
    for kk in range(ctx.KP):
        a(ctx.mn_o, ctx.o, s + 8 * kk, ctx.db, 2)
        if kk + 1 < ctx.KP:
            a("add.i64", ctx.db, ctx.db, 16 * 128 >> 4)
    a("wgmma.commit_group")


def _softmax(ctx: _WgCtx, s, j, label: str) -> None:
    """Mask tile ``j``'s scores in ``s`` and run the online softmax on them, P in place; O is left
    for the caller to rescale by ctx.al once its P V is done."""
    AG.mma_mask(ctx, s, j, label)
    AG.mma_softmax_tile(ctx, s, ctx.m, ctx.l, None, ctx.mx, ctx.nmc, ctx.al)


def _half_loop(ctx: _WgCtx, cur, nxt, name: str, other: str) -> None:
    """One K / V tile with P in ``cur``: issue the next tile's S = Q K^T into ``nxt`` and this tile's
    O += P V, run the next tile's softmax while P V runs, then release the stage and rescale O.
    The last tile only issues its P V."""
    a, t1 = ctx.a, ctx.t1
    si, ph, bar, sn, pn, bn = ctx.si, ctx.ph, ctx.bar, ctx.sn, ctx.pn, ctx.bn
    a.label(name)
    a("add.i64", t1, ctx.j, 1)
    a("setp.lt.i64", ctx.pm, t1, ctx.ntl)
    a("bra", name + "_LAST", p=ctx.pm, neg=True)
    a("xor.b64", sn, si, 1)                        # the next tile's stage, parity and barriers
    a("xor.b64", pn, ph, si)
    a("shl.b64", bn, sn, 3)
    _turn(ctx, lambda: (_issue_s(ctx, nxt, sn, pn, bn), _issue_pv(ctx, cur, si, ph, bar)))
    a("wgmma.wait_group", 1)                       # the next tile's S is done (its K is free); P V may run
    a("mbarrier.arrive", Mem(bn, ctx.emptyK))
    a("add.i64", ctx.jkey, ctx.jkey, ctx.Bc)
    a("add.i64", ctx.j, ctx.j, 1)
    _softmax(ctx, nxt, ctx.j, name + "_UNMASKED")
    a("wgmma.wait_group", 0)                       # P V read this tile's V and wrote O
    a("mbarrier.arrive", Mem(bar, ctx.emptyV))
    AG.rescale_o(a, ctx.o, ctx.al, ctx.NO)
    for dst, src in ((si, sn), (ph, pn), (bar, bn)):
        a("mov.b64", dst, src)
    a("bra", other)
    a.label(name + "_LAST")
    _turn(ctx, lambda: _issue_pv(ctx, cur, si, ph, bar))
    a("wgmma.wait_group", 0)
    a("mbarrier.arrive", Mem(bar, ctx.emptyV))
    a("bra", "KV_DONE")


def _consumer_loop(ctx: _WgCtx) -> None:
    """FlashAttention-3's intra-warpgroup pipeline over the K / V tiles: tile 0's S and softmax, then
    per tile its P V overlapped with the next tile's S and softmax, the two S blocks taking turns
    (the loop is unrolled twice so each half names its own)."""
    a = ctx.a
    ctx.mx, ctx.nmc, ctx.al = a.reg(2), a.reg(2), a.reg(2)
    ctx.sn, ctx.pn, ctx.bn = a.reg(), a.reg(), a.reg()
    a("mbarrier.wait", Mem(None, ctx.fullQ), ctx.ph)   # (ph is 0 here: Q's one phase)
    a("mov.b64", ctx.bar, 0)
    _turn(ctx, lambda: _issue_s(ctx, ctx.s, ctx.si, ctx.ph, ctx.bar))
    a("wgmma.wait_group", 0)
    a("mbarrier.arrive", Mem(ctx.bar, ctx.emptyK))
    _softmax(ctx, ctx.s, ctx.j, "T0_UNMASKED")        # (O is zero: nothing to rescale)
    _half_loop(ctx, ctx.s, ctx.s2, "KV_A", "KV_B")
    _half_loop(ctx, ctx.s2, ctx.s, "KV_B", "KV_A")
    a.label("KV_DONE")
    a.free(ctx.mx, ctx.nmc, ctx.al, k=2)
    a.free(ctx.sn, ctx.pn, ctx.bn)


def _o_store(ctx: _WgCtx) -> None:
    """O by bulk tensor stores, as FA3's epilogue: each consumer warp writes its 16 rows of O / l
    (converted) over its own rows of Q's panels, which no wgmma reads any more (warp q of a
    warpgroup's wgmma reads A's rows 16q .. 16q + 15 only, and its last is done), as boxes of 16
    rows x 128 bytes laid out as a bulk copy lands them (128-byte swizzle), and stores them through
    the map mapO (rows past q_len are not written); it exits once their sources are read."""
    a, tid = ctx.a, ctx.tid
    g, t, wb, rb, tmp, mo = (a.reg() for _ in range(6))
    a("and.b64", g, tid, 31)
    a("shr.u64", g, g, 2)
    a("and.b64", t, tid, 3)
    a("shr.u64", wb, tid, 5)
    a("shl.b64", wb, wb, log2(AG.O_BOX_ROWS * 128))      # the warp's rows in panel 0
    a("shl.b64", rb, g, 7)
    a("add.i64", rb, rb, wb)                       # and its row g
    sw = box_chunks(a, g, t, rb, tmp, 2)
    for pn in range(ctx.P):
        for ni in range(8):                        # the panel's 64 columns: 8 n-tiles
            box_write(a, ctx.o + 4 * (8 * pn + ni), sw + ni, pn * BM * 128, ctx.cvt, tmp)
    a.free(sw, k=8)
    cc = a.reg(4)                                  # column, row, head, batch
    a("s2r", cc + 1, "%ctaid.x")
    a("shl.b64", cc + 1, cc + 1, log2(BM))
    a("shr.u64", tmp, tid, 5)
    a("shl.b64", tmp, tmp, log2(AG.O_BOX_ROWS))
    a("add.i64", cc + 1, cc + 1, tmp)
    a("s2r", cc + 2, "%ctaid.y")
    a("s2r", cc + 3, "%ctaid.z")
    a("ldparam", mo, "mapO")
    for pn in range(ctx.P):
        a("mov.b64", cc, 64 * pn)
        a("cp.async.bulk.tensor.4d.store", Mem(wb, pn * BM * 128), mo, cc)
    a("cp.async.bulk.commit_group")
    a("cp.async.bulk.wait_group", 0)
    a("exit")


def emit(c: AG.FlashCfg) -> Program:
    """The warp-specialized kernel (see the module docstring)."""
    ctx = _WgCtx(c)
    a = ctx.a
    tid = ctx.tid = a.reg()
    a("s2r", tid, "%tid.x")
    _barriers(ctx, tid)
    bq, hd, i0, Lq, Lk = (a.reg() for _ in range(5))
    a("s2r", bq, "%ctaid.z")
    a("s2r", hd, "%ctaid.y")
    a("s2r", i0, "%ctaid.x")
    a("shl.b64", i0, i0, log2(BM))
    a("ldparam", Lq, "q_len")
    a("ldparam", Lk, "kv_len")
    ctx.ntl, ctx.nfull, t, diff = a.reg(), a.reg(), a.reg(), a.reg()
    AG.kv_tile_counts(a, ctx.ntl, ctx.nfull, i0, Lq, Lk, BM, c.Bc, c.causal, t, diff)
    a.free(t, Lq)
    p = a.pred()
    a("setp.lt.i64", p, tid, 128 * CW)
    a("bra", "CONSUMER", p=p)
    a.pfree(p)
    _producer(ctx, bq, hd, i0, ctx.ntl)
    a.label("CONSUMER")
    _consumer_setup(ctx, tid, i0, Lk, diff)
    a.free(bq, hd, i0, Lk, diff)
    _consumer_loop(ctx)
    AG.mma_epilogue(ctx, _o_store)
    return a.build()


def _unfit(caps, dtype: str, d: int, q_len: int, kv_len: int) -> list[str]:
    """What keeps this kernel from running the attention (the target needs wgmma and tma; fp16 /
    bf16; head_dim 64 or 128; q_len, kv_len at least a block's rows and a tile's keys): none if it can."""
    lacks = sorted({"wgmma", "tma"} - set(caps.features))
    bad = [f"{caps.name} has no {' or '.join(lacks)}"] if lacks else []
    if AG.DTYPE_ALIASES.get(dtype, dtype) not in ("fp16", "bf16"):
        bad.append(f"dtype {dtype}")
    if d not in HEAD_DIMS:
        bad.append(f"head_dim {d}")
    if q_len < BM or kv_len < BC:
        bad.append(f"q_len {q_len}, kv_len {kv_len}")
    return bad


def applies(caps, dtype: str, d: int, q_len: int, kv_len: int) -> bool:
    """Can this kernel run the attention (_unfit lists nothing)?"""
    return not _unfit(caps, dtype, d, q_len, kv_len)


def choose(caps, dtype: str, d: int, causal: bool, c: float, lse: bool, q_len: int, kv_len: int):
    """(cfg, program) of the warp-specialized kernel, or one InputError line saying why it cannot run."""
    where = f"attention on {caps.name} (kernel wgmma)"
    bad = _unfit(caps, dtype, d, q_len, kv_len)
    if bad:
        raise InputError(where, "; ".join(bad), f"a target with wgmma and tma, fp16 or bf16, head_dim "
                         f"{' or '.join(map(str, HEAD_DIMS))}, q_len >= {BM} and kv_len >= {BC} (its TMA boxes); "
                         "or kernel mma")
    cfg = AG.FlashCfg(dtype, d, causal, BC, True, c, lse)
    prog = emit(cfg)
    if (prog.shared_bytes > caps.scratchpad_bytes or prog.nregs > caps.max_regs_per_thread
            or prog.nregs * THREADS > caps.regs_per_core):
        raise InputError(where, f"{prog.nregs} registers x {THREADS} threads, {prog.shared_bytes} B scratchpad",
                         "a target whose core holds one block")
    return cfg, prog


def flash_attention3_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                            dtype: str = "fp16", causal: bool = False, scale: float | None = None,
                            q_ld: int | None = None, kv_ld: int | None = None, o_ld: int | None = None,
                            with_lse: bool = False) -> AG.AttentionKernel:
    """Emit the warp-specialized kernel (module docstring) for attention_gpu.flash_attention_kernel's
    arguments and layout; the kernel object builds the tensor maps in ``args``."""
    where = "attention"
    batch, heads, q_len, kv_len, d, dt, lds, scale = AG.check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld, "fp16, bf16")
    cfg, prog = choose(caps, dt, d, bool(causal), scale * AG.LOG2E, bool(with_lse), q_len, kv_len)
    check(prog, caps)
    pairs = AG.causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    return AG.AttentionKernel(program=prog, launch=Launch((ceil_div(q_len, BM), heads, batch), (THREADS, 1, 1)),
                              flops=4 * d * batch * heads * pairs, model_flops=4 * d * batch * heads * q_len * kv_len,
                              batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=d, dtype=dt,
                              causal=bool(causal), scale=scale, Bc=cfg.Bc, kind="wgmma", with_lse=bool(with_lse),
                              block_rows=BM, **lds)


__all__ = ["BC", "BM", "THREADS", "applies", "choose", "emit", "flash_attention3_kernel"]
