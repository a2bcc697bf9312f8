"""Elementwise and row-reduction kernels of a transformer block, for the Sunway family (SW26010-Pro).

The same public API as ``elementwise_gpu`` (same functions, signatures, ``ElementwiseKernel`` /
``KernelChain`` objects with the same buffers, scalars, flops and references), so the block
composer can switch module by machine family:

    caps = capabilities(load_machine("sw26010pro"))
    k = softmax_kernel(caps, rows=b * n * s, cols=s, dtype="fp16", scale=d ** -0.5, causal=True, q_len=s)
    bufs = k.random_inputs(seed=0)
    res = run_functional(k.program, k.args(**bufs), k.launch, warp_width=32, ncores=caps.cores_total)

The contract (buffers, scalar parameters, nominal flops, ``random_inputs`` and ``reference``) is the
GPU module's own: each function first builds the GPU kernel for the same request on a GPU-shaped
twin of the target (``_spec``) and keeps everything but the program, launch, team and vector width.
Scalars are the GPU kernels' (rows, cols, ld, q_len, q_off, scale, eps, n, ffn); the Sunway programs
read the loop bounds from them and carry their geometry (LDM layout, rows per tile, chunk bytes,
chosen on the host from the shape and the LDM size) as immediates. So a program's size never
depends on the shape (loops, not unrolled streams), while its immediates do.

How the kernels are written (the way athread code is):

- A thread block is one CPE: one warp whose 32 lanes are the 512-bit vector; launch block (32,1,1),
  grid = the CPEs used (at most the machine's). Every CPE runs a grid-stride loop over *chunks*.
- A chunk is DMA'd into the LDM (``dma.get``), computed on with ``ld.shared`` / ``st.shared`` and the
  vector pipes, and its results DMA'd out (``dma.put``). Chunks are double buffered: two LDM sets;
  while chunk k is computed, chunk k+step's get and chunk k-step's put are in flight. The only wait
  is ``dma.wait 0`` (the ISA counts a CPE's transfers, it has no per-transfer reply word), placed
  after the compute of chunk k: it covers exactly the transfers issued before that compute (chunk
  k+step's gets, chunk k-step's puts), which overlapped it. The last puts are waited for before
  ``exit``.
- Flat kernels (gelu, relu, add and their gradients): a chunk is CHB contiguous bytes of every
  buffer (a power of two, at most ``FLAT_CHUNK_MAX``, sized to give every CPE about 3 chunks).
- Row kernels (softmax, norms, their gradients, SwiGLU), team ``rows`` (GPU name: ``warp``): a chunk
  is RB whole rows, one DMA per buffer (rows are contiguous in memory; a [cols] parameter such as
  gamma is fetched once per CPE and stays in its LDM: every CPE gets its own copy). Each row is
  then processed in the LDM with the GPU kernels' lane layout: lane l takes vectors l, l+32, ...
  (16 bytes when the row stride allows, else 8 / 4 / 2), then one element of the tail; reductions
  are a butterfly of shfl.bfly (the vector's lane permutes), no barrier. RB = ceil(rows per CPE /
  4) (about 4 chunks a CPE, for the pipeline), capped by what fits the LDM. Rows written with a
  stride (softmax with ld > cols) are put row by row so the columns past cols stay untouched.
- Team ``chunks`` (GPU name: ``block``), taken when one row of every buffer (double buffered) does
  not fit the LDM: each CPE takes whole rows (grid stride) and every pass over a row streams it
  through the LDM in column chunks of CWB bytes (a power of two, about a quarter row), double
  buffered the same way; a pass that needs the whole row (a reduction before the output) re-reads
  it from memory. Per-row statistics go through ``ld.global`` / ``st.global``.
- Softmax with rows in the LDM is three passes over the LDM row: max; e = 2^(t - max) stored as f32
  in an LDM scratch row, with the sum; y = e / sum. One ex2 per kept element: on a CPE the
  transcendental is a slow software sequence (the mufu pipe of configs/sw26010pro.yaml), so this
  halves the online normalizer's two. Streamed (team ``chunks``) it is max, sum, write (two ex2).
  Masking, -inf handling (running max from -FLT_MAX, a row with nothing kept written as zeros) and
  the causal rule are the GPU kernel's.
- Norm backward (``KernelChain``): (1) dx per row as above; (2) the column sums dgamma (dbeta): work
  units of (column chunk, row range); a unit streams tiles of RB2 rows x CW2 columns of x and dy
  (and the rows' mean / rstd) through the LDM, and for each column vector sums the tile's rows in
  registers into f32 partial sums kept in the LDM; a unit that covers all rows stores dgamma
  directly, otherwise its partial sums go to a workspace ``ws`` [ranges, nout*cols] (f32) and (3)
  a third kernel adds the ranges up, ``WS_ROWS`` workspace rows a DMA step (the GPU chain's
  structure; no atomics, no RMA).
- ``team``: None (the rule above), "warp" / "rows" (whole rows in the LDM; an InputError if one row
  does not fit), "block" / "chunks" (streamed column chunks, for any row length). The kernel's
  ``team`` field says "rows", "chunks", "flat" or "column".

Math in f32 as on the GPU (storage dtype converted on load, rounded once on the store), so the
GPU module's tolerances hold.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Mem, Reg
from archsim.isa.check import check
from archsim.isa.program import Launch

from . import elementwise_gpu as EW
from .elementwise_gpu import F32_MAX, FLOPS_PER_ELEM, LOG2E, Buf, ElementwiseKernel, KernelChain
from .common import (BUF_BYTES, CVT_IN, CVT_OUT, ELEM_BYTES, MASK_DTYPE, Asm, OutOfRegisters, ceil_div, log2, pow2_ceil, pow2_floor,
                     widen_halves)

__all__ = ["Buf", "ElementwiseKernel", "KernelChain", "softmax_kernel", "softmax_grad_kernel", "layernorm_kernel",
           "layernorm_grad_kernel", "rmsnorm_kernel", "rmsnorm_grad_kernel", "gelu_kernel", "gelu_grad_kernel",
           "relu_kernel", "relu_grad_kernel", "adamw_kernel", "swiglu_kernel", "swiglu_grad_kernel", "add_kernel", "FLOPS_PER_ELEM"]

_LDS = {4: "ld.shared.b32", 8: "ld.shared.v2.b32", 16: "ld.shared.v4.b32"}
_STS = {4: "st.shared.b32", 8: "st.shared.v2.b32", 16: "st.shared.v4.b32"}

FLAT_CHUNK_MAX = 8192        # choice: bytes per buffer and chunk of a flat kernel (4 KiB-8 KiB DMAs run near
#                              one CPE's streaming rate; 3 buffers x 2 sets x 8 KiB fit even tiny-sunway's LDM)
CHUNKS_PER_CPE = 4           # choice: row tiles per CPE the row kernels aim at (a pipeline needs >= 2)
ALIGN = 64                   # LDM buffers start on 64-byte boundaries (one LDM wavefront)


def _al(x: int) -> int:
    return -(-x // ALIGN) * ALIGN


# ----------------------------------------------------------------------------- target and contract
def _target(op: str, caps) -> None:
    if caps.family != "sunway" or caps.warp_width != 32 or not caps.has_dma:
        raise InputError(f"{op} on {caps.name}", f"the Sunway elementwise emitter needs a sunway-family target "
                         f"with 32-lane CPEs and DMA, not {caps.family} with {caps.warp_width}",
                         "a sunway-family machine")


def _spec(caps):
    """A GPU-shaped twin of a Sunway target: the GPU emitter builds its kernel for the same request
    on it, and the Sunway kernel keeps that kernel's contract (buffers, scalars, flops, references)."""
    return dataclasses.replace(caps, family="gpu", warp_slots=64, max_blocks_per_core=32,
                               regs_per_core=65536, max_regs_per_thread=255, subcores=4,
                               scratchpad_bytes=max(caps.scratchpad_bytes, 64 * 1024))


def _team(team) -> Optional[str]:
    m = {None: None, "warp": "rows", "rows": "rows", "block": "chunks", "chunks": "chunks"}
    if not isinstance(team, (str, type(None))) or team not in m:
        raise InputError("row kernel", f"team {team!r}", "warp / rows, block / chunks or None (the rule)")
    return m[team]


def _vec_bytes(*byte_sizes: int, es: int) -> int:
    """The widest vector (16, 8, 4 bytes; else one element) that divides every row stride and offset."""
    for vb in (16, 8, 4):
        if vb >= es and all(b % vb == 0 for b in byte_sizes):
            return vb
    return es


# ----------------------------------------------------------------------------- emission context
class LdmAsm(EW.ElementwiseAsm):
    """The GPU emission context with loads and stores in the LDM, a 32-lane warp team, the target's
    register limit, and the double-buffered DMA pipeline."""

    def __init__(self, name: str, params, dt: str, VB: int, shared: int, caps):
        super().__init__(name, params, dt, VB, "warp", 32)
        self.a = Asm(name, params, shared, limit=caps.max_regs_per_thread)
        self.npipe = 0
        self.nlab = 0

    def label(self) -> str:
        self.nlab += 1
        return f"Z{self.nlab}"

    # ---- LDM memory
    def words(self, mn: dict, v: Reg, addr: Reg, off: int, nw: int, p=None, store=False) -> None:
        """nw 32-bit words at [addr+off] <-> v..v+nw-1, in v4 / v2 / b32 pieces."""
        i = 0
        while i < nw:
            w = 4 if nw - i >= 4 and (off + 4 * i) % 16 == 0 else (2 if nw - i >= 2 and (off + 4 * i) % 8 == 0 else 1)
            if store:
                self.a(mn[4 * w], Mem(addr, off + 4 * i), v + i, p=p)
            else:
                self.a(mn[4 * w], v + i, Mem(addr, off + 4 * i), p=p)
            i += w

    def load(self, addr: Reg, n: int, p=None, off: int = 0, dt: Optional[str] = None) -> Reg:
        dt = dt or self.dt
        if dt == MASK_DTYPE:
            v = self.a.reg(n)
            if n == 1:
                self.a("ld.shared.u8", v, Mem(addr, off), p=p)
                return v
            raw = self.a.reg(n // 4)
            self.words(_LDS, raw, addr, off, n // 4, p)
            EW.unpack_bytes(self.a, v, raw, n)
            self.a.free(raw, k=n // 4)
            return v
        es, a = ELEM_BYTES[dt], self.a
        v = a.reg(n)
        if dt == "fp32":
            self.words(_LDS, v, addr, off, n, p)
            return v
        lo = CVT_IN[dt][0]
        if n == 1:
            a("ld.shared.u16", v, Mem(addr, off), p=p)
            a(lo, v, v)
            return v
        nr = n * es // 4
        raw = a.reg(nr)
        self.words(_LDS, raw, addr, off, nr, p)
        widen_halves(a, dt, v, raw, nr)
        a.free(raw, k=nr)
        return v

    def store(self, addr: Reg, v: Reg, n: int, off: int = 0, dt: Optional[str] = None) -> None:
        dt = dt or self.dt
        if dt == MASK_DTYPE:
            if n == 1:
                self.a("st.shared.b8", Mem(addr, off), v)
                return
            pk = self.a.reg(n // 4)
            EW.pack_bytes(self.a, pk, v, n)
            self.words(_STS, pk, addr, off, n // 4, store=True)
            self.a.free(pk, k=n // 4)
            return
        es, a = ELEM_BYTES[dt], self.a
        if dt == "fp32":
            self.words(_STS, v, addr, off, n, store=True)
            return
        cvt = CVT_OUT[dt]
        if n == 1:
            pk = a.reg()
            a(cvt, pk, v, v)
            a("st.shared.b16", Mem(addr, off), pk)
            a.free(pk)
            return
        nr = n * es // 4
        pk = a.reg(nr)
        for i in range(nr):
            a(cvt, pk + i, v + 2 * i, v + 2 * i + 1)
        self.words(_STS, pk, addr, off, nr, store=True)
        a.free(pk, k=nr)

    def lanes(self) -> None:
        """j0v = lane * VB, j0s = lane * es (the loop's starting byte offsets), p0 = lane 0."""
        a = self.a
        t = a.reg()
        a("s2r", t, "%laneid")
        self.p0 = a.pred()
        a("setp.eq.i64", self.p0, t, 0)
        self.j0v = a.reg()
        a("shl.b64", self.j0v, t, log2(self.VB))
        self.j0s = None
        if self.V > 1:
            self.j0s = a.reg()
            a("shl.b64", self.j0s, t, log2(self.es))
        a.free(t)

    def imm(self, v: int) -> Reg:
        r = self.reg()
        self("mov.b64", r, int(v))
        return r

    def clamp(self, dst: Reg, lo, hi) -> None:
        self("max.i64", dst, dst, lo)
        self("min.i64", dst, dst, hi)

    # ---- the DMA pipeline
    def pipeline(self, k: Reg, step, kend: Reg, setb: int, gets: Callable, body: Callable, puts: Callable) -> None:
        """Chunks k, k+step, ... < kend (k advances in place). gets(k, boff) / puts(k, boff) emit the
        DMAs of chunk k into / out of LDM set boff (a register: 0 or setb), body(k, boff) computes.
        get(k) [wait] get(k+s) | body(k) wait put(k) get(k+2s) | body(k+s) wait put(k+s) ... wait."""
        a = self.a
        i = self.npipe
        self.npipe += 1
        p, boff, kn = a.pred(), a.reg(), a.reg()
        e_end, e_loop, e_next = f"P{i}_end", f"P{i}_loop", f"P{i}_next"
        a("setp.ge.i64", p, k, kend)
        a("bra", e_end, p=p)
        a("mov.b64", boff, 0)
        gets(k, boff)
        a("dma.wait", 0)
        a("add.i64", kn, k, step)
        a("mov.b64", boff, setb)
        a("setp.ge.i64", p, kn, kend)
        a("bra", e_loop + "0", p=p)
        gets(kn, boff)
        a.label(e_loop + "0")
        a("mov.b64", boff, 0)
        a.label(e_loop)
        body(k, boff)
        a("dma.wait", 0)
        puts(k, boff)
        a("add.i64", kn, k, step)
        a("add.i64", kn, kn, step)
        a("setp.ge.i64", p, kn, kend)
        a("bra", e_next, p=p)
        gets(kn, boff)
        a.label(e_next)
        a("add.i64", k, k, step)
        a("xor.b64", boff, boff, setb)
        a("setp.lt.i64", p, k, kend)
        a("bra", e_loop, p=p)
        a("dma.wait", 0)
        a.label(e_end)
        a.free(boff, kn)
        a.pfree(p)


def _scale_off(e, dst: Reg, src: Reg, frm: int, to: int) -> None:
    """dst = src * to / frm for power-of-two element sizes: a byte offset in an array of frm-byte
    elements -> the same element's offset in an array of to-byte elements (e.g. 2 -> 4: into f32)."""
    if to > frm:
        e("shl.b64", dst, src, log2(to // frm))
    elif to < frm:
        e("shr.u64", dst, src, log2(frm // to))
    else:
        e("mov.b64", dst, src)


def _grid_launch(caps, needed: int) -> Launch:
    return Launch((max(1, min(int(needed), caps.cores_total)), 1, 1), (32, 1, 1), spread=True)


def build_checked(e: LdmAsm, caps):
    """e's program, checked against the target (archsim.isa.check)."""
    prog = e.build()
    check(prog, caps)
    return prog


def _try_vb(make: Callable, vbs) -> tuple:
    """Build with the widest vector first; a narrower one when the registers run out (64 on a CPE)."""
    last = None
    for vb in vbs:
        try:
            return make(vb)
        except OutOfRegisters as ex:
            last = ex
    raise InputError("elementwise kernel", f"needs more registers than the target allows ({last})",
                     "a target with more registers per thread")


def _kernel(spec: ElementwiseKernel, prog, launch: Launch, team: str, vb: int) -> ElementwiseKernel:
    return dataclasses.replace(spec, program=prog, launch=launch, team=team, vector_bytes=vb)


# ----------------------------------------------------------------------------- flat kernels
def _flat(spec: ElementwiseKernel, caps, math_fn: Callable) -> ElementwiseKernel:
    """Grid-stride over chunks of CHB bytes of every buffer (all [n], the storage dtype; a 16-bit
    buffer beside fp32 ones takes the same elements in half the bytes)."""
    op = spec.op
    _target(op, caps)
    dt = spec.dtype
    es = ELEM_BYTES[dt]
    n = int(dict(spec.scalars)["n"])
    ins = [b.name for b in spec.inputs]
    outs = [b.name for b in spec.outputs]
    narrow = {b.name: b.dtype for b in spec.buffers if b.dtype != dt}     # 16-bit beside fp32, u8 masks
    shift = {name: log2(es // BUF_BYTES[d]) for name, d in narrow.items()}
    index = any(name == "seed" for name, _ in spec.scalars)    # dropout hashes the element's index
    nbuf = len(ins) + len(outs)
    nb = n * es
    G = caps.cores_total
    cap = min(FLAT_CHUNK_MAX, pow2_floor(caps.scratchpad_bytes // (2 * nbuf)))
    CHB = max(min(512, cap), min(cap, pow2_ceil(ceil_div(nb, 3 * G))))
    chb = {name: CHB >> shift.get(name, 0) for name in ins + outs}
    setb = sum(chb.values())
    VB = 16
    fnames = tuple(name for name, _ in spec.scalars if name != "n")   # f32 parameters (AdamW's)
    e = LdmAsm(f"{op}_{dt}_sw_c{CHB}", tuple(b.name for b in spec.buffers) + ("n",) + fnames, dt, VB, 2 * setb, caps)
    e.lanes()
    e.fs = {name: e.fparam(name) for name in fnames}
    k, step, nbr, kend = e.reg(), e.reg(), e.reg(), e.reg()
    e("s2r", k, "%ctaid.x")
    e("s2r", step, "%nctaid.x")
    e("ldparam", nbr, "n")
    e("shl.b64", nbr, nbr, log2(es))
    e("add.i64", kend, nbr, CHB - 1)
    e("shr.u64", kend, kend, log2(CHB))
    e.const(1.0)
    e.const(0.5)
    off_of, o = {}, 0
    for name in ins + outs:
        off_of[name], o = o, o + chb[name]

    def span(kk):
        off, ln = e.reg(), e.reg()
        e("shl.b64", off, kk, log2(CHB))
        e("sub.i64", ln, nbr, off)
        e("min.i64", ln, ln, CHB)
        return off, ln

    def dmas(kk, boff, names, put):
        off, ln = span(kk)
        g, s = e.reg(), e.reg()
        narrowed = any(name in narrow for name in names)
        if narrowed:
            off2, ln2 = e.reg(), e.reg()
        for name in names:
            o, n_ = off, ln
            if name in narrow:
                e("shr.u64", off2, off, shift[name])
                e("shr.u64", ln2, ln, shift[name])
                o, n_ = off2, ln2
            e("ldparam", g, name)
            e("add.i64", g, g, o)
            e("add.i64", s, boff, off_of[name])
            if put:
                e("dma.put", Mem(g, 0), Mem(s, 0), n_)
            else:
                e("dma.get", Mem(s, 0), Mem(g, 0), n_)
        if narrowed:
            e.free(off2, ln2)
        e.free(off, ln, g, s)

    def body(kk, boff):
        off, ln = span(kk)
        if not index:
            e.free(off)
        ptr = {name: e.reg() for name in ins + outs}
        for name, r in ptr.items():
            e("add.i64", r, boff, off_of[name])

        def at(ad, name, j):
            if name in narrow:
                e("shr.u64", ad, j, shift[name])
                e("add.i64", ad, ptr[name], ad)
            else:
                e("add.i64", ad, ptr[name], j)

        def elem(j, m):
            ad = e.reg()
            if index:                              # the element's index in the whole buffer (dropout's hash)
                e.idx = e.reg()
                e("add.i64", e.idx, off, j)
                e("shr.u64", e.idx, e.idx, log2(es))
            vals = {}
            for name in ins:
                at(ad, name, j)
                vals[name] = e.load(ad, m, dt=narrow.get(name))
            res = math_fn(e, vals, m)
            for name in outs:
                at(ad, name, j)
                e.store(ad, res[name], m, dt=narrow.get(name))
            if index:
                e.free(e.idx)
            e.free(ad)
            for r in set(vals.values()) | set(res.values()):
                e.free(r, k=m)

        e.loop(ln, elem)
        e.free(ln, *ptr.values())
        if index:
            e.free(off)

    e.pipeline(k, step, kend, setb, lambda kk, b: dmas(kk, b, ins, False), body, lambda kk, b: dmas(kk, b, outs, True))
    e("dma.wait", 0)
    e("exit")
    prog = build_checked(e, caps)
    return _kernel(spec, prog, _grid_launch(caps, ceil_div(nb, CHB)), "flat", VB)


def _m_gelu(e, v, k):
    x = v["x"]
    t = e.reg(k)
    EW.gelu_tanh(e, x, k, t)
    for i in range(k):
        e("mul.f32", x + i, x + i, 0.5)
        e("fma.f32", x + i, x + i, t + i, x + i)
    e.free(t, k=k)
    return {"y": x}


def _m_gelu_grad(e, v, k):
    x, dy = v["x"], v["dy"]
    one, half = e.const(1.0), e.const(0.5)
    t, s = e.reg(k), e.reg()
    EW.gelu_tanh(e, x, k, t)
    for i in range(k):
        e("neg.f32", s, t + i)
        e("fma.f32", s, s, t + i, one)
        e("fma.f32", t + i, t + i, 0.5, half)
        e("mul.f32", s, s, x + i)
        e("mul.f32", s, s, 0.5 * EW.GELU_K)
        e("mul.f32", x + i, x + i, x + i)
        e("fma.f32", x + i, x + i, 3.0 * EW.GELU_A, one)
        e("fma.f32", x + i, s, x + i, t + i)
        e("mul.f32", x + i, x + i, dy + i)
    e.free(t, k=k)
    e.free(s)
    return {"dx": x}


def _m_add(e, v, k):
    for i in range(k):
        e("add.f32", v["a"] + i, v["a"] + i, v["b"] + i)
    return {"y": v["a"]}


def _m_relu(e, v, k):
    for i in range(k):
        e("max.f32", v["x"] + i, v["x"] + i, 0.0)
    return {"y": v["x"]}


def _m_relu_grad(e, v, k):
    x, dy = v["x"], v["dy"]
    p = e.a.pred()
    for i in range(k):
        e("setp.gt.f32", p, x + i, 0.0)
        e("mov.f32", x + i, 0.0)
        e("mov.b64", x + i, dy + i, p=p)
    e.a.pfree(p)
    return {"dx": x}


def gelu_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) over n elements (GPT-2's GELU)."""
    _target("gelu", caps)
    return _flat(EW.gelu_kernel(_spec(caps), n, dtype), caps, _m_gelu)


def gelu_grad_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """dx = dy * gelu'(x) of the tanh-approximation GELU."""
    _target("gelu_grad", caps)
    return _flat(EW.gelu_grad_kernel(_spec(caps), n, dtype), caps, _m_gelu_grad)


def add_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = a + b over n elements (the residual connection)."""
    _target("add", caps)
    return _flat(EW.add_kernel(_spec(caps), n, dtype), caps, _m_add)


def adamw_kernel(caps, n: int, **hyper) -> ElementwiseKernel:
    """One AdamW step over n fp32 master parameters (elementwise_gpu.adamw_kernel), each CPE
    streaming its chunks of p, g, m, v through its LDM and putting back p_out, m_out, v_out."""
    _target("adamw", caps)
    return _flat(EW.adamw_kernel(_spec(caps), n, **hyper), caps, EW.adamw_math)


def grad_accum_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """acc_out = acc + g: a micro-batch's half-precision weight gradient added into the fp32
    accumulation buffer (elementwise_gpu.grad_accum_kernel), each CPE streaming its chunks of
    both through its LDM (the gradient's chunks half as long in bytes)."""
    _target("grad_accum", caps)
    return _flat(EW.grad_accum_kernel(_spec(caps), n, dtype), caps, EW.grad_accum_math)


def cast_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = x, a 16-bit x widened to fp32 (elementwise_gpu.cast_kernel)."""
    _target("cast", caps)
    return _flat(EW.cast_kernel(_spec(caps), n, dtype), caps, EW.cast_math)


def dropout_kernel(caps, n: int, p: float, seed: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = x / (1 - p) where kept, 0 where dropped, and its byte mask (elementwise_gpu.dropout_kernel:
    the same hash of the element's index, so the same mask)."""
    _target("dropout", caps)
    return _flat(EW.dropout_kernel(_spec(caps), n, p, seed, dtype), caps, EW.dropout_math("x"))


def dropout_add_kernel(caps, n: int, p: float, seed: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = a + dropout(x), and its byte mask."""
    _target("dropout_add", caps)
    return _flat(EW.dropout_add_kernel(_spec(caps), n, p, seed, dtype), caps, EW.dropout_math("x", "a"))


def dropout_grad_kernel(caps, n: int, p: float, dtype: str = "fp16") -> ElementwiseKernel:
    """dx = dy / (1 - p) where the mask kept the element, 0 elsewhere."""
    _target("dropout_grad", caps)
    return _flat(EW.dropout_grad_kernel(_spec(caps), n, p, dtype), caps, EW.dropout_grad_math)


def relu_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = max(x, 0) over n elements."""
    _target("relu", caps)
    return _flat(EW.relu_kernel(_spec(caps), n, dtype), caps, _m_relu)


def relu_grad_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """dx = dy where x > 0, else 0."""
    _target("relu_grad", caps)
    return _flat(EW.relu_grad_kernel(_spec(caps), n, dtype), caps, _m_relu_grad)


# ----------------------------------------------------------------------------- row kernels
@dataclasses.dataclass(frozen=True)
class _St:
    """A row stream of a row kernel: `name` in the kernel code, buffer `param`, columns
    [coff, coff + width) of rows `ld` elements apart (ld 0: a [cols] parameter such as gamma)."""
    name: str
    param: str
    coff: int
    width: int
    ld: int


@dataclasses.dataclass
class _RowSpec:
    ins: tuple                 # _St read per row
    outs: tuple                # _St written per row
    vecs: tuple = ()           # _St with ld 0 ([cols] parameters), read
    stats_in: tuple = ()       # f32 [rows] buffers read (one value a row)
    stats_out: tuple = ()      # f32 [rows] buffers written
    scratch_f32: int = 0       # elements of an f32 LDM row (rows team only)


class _Rows:
    """Driver of a row kernel. code(D) emits the work of one row (D.row) with D.sweep(...) for each
    pass over it; D.p[name] are the LDM pointers of the streams (inside a sweep's elem)."""

    def __init__(self, e: LdmAsm, spec: _RowSpec, team: str, geo: dict):
        self.e, self.spec, self.team, self.geo = e, spec, team, geo
        self.ce = None

    # ---- used by kernel code
    def set_kept(self, ce: Reg) -> None:
        """Byte end of the kept columns of the current row (causal softmax); None: all columns."""
        self.ce = ce

    def stat_in(self, param: str) -> Reg:
        e = self.e
        r = e.reg()
        if self.team == "rows":
            e("shl.b64", r, self.rr, 2)
            e("add.i64", r, r, self.boff)
            e("ld.shared.b32", r, Mem(r, self.geo["off"][param]))
        else:
            e("ldparam", r, param)
            t = e.reg()
            e("shl.b64", t, self.row, 2)
            e("add.i64", r, r, t)
            e("ld.global.b32", r, Mem(r, 0))
            e.free(t)
        return r

    def stat_out(self, param: str, v: Reg) -> None:
        e = self.e
        r = e.reg()
        if self.team == "rows":
            e("shl.b64", r, self.rr, 2)
            e("add.i64", r, r, self.boff)
            e("st.shared.b32", Mem(r, self.geo["off"][param]), v, p=e.p0)
        else:
            e("ldparam", r, param)
            t = e.reg()
            e("shl.b64", t, self.row, 2)
            e("add.i64", r, r, t)
            e("st.global.b32", Mem(r, 0), v, p=e.p0)
            e.free(t)
        e.free(r)

    def sweep(self, reads: tuple, writes: tuple, elem: Callable, kept: bool = False, kept_reads: bool = False) -> None:
        """elem(j, n) over the row's columns (kept: only those below the kept end), j the byte offset
        from the pointers D.p[...] of the streams read and written (D.ce_rel: the kept end from there)."""
        e = self.e
        if self.team == "rows":
            self.ce_rel = self.ce
            lim = self.ce if (kept and self.ce is not None) else self.wb_r
            e.loop(lim, elem)
            return
        g = self.geo
        CWB, WB = g["cwb"], g["wb"]
        streams = {s.name: s for s in self.spec.ins + self.spec.outs + self.spec.vecs}
        c, nch = e.reg(), e.reg()
        e("mov.b64", c, 0)
        if kept and self.ce is not None:
            e("add.i64", nch, self.ce, CWB - 1)
            e("shr.u64", nch, nch, log2(CWB))
        else:
            e("mov.b64", nch, ceil_div(WB, CWB))

        def span(cc):
            off, ln = e.reg(), e.reg()
            e("shl.b64", off, cc, log2(CWB))
            e("sub.i64", ln, self.wb_r, off)
            e("min.i64", ln, ln, CWB)
            return off, ln

        def gaddr(s: _St, off: Reg) -> Reg:
            ga = e.reg()
            e("ldparam", ga, s.param)
            if s.ld:
                t = e.reg()
                e("mul.i64", t, self.row, s.ld * e.es)
                e("add.i64", ga, ga, t)
                e.free(t)
            e("add.i64", ga, ga, off)
            if s.coff:
                e("add.i64", ga, ga, s.coff * e.es)
            return ga

        def gets(cc, boff):
            off, ln = span(cc)
            pk = None
            if kept_reads and self.ce is not None:
                pk = e.a.pred()
                t = e.reg()
                e("sub.i64", t, self.ce, off)
                e("max.i64", t, t, 0)
                e("min.i64", ln, ln, t)
                e("setp.gt.i64", pk, ln, 0)
                e.free(t)
            la = e.reg()
            for name in reads:
                ga = gaddr(streams[name], off)
                e("add.i64", la, boff, g["off"][name])
                e("dma.get", Mem(la, 0), Mem(ga, 0), ln, p=pk)
                e.free(ga)
            e.free(off, ln, la)
            if pk is not None:
                e.a.pfree(pk)

        def puts(cc, boff):
            if not writes:
                return
            off, ln = span(cc)
            la = e.reg()
            for name in writes:
                ga = gaddr(streams[name], off)
                e("add.i64", la, boff, g["off"][name])
                e("dma.put", Mem(ga, 0), Mem(la, 0), ln)
                e.free(ga)
            e.free(off, ln, la)

        def body(cc, boff):
            off, ln = span(cc)
            for name in reads + writes:
                e("add.i64", self.p[name], boff, g["off"][name])
            cer = None
            if self.ce is not None:
                cer = e.reg()
                e("sub.i64", cer, self.ce, off)
                if kept:
                    e("max.i64", ln, cer, 0)
                    e("min.i64", ln, ln, CWB)
            self.ce_rel = cer
            e.free(off)
            e.loop(ln, elem)
            e.free(ln)
            if cer is not None:
                e.free(cer)

        e.pipeline(c, 1, nch, g["setb"], gets, body, puts)
        e.free(c, nch)

    # ---- the drivers
    def emit(self, code: Callable, setup: Callable) -> None:
        e, spec, g = self.e, self.spec, self.geo
        e.lanes()
        self.wb_r = e.imm(g["wb"])
        setup(self)
        self.p = {s.name: e.reg() for s in spec.ins + spec.outs + spec.vecs}
        rows_r = e.reg()
        e("ldparam", rows_r, "rows")
        self.rows_r = rows_r
        if self.team == "rows":
            self._emit_rows(code)
        else:
            self._emit_chunks(code)
        e("dma.wait", 0)
        e("exit")

    def _emit_chunks(self, code: Callable) -> None:
        e = self.e
        row, step, p = e.reg(), e.reg(), e.a.pred()
        self.row = row
        e("s2r", row, "%ctaid.x")
        e("s2r", step, "%nctaid.x")
        top, done = e.label(), e.label()
        e.a.label(top)
        e("setp.ge.i64", p, row, self.rows_r)
        e("bra", done, p=p)
        code(self)
        e("add.i64", row, row, step)
        e("bra", top)
        e.a.label(done)
        e.a.pfree(p)

    def _emit_rows(self, code: Callable) -> None:
        e, spec, g = self.e, self.spec, self.geo
        RB = g["rb"]
        tiles_in, tiles_out = g["tiles_in"], g["tiles_out"]     # param -> (ld bytes, span bytes)
        # [cols] parameters: fetched once, stay in the LDM (waited by the pipeline's first wait)
        t, ln = e.reg(), e.reg()
        for s in spec.vecs:
            e("ldparam", t, s.param)
            e("mov.b64", ln, s.width * e.es)
            e("mov.b64", self.p[s.name], g["off"][s.name])
            e("dma.get", Mem(self.p[s.name], 0), Mem(t, 0), ln)
        e.free(t, ln)
        k, step, kend = e.reg(), e.reg(), e.reg()
        e("s2r", k, "%ctaid.x")
        e("s2r", step, "%nctaid.x")
        e("add.i64", kend, self.rows_r, RB - 1)
        e("div.i64", kend, kend, RB)

        def tile(kk):
            r0, nr = e.reg(), e.reg()
            e("mul.i64", r0, kk, RB)
            e("sub.i64", nr, self.rows_r, r0)
            e("min.i64", nr, nr, RB)
            return r0, nr

        def dmas(kk, boff, put):
            r0, nr = tile(kk)
            ga, la, ln = e.reg(), e.reg(), e.reg()
            for param, (ldb, spanb) in (tiles_out if put else tiles_in).items():
                e("ldparam", ga, param)
                e("mul.i64", ln, r0, ldb)
                e("add.i64", ga, ga, ln)
                e("add.i64", la, boff, g["off"][param])
                if not put or spanb == ldb:                      # whole rows: one transfer
                    e("mul.i64", ln, nr, ldb)
                    if spanb != ldb:
                        e("sub.i64", ln, ln, ldb - spanb)
                    if put:
                        e("dma.put", Mem(ga, 0), Mem(la, 0), ln)
                    else:
                        e("dma.get", Mem(la, 0), Mem(ga, 0), ln)
                else:                                            # strided rows: one put a row
                    i, p = e.reg(), e.a.pred()
                    lab = e.label()
                    e("mov.b64", i, 0)
                    e("mov.b64", ln, spanb)
                    e.a.label(lab)
                    e("dma.put", Mem(ga, 0), Mem(la, 0), ln)
                    e("add.i64", ga, ga, ldb)
                    e("add.i64", la, la, ldb)
                    e("add.i64", i, i, 1)
                    e("setp.lt.i64", p, i, nr)
                    e("bra", lab, p=p)
                    e.free(i)
                    e.a.pfree(p)
            for param in (spec.stats_out if put else spec.stats_in):
                e("ldparam", ga, param)
                e("shl.b64", ln, r0, 2)
                e("add.i64", ga, ga, ln)
                e("add.i64", la, boff, g["off"][param])
                e("shl.b64", ln, nr, 2)
                if put:
                    e("dma.put", Mem(ga, 0), Mem(la, 0), ln)
                else:
                    e("dma.get", Mem(la, 0), Mem(ga, 0), ln)
            e.free(r0, nr, ga, la, ln)

        def body(kk, boff):
            r0, nr = tile(kk)
            rr, row, p = e.reg(), e.reg(), e.a.pred()
            self.rr, self.row, self.boff = rr, row, boff
            lab = e.label()
            e("mov.b64", rr, 0)
            e.a.label(lab)
            e("add.i64", row, r0, rr)
            for s in spec.ins + spec.outs:
                ldb = s.ld * e.es
                e("mul.i64", self.p[s.name], rr, ldb)
                e("add.i64", self.p[s.name], self.p[s.name], boff)
                e("add.i64", self.p[s.name], self.p[s.name], g["off"][s.param] + s.coff * e.es)
            code(self)
            e("add.i64", rr, rr, 1)
            e("setp.lt.i64", p, rr, nr)
            e("bra", lab, p=p)
            e.free(r0, nr, rr, row)
            e.a.pfree(p)

        e.pipeline(k, step, kend, g["setb"], lambda kk, b: dmas(kk, b, False), body, lambda kk, b: dmas(kk, b, True))
        e.free(k, step, kend)


def _row_geometry(caps, spec: _RowSpec, rows: int, es: int, team: Optional[str], op: str) -> tuple:
    """(team, geometry): the LDM layout of the rows team if a row of everything fits (or is asked
    for), else the column-chunk layout."""
    L = caps.scratchpad_bytes
    wb = spec.ins[0].width * es if spec.ins else spec.outs[0].width * es
    tiles_in, tiles_out = {}, {}
    for s in spec.ins:
        ldb, end = s.ld * es, (s.coff + s.width) * es
        tiles_in[s.param] = (ldb, max(end, tiles_in.get(s.param, (0, 0))[1]))
    for s in spec.outs:
        ldb, end = s.ld * es, (s.coff + s.width) * es
        tiles_out[s.param] = (ldb, max(end, tiles_out.get(s.param, (0, 0))[1]))
    fixed = sum(_al(s.width * es) for s in spec.vecs) + _al(spec.scratch_f32 * 4)

    def rows_set(rb):
        return (sum(_al(rb * ldb) for ldb, _ in tiles_in.values()) + sum(_al(rb * ldb) for ldb, _ in tiles_out.values())
                + sum(_al(rb * 4) for _ in spec.stats_in + spec.stats_out))

    fits = fixed + 2 * rows_set(1) <= L
    if team == "rows" and not fits:
        raise InputError(f"{op} on {caps.name}", f"team 'rows' needs one row of every buffer, double buffered, in "
                         f"the LDM: {fixed + 2 * rows_set(1)} bytes > {L}", "team None or 'chunks' (column chunks)")
    if team == "rows" or (team is None and fits):
        rpc = ceil_div(rows, caps.cores_total)
        rb = max(1, ceil_div(rpc, CHUNKS_PER_CPE))
        while rb > 1 and fixed + 2 * rows_set(rb) > L:
            rb -= 1
        off, pos = {}, 0
        for s in spec.vecs:
            off[s.name] = pos
            pos += _al(s.width * es)
        off["_scratch"] = pos
        pos += _al(spec.scratch_f32 * 4)
        base = pos
        for param, (ldb, _) in list(tiles_in.items()) + list(tiles_out.items()):
            off[param] = pos
            pos += _al(rb * ldb)
        for param in spec.stats_in + spec.stats_out:
            off[param] = pos
            pos += _al(rb * 4)
        setb = pos - base
        # the set offset is added to a register: sets are [base, base+setb) and [base+setb, base+2 setb)
        return "rows", dict(rb=rb, wb=wb, tiles_in=tiles_in, tiles_out=tiles_out, off=off, setb=setb,
                            shared=base + 2 * setb, scratch=off["_scratch"], blocks=ceil_div(rows, rb))
    names = [s.name for s in spec.ins + spec.outs + spec.vecs]
    cap = pow2_floor(L // (2 * len(names)))
    cwb = max(64, min(cap, pow2_ceil(ceil_div(wb, 4))))
    if cwb > cap:
        raise InputError(f"{op} on {caps.name}", f"{len(names)} double-buffered column chunks of 64 bytes do not "
                         f"fit the LDM of {L} bytes", "a target with a larger LDM")
    off = {name: i * cwb for i, name in enumerate(names)}
    return "chunks", dict(cwb=cwb, wb=wb, off=off, setb=len(names) * cwb, shared=2 * len(names) * cwb,
                          blocks=rows)


def _row_kernel(spec_k: ElementwiseKernel, caps, rs: _RowSpec, team, vb_sizes: tuple, code: Callable,
                setup: Callable, tag: str = "") -> ElementwiseKernel:
    op = spec_k.op
    dt = spec_k.dtype
    es = ELEM_BYTES[dt]
    rows = int(dict(spec_k.scalars)["rows"])
    tm, geo = _row_geometry(caps, rs, rows, es, _team(team), op)
    params = tuple(b.name for b in spec_k.buffers) + tuple(n for n, _ in spec_k.scalars)

    def make(vb):
        e = LdmAsm(f"{op}_{dt}_sw_{tm}_v{vb}{tag}", params, dt, vb, geo["shared"], caps)
        _Rows(e, rs, tm, geo).emit(code, setup)
        return build_checked(e, caps), vb

    vb0 = _vec_bytes(*vb_sizes, es=es)
    prog, vb = _try_vb(make, [v for v in (16, 8, 4, 2) if es <= v <= vb0 and (v == vb0 or v >= es)])
    return _kernel(spec_k, prog, _grid_launch(caps, geo["blocks"]), tm, vb)


# ----------------------------------------------------------------------------- softmax
def _mask_vec(D, v: Reg, j: Reg, n: int) -> None:
    """Zero the elements of the vector at byte j past the kept end (causal)."""
    e = D.e
    if D.ce is None:
        return
    rem, pv = e.reg(), e.a.pred()
    e("sub.i64", rem, D.ce_rel, j)
    for i in range(n):
        e("setp.gt.i64", pv, rem, i * e.es)
        e("selp.b64", v + i, v + i, 0, pv)
    e.free(rem)
    e.a.pfree(pv)


def softmax_kernel(caps, rows: int, cols: int, dtype: str = "fp16", scale: float = 1.0, causal: bool = False,
                   q_offset: Optional[int] = None, ld: Optional[int] = None, *, q_len: Optional[int] = None,
                   team: Optional[str] = None) -> ElementwiseKernel:
    """y = softmax(scale * x) over each row of x [rows, ld] (the first cols columns), y [rows, ld]
    (columns past cols untouched); causal, q_len, q_offset, ld as ``elementwise_gpu.softmax_kernel``."""
    _target("softmax", caps)
    sk = EW.softmax_kernel(_spec(caps), rows, cols, dtype, scale, causal, q_offset, ld, q_len=q_len)
    ld = int(dict(sk.scalars)["ld"])
    rs = _RowSpec(ins=(_St("x", "x", 0, cols, ld),), outs=(_St("y", "y", 0, cols, ld),), scratch_f32=cols)
    st = {}

    def setup(D):
        e = D.e
        c = e.fparam("scale")
        e("mul.f32", c, c, LOG2E)
        st["c"] = c
        st["cols_b"] = D.wb_r

    def code(D):
        e, c = D.e, st["c"]
        D.set_kept(EW.kept_end(e, D.row, causal, st["cols_b"]) if causal else None)
        m = e.reg()
        e("mov.f32", m, -F32_MAX)

        def vmax(j, n):
            ad = e.addr(D.p["x"], j)
            v = e.load(ad, n)
            e.free(ad)
            for i in range(n):
                e("mul.f32", v + i, v + i, c)
                e("max.f32", m, m, v + i)
            e.free(v, k=n)

        D.sweep(("x",), (), vmax, kept=True)
        e.reduce([m], lambda vs, os: e("max.f32", vs[0], vs[0], os[0]), [-F32_MAX])
        s = e.reg()
        e("mov.f32", s, 0.0)
        rows_team = D.team == "rows"

        def exps(j, n, keep=True):
            ad = e.addr(D.p["x"], j)
            v = e.load(ad, n)
            for i in range(n):
                e("mul.f32", v + i, v + i, c)
                e("sub.f32", v + i, v + i, m)
                e("ex2.f32", v + i, v + i)
            if keep:
                for i in range(n):
                    e("add.f32", s, s, v + i)
            e.free(ad)
            return v

        def esum(j, n):
            v = exps(j, n)
            if rows_team:                               # e in the f32 scratch row, at 4/es x j
                ad = e.reg()
                _scale_off(e, ad, j, e.es, 4)
                e.words(_STS, v, ad, D.geo["scratch"], n, store=True)
                e.free(ad)
            e.free(v, k=n)

        D.sweep(("x",), (), esum, kept=True)
        e.reduce_sum([s])
        e("rcp.f32", s, s)
        e("min.f32", s, s, F32_MAX)                     # nothing kept (s = 0): y = 0 * MAX = 0

        def write(j, n):
            if rows_team:
                ad = e.reg()
                _scale_off(e, ad, j, e.es, 4)
                v = e.a.reg(n)
                e.words(_LDS, v, ad, D.geo["scratch"], n)
                e.free(ad)
            else:
                v = exps(j, n, keep=False)
            for i in range(n):
                e("mul.f32", v + i, v + i, s)
            _mask_vec(D, v, j, n)
            ad = e.addr(D.p["y"], j)
            e.store(ad, v, n)
            e.free(ad)
            e.free(v, k=n)

        D.sweep(("x",) if not rows_team else (), ("y",), write, kept_reads=True)
        e.free(m, s)
        if causal:
            e.free(D.ce)

    return _row_kernel(sk, caps, rs, team, (ld * ELEM_BYTES[sk.dtype],), code, setup, "_causal" if causal else "")


def softmax_grad_kernel(caps, rows: int, cols: int, dtype: str = "fp16", scale: float = 1.0, causal: bool = False,
                        q_offset: Optional[int] = None, ld: Optional[int] = None, *, q_len: Optional[int] = None,
                        team: Optional[str] = None) -> ElementwiseKernel:
    """dx = scale * P * (dP - rowsum(dP * P)) (as ``elementwise_gpu.softmax_grad_kernel``)."""
    _target("softmax_grad", caps)
    sk = EW.softmax_grad_kernel(_spec(caps), rows, cols, dtype, scale, causal, q_offset, ld, q_len=q_len)
    ld = int(dict(sk.scalars)["ld"])
    rs = _RowSpec(ins=(_St("p", "p", 0, cols, ld), _St("dp", "dp", 0, cols, ld)), outs=(_St("dx", "dx", 0, cols, ld),))
    st = {}

    def setup(D):
        st["c"] = D.e.fparam("scale")

    def code(D):
        e, c = D.e, st["c"]
        D.set_kept(EW.kept_end(e, D.row, causal, D.wb_r) if causal else None)
        acc = e.reg()
        e("mov.f32", acc, 0.0)

        def operands(j, n):
            ad = e.addr(D.p["p"], j)
            p = e.load(ad, n)
            e("add.i64", ad, D.p["dp"], j)
            d = e.load(ad, n)
            e.free(ad)
            return p, d

        def dot(j, n):
            p, d = operands(j, n)
            for i in range(n):
                e("fma.f32", acc, p + i, d + i, acc)
            e.free(p, k=n)
            e.free(d, k=n)

        D.sweep(("p", "dp"), (), dot, kept=True)
        e.reduce_sum([acc])

        def write(j, n):
            p, d = operands(j, n)
            for i in range(n):
                e("sub.f32", d + i, d + i, acc)
                e("mul.f32", d + i, d + i, p + i)
                e("mul.f32", d + i, d + i, c)
            _mask_vec(D, d, j, n)
            ad = e.addr(D.p["dx"], j)
            e.store(ad, d, n)
            e.free(ad)
            e.free(p, k=n)
            e.free(d, k=n)

        D.sweep(("p", "dp"), ("dx",), write, kept_reads=True)
        e.free(acc)
        if causal:
            e.free(D.ce)

    return _row_kernel(sk, caps, rs, team, (ld * ELEM_BYTES[sk.dtype],), code, setup, "_causal" if causal else "")


# ----------------------------------------------------------------------------- layernorm / rmsnorm
def _f32(x: float) -> float:
    return float(np.float32(x))


def _norm_fwd(sk: ElementwiseKernel, caps, rows: int, cols: int, team, ln: bool) -> ElementwiseKernel:
    vecs = (_St("gamma", "gamma", 0, cols, 0),) + ((_St("beta", "beta", 0, cols, 0),) if ln else ())
    rs = _RowSpec(ins=(_St("x", "x", 0, cols, cols),), outs=(_St("y", "y", 0, cols, cols),), vecs=vecs,
                  stats_out=("mean", "rstd") if ln else ("rstd",))
    st = {}

    def setup(D):
        st["eps"] = D.e.fparam("eps")
        st["invn"] = D.e.const(_f32(1.0 / cols))        # = rcp.f32(cols): 1/cols rounded once to f32

    def code(D):
        e, invn, eps = D.e, st["invn"], st["eps"]
        acc, rstd = e.reg(), e.reg()
        mean = e.reg() if ln else None
        e("mov.f32", acc, 0.0)

        def load_x(j, n):
            ad = e.addr(D.p["x"], j)
            v = e.load(ad, n)
            e.free(ad)
            return v

        if ln:
            def s1(j, n):
                v = load_x(j, n)
                for i in range(n):
                    e("add.f32", acc, acc, v + i)
                e.free(v, k=n)

            D.sweep(("x",), (), s1)
            e.reduce_sum([acc])
            e("mul.f32", mean, acc, invn)
            e("mov.f32", acc, 0.0)

        def s2(j, n):
            v = load_x(j, n)
            for i in range(n):
                if ln:
                    e("sub.f32", v + i, v + i, mean)
                e("fma.f32", acc, v + i, v + i, acc)
            e.free(v, k=n)

        D.sweep(("x",), (), s2)
        e.reduce_sum([acc])
        e("fma.f32", rstd, acc, invn, eps)
        e("rsqrt.f32", rstd, rstd)
        if ln:
            D.stat_out("mean", mean)
        D.stat_out("rstd", rstd)

        def out(j, n):
            v = load_x(j, n)
            ad = e.addr(D.p["gamma"], j)
            g = e.load(ad, n)
            b = None
            if ln:
                e("add.i64", ad, D.p["beta"], j)
                b = e.load(ad, n)
            for i in range(n):
                if ln:
                    e("sub.f32", v + i, v + i, mean)
                    e("mul.f32", v + i, v + i, rstd)
                    e("fma.f32", v + i, v + i, g + i, b + i)
                else:
                    e("mul.f32", v + i, v + i, rstd)
                    e("mul.f32", v + i, v + i, g + i)
            e("add.i64", ad, D.p["y"], j)
            e.store(ad, v, n)
            e.free(ad)
            for r in (v, g) + ((b,) if ln else ()):
                e.free(r, k=n)

        D.sweep(("x", "gamma") + (("beta",) if ln else ()), ("y",), out)
        e.free(acc, rstd)
        if ln:
            e.free(mean)

    return _row_kernel(sk, caps, rs, team, (cols * ELEM_BYTES[sk.dtype],), code, setup)


def layernorm_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-5, *,
                     team: Optional[str] = None) -> ElementwiseKernel:
    """y = (x - mean) * rstd * gamma + beta per row, also mean [rows] and rstd [rows] (f32), as
    ``elementwise_gpu.layernorm_kernel``: two passes for the statistics, a third writes y."""
    _target("layernorm", caps)
    return _norm_fwd(EW.layernorm_kernel(_spec(caps), rows, cols, dtype, eps), caps, rows, cols, team, True)


def rmsnorm_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-6, *,
                   team: Optional[str] = None) -> ElementwiseKernel:
    """y = x * rstd * gamma per row, rstd = 1/sqrt(mean(x^2) + eps), also rstd [rows] (f32)."""
    _target("rmsnorm", caps)
    return _norm_fwd(EW.rmsnorm_kernel(_spec(caps), rows, cols, dtype, eps), caps, rows, cols, team, False)


# ----------------------------------------------------------------------------- norm backward
def _norm_dx(sk: ElementwiseKernel, caps, rows: int, cols: int, team, ln: bool) -> ElementwiseKernel:
    rs = _RowSpec(ins=(_St("x", "x", 0, cols, cols), _St("dy", "dy", 0, cols, cols)),
                  outs=(_St("dx", "dx", 0, cols, cols),), vecs=(_St("gamma", "gamma", 0, cols, 0),),
                  stats_in=("mean", "rstd") if ln else ("rstd",))
    st = {}

    def setup(D):
        st["invn"] = D.e.const(_f32(1.0 / cols))

    def code(D):
        e, invn = D.e, st["invn"]
        rstd = D.stat_in("rstd")
        mean = D.stat_in("mean") if ln else None
        acc = [e.reg() for _ in range(2 if ln else 1)]
        for r in acc:
            e("mov.f32", r, 0.0)

        def operands(j, n):
            ad = e.addr(D.p["x"], j)
            x = e.load(ad, n)
            e("add.i64", ad, D.p["dy"], j)
            d = e.load(ad, n)
            e("add.i64", ad, D.p["gamma"], j)
            g = e.load(ad, n)
            e.free(ad)
            for i in range(n):
                e("mul.f32", d + i, d + i, g + i)
                if ln:
                    e("sub.f32", x + i, x + i, mean)
                    e("mul.f32", x + i, x + i, rstd)
            e.free(g, k=n)
            return x, d

        def sums(j, n):
            x, d = operands(j, n)
            for i in range(n):
                if ln:
                    e("add.f32", acc[0], acc[0], d + i)
                    e("fma.f32", acc[1], d + i, x + i, acc[1])
                else:
                    e("fma.f32", acc[0], d + i, x + i, acc[0])
            e.free(x, k=n)
            e.free(d, k=n)

        D.sweep(("x", "dy", "gamma"), (), sums)
        e.reduce_sum(acc)
        if ln:
            e("mul.f32", acc[0], acc[0], invn)
            e("mul.f32", acc[1], acc[1], invn)
        else:
            e("mul.f32", acc[0], acc[0], invn)
            for _ in range(3):
                e("mul.f32", acc[0], acc[0], rstd)
            e("neg.f32", acc[0], acc[0])

        def out(j, n):
            x, d = operands(j, n)
            for i in range(n):
                if ln:
                    e("fma.f32", x + i, x + i, acc[1], acc[0])
                    e("sub.f32", d + i, d + i, x + i)
                    e("mul.f32", d + i, d + i, rstd)
                else:
                    e("mul.f32", d + i, d + i, rstd)
                    e("fma.f32", d + i, x + i, acc[0], d + i)
            ad = e.addr(D.p["dx"], j)
            e.store(ad, d, n)
            e.free(ad)
            e.free(x, k=n)
            e.free(d, k=n)

        D.sweep(("x", "dy", "gamma"), ("dx",), out)
        e.free(rstd, *acc)
        if ln:
            e.free(mean)

    return _row_kernel(sk, caps, rs, team, (cols * ELEM_BYTES[sk.dtype],), code, setup)


WS_ROWS = 8                  # choice: workspace rows a step of the workspace sum fetches (DMAs in flight)
COLSUM_MIN_ROWS = 8          # choice: rows a column-sum unit sums at least (fewer: more partials to add up)


def _colsum_geometry(caps, rows: int, cols: int, es: int, nout: int) -> dict:
    """Units (column chunk c, row range q); tiles of RB rows x CW columns. CW: the whole row when
    the LDM holds it (one DMA a tile), else a power-of-two chunk (one DMA per tile row)."""
    L = caps.scratchpad_bytes
    G = caps.cores_total

    def need(cw, rb):     # acc (f32) + out staging + 2 sets of x, dy tiles and the rows' mean / rstd
        return nout * _al(cw * 4) + nout * _al(cw * es) + 2 * (2 * _al(rb * cw * es) + 2 * _al(rb * 4))

    cw = cols
    if need(cw, 1) > L:
        cw = pow2_floor(cols)
        while cw > 1 and need(cw, 1) > L:
            cw //= 2
    ncc = ceil_div(cols, cw)
    Q = max(1, min(ceil_div(G, ncc), rows // COLSUM_MIN_ROWS))
    rq = ceil_div(rows, Q)
    Q = ceil_div(rows, rq)
    rb = max(1, ceil_div(rq, CHUNKS_PER_CPE))
    while rb > 1 and need(cw, rb) > L:
        rb -= 1
    return dict(cw=cw, ncc=ncc, Q=Q, rq=rq, rb=rb)


def _units_open(e: LdmAsm, u: Reg, count) -> tuple:
    """Emits the head of a grid-stride loop over units (u from %ctaid.x): to done once u >= count;
    returns (top, done), the loop's labels."""
    a = e.a
    top, done = e.label(), e.label()
    pu = a.pred()
    a.label(top)
    e("setp.ge.i64", pu, u, count)
    e("bra", done, p=pu)
    return top, done


def _units_close(e: LdmAsm, u: Reg, ustep: Reg, top: str, done: str) -> None:
    """Emits the end of the loop over units (u += ustep, back to top), its done label and the exit."""
    e("add.i64", u, u, ustep)
    e("bra", top)
    e.a.label(done)
    e("exit")


def _zero_sums(e: LdmAsm, lane_off: Reg, frm: int, offs, cw: int) -> None:
    """Emits the zeroing of f32 partial sums of cw columns at each LDM offset of offs, lane l
    taking columns l, l+32, ... (lane_off: the lane's offset in an array of frm-byte elements)."""
    a = e.a
    j, z, pz = e.reg(), e.reg(), a.pred()
    e("mov.b64", z, 0)
    _scale_off(e, j, lane_off, frm, 4)                # lane * 4
    zl = e.label()
    a.label(zl)
    for o in offs:
        e("st.shared.b32", Mem(j, o), z)
    e("add.i64", j, j, 128)
    e("setp.lt.i64", pz, j, cw * 4)
    e("bra", zl, p=pz)
    e.free(j, z)
    a.pfree(pz)


@dataclasses.dataclass(frozen=True)
class _ColsumPlan:
    """What the column-sum program's steps read: the target, dtype and width, the geometry of
    _colsum_geometry (cw, ncc, Q, rq, rb), the LDM offsets (off: acc<o>, out<o>, x, dy and the
    statistics of set 0; setb: the bytes of a set), the parameters and the outputs."""
    caps: object
    dt: str
    ln: bool
    cols: int
    cw: int
    ncc: int
    Q: int
    rq: int
    rb: int
    off: dict
    setb: int
    shared: int
    params: tuple
    outs: tuple

    @property
    def es(self) -> int:
        return ELEM_BYTES[self.dt]

    @property
    def nout(self) -> int:
        return 2 if self.ln else 1

    @property
    def cwb(self) -> int:
        return self.cw * self.es

    @property
    def partial(self) -> bool:
        return self.Q > 1

    @property
    def stats(self) -> tuple:
        return ("mean", "rstd") if self.ln else ("rstd",)


def _colsum_kernel(caps, rows: int, cols: int, dt: str, ln: bool) -> tuple:
    """dgamma = sum_rows dy * xhat (and dbeta = sum_rows dy), xhat from x and the saved statistics.
    Unit u = (row range q = u / ncc, column chunk c = u % ncc), grid stride over units. A unit
    streams tiles of rb rows through the LDM; for each column vector of the chunk the tile's rows
    are summed in registers and added to f32 partial sums in the LDM; at the end the unit stores
    its partial sums (Q = 1: dgamma / dbeta in the storage dtype; else ws[q] in f32)."""
    es = ELEM_BYTES[dt]
    nout = 2 if ln else 1
    geo = _colsum_geometry(caps, rows, cols, es, nout)
    Q, ncc, cwb = geo["Q"], geo["ncc"], geo["cw"] * es
    partial = Q > 1
    op = "colsum_ln" if ln else "colsum_rms"
    outs = ("ws",) if partial else ("dgamma",) + (("dbeta",) if ln else ())
    bufs = (Buf("x", (rows, cols), dt), Buf("dy", (rows, cols), dt)) + ((Buf("mean", (rows,), "fp32"),) if ln else ()) \
        + (Buf("rstd", (rows,), "fp32"),)
    finals = (Buf("dgamma", (cols,), dt, True),) + ((Buf("dbeta", (cols,), dt, True),) if ln else ())
    ws = Buf("ws", (Q, nout * cols), "fp32", True, scratch=True)
    bufs = bufs + ((ws,) if partial else finals)
    scalars = (("rows", rows), ("cols", cols))
    off, setb, shared = _colsum_ldm(geo["cw"], geo["rb"], es, nout, ("mean", "rstd") if ln else ("rstd",))
    params = tuple(b.name for b in bufs) + ("rows", "cols")
    p = _ColsumPlan(caps, dt, ln, cols, **geo, off=off, setb=setb, shared=shared, params=params, outs=outs)
    prog, vb = _try_vb(lambda vb: _colsum_program(p, vb),
                       [v for v in (16, 8, 4) if v >= es and (cwb % v == 0 or ncc == 1 and cols * es % v == 0)] + [es])
    k1 = ElementwiseKernel(op=op, program=prog, launch=_grid_launch(caps, Q * ncc),
                           flops=FLOPS_PER_ELEM[op] * rows * cols,
                           dtype=dt, buffers=bufs, scalars=scalars, team="column", vector_bytes=vb)
    if not partial:
        return (k1,)
    return (k1, _ws_sum_kernel(caps, cols, Q, dt, finals))


def _colsum_ldm(cw: int, rb: int, es: int, nout: int, stats: tuple) -> tuple:
    """The column sum's LDM: acc[nout] (f32), out staging[nout] (storage dtype), then 2 sets of x,
    dy, stats tiles; returns (offsets, bytes of a set, bytes in all)."""
    cwb = cw * es
    off = {}
    pos = 0
    for o in range(nout):
        off[f"acc{o}"] = pos
        pos += _al(cw * 4)
    for o in range(nout):
        off[f"out{o}"] = pos
        pos += _al(cwb)
    base = pos
    for name in ("x", "dy"):
        off[name] = pos
        pos += _al(rb * cwb)
    for name in stats:
        off[name] = pos
        pos += _al(rb * 4)
    setb = pos - base
    return off, setb, base + 2 * setb


def _colsum_program(p: _ColsumPlan, vb: int) -> tuple:
    """(the column-sum program with vb-byte vectors, vb): a grid-stride loop over units, each
    zeroing its f32 sums, streaming its tiles (double buffered) and storing its sums."""
    e = LdmAsm(f"{'layernorm' if p.ln else 'rmsnorm'}_grad_params_{p.dt}_sw_v{vb}{'_partial' if p.partial else ''}",
               p.params, p.dt, vb, p.shared, p.caps)
    e.lanes()
    u, ustep, nunit, rows_r = e.reg(), e.reg(), e.reg(), e.reg()
    e("s2r", u, "%ctaid.x")
    e("s2r", ustep, "%nctaid.x")
    e("mov.b64", nunit, p.Q * p.ncc)
    e("ldparam", rows_r, "rows")
    top, done = _units_open(e, u, nunit)
    span = c0, clen, r0, rend = e.reg(), e.reg(), e.reg(), e.reg()
    e("rem.i64", c0, u, p.ncc)
    e("mul.i64", c0, c0, p.cwb)                       # the chunk's first column byte
    e("mov.b64", clen, p.cols * p.es)
    e("sub.i64", clen, clen, c0)
    e("min.i64", clen, clen, p.cwb)
    e("div.i64", r0, u, p.ncc)
    e("mul.i64", r0, r0, p.rq)                        # the unit's rows [r0, rend)
    e("add.i64", rend, r0, p.rq)
    e("min.i64", rend, rend, rows_r)
    _zero_sums(e, e.j0s if e.j0s is not None else e.j0v, p.es, [p.off[f"acc{o}"] for o in range(p.nout)], p.cw)
    # tiles: k = 0 .. ntiles-1 of rb rows from r0
    k, kend = e.reg(), e.reg()
    e("mov.b64", k, 0)
    e("sub.i64", kend, rend, r0)
    e("add.i64", kend, kend, p.rb - 1)
    e("div.i64", kend, kend, p.rb)
    e.pipeline(k, 1, kend, p.setb, lambda kk, boff: _colsum_gets(e, p, span, kk, boff),
               lambda kk, boff: _colsum_body(e, p, span, kk, boff), lambda kk, b: None)
    e.free(k, kend)
    _colsum_store(e, p, u, c0, clen)
    e("dma.wait", 0)                                  # the partial sums are reused by the next unit
    e.free(c0, clen, r0, rend)
    _units_close(e, u, ustep, top, done)
    return build_checked(e, p.caps), vb


def _colsum_tile(e: LdmAsm, p: _ColsumPlan, span: tuple, kk: Reg) -> tuple:
    """Emits tile kk's first row t0 and its rows nr (new registers, returned)."""
    r0, rend = span[2], span[3]
    t0, nr = e.reg(), e.reg()
    e("mul.i64", t0, kk, p.rb)
    e("add.i64", t0, t0, r0)
    e("sub.i64", nr, rend, t0)
    e("min.i64", nr, nr, p.rb)
    return t0, nr


def _colsum_gets(e: LdmAsm, p: _ColsumPlan, span: tuple, kk: Reg, boff: Reg) -> None:
    """Emits the gets of tile kk into LDM set boff: the x, dy rows of the unit's chunk (one DMA a
    tile when the chunk is the whole row, else one a row) and the rows' statistics."""
    a, es, cwb = e.a, p.es, p.cwb
    c0, clen = span[0], span[1]
    t0, nr = _colsum_tile(e, p, span, kk)
    ga, la, ln_ = e.reg(), e.reg(), e.reg()
    for name in ("x", "dy"):
        e("ldparam", ga, name)
        e("mul.i64", ln_, t0, p.cols * es)
        e("add.i64", ga, ga, ln_)
        e("add.i64", ga, ga, c0)
        e("add.i64", la, boff, p.off[name])
        if p.ncc == 1:
            e("mul.i64", ln_, nr, cwb)
            e("dma.get", Mem(la, 0), Mem(ga, 0), ln_)
        else:                                         # one row segment at a time
            i, pr = e.reg(), a.pred()
            lab = e.label()
            e("mov.b64", i, 0)
            a.label(lab)
            e("dma.get", Mem(la, 0), Mem(ga, 0), clen)
            e("add.i64", ga, ga, p.cols * es)
            e("add.i64", la, la, cwb)
            e("add.i64", i, i, 1)
            e("setp.lt.i64", pr, i, nr)
            e("bra", lab, p=pr)
            e.free(i)
            a.pfree(pr)
    for name in p.stats:
        e("ldparam", ga, name)
        e("shl.b64", ln_, t0, 2)
        e("add.i64", ga, ga, ln_)
        e("add.i64", la, boff, p.off[name])
        e("shl.b64", ln_, nr, 2)
        e("dma.get", Mem(la, 0), Mem(ga, 0), ln_)
    e.free(t0, nr, ga, la, ln_)


def _colsum_body(e: LdmAsm, p: _ColsumPlan, span: tuple, kk: Reg, boff: Reg) -> None:
    """Emits tile kk's sums: every column vector of the chunk (_colsum_col)."""
    t0, nr = _colsum_tile(e, p, span, kk)
    e.free(t0)
    e.loop(span[1], lambda jj, n: _colsum_col(e, p, boff, nr, jj, n))
    e.free(nr)


def _colsum_col(e: LdmAsm, p: _ColsumPlan, boff: Reg, nr: Reg, jj: Reg, n: int) -> None:
    """Emits the sums of column vector jj (n elements) over the tile's nr rows in LDM set boff,
    added to the f32 partial sums: dy * (x - mean) * rstd (and dy)."""
    a, es, ln, nout, off = e.a, p.es, p.ln, p.nout, p.off
    accs = []
    sj = e.reg()                                      # f32 offset of the vector: j * 4 / es
    _scale_off(e, sj, jj, es, 4)
    for o in range(nout):
        r = e.a.reg(n)
        e.words(_LDS, r, sj, off[f"acc{o}"], n)
        accs.append(r)
    rr, px, ps, pr = e.reg(), e.reg(), e.reg(), a.pred()
    e("mov.b64", rr, 0)
    e("add.i64", px, boff, jj)
    e("mov.b64", ps, boff)
    lab = e.label()
    a.label(lab)
    x = e.load(px, n, off=off["x"])
    d = e.load(px, n, off=off["dy"])
    rs_ = e.reg()
    e("ld.shared.b32", rs_, Mem(ps, off["rstd"]))
    mu = None
    if ln:
        mu = e.reg()
        e("ld.shared.b32", mu, Mem(ps, off["mean"]))
    for i in range(n):
        if ln:
            e("sub.f32", x + i, x + i, mu)
        e("mul.f32", x + i, x + i, rs_)
        e("fma.f32", accs[0] + i, d + i, x + i, accs[0] + i)
        if ln:
            e("add.f32", accs[1] + i, accs[1] + i, d + i)
    e.free(x, k=n)
    e.free(d, k=n)
    e.free(rs_)
    if ln:
        e.free(mu)
    e("add.i64", px, px, p.cwb)
    e("add.i64", ps, ps, 4)
    e("add.i64", rr, rr, 1)
    e("setp.lt.i64", pr, rr, nr)
    e("bra", lab, p=pr)
    for o in range(nout):
        e.words(_STS, accs[o], sj, off[f"acc{o}"], n, store=True)
        e.free(accs[o], k=n)
    e.free(sj, rr, px, ps)
    a.pfree(pr)


def _colsum_store(e: LdmAsm, p: _ColsumPlan, u: Reg, c0: Reg, clen: Reg) -> None:
    """Emits the puts of the unit's sums: Q > 1, the f32 sums into ws[q, o*cols + column]; else
    converted to the storage dtype into dgamma (dbeta)."""
    es, nout, cols, off = p.es, p.nout, p.cols, p.off
    ga, la = e.reg(), e.reg()
    if p.partial:                                     # ws[q, o*cols + column] in f32
        q = e.reg()
        e("div.i64", q, u, p.ncc)
        e("mul.i64", q, q, nout * cols * 4)
        _scale_off(e, la, clen, es, 4)   # f32 bytes
        for o in range(nout):
            e("ldparam", ga, "ws")
            e("add.i64", ga, ga, q)
            t = e.reg()
            _scale_off(e, t, c0, es, 4)
            e("add.i64", ga, ga, t)
            e("mov.b64", t, off[f"acc{o}"])
            e("dma.put", Mem(ga, o * cols * 4), Mem(t, 0), la)
            e.free(t)
        e.free(q)
    else:                                             # convert to the storage dtype, then put
        def conv(jj, n):
            sj = e.reg()
            _scale_off(e, sj, jj, es, 4)
            for o in range(nout):
                r = e.a.reg(n)
                e.words(_LDS, r, sj, off[f"acc{o}"], n)
                e.store(jj, r, n, off=off[f"out{o}"])
                e.free(r, k=n)
            e.free(sj)

        e.loop(clen, conv)
        for o, name in enumerate(p.outs):
            e("ldparam", ga, name)
            e("add.i64", ga, ga, c0)
            e("mov.b64", la, off[f"out{o}"])
            e("dma.put", Mem(ga, 0), Mem(la, 0), clen)
    e.free(ga, la)


@dataclasses.dataclass(frozen=True)
class _WsPlan:
    """What the workspace sum's steps read: the target, dtype and width, the outputs (finals), and
    the geometry: chunks of cw f32 columns (ncc of them), R ws rows a step; LDM: the f32 sums at 0,
    the output staging at off_out, two sets of R row chunks (rowl bytes each) from base."""
    caps: object
    dt: str
    cols: int
    finals: tuple
    cw: int
    ncc: int
    R: int

    @property
    def es(self) -> int:
        return ELEM_BYTES[self.dt]

    @property
    def nout(self) -> int:
        return len(self.finals)

    @property
    def off_out(self) -> int:
        return _al(self.cw * 4)

    @property
    def base(self) -> int:
        return _al(self.cw * 4) + _al(self.cw * self.es)

    @property
    def rowl(self) -> int:
        """LDM bytes of one ws row's chunk."""
        return _al(self.cw * 4)

    @property
    def setb(self) -> int:
        return self.R * self.rowl


def _ws_sum_kernel(caps, cols: int, Q: int, dt: str, finals: tuple) -> ElementwiseKernel:
    """dgamma (dbeta) = the Q partial sums of ws [Q, nout*cols] (f32) added up. Unit u = (output
    o, column chunk c); a unit streams the chunk of the ws rows through the LDM, WS_ROWS rows a
    step (one DMA a row, the steps double buffered), adds them to f32 sums in the LDM, converts and
    puts the chunk."""
    es = ELEM_BYTES[dt]
    nout = len(finals)
    G = caps.cores_total
    L = caps.scratchpad_bytes
    cw = max(32, pow2_ceil(ceil_div(nout * cols, G)))  # f32 columns of a chunk
    cw = min(cw, pow2_floor(cols))
    while cw > 32 and cw * 4 + cw * es + 2 * cw * 4 + 3 * ALIGN > L:
        cw //= 2
    ncc = ceil_div(cols, cw)
    R = min(WS_ROWS, Q)
    while R > 1 and _al(cw * 4) + _al(cw * es) + 2 * R * _al(cw * 4) > L:
        R //= 2
    prog, vb = _ws_sum_program(_WsPlan(caps, dt, cols, finals, cw, ncc, R), 4)
    ws = Buf("ws", (Q, nout * cols), "fp32", False, scratch=True)
    return ElementwiseKernel(op="colsum_chunks", program=prog, launch=_grid_launch(caps, nout * ncc),
                             flops=FLOPS_PER_ELEM["colsum_chunks"] * nout * cols * Q, dtype=dt, buffers=(ws,) + finals,
                             scalars=(("cols", cols), ("chunks", Q)), team="column", vector_bytes=4)


def _ws_sum_program(p: _WsPlan, vb: int) -> tuple:
    """(the workspace-sum program with vb-byte vectors, vb): a grid-stride loop over units (o, c),
    each zeroing its f32 sums, streaming its ws rows (double buffered), converting and putting."""
    shared = p.base + 2 * p.setb
    params = ("ws",) + tuple(b.name for b in p.finals) + ("cols", "chunks")
    e = LdmAsm(f"grad_params_sum_{p.dt}_{p.nout}_sw_v{vb}", params, p.dt, vb, shared, p.caps)
    e.lanes()
    u, ustep = e.reg(), e.reg()
    e("s2r", u, "%ctaid.x")
    e("s2r", ustep, "%nctaid.x")
    top, done = _units_open(e, u, p.nout * p.ncc)
    o, c0, clen = e.reg(), e.reg(), e.reg()
    e("div.i64", o, u, p.ncc)
    e("rem.i64", c0, u, p.ncc)
    e("mul.i64", c0, c0, p.cw)                        # first column of the chunk
    e("mov.b64", clen, p.cols)
    e("sub.i64", clen, clen, c0)
    e("min.i64", clen, clen, p.cw)                    # columns
    _zero_sums(e, e.j0v, vb, (0,), p.cw)
    k, kend, nq_all = e.reg(), e.reg(), e.reg()
    e("mov.b64", k, 0)
    e("ldparam", nq_all, "chunks")
    e("add.i64", kend, nq_all, p.R - 1)
    e("div.i64", kend, kend, p.R)                     # steps of R ws rows
    span = (o, c0, clen, nq_all)
    e.pipeline(k, 1, kend, p.setb, lambda kk, boff: _ws_gets(e, p, span, kk, boff),
               lambda kk, boff: _ws_body(e, p, span, kk, boff, vb), lambda kk, b: None)
    e.free(k, kend, nq_all)
    ad = _ws_convert(e, p, clen, vb)
    _ws_put(e, p, o, c0, clen, ad)
    e.free(o, c0, clen)
    _units_close(e, u, ustep, top, done)
    return build_checked(e, p.caps), vb


def _ws_rows(e: LdmAsm, p: _WsPlan, nq_all: Reg, kk: Reg) -> tuple:
    """Emits step kk's first ws row q0 and its rows nq (new registers, returned)."""
    q0, nq = e.reg(), e.reg()
    e("mul.i64", q0, kk, p.R)
    e("sub.i64", nq, nq_all, q0)
    e("min.i64", nq, nq, p.R)
    return q0, nq


def _ws_gets(e: LdmAsm, p: _WsPlan, span: tuple, kk: Reg, boff: Reg) -> None:
    """Emits the gets of step kk into LDM set boff: the unit's chunk of each of its ws rows."""
    a, nout, cols = e.a, p.nout, p.cols
    o, c0, clen, nq_all = span
    q0, nq = _ws_rows(e, p, nq_all, kk)
    ga, la, ln_, i, pr = e.reg(), e.reg(), e.reg(), e.reg(), a.pred()
    e("ldparam", ga, "ws")
    e("mul.i64", ln_, q0, nout * cols * 4)
    e("add.i64", ga, ga, ln_)
    e("mul.i64", ln_, o, cols * 4)
    e("add.i64", ga, ga, ln_)
    e("shl.b64", ln_, c0, 2)
    e("add.i64", ga, ga, ln_)
    e("add.i64", la, boff, p.base)
    e("shl.b64", ln_, clen, 2)
    e("mov.b64", i, 0)
    lab = e.label()
    a.label(lab)
    e("dma.get", Mem(la, 0), Mem(ga, 0), ln_)
    e("add.i64", ga, ga, nout * cols * 4)
    e("add.i64", la, la, p.rowl)
    e("add.i64", i, i, 1)
    e("setp.lt.i64", pr, i, nq)
    e("bra", lab, p=pr)
    e.free(q0, nq, ga, la, ln_, i)
    a.pfree(pr)


def _ws_body(e: LdmAsm, p: _WsPlan, span: tuple, kk: Reg, boff: Reg, vb: int) -> None:
    """Emits step kk's sums: the step's rows of the chunk in LDM set boff added, in order, to the
    f32 sums (lane l: f32 columns l, l+32, ...)."""
    a, clen, nq_all = e.a, span[2], span[3]
    q0, nq = _ws_rows(e, p, nq_all, kk)
    e.free(q0)
    nb, jj, pj = e.reg(), e.reg(), a.pred()
    e("shl.b64", nb, clen, 2)
    lab, end = e.label(), e.label()
    _scale_off(e, jj, e.j0v, vb, 4)
    a.label(lab)                                      # lane l: f32 columns l, l+32, ...
    e("setp.ge.i64", pj, jj, nb)
    e("bra", end, p=pj)
    v, w, ad, i, pi = e.reg(), e.reg(), e.reg(), e.reg(), a.pred()
    e("add.i64", ad, jj, boff)
    e("ld.shared.b32", w, Mem(jj, 0))
    e("mov.b64", i, 0)
    rl = e.label()
    a.label(rl)                                       # the step's rows, in order
    e("ld.shared.b32", v, Mem(ad, p.base))
    e("add.f32", w, w, v)
    e("add.i64", ad, ad, p.rowl)
    e("add.i64", i, i, 1)
    e("setp.lt.i64", pi, i, nq)
    e("bra", rl, p=pi)
    e("st.shared.b32", Mem(jj, 0), w)
    e.free(v, w, ad, i)
    a.pfree(pi)
    e("add.i64", jj, jj, 128)
    e("bra", lab)
    a.label(end)
    e.free(nb, jj, nq)
    a.pfree(pj)


def _ws_convert(e: LdmAsm, p: _WsPlan, clen: Reg, vb: int) -> Reg:
    """Emits the conversion of the chunk's f32 sums to the storage dtype at off_out; returns a
    register (free for the put) that held the element offsets."""
    a, es = e.a, p.es
    jj, v, ad, pj = e.reg(), e.reg(), e.reg(), a.pred()
    _scale_off(e, jj, e.j0v, vb, 4)
    nb = e.reg()
    e("shl.b64", nb, clen, 2)
    lab, end = e.label(), e.label()
    a.label(lab)
    e("setp.ge.i64", pj, jj, nb)
    e("bra", end, p=pj)
    e("ld.shared.b32", v, Mem(jj, 0))
    _scale_off(e, ad, jj, 4, es)
    if p.dt == "fp32":
        e("st.shared.b32", Mem(ad, p.off_out), v)
    else:
        e(CVT_OUT[p.dt], v, v, v)
        e("st.shared.b16", Mem(ad, p.off_out), v)
    e("add.i64", jj, jj, 128)
    e("bra", lab)
    a.label(end)
    e.free(jj, v, nb)
    a.pfree(pj)
    return ad


def _ws_put(e: LdmAsm, p: _WsPlan, o: Reg, c0: Reg, clen: Reg, ad: Reg) -> None:
    """Emits the put of the converted chunk into output o (its base by a branch-free select) and
    the wait for it; frees ad."""
    a, es = e.a, p.es
    ga = e.reg()
    for i, b in enumerate(p.finals):                  # the output o names: branch-free select
        t = e.reg()
        e("ldparam", t, b.name)
        if i == 0:
            e("mov.b64", ga, t)
        else:
            pr = a.pred()
            e("setp.eq.i64", pr, o, i)
            e("selp.b64", ga, t, ga, pr)
            a.pfree(pr)
        e.free(t)
    e("mul.i64", ad, c0, es)
    e("add.i64", ga, ga, ad)
    e("mov.b64", ad, p.off_out)
    e("mul.i64", clen, clen, es)
    e("dma.put", Mem(ga, 0), Mem(ad, 0), clen)
    e("dma.wait", 0)
    e.free(ga, ad)


def _norm_grad(op: str, caps, rows: int, cols: int, dtype, eps, team, ln: bool) -> KernelChain:
    _target(op, caps)
    fn = EW.layernorm_grad_kernel if ln else EW.rmsnorm_grad_kernel
    sc = fn(_spec(caps), rows, cols, dtype, eps)
    k1 = _norm_dx(sc.kernels[0], caps, rows, cols, team, ln)
    return KernelChain(op=op, kernels=(k1,) + _colsum_kernel(caps, rows, cols, sc.dtype, ln), dtype=sc.dtype,
                       draw_inputs=sc.draw_inputs, ref_outputs=sc.ref_outputs)


def layernorm_grad_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-5, *,
                          team: Optional[str] = None) -> KernelChain:
    """Layernorm backward: (1) dx [rows, cols] from x, dy, gamma, mean, rstd; (2) dgamma, dbeta
    (column sums; (3) the workspace's partial sums added up when the rows are split)."""
    return _norm_grad("layernorm_grad", caps, rows, cols, dtype, eps, team, True)


def rmsnorm_grad_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-6, *,
                        team: Optional[str] = None) -> KernelChain:
    """RMSNorm backward: (1) dx; (2) dgamma = sum_rows dy * x * rstd (and (3) as layernorm's)."""
    return _norm_grad("rmsnorm_grad", caps, rows, cols, dtype, eps, team, False)


# ----------------------------------------------------------------------------- SwiGLU
def _swiglu(sk: ElementwiseKernel, caps, rows: int, ffn: int, team, grad: bool) -> ElementwiseKernel:
    if grad:
        rs = _RowSpec(ins=(_St("g", "x", 0, ffn, 2 * ffn), _St("u", "x", ffn, ffn, 2 * ffn),
                           _St("dy", "dy", 0, ffn, ffn)),
                      outs=(_St("dg", "dx", 0, ffn, 2 * ffn), _St("du", "dx", ffn, ffn, 2 * ffn)))
    else:
        rs = _RowSpec(ins=(_St("g", "x", 0, ffn, 2 * ffn), _St("u", "x", ffn, ffn, 2 * ffn)),
                      outs=(_St("y", "y", 0, ffn, ffn),))

    def setup(D):
        D.e.const(1.0)
        D.e.const(0.5)

    def code(D):
        e = D.e
        one = e.const(1.0)

        def elem(j, n):
            ad = e.addr(D.p["g"], j)
            g = e.load(ad, n)
            e("add.i64", ad, D.p["u"], j)
            u = e.load(ad, n)
            s = e.reg()
            if not grad:
                for i in range(n):
                    EW.sigmoid(e, g + i, s)
                    e("mul.f32", g + i, g + i, s)
                    e("mul.f32", g + i, g + i, u + i)
                e("add.i64", ad, D.p["y"], j)
                e.store(ad, g, n)
            else:
                e("add.i64", ad, D.p["dy"], j)
                d = e.load(ad, n)
                w = e.reg()
                for i in range(n):
                    EW.sigmoid(e, g + i, s)
                    e("mul.f32", w, g + i, s)
                    e("mul.f32", u + i, u + i, d + i)
                    e("mul.f32", d + i, d + i, w)
                    e("sub.f32", g + i, one, s)
                    e("fma.f32", g + i, w, g + i, s)
                    e("mul.f32", g + i, g + i, u + i)
                e("add.i64", ad, D.p["dg"], j)
                e.store(ad, g, n)
                e("add.i64", ad, D.p["du"], j)
                e.store(ad, d, n)
                e.free(w)
                e.free(d, k=n)
            e.free(ad, s)
            e.free(g, k=n)
            e.free(u, k=n)

        D.sweep(("g", "u") + (("dy",) if grad else ()), ("dg", "du") if grad else ("y",), elem)

    es = ELEM_BYTES[sk.dtype]
    return _row_kernel(sk, caps, rs, team, (ffn * es,), code, setup)


def swiglu_kernel(caps, rows: int, ffn: int, dtype: str = "fp16", *, team: Optional[str] = None) -> ElementwiseKernel:
    """y [rows, ffn] = silu(gate) * up with x [rows, 2 ffn] = [gate | up]."""
    _target("swiglu", caps)
    return _swiglu(EW.swiglu_kernel(_spec(caps), rows, ffn, dtype), caps, rows, ffn, team, False)


def swiglu_grad_kernel(caps, rows: int, ffn: int, dtype: str = "fp16", *,
                       team: Optional[str] = None) -> ElementwiseKernel:
    """dx [rows, 2 ffn] = [dy * up * silu'(gate) | dy * silu(gate)]."""
    _target("swiglu_grad", caps)
    return _swiglu(EW.swiglu_grad_kernel(_spec(caps), rows, ffn, dtype), caps, rows, ffn, team, True)


# ----------------------------------------------------------------------------- mixture of experts
# The routing, dispatch and combine kernels (and their backward) are the GPU module's programs at one
# warp a thread block, so a block is one CPE (its lanes the vector), launched spread over the core
# groups. They move their data by ld.global / st.global, each access a round trip through the
# memory system, not by DMA through the LDM as the kernels above do: what a port without hand-made
# DMA staging costs on the CPEs. (The experts' GEMMs are the Sunway GEMM, batched.)
def _spread(k):
    """A kernel (or a chain's kernels) launched spread over the core groups."""
    if isinstance(k, KernelChain):
        return dataclasses.replace(k, kernels=tuple(_spread(x) for x in k.kernels))
    return dataclasses.replace(k, launch=dataclasses.replace(k.launch, spread=True))


def _lanes(caps) -> int:
    if caps.family != "sunway":
        raise InputError(f"moe kernel on {caps.name}", f"a {caps.family} machine", "a sunway-family machine")
    return caps.warp_width


def moe_topk_kernel(caps, tokens: int, experts: int, top_k: int, dtype: str = "fp16") -> ElementwiseKernel:
    """Softmax and top-k of each token's gate logits (EW.moe_topk_kernel, a CPE a block)."""
    return _spread(EW.moe_topk_kernel(caps, tokens, experts, top_k, dtype, threads=_lanes(caps)))


def moe_assign_kernel(caps, tokens: int, experts: int, top_k: int, capacity: int) -> ElementwiseKernel:
    """Each expert's slots in priority order (EW.moe_assign_kernel, a CPE an expert)."""
    return _spread(EW.moe_assign_kernel(caps, tokens, experts, top_k, capacity, threads=_lanes(caps)))


def moe_dispatch_kernel(caps, tokens: int, hidden: int, slots: int, dtype: str = "fp16") -> ElementwiseKernel:
    return _spread(EW.moe_dispatch_kernel(caps, tokens, hidden, slots, dtype, threads=_lanes(caps)))


def moe_combine_kernel(caps, tokens: int, hidden: int, top_k: int, slots: int, dtype: str = "fp16",
                       weighted: bool = True) -> ElementwiseKernel:
    return _spread(EW.moe_combine_kernel(caps, tokens, hidden, top_k, slots, dtype, weighted, threads=_lanes(caps)))


def moe_combine_grad_kernel(caps, tokens: int, hidden: int, top_k: int, slots: int,
                            dtype: str = "fp16") -> KernelChain:
    return _spread(EW.moe_combine_grad_kernel(caps, tokens, hidden, top_k, slots, dtype, threads=_lanes(caps)))


def moe_route_grad_kernel(caps, tokens: int, experts: int, top_k: int, dtype: str = "fp16") -> ElementwiseKernel:
    return _spread(EW.moe_route_grad_kernel(caps, tokens, experts, top_k, dtype, threads=_lanes(caps)))


__all__ += ["moe_assign_kernel", "moe_combine_grad_kernel", "moe_combine_kernel", "moe_dispatch_kernel",
            "moe_route_grad_kernel", "moe_topk_kernel"]
