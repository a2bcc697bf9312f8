"""Fused (flash) attention backward for the Sunway family: dQ, dK, dV of O = softmax(scale Q K^T + mask) V.

    caps = capabilities(load_machine("sw26010pro"))
    g = flash_attention_grad_kernel(caps, batch=2, heads=3, q_len=70, kv_len=70, head_dim=64,
                                    dtype="fp16", causal=True)
    Q, K, V, O, dO, LSE = g.random_inputs(seed=0)
    ...                                            # as attention_grad_gpu: g.args / g.qkv_args, g.parts

The API, the kernel object (attention_grad_gpu's ``AttentionGradKernel`` of three ``GradPart``s,
run in order), the buffers, their layout and the D / NL workspaces are attention_grad_gpu's, so the
block composer only picks the module by machine family. The design is the GPU one (FlashAttention-2's
backward split in two, since the ISA has no atomics), laid out for a CPE: a thread block is one CPE,
one warp of 32 lanes (the 512-bit vector), fp32 math on the vector pipe, every global byte moved by
DMA through the LDM, and accumulators that would not fit 64 registers kept as [d][32] fp32 arrays
in the LDM (a vector load gives one column of all 32 lanes), as the forward keeps O^T.

- ``attn.grad.pre``: grid (q_pad / 32, heads, batch), lane = query row (q_pad = q_len rounded up to
  32). O and dO rows land by one DMA a row in LDM rows padded by 8 bytes (the lanes' gathers spread
  over the banks); each lane sums its own row: D = rowsum(dO o O) in fp32; NL = -LSE log2(e) from
  one get of the block's LSE values. Rows past q_len get D = 0 and NL = -inf (every probability the
  other kernels recompute for such a row is ex2(-inf) = 0: the query tail needs no mask). D and NL
  leave by one 128-byte put each.
- ``attn.grad.dkdv``: grid (ceil(kv_len / 32), heads, batch), lane = key row j0 + lane (rows past
  kv_len compute a copy of the last one and are never stored). K and V rows stay in padded LDM rows
  (each lane reads its own row); dK^T, dV^T [d][32] fp32 accumulate in the LDM. Query blocks of Br
  rows stream through the LDM: one strided DMA (dma.get.s) each for the Q and dO rows (rows past
  q_len are not fetched) and one get each for the block's NL and D, into a raw area converted to
  fp32 working copies Qf, dOf [Br][d] at the top of the block, after which the next block's DMAs
  land in the raw area while this one is computed (double buffering; NL / D in two stages). Per
  group of U queries, with each query's row read by broadcast loads (every lane the same address):
  s_u = K_lane . Q_u, dp_u = V_lane . dO_u (a loop over k in fours), p_u = ex2(c s_u + NL_u),
  ds_u = p_u (dp_u - D_u), then dV^T[k] += p_u dO_u[k], dK^T[k] += ds_u Q_u[k] (a second loop over k).
  Causal: the CPE starts at the first query block that sees its first key; blocks that cross the
  diagonal set the hidden scores to -inf. Epilogue: dK * scale and dV in the storage dtype,
  transposed back into the padded K / V rows, one put a row (rows < kv_len).
- ``attn.grad.dq``: grid (ceil(q_len / 32), heads, batch), lane = query row; block x takes query
  block nqb - 1 - x (heavy causal blocks first, as the forward). Q and dO rows stay in padded LDM
  rows, NL and D of the lane's row in registers, dQ^T [d][32] fp32 in the LDM. K / V blocks of Bc
  rows stream as the forward's (strided gets into a raw area, fp32 working copies, next block's
  DMAs in flight while this one is computed); per group of U keys, read by broadcast loads:
  s_u = Q_lane . K_u, dp_u = dO_lane . V_u, p_u, ds_u as above, dQ^T[k] += ds_u K_u[k]. Causal
  blocks stop at the last block the CPE's last row sees; blocks from the first one its first row
  does not see whole (the diagonal and the kv tail: clamped rows past kv_len) run the mask.
  Epilogue: dQ * scale, in the storage dtype, one put a row.

In both, a group no lane sees (queries past q_len or wholly before the CPE's first visible query;
keys past the last one its last row sees) is skipped by a uniform branch.

Every dtype (fp16, bf16, fp32 storage) computes in fp32; fp16 / bf16 rows are converted once as
they land (the working copies) or as a lane reads its own row (one 8-byte load and 4 cvt per four
elements). Block sizes: Br (dkdv) and Bc (dq) are the largest of 32, 16, 8 (Bc: 64 first) whose
LDM footprint fits caps.scratchpad_bytes, U the largest of 8, 4 that fits the registers; nothing
fitting is one InputError line naming the LDM size (on tiny-sunway's 64 KiB: head_dim 128 in fp32).

``flops`` and ``model_flops`` count as attention_grad_gpu: pre 2d per query row; dkdv 8d + 4 per
unmasked (query, key) pair; dq 6d + 4; model_flops 3 and 1 of the textbook 4 matmuls of 2d over the
full q_len x kv_len.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program
from archsim.workloads.emit.attention_gpu import LOG2E, causal_pairs, check_attention_args
from archsim.workloads.emit.attention_grad_gpu import (DKDV_PARAMS, DQ_PARAMS, PRE_PARAMS, AttentionGradKernel,
                                                       GradPart)
from archsim.workloads.emit.attention_sunway import LANES, check_sunway_units
from archsim.workloads.emit.common import CVT_IN, CVT_OUT, ELEM_BYTES, Asm, OutOfRegisters, ceil_div, log2

__all__ = ["flash_attention_grad_kernel"]

Q_PAD = LANES                   # rows of the D / NL workspaces: q_len rounded up to this
BR_CHOICES = (32, 16, 8)        # dkdv: query rows a streamed block
BC_CHOICES = (64, 32, 16, 8)    # dq: key rows a streamed block
U_CHOICES = (8, 4)              # rows of the streamed operand a group (registers)


@dataclass(frozen=True)
class _Cfg:
    dtype: str
    d: int
    causal: bool
    T: int              # rows of a streamed block (queries in dkdv, keys in dq)
    U: int              # of them a group
    c: float            # scale * log2(e)
    scale: float


# ----------------------------------------------------------------------------- shared emit helpers
class _Cpe:
    """Registers and small routines every kernel of the backward uses: lane, 4*lane, block
    coordinates, a loop predicate; row pointers, workspace pointers, row DMAs, conversions."""

    def __init__(self, a: Asm, dtype: str, d: int):
        self.a, self.dtype, self.d, self.es = a, dtype, d, ELEM_BYTES[dtype]
        self.RB = d * self.es
        self.RBp = self.RB + 8
        self.lane, self.la4 = a.reg(), a.reg()
        a("s2r", self.lane, "%tid.x")
        a("shl.b64", self.la4, self.lane, 2)
        self.pl = a.pred()
        self.t1, self.t2 = a.reg(), a.reg()

    def coords(self, bq, hd):
        self.a("s2r", bq, "%ctaid.z")
        self.a("s2r", hd, "%ctaid.y")

    def base(self, dst, buf: str, rows_param: str, ld_name: str, off_name: str):
        """dst = buf + es*((bq*rows)*ld + hd*d + off): row 0 of this (batch, head); returns a new
        register holding ld*es (the bytes between rows)."""
        a, t1 = self.a, self.t1
        bq, hd, ldb = a.reg(), a.reg(), a.reg()
        self.coords(bq, hd)
        a("ldparam", ldb, ld_name)
        a("ldparam", t1, rows_param)
        a("mul.i64", dst, bq, t1)
        a("mul.i64", dst, dst, ldb)
        a("mad.i64", dst, hd, self.d, dst)
        a("ldparam", t1, off_name)
        a("add.i64", dst, dst, t1)
        a("shl.b64", dst, dst, log2(self.es))
        a("ldparam", t1, buf)
        a("add.i64", dst, dst, t1)
        a("shl.b64", ldb, ldb, log2(self.es))
        a.free(bq, hd)
        return ldb

    def ws(self, dst, name: str, row, q_param: str = "q_pad"):
        """dst = name + 4*((bq*heads + hd)*q_pad + row): a D / NL workspace (or LSE with
        q_param q_len) element."""
        a = self.a
        bq, hd = a.reg(), a.reg()
        self.coords(bq, hd)
        a("s2r", dst, "%nctaid.y")
        a("mad.i64", bq, bq, dst, hd)
        a("ldparam", dst, q_param)
        a("mad.i64", bq, bq, dst, row)
        a("shl.b64", bq, bq, 2)
        a("ldparam", dst, name)
        a("add.i64", dst, dst, bq)
        a.free(bq, hd)

    def loop(self, label: str, count, body, step: int = 1):
        """for r in 0, step, .. < count (a register or an int >= step): body(r)."""
        a = self.a
        r = a.reg()
        a("mov.b64", r, 0)
        a.label(label)
        body(r)
        a("add.i64", r, r, step)
        a("setp.lt.i64", self.pl, r, count)
        a("bra", label, p=self.pl)
        a.free(r)

    def rows(self, label: str, put: bool, g, ldb, first, lim, count, lds: int):
        """One DMA a row between global rows first + r (clamped to lim; lim None: no clamp) at g
        (ld bytes ldb apart) and padded LDM rows lds + r*RBp, r < count."""
        a, t1, t2 = self.a, self.t1, self.t2
        rbn = a.reg()
        a("mov.b64", rbn, self.RB)

        def body(r):
            a("add.i64", t1, first, r)
            if lim is not None:
                a("min.i64", t1, t1, lim)
            a("mad.i64", t1, t1, ldb, g)
            a("mul.i64", t2, r, self.RBp)
            if put:
                a("dma.put", Mem(t1, 0), Mem(t2, lds), rbn)
            else:
                a("dma.get", Mem(t2, lds), Mem(t1, 0), rbn)
        self.loop(label, count, body)
        a.free(rbn)

    def strided_get(self, dst: int, g, ldb, count):
        """count rows of RB bytes, ldb apart from g, packed at LDM dst (one dma.get.s)."""
        a = self.a
        pair, s = a.reg(2), a.reg()
        a("mov.b64", pair, self.RB)
        a("mov.b64", pair + 1, ldb)
        a("mov.b64", s, dst)
        a("dma.get.s", Mem(s, 0), Mem(g, 0), count, pair)
        a.free(pair, k=2)
        a.free(s)

    def convert(self, label: str, src: int, dst: int, nelem: int):
        """Raw rows in the storage dtype at LDM src -> fp32 at dst, nelem (a multiple of 256)
        elements, the lanes interleaved."""
        a = self.a
        s, t = a.reg(), a.reg()
        if self.dtype == "fp32":                      # a copy: 16 bytes a lane, 2 at a time
            xs = a.reg(8)
            a("shl.b64", s, self.la4, 2)
            a("add.i64", t, s, dst)
            a("add.i64", s, s, src)

            def body(_):
                for e in range(2):
                    a("ld.shared.v4.b32", xs + 4 * e, Mem(s, 512 * e))
                for e in range(2):
                    a("st.shared.v4.b32", Mem(t, 512 * e), xs + 4 * e)
                a("add.i64", s, s, 1024)
                a("add.i64", t, t, 1024)
            self.loop(label, nelem // 256, body)
            a.free(xs, k=8)
        else:                                         # 2 elements a lane a load, 4 loads at a time
            lo, hi = CVT_IN[self.dtype]
            xs, ys = a.reg(4), a.reg(8)
            a("add.i64", s, self.la4, src)
            a("shl.b64", t, self.la4, 1)
            a("add.i64", t, t, dst)

            def body(_):
                for e in range(4):
                    a("ld.shared.b32", xs + e, Mem(s, 128 * e))
                for e in range(4):
                    a(lo, ys + 2 * e, xs + e)
                    a(hi, ys + 2 * e + 1, xs + e)
                for e in range(4):
                    a("st.shared.v2.b32", Mem(t, 256 * e), ys + 2 * e)
                a("add.i64", s, s, 512)
                a("add.i64", t, t, 1024)
            self.loop(label, nelem // 256, body)
            a.free(xs, k=4)
            a.free(ys, k=8)
        a.free(s, t)

    def quad(self, dst, rp, off: int):
        """dst .. dst+3 = fp32 elements 4q .. 4q+3 of the lane's own padded row (rp: its start,
        off: 4q*es)."""
        a = self.a
        if self.dtype == "fp32":
            a("ld.shared.v2.b32", dst, Mem(rp, off))
            a("ld.shared.v2.b32", dst + 2, Mem(rp, off + 8))
        else:
            lo, hi = CVT_IN[self.dtype]
            a("ld.shared.v2.b32", dst + 2, Mem(rp, off))
            a(lo, dst, dst + 2)
            a(hi, dst + 1, dst + 2)
            a(lo, dst + 2, dst + 3)                   # dst+2 (the first word) is consumed above
            a(hi, dst + 3, dst + 3)

    def zero_cols(self, label: str, at: int):
        """[d][32] fp32 at LDM at = 0 (this lane's column)."""
        a = self.a
        z, p = a.reg(), a.reg()
        a("mov.f32", z, 0.0)
        a("add.i64", p, self.la4, at)

        def body(_):
            for e in range(8):
                a("st.shared.b32", Mem(p, 128 * e), z)
            a("add.i64", p, p, 1024)
        self.loop(label, self.d // 8, body)
        a.free(z, p)

    def cols_to_row(self, label: str, at: int, row: int, scale: Optional[float]):
        """This lane's column of the [d][32] fp32 array at LDM at (times scale) -> its padded row at
        LDM row (storage dtype)."""
        a = self.a
        src, dst = a.reg(), a.reg()
        x = a.reg(4)
        a("add.i64", src, self.la4, at)
        a("mul.i64", dst, self.lane, self.RBp)
        a("add.i64", dst, dst, row)

        def body(_):
            for e in range(4):
                a("ld.shared.b32", x + e, Mem(src, 128 * e))
            if scale is not None:
                for e in range(4):
                    a("mul.f32", x + e, x + e, scale)
            if self.dtype == "fp32":
                a("st.shared.v2.b32", Mem(dst, 0), x)
                a("st.shared.v2.b32", Mem(dst, 8), x + 2)
            else:
                a(CVT_OUT[self.dtype], x, x, x + 1)
                a(CVT_OUT[self.dtype], x + 1, x + 2, x + 3)
                a("st.shared.v2.b32", Mem(dst, 0), x)
            a("add.i64", src, src, 512)
            a("add.i64", dst, dst, 4 * self.es)
        self.loop(label, self.d // 4, body)
        a.free(src, dst)
        a.free(x, k=4)


def _pipe(a: Asm, steps, load, compute):
    """Software pipeline over steps with two operand buffers: load i+1 before computing i."""
    load(steps[0], 0)
    for i, st in enumerate(steps):
        if i + 1 < len(steps):
            load(steps[i + 1], (i + 1) % 2)
        compute(st, i % 2)


def _dual_dots(a: Asm, k: "_Cpe", U: int, d: int, u0, lane_rows, first: int, pitch: int, rows: int):
    """The two score chains of both gradient kernels, in new registers (s, dp) of U each:
    s_u = X_lane . Y_u and dp_u = Z_lane . W_u for u < U, where the lane's X and Z rows are the
    lane's padded LDM rows at lane_rows = (X offset, Z offset), and Y_u, W_u the fp32 working rows
    u0 + u at first + (u0 + u) * pitch and rows * pitch further (dkdv: K, V against Q, dO; dq: Q,
    dO against K, V). Loads of row u + 1 run ahead of the FMAs of row u; s and dp interleave."""
    s, dp = a.reg(U), a.reg(U)
    for u in range(U):
        a("mov.f32", s + u, 0.0)
        a("mov.f32", dp + u, 0.0)
    xq, zq = a.reg(4), a.reg(4)
    buf = [a.reg(8), a.reg(8)]                        # Y_u then W_u (4 elements each), two stages
    rp, yp = a.reg(), a.reg()
    a("mul.i64", rp, k.lane, k.RBp)                   # the lane's X row (Z row at its own offset)
    a("mul.i64", yp, u0, pitch)
    a("add.i64", yp, yp, first)                       # Y_u0 (W_u0 at + rows * pitch)

    def ld_s(u, b):
        a("ld.shared.v4.b32", buf[b], Mem(yp, u * pitch))
        a("ld.shared.v4.b32", buf[b] + 4, Mem(yp, rows * pitch + u * pitch))

    def fma_s(u, b):                                  # the s and dp chains interleaved (FMA latency)
        for e in range(4):
            a("fma.f32", s + u, xq + e, buf[b] + e, s + u)
            a("fma.f32", dp + u, zq + e, buf[b] + 4 + e, dp + u)

    def score(_):
        k.quad(xq, rp, lane_rows[0])
        k.quad(zq, rp, lane_rows[1])
        _pipe(a, list(range(U)), ld_s, fma_s)
        a("add.i64", rp, rp, 4 * k.es)
        a("add.i64", yp, yp, 16)
    k.loop("SCORE", d // 4, score)
    a.free(xq, zq, k=4)
    a.free(buf[0], buf[1], k=8)
    a.free(rp, yp)
    return s, dp


class _Grad(_Cpe):
    """The steps of a gradient kernel (dkdv, dq): _Cpe's registers and routines, the configuration
    c and the LDM layout L, and the registers the steps share (g, the loop state), each set by
    the step that allocates it."""

    def __init__(self, a: Asm, c: _Cfg, L: dict):
        super().__init__(a, c.dtype, c.d)
        self.c, self.L = c, L


def _mask_group(k: _Grad, s, hidden: str, first) -> None:
    """Emits the causal mask of a group (blocks with pk only): s_u = -inf where (lim - the group's
    first query / key, which first() emits into t1) ``hidden`` u."""
    a, t1 = k.a, k.t1
    a("bra", "UNMASKED", p=k.pk, neg=True)
    pe = a.pred()
    first()
    a("sub.i64", t1, k.lim, t1)
    for u in range(k.c.U):
        a(hidden, pe, t1, u)
        a("mov.f32", s + u, float("-inf"), p=pe)
    a.pfree(pe)
    a.label("UNMASKED")


def _next_group(k: _Grad) -> None:
    """Emits the SKIP label and the step to the block's next group of U rows (u0 += U, T rows)."""
    a = k.a
    a.label("SKIP")
    a("add.i64", k.u0, k.u0, k.c.U)
    a("setp.lt.i64", k.pl, k.u0, k.c.T)
    a("bra", "GROUP", p=k.pl)


def _query_block(k: _Grad, i0) -> None:
    """Emits i0 = the CPE's first query row: block nqb - 1 - x (heavy causal blocks first)."""
    a, t1, t2 = k.a, k.t1, k.t2
    a("s2r", t1, "%nctaid.x")
    a("s2r", t2, "%ctaid.x")
    a("sub.i64", i0, t1, t2)
    a("sub.i64", i0, i0, 1)                           # query block nqb - 1 - x: heavy causal blocks first
    a("shl.b64", i0, i0, log2(LANES))


# ----------------------------------------------------------------------------- attn.grad.pre
def _pre_layout(dtype: str, d: int) -> dict:
    RBp = d * ELEM_BYTES[dtype] + 8
    OR, DOR = 0, LANES * RBp
    LSEB = 2 * LANES * RBp
    return dict(OR=OR, DOR=DOR, LSEB=LSEB, OUT=LSEB + 128, total=LSEB + 128 + 256)


def _emit_pre(dtype: str, d: int, max_regs: int) -> Program:
    L = _pre_layout(dtype, d)
    a = Asm(f"flash_attn_bwd_sw_pre_{dtype}_d{d}", PRE_PARAMS, L["total"], limit=max_regs)
    k = _Cpe(a, dtype, d)
    t1, t2 = k.t1, k.t2
    i0, Lq, qlim, g = a.reg(), a.reg(), a.reg(), a.reg()
    a("s2r", i0, "%ctaid.x")
    a("shl.b64", i0, i0, log2(LANES))
    a("ldparam", Lq, "q_len")
    a("sub.i64", qlim, Lq, 1)
    for buf, off, lds in (("O", "o_off", L["OR"]), ("dO", "do_off", L["DOR"])):
        ldb = k.base(g, buf, "q_len", "o_ld", off)
        k.rows(f"{buf}_ROWS", False, g, ldb, i0, qlim, LANES, lds)
        a.free(ldb)
    # this block's LSE values (rows < q_len; q_pad is a multiple of 32, so i0 < q_len)
    nr = a.reg()
    a("sub.i64", nr, Lq, i0)
    a("min.i64", nr, nr, LANES)
    a("shl.b64", nr, nr, 2)
    k.ws(g, "LSE", i0, "q_len")
    a("mov.b64", t2, L["LSEB"])
    a("dma.get", Mem(t2, 0), Mem(g, 0), nr)
    a.free(nr)
    a("dma.wait", 0)
    # D = rowsum(dO o O) over the lane's rows
    ro, rd, acc = a.reg(), a.reg(), a.reg(2)
    xo, xd = a.reg(4), a.reg(4)
    a("mul.i64", ro, k.lane, k.RBp)
    a("add.i64", rd, ro, L["DOR"])
    a("mov.f32", acc, 0.0)
    a("mov.f32", acc + 1, 0.0)

    def body(_):
        k.quad(xo, ro, 0)
        k.quad(xd, rd, 0)
        for e in range(4):
            a("fma.f32", acc + (e & 1), xo + e, xd + e, acc + (e & 1))
        a("add.i64", ro, ro, 4 * k.es)
        a("add.i64", rd, rd, 4 * k.es)
    k.loop("D_SUM", d // 4, body)
    a.free(xo, xd, k=4)
    a("add.f32", acc, acc, acc + 1)
    nl = acc + 1
    a("ld.shared.b32", nl, Mem(k.la4, L["LSEB"]))
    a("mul.f32", nl, nl, -LOG2E)
    pv = a.pred()
    a("add.i64", t1, i0, k.lane)
    a("setp.lt.i64", pv, t1, Lq)
    a("mov.f32", acc, 0.0, p=pv, neg=True)            # rows past q_len: D = 0, NL = -inf
    a("mov.f32", nl, float("-inf"), p=pv, neg=True)
    a("st.shared.b32", Mem(k.la4, L["OUT"]), acc)
    a("st.shared.b32", Mem(k.la4, L["OUT"] + 128), nl)
    a("mov.b64", t2, 128)
    for w, name in enumerate(("D", "NL")):
        k.ws(g, name, i0)
        a("mov.b64", t1, L["OUT"] + 128 * w)
        a("dma.put", Mem(g, 0), Mem(t1, 0), t2)
    a("dma.wait", 0)
    a("exit")
    return a.build()


# ----------------------------------------------------------------------------- attn.grad.dkdv
def _dkdv_layout(dtype: str, d: int, Br: int) -> dict:
    es = ELEM_BYTES[dtype]
    RB, RBp = d * es, d * es + 8
    KR, VR = 0, LANES * RBp
    DKT = ceil_div(2 * LANES * RBp, 16) * 16
    DVT = DKT + 128 * d
    QF = DVT + 128 * d
    DOF = QF + 4 * Br * d
    NLD = ceil_div(DOF + 4 * Br * d, 512) * 512      # two stages of [NL Br][D Br] (toggled by xor 8 Br)
    RAW = NLD + 2 * 8 * Br                           # Q rows then dO rows (storage dtype)
    return dict(KR=KR, VR=VR, DKT=DKT, DVT=DVT, QF=QF, DOF=DOF, NLD=NLD, RAW=RAW, total=RAW + 2 * Br * RB)


def _emit_dkdv(c: _Cfg, max_regs: int) -> Program:
    """dK, dV of 32 keys a CPE (one a lane) over the query blocks that see them."""
    d, Br, U = c.d, c.T, c.U
    L = _dkdv_layout(c.dtype, d, Br)
    a = Asm(f"flash_attn_bwd_sw_dkdv_{c.dtype}_d{d}_br{Br}_u{U}{'_causal' if c.causal else ''}", DKDV_PARAMS,
            L["total"], limit=max_regs)
    k = _Grad(a, c, L)
    j0 = _dkdv_keys(k)
    _dkdv_query_range(k, j0)
    _dkdv_block_dmas(k, k.it, k.nld)
    k.pn, k.pk = a.pred(), a.pred()
    k.u0 = a.reg()
    _dkdv_block_head(k)
    a.label("GROUP")
    _dkdv_skip(k)
    # ---- s_u = K_lane . Q_u, dp_u = V_lane . dO_u
    s, dp = _dual_dots(a, k, U, d, k.u0, (L["KR"], L["VR"]), L["QF"], 4 * d, Br)
    if c.causal:                                      # query i0 + u0 + u hidden iff i0 + u0 + u < lim
        _mask_group(k, s, "setp.gt.i64", lambda: _dkdv_group_query(k))
    _dkdv_probs(k, s, dp)
    _dkdv_accumulate(k, s, dp)
    _next_group(k)
    a("xor.b64", k.nld, k.nld, 8 * Br)
    a("add.i64", k.it, k.it, 1)
    a("setp.lt.i64", k.pl, k.it, k.nq)
    a("bra", "Q_LOOP", p=k.pl)
    a.free(k.it, k.nq, k.nmask, k.lim, k.nld, k.u0)
    a.pfree(k.pn, k.pk)
    _dkdv_store(k)
    a("dma.wait", 0)
    a("exit")
    return a.build()


def _dkdv_keys(k: _Grad):
    """Emits the CPE's first key j0 (returned), the K, V rows of its keys (clamped to kv_len - 1)
    into padded rows, and dK^T, dV^T = 0; allocates g, the global pointer the steps share."""
    a, L = k.a, k.L
    j0, k.g = a.reg(), a.reg()
    a("s2r", j0, "%ctaid.x")
    a("shl.b64", j0, j0, log2(LANES))
    klim = a.reg()
    a("ldparam", klim, "kv_len")
    a("sub.i64", klim, klim, 1)
    for buf, off, lds in (("K", "k_off", L["KR"]), ("V", "v_off", L["VR"])):
        ldb = k.base(k.g, buf, "kv_len", "kv_ld", off)
        k.rows(f"{buf}_ROWS", False, k.g, ldb, j0, klim, LANES, lds)
        a.free(ldb)
    a.free(klim)
    k.zero_cols("ZERO_DK", L["DKT"])
    k.zero_cols("ZERO_DV", L["DVT"])
    return j0


def _dkdv_query_range(k: _Grad, j0) -> None:
    """Emits the query blocks: it from the first that sees key j0 (causal) to nq; blocks before
    nmask hold a hidden (query, key) pair. Key row j sees query i iff i >= j - diff = lim. nld:
    the NL / D stage. Frees j0."""
    a, c, t1, Br = k.a, k.c, k.t1, k.c.T
    it, nq, nmask, lim, nld = (a.reg() for _ in range(5))
    k.it, k.nq, k.nmask, k.lim, k.nld = it, nq, nmask, lim, nld
    Lq = a.reg()
    a("ldparam", Lq, "q_len")
    a("add.i64", nq, Lq, Br - 1)
    a("shr.u64", nq, nq, log2(Br))
    if c.causal:
        a("ldparam", t1, "kv_len")
        a("sub.i64", t1, t1, Lq)                      # diff
        a("sub.i64", it, j0, t1)
        a("max.i64", it, it, 0)
        a("shr.u64", it, it, log2(Br))
        a("add.i64", nmask, j0, LANES - 1 + Br - 1)
        a("sub.i64", nmask, nmask, t1)
        a("shr.s64", nmask, nmask, log2(Br))
        a("add.i64", lim, j0, k.lane)
        a("sub.i64", lim, lim, t1)
    else:
        a("mov.b64", it, 0)
        a("mov.b64", nmask, 0)
    a.free(Lq, j0)
    a("mov.b64", nld, k.L["NLD"])


def _dkdv_block_dmas(k: _Grad, blk, stage) -> None:
    """Query block blk's Q, dO rows (below q_len) into RAW, its NL, D into the stage at
    register stage."""
    a, Br, g = k.a, k.c.T, k.g
    i0, cnt = a.reg(), a.reg()
    a("shl.b64", i0, blk, log2(Br))
    a("ldparam", cnt, "q_len")
    a("sub.i64", cnt, cnt, i0)
    a("min.i64", cnt, cnt, Br)
    for w, (buf, off) in enumerate((("Q", "q_off"), ("dO", "do_off"))):
        ldb = k.base(g, buf, "q_len", "q_ld" if buf == "Q" else "o_ld", off)
        a("mad.i64", g, i0, ldb, g)
        k.strided_get(k.L["RAW"] + w * Br * k.RB, g, ldb, cnt)
        a.free(ldb)
    a("mov.b64", cnt, 4 * Br)
    for w, name in enumerate(("NL", "D")):
        k.ws(g, name, i0)
        a("add.i64", k.t2, stage, 4 * Br * w)
        a("dma.get", Mem(k.t2, 0), Mem(g, 0), cnt)
    a.free(i0, cnt)


def _dkdv_block_head(k: _Grad) -> None:
    """Emits the head of the query-block loop: wait for block it, its Q, dO rows to fp32, block
    it+1's gets (into RAW and the other NL / D stage), pk = the block needs the mask, u0 = 0."""
    a, c, L, t1, t2, Br = k.a, k.c, k.L, k.t1, k.t2, k.c.T
    a.label("Q_LOOP")
    a("dma.wait", 0)
    k.convert("CONVERT", L["RAW"], L["QF"], 2 * Br * c.d)
    a("add.i64", t1, k.it, 1)
    a("setp.lt.i64", k.pn, t1, k.nq)
    a("bra", "NO_NEXT", p=k.pn, neg=True)
    a("xor.b64", t2, k.nld, 8 * Br)                   # the other NL / D stage
    nxt, stg = a.reg(), a.reg()
    a("mov.b64", nxt, t1)
    a("mov.b64", stg, t2)
    _dkdv_block_dmas(k, nxt, stg)
    a.free(nxt, stg)
    a.label("NO_NEXT")
    if c.causal:
        a("setp.lt.i64", k.pk, k.it, k.nmask)         # this block needs the mask
    a("mov.b64", k.u0, 0)


def _dkdv_group_query(k: _Grad) -> None:
    """Emits t1 = the group's first query (it * Br + u0)."""
    k.a("shl.b64", k.t1, k.it, log2(k.c.T))
    k.a("add.i64", k.t1, k.t1, k.u0)


def _dkdv_skip(k: _Grad) -> None:
    """Emits the skip of a group no lane sees: past q_len (padding rows), or (causal) wholly before
    the first query the CPE's first key sees (j0 - diff)."""
    a, t1, t2 = k.a, k.t1, k.t2
    _dkdv_group_query(k)
    a("ldparam", t2, "q_len")
    a("setp.ge.i64", k.pl, t1, t2)
    a("bra", "SKIP", p=k.pl)
    if k.c.causal:
        a("add.i64", t1, t1, k.c.U - 1)               # its last query
        a("sub.i64", t2, k.lim, k.lane)               # j0 - diff (lim of lane 0)
        a("setp.lt.i64", k.pl, t1, t2)
        a("bra", "SKIP", p=k.pl)


def _dkdv_probs(k: _Grad, s, dp) -> None:
    """Emits p_u = ex2(c s_u + NL_u), ds_u = p_u (dp_u - D_u) in place: NL_u, D_u by broadcast
    loads from the NL / D stage."""
    a, t1, Br = k.a, k.t1, k.c.T
    x = a.reg()
    a("shl.b64", t1, k.u0, 2)
    a("add.i64", t1, t1, k.nld)
    for u in range(k.c.U):
        a("ld.shared.b32", x, Mem(t1, 4 * u))
        a("fma.f32", s + u, s + u, k.c.c, x)
        a("ex2.f32", s + u, s + u)
        a("ld.shared.b32", x, Mem(t1, 4 * Br + 4 * u))
        a("sub.f32", dp + u, dp + u, x)
        a("mul.f32", dp + u, dp + u, s + u)
    a.free(x)


def _dkdv_accumulate(k: _Grad, s, dp) -> None:
    """Emits dV^T[k] += p_u dO_u[k], dK^T[k] += ds_u Q_u[k] over the group; frees s and dp."""
    a, d, L, Br, U = k.a, k.c.d, k.L, k.c.T, k.c.U
    QR4 = 4 * d                                       # bytes of a working Q / dO row (fp32)
    dv, dk = a.reg(4), a.reg(4)
    buf = [a.reg(4), a.reg(4)]
    ap, qp = a.reg(), a.reg()
    a("add.i64", ap, k.la4, L["DKT"])                 # dK^T column of the lane (dV^T at + 128 d)
    a("mul.i64", qp, k.u0, QR4)
    a("add.i64", qp, qp, L["QF"])

    def ld_a(st, b):
        u, w = st
        a("ld.shared.v4.b32", buf[b], Mem(qp, (1 - w) * Br * QR4 + u * QR4))   # w 0: dO_u, 1: Q_u

    def fma_a(st, b):
        u, w = st
        acc, f = (dv, s) if w == 0 else (dk, dp)
        for e in range(4):
            a("fma.f32", acc + e, f + u, buf[b] + e, acc + e)

    def accumulate(_):
        for e in range(4):
            a("ld.shared.b32", dv + e, Mem(ap, 128 * d + 128 * e))
            a("ld.shared.b32", dk + e, Mem(ap, 128 * e))
        _pipe(a, [(u, w) for u in range(U) for w in range(2)], ld_a, fma_a)
        for e in range(4):
            a("st.shared.b32", Mem(ap, 128 * d + 128 * e), dv + e)
            a("st.shared.b32", Mem(ap, 128 * e), dk + e)
        a("add.i64", ap, ap, 512)
        a("add.i64", qp, qp, 16)
    k.loop("ACCUMULATE", d // 4, accumulate)
    a.free(dv, dk, buf[0], buf[1], k=4)
    a.free(ap, qp)
    a.free(s, dp, k=U)


def _dkdv_store(k: _Grad) -> None:
    """Emits the epilogue: dK * scale, dV -> the padded K / V rows -> one put a row (rows < kv_len)."""
    a, L = k.a, k.L
    k.cols_to_row("DK_ROW", L["DKT"], L["KR"], k.c.scale)
    k.cols_to_row("DV_ROW", L["DVT"], L["VR"], None)
    j0, nr = a.reg(), a.reg()
    a("s2r", j0, "%ctaid.x")
    a("shl.b64", j0, j0, log2(LANES))
    a("ldparam", nr, "kv_len")
    a("sub.i64", nr, nr, j0)
    a("min.i64", nr, nr, LANES)
    for buf_, off, lds in (("dK", "dk_off", L["KR"]), ("dV", "dv_off", L["VR"])):
        ldb = k.base(k.g, buf_, "kv_len", "kv_ld", off)
        k.rows(f"{buf_}_PUT", True, k.g, ldb, j0, None, nr, lds)
        a.free(ldb)


# ----------------------------------------------------------------------------- attn.grad.dq
def _dq_layout(dtype: str, d: int, Bc: int) -> dict:
    es = ELEM_BYTES[dtype]
    RB, RBp = d * es, d * es + 8
    QR, DOR = 0, LANES * RBp
    NLD = 2 * LANES * RBp                             # NL [32] then D [32] of the CPE's rows
    DQT = ceil_div(NLD + 256, 16) * 16
    KF = DQT + 128 * d
    VF = KF + 4 * Bc * d
    RAW = VF + 4 * Bc * d                             # K rows then V rows (storage dtype)
    return dict(QR=QR, DOR=DOR, NLD=NLD, DQT=DQT, KF=KF, VF=VF, RAW=RAW, total=RAW + 2 * Bc * RB)


def _emit_dq(c: _Cfg, max_regs: int) -> Program:
    """dQ of 32 query rows a CPE (one a lane) over the key blocks they see."""
    d, Bc, U = c.d, c.T, c.U
    L = _dq_layout(c.dtype, d, Bc)
    a = Asm(f"flash_attn_bwd_sw_dq_{c.dtype}_d{d}_bc{Bc}_u{U}{'_causal' if c.causal else ''}", DQ_PARAMS,
            L["total"], limit=max_regs)
    k = _Grad(a, c, L)
    t1 = k.t1
    _dq_key_range(k, *_dq_rows(k))
    k.key = a.reg()
    a("mov.b64", k.key, 0)
    _dq_block_dmas(k, k.key)
    a("dma.wait", 0)
    k.nl, k.dd = a.reg(), a.reg()
    a("ld.shared.b32", k.nl, Mem(k.la4, L["NLD"]))
    a("ld.shared.b32", k.dd, Mem(k.la4, L["NLD"] + 128))
    k.pn, k.pk = a.pred(), a.pred()
    k.u0 = a.reg()
    _dq_block_head(k)
    a.label("GROUP")
    _dq_group_key(k)                                  # skip a group no lane sees (keys past glim)
    a("setp.gt.i64", k.pl, t1, k.glim)
    a("bra", "SKIP", p=k.pl)
    # ---- s_u = Q_lane . K_u, dp_u = dO_lane . V_u; key + u0 + u hidden iff key + u0 + u > lim
    s, dp = _dual_dots(a, k, U, d, k.u0, (L["QR"], L["DOR"]), L["KF"], 4 * d, Bc)
    _mask_group(k, s, "setp.lt.i64", lambda: _dq_group_key(k))
    for u in range(U):                                # p_u = ex2(c s_u + NL), ds_u = p_u (dp_u - D)
        a("fma.f32", s + u, s + u, c.c, k.nl)
        a("ex2.f32", s + u, s + u)
        a("sub.f32", dp + u, dp + u, k.dd)
        a("mul.f32", dp + u, dp + u, s + u)
    a.free(s, k=U)
    _dq_accumulate(k, dp)
    _next_group(k)
    a("add.i64", k.key, k.key, Bc)
    a("setp.lt.i64", k.pl, k.key, k.ntl)
    a("bra", "KV_LOOP", p=k.pl)
    a.free(k.key, k.ntl, k.nfull, k.lim, k.glim, k.nl, k.dd, k.u0)
    a.pfree(k.pn, k.pk)
    _dq_store(k)
    a("dma.wait", 0)
    a("exit")
    return a.build()


def _dq_group_key(k: _Grad) -> None:
    """Emits t1 = the group's first key (key + u0)."""
    k.a("add.i64", k.t1, k.key, k.u0)


def _dq_rows(k: _Grad) -> tuple:
    """Emits the CPE's first row i0, the Q, dO rows of its rows (clamped to q_len - 1) into padded
    rows, their NL, D, and dQ^T = 0; allocates g; returns (i0, qlim = q_len - 1)."""
    a, L, t1, t2 = k.a, k.L, k.t1, k.t2
    i0, k.g, qlim = a.reg(), a.reg(), a.reg()
    _query_block(k, i0)
    a("ldparam", qlim, "q_len")
    a("sub.i64", qlim, qlim, 1)
    for buf, ld, off, lds in (("Q", "q_ld", "q_off", L["QR"]), ("dO", "o_ld", "do_off", L["DOR"])):
        ldb = k.base(k.g, buf, "q_len", ld, off)
        k.rows(f"{buf}_ROWS", False, k.g, ldb, i0, qlim, LANES, lds)
        a.free(ldb)
    a("mov.b64", t2, 128)
    for w, name in enumerate(("NL", "D")):            # q_pad is a multiple of 32: always in the workspace
        k.ws(k.g, name, i0)
        a("mov.b64", t1, L["NLD"] + 128 * w)
        a("dma.get", Mem(t1, 0), Mem(k.g, 0), t2)
    k.zero_cols("ZERO_DQ", L["DQT"])
    return i0, qlim


def _dq_key_range(k: _Grad, i0, qlim) -> None:
    """Emits the key blocks: causal CPEs stop at the last block their last row sees (ntl, in keys);
    blocks from nfull on need the mask; key j is visible to this lane's row iff j <= lim; glim:
    the last key the CPE's last row sees. Frees i0 and qlim."""
    a, c, t1, t2, Bc = k.a, k.c, k.t1, k.t2, k.c.T
    lb = log2(Bc)
    k.ntl, k.nfull, k.lim, Lk, k.glim = ntl, nfull, lim, Lk, glim = a.reg(), a.reg(), a.reg(), a.reg(), a.reg()
    a("ldparam", Lk, "kv_len")
    a("add.i64", lim, i0, k.lane)
    a("min.i64", lim, lim, qlim)                      # this lane's row, clamped
    if c.causal:
        a("ldparam", t2, "q_len")
        a("sub.i64", t2, Lk, t2)                      # diff
        a("add.i64", t1, i0, LANES - 1)
        a("min.i64", t1, t1, qlim)
        a("add.i64", glim, t1, t2)                    # the last key the CPE's last row sees
        a("add.i64", ntl, glim, Bc)
        a("shr.u64", ntl, ntl, lb)
        a("add.i64", nfull, i0, t2)
        a("add.i64", nfull, nfull, 1)
        a("shr.u64", nfull, nfull, lb)
        a("add.i64", lim, lim, t2)
    else:
        a("add.i64", ntl, Lk, Bc - 1)
        a("shr.u64", ntl, ntl, lb)
        a("shr.u64", nfull, Lk, lb)
        a("sub.i64", lim, Lk, 1)
        a("mov.b64", glim, lim)
    a("shl.b64", ntl, ntl, lb)                        # both in keys from here on
    a("shl.b64", nfull, nfull, lb)
    a.free(i0, qlim, Lk)


def _dq_block_dmas(k: _Grad, key) -> None:
    """K / V rows key .. (below kv_len) into RAW."""
    a, Bc, g = k.a, k.c.T, k.g
    cnt = a.reg()
    a("ldparam", cnt, "kv_len")
    a("sub.i64", cnt, cnt, key)
    a("min.i64", cnt, cnt, Bc)
    for w, (buf, off) in enumerate((("K", "k_off"), ("V", "v_off"))):
        ldb = k.base(g, buf, "kv_len", "kv_ld", off)
        a("mad.i64", g, key, ldb, g)
        k.strided_get(k.L["RAW"] + w * Bc * k.RB, g, ldb, cnt)
        a.free(ldb)
    a.free(cnt)


def _dq_block_head(k: _Grad) -> None:
    """Emits the head of the key-block loop: wait for the block at key, its K, V rows to fp32, the
    next block's gets into RAW, pk = the block needs the mask, u0 = 0."""
    a, L, t1, Bc = k.a, k.L, k.t1, k.c.T
    a.label("KV_LOOP")
    a("dma.wait", 0)
    k.convert("CONVERT", L["RAW"], L["KF"], 2 * Bc * k.c.d)
    a("add.i64", t1, k.key, Bc)
    a("setp.lt.i64", k.pn, t1, k.ntl)
    a("bra", "NO_NEXT", p=k.pn, neg=True)
    nxt = a.reg()
    a("mov.b64", nxt, t1)
    _dq_block_dmas(k, nxt)
    a.free(nxt)
    a.label("NO_NEXT")
    a("setp.ge.i64", k.pk, k.key, k.nfull)            # this block needs the mask
    a("mov.b64", k.u0, 0)


def _dq_accumulate(k: _Grad, dp) -> None:
    """Emits dQ^T[k] += ds_u K_u[k] over the group; frees dp."""
    a, d, L, U = k.a, k.c.d, k.L, k.c.U
    KR4 = 4 * d                                       # bytes of a working K row (fp32)
    dq = a.reg(4)
    buf = [a.reg(4), a.reg(4)]
    ap, kp = a.reg(), a.reg()
    a("add.i64", ap, k.la4, L["DQT"])
    a("mul.i64", kp, k.u0, KR4)
    a("add.i64", kp, kp, L["KF"])
    ksteps = list(range(U))

    def ld_a(u, b):
        a("ld.shared.v4.b32", buf[b], Mem(kp, u * KR4))

    def fma_a(u, b):
        for e in range(4):
            a("fma.f32", dq + e, dp + u, buf[b] + e, dq + e)

    def accumulate(_):
        for e in range(4):
            a("ld.shared.b32", dq + e, Mem(ap, 128 * e))
        _pipe(a, ksteps, ld_a, fma_a)
        for e in range(4):
            a("st.shared.b32", Mem(ap, 128 * e), dq + e)
        a("add.i64", ap, ap, 512)
        a("add.i64", kp, kp, 16)
    k.loop("ACCUMULATE", d // 4, accumulate)
    a.free(dq, buf[0], buf[1], k=4)
    a.free(ap, kp)
    a.free(dp, k=U)


def _dq_store(k: _Grad) -> None:
    """Emits the epilogue: dQ * scale -> the padded Q rows -> one put a row (rows < q_len)."""
    a, L = k.a, k.L
    k.cols_to_row("DQ_ROW", L["DQT"], L["QR"], k.c.scale)
    i0, nr = a.reg(), a.reg()
    _query_block(k, i0)
    a("ldparam", nr, "q_len")
    a("sub.i64", nr, nr, i0)
    a("min.i64", nr, nr, LANES)
    ldb = k.base(k.g, "dQ", "q_len", "q_ld", "dq_off")
    k.rows("DQ_PUT", True, k.g, ldb, i0, None, nr, L["QR"])


# ----------------------------------------------------------------------------- configuration
def _choose(caps, emit, layout, choices, what: str, dtype: str, d: int, causal: bool, c: float, scale: float):
    tried = []
    for T in choices:
        need = layout(dtype, d, T)["total"]
        if need > caps.scratchpad_bytes:
            tried.append(f"{T} rows a block: {need} B")
            continue
        for U in U_CHOICES:
            if T % U:
                continue
            cfg = _Cfg(dtype, d, causal, T, U, c, scale)
            try:
                return cfg, emit(cfg, caps.max_regs_per_thread)
            except OutOfRegisters as e:
                tried.append(f"{T} rows, groups of {U}: {e}")
    raise InputError(f"attention backward on {caps.name}", f"head_dim {d} {dtype} ({what}): no block fits the "
                     f"{caps.scratchpad_bytes} B LDM of a CPE (" + "; ".join(dict.fromkeys(tried)) + ")",
                     "a smaller head_dim, a 16-bit dtype or a larger LDM")


def flash_attention_grad_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                                dtype: str = "fp16", causal: bool = False, scale: Optional[float] = None,
                                q_ld: Optional[int] = None, kv_ld: Optional[int] = None,
                                o_ld: Optional[int] = None, name: str = "attn.grad") -> AttentionGradKernel:
    """Emit the fused attention backward (see the module docstring) for a Sunway-family target; the
    arguments and the returned kernel are attention_grad_gpu's. Parts are named ``<name>.pre``,
    ``<name>.dkdv``, ``<name>.dq`` and run in that order."""
    where = "attention backward"
    batch, heads, q_len, kv_len, d, dt, lds, scale = check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld,
        "fp16, bf16, fp32", family="sunway")
    check_sunway_units(where, caps, dt)
    c = scale * LOG2E
    q_pad = ceil_div(q_len, Q_PAD) * Q_PAD
    if _pre_layout(dt, d)["total"] > caps.scratchpad_bytes:
        raise InputError(f"{where} on {caps.name}", f"head_dim {d} {dt} (pre kernel): "
                         f"{_pre_layout(dt, d)['total']} B do not fit the {caps.scratchpad_bytes} B LDM of a CPE",
                         "a smaller head_dim or a larger LDM")
    pre = _emit_pre(dt, d, caps.max_regs_per_thread)
    ckv, pkv = _choose(caps, _emit_dkdv, _dkdv_layout, BR_CHOICES, "dK, dV kernel", dt, d, bool(causal), c, scale)
    cq, pq = _choose(caps, _emit_dq, _dq_layout, BC_CHOICES, "dQ kernel", dt, d, bool(causal), c, scale)
    for p in (pre, pkv, pq):
        check(p, caps)
    pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    cells, full = batch * heads * pairs, batch * heads * q_len * kv_len
    blk = (LANES, 1, 1)
    parts = (
        GradPart(f"{name}.pre", pre, Launch((q_pad // LANES, heads, batch), blk, spread=True), 2 * d * batch * heads * q_len, 0,
                 ("D", "NL")),
        GradPart(f"{name}.dkdv", pkv, Launch((ceil_div(kv_len, LANES), heads, batch), blk, spread=True),
                 cells * (4 * 2 * d + 4), 3 * 2 * d * full, ("dK", "dV")),
        GradPart(f"{name}.dq", pq, Launch((ceil_div(q_len, LANES), heads, batch), blk, spread=True),
                 cells * (3 * 2 * d + 4), 2 * d * full, ("dQ",)),
    )
    return AttentionGradKernel(parts=parts, batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=d,
                               dtype=dt, causal=bool(causal), scale=scale, q_pad=q_pad,
                               tiles={"dkdv": (ckv.T, ckv.U), "dq": (cq.T, cq.U)}, **lds)
