"""Fused (flash) attention for the GPU family: O = softmax(scale * Q K^T + mask) V per (batch, head).

    caps = capabilities(load_machine("a100"))
    k = flash_attention_kernel(caps, batch=2, heads=3, q_len=129, kv_len=129, head_dim=64, causal=True)
    Q, K, V, O = k.random_inputs(seed=0)
    res = run_functional(k.program, k.args(Q, K, V, O), k.launch, warp_width=caps.warp_width)
    err = to_float(res.output("O"), k.dtype) - k.reference(Q, K, V)

Layout (elements, row-major): Q element (b, i, head, j) at Q + q_off + (b*q_len + i)*q_ld + head*d + j;
K and V the same with kv_len, kv_ld (k_off, v_off); O with o_ld (o_off). The leading dimensions
default to heads*d; a fused QKV buffer [b*s, 3*heads*d] is read in place with q_ld = kv_ld =
3*heads*d and offsets 0, heads*d, 2*heads*d (``qkv_args``). The offsets are kernel parameters,
so one Program serves every placement. fp16 buffers are float16 arrays, bf16 buffers uint16 bit
patterns (as everywhere in archsim).

Causal mask: query i sees key j iff j <= i + (kv_len - q_len); so a decode step (q_len = 1) sees
the whole cache and a prefill (q_len = kv_len) the usual lower triangle. Causal needs
kv_len >= q_len (otherwise the first queries would see no key at all).

The kernel follows FlashAttention-2 (the forward pass of Dao, 2023; the seed's Algorithm 9.1):

- grid = (ceil(q_len / Br), heads, batch); a block of 4 warps owns Br query rows of one
  (batch, head). Br = 128 as FlashAttention-2's standard forward kernel has it
  (Flash_fwd_kernel_traits<d, 128, Bc, 4 warps>) where the 64-row blocks would fill the GPU
  (q_len > 64 and batch x heads x ceil(q_len / 64) >= 0.8 x 2 x SMs, the test FA2's
  num_splits_heuristic starts with): warp w owns two 16-row m-tiles, rows 32w .. 32w+31, and
  every K and V fragment it loads feeds both. Br = 64 (one m-tile a warp, rows 16w .. 16w+15)
  otherwise (a simplification: below that test FA2 may split the keys over 64-row blocks or still
  run 128 rows; smaller blocks here spread a small grid over more SMs), and where 128 rows leave
  no room for 64-key tiles (head_dim 128, or a small core). Query rows past q_len are clamped to
  the last row (they compute a copy of it and are never stored).
- Q is copied once (cp.async.16) into swizzled shared memory and moved to registers with
  ldmatrix.x4: the A fragments of all d/16 k-steps stay in registers for the whole kernel.
- K and V tiles of Bc rows (64, or 32 / 16 where shared memory or registers are short) stream
  through two shared-memory stages (cp.async double buffering): iteration j waits for tile j,
  passes one barrier (which also frees the stage tile j-1 was read from) and at once issues the
  copies of tile j+1 into that stage, so they fly while tile j is computed. Key rows past kv_len
  are clamped to the last row (finite values that the mask zeroes out).
- S = Q K^T with mma.m16n8k16 (K fragments with ldmatrix.x4 from key-major rows: the "B^T" form);
  the first k-step adds to a zero block instead of zeroing S.
- Online softmax in fp32 in the log2 domain (log2(e) * scale folded into one fma per score):
  row max over the 4 lanes of a quad by shfl.bfly, m_new = max(m_old, rowmax), p = ex2(s*c -
  m_new*c), alpha = ex2(m_old*c - m_new*c), l = alpha*l + rowsum(p) (per-lane partial sums,
  reduced over the quad only at the end), O *= alpha.
- P is converted to f16x2 / bf16x2 in registers and fed straight to the P V mma as its A operand:
  the C fragment of two adjacent 16 x 8 S tiles is, element for element, the A fragment of one
  16 x 16 k-step (rows g, g+8, columns 2t, 2t+1 and 2t+8, 2t+9), so four cvt per k-step, written
  over the S registers they read, make the A fragment. V fragments with ldmatrix.x4.trans from
  key-major rows (the "B k-major" form).
- Masking only where needed: tiles 0 .. n_full-1 (wholly visible to every row of the block) skip
  the mask code by a uniform branch; tiles n_full .. n_tiles-1 (the diagonal tile(s) and the
  kv tail) set masked scores to -inf. Causal blocks stop at the last tile their last row sees,
  so tiles wholly above the diagonal are never loaded.
- Epilogue: l reduced over the quad, O * rcp(l), converted to the input dtype, 4-byte stores of
  two adjacent columns, each row under its own row < q_len predicate.
- Shared memory rows are 2d bytes in 16-byte chunks, XOR-swizzled as gemm_gpu's tiles are
  (64-byte rows: chunk c at c ^ ((row/2) % 4); 128 bytes or more: c ^ (row % 8)), so every
  ldmatrix phase hits 8 distinct bank groups.

Tile rule: 128 x 64 where FA2 takes 128-row blocks (above), then 64 x Bc for the first of
Bc = 64, 32, 16 (Q in its own region, else Q staged in the K/V stages and moved to registers
before the first K/V copy) whose shared memory, registers per thread and registers per block fit
the target. head_dim 32, 64, 128; fp16 and bf16 on tensor units.

FFMA variant (fp32, or fp16 / bf16 where the tensor units lack them): the same algorithm on the
vector pipes. A pair of adjacent threads owns a query row, each holding half of the row of Q
(pre-scaled by scale*log2(e), in f32) and half of the row of O; K/V tiles are copied raw by
cp.async into two stages (rows padded by 16 bytes between the halves: the two halves of a warp
read different banks, the 16 lanes of a half one broadcast address); keys are taken 8 at a
time: a score is an fma chain over the half row plus one shfl.bfly with the partner, then the
online-softmax update (m, l, alpha with ex2) and O += p V by fma; fp16 / bf16 elements are
converted with cvt on the way. Bc is the first of 64, 32, 16, 8 that fits.

Split-KV decode (Flash-Decoding; FlashAttention-2's splitkv kernels), ``split_kv_attention_kernel``:
a decode step has one query block per (batch, head), too few to fill the SMs, and each would walk
the whole cache alone. For q_len <= 64 the kv sequence is cut into chunks of ``chunk`` K/V tiles
(``kv_splits``: the chunk minimising waves x chunk on the target's cores) and two kernels run:

- attn.split, grid (splits, heads, batch): block x runs the flash loop above (the same emitter,
  tensor-core or FFMA, in split mode) over tiles x*chunk .. x*chunk+chunk-1 only, and writes its
  rows' O normalised by their own sum, in f32, to Opart [batch, heads, splits, q_len, d] and their
  log-sum-exp to LSEpart [batch, heads, splits, q_len]. A row that sees no key of its chunk (causal
  with q_len > 1) keeps m = -inf without NaN (the exponent shift is 0 then) and writes O = 0 and
  LSE = -inf.
- attn.combine, a warp per (batch, head, query row): O = sum_s e^(LSE_s - M) O_s / sum_s
  e^(LSE_s - M), M = max_s LSE_s taken online, 8 splits an iteration; O in the storage dtype and,
  with with_lse, LSE = M + ln(sum).

Causal decode stays exact: the chunks partition the keys and every row's mask is the whole-row
kernel's. The split kernel's flops are the whole-row kernel's; the combine's are its elementwise
math (``combine_flops``), with no model_flops.

Training: with_lse=True adds a buffer parameter LSE (fp32 [batch, heads, q_len], contiguous) where
the epilogue stores each row's natural log-sum-exp of its scaled, masked scores, ln 2 (c m + log2 l)
(what reference.ref_attention(..., return_lse=True) gives and attention_grad_gpu reads).

``flops`` counts the math of the unmasked (query, key) pairs: 4*d per pair (2d for a score, 2d
for its share of P V), all q_len*kv_len pairs when not causal, the exact visible count when
causal. ``model_flops`` is the same product over the full q_len x kv_len (the textbook count).
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
from archsim.isa.tensor_map import TensorMap, tensor_map_words
from archsim.workloads.emit.common import (CVT_OUT, DTYPE_ALIASES, ELEM_BYTES, HOST_DTYPE, MMA_OP, Asm,
                                          OutOfRegisters, ceil_div, log2, swizzle_offset)
from archsim.workloads.emit.gemm_gpu import to_float, to_host

__all__ = ["AttentionKernel", "AttentionPart", "SplitAttentionKernel", "attention_reference", "causal_pairs",
           "fills_gpu", "flash_attention_kernel", "kv_splits", "split_kv_attention_kernel"]

HEAD_DIMS = (32, 64, 128)
KERNELS = (None, "mma")      # flash_attention_kernel's kernel: the rule's choice, or the tensor-core one
BR = 64                      # query rows of a block of one m-tile a warp (split-KV, short queries)
WARPS = 4                    # a block's warps (16 query rows an m-tile)
THREADS = 32 * WARPS
BC_CHOICES = (64, 32, 16)    # key rows per K/V tile, largest first
FFMA_BC_CHOICES = (64, 32, 16, 8)
PARAMS = ("Q", "K", "V", "O", "q_len", "kv_len", "q_ld", "kv_ld", "o_ld", "q_off", "k_off", "v_off", "o_off")
LSE_PARAMS = PARAMS + ("LSE",)   # with_lse: the log-sum-exp buffer, f32 [batch, heads, q_len]
# split-KV: the flash loop over one chunk of `chunk` K/V tiles (grid.x = split), writing an f32
# partial O [batch, heads, splits, q_len, d] and its log-sum-exp [batch, heads, splits, q_len]
SPLIT_PARAMS = ("Q", "K", "V", "Opart", "LSEpart", "q_len", "kv_len", "q_ld", "kv_ld", "q_off", "k_off", "v_off",
                "chunk")
COMBINE_PARAMS = ("Opart", "LSEpart", "O", "rows", "heads", "q_len", "splits", "o_ld", "o_off")
LN2 = 0.6931471805599453
LOG2E = 1.4426950408889634


# rows of the boxes in which attention_wgmma's consumer warps store O (a warp's 16 rows)
O_BOX_ROWS = 16


@dataclass(frozen=True)
class FlashCfg:
    """A tensor-core kernel's tile and options (attention_wgmma builds one for its kernel too)."""

    dtype: str
    d: int
    causal: bool
    Bc: int
    qsep: bool          # Q has its own shared-memory region (else it is staged in the K/V stages)
    c: float            # scale * log2(e)
    lse: bool = False   # also write the natural log-sum-exp of each row's scaled scores to LSE
    split: bool = False  # split-KV: block x of the grid runs K/V tiles x*chunk .. (x+1)*chunk-1 (q_len <= BR)
    mt: int = 1         # 16-row m-tiles a warp: the block holds 64 * mt query rows


def causal_pairs(q_len: int, kv_len: int) -> int:
    """(query, key) pairs the causal mask leaves visible: query i sees keys 0 .. i + kv_len - q_len."""
    diff = kv_len - q_len
    return q_len * (diff + 1) + q_len * (q_len - 1) // 2


# ----------------------------------------------------------------------------- the kernel object
@dataclass(frozen=True)
class AttentionKernel:
    """One emitted fused attention kernel: the program, its launch and what it computes."""

    program: Program
    launch: Launch
    flops: int             # 4*d per unmasked (query, key) pair
    model_flops: int       # 4*d per (query, key) pair of the full q_len x kv_len
    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str             # fp16 | bf16
    causal: bool
    scale: float
    q_ld: int
    kv_ld: int
    o_ld: int
    Bc: int                # key rows per K/V tile
    kind: str = "mma"      # mma | wgmma (attention_wgmma: TMA and warpgroup MMA) | ffma
    with_lse: bool = False  # the program also writes LSE (f32 [batch, heads, q_len])
    block_rows: int = BR    # query rows a block (grid x = ceil(q_len / block_rows))

    @property
    def host_dtype(self):
        """numpy dtype of every buffer (bf16: uint16 bit patterns)."""
        return HOST_DTYPE[self.dtype]

    def _need(self, rows: int, ld: int, off: int) -> int:
        """Elements a buffer must hold: the last row's last element + 1."""
        return off + (rows - 1) * ld + self.heads * self.head_dim

    def buffer_bytes(self, q_off: int = 0, k_off: int = 0, v_off: int = 0, o_off: int = 0) -> dict:
        """Bytes each buffer must hold (for ``Unbacked(nbytes)`` in timing runs)."""
        B, Lq, Lk, es = self.batch, self.q_len, self.kv_len, ELEM_BYTES[self.dtype]
        out = {"Q": es * self._need(B * Lq, self.q_ld, q_off), "K": es * self._need(B * Lk, self.kv_ld, k_off),
               "V": es * self._need(B * Lk, self.kv_ld, v_off), "O": es * self._need(B * Lq, self.o_ld, o_off)}
        if self.with_lse:
            out["LSE"] = 4 * B * self.heads * Lq
        return out

    def lse_buffer(self) -> np.ndarray:
        """A zeroed LSE buffer: float32 [batch, heads, q_len]."""
        return np.zeros((self.batch, self.heads, self.q_len), np.float32)

    def args(self, Q, K, V, O, *, q_off: int = 0, k_off: int = 0, v_off: int = 0, o_off: int = 0, LSE=None) -> dict:
        """Kernel arguments: the four buffers (numpy arrays of the kernel's host dtype, any shape,
        C-contiguous, or anything with ``nbytes`` such as the timing engine's ``Unbacked``), and
        the element offsets of the first (batch 0, row 0, head 0) element in each. A with_lse
        kernel also takes LSE (a C-contiguous float32 array of batch*heads*q_len elements)."""
        where = f"attention b{self.batch} h{self.heads} {self.q_len}x{self.kv_len} d{self.head_dim}"
        offs = {"q_off": q_off, "k_off": k_off, "v_off": v_off, "o_off": o_off}
        for n, v in offs.items():
            if int(v) != v or v < 0 or v % 8:
                raise InputError(where, f"{n} = {v!r}", "an element offset >= 0, a multiple of 8 (16-byte copies)")
        want = self.buffer_bytes(q_off, k_off, v_off, o_off)
        for name, v in (("Q", Q), ("K", K), ("V", V), ("O", O)):
            if isinstance(v, np.ndarray):
                if v.dtype != np.dtype(self.host_dtype) or not v.flags.c_contiguous:
                    raise InputError(where, f"{name} is a {'non-contiguous ' if not v.flags.c_contiguous else ''}"
                                     f"{v.dtype} array", f"a C-contiguous {np.dtype(self.host_dtype)} array")
            if int(getattr(v, "nbytes", -1)) < want[name]:
                raise InputError(where, f"{name} has {getattr(v, 'nbytes', None)} bytes", f"at least {want[name]}")
        extra = {}
        if self.with_lse:
            if LSE is None:
                raise InputError(where, "a with_lse kernel without an LSE buffer", "LSE=<float32 array>")
            if isinstance(LSE, np.ndarray) and (LSE.dtype != np.float32 or not LSE.flags.c_contiguous):
                raise InputError(where, f"LSE is a {LSE.dtype} array", "a C-contiguous float32 array")
            if int(getattr(LSE, "nbytes", -1)) < want["LSE"]:
                raise InputError(where, f"LSE has {getattr(LSE, 'nbytes', None)} bytes", f"at least {want['LSE']}")
            extra["LSE"] = LSE
        elif LSE is not None:
            raise InputError(where, "an LSE buffer for a kernel emitted without with_lse", "with_lse=True")
        if self.kind == "wgmma":                   # the producer's tensor maps and O's (attention_wgmma)
            extra.update(self.tensor_maps(q_off, k_off, v_off))
            extra["mapO"] = self._map("O", self.q_len, self.o_ld, o_off, O_BOX_ROWS)
        return {"Q": Q, "K": K, "V": V, "O": O, "q_len": self.q_len, "kv_len": self.kv_len, "q_ld": self.q_ld,
                "kv_ld": self.kv_ld, "o_ld": self.o_ld, **{k: int(v) for k, v in offs.items()}, **extra}

    def tensor_maps(self, q_off: int, k_off: int, v_off: int) -> dict:
        """The TMA kernel's (attention_wgmma) tensor maps of Q, K and V: 4-d (head column, row, head,
        batch), 128-byte swizzle, boxes of 64 columns by block_rows query or Bc key rows."""
        return {"mapQ": self._map("Q", self.q_len, self.q_ld, q_off, self.block_rows),
                "mapK": self._map("K", self.kv_len, self.kv_ld, k_off, self.Bc),
                "mapV": self._map("V", self.kv_len, self.kv_ld, v_off, self.Bc)}

    def _map(self, of: str, rows: int, ld: int, off: int, box: int) -> TensorMap:
        """The 4-d tensor map (head column, row, head, batch) of buffer ``of``, 128-byte swizzle,
        boxes of 64 columns by ``box`` rows."""
        es, d = ELEM_BYTES[self.dtype], self.head_dim
        words = tensor_map_words([d, rows, self.heads, self.batch], es, [64, box, 1, 1], 128,
                                 [ld * es, d * es, rows * ld * es])
        return TensorMap(of, words, offset=off * es)

    def qkv_args(self, QKV, O, LSE=None) -> dict:
        """Arguments for Q, K and V read in place from one fused QKV buffer [batch*s, 3*heads*d]
        (needs q_len == kv_len and q_ld == kv_ld == 3*heads*d)."""
        hd = self.heads * self.head_dim
        if self.q_len != self.kv_len or self.q_ld != 3 * hd or self.kv_ld != 3 * hd:
            raise InputError("attention qkv_args", f"q_len {self.q_len}, kv_len {self.kv_len}, q_ld {self.q_ld}, "
                             f"kv_ld {self.kv_ld}", f"q_len == kv_len and q_ld == kv_ld == 3*heads*d = {3 * hd}")
        return self.args(QKV, QKV, QKV, O, q_off=0, k_off=hd, v_off=2 * hd, LSE=LSE)

    def random_inputs(self, seed: int = 0) -> tuple:
        """(Q, K, V, O): standard-normal Q, K, V as [rows, ld] arrays of the host dtype (the
        columns past heads*d are random too: they must not be read), O zeros [batch*q_len, o_ld]."""
        rng = np.random.default_rng(seed)
        B = self.batch
        out = []
        for rows, ld in ((B * self.q_len, self.q_ld), (B * self.kv_len, self.kv_ld), (B * self.kv_len, self.kv_ld)):
            out.append(to_host(rng.standard_normal((rows, ld)).astype(np.float32), self.dtype))
        out.append(np.zeros((B * self.q_len, self.o_ld), self.host_dtype))
        return tuple(out)

    def reference(self, Q, K, V, *, q_off: int = 0, k_off: int = 0, v_off: int = 0) -> np.ndarray:
        """O in float64 from the exact input values, as a [batch*q_len, heads*d] array (the
        columns of O that the kernel writes, in order)."""
        return attention_reference(Q, K, V, self.dtype, self.batch, self.heads, self.q_len, self.kv_len,
                                   self.head_dim, self.causal, self.scale, self.q_ld, self.kv_ld, q_off, k_off, v_off)

    def output(self, O, *, o_off: int = 0) -> np.ndarray:
        """The written part of an O buffer as float64 [batch*q_len, heads*d]."""
        flat = to_float(np.asarray(O).ravel(), self.dtype)
        hd = self.heads * self.head_dim
        rows = self.batch * self.q_len
        idx = o_off + np.arange(rows)[:, None] * self.o_ld + np.arange(hd)[None, :]
        return flat[idx]


def attention_reference(Q, K, V, dtype: str, batch: int, heads: int, q_len: int, kv_len: int, d: int,
                        causal: bool, scale: float, q_ld: int, kv_ld: int, q_off: int = 0, k_off: int = 0,
                        v_off: int = 0) -> np.ndarray:
    """float64 softmax(scale Q K^T + mask) V from the buffers' exact values -> [batch*q_len, heads*d]."""
    dtype = DTYPE_ALIASES[dtype]

    def gather(X, rows, ld, off):
        flat = to_float(np.asarray(X).ravel(), dtype)
        idx = off + np.arange(batch * rows)[:, None] * ld + np.arange(heads * d)[None, :]
        return flat[idx].reshape(batch, rows, heads, d).transpose(0, 2, 1, 3)   # [b, h, rows, d]

    q, k, v = gather(Q, q_len, q_ld, q_off), gather(K, kv_len, kv_ld, k_off), gather(V, kv_len, kv_ld, v_off)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if causal:
        vis = np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None] + (kv_len - q_len)
        s = np.where(vis, s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    o = np.einsum("bhij,bhjd->bhid", p, v)
    return o.transpose(0, 2, 1, 3).reshape(batch * q_len, heads * d)


# ----------------------------------------------------------------------------- split-KV pieces
# Shared by both kernels (tensor-core and FFMA). In split mode the block's grid x index is its split,
# its query rows start at 0 (q_len <= BR) and it runs K/V tiles j0 = split*chunk .. min(j0 + chunk,
# n_tiles) - 1 of the block's visible tiles; tile numbers stay absolute, so the mask logic (tiles
# below n_full need no mask) is the same as the whole-row kernel's.
def _first_tile(a, i0, split: bool, rows: int = BR):
    """i0 = the block's first query row (blocks of ``rows``); split: also returns j = split * chunk (else None)."""
    if not split:
        a("s2r", i0, "%ctaid.x")
        a("shl.b64", i0, i0, log2(rows))
        return None
    j = a.reg()
    a("s2r", j, "%ctaid.x")
    a("ldparam", i0, "chunk")
    a("mul.i64", j, j, i0)
    a("mov.b64", i0, 0)
    return j


def _last_tile(a, ntl, j, t, split: bool):
    """split: ntl = min(ntl, j0 + chunk), the chunk's end (j holds j0 here)."""
    if split:
        a("ldparam", t, "chunk")
        a("add.i64", t, t, j)
        a("min.i64", ntl, ntl, t)


def _zero_if_empty(a, rl, n: int):
    """rl .. rl+n-1 hold 1/l; a row that saw no key of its chunk (l = 0, so 1/l = inf) writes a zero
    partial O instead of NaN (its LSE is -inf, so the combine gives it weight 0)."""
    pz = a.pred()
    for r in range(n):
        a("setp.eq.f32", pz, rl + r, float("inf"))
        a("mov.f32", rl + r, 0.0, p=pz)
    a.pfree(pz)


def _split_index(a, dst, t):
    """dst = ((b * heads + head) * splits + split), the (batch, head, split) slot of the workspaces."""
    a("s2r", dst, "%ctaid.z")
    a("s2r", t, "%nctaid.y")
    a("mul.i64", dst, dst, t)
    a("s2r", t, "%ctaid.y")
    a("add.i64", dst, dst, t)
    a("s2r", t, "%nctaid.x")
    a("mul.i64", dst, dst, t)
    a("s2r", t, "%ctaid.x")
    a("add.i64", dst, dst, t)


def _split_epilogue_mma(a, c, o, rl, lz, row, ptr, ptrB, x, t1, tid, pm, pB, NO: int):
    """Rows g and g + 8 (row, pm / pB: row < q_len) of the tensor-core kernel: lane t == 0 of each
    quad stores the two LSEs, every lane its two columns of each n-tile as f32 pairs."""
    d = c.d
    _split_index(a, ptr, t1)
    a("mad.i64", ptr, ptr, x, row)                        # ((b h s) q_len + row)
    pz, pA2, pB2 = a.pred(), a.pred(), a.pred()
    a("and.b64", t1, tid, 3)
    a("setp.eq.i64", pz, t1, 0)
    a("and.pred", pA2, pm, pz)
    a("and.pred", pB2, pB, pz)
    a("shl.b64", t1, ptr, 2)
    a("ldparam", ptrB, "LSEpart")
    a("add.i64", t1, t1, ptrB)
    a("st.global.b32", Mem(t1, 0), lz, p=pA2)
    a("st.global.b32", Mem(t1, 32), lz + 1, p=pB2)       # row + 8
    a.pfree(pz, pA2, pB2)
    a("and.b64", t1, tid, 3)
    a("shl.b64", t1, t1, 1)                               # column 2t
    a("mad.i64", ptr, ptr, d, t1)
    a("shl.b64", ptr, ptr, 2)
    a("ldparam", t1, "Opart")
    a("add.i64", ptr, ptr, t1)
    a("add.i64", ptrB, ptr, 8 * d * 4)                    # row + 8
    for nt in range(NO):
        for r, (pr, pp) in enumerate(((pm, ptr), (pB, ptrB))):
            acc = o + 4 * nt + 2 * r
            a("mul.f32", acc, acc, rl + r)
            a("mul.f32", acc + 1, acc + 1, rl + r)
            a("st.global.v2.b32", Mem(pp, 32 * nt), acc, p=pr)


# ----------------------------------------------------------------------------- shared steps
# (of both kernels here, and of attention_grad_gpu's dq and dkdv kernels)
def kv_tile_counts(a, ntl, nfull, i0, Lq, Lk, rows: int, Bc: int, causal: bool, t, diff) -> None:
    """Emit ntl, the K/V tiles the block visits, and nfull, the tiles all its rows see whole (no mask)."""
    # the block: `rows` query rows from i0; tiles of Bc keys. Causal: diff = kv_len - q_len is left in
    # `diff`; t: scratch
    lb = log2(Bc)
    if causal:
        a("sub.i64", diff, Lk, Lq)
        a("add.i64", t, i0, rows - 1)
        a("sub.i64", ntl, Lq, 1)
        a("min.i64", t, t, ntl)                   # the block's last real row
        a("add.i64", ntl, t, diff)
        a("add.i64", ntl, ntl, Bc)
        a("shr.u64", ntl, ntl, lb)                # tiles up to the one holding its last visible key
        a("add.i64", nfull, i0, diff)
        a("add.i64", nfull, nfull, 1)
        a("shr.u64", nfull, nfull, lb)            # tiles every row sees whole
    else:
        a("add.i64", ntl, Lk, Bc - 1)
        a("shr.u64", ntl, ntl, lb)
        a("shr.u64", nfull, Lk, lb)


def pipelined(steps, load, compute) -> None:
    """Software pipeline over `steps` with two register buffers: the load of step i+1 is emitted
    before the compute of step i."""
    load(steps[0], 0)
    for i, st in enumerate(steps):
        if i + 1 < len(steps):
            load(steps[i + 1], (i + 1) % 2)
        compute(st, i % 2)


def ldmatrix_bases(a: Asm, lane, lay: str, RB: int):
    """Emit this lane's offsets of the two ldmatrix forms within a tile (without the stage)."""
    # V form (row L%16, chunk L/16): x4.trans of a k-major operand, x4 of an A operand; K form (row
    # (L%8) + 8(L/16), chunk (L/8)%2): x4 of an n-major operand, the "B^T" form. A k-step (32 bytes)
    # to the right is xor 32 on the offset.
    vx0, kx0, t1, t2 = a.reg(), a.reg(), a.reg(), a.reg()
    a("and.b64", t1, lane, 15)
    a("shr.u64", t2, lane, 4)
    a("shl.b64", t2, t2, 4)
    swizzle_offset(a, vx0, t1, t2, lay, RB, 0)
    a("and.b64", t1, lane, 7)
    a("shr.u64", t2, lane, 4)
    a("shl.b64", t2, t2, 3)
    a("add.i64", t1, t1, t2)
    a("shr.u64", t2, lane, 3)
    a("and.b64", t2, t2, 1)
    a("shl.b64", t2, t2, 4)
    swizzle_offset(a, kx0, t1, t2, lay, RB, 0)
    a.free(t1, t2)
    return vx0, kx0


def c_to_a(a: Asm, cvt: str, s, n_ksteps: int) -> None:
    """C fragments of 16 x 8 tiles 2kk, 2kk+1 -> f16x2 / bf16x2 A fragment of k-step kk at s + 8kk."""
    for kk in range(n_ksteps):
        b = s + 8 * kk
        a(cvt, b, b, b + 1)
        a(cvt, b + 1, b + 2, b + 3)
        a(cvt, b + 2, b + 4, b + 5)
        a(cvt, b + 3, b + 6, b + 7)


# ----------------------------------------------------------------------------- the tensor-core kernel
class _MmaCtx:
    """The tensor-core attention kernel being emitted: its geometry (from FlashCfg), its Asm, and the
    registers that more than one step of the kernel uses."""

    def __init__(self, c: FlashCfg):
        self.c = c
        self.d, self.Bc = d, Bc = c.d, c.Bc
        self.RB = RB = 2 * d                      # bytes of a Q / K / V row in shared memory
        self.lay = "sw64" if RB == 64 else "sw128"
        self.MT = c.mt                            # m-tiles a warp (16 rows each)
        self.BR = 16 * WARPS * c.mt               # query rows a block
        assert c.mt == 1 or not c.split
        Q_BYTES, self.KV_BYTES = self.BR * RB, Bc * RB
        self.SB = SB = 2 * self.KV_BYTES          # one stage: K tile then V tile
        self.ST0 = ST0 = Q_BYTES if c.qsep else 0  # first stage (Q always at 0)
        self.SWAP = ST0 ^ (ST0 + SB)              # rs ^ SWAP: the other stage
        assert c.qsep or Q_BYTES <= 2 * SB
        self.NS, self.KQ, self.NO, self.KP, self.NP = Bc // 8, d // 16, d // 8, Bc // 16, d // 16
        self.CPR = CPR = RB // 16                 # 16-byte chunks a row
        self.RS = THREADS // CPR                  # rows between one thread's copies
        if Bc % self.RS:
            raise OutOfRegisters(f"a {Bc}-row tile of {CPR} chunks a row does not split over {THREADS} threads")
        self.mma, self.cvt = MMA_OP[c.dtype], CVT_OUT[c.dtype]
        rows = f"_br{self.BR}" if c.mt > 1 else ""
        name = f"flash_attn_{c.dtype}_d{d}{rows}_bc{Bc}{'_causal' if c.causal else ''}{'_lse' if c.lse else ''}"
        if c.split:
            name = f"flash_attn_split_{c.dtype}_d{d}_bc{Bc}{'_causal' if c.causal else ''}"
        self.a = Asm(name, SPLIT_PARAMS if c.split else (LSE_PARAMS if c.lse else PARAMS), ST0 + 2 * SB)
        # the registers are attributes set by the steps that allocate them

    def free_loop(self) -> None:
        """Free the K / V loop's registers (before the epilogue)."""
        a = self.a
        a.free(self.j, self.jkey, self.rs, self.ntl, self.nfull, self.klim, self.rj, self.gk, self.kldb, self.vx0,
               self.kx0, self.soff)
        if self.limB is not self.limA:
            a.free(self.limB)
        a.free(self.limA)


def _mma_registers(ctx: _MmaCtx) -> None:
    """Allocate the big register blocks first (O, Q and K / V fragments, S, a zero tile); zero O.
    Each is MT blocks, m-tile mt's at offset mt times the block's size."""
    a, NO, MT = ctx.a, ctx.NO, ctx.MT
    ctx.o = o = a.reg(4 * NO * MT)                # O accumulators: n-tile nt at o + 4nt
    ctx.q = a.reg(4 * ctx.KQ * MT)                # Q A-fragments: k-step ks at q + 4ks
    ctx.s = a.reg(4 * ctx.NS * MT)                # S tiles (then P fragments: k-step kk at s + 8kk)
    ctx.kf = [a.reg(4), a.reg(4)]                 # K / V B-fragments (two n-tiles), double buffered
    ctx.zero = zero = a.reg(4)
    for i in range(4 * NO * MT):
        a("mov.f32", o + i, 0.0)
    for i in range(4):
        a("mov.f32", zero + i, 0.0)


def _mma_block(ctx: _MmaCtx) -> None:
    """Emit the block coordinates, the shapes, and this thread's copy row r0, column byte cb, offset soff."""
    a, CPR = ctx.a, ctx.CPR
    ctx.tid, ctx.lane, ctx.warp = tid, lane, warp = a.reg(), a.reg(), a.reg()
    a("s2r", tid, "%tid.x")
    a("and.b64", lane, tid, 31)
    a("shr.u64", warp, tid, 5)
    ctx.bq, ctx.hd, ctx.i0 = bq, hd, i0 = a.reg(), a.reg(), a.reg()
    a("s2r", bq, "%ctaid.z")
    a("s2r", hd, "%ctaid.y")
    ctx.j = _first_tile(a, i0, ctx.c.split, ctx.BR)
    ctx.Lq, ctx.Lk = Lq, Lk = a.reg(), a.reg()
    a("ldparam", Lq, "q_len")
    a("ldparam", Lk, "kv_len")
    ctx.r0, ctx.cb, ctx.soff = r0, cb, soff = a.reg(), a.reg(), a.reg()
    a("shr.u64", r0, tid, log2(CPR))              # this thread's first row of a tile
    a("and.b64", cb, tid, CPR - 1)
    a("shl.b64", cb, cb, 4)                       # its column byte
    a("mov.b64", soff, cb)
    swizzle_offset(a, soff, r0, soff, ctx.lay, ctx.RB, 0)  # shared offset of (r0, cb) in a tile


def _mma_col_base(ctx: _MmaCtx, dst, buf: str, rows, ld_name: str, off_name: str):
    """dst = buf + 2*((bq*rows)*ld + hd*d + off) + cb; returns the row pitch register (2*ld bytes)."""
    a = ctx.a
    ldb, t = a.reg(), a.reg()
    a("ldparam", ldb, ld_name)
    a("mul.i64", t, ctx.bq, rows)
    a("mul.i64", t, t, ldb)
    a("mad.i64", t, ctx.hd, ctx.d, t)
    a("ldparam", dst, off_name)
    a("add.i64", t, t, dst)
    a("shl.b64", t, t, 1)
    a("ldparam", dst, buf)
    a("add.i64", dst, dst, t)
    a("add.i64", dst, dst, ctx.cb)
    a("shl.b64", ldb, ldb, 1)
    a.free(t)
    return ldb


def _mma_copy_q(ctx: _MmaCtx) -> None:
    """Copy Q rows i0 + r0 + RS*i (clamped to q_len - 1) into the Q region at 0."""
    a, RS = ctx.a, ctx.RS
    gq = a.reg()
    qldb = _mma_col_base(ctx, gq, "Q", ctx.Lq, "q_ld", "q_off")
    qlim, t = a.reg(), a.reg()
    a("sub.i64", qlim, ctx.Lq, 1)
    for i in range(ctx.BR // RS):
        a("add.i64", t, ctx.r0, ctx.i0)
        if i:
            a("add.i64", t, t, RS * i)
        a("min.i64", t, t, qlim)
        a("mad.i64", t, t, qldb, gq)
        a("cp.async.16", Mem(ctx.soff, RS * i * ctx.RB), Mem(t, 0))
    a("cp.async.commit")
    a.free(gq, qldb, qlim, t)


def _mma_kv_stream(ctx: _MmaCtx) -> None:
    """Emit the K / V copy state: column bases, row pitch, rj (the next tile's first key row + r0)."""
    a = ctx.a
    ctx.gk, ctx.gv = a.reg(), a.reg()
    ctx.kldb = _mma_col_base(ctx, ctx.gk, "K", ctx.Lk, "kv_ld", "k_off")
    a.free(_mma_col_base(ctx, ctx.gv, "V", ctx.Lk, "kv_ld", "v_off"))
    ctx.klim, ctx.rj = klim, rj = a.reg(), a.reg()
    a("sub.i64", klim, ctx.Lk, 1)
    if ctx.c.split:
        a("mad.i64", rj, ctx.j, ctx.Bc, ctx.r0)   # first key row of the chunk's first tile (+ r0)
    else:
        a("mov.b64", rj, ctx.r0)
    a.free(ctx.cb)


def _mma_kv_copies(ctx: _MmaCtx, stage, guard=None) -> None:
    """Emit the copies of the next K and V tile into the stage at `stage`; rj moves on to the next tile."""
    # stage: a register, or an int offset
    a, RS, RB, soff, rj = ctx.a, ctx.RS, ctx.RB, ctx.soff, ctx.rj
    if isinstance(stage, int):
        sb, imm = soff, stage
    else:
        sb, imm = a.reg(), 0
        a("add.i64", sb, stage, soff)
    t, gk_, gv_ = a.reg(), a.reg(), a.reg()
    for i in range(ctx.Bc // RS):
        a("add.i64", t, rj, RS * i)
        a("min.i64", t, t, ctx.klim)
        a("mad.i64", gk_, t, ctx.kldb, ctx.gk)
        a("mad.i64", gv_, t, ctx.kldb, ctx.gv)
        a("cp.async.16", Mem(sb, imm + RS * i * RB), Mem(gk_, 0), p=guard)
        a("cp.async.16", Mem(sb, imm + ctx.KV_BYTES + RS * i * RB), Mem(gv_, 0), p=guard)
    a("cp.async.commit")
    a("add.i64", rj, rj, ctx.Bc)
    a.free(t, gk_, gv_)
    if sb is not soff:
        a.free(sb)


def _mma_frag_bases(ctx: _MmaCtx) -> None:
    """Emit the ldmatrix bases (without the stage); allocate the scratch registers t1, t2."""
    a = ctx.a
    ctx.vx0, ctx.kx0 = ldmatrix_bases(a, ctx.lane, ctx.lay, ctx.RB)
    ctx.t1, ctx.t2 = a.reg(), a.reg()


def _mma_q_to_registers(ctx: _MmaCtx) -> None:
    """The warp's 16 MT Q rows from shared memory into its A fragments."""
    a, t1, t2 = ctx.a, ctx.t1, ctx.t2
    for mt in range(ctx.MT):
        a("mul.i64", t1, ctx.warp, 16 * ctx.MT * ctx.RB)
        a("add.i64", t1, t1, ctx.vx0)             # row 16 (MT w + mt) + L%16 keeps the swizzle of row L%16
        if mt:
            a("add.i64", t1, t1, 16 * mt * ctx.RB)
        for ks in range(ctx.KQ):
            if ks:
                a("xor.b64", t2, t1, 32 * ks)
            a("ldmatrix.x4", ctx.q + 4 * ctx.KQ * mt + 4 * ks, Mem(t1 if ks == 0 else t2, 0))


def _mma_start(ctx: _MmaCtx) -> None:
    """Emit Q into registers and the start of K/V tile 0 (in flight with Q when Q has its own region)."""
    a = ctx.a
    if ctx.c.qsep:
        _mma_kv_copies(ctx, ctx.ST0)              # tile 0 flies while Q lands
        a("cp.async.wait", 1)
        a("bar.sync")
        _mma_q_to_registers(ctx)
    else:
        a("cp.async.wait", 0)
        a("bar.sync")
        _mma_q_to_registers(ctx)
        a("bar.sync")                             # every warp has its Q before tile 0 overwrites it
        _mma_kv_copies(ctx, ctx.ST0)


def _mma_tile_limits(ctx: _MmaCtx) -> None:
    """Emit the tile counts and the mask limits limA, limB of rows g, g + 8 (uniform per block)."""
    # key j is visible to row i iff j <= lim(i): lim = kv_len - 1, or i + kv_len - q_len when causal
    a, c, t1, t2 = ctx.a, ctx.c, ctx.t1, ctx.t2
    ntl, nfull, limA, limB = a.reg(), a.reg(), a.reg(), a.reg()
    ctx.ntl, ctx.nfull = ntl, nfull
    kv_tile_counts(a, ntl, nfull, ctx.i0, ctx.Lq, ctx.Lk, ctx.BR, ctx.Bc, c.causal, t1, t2)
    if c.causal:
        diff = t2
        a("shl.b64", t1, ctx.warp, log2(16 * ctx.MT))
        a("add.i64", limA, t1, ctx.i0)
        a("shr.u64", t1, ctx.lane, 2)
        a("add.i64", limA, limA, t1)              # row g of this lane
        a("add.i64", limA, limA, diff)
        a("add.i64", limB, limA, 8)               # row g + 8 (m-tile mt: both + 16 mt)
    else:
        a("mov.b64", limA, ctx.klim)
        a.free(limB)
        limB = limA
    ctx.limA, ctx.limB = limA, limB
    _last_tile(a, ntl, ctx.j, t1, c.split)
    a.free(ctx.Lq, ctx.Lk, ctx.bq, ctx.hd, ctx.i0, ctx.r0, ctx.warp)


def _mma_loop_state(ctx: _MmaCtx) -> None:
    """Emit the softmax state (m, l), the tile counter j, the lane's first key column jkey, stage rs."""
    a, c = ctx.a, ctx.c
    ctx.m, ctx.l = m, l = a.reg(2 * ctx.MT), a.reg(2 * ctx.MT)   # row max, partial row sums (rows g, g + 8 a tile)
    for r in range(2 * ctx.MT):
        a("mov.f32", m + r, float("-inf"))
    for r in range(2 * ctx.MT):
        a("mov.f32", l + r, 0.0)
    if c.split:
        jkey, rs = a.reg(), a.reg()
    else:
        ctx.j, jkey, rs = a.reg(), a.reg(), a.reg()
        a("mov.b64", ctx.j, 0)
    a("and.b64", jkey, ctx.lane, 3)
    a("shl.b64", jkey, jkey, 1)                   # key of this lane's first S column: j*Bc + 2t
    if c.split:
        a("mad.i64", jkey, ctx.j, ctx.Bc, jkey)
    a("mov.b64", rs, ctx.ST0)
    a.free(ctx.lane)
    ctx.jkey, ctx.rs = jkey, rs
    ctx.pn, ctx.pm = a.pred(), a.pred()


def _mma_scores(ctx: _MmaCtx) -> None:
    """S = Q K^T: k-step ks outer, key pairs jp inner (one address per k-step)."""
    a, t2, kf, s = ctx.a, ctx.t2, ctx.kf, ctx.s

    def k_load(st, buf):
        ks, jp = st
        if jp == 0:
            a("xor.b64", t2, ctx.kx0, 32 * ks)
            a("add.i64", t2, t2, ctx.rs)
        a("ldmatrix.x4", kf[buf], Mem(t2, 16 * jp * ctx.RB))

    def s_mma(st, buf):
        ks, jp = st
        for mt in range(ctx.MT):                  # one K fragment serves every m-tile of the warp
            for h in range(2):
                acc = s + 4 * ctx.NS * mt + 4 * (2 * jp + h)
                a(ctx.mma, acc, ctx.q + 4 * ctx.KQ * mt + 4 * ks, kf[buf] + 2 * h, ctx.zero if ks == 0 else acc)

    pipelined([(ks, jp) for ks in range(ctx.KQ) for jp in range(ctx.NS // 2)], k_load, s_mma)


def mma_mask(ctx: _MmaCtx, s=None, j=None, label: str = "UNMASKED") -> None:
    """Mask (diagonal and tail tiles only): score (row, jkey + 8nt + e%2) -> -inf past lim(row).
    ``s``, ``j``: the S block and the register holding its tile (default ctx.s, ctx.j)."""
    a, c, t1, t2 = ctx.a, ctx.c, ctx.t1, ctx.t2
    s = ctx.s if s is None else s
    a("setp.lt.i64", ctx.pm, ctx.j if j is None else j, ctx.nfull)
    a("bra", label, p=ctx.pm)
    pe = a.pred()
    a("sub.i64", t1, ctx.limA, ctx.jkey)
    if c.causal:
        a("sub.i64", t2, ctx.limB, ctx.jkey)
    for mt in range(ctx.MT):
        if mt and c.causal:                       # the m-tile's rows are 16 further down
            a("add.i64", t1, t1, 16)
            a("add.i64", t2, t2, 16)
        for nt in range(ctx.NS):
            for e in range(4):
                a("setp.lt.i64", pe, t2 if (c.causal and e >= 2) else t1, 8 * nt + (e & 1))
                a("mov.f32", s + 4 * ctx.NS * mt + 4 * nt + e, float("-inf"), p=pe)
    a.pfree(pe)
    a.label(label)


def _mma_online_softmax(ctx: _MmaCtx) -> None:
    """Emit the online softmax of each m-tile's rows g, g + 8 (e = 0, 1 and 2, 3), then P as A fragments."""
    a = ctx.a
    mx, nmc, al = a.reg(2), a.reg(2), a.reg(2)
    for mt in range(ctx.MT):
        mma_softmax_tile(ctx, ctx.s + 4 * ctx.NS * mt, ctx.m + 2 * mt, ctx.l + 2 * mt, ctx.o + 4 * ctx.NO * mt,
                          mx, nmc, al)
    a.free(mx, nmc, al, k=2)


def mma_softmax_tile(ctx: _MmaCtx, s, m, l, o, mx, nmc, al) -> None:
    """The online softmax of one m-tile: its S block s, row state m, l, O block o (mx, nmc, al: scratch
    pairs; al is left holding the rows' alpha). ``o`` None: O is not rescaled here (the caller does
    it once O is free)."""
    a, c, t1, NS = ctx.a, ctx.c, ctx.t1, ctx.NS
    for r in range(2):
        a("max.f32", mx + r, s + 2 * r, s + 2 * r + 1)
        for nt in range(1, NS):
            a("max.f32", mx + r, mx + r, s + 4 * nt + 2 * r)
            a("max.f32", mx + r, mx + r, s + 4 * nt + 2 * r + 1)
    for sh in (1, 2):
        for r in range(2):
            a("shfl.bfly.b64", t1, mx + r, sh)
            a("max.f32", mx + r, mx + r, t1)
    for r in range(2):
        a("max.f32", mx + r, mx + r, m + r)               # m_new
        a("mul.f32", nmc + r, mx + r, -c.c)               # -m_new * c
        if c.split:                                       # a row that has seen no key yet (m_new = -inf):
            pz = a.pred()                                 # shift by 0, so p = alpha = 0 instead of NaN
            a("setp.eq.f32", pz, mx + r, float("-inf"))
            a("mov.f32", nmc + r, 0.0, p=pz)
            a.pfree(pz)
        a("fma.f32", al + r, m + r, c.c, nmc + r)
        a("ex2.f32", al + r, al + r)                      # alpha = 2^(c (m_old - m_new))
        a("mov.f32", m + r, mx + r)
    for nt in range(NS):
        for e in range(4):
            x = s + 4 * nt + e
            a("fma.f32", x, x, c.c, nmc + (e >> 1))
            a("ex2.f32", x, x)                            # p = 2^(c s - c m_new)
    for r in range(2):                                    # l = alpha l + rowsum(p) (this lane's columns)
        a("add.f32", mx + r, s + 2 * r, s + 2 * r + 1)
        for nt in range(1, NS):
            a("add.f32", mx + r, mx + r, s + 4 * nt + 2 * r)
            a("add.f32", mx + r, mx + r, s + 4 * nt + 2 * r + 1)
        a("fma.f32", l + r, l + r, al + r, mx + r)
    if o is not None:
        rescale_o(a, o, al, ctx.NO)
    c_to_a(a, ctx.cvt, s, ctx.KP)                         # P k-step kk -> s + 8kk .. +3


def rescale_o(a: Asm, o, al, NO: int) -> None:
    """O *= alpha: rows g (e = 0, 1) and g + 8 (e = 2, 3) of each of the NO 16 x 8 tiles."""
    for nt in range(NO):
        for e in range(4):
            a("mul.f32", o + 4 * nt + e, o + 4 * nt + e, al + (e >> 1))


def _mma_pv(ctx: _MmaCtx) -> None:
    """O += P V: n-tile pair np outer (one address each), key k-step kk inner."""
    a, t2, kf, o = ctx.a, ctx.t2, ctx.kf, ctx.o

    def v_load(st, buf):
        np_, kk = st
        if kk == 0:
            a("xor.b64", t2, ctx.vx0, 32 * np_)
            a("add.i64", t2, t2, ctx.rs)
        a("ldmatrix.x4.trans", kf[buf], Mem(t2, ctx.KV_BYTES + 16 * kk * ctx.RB))

    def pv_mma(st, buf):
        np_, kk = st
        for mt in range(ctx.MT):                  # one V fragment serves every m-tile of the warp
            for h in range(2):
                acc = o + 4 * ctx.NO * mt + 4 * (2 * np_ + h)
                a(ctx.mma, acc, ctx.s + 4 * ctx.NS * mt + 8 * kk, kf[buf] + 2 * h, acc)

    pipelined([(np_, kk) for np_ in range(ctx.NP) for kk in range(ctx.KP)], v_load, pv_mma)


def _mma_kv_loop(ctx: _MmaCtx) -> None:
    """Emit the loop over K/V tiles (KV_LOOP): next tile's copies, scores, mask, softmax, O += P V."""
    a, t1, j, pm = ctx.a, ctx.t1, ctx.j, ctx.pm
    a.label("KV_LOOP")
    a("cp.async.wait", 0)                         # tile j landed (this thread's copies) ...
    a("bar.sync")                                 # ... everyone's; the stage of tile j-1 is free
    a("add.i64", t1, j, 1)
    a("setp.lt.i64", ctx.pn, t1, ctx.ntl)
    a("xor.b64", t1, ctx.rs, ctx.SWAP)
    _mma_kv_copies(ctx, t1, ctx.pn)               # tile j+1 into the other stage
    _mma_scores(ctx)
    mma_mask(ctx)
    _mma_online_softmax(ctx)
    _mma_pv(ctx)
    a("xor.b64", ctx.rs, ctx.rs, ctx.SWAP)
    a("add.i64", ctx.jkey, ctx.jkey, ctx.Bc)
    a("add.i64", j, j, 1)
    a("setp.lt.i64", pm, j, ctx.ntl)
    a("bra", "KV_LOOP", p=pm)


def _mma_row_sums(ctx: _MmaCtx):
    """Emit l summed over the quad and inverted; return the rows' natural LSE registers (lse, split)."""
    # the loop's registers are free from here on
    a, c, l, t1 = ctx.a, ctx.c, ctx.l, ctx.t1
    ctx.free_loop()
    R = 2 * ctx.MT                                        # rows g, g + 8 of each m-tile
    for sh in (1, 2):
        for r in range(R):
            a("shfl.bfly.b64", t1, l + r, sh)
            a("add.f32", l + r, l + r, t1)
    lz = None
    if c.lse or c.split:                                  # ln(sum e^(scale s)) = ln2 (c m + log2 l)
        lz = a.reg(R)
        for r in range(R):
            a("lg2.f32", lz + r, l + r)
            a("fma.f32", lz + r, ctx.m + r, c.c, lz + r)
            a("mul.f32", lz + r, lz + r, LN2)
    for r in range(R):
        a("rcp.f32", l + r, l + r)
    if c.split:
        _zero_if_empty(a, l, 2)
    return lz


def _scale_o(ctx: _MmaCtx, mt: int) -> None:
    """O / l of m-tile mt's rows g, g + 8 in place (l holds 1 / l)."""
    a = ctx.a
    for nt in range(ctx.NO):
        for r in range(2):
            acc = ctx.o + 4 * ctx.NO * mt + 4 * nt + 2 * r
            a("mul.f32", acc, acc, ctx.l + 2 * mt + r)
            a("mul.f32", acc + 1, acc + 1, ctx.l + 2 * mt + r)


def mma_epilogue(ctx: _MmaCtx, o_store=None) -> None:
    """Emit O / l of each m-tile's rows g, g + 8 in the input dtype (split: f32 partials) and, with
    lse, the LSE. ``o_store(ctx)``: instead of the stores from registers, emit O's stores (and the
    end) once the accumulators hold O / l (attention_wgmma's bulk tensor stores)."""
    # each lane: 2 columns of each 16 x 8 tile
    a, c, tid, t1, pm = ctx.a, ctx.c, ctx.tid, ctx.t1, ctx.pm
    lz = _mma_row_sums(ctx)
    if o_store is not None and not c.lse:                 # no rows to find: O / l, then its stores
        for mt in range(ctx.MT):
            _scale_o(ctx, mt)
        o_store(ctx)
        return
    row0, ptr, ptrB, x, ldb = a.reg(), a.reg(), a.reg(), a.reg(), a.reg()
    row = a.reg() if ctx.MT > 1 else row0                 # one m-tile: its rows are row0's
    if c.split:
        a("mov.b64", row0, 0)
    else:
        a("s2r", row0, "%ctaid.x")
        a("shl.b64", row0, row0, log2(ctx.BR))
    a("shr.u64", t1, tid, 5)
    a("shl.b64", t1, t1, log2(16 * ctx.MT))
    a("add.i64", row0, row0, t1)
    a("and.b64", t1, tid, 31)
    a("shr.u64", t1, t1, 2)
    a("add.i64", row0, row0, t1)                          # i0 + 16 MT w + g
    a("ldparam", x, "q_len")
    pB = a.pred()
    for mt in range(ctx.MT):
        if ctx.MT > 1:
            a("add.i64", row, row0, 16 * mt)              # the m-tile's row g
        a("setp.lt.i64", pm, row, x)
        a("add.i64", t1, row, 8)
        a("setp.lt.i64", pB, t1, x)
        if c.split:
            _split_epilogue_mma(a, c, ctx.o, ctx.l, lz, row, ptr, ptrB, x, t1, tid, pm, pB, ctx.NO)
            a("exit")
            return
        if c.lse:                                         # lane t == 0 of each quad stores rows g, g + 8
            pz, pA2, pB2 = a.pred(), a.pred(), a.pred()
            a("and.b64", t1, tid, 3)
            a("setp.eq.i64", pz, t1, 0)
            a("and.pred", pA2, pm, pz)
            a("and.pred", pB2, pB, pz)
            a("s2r", t1, "%ctaid.z")
            a("s2r", ptr, "%nctaid.y")
            a("s2r", ptrB, "%ctaid.y")
            a("mad.i64", t1, t1, ptr, ptrB)               # b*heads + head
            a("mad.i64", t1, t1, x, row)                  # (b*heads + head)*q_len + row
            a("shl.b64", t1, t1, 2)
            a("ldparam", ptr, "LSE")
            a("add.i64", ptr, ptr, t1)
            a("st.global.b32", Mem(ptr, 0), lz + 2 * mt, p=pA2)
            a("st.global.b32", Mem(ptr, 32), lz + 2 * mt + 1, p=pB2)   # row + 8
            a.pfree(pz, pA2, pB2)
        if o_store is not None:
            _scale_o(ctx, mt)
            continue
        a("s2r", t1, "%ctaid.z")
        a("mad.i64", row, t1, x, row)                     # b*q_len + row
        a("ldparam", ldb, "o_ld")
        a("mul.i64", row, row, ldb)
        a("s2r", t1, "%ctaid.y")
        a("mad.i64", row, t1, ctx.d, row)
        a("ldparam", t1, "o_off")
        a("add.i64", row, row, t1)
        a("and.b64", t1, tid, 3)
        a("shl.b64", t1, t1, 1)
        a("add.i64", row, row, t1)                        # + 2t
        a("shl.b64", row, row, 1)
        a("ldparam", ptr, "O")
        a("add.i64", ptr, ptr, row)
        a("shl.b64", ldb, ldb, 4)                         # 8 rows of O
        a("add.i64", ptrB, ptr, ldb)
        for nt in range(ctx.NO):
            for r, (pr, pp) in enumerate(((pm, ptr), (pB, ptrB))):
                acc = ctx.o + 4 * ctx.NO * mt + 4 * nt + 2 * r
                a("mul.f32", acc, acc, ctx.l + 2 * mt + r)
                a("mul.f32", acc + 1, acc + 1, ctx.l + 2 * mt + r)
                a(ctx.cvt, x, acc, acc + 1)
                a("st.global.b32", Mem(pp, 16 * nt), x, p=pr)
        if mt + 1 < ctx.MT:
            a("ldparam", x, "q_len")                      # (x held a converted pair)
    if o_store is not None:
        a.free(row0, ptr, ptrB, x, ldb, *((row,) if row is not row0 else ()))
        o_store(ctx)
        return
    a("exit")


def _emit_mma(c: FlashCfg) -> Program:
    """The tensor-core kernel (see the module docstring)."""
    ctx = _MmaCtx(c)
    _mma_registers(ctx)
    _mma_block(ctx)
    _mma_copy_q(ctx)
    _mma_kv_stream(ctx)
    _mma_frag_bases(ctx)
    _mma_start(ctx)
    _mma_tile_limits(ctx)
    _mma_loop_state(ctx)
    _mma_kv_loop(ctx)
    mma_epilogue(ctx)
    return ctx.a.build()


# ----------------------------------------------------------------------------- the FFMA kernel
U = 8                        # keys per online-softmax step of the FFMA kernel


@dataclass(frozen=True)
class _FCfg:
    dtype: str          # fp32, or fp16 / bf16 on a target whose tensor units lack it
    d: int
    causal: bool
    Bc: int
    c: float
    lse: bool = False
    split: bool = False  # as FlashCfg.split


class _FfmaCtx:
    """The FFMA attention kernel being emitted: its geometry (from _FCfg), its Asm, and the
    registers that more than one step of the kernel uses."""

    def __init__(self, c: _FCfg):
        self.c = c
        self.d, self.Bc, self.es = d, Bc, es = c.d, c.Bc, (4 if c.dtype == "fp32" else 2)
        self.HB = HB = d // 2 * es                # bytes of a half row
        self.RBp = RBp = 2 * HB + 16              # padded shared row
        self.KV_BYTES = Bc * RBp
        self.SB = SB = 2 * self.KV_BYTES
        self.CPR = CPR = d * es // 16
        self.RS = THREADS // CPR
        if self.RS > Bc or Bc % self.RS:
            raise OutOfRegisters(f"a {Bc}-row tile of {CPR} chunks a row does not split over {THREADS} threads")
        self.H = d // 2                           # elements a thread holds
        self.NV = HB // 16                        # 16-byte loads per half row
        name = f"flash_attn_ffma_{c.dtype}_d{d}_bc{Bc}{'_causal' if c.causal else ''}{'_lse' if c.lse else ''}"
        if c.split:
            name = f"flash_attn_split_ffma_{c.dtype}_d{d}_bc{Bc}{'_causal' if c.causal else ''}"
        self.a = Asm(name, SPLIT_PARAMS if c.split else (LSE_PARAMS if c.lse else PARAMS), 2 * SB)
        # the registers are attributes set by the steps that allocate them


def _ffma_block(ctx: _FfmaCtx) -> None:
    """Allocate the Q, O and score registers (O zeroed) and load buffers; emit block coordinates, shapes."""
    a, H = ctx.a, ctx.H
    ctx.qv, ctx.ov, ctx.sv = a.reg(H), a.reg(H), a.reg(U)
    ctx.buf = [a.reg(4), a.reg(4)]
    for i in range(H):
        a("mov.f32", ctx.ov + i, 0.0)
    tid, bq, hd, i0, Lq, Lk, t1, t2 = (a.reg() for _ in range(8))
    ctx.tid, ctx.bq, ctx.hd, ctx.i0, ctx.Lq, ctx.Lk, ctx.t1, ctx.t2 = tid, bq, hd, i0, Lq, Lk, t1, t2
    a("s2r", tid, "%tid.x")
    a("s2r", bq, "%ctaid.z")
    a("s2r", hd, "%ctaid.y")
    ctx.j0 = _first_tile(a, i0, ctx.c.split)
    a("ldparam", Lq, "q_len")
    a("ldparam", Lk, "kv_len")


def _ffma_to_f32(ctx: _FfmaCtx, dst, src, high: bool = False) -> None:
    """Emit dst = src as f32 (high: the upper half of an f16x2 / bf16x2 pair)."""
    a, dtype = ctx.a, ctx.c.dtype
    if dtype == "fp16":
        a("cvt.f32.f16h" if high else "cvt.f32.f16", dst, src)
    elif dtype == "bf16":
        a("cvt.f32.bf16h" if high else "cvt.f32.bf16", dst, src)
    elif dst != src:
        a("mov.b64", dst, src)


def _ffma_row_ptr(ctx: _FfmaCtx, dst, buf_name: str, rows, row, ld_name: str, off_name: str, half) -> None:
    """dst = buf + es*((bq*rows + row)*ld + hd*d + off + half*d/2)."""
    a, t2 = ctx.a, ctx.t2
    a("mad.i64", dst, ctx.bq, rows, row)
    a("ldparam", t2, ld_name)
    a("mul.i64", dst, dst, t2)
    a("mad.i64", dst, ctx.hd, ctx.d, dst)
    a("ldparam", t2, off_name)
    a("add.i64", dst, dst, t2)
    if half is not None:
        a("mad.i64", dst, half, ctx.H, dst)
    a("shl.b64", dst, dst, log2(ctx.es))
    a("ldparam", t2, buf_name)
    a("add.i64", dst, dst, t2)


def _ffma_load_q(ctx: _FfmaCtx) -> None:
    """This thread's half Q row (row clamped), scaled by c = scale*log2(e), in f32."""
    a, es, t1, qv = ctx.a, ctx.es, ctx.t1, ctx.qv
    ctx.qrow, ctx.half, ctx.g = qrow, half, g = a.reg(), a.reg(), a.reg()
    a("shr.u64", qrow, ctx.tid, 1)
    a("add.i64", qrow, qrow, ctx.i0)              # unclamped query row
    a("and.b64", half, ctx.tid, 1)
    a("sub.i64", t1, ctx.Lq, 1)
    a("min.i64", t1, t1, qrow)
    _ffma_row_ptr(ctx, g, "Q", ctx.Lq, t1, "q_ld", "q_off", half)
    ld = {2: "ld.global.u16", 4: "ld.global.b32"}[es]
    for e in range(ctx.H):
        a(ld, qv + e, Mem(g, e * es))
    for e in range(ctx.H):
        _ffma_to_f32(ctx, qv + e, qv + e)
        a("mul.f32", qv + e, qv + e, ctx.c.c)


def _ffma_kv_stream(ctx: _FfmaCtx) -> None:
    """Emit the copy geometry: this thread's shared offset, K and V pointers, row pitch and rj."""
    # chunk q = tid + 128 i -> row q / CPR, chunk q % CPR (+16 bytes in the second half)
    a, CPR, t1 = ctx.a, ctx.CPR, ctx.t1
    r0, cb, soff, gk, gv, kldb, klim, rj = (a.reg() for _ in range(8))
    a("shr.u64", r0, ctx.tid, log2(CPR))
    a("and.b64", cb, ctx.tid, CPR - 1)
    a("mul.i64", soff, r0, ctx.RBp)
    a("shr.u64", t1, cb, log2(CPR // 2))
    a("shl.b64", t1, t1, 4)
    a("add.i64", soff, soff, t1)
    a("shl.b64", cb, cb, 4)
    a("add.i64", soff, soff, cb)
    a("mov.b64", t1, 0)
    _ffma_row_ptr(ctx, gk, "K", ctx.Lk, t1, "kv_ld", "k_off", None)
    a("add.i64", gk, gk, cb)
    _ffma_row_ptr(ctx, gv, "V", ctx.Lk, t1, "kv_ld", "v_off", None)
    a("add.i64", gv, gv, cb)
    a("ldparam", kldb, "kv_ld")
    a("shl.b64", kldb, kldb, log2(ctx.es))
    a("sub.i64", klim, ctx.Lk, 1)
    if ctx.c.split:
        a("mad.i64", rj, ctx.j0, ctx.Bc, r0)
    else:
        a("mov.b64", rj, r0)
    a.free(cb, r0)
    ctx.soff, ctx.gk, ctx.gv, ctx.kldb, ctx.klim, ctx.rj = soff, gk, gv, kldb, klim, rj


def _ffma_kv_copies(ctx: _FfmaCtx, stage, guard=None) -> None:
    """Emit the copies of the next K and V tile into the stage at `stage`; rj moves on to the next tile."""
    a, t1, RS, RBp, rj = ctx.a, ctx.t1, ctx.RS, ctx.RBp, ctx.rj
    sb = a.reg()
    if isinstance(stage, int):
        a("add.i64", sb, ctx.soff, stage)
    else:
        a("add.i64", sb, stage, ctx.soff)
    gk_, gv_ = a.reg(), a.reg()
    for i in range(ctx.Bc // RS):
        a("add.i64", t1, rj, RS * i)
        a("min.i64", t1, t1, ctx.klim)
        a("mad.i64", gk_, t1, ctx.kldb, ctx.gk)
        a("mad.i64", gv_, t1, ctx.kldb, ctx.gv)
        a("cp.async.16", Mem(sb, RS * i * RBp), Mem(gk_, 0), p=guard)
        a("cp.async.16", Mem(sb, ctx.KV_BYTES + RS * i * RBp), Mem(gv_, 0), p=guard)
    a("cp.async.commit")
    a("add.i64", rj, rj, ctx.Bc)
    a.free(sb, gk_, gv_)


def _ffma_loop_state(ctx: _FfmaCtx) -> None:
    """Emit the tile counts, this row's last visible key (lim) and the loop state (m, l, j, key, rs)."""
    a, c, t1, t2 = ctx.a, ctx.c, ctx.t1, ctx.t2
    ctx.ntl, ctx.nfull, ctx.lim = ntl, nfull, lim = a.reg(), a.reg(), a.reg()
    kv_tile_counts(a, ntl, nfull, ctx.i0, ctx.Lq, ctx.Lk, BR, ctx.Bc, c.causal, t1, t2)
    if c.causal:
        a("add.i64", lim, ctx.qrow, t2)           # t2: kv_len - q_len
    else:
        a("mov.b64", lim, ctx.klim)
    _last_tile(a, ntl, ctx.j0, t1, c.split)
    a.free(ctx.i0, ctx.Lk)
    m, l, ctx.al, ctx.mx = a.reg(), a.reg(), a.reg(), a.reg()
    ctx.m, ctx.l = m, l
    a("mov.f32", m, float("-inf"))
    a("mov.f32", l, 0.0)
    if c.split:
        j = ctx.j0
        rs, kp, key, jc, khalf = (a.reg() for _ in range(5))
        a("mul.i64", key, j, ctx.Bc)
    else:
        j, rs, kp, key, jc, khalf = (a.reg() for _ in range(6))
        a("mov.b64", j, 0)
        a("mov.b64", key, 0)
    a("mov.b64", rs, 0)
    a("mul.i64", khalf, ctx.half, ctx.HB + 16)    # this thread's half of a shared row
    ctx.j, ctx.rs, ctx.kp, ctx.key, ctx.jc, ctx.khalf = j, rs, kp, key, jc, khalf
    ctx.pn, ctx.pm, ctx.pk = a.pred(), a.pred(), a.pred()


def _ffma_scores(ctx: _FfmaCtx) -> None:
    """Emit the scores of keys key .. key+U-1: fma over the half row, plus the partner's half."""
    # log2 domain: Q is pre-scaled
    a, es, buf, kp, qv, sv, t1 = ctx.a, ctx.es, ctx.buf, ctx.kp, ctx.qv, ctx.sv, ctx.t1
    for u in range(U):
        def load(i, b, u=u):
            a("ld.shared.v4.b32", buf[b], Mem(kp, u * ctx.RBp + 16 * i))

        def comp(i, b, u=u):
            per = 4 if es == 4 else 8
            for e in range(per):
                x = qv + per * i + e
                src = buf[b] + (e if es == 4 else e // 2)
                if es == 4:
                    v = src
                else:
                    v = t1
                    _ffma_to_f32(ctx, t1, src, high=bool(e & 1))
                if i == 0 and e == 0:
                    a("mul.f32", sv + u, x, v)
                else:
                    a("fma.f32", sv + u, x, v, sv + u)
        pipelined(range(ctx.NV), load, comp)
        a("shfl.bfly.b64", t1, sv + u, 1)
        a("add.f32", sv + u, sv + u, t1)          # + the partner's half


def _ffma_online_softmax(ctx: _FfmaCtx) -> None:
    """Emit the mask (tiles that need it) and the online-softmax update of the U scores."""
    a, c, sv, m, l, al, mx, t1 = ctx.a, ctx.c, ctx.sv, ctx.m, ctx.l, ctx.al, ctx.mx, ctx.t1
    a("bra", "UNMASKED", p=ctx.pk, neg=True)
    a("sub.i64", t1, ctx.lim, ctx.key)
    pe = a.pred()
    for u in range(U):
        a("setp.lt.i64", pe, t1, u)
        a("mov.f32", sv + u, float("-inf"), p=pe)
    a.pfree(pe)
    a.label("UNMASKED")
    a("max.f32", mx, sv, sv + 1)
    for u in range(2, U):
        a("max.f32", mx, mx, sv + u)
    a("max.f32", mx, mx, m)
    a("sub.f32", al, m, mx)
    a("ex2.f32", al, al)
    a("mov.f32", m, mx)
    if c.split:                                   # no key seen yet (m_new = -inf): p = alpha = 0, not NaN
        pz = a.pred()
        a("setp.eq.f32", pz, mx, float("-inf"))
        a("mov.f32", mx, 0.0, p=pz)
        a("mov.f32", al, 0.0, p=pz)
        a.pfree(pz)
    for u in range(U):
        a("sub.f32", sv + u, sv + u, mx)
        a("ex2.f32", sv + u, sv + u)
    a("add.f32", mx, sv, sv + 1)
    for u in range(2, U):
        a("add.f32", mx, mx, sv + u)
    a("fma.f32", l, l, al, mx)
    for e in range(ctx.H):
        a("mul.f32", ctx.ov + e, ctx.ov + e, al)


def _ffma_pv(ctx: _FfmaCtx) -> None:
    """O += p V over the U keys of the step, a half row of V each."""
    a, es, buf, kp, sv, ov, t1 = ctx.a, ctx.es, ctx.buf, ctx.kp, ctx.sv, ctx.ov, ctx.t1
    for u in range(U):
        def vload(i, b, u=u):
            a("ld.shared.v4.b32", buf[b], Mem(kp, ctx.KV_BYTES + u * ctx.RBp + 16 * i))

        def vcomp(i, b, u=u):
            per = 4 if es == 4 else 8
            for e in range(per):
                x = ov + per * i + e
                if es == 4:
                    v = buf[b] + e
                else:
                    v = t1
                    _ffma_to_f32(ctx, t1, buf[b] + e // 2, high=bool(e & 1))
                a("fma.f32", x, sv + u, v, x)
        pipelined(range(ctx.NV), vload, vcomp)


def _ffma_kv_loop(ctx: _FfmaCtx) -> None:
    """Emit the loop over K/V tiles (KV_LOOP), U keys a step (CHUNK): scores, softmax, O += p V."""
    a, t1, t2, j, rs, kp, key, jc, pm = ctx.a, ctx.t1, ctx.t2, ctx.j, ctx.rs, ctx.kp, ctx.key, ctx.jc, ctx.pm
    a.label("KV_LOOP")
    a("cp.async.wait", 0)
    a("bar.sync")
    a("add.i64", t1, j, 1)
    a("setp.lt.i64", ctx.pn, t1, ctx.ntl)
    a("xor.b64", t2, rs, ctx.SB)
    _ffma_kv_copies(ctx, t2, ctx.pn)
    a("setp.ge.i64", ctx.pk, j, ctx.nfull)        # this tile needs the mask
    a("add.i64", kp, rs, ctx.khalf)
    a("mov.b64", jc, 0)
    a.label("CHUNK")
    _ffma_scores(ctx)
    _ffma_online_softmax(ctx)
    _ffma_pv(ctx)
    a("add.i64", kp, kp, U * ctx.RBp)
    a("add.i64", key, key, U)
    a("add.i64", jc, jc, 1)
    a("setp.lt.i64", pm, jc, ctx.Bc // U)
    a("bra", "CHUNK", p=pm)
    a("xor.b64", rs, rs, ctx.SB)
    a("add.i64", j, j, 1)
    a("setp.lt.i64", pm, j, ctx.ntl)
    a("bra", "KV_LOOP", p=pm)


def _ffma_lse(ctx: _FfmaCtx):
    """Emit al = the row's natural LSE; returns pz, a new predicate: this thread stores it."""
    a, al = ctx.a, ctx.al
    pz = a.pred()                                 # thread 0 of the pair, row < q_len
    a("setp.eq.i64", pz, ctx.half, 0)
    a("and.pred", pz, pz, ctx.pm)
    a("lg2.f32", al, ctx.l)                       # scores are in the log2 domain: ln2 (m + log2 l)
    a("add.f32", al, al, ctx.m)
    a("mul.f32", al, al, LN2)
    return pz


def _ffma_split_epilogue(ctx: _FfmaCtx) -> None:
    """Emit the split-KV epilogue: f32 partial O / l and its LSE (the pair's thread 0) to the workspaces."""
    a, l, al, g, t1, t2, half, pm = ctx.a, ctx.l, ctx.al, ctx.g, ctx.t1, ctx.t2, ctx.half, ctx.pm
    pz = _ffma_lse(ctx)
    _split_index(a, g, t1)
    a("mad.i64", g, g, ctx.Lq, ctx.qrow)          # ((b h s) q_len + row)
    a("shl.b64", t1, g, 2)
    a("ldparam", t2, "LSEpart")
    a("add.i64", t1, t1, t2)
    a("st.global.b32", Mem(t1, 0), al, p=pz)
    a.pfree(pz)
    a("rcp.f32", l, l)
    _zero_if_empty(a, l, 1)
    a("mul.i64", g, g, ctx.d)
    a("mad.i64", g, half, ctx.H, g)
    a("shl.b64", g, g, 2)
    a("ldparam", t2, "Opart")
    a("add.i64", g, g, t2)
    for e in range(ctx.H):
        a("mul.f32", ctx.ov + e, ctx.ov + e, l)
    for e in range(0, ctx.H, 4):
        a("st.global.v4.b32", Mem(g, 4 * e), ctx.ov + e, p=pm)
    a("exit")


def _ffma_epilogue(ctx: _FfmaCtx) -> None:
    """Emit O / l in the input dtype and, with lse, the row's LSE (both threads of a row hold the full l)."""
    a, c, l, al, t1, t2, ov, pm = ctx.a, ctx.c, ctx.l, ctx.al, ctx.t1, ctx.t2, ctx.ov, ctx.pm
    a("setp.lt.i64", pm, ctx.qrow, ctx.Lq)
    if c.split:
        _ffma_split_epilogue(ctx)
        return
    if c.lse:
        pz = _ffma_lse(ctx)
        a("s2r", t1, "%nctaid.y")
        a("mad.i64", t1, ctx.bq, t1, ctx.hd)      # b*heads + head
        a("mad.i64", t1, t1, ctx.Lq, ctx.qrow)
        a("shl.b64", t1, t1, 2)
        a("ldparam", t2, "LSE")
        a("add.i64", t1, t1, t2)
        a("st.global.b32", Mem(t1, 0), al, p=pz)
        a.pfree(pz)
    a("rcp.f32", l, l)
    _ffma_row_ptr(ctx, ctx.g, "O", ctx.Lq, ctx.qrow, "o_ld", "o_off", ctx.half)
    if ctx.es == 4:
        for e in range(ctx.H):
            a("mul.f32", ov + e, ov + e, l)
            a("st.global.b32", Mem(ctx.g, 4 * e), ov + e, p=pm)
    else:
        cvt = CVT_OUT[c.dtype]
        for e in range(0, ctx.H, 2):
            a("mul.f32", ov + e, ov + e, l)
            a("mul.f32", ov + e + 1, ov + e + 1, l)
            a(cvt, t1, ov + e, ov + e + 1)
            a("st.global.b32", Mem(ctx.g, 2 * e), t1, p=pm)
    a("exit")


def _emit_ffma(c: _FCfg) -> Program:
    """The same algorithm on the vector pipes: a pair of threads per query row, each holding half
    of the (pre-scaled) Q row and half of the O row in f32 registers; K/V tiles staged raw by
    cp.async into two shared-memory stages (rows padded by 16 bytes between the halves, so the
    two halves of a warp read different banks; the 16 lanes of a half read one address, a
    broadcast); keys taken U = 8 at a time: scores by fma over the half row plus one shfl.bfly,
    then the online-softmax update and O += p V by fma."""
    ctx = _FfmaCtx(c)
    _ffma_block(ctx)
    _ffma_load_q(ctx)
    _ffma_kv_stream(ctx)
    _ffma_kv_copies(ctx, 0)
    _ffma_loop_state(ctx)
    _ffma_kv_loop(ctx)
    _ffma_epilogue(ctx)
    return ctx.a.build()


# ----------------------------------------------------------------------------- the split-KV combine
COMBINE_WARPS = 4            # one warp per (batch, head, query row)
COMBINE_UNROLL = 8           # splits per iteration of the combine's weighted sum


def _emit_combine(dtype: str, d: int, lse: bool) -> Program:
    """O = sum_s w_s O_s / sum_s w_s with w_s = exp(LSE_s - max_s LSE_s), per (batch, head, query
    row) r = (b*heads + head)*q_len + i: a warp per row, lane L holding columns E*L .. E*L+E-1 (E =
    d/32) in f32. One loop over the splits, COMBINE_UNROLL an iteration whose loads (each split's
    LSE, one vector load a lane of its partial O) are all issued before the first is used, with
    the max taken online (the weights so far rescaled when it grows), splits past the end guarded
    off with weight 0. The row's LSE is max + ln(sum w)."""
    E, UC = d // 32, COMBINE_UNROLL
    es = ELEM_BYTES[dtype]
    name = f"flash_attn_combine_{dtype}_d{d}{'_lse' if lse else ''}"
    a = Asm(name, COMBINE_PARAMS + (("LSE",) if lse else ()), 0)
    acc, ob, lv = a.reg(E), a.reg(E * UC), a.reg(UC)
    tid, lane, r, n, t1, t2, S, sp, pl, po, stl, sto, mx, nm, w, l = (a.reg() for _ in range(16))
    pm, pe = a.pred(), a.pred()
    pu = a.pred()
    a("s2r", tid, "%tid.x")
    a("and.b64", lane, tid, 31)
    a("s2r", r, "%ctaid.x")
    a("shr.u64", t1, tid, 5)
    a("mad.i64", r, r, COMBINE_WARPS, t1)          # the row of this warp
    a("ldparam", n, "rows")
    a("setp.ge.i64", pe, r, n)
    a("exit", p=pe)
    a("ldparam", S, "splits")
    a("ldparam", n, "q_len")
    a("rem.i64", t1, r, n)                         # i
    a("div.i64", t2, r, n)                         # b*heads + head
    a("mul.i64", pl, t2, S)
    a("mad.i64", pl, pl, n, t1)                    # the slot of split 0: (bh*S*q_len + i)
    a("shl.b64", stl, n, 2)                        # a split further on: q_len f32 (LSE)
    a("mul.i64", sto, stl, d)                      # ... q_len*d f32 (O)
    a("mul.i64", t1, lane, E)                      # this lane's first column
    a("mad.i64", po, pl, d, t1)
    a("shl.b64", po, po, 2)
    a("ldparam", t1, "Opart")
    a("add.i64", po, po, t1)
    a("shl.b64", pl, pl, 2)
    a("ldparam", t1, "LSEpart")
    a("add.i64", pl, pl, t1)
    # one pass, online over the splits (COMBINE_UNROLL an iteration): m = the largest LSE so far,
    # l = sum of 2^(log2e (LSE_s - m)), acc = the same weighted sum of the partials; rescaled by
    # alpha = 2^(log2e (m_old - m)) when m grows. Split 0 holds key 0, which every row sees, so m
    # is finite from the first iteration on; a split past the end or a partial that saw no key has
    # LSE -inf and weight 0.
    ld = {1: "ld.global.b32", 2: "ld.global.v2.b32", 4: "ld.global.v4.b32"}[E]
    a("mov.f32", mx, float("-inf"))
    a("mov.f32", l, 0.0)
    for e in range(E):
        a("mov.f32", acc + e, 0.0)
    for e in range(E * UC):
        a("mov.f32", ob + e, 0.0)
    a("mov.b64", sp, 0)
    a.label("SPLITS")
    for u in range(UC):
        a("add.i64", t1, sp, u)
        a("setp.lt.i64", pu, t1, S)
        a("mov.f32", lv + u, float("-inf"))
        a("ld.global.b32", lv + u, Mem(pl, 0), p=pu)
        a(ld, ob + E * u, Mem(po, 0), p=pu)
        a("add.i64", pl, pl, stl)
        a("add.i64", po, po, sto)
    a("max.f32", t1, mx, lv)
    for u in range(1, UC):
        a("max.f32", t1, t1, lv + u)                 # m_new
    a("mul.f32", nm, t1, -LOG2E)
    a("fma.f32", w, mx, LOG2E, nm)
    a("ex2.f32", w, w)                             # alpha (0 on the first iteration: m_old = -inf)
    a("mov.f32", mx, t1)
    a("mul.f32", l, l, w)
    for e in range(E):
        a("mul.f32", acc + e, acc + e, w)
    for u in range(UC):
        a("fma.f32", w, lv + u, LOG2E, nm)
        a("ex2.f32", w, w)
        a("add.f32", l, l, w)
        for e in range(E):
            a("fma.f32", acc + e, w, ob + E * u + e, acc + e)
    a("add.i64", sp, sp, UC)
    a("setp.lt.i64", pe, sp, S)
    a("bra", "SPLITS", p=pe)
    # out: O row (b*q_len + i) at head's columns, in the storage dtype
    if lse:
        a("lg2.f32", w, l)
        a("fma.f32", w, w, LN2, mx)
        a("shl.b64", t1, r, 2)
        a("ldparam", t2, "LSE")
        a("add.i64", t1, t1, t2)
        a("setp.eq.i64", pm, lane, 0)
        a("st.global.b32", Mem(t1, 0), w, p=pm)
    a("rcp.f32", l, l)
    for e in range(E):
        a("mul.f32", acc + e, acc + e, l)
    a("ldparam", S, "heads")
    a("div.i64", t2, r, n)                         # b*heads + head
    a("rem.i64", t1, r, n)                         # i
    a("div.i64", sp, t2, S)                        # b
    a("rem.i64", t2, t2, S)                        # head
    a("mad.i64", sp, sp, n, t1)                    # O row b*q_len + i
    a("ldparam", t1, "o_ld")
    a("mul.i64", sp, sp, t1)
    a("mad.i64", sp, t2, d, sp)
    a("mad.i64", sp, lane, E, sp)
    a("ldparam", t1, "o_off")
    a("add.i64", sp, sp, t1)
    a("mul.i64", sp, sp, es)
    a("ldparam", t1, "O")
    a("add.i64", sp, sp, t1)
    if es == 4:
        st = {1: "st.global.b32", 2: "st.global.v2.b32", 4: "st.global.v4.b32"}[E]
        a(st, Mem(sp, 0), acc)
    else:
        cvt = CVT_OUT[dtype]
        if E == 1:
            a(cvt, ob, acc, acc)
            a("st.global.b16", Mem(sp, 0), ob)
        else:
            for e in range(0, E, 2):
                a(cvt, ob + e // 2, acc + e, acc + e + 1)
            a("st.global.b32" if E == 2 else "st.global.v2.b32", Mem(sp, 0), ob)
    a("exit")
    return a.build()


def combine_flops(rows: int, splits: int, d: int) -> int:
    """The combine's elementwise math per (batch, head, query row): per split a max, an fma and an
    ex2 for the weight, an add to the sum, and d fma; then d multiplies by 1/sum."""
    return rows * (splits * (2 * d + 4) + d)


# ----------------------------------------------------------------------------- configuration
def _fits(prog: Program, caps) -> bool:
    return (prog.shared_bytes <= caps.scratchpad_bytes and prog.nregs <= caps.max_regs_per_thread
            and prog.nregs * THREADS <= caps.regs_per_core and WARPS <= caps.warp_slots)


def _choose_ffma(caps, dtype: str, d: int, causal: bool, c: float, lse: bool = False,
                 split: bool = False) -> tuple[_FCfg, Program]:
    tried = []
    for Bc in FFMA_BC_CHOICES:
        shared = 4 * Bc * (d * ELEM_BYTES[dtype] + 16)
        if shared > caps.scratchpad_bytes:
            tried.append(f"Bc {Bc}: {shared} B scratchpad")
            continue
        cfg = _FCfg(dtype, d, causal, Bc, c, lse, split)
        try:
            prog = _emit_ffma(cfg)
        except OutOfRegisters as e:
            tried.append(f"Bc {Bc}: {e}")
            continue
        if _fits(prog, caps):
            return cfg, prog
        tried.append(f"Bc {Bc}: {prog.nregs} registers x {THREADS} threads")
    raise InputError(f"attention on {caps.name}", f"head_dim {d} {dtype} (FFMA kernel): no K/V tile fits a core ("
                     + "; ".join(dict.fromkeys(tried)) + ")", "a smaller head_dim or a larger target")


def _choose(caps, dtype: str, d: int, causal: bool, c: float, lse: bool = False,
            split: bool = False, rows128: bool = False) -> tuple[FlashCfg, Program]:
    """The first tile that fits: with ``rows128`` FlashAttention-2's forward blocks of 128 query
    rows (4 warps of two 16-row m-tiles sharing each K and V fragment) with 64-key tiles, then
    blocks of 64 rows (its split-KV blocks) with the largest Bc. (FA2's head-dim-128 kernel reads Q
    from shared memory at every tile, which this one holds in registers: there 128 rows leave room
    for 16-key tiles only, and 64 rows are taken.)"""
    tried = []
    tiles = [(1, Bc) for Bc in BC_CHOICES]
    if rows128 and not split:
        tiles.insert(0, (2, BC_CHOICES[0]))
    for mt, Bc, qsep in ((mt, Bc, qsep) for mt, Bc in tiles for qsep in (True, False)):
        rows = 16 * WARPS * mt
        shared = (rows * 2 * d if qsep else 0) + 2 * 2 * Bc * 2 * d
        if not qsep and rows * 2 * d > 2 * 2 * Bc * 2 * d:
            continue
        # (a refusal names the 64-row tiles' reasons only: the 128-row one is a preference)
        note = tried.append if mt == 1 else (lambda _: None)
        if shared > caps.scratchpad_bytes:
            note(f"Bc {Bc}{' (Q apart)' if qsep else ''}: {shared} B scratchpad")
            continue
        cfg = FlashCfg(dtype, d, causal, Bc, qsep, c, lse, split, mt)
        try:
            prog = _emit_mma(cfg)
        except OutOfRegisters as e:
            note(f"Bc {Bc}: {e}")
            continue
        if _fits(prog, caps):
            return cfg, prog
        note(f"Bc {Bc}: {prog.nregs} registers x {THREADS} threads")
    raise InputError(f"attention on {caps.name}", f"head_dim {d} {dtype}: no K/V tile fits a core ("
                     + "; ".join(dict.fromkeys(tried)) + ")", "a smaller head_dim or a larger target")


# ----------------------------------------------------------------------------- API
def check_attention_args(where: str, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld,
                         kv_ld, o_ld, dtypes_allowed: str, family: str = "gpu"):
    """The argument checks the fused attention kernels (forward and backward, GPU and Sunway:
    ``family``) share: one InputError line per bad value. Returns (batch, heads, q_len, kv_len, d, dtype, {q_ld, kv_ld,
    o_ld}, scale) normalised."""
    vals = {"batch": batch, "heads": heads, "q_len": q_len, "kv_len": kv_len}
    for n, v in vals.items():
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise InputError(where, f"{n} = {v!r}", "an integer >= 1")
    batch, heads, q_len, kv_len = (int(v) for v in vals.values())
    if head_dim not in HEAD_DIMS:
        raise InputError(where, f"head_dim = {head_dim!r}", ", ".join(map(str, HEAD_DIMS)))
    d = int(head_dim)
    if dtype not in DTYPE_ALIASES:
        raise InputError(where, f"dtype {dtype!r}", dtypes_allowed)
    dt = DTYPE_ALIASES[dtype]
    if caps.family != family:
        who = "GPU" if family == "gpu" else family.capitalize()
        raise InputError(f"{where} on {caps.name}", f"the {who} attention emitter targets the {family} family, "
                         f"not {caps.family}", f"a {family}-family machine")
    if family == "gpu" and not caps.has_async_copy:
        raise InputError(f"{where} on {caps.name}", "the fused attention kernels stream K/V tiles with async "
                         "copies", "a target with async copies")
    if causal and kv_len < q_len:
        raise InputError(where, f"causal with kv_len {kv_len} < q_len {q_len}: the first queries would see no key",
                         "kv_len >= q_len when causal")
    hd = heads * d
    lds = {}
    for n, v in (("q_ld", q_ld), ("kv_ld", kv_ld), ("o_ld", o_ld)):
        v = hd if v is None else v
        if isinstance(v, bool) or int(v) != v or v < hd or v % 8:
            raise InputError(where, f"{n} = {v!r}", f"a multiple of 8 elements >= heads*head_dim = {hd}")
        lds[n] = int(v)
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise InputError(where, f"scale = {scale!r}", "a finite number > 0")
    return batch, heads, q_len, kv_len, d, dt, lds, scale


def fills_gpu(caps, batch: int, heads: int, q_len: int) -> bool:
    """Would blocks of 64 query rows nearly fill the GPU at two blocks an SM (at least 0.8 x 2 x SMs
    of them, the first test of FA2's num_splits_heuristic)? Then blocks of 128 rows lose little
    (at the threshold they leave a fifth of the SMs idle in the last wave: 0.8 x SMs of them)."""
    return batch * heads * ceil_div(q_len, BR) >= 1.6 * caps.cores_total


def flash_attention_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                           dtype: str = "fp16", causal: bool = False, scale: Optional[float] = None,
                           q_ld: Optional[int] = None, kv_ld: Optional[int] = None,
                           o_ld: Optional[int] = None, with_lse: bool = False,
                           kernel: Optional[str] = None) -> AttentionKernel:
    """Emit fused attention O = softmax(scale Q K^T + mask) V for a GPU-family target (see the
    module docstring for the layout and the algorithm). scale defaults to 1/sqrt(head_dim);
    q_ld / kv_ld / o_ld (elements between consecutive rows) default to heads*head_dim.
    with_lse: the program takes one more buffer, LSE (float32 [batch, heads, q_len], contiguous),
    and writes there each query row's natural log-sum-exp of its scaled, masked scores (what the
    fused backward recomputes P from). ``kernel``: None (the rule above) or "mma" (the tensor-core
    kernel, refused where the target has none). FlashAttention-3's kernel is attention_wgmma's."""
    where = "attention"
    batch, heads, q_len, kv_len, d, dt, lds, scale = check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld, "fp16, bf16, fp32")
    if kernel not in KERNELS:
        raise InputError(where, f"kernel {kernel!r}", ", ".join(k for k in KERNELS if k))
    use_mma = dt in MMA_OP and dt in caps.tensor_dtypes and "tensor" in caps.units and caps.warp_width == 32
    if kernel == "mma" and not use_mma:
        raise InputError(f"{where} on {caps.name}", f"kernel mma: {dt} on {caps.name} has no tensor-core path",
                         "kernel auto")
    if use_mma:
        # FlashAttention-2's 128-row kernel where 64-row blocks would nearly fill the GPU at two blocks
        # an SM (at least 0.8 x 2 x SMs of them: the test flash_api's num_splits_heuristic starts
        # with); 64-row blocks below it (a simplification of FA2's split choice, module docstring)
        rows128 = q_len > BR and fills_gpu(caps, batch, heads, q_len)
        cfg, prog = _choose(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse), rows128=rows128)
        rows = 16 * WARPS * cfg.mt
    else:
        cfg, prog = _choose_ffma(caps, dt, d, bool(causal), scale * LOG2E, bool(with_lse))
        rows = BR
    check(prog, caps)
    launch = Launch((ceil_div(q_len, rows), heads, batch), (THREADS, 1, 1))
    pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    return AttentionKernel(program=prog, launch=launch, flops=4 * d * batch * heads * pairs,
                           model_flops=4 * d * batch * heads * q_len * kv_len, batch=batch, heads=heads,
                           q_len=q_len, kv_len=kv_len, head_dim=d, dtype=dt, causal=bool(causal), scale=scale,
                           Bc=cfg.Bc, kind="mma" if use_mma else "ffma", with_lse=bool(with_lse), block_rows=rows,
                           **lds)


# ----------------------------------------------------------------------------- split-KV (flash-decoding)
@dataclass(frozen=True)
class AttentionPart:
    """One kernel of a multi-kernel attention: its name (attn.split / attn.combine), program,
    launch, the math it executes, its share of the textbook count and the buffers it writes."""

    name: str
    program: Program
    launch: Launch
    flops: int
    model_flops: int
    outputs: tuple


def forced_chunk(where: str, splits, tiles: int) -> int:
    """K/V tiles per split when the caller forces ``splits`` (an integer >= 1; InputError else)."""
    if isinstance(splits, bool) or int(splits) != splits or splits < 1:
        raise InputError(where, f"splits = {splits!r}", "an integer >= 1")
    return ceil_div(tiles, int(splits))


def kv_splits(caps, batch: int, heads: int, q_len: int, kv_len: int, Bc: int) -> tuple[int, int]:
    """(splits, chunk): the kv sequence cut into ``splits`` chunks of ``chunk`` K/V tiles (every
    chunk at least one tile). The chunk is the one that minimises the critical path in tiles,
    waves x (chunk + 1) = ceil(batch*heads*splits / cores) * (chunk + 1) with splits = ceil(tiles /
    chunk): one block a core (SM) at a time, a short last chunk does not shorten its wave, and a
    block's start (Q, the first tile's latency) costs about one tile; the largest such chunk on a
    tie (the combine reads fewer partials). So a machine nearly filled by batch*heads blocks
    (gpt2-small decode at batch 8: 96 blocks on 108 SMs) keeps the whole-row kernel; on a100 (1025
    keys in 64-key tiles) GPT-2 small decode (12 heads) gets 9 splits of 2 tiles, 108 blocks, and
    llama2-7b (32 heads) 3 splits of 6 tiles. 1 split (the whole-row kernel) when q_len > BR (more
    than one query block), when batch*heads blocks already cover the cores, or when the sequence
    is a single tile."""
    tiles = ceil_div(kv_len, Bc)
    bh, cores = batch * heads, caps.cores_total
    if q_len > BR or bh >= cores or tiles < 2:
        return 1, tiles
    best = None
    for chunk in range(tiles, 0, -1):
        cost = ceil_div(bh * ceil_div(tiles, chunk), cores) * (chunk + 1)
        if best is None or cost < best[0]:
            best = (cost, chunk)
    chunk = best[1]
    return ceil_div(tiles, chunk), chunk       # (1, tiles) when no split beats the whole row


@dataclass(frozen=True)
class SplitAttentionKernel:
    """Split-KV attention (Flash-Decoding): ``parts`` = (split, combine), run in order. The split
    kernel is the flash loop of ``flash_attention_kernel`` over one chunk of ``chunk`` K/V tiles
    per block (grid (splits, heads, batch)), writing an f32 partial O, normalised by its own
    softmax sum, and that sum's log-sum-exp into the workspaces Opart [batch, heads, splits,
    q_len, d] and LSEpart [batch, heads, splits, q_len]; the combine kernel (a warp per (batch,
    head, query row)) weighs the partials by exp(LSE_s - LSE) and writes O in the storage dtype
    (and LSE with with_lse)."""

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
    Bc: int
    splits: int
    chunk: int               # K/V tiles per split
    kind: str = "mma"
    with_lse: bool = False

    host_dtype = AttentionKernel.host_dtype
    _need = AttentionKernel._need
    lse_buffer = AttentionKernel.lse_buffer
    random_inputs = AttentionKernel.random_inputs
    reference = AttentionKernel.reference
    output = AttentionKernel.output

    @property
    def flops(self) -> int:
        return sum(p.flops for p in self.parts)

    @property
    def model_flops(self) -> int:
        return sum(p.model_flops for p in self.parts)

    def part(self, name: str) -> AttentionPart:
        for p in self.parts:
            if p.name == name or p.name.endswith("." + name):
                return p
        raise KeyError(name)

    def workspaces(self) -> dict:
        """Scratch buffers the caller allocates (name -> (shape, host dtype)); no contents needed."""
        B, H, S, Lq = self.batch, self.heads, self.splits, self.q_len
        return {"Opart": ((B, H, S, Lq, self.head_dim), np.float32), "LSEpart": ((B, H, S, Lq), np.float32)}

    def buffer_bytes(self, q_off: int = 0, k_off: int = 0, v_off: int = 0, o_off: int = 0) -> dict:
        out = AttentionKernel.buffer_bytes(self, q_off, k_off, v_off, o_off)
        for n, (shape, _) in self.workspaces().items():
            out[n] = 4 * int(np.prod(shape))
        return out

    def args(self, Q, K, V, O, Opart, LSEpart, *, q_off: int = 0, k_off: int = 0, v_off: int = 0, o_off: int = 0,
             LSE=None) -> dict:
        """Every buffer and scalar of both kernels (``part_args`` picks a part's): Q, K, V, O as
        ``AttentionKernel.args`` takes them, the two f32 workspaces, and LSE with with_lse."""
        out = AttentionKernel.args(self, Q, K, V, O, q_off=q_off, k_off=k_off, v_off=v_off, o_off=o_off, LSE=LSE)
        where = f"split-KV attention b{self.batch} h{self.heads} {self.q_len}x{self.kv_len} d{self.head_dim}"
        want = self.buffer_bytes()
        for name, v in (("Opart", Opart), ("LSEpart", LSEpart)):
            if isinstance(v, np.ndarray) and (v.dtype != np.float32 or not v.flags.c_contiguous):
                raise InputError(where, f"{name} is a {v.dtype} array", "a C-contiguous float32 array")
            if int(getattr(v, "nbytes", -1)) < want[name]:
                raise InputError(where, f"{name} has {getattr(v, 'nbytes', None)} bytes", f"at least {want[name]}")
        out.update(Opart=Opart, LSEpart=LSEpart, chunk=self.chunk, splits=self.splits, heads=self.heads,
                   rows=self.batch * self.heads * self.q_len)
        return out

    @staticmethod
    def part_args(part: AttentionPart, args: dict) -> dict:
        """The arguments of one part, from ``args``."""
        return {k: args[k] for k in part.program.params}

    def workspace_buffers(self) -> tuple:
        """Zeroed (Opart, LSEpart) numpy workspaces."""
        return tuple(np.zeros(shape, dt) for shape, dt in self.workspaces().values())


def split_kv_attention_kernel(caps, batch: int, heads: int, q_len: int, kv_len: int, head_dim: int,
                              dtype: str = "fp16", causal: bool = False, scale: Optional[float] = None,
                              q_ld: Optional[int] = None, kv_ld: Optional[int] = None, o_ld: Optional[int] = None,
                              with_lse: bool = False, splits: Optional[int] = None,
                              name: str = "attn") -> Optional[SplitAttentionKernel]:
    """Split-KV attention for a small query block (decode), as ``flash_attention_kernel``'s
    arguments (the same layouts, mask and dtypes; the same tile rule, so the same Bc). ``splits``
    None chooses from the target (``kv_splits``: enough blocks to cover the cores, every chunk at
    least one K/V tile) and returns None when one split would do (the whole-row kernel is the
    better choice); a number forces (about) that many splits (chunk = ceil(tiles / splits) tiles,
    for tests). Needs q_len <= 64 (one query block; with splits None a longer q_len returns None)."""
    where = "split-KV attention"
    batch, heads, q_len, kv_len, d, dt, lds, scale = check_attention_args(
        where, caps, batch, heads, q_len, kv_len, head_dim, dtype, causal, scale, q_ld, kv_ld, o_ld, "fp16, bf16, fp32")
    if q_len > BR:
        if splits is None:
            return None
        raise InputError(where, f"q_len {q_len}", f"q_len <= {BR} (one query block; longer queries fill the machine)")
    use_mma = dt in MMA_OP and dt in caps.tensor_dtypes and "tensor" in caps.units and caps.warp_width == 32
    c = scale * LOG2E
    cfg, prog = (_choose if use_mma else _choose_ffma)(caps, dt, d, bool(causal), c, False, True)
    tiles = ceil_div(kv_len, cfg.Bc)
    if splits is None:
        n, chunk = kv_splits(caps, batch, heads, q_len, kv_len, cfg.Bc)
        if n <= 1:
            return None
    else:
        chunk = forced_chunk(where, splits, tiles)
        n = ceil_div(tiles, chunk)
    check(prog, caps)
    comb = _emit_combine(dt, d, bool(with_lse))
    check(comb, caps)
    rows = batch * heads * q_len
    pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
    parts = (AttentionPart(f"{name}.split", prog, Launch((n, heads, batch), (THREADS, 1, 1)),
                           4 * d * batch * heads * pairs, 4 * d * batch * heads * q_len * kv_len, ("Opart", "LSEpart")),
             AttentionPart(f"{name}.combine", comb,
                           Launch((ceil_div(rows, COMBINE_WARPS), 1, 1), (32 * COMBINE_WARPS, 1, 1)),
                           combine_flops(rows, n, d), 0, ("O", "LSE") if with_lse else ("O",)))
    return SplitAttentionKernel(parts=parts, batch=batch, heads=heads, q_len=q_len, kv_len=kv_len, head_dim=d,
                                dtype=dt, causal=bool(causal), scale=scale, Bc=cfg.Bc, splits=n, chunk=chunk,
                                kind="mma" if use_mma else "ffma", with_lse=bool(with_lse), **lds)
