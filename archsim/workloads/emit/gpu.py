"""Op graph -> GPU kernels: each op of a decoder block becomes one or more emitted kernels.

A ``Kernel`` here is an emitted program bound to the block's tensors: its buffer parameters name
tensors (``Slot``), its scalar parameters are numbers. The run layer (archsim.run) gives the
slots real numpy arrays in functional mode or address space in timing mode; the emitter never
sees the engine (DESIGN.md's dependency rule).

Kernel naming: a kernel is named after its op (``qkv``, ``ffn1.wgrad``); an op emitted as several
kernels names them ``<op>.<part>`` (unfused attention: ``attn.qk``, ``attn.softmax``, ``attn.av``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
import numpy as np

from archsim.errors import InputError
from archsim.isa.program import ARRAYS, Launch, Program

from .attention_gpu import flash_attention_kernel
from .gemm_gpu import gemm_kernel, to_float, to_host

# storage dtype of a block's tensors -> the GEMM emitter's output dtype
_OUT = {"fp16": "f16", "bf16": "bf16", "fp32": "f32"}


@dataclass(frozen=True)
class Slot:
    """A buffer parameter bound to a tensor of the block."""

    tensor: str
    nbytes: int


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple
    dtype: str            # fp16 | bf16 | fp32 | f32 (host format as in gemm_gpu.to_host)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * (4 if self.dtype in ("fp32", "f32") else 2)


@dataclass(frozen=True)
class Kernel:
    name: str
    op: str
    program: Program
    launch: Launch
    flops: int                       # math executed (CONTRACT: 2mnk per GEMM ...)
    model_flops: int                 # the seed's textbook count for this kernel's share of the op
    params: dict                     # parameter -> Slot | int
    tensors: tuple                   # TensorSpec of every tensor it reads or writes
    outputs: tuple                   # parameters it writes

    def key(self) -> str:
        """Identity for memoization: the same program, launch and arguments (sizes and scalars)
        time the same on the same machine."""
        h = hashlib.sha1()
        for a in ARRAYS:
            h.update(np.ascontiguousarray(getattr(self.program, a)).tobytes())
        h.update(repr((self.program.nregs, self.program.shared_bytes, self.launch.grid, self.launch.block,
                       sorted((k, v.nbytes if isinstance(v, Slot) else int(v)) for k, v in self.params.items())))
                 .encode())
        return h.hexdigest()


def _bind(kobj, names: dict) -> dict:
    """The emitted kernel's arguments with buffers as Slots. ``names``: buffer parameter ->
    tensor name; kobj.buffer_bytes() gives the sizes."""
    nb = kobj.buffer_bytes()
    return {p: Slot(names[p], int(nb[p])) for p in nb}


def _gemm(op, caps) -> list[Kernel]:
    d = op.dims
    dt = op.dtype
    k = gemm_kernel(caps, d["M"], d["N"], d["K"], dt, _OUT[dt], bool(d.get("trans_b", False)),
                    **({"trans_a": True} if d.get("trans_a") else {}))
    a, b = op.inputs[:2]
    (c,) = op.outputs
    slots = _bind(k, {"A": a, "B": b, "C": c})
    params = k.args(slots["A"], slots["B"], slots["C"])
    tensors = (TensorSpec(a, k.a_shape, dt), TensorSpec(b, k.b_shape, dt), TensorSpec(c, k.c_shape, k.out_dtype))
    return [Kernel(op.name, op.name, k.program, k.launch, k.flops, int(op.model_flops), params, tensors, ("C",))]


def _slots(shapes: dict, dt: dict, names: dict) -> dict:
    """Slots for buffer parameters bound to whole tensors (param -> tensor name)."""
    return {p: Slot(n, TensorSpec(n, shapes[n], dt[n]).nbytes) for p, n in names.items()}


def _attention(op, caps) -> list[Kernel]:
    """Forward attention. Q (and K, V outside decode) are read in place from the fused qkv
    tensor [T, 3h]; decode reads K, V from the cache [b, kv_len, h]; O is attn_out [T, h]."""
    d = op.dims
    dt = op.dtype
    b, n, hd = d["batch"], d["heads"], d["head_dim"]
    h = n * hd
    T = b * d["q_len"]
    cache = "k_cache" in op.inputs
    if not d["fused"]:
        raise InputError(f"op {op.name}", "unfused attention is not emitted for the GPU yet", "attention: fused")
    if len(op.outputs) > 1:
        raise InputError(f"op {op.name}", f"the fused attention kernel does not write {', '.join(op.outputs[1:])} "
                         "(the training phase's saved statistics)", "phase prefill or decode")
    k = flash_attention_kernel(caps, b, n, d["q_len"], d["kv_len"], hd, dt, d["causal"], q_ld=3 * h,
                               kv_ld=h if cache else 3 * h, o_ld=h)
    shapes = {"qkv": (T, 3 * h), "attn_out": (T, h), "k_cache": (b, d["kv_len"], h), "v_cache": (b, d["kv_len"], h)}
    names = {"Q": "qkv", "K": "k_cache" if cache else "qkv", "V": "v_cache" if cache else "qkv",
             "O": op.outputs[0]}
    sl = _slots(shapes, {t: dt for t in shapes}, names)
    params = k.args(sl["Q"], sl["K"], sl["V"], sl["O"], q_off=0, k_off=0 if cache else h,
                    v_off=0 if cache else 2 * h)
    tensors = tuple(TensorSpec(t, shapes[t], dt) for t in dict.fromkeys(names.values()))
    return [Kernel(op.name, op.name, k.program, k.launch, int(op.flops), int(op.model_flops), params, tensors,
                   ("O",))]


EMITTERS = {"gemm": _gemm, "attention": _attention}


def emit_op(op, caps) -> list[Kernel]:
    if caps.family != "gpu":
        raise InputError(f"op {op.name}", f"the GPU emitters target the gpu family, not {caps.family}",
                         "a gpu-family machine")
    fn = EMITTERS.get(op.kind)
    if fn is None:
        raise InputError(f"op {op.name}", f"no GPU emitter for op kind {op.kind!r}",
                         "one of: " + ", ".join(sorted(EMITTERS)))
    return fn(op, caps)


def host_random(spec: TensorSpec, rng: np.random.Generator, scale: float = 1.0) -> np.ndarray:
    """A random tensor in its host format (bf16 as bits)."""
    return to_host((rng.standard_normal(spec.shape) * scale).astype(np.float32), spec.dtype)


def host_to_float(x: np.ndarray, dtype: str) -> np.ndarray:
    return to_float(x, dtype)
