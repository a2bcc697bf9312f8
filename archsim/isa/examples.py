"""The example kernels of ``isa/examples/*.s``: their numpy references, tolerances and argument
builders.

Every example is a real kernel (loops with branches; its size does not grow with the problem),
runs with no flags from its own ``.launch`` / ``.arg`` lines (``archsim asm FILE.s --hw HW``), and
is checked against numpy here:

    prog = load_example("softmax")
    args, launch = make_args("softmax", seed=1, rows=7, cols=45)
    result = run_functional(prog, args, launch)
    verify("softmax", args, result)   # {"out": {"max_abs_err", "max_rel_err", "passed"}}

A comparison passes when ``|got - ref| <= atol + rtol*|ref|`` for every element (numpy's
``allclose``; NaN never passes). References are computed in float64 from the exact input values.
``max_rel_err`` divides by ``max(|ref|, atol)`` so that elements near zero do not dominate it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from archsim.isa.program import Launch, Program
from archsim.paths import data_dir

F32 = np.float32
F64 = np.float64


@dataclass(frozen=True)
class Example:
    name: str
    file: str                                       # file name in isa/examples/
    ref: Callable[[dict], dict]                     # args -> {output name: float64 array}
    tol: dict                                       # output name -> (atol, rtol)
    varies: dict                                    # parameter -> what values it may take
    build: Callable[..., tuple]                     # (rng, **sizes) -> (args, Launch)
    sizes: dict = field(default_factory=dict)       # default sizes for build
    doc: str = ""

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self.tol)


# ----------------------------------------------------------------------------- references
def _ref_vector_add(a: dict) -> dict:
    return {"out": (a["x"].astype(F32) + a["y"].astype(F32)).astype(F64)}


def _ref_reduce_sum(a: dict) -> dict:
    n, nblocks = int(a["n"]), a["out"].shape[0]   # one output per block: out has nctaid.x elements
    chunk = -(-n // nblocks)
    x = a["x"][:n].astype(F64)
    return {"out": np.array([x[b * chunk:(b + 1) * chunk].sum() for b in range(nblocks)])}


def _ref_softmax(a: dict) -> dict:
    x = a["x"].astype(F64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return {"out": e / e.sum(axis=1, keepdims=True)}


def _ref_layernorm(a: dict) -> dict:
    x = a["x"].astype(F64)
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    y = (x - mean) / np.sqrt(var + 1e-5) * a["gamma"].astype(F64) + a["beta"].astype(F64)
    return {"out": y}


def _ref_gemm(a: dict) -> dict:
    return {"C": a["A"].astype(F64) @ a["B"].astype(F64)}


# ----------------------------------------------------------------------------- argument builders
def _randn(rng, shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


def _build_vector_add(rng, n=1000, grid=4, block=128):
    args = {"x": _randn(rng, n), "y": _randn(rng, n), "out": np.zeros(n, F32), "n": n}
    return args, Launch((grid, 1, 1), (block, 1, 1))


def _build_reduce_sum(rng, n=5000, grid=4, block=256):
    args = {"x": _randn(rng, max(n, 1)), "out": np.zeros(grid, F32), "n": n}
    return args, Launch((grid, 1, 1), (block, 1, 1))


def _build_softmax(rng, rows=10, cols=100, block=128):
    per_block = block // 32                          # one warp per row
    args = {"x": _randn(rng, (rows, cols)) * F32(3), "out": np.zeros((rows, cols), F32),
            "rows": rows, "cols": cols}
    return args, Launch((-(-rows // per_block), 1, 1), (block, 1, 1))


def _build_layernorm(rng, rows=8, cols=200, block=128):
    args = {"x": _randn(rng, (rows, cols)) * F32(2) + F32(0.5), "gamma": _randn(rng, cols),
            "beta": _randn(rng, cols), "out": np.zeros((rows, cols), F32), "rows": rows, "cols": cols}
    return args, Launch((rows, 1, 1), (block, 1, 1))


def _build_gemm_mma(rng, M=128, N=128, K=64):
    if M % 64 or N % 64 or K % 32 or min(M, N, K) <= 0:
        raise ValueError(f"gemm_mma needs M, N multiples of 64 and K a multiple of 32, got {M}x{N}x{K}")
    args = {"A": _randn(rng, (M, K), np.float16), "B": _randn(rng, (K, N), np.float16),
            "C": np.zeros((M, N), F32), "M": M, "N": N, "K": K}
    return args, Launch((N // 64, M // 64, 1), (128, 1, 1))


def _build_gemm_ffma(rng, M=128, N=128, K=64):
    if M % 64 or N % 64 or K % 16 or min(M, N, K) <= 0:
        raise ValueError(f"gemm_ffma needs M, N multiples of 64 and K a multiple of 16, got {M}x{N}x{K}")
    args = {"A": _randn(rng, (M, K)), "B": _randn(rng, (K, N)), "C": np.zeros((M, N), F32),
            "M": M, "N": N, "K": K}
    return args, Launch((N // 64, M // 64, 1), (256, 1, 1))


EXAMPLES: dict[str, Example] = {e.name: e for e in (
    Example(
        "vector_add", "vector_add.s", _ref_vector_add,
        # one IEEE f32 add per element, the same one numpy does: bit-exact
        tol={"out": (0.0, 0.0)},
        varies={"n": "any n >= 0 (x, y, out of n elements), any grid and block"},
        build=_build_vector_add, sizes={"n": 1000},
        doc="out = x + y (f32), grid-stride loop"),
    Example(
        "reduce_sum", "reduce_sum.s", _ref_reduce_sum,
        # f32 accumulation in an order unlike numpy's (strided per thread, then a butterfly
        # tree): error grows like eps32*sqrt(chunk)*|x|; inputs are standard normal, chunks of
        # up to ~1e4 elements give errors ~1e-5
        tol={"out": (1e-3, 1e-5)},
        varies={"n": "any n >= 0", "grid": "any; out must have grid elements",
                "block": "1..1024 threads"},
        build=_build_reduce_sum, sizes={"n": 5000},
        doc="per-block partial sums: thread loop, warp butterfly, scratchpad across warps"),
    Example(
        "softmax", "softmax.s", _ref_softmax,
        # ex2.f32 is rounded once from fp64, but its argument (x - m)*log2e is an f32 product
        # (rel. error 2^-24 on values up to ~40) -> ~1e-6 relative per exponential; the row
        # sum adds eps32*log2(cols); rcp and the final multiply add 1 ulp each
        tol={"out": (1e-7, 1e-5)},
        varies={"rows": "any >= 1; grid = ceil(rows / (block/32))",
                "cols": "any >= 1 (not necessarily a multiple of 32)",
                "block": "a multiple of 32"},
        build=_build_softmax, sizes={"rows": 10, "cols": 100},
        doc="row softmax, one warp per row, ex2-based, numerically stable"),
    Example(
        "layernorm", "layernorm.s", _ref_layernorm,
        # two-pass mean/variance in f32 (error ~eps32*sqrt(cols)), 1/cols and rsqrt rounded
        # once from fp64; outputs are O(1..5)
        tol={"out": (1e-5, 1e-5)},
        varies={"rows": "any >= 1; grid = rows", "cols": "any >= 1",
                "block": "a multiple of 32, at most 1024"},
        build=_build_layernorm, sizes={"rows": 8, "cols": 200},
        doc="row layernorm with gamma/beta, eps 1e-5, block-wide shuffle + scratchpad reductions"),
    Example(
        "gemm_mma", "gemm_mma.s", _ref_gemm,
        # fp16 inputs are exact in the reference; products are exact in fp32 and the sums are
        # fp32 in k order: error grows like eps32*sqrt(K)*|C| (measured: 1e-5 at K = 64,
        # 7.5e-5 at K = 512, with N(0,1) inputs, |C| ~ sqrt(K)); a layout bug gives O(1)
        tol={"C": (1e-4, 1e-5)},
        varies={"M": "a multiple of 64", "N": "a multiple of 64", "K": "a multiple of 32"},
        build=_build_gemm_mma, sizes={"M": 128, "N": 128, "K": 64},
        doc="C = A @ B, f16 in / f32 out, 64x64x32 block tile, 4 warps of 32x32, cp.async double "
            "buffering, ldmatrix, mma.m16n8k16"),
    Example(
        "gemm_ffma", "gemm_ffma.s", _ref_gemm,
        # f32 inputs; each fma.f32 rounds once, K of them in k order: as gemm_mma (measured
        # 6e-5 at K = 512)
        tol={"C": (1e-4, 1e-5)},
        varies={"M": "a multiple of 64", "N": "a multiple of 64", "K": "a multiple of 16"},
        build=_build_gemm_ffma, sizes={"M": 128, "N": 128, "K": 64},
        doc="C = A @ B, f32, 64x64x16 block tile, 16x16 threads of 4x4, scratchpad, fma.f32"),
)}


# ----------------------------------------------------------------------------- API
def _get(name: str) -> Example:
    try:
        return EXAMPLES[name]
    except KeyError:
        raise KeyError(f"no example {name!r}; examples: {', '.join(EXAMPLES)}") from None


def example_path(name: str) -> Path:
    return data_dir("isa") / "examples" / _get(name).file


def load_example(name: str) -> Program:
    from archsim.isa.asm import assemble_file

    return assemble_file(example_path(name))


def make_args(name: str, seed: int = 0, **sizes) -> tuple[dict, Launch]:
    """Random arguments for the example at the given sizes (the rest default), and its launch."""
    ex = _get(name)
    rng = np.random.default_rng(seed)
    return ex.build(rng, **{**ex.sizes, **sizes})


def _outputs_of(result, names) -> dict:
    if isinstance(result, dict):
        return {n: result[n] for n in names}
    return {n: result.output(n) for n in names}


def verify(name: str, args: dict, result) -> dict:
    """Compare an example's outputs (a FunctionalResult, or a dict name -> array) with numpy.

    Returns {output: {"max_abs_err", "max_rel_err", "passed"}}."""
    ex = _get(name)
    ref = ex.ref(args)
    got = _outputs_of(result, ex.outputs)
    report = {}
    for out, (atol, rtol) in ex.tol.items():
        r = np.asarray(ref[out], F64)
        g = np.asarray(got[out]).astype(F64).reshape(r.shape)
        err = np.abs(g - r)
        finite = np.isfinite(err)
        ok = bool(np.all(finite & (err <= atol + rtol * np.abs(r))))
        if err.size == 0:
            mabs = mrel = 0.0
        elif not finite.all():
            mabs = mrel = float("inf")
        else:
            mabs = float(err.max())
            mrel = float((err / np.maximum(np.abs(r), max(atol, 1e-30))).max())
        report[out] = {"max_abs_err": mabs, "max_rel_err": mrel, "passed": ok}
    return report
