"""Op graph -> kernels: each op of a decoder block becomes one or more emitted kernels, from the
emitters of the target's machine family (``family_emitters``: the *_gpu modules for the GPU family).

A ``Kernel`` here is an emitted program bound to the block's tensors: its buffer parameters are
``Slot``s (a tensor of the block, an element offset into it, and the shape the kernel wants a
numpy array in), its scalar parameters are numbers. The run layer (archsim.runner) gives the slots
real numpy arrays in functional mode or address space in timing mode; the emitters never see the
engine (the dependency rule of docs/architecture.md).

How each op kind is emitted (tensor names and layouts: archsim/workloads/ops.py):

- gemm: one tiled GEMM (gemm_gpu; dgrad with trans_b, wgrad with trans_a), out in the storage dtype.
  A skinny one (decode's) whose output tiles leave cores idle is split along K when the family
  can (``split_k``): ``<op>.partial``, the slices of K as a batched GEMM writing f32 partial sums
  into a workspace (``<op>.partial_sums``), then ``<op>.reduce`` adding them up into the output.
- attention in decode: first ``attn.kv_append`` copies the new tokens' K, V rows of qkv into the
  caches' last row (kvcache_gpu), then the attention kernels read K, V from the caches.
- attention, fused: one flash-attention kernel (attention_gpu, FlashAttention-2's; on Hopper where
  the grid is large attention_wgmma, FlashAttention-3's) reading Q, K, V in place from the
  fused qkv tensor [T, 3h] (decode: K, V from the cache [b, kv_len, h]) and writing attn_out.
  When the query rows fit one block (decode) and batch*heads blocks cannot cover the cores, split-KV
  instead (attention_gpu / attention_sunway.split_kv_attention_kernel): ``attn.split`` (the flash loop
  over one chunk of the cache per block, f32 partial O and LSE into workspaces) and ``attn.combine``.
- attention, unfused (the s x s matrix goes through memory): ``attn.qk`` S = Q K^T as a batched
  GEMM over (batch, head) into attn_scores [b, n, q, kv]; ``attn.softmax`` P = softmax(S / sqrt(d))
  with the causal mask into attn_probs; ``attn.av`` O = P V, a batched GEMM writing each head's
  columns of attn_out.
- attention_grad, unfused: dV = P^T dO, dP = dO V^T, dS = softmax'(P, dP) (the scale folded in),
  dQ = dS K, dK = dS^T Q: four batched GEMMs and a row kernel, writing the Q, K, V thirds of d_qkv.
- layernorm / rmsnorm: one row kernel that also saves its statistics (``<op>.mean``,
  ``<op>.rstd``, f32) for the backward, which reads them (``<op>.grad``: dx, then the column sums
  for d_gamma / d_beta, with a workspace when the rows are split over the machine).
- gelu, relu, add, and their grads: grid-stride flat kernels; swiglu(_grad): row kernels.
- mixture of experts: ``route`` as ``route.topk`` (a thread a token: softmax and the
  top_k logits) and ``route.assign`` (a block an expert: a prefix sum of its hits in priority order
  gives each its slot, past the capacity -1); ``dispatch`` and ``combine`` row kernels (a block a
  slot or token); ``expert1`` / ``expert2`` one batched GEMM over the experts' [C, K] slices; the
  backward's combine.grad (dw, dslot), route.grad and dispatch.grad likewise (the Sunway family runs
  the same programs at a CPE a block, elementwise_sunway).

flops and model_flops of a kernel are its share of its op's (the op graph's counts are
authoritative): a multi-kernel op splits them by the kernels' own nominal counts, and its model_flops
by the matmuls each kernel holds.

Kernel naming: a kernel is named after its op (``qkv``, ``ffn1.wgrad``); an op emitted as several
kernels names them ``<op>.<part>`` (``attn.qk``, ``attn.softmax``, ``attn.av``, ``norm1.grad.dx``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace

import numpy as np

from archsim.errors import InputError
from archsim.isa.program import Launch, Program
from archsim.isa.tensor_map import TensorMap

from . import elementwise_gpu as EW
from .common import BUF_BYTES, OUT_BYTES, OutOfRegisters
from .gemm_gpu import to_float, to_host

# storage dtype of a block's tensors -> the GEMM emitter's output dtype
_OUT = {"fp16": "f16", "bf16": "bf16", "fp32": "f32"}
_ES = {**BUF_BYTES, **OUT_BYTES}    # bytes of an element, by storage, index or GEMM output dtype name


@dataclass(frozen=True)
class Slot:
    """A buffer parameter bound to a tensor of the block: from element ``offset`` on; ``view`` is
    the shape the kernel wants a numpy array in (None: the flat rest of the tensor)."""

    tensor: str
    nbytes: int
    offset: int = 0
    view: tuple | None = None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple
    dtype: str            # fp16 | bf16 | fp32 | i32 (host format as in gemm_gpu.to_host)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * _ES[self.dtype]


@dataclass(frozen=True)
class Kernel:
    name: str
    op: str
    program: Program
    launch: Launch
    flops: int                       # its share of the op's flops (the math executed)
    model_flops: int                 # its share of the op's textbook count
    params: dict                     # parameter -> Slot | int
    tensors: tuple                   # TensorSpec of every tensor it reads or writes
    outputs: tuple                   # parameters it writes
    acc_error: float = 0.0           # a GEMM accumulating below f32: relative error vs sum |a*b| (see gemm_sunway)
    k_tile: int = 0                  # a GEMM's k tile: elements of its K argument one pass of its k-loop takes

    def key(self) -> str:
        """Identity for memoization: the same program, launch and arguments (sizes and scalars)
        time the same on the same machine."""
        h = hashlib.sha1(self.program.content_digest())
        h.update(repr((self.launch, sorted((k, _param_key(v)) for k, v in self.params.items()))).encode())
        return h.hexdigest()


def _param_key(v):
    """What identifies a kernel argument for Kernel.key: a slot's size, a tensor map's words, a scalar."""
    if isinstance(v, Slot):
        return v.nbytes
    if isinstance(v, TensorMap):
        return (v.of, v.words, v.offset)
    return int(v)


@dataclass(frozen=True)
class FamilyEmitters:
    """The kernel emitters of one machine family. Each family's modules have the same functions
    with the same signatures and return the same kernel classes, so the composition below is one
    for both families."""

    gemm_kernel: object
    flash_attention_kernel: object
    flash_attention_grad_kernel: object
    kv_append_kernel: object
    ew: object                       # module with the elementwise / row kernels
    gemm_acc_error: object = None    # GemmKernel -> its accumulation's relative error (None: f32, 0)
    split_attention_kernel: object = None   # split-KV decode attention (None: the family has none)
    split_k: object = None           # (caps, M, N, K, dtype, trans_b, trans_a=) -> slices of K (None: no split-K)


GPU_ATTENTION_KERNELS = ("mma", "wgmma")   # a fused attention's kernel on a GPU when one is asked for


def gpu_flash_attention_kernel(caps, batch, heads, q_len, kv_len, head_dim, dtype="fp16", causal=False, *,
                               kernel: str | None = None, **kw):
    """A GPU's fused attention kernel: FlashAttention-3's ("wgmma": attention_wgmma) or
    FlashAttention-2's ("mma": attention_gpu, its own rule). ``kernel`` None: FA3's where the target
    has wgmma and tma, it applies, one of its blocks fits a core and the grid is large by FA2's own
    128-row test (attention_gpu.fills_gpu; Hopper runs FA3 so), else FA2's, whose 64-row blocks
    spread a small grid wider; ``--set tensor.wgmma=null`` gives FA2's on h100."""
    from . import attention_gpu, attention_wgmma

    args = (caps, batch, heads, q_len, kv_len, head_dim, dtype, causal)
    if kernel == "wgmma":
        return attention_wgmma.flash_attention3_kernel(*args, **kw)
    if (kernel is None and attention_wgmma.applies(caps, dtype, head_dim, q_len, kv_len)
            and attention_gpu.fills_gpu(caps, batch, heads, q_len)):
        try:
            return attention_wgmma.flash_attention3_kernel(*args, **kw)
        except InputError:            # its block does not fit this core: FA2's kernel does the work
            pass
    if kernel not in (None,) + GPU_ATTENTION_KERNELS:
        raise InputError("attention", f"kernel {kernel!r}", ", ".join(GPU_ATTENTION_KERNELS))
    return attention_gpu.flash_attention_kernel(*args, kernel=kernel, **kw)


def family_emitters(caps) -> FamilyEmitters:
    """The emitters for ``caps.family``; a family without emitters is a one-line input error."""
    if caps.family == "gpu":
        from . import attention_gpu, attention_grad_gpu, gemm_gpu, kvcache_gpu
        return FamilyEmitters(gemm_gpu.gemm_kernel, gpu_flash_attention_kernel,
                              attention_grad_gpu.flash_attention_grad_kernel, kvcache_gpu.kv_append_kernel, EW,
                              split_attention_kernel=attention_gpu.split_kv_attention_kernel,
                              split_k=gemm_gpu.split_k)
    if caps.family == "sunway":
        from . import attention_grad_sunway, attention_sunway, elementwise_sunway, gemm_sunway, kvcache_sunway
        return FamilyEmitters(gemm_sunway.gemm_kernel, attention_sunway.flash_attention_kernel,
                              attention_grad_sunway.flash_attention_grad_kernel, kvcache_sunway.kv_append_kernel,
                              elementwise_sunway, gemm_sunway.accumulation_error,
                              split_attention_kernel=attention_sunway.split_kv_attention_kernel)
    raise InputError(f"--hw {caps.name}", f"no kernel emitters for the {caps.family} family",
                     "a gpu or sunway machine")


class _Ctx:
    """What the emitters of one block need: target and its family's emitters, tensor shapes,
    storage dtype, norm eps."""

    def __init__(self, caps, shapes: dict, dtype: str, eps: float = 1e-5):
        self.caps = caps
        self.E = family_emitters(caps)
        self.shapes = shapes
        self.dt = dtype
        self.eps = eps
        self.extra: dict[str, TensorSpec] = {}   # tensors the kernels add (statistics, scores, workspaces)
        self.dtypes: dict[str, str] = {}         # tensors not stored in the scenario's dtype

    def spec(self, name: str, shape=None, dtype=None) -> TensorSpec:
        """A tensor's shape (the graph's, else the first kernel's that names it) and storage dtype
        (the scenario's unless a kernel stores it otherwise: statistics and workspaces in f32)."""
        if dtype is not None:
            self.dtypes.setdefault(name, dtype)
        dt = self.dtypes.get(name, self.dt)
        if name in self.shapes:
            return TensorSpec(name, tuple(self.shapes[name]), dt)
        if name not in self.extra:
            self.extra[name] = TensorSpec(name, tuple(shape), dt)
        return self.extra[name]

    def slot(self, name: str, offset: int = 0, view=None, shape=None, dtype=None) -> Slot:
        s = self.spec(name, shape, dtype)
        return Slot(name, s.nbytes - offset * _ES[s.dtype], offset, tuple(view) if view is not None else None)


def _split(total: int, weights: list) -> list[int]:
    """total split in proportion to weights, as integers that add up to total."""
    w = [max(float(x), 0.0) for x in weights]
    s = sum(w) or float(len(w))
    parts = [int(total * (x if sum(w) else 1.0) // s) for x in w]
    parts[-1] += total - sum(parts)
    return parts


def _mk(name, op, prog, launch, flops, model_flops, params, ctx, outputs) -> Kernel:
    tensors = tuple(dict.fromkeys(ctx.spec(v.tensor) for v in params.values() if isinstance(v, Slot)))
    return Kernel(name, op.name, prog, launch, int(flops), int(model_flops), params, tensors, tuple(outputs))


# ----------------------------------------------------------------------------- GEMMs
def _acc(ctx, k) -> float:
    return ctx.E.gemm_acc_error(k) if ctx.E.gemm_acc_error else 0.0


def _gemm_call(ctx, M, N, K, *, trans_a=False, trans_b=False, **kw):
    return ctx.E.gemm_kernel(ctx.caps, M, N, K, ctx.dt, _OUT[ctx.dt], trans_b, trans_a=trans_a, **kw)


def _gemm(op, ctx) -> list[Kernel]:
    d = op.dims
    ta, tb = bool(d.get("trans_a")), bool(d.get("trans_b"))
    if ctx.E.split_k is not None:
        S = ctx.E.split_k(ctx.caps, d["M"], d["N"], d["K"], ctx.dt, tb, trans_a=ta)
        if S > 1:
            return _gemm_split_k(op, ctx, S)
    k = _gemm_call(ctx, d["M"], d["N"], d["K"], trans_a=ta, trans_b=tb)
    a, b = op.inputs[:2]
    (c,) = op.outputs
    sl = {"A": ctx.slot(a, view=k.a_shape), "B": ctx.slot(b, view=k.b_shape), "C": ctx.slot(c, view=k.c_shape)}
    kern = _mk(op.name, op, k.program, k.launch, op.flops, op.model_flops, k.args(sl["A"], sl["B"], sl["C"]), ctx,
               ("C",))
    return [replace(kern, acc_error=_acc(ctx, k), k_tile=k.tile.BK)]


def _gemm_split_k(op, ctx, S: int) -> list[Kernel]:
    """C = A @ B as S slices of K: block z of ``<op>.partial`` multiplies the z-th slice of A's
    columns (rows of A^T) by the z-th slice of B's rows (columns of B^T) into f32 partial sums
    [S, M, N]; ``<op>.reduce`` adds them into C in the storage dtype. The partial GEMM carries the
    op's flops; the reduction its own adds."""
    d = op.dims
    M, N, K = d["M"], d["N"], d["K"]
    ta, tb = bool(d.get("trans_a")), bool(d.get("trans_b"))
    ks = K // S
    lda, ldb = (M if ta else K), (K if tb else N)
    k = ctx.E.gemm_kernel(ctx.caps, M, N, ks, ctx.dt, "f32", tb, trans_a=ta, lda=lda, ldb=ldb, ldc=N, batch=(S, 1),
                          stride_a=(ks * M if ta else ks, 0), stride_b=(ks if tb else ks * N, 0),
                          stride_c=(M * N, 0))
    a, b = op.inputs[:2]
    (c,) = op.outputs
    ws = f"{op.name}.partial_sums"
    part = _mk(f"{op.name}.partial", op, k.program, k.launch, op.flops, op.model_flops,
               k.args(ctx.slot(a), ctx.slot(b), ctx.slot(ws, shape=(S, M, N), dtype="fp32")), ctx, ("C",))
    r = ctx.E.ew.chunk_sum_kernel(ctx.caps, M * N, S, ctx.dt)
    red = _mk(f"{op.name}.reduce", op, r.program, r.launch, r.flops, 0,
              r.args(ws=ctx.slot(ws, view=(S, M * N)), y=ctx.slot(c, view=(M * N,))), ctx, ("y",))
    return [replace(part, acc_error=_acc(ctx, k), k_tile=k.tile.BK), red]


def _batched(ctx, name, op, flops, model_flops, M, N, K, A, B, C, *, trans_a=False, trans_b=False, lda, ldb, ldc,
             batch, stride_a, stride_b, stride_c) -> Kernel:
    """A batched GEMM over (batch, head); A, B, C: (tensor, element offset[, shape if scratch])."""
    k = _gemm_call(ctx, M, N, K, trans_a=trans_a, trans_b=trans_b, lda=lda, ldb=ldb, ldc=ldc, batch=batch,
                   stride_a=stride_a, stride_b=stride_b, stride_c=stride_c)
    sl = [ctx.slot(t[0], t[1], shape=t[2] if len(t) > 2 else None) for t in (A, B, C)]
    return replace(_mk(name, op, k.program, k.launch, flops, model_flops, k.args(*sl), ctx, ("C",)),
                   acc_error=_acc(ctx, k), k_tile=k.tile.BK)


# ----------------------------------------------------------------------------- attention
def _attn_geometry(op, ctx):
    d = op.dims
    b, n, hd, q, kv = d["batch"], d["heads"], d["head_dim"], d["q_len"], d["kv_len"]
    h = n * hd
    cache = "k_cache" in op.inputs
    # where K and V rows live: (tensor, element offset, row stride)
    kt = ("k_cache", 0, h) if cache else ("qkv", h, 3 * h)
    vt = ("v_cache", 0, h) if cache else ("qkv", 2 * h, 3 * h)
    return b, n, hd, q, kv, h, kt, vt


def _kv_append(op, ctx) -> list[Kernel]:
    """Decode: the new tokens' K, V go into the caches' last row before attention reads them."""
    d = op.dims
    if "k_cache" not in op.inputs:
        return []
    h = d["heads"] * d["head_dim"]
    k = ctx.E.kv_append_kernel(ctx.caps, d["batch"], d["kv_len"], h, d["kv_len"] - 1, ctx.dt)
    params = k.args(ctx.slot("qkv"), ctx.slot("k_cache"), ctx.slot("v_cache"))
    return [_mk(f"{op.name}.kv_append", op, k.program, k.launch, 0, 0, params, ctx, ("k_cache", "v_cache"))]


def _attention(op, ctx) -> list[Kernel]:
    return _kv_append(op, ctx) + _attention_math(op, ctx)


def _attention_math(op, ctx) -> list[Kernel]:
    d = op.dims
    b, n, hd, q, kv, h, kt, vt = _attn_geometry(op, ctx)
    if d["fused"]:
        lse = "attn_lse" in op.outputs     # train: the backward recomputes P from the log-sum-exp
        if ctx.E.split_attention_kernel is not None and d.get("kernel") != "wgmma":   # (FA3's has no split form)
            sk = ctx.E.split_attention_kernel(ctx.caps, b, n, q, kv, hd, ctx.dt, d["causal"], q_ld=3 * h,
                                              kv_ld=kt[2], o_ld=h, with_lse=lse, name=op.name)
            if sk is not None:
                return _attention_split(op, ctx, sk, kt, vt, lse)
        chosen = {"kernel": d["kernel"]} if d.get("kernel") else {}
        k = ctx.E.flash_attention_kernel(ctx.caps, b, n, q, kv, hd, ctx.dt, d["causal"], q_ld=3 * h, kv_ld=kt[2], o_ld=h,
                                         with_lse=lse, **chosen)
        sl = [ctx.slot("qkv"), ctx.slot(kt[0]), ctx.slot(vt[0]), ctx.slot(op.outputs[0])]
        extra = {"LSE": ctx.slot("attn_lse", dtype="fp32")} if lse else {}
        params = k.args(*sl, q_off=0, k_off=kt[1], v_off=vt[1], **extra)
        return [_mk(op.name, op, k.program, k.launch, op.flops, op.model_flops, params, ctx,
                    ("O", "LSE") if lse else ("O",))]
    # unfused: S = Q K^T -> P = softmax(S / sqrt(d)) [-> dropout] -> O = P V, S and P through memory
    sq = (b, n, q, kv)
    probs = op.outputs[1] if len(op.outputs) > 1 else f"{op.name}.probs"
    p_drop = d.get("dropout", 0.0)
    sm = ctx.E.ew.softmax_kernel(ctx.caps, b * n * q, kv, ctx.dt, 1.0 / math.sqrt(hd), d["causal"], q_len=q)
    f_drop = b * n * q * kv * EW.FLOPS_PER_ELEM["dropout"] if p_drop else 0
    cells = (op.flops - f_drop) // (4 * hd + EW.FLOPS_PER_ELEM["softmax"])   # unmasked (query, key) pairs
    f_qk, f_sm, f_av = 2 * hd * cells, op.flops - f_drop - 4 * hd * cells, 2 * hd * cells
    m_half = op.model_flops // 2
    qk = _batched(ctx, f"{op.name}.qk", op, f_qk, m_half, q, kv, hd, ("qkv", 0), kt[:2],
                  (f"{op.name}.scores", 0, sq), trans_b=True, lda=3 * h, ldb=kt[2], ldc=kv, batch=(b, n),
                  stride_a=(q * 3 * h, hd), stride_b=(kv * kt[2], hd), stride_c=(n * q * kv, q * kv))
    ssl = {"x": ctx.slot(f"{op.name}.scores", view=(b * n * q, kv), shape=sq),
           "y": ctx.slot(probs, view=(b * n * q, kv), shape=sq)}
    smk = _mk(f"{op.name}.softmax", op, sm.program, sm.launch, f_sm, 0, sm.args(**ssl), ctx, ("y",))
    drop = []
    if p_drop:                          # P V reads the dropped probabilities; the mask is kept
        from archsim.workloads.ops import DROPOUT_SEEDS
        probs, mask = op.outputs[2], op.outputs[3]
        dk = ctx.E.ew.dropout_kernel(ctx.caps, b * n * q * kv, p_drop, DROPOUT_SEEDS[op.name], ctx.dt)
        dsl = {"x": ctx.slot(ssl["y"].tensor, view=(b * n * q * kv,), shape=sq),
               "y": ctx.slot(probs, view=(b * n * q * kv,), shape=sq),
               "mask": ctx.slot(mask, view=(b * n * q * kv,), shape=sq, dtype="u8")}
        drop = [_mk(f"{op.name}.dropout", op, dk.program, dk.launch, f_drop, 0, dk.args(**dsl), ctx, ("y", "mask"))]
    av = _batched(ctx, f"{op.name}.av", op, f_av, op.model_flops - m_half, q, hd, kv, (probs, 0, sq), vt[:2],
                  (op.outputs[0], 0), lda=kv, ldb=vt[2], ldc=h, batch=(b, n), stride_a=(n * q * kv, q * kv),
                  stride_b=(kv * vt[2], hd), stride_c=(q * h, hd))
    return [qk, smk] + drop + [av]


def _attention_split(op, ctx, sk, kt, vt, lse) -> list[Kernel]:
    """Split-KV (decode with fewer query blocks than cores): ``attn.split`` runs the flash loop
    over one chunk of the cache per block into f32 workspaces (``attn.opart``, ``attn.lsepart``),
    ``attn.combine`` merges the chunks into attn_out. The split kernel carries the op's flops and
    model_flops; the combine adds its own elementwise flops (the math it executes)."""
    ws = {w: ctx.slot(f"{op.name}.{w.lower()}", shape=shape, dtype="fp32") for w, (shape, _) in sk.workspaces().items()}
    extra = {"LSE": ctx.slot("attn_lse", dtype="fp32")} if lse else {}
    args = sk.args(ctx.slot("qkv"), ctx.slot(kt[0]), ctx.slot(vt[0]), ctx.slot(op.outputs[0]), ws["Opart"],
                   ws["LSEpart"], q_off=0, k_off=kt[1], v_off=vt[1], **extra)
    split, comb = sk.parts
    return [_mk(split.name, op, split.program, split.launch, op.flops, op.model_flops, sk.part_args(split, args), ctx,
                split.outputs),
            _mk(comb.name, op, comb.program, comb.launch, comb.flops, 0, sk.part_args(comb, args), ctx, comb.outputs)]


def _attention_grad(op, ctx) -> list[Kernel]:
    d = op.dims
    b, n, hd, q, kv, h, kt, vt = _attn_geometry(op, ctx)
    if d["fused"]:
        return _attention_grad_fused(op, ctx)
    probs, dout = op.inputs[1], op.inputs[-1]
    p_drop = d.get("dropout", 0.0)
    dropped, mask = (op.inputs[2], op.inputs[3]) if p_drop else (probs, None)   # what P V read; the mask
    (dqkv,) = op.outputs
    sq = (b, n, q, kv)
    dp, ds = f"{op.name}.dprobs", f"{op.name}.dscores"
    sg = ctx.E.ew.softmax_grad_kernel(ctx.caps, b * n * q, kv, ctx.dt, 1.0 / math.sqrt(hd), d["causal"], q_len=q)
    f_drop = b * n * q * kv * EW.FLOPS_PER_ELEM["dropout_grad"] if p_drop else 0
    cells = (op.flops - f_drop) // (8 * hd + 4)    # unmasked pairs: 4 matmuls of 2d, 4 elementwise
    f_mm = 2 * hd * cells
    f_sg = op.flops - f_drop - 4 * f_mm
    m4 = _split(op.model_flops, [1, 1, 1, 1])
    P = dict(batch=(b, n))
    sP = (n * q * kv, q * kv)          # a (b, head) matrix of P, dP, dS
    sO = (q * h, hd)                   # a head of dO (rows of h)
    sQKV = (q * 3 * h, hd)             # a head of Q / dQ / dK / dV in the [T, 3h] layout
    ddrop = f"{op.name}.ddrop" if p_drop else dp    # dO V^T: the dropped probabilities' gradient
    ks = [
        _batched(ctx, f"{op.name}.dv", op, f_mm, m4[0], kv, hd, q, (dropped, 0, sq), (dout, 0), (dqkv, 2 * h),
                 trans_a=True, lda=kv, ldb=h, ldc=3 * h, stride_a=sP, stride_b=sO, stride_c=sQKV, **P),
        _batched(ctx, f"{op.name}.dp", op, f_mm, m4[1], q, kv, hd, (dout, 0), vt[:2], (ddrop, 0, sq), trans_b=True,
                 lda=h, ldb=vt[2], ldc=kv, stride_a=sO, stride_b=(kv * vt[2], hd), stride_c=sP, **P),
    ]
    if p_drop:
        gk = ctx.E.ew.dropout_grad_kernel(ctx.caps, b * n * q * kv, p_drop, ctx.dt)
        fl = (b * n * q * kv,)
        gsl0 = {"dy": ctx.slot(ddrop, view=fl, shape=sq), "mask": ctx.slot(mask, view=fl, shape=sq, dtype="u8"),
                "dx": ctx.slot(dp, view=fl, shape=sq)}
        ks.append(_mk(f"{op.name}.dropout", op, gk.program, gk.launch, f_drop, 0, gk.args(**gsl0), ctx, ("dx",)))
    gsl = {"p": ctx.slot(probs, view=(b * n * q, kv), shape=sq), "dp": ctx.slot(dp, view=(b * n * q, kv), shape=sq),
           "dx": ctx.slot(ds, view=(b * n * q, kv), shape=sq)}
    ks.append(_mk(f"{op.name}.softmax", op, sg.program, sg.launch, f_sg, 0, sg.args(**gsl), ctx, ("dx",)))
    ks.append(_batched(ctx, f"{op.name}.dq", op, f_mm, m4[2], q, hd, kv, (ds, 0, sq), kt[:2], (dqkv, 0), lda=kv,
                       ldb=kt[2], ldc=3 * h, stride_a=sP, stride_b=(kv * kt[2], hd), stride_c=sQKV, **P))
    ks.append(_batched(ctx, f"{op.name}.dk", op, f_mm, m4[3], kv, hd, q, (ds, 0, sq), ("qkv", 0), (dqkv, h),
                       trans_a=True, lda=kv, ldb=3 * h, ldc=3 * h, stride_a=sP, stride_b=sQKV, stride_c=sQKV, **P))
    return ks


def _attention_grad_fused(op, ctx) -> list[Kernel]:
    """FlashAttention-2's backward (attention_grad_gpu / _sunway): attn.grad.pre, .dkdv, .dq, reading Q, K,
    V from qkv and writing dQ, dK, dV into d_qkv in place; D and NL are its f32 workspaces."""
    d = op.dims
    b, n, hd, q, kv, h, kt, vt = _attn_geometry(op, ctx)
    g = ctx.E.flash_attention_grad_kernel(ctx.caps, b, n, q, kv, hd, ctx.dt, d["causal"], q_ld=3 * h, kv_ld=3 * h,
                                    o_ld=h, name=op.name)
    qkv, out, lse, dout = op.inputs
    (dqkv,) = op.outputs
    ws = {w: ctx.slot(f"{op.name}.{w}", shape=shape, dtype="fp32") for w, (shape, _) in g.workspaces().items()}
    args = g.qkv_args(ctx.slot(qkv), ctx.slot(out), ctx.slot(dout), ctx.slot(lse, dtype="fp32"), ctx.slot(dqkv),
                      ws["D"], ws["NL"])
    flops = _split(op.flops, [p.flops for p in g.parts])
    model = _split(op.model_flops, [p.model_flops for p in g.parts])
    return [_mk(p.name, op, p.program, p.launch, flops[i], model[i], g.part_args(p, args), ctx, p.outputs)
            for i, p in enumerate(g.parts)]


# ----------------------------------------------------------------------------- elementwise
def _ew(op, ctx, kobj, bind: dict) -> list[Kernel]:
    """An elementwise kernel or chain; ``bind``: buffer name -> tensor name (the kernels' extra
    buffers, such as a norm's saved statistics or a workspace, get their own tensors)."""
    kernels = kobj.kernels if isinstance(kobj, EW.KernelChain) else (kobj,)
    flops = _split(op.flops, [k.flops for k in kernels])
    out = []
    for i, k in enumerate(kernels):
        params = {}
        for buf in k.buffers:
            t = bind.get(buf.name, f"{op.name}.{buf.name}")
            params[buf.name] = ctx.slot(t, view=buf.shape, shape=buf.shape, dtype=buf.dtype)
        params.update(dict(k.scalars))
        name = op.name if len(kernels) == 1 else f"{op.name}.{_part(k.op, i)}"
        out.append(_mk(name, op, k.program, k.launch, flops[i], 0, params, ctx, tuple(b.name for b in k.outputs)))
    return out


def _part(kop: str, i: int) -> str:
    return {"layernorm_grad": "dx", "rmsnorm_grad": "dx", "colsum_ln": "dgamma", "colsum_rms": "dgamma",
            "colsum_chunks": "dgamma_sum", "moe_topk": "topk", "moe_assign": "assign", "moe_combine_dw": "dw",
            "moe_combine_dslot": "dslot"}.get(kop, f"k{i}")


def _norm(op, ctx) -> list[Kernel]:
    d = op.dims
    rows, cols = d["rows"], d["cols"]
    if op.kind == "layernorm":
        k = ctx.E.ew.layernorm_kernel(ctx.caps, rows, cols, ctx.dt, ctx.eps)
        bind = dict(zip(("x", "gamma", "beta"), op.inputs), y=op.outputs[0])
    else:
        k = ctx.E.ew.rmsnorm_kernel(ctx.caps, rows, cols, ctx.dt, ctx.eps)
        bind = dict(zip(("x", "gamma"), op.inputs), y=op.outputs[0])
    return _ew(op, ctx, k, bind)


def _norm_grad(op, ctx) -> list[Kernel]:
    d = op.dims
    fwd = op.name[:-len(".grad")]          # the forward op whose statistics it reads
    ln = op.kind == "layernorm_grad"
    k = (ctx.E.ew.layernorm_grad_kernel if ln else ctx.E.ew.rmsnorm_grad_kernel)(ctx.caps, d["rows"], d["cols"], ctx.dt, ctx.eps)
    bind = dict(zip(("x", "gamma", "dy"), op.inputs), dx=op.outputs[0], dgamma=op.outputs[1],
                mean=f"{fwd}.mean", rstd=f"{fwd}.rstd")
    if ln:
        bind["dbeta"] = op.outputs[2]
    return _ew(op, ctx, k, bind)


def _flat(op, ctx) -> list[Kernel]:
    d = op.dims
    n = d["rows"] * d["cols"]
    fn = {"gelu": ctx.E.ew.gelu_kernel, "relu": ctx.E.ew.relu_kernel, "add": ctx.E.ew.add_kernel, "gelu_grad": ctx.E.ew.gelu_grad_kernel,
          "relu_grad": ctx.E.ew.relu_grad_kernel}[op.kind]
    k = fn(ctx.caps, n, ctx.dt)
    names = [b.name for b in k.buffers]
    return _ew(op, ctx, k, dict(zip(names, list(op.inputs) + list(op.outputs))))


def _dropout(op, ctx) -> list[Kernel]:
    """A dropout-add (forward residual, its mask out) or a dropout's gradient (the mask in)."""
    d = op.dims
    n = d["rows"] * d["cols"]
    if op.kind == "dropout_add":
        k = ctx.E.ew.dropout_add_kernel(ctx.caps, n, d["p"], d["seed"], ctx.dt)
    else:
        k = ctx.E.ew.dropout_grad_kernel(ctx.caps, n, d["p"], ctx.dt)
    names = [b.name for b in k.buffers]
    return _ew(op, ctx, k, dict(zip(names, list(op.inputs) + list(op.outputs))))


def _swiglu(op, ctx) -> list[Kernel]:
    d = op.dims
    fn = ctx.E.ew.swiglu_grad_kernel if op.kind == "swiglu_grad" else ctx.E.ew.swiglu_kernel
    k = fn(ctx.caps, d["rows"], d["cols"], ctx.dt)
    names = [b.name for b in k.buffers]
    return _ew(op, ctx, k, dict(zip(names, list(op.inputs) + list(op.outputs))))


# ----------------------------------------------------------------------------- mixture of experts
def _moe_route(op, ctx) -> list[Kernel]:
    """``route.topk`` (softmax and top-k a token) then ``route.assign`` (each expert's slots)."""
    d = op.dims
    k1 = ctx.E.ew.moe_topk_kernel(ctx.caps, d["tokens"], d["experts"], d["top_k"], ctx.dt)
    k2 = ctx.E.ew.moe_assign_kernel(ctx.caps, d["tokens"], d["experts"], d["top_k"], d["capacity"])
    chain = EW.KernelChain(op=op.kind, kernels=(k1, k2), dtype=ctx.dt)
    return _ew(op, ctx, chain, dict(zip(("logits", "route_e", "route_w", "route_slot", "slot_token"),
                                        list(op.inputs) + list(op.outputs))))


def _moe_dispatch(op, ctx) -> list[Kernel]:
    d = op.dims
    k = ctx.E.ew.moe_dispatch_kernel(ctx.caps, d["tokens"], d["hidden"], d["slots"], ctx.dt)
    return _ew(op, ctx, k, dict(zip(("x", "slot_token", "y"), list(op.inputs) + list(op.outputs))))


def _moe_combine(op, ctx) -> list[Kernel]:
    d = op.dims
    k = ctx.E.ew.moe_combine_kernel(ctx.caps, d["tokens"], d["hidden"], d["top_k"], d["slots"], ctx.dt)
    return _ew(op, ctx, k, dict(zip(("expert_out", "route_slot", "route_w", "y"), list(op.inputs) + list(op.outputs))))


def _moe_gemm(op, ctx) -> list[Kernel]:
    """Every expert's GEMM, batched over the experts: C[e] = op(A[e]) @ op(B[e]), each operand the
    experts' matrices one after another (forward [E, C, K] @ [E, K, N]; dgrad with B^T, wgrad with A^T)."""
    d = op.dims
    E, M, N, K = d["experts"], d["M"], d["N"], d["K"]
    ta, tb = bool(d.get("trans_a")), bool(d.get("trans_b"))
    (a, b), (c,) = op.inputs, op.outputs
    return [_batched(ctx, op.name, op, op.flops, op.model_flops, M, N, K, (a, 0), (b, 0), (c, 0), trans_a=ta,
                     trans_b=tb, lda=M if ta else K, ldb=K if tb else N, ldc=N, batch=(E, 1), stride_a=(M * K, 0),
                     stride_b=(K * N, 0), stride_c=(M * N, 0))]


def _moe_combine_grad(op, ctx) -> list[Kernel]:
    """``combine.grad.dw`` (the weights' gradient, a team a token) and ``combine.grad.dslot`` (the
    slots' gradient rows, a block a slot)."""
    d = op.dims
    k = ctx.E.ew.moe_combine_grad_kernel(ctx.caps, d["tokens"], d["hidden"], d["top_k"], d["slots"],
                                                    ctx.dt)
    return _ew(op, ctx, k, dict(zip(("d_y", "expert_out", "route_slot", "route_w", "slot_token", "d_route_w",
                                     "d_expert_out"), list(op.inputs) + list(op.outputs))))


def _moe_dispatch_grad(op, ctx) -> list[Kernel]:
    """The dispatch's backward: each token's slots' gradient rows summed (combine, unweighted)."""
    d = op.dims
    k = ctx.E.ew.moe_combine_kernel(ctx.caps, d["tokens"], d["hidden"], d["top_k"], d["slots"], ctx.dt,
                                               weighted=False)
    return _ew(op, ctx, k, dict(zip(("expert_out", "route_slot", "y"), list(op.inputs) + list(op.outputs))))


def _moe_route_grad(op, ctx) -> list[Kernel]:
    d = op.dims
    k = ctx.E.ew.moe_route_grad_kernel(ctx.caps, d["tokens"], d["experts"], d["top_k"], ctx.dt)
    return _ew(op, ctx, k, dict(zip(("logits", "route_e", "d_route_w", "d_logits"),
                                    list(op.inputs) + list(op.outputs))))


EMITTERS = {"gemm": _gemm, "attention": _attention, "attention_grad": _attention_grad, "layernorm": _norm,
            "rmsnorm": _norm, "layernorm_grad": _norm_grad, "rmsnorm_grad": _norm_grad, "gelu": _flat,
            "relu": _flat, "add": _flat, "gelu_grad": _flat, "relu_grad": _flat, "swiglu": _swiglu,
            "swiglu_grad": _swiglu, "moe_route": _moe_route, "moe_dispatch": _moe_dispatch, "moe_gemm": _moe_gemm,
            "moe_combine": _moe_combine, "moe_combine_grad": _moe_combine_grad,
            "moe_dispatch_grad": _moe_dispatch_grad, "moe_route_grad": _moe_route_grad, "dropout_add": _dropout,
            "dropout_grad": _dropout}


def emit_block(caps, wl) -> list[Kernel]:
    """The kernels of one decoder block of workload ``wl`` for the target ``caps``, in op order."""
    ctx = _Ctx(caps, wl.tensor_shapes(), wl.scenario.dtype, wl.model.norm_eps)
    out = []
    for op in wl.block_ops():
        fn = EMITTERS.get(op.kind)
        if fn is None:
            raise InputError(f"op {op.name}", f"no emitter for op kind {op.kind!r}",
                             "one of: " + ", ".join(sorted(EMITTERS)))
        try:
            out.extend(fn(op, ctx))
        except InputError as e:   # name the workload and op whose shape the kernel refuses
            raise InputError(f"workload {wl.name}, op {op.name} ({op.kind}): {e.where}", e.what, e.allowed) from None
        except OutOfRegisters as e:   # an emitter with no variant left that fits the registers
            raise InputError(f"workload {wl.name}, op {op.name} ({op.kind}) on {caps.name}",
                             f"its kernel does not fit a core's registers ({e})", "a smaller shape") from None
    return out


def attention_kernels(caps, batch: int, heads: int, seq: int, head_dim: int, dtype: str = "fp16",
                      causal: bool = False, fused: bool = True, kernel: str | None = None) -> list[Kernel]:
    """Forward self-attention over a fused qkv tensor [batch*seq, 3*heads*head_dim] into
    attn_out, as a block's attention op is emitted: one flash kernel, or QK^T, softmax, AV with
    the seq x seq matrix through memory (``micro attention``). ``kernel``: the GPU flash kernel
    (gpu_flash_attention_kernel's; None: the rule)."""
    from archsim.workloads.ops import ELEMENTWISE_FLOPS, Op, unmasked_scores

    h = heads * head_dim
    T = batch * seq
    cells = batch * heads * unmasked_scores(seq, seq, causal)
    if kernel is not None and (caps.family != "gpu" or not fused):
        raise InputError("attention", f"kernel {kernel!r} for a {'fused' if fused else 'unfused'} attention on "
                         f"{caps.name} ({caps.family})", "no kernel, or a fused attention on a GPU")
    chosen = {} if kernel is None else {"kernel": kernel}
    op = Op(name="attn", kind="attention", dims=dict(batch=batch, heads=heads, q_len=seq, kv_len=seq,
                                                     head_dim=head_dim, causal=causal, fused=fused, **chosen),
            dtype=dtype, inputs=("qkv",), outputs=("attn_out",),
            flops=cells * (4 * head_dim + ELEMENTWISE_FLOPS["softmax"]), model_flops=4 * batch * seq * seq * h)
    return _attention(op, _Ctx(caps, {"qkv": (T, 3 * h), "attn_out": (T, h)}, dtype))


def host_to_float(x: np.ndarray, dtype: str) -> np.ndarray:
    return to_float(x, dtype)


__all__ = ["Kernel", "Slot", "TensorSpec", "emit_block", "host_to_float", "to_host"]
