"""Elementwise and row-reduction kernels of a transformer block, for the GPU family.

    caps = capabilities(load_machine("a100"))
    k = softmax_kernel(caps, rows=b * n * s, cols=s, dtype="fp16", scale=d ** -0.5, causal=True, q_len=s)
    bufs = k.random_inputs(seed=0)                    # {"x": ..., "y": zeros}
    res = run_functional(k.program, k.args(**bufs), k.launch, warp_width=32)
    ref = k.reference(**bufs)                         # {"y": float64}

Forward: ``softmax_kernel``, ``layernorm_kernel``, ``rmsnorm_kernel``, ``gelu_kernel``,
``swiglu_kernel``, ``add_kernel``. Backward: ``softmax_grad_kernel``, ``layernorm_grad_kernel``,
``rmsnorm_grad_kernel`` (each a ``KernelChain``: dx per row, then the dgamma /
dbeta column sums), ``gelu_grad_kernel``, ``swiglu_grad_kernel``. Each returns an
``ElementwiseKernel``: the program, its launch, nominal ``flops``, ``buffers`` (name, shape,
storage dtype, written or not, in parameter order), ``args(**buffers)``, ``random_inputs(seed)``,
``reference(**inputs)`` (float64 from the buffers' exact values) and ``buffer_bytes()``.

Storage dtypes fp16, bf16 (uint16 bit patterns, as everywhere in archsim) and fp32; every value is
converted to f32 on load and the math runs in f32 (MUFU ex2, tanh, rcp, rsqrt); results are
rounded once to the storage dtype on the store. Saved statistics (mean, rstd) are f32.

How the kernels are written (the way a CUDA programmer writes them):

- Row kernels (softmax, norms, their gradients, SwiGLU) give each row a *team*: one warp (rows of
  up to 1024 elements, 4 warps a block, so a block has 4 rows in flight) or a whole block of 128
  or 256 threads (longer rows, or too few rows to fill the machine with warps). Team thread t
  takes vector t, t+T, t+2T, ... of the row (T = 32 or the block size), then one scalar element of
  the row's tail (cols mod V). Vectors are 16 bytes when the row stride allows (8 fp16/bf16 or 4
  fp32 per ld.global.v4.b32), else the widest of 8 / 4 / 2 bytes that keeps every row aligned.
- Team reductions: a butterfly of shfl.bfly.b64 (masks 16 .. 1) gives every lane the warp's
  value; a block team then writes one partial per warp to shared memory, bar.sync, and every
  warp reads the partials back and runs the butterfly again. Two alternating sets of slots keep
  consecutive reductions apart with one barrier each (an odd number of reductions per row gets
  one more barrier at the end of the row).
- The grid is capped at what the machine holds at once (cores x resident blocks) and every team
  loops over rows (flat kernels: over vectors) with a grid stride, so the program's size does not
  depend on the shape: rows, cols and the other sizes are kernel parameters; only the vector width
  (the shape's alignment class), the team kind, the dtype and the causal flag select the program.
  Float scalars (scale, eps) are parameters holding f32 bit patterns.
- Softmax is the online (single pass) normalizer: each lane keeps a running max m and sum s of
  2^(t - m) over t = x * scale * log2(e) (log2 e folded into the scale, so the exponential is
  one ex2), rescaling s by 2^(m_old - m_new) once per vector; lanes and warps combine (m, s) pairs
  the same way. m starts at -FLT_MAX, not -inf, so -inf scores (an additive mask) give 2^-inf = 0
  and never -inf - -inf = NaN; a row of only -inf scores is written as zeros. A second pass
  writes y = 2^(t - m) / s. Causal masking: row r is query
  i = r mod q_len and keeps columns j <= i + q_offset (q_offset defaults to kv_len - q_len, a query
  block at the end of the key sequence); the first pass reads only the kept columns, the second
  writes zeros past them without loading (a row with no kept column is all zeros).
- Layernorm is two-pass (mean, then the sum of squared deviations from it: exact where
  E[x^2] - mean^2 cancels), then a third pass writes y; the row is re-read from L1/L2, not kept in
  registers (any row length). Forward norms also write the per-row statistics the backward pass
  reads (mean and rstd for layernorm, rstd for rmsnorm), as training frameworks do.
- Norm backward: kernel 1 (row team) dx = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat))
  (rmsnorm: rstd * g*dy - x * rstd^3 * mean(g*dy*x)); kernel 2 (atomics-free column sums): a block
  of up to 16 warps owns 32*V columns, warp w sums rows w, w+16, ... in registers, the partials
  meet in shared memory and warp 0 writes dgamma (and dbeta) in the storage dtype. When the
  column tiles cannot fill the machine the rows are split into chunks as well: f32 partials go to
  a workspace ``ws`` [chunks, nout*cols] (a ``scratch`` buffer of the chain) and a third kernel
  adds the chunks.

Tolerances the tests hold them to are stated in tests/test_emit_elementwise.py.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Mem, Pred, Reg
from archsim.isa.check import check
from archsim.isa.program import Launch, Program

from .common import (BUF_BYTES, BUF_HOST, CVT_IN, CVT_OUT, DTYPE_ALIASES, ELEM_BYTES, HOST_DTYPE, MASK_DTYPE, Asm,
                     blocks_per_core, ceil_div, log2, widen_halves)
from .gemm_gpu import to_float, to_host
from ..reference import HASH_MUL, HASH_SHIFT, M32, dropout_keep, dropout_scale

__all__ = ["Buf", "ElementwiseKernel", "KernelChain", "chunk_sum_kernel", "softmax_kernel", "softmax_grad_kernel",
           "layernorm_kernel", "layernorm_grad_kernel", "rmsnorm_kernel", "rmsnorm_grad_kernel", "gelu_kernel",
           "gelu_grad_kernel", "swiglu_kernel", "swiglu_grad_kernel", "add_kernel"]

_LD = {4: "ld.global.b32", 8: "ld.global.v2.b32", 16: "ld.global.v4.b32"}
_ST = {2: "st.global.b16", 4: "st.global.b32", 8: "st.global.v2.b32", 16: "st.global.v4.b32"}

LOG2E = 1.4426950408889634
F32_MAX = 3.4028234663852886e38
GELU_K = math.sqrt(2.0 / math.pi)     # tanh-approximation GELU (GPT-2): 0.5x(1 + tanh(K(x + A x^3)))
GELU_A = 0.044715
WARP_ROW_MAX_COLS = 1024              # longer rows get a block per row
COLSUM_WARPS = 16                     # warps of a dgamma / dbeta column-sum block (at most)

# nominal flops per element (the element-wise math of the kernel body; per-row and per-vector
# work such as reductions and rescales is not counted)
FLOPS_PER_ELEM = {"softmax": 5, "softmax_grad": 4, "layernorm": 8, "rmsnorm": 4, "layernorm_grad": 11,
                  "rmsnorm_grad": 7, "gelu": 9, "gelu_grad": 18, "swiglu": 6, "swiglu_grad": 11, "add": 1,
                  "relu": 1, "relu_grad": 1, "adamw": 14, "grad_accum": 1, "cast": 0, "dropout": 1, "dropout_add": 2,
                  "dropout_grad": 1,
                  "colsum_ln": 5, "colsum_rms": 3, "colsum_chunks": 1}


def unpack_bytes(a, v: Reg, raw: Reg, n: int) -> None:
    """Registers v..v+n-1 = the n bytes packed in the words raw.. (each word's low byte first)."""
    for i in range(n):
        a("shr.u64", v + i, raw + i // 4, 8 * (i % 4))
        a("and.b64", v + i, v + i, 0xFF)


def pack_bytes(a, pk: Reg, v: Reg, n: int) -> None:
    """Words pk.. = the bytes in registers v..v+n-1 (0 / 1 each), four a word, low byte first."""
    t = a.reg()
    for w in range(n // 4):
        a("mov.b64", pk + w, v + 4 * w)
        for b in range(1, 4):
            a("shl.b64", t, v + 4 * w + b, 8 * b)
            a("or.b64", pk + w, pk + w, t)
    a.free(t)


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


# ----------------------------------------------------------------------------- kernel objects
@dataclass(frozen=True)
class Buf:
    """One buffer parameter: name, shape, storage dtype (fp16 | bf16 | fp32, or i32 for indices), written
    by the kernel."""

    name: str
    shape: tuple
    dtype: str
    out: bool = False
    scratch: bool = False        # a workspace between the kernels of a chain (not a result)

    @property
    def host_dtype(self):
        return np.dtype(BUF_HOST[self.dtype])

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * BUF_BYTES[self.dtype]


@dataclass(frozen=True)
class ElementwiseKernel:
    """One emitted elementwise / row kernel: program, launch and what it computes."""

    op: str                      # softmax, layernorm, ..., colsum_ln (dgamma/dbeta of a chain)
    program: Program
    launch: Launch
    flops: int                   # nominal (FLOPS_PER_ELEM x elements)
    dtype: str                   # storage dtype: fp16 | bf16 | fp32
    buffers: tuple               # Buf, in parameter order
    scalars: tuple               # (param, value) of the integer parameters (f32 ones as bit patterns)
    team: str                    # warp | block (row kernels), thread (flat), column (column sums)
    vector_bytes: int            # bytes per lane per load of the main loop
    draw_inputs: Callable = field(compare=False, repr=False, default=None)   # rng -> input arrays by name
    ref_outputs: Callable = field(compare=False, repr=False, default=None)   # float64 inputs -> outputs

    @property
    def inputs(self) -> tuple:
        return tuple(b for b in self.buffers if not b.out)

    @property
    def outputs(self) -> tuple:
        return tuple(b for b in self.buffers if b.out)

    def buffer_bytes(self) -> dict:
        """Bytes of each buffer (for ``Unbacked(nbytes)`` in timing runs)."""
        return {b.name: b.nbytes for b in self.buffers}

    def args(self, *arrays, **named) -> dict:
        """Kernel arguments: the buffers in parameter order or by name (numpy arrays of the right
        shape and dtype, or anything with ``nbytes`` such as the timing engine's ``Unbacked``),
        plus the scalar parameters."""
        if len(arrays) > len(self.buffers):
            raise InputError(f"{self.op} kernel", f"{len(arrays)} buffers given",
                             "buffers: " + ", ".join(b.name for b in self.buffers))
        got = dict(zip((b.name for b in self.buffers), arrays))
        for k, v in named.items():
            if k not in {b.name for b in self.buffers} or k in got:
                raise InputError(f"{self.op} kernel", f"unexpected or repeated buffer {k!r}",
                                 "buffers: " + ", ".join(b.name for b in self.buffers))
            got[k] = v
        out = {}
        for b in self.buffers:
            if b.name not in got:
                raise InputError(f"{self.op} kernel", f"no buffer {b.name!r}",
                                 "buffers: " + ", ".join(bb.name for bb in self.buffers))
            v = got[b.name]
            if isinstance(v, np.ndarray):
                if v.shape != tuple(b.shape) or v.dtype != b.host_dtype or not v.flags.c_contiguous:
                    raise InputError(f"{self.op} kernel", f"{b.name} is {v.dtype}{list(v.shape)}",
                                     f"a C-contiguous {b.host_dtype}{list(b.shape)} array")
            elif int(getattr(v, "nbytes", -1)) < b.nbytes:
                raise InputError(f"{self.op} kernel", f"{b.name} has {getattr(v, 'nbytes', None)} bytes",
                                 f"at least {b.nbytes}")
            out[b.name] = v
        out.update(dict(self.scalars))
        return out

    def random_inputs(self, seed: int = 0) -> dict:
        """Every buffer by name: inputs drawn for the op (in the storage format), outputs zeros."""
        rng = np.random.default_rng(seed)
        ins = self.draw_inputs(rng)
        out = {}
        for b in self.buffers:
            out[b.name] = ins[b.name] if b.name in ins else np.zeros(b.shape, b.host_dtype)
        return out

    def reference(self, **bufs) -> dict:
        """The outputs in float64, computed from the exact values of the input buffers."""
        vals = {b.name: to_float(bufs[b.name], b.dtype) for b in self.inputs}
        return self.ref_outputs(vals)


@dataclass(frozen=True)
class KernelChain:
    """Kernels run one after the other on shared buffers (a norm's backward: dx, then dgamma/dbeta)."""

    op: str
    kernels: tuple
    dtype: str
    draw_inputs: Callable = field(compare=False, repr=False, default=None)   # rng -> input arrays by name
    ref_outputs: Callable = field(compare=False, repr=False, default=None)   # float64 inputs -> outputs

    @property
    def buffers(self) -> tuple:
        seen = {}
        for k in self.kernels:
            for b in k.buffers:
                seen.setdefault(b.name, b)
        outs = {b.name for k in self.kernels for b in k.outputs}
        return tuple(Buf(b.name, b.shape, b.dtype, b.name in outs, b.scratch) for b in seen.values())

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    def buffer_bytes(self) -> dict:
        return {b.name: b.nbytes for b in self.buffers}

    def args_for(self, i: int, **bufs) -> dict:
        """The arguments of kernel i, taken by name from one dict of buffers (in a functional run,
        build them after kernel i-1 ran: its outputs are kernel i's inputs)."""
        k = self.kernels[i]
        return k.args(**{b.name: bufs[b.name] for b in k.buffers})

    def random_inputs(self, seed: int = 0) -> dict:
        rng = np.random.default_rng(seed)
        ins = self.draw_inputs(rng)
        return {b.name: ins[b.name] if b.name in ins else np.zeros(b.shape, b.host_dtype) for b in self.buffers}

    def reference(self, **bufs) -> dict:
        vals = {b.name: to_float(bufs[b.name], b.dtype) for b in self.buffers if not b.out}
        return self.ref_outputs(vals)


# ----------------------------------------------------------------------------- validation
def _dtype(op: str, dtype) -> str:
    if not isinstance(dtype, str) or dtype.lower() not in DTYPE_ALIASES:
        raise InputError(op, f"unknown dtype {dtype!r}", "fp16, bf16, fp32")
    return DTYPE_ALIASES[dtype.lower()]


def _pos(op: str, **sizes) -> None:
    for k, v in sizes.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InputError(op, f"{k} = {v!r}", f"{k} an integer >= 1")


def _target(op: str, caps) -> None:
    if caps.family != "gpu" or caps.warp_width != 32:
        raise InputError(f"{op} on {caps.name}", f"the GPU elementwise emitter needs a gpu-family target with "
                         f"32-wide warps, not {caps.family} with {caps.warp_width}", "a gpu-family machine")


def _finite(op: str, name: str, v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = float("nan")
    if not math.isfinite(f) or abs(f) > 3.4e38:
        raise InputError(op, f"{name} = {v!r}", f"{name} a finite f32 number")
    return f


def _vec_bytes(row_bytes: int, es: int) -> int:
    """The widest load (16, 8, 4 bytes; 2 = one 16-bit element) that keeps every row aligned."""
    for vb in (16, 8, 4):
        if vb >= es and row_bytes % vb == 0:
            return vb
    return es


def _grid(caps, prog: Program, threads: int, needed: int) -> int:
    """Blocks to launch: what the work needs, capped at what the machine holds at once."""
    per_core = blocks_per_core(caps, prog, threads)
    if per_core < 1 or prog.nregs > caps.max_regs_per_thread:
        raise InputError(f"{prog.name} on {caps.name}", f"a block of {threads} threads x {prog.nregs} registers, "
                         f"{prog.shared_bytes} B scratchpad does not fit a core", "a larger target")
    return max(1, min(needed, caps.cores_total * per_core))


# ----------------------------------------------------------------------------- emission helpers
class ElementwiseAsm:
    """Emission context: an Asm with f32 load/store of the storage dtype and team reductions."""

    def __init__(self, name: str, params, dt: str, VB: int, team: str = "warp", BT: int = 128, red_vals: int = 0,
                 shared: int = 0):
        self.dt, self.es, self.VB = dt, ELEM_BYTES[dt], VB
        self.V = VB // self.es
        self.team, self.BT = team, BT
        self.T = 32 if team == "warp" else BT
        self.red_vals = red_vals
        self.red_base = shared
        if team == "block" and red_vals:
            shared += 2 * red_vals * 128
        self.a = Asm(name, params, shared)
        self.nloop = 0
        self.nred = 0
        self._const = {}

    def __call__(self, *x, **kw):
        self.a(*x, **kw)

    def reg(self, k: int = 1) -> Reg:
        return self.a.reg(k)

    def free(self, *r, k: int = 1) -> None:
        self.a.free(*r, k=k)

    def const(self, v: float) -> Reg:
        """A register holding the f32 constant v (kept for the whole kernel)."""
        if v not in self._const:
            r = self.reg()
            self("mov.f32", r, float(v))
            self._const[v] = r
        return self._const[v]

    def fparam(self, name: str) -> Reg:
        r = self.reg()
        self("ldparam", r, name)
        return r

    # ---- memory
    def load(self, addr: Reg, n: int, p: Optional[Pred] = None, dt: Optional[str] = None) -> Reg:
        """n elements of the storage dtype (or ``dt``) at [addr] -> n consecutive f32 registers
        (returned: the first)."""
        dt = dt or self.dt
        if dt == MASK_DTYPE:
            return self.load_bytes(addr, n, p)
        es, a = ELEM_BYTES[dt], self.a
        nb = n * es
        v = a.reg(n)
        if dt == "fp32":
            a(_LD[nb], v, Mem(addr, 0), p=p)
            return v
        lo = CVT_IN[dt][0]
        if n == 1:
            a("ld.global.u16", v, Mem(addr, 0), p=p)
            a(lo, v, v)
            return v
        nr = nb // 4
        raw = a.reg(nr)
        a(_LD[nb], raw, Mem(addr, 0), p=p)
        widen_halves(a, dt, v, raw, nr)
        a.free(raw, k=nr)
        return v

    def load_raw(self, addr: Reg, n: int, p: Optional[Pred] = None) -> Reg:
        """The load half of ``load`` (n > 1): n elements at [addr] into n * es / 4 registers as
        stored; ``unpack`` converts them, so that several loads can be in flight first."""
        nb = n * self.es
        raw = self.a.reg(n if self.dt == "fp32" else nb // 4)
        self.a(_LD[nb], raw, Mem(addr, 0), p=p)
        return raw

    def unpack(self, raw: Reg, n: int) -> Reg:
        """load_raw's registers as n f32 registers (returned: the first; raw is freed or reused)."""
        if self.dt == "fp32":
            return raw
        a = self.a
        nr = n * self.es // 4
        v = a.reg(n)
        widen_halves(a, self.dt, v, raw, nr)
        a.free(raw, k=nr)
        return v

    def load_bytes(self, addr: Reg, n: int, p: Optional[Pred] = None) -> Reg:
        """n bytes at [addr] -> n registers holding them as integers (a mask's 0 / 1)."""
        a = self.a
        v = a.reg(n)
        if n == 1:
            a("ld.global.u8", v, Mem(addr, 0), p=p)
            return v
        nw = n // 4
        raw = a.reg(nw)
        a(_LD[4 * nw], raw, Mem(addr, 0), p=p)
        unpack_bytes(a, v, raw, n)
        a.free(raw, k=nw)
        return v

    def store_bytes(self, addr: Reg, v: Reg, n: int) -> None:
        """n registers of byte values (0 / 1) -> n bytes at [addr]."""
        a = self.a
        if n == 1:
            a("st.global.b8", Mem(addr, 0), v)
            return
        nw = n // 4
        pk = a.reg(nw)
        pack_bytes(a, pk, v, n)
        a(_ST[4 * nw], Mem(addr, 0), pk)
        a.free(pk, k=nw)

    def store(self, addr: Reg, v: Reg, n: int, dt: Optional[str] = None) -> None:
        dt = dt or self.dt
        if dt == MASK_DTYPE:
            self.store_bytes(addr, v, n)
            return
        es, a = ELEM_BYTES[dt], self.a
        nb = n * es
        if dt == "fp32":
            a(_ST[nb], Mem(addr, 0), v)
            return
        cvt = CVT_OUT[dt]
        if n == 1:
            pk = a.reg()
            a(cvt, pk, v, v)
            a("st.global.b16", Mem(addr, 0), pk)
            a.free(pk)
            return
        nr = nb // 4
        pk = a.reg(nr)
        for i in range(nr):
            a(cvt, pk + i, v + 2 * i, v + 2 * i + 1)
        a(_ST[nb], Mem(addr, 0), pk)
        a.free(pk, k=nr)

    def addr(self, base: Reg, j: Reg) -> Reg:
        r = self.reg()
        self("add.i64", r, base, j)
        return r

    # ---- team setup and loops
    def team_setup(self) -> tuple:
        """Registers: tt (thread index in the team), row (first row), step (row stride)."""
        a = self.a
        tt, row, step, t = a.reg(), a.reg(), a.reg(), a.reg()
        if self.team == "warp":
            a("s2r", tt, "%laneid")
            a("s2r", row, "%ctaid.x")
            a("s2r", t, "%nwarpid")
            a("s2r", step, "%nctaid.x")
            a("mul.i64", step, step, t)
            a("mul.i64", row, row, t)
            a("s2r", t, "%warpid")
            a("add.i64", row, row, t)
        else:
            a("s2r", tt, "%tid.x")
            a("s2r", row, "%ctaid.x")
            a("s2r", step, "%nctaid.x")
        if self.team == "block" and self.red_vals:
            self.woff, self.loff = a.reg(), a.reg()
            self.plane0, self.prd = a.pred(), a.pred()
            a("s2r", t, "%laneid")
            a("setp.eq.i64", self.plane0, t, 0)
            a("shl.b64", self.loff, t, 2)
            a("s2r", self.woff, "%nwarpid")
            a("setp.lt.i64", self.prd, t, self.woff)
            a("s2r", t, "%warpid")
            a("shl.b64", self.woff, t, 2)
        a.free(t)
        self.j0v = a.reg()
        a("shl.b64", self.j0v, tt, log2(self.VB))
        self.j0s = None
        if self.V > 1:
            self.j0s = a.reg()
            a("shl.b64", self.j0s, tt, log2(self.es))
        self.tt = tt
        return tt, row, step

    def loop(self, lim_b: Reg, body: Callable, step_b: Optional[Reg] = None) -> None:
        """body(j, n) for every vector of the row below byte offset lim_b (j: the vector's byte
        offset in the row, n = V elements), then for the tail elements one at a time (n = 1).
        The vectors a thread takes are step_b bytes apart (default: the team's T vectors)."""
        a = self.a
        k = self.nloop
        self.nloop += 1
        j, p = a.reg(), a.pred()
        if self.V > 1:
            vend = a.reg()
            a("and.b64", vend, lim_b, -self.VB)
        else:
            vend = lim_b
        a("mov.b64", j, self.j0v)
        a.label(f"L{k}")
        a("setp.ge.i64", p, j, vend)
        a("bra", f"L{k}_tail", p=p)
        body(j, self.V)
        a("add.i64", j, j, self.T * self.VB if step_b is None else step_b)
        a("bra", f"L{k}")
        a.label(f"L{k}_tail")
        if self.V > 1:
            a("add.i64", j, vend, self.j0s)
            a("setp.ge.i64", p, j, lim_b)
            a("bra", f"L{k}_end", p=p)
            body(j, 1)
            a.label(f"L{k}_end")
            a.free(vend)
        a.free(j)
        a.pfree(p)

    def reduce(self, vals: list, combine: Callable, ident: list) -> None:
        """Reduce registers over the team; every thread ends with the result."""
        a = self.a
        oth = [a.reg() for _ in vals]

        def bfly():
            for m in (16, 8, 4, 2, 1):
                for v, o in zip(vals, oth):
                    a("shfl.bfly.b64", o, v, m)
                combine(vals, oth)

        bfly()
        if self.team == "block":
            assert len(vals) <= self.red_vals
            base = self.red_base + (self.nred % 2) * self.red_vals * 128
            self.nred += 1
            for i, v in enumerate(vals):
                a("st.shared.b32", Mem(self.woff, base + 128 * i), v, p=self.plane0)
            a("bar.sync")
            for i, v in enumerate(vals):
                a("mov.f32", v, ident[i])
                a("ld.shared.b32", v, Mem(self.loff, base + 128 * i), p=self.prd)
            bfly()
        a.free(*oth)

    def reduce_sum(self, vals: list) -> None:
        self.reduce(vals, lambda vs, os: [self("add.f32", v, v, o) for v, o in zip(vs, os)], [0.0] * len(vals))

    def end_row(self) -> None:
        """Block teams: an odd number of reductions per row leaves the slot sets out of step with
        the next row's; one more barrier keeps a fast warp's next write behind every read."""
        if self.team == "block" and self.nred % 2:
            self("bar.sync")

    def row_loop(self, row: Reg, step: Reg, rows: Reg, body: Callable) -> None:
        a = self.a
        p = a.pred()
        a.label("ROW")
        a("setp.ge.i64", p, row, rows)
        a("bra", "DONE", p=p)
        a.pfree(p)
        self.nred = 0
        body()
        self.end_row()
        a("add.i64", row, row, step)
        a("bra", "ROW")
        a.label("DONE")
        a("exit")

    def build(self) -> Program:
        return self.a.build()


def _choose_team(caps, rows: int, cols: int, V: int, team: Optional[str]) -> tuple:
    """(team, block threads). Warp per row for rows up to WARP_ROW_MAX_COLS elements unless there
    are too few rows to give every core 4 warps; a block (128 or 256 threads) per longer row."""
    if team is None:
        long_row = cols > WARP_ROW_MAX_COLS
        few_rows = cols >= 256 and rows < 4 * caps.cores_total
        team = "block" if long_row or few_rows else "warp"
    if team not in ("warp", "block"):
        raise InputError("row kernel", f"team {team!r}", "warp, block or None (the rule)")
    if team == "warp":
        return "warp", 128
    return "block", (128 if ceil_div(cols, V) <= 512 else 256)


def _finish(op: str, caps, e: ElementwiseAsm, threads: int, needed: int, flops: int, buffers, scalars, team: str,
            gen, ref):
    prog = e.build()
    check(prog, caps)
    grid = _grid(caps, prog, threads, needed)
    return ElementwiseKernel(op=op, program=prog, launch=Launch((grid, 1, 1), (threads, 1, 1)), flops=int(flops),
                             dtype=e.dt, buffers=tuple(buffers), scalars=tuple(scalars), team=team,
                             vector_bytes=e.VB, draw_inputs=gen, ref_outputs=ref)


def _normal(rng, shape, dt, scale=1.0, shift=0.0):
    return to_host((rng.standard_normal(shape) * scale + shift).astype(np.float32), dt)


# ----------------------------------------------------------------------------- softmax
def _keep(rows: int, cols: int, causal: bool, q_len: int, q_off: int) -> np.ndarray:
    """The kept entries of a [rows, cols] score matrix (small shapes: references only)."""
    if not causal:
        return np.ones((rows, cols), bool)
    i = (np.arange(rows) % q_len)[:, None]
    return np.arange(cols)[None, :] <= i + q_off


def _kept(rows: int, cols: int, causal: bool, q_len: int, q_off: int) -> int:
    """How many entries the mask keeps, without building it."""
    if not causal:
        return rows * cols
    per_query = np.clip(np.arange(q_len, dtype=np.int64) + q_off + 1, 0, cols)
    return int(per_query.sum()) * (rows // q_len)


def _pad(y: np.ndarray, ld: int) -> np.ndarray:
    """[rows, cols] -> [rows, ld] with zeros in the columns the kernel does not touch."""
    if y.shape[1] == ld:
        return y
    out = np.zeros((y.shape[0], ld))
    out[:, :y.shape[1]] = y
    return out


def _softmax_common(op, caps, rows, cols, dtype, scale, causal, q_len, q_offset, ld):
    dt = _dtype(op, dtype)
    _pos(op, rows=rows, cols=cols)
    _target(op, caps)
    scale = _finite(op, "scale", scale)
    ld = cols if ld is None else ld
    _pos(op, ld=ld)
    if ld < cols:
        raise InputError(op, f"ld = {ld} < cols = {cols}", "ld >= cols (the row stride in elements)")
    if q_len is None:
        q_len = rows
    _pos(op, q_len=q_len)
    if causal and rows % q_len:
        raise InputError(op, f"rows = {rows} is not a multiple of q_len = {q_len}",
                         "rows = batch*heads*q_len for a causal mask")
    if q_offset is None:
        q_offset = cols - q_len
    if isinstance(q_offset, bool) or not isinstance(q_offset, (int, np.integer)):
        raise InputError(op, f"q_offset = {q_offset!r}", "an integer (query i keeps columns j <= i + q_offset)")
    return dt, scale, int(ld), int(q_len), int(q_offset)


def kept_end(e: ElementwiseAsm, row: Reg, causal: bool, cols_b: Reg) -> Reg:
    """The byte end of the row's kept columns: causal: clamp(row mod q_len + q_off + 1, 0, cols) * es."""
    if not causal:
        return cols_b
    ce = e.reg()
    t = e.reg()
    e("ldparam", t, "q_len")
    e("rem.i64", ce, row, t)
    e("ldparam", t, "q_off")
    e("add.i64", ce, ce, t)
    e("add.i64", ce, ce, 1)
    e("max.i64", ce, ce, 0)
    e("shl.b64", ce, ce, log2(e.es))
    e("min.i64", ce, ce, cols_b)
    e.free(t)
    return ce


def softmax_kernel(caps, rows: int, cols: int, dtype: str = "fp16", scale: float = 1.0, causal: bool = False,
                   q_offset: Optional[int] = None, ld: Optional[int] = None, *, q_len: Optional[int] = None,
                   team: Optional[str] = None) -> ElementwiseKernel:
    """y = softmax(scale * x) over each row of x [rows, ld] (the first cols columns), written to a
    separate buffer y [rows, ld] (columns past cols are not touched).

    Causal: rows = b*n*q_len of an S [b, n, q_len, kv_len = cols] tensor; row r is query
    i = r mod q_len (q_len: default rows) and keeps columns j <= i + q_offset (default
    kv_len - q_len); masked entries are written as 0. ld: row stride in elements (default cols).
    team: force "warp" or "block" rows (default: the rule in ``_choose_team``)."""
    op = "softmax"
    dt, scale, ld, q_len, q_off = _softmax_common(op, caps, rows, cols, dtype, scale, causal, q_len, q_offset, ld)
    es = ELEM_BYTES[dt]
    VB = _vec_bytes(ld * es, es)
    tm, BT = _choose_team(caps, rows, cols, VB // es, team)
    params = ("x", "y", "rows", "cols", "ld", "q_len", "q_off", "scale")
    e = ElementwiseAsm(f"softmax_{dt}_{tm}_v{VB}{'_causal' if causal else ''}", params, dt, VB, tm, BT, red_vals=2)
    tt, row, step = e.team_setup()
    rows_r, cols_b, ldb, X, Y = e.reg(), e.reg(), e.reg(), e.reg(), e.reg()
    e("ldparam", rows_r, "rows")
    e("ldparam", cols_b, "cols")
    e("shl.b64", cols_b, cols_b, log2(es))
    e("ldparam", ldb, "ld")
    e("shl.b64", ldb, ldb, log2(es))
    e("ldparam", X, "x")
    e("ldparam", Y, "y")
    c = e.fparam("scale")
    e("mul.f32", c, c, LOG2E)                         # t = x * scale * log2(e): exp(s x) = 2^t

    def body():
        ro, px, py = e.reg(), e.reg(), e.reg()
        e("mul.i64", ro, row, ldb)
        e("add.i64", px, X, ro)
        e("add.i64", py, Y, ro)
        e.free(ro)
        ce = kept_end(e, row, causal, cols_b)
        m, s = e.reg(), e.reg()
        e("mov.f32", m, -F32_MAX)                     # not -inf: m - M is never -inf - -inf
        e("mov.f32", s, 0.0)

        def online(j, n):                             # running (m, s) over the kept columns
            ad = e.addr(px, j)
            v = e.load(ad, n)
            e.free(ad)
            for i in range(n):
                e("mul.f32", v + i, v + i, c)
            M, t = e.reg(), e.reg()
            e("max.f32", M, m, v)
            for i in range(1, n):
                e("max.f32", M, M, v + i)
            e("sub.f32", t, m, M)
            e("ex2.f32", t, t)
            e("mul.f32", s, s, t)
            for i in range(n):
                e("sub.f32", v + i, v + i, M)
                e("ex2.f32", v + i, v + i)
                e("add.f32", s, s, v + i)
            e("mov.b64", m, M)
            e.free(M, t)
            e.free(v, k=n)

        e.loop(ce, online)

        def combine(vs, os):
            (m1, s1), (m2, s2) = vs, os
            M, t = e.reg(), e.reg()
            e("max.f32", M, m1, m2)
            e("sub.f32", t, m1, M)
            e("ex2.f32", t, t)
            e("mul.f32", s1, s1, t)
            e("sub.f32", t, m2, M)
            e("ex2.f32", t, t)
            e("fma.f32", s1, s2, t, s1)
            e("mov.b64", m1, M)
            e.free(M, t)

        e.reduce([m, s], combine, [-F32_MAX, 0.0])
        e("rcp.f32", s, s)
        e("min.f32", s, s, F32_MAX)                   # s = 0 (nothing kept, all -inf): y = 0 * MAX = 0

        def write(j, n):
            pv = rem = None
            if causal:
                rem, pv = e.reg(), e.a.pred()
                e("sub.i64", rem, ce, j)
                e("setp.gt.i64", pv, rem, 0)          # some element of this vector is kept
            ad = e.addr(px, j)
            v = e.load(ad, n, p=pv)
            for i in range(n):
                e("mul.f32", v + i, v + i, c)
                e("sub.f32", v + i, v + i, m)
                e("ex2.f32", v + i, v + i)
                e("mul.f32", v + i, v + i, s)
            if causal:
                for i in range(n):
                    e("setp.gt.i64", pv, rem, i * es)
                    e("selp.b64", v + i, v + i, 0, pv)
                e.free(rem)
                e.a.pfree(pv)
            e("add.i64", ad, py, j)
            e.store(ad, v, n)
            e.free(ad)
            e.free(v, k=n)

        e.loop(cols_b, write)
        e.free(m, s, px, py)
        if causal:
            e.free(ce)

    e.row_loop(row, step, rows_r, body)
    buffers = (Buf("x", (rows, ld), dt), Buf("y", (rows, ld), dt, True))

    def gen(rng):
        return {"x": _normal(rng, (rows, ld), dt, 2.0)}

    def ref(v):
        keep = _keep(rows, cols, causal, q_len, q_off)
        t = np.where(keep, scale * v["x"][:, :cols], -np.inf)
        mx = t.max(axis=1, keepdims=True)
        mx = np.where(np.isfinite(mx), mx, 0.0)
        p = np.where(keep, np.exp(t - mx), 0.0)
        sm = p.sum(axis=1, keepdims=True)
        return {"y": _pad(p / np.where(sm > 0, sm, 1.0), ld)}

    scalars = (("rows", rows), ("cols", cols), ("ld", ld), ("q_len", q_len), ("q_off", q_off),
               ("scale", _f32_bits(scale)))
    teams = ceil_div(rows, 4) if tm == "warp" else rows
    return _finish(op, caps, e, BT, teams, FLOPS_PER_ELEM[op] * _kept(rows, cols, causal, q_len, q_off), buffers, scalars, tm, gen, ref)


def softmax_grad_kernel(caps, rows: int, cols: int, dtype: str = "fp16", scale: float = 1.0, causal: bool = False,
                        q_offset: Optional[int] = None, ld: Optional[int] = None, *, q_len: Optional[int] = None,
                        team: Optional[str] = None) -> ElementwiseKernel:
    """dx = scale * P * (dP - rowsum(dP * P)): the gradient of y = softmax(scale * x) given the
    forward output P = y and dP = dL/dy (all [rows, ld]; the same scale / causal / q_len /
    q_offset / ld conventions as ``softmax_kernel``). Masked entries get dx = 0 and are not read."""
    op = "softmax_grad"
    dt, scale, ld, q_len, q_off = _softmax_common(op, caps, rows, cols, dtype, scale, causal, q_len, q_offset, ld)
    es = ELEM_BYTES[dt]
    VB = _vec_bytes(ld * es, es)
    tm, BT = _choose_team(caps, rows, cols, VB // es, team)
    params = ("p", "dp", "dx", "rows", "cols", "ld", "q_len", "q_off", "scale")
    e = ElementwiseAsm(f"softmax_grad_{dt}_{tm}_v{VB}{'_causal' if causal else ''}", params, dt, VB, tm, BT, red_vals=1)
    tt, row, step = e.team_setup()
    rows_r, cols_b, ldb, P, DP, DX = (e.reg() for _ in range(6))
    e("ldparam", rows_r, "rows")
    e("ldparam", cols_b, "cols")
    e("shl.b64", cols_b, cols_b, log2(es))
    e("ldparam", ldb, "ld")
    e("shl.b64", ldb, ldb, log2(es))
    e("ldparam", P, "p")
    e("ldparam", DP, "dp")
    e("ldparam", DX, "dx")
    c = e.fparam("scale")

    def body():
        ro = e.reg()
        e("mul.i64", ro, row, ldb)
        pp, pd, px = e.addr(P, ro), e.addr(DP, ro), e.addr(DX, ro)
        e.free(ro)
        ce = kept_end(e, row, causal, cols_b)
        acc = e.reg()
        e("mov.f32", acc, 0.0)

        def dot(j, n):
            ad = e.addr(pp, j)
            p = e.load(ad, n)
            e("add.i64", ad, pd, j)
            d = e.load(ad, n)
            e.free(ad)
            for i in range(n):
                e("fma.f32", acc, p + i, d + i, acc)
            e.free(p, k=n)
            e.free(d, k=n)

        e.loop(ce, dot)
        e.reduce_sum([acc])                            # acc = sum_j P dP over the kept columns

        def write(j, n):
            pv = rem = None
            if causal:
                rem, pv = e.reg(), e.a.pred()
                e("sub.i64", rem, ce, j)
                e("setp.gt.i64", pv, rem, 0)
            ad = e.addr(pp, j)
            p = e.load(ad, n, p=pv)
            e("add.i64", ad, pd, j)
            d = e.load(ad, n, p=pv)
            for i in range(n):
                e("sub.f32", d + i, d + i, acc)
                e("mul.f32", d + i, d + i, p + i)
                e("mul.f32", d + i, d + i, c)
            if causal:
                for i in range(n):
                    e("setp.gt.i64", pv, rem, i * es)
                    e("selp.b64", d + i, d + i, 0, pv)
                e.free(rem)
                e.a.pfree(pv)
            e("add.i64", ad, px, j)
            e.store(ad, d, n)
            e.free(ad)
            e.free(p, k=n)
            e.free(d, k=n)

        e.loop(cols_b, write)
        e.free(acc, pp, pd, px)
        if causal:
            e.free(ce)

    e.row_loop(row, step, rows_r, body)
    buffers = (Buf("p", (rows, ld), dt), Buf("dp", (rows, ld), dt), Buf("dx", (rows, ld), dt, True))

    def gen(rng):
        keep = _keep(rows, cols, causal, q_len, q_off)
        t = np.where(keep, rng.standard_normal((rows, cols)) * 2.0, -np.inf)
        mx = t.max(axis=1, keepdims=True)
        pr = np.where(keep, np.exp(t - np.where(np.isfinite(mx), mx, 0.0)), 0.0)
        pr /= np.maximum(pr.sum(axis=1, keepdims=True), 1e-300)
        return {"p": to_host(_pad(pr, ld).astype(np.float32), dt), "dp": _normal(rng, (rows, ld), dt)}

    def ref(v):
        keep = _keep(rows, cols, causal, q_len, q_off)
        p = np.where(keep, v["p"][:, :cols], 0.0)
        d = v["dp"][:, :cols]
        s = (p * d).sum(axis=1, keepdims=True)
        return {"dx": _pad(np.where(keep, scale * p * (d - s), 0.0), ld)}

    scalars = (("rows", rows), ("cols", cols), ("ld", ld), ("q_len", q_len), ("q_off", q_off),
               ("scale", _f32_bits(scale)))
    teams = ceil_div(rows, 4) if tm == "warp" else rows
    return _finish(op, caps, e, BT, teams, FLOPS_PER_ELEM[op] * _kept(rows, cols, causal, q_len, q_off), buffers,
                   scalars, tm, gen, ref)


# ----------------------------------------------------------------------------- layernorm / rmsnorm
def _norm_setup(op, caps, rows, cols, dtype, eps, team):
    dt = _dtype(op, dtype)
    _pos(op, rows=rows, cols=cols)
    _target(op, caps)
    if eps is not None:
        eps = _finite(op, "eps", eps)
        if eps < 0:
            raise InputError(op, f"eps = {eps}", "eps >= 0")
    es = ELEM_BYTES[dt]
    VB = _vec_bytes(cols * es, es)
    tm, BT = _choose_team(caps, rows, cols, VB // es, team)
    return dt, es, VB, tm, BT


def _row_ptrs(e: ElementwiseAsm, row: Reg, rowb: Reg, bases: list) -> list:
    """Pointers to the row `row` of each [rows, cols] buffer: base + row * rowb."""
    ro = e.reg()
    e("mul.i64", ro, row, rowb)
    out = [e.addr(b, ro) for b in bases]
    e.free(ro)
    return out


def _norm_gen(rows, cols, dt, with_beta):
    def gen(rng):
        d = {"x": _normal(rng, (rows, cols), dt, 2.0, 0.5), "gamma": _normal(rng, (cols,), dt, 0.2, 1.0)}
        if with_beta:
            d["beta"] = _normal(rng, (cols,), dt, 0.2)
        return d
    return gen


def layernorm_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-5, *,
                     team: Optional[str] = None) -> ElementwiseKernel:
    """y = (x - mean) * rstd * gamma + beta per row of x [rows, cols], rstd = 1/sqrt(var + eps)
    (biased variance, as torch.nn.LayerNorm); also writes mean [rows] and rstd [rows] (f32), the
    statistics ``layernorm_grad_kernel`` reads. gamma, beta: [cols] in the storage dtype."""
    op = "layernorm"
    dt, es, VB, tm, BT = _norm_setup(op, caps, rows, cols, dtype, eps, team)
    params = ("x", "gamma", "beta", "y", "mean", "rstd", "rows", "cols", "eps")
    e = ElementwiseAsm(f"layernorm_{dt}_{tm}_v{VB}", params, dt, VB, tm, BT, red_vals=1)
    tt, row, step = e.team_setup()
    rows_r, cols_b, X, G, B, Y, MEAN, RSTD = (e.reg() for _ in range(8))
    invn, eps_r = e.reg(), e.fparam("eps")
    e("ldparam", rows_r, "rows")
    e("ldparam", cols_b, "cols")
    e("cvt.f32.i64", invn, cols_b)
    e("rcp.f32", invn, invn)
    e("shl.b64", cols_b, cols_b, log2(es))
    for r, n in ((X, "x"), (G, "gamma"), (B, "beta"), (Y, "y"), (MEAN, "mean"), (RSTD, "rstd")):
        e("ldparam", r, n)
    p0 = e.a.pred()
    e("setp.eq.i64", p0, tt, 0)

    def body():
        px, py = _row_ptrs(e, row, cols_b, [X, Y])
        acc, mean, rstd = e.reg(), e.reg(), e.reg()
        e("mov.f32", acc, 0.0)

        def s1(j, n):
            ad = e.addr(px, j)
            v = e.load(ad, n)
            for i in range(n):
                e("add.f32", acc, acc, v + i)
            e.free(ad)
            e.free(v, k=n)

        e.loop(cols_b, s1)
        e.reduce_sum([acc])
        e("mul.f32", mean, acc, invn)
        e("mov.f32", acc, 0.0)

        def s2(j, n):
            ad = e.addr(px, j)
            v = e.load(ad, n)
            for i in range(n):
                e("sub.f32", v + i, v + i, mean)
                e("fma.f32", acc, v + i, v + i, acc)
            e.free(ad)
            e.free(v, k=n)

        e.loop(cols_b, s2)
        e.reduce_sum([acc])
        e("fma.f32", rstd, acc, invn, eps_r)           # var + eps
        e("rsqrt.f32", rstd, rstd)
        ad = e.reg()
        e("shl.b64", ad, row, 2)
        e("add.i64", acc, MEAN, ad)
        e("st.global.b32", Mem(acc, 0), mean, p=p0)
        e("add.i64", acc, RSTD, ad)
        e("st.global.b32", Mem(acc, 0), rstd, p=p0)
        e.free(ad, acc)

        def out(j, n):
            ad = e.addr(px, j)
            v = e.load(ad, n)
            e("add.i64", ad, G, j)
            g = e.load(ad, n)
            e("add.i64", ad, B, j)
            b = e.load(ad, n)
            for i in range(n):
                e("sub.f32", v + i, v + i, mean)
                e("mul.f32", v + i, v + i, rstd)
                e("fma.f32", v + i, v + i, g + i, b + i)
            e("add.i64", ad, py, j)
            e.store(ad, v, n)
            e.free(ad)
            for r in (v, g, b):
                e.free(r, k=n)

        e.loop(cols_b, out)
        e.free(px, py, mean, rstd)

    e.row_loop(row, step, rows_r, body)
    buffers = (Buf("x", (rows, cols), dt), Buf("gamma", (cols,), dt), Buf("beta", (cols,), dt),
               Buf("y", (rows, cols), dt, True), Buf("mean", (rows,), "fp32", True), Buf("rstd", (rows,), "fp32", True))

    def ref(v):
        x = v["x"]
        mu = x.mean(axis=1)
        r = 1.0 / np.sqrt(((x - mu[:, None]) ** 2).mean(axis=1) + eps)
        return {"y": (x - mu[:, None]) * r[:, None] * v["gamma"] + v["beta"], "mean": mu, "rstd": r}

    scalars = (("rows", rows), ("cols", cols), ("eps", _f32_bits(eps)))
    teams = ceil_div(rows, 4) if tm == "warp" else rows
    return _finish(op, caps, e, BT, teams, FLOPS_PER_ELEM[op] * rows * cols, buffers, scalars, tm,
                   _norm_gen(rows, cols, dt, True), ref)


def rmsnorm_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-6, *,
                   team: Optional[str] = None) -> ElementwiseKernel:
    """y = x * rstd * gamma per row of x [rows, cols], rstd = 1/sqrt(mean(x^2) + eps) (LLaMA's
    RMSNorm); also writes rstd [rows] (f32) for ``rmsnorm_grad_kernel``."""
    op = "rmsnorm"
    dt, es, VB, tm, BT = _norm_setup(op, caps, rows, cols, dtype, eps, team)
    params = ("x", "gamma", "y", "rstd", "rows", "cols", "eps")
    e = ElementwiseAsm(f"rmsnorm_{dt}_{tm}_v{VB}", params, dt, VB, tm, BT, red_vals=1)
    tt, row, step = e.team_setup()
    rows_r, cols_b, X, G, Y, RSTD = (e.reg() for _ in range(6))
    invn, eps_r = e.reg(), e.fparam("eps")
    e("ldparam", rows_r, "rows")
    e("ldparam", cols_b, "cols")
    e("cvt.f32.i64", invn, cols_b)
    e("rcp.f32", invn, invn)
    e("shl.b64", cols_b, cols_b, log2(es))
    for r, n in ((X, "x"), (G, "gamma"), (Y, "y"), (RSTD, "rstd")):
        e("ldparam", r, n)
    p0 = e.a.pred()
    e("setp.eq.i64", p0, tt, 0)

    def body():
        px, py = _row_ptrs(e, row, cols_b, [X, Y])
        acc, rstd = e.reg(), e.reg()
        e("mov.f32", acc, 0.0)

        def s1(j, n):
            ad = e.addr(px, j)
            v = e.load(ad, n)
            for i in range(n):
                e("fma.f32", acc, v + i, v + i, acc)
            e.free(ad)
            e.free(v, k=n)

        e.loop(cols_b, s1)
        e.reduce_sum([acc])
        e("fma.f32", rstd, acc, invn, eps_r)
        e("rsqrt.f32", rstd, rstd)
        e("shl.b64", acc, row, 2)
        e("add.i64", acc, acc, RSTD)
        e("st.global.b32", Mem(acc, 0), rstd, p=p0)
        e.free(acc)

        def out(j, n):
            ad = e.addr(px, j)
            v = e.load(ad, n)
            e("add.i64", ad, G, j)
            g = e.load(ad, n)
            for i in range(n):
                e("mul.f32", v + i, v + i, rstd)
                e("mul.f32", v + i, v + i, g + i)
            e("add.i64", ad, py, j)
            e.store(ad, v, n)
            e.free(ad)
            e.free(v, k=n)
            e.free(g, k=n)

        e.loop(cols_b, out)
        e.free(px, py, rstd)

    e.row_loop(row, step, rows_r, body)
    buffers = (Buf("x", (rows, cols), dt), Buf("gamma", (cols,), dt), Buf("y", (rows, cols), dt, True),
               Buf("rstd", (rows,), "fp32", True))

    def ref(v):
        x = v["x"]
        r = 1.0 / np.sqrt((x * x).mean(axis=1) + eps)
        return {"y": x * r[:, None] * v["gamma"], "rstd": r}

    scalars = (("rows", rows), ("cols", cols), ("eps", _f32_bits(eps)))
    teams = ceil_div(rows, 4) if tm == "warp" else rows
    return _finish(op, caps, e, BT, teams, FLOPS_PER_ELEM[op] * rows * cols, buffers, scalars, tm,
                   _norm_gen(rows, cols, dt, False), ref)


# ----------------------------------------------------------------------------- norm backward
def _norm_dx_kernel(caps, rows, cols, dt, es, VB, tm, BT, ln: bool) -> ElementwiseKernel:
    """Kernel 1 of a norm's backward: dx per row from x, dy, gamma and the saved statistics."""
    op = "layernorm_grad" if ln else "rmsnorm_grad"
    params = ("x", "dy", "gamma") + (("mean",) if ln else ()) + ("rstd", "dx", "rows", "cols")
    e = ElementwiseAsm(f"{op}_dx_{dt}_{tm}_v{VB}", params, dt, VB, tm, BT, red_vals=2 if ln else 1)
    tt, row, step = e.team_setup()
    rows_r, cols_b, X, DY, G, RSTD, DX, invn = (e.reg() for _ in range(8))
    MEAN = e.reg() if ln else None
    e("ldparam", rows_r, "rows")
    e("ldparam", cols_b, "cols")
    e("cvt.f32.i64", invn, cols_b)
    e("rcp.f32", invn, invn)
    e("shl.b64", cols_b, cols_b, log2(es))
    for r, n in ((X, "x"), (DY, "dy"), (G, "gamma"), (RSTD, "rstd"), (DX, "dx")) + (((MEAN, "mean"),) if ln else ()):
        e("ldparam", r, n)

    def body():
        px, pd, po = _row_ptrs(e, row, cols_b, [X, DY, DX])
        rstd, t = e.reg(), e.reg()
        e("shl.b64", t, row, 2)
        e("add.i64", rstd, RSTD, t)
        e("ld.global.b32", rstd, Mem(rstd, 0))
        mean = None
        if ln:
            mean = e.reg()
            e("add.i64", mean, MEAN, t)
            e("ld.global.b32", mean, Mem(mean, 0))
        e.free(t)
        acc = [e.reg() for _ in range(2 if ln else 1)]
        for r in acc:
            e("mov.f32", r, 0.0)

        def operands(j, n):
            """x (ln: xhat = (x - mean) * rstd) and g*dy of n elements at byte offset j."""
            ad = e.addr(px, j)
            x = e.load(ad, n)
            e("add.i64", ad, pd, j)
            d = e.load(ad, n)
            e("add.i64", ad, G, j)
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
                    e("add.f32", acc[0], acc[0], d + i)            # sum g dy
                    e("fma.f32", acc[1], d + i, x + i, acc[1])     # sum g dy xhat
                else:
                    e("fma.f32", acc[0], d + i, x + i, acc[0])     # sum g dy x
            e.free(x, k=n)
            e.free(d, k=n)

        e.loop(cols_b, sums)
        e.reduce_sum(acc)
        if ln:
            e("mul.f32", acc[0], acc[0], invn)                    # c1 = mean(g dy)
            e("mul.f32", acc[1], acc[1], invn)                    # c2 = mean(g dy xhat)
        else:
            e("mul.f32", acc[0], acc[0], invn)
            e("mul.f32", acc[0], acc[0], rstd)
            e("mul.f32", acc[0], acc[0], rstd)
            e("mul.f32", acc[0], acc[0], rstd)
            e("neg.f32", acc[0], acc[0])                          # -rstd^3 mean(g dy x)

        def out(j, n):
            x, d = operands(j, n)
            for i in range(n):
                if ln:   # rstd * (g dy - c1 - xhat c2)
                    e("fma.f32", x + i, x + i, acc[1], acc[0])
                    e("sub.f32", d + i, d + i, x + i)
                    e("mul.f32", d + i, d + i, rstd)
                else:    # rstd g dy - x rstd^3 mean(g dy x)
                    e("mul.f32", d + i, d + i, rstd)
                    e("fma.f32", d + i, x + i, acc[0], d + i)
            ad = e.addr(po, j)
            e.store(ad, d, n)
            e.free(ad)
            e.free(x, k=n)
            e.free(d, k=n)

        e.loop(cols_b, out)
        e.free(px, pd, po, rstd, *acc)
        if ln:
            e.free(mean)

    e.row_loop(row, step, rows_r, body)
    buffers = (Buf("x", (rows, cols), dt), Buf("dy", (rows, cols), dt), Buf("gamma", (cols,), dt)) + \
        ((Buf("mean", (rows,), "fp32"),) if ln else ()) + (Buf("rstd", (rows,), "fp32"), Buf("dx", (rows, cols), dt, True))
    scalars = (("rows", rows), ("cols", cols))
    teams = ceil_div(rows, 4) if tm == "warp" else rows
    return _finish(op, caps, e, BT, teams, FLOPS_PER_ELEM[op] * rows * cols, buffers, scalars, tm,
                   None, None)


def _vec_f32(a: Asm, op: str, v: Reg, addr: Reg, off: int, V: int) -> None:
    """Emit the move of V f32 registers at v to (st.shared / st.global) or from (ld.shared) addr + off."""
    # pieces of 4, 2 and 1 words
    piece = {4: "v4.b32", 2: "v2.b32", 1: "b32"}
    i = 0
    while i < V:
        w = min(4, V - i)
        mn = f"{op}.{piece[w]}"
        if op.startswith("ld"):
            a(mn, v + i, Mem(addr, off + 4 * i))
        else:
            a(mn, Mem(addr, off + 4 * i), v + i)
        i += w


class _ColsumCtx:
    """A column-sum kernel being emitted (see _norm_colsum_kernel): its plan (tile width, warps,
    row chunks), its ElementwiseAsm, and the registers that more than one step uses."""

    def __init__(self, caps, rows: int, cols: int, dt: str, es: int, ln: bool):
        self.ln, self.es = ln, es
        VB = _vec_bytes(cols * es, es)
        self.V = V = VB // es
        self.TW = TW = 32 * V                     # columns of a tile
        self.nout = nout = 2 if ln else 1
        RY = min(COLSUM_WARPS, caps.warp_slots)
        while RY > 1 and nout * RY * TW * 4 > caps.scratchpad_bytes:
            RY //= 2
        self.RY = RY
        self.plane = RY * TW * 4                  # bytes of one output's partials
        self.ntiles = ntiles = ceil_div(cols, TW)
        nchunk = max(1, min(ceil_div(2 * caps.cores_total, ntiles), rows // (4 * RY)))  # >= 4 rows a warp
        self.rpc = rpc = ceil_div(rows, nchunk)
        self.nchunk = ceil_div(rows, rpc)
        self.partial = partial = self.nchunk > 1
        self.outs = outs = ("ws",) if partial else ("dgamma",) + (("dbeta",) if ln else ())
        params = ("x", "dy") + (("mean",) if ln else ()) + ("rstd",) + outs + ("rows", "cols", "rpc", "chunks")
        self.e = ElementwiseAsm(f"{'layernorm' if ln else 'rmsnorm'}_grad_params_{dt}_v{VB}"
                                f"{'_partial' if partial else ''}", params, dt, VB, "column", 32 * RY,
                                shared=nout * self.plane)
        self.a = self.e.a
        # the registers are attributes set by the steps that allocate them


def _colsum_prologue(ctx: _ColsumCtx) -> None:
    """Emit the work-unit loop's setup: units, shapes, pointers, this thread's partial slot and column."""
    e, a, ln, V, TW = ctx.e, ctx.a, ctx.ln, ctx.V, ctx.TW
    lane, warp, u, step, rows_r, cols_b = (e.reg() for _ in range(6))
    e("s2r", lane, "%laneid")
    e("s2r", warp, "%warpid")
    e("s2r", u, "%ctaid.x")                        # work unit: (tile, chunk) = (u mod ntile, u / ntile)
    e("s2r", step, "%nctaid.x")
    e("ldparam", rows_r, "rows")
    e("ldparam", cols_b, "cols")
    e("shl.b64", cols_b, cols_b, log2(ctx.es))
    ntile, nunit, rpc_r = e.reg(), e.reg(), e.reg()
    e("add.i64", ntile, cols_b, 32 * e.VB - 1)
    e("shr.u64", ntile, ntile, log2(32 * e.VB))
    e("ldparam", nunit, "chunks")
    e("mul.i64", nunit, nunit, ntile)
    e("ldparam", rpc_r, "rpc")
    X, DY, RSTD, DG = e.reg(), e.reg(), e.reg(), e.reg()
    MEAN = e.reg() if ln else None
    DB = e.reg() if ln and not ctx.partial else None
    for r, n in ((X, "x"), (DY, "dy"), (RSTD, "rstd"), (DG, ctx.outs[0])) + (((MEAN, "mean"),) if ln else ()) + \
            (((DB, "dbeta"),) if DB is not None else ()):
        e("ldparam", r, n)
    soff = e.reg()                                 # this thread's partial slot: (warp*TW + lane*V)*4
    e("mul.i64", soff, warp, TW * 4)
    t = e.reg()
    e("shl.b64", t, lane, log2(V * 4))
    e("add.i64", soff, soff, t)
    e("shl.b64", t, lane, log2(e.VB))
    lane_b = t                                     # lane's column byte within a tile
    pT, pv, pw, pr = a.pred(), a.pred(), a.pred(), a.pred()
    e("setp.eq.i64", pw, warp, 0)
    rstep = e.reg()
    e("mul.i64", rstep, cols_b, ctx.RY)            # bytes of RY rows
    ctx.warp, ctx.u, ctx.step, ctx.rows_r, ctx.cols_b = warp, u, step, rows_r, cols_b
    ctx.ntile, ctx.nunit, ctx.rpc_r = ntile, nunit, rpc_r
    ctx.X, ctx.DY, ctx.RSTD, ctx.DG, ctx.MEAN, ctx.DB = X, DY, RSTD, DG, MEAN, DB
    ctx.soff, ctx.lane_b, ctx.pT, ctx.pv, ctx.pw, ctx.pr, ctx.rstep = soff, lane_b, pT, pv, pw, pr, rstep


def _colsum_unit(ctx: _ColsumCtx) -> None:
    """Emit the start of a work unit: its columns (c, pv), its chunk's rows (r0, rend), zeroed sums."""
    e, a, V = ctx.e, ctx.a, ctx.V
    a.label("TILE")
    e("setp.ge.i64", ctx.pT, ctx.u, ctx.nunit)
    e("bra", "DONE", p=ctx.pT)
    c, chunk, rend = e.reg(), e.reg(), e.reg()
    e("rem.i64", c, ctx.u, ctx.ntile)
    e("div.i64", chunk, ctx.u, ctx.ntile)
    e("shl.b64", c, c, log2(32 * e.VB))
    e("add.i64", c, c, ctx.lane_b)                 # this thread's first column byte
    e("setp.lt.i64", ctx.pv, c, ctx.cols_b)
    e("mul.i64", rend, chunk, ctx.rpc_r)           # the chunk's first row
    r0 = e.reg()
    e("add.i64", r0, rend, ctx.warp)
    e("add.i64", rend, rend, ctx.rpc_r)
    e("min.i64", rend, rend, ctx.rows_r)           # ... and its end
    ctx.accs = [e.reg(V) for _ in range(ctx.nout)]
    for acc in ctx.accs:
        for i in range(V):
            e("mov.f32", acc + i, 0.0)
    ctx.c, ctx.chunk, ctx.rend, ctx.r0 = c, chunk, rend, r0


def _colsum_rows(ctx: _ColsumCtx) -> None:
    """Emit the warp's row loop: dgamma += dy * xhat (and dbeta += dy), V columns a lane, in registers."""
    e, a, ln, V, accs = ctx.e, ctx.a, ctx.ln, ctx.V, ctx.accs
    e("bra", "SUMS_END", p=ctx.pv, neg=True)
    r, px, pd, ps = e.reg(), e.reg(), e.reg(), e.reg()
    e("mov.b64", r, ctx.r0)
    e("mul.i64", px, ctx.r0, ctx.cols_b)
    e("add.i64", px, px, ctx.c)
    e("add.i64", pd, px, ctx.DY)
    e("add.i64", px, px, ctx.X)
    e("shl.b64", ps, ctx.r0, 2)                    # byte offset of row r's statistics
    a.label("ROWS")
    e("setp.ge.i64", ctx.pr, r, ctx.rend)
    e("bra", "SUMS_END", p=ctx.pr)
    x = e.load(px, V)
    d = e.load(pd, V)
    rs, mu = e.reg(), (e.reg() if ln else None)
    e("add.i64", rs, ctx.RSTD, ps)
    e("ld.global.b32", rs, Mem(rs, 0))
    if ln:
        e("add.i64", mu, ctx.MEAN, ps)
        e("ld.global.b32", mu, Mem(mu, 0))
    for i in range(V):
        if ln:
            e("sub.f32", x + i, x + i, mu)
        e("mul.f32", x + i, x + i, rs)             # xhat
        e("fma.f32", accs[0] + i, d + i, x + i, accs[0] + i)
        if ln:
            e("add.f32", accs[1] + i, accs[1] + i, d + i)
    e.free(x, k=V)
    e.free(d, k=V)
    e.free(rs)
    if ln:
        e.free(mu)
    e("add.i64", r, r, ctx.RY)
    e("add.i64", px, px, ctx.rstep)
    e("add.i64", pd, pd, ctx.rstep)
    e("add.i64", ps, ps, 4 * ctx.RY)
    e("bra", "ROWS")
    a.label("SUMS_END")
    e.free(r, px, pd, ps)


def _colsum_combine(ctx: _ColsumCtx) -> None:
    """Emit the meeting of the RY warps' partials in shared memory; warp 0 adds them up and stores."""
    # to dgamma (dbeta) in the storage dtype, or as f32 to the chunk's row of the workspace
    e, a, V, accs, partial = ctx.e, ctx.a, ctx.V, ctx.accs, ctx.partial
    for k, acc in enumerate(accs):
        _vec_f32(a, "st.shared", acc, ctx.soff, k * ctx.plane, V)
    e("bar.sync")
    pw0 = a.pred()
    e("and.pred", pw0, ctx.pw, ctx.pv)
    e("bra", "OUT_END", p=pw0, neg=True)
    part = e.reg(V)
    wsa = None
    if partial:        # ws [chunk, k*cols + col] in f32: byte (chunk*nout*cols + col)*4 + k*cols*4
        wsa, t2 = e.reg(), e.reg()
        e("ldparam", t2, "cols")
        e("mul.i64", wsa, ctx.chunk, ctx.nout)
        e("mul.i64", wsa, wsa, t2)
        e("shr.u64", t2, ctx.c, log2(ctx.es))
        e("add.i64", wsa, wsa, t2)
        e("shl.b64", wsa, wsa, 2)
        e("add.i64", wsa, wsa, ctx.DG)
        e.free(t2)
    for k, acc in enumerate(accs):
        for w in range(1, ctx.RY):
            _vec_f32(a, "ld.shared", part, ctx.soff, k * ctx.plane + w * ctx.TW * 4, V)
            for i in range(V):
                e("add.f32", acc + i, acc + i, part + i)
        if partial:
            if k:
                t2 = e.reg()
                e("ldparam", t2, "cols")
                e("shl.b64", t2, t2, 2)
                e("add.i64", wsa, wsa, t2)
                e.free(t2)
            _vec_f32(a, "st.global", acc, wsa, 0, V)
        else:
            ad = e.addr(ctx.DG if k == 0 else ctx.DB, ctx.c)
            e.store(ad, acc, V)
            e.free(ad)
    e.free(part, k=V)
    if partial:
        e.free(wsa)
    a.label("OUT_END")
    a.pfree(pw0)


def _norm_colsum_kernel(caps, rows, cols, dt, es, ln: bool) -> ElementwiseKernel:
    """Kernel 2 of a norm's backward: dgamma = sum_rows dy * xhat (and dbeta = sum_rows dy), no
    atomics. A block of RY warps owns a tile of 32*V columns (lane l: V adjacent columns, one
    vector load a row); warp w sums rows w, w+RY, ... in registers; the RY partials of each
    column meet in shared memory and warp 0 adds them and stores. Tiles go round with a grid
    stride. When the tiles alone cannot fill the machine (a100, 768 columns of fp16: 3 tiles), the
    rows are split into chunks too: the block of (tile, chunk) writes its f32 partial sums to a
    workspace ws [chunks, nout*cols] and a third kernel (``_ws_sum_kernel``) adds the chunks up.
    Returns the kernels (one or two)."""
    op = "colsum_ln" if ln else "colsum_rms"
    ctx = _ColsumCtx(caps, rows, cols, dt, es, ln)
    e, a = ctx.e, ctx.a
    _colsum_prologue(ctx)
    _colsum_unit(ctx)
    _colsum_rows(ctx)
    _colsum_combine(ctx)
    e("bar.sync")                                  # partials read before the next tile writes
    e.free(ctx.c, ctx.chunk, ctx.rend, ctx.r0)
    e("add.i64", ctx.u, ctx.u, ctx.step)
    e("bra", "TILE")
    a.label("DONE")
    e("exit")
    for acc in ctx.accs:
        e.free(acc, k=ctx.V)
    ins = (Buf("x", (rows, cols), dt), Buf("dy", (rows, cols), dt)) + ((Buf("mean", (rows,), "fp32"),) if ln else ()) \
        + (Buf("rstd", (rows,), "fp32"),)
    finals = (Buf("dgamma", (cols,), dt, True),) + ((Buf("dbeta", (cols,), dt, True),) if ln else ())
    nchunk, partial = ctx.nchunk, ctx.partial
    ws = Buf("ws", (nchunk, ctx.nout * cols), "fp32", True, scratch=True)
    k1 = _finish(op, caps, e, 32 * ctx.RY, ctx.ntiles * nchunk, FLOPS_PER_ELEM[op] * rows * cols,
                 ins + ((ws,) if partial else finals),
                 (("rows", rows), ("cols", cols), ("rpc", ctx.rpc), ("chunks", nchunk)), "column", None, None)
    return (k1, _ws_sum_kernel(caps, cols, nchunk, dt, finals)) if partial else (k1,)


def _ws_sum_kernel(caps, cols: int, nchunk: int, dt: str, finals: tuple) -> ElementwiseKernel:
    """The chunks of a column-sum workspace ws [chunks, nout*cols] (f32) added up: thread i (grid
    stride) sums column i over the chunks and stores it, in the storage dtype, to dgamma[i] or
    dbeta[i - cols]."""
    nout = len(finals)
    es = ELEM_BYTES[dt]
    U = 4
    e = ElementwiseAsm(f"grad_params_sum_{dt}_{nout}", ("ws",) + tuple(b.name for b in finals) + ("cols", "chunks"),
                       dt, es, "thread", FLAT_THREADS)
    a = e.a
    i, t, stride, tot, nch, rowb, WS = (e.reg() for _ in range(7))
    e("s2r", i, "%ctaid.x")
    e("s2r", t, "%ntid.x")
    e("s2r", stride, "%nctaid.x")
    e("mul.i64", stride, stride, t)
    e("mul.i64", i, i, t)
    e("s2r", t, "%tid.x")
    e("add.i64", i, i, t)
    e("ldparam", tot, "cols")
    e("mul.i64", rowb, tot, 4 * nout)              # bytes of one chunk's row
    colsr = e.reg()
    e("mov.b64", colsr, tot)
    e("mul.i64", tot, tot, nout)
    e("ldparam", nch, "chunks")
    e("ldparam", WS, "ws")
    outs = [e.reg() for _ in finals]
    for r, b in zip(outs, finals):
        e("ldparam", r, b.name)
    p, pc = a.pred(), a.pred()
    a.label("COL")
    e("setp.ge.i64", p, i, tot)
    e("bra", "DONE", p=p)
    acc, ptr, ch, v = e.reg(), e.reg(), e.reg(), e.reg(U)
    e("mov.f32", acc, 0.0)
    e("shl.b64", ptr, i, 2)
    e("add.i64", ptr, ptr, WS)
    e("mov.b64", ch, U)
    a.label("CHUNK4")                              # U chunks at a time: U loads in flight
    e("setp.gt.i64", pc, ch, nch)
    e("bra", "CHUNK4_END", p=pc)
    for j in range(U):
        e("ld.global.b32", v + j, Mem(ptr, 0))
        e("add.i64", ptr, ptr, rowb)
    for j in range(U):
        e("add.f32", acc, acc, v + j)
    e("add.i64", ch, ch, U)
    e("bra", "CHUNK4")
    a.label("CHUNK4_END")
    e("sub.i64", ch, ch, U)
    a.label("CHUNK")
    e("setp.ge.i64", pc, ch, nch)
    e("bra", "CHUNK_END", p=pc)
    e("ld.global.b32", v, Mem(ptr, 0))
    e("add.f32", acc, acc, v)
    e("add.i64", ptr, ptr, rowb)
    e("add.i64", ch, ch, 1)
    e("bra", "CHUNK")
    a.label("CHUNK_END")
    e("shl.b64", ptr, i, log2(es))
    e("add.i64", ptr, ptr, outs[0])                # dgamma + i
    if nout == 2:                                  # i >= cols: dbeta + (i - cols)
        e("setp.ge.i64", pc, i, colsr)
        e("sub.i64", ch, i, colsr)
        e("shl.b64", ch, ch, log2(es))
        e("add.i64", ch, ch, outs[1])
        e("selp.b64", ptr, ch, ptr, pc)
    e.store(ptr, acc, 1)
    e.free(acc, ptr, ch)
    e.free(v, k=U)
    e("add.i64", i, i, stride)
    e("bra", "COL")
    a.label("DONE")
    e("exit")
    ws = Buf("ws", (nchunk, nout * cols), "fp32", False, scratch=True)
    return _finish("colsum_chunks", caps, e, FLAT_THREADS, ceil_div(nout * cols, FLAT_THREADS), nout * cols * nchunk,
                   (ws,) + finals, (("cols", cols), ("chunks", nchunk)), "thread", None, None)


def chunk_sum_kernel(caps, n: int, chunks: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y[i] = sum over c of ws[c, i] (f32 partial results, such as a split-K GEMM's), stored in
    the storage dtype: the column-sum workspace reduction with one output."""
    dt = _dtype("chunk_sum", dtype)
    _pos("chunk_sum", n=n, chunks=chunks)
    _target("chunk_sum", caps)
    return _ws_sum_kernel(caps, n, chunks, dt, (Buf("y", (n,), dt, True),))


def _norm_grad(op, caps, rows, cols, dtype, eps, team, ln: bool) -> KernelChain:
    dt, es, VB, tm, BT = _norm_setup(op, caps, rows, cols, dtype, eps, team)
    k1 = _norm_dx_kernel(caps, rows, cols, dt, es, VB, tm, BT, ln)
    ksum = _norm_colsum_kernel(caps, rows, cols, dt, es, ln)

    def gen(rng):
        d = _norm_gen(rows, cols, dt, False)(rng)
        d["dy"] = _normal(rng, (rows, cols), dt)
        x = to_float(d["x"], dt)
        if ln:
            mu = x.mean(axis=1)
            d["mean"] = mu.astype(np.float32)
            d["rstd"] = (1.0 / np.sqrt(((x - mu[:, None]) ** 2).mean(axis=1) + eps)).astype(np.float32)
        else:
            d["rstd"] = (1.0 / np.sqrt((x * x).mean(axis=1) + eps)).astype(np.float32)
        return d

    def ref(v):
        x, dy, g, r = v["x"], v["dy"], v["gamma"], v["rstd"][:, None]
        gdy = g * dy
        if ln:
            xhat = (x - v["mean"][:, None]) * r
            dx = r * (gdy - gdy.mean(axis=1, keepdims=True) - xhat * (gdy * xhat).mean(axis=1, keepdims=True))
            return {"dx": dx, "dgamma": (dy * xhat).sum(axis=0), "dbeta": dy.sum(axis=0)}
        dx = r * gdy - x * r ** 3 * (gdy * x).mean(axis=1, keepdims=True)
        return {"dx": dx, "dgamma": (dy * x * r).sum(axis=0)}

    return KernelChain(op=op, kernels=(k1,) + ksum, dtype=dt, draw_inputs=gen, ref_outputs=ref)


def layernorm_grad_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-5, *,
                          team: Optional[str] = None) -> KernelChain:
    """Layernorm backward as two kernels on shared buffers: (1) dx [rows, cols] from x, dy, gamma
    and the forward's saved mean, rstd [rows] (f32; eps is already in rstd: the kernels do not
    use it, ``random_inputs`` does, to make the statistics); (2) dgamma = sum_rows dy * xhat, dbeta = sum_rows dy ([cols], storage
    dtype). The reference takes the saved statistics as given (the forward's own outputs)."""
    return _norm_grad("layernorm_grad", caps, rows, cols, dtype, eps, team, True)


def rmsnorm_grad_kernel(caps, rows: int, cols: int, dtype: str = "fp16", eps: float = 1e-6, *,
                        team: Optional[str] = None) -> KernelChain:
    """RMSNorm backward: (1) dx = rstd * g * dy - x * rstd^3 * mean(g * dy * x) per row, from the
    forward's saved rstd [rows] (f32); (2) dgamma = sum_rows dy * x * rstd."""
    return _norm_grad("rmsnorm_grad", caps, rows, cols, dtype, eps, team, False)


# ----------------------------------------------------------------------------- flat elementwise
FLAT_THREADS = 256
MAX_UNROLL = 16             # choice: vectors a thread loads before its math (registers: 2 x 4 a vector)


def _flat_kernel(op: str, caps, n: int, dtype, ins: tuple, outs: tuple, math_fn: Callable, gen, ref,
                 unroll: int = 1, fscalars: tuple = (), narrow: Optional[dict] = None,
                 iscalars: tuple = (), index: bool = False) -> ElementwiseKernel:
    """A grid-stride kernel over n elements of same-shaped buffers: thread g takes the 16-byte
    vectors g, g + G, g + 2G, ... (G = threads in the grid), then one element of the tail.
    math_fn(e, vals: dict name -> first f32 register, k) returns {out name: first register}
    (it may overwrite the input registers). ``unroll`` > 1: while a thread has that many whole
    vectors left it loads all of them before the math (more loads in flight, as NCCL's
    reduce-copy loop does), then takes the rest one at a time. ``fscalars``: (name, value) f32
    parameters, loaded once into ``e.fs[name]`` for the math; ``iscalars``: (name, value) integer
    ones, in ``e.fs`` too. ``narrow``: buffer name -> the dtype of a buffer narrower than
    ``dtype`` (16-bit beside fp32, or a u8 mask): the same elements at a fraction of the byte
    offset (not with ``unroll``). ``index``: the math finds the index of its first element in
    ``e.idx``."""
    dt = _dtype(op, dtype)
    narrow = dict(narrow or {})
    if narrow and (unroll > 1 or any(d not in BUF_BYTES or BUF_BYTES[d] >= ELEM_BYTES[dt] for d in narrow.values())):
        raise InputError(f"{op} kernel", f"narrow buffers {narrow} in an {dt} kernel (unroll {unroll})",
                         "buffers narrower than the kernel's dtype, without unroll")
    shift = {name: log2(ELEM_BYTES[dt] // BUF_BYTES[d]) for name, d in narrow.items()}
    _pos(op, n=n)
    _target(op, caps)
    es = ELEM_BYTES[dt]
    VB = 16
    fnames = tuple(name for name, _ in fscalars) + tuple(name for name, _ in iscalars)
    e = ElementwiseAsm(f"{op}_{dt}", ins + outs + ("n",) + fnames, dt, VB, "thread", FLAT_THREADS)
    gid, t, stride = e.reg(), e.reg(), e.reg()
    e("s2r", gid, "%ctaid.x")
    e("s2r", t, "%ntid.x")
    e("s2r", stride, "%nctaid.x")
    e("mul.i64", stride, stride, t)
    e("shl.b64", stride, stride, log2(VB))        # bytes between a thread's vectors
    e("mul.i64", gid, gid, t)
    e("s2r", t, "%tid.x")
    e("add.i64", gid, gid, t)
    e.free(t)
    e.j0v, e.j0s = e.reg(), e.reg()
    e("shl.b64", e.j0v, gid, log2(VB))
    e("shl.b64", e.j0s, gid, log2(es))
    nb = e.reg()
    e("ldparam", nb, "n")
    e("shl.b64", nb, nb, log2(es))
    base = {}
    for name in ins + outs:
        base[name] = e.reg()
        e("ldparam", base[name], name)
    e.fs = {name: e.fparam(name) for name in fnames}

    e.const(1.0)                                   # constants the math uses, set on every path
    e.const(0.5)

    def at(ad, name, j):
        if name in narrow:                         # a narrower buffer: a fraction of the byte offset
            e("shr.u64", ad, j, shift[name])
            e("add.i64", ad, base[name], ad)
        else:
            e("add.i64", ad, base[name], j)

    def body(j, k):
        ad = e.reg()
        if index:
            e.idx = e.reg()
            e("shr.u64", e.idx, j, log2(es))
        vals = {}
        for name in ins:
            at(ad, name, j)
            vals[name] = e.load(ad, k, dt=narrow.get(name))
        res = math_fn(e, vals, k)
        for name in outs:
            at(ad, name, j)
            e.store(ad, res[name], k, dt=narrow.get(name))
        e.free(ad)
        if index:
            e.free(e.idx)
        for r in set(vals.values()) | set(res.values()):
            e.free(r, k=k)

    if unroll > 1:
        _unrolled(e, nb, stride, unroll, ins, outs, base, math_fn)
    e.loop(nb, body, step_b=stride)
    e("exit")
    buffers = tuple(Buf(x, (n,), narrow.get(x, dt)) for x in ins) + \
        tuple(Buf(x, (n,), narrow.get(x, dt), True) for x in outs)
    scalars = (("n", n),) + tuple((name, _f32_bits(_finite(op, name, v))) for name, v in fscalars) + \
        tuple((name, int(v)) for name, v in iscalars)
    return _finish(op, caps, e, FLAT_THREADS, ceil_div(n, FLAT_THREADS * (VB // es)), FLOPS_PER_ELEM[op] * n, buffers,
                   scalars, "thread", gen, ref)


def _unrolled(e: ElementwiseAsm, nb: Reg, stride: Reg, U: int, ins: tuple, outs: tuple, base: dict,
              math_fn: Callable) -> None:
    """The unrolled part of a flat kernel: groups of U whole vectors stride bytes apart, every load
    of a group issued before its math; leaves e.j0v at the first vector it did not take."""
    V = e.VB // e.es
    j, lim, step, p = e.reg(), e.reg(), e.reg(), e.a.pred()
    e("and.b64", lim, nb, -e.VB)                  # the vectors' end ...
    e("mul.i64", step, stride, U - 1)
    e("sub.i64", lim, lim, step)                  # ... less U - 1 strides: a group starting below is whole
    e("mul.i64", step, stride, U)
    e("mov.b64", j, e.j0v)
    e.a.label("LU")
    e("setp.ge.i64", p, j, lim)
    e("bra", "LU_end", p=p)
    ad = e.reg()
    raws = []
    for u in range(U):
        raws.append({})
        for name in ins:
            e("add.i64", ad, base[name], j)
            if u:
                e("mad.i64", ad, stride, u, ad)
            raws[u][name] = e.load_raw(ad, V)
    for u in range(U):
        vals = {name: e.unpack(raws[u][name], V) for name in ins}
        res = math_fn(e, vals, V)
        for name in outs:
            e("add.i64", ad, base[name], j)
            if u:
                e("mad.i64", ad, stride, u, ad)
            e.store(ad, res[name], V)
        for r in set(vals.values()) | set(res.values()):
            e.free(r, k=V)
    e.free(ad)
    e("add.i64", j, j, step)
    e("bra", "LU")
    e.a.label("LU_end")
    e("mov.b64", e.j0v, j)
    e.free(j, lim, step)
    e.a.pfree(p)


def gelu_tanh(e: ElementwiseAsm, x: Reg, k: int, t: Reg) -> None:
    """t[i] = tanh(K (x + A x^3)) for k values (t, x: first registers)."""
    one = e.const(1.0)
    for i in range(k):
        e("mul.f32", t + i, x + i, x + i)
        e("fma.f32", t + i, t + i, GELU_A, one)
        e("mul.f32", t + i, t + i, x + i)
        e("mul.f32", t + i, t + i, GELU_K)
        e("tanh.f32", t + i, t + i)


def _gelu_ref_parts(x):
    u = GELU_K * (x + GELU_A * x ** 3)
    return np.tanh(u)


def gelu_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) over n elements (GPT-2's GELU)."""
    def math_fn(e, v, k):
        x = v["x"]
        t = e.reg(k)
        gelu_tanh(e, x, k, t)
        for i in range(k):
            e("mul.f32", x + i, x + i, 0.5)
            e("fma.f32", x + i, x + i, t + i, x + i)     # h + h t
        e.free(t, k=k)
        return {"y": x}

    def gen(rng):
        return {"x": _normal(rng, (n,), _dtype("gelu", dtype), 2.0)}

    def ref(v):
        x = v["x"]
        return {"y": 0.5 * x * (1.0 + _gelu_ref_parts(x))}

    return _flat_kernel("gelu", caps, n, dtype, ("x",), ("y",), math_fn, gen, ref)


def gelu_grad_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """dx = dy * gelu'(x) of the tanh-approximation GELU:
    gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(...)."""
    def math_fn(e, v, k):
        x, dy = v["x"], v["dy"]
        one, half = e.const(1.0), e.const(0.5)
        t, s = e.reg(k), e.reg()
        gelu_tanh(e, x, k, t)
        for i in range(k):
            e("neg.f32", s, t + i)
            e("fma.f32", s, s, t + i, one)                # 1 - t^2
            e("fma.f32", t + i, t + i, 0.5, half)         # 0.5 (1 + t)
            e("mul.f32", s, s, x + i)
            e("mul.f32", s, s, 0.5 * GELU_K)              # 0.5 x (1 - t^2) K
            e("mul.f32", x + i, x + i, x + i)
            e("fma.f32", x + i, x + i, 3.0 * GELU_A, one)  # 1 + 3 A x^2
            e("fma.f32", x + i, s, x + i, t + i)
            e("mul.f32", x + i, x + i, dy + i)
        e.free(t, k=k)
        e.free(s)
        return {"dx": x}

    dt = _dtype("gelu_grad", dtype)

    def gen(rng):
        return {"x": _normal(rng, (n,), dt, 2.0), "dy": _normal(rng, (n,), dt)}

    def ref(v):
        x = v["x"]
        t = _gelu_ref_parts(x)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_K * (1 + 3 * GELU_A * x * x)
        return {"dx": v["dy"] * d}

    return _flat_kernel("gelu_grad", caps, n, dtype, ("x", "dy"), ("dx",), math_fn, gen, ref)


def add_kernel(caps, n: int, dtype: str = "fp16", unroll: int = 1) -> ElementwiseKernel:
    """y = a + b over n elements (the residual connection; a collective's reduction, unrolled)."""
    def math_fn(e, v, k):
        a, b = v["a"], v["b"]
        for i in range(k):
            e("add.f32", a + i, a + i, b + i)
        return {"y": a}

    dt = _dtype("add", dtype)

    def gen(rng):
        return {"a": _normal(rng, (n,), dt), "b": _normal(rng, (n,), dt)}

    def ref(v):
        return {"y": v["a"] + v["b"]}

    if not isinstance(unroll, int) or not 1 <= unroll <= MAX_UNROLL:
        raise InputError("add kernel", f"unroll {unroll!r}", f"an integer 1 to {MAX_UNROLL}")
    return _flat_kernel("add", caps, n, dtype, ("a", "b"), ("y",), math_fn, gen, ref, unroll)


def relu_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = max(x, 0) over n elements."""
    def math_fn(e, v, k):
        x = v["x"]
        for i in range(k):
            e("max.f32", x + i, x + i, 0.0)
        return {"y": x}

    dt = _dtype("relu", dtype)
    return _flat_kernel("relu", caps, n, dtype, ("x",), ("y",), math_fn,
                        lambda rng: {"x": _normal(rng, (n,), dt)}, lambda v: {"y": np.maximum(v["x"], 0.0)})


def relu_grad_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """dx = dy where x > 0, else 0 (the subgradient at 0 is 0, as torch's)."""
    def math_fn(e, v, k):
        x, dy = v["x"], v["dy"]
        p = e.a.pred()
        for i in range(k):
            e("setp.gt.f32", p, x + i, 0.0)
            e("mov.f32", x + i, 0.0)
            e("mov.b64", x + i, dy + i, p=p)
        e.a.pfree(p)
        return {"dx": x}

    dt = _dtype("relu_grad", dtype)
    return _flat_kernel("relu_grad", caps, n, dtype, ("x", "dy"), ("dx",), math_fn,
                        lambda rng: {"x": _normal(rng, (n,), dt), "dy": _normal(rng, (n,), dt)},
                        lambda v: {"dx": np.where(v["x"] > 0, v["dy"], 0.0)})


# ----------------------------------------------------------------------------- SwiGLU
ADAMW_BUFFERS = (("p", "g", "m", "v"), ("p_out", "m_out", "v_out"))


def adamw_scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> tuple:
    """The f32 parameters of the AdamW kernel: the moments' decay rates and their complements, the
    bias corrections folded into the step size (lr / (1 - b1^t)) and the denominator's scale
    (1 / sqrt(1 - b2^t)), eps, and the decoupled decay factor (1 - lr wd)."""
    for name, v, lo, hi in (("lr", lr, 0.0, 1.0), ("beta1", beta1, 0.0, 1.0), ("beta2", beta2, 0.0, 1.0),
                            ("eps", eps, 0.0, 1.0), ("weight_decay", weight_decay, 0.0, 1.0)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= float(v) < hi:
            raise InputError("adamw", f"{name} = {v!r}", f"{name} a number in [{lo:g}, {hi:g})")
    _pos("adamw", step=step)
    c1 = 1.0 - beta1 ** step
    c2 = 1.0 - beta2 ** step
    if c1 <= 0.0 or c2 <= 0.0:
        raise InputError("adamw", f"beta1 = {beta1!r}, beta2 = {beta2!r}", "betas above 0 (bias corrections > 0)")
    return (("b1", beta1), ("omb1", 1.0 - beta1), ("b2", beta2), ("omb2", 1.0 - beta2),
            ("rc2", 1.0 / math.sqrt(c2)), ("eps", eps), ("decay", 1.0 - lr * weight_decay), ("nstep", -lr / c1))


def adamw_math(e, v, k):
    """One AdamW update of k parameters in f32 registers (see adamw_kernel); the parameters'
    registers come from ``e.fs``."""
    f = e.fs
    p, g, m, vv = v["p"], v["g"], v["m"], v["v"]
    t = e.reg()
    for i in range(k):
        e("mul.f32", m + i, m + i, f["b1"])
        e("fma.f32", m + i, g + i, f["omb1"], m + i)      # m = b1 m + (1 - b1) g
        e("mul.f32", t, g + i, g + i)
        e("mul.f32", vv + i, vv + i, f["b2"])
        e("fma.f32", vv + i, t, f["omb2"], vv + i)        # v = b2 v + (1 - b2) g^2
        e("sqrt.f32", t, vv + i)
        e("fma.f32", t, t, f["rc2"], f["eps"])            # sqrt(v / (1 - b2^t)) + eps
        e("rcp.f32", t, t)
        e("mul.f32", t, t, m + i)
        e("mul.f32", p + i, p + i, f["decay"])           # decoupled weight decay
        e("fma.f32", p + i, t, f["nstep"], p + i)         # p -= lr / (1 - b1^t) m / (...)
    e.free(t)
    return {"p_out": p, "m_out": m, "v_out": vv}


def adamw_reference(scalars: dict, x: dict) -> dict:
    """The AdamW update in float64 from the kernel's f32 parameters (as torch.optim.AdamW)."""
    f = {k: float(np.float32(v)) for k, v in scalars.items()}
    m = f["b1"] * x["m"] + f["omb1"] * x["g"]
    v = f["b2"] * x["v"] + f["omb2"] * x["g"] ** 2
    p = x["p"] * f["decay"] + f["nstep"] * m / (np.sqrt(v) * f["rc2"] + f["eps"])
    return {"p_out": p, "m_out": m, "v_out": v}


def adamw_inputs(rng, n: int) -> dict:
    """Master weights, a gradient, and moments as after some steps (v >= 0)."""
    return {"p": _normal(rng, (n,), "fp32", 0.02), "g": _normal(rng, (n,), "fp32", 1e-3),
            "m": _normal(rng, (n,), "fp32", 1e-3), "v": to_host((rng.random(n) * 1e-6).astype(np.float32), "fp32")}


def adamw_kernel(caps, n: int, *, lr: float = 6e-5, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8,
                 weight_decay: float = 0.1, step: int = 1000) -> ElementwiseKernel:
    """One AdamW step over n fp32 master parameters (mixed-precision training keeps the weights,
    their gradient and both moments in f32): reads p, g, m, v and writes p_out, m_out, v_out
    (the same bytes as an update in place, 28 a parameter). Defaults: BLOOM's hyperparameters;
    the step only sets the bias corrections."""
    sc = adamw_scalars(lr, beta1, beta2, eps, weight_decay, step)
    ins, outs = ADAMW_BUFFERS
    return _flat_kernel("adamw", caps, n, "fp32", ins, outs, adamw_math, lambda rng: adamw_inputs(rng, n),
                        lambda x: adamw_reference(dict(sc), x), fscalars=sc)


def grad_accum_math(e, v, k):
    for i in range(k):
        e("add.f32", v["acc"] + i, v["acc"] + i, v["g"] + i)
    return {"acc_out": v["acc"]}


def grad_accum_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """acc_out = acc + g over n parameters: a micro-batch's half-precision weight gradient g added
    into the fp32 accumulation buffer (Megatron-LM's main_grad, DeepSpeed's fp32 gradients under
    bf16): 10 bytes a parameter."""
    dt = _dtype("grad_accum", dtype)
    if dt == "fp32":
        raise InputError("grad_accum kernel", "an fp32 gradient", "fp16 or bf16 (fp32 training accumulates in place)")

    def gen(rng):
        return {"acc": _normal(rng, (n,), "fp32", 1e-2), "g": _normal(rng, (n,), dt, 1e-2)}

    return _flat_kernel("grad_accum", caps, n, "fp32", ("acc", "g"), ("acc_out",), grad_accum_math, gen,
                        lambda v: {"acc_out": v["acc"] + v["g"]}, narrow={"g": dt})


# ----------------------------------------------------------------------------- dropout
# Which elements dropout keeps: reference.dropout_keep's hash of (element index + seed).
MAX_DROP = 0.999            # choice: a probability close to 1 keeps nothing worth scaling


def dropout_scalars(op: str, p: float, seed: int) -> tuple:
    """(f32 scalars, integer scalars) of a dropout kernel: the kept elements' scale 1 / (1 - p),
    the hash's seed and its keep threshold."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= float(p) <= MAX_DROP:
        raise InputError(f"{op} kernel", f"dropout probability {p!r}", f"a number from 0 to {MAX_DROP}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= M32:
        raise InputError(f"{op} kernel", f"seed {seed!r}", f"a whole number from 0 to {M32}")
    return (("scale", 1.0 / (1.0 - float(p))),), (("seed", int(seed)), ("thresh", int(round(float(p) * 2.0 ** 32))))


def _keep_pred(e, i: int, pk) -> None:
    """pk = element e.idx + i is kept (dropout_keep's hash, in 64-bit integer registers)."""
    h, t = e.reg(), e.reg()
    e("add.i64", h, e.idx, i)
    e("add.i64", h, h, e.fs["seed"])
    e("and.b64", h, h, M32)
    for mul, sh in zip(HASH_MUL, HASH_SHIFT):
        e("mul.i64", h, h, mul)
        e("and.b64", h, h, M32)
        e("shr.u64", t, h, sh)
        e("xor.b64", h, h, t)
    e("setp.ge.i64", pk, h, e.fs["thresh"])
    e.free(h, t)


def dropout_math(src: str, add: Optional[str] = None):
    """The math of dropout (y = src kept and scaled, or add + that) with its mask."""
    def math_fn(e, v, k):
        x = v[src]
        m, t = e.reg(k), e.reg()
        pk = e.a.pred()
        for i in range(k):
            _keep_pred(e, i, pk)
            e("mov.f32", t, 0.0)
            e("mov.b64", t, e.fs["scale"], p=pk)
            e("mul.f32", x + i, x + i, t)
            if add is not None:
                e("add.f32", x + i, x + i, v[add] + i)
            e("mov.b64", m + i, 0)
            e("mov.b64", m + i, 1, p=pk)
        e.free(t)
        e.a.pfree(pk)
        return {"y": x, "mask": m}
    return math_fn


def dropout_grad_math(e, v, k):
    dy, m = v["dy"], v["mask"]
    t = e.reg()
    pk = e.a.pred()
    for i in range(k):
        e("setp.ne.i64", pk, m + i, 0)
        e("mov.f32", t, 0.0)
        e("mov.b64", t, e.fs["scale"], p=pk)
        e("mul.f32", dy + i, dy + i, t)
    e.free(t)
    e.a.pfree(pk)
    return {"dx": dy}


def _dropout_ref(n, p, seed, add: bool):
    scale = dropout_scale(p)

    def ref(v):                                   # the mask drawn only when a check asks for it
        keep = dropout_keep(n, p, seed)
        y = np.where(keep, v["x"] * scale, 0.0)
        return {"y": y + v["a"] if add else y, "mask": keep.astype(np.float64)}
    return ref


def dropout_kernel(caps, n: int, p: float, seed: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = x / (1 - p) where kept, 0 where dropped, and the mask (a byte an element) for the
    backward: torch.nn.functional.dropout in training (attention's probabilities)."""
    dt = _dtype("dropout", dtype)
    fs, ints = dropout_scalars("dropout", p, seed)
    return _flat_kernel("dropout", caps, n, dt, ("x",), ("y", "mask"), dropout_math("x"),
                        lambda rng: {"x": _normal(rng, (n,), dt)}, _dropout_ref(n, p, seed, False),
                        fscalars=fs, iscalars=ints, narrow={"mask": MASK_DTYPE}, index=True)


def dropout_add_kernel(caps, n: int, p: float, seed: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = a + dropout(x), and the mask: Megatron-LM's bias-dropout-add after the projection and
    FFN-out (no bias here), the residual a kept whole."""
    dt = _dtype("dropout_add", dtype)
    fs, ints = dropout_scalars("dropout_add", p, seed)
    return _flat_kernel("dropout_add", caps, n, dt, ("a", "x"), ("y", "mask"), dropout_math("x", "a"),
                        lambda rng: {"a": _normal(rng, (n,), dt), "x": _normal(rng, (n,), dt)},
                        _dropout_ref(n, p, seed, True), fscalars=fs, iscalars=ints, narrow={"mask": MASK_DTYPE},
                        index=True)


def dropout_grad_kernel(caps, n: int, p: float, dtype: str = "fp16") -> ElementwiseKernel:
    """dx = dy / (1 - p) where the mask kept the element, 0 elsewhere."""
    dt = _dtype("dropout_grad", dtype)
    fs, _ = dropout_scalars("dropout_grad", p, 0)
    scale = dropout_scale(p)

    def gen(rng):
        return {"dy": _normal(rng, (n,), dt), "mask": (rng.random(n) >= p).astype(np.uint8)}

    return _flat_kernel("dropout_grad", caps, n, dt, ("dy", "mask"), ("dx",), dropout_grad_math, gen,
                        lambda v: {"dx": np.where(v["mask"] != 0, v["dy"] * scale, 0.0)}, fscalars=fs,
                        narrow={"mask": MASK_DTYPE})


def cast_math(e, v, k):
    return {"y": v["x"]}


def cast_kernel(caps, n: int, dtype: str = "fp16") -> ElementwiseKernel:
    """y = x over n elements, a 16-bit x widened to fp32 (torch's ``.to(torch.float32)``)."""
    dt = _dtype("cast", dtype)
    if dt == "fp32":
        raise InputError("cast kernel", "an fp32 input", "fp16 or bf16 (the output is fp32)")
    return _flat_kernel("cast", caps, n, "fp32", ("x",), ("y",), cast_math,
                        lambda rng: {"x": _normal(rng, (n,), dt)}, lambda v: {"y": v["x"]}, narrow={"x": dt})


def sigmoid(e: ElementwiseAsm, g: Reg, s: Reg) -> None:
    """s = sigmoid(g) = 0.5 tanh(g / 2) + 0.5."""
    e("mul.f32", s, g, 0.5)
    e("tanh.f32", s, s)
    e("fma.f32", s, s, 0.5, e.const(0.5))


def _swiglu(op: str, caps, rows: int, ffn: int, dtype, team, grad: bool) -> ElementwiseKernel:
    dt = _dtype(op, dtype)
    _pos(op, rows=rows, ffn=ffn)
    _target(op, caps)
    es = ELEM_BYTES[dt]
    VB = _vec_bytes(ffn * es, es)
    tm, BT = _choose_team(caps, rows, ffn, VB // es, team)
    params = ("x", "dy", "dx", "rows", "ffn") if grad else ("x", "y", "rows", "ffn")
    e = ElementwiseAsm(f"{op}_{dt}_{tm}_v{VB}", params, dt, VB, tm, BT)
    tt, row, step = e.team_setup()
    rows_r, fb, X, Y = e.reg(), e.reg(), e.reg(), e.reg()
    DX = e.reg() if grad else None
    e("ldparam", rows_r, "rows")
    e("ldparam", fb, "ffn")
    e("shl.b64", fb, fb, log2(es))                 # bytes of one half-row
    e("ldparam", X, "x")
    e("ldparam", Y, "dy" if grad else "y")
    if grad:
        e("ldparam", DX, "dx")
    one = e.const(1.0)
    e.const(0.5)

    def body():
        ro, pg, pu, po = e.reg(), e.reg(), e.reg(), e.reg()
        e("mul.i64", ro, row, fb)                  # row offset in y / dy ([rows, ffn])
        e("add.i64", po, Y, ro)
        e("shl.b64", ro, ro, 1)                    # row offset in x / dx ([rows, 2 ffn])
        e("add.i64", pg, X, ro)
        e("add.i64", pu, pg, fb)
        pdg = pdu = None
        if grad:
            pdg, pdu = e.reg(), e.reg()
            e("add.i64", pdg, DX, ro)
            e("add.i64", pdu, pdg, fb)
        e.free(ro)

        def elem(j, n):
            ad = e.addr(pg, j)
            g = e.load(ad, n)
            e("add.i64", ad, pu, j)
            u = e.load(ad, n)
            s = e.reg()
            if not grad:
                for i in range(n):
                    sigmoid(e, g + i, s)
                    e("mul.f32", g + i, g + i, s)
                    e("mul.f32", g + i, g + i, u + i)      # silu(gate) * up
                e("add.i64", ad, po, j)
                e.store(ad, g, n)
            else:
                e("add.i64", ad, po, j)
                d = e.load(ad, n)
                w = e.reg()
                for i in range(n):
                    sigmoid(e, g + i, s)
                    e("mul.f32", w, g + i, s)               # silu
                    e("mul.f32", u + i, u + i, d + i)       # dy * up
                    e("mul.f32", d + i, d + i, w)           # d up = dy * silu
                    e("sub.f32", g + i, one, s)             # 1 - sig
                    e("fma.f32", g + i, w, g + i, s)        # silu' = sig + silu (1 - sig)
                    e("mul.f32", g + i, g + i, u + i)       # d gate
                e("add.i64", ad, pdg, j)
                e.store(ad, g, n)
                e("add.i64", ad, pdu, j)
                e.store(ad, d, n)
                e.free(w)
                e.free(d, k=n)
            e.free(ad, s)
            e.free(g, k=n)
            e.free(u, k=n)

        e.loop(fb, elem)
        e.free(pg, pu, po)
        if grad:
            e.free(pdg, pdu)

    e.row_loop(row, step, rows_r, body)
    if grad:
        buffers = (Buf("x", (rows, 2 * ffn), dt), Buf("dy", (rows, ffn), dt), Buf("dx", (rows, 2 * ffn), dt, True))
    else:
        buffers = (Buf("x", (rows, 2 * ffn), dt), Buf("y", (rows, ffn), dt, True))

    def gen(rng):
        d = {"x": _normal(rng, (rows, 2 * ffn), dt, 2.0)}
        if grad:
            d["dy"] = _normal(rng, (rows, ffn), dt)
        return d

    def ref(v):
        g, u = v["x"][:, :ffn], v["x"][:, ffn:]
        sig = 1.0 / (1.0 + np.exp(-g))
        if not grad:
            return {"y": g * sig * u}
        dy = v["dy"]
        dsilu = sig * (1.0 + g * (1.0 - sig))
        return {"dx": np.concatenate([dy * u * dsilu, dy * g * sig], axis=1)}

    teams = ceil_div(rows, 4) if tm == "warp" else rows
    return _finish(op, caps, e, BT, teams, FLOPS_PER_ELEM[op] * rows * ffn, buffers, (("rows", rows), ("ffn", ffn)),
                   tm, gen, ref)


def swiglu_kernel(caps, rows: int, ffn: int, dtype: str = "fp16", *, team: Optional[str] = None) -> ElementwiseKernel:
    """y [rows, ffn] = silu(gate) * up with x [rows, 2 ffn] = [gate | up] (LLaMA's FFN input after
    the fused gate/up projection); silu(g) = g * sigmoid(g), sigmoid = 0.5 tanh(g/2) + 0.5."""
    return _swiglu("swiglu", caps, rows, ffn, dtype, team, False)


def swiglu_grad_kernel(caps, rows: int, ffn: int, dtype: str = "fp16", *,
                       team: Optional[str] = None) -> ElementwiseKernel:
    """dx [rows, 2 ffn] = [dy * up * silu'(gate) | dy * silu(gate)] from x [rows, 2 ffn] and dy [rows, ffn]."""
    return _swiglu("swiglu_grad", caps, rows, ffn, dtype, team, True)


# ----------------------------------------------------------------------------- mixture of experts
MOE_MAX_TOP_K = 16          # choice: choices a token unrolled in the routing kernels (published MoEs use 1-8)
MOE_ASSIGN_THREADS = 128    # a block per expert: its threads split the token x choice list
MOE_ROW_THREADS = 128       # dispatch / combine: a block a row


def _moe_sizes(op: str, caps, threads, **sizes) -> None:
    """Sizes >= 1, top_k within bounds, and the target: a GPU, or a Sunway machine when the caller
    asks for one warp a block (elementwise_sunway: a thread block is one CPE, its lanes the vector;
    these kernels then reach memory by ld.global / st.global, not DMA)."""
    _pos(op, **sizes)
    if not (caps.family == "sunway" and threads == caps.warp_width == 32):
        _target(op, caps)
    if "top_k" in sizes and sizes["top_k"] > MOE_MAX_TOP_K:
        raise InputError(op, f"top_k = {sizes['top_k']}", f"1 to {MOE_MAX_TOP_K}")
    if "top_k" in sizes and "experts" in sizes and sizes["top_k"] > sizes["experts"]:
        raise InputError(op, f"top_k {sizes['top_k']} > experts {sizes['experts']}", "top_k <= experts")


def _row_loop_bytes(e: ElementwiseAsm, rb: int, vec) -> None:
    """e.loop over a row of ``rb`` bytes (a constant) with body ``vec``."""
    lim = e.reg()
    e("mov.b64", lim, rb)
    e.loop(lim, vec)
    e.free(lim)


def _random_routes(rng, tokens: int, experts: int, top_k: int) -> np.ndarray:
    """route_e [tokens, top_k] (int32) of random gate logits, as the reference routes them."""
    from archsim.workloads.reference import ref_moe_route

    return ref_moe_route(rng.standard_normal((tokens, experts)), top_k, 1)[0].astype(np.int32)


def _token_threads(caps, tokens: int) -> int:
    """Threads a block of a thread-a-token kernel: few enough that the tokens' blocks spread over
    every core (a warp at least, FLAT_THREADS at most)."""
    per_core = -(-tokens // caps.cores_total)
    return max(32, min(FLAT_THREADS, 1 << max(per_core - 1, 0).bit_length()))


def _token_thread(e: ElementwiseAsm) -> tuple:
    """(t, stride, tmp): this thread's first token and the grid's thread count (a thread a token)."""
    t, stride, tmp = e.reg(), e.reg(), e.reg()
    e("s2r", t, "%ctaid.x")
    e("s2r", tmp, "%ntid.x")
    e("mul.i64", t, t, tmp)
    e("s2r", stride, "%tid.x")
    e("add.i64", t, t, stride)
    e("s2r", stride, "%nctaid.x")
    e("mul.i64", stride, stride, tmp)
    return t, stride, tmp


class _RowScan:
    """Passes over one token's row of logits [row, end) (bytes), an element at a time: ``i`` the
    element's index, ``ad`` its address; ``stats`` leaves the row's max in mx and 1 / (sum of
    exp(x - max)) in sm."""

    def __init__(self, e: ElementwiseAsm, es: int):
        self.e, self.es = e, es
        self.row, self.end, self.ad, self.i = e.reg(), e.reg(), e.reg(), e.reg()
        self.mx, self.sm = e.reg(), e.reg()
        self.p = e.a.pred()

    def scan(self, label: str, body) -> None:
        e = self.e
        e("mov.b64", self.ad, self.row)
        e("mov.b64", self.i, 0)
        e.a.label(label)
        v = e.load(self.ad, 1)
        body(v)
        e.free(v)
        e("add.i64", self.i, self.i, 1)
        e("add.i64", self.ad, self.ad, self.es)
        e("setp.lt.i64", self.p, self.ad, self.end)
        e("bra", label, p=self.p)

    def stats(self) -> None:
        e, mx, sm = self.e, self.mx, self.sm
        e("mov.f32", mx, -F32_MAX)
        self.scan("LMAX", lambda v: e("max.f32", mx, mx, v))
        e("mov.f32", sm, 0.0)

        def add_exp(v):
            self.prob(v, scale=False)
            e("add.f32", sm, sm, v)
        self.scan("LSUM", add_exp)
        e("rcp.f32", sm, sm)

    def prob(self, v: Reg, scale: bool = True) -> None:
        """v <- exp(v - max), times 1 / sum when ``scale`` (the softmax probability)."""
        e = self.e
        e("sub.f32", v, v, self.mx)
        e("mul.f32", v, v, LOG2E)
        e("ex2.f32", v, v)
        if scale:
            e("mul.f32", v, v, self.sm)


def moe_topk_kernel(caps, tokens: int, experts: int, top_k: int, dtype: str = "fp16", *,
                    threads: Optional[int] = None) -> ElementwiseKernel:
    """Routing, step 1: a thread a token reads its row of gate logits [tokens, experts] three times:
    the max, the softmax's sum, then top_k passes each taking the largest logit after the last one
    taken (ties to the lower expert). route_e [tokens, top_k] (i32): the experts; route_w (f32):
    their softmax probabilities."""
    op = "moe_topk"
    dt = _dtype(op, dtype)
    BT = threads or _token_threads(caps, tokens)
    _moe_sizes(op, caps, threads, tokens=tokens, experts=experts, top_k=top_k)
    es = ELEM_BYTES[dt]
    e = ElementwiseAsm(f"{op}_{dt}_k{top_k}", ("logits", "route_e", "route_w", "tokens", "experts"), dt, es,
                       "thread", BT)
    t, stride, _ = _token_thread(e)
    nt, rowb, L, RE, RW = e.reg(), e.reg(), e.reg(), e.reg(), e.reg()
    e("ldparam", nt, "tokens")
    e("ldparam", rowb, "experts")
    e("mul.i64", rowb, rowb, es)
    e("ldparam", L, "logits")
    e("ldparam", RE, "route_e")
    e("ldparam", RW, "route_w")
    r = _RowScan(e, es)
    out, bi, pi, bv, pv = (e.reg() for _ in range(5))
    p1, p2, p3 = e.a.pred(), e.a.pred(), e.a.pred()

    e.a.label("TOK")
    e("setp.ge.i64", r.p, t, nt)
    e("bra", "DONE", p=r.p)
    e("mul.i64", r.row, t, rowb)
    e("add.i64", r.row, r.row, L)
    e("add.i64", r.end, r.row, rowb)
    r.stats()
    e("mov.f32", pv, F32_MAX)
    e("mov.b64", pi, -1)
    e("mul.i64", out, t, 4 * top_k)

    def better(v):
        e("setp.lt.f32", p1, v, pv)              # after the last choice: smaller, or equal and later
        e("setp.eq.f32", p2, v, pv)
        e("setp.gt.i64", p3, r.i, pi)
        e("and.pred", p2, p2, p3)
        e("or.pred", p1, p1, p2)
        e("setp.gt.f32", p3, v, bv)              # strictly larger: the first of equals stays
        e("and.pred", p1, p1, p3)
        e("mov.f32", bv, v, p=p1)
        e("mov.b64", bi, r.i, p=p1)

    for j in range(top_k):
        e("mov.f32", bv, -F32_MAX)
        e("mov.b64", bi, 0)
        r.scan(f"LK{j}", better)
        e("add.i64", r.ad, RE, out)
        e("st.global.b32", Mem(r.ad, 4 * j), bi)
        w = e.reg()
        e("mov.f32", w, bv)
        r.prob(w)
        e("add.i64", r.ad, RW, out)
        e("st.global.b32", Mem(r.ad, 4 * j), w)
        e.free(w)
        e("mov.f32", pv, bv)
        e("mov.b64", pi, bi)
    e("add.i64", t, t, stride)
    e("bra", "TOK")
    e.a.label("DONE")
    e("exit")

    def gen(rng):
        return {"logits": _normal(rng, (tokens, experts), dt)}

    def ref(v):
        from archsim.workloads.reference import ref_moe_route

        route_e, route_w, _, _ = ref_moe_route(v["logits"], top_k, 1)
        return {"route_e": route_e, "route_w": route_w}

    bufs = (Buf("logits", (tokens, experts), dt), Buf("route_e", (tokens, top_k), "i32", True),
            Buf("route_w", (tokens, top_k), "fp32", True))
    return _finish(op, caps, e, BT, ceil_div(tokens, BT), 5 * tokens * experts, bufs,
                   (("tokens", tokens), ("experts", experts)), "thread", gen, ref)


def moe_assign_kernel(caps, tokens: int, experts: int, top_k: int, capacity: int, *,
                      threads: Optional[int] = None) -> ElementwiseKernel:
    """Routing, step 2: a block an expert fills its ``capacity`` slots in priority order (every
    token's first choice, tokens in order, then every second choice ...). Its threads split that
    list of tokens x top_k choices into runs, count their hits on the expert, take an exclusive
    prefix sum of the counts (in shared memory), then walk their runs again giving each hit its
    position: route_slot [tokens, top_k] = expert * capacity + position, or -1 past the capacity;
    slot_token [experts * capacity] = the token, or -1 for a slot left empty."""
    op = "moe_assign"
    _moe_sizes(op, caps, threads, tokens=tokens, experts=experts, top_k=top_k, capacity=capacity)
    B = threads or MOE_ASSIGN_THREADS
    N = tokens * top_k
    run = ceil_div(N, B)
    e = ElementwiseAsm(f"{op}_k{top_k}", ("route_e", "route_slot", "slot_token"), "fp32", 4, "block", B,
                       shared=(B + 1) * 8)
    tid, ex, estep, RE, RS, ST = (e.reg() for _ in range(6))
    e("s2r", tid, "%tid.x")
    e("s2r", ex, "%ctaid.x")
    e("s2r", estep, "%nctaid.x")
    e("ldparam", RE, "route_e")
    e("ldparam", RS, "route_slot")
    e("ldparam", ST, "slot_token")
    q, q1, j, t, a, v, cnt, tmp = (e.reg() for _ in range(8))
    p, pc = e.a.pred(), e.a.pred()
    so = e.reg()
    e("shl.b64", so, tid, 3)                      # this thread's count in shared memory

    def walk(label, hit):
        """For q over this thread's run: (j, t) = divmod(q, tokens), a = route_e's byte offset."""
        e("mul.i64", q, tid, run)
        e("add.i64", q1, q, run)
        e("min.i64", q1, q1, N)
        e("div.i64", j, q, tokens)
        e("rem.i64", t, q, tokens)
        e.a.label(label)
        e("setp.ge.i64", p, q, q1)
        e("bra", f"{label}_END", p=p)
        e("mul.i64", a, t, top_k)
        e("add.i64", a, a, j)
        e("shl.b64", a, a, 2)
        e("add.i64", tmp, RE, a)
        e("ld.global.s32", v, Mem(tmp, 0))
        e("setp.ne.i64", p, v, ex)
        e("bra", f"{label}_NEXT", p=p)
        hit()
        e.a.label(f"{label}_NEXT")
        e("add.i64", q, q, 1)
        e("add.i64", t, t, 1)
        e("setp.eq.i64", p, t, tokens)
        e("mov.b64", t, 0, p=p)
        e("add.i64", j, j, 1, p=p)
        e("bra", label)
        e.a.label(f"{label}_END")

    e.a.label("EXP")
    e("setp.ge.i64", p, ex, experts)
    e("bra", "DONE", p=p)
    e("mov.b64", cnt, 0)
    walk("LC", lambda: e("add.i64", cnt, cnt, 1))
    e("st.shared.b64", Mem(so, 0), cnt)
    e("bar.sync")
    e("setp.ne.i64", p, tid, 0)                   # thread 0: the exclusive prefix sum of the counts
    e("bra", "SCANNED", p=p)
    e("mov.b64", cnt, 0)
    e("mov.b64", a, 0)
    e.a.label("LS")
    e("ld.shared.b64", v, Mem(a, 0))
    e("st.shared.b64", Mem(a, 0), cnt)
    e("add.i64", cnt, cnt, v)
    e("add.i64", a, a, 8)
    e("setp.lt.i64", p, a, 8 * B)
    e("bra", "LS", p=p)
    e("st.shared.b64", Mem(a, 0), cnt)            # the expert's total, after the B counts
    e.a.label("SCANNED")
    e("bar.sync")
    e("ld.shared.b64", cnt, Mem(so, 0))           # this run's first position
    base = e.reg()
    e("mul.i64", base, ex, capacity)

    def place():
        e("setp.lt.i64", pc, cnt, capacity)
        e("add.i64", v, base, cnt)
        e("selp.b64", v, v, -1, pc)
        e("add.i64", tmp, RS, a)
        e("st.global.b32", Mem(tmp, 0), v)
        e("shl.b64", v, v, 2)
        e("add.i64", tmp, ST, v)
        e("st.global.b32", Mem(tmp, 0), t, p=pc)
        e("add.i64", cnt, cnt, 1)
    walk("LA", place)
    e("mov.b64", a, 8 * B)
    e("ld.shared.b64", cnt, Mem(a, 0))
    e("min.i64", cnt, cnt, capacity)
    e("add.i64", cnt, cnt, tid)                   # the empty slots, a thread each in turn
    e("mov.b64", v, -1)
    e.a.label("LF")
    e("setp.ge.i64", p, cnt, capacity)
    e("bra", "LF_END", p=p)
    e("add.i64", tmp, base, cnt)
    e("shl.b64", tmp, tmp, 2)
    e("add.i64", tmp, tmp, ST)
    e("st.global.b32", Mem(tmp, 0), v)
    e("add.i64", cnt, cnt, B)
    e("bra", "LF")
    e.a.label("LF_END")
    e("bar.sync")                                 # every read of the counts before the next expert's writes
    e("add.i64", ex, ex, estep)
    e("bra", "EXP")
    e.a.label("DONE")
    e("exit")

    def gen(rng):
        return {"route_e": _random_routes(rng, tokens, experts, top_k)}

    def ref(vals):
        from archsim.workloads.reference import ref_moe_assign

        slot, tok = ref_moe_assign(vals["route_e"], experts, capacity)
        return {"route_slot": slot, "slot_token": tok}

    bufs = (Buf("route_e", (tokens, top_k), "i32"), Buf("route_slot", (tokens, top_k), "i32", True),
            Buf("slot_token", (experts * capacity,), "i32", True))
    return _finish(op, caps, e, B, experts, 0, bufs, (), "block", gen, ref)


def moe_dispatch_kernel(caps, tokens: int, hidden: int, slots: int, dtype: str = "fp16", *,
                        threads: Optional[int] = None) -> ElementwiseKernel:
    """y [slots, hidden]: a block a slot copies its token's row of x [tokens, hidden] (as stored,
    no conversion), or zeros for an empty slot (slot_token -1)."""
    op = "moe_dispatch"
    dt = _dtype(op, dtype)
    BT = threads or MOE_ROW_THREADS
    _moe_sizes(op, caps, threads, tokens=tokens, hidden=hidden, slots=slots)
    es = ELEM_BYTES[dt]
    rb = hidden * es
    VB = _vec_bytes(rb, es)
    e = ElementwiseAsm(f"{op}_{dt}_v{VB}", ("x", "slot_token", "y", "slots"), dt, VB, "block", BT)
    tt, row, step = e.team_setup()
    S, X, ST, Y, src, dst, tok = (e.reg() for _ in range(7))
    e("ldparam", S, "slots")
    e("ldparam", X, "x")
    e("ldparam", ST, "slot_token")
    e("ldparam", Y, "y")
    pk = e.a.pred()

    def body():
        e("shl.b64", src, row, 2)
        e("add.i64", src, src, ST)
        e("ld.global.s32", tok, Mem(src, 0))
        e("setp.ge.i64", pk, tok, 0)
        e("max.i64", tok, tok, 0)
        e("mul.i64", src, tok, rb)
        e("add.i64", src, src, X)
        e("mul.i64", dst, row, rb)
        e("add.i64", dst, dst, Y)

        def vec(j, n):
            nb = n * es                          # bytes: a vector, or one element of the tail
            nr = max(nb // 4, 1)
            r = e.reg(nr)
            for i in range(nr):
                e("mov.b64", r + i, 0)           # an empty slot's row stays zero
            ad = e.addr(src, j)
            e(_LD.get(nb, "ld.global.u16"), r, Mem(ad, 0), p=pk)
            e("add.i64", ad, dst, j)
            e(_ST[nb], Mem(ad, 0), r)
            e.free(ad)
            e.free(r, k=nr)
        _row_loop_bytes(e, rb, vec)

    e.row_loop(row, step, S, body)

    def gen(rng):
        tok = rng.integers(-1, tokens, size=slots).astype(np.int32)
        return {"x": _normal(rng, (tokens, hidden), dt), "slot_token": tok}

    def ref(v):
        from archsim.workloads.reference import ref_moe_dispatch

        return {"y": ref_moe_dispatch(v["x"], v["slot_token"])}

    bufs = (Buf("x", (tokens, hidden), dt), Buf("slot_token", (slots,), "i32"), Buf("y", (slots, hidden), dt, True))
    return _finish(op, caps, e, BT, slots, 0, bufs, (("slots", slots),), "block", gen, ref)


def moe_combine_kernel(caps, tokens: int, hidden: int, top_k: int, slots: int, dtype: str = "fp16",
                       weighted: bool = True, *, threads: Optional[int] = None) -> ElementwiseKernel:
    """y [tokens, hidden]: a block a token sums its kept choices' rows of expert_out [slots, hidden]
    weighted by route_w (f32); a dropped choice (route_slot -1) adds nothing. Unweighted (no
    route_w): the dispatch's backward, each token's slots' gradient rows summed."""
    op = "moe_combine" if weighted else "moe_dispatch_grad"
    dt = _dtype(op, dtype)
    BT = threads or MOE_ROW_THREADS
    _moe_sizes(op, caps, threads, tokens=tokens, hidden=hidden, top_k=top_k, slots=slots)
    es = ELEM_BYTES[dt]
    rb = hidden * es
    VB = _vec_bytes(rb, es)
    params = ("expert_out", "route_slot") + (("route_w",) if weighted else ()) + ("y", "tokens")
    e = ElementwiseAsm(f"{op}_{dt}_k{top_k}_v{VB}", params, dt, VB, "block", BT)
    tt, row, step = e.team_setup()
    T, EO, RSL, RW, Y, ad, yrow = (e.reg() for _ in range(7))
    e("ldparam", T, "tokens")
    e("ldparam", EO, "expert_out")
    e("ldparam", RSL, "route_slot")
    if weighted:
        e("ldparam", RW, "route_w")
    e("ldparam", Y, "y")
    p = e.a.pred()
    bases = [e.reg() for _ in range(top_k)]
    ws = [e.reg() for _ in range(top_k)]

    def body():
        e("mul.i64", ad, row, 4 * top_k)
        for c in range(top_k):
            e("add.i64", yrow, ad, RSL)
            e("ld.global.s32", bases[c], Mem(yrow, 4 * c))
            if weighted:
                e("add.i64", yrow, ad, RW)
                e("ld.global.b32", ws[c], Mem(yrow, 4 * c))
            else:
                e("mov.f32", ws[c], 1.0)
            e("setp.ge.i64", p, bases[c], 0)
            e("selp.b64", ws[c], ws[c], 0, p)        # a dropped choice weighs nothing (f32 0 bits)
            e("max.i64", bases[c], bases[c], 0)
            e("mul.i64", bases[c], bases[c], rb)
            e("add.i64", bases[c], bases[c], EO)
        e("mul.i64", yrow, row, rb)
        e("add.i64", yrow, yrow, Y)

        def vec(j, n):
            acc = e.reg(n)
            for i in range(n):
                e("mov.f32", acc + i, 0.0)
            for c in range(top_k):
                a2 = e.addr(bases[c], j)
                x = e.load(a2, n)
                for i in range(n):
                    e("fma.f32", acc + i, x + i, ws[c], acc + i)
                e.free(x, k=n)
                e.free(a2)
            a2 = e.addr(yrow, j)
            e.store(a2, acc, n)
            e.free(a2)
            e.free(acc, k=n)
        _row_loop_bytes(e, rb, vec)

    e.row_loop(row, step, T, body)

    def gen(rng):
        slot = rng.integers(-1, slots, size=(tokens, top_k)).astype(np.int32)
        return {"expert_out": _normal(rng, (slots, hidden), dt), "route_slot": slot,
                "route_w": rng.random((tokens, top_k)).astype(np.float32)}

    def ref(v):
        from archsim.workloads.reference import ref_moe_combine

        w = v["route_w"] if weighted else np.ones(np.shape(v["route_slot"]))
        return {"y": ref_moe_combine(v["expert_out"], v["route_slot"], w)}

    bufs = (Buf("expert_out", (slots, hidden), dt), Buf("route_slot", (tokens, top_k), "i32")) + \
        ((Buf("route_w", (tokens, top_k), "fp32"),) if weighted else ()) + (Buf("y", (tokens, hidden), dt, True),)
    return _finish(op, caps, e, BT, tokens, (2 if weighted else 1) * tokens * top_k * hidden, bufs,
                   (("tokens", tokens),), "block", gen, ref)


def moe_combine_grad_kernel(caps, tokens: int, hidden: int, top_k: int, slots: int, dtype: str = "fp16", *,
                            threads: Optional[int] = None) -> KernelChain:
    """combine's backward as two kernels: (1) a team a token: d_route_w [tokens, top_k] (f32), each
    kept choice's slot row of expert_out dotted with d_y (0 when dropped); (2) a block a slot:
    d_expert_out [slots, hidden] = its choice's weight x d_y of its token (found among the token's
    route_slot entries), zeros for an empty slot."""
    op = "moe_combine_grad"
    dt = _dtype(op, dtype)
    _moe_sizes(op, caps, threads, tokens=tokens, hidden=hidden, top_k=top_k, slots=slots)
    es = ELEM_BYTES[dt]
    rb = hidden * es
    VB = _vec_bytes(rb, es)
    tm, BT = ("warp", threads) if threads else _choose_team(caps, tokens, hidden, VB // es, None)
    # (1) the weights' gradient
    e = ElementwiseAsm(f"moe_combine_dw_{dt}_k{top_k}_{tm}_v{VB}", ("d_y", "expert_out", "route_slot", "d_route_w",
                                                                    "tokens"), dt, VB, tm, BT, red_vals=top_k)
    tt, row, step = e.team_setup()
    T, DY, EO, RSL, DW, ad, yrow = (e.reg() for _ in range(7))
    e("ldparam", T, "tokens")
    e("ldparam", DY, "d_y")
    e("ldparam", EO, "expert_out")
    e("ldparam", RSL, "route_slot")
    e("ldparam", DW, "d_route_w")
    p, first = e.a.pred(), e.a.pred()
    e("setp.eq.i64", first, tt, 0)
    bases = [e.reg() for _ in range(top_k)]
    keep = [e.reg() for _ in range(top_k)]        # 1.0 for a kept choice, 0.0 for a dropped one
    acc = [e.reg() for _ in range(top_k)]
    one = e.const(1.0)

    def body1():
        e("mul.i64", ad, row, 4 * top_k)
        e("add.i64", ad, ad, RSL)
        for c in range(top_k):
            e("ld.global.s32", bases[c], Mem(ad, 4 * c))
            e("setp.ge.i64", p, bases[c], 0)
            e("selp.b64", keep[c], one, 0, p)
            e("max.i64", bases[c], bases[c], 0)
            e("mul.i64", bases[c], bases[c], rb)
            e("add.i64", bases[c], bases[c], EO)
            e("mov.f32", acc[c], 0.0)
        e("mul.i64", yrow, row, rb)
        e("add.i64", yrow, yrow, DY)

        def vec(j, n):
            a2 = e.addr(yrow, j)
            dy = e.load(a2, n)
            for c in range(top_k):
                e("add.i64", a2, bases[c], j)
                x = e.load(a2, n)
                for i in range(n):
                    e("fma.f32", acc[c], x + i, dy + i, acc[c])
                e.free(x, k=n)
            e.free(dy, k=n)
            e.free(a2)
        _row_loop_bytes(e, rb, vec)
        e.reduce_sum(acc)
        e("mul.i64", ad, row, 4 * top_k)
        e("add.i64", ad, ad, DW)
        for c in range(top_k):
            e("mul.f32", acc[c], acc[c], keep[c])          # a dropped choice: no gradient
            e("st.global.b32", Mem(ad, 4 * c), acc[c], p=first)

    e.row_loop(row, step, T, body1)
    k1 = _finish("moe_combine_dw", caps, e, BT, tokens if tm == "block" else ceil_div(tokens, BT // 32),
                 2 * tokens * top_k * hidden, (Buf("d_y", (tokens, hidden), dt), Buf("expert_out", (slots, hidden), dt),
                                               Buf("route_slot", (tokens, top_k), "i32"),
                                               Buf("d_route_w", (tokens, top_k), "fp32", True)),
                 (("tokens", tokens),), tm, None, None)
    # (2) the slots' gradient
    e = ElementwiseAsm(f"moe_combine_dslot_{dt}_k{top_k}_v{VB}", ("d_y", "route_slot", "route_w", "slot_token",
                                                                  "d_expert_out", "slots"), dt, VB, "block",
                       threads or MOE_ROW_THREADS)
    tt, row, step = e.team_setup()
    S, DY, RSL, RW, ST, DEO, tok, w, src, dst, v = (e.reg() for _ in range(11))
    e("ldparam", S, "slots")
    e("ldparam", DY, "d_y")
    e("ldparam", RSL, "route_slot")
    e("ldparam", RW, "route_w")
    e("ldparam", ST, "slot_token")
    e("ldparam", DEO, "d_expert_out")
    pk, pj = e.a.pred(), e.a.pred()

    def body2():
        e("shl.b64", src, row, 2)
        e("add.i64", src, src, ST)
        e("ld.global.s32", tok, Mem(src, 0))
        e("setp.ge.i64", pk, tok, 0)
        e("max.i64", tok, tok, 0)
        e("mov.f32", w, 0.0)
        e("mul.i64", src, tok, 4 * top_k)                 # the token's choices: which one holds this slot
        for c in range(top_k):
            e("add.i64", dst, src, RSL)
            e("ld.global.s32", v, Mem(dst, 4 * c))
            e("setp.eq.i64", pj, v, row)
            e("and.pred", pj, pj, pk)
            e("add.i64", dst, src, RW)
            e("ld.global.b32", w, Mem(dst, 4 * c), p=pj)
        e("mul.i64", src, tok, rb)
        e("add.i64", src, src, DY)
        e("mul.i64", dst, row, rb)
        e("add.i64", dst, dst, DEO)

        def vec(j, n):
            a2 = e.addr(src, j)
            x = e.load(a2, n)
            for i in range(n):
                e("mul.f32", x + i, x + i, w)
            e("add.i64", a2, dst, j)
            e.store(a2, x, n)
            e.free(x, k=n)
            e.free(a2)
        _row_loop_bytes(e, rb, vec)

    e.row_loop(row, step, S, body2)
    k2 = _finish("moe_combine_dslot", caps, e, threads or MOE_ROW_THREADS, slots, tokens * top_k * hidden,
                 (Buf("d_y", (tokens, hidden), dt), Buf("route_slot", (tokens, top_k), "i32"),
                  Buf("route_w", (tokens, top_k), "fp32"), Buf("slot_token", (slots,), "i32"),
                  Buf("d_expert_out", (slots, hidden), dt, True)), (("slots", slots),), "block", None, None)

    def gen(rng):
        from archsim.workloads.reference import ref_moe_route

        logits = rng.standard_normal((tokens, max(top_k, 4)))
        cap = max(1, slots // logits.shape[1])
        _, w, slot, tok = ref_moe_route(logits, top_k, cap)
        full = np.full(slots, -1, np.int32)
        full[:tok.size] = tok
        return {"d_y": _normal(rng, (tokens, hidden), dt), "expert_out": _normal(rng, (slots, hidden), dt),
                "route_slot": slot.astype(np.int32), "route_w": w.astype(np.float32), "slot_token": full}

    def ref(v):
        from archsim.workloads.reference import ref_moe_combine_grad

        dw, deo = ref_moe_combine_grad(v["d_y"], v["expert_out"], v["route_slot"], v["route_w"], v["slot_token"])
        return {"d_route_w": dw, "d_expert_out": deo}

    return KernelChain(op=op, kernels=(k1, k2), dtype=dt, draw_inputs=gen, ref_outputs=ref)


def moe_route_grad_kernel(caps, tokens: int, experts: int, top_k: int, dtype: str = "fp16", *,
                          threads: Optional[int] = None) -> ElementwiseKernel:
    """The router's backward, a thread a token: the softmax p of its logits again, the chosen
    probabilities' gradient g (d_route_w at their experts), and d_logits = p (g - p . g)."""
    op = "moe_route_grad"
    dt = _dtype(op, dtype)
    BT = threads or _token_threads(caps, tokens)
    _moe_sizes(op, caps, threads, tokens=tokens, experts=experts, top_k=top_k)
    es = ELEM_BYTES[dt]
    e = ElementwiseAsm(f"{op}_{dt}_k{top_k}", ("logits", "route_e", "d_route_w", "d_logits", "tokens", "experts"),
                       dt, es, "thread", BT)
    t, stride, tmp = _token_thread(e)
    nt, rowb, L, RE, DW, DL = (e.reg() for _ in range(6))
    e("ldparam", nt, "tokens")
    e("ldparam", rowb, "experts")
    e("mul.i64", rowb, rowb, es)
    e("ldparam", L, "logits")
    e("ldparam", RE, "route_e")
    e("ldparam", DW, "d_route_w")
    e("ldparam", DL, "d_logits")
    r = _RowScan(e, es)
    out, drow, dot, g = (e.reg() for _ in range(4))
    ch = [e.reg() for _ in range(top_k)]
    dw = [e.reg() for _ in range(top_k)]
    pe = e.a.pred()

    e.a.label("TOK")
    e("setp.ge.i64", r.p, t, nt)
    e("bra", "DONE", p=r.p)
    e("mul.i64", r.row, t, rowb)
    e("add.i64", drow, r.row, DL)
    e("add.i64", r.row, r.row, L)
    e("add.i64", r.end, r.row, rowb)
    r.stats()
    e("mul.i64", out, t, 4 * top_k)
    e("mov.f32", dot, 0.0)
    for c in range(top_k):                       # p . g over the chosen experts
        e("add.i64", r.ad, out, RE)
        e("ld.global.s32", ch[c], Mem(r.ad, 4 * c))
        e("add.i64", r.ad, out, DW)
        e("ld.global.b32", dw[c], Mem(r.ad, 4 * c))
        e("mul.i64", r.ad, ch[c], es)
        e("add.i64", r.ad, r.ad, r.row)
        v = e.load(r.ad, 1)
        r.prob(v)
        e("fma.f32", dot, v, dw[c], dot)
        e.free(v)
    e("mov.b64", tmp, drow)

    def write(v):
        r.prob(v)
        e("mov.f32", g, 0.0)
        for c in range(top_k):
            e("setp.eq.i64", pe, ch[c], r.i)
            e("add.f32", g, g, dw[c], p=pe)
        e("sub.f32", g, g, dot)
        e("mul.f32", v, v, g)
        e.store(tmp, v, 1)
        e("add.i64", tmp, tmp, es)
    r.scan("LOUT", write)
    e("add.i64", t, t, stride)
    e("bra", "TOK")
    e.a.label("DONE")
    e("exit")

    def gen(rng):
        route_e = _random_routes(rng, tokens, experts, top_k)
        return {"logits": _normal(rng, (tokens, experts), dt), "route_e": route_e,
                "d_route_w": rng.standard_normal((tokens, top_k)).astype(np.float32)}

    def ref(v):
        from archsim.workloads.reference import ref_moe_route_grad

        return {"d_logits": ref_moe_route_grad(v["logits"], v["route_e"], v["d_route_w"])}

    bufs = (Buf("logits", (tokens, experts), dt), Buf("route_e", (tokens, top_k), "i32"),
            Buf("d_route_w", (tokens, top_k), "fp32"), Buf("d_logits", (tokens, experts), dt, True))
    return _finish(op, caps, e, BT, ceil_div(tokens, BT), 4 * tokens * experts, bufs,
                   (("tokens", tokens), ("experts", experts)), "thread", gen, ref)


__all__ += ["moe_assign_kernel", "moe_combine_grad_kernel", "moe_combine_kernel", "moe_dispatch_kernel",
            "moe_route_grad_kernel", "moe_topk_kernel"]
