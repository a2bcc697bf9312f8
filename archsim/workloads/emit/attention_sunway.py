"""Fused (flash) attention for the Sunway family: O = softmax(scale * Q K^T + mask) V per (batch, head).

    caps = capabilities(load_machine("sw26010pro"))
    k = flash_attention_kernel(caps, batch=1, heads=12, q_len=1024, kv_len=1024, head_dim=64, causal=True)
    Q, K, V, O = k.random_inputs(seed=0)
    res = run_functional(k.program, k.args(Q, K, V, O), k.launch, warp_width=32, ncores=caps.cores_total)
    err = to_float(res.output("O"), k.dtype) - k.reference(Q, K, V)

The public API, the kernel object (``AttentionKernel``: buffers Q, K, V, O (+ LSE), ``args`` /
``qkv_args`` with q_off / k_off / v_off, ``reference``) and the layout of every buffer are those of
attention_gpu, so the block composer only picks the module by machine family.

A thread block is one CPE: one warp of 32 lanes, the lanes being the 512-bit vector (8 fp32 FMAs a
cycle). A CPE has no tensor unit and no cache, but a 256 KiB scratchpad (LDM) filled by DMA. The
kernel (FlashAttention-2's forward, lane = query row):

- grid = (ceil(q_len / Br), heads, batch), block (32, 1, 1): one CPE owns Br = 32 (or 64, below)
  query rows of one (batch, head), lane i row i0 + i (and i0 + 32 + i). Block x takes query
  block nqb - 1 - x, so that under a causal mask the heaviest blocks start first when the grid
  outnumbers the CPEs. Rows past q_len compute a copy of the last row and are never stored.
- Q: Br row DMAs (one per row: rows are kv_ld / q_ld apart in memory, a DMA moves one contiguous
  range) into a staging area whose rows are padded by 8 bytes (the lanes' gathers then spread over
  the LDM banks), then transposed, converted to fp32 and pre-scaled by c = scale * log2(e) into
  QT [d][32] (lane i's row in column i: one vector load gives every row's element k). The O
  accumulator OT [d][32] fp32 lives in the LDM too (d fp32 registers a lane would not fit).
- K and V blocks of Bc key rows are fetched by one DMA per row. fp16 / bf16: the rows land in a raw
  area; at the start of block j the CPE converts it to fp32 working copies Kf, Vf [Bc][d] (one
  vector load, two cvt and one 8-byte store per 64 elements, ~2% of the block's vector work), after
  which the raw area is free and the DMAs of block j+1 go there while block j is computed (double
  buffering through raw + working copy). fp32: the rows land straight in one of two stages that
  alternate. The next block's DMAs are spread over the score loop (a K and a V row per iteration
  or so) rather than issued at once, so the CPE does not stall on a full descriptor queue while it
  has math to do.
- Keys are taken U = 16 at a time (a group). Scores s_u = sum_k QT[k][lane] Kf[u][k]: per k a
  vector load of QT and, per key, a broadcast load of Kf (ld.shared.v4: four k at once, every lane
  the same address) and one fma.f32: no shuffles, every row's statistics stay in its own lane.
- Online softmax in fp32 in the log2 domain, lane-local: m_new = max(m, s_0..s_15), alpha =
  ex2(m - m_new), p_u = ex2(s_u - m_new), l = alpha l + sum p_u. Masking only in blocks that need
  it (the diagonal and the kv tail: a uniform branch); causal blocks stop at the last block their
  last row sees.
- O += P V: OT is walked in chunks of C columns: C vector loads, O *= alpha, per key a broadcast
  load of four Vf elements and four fma.f32 with p_u, C vector stores.
- Epilogue: O / l, converted to the storage dtype, transposed back into padded rows in the LDM and
  written by one DMA put per row (rows < q_len only); LSE (with_lse) as 32 fp32 values by one put.

Why fp32 math with fp16 storage: the vector pipe's f16x2 FMA is 4x faster, but scores summed over
64-128 products and probabilities in fp16 would miss the tolerance the GPU kernels meet (a few
units of fp16 rounding on O); fp32 keeps the kernel's error at the output's own rounding.

Block sizes: Br = 32 rows (the vector width), or 64 (two chunks of 32 rows that take every K/V
group in turn, their m and l kept in the LDM) when the grid at 64 rows a CPE still covers every
CPE (ceil(q_len / 64) * heads * batch >= cores) and a Bc >= 32 fits: the K/V traffic per flop
halves (DRAM, not the vector pipe, limits 32-row blocks on a full chip; on tiny-sunway b4 h8 256
x 256 the 64-row kernel is 20% faster). Bc is the largest of 64, 32, 16, 8 whose LDM footprint fits
caps.scratchpad_bytes: QT + OT (2 x 128 d bytes a chunk) + the raw area (2 Bc d es, and at least
the padded staging rows) + the fp32 working copies (8 Bc d; fp32 has two raw stages instead).
(U, C) is the first of (16, 16), (16, 8), (8, 8) whose registers fit max_regs_per_thread.

Decode (q_len = 1): a second program (kind "sunway_decode"), lane = key. One CPE per (batch, head);
lane i takes keys j*Bc + 32u + i (u < Bc/32) of every K/V block, keeps its own running max, sum
and O columns (OT[.][i]), and the 32 partial softmaxes are merged at the end by shfl.bfly (max,
then the rescaled sums and O columns). K / V rows land in padded rows and are transposed to fp32
K^T, V^T [d][Bc] so that one vector load gives 32 keys' element k; Q is broadcast from the LDM.
Bc is the largest of 128, 64, 32 that fits; where none does (d 128 on a 64 KiB LDM) the row
kernel runs instead. The KV length is split over the lanes, not over CPEs: merging partial
(m, l, O) across CPEs needs atomics (the ISA has none), a workspace buffer and a second kernel
(the composer's attention op is one kernel over Q, K, V, O), or RMA / bar.grid (RMA has no timing
model yet; bar.grid needs the whole grid resident). So decode keeps batch*heads CPEs busy.

DMA granularity: a dma.get moves one contiguous range, and the rows of one head are kv_ld apart,
so every K / V row is its own 2 d-byte descriptor. An engine's FIFO holds 8 descriptors until
they complete (~500 cycles on sw26010pro), so one engine moves ~2 B/cycle of such rows: enough
for the prefill kernel (4 CPEs an engine, 0.5 B/cycle each), the limit of decode. A strided DMA
(the real athread_get's stride / bsize) would lift it; the ISA has none yet.

``flops`` and ``model_flops`` count as attention_gpu does (4 d per visible / per (query, key) pair).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program
from archsim.workloads.emit.attention_gpu import (LN2, LOG2E, LSE_PARAMS, PARAMS, AttentionKernel, causal_pairs,
                                                  check_attention_args)
from archsim.workloads.emit.gemm_gpu import _Asm, _ceil, _log2, _OutOfRegisters

__all__ = ["flash_attention_kernel"]

BR = 32                        # query rows per CPE: one per lane
LANES = 32
BC_CHOICES = (64, 32, 16, 8)   # key rows per K/V block, largest first
UC_CHOICES = ((16, 16), (16, 8), (8, 8))   # (keys per group, O columns per chunk)
_ES = {"fp16": 2, "bf16": 2, "fp32": 4}
_CVT_IN = {"fp16": ("cvt.f32.f16", "cvt.f32.f16h"), "bf16": ("cvt.f32.bf16", "cvt.f32.bf16h")}
_CVT_OUT = {"fp16": "cvt.f16x2.f32", "bf16": "cvt.bf16x2.f32"}
NEEDED_UNITS = ("fp32", "mufu", "dma")


@dataclass(frozen=True)
class _Cfg:
    dtype: str
    d: int
    causal: bool
    Bc: int
    U: int
    C: int
    c: float            # scale * log2(e)
    lse: bool = False
    nch: int = 1        # chunks of 32 query rows a CPE owns (row kernel)


def _layout(dtype: str, d: int, Bc: int, nch: int = 1) -> dict:
    """LDM byte offsets: QT, OT ([d][32 nch] fp32 each), ML (m, l of every row: [2][32 nch]), RAW
    (DMA landing area / staging), WK (fp32 working K, V follows)."""
    es = _ES[dtype]
    RB, RBp = d * es, d * es + 8
    stage = 2 * Bc * RB                               # K rows then V rows
    raw = max(stage * (2 if dtype == "fp32" else 1), LANES * nch * RBp + 4 * LANES * nch)
    raw = _ceil(raw, 16) * 16
    QP = 128 * nch                                    # bytes of a QT / OT row (one k, every row)
    QT, OT, ML = 0, QP * d, 2 * QP * d
    RAW = ML + (2 * QP if nch > 1 else 0)
    WK = RAW + raw
    total = WK + (8 * Bc * d if dtype != "fp32" else 0)
    return dict(es=es, RB=RB, RBp=RBp, STG=stage, QP=QP, QT=QT, OT=OT, ML=ML, RAW=RAW,
                WK=WK if dtype != "fp32" else RAW, total=total)


def _emit(c: _Cfg, max_regs: int) -> Program:
    d, Bc, U, C = c.d, c.Bc, c.U, c.C
    nch = c.nch
    L = _layout(c.dtype, d, Bc, nch)
    es, RB, RBp, STG, OT, RAW = L["es"], L["RB"], L["RBp"], L["STG"], L["OT"], L["RAW"]
    QP, ML, BRr = L["QP"], L["ML"], BR * nch
    f32 = c.dtype == "fp32"
    KV4 = 4 * d                                       # bytes of a working K / V row (fp32)
    VOFF = Bc * KV4                                   # working V block after the working K block
    NIT = d // 4                                      # score-loop iterations (4 k each)
    name = f"flash_attn_sw_{c.dtype}_d{d}_br{BRr}_bc{Bc}_u{U}{'_causal' if c.causal else ''}{'_lse' if c.lse else ''}"
    a = _Asm(name, LSE_PARAMS if c.lse else PARAMS, L["total"], limit=max_regs)

    # ---------------------------------------------------------------- coordinates
    qa0, bq, hd, i0, Lq, Lk, t1, t2 = (a.reg() for _ in range(8))
    a("s2r", qa0, "%tid.x")
    a("shl.b64", qa0, qa0, 2)                         # 4 * lane: this lane's column of QT / OT
    a("s2r", bq, "%ctaid.z")
    a("s2r", hd, "%ctaid.y")
    a("s2r", t1, "%nctaid.x")
    a("s2r", t2, "%ctaid.x")
    a("sub.i64", i0, t1, t2)
    a("sub.i64", i0, i0, 1)                           # query block nqb - 1 - x: heavy causal blocks first
    a("shl.b64", i0, i0, _log2(BRr))
    a("ldparam", Lq, "q_len")
    a("ldparam", Lk, "kv_len")
    rbn = a.reg()
    a("mov.b64", rbn, RB)                             # bytes a row DMA moves

    def base_ptr(dst, buf, rows, ld_name, off_name):
        """dst = buf + es*((bq*rows)*ld + hd*d + off); returns a register with ld*es (bytes a row)."""
        ldb = a.reg()
        a("ldparam", ldb, ld_name)
        a("mul.i64", dst, bq, rows)
        a("mul.i64", dst, dst, ldb)
        a("mad.i64", dst, hd, d, dst)
        a("ldparam", t1, off_name)
        a("add.i64", dst, dst, t1)
        a("shl.b64", dst, dst, _log2(es))
        a("ldparam", t1, buf)
        a("add.i64", dst, dst, t1)
        a("shl.b64", ldb, ldb, _log2(es))
        return ldb

    pl = a.pred()

    def row_loop(label, count, body):
        """for r in 0 .. count-1 (count: register or int >= 1): body(r)."""
        r = a.reg()
        a("mov.b64", r, 0)
        a.label(label)
        body(r)
        a("add.i64", r, r, 1)
        a("setp.lt.i64", pl, r, count)
        a("bra", label, p=pl)
        a.free(r)

    # ---------------------------------------------------------------- Q: 32 row DMAs, transpose, scale
    gq = a.reg()
    qldb = base_ptr(gq, "Q", Lq, "q_ld", "q_off")
    qlim = a.reg()
    a("sub.i64", qlim, Lq, 1)

    def q_row(r):
        a("add.i64", t1, i0, r)
        a("min.i64", t1, t1, qlim)
        a("mad.i64", t1, t1, qldb, gq)
        a("mul.i64", t2, r, RBp)
        a("dma.get", Mem(t2, RAW), Mem(t1, 0), rbn)

    row_loop("Q_ROWS", BRr, q_row)
    a.free(gq, qldb)
    a("dma.wait", 0)
    stg, x, y, z = a.reg(), a.reg(), a.reg(), a.reg()
    a("mul.i64", stg, qa0, RBp // 4)                  # lane * RBp: this lane's staged row
    for ch in range(nch):                             # rows 32 ch + lane
        so, qo = RAW + 32 * ch * RBp, 128 * ch
        if f32:
            for k in range(d):
                a("ld.shared.b32", x, Mem(stg, so + 4 * k))
                a("mul.f32", x, x, c.c)
                a("st.shared.b32", Mem(qa0, qo + QP * k), x)
        else:
            lo, hi = _CVT_IN[c.dtype]
            for k in range(0, d, 2):
                a("ld.shared.b32", x, Mem(stg, so + 2 * k))
                a(lo, y, x)
                a(hi, z, x)
                a("mul.f32", y, y, c.c)
                a("mul.f32", z, z, c.c)
                a("st.shared.b32", Mem(qa0, qo + QP * k), y)
                a("st.shared.b32", Mem(qa0, qo + QP * (k + 1)), z)
    a("mov.f32", x, 0.0)
    for k in range(d * nch):
        a("st.shared.b32", Mem(qa0, OT + 128 * k), x)
    if nch > 1:                                       # m = -inf, l = 0 of every chunk's rows
        a("mov.f32", y, float("-inf"))
        for ch in range(nch):
            a("st.shared.b32", Mem(qa0, ML + 128 * ch), y)
            a("st.shared.b32", Mem(qa0, ML + QP + 128 * ch), x)
    a.free(stg, x, y, z)

    # ---------------------------------------------------------------- K / V sources, block counts, mask limit
    gk, gv = a.reg(), a.reg()
    kldb = base_ptr(gk, "K", Lk, "kv_ld", "k_off")
    a.free(base_ptr(gv, "V", Lk, "kv_ld", "v_off"))
    klim = a.reg()
    a("sub.i64", klim, Lk, 1)
    ntl, nfull, lim = a.reg(), a.reg(), a.reg()
    lb = _log2(Bc)
    a("s2r", lim, "%tid.x")
    a("add.i64", lim, lim, i0)
    a("min.i64", lim, lim, qlim)                      # this lane's row, clamped
    if c.causal:
        a("sub.i64", t2, Lk, Lq)                      # diff: row i sees keys 0 .. i + diff
        a("add.i64", t1, i0, BRr - 1)
        a("min.i64", t1, t1, qlim)                    # the block's last real row
        a("add.i64", ntl, t1, t2)
        a("add.i64", ntl, ntl, Bc)
        a("shr.u64", ntl, ntl, lb)                    # blocks up to the one holding its last visible key
        a("add.i64", nfull, i0, t2)
        a("add.i64", nfull, nfull, 1)
        a("shr.u64", nfull, nfull, lb)                # blocks the block's first row sees whole
        a("add.i64", lim, lim, t2)
        a("shl.b64", ntl, ntl, lb)                    # both in keys from here on
        a("shl.b64", nfull, nfull, lb)
    else:
        a("add.i64", ntl, Lk, Bc - 1)
        a("shr.u64", ntl, ntl, lb)
        a("shr.u64", nfull, Lk, lb)
        a("mov.b64", lim, klim)
        a("shl.b64", ntl, ntl, lb)                    # both in keys from here on
        a("shl.b64", nfull, nfull, lb)
    a.free(Lk, qlim, bq, hd, i0, Lq)                  # the epilogue reads i0 and q_len again

    # block 0: its K and V rows into stage 0 (the raw area)
    def kv_row(r):
        a("min.i64", t1, r, klim)
        a("mul.i64", t2, r, RB)
        a("add.i64", t2, t2, RAW)
        a("mad.i64", t1, t1, kldb, gk)
        a("dma.get", Mem(t2, 0), Mem(t1, 0), rbn)
        a("min.i64", t1, r, klim)
        a("mad.i64", t1, t1, kldb, gv)
        a("dma.get", Mem(t2, Bc * RB), Mem(t1, 0), rbn)

    row_loop("KV0_ROWS", Bc, kv_row)

    # ---------------------------------------------------------------- loop state
    m, l, key, rr, dk = (a.reg() for _ in range(5))
    a("mov.f32", m, float("-inf"))
    a("mov.f32", l, 0.0)
    a("mov.b64", key, 0)                              # first key of the current group (block j: j*Bc)
    if f32:                                           # the two stages alternate
        wk, dd = a.reg(), a.reg()
        a("mov.b64", wk, L["WK"])                     # working K block (V at + VOFF)
        a("mov.b64", dd, RAW + STG)                   # where the next block's rows land
    else:                                             # fixed: working copies at WK, DMAs into RAW
        wk, dd = L["WK"], RAW
    pn, pk, pm = a.pred(), a.pred(), a.pred()

    a.label("KV_LOOP")
    a("dma.wait", 0)                                  # block j landed
    if not f32:                                       # raw -> fp32 working copies (K then V, contiguous)
        lo, hi = _CVT_IN[c.dtype]
        n_it = 2 * Bc * d // 64
        UNR = 4
        src, dst = a.reg(), a.reg()
        xs, ys = a.reg(UNR), a.reg(2 * UNR)
        a("add.i64", src, qa0, RAW)
        a("shl.b64", dst, qa0, 1)
        a("add.i64", dst, dst, L["WK"])

        def conv(r):
            for e in range(UNR):
                a("ld.shared.b32", xs + e, Mem(src, 128 * e))
            for e in range(UNR):
                a(lo, ys + 2 * e, xs + e)
                a(hi, ys + 2 * e + 1, xs + e)
            for e in range(UNR):
                a("st.shared.v2.b32", Mem(dst, 256 * e), ys + 2 * e)
            a("add.i64", src, src, 128 * UNR)
            a("add.i64", dst, dst, 256 * UNR)

        row_loop("CONVERT", n_it // UNR, conv)
        a.free(src, dst)
        a.free(xs, k=UNR)
        a.free(ys, k=2 * UNR)
    a("add.i64", rr, key, Bc)                         # the next block's first key row
    a("setp.lt.i64", pn, rr, ntl)                     # a next block exists
    a("mov.b64", dk, dd)
    a("setp.ge.i64", pk, key, nfull)                  # this block needs the mask
    kp = a.reg()
    a("mov.b64", kp, wk)

    a.label("GROUP")
    if nch > 1:                                       # every chunk of 32 rows takes this group of keys
        choff = a.reg()                               # 128 * chunk
        a("mov.b64", choff, 0)
        a.label("CHUNKS")
        a("add.i64", t1, qa0, choff)
        a("ld.shared.b32", m, Mem(t1, ML))
        a("ld.shared.b32", l, Mem(t1, ML + QP))
    # ---- scores s_u of keys key .. key+U-1 (log2 domain: Q is pre-scaled)
    s = a.reg(U)
    for u in range(U):
        a("mov.f32", s + u, 0.0)
    # Keys in pairs, their fmas interleaved (two fmas apart on one accumulator cover the FMA
    # latency). A loop body covers two k-quads (q registers A, B); everything else the loop does
    # (the other half's q loads, the next pair's and next body's K loads, the next block's row
    # DMAs, the loop counter) is spread between the fmas, so the in-order CPE issues it in the
    # shadow of the vector pipe instead of in a clump the pipe waits through.
    q, kv = [a.reg(4), a.reg(4)], [a.reg(8), a.reg(8)]
    qa, kp2, it = a.reg(), a.reg(), a.reg()
    if nch > 1:
        a("add.i64", qa, qa0, choff)
    else:
        a("mov.b64", qa, qa0)
    a("mov.b64", kp2, kp)
    a("mov.b64", it, 0)
    NB = NIT // 2                                     # loop bodies
    rows_per_body = max(1, U // NB)
    pit = a.pred() if NB > U else None
    pc0 = a.pred() if nch > 1 else None               # the first chunk issues the next block's DMAs
    pq = a.pred() if (pit is not None or pc0 is not None) else None
    if pc0 is not None:
        a("setp.eq.i64", pc0, choff, 0)
        if pit is None:
            a("and.pred", pq, pc0, pn)
    for e in range(4):
        a("ld.shared.b32", q[0] + e, Mem(qa, QP * e))
    a("ld.shared.v4.b32", kv[0], Mem(kp2, 0))
    a("ld.shared.v4.b32", kv[0] + 4, Mem(kp2, KV4))
    a.label("SCORE")
    fill = []                                         # (mnemonic, operands, kwargs) in order
    pinc = pit                                        # guards the DMA row counters
    if pit is not None:
        fill.append(("setp.lt.i64", (pit, it, U), {}))
        fill.append(("and.pred", (pq, pit, pn), {}))
        if pc0 is not None:
            fill.append(("and.pred", (pq, pq, pc0), {}))
            fill.append(("and.pred", (pit, pit, pc0), {}))
    elif pc0 is not None:
        pinc = pc0
    for _ in range(rows_per_body):
        g = pq if pq is not None else pn
        fill += [("min.i64", (t1, rr, klim), {}), ("mad.i64", (t2, t1, kldb, gk), {}),
                 ("dma.get", (Mem(dk, 0), Mem(t2, 0), rbn), {"p": g}), ("mad.i64", (t2, t1, kldb, gv), {}),
                 ("dma.get", (Mem(dk, Bc * RB), Mem(t2, 0), rbn), {"p": g}),
                 ("add.i64", (rr, rr, 1), {"p": pinc}), ("add.i64", (dk, dk, RB), {"p": pinc})]
    fill += [("add.i64", (it, it, 1), {}), ("setp.lt.i64", (pm, it, NB), {})]
    halves = ([("ld.shared.b32", (q[1] + e, Mem(qa, QP * (4 + e))), {}) for e in range(4)] + fill[:len(fill) // 2],
              [("ld.shared.b32", (q[0] + e, Mem(qa, QP * (8 + e))), {}) for e in range(4)] + fill[len(fill) // 2:])
    for h in range(2):
        todo = list(halves[h])
        npairs = U // 2
        every = max(1, (4 * U) // (len(todo) + 1))    # fmas between two fillers
        nf = 0
        for pi in range(npairs):
            u = 2 * pi
            nxt = kv[(pi + 1) % 2]
            if pi + 1 < npairs:                       # the next pair of this k-quad
                a("ld.shared.v4.b32", nxt, Mem(kp2, 16 * h + (u + 2) * KV4))
                a("ld.shared.v4.b32", nxt + 4, Mem(kp2, 16 * h + (u + 3) * KV4))
            else:                                     # pair 0 of the next k-quad (next half / body)
                a("ld.shared.v4.b32", nxt, Mem(kp2, 16 * (h + 1)))
                a("ld.shared.v4.b32", nxt + 4, Mem(kp2, 16 * (h + 1) + KV4))
            b = kv[pi % 2]
            for e in range(4):
                for w in range(2):
                    a("fma.f32", s + u + w, q[h] + e, b + 4 * w + e, s + u + w)
                    nf += 1
                    if todo and nf % every == 0:
                        mn, ops, kw = todo.pop(0)
                        a(mn, *ops, **kw)
        for mn, ops, kw in todo:
            a(mn, *ops, **kw)
        if npairs % 2:                                # keep "pair 0 is in kv[0]" for the next k-quad
            raise _OutOfRegisters(f"U = {U}: an odd number of key pairs")
    a.pfree(*(p_ for p_ in (pit, pq, pc0) if p_ is not None))
    a("add.i64", qa, qa, 8 * QP)
    a("add.i64", kp2, kp2, 32)
    a("bra", "SCORE", p=pm)
    a.free(qa, kp2, it)
    a.free(q[0], q[1], k=4)
    a.free(kv[0], kv[1], k=8)

    # ---- mask: key + u visible to this lane's row iff key + u <= lim
    a("bra", "UNMASKED", p=pk, neg=True)
    pe = a.pred()
    if nch > 1 and c.causal:                          # this chunk's rows: lim + 32 chunk, at most kv_len - 1
        a("shr.u64", t1, choff, 2)
        a("add.i64", t1, t1, lim)
        a("min.i64", t1, t1, klim)
        a("sub.i64", t1, t1, key)
    else:
        a("sub.i64", t1, lim, key)
    for u in range(U):
        a("setp.lt.i64", pe, t1, u)
        a("mov.f32", s + u, float("-inf"), p=pe)
    a.pfree(pe)
    a.label("UNMASKED")

    # ---- online softmax (every row in its own lane); max by a tree over temporaries
    def tree(op, first, n, out):
        tmp = a.reg(n // 2)
        for i in range(n // 2):
            a(op, tmp + i, first + 2 * i, first + 2 * i + 1)
        w = n // 2
        while w > 1:
            for i in range(w // 2):
                a(op, tmp + i, tmp + 2 * i, tmp + 2 * i + 1)
            w //= 2
        a(op, out, out, tmp)
        a.free(tmp, k=n // 2)

    mx, al = a.reg(), a.reg()
    a("mov.f32", mx, m)
    tree("max.f32", s, U, mx)                         # m_new
    a("sub.f32", al, m, mx)
    a("ex2.f32", al, al)                              # alpha = 2^(m_old - m_new)
    a("mov.f32", m, mx)
    for u in range(U):
        a("sub.f32", s + u, s + u, mx)
    a("ex2.f32", s, s)
    a("ex2.f32", s + 1, s + 1)
    a.free(mx)

    # ---- O += P V, C columns of OT at a time. The first chunk is emitted apart: p_(u+2) = ex2(..)
    # issues just before the fmas of p_u (its result lands while they run), so the slow mufu pipe
    # works while the vector pipe does.
    oa, vp = a.reg(), a.reg()
    a("add.i64", oa, qa0, OT)
    if nch > 1:
        a("add.i64", oa, oa, choff)
    a("add.i64", vp, kp, VOFF)

    def chunk(first: bool):
        o, vb = a.reg(C), [a.reg(4), a.reg(4)]
        for e in range(4):                            # loads run 4 ahead of the rescaling muls
            a("ld.shared.b32", o + e, Mem(oa, QP * e))
        for e in range(C):
            a("mul.f32", o + e, o + e, al)
            if e + 4 < C:
                a("ld.shared.b32", o + e + 4, Mem(oa, QP * (e + 4)))
        steps = [(u, e4) for u in range(U) for e4 in range(C // 4)]
        a("ld.shared.v4.b32", vb[0], Mem(vp, 0))
        for i, (u, e4) in enumerate(steps):
            if first and e4 == 0 and u + 2 < U:
                a("ex2.f32", s + u + 2, s + u + 2)    # p = 2^(s - m_new), two keys ahead
            if i + 1 < len(steps):
                u2, f2 = steps[i + 1]
                a("ld.shared.v4.b32", vb[(i + 1) % 2], Mem(vp, u2 * KV4 + 16 * f2))
            for e in range(4):
                a("fma.f32", o + 4 * e4 + e, s + u, vb[i % 2] + e, o + 4 * e4 + e)
                if u == U - 1 and e4 > 0:             # the last key: store the previous 4 columns
                    a("st.shared.b32", Mem(oa, QP * (4 * (e4 - 1) + e)), o + 4 * (e4 - 1) + e)
        for e in range(C - 4, C):
            a("st.shared.b32", Mem(oa, QP * e), o + e)
        a("add.i64", oa, oa, QP * C)
        a("add.i64", vp, vp, 4 * C)
        a.free(o, k=C)
        a.free(vb[0], vb[1], k=4)

    chunk(True)
    sm = a.reg()                                      # l = alpha l + sum p
    a("mov.f32", sm, 0.0)
    tree("add.f32", s, U, sm)
    a("fma.f32", l, l, al, sm)
    a.free(sm)
    if d // C > 1:
        cc = a.reg()
        a("mov.b64", cc, 1)
        a.label("PV")
        chunk(False)
        a("add.i64", cc, cc, 1)
        a("setp.lt.i64", pm, cc, d // C)
        a("bra", "PV", p=pm)
        a.free(cc)
    a.free(oa, vp, al)
    a.free(s, k=U)
    if nch > 1:
        a("add.i64", t1, qa0, choff)
        a("st.shared.b32", Mem(t1, ML), m)
        a("st.shared.b32", Mem(t1, ML + QP), l)
        a("add.i64", choff, choff, 128)
        a("setp.lt.i64", pm, choff, QP)
        a("bra", "CHUNKS", p=pm)
        a.free(choff)

    a("add.i64", kp, kp, U * KV4)
    a("add.i64", key, key, U)
    a("sub.i64", t1, kp, wk)                          # groups done in this block (wk: register or immediate)
    a("setp.lt.i64", pm, t1, Bc * KV4)
    a("bra", "GROUP", p=pm)
    a.free(kp)
    if f32:                                           # the stages swap
        a("mov.b64", t1, wk)
        a("mov.b64", wk, dd)
        a("mov.b64", dd, t1)
        a.free(wk, dd)
    a("setp.lt.i64", pm, key, ntl)
    a("bra", "KV_LOOP", p=pm)
    a.free(key, rr, dk, ntl, nfull, lim, gk, gv, kldb, klim)
    a.pfree(pn, pk)

    # ---------------------------------------------------------------- epilogue: O / l -> padded rows -> row DMAs
    nr, i0, Lq = a.reg(), a.reg(), a.reg()
    a("s2r", t1, "%nctaid.x")
    a("s2r", t2, "%ctaid.x")
    a("sub.i64", i0, t1, t2)
    a("sub.i64", i0, i0, 1)
    a("shl.b64", i0, i0, _log2(BRr))
    a("ldparam", Lq, "q_len")
    a("sub.i64", nr, Lq, i0)
    a("min.i64", nr, nr, BRr)                         # rows of this block below q_len
    LSEB = RAW + BRr * RBp                            # staged log-sum-exps
    stg, x, y = a.reg(), a.reg(), a.reg()
    a("mul.i64", stg, qa0, RBp // 4)
    for ch in range(nch):                             # rows 32 ch + lane: O / l -> padded rows
        if nch > 1:
            a("ld.shared.b32", m, Mem(qa0, ML + 128 * ch))
            a("ld.shared.b32", l, Mem(qa0, ML + QP + 128 * ch))
        if c.lse:                                     # ln(sum e^(scale s)) = ln2 (m + log2 l)
            a("lg2.f32", x, l)
            a("add.f32", x, x, m)
            a("mul.f32", x, x, LN2)
            a("st.shared.b32", Mem(qa0, LSEB + 128 * ch), x)
        a("rcp.f32", l, l)
        so, qo = RAW + 32 * ch * RBp, OT + 128 * ch
        if f32:
            for k in range(d):
                a("ld.shared.b32", x, Mem(qa0, qo + QP * k))
                a("mul.f32", x, x, l)
                a("st.shared.b32", Mem(stg, so + 4 * k), x)
        else:
            for k in range(0, d, 2):
                a("ld.shared.b32", x, Mem(qa0, qo + QP * k))
                a("ld.shared.b32", y, Mem(qa0, qo + QP * (k + 1)))
                a("mul.f32", x, x, l)
                a("mul.f32", y, y, l)
                a(_CVT_OUT[c.dtype], x, x, y)
                a("st.shared.b32", Mem(stg, so + 2 * k), x)
    a.free(stg, y)
    if c.lse:
        a("s2r", t1, "%nctaid.y")
        a("s2r", t2, "%ctaid.z")
        a("mul.i64", t1, t1, t2)
        a("s2r", t2, "%ctaid.y")
        a("add.i64", t1, t1, t2)                      # b*heads + head
        a("mad.i64", t1, t1, Lq, i0)
        a("shl.b64", t1, t1, 2)
        a("ldparam", t2, "LSE")
        a("add.i64", t1, t1, t2)
        a("shl.b64", x, nr, 2)
        a("mov.b64", t2, LSEB)
        a("dma.put", Mem(t1, 0), Mem(t2, 0), x)
    a.free(x)
    # O rows: bq, hd again from the special registers (their registers were freed)
    go = a.reg()
    bq, hd = a.reg(), a.reg()
    a("s2r", bq, "%ctaid.z")
    a("s2r", hd, "%ctaid.y")
    oldb = base_ptr(go, "O", Lq, "o_ld", "o_off")
    a.free(bq, hd)
    a("mad.i64", go, i0, oldb, go)                    # row i0

    def o_row(r):
        a("mul.i64", t2, r, RBp)
        a("dma.put", Mem(go, 0), Mem(t2, RAW), rbn)
        a("add.i64", go, go, oldb)

    row_loop("O_ROWS", nr, o_row)
    a("dma.wait", 0)
    a("exit")
    return a.build()


# ----------------------------------------------------------------------------- decode (q_len = 1)
DEC_BC_CHOICES = (128, 64, 32)   # keys per block: 32 lanes x U keys a lane


def _dec_layout(dtype: str, d: int, Bc: int) -> dict:
    es = _ES[dtype]
    RB, RBp = d * es, d * es + 8
    QF, OT = 0, _ceil(4 * d, 128) * 128
    RAW = OT + 128 * d
    raw = _ceil(max(2 * Bc * RBp, 2 * RB + 16), 16) * 16
    KT = RAW + raw
    return dict(es=es, RB=RB, RBp=RBp, QF=QF, OT=OT, RAW=RAW, KT=KT, VT=KT + 4 * Bc * d, total=KT + 8 * Bc * d)


def _emit_decode(c: _Cfg, max_regs: int) -> Program:
    """q_len = 1: lane = key. Lane i takes keys j*Bc + 32u + i (u < U = Bc/32) of every block, with
    its own running max, sum and O column set OT[.][i]; the 32 partial softmaxes are merged by
    shfl.bfly at the end. K / V rows land by row DMAs in padded rows and are transposed to fp32
    KT, VT [d][Bc] (key-contiguous: one vector load gives 32 keys' element k)."""
    d, Bc = c.d, c.Bc
    U = Bc // LANES
    C = 8
    L = _dec_layout(c.dtype, d, Bc)
    es, RB, RBp, OT, RAW, KT, VT = L["es"], L["RB"], L["RBp"], L["OT"], L["RAW"], L["KT"], L["VT"]
    f32 = c.dtype == "fp32"
    KTR = 4 * Bc                                      # bytes of a KT / VT row (one k, all keys)
    name = f"flash_attn_sw_decode_{c.dtype}_d{d}_bc{Bc}{'_lse' if c.lse else ''}"
    a = _Asm(name, LSE_PARAMS if c.lse else PARAMS, L["total"], limit=max_regs)
    qa0, bq, hd, t1, t2, rbn, lane = (a.reg() for _ in range(7))
    a("s2r", lane, "%tid.x")
    a("shl.b64", qa0, lane, 2)
    a("s2r", bq, "%ctaid.z")
    a("s2r", hd, "%ctaid.y")
    a("mov.b64", rbn, RB)
    pl = a.pred()

    def base_ptr(dst, buf, rows, ld_name, off_name):
        ldb = a.reg()
        a("ldparam", ldb, ld_name)
        a("mul.i64", dst, bq, rows)
        a("mul.i64", dst, dst, ldb)
        a("mad.i64", dst, hd, d, dst)
        a("ldparam", t1, off_name)
        a("add.i64", dst, dst, t1)
        a("shl.b64", dst, dst, _log2(es))
        a("ldparam", t1, buf)
        a("add.i64", dst, dst, t1)
        a("shl.b64", ldb, ldb, _log2(es))
        return ldb

    def row_loop(label, count, body):
        r = a.reg()
        a("mov.b64", r, 0)
        a.label(label)
        body(r)
        a("add.i64", r, r, 1)
        a("setp.lt.i64", pl, r, count)
        a("bra", label, p=pl)
        a.free(r)

    one = a.reg()
    a("mov.b64", one, 1)
    # ---- Q row -> QF (fp32, scaled by c): lanes take element pairs
    g = a.reg()
    a.free(base_ptr(g, "Q", one, "q_ld", "q_off"))
    a("mov.b64", t2, RAW)
    a("dma.get", Mem(t2, 0), Mem(g, 0), rbn)
    a("dma.wait", 0)
    x, y, z = a.reg(), a.reg(), a.reg()
    pq = a.pred()
    if f32:
        for k0 in range(0, d, LANES):
            a("ld.shared.b32", x, Mem(qa0, RAW + 4 * k0))
            a("mul.f32", x, x, c.c)
            a("st.shared.b32", Mem(qa0, 4 * k0), x)
    else:
        lo, hi = _CVT_IN[c.dtype]
        for k0 in range(0, d, 2 * LANES):
            part = d - k0 < 2 * LANES                 # d 32: lanes 0 .. 15 hold the 32 elements
            if part:
                a("setp.lt.i64", pq, lane, (d - k0) // 2)
            a("ld.shared.b32", x, Mem(qa0, RAW + 2 * k0))
            a(lo, y, x)
            a(hi, z, x)
            a("mul.f32", y, y, c.c)
            a("mul.f32", z, z, c.c)
            a("shl.b64", t1, qa0, 1)
            a("st.shared.v2.b32", Mem(t1, 4 * k0), y, p=pq if part else None)
    a("mov.f32", x, 0.0)
    for k in range(d):
        a("st.shared.b32", Mem(qa0, OT + 128 * k), x)
    a.free(x, y, z)
    a.pfree(pq)

    # ---- K / V rows
    gk, gv = a.reg(), a.reg()
    Lk = a.reg()
    a("ldparam", Lk, "kv_len")
    kldb = base_ptr(gk, "K", Lk, "kv_ld", "k_off")
    a.free(base_ptr(gv, "V", Lk, "kv_ld", "v_off"))
    klim, ntl = a.reg(), a.reg()
    a("sub.i64", klim, Lk, 1)
    a("add.i64", ntl, Lk, Bc - 1)
    a("shr.u64", ntl, ntl, _log2(Bc))
    a("shl.b64", ntl, ntl, _log2(Bc))                # keys of the blocks run
    a.free(Lk, one)

    def kv_rows(first_key):
        def body(r):
            a("add.i64", t1, r, first_key)
            a("min.i64", t1, t1, klim)
            a("mul.i64", t2, r, RBp)
            a("mad.i64", g, t1, kldb, gk)
            a("dma.get", Mem(t2, RAW), Mem(g, 0), rbn)
            a("mad.i64", g, t1, kldb, gv)
            a("dma.get", Mem(t2, RAW + Bc * RBp), Mem(g, 0), rbn)
        return body

    key = a.reg()
    a("mov.b64", key, 0)
    row_loop("KV0_ROWS", Bc, kv_rows(key))
    m, l = a.reg(), a.reg()
    a("mov.f32", m, -1e30)                            # finite: a lane whose keys are all masked stays exact
    a("mov.f32", l, 0.0)
    pm, pn, pk = a.pred(), a.pred(), a.pred()

    a.label("KV_LOOP")
    a("dma.wait", 0)
    # transpose + convert: lane i takes row 32u + i; KT[k][32u + i]
    src, dst = a.reg(), a.reg()
    xs, ys = a.reg(4), a.reg(8)
    for which, raw0, dst0 in (("K", RAW, KT), ("V", RAW + Bc * RBp, VT)):
        for u in range(U):
            a("mul.i64", src, lane, RBp)
            a("add.i64", src, src, raw0 + 32 * u * RBp)
            a("add.i64", dst, qa0, dst0 + 128 * u)
            step = 4 if f32 else 8                    # elements a loop iteration converts
            for k0 in range(0, d, step):
                if f32:
                    for e in range(4):
                        a("ld.shared.b32", ys + e, Mem(src, 4 * (k0 + e)))
                    for e in range(4):
                        a("st.shared.b32", Mem(dst, KTR * (k0 + e)), ys + e)
                else:
                    lo, hi = _CVT_IN[c.dtype]
                    for e in range(4):
                        a("ld.shared.b32", xs + e, Mem(src, 2 * k0 + 4 * e))
                    for e in range(4):
                        a(lo, ys + 2 * e, xs + e)
                        a(hi, ys + 2 * e + 1, xs + e)
                    for e in range(8):
                        a("st.shared.b32", Mem(dst, KTR * (k0 + e)), ys + e)
    a.free(src, dst)
    a.free(xs, k=4)
    a.free(ys, k=8)
    # the next block's rows into the raw area, now free
    nk = a.reg()
    a("add.i64", nk, key, Bc)
    a("setp.lt.i64", pn, nk, ntl)
    a("bra", "NO_NEXT", p=pn, neg=True)
    row_loop("KV_ROWS", Bc, kv_rows(nk))
    a.label("NO_NEXT")
    a.free(nk)

    # ---- scores s_u = sum_k QF[k] KT[k][32u + lane]: two accumulators a key (even / odd k)
    s = a.reg(2 * U)
    for i in range(2 * U):
        a("mov.f32", s + i, 0.0)
    qv, kx = a.reg(4), a.reg(4 * U)
    kk, qq, it = a.reg(), a.reg(), a.reg()
    a("add.i64", kk, qa0, KT)
    a("mov.b64", qq, 0)
    a("mov.b64", it, 0)
    a.label("SCORE")
    a("ld.shared.v4.b32", qv, Mem(qq, 0))
    for e in range(4):
        for u in range(U):
            a("ld.shared.b32", kx + 4 * u + e, Mem(kk, KTR * e + 128 * u))
    for e in range(4):
        for u in range(U):
            acc = s + (e % 2) * U + u
            a("fma.f32", acc, qv + e, kx + 4 * u + e, acc)
    a("add.i64", kk, kk, 4 * KTR)
    a("add.i64", qq, qq, 16)
    a("add.i64", it, it, 1)
    a("setp.lt.i64", pm, it, d // 4)
    a("bra", "SCORE", p=pm)
    a.free(qv, k=4)
    a.free(kx, k=4 * U)
    a.free(kk, qq, it)
    for u in range(U):
        a("add.f32", s + u, s + u, s + U + u)
    # mask keys past kv_len (the last block only)
    a("add.i64", t1, key, Bc)
    a("setp.le.i64", pk, t1, klim)
    a("bra", "UNMASKED", p=pk)
    a("sub.i64", t1, klim, key)
    a("sub.i64", t1, t1, lane)                        # key + 32u + lane visible iff 32u <= t1
    for u in range(U):
        a("setp.lt.i64", pk, t1, 32 * u)
        a("mov.f32", s + u, float("-inf"), p=pk)
    a.label("UNMASKED")
    # ---- online softmax per lane
    mx, al = a.reg(), a.reg()
    a("mov.f32", mx, m)
    for u in range(U):
        a("max.f32", mx, mx, s + u)
    a("sub.f32", al, m, mx)
    a("ex2.f32", al, al)
    a("mov.f32", m, mx)
    for u in range(U):
        a("sub.f32", s + u, s + u, mx)
        a("ex2.f32", s + u, s + u)
    a("mov.f32", mx, 0.0)
    for u in range(U):
        a("add.f32", mx, mx, s + u)
    a("fma.f32", l, l, al, mx)
    a.free(mx)
    # ---- O^T[c][lane] += p_u VT[c][32u + lane]
    o, vx = a.reg(C), a.reg(C)
    oa, vp, cc = a.reg(), a.reg(), a.reg()
    a("add.i64", oa, qa0, OT)
    a("add.i64", vp, qa0, VT)
    a("mov.b64", cc, 0)
    a.label("PV")
    for e in range(C):
        a("ld.shared.b32", o + e, Mem(oa, 128 * e))
    for e in range(C):
        a("mul.f32", o + e, o + e, al)
    for u in range(U):
        for e in range(C):
            a("ld.shared.b32", vx + e, Mem(vp, KTR * e + 128 * u))
        for e in range(C):
            a("fma.f32", o + e, s + u, vx + e, o + e)
    for e in range(C):
        a("st.shared.b32", Mem(oa, 128 * e), o + e)
    a("add.i64", oa, oa, 128 * C)
    a("add.i64", vp, vp, KTR * C)
    a("add.i64", cc, cc, 1)
    a("setp.lt.i64", pm, cc, d // C)
    a("bra", "PV", p=pm)
    a.free(oa, vp, cc, al)
    a.free(o, vx, k=C)
    a.free(s, k=2 * U)
    a("add.i64", key, key, Bc)
    a("setp.lt.i64", pm, key, ntl)
    a("bra", "KV_LOOP", p=pm)
    a.free(key, klim, ntl, gk, gv, kldb)

    # ---- merge the 32 lanes: M = max m, sc = 2^(m - M), L = sum l sc, O = sum sc O^T / L
    M, sc, x = a.reg(), a.reg(), a.reg()
    a("mov.f32", M, m)
    for sh in (1, 2, 4, 8, 16):
        a("shfl.bfly.b64", x, M, sh)
        a("max.f32", M, M, x)
    a("sub.f32", sc, m, M)
    a("ex2.f32", sc, sc)
    a("mul.f32", l, l, sc)
    for sh in (1, 2, 4, 8, 16):
        a("shfl.bfly.b64", x, l, sh)
        a("add.f32", l, l, x)
    p0 = a.pred()
    a("setp.eq.i64", p0, lane, 0)
    if c.lse:
        a("lg2.f32", x, l)
        a("add.f32", x, x, M)
        a("mul.f32", x, x, LN2)
        a("mov.b64", t2, RAW + RB)
        a("st.shared.b32", Mem(t2, 0), x, p=p0)
        a("s2r", t1, "%nctaid.y")
        a("mad.i64", t1, bq, t1, hd)                  # (b*heads + head) * q_len(1)
        a("shl.b64", t1, t1, 2)
        a("ldparam", x, "LSE")
        a("add.i64", t1, t1, x)
        a("mov.b64", x, 4)
        a("dma.put", Mem(t1, 0), Mem(t2, 0), x)
    a("rcp.f32", l, l)
    a("mul.f32", sc, sc, l)                           # 2^(m - M) / L
    vals = a.reg(2)
    for c0 in range(0, d, 1 if f32 else 2):
        for e in range(1 if f32 else 2):
            v = vals + e
            a("ld.shared.b32", v, Mem(qa0, OT + 128 * (c0 + e)))
            a("mul.f32", v, v, sc)
            for sh in (1, 2, 4, 8, 16):
                a("shfl.bfly.b64", x, v, sh)
                a("add.f32", v, v, x)
        if f32:
            a("st.shared.b32", Mem(None, RAW + 4 * c0), vals, p=p0)
        else:
            a(_CVT_OUT[c.dtype], x, vals, vals + 1)
            a("st.shared.b32", Mem(None, RAW + 2 * c0), x, p=p0)
    go = a.reg()
    one = a.reg()
    a("mov.b64", one, 1)
    a.free(base_ptr(go, "O", one, "o_ld", "o_off"))
    a("mov.b64", t2, RAW)
    a("dma.put", Mem(go, 0), Mem(t2, 0), rbn)
    a("dma.wait", 0)
    a("exit")
    return a.build()


# ----------------------------------------------------------------------------- configuration
def _choose(caps, dtype: str, d: int, causal: bool, c: float, lse: bool, nch: int = 1) -> tuple[_Cfg, Program]:
    tried = []
    for Bc in BC_CHOICES:
        need = _layout(dtype, d, Bc, nch)["total"]
        if need > caps.scratchpad_bytes:
            tried.append(f"Bc {Bc}: {need} B LDM")
            continue
        for U, C in UC_CHOICES:
            if Bc % U:
                continue
            cfg = _Cfg(dtype, d, causal, Bc, U, C, c, lse, nch)
            try:
                prog = _emit(cfg, caps.max_regs_per_thread)
            except _OutOfRegisters as e:
                tried.append(f"Bc {Bc} U {U} C {C}: {e}")
                continue
            return cfg, prog
    raise InputError(f"attention on {caps.name}", f"head_dim {d} {dtype}: no K/V block fits a CPE ("
                     + "; ".join(dict.fromkeys(tried)) + f"; LDM {caps.scratchpad_bytes} B)",
                     "a smaller head_dim or a larger LDM")


def _choose_decode(caps, dtype: str, d: int, causal: bool, c: float, lse: bool) -> tuple[_Cfg, Program]:
    tried = []
    for Bc in DEC_BC_CHOICES:
        need = _dec_layout(dtype, d, Bc)["total"]
        if need > caps.scratchpad_bytes:
            tried.append(f"Bc {Bc}: {need} B LDM")
            continue
        cfg = _Cfg(dtype, d, causal, Bc, Bc // LANES, 8, c, lse)
        try:
            return cfg, _emit_decode(cfg, caps.max_regs_per_thread)
        except _OutOfRegisters as e:
            tried.append(f"Bc {Bc}: {e}")
    raise InputError(f"attention (decode) on {caps.name}", f"head_dim {d} {dtype}: no K/V block fits a CPE ("
                     + "; ".join(dict.fromkeys(tried)) + f"; LDM {caps.scratchpad_bytes} B)",
                     "a smaller head_dim or a larger LDM")


def check_sunway_units(where: str, caps, dt: str) -> None:
    """The units the Sunway attention kernels (forward and backward) need: fp32 vector, mufu, DMA,
    conversions for a 16-bit dtype, and 32-lane warps; one InputError line otherwise."""
    need = set(NEEDED_UNITS) | ({"conv"} if dt != "fp32" else set())
    missing = sorted(need - set(caps.units))
    if missing or caps.warp_width != LANES:
        raise InputError(f"{where} on {caps.name}", f"dtype {dt} needs {', '.join(sorted(need))} units and "
                         f"{LANES}-lane warps (missing: {', '.join(missing) or 'none'}, warp width "
                         f"{caps.warp_width})", "a Sunway CPE with fp32 vector, mufu and DMA")


def flash_attention_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                           dtype: str = "fp16", causal: bool = False, scale: Optional[float] = None,
                           q_ld: Optional[int] = None, kv_ld: Optional[int] = None,
                           o_ld: Optional[int] = None, with_lse: bool = False) -> AttentionKernel:
    """Emit fused attention O = softmax(scale Q K^T + mask) V for a Sunway-family target (see the
    module docstring); the arguments and the returned kernel are attention_gpu's."""
    where = "attention"
    batch, heads, q_len, kv_len, d, dt, lds, scale = check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld,
        "fp16, bf16, fp32", family="sunway")
    check_sunway_units(where, caps, dt)
    cfg = prog = None
    if q_len == 1:                                    # decode: lane = key (causal or not: it sees every key)
        try:
            cfg, prog = _choose_decode(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse))
        except InputError:                            # its fp32 K^T, V^T do not fit: the row kernel does
            pass
    if prog is None and _ceil(q_len, 2 * BR) * heads * batch >= caps.cores_total:
        try:                                          # every CPE still busy with 64 rows: half the K/V traffic
            cfg, prog = _choose(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse), nch=2)
            if cfg.Bc < 32:                           # not at the price of small K/V blocks
                cfg = prog = None
        except InputError:
            pass
    if prog is None:
        cfg, prog = _choose(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse))
    check(prog, caps)
    launch = Launch((_ceil(q_len, BR * cfg.nch), heads, batch), (LANES, 1, 1))
    kind = "sunway_decode" if prog.name.startswith("flash_attn_sw_decode") else "sunway"
    pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    return AttentionKernel(program=prog, launch=launch, flops=4 * d * batch * heads * pairs,
                           model_flops=4 * d * batch * heads * q_len * kv_len, batch=batch, heads=heads,
                           q_len=q_len, kv_len=kv_len, head_dim=d, dtype=dt, causal=bool(causal), scale=scale,
                           Bc=cfg.Bc, kind=kind, with_lse=bool(with_lse), **lds)
