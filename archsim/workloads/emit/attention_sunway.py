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
  outnumbers the CPEs. Rows past q_len compute on whatever their staging rows held (finite
  values; their mask is the last row's) and are never stored.
- Q: one strided get (dma.get.s, athread's dma_iget_stride: rows q_ld apart in memory, at most
  Br, those below q_len) lands the rows packed, 2 d bytes apart, in a staging area; a skewed
  transpose (below) converts them to fp32, pre-scales by c = scale * log2(e) and stores QT [d][32]
  (lane i's row in column i: one vector load gives every row's element k). The O accumulator
  OT [d][32] fp32 lives in the LDM too (d fp32 registers a lane would not fit).
- K and V blocks of Bc key rows are fetched by one strided get each (rows past kv_len are not
  fetched: the tail block's last rows keep older, finite values, and the mask drops them). fp16 /
  bf16: the rows land packed in a raw area; at the start of block j the CPE converts it to fp32
  working copies Kf, Vf [Bc][d] (one vector load, two cvt and one 8-byte store per 64 elements,
  ~2% of the block's vector work), after which the raw area is free and the two gets of block j+1
  go there while block j is computed (double buffering through raw + working copy). fp32: the
  rows land straight in one of two stages that alternate.
- Keys are taken U = 16 at a time (a group). Scores s_u = sum_k QT[k][lane] Kf[u][k]: per k a
  vector load of QT and, per key, a broadcast load of Kf (ld.shared.v4: four k at once, every lane
  the same address) and one fma.f32: no shuffles, every row's statistics stay in its own lane.
- Online softmax in fp32 in the log2 domain, lane-local: m_new = max(m, s_0..s_15), alpha =
  ex2(m - m_new), p_u = ex2(s_u - m_new), l = alpha l + sum p_u. Masking only in blocks that need
  it (the diagonal and the kv tail: a uniform branch); causal blocks stop at the last block their
  last row sees.
- O += P V: OT is walked in chunks of C columns: C vector loads, O *= alpha, per key a broadcast
  load of four Vf elements and four fma.f32 with p_u, C vector stores.
- Epilogue: O / l, converted to the storage dtype, transposed back (skewed) into packed rows in
  the LDM and written by one strided put (dma.put.s, rows < q_len only); LSE (with_lse) as 32 fp32
  values by one put.

Why fp32 math with fp16 storage: the vector pipe's f16x2 FMA is 4x faster, but scores summed over
64-128 products and probabilities in fp16 would miss the tolerance the GPU kernels meet (a few
units of fp16 rounding on O); fp32 keeps the kernel's error at the output's own rounding.

Block sizes: Br = 32 rows (the vector width), or 64 (two chunks of 32 rows that take every K/V
group in turn, their m and l kept in the LDM) when the grid at 64 rows a CPE still covers every
CPE (ceil(q_len / 64) * heads * batch >= cores) and a Bc >= 32 fits: the K/V traffic per flop
halves (DRAM, not the vector pipe, limits 32-row blocks on a full chip). Bc is the largest of 64,
32, 16, 8 whose LDM footprint fits caps.scratchpad_bytes: QT + OT (2 x 128 d bytes a chunk) + the
raw area (2 Bc d es, and at least the packed Q / O rows) + the fp32 working copies (8 Bc d; fp32
has two raw stages instead).
(U, C) is the first of (16, 16), (16, 8), (8, 8) whose registers fit max_regs_per_thread.

Decode (q_len = 1): a second program (kind "sunway_decode"), lane = key. One CPE per (batch, head);
lane i takes keys j*Bc + 32u + i (u < Bc/32) of every K/V block, keeps its own running max, sum
and O columns (OT[.][i]), and the 32 partial softmaxes are merged at the end by shfl.bfly (max,
then the rescaled sums and O columns). A K and a V block are one strided get each, packed, and
are transposed (skewed, below) to fp32 K^T, V^T [d][Bc] so that one vector load gives 32 keys'
element k; Q is broadcast from the LDM. Bc is the largest of 128, 64, 32 that fits; where none
does (d 128 on a 64 KiB LDM) the row kernel runs instead.

Split-KV decode (``split_kv_attention_kernel``, the GPU family's Flash-Decoding interface and
kernel object): batch*heads CPEs alone leave most of the chip idle and stream the whole cache
through a few DMA engines and ring stops, so when batch*heads < cores the cache is cut into
``splits`` chunks of ``chunk`` blocks (``sunway_kv_splits``: the largest chunk that still gives
every CPE a block) and two kernels run: ``attn.split``, the decode program above over chunk x of
the cache (grid (splits, heads, batch)), writing its f32 O normalised by its own sum and the sum's
log-sum-exp to Opart [batch, heads, splits, 1, d] / LSEpart [batch, heads, splits, 1]; and
``attn.combine`` (``_emit_combine``, a CPE per (batch, head)): one get of the row's LSEs, one of
its partials, O = sum_s w_s O_s / sum_s w_s with w_s = e^(LSE_s - max LSE) (lane L holding
columns E L .. E L + E - 1), one put of O (and LSE with with_lse). The partials stay f32, so the
combine rounds once, as the whole-row kernel does. At most SPLITS_MAX partials a row (its LDM).

DMA and LDM layout. The rows of one head are kv_ld (q_ld, o_ld) elements apart in memory, so a
plain dma.get moves one row: 2 Bc descriptors a K/V block, and an engine's FIFO holds 8 until
they complete (~500 cycles on sw26010pro), ~2 B/cycle an engine. A strided get moves a whole
block in one descriptor (count rows of 2 d bytes, kv_ld apart), but it packs the rows: 2 d is a
multiple of the 64 bytes the 8 LDM banks x 8 B span, so word w of every row sits in bank w % 8
and 32 lanes reading one word each of their own rows would hit one bank (32 wavefronts a load; a
strided get cannot pad the rows). The transposes therefore skew the order (_skew_xpose,
_skew_untranspose): lane i walks its row's words w = 8 s + (t ^ x),
x = (i >> 1) & 7, for t = 0..7, so a v2 (8-byte) load of 8 lanes touches 4 banks twice (8
wavefronts for 256 B), while lanes 2j, 2j+1 (same x) store into one 8-B word of a K^T / QT row and
lanes j, j+16 into two rows of one bank (2 wavefronts a 32-lane store, the minimum for 128 B):
as few wavefronts per element as rows padded by 8 bytes, with no padding and no extra bytes.

Where decode time goes: one CPE's blocks are compute-bound (the transposes and the fp32 score / PV
fmas, 8 lanes a cycle, outweigh the block's DMA); a whole decode is bound by streaming the cache,
which split-KV spreads over more core groups' DMA engines and ring stops.

``flops`` and ``model_flops`` count as attention_gpu does (4 d per visible / per (query, key) pair).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.check import check
from archsim.isa.program import Launch, Program
from archsim.workloads.emit.attention_gpu import (COMBINE_PARAMS, LN2, LOG2E, LSE_PARAMS, PARAMS, SPLIT_PARAMS,
                                                  AttentionKernel, AttentionPart, SplitAttentionKernel, causal_pairs,
                                                  check_attention_args, combine_flops, forced_chunk)
from archsim.workloads.emit.common import CVT_IN, CVT_OUT, ELEM_BYTES, Asm, OutOfRegisters, ceil_div, log2

__all__ = ["flash_attention_kernel", "split_kv_attention_kernel", "sunway_kv_splits"]

BR = 32                        # query rows per CPE: one per lane
LANES = 32
BC_CHOICES = (64, 32, 16, 8)   # key rows per K/V block, largest first
UC_CHOICES = ((16, 16), (16, 8), (8, 8))   # (keys per group, O columns per chunk)
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
    split: bool = False  # decode over one chunk of the cache (grid.x = split) into f32 workspaces


def _layout(dtype: str, d: int, Bc: int, nch: int = 1) -> dict:
    """LDM byte offsets: QT, OT ([d][32 nch] fp32 each), ML (m, l of every row: [2][32 nch]), RAW
    (DMA landing area / staging), WK (fp32 working K, V follows)."""
    es = ELEM_BYTES[dtype]
    RB = d * es
    stage = 2 * Bc * RB                               # K rows then V rows
    raw = max(stage * (2 if dtype == "fp32" else 1), LANES * nch * RB + 4 * LANES * nch)   # or Q / O rows, LSE
    raw = ceil_div(raw, 16) * 16
    QP = 128 * nch                                    # bytes of a QT / OT row (one k, every row)
    QT, OT, ML = 0, QP * d, 2 * QP * d
    RAW = ML + (2 * QP if nch > 1 else 0)
    WK = RAW + raw
    total = WK + (8 * Bc * d if dtype != "fp32" else 0)
    return dict(es=es, RB=RB, STG=stage, QP=QP, QT=QT, OT=OT, ML=ML, RAW=RAW,
                WK=WK if dtype != "fp32" else RAW, total=total)


def _skew_loop_open(a, lane, RB: int, pitch: int, epw: int, qa0, label: str):
    """The head of the skewed-transpose loop over t = 0..7 (see _skew_xpose): registers (x, t, p,
    row, col) with x = (lane >> 1) & 7, p = t ^ x, row = the lane's row word p (lane RB + 8 p),
    col = element epw p of the lane's column (qa0 + p pitch epw); the label opens the loop body."""
    x, t, p, row, col = (a.reg() for _ in range(5))
    a("shr.u64", x, lane, 1)
    a("and.b64", x, x, 7)
    a("mov.b64", t, 0)
    a.label(label)
    a("xor.b64", p, t, x)
    a("mul.i64", row, lane, RB)
    a("mad.i64", row, p, 8, row)                      # this lane's row, word p
    a("mad.i64", col, p, pitch * epw, qa0)            # element epw p of this lane's column
    return x, t, p, row, col


def _skew_loop_close(a, regs, label: str) -> None:
    """t += 1, back to the label while t < 8; frees _skew_loop_open's registers."""
    t = regs[1]
    pl = a.pred()
    a("add.i64", t, t, 1)
    a("setp.lt.i64", pl, t, 8)
    a("bra", label, p=pl)
    a.free(*regs)
    a.pfree(pl)


def _skew_xpose(a, dtype: str, RB: int, pitch: int, jobs, lane, qa0, label: str, scale: Optional[float] = None) -> None:
    """Transpose rows packed RB bytes apart in the LDM (a strided get lands them so) into fp32
    columns: for each job (src, dst) of immediates, lane i moves row i (at src + i RB) to column i
    (element k at dst + pitch k + 4 i), converting a 16-bit dtype and multiplying by ``scale``.

    Bank spread: RB is a multiple of 64 B (the 8 banks x 8 B), so every row's word w sits in bank
    w % 8; 32 lanes reading word w of their own rows would hit one bank. Lane i reads its row's
    words in the order w = 8 s + (t ^ x_i), x_i = (i >> 1) & 7, t = 0..7 (a loop), s = 0..RB/64-1
    (unrolled): a v2 load of 8 lanes touches 4 banks, two lanes each (8 wavefronts for the warp's
    256 B), and lanes 2j, 2j+1 (same x) write one 8-B word of a destination row while lanes j and
    j+16 write two rows in one bank (2 wavefronts a store, the 128 B minimum): the same wavefronts
    per element as 8-B padded rows (4-B loads, 4 wavefronts each)."""
    es = ELEM_BYTES[dtype]
    epw = 8 // es                                     # elements an 8-B word holds
    nw = RB // 8
    assert RB % 64 == 0 and pitch % 64 == 0, (RB, pitch)
    lo_hi = CVT_IN.get(dtype)
    G = 2 if lo_hi else 4                             # words a group loads before it converts / stores
    items = [(so, do, s) for so, do in jobs for s in range(nw // 8)]
    regs = _skew_loop_open(a, lane, RB, pitch, epw, qa0, label)
    src, dst = regs[3], regs[4]
    xs = a.reg(2 * G)
    ys = a.reg(8) if lo_hi else None
    for g0 in range(0, len(items), G):
        grp = items[g0:g0 + G]
        for i, (so, do, s) in enumerate(grp):
            a("ld.shared.v2.b32", xs + 2 * i, Mem(src, so + 64 * s))
        outs = []                                     # (register, dst immediate) per element
        for i, (so, do, s) in enumerate(grp):
            base = do + pitch * epw * 8 * s
            if lo_hi:
                for h in range(2):
                    r = ys + 4 * i + 2 * h
                    a(lo_hi[0], r, xs + 2 * i + h)
                    a(lo_hi[1], r + 1, xs + 2 * i + h)
                    outs += [(r, base + pitch * 2 * h), (r + 1, base + pitch * (2 * h + 1))]
            else:
                outs += [(xs + 2 * i, base), (xs + 2 * i + 1, base + pitch)]
        for r, off in outs:
            if scale is not None:
                a("mul.f32", r, r, scale)
        for r, off in outs:
            a("st.shared.b32", Mem(dst, off), r)
    a.free(xs, k=2 * G)
    if ys is not None:
        a.free(ys, k=8)
    _skew_loop_close(a, regs, label)


def _skew_untranspose(a, dtype: str, RB: int, pitch: int, src: int, dst: int, lane, qa0, label: str, scale) -> None:
    """_skew_xpose's inverse for the epilogue: lane i's fp32 column (element k at src + pitch k +
    4 i), times the register ``scale``, converted to the storage dtype into row i packed at RB
    bytes (dst + i RB), in the same skewed word order (same wavefronts)."""
    es = ELEM_BYTES[dtype]
    epw = 8 // es
    nw = RB // 8
    assert RB % 64 == 0 and pitch % 64 == 0, (RB, pitch)
    f32 = dtype == "fp32"
    G = 2
    regs = _skew_loop_open(a, lane, RB, pitch, epw, qa0, label)
    ra, ca = regs[3], regs[4]
    vs = a.reg(epw * G)                               # fp32 elements of G words
    ws = a.reg(2 * G)                                 # the words, as two 32-bit halves each
    for s0 in range(0, nw // 8, G):
        grp = list(range(s0, min(s0 + G, nw // 8)))
        for i, sw in enumerate(grp):
            for e in range(epw):
                a("ld.shared.b32", vs + epw * i + e, Mem(ca, src + pitch * (epw * 8 * sw + e)))
        for i, sw in enumerate(grp):
            for e in range(epw):
                a("mul.f32", vs + epw * i + e, vs + epw * i + e, scale)
        for i, sw in enumerate(grp):
            if f32:
                a("st.shared.v2.b32", Mem(ra, dst + 64 * sw), vs + 2 * i)
            else:
                for h in range(2):
                    a(CVT_OUT[dtype], ws + 2 * i + h, vs + 4 * i + 2 * h, vs + 4 * i + 2 * h + 1)
                a("st.shared.v2.b32", Mem(ra, dst + 64 * sw), ws + 2 * i)
    a.free(vs, k=epw * G)
    a.free(ws, k=2 * G)
    _skew_loop_close(a, regs, label)

class _Steps:
    """What the steps of one attention program share: the configuration c, the assembler a, and
    the registers that live across steps, each set by the step that allocates it (qa0 = 4 * lane,
    the block's batch bq and head hd, the scratch registers t1, t2, the loop predicate pl, the K /
    V sources and the loop state)."""

    def base_ptr(self, dst, buf, rows, ld_name, off_name):
        """dst = buf + es*((bq*rows)*ld + hd*d + off); returns a register with ld*es (bytes a row)."""
        a, t1 = self.a, self.t1
        ldb = a.reg()
        a("ldparam", ldb, ld_name)
        a("mul.i64", dst, self.bq, rows)
        a("mul.i64", dst, dst, ldb)
        a("mad.i64", dst, self.hd, self.c.d, dst)
        a("ldparam", t1, off_name)
        a("add.i64", dst, dst, t1)
        a("shl.b64", dst, dst, log2(self.es))
        a("ldparam", t1, buf)
        a("add.i64", dst, dst, t1)
        a("shl.b64", ldb, ldb, log2(self.es))
        return ldb


class _Fwd(_Steps):
    """The row kernel's steps: its configuration, LDM layout and assembler (registers: _Steps)."""

    def __init__(self, c: _Cfg, max_regs: int):
        self.c = c
        d, Bc = c.d, c.Bc
        self.L = L = _layout(c.dtype, d, Bc, c.nch)
        self.es, self.RB, self.STG, self.OT, self.RAW = L["es"], L["RB"], L["STG"], L["OT"], L["RAW"]
        self.QP, self.ML, self.BRr = L["QP"], L["ML"], BR * c.nch
        self.f32 = c.dtype == "fp32"
        self.KV4 = 4 * d                              # bytes of a working K / V row (fp32)
        self.VOFF = Bc * self.KV4                     # working V block after the working K block
        name = (f"flash_attn_sw_{c.dtype}_d{d}_br{self.BRr}_bc{Bc}_u{c.U}{'_causal' if c.causal else ''}"
                f"{'_lse' if c.lse else ''}")
        self.a = Asm(name, LSE_PARAMS if c.lse else PARAMS, L["total"], limit=max_regs)

    def row_loop(self, label, count, body):
        """for r in 0 .. count-1 (count: register or int >= 1): body(r)."""
        a = self.a
        r = a.reg()
        a("mov.b64", r, 0)
        a.label(label)
        body(r)
        a("add.i64", r, r, 1)
        a("setp.lt.i64", self.pl, r, count)
        a("bra", label, p=self.pl)
        a.free(r)


def _emit(c: _Cfg, max_regs: int) -> Program:
    """The row kernel: 32 query rows a lane each (BR * nch a CPE) against every K / V block."""
    x = _Fwd(c, max_regs)
    a = x.a
    _fwd_coords(x)
    _fwd_load_q(x)
    _fwd_kv_bounds(x)
    _fwd_loop_state(x)
    a.label("KV_LOOP")
    a("dma.wait", 0)                                  # block j landed
    if not x.f32:
        _fwd_convert(x)
    _fwd_next_block(x)
    a.label("GROUP")
    _fwd_group(x)
    _fwd_loop_close(x)
    _fwd_epilogue(x)
    a("dma.wait", 0)
    a("exit")
    return a.build()


def _fwd_coords(x: _Fwd) -> None:
    """Emits the block's coordinates: qa0 (this lane's column of QT / OT), bq, hd, its first row i0
    (heavy causal blocks first), q_len and kv_len, with t1, t2 and pl."""
    a = x.a
    x.qa0, x.bq, x.hd, x.i0, x.Lq, x.Lk, x.t1, x.t2 = (a.reg() for _ in range(8))
    qa0, i0, t1, t2 = x.qa0, x.i0, x.t1, x.t2
    a("s2r", qa0, "%tid.x")
    a("shl.b64", qa0, qa0, 2)                         # 4 * lane: this lane's column of QT / OT
    a("s2r", x.bq, "%ctaid.z")
    a("s2r", x.hd, "%ctaid.y")
    a("s2r", t1, "%nctaid.x")
    a("s2r", t2, "%ctaid.x")
    a("sub.i64", i0, t1, t2)
    a("sub.i64", i0, i0, 1)                           # query block nqb - 1 - x: heavy causal blocks first
    a("shl.b64", i0, i0, log2(x.BRr))
    a("ldparam", x.Lq, "q_len")
    a("ldparam", x.Lk, "kv_len")
    x.pl = a.pred()


def _fwd_load_q(x: _Fwd) -> None:
    """Emits Q's rows by one strided get, their skewed transpose into QT (scaled by c), OT = 0 and,
    with several chunks, every chunk's m = -inf, l = 0; sets qlim = q_len - 1."""
    a, c, RB, RAW, BRr = x.a, x.c, x.RB, x.RAW, x.BRr
    qa0, t1, t2 = x.qa0, x.t1, x.t2
    gq = a.reg()
    qldb = x.base_ptr(gq, "Q", x.Lq, "q_ld", "q_off")
    x.qlim = a.reg()
    a("sub.i64", x.qlim, x.Lq, 1)
    pair = a.reg(2)                                   # rows i0 .. min(i0 + BRr, q_len) - 1, packed at RB
    a("mov.b64", pair, RB)
    a("mov.b64", pair + 1, qldb)
    a("mad.i64", gq, x.i0, qldb, gq)
    a("sub.i64", t1, x.Lq, x.i0)
    a("min.i64", t1, t1, BRr)                         # rows past q_len stay as they were (never stored)
    a("mov.b64", t2, RAW)
    a("dma.get.s", Mem(t2, 0), Mem(gq, 0), t1, pair)
    a.free(gq, qldb)
    a.free(pair, k=2)
    a("dma.wait", 0)
    lane = a.reg()
    a("s2r", lane, "%tid.x")
    _skew_xpose(a, c.dtype, RB, x.QP, [(RAW + 32 * ch * RB, 128 * ch) for ch in range(c.nch)], lane, qa0, "QXPOSE",
                scale=c.c)
    a.free(lane)
    z, y = a.reg(), a.reg()
    a("mov.f32", z, 0.0)
    for k in range(c.d * c.nch):
        a("st.shared.b32", Mem(qa0, x.OT + 128 * k), z)
    if c.nch > 1:                                     # m = -inf, l = 0 of every chunk's rows
        a("mov.f32", y, float("-inf"))
        for ch in range(c.nch):
            a("st.shared.b32", Mem(qa0, x.ML + 128 * ch), y)
            a("st.shared.b32", Mem(qa0, x.ML + x.QP + 128 * ch), z)
    a.free(z, y)


def _fwd_kv_bounds(x: _Fwd) -> None:
    """Emits the K / V sources gk, gv with the strided gets' (row bytes, stride) pair, klim =
    kv_len - 1, the block counts ntl (blocks to run) and nfull (those seen whole), both in keys,
    and lim, the last key this lane's row sees; frees the coordinates."""
    a, c, Bc, t1, t2 = x.a, x.c, x.c.Bc, x.t1, x.t2
    x.gk, x.gv = a.reg(), a.reg()
    kldb = x.base_ptr(x.gk, "K", x.Lk, "kv_ld", "k_off")
    a.free(x.base_ptr(x.gv, "V", x.Lk, "kv_ld", "v_off"))
    x.klim = klim = a.reg()
    a("sub.i64", klim, x.Lk, 1)
    x.ntl, x.nfull, x.lim = ntl, nfull, lim = a.reg(), a.reg(), a.reg()
    i0, Lq, Lk = x.i0, x.Lq, x.Lk
    lb = log2(Bc)
    a("s2r", lim, "%tid.x")
    a("add.i64", lim, lim, i0)
    a("min.i64", lim, lim, x.qlim)                    # this lane's row, clamped
    if c.causal:
        a("sub.i64", t2, Lk, Lq)                      # diff: row i sees keys 0 .. i + diff
        a("add.i64", t1, i0, x.BRr - 1)
        a("min.i64", t1, t1, x.qlim)                  # the block's last real row
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
    a.free(Lk, x.qlim, x.bq, x.hd, i0, Lq)            # the epilogue reads i0 and q_len again
    x.pair = pair = a.reg(2)                          # a strided get's block size (a row) and stride
    a("mov.b64", pair, x.RB)
    a("mov.b64", pair + 1, kldb)
    a.free(kldb)


def _fwd_kv_block(x: _Fwd, first, dst, p=None) -> None:
    """K and V rows first .. first + cnt - 1 (cnt = min(Bc, kv_len - first)) by one strided
    get each, packed at RB bytes (K at dst, V at dst + Bc RB); rows past cnt keep older
    values (finite, and masked)."""
    a, cnt, t1, t2 = x.a, x.cnt, x.t1, x.t2
    a("sub.i64", cnt, x.klim, first)
    a("add.i64", cnt, cnt, 1)
    a("min.i64", cnt, cnt, x.c.Bc)
    if not isinstance(dst, int):
        a("mov.b64", t2, dst)
        dst = 0
    else:
        a("mov.b64", t2, 0)
    a("mad.i64", t1, first, x.pair + 1, x.gk)
    a("dma.get.s", Mem(t2, dst), Mem(t1, 0), cnt, x.pair, p=p)
    a("mad.i64", t1, first, x.pair + 1, x.gv)
    a("dma.get.s", Mem(t2, dst + x.c.Bc * x.RB), Mem(t1, 0), cnt, x.pair, p=p)


def _fwd_loop_state(x: _Fwd) -> None:
    """Emits the loop state (m = -inf, l = 0, key = 0) and block 0's gets into stage 0 (the raw
    area); wk / dd: the working K block and where the next block lands (registers that swap for
    fp32, immediates otherwise)."""
    a = x.a
    x.cnt = a.reg()
    x.pn, x.pk, x.pm = a.pred(), a.pred(), a.pred()
    x.m, x.l, x.key, x.rr = (a.reg() for _ in range(4))
    a("mov.f32", x.m, float("-inf"))
    a("mov.f32", x.l, 0.0)
    a("mov.b64", x.key, 0)                            # first key of the current group (block j: j*Bc)
    _fwd_kv_block(x, x.key, x.RAW)
    if x.f32:                                         # the two stages alternate
        x.wk, x.dd = a.reg(), a.reg()
        a("mov.b64", x.wk, x.L["WK"])                 # working K block (V at + VOFF)
        a("mov.b64", x.dd, x.RAW + x.STG)             # where the next block's rows land
    else:                                             # fixed: working copies at WK, DMAs into RAW
        x.wk, x.dd = x.L["WK"], x.RAW


def _fwd_convert(x: _Fwd) -> None:
    """Emits the conversion of the landed block: raw 16-bit rows -> fp32 working copies (K then
    V, contiguous)."""
    a, c = x.a, x.c
    lo, hi = CVT_IN[c.dtype]
    n_it = 2 * c.Bc * c.d // 64
    UNR = 4
    src, dst = a.reg(), a.reg()
    xs, ys = a.reg(UNR), a.reg(2 * UNR)
    a("add.i64", src, x.qa0, x.RAW)
    a("shl.b64", dst, x.qa0, 1)
    a("add.i64", dst, dst, x.L["WK"])

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

    x.row_loop("CONVERT", n_it // UNR, conv)
    a.free(src, dst)
    a.free(xs, k=UNR)
    a.free(ys, k=2 * UNR)


def _fwd_next_block(x: _Fwd) -> None:
    """Emits the next block's gets into the free stage (if there is one), pk = this block needs the
    mask, and kp = the working K block's first group."""
    a = x.a
    a("add.i64", x.rr, x.key, x.c.Bc)                 # the next block's first key row
    a("setp.lt.i64", x.pn, x.rr, x.ntl)               # a next block exists: its rows into the free stage
    _fwd_kv_block(x, x.rr, x.dd, p=x.pn)
    a("setp.ge.i64", x.pk, x.key, x.nfull)            # this block needs the mask
    x.kp = a.reg()
    a("mov.b64", x.kp, x.wk)


def _fwd_group(x: _Fwd) -> None:
    """Emits one group of U keys against every chunk of rows: scores, mask, online softmax, O += P V
    (m and l of a chunk from / to the LDM when the CPE owns several)."""
    a, c, t1 = x.a, x.c, x.t1
    nch = c.nch
    x.choff = None
    if nch > 1:                                       # every chunk of 32 rows takes this group of keys
        x.choff = choff = a.reg()                     # 128 * chunk
        a("mov.b64", choff, 0)
        a.label("CHUNKS")
        a("add.i64", t1, x.qa0, choff)
        a("ld.shared.b32", x.m, Mem(t1, x.ML))
        a("ld.shared.b32", x.l, Mem(t1, x.ML + x.QP))
    _fwd_scores(x)
    _fwd_mask(x)
    _fwd_softmax(x)
    _fwd_pv(x)
    if nch > 1:
        a("add.i64", t1, x.qa0, x.choff)
        a("st.shared.b32", Mem(t1, x.ML), x.m)
        a("st.shared.b32", Mem(t1, x.ML + x.QP), x.l)
        a("add.i64", x.choff, x.choff, 128)
        a("setp.lt.i64", x.pm, x.choff, x.QP)
        a("bra", "CHUNKS", p=x.pm)
        a.free(x.choff)


def _fwd_scores(x: _Fwd) -> None:
    """Emits the scores s_u (new registers) of keys key .. key+U-1 (log2 domain: Q is pre-scaled)."""
    a, c, U, KV4, QP, pm = x.a, x.c, x.c.U, x.KV4, x.QP, x.pm
    x.s = s = a.reg(U)
    for u in range(U):
        a("mov.f32", s + u, 0.0)
    # Keys in pairs, their fmas interleaved (two fmas apart on one accumulator cover the FMA
    # latency). A loop body covers two k-quads (q registers A, B); everything else the loop does
    # (the other half's q loads, the next pair's and next body's K loads, the loop counter) is
    # spread between the fmas, so the in-order CPE issues it in the
    # shadow of the vector pipe instead of in a clump the pipe waits through.
    q, kv = [a.reg(4), a.reg(4)], [a.reg(8), a.reg(8)]
    qa, kp2, it = a.reg(), a.reg(), a.reg()
    if c.nch > 1:
        a("add.i64", qa, x.qa0, x.choff)
    else:
        a("mov.b64", qa, x.qa0)
    a("mov.b64", kp2, x.kp)
    a("mov.b64", it, 0)
    NB = c.d // 4 // 2                                # loop bodies (4 k a score-loop iteration)
    for e in range(4):
        a("ld.shared.b32", q[0] + e, Mem(qa, QP * e))
    a("ld.shared.v4.b32", kv[0], Mem(kp2, 0))
    a("ld.shared.v4.b32", kv[0] + 4, Mem(kp2, KV4))
    a.label("SCORE")
    fill = []                                         # (mnemonic, operands, kwargs) in order
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
            raise OutOfRegisters(f"U = {U}: an odd number of key pairs")
    a("add.i64", qa, qa, 8 * QP)
    a("add.i64", kp2, kp2, 32)
    a("bra", "SCORE", p=pm)
    a.free(qa, kp2, it)
    a.free(q[0], q[1], k=4)
    a.free(kv[0], kv[1], k=8)


def _fwd_mask(x: _Fwd) -> None:
    """Emits the mask (blocks with pk only): key + u visible to this lane's row iff key + u <= lim."""
    a, c, t1 = x.a, x.c, x.t1
    a("bra", "UNMASKED", p=x.pk, neg=True)
    pe = a.pred()
    if c.nch > 1 and c.causal:                        # this chunk's rows: lim + 32 chunk, at most kv_len - 1
        a("shr.u64", t1, x.choff, 2)
        a("add.i64", t1, t1, x.lim)
        a("min.i64", t1, t1, x.klim)
        a("sub.i64", t1, t1, x.key)
    else:
        a("sub.i64", t1, x.lim, x.key)
    for u in range(c.U):
        a("setp.lt.i64", pe, t1, u)
        a("mov.f32", x.s + u, float("-inf"), p=pe)
    a.pfree(pe)
    a.label("UNMASKED")


def _tree(a: Asm, op: str, first, n: int, out) -> None:
    """out = op(out, op over registers first .. first+n-1), n a power of two, by a tree over
    temporaries."""
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


def _fwd_softmax(x: _Fwd) -> None:
    """Emits the online softmax's new max (every row in its own lane): m_new, al = 2^(m_old -
    m_new), s_u -= m_new, and p of the first two keys."""
    a, s, m = x.a, x.s, x.m
    mx = a.reg()
    x.al = al = a.reg()
    a("mov.f32", mx, m)
    _tree(a, "max.f32", s, x.c.U, mx)                 # m_new
    a("sub.f32", al, m, mx)
    a("ex2.f32", al, al)                              # alpha = 2^(m_old - m_new)
    a("mov.f32", m, mx)
    for u in range(x.c.U):
        a("sub.f32", s + u, s + u, mx)
    a("ex2.f32", s, s)
    a("ex2.f32", s + 1, s + 1)
    a.free(mx)


def _fwd_pv(x: _Fwd) -> None:
    """Emits O += P V, C columns of OT at a time, and l = alpha l + sum p. The first chunk is
    emitted apart: p_(u+2) = ex2(..) issues just before the fmas of p_u (its result lands while
    they run), so the slow mufu pipe works while the vector pipe does."""
    a, c, U, C = x.a, x.c, x.c.U, x.c.C
    oa, vp = a.reg(), a.reg()
    a("add.i64", oa, x.qa0, x.OT)
    if c.nch > 1:
        a("add.i64", oa, oa, x.choff)
    a("add.i64", vp, x.kp, x.VOFF)
    _fwd_pv_chunk(x, oa, vp, True)
    sm = a.reg()                                      # l = alpha l + sum p
    a("mov.f32", sm, 0.0)
    _tree(a, "add.f32", x.s, U, sm)
    a("fma.f32", x.l, x.l, x.al, sm)
    a.free(sm)
    if c.d // C > 1:
        cc = a.reg()
        a("mov.b64", cc, 1)
        a.label("PV")
        _fwd_pv_chunk(x, oa, vp, False)
        a("add.i64", cc, cc, 1)
        a("setp.lt.i64", x.pm, cc, c.d // C)
        a("bra", "PV", p=x.pm)
        a.free(cc)
    a.free(oa, vp, x.al)
    a.free(x.s, k=U)


def _fwd_pv_chunk(x: _Fwd, oa, vp, first: bool) -> None:
    """Emits C columns of O (at oa, V at vp): rescaled by alpha, += p_u V_u, stored; steps oa, vp."""
    a, U, C, QP, KV4, s, al = x.a, x.c.U, x.c.C, x.QP, x.KV4, x.s, x.al
    o, vb = a.reg(C), [a.reg(4), a.reg(4)]
    for e in range(4):                                # loads run 4 ahead of the rescaling muls
        a("ld.shared.b32", o + e, Mem(oa, QP * e))
    for e in range(C):
        a("mul.f32", o + e, o + e, al)
        if e + 4 < C:
            a("ld.shared.b32", o + e + 4, Mem(oa, QP * (e + 4)))
    steps = [(u, e4) for u in range(U) for e4 in range(C // 4)]
    a("ld.shared.v4.b32", vb[0], Mem(vp, 0))
    for i, (u, e4) in enumerate(steps):
        if first and e4 == 0 and u + 2 < U:
            a("ex2.f32", s + u + 2, s + u + 2)        # p = 2^(s - m_new), two keys ahead
        if i + 1 < len(steps):
            u2, f2 = steps[i + 1]
            a("ld.shared.v4.b32", vb[(i + 1) % 2], Mem(vp, u2 * KV4 + 16 * f2))
        for e in range(4):
            a("fma.f32", o + 4 * e4 + e, s + u, vb[i % 2] + e, o + 4 * e4 + e)
            if u == U - 1 and e4 > 0:                 # the last key: store the previous 4 columns
                a("st.shared.b32", Mem(oa, QP * (4 * (e4 - 1) + e)), o + 4 * (e4 - 1) + e)
    for e in range(C - 4, C):
        a("st.shared.b32", Mem(oa, QP * e), o + e)
    a("add.i64", oa, oa, QP * C)
    a("add.i64", vp, vp, 4 * C)
    a.free(o, k=C)
    a.free(vb[0], vb[1], k=4)


def _fwd_loop_close(x: _Fwd) -> None:
    """Emits the ends of the group loop (the next U keys of the block) and of the block loop (fp32:
    the stages swap); frees the loop state."""
    a, t1, pm, wk = x.a, x.t1, x.pm, x.wk
    a("add.i64", x.kp, x.kp, x.c.U * x.KV4)
    a("add.i64", x.key, x.key, x.c.U)
    a("sub.i64", t1, x.kp, wk)                        # groups done in this block (wk: register or immediate)
    a("setp.lt.i64", pm, t1, x.c.Bc * x.KV4)
    a("bra", "GROUP", p=pm)
    a.free(x.kp)
    if x.f32:                                         # the stages swap
        a("mov.b64", t1, wk)
        a("mov.b64", wk, x.dd)
        a("mov.b64", x.dd, t1)
        a.free(wk, x.dd)
    a("setp.lt.i64", pm, x.key, x.ntl)
    a("bra", "KV_LOOP", p=pm)
    a.free(x.key, x.rr, x.ntl, x.nfull, x.lim, x.gk, x.gv, x.klim, x.cnt)
    a.free(x.pair, k=2)
    a.pfree(x.pn, x.pk)


def _fwd_epilogue(x: _Fwd) -> None:
    """Emits the epilogue: O / l -> packed rows (and the log-sum-exps, with lse) -> one strided put
    of the rows below q_len."""
    a, c, t1, t2, qa0, RAW = x.a, x.c, x.t1, x.t2, x.qa0, x.RAW
    nr, i0, Lq = a.reg(), a.reg(), a.reg()
    a("s2r", t1, "%nctaid.x")
    a("s2r", t2, "%ctaid.x")
    a("sub.i64", i0, t1, t2)
    a("sub.i64", i0, i0, 1)
    a("shl.b64", i0, i0, log2(x.BRr))
    a("ldparam", Lq, "q_len")
    a("sub.i64", nr, Lq, i0)
    a("min.i64", nr, nr, x.BRr)                       # rows of this block below q_len
    LSEB = RAW + x.BRr * x.RB                         # staged log-sum-exps
    v, lane = a.reg(), a.reg()
    a("s2r", lane, "%tid.x")
    for ch in range(c.nch):                           # rows 32 ch + lane: O / l -> packed rows
        if c.nch > 1:
            a("ld.shared.b32", x.m, Mem(qa0, x.ML + 128 * ch))
            a("ld.shared.b32", x.l, Mem(qa0, x.ML + x.QP + 128 * ch))
        if c.lse:                                     # ln(sum e^(scale s)) = ln2 (m + log2 l)
            a("lg2.f32", v, x.l)
            a("add.f32", v, v, x.m)
            a("mul.f32", v, v, LN2)
            a("st.shared.b32", Mem(qa0, LSEB + 128 * ch), v)
        a("rcp.f32", x.l, x.l)
        _skew_untranspose(a, c.dtype, x.RB, x.QP, x.OT + 128 * ch, RAW + 32 * ch * x.RB, lane, qa0, f"OXPOSE{ch}",
                          x.l)
    a.free(lane)
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
        a("shl.b64", v, nr, 2)
        a("mov.b64", t2, LSEB)
        a("dma.put", Mem(t1, 0), Mem(t2, 0), v)
    a.free(v)
    # O rows: bq, hd again from the special registers (their registers were freed)
    go = a.reg()
    x.bq, x.hd = a.reg(), a.reg()
    a("s2r", x.bq, "%ctaid.z")
    a("s2r", x.hd, "%ctaid.y")
    oldb = x.base_ptr(go, "O", Lq, "o_ld", "o_off")
    a.free(x.bq, x.hd)
    pair = a.reg(2)
    a("mov.b64", pair, x.RB)
    a("mov.b64", pair + 1, oldb)
    a.free(oldb)
    a("mad.i64", go, i0, pair + 1, go)                # row i0
    a("mov.b64", t2, RAW)
    a("dma.put.s", Mem(go, 0), Mem(t2, 0), nr, pair)  # rows i0 .. i0 + nr - 1 in one strided put



# ----------------------------------------------------------------------------- decode (q_len = 1)
DEC_BC_CHOICES = (128, 64, 32)   # keys per block: 32 lanes x U keys a lane


def _dec_layout(dtype: str, d: int, Bc: int) -> dict:
    es = ELEM_BYTES[dtype]
    RB = d * es
    QF, OT = 0, ceil_div(4 * d, 128) * 128
    RAW = OT + 128 * d                                # K then V rows, packed (strided gets)
    raw = ceil_div(max(2 * Bc * RB, 2 * RB + 16), 64) * 64
    KT = RAW + raw
    return dict(es=es, RB=RB, QF=QF, OT=OT, RAW=RAW, KT=KT, VT=KT + 4 * Bc * d, total=KT + 8 * Bc * d)


class _Dec(_Steps):
    """The decode kernel's steps: its configuration, LDM layout and assembler (registers: _Steps)."""

    def __init__(self, c: _Cfg, max_regs: int):
        self.c = c
        self.U = c.Bc // LANES
        self.C = 8
        self.L = L = _dec_layout(c.dtype, c.d, c.Bc)
        self.es, self.RB, self.OT, self.RAW, self.KT, self.VT = L["es"], L["RB"], L["OT"], L["RAW"], L["KT"], L["VT"]
        self.f32 = c.dtype == "fp32"
        self.KTR = 4 * c.Bc                           # bytes of a KT / VT row (one k, all keys)
        name = f"flash_attn_sw_decode_{c.dtype}_d{c.d}_bc{c.Bc}{'_split' if c.split else ('_lse' if c.lse else '')}"
        self.a = Asm(name, SPLIT_PARAMS if c.split else (LSE_PARAMS if c.lse else PARAMS), L["total"], limit=max_regs)


def _emit_decode(c: _Cfg, max_regs: int) -> Program:
    """q_len = 1: lane = key. Lane i takes keys j*Bc + 32u + i (u < U = Bc/32) of every block, with
    its own running max, sum and O column set OT[.][i]; the 32 partial softmaxes are merged by
    shfl.bfly at the end. A K / V block lands by one strided get each, rows packed, and is
    transposed (skewed: no bank conflicts) to fp32 KT, VT [d][Bc] (key-contiguous: one vector load
    gives 32 keys' element k)."""
    x = _Dec(c, max_regs)
    a = x.a
    x.qa0, x.bq, x.hd, x.t1, x.t2, x.rbn, x.lane = (a.reg() for _ in range(7))
    a("s2r", x.lane, "%tid.x")
    a("shl.b64", x.qa0, x.lane, 2)
    a("s2r", x.bq, "%ctaid.z")
    a("s2r", x.hd, "%ctaid.y")
    a("mov.b64", x.rbn, x.RB)
    x.pl = a.pred()
    _dec_load_q(x)
    _dec_kv_range(x)
    _dec_kv_block(x, x.key)
    x.m, x.l = a.reg(), a.reg()
    a("mov.f32", x.m, -1e30)                          # finite: a lane whose keys are all masked stays exact
    a("mov.f32", x.l, 0.0)
    x.pm, x.pn, x.pk = a.pred(), a.pred(), a.pred()
    _dec_block_head(x)
    _dec_scores(x)
    al = _dec_softmax(x)
    _dec_pv(x, al)
    a("add.i64", x.key, x.key, c.Bc)
    a("setp.lt.i64", x.pm, x.key, x.ntl)
    a("bra", "KV_LOOP", p=x.pm)
    a.free(x.key, x.klim, x.ntl, x.gk, x.gv, x.cnt)
    a.free(x.pair, k=2)
    _dec_epilogue(x)
    a("dma.wait", 0)
    a("exit")
    return a.build()


def _dec_load_q(x: _Dec) -> None:
    """Emits the Q row's get and its conversion to QF (fp32, scaled by c; lanes take element
    pairs), and OT = 0."""
    a, c, d, qa0, t1, t2, RAW = x.a, x.c, x.c.d, x.qa0, x.t1, x.t2, x.RAW
    x.one = a.reg()
    a("mov.b64", x.one, 1)
    x.g = g = a.reg()
    a.free(x.base_ptr(g, "Q", x.one, "q_ld", "q_off"))
    a("mov.b64", t2, RAW)
    a("dma.get", Mem(t2, 0), Mem(g, 0), x.rbn)
    a("dma.wait", 0)
    v, y, z = a.reg(), a.reg(), a.reg()
    pq = a.pred()
    if x.f32:
        for k0 in range(0, d, LANES):
            a("ld.shared.b32", v, Mem(qa0, RAW + 4 * k0))
            a("mul.f32", v, v, c.c)
            a("st.shared.b32", Mem(qa0, 4 * k0), v)
    else:
        lo, hi = CVT_IN[c.dtype]
        for k0 in range(0, d, 2 * LANES):
            part = d - k0 < 2 * LANES                 # d 32: lanes 0 .. 15 hold the 32 elements
            if part:
                a("setp.lt.i64", pq, x.lane, (d - k0) // 2)
            a("ld.shared.b32", v, Mem(qa0, RAW + 2 * k0))
            a(lo, y, v)
            a(hi, z, v)
            a("mul.f32", y, y, c.c)
            a("mul.f32", z, z, c.c)
            a("shl.b64", t1, qa0, 1)
            a("st.shared.v2.b32", Mem(t1, 4 * k0), y, p=pq if part else None)
    a("mov.f32", v, 0.0)
    for k in range(d):
        a("st.shared.b32", Mem(qa0, x.OT + 128 * k), v)
    a.free(v, y, z)
    a.pfree(pq)


def _dec_kv_range(x: _Dec) -> None:
    """Emits the K / V sources gk, gv with the strided gets' (row bytes, stride) pair, and the keys
    the CPE runs: key (its first) .. klim (its last), ntl (the end of its blocks, in keys); split:
    chunk x of chunk*Bc keys."""
    a, c, t1 = x.a, x.c, x.t1
    Bc = c.Bc
    x.gk, x.gv = a.reg(), a.reg()
    Lk = a.reg()
    a("ldparam", Lk, "kv_len")
    kldb = x.base_ptr(x.gk, "K", Lk, "kv_ld", "k_off")
    a.free(x.base_ptr(x.gv, "V", Lk, "kv_ld", "v_off"))
    x.klim, x.ntl, x.key = klim, ntl, key = a.reg(), a.reg(), a.reg()
    if c.split:                                       # keys key .. klim: chunk x of chunk*Bc keys
        a("ldparam", t1, "chunk")
        a("shl.b64", t1, t1, log2(Bc))
        a("s2r", key, "%ctaid.x")
        a("mul.i64", key, key, t1)
        a("add.i64", t1, t1, key)
        a("min.i64", t1, t1, Lk)
        a("sub.i64", klim, t1, 1)
    else:
        a("mov.b64", key, 0)
        a("sub.i64", klim, Lk, 1)
    a("sub.i64", ntl, klim, key)
    a("add.i64", ntl, ntl, Bc)
    a("shr.u64", ntl, ntl, log2(Bc))
    a("shl.b64", ntl, ntl, log2(Bc))
    a("add.i64", ntl, ntl, key)                       # the end of the blocks run (keys)
    a.free(Lk, x.one)
    x.pair = pair = a.reg(2)                          # a strided get's block size and stride
    a("mov.b64", pair, x.RB)
    a("mov.b64", pair + 1, kldb)
    a.free(kldb)
    x.cnt = a.reg()


def _dec_kv_block(x: _Dec, first_key) -> None:
    """K and V rows first_key .. first_key + cnt - 1 (cnt = min(Bc, kv_len - first_key)) by one
    strided get each, packed at RB bytes; rows past cnt keep the previous block's values
    (finite, and masked)."""
    a, cnt, g, pair, t2 = x.a, x.cnt, x.g, x.pair, x.t2
    a("sub.i64", cnt, x.klim, first_key)
    a("add.i64", cnt, cnt, 1)
    a("min.i64", cnt, cnt, x.c.Bc)
    a("mad.i64", g, first_key, pair + 1, x.gk)
    a("mov.b64", t2, x.RAW)
    a("dma.get.s", Mem(t2, 0), Mem(g, 0), cnt, pair)
    a("mad.i64", g, first_key, pair + 1, x.gv)
    a("dma.get.s", Mem(t2, x.c.Bc * x.RB), Mem(g, 0), cnt, pair)


def _dec_block_head(x: _Dec) -> None:
    """Emits the head of the block loop: wait for block j, transpose it to KT / VT, then the next
    block's gets into the raw area, now free."""
    a, U, RB, RAW = x.a, x.U, x.RB, x.RAW
    a.label("KV_LOOP")
    a("dma.wait", 0)
    # transpose + convert: lane i takes rows 32u + i; KT[k][32u + i] (skewed: no bank conflicts)
    jobs = [(RAW + 32 * u * RB, x.KT + 128 * u) for u in range(U)]
    jobs += [(RAW + x.c.Bc * RB + 32 * u * RB, x.VT + 128 * u) for u in range(U)]
    _skew_xpose(a, x.c.dtype, RB, x.KTR, jobs, x.lane, x.qa0, "XPOSE")
    # the next block's rows into the raw area, now free
    nk = a.reg()
    a("add.i64", nk, x.key, x.c.Bc)
    a("setp.lt.i64", x.pn, nk, x.ntl)
    a("bra", "NO_NEXT", p=x.pn, neg=True)
    _dec_kv_block(x, nk)
    a.label("NO_NEXT")
    a.free(nk)


def _dec_scores(x: _Dec) -> None:
    """Emits the scores s_u = sum_k QF[k] KT[k][32u + lane] (two accumulators a key: even / odd k),
    then the mask of keys past kv_len (the last block only)."""
    a, U, KTR, t1, pk = x.a, x.U, x.KTR, x.t1, x.pk
    x.s = s = a.reg(2 * U)
    for i in range(2 * U):
        a("mov.f32", s + i, 0.0)
    qv, kx = a.reg(4), a.reg(4 * U)
    kk, qq, it = a.reg(), a.reg(), a.reg()
    a("add.i64", kk, x.qa0, x.KT)
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
    a("setp.lt.i64", x.pm, it, x.c.d // 4)
    a("bra", "SCORE", p=x.pm)
    a.free(qv, k=4)
    a.free(kx, k=4 * U)
    a.free(kk, qq, it)
    for u in range(U):
        a("add.f32", s + u, s + u, s + U + u)
    # mask keys past kv_len (the last block only)
    a("add.i64", t1, x.key, x.c.Bc)
    a("setp.le.i64", pk, t1, x.klim)
    a("bra", "UNMASKED", p=pk)
    a("sub.i64", t1, x.klim, x.key)
    a("sub.i64", t1, t1, x.lane)                      # key + 32u + lane visible iff 32u <= t1
    for u in range(U):
        a("setp.lt.i64", pk, t1, 32 * u)
        a("mov.f32", s + u, float("-inf"), p=pk)
    a.label("UNMASKED")


def _dec_softmax(x: _Dec):
    """Emits the lane's online softmax over its U keys (m, l updated, s_u = p_u); returns the
    register alpha = 2^(m_old - m_new)."""
    a, U, s, m = x.a, x.U, x.s, x.m
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
    a("fma.f32", x.l, x.l, al, mx)
    a.free(mx)
    return al


def _dec_pv(x: _Dec, al) -> None:
    """Emits O^T[c][lane] = al O^T[c][lane] + sum_u p_u VT[c][32u + lane], C columns at a time;
    frees al and the scores."""
    a, U, C, KTR = x.a, x.U, x.C, x.KTR
    o, vx = a.reg(C), a.reg(C)
    oa, vp, cc = a.reg(), a.reg(), a.reg()
    a("add.i64", oa, x.qa0, x.OT)
    a("add.i64", vp, x.qa0, x.VT)
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
            a("fma.f32", o + e, x.s + u, vx + e, o + e)
    for e in range(C):
        a("st.shared.b32", Mem(oa, 128 * e), o + e)
    a("add.i64", oa, oa, 128 * C)
    a("add.i64", vp, vp, KTR * C)
    a("add.i64", cc, cc, 1)
    a("setp.lt.i64", x.pm, cc, x.c.d // C)
    a("bra", "PV", p=x.pm)
    a.free(oa, vp, cc, al)
    a.free(o, vx, k=C)
    a.free(x.s, k=2 * U)


def _dec_epilogue(x: _Dec) -> None:
    """Emits the merge of the 32 lanes: M = max m, sc = 2^(m - M), L = sum l sc, O = sum sc O^T / L;
    lane 0 stages the O row (and the log-sum-exp) and puts them (split: the f32 partial O and its
    log-sum-exp into the workspaces)."""
    a, c, d, t1, t2, l, RAW = x.a, x.c, x.c.d, x.t1, x.t2, x.l, x.RAW
    M, sc, v = a.reg(), a.reg(), a.reg()
    a("mov.f32", M, x.m)
    for sh in (1, 2, 4, 8, 16):
        a("shfl.bfly.b64", v, M, sh)
        a("max.f32", M, M, v)
    a("sub.f32", sc, x.m, M)
    a("ex2.f32", sc, sc)
    a("mul.f32", l, l, sc)
    for sh in (1, 2, 4, 8, 16):
        a("shfl.bfly.b64", v, l, sh)
        a("add.f32", l, l, v)
    p0 = a.pred()
    a("setp.eq.i64", p0, x.lane, 0)
    of32 = x.f32 or c.split                           # split: the partial O in f32, normalised by its own sum
    slot = _dec_put_lse(x, M, v, p0)
    a("rcp.f32", l, l)
    a("mul.f32", sc, sc, l)                           # 2^(m - M) / L
    vals = a.reg(2)
    for c0 in range(0, d, 1 if of32 else 2):
        for e in range(1 if of32 else 2):
            r = vals + e
            a("ld.shared.b32", r, Mem(x.qa0, x.OT + 128 * (c0 + e)))
            a("mul.f32", r, r, sc)
            for sh in (1, 2, 4, 8, 16):
                a("shfl.bfly.b64", v, r, sh)
                a("add.f32", r, r, v)
        if of32:
            a("st.shared.b32", Mem(None, RAW + 4 * c0), vals, p=p0)
        else:
            a(CVT_OUT[c.dtype], v, vals, vals + 1)
            a("st.shared.b32", Mem(None, RAW + 2 * c0), v, p=p0)
    go = a.reg()
    if c.split:
        a("mul.i64", go, slot, 4 * d)
        a("ldparam", t1, "Opart")
        a("add.i64", go, go, t1)
        a("mov.b64", x.rbn, 4 * d)
    else:
        one = a.reg()
        a("mov.b64", one, 1)
        a.free(x.base_ptr(go, "O", one, "o_ld", "o_off"))
    a("mov.b64", t2, RAW)
    a("dma.put", Mem(go, 0), Mem(t2, 0), x.rbn)


def _dec_put_lse(x: _Dec, M, v, p0):
    """Emits (lse or split) the log-sum-exp ln2 (M + log2 L), staged by lane 0 after the O row, and
    its put into LSE (split: LSEpart); returns the split's workspace slot register, else None."""
    a, c, t1, t2 = x.a, x.c, x.t1, x.t2
    LSEB = x.RAW + (4 * c.d if c.split else x.RB)     # the staged log-sum-exp, after the staged O row
    slot = None
    if c.split:                                       # workspace slot (b*heads + head)*splits + split
        slot = a.reg()
        a("s2r", t1, "%nctaid.y")
        a("mad.i64", slot, x.bq, t1, x.hd)
        a("s2r", t1, "%nctaid.x")
        a("s2r", t2, "%ctaid.x")
        a("mad.i64", slot, slot, t1, t2)
    if c.lse or c.split:
        a("lg2.f32", v, x.l)
        a("add.f32", v, v, M)
        a("mul.f32", v, v, LN2)
        a("mov.b64", t2, LSEB)
        a("st.shared.b32", Mem(t2, 0), v, p=p0)
        if c.split:
            a("shl.b64", t1, slot, 2)
            a("ldparam", v, "LSEpart")
        else:
            a("s2r", t1, "%nctaid.y")
            a("mad.i64", t1, x.bq, t1, x.hd)          # (b*heads + head) * q_len(1)
            a("shl.b64", t1, t1, 2)
            a("ldparam", v, "LSE")
        a("add.i64", t1, t1, v)
        a("mov.b64", v, 4)
        a("dma.put", Mem(t1, 0), Mem(t2, 0), v)
    return slot



# ----------------------------------------------------------------------------- split-KV decode: the combine
SPLITS_MAX = 64                 # partials a combine CPE holds in its LDM (the split rule caps the count)


def _emit_combine(dtype: str, d: int, lse: bool) -> Program:
    """O = sum_s w_s O_s / sum_s w_s, w_s = 2^(log2e (LSE_s - M)), M = max_s LSE_s, for one (batch,
    head) row a CPE (grid (rows, 1, 1), q_len 1): one get of the row's split LSEs, one of its f32
    partials (contiguous: Opart [b, heads, splits, 1, d]); lane L holds columns E L .. E L + E - 1
    (E = d / 32: one vector load per split, no bank conflict); the row's O in the storage dtype by
    one put, and LSE = M + ln(sum w) with with_lse."""
    es = ELEM_BYTES[dtype]
    E = d // LANES
    LSEA, OPA = 0, 4 * SPLITS_MAX
    OUT = OPA + 4 * d * SPLITS_MAX
    name = f"flash_attn_sw_combine_{dtype}_d{d}{'_lse' if lse else ''}"
    a = Asm(name, COMBINE_PARAMS + (("LSE",) if lse else ()), OUT + 4 * d + 64)
    r, S, t1, t2, n, la, oa, sp, mx, l, w = (a.reg() for _ in range(11))
    acc, ob = a.reg(E), a.reg(E)
    pl, p0 = a.pred(), a.pred()
    a("s2r", r, "%ctaid.x")                          # (b*heads + head), q_len 1
    a("ldparam", S, "splits")
    a("mul.i64", t1, r, S)                            # the row's first workspace slot
    a("shl.b64", t2, t1, 2)
    a("ldparam", n, "LSEpart")
    a("add.i64", t2, t2, n)
    a("shl.b64", n, S, 2)
    a("mov.b64", la, LSEA)
    a("dma.get", Mem(la, 0), Mem(t2, 0), n)
    a("mul.i64", t2, t1, 4 * d)
    a("ldparam", n, "Opart")
    a("add.i64", t2, t2, n)
    a("mul.i64", n, S, 4 * d)
    a("mov.b64", oa, OPA)
    a("dma.get", Mem(oa, 0), Mem(t2, 0), n)
    a("dma.wait", 0)
    # M = max_s LSE_s (every lane the same: broadcast loads)
    a("mov.f32", mx, float("-inf"))
    a("mov.b64", sp, 0)
    a.label("MAX")
    a("ld.shared.b32", w, Mem(la, 0))
    a("max.f32", mx, mx, w)
    a("add.i64", la, la, 4)
    a("add.i64", sp, sp, 1)
    a("setp.lt.i64", pl, sp, S)
    a("bra", "MAX", p=pl)
    # l = sum w_s, acc = sum w_s O_s (this lane's E columns)
    a("s2r", t1, "%tid.x")
    a("mul.i64", t1, t1, 4 * E)
    a("add.i64", oa, oa, t1)
    a("mov.b64", la, LSEA)
    a("mul.f32", mx, mx, LOG2E)
    a("mov.f32", l, 0.0)
    for e in range(E):
        a("mov.f32", acc + e, 0.0)
    ld = {1: "ld.shared.b32", 2: "ld.shared.v2.b32", 4: "ld.shared.v4.b32"}[E]
    a("mov.b64", sp, 0)
    a.label("SUM")
    a("ld.shared.b32", w, Mem(la, 0))
    a(ld, ob, Mem(oa, 0))
    a("mul.f32", w, w, LOG2E)
    a("sub.f32", w, w, mx)
    a("ex2.f32", w, w)
    a("add.f32", l, l, w)
    for e in range(E):
        a("fma.f32", acc + e, w, ob + e, acc + e)
    a("add.i64", la, la, 4)
    a("add.i64", oa, oa, 4 * d)
    a("add.i64", sp, sp, 1)
    a("setp.lt.i64", pl, sp, S)
    a("bra", "SUM", p=pl)
    a("s2r", t1, "%tid.x")
    a("setp.eq.i64", p0, t1, 0)
    if lse:                                           # ln(sum e^(LSE_s)) = ln2 (log2 l + log2e M)
        a("lg2.f32", w, l)
        a("add.f32", w, w, mx)
        a("mul.f32", w, w, LN2)
        a("mov.b64", t2, OUT + 4 * d)
        a("st.shared.b32", Mem(t2, 0), w, p=p0)
        a("shl.b64", t1, r, 2)
        a("ldparam", n, "LSE")
        a("add.i64", t1, t1, n)
        a("mov.b64", n, 4)
        a("dma.put", Mem(t1, 0), Mem(t2, 0), n)
    a("rcp.f32", l, l)
    for e in range(E):
        a("mul.f32", acc + e, acc + e, l)
    a("s2r", t1, "%tid.x")
    a("mul.i64", t1, t1, es * E)
    a("add.i64", t1, t1, OUT)                         # this lane's columns of the staged row
    if es == 4:
        a({1: "st.shared.b32", 2: "st.shared.v2.b32", 4: "st.shared.v4.b32"}[E], Mem(t1, 0), acc)
    elif E == 1:
        a(CVT_OUT[dtype], ob, acc, acc)
        a("st.shared.b16", Mem(t1, 0), ob)
    else:
        for e in range(0, E, 2):
            a(CVT_OUT[dtype], ob + e // 2, acc + e, acc + e + 1)
        a("st.shared.b32" if E == 2 else "st.shared.v2.b32", Mem(t1, 0), ob)
    # O row b (q_len 1) at head's columns: ((b*o_ld + head*d) + o_off) es
    a("ldparam", n, "heads")
    a("div.i64", t1, r, n)                            # b
    a("rem.i64", t2, r, n)                            # head
    a("ldparam", n, "o_ld")
    a("mul.i64", t1, t1, n)
    a("mad.i64", t1, t2, d, t1)
    a("ldparam", n, "o_off")
    a("add.i64", t1, t1, n)
    a("shl.b64", t1, t1, log2(es))
    a("ldparam", n, "O")
    a("add.i64", t1, t1, n)
    a("mov.b64", t2, OUT)
    a("mov.b64", n, d * es)
    a("dma.put", Mem(t1, 0), Mem(t2, 0), n)
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
            except OutOfRegisters as e:
                tried.append(f"Bc {Bc} U {U} C {C}: {e}")
                continue
            return cfg, prog
    raise InputError(f"attention on {caps.name}", f"head_dim {d} {dtype}: no K/V block fits a CPE ("
                     + "; ".join(dict.fromkeys(tried)) + f"; LDM {caps.scratchpad_bytes} B)",
                     "a smaller head_dim or a larger LDM")


def _choose_decode(caps, dtype: str, d: int, causal: bool, c: float, lse: bool,
                   split: bool = False) -> tuple[_Cfg, Program]:
    tried = []
    for Bc in DEC_BC_CHOICES:
        need = _dec_layout(dtype, d, Bc)["total"]
        if need > caps.scratchpad_bytes:
            tried.append(f"Bc {Bc}: {need} B LDM")
            continue
        cfg = _Cfg(dtype, d, causal, Bc, Bc // LANES, 8, c, lse, split=split)
        try:
            return cfg, _emit_decode(cfg, caps.max_regs_per_thread)
        except OutOfRegisters as e:
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
    if prog is None and ceil_div(q_len, 2 * BR) * heads * batch >= caps.cores_total:
        try:                                          # every CPE still busy with 64 rows: half the K/V traffic
            cfg, prog = _choose(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse), nch=2)
            if cfg.Bc < 32:                           # not at the price of small K/V blocks
                cfg = prog = None
        except InputError:
            pass
    if prog is None:
        cfg, prog = _choose(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse))
    check(prog, caps)
    launch = Launch((ceil_div(q_len, BR * cfg.nch), heads, batch), (LANES, 1, 1), spread=True)
    kind = "sunway_decode" if prog.name.startswith("flash_attn_sw_decode") else "sunway"
    pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    return AttentionKernel(program=prog, launch=launch, flops=4 * d * batch * heads * pairs,
                           model_flops=4 * d * batch * heads * q_len * kv_len, batch=batch, heads=heads,
                           q_len=q_len, kv_len=kv_len, head_dim=d, dtype=dt, causal=bool(causal), scale=scale,
                           Bc=cfg.Bc, kind=kind, with_lse=bool(with_lse), **lds)


def sunway_kv_splits(caps, bh: int, tiles: int) -> tuple[int, int]:
    """(splits, chunk) for bh (batch, head) rows of ``tiles`` K/V blocks: the largest chunk whose
    splits still give every CPE a block (bh * splits >= cores), one block a split when none does;
    (1, tiles) when bh already covers the CPEs or the cache is one block. Not attention_gpu's
    kv_splits (the shortest critical path in tiles): a Sunway decode is bound by the DMA engines
    and the ring, not by one CPE's math, so the more CPEs (engines, core groups, ring stops) a
    decode spans the faster it streams."""
    cores = caps.cores_total
    if bh >= cores or tiles < 2:
        return 1, tiles
    chunk = 1
    for c in range(tiles, 0, -1):
        if bh * ceil_div(tiles, c) >= cores:
            chunk = c
            break
    return ceil_div(tiles, chunk), chunk


def split_kv_attention_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                              dtype: str = "fp16", causal: bool = False, scale: Optional[float] = None,
                              q_ld: Optional[int] = None, kv_ld: Optional[int] = None, o_ld: Optional[int] = None,
                              with_lse: bool = False, splits: Optional[int] = None,
                              name: str = "attn") -> Optional[SplitAttentionKernel]:
    """Split-KV decode (q_len 1) for a Sunway target, attention_gpu.split_kv_attention_kernel's
    arguments and kernel object: ``attn.split`` is the decode program (lane = key) over chunk x of
    ``chunk`` K/V blocks per CPE (grid (splits, heads, batch)), writing its f32 O normalised by its
    own sum and that sum's log-sum-exp into Opart / LSEpart; ``attn.combine`` (a CPE per (batch,
    head)) weighs them. ``splits`` None: sunway_kv_splits, None when one split would do or the
    decode program does not fit; a number forces (about) that many; at most SPLITS_MAX splits."""
    where = "split-KV attention"
    batch, heads, q_len, kv_len, d, dt, lds, scale = check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld,
        "fp16, bf16, fp32", family="sunway")
    check_sunway_units(where, caps, dt)
    if q_len != 1:
        if splits is None:
            return None
        raise InputError(where, f"q_len {q_len}", "q_len 1 (decode; longer queries fill the machine)")
    try:
        cfg, prog = _choose_decode(caps, dt, d, bool(causal), scale * LOG2E, False, split=True)
    except InputError:
        if splits is None:                            # K^T, V^T do not fit: the row kernel runs whole
            return None
        raise
    tiles = ceil_div(kv_len, cfg.Bc)
    if splits is None:
        n, chunk = sunway_kv_splits(caps, batch * heads, tiles)
        if n <= 1:
            return None
    else:
        chunk = forced_chunk(where, splits, tiles)
    chunk = max(chunk, ceil_div(tiles, SPLITS_MAX))   # the combine holds at most SPLITS_MAX partials
    n = ceil_div(tiles, chunk)
    check(prog, caps)
    comb = _emit_combine(dt, d, bool(with_lse))
    check(comb, caps)
    rows = batch * heads
    pairs = kv_len                                    # one query: causal or not, it sees every key
    parts = (AttentionPart(f"{name}.split", prog, Launch((n, heads, batch), (LANES, 1, 1), spread=True),
                           4 * d * batch * heads * pairs, 4 * d * batch * heads * kv_len, ("Opart", "LSEpart")),
             AttentionPart(f"{name}.combine", comb, Launch((rows, 1, 1), (LANES, 1, 1), spread=True),
                           combine_flops(rows, n, d), 0, ("O", "LSE") if with_lse else ("O",)))
    return SplitAttentionKernel(parts=parts, batch=batch, heads=heads, q_len=1, kv_len=kv_len, head_dim=d,
                                dtype=dt, causal=bool(causal), scale=scale, Bc=cfg.Bc, splits=n, chunk=chunk,
                                kind="sunway_decode", with_lse=bool(with_lse), **lds)
