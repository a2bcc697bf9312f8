"""GEMM kernels for the GPU family: C[M,N] = alpha * A[M,K] @ B[K,N], with A given as [K,M]
(``trans_a``) and / or B as [N,K] (``trans_b``), strided rows and a 2-level batch.

    caps = capabilities(load_machine("a100"))
    k = gemm_kernel(caps, 1024, 1024, 1024, dtype="fp16", out_dtype="f32")
    result = run_functional(k.program, k.args(A, B, C), k.launch, warp_width=caps.warp_width)
    timing = time_kernel(k.program, machine, k.launch, k.args(Unbacked(..), Unbacked(..), Unbacked(..)))

Every kernel is a loop over K (the program's size does not depend on the problem size: only the
launch grid and the loop bound grow) and takes its shape from the ``M``, ``N``, ``K`` parameters,
so one Program serves every shape of the same alignment class; it is built for the shape given
only to pick the tile. Matrices are row-major; bf16 buffers are uint16 bit patterns (as
everywhere in archsim); tf32 and fp32 inputs are float32 arrays.

Layout (kernel parameters too, see ``PARAMS``): rows of A, B and C are ``lda``, ``ldb``, ``ldc``
elements apart (sub-matrices of a wider tensor: Q, K or V columns of a fused [T, 3h] QKV buffer,
a head's column slice of [T, h]). ``batch = (nb, nh)`` runs nb*nh GEMMs as grid.z; block z finds
its matrices at (z // nh)*stride[0] + (z % nh)*stride[1] elements into each buffer (the division
is a multiply by a host-computed magic number and a shift, CUTLASS's FastDivmod). Copy widths come
from the gcd of row length, ld and used strides, so a strided layout keeps cp.async.16 wherever
its rows stay 16-byte aligned. C's layout must write no element twice (checked on the host).

Tensor-core kernel (dtype fp16 / bf16 with mma.m16n8k16, tf32 with mma.m16n8k8), written the way
an Ampere CUTLASS-style kernel is:

- Block tile BM x BN of C, 4 warps in a 2 x 2 grid, each owning a (BM/2) x (BN/2) warp tile of
  (BM/32) x (BN/16) mma tiles (64 x 64 for the 128 x 128 block: 128 f32 accumulators a thread).
  K is stepped in k tiles of 128 bytes a row (BK = 64 halves / 32 tf32, four mma k-steps) when K
  has at least two of them and the stages fit, else 64 bytes (BK = 32 / 16, two k-steps). 128-byte
  rows halve the barriers per flop and make every cp.async of A touch whole 128-byte lines (64-byte
  rows cost a line request, a data-pipe wavefront and a fabric packet per 64 bytes).
- An S-stage cp.async pipeline (S = 4 / 3 / 2, the most that fits): the prologue copies tiles
  0 .. S-2; iteration kt copies tile kt+S-1 into the stage that iteration kt-1 computed on. One
  bar.sync per k tile, placed CUTLASS-style before the last k-step: after it, the first fragments
  of the next tile are loaded while the last k-step's mma run. Fragments are double buffered in
  registers: k-step s runs its 32 mma with the ldmatrix of k-step s+1 (and a share of the tile's
  cp.async) spread evenly between them, so an in-order warp never parks a run of memory
  instructions (which wait for the SM's MIO queue) in front of its tensor work.
- Shared memory rows are stored in 16-byte chunks, XOR-swizzled so that the 8 row addresses of
  every ldmatrix phase fall on 8 different 16-byte bank groups (conflict free):
  64-byte rows (A and B^T with BK = 32, a 32-wide B): chunk c of row r at c ^ ((r/2) % 4);
  rows of 128 bytes or more (A and B^T with BK = 64, B k-major): chunk c at c ^ (r % 8).
  tf32 B (k-major) is read with scalar ld.shared.b32 (ldmatrix.trans moves 16-bit elements only);
  its rows are padded by 32 bytes instead, which makes those reads conflict free.
- A fragments with ldmatrix.x4; B with ldmatrix.x4.trans (B k-major, fp16/bf16) or ldmatrix.x4
  (B^T, n-major).
- Any M, N, K >= 1. Rows of A (columns of B) past M (N) are clamped to the last one: they only feed
  C rows (columns) that are never stored. The K remainder is the *first* k tile, placed so that
  it ends where the second one starts (CUTLASS's residue-first order): its k < 0 part is not
  copied but zero-filled with st.shared (cp.async has no zero-fill), so the main loop carries no
  bounds predicates. The copy width is the widest of 16 / 8 / 4 bytes that divides a row's byte
  length (cp.async.16 for K, N multiples of 8 halves); rows of an odd number of halves fall back to
  per-element ld.global.u16 + st.shared.b16 (correct, slow: no asynchronous overlap).
- Block raster (``_tile_origin``): the block's C tile comes from its linear index in grouped
  order, groups of ``group`` tile rows along the dimension with fewer tiles sweeping the other
  (CUTLASS's threadblock swizzle, Triton's grouped ordering), so the blocks of a wave share their
  A and B panels in L2 (x-major order over a wide grid fetches each B panel once per M tile).
  Every block walks k from its first tile, so the blocks sharing a panel read it together (a
  per-block k rotation against partition camping would defeat that sharing; the L2 slice hash
  keeps the channels even).
- Epilogue: f32 out with st.global.v2.b32 (8 bytes: two adjacent columns), f16 / bf16 out
  converted with cvt.{f16x2,bf16x2}.f32 and stored 4 bytes at a time, for blocks fully inside C
  with ldc and C's strides even (checked at run time); otherwise each element is stored under its
  own bounds predicate.
- trans_a (A^T given, as in the weight gradient dW = X^T dY): the A tile is staged k-major like B
  (rows of BK k, BM columns of m, the same swizzle) and read with ldmatrix.x4.trans: lane L points
  at k-row (L%8) + 8(L/16), m-chunk (L/8)%2, so the four transposed 8x8 matrices are the A
  fragment's registers 0-3. tf32 A^T is read with scalar ld.shared.b32 from padded rows.
- alpha != 1: one mul.f32 per accumulator before the stores (emitted only then).

Warpgroup-MMA kernel (targets with wgmma, h100; fp16 / bf16 with A row-major; ``_emit_wgmma``):
BM / 64 warpgroups (BM 64 or 128, BN 64 to 256), each warp's 16 x BN slice of the tile in BN / 2
f32 accumulators, four wgmma.m64nBNk16 a k tile of 64 read from the stages through descriptors
(128-byte swizzle, the copies' own layout; B k-major in 64-column panels, MN-major). cp.async
fills the stages S - 2 k tiles ahead; after a tile's wgmma are committed, wait_group 1 leaves them
running while the stage that every warp finished before the barrier takes the next copies. The
K residue, the clamped edge rows, the copy widths and the epilogue are the mma kernel's.

TMA kernel (``kernel="tma"``: targets with wgmma and tma; ``_emit_wgmma_tma``): the wgmma kernel's
tiles and consumer warpgroups, warp specialized as CUTLASS 3's TMA kernels are: one producer warp
more a block fills the S stages with cp.async.bulk.tensor (A as one BM x 64 box, B as 64-column
panels or, B^T, one BN x 64 box, from tensor maps the kernel object builds: ``GemmKernel.args``),
each stage completing on its "full" mbarrier; consumers wait on it, run the tile's wgmma and
release the stage on its "empty" mbarrier once wait_group 1 says the previous tile's wgmma are
done. The TMA unit zero-fills what lies outside the matrices (the K residue, edge rows), so the
copies carry no bounds logic. Its boxes need rows and batch strides in multiples of 16 bytes and
matrices at least a box large (``tma_fits``); it is chosen only when asked for. Where C's rows and
batch strides are multiples of 16 bytes too (``c_store_fits``) and the stages hold the tile, C
leaves as CUTLASS 3's TMA epilogue stores it: the consumers write the converted tile into the
stages as swizzled boxes of 128-byte rows and one warp stores them by bulk tensor stores
(``_tma_c_epilogue``); otherwise by the wgmma kernel's epilogue.
``kernel="tma_multicast"`` (machines with tma and clusters) runs it on clusters of two blocks, as
CUTLASS's 2 x 1 clusters do: the pair takes two M tiles of one tile column (a 1-d grid of pairs in
the grouped raster) and shares B, each producer copying one half of each B box into both blocks
by multicast; a consumer warp frees a stage in both blocks (a remote mbarrier arrival for the peer's),
and a producer ends by waiting until both blocks freed every stage, so neither block exits while
the other may still reach its barriers.

Ping-pong kernel (``kernel="tma_pingpong"``: machines with wgmma and tma; ``_emit_wgmma_pingpong``),
CUTLASS 3's persistent KernelTmaWarpSpecializedPingpong: a grid of one block an SM slot, each
block walking the C tiles ctaid.x, ctaid.x + nctaid.x, ... of the grouped raster; its producer
warp fills the stages tile after tile, and its two consumer warpgroups take alternate tiles,
each a whole tile (128 x 128, 64 x 256, ...: BM / 64 wgmma a k16 step). The warpgroups take
turns at the tensor units (a warpgroup starts a main loop once the other has issued its last
wgmma), so each one's epilogue runs beside the other's main loop: each consumer warp stores its
own rows by bulk tensor stores through two small buffers of its own (the stages are the other
warpgroup's; ``_pp_store_epilogue``), or from registers where C's layout does not take them.
``kernel="tma_pingpong_multicast"`` runs it on clusters of two that walk pairs of M tiles and
share B by multicast, as the multicast kernel does.

FFMA fallback (dtype fp32, or a dtype the target's tensor units lack): 64 x 64 block tile,
256 threads of 4 x 4 outputs, BK = 16, elements loaded one by one (any alignment; fp16 / bf16
converted to f32 on the way to shared memory), register prefetch of the next tile while the
current one is multiplied (fma.f32 on ld.shared.v4 operands). The same layout options: A^T and B
are loaded a k-row at a time (4 adjacent columns a thread), A and B^T four k of one row.

Tile rule (``choose_tile``): candidates 128x128, 128x64, 64x128, 64x64, 64x32, 32x64, 32x32 (4
warps each). A candidate must fit the target: S >= 2 stages of (BM + BN) x (BK bytes) within
``caps.scratchpad_bytes`` (the first of 128-byte rows x 4 or 3 stages, 64-byte rows x 3 or 2 that
fits), the emitted kernel's registers per thread within ``caps.max_regs_per_thread`` and a
block's registers within ``caps.regs_per_core``. Among those that fit, the smallest estimated
time wins, ties to the larger tile:

    cost = ceil(blocks / cores) * BM * BN / eff,  eff = min(1, BM*BN / (BM+BN) / 64)

i.e. the work of the busiest core (whole tiles per core: wave quantization) divided by an
efficiency that grows with the tile's arithmetic intensity (the 128 x 128 tile moves half the
shared-memory and L2 bytes per flop of a 64 x 64 one). So a large GEMM gets 128 x 128 (a100:
from about 1024^2 on), and a small one a smaller tile that spreads over more cores. The tile
takes the deepest pipeline that fits, except in a GEMM of at most ``SKINNY_M`` rows (decode's
GEMV, bound by streaming B): there the stage count that gives the fewest waves of blocks over
all the cores' block slots (batched GEMMs counted) wins, ties to the deeper, since a last wave
of a few blocks streams at a few cores' rate (h100, 1 x 36864 x 12288: 576 blocks of 32 x 64,
4 stages hold 4 blocks an SM, two waves; 3 stages hold 6, one wave).

On a target with wgmma, a GEMM of more than ``SKINNY_M`` rows takes the wgmma kernel when the cost
of its best tile (128 x 256 down to 64 x 64) is below that of the mma kernel's best, its
efficiency raised up to 1 / (mma.sync's share of the units' peak) where the tile's intensity
allows: eff = min(1 / share, intensity / 64). So a large GEMM runs wgmma 128 x 256, and a small
one, or one bound by its operands' traffic, mma's smaller tiles. ``kernel`` overrides the choice.
The ping-pong kernel orders its warpgroup tiles (PINGPONG_TILES) by the same cost at wgmma's rate,
one tile an SM at a time (its warpgroups' main loops take turns), and takes the most stages of up
to 8 that fit beside its epilogue buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from archsim.errors import InputError
from archsim.isa.builder import Mem, Pred, Reg
from archsim.isa.check import check
from archsim.isa.program import Launch, Program
from archsim.isa.tensor_map import TensorMap, tensor_map_words
from archsim.workloads.emit.common import (BUF_HOST, CVT_PACK, DTYPE_ALIASES, ELEM_BYTES, INDEX_DTYPE, MMA_OP,
                                          OUT_BYTES, OUT_DTYPE_ALIASES, SKINNY_ROWS, SPLIT_K_MIN_K, Asm, OutOfRegisters,
                                          blocks_per_core, ceil_div, check_int, check_pair, log2, one_to_one,
                                          split_k_slices, swizzle_offset)

__all__ = ["GemmKernel", "Tile", "choose_tile", "gemm_kernel", "gemm_reference", "nh_magic", "split_k", "PARAMS",
           "MAX_BATCH"]

# the storage dtypes' tables and tf32 (fp32 buffers the tensor units read with 10 mantissa bits);
# _HOST also takes the output dtypes
_DTYPES = {**DTYPE_ALIASES, "tf32": "tf32", INDEX_DTYPE: INDEX_DTYPE, "u8": "u8"}
_ELEM_BYTES = {**ELEM_BYTES, "tf32": 4}
_MMA = {**MMA_OP, "tf32": "mma.m16n8k8.f32.tf32"}
_HOST = {**BUF_HOST, "tf32": np.float32, "f32": np.float32, "f16": np.float16}

# (BM, BN, warps along M, warps along N) of the tensor-core kernel, largest first
MMA_TILES = ((128, 128, 2, 2), (128, 64, 2, 2), (64, 128, 2, 2), (64, 64, 2, 2), (64, 32, 2, 2),
             (32, 64, 2, 2), (32, 32, 2, 2))
SKINNY_M = SKINNY_ROWS   # GEMMs of at most this many rows (decode) stream B: their stages are chosen by waves
FFMA_TILE = (64, 64, 16, 8)   # BM, BN, BK, warps (16 x 16 threads of 4 x 4 outputs)
# gemm_kernel's kernel: the rule's choice, or one of these (tma_multicast: the TMA kernel on clusters of
# two blocks that share their B tiles by multicast; tma_pingpong: the persistent ping-pong kernel)
KERNELS = (None, "mma", "wgmma", "tma", "tma_multicast", "tma_pingpong", "tma_pingpong_multicast")
KERNEL_NAMES = ", ".join(KERNELS[1:-1]) + " or " + KERNELS[-1]
# (BM, BN) of the warpgroup-MMA kernel (BM / 64 warpgroups of m64nBNk16), largest first
WGMMA_TILES = ((128, 256), (128, 128), (64, 256), (64, 128), (128, 64), (64, 64))
# (BM, BN) of one consumer warpgroup of the ping-pong kernel (BM x BN / 128 accumulators a thread)
PINGPONG_TILES = ((128, 128), (64, 256), (64, 128), (128, 64), (64, 64))


class Tile(NamedTuple):
    BM: int
    BN: int
    BK: int        # elements of K per k tile
    warps: int
    stages: int    # shared-memory stages of the copy pipeline (FFMA: 1, with a register prefetch)


@dataclass(frozen=True)
class _Cfg:
    kind: str          # mma | wgmma | tma | ffma
    dtype: str         # fp16 bf16 tf32 fp32
    out: str           # f32 f16 bf16
    trans_b: bool
    BM: int
    BN: int
    WM: int            # warps along M
    WN: int            # warps along N
    stages: int
    cw_a: int          # bytes per copy of A / B (16, 8, 4 or 2)
    cw_b: int
    kb: int = 64       # bytes of a k-tile row (64: BK = 32 halves; 128: BK = 64 halves)
    trans_a: bool = False  # A given k-major ([K, M], row stride lda)
    alpha: float = 1.0     # C = alpha * A @ B (an f32 multiply in the epilogue when not 1)
    cluster: int = 1       # the TMA kernel: blocks a cluster (2: M tiles in pairs sharing B by multicast)
    c_tma: bool = False    # the TMA kernel: C leaves by bulk tensor stores (_tma_c_epilogue)
    pingpong: bool = False  # the TMA kernel as the persistent ping-pong kernel (_emit_wgmma_pingpong)
    pp_overlap: bool = True  # ping-pong: the turn passes after the main loop (False, for comparison: after
                             # the epilogue, so no epilogue runs beside the other warpgroup's main loop)


# kernel parameters, in order: buffers, shape, leading dimensions (elements), the number of heads
# (the inner batch level) and the element strides of each buffer per batch and per head
PARAMS = ("A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "nh", "nh_magic",
          "sa_b", "sa_h", "sb_b", "sb_h", "sc_b", "sc_h", "group", "raster_n")
MAX_BATCH = 65535          # grid.z limit (as CUDA's); it also keeps the magic division exact
_MAGIC_SHIFT = 40


def nh_magic(nh: int) -> int:
    """The multiplier of the kernels' division by nh: z // nh = (z * nh_magic(nh)) >> 40, exact
    for z < 2^40 / nh (z < nb*nh <= 65535 here), as CUTLASS's FastDivmod replaces a division
    by a run-time constant with a multiply and a shift."""
    return -(-(1 << _MAGIC_SHIFT) // nh)


# ----------------------------------------------------------------------------- the kernel object
@dataclass(frozen=True)
class GemmKernel:
    """One emitted GEMM: the program, its launch and what it computes.

    Block z of the launch (z < nb*nh for ``batch = (nb, nh)``) computes
    C_z = alpha * op(A_z) @ op(B_z), where X_z starts ``(z // nh)*stride[0] + (z % nh)*stride[1]``
    elements into buffer X and its rows are ``ld`` elements apart. op(A) is A[M, K] (A given as
    [K, M] with ``trans_a``), op(B) is B[K, N] (B given as [N, K] with ``trans_b``)."""

    program: Program
    launch: Launch
    tile: Tile
    flops: int             # 2*M*N*K*nb*nh (useful math; edge tiles do more)
    M: int
    N: int
    K: int
    dtype: str             # fp16 | bf16 | tf32 | fp32
    out_dtype: str         # f32 | f16 | bf16
    trans_b: bool
    kind: str              # "mma" (tensor cores), "wgmma" (warpgroup MMA), "tma" (wgmma fed by the TMA unit) or "ffma"
    trans_a: bool = False
    lda: int = 0           # row strides in elements (0: dense, set by gemm_kernel)
    ldb: int = 0
    ldc: int = 0
    batch: tuple = (1, 1)  # (nb, nh): grid.z = nb*nh
    stride_a: tuple = (0, 0)  # element strides of A per batch and per head
    stride_b: tuple = (0, 0)
    stride_c: tuple = (0, 0)
    alpha: float = 1.0
    raster: tuple = (1, 0)  # (group, raster_n): the block raster (kernel parameters; see _tile_origin)
    cluster: int = 1        # blocks a thread-block cluster (the TMA kernel with multicast: 2)
    c_tma: bool = False     # the TMA kernel stores C by bulk tensor stores (a third map, mapC)
    pingpong: bool = False  # the TMA kernel as the persistent ping-pong kernel (tile: one warpgroup's)

    @property
    def a_shape(self) -> tuple[int, int]:
        """Shape of one A matrix as stored ([K, M] with trans_a)."""
        return (self.K, self.M) if self.trans_a else (self.M, self.K)

    @property
    def b_shape(self) -> tuple[int, int]:
        return (self.N, self.K) if self.trans_b else (self.K, self.N)

    @property
    def c_shape(self) -> tuple[int, int]:
        return (self.M, self.N)

    @property
    def dense(self) -> bool:
        """One GEMM on dense row-major matrices: buffers are exactly a_shape, b_shape, c_shape."""
        return (self.batch == (1, 1) and self.lda == self.a_shape[1] and self.ldb == self.b_shape[1]
                and self.ldc == self.N)

    @property
    def in_host_dtype(self):
        """numpy dtype of A and B (bf16: uint16 bit patterns; tf32: float32)."""
        return _HOST[self.dtype]

    @property
    def out_host_dtype(self):
        return _HOST[self.out_dtype]

    def _layout(self, name: str):
        """(shape of one matrix as stored, row stride, (batch stride, head stride)) of a buffer."""
        return {"A": (self.a_shape, self.lda, self.stride_a), "B": (self.b_shape, self.ldb, self.stride_b),
                "C": (self.c_shape, self.ldc, self.stride_c)}[name]

    def extent(self, name: str) -> int:
        """Elements buffer A, B or C must hold: one past the last element the kernel touches."""
        (rows, cols), ld, (sb, sh) = self._layout(name)
        nb, nh = self.batch
        return (nb - 1) * sb + (nh - 1) * sh + (rows - 1) * ld + cols

    def view(self, name: str, buf: np.ndarray) -> np.ndarray:
        """The matrices the kernel sees in a buffer (a C-contiguous array of at least extent(name)
        elements), as a strided view: [rows, cols] for a dense kernel, else [nb, nh, rows, cols].
        Writing through the view of C writes the buffer."""
        (rows, cols), ld, (sb, sh) = self._layout(name)
        flat = buf.reshape(-1)
        if self.dense:
            return flat[:rows * cols].reshape(rows, cols)
        it = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat, (*self.batch, rows, cols), (sb * it, sh * it, ld * it, it))

    def buffer_bytes(self) -> dict:
        """Bytes of each buffer (for ``Unbacked(nbytes)`` in timing runs)."""
        es, os_ = _ELEM_BYTES[self.dtype], OUT_BYTES[self.out_dtype]
        return {"A": self.extent("A") * es, "B": self.extent("B") * es, "C": self.extent("C") * os_}

    def args(self, A, B, C) -> dict:
        """Kernel arguments: the three buffers and the scalars. A buffer is a numpy array in the
        kernel's format (a dense kernel: exactly [rows, cols] of its matrix; a strided or batched
        one: any C-contiguous array of at least ``extent`` elements, e.g. ``qkv.reshape(-1)[h:]``
        for the K columns of a fused [T, 3h] QKV buffer), or anything with ``nbytes`` such as the
        timing engine's ``Unbacked``."""
        want = self.buffer_bytes()
        where = f"gemm {self.M}x{self.N}x{self.K}"
        for name, v, dt in (("A", A, self.in_host_dtype), ("B", B, self.in_host_dtype), ("C", C, self.out_host_dtype)):
            if isinstance(v, np.ndarray):
                if self.dense:
                    shape = self._layout(name)[0]
                    if v.shape != shape or v.dtype != np.dtype(dt) or not v.flags.c_contiguous:
                        raise InputError(where, f"{name} is {v.dtype}{list(v.shape)}",
                                         f"a C-contiguous {np.dtype(dt)}{list(shape)} array")
                elif v.dtype != np.dtype(dt) or not v.flags.c_contiguous or v.size < self.extent(name):
                    strided = "" if v.flags.c_contiguous else " (strided)"
                    raise InputError(where, f"{name} is {v.dtype}{list(v.shape)}{strided}",
                                     f"a C-contiguous {np.dtype(dt)} array of at least {self.extent(name)} elements")
            elif int(getattr(v, "nbytes", -1)) < want[name]:
                raise InputError(where, f"{name} has {getattr(v, 'nbytes', None)} bytes", f"at least {want[name]}")
        out = {"A": A, "B": B, "C": C, "M": self.M, "N": self.N, "K": self.K, "lda": self.lda, "ldb": self.ldb,
               "ldc": self.ldc, "nh": self.batch[1], "nh_magic": nh_magic(self.batch[1]),
               "sa_b": self.stride_a[0], "sa_h": self.stride_a[1], "sb_b": self.stride_b[0], "sb_h": self.stride_b[1],
               "sc_b": self.stride_c[0], "sc_h": self.stride_c[1], "group": self.raster[0],
               "raster_n": self.raster[1]}
        if self.kind == "tma":
            out["mapA"], out["mapB"] = _tensor_maps(self.M, self.N, self.K, self.dtype, self.trans_b, self.tile.BM,
                                                    self.tile.BN, self.lda, self.ldb, self.batch, self.stride_a,
                                                    self.stride_b, self.cluster)
            if self.c_tma:
                out["mapC"] = _c_map(self.M, self.N, self.out_dtype, PP_C_BOX_ROWS if self.pingpong else self.tile.BM,
                                     self.ldc, self.batch, self.stride_c)
        return out

    def random_inputs(self, seed: int = 0) -> tuple:
        """(A, B, C): standard-normal inputs in the kernel's input format, C zeros. Dense kernels get
        [rows, cols] arrays; strided or batched ones flat buffers of ``extent`` elements."""
        rng = np.random.default_rng(seed)
        if self.dense:
            a = rng.standard_normal(self.a_shape).astype(np.float32)
            b = rng.standard_normal(self.b_shape).astype(np.float32)
            return to_host(a, self.dtype), to_host(b, self.dtype), np.zeros(self.c_shape, self.out_host_dtype)
        a = rng.standard_normal(self.extent("A")).astype(np.float32)
        b = rng.standard_normal(self.extent("B")).astype(np.float32)
        return to_host(a, self.dtype), to_host(b, self.dtype), np.zeros(self.extent("C"), self.out_host_dtype)

    def reference(self, A, B) -> np.ndarray:
        """alpha * op(A) @ op(B) in float64 from the exact input values (tf32 inputs rounded as the
        tensor units read them; alpha rounded to f32 as the kernel holds it): [M, N] for a dense
        kernel, else [nb, nh, M, N] (compare with ``view("C", C)``)."""
        a = self.view("A", _exact(A, self.dtype))
        b = self.view("B", _exact(B, self.dtype))
        if self.trans_a:
            a = np.swapaxes(a, -1, -2)
        if self.trans_b:
            b = np.swapaxes(b, -1, -2)
        c = a @ b
        return c if self.alpha == 1.0 else c * float(np.float32(self.alpha))


def _exact(x, dtype: str) -> np.ndarray:
    """The float64 values the kernel reads from a buffer (tf32: 10 mantissa bits)."""
    dtype = _DTYPES[dtype]
    if dtype == "tf32":
        bits = np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32).astype(np.float64)
    return to_float(x, dtype)


def to_host(x: np.ndarray, dtype: str) -> np.ndarray:
    """float array -> the buffer format of ``dtype`` (bf16 as uint16 bits)."""
    dtype = _DTYPES[dtype]
    if dtype == "bf16":
        b = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        return (r & 0xFFFF).astype(np.uint16)
    if dtype == INDEX_DTYPE:
        return np.ascontiguousarray(np.rint(x), np.int32)
    if dtype == "u8":
        return np.ascontiguousarray(np.rint(x), np.uint8)
    return np.ascontiguousarray(x, _HOST[dtype])


def to_float(x: np.ndarray, dtype: str) -> np.ndarray:
    """A buffer in the format of ``dtype`` (bf16 bits, f16, f32) -> float64 values."""
    dtype = OUT_DTYPE_ALIASES.get(dtype, _DTYPES.get(dtype))
    if dtype == "bf16":
        return (np.asarray(x, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(x).astype(np.float64)


def gemm_reference(A, B, dtype: str, trans_b: bool = False, trans_a: bool = False) -> np.ndarray:
    """float64 A @ B (A^T with trans_a, B^T with trans_b) of two dense matrices from the buffers'
    exact values; tf32 inputs are truncated to 10 mantissa bits, as the tensor units read them."""
    a, b = _exact(A, dtype), _exact(B, dtype)
    return (a.T if trans_a else a) @ (b.T if trans_b else b)


# ----------------------------------------------------------------------------- emission helpers
def _copy_width(row_bytes: int, es: int) -> int:
    """The widest copy (16, 8, 4 bytes; 2 = per element) that keeps every row's copies aligned."""
    for cw in (16, 8, 4, 2):
        if cw >= es and row_bytes % cw == 0:
            return cw
    return es


def _zero_store(cw: int) -> str:
    return {16: "st.shared.v4.b32", 8: "st.shared.v2.b32", 4: "st.shared.b32", 2: "st.shared.b16"}[cw]


def batch_index(a: Asm) -> tuple[Reg, Reg]:
    """(z // nh, z % nh) of this block (z = %ctaid.z) in two new registers: the batch and the head.
    A multiply by the host's magic number and a shift instead of a division (40 cycles on the
    modelled integer pipe; see nh_magic)."""
    zb, zh, t = a.reg(), a.reg(), a.reg()
    a("s2r", zh, "%ctaid.z")
    a("ldparam", t, "nh_magic")
    a("mul.i64", zb, zh, t)
    a("shr.u64", zb, zb, _MAGIC_SHIFT)
    a("ldparam", t, "nh")
    a("mul.i64", t, zb, t)
    a("sub.i64", zh, zh, t)
    a.free(t)
    return zb, zh


def batch_ptr(a: Asm, dst: Reg, buf: str, sb: str, sh: str, es: int, z: tuple[Reg, Reg]) -> None:
    """dst = buf + (zb*sb + zh*sh) * es: the start of this block's matrix in buffer `buf`
    (z = (zb, zh) from batch_index; sb, sh are kernel parameters, so one program serves every
    batch)."""
    t = a.reg()
    a("ldparam", t, sb)
    a("mul.i64", t, z[0], t)
    a("ldparam", dst, sh)
    a("mad.i64", t, z[1], dst, t)
    a("shl.b64", t, t, log2(es))
    a("ldparam", dst, buf)
    a("add.i64", dst, dst, t)
    a.free(t)


def _tile_origin(a: Asm, c: "_Cfg", m0: Reg, n0: Reg) -> None:
    """m0, n0 = the first row and column of this block's C tile, from its linear index in the
    grid (x-major, the order blocks are dispatched) in grouped raster order, as CUTLASS's
    threadblock swizzle and Triton's grouped ordering do: groups of ``group`` tile rows sweep the
    tile columns, so the blocks that run at once share their A and B panels in L2 (x-major order
    over a wide grid fetches each B panel once per M tile, a wave apart). Tile rows are M tiles
    (grid y), or N tiles (grid x) when the parameter ``raster_n`` is 1; both are parameters, so
    one program serves every shape. Three divisions a call; the prologue and the epilogue each
    call it (keeping m0, n0 live through the main loop would cost two registers there). A kernel
    on clusters of two (c.cluster) takes its origin from _cluster_tile_origin."""
    if c.cluster > 1:
        _cluster_tile_origin(a, c, m0, n0)
        return
    b, R, Q, t = a.reg(), a.reg(), a.reg(), a.reg()
    a("s2r", b, "%ctaid.y")
    a("s2r", Q, "%nctaid.x")
    a("s2r", t, "%ctaid.x")
    a("mad.i64", b, b, Q, t)                      # linear block index
    a("s2r", R, "%nctaid.y")
    _raster_origin(a, c, b, R, Q, t, m0, n0)


def _raster_origin(a: Asm, c: "_Cfg", b: Reg, R: Reg, Q: Reg, t: Reg, m0: Reg, n0: Reg) -> None:
    """m0, n0 of linear tile index b over R M tiles and Q N tiles (swapped when ``raster_n`` is 1)
    in _tile_origin's grouped raster; frees b, R, Q and t."""
    pn = a.pred()
    a("ldparam", t, "raster_n")
    a("setp.ne.i64", pn, t, 0)
    a("mov.b64", t, R)
    a("selp.b64", R, Q, R, pn)                    # tile rows
    a("selp.b64", Q, t, Q, pn)                    # tile columns
    g, row = a.reg(), a.reg()
    a("ldparam", g, "group")
    _grouped_raster(a, b, R, Q, g, row, t, Q)
    a("selp.b64", m0, Q, row, pn)
    a("selp.b64", n0, row, Q, pn)
    a("shl.b64", m0, m0, log2(c.BM))
    a("shl.b64", n0, n0, log2(c.BN))
    a.free(b, R, Q, t, g, row)
    a.pfree(pn)


def _grouped_raster(a: Asm, b: Reg, R: Reg, Q: Reg, g: Reg, row: Reg, t: Reg, col: Reg) -> None:
    """The grouped raster of _tile_origin: linear index b over R tile rows and Q tile columns in
    groups of g tile rows gives the tile row (``row``) and column (``col``, which may be Q).
    Clobbers b, R and t."""
    a("mul.i64", t, g, Q)                         # blocks per group
    a("div.i64", row, b, t)                       # group
    a("mul.i64", t, row, t)
    a("sub.i64", b, b, t)                         # index within the group
    a("mul.i64", row, row, g)                     # the group's first tile row
    a("sub.i64", R, R, row)
    a("min.i64", R, R, g)                         # rows in this group (the last may be short)
    a("rem.i64", t, b, R)
    a("add.i64", row, row, t)                     # tile row
    a("div.i64", col, b, R)                       # tile column


def _cluster_tile_origin(a: Asm, c: "_Cfg", m0: Reg, n0: Reg, pair: Optional[Reg] = None) -> None:
    """m0, n0 of a block of the TMA kernel on clusters of two (a 1-d grid, batch in z): cluster
    b // 2 takes a pair of M tiles in one tile column (they share their B tiles), its block of
    rank r the pair's tile r; the pairs go in _tile_origin's grouped raster with M-tile pairs as
    tile rows and ``group`` / 2 (rounded up) of them a group. A pair's second tile past M (an odd
    number of M tiles) computes zeros and stores nothing. ``pair``: a register holding the pair's
    index instead of the cluster's (the persistent ping-pong kernel's)."""
    b, R, Q, t, g, row = (a.reg() for _ in range(6))
    if pair is None:
        a("s2r", b, "%ctaid.x")
        a("shr.u64", b, b, 1)                     # the cluster
    else:
        a("mov.b64", b, pair)
    a("ldparam", R, "M")
    a("add.i64", R, R, 2 * c.BM - 1)
    a("shr.u64", R, R, log2(2 * c.BM))            # tile pairs along M
    a("ldparam", Q, "N")
    a("add.i64", Q, Q, c.BN - 1)
    a("shr.u64", Q, Q, log2(c.BN))                # tile columns
    a("ldparam", g, "group")
    a("add.i64", g, g, 1)
    a("shr.u64", g, g, 1)                         # pairs a group
    _grouped_raster(a, b, R, Q, g, row, t, n0)     # (tile rows: M-tile pairs)
    a("s2r", t, "%cluster_ctarank")
    a("shl.b64", m0, row, 1)
    a("add.i64", m0, m0, t)
    a("shl.b64", m0, m0, log2(c.BM))
    a("shl.b64", n0, n0, log2(c.BN))
    a.free(b, R, Q, t, g, row)


# ----------------------------------------------------------------------------- tensor-core kernel
class _Operand:
    """Copy plan of one operand tile (global -> one shared-memory stage)."""

    def __init__(self, name, kind, rows, payload, RB, lay, cw, off, es):
        self.name, self.kind, self.rows, self.payload, self.RB, self.lay = name, kind, rows, payload, RB, lay
        self.cw, self.off, self.es = cw, off, es
        self.copies = []      # (sreg, simm, greg, gimm, dr, dcb)
        self.sregs = []
        self.gregs = []


def _plan_copies(a: Asm, op: _Operand, T: int, tid: Reg, rowbase: Reg, lim: Reg, ld: Reg, kshift: Reg,
                 ptr: Reg) -> None:
    """Allocate and compute the per-thread shared offsets and global pointers of op's copies.

    Chunk q = tid + T*i of the tile (CPR chunks a row): row q // CPR, column chunk q % CPR.
    rowbase: m0 (A) / n0 (B^T) / n0 (B, for its columns) / m0 (A^T, for its columns); lim: the
    clamp bound register; ld: the row stride of the operand in global memory (elements); ptr: the
    operand's base address (this block's matrix)."""
    cw, es = op.cw, op.es
    CPR = op.payload // cw
    total = op.rows * CPR
    if total % T:
        raise OutOfRegisters(f"{op.name} tile of {total} copies does not split over {T} threads")
    n = total // T
    if T % CPR == 0:
        rb = a.reg()
        a("shr.u64", rb, tid, log2(CPR))
        cbase = a.reg()
        a("and.b64", cbase, tid, CPR - 1)
        items = [((T // CPR) * i, 0) for i in range(n)]
    else:
        m = CPR // T
        rb = None
        cbase = a.reg()
        a("mov.b64", cbase, tid)
        items = [(i // m, T * (i % m) * cw) for i in range(n)]
    cb = cbase
    a("shl.b64", cb, cbase, log2(cw))             # column byte of the thread's chunk
    swizzled = op.lay != "pad"
    sreg = {}
    greg = {}
    for dr, dcb in items:
        skey = (dr % 8, dcb % 128) if swizzled else (0, 0)
        if skey not in sreg:
            r, c = a.reg(), a.reg()
            if rb is None:
                a("mov.b64", r, skey[0])
            else:
                a("add.i64", r, rb, skey[0])
            a("add.i64", c, cb, skey[1])
            swizzle_offset(a, r, r, c, op.lay, op.RB, op.off)
            a.free(c)
            sreg[skey] = r
        simm = (dr - skey[0]) * op.RB + (dcb - skey[1])
        if op.kind in ("A", "Bt"):
            gkey = dr
            if gkey not in greg:
                g = a.reg()
                if rb is None:
                    a("add.i64", g, rowbase, dr)
                else:
                    a("add.i64", g, rb, rowbase)
                    if dr:
                        a("add.i64", g, g, dr)
                a("min.i64", g, g, lim)                 # clamp to the last row
                a("mul.i64", g, g, ld)
                a("add.i64", g, g, kshift)
                a("shl.b64", g, g, log2(es))
                a("add.i64", g, g, ptr)
                a("add.i64", g, g, cb)
                greg[gkey] = g
            gimm = dcb
        else:   # Bn / At: rows are k, columns n / m (clamped per chunk)
            gkey = (dr, dcb)
            if gkey not in greg:
                g, t = a.reg(), a.reg()
                a("add.i64", t, cb, dcb)
                a("shr.u64", t, t, log2(es))
                a("add.i64", t, t, rowbase)             # n0 + column
                a("min.i64", t, t, lim)                 # clamp the chunk to N - cw/es
                if rb is None:
                    a("add.i64", g, kshift, dr)
                else:
                    a("add.i64", g, rb, kshift)
                    if dr:
                        a("add.i64", g, g, dr)
                a("mad.i64", g, g, ld, t)
                a("shl.b64", g, g, log2(es))
                a("add.i64", g, g, ptr)
                a.free(t)
                greg[gkey] = g
            gimm = 0
        op.copies.append((sreg[skey], simm, greg[gkey], gimm, dr, dcb))
    op.sregs = list(sreg.values())
    op.gregs = list(dict.fromkeys(greg.values()))
    op.rb, op.cb = rb, cb   # kept for the tile-0 validity test


def _emit_copies(a: Asm, op: _Operand, stage: Optional[Reg], guard: Optional[Pred], tile0: bool,
                 kshift: Optional[Reg], zero: Reg) -> None:
    """Copy one k tile of op into the stage at byte offset `stage` (None: 0).
    tile0: the residue tile (k from kshift <= 0): chunks at k < 0 are zero-filled instead."""
    base = {}
    for s in op.sregs:
        if stage is None:
            base[s.n] = s
        else:
            t = a.reg()
            a("add.i64", t, stage, s)
            base[s.n] = t
    valid = {}
    pv = a.pred() if tile0 else None

    def validity(dr, dcb):
        """Set pv to 'this copy's k >= 0' (tile 0); cached on the last key."""
        key = dcb if op.kind in ("A", "Bt") else dr
        if valid.get("key") == key:
            return
        t = a.reg()
        if op.kind in ("A", "Bt"):
            a("shr.u64", t, op.cb, log2(op.es))
            a("add.i64", t, t, kshift)
            a("setp.ge.i64", pv, t, -(dcb // op.es))
        else:
            if op.rb is None:
                a("mov.b64", t, kshift)
            else:
                a("add.i64", t, op.rb, kshift)
            a("setp.ge.i64", pv, t, -dr)
        a.free(t)
        valid["key"] = key

    if op.cw >= 4:
        for s, simm, g, gimm, dr, dcb in op.copies:
            sm, gm = Mem(base[s.n], simm), Mem(g, gimm)
            if tile0:
                validity(dr, dcb)
                a(f"cp.async.{op.cw}", sm, gm, p=pv)
                a(_zero_store(op.cw), sm, zero, p=pv, neg=True)
            else:
                a(f"cp.async.{op.cw}", sm, gm, p=guard)
    else:   # per element: ld.global.u16 + st.shared.b16, 8 at a time
        G = 8
        tmp = a.reg(G)
        cps = op.copies
        for i0 in range(0, len(cps), G):
            grp = cps[i0:i0 + G]
            for j, (s, simm, g, gimm, dr, dcb) in enumerate(grp):
                if tile0:
                    validity(dr, dcb)
                    a("mov.b64", tmp + j, 0)
                    a("ld.global.u16", tmp + j, Mem(g, gimm), p=pv)
                else:
                    a("ld.global.u16", tmp + j, Mem(g, gimm), p=guard)
            for j, (s, simm, g, gimm, dr, dcb) in enumerate(grp):
                a("st.shared.b16", Mem(base[s.n], simm), tmp + j, p=None if tile0 else guard)
        a.free(tmp, k=G)
    if pv is not None:
        a.pfree(pv)
    if stage is not None:
        for t in base.values():
            a.free(t)


def _copy_ops(a: Asm, op: _Operand, base: dict, guard: Optional[Pred]) -> list:
    """The steady-state copies of one k tile of op as a list of emitters (one per instruction
    group), so that the main loop can spread them between its mma. `base`: sreg -> register holding
    stage + sreg."""
    if op.cw >= 4:
        return [(lambda s=s, simm=simm, g=g, gimm=gimm:
                 a(f"cp.async.{op.cw}", Mem(base[s.n], simm), Mem(g, gimm), p=guard))
                for s, simm, g, gimm, _, _ in op.copies]

    def per_element():
        G = 8
        tmp = a.reg(G)
        cps = op.copies
        for i0 in range(0, len(cps), G):
            grp = cps[i0:i0 + G]
            for j, (s, simm, g, gimm, _, _) in enumerate(grp):
                a("ld.global.u16", tmp + j, Mem(g, gimm), p=guard)
            for j, (s, simm, g, gimm, _, _) in enumerate(grp):
                a("st.shared.b16", Mem(base[s.n], simm), tmp + j, p=guard)
        a.free(tmp, k=G)
    return [per_element]


def _interleave(a: Asm, mmas: list, others: list) -> None:
    """Emit the mma with the other instructions spread evenly between them (front-loaded), as
    CUTLASS's warp-level software pipeline does: an in-order warp then never holds a run of memory
    instructions in front of its tensor work."""
    n, m = len(mmas), len(others)
    j = 0
    for i, f in enumerate(mmas):
        while j < m and j * n <= i * m:
            others[j]()
            j += 1
        f()
    while j < m:
        others[j]()
        j += 1


def _stage_rows(k_along_row: bool, cols: int, KB: int, es: int) -> tuple[int, int, int, str]:
    """(rows, payload bytes, row pitch, layout) of one operand's tile in a shared-memory stage."""
    # rows of KB bytes of k (A, B^T); else k-major rows of `cols` elements (A^T, B), swizzled for 16-bit
    # elements (read with ldmatrix.trans) or padded by 32 bytes for tf32 (read with scalar loads)
    if k_along_row:
        return cols, KB, KB, "sw64" if KB == 64 else "sw128"
    BK = KB // es
    if es == 2:
        payload = cols * 2
        return BK, payload, payload, ("sw128" if payload >= 128 else "sw64")
    payload = cols * 4
    return BK, payload, payload + 32, "pad"


class _MmaCtx:
    """The tensor-core GEMM being emitted: its geometry (from _Cfg), its Asm, and the registers,
    copy plans and fragment bases that more than one step of the kernel uses."""

    def __init__(self, c: _Cfg):
        self.c = c
        self.es = es = _ELEM_BYTES[c.dtype]
        self.T = 32 * c.WM * c.WN
        self.WTM, self.WTN = c.BM // c.WM, c.BN // c.WN
        self.MI, self.NI = MI, NI = self.WTM // 16, self.WTN // 8
        if MI < 1 or NI < 2 or NI % 2:
            raise OutOfRegisters("warp tile too small")
        self.KB = KB = c.kb                       # bytes of a k tile row: 64 or 128
        self.BK = BK = KB // es                   # elements per k tile
        self.NSTEP = KB // 32                     # mma k-steps per k tile (32 bytes of k each)
        self.lay_k = "sw64" if KB == 64 else "sw128"
        self.S = S = c.stages
        self.mma = _MMA[c.dtype]
        self.a_rows, self.a_payload, self.a_RB, self.a_lay = _stage_rows(not c.trans_a, c.BM, KB, es)
        self.b_rows, self.b_payload, self.b_RB, self.b_lay = _stage_rows(c.trans_b, c.BN, KB, es)
        self.B_OFF = A_BYTES = ceil_div(self.a_rows * self.a_RB, 128) * 128
        self.SB = ceil_div(A_BYTES + self.b_rows * self.b_RB, 128) * 128
        self.osz = OUT_BYTES[c.out]
        name = (f"gemm_{c.dtype}_{c.out}{'_ta' if c.trans_a else ''}{'_tb' if c.trans_b else ''}"
                f"_{c.BM}x{c.BN}x{BK}_s{S}")
        self.a = Asm(name, PARAMS, S * self.SB)
        # the registers (acc, fa, fb, tid, nt, kshift, aA, bB, rs, ws, kt, fA, fB, pm) and the copy plans
        # (A, Bops) are set by the steps that allocate them

    def accr(self, mi: int, ni: int) -> Reg:
        """The 4 accumulators of mma tile (mi, ni) of the warp tile."""
        return self.acc + 4 * (mi * self.NI + ni)


def _mma_accumulators(ctx: _MmaCtx) -> None:
    """Allocate the accumulators and the two fragment buffers first (big blocks); zero the accumulators."""
    a, MI, NI = ctx.a, ctx.MI, ctx.NI
    ctx.acc = a.reg(MI * NI * 4)
    ctx.fa = [a.reg(MI * 4), a.reg(MI * 4)]
    ctx.fb = [a.reg(NI * 2), a.reg(NI * 2)]
    for i in range(MI * NI * 4):
        a("mov.f32", ctx.acc + i, 0.0)


def _mma_operands(ctx: _MmaCtx) -> None:
    """Emit the block's shape and k-tile count (nt, kshift) and the copy plans of A and B with their k steps."""
    a, c, es, BK, KB, lay_k = ctx.a, ctx.c, ctx.es, ctx.BK, ctx.KB, ctx.lay_k
    ctx.tid = tid = a.reg()
    a("s2r", tid, "%tid.x")
    m0, n0 = a.reg(), a.reg()
    _tile_origin(a, c, m0, n0)
    Mr, Nr, Kr = a.reg(), a.reg(), a.reg()
    a("ldparam", Mr, "M")
    a("ldparam", Nr, "N")
    a("ldparam", Kr, "K")
    ctx.nt = nt = a.reg()
    a("add.i64", nt, Kr, BK - 1)
    a("shr.u64", nt, nt, log2(BK))                # k tiles
    ctx.kshift = kshift = a.reg()
    a("shl.b64", kshift, nt, log2(BK))
    a("sub.i64", kshift, Kr, kshift)              # K - nt*BK <= 0: first k of tile 0
    lim, ld = a.reg(), a.reg()
    pA, pB = a.reg(), a.reg()                     # this block's matrices
    z = batch_index(a)
    batch_ptr(a, pA, "A", "sa_b", "sa_h", es, z)
    batch_ptr(a, pB, "B", "sb_b", "sb_h", es, z)
    a.free(*z)
    a("ldparam", ld, "lda")
    if c.trans_a:
        A = _Operand("A", "At", ctx.a_rows, ctx.a_payload, ctx.a_RB, ctx.a_lay, c.cw_a, 0, es)
        a("sub.i64", lim, Mr, c.cw_a // es)       # the last chunk start that stays inside a row
    else:
        A = _Operand("A", "A", c.BM, KB, KB, lay_k, c.cw_a, 0, es)
        a("sub.i64", lim, Mr, 1)
    _plan_copies(a, A, ctx.T, tid, m0, lim, ld, kshift, pA)
    a.free(pA)
    ctx.astep = None
    if c.trans_a:
        ctx.astep = a.reg()
        a("mul.i64", ctx.astep, ld, BK * es)      # A^T: BK rows further per k tile
    a("ldparam", ld, "ldb")
    if c.trans_b:
        ctx.Bops = [_Operand("B", "Bt", c.BN, KB, KB, lay_k, c.cw_b, ctx.B_OFF, es)]
        a("sub.i64", lim, Nr, 1)
        _plan_copies(a, ctx.Bops[0], ctx.T, tid, n0, lim, ld, kshift, pB)
    else:
        a("sub.i64", lim, Nr, c.cw_b // es)       # the last chunk start that stays inside a row
        # B's k rows in one stage row (mma), or in panels of 64 columns (wgmma: 128-byte rows, the
        # MN-major layout a descriptor names), the panels one after another
        panel = 128 // es if c.kind == "wgmma" else c.BN
        RB, lay = (128, "sw128") if c.kind == "wgmma" else (ctx.b_RB, ctx.b_lay)
        ctx.Bops = []
        for j in range(c.BN // panel):
            op = _Operand("B", "Bn", ctx.b_rows, panel * es if c.kind == "wgmma" else ctx.b_payload, RB, lay,
                          c.cw_b, ctx.B_OFF + j * ctx.b_rows * RB, es)
            col0 = n0
            if j:
                col0 = a.reg()
                a("add.i64", col0, n0, j * panel)
            _plan_copies(a, op, ctx.T, tid, col0, lim, ld, kshift, pB)
            if j:
                a.free(col0)
            ctx.Bops.append(op)
    a.free(pB, lim, Mr)
    ctx.bstep = None
    if not c.trans_b:
        ctx.bstep = a.reg()
        a("mul.i64", ctx.bstep, ld, BK * es)      # B: BK rows further per k tile
    a.free(ld)
    # a k tile further: BK elements along a row (A, B^T), or BK rows (A^T, B: a register)
    ctx.kstep = {"A": ctx.astep if c.trans_a else BK * es, "B": BK * es if c.trans_b else ctx.bstep}
    a.free(Nr, Kr, m0, n0)
    ctx.A = A


def _mma_a_frag_bases(ctx: _MmaCtx, lane: Reg, warp: Reg, t1: Reg, t2: Reg) -> None:
    """Emit ctx.aA, the offsets within a stage that the A fragment loads start from."""
    a, c, es = ctx.a, ctx.c, ctx.es
    a("shr.u64", t1, warp, log2(c.WN))
    a("mul.i64", t1, t1, ctx.WTM)                 # first row (A^T: column) of the warp tile
    if not c.trans_a:
        # A: lane L points at row wm*WTM + L%16, logical chunk L/16 (+2s for k-step s)
        aA = [a.reg() for _ in range(ctx.NSTEP)]
        a("and.b64", t2, lane, 15)
        a("add.i64", t1, t1, t2)
        a("shr.u64", t2, lane, 4)
        a("shl.b64", t2, t2, 4)
        swizzle_offset(a, aA[0], t1, t2, ctx.lay_k, ctx.KB, 0)
        for s_ in range(1, ctx.NSTEP):
            a("xor.b64", aA[s_], aA[0], 32 * s_)
    elif es == 2:
        # A^T (rows k): ldmatrix.trans, lane L points at k-row (L%8) + 8*(L/16), chunk (warp's
        # first) + (L/8)%2: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15,
        # k 8-15) transposed are the A fragment's registers 0-3. m16 tile mi: chunk + 2mi = xor
        # 32mi; k-step s: 16s rows further (immediate)
        aA = [a.reg() for _ in range(ctx.MI)]
        a("shl.b64", t1, t1, 1)                   # column bytes
        a("shr.u64", t2, lane, 3)
        a("and.b64", t2, t2, 1)
        a("shl.b64", t2, t2, 4)
        a("add.i64", t2, t2, t1)
        t3 = a.reg()
        a("and.b64", t1, lane, 7)
        a("shr.u64", t3, lane, 4)
        a("shl.b64", t3, t3, 3)
        a("add.i64", t1, t1, t3)
        a.free(t3)
        swizzle_offset(a, aA[0], t1, t2, ctx.a_lay, ctx.a_RB, 0)
        for mi in range(1, ctx.MI):
            a("xor.b64", aA[mi], aA[0], 32 * mi)
    else:
        # tf32 A^T (rows k, padded): lane (g, t) reads k-row t (+4), column g (+8) of each m16 tile
        aA = [a.reg()]
        a("shr.u64", t2, lane, 2)
        a("add.i64", t1, t1, t2)
        a("shl.b64", t1, t1, 2)
        a("and.b64", t2, lane, 3)
        a("mul.i64", t2, t2, ctx.a_RB)
        a("add.i64", aA[0], t1, t2)
    ctx.aA = aA


def _mma_b_frag_bases(ctx: _MmaCtx, lane: Reg, warp: Reg, t1: Reg, t2: Reg) -> None:
    """Emit ctx.bB, the offsets within a stage that the B fragment loads start from."""
    a, c, es, B_OFF = ctx.a, ctx.c, ctx.es, ctx.B_OFF
    a("and.b64", t1, warp, c.WN - 1)              # wn
    a("mul.i64", t1, t1, ctx.WTN)                 # first column of the warp tile
    if c.trans_b:
        # B^T (rows n, KB bytes of k): lane L points at n-row (L%8) + 8*(L/16), chunk (L/8)%2 (+2s)
        bB = [a.reg() for _ in range(ctx.NSTEP)]
        a("and.b64", t2, lane, 7)
        a("add.i64", t1, t1, t2)
        a("shr.u64", t2, lane, 4)
        a("shl.b64", t2, t2, 3)
        a("add.i64", t1, t1, t2)
        a("shr.u64", t2, lane, 3)
        a("and.b64", t2, t2, 1)
        a("shl.b64", t2, t2, 4)
        swizzle_offset(a, bB[0], t1, t2, ctx.lay_k, ctx.KB, B_OFF)
        for s_ in range(1, ctx.NSTEP):
            a("xor.b64", bB[s_], bB[0], 32 * s_)
    elif es == 2:
        # B (rows k): ldmatrix.trans, lane L points at k-row L%16, chunk (warp's first) + L/16;
        # n8-tile pair j: chunk + 2j = xor 32j; k-step s: 16s rows further (immediate)
        bB = [a.reg() for _ in range(ctx.NI // 2)]
        a("shl.b64", t1, t1, 1)                   # column bytes
        a("shr.u64", t2, lane, 4)
        a("shl.b64", t2, t2, 4)
        a("add.i64", t2, t2, t1)
        a("and.b64", t1, lane, 15)
        swizzle_offset(a, bB[0], t1, t2, ctx.b_lay, ctx.b_RB, B_OFF)
        for j in range(1, ctx.NI // 2):
            a("xor.b64", bB[j], bB[0], 32 * j)
    else:
        # tf32 B (rows k, padded): lane (g, t) reads k-row t (+4), column g of each n8 tile
        bB = [a.reg()]
        a("shr.u64", t2, lane, 2)
        a("add.i64", t1, t1, t2)
        a("shl.b64", t1, t1, 2)
        a("and.b64", t2, lane, 3)
        a("mul.i64", t2, t2, ctx.b_RB)
        a("add.i64", bB[0], t1, t2)
        a("add.i64", bB[0], bB[0], B_OFF)
    ctx.bB = bB


def _mma_frag_addresses(ctx: _MmaCtx) -> None:
    """Emit the fragment offsets within a stage; allocate the loop's stage, k-tile and base registers."""
    # moving one k-step (32 bytes of k) to the right flips logical chunk bits 1.. of a swizzled row,
    # i.e. xor 32*s on the address
    a = ctx.a
    lane, warp, t1, t2 = a.reg(), a.reg(), a.reg(), a.reg()
    a("and.b64", lane, ctx.tid, 31)
    a("shr.u64", warp, ctx.tid, 5)
    _mma_a_frag_bases(ctx, lane, warp, t1, t2)
    _mma_b_frag_bases(ctx, lane, warp, t1, t2)
    a.free(lane, warp, t1, t2, ctx.tid)
    ctx.rs, ctx.ws, ctx.kt = a.reg(), a.reg(), a.reg()
    ctx.fA = [a.reg() for _ in ctx.aA]            # this tile's fragment bases
    ctx.fB = [a.reg() for _ in ctx.bB]


def _mma_stage_frag_bases(ctx: _MmaCtx, stage: Reg) -> None:
    """Emit fA, fB = the fragment bases in the stage at byte offset `stage`."""
    for i, r in enumerate(ctx.aA):
        ctx.a("add.i64", ctx.fA[i], stage, r)
    for i, r in enumerate(ctx.bB):
        ctx.a("add.i64", ctx.fB[i], stage, r)


def _mma_frag_ops(ctx: _MmaCtx, s: int, buf: int) -> list:
    """Emitters of the fragment loads of k-step s into buffer buf, in the order the mma use them."""
    a, c, es, KB, MI, NI = ctx.a, ctx.c, ctx.es, ctx.KB, ctx.MI, ctx.NI
    fa, fb, fA, fB, a_RB, b_RB = ctx.fa, ctx.fb, ctx.fA, ctx.fB, ctx.a_RB, ctx.b_RB
    ops = []
    if not c.trans_a:
        A_ = [lambda mi=mi: a("ldmatrix.x4", fa[buf] + 4 * mi, Mem(fA[s], mi * 16 * KB)) for mi in range(MI)]
    elif es == 2:
        A_ = [lambda mi=mi: a("ldmatrix.x4.trans", fa[buf] + 4 * mi, Mem(fA[mi], s * 16 * a_RB))
              for mi in range(MI)]
    else:   # registers 0-3: (g, t), (g+8, t), (g, t+4), (g+8, t+4) as (m, k); rows are k
        A_ = [lambda mi=mi: [a("ld.shared.b32", fa[buf] + 4 * mi + j,
                               Mem(fA[0], (8 * s + 4 * (j // 2)) * a_RB + 4 * (16 * mi + 8 * (j % 2))))
                             for j in range(4)]
              for mi in range(MI)]
    if c.trans_b:
        B_ = [lambda j=j: a("ldmatrix.x4", fb[buf] + 4 * j, Mem(fB[s], j * 16 * KB)) for j in range(NI // 2)]
    elif es == 2:
        B_ = [lambda j=j: a("ldmatrix.x4.trans", fb[buf] + 4 * j, Mem(fB[j], s * 16 * b_RB))
              for j in range(NI // 2)]
    else:
        B_ = [lambda ni=ni, h=h: a("ld.shared.b32", fb[buf] + 2 * ni + h,
                                   Mem(fB[0], (8 * s + 4 * h) * b_RB + 32 * ni))
              for ni in range(NI) for h in range(2)]
    # A fragment 0 and the B fragments first (the first row of mma needs all of them)
    ops.append(A_[0])
    ops.extend(B_)
    ops.extend(A_[1:])
    return ops


def _mma_ops(ctx: _MmaCtx, buf: int) -> list:
    """Emitters of one k-step's mma on fragment buffer buf, snaking along the warp tile's rows."""
    a, MI, NI, fa, fb = ctx.a, ctx.MI, ctx.NI, ctx.fa, ctx.fb
    ops = []
    for mi in range(MI):
        order = range(NI) if mi % 2 == 0 else range(NI - 1, -1, -1)
        for ni in order:
            ops.append(lambda mi=mi, ni=ni: a(ctx.mma, ctx.accr(mi, ni), fa[buf] + 4 * mi, fb[buf] + 2 * ni,
                                              ctx.accr(mi, ni)))
    return ops


def _mma_advance(ctx: _MmaCtx) -> None:
    """Emit the steps of A's and B's copy pointers to the next k tile."""
    for op in (ctx.A, *ctx.Bops):
        for g in op.gregs:
            ctx.a("add.i64", g, g, ctx.kstep[op.name])


def _copy_prologue(ctx: _MmaCtx, tiles: int) -> None:
    """Emit the copies of k tiles 0 .. tiles-1 into stages 0 .. tiles-1, a commit group each, and
    allocate ctx.pm. Tile 0 is the K residue: its chunks at k < 0 are zero-filled (_emit_copies)."""
    a, SB = ctx.a, ctx.SB
    ctx.pm = pm = a.pred()
    for j in range(tiles):
        stage = None
        if j:
            stage = a.reg()
            a("mov.b64", stage, j * SB)
            a("setp.gt.i64", pm, ctx.nt, j)       # tile j exists
        for op in (ctx.A, *ctx.Bops):
            _emit_copies(a, op, stage, pm if j else None, j == 0, ctx.kshift, ctx.acc)
        a("cp.async.commit")
        _mma_advance(ctx)
        if stage is not None:
            a.free(stage)
    a.free(ctx.kshift)


def _stage_bases(ctx: _MmaCtx, ws: Reg) -> dict:
    """Registers holding ws + each copy plan's shared offset: where a k tile's copies go."""
    base = {}
    for op in (ctx.A, *ctx.Bops):
        for sr in op.sregs:
            r = ctx.a.reg()
            ctx.a("add.i64", r, ws, sr)
            base[sr.n] = r
    return base


def _mma_pipeline_prologue(ctx: _MmaCtx) -> None:
    """Emit the copies of tiles 0 .. S-2 into stages 0 .. S-2, then tile 0's first fragments."""
    a, S, SB = ctx.a, ctx.S, ctx.SB
    _copy_prologue(ctx, S - 1)
    a("mov.b64", ctx.rs, 0)
    a("mov.b64", ctx.ws, (S - 1) * SB)
    a("mov.b64", ctx.kt, 0)
    a("cp.async.wait", S - 2)
    a("bar.sync")
    _mma_stage_frag_bases(ctx, ctx.rs)
    for f in _mma_frag_ops(ctx, 0, 0):
        f()


def _mma_main_loop(ctx: _MmaCtx) -> None:
    """Emit the main loop (KLOOP), one k tile per iteration."""
    # k-step s runs its mma with the loads of k-step s+1 spread between them; the copies of tile kt+S-1
    # are spread over the k-steps before the barrier, which sits before the last k-step (CUTLASS's
    # multistage order): after it, the first fragments of tile kt+1 are loaded while the last k-step's
    # mma run.
    a, S, SB, NSTEP, pm, rs, ws, kt = ctx.a, ctx.S, ctx.SB, ctx.NSTEP, ctx.pm, ctx.rs, ctx.ws, ctx.kt
    a.label("KLOOP")
    t = a.reg()
    a("add.i64", t, kt, S - 1)
    a("setp.lt.i64", pm, t, ctx.nt)               # tile kt+S-1 exists?
    a.free(t)
    base = _stage_bases(ctx, ws)                  # where this tile's copies go
    copies = [f for op in (ctx.A, *ctx.Bops) for f in _copy_ops(a, op, base, pm)]
    pre = NSTEP - 1                               # k-steps before the barrier
    share = [copies[i * len(copies) // pre:(i + 1) * len(copies) // pre] for i in range(pre)]
    for s_ in range(NSTEP):
        buf = s_ % 2
        if s_ == NSTEP - 1:
            a("cp.async.wait", S - 2)             # tile kt+1 landed (this thread) ...
            a("bar.sync")                         # ... for everyone; the stage of tile kt-1 is free
            a("mov.b64", ws, rs)                  # next iteration writes where this one read
            a("add.i64", rs, rs, SB)
            a("setp.ge.i64", pm, rs, S * SB)
            a("mov.b64", rs, 0, p=pm)
            _mma_stage_frag_bases(ctx, rs)
            others = _mma_frag_ops(ctx, 0, 1 - buf)  # k-step 0 of tile kt+1
        else:
            others = _mma_frag_ops(ctx, s_ + 1, 1 - buf) + share[s_]
        _interleave(a, _mma_ops(ctx, buf), others)
        if s_ == NSTEP - 2:
            a("cp.async.commit")
            _mma_advance(ctx)
            for r in base.values():
                a.free(r)
    a("add.i64", kt, kt, 1)
    a("setp.lt.i64", pm, kt, ctx.nt)
    a("bra", "KLOOP", p=pm)


def _mma_release(ctx: _MmaCtx) -> None:
    """Free the main loop's registers (all but the accumulators) for the epilogue."""
    a = ctx.a
    ops = (ctx.A, *ctx.Bops)
    loop = [ctx.rs, ctx.ws, ctx.kt, ctx.nt] + ([*ctx.fA, *ctx.fB, *ctx.aA, *ctx.bB] if ctx.c.kind == "mma" else [])
    for r in loop + [r for op in ops for r in (*op.sregs, *op.gregs)]:
        a.free(r)
    for r in [r for op in ops for r in (op.rb, op.cb)] + [ctx.astep, ctx.bstep]:
        if r is not None:
            a.free(r)
    if ctx.c.kind == "mma":
        a.free(ctx.fa[0], ctx.fa[1], k=ctx.MI * 4)
        a.free(ctx.fb[0], ctx.fb[1], k=ctx.NI * 2)


def _emit_mma(c: _Cfg) -> Program:
    """The tensor-core kernel (see the module docstring)."""
    ctx = _MmaCtx(c)
    _mma_accumulators(ctx)
    _mma_operands(ctx)
    _mma_frag_addresses(ctx)
    _mma_pipeline_prologue(ctx)
    _mma_main_loop(ctx)
    _mma_release(ctx)
    _epilogue(ctx.a, c, ctx.pm, ctx.acc, ctx.MI, ctx.NI, ctx.WTM, ctx.WTN, ctx.osz, ctx.accr, ctx.S * ctx.SB)
    return ctx.a.build()


# ----------------------------------------------------------------------------- warpgroup MMA kernel
class _WgDesc(NamedTuple):
    """The wgmma kernels' operand descriptors: registers for this warpgroup's A offset (with the
    constant fields) and the two descriptors, B's constant fields, the k16 step along B, the opcode."""
    wgoff: Reg
    dA: Reg
    dB: Reg
    bconst: int
    bstep: int
    mn: str


def _wg_descriptors(ctx: _MmaCtx, tid: Optional[Reg]) -> _WgDesc:
    """Emit this warp's warpgroup offset into A (``tid``: a register holding %tid.x; None: every
    warpgroup reads A from its first row, the ping-pong kernel's) and allocate the descriptor
    registers. Descriptors: 128-byte swizzle, 8-row groups 1 KiB apart; B k-major in 64-column
    panels BK rows long."""
    a, c = ctx.a, ctx.c
    kmaj = (1024 >> 4) << 32 | 1 << 62
    bconst = kmaj if c.trans_b else kmaj | (ctx.b_rows * 128 >> 4) << 16
    bstep = 2 if c.trans_b else 16 * 128 >> 4     # a k16 step: 32 bytes along a row, or 16 k rows
    wgoff = a.reg()
    if tid is None:
        a("mov.b64", wgoff, kmaj)
    else:
        a("shr.u64", wgoff, tid, 7)               # this warp's warpgroup: A rows 64 wg ..
        a("mul.i64", wgoff, wgoff, 64 * 128 >> 4)
        a("add.i64", wgoff, wgoff, kmaj)
    mn = f"wgmma.m64n{c.BN}k16.f32.{'f16' if c.dtype == 'fp16' else 'bf16'}"
    return _WgDesc(wgoff, a.reg(), a.reg(), bconst, bstep, mn)


def _wgmma_k_tile(ctx: _MmaCtx, d: _WgDesc, base16: Reg) -> None:
    """Emit one k tile's wgmma from the stage at ``base16`` (its scratchpad offset / 16), one group."""
    a, c = ctx.a, ctx.c
    a("add.i64", d.dA, base16, d.wgoff)
    a("add.i64", d.dB, base16, (ctx.B_OFF >> 4) + d.bconst)
    a("wgmma.fence")
    for s_ in range(ctx.NSTEP):
        a(d.mn, ctx.acc, d.dA, d.dB, 0 if c.trans_b else 2)
        if s_ + 1 < ctx.NSTEP:
            a("add.i64", d.dA, d.dA, 2)
            a("add.i64", d.dB, d.dB, d.bstep)
    a("wgmma.commit_group")


def _wgmma_loop(ctx: _MmaCtx) -> None:
    """The copy pipeline and main loop of the wgmma kernel (see _emit_wgmma)."""
    a, c, S, SB = ctx.a, ctx.c, ctx.S, ctx.SB
    d = S - 2                                     # k tiles copied ahead
    _copy_prologue(ctx, d)
    pm = ctx.pm
    ctx.rs, ctx.ws, ctx.kt = rs, ws, kt = a.reg(), a.reg(), a.reg()
    a("mov.b64", rs, 0)
    a("mov.b64", ws, d * SB)
    a("mov.b64", kt, 0)
    tmp = a.reg()
    a("s2r", tmp, "%tid.x")
    desc = _wg_descriptors(ctx, tmp)
    a.label("KLOOP")
    a("cp.async.wait", d - 1)                     # tile kt landed (this thread) ...
    a("bar.sync")                                 # ... for everyone
    a("shr.u64", tmp, rs, 4)
    _wgmma_k_tile(ctx, desc, tmp)
    # tile kt-1's wgmma are done (this warp); every warp's tile kt-2 was done before the barrier,
    # so its stage takes tile kt+d
    a("wgmma.wait_group", 1)
    a("add.i64", tmp, kt, d)
    a("setp.lt.i64", pm, tmp, ctx.nt)
    base = _stage_bases(ctx, ws)
    for op in (ctx.A, *ctx.Bops):
        for f in _copy_ops(a, op, base, pm):
            f()
    for r in base.values():
        a.free(r)
    a("cp.async.commit")
    _mma_advance(ctx)
    for r in (rs, ws):                            # the next stage, round the ring
        a("add.i64", r, r, SB)
        a("setp.ge.i64", pm, r, S * SB)
        a("mov.b64", r, 0, p=pm)
    a("add.i64", kt, kt, 1)
    a("setp.lt.i64", pm, kt, ctx.nt)
    a("bra", "KLOOP", p=pm)
    a("wgmma.wait_group", 0)
    a.free(desc.wgoff, tmp, desc.dA, desc.dB)


def _emit_wgmma(c: _Cfg) -> Program:
    """The warpgroup-MMA kernel (machines with wgmma; fp16 / bf16, A row-major): BM / 64
    warpgroups, each computing a 64 x BN slab of the block tile with wgmma.m64nBNk16 from the
    shared-memory stages (descriptors, 128-byte swizzle: the stages' layout is the mma kernel's,
    B k-major in 64-column panels), accumulators in registers (BN / 2 a thread). The stages are
    filled by cp.async from every thread, S - 2 k tiles ahead: after a k tile's wgmma are
    committed, wait_group 1 leaves them running while the stage of tile kt - 2, which every warp
    finished before the barrier, takes tile kt + S - 2 (a CUTLASS 3 cp.async mainloop without
    warp specialization). The epilogue is the mma kernel's (each warp's 16 x BN slice in the
    mma C layout)."""
    ctx = _MmaCtx(c)
    if ctx.S * ctx.SB > 1 << 18:
        raise OutOfRegisters(f"{ctx.S * ctx.SB} B of stages beyond a descriptor's 256 KiB reach")
    a = ctx.a
    ctx.acc = a.reg(c.BN // 2)
    for i in range(c.BN // 2):
        a("mov.f32", ctx.acc + i, 0.0)
    _mma_operands(ctx)
    _wgmma_loop(ctx)
    _mma_release(ctx)
    _epilogue(a, c, ctx.pm, ctx.acc, ctx.MI, ctx.NI, ctx.WTM, ctx.WTN, ctx.osz, ctx.accr, ctx.S * ctx.SB)
    return a.build()


# ----------------------------------------------------------------------------- TMA + warpgroup MMA kernel
# the tensor maps of A and B, and of C where its stores are bulk tensor stores (GemmKernel.args builds them)
TMA_PARAMS = PARAMS + ("mapA", "mapB")


def _tma_boxes(c: _Cfg) -> list:
    """(map, stage offset, column offset, k offset) of each bulk copy of a k tile: A as one BM x 64
    box; B^T as one BN x 64 box; B k-major as BN / 64 boxes of 64 rows of k x 64 columns (the
    wgmma kernel's panels). On clusters of two each B box is split in two halves (B^T: BN / 2
    rows; B: 32 rows of k), the pair's two producers copying one each (_emit_wgmma_tma)."""
    ctx_a = c.BM * 128
    if c.trans_b:
        h = c.BN // c.cluster
        return [("A", 0, None, 0)] + [("B", ctx_a + j * h * 128, j * h, 0) for j in range(c.cluster)]
    h = 64 // c.cluster
    return [("A", 0, None, 0)] + [("B", ctx_a + j * 64 * 128 + i * h * 128, 64 * j, i * h)
                                  for j in range(c.BN // 64) for i in range(c.cluster)]


def _tensor_maps(M, N, K, dtype, trans_b, BM, BN, lda, ldb, batch, sa, sb, cluster=1) -> tuple:
    """The TMA kernel's tensor maps of A and B: 4-d (k or n, rows, head, batch), 128-byte swizzle
    (B's boxes split in ``cluster`` parts, _tma_boxes)."""
    es = _ELEM_BYTES[dtype]
    nb, nh = batch

    def strides(ld, s):      # (a dimension of one matrix is never stepped: any positive multiple of 16)
        return [ld * es, s[1] * es if nh > 1 else 16, s[0] * es if nb > 1 else 16]

    mA = TensorMap("A", tensor_map_words([K, M, nh, nb], es, [64, BM, 1, 1], 128, strides(lda, sa)))
    if trans_b:
        mB = TensorMap("B", tensor_map_words([K, N, nh, nb], es, [64, BN // cluster, 1, 1], 128, strides(ldb, sb)))
    else:
        mB = TensorMap("B", tensor_map_words([N, K, nh, nb], es, [64, 64 // cluster, 1, 1], 128, strides(ldb, sb)))
    return mA, mB


def _c_map(M, N, out, BM, ldc, batch, sc) -> TensorMap:
    """The TMA kernel's tensor map of C for its bulk tensor stores: 4-d (n, m, head, batch), boxes
    of BM rows x 128 bytes, 128-byte swizzle (_tma_c_epilogue)."""
    osz = OUT_BYTES[out]
    nb, nh = batch
    st = [ldc * osz, sc[1] * osz if nh > 1 else 16, sc[0] * osz if nb > 1 else 16]
    return TensorMap("C", tensor_map_words([N, M, nh, nb], osz, [128 // osz, BM, 1, 1], 128, st))


def c_store_fits(N, out, ldc, batch, sc) -> bool:
    """Can bulk tensor stores write C (rows and batch strides multiples of 16 bytes, a row at least
    a 128-byte box wide)? The tile's rows fit M wherever the TMA kernel's A boxes do."""
    osz = OUT_BYTES[out]
    nb, nh = batch
    steps = [ldc * osz] + [s * osz for s, n in ((sc[1], nh), (sc[0], nb)) if n > 1]
    return N * osz >= 128 and all(s > 0 and s % 16 == 0 for s in steps)


def tma_fits(M, N, K, dtype, trans_b, BM, BN, lda, ldb, batch, sa, sb) -> bool:
    """Can the TMA kernel's boxes (tile BM x BN) describe this layout? Every stride a positive
    multiple of 16 bytes (a head or batch stride of 0 is not), and no box larger than its matrix
    (isa/README.md's tensor-map rules)."""
    es = _ELEM_BYTES[dtype]
    nb, nh = batch
    steps = [lda * es, ldb * es] + [s[i] * es for s in (sa, sb) for i, n in ((1, nh), (0, nb)) if n > 1]
    if any(s <= 0 or s % 16 for s in steps):
        return False
    return K >= 64 and M >= BM and (N >= BN if trans_b else N >= 64)


def tma_tile_bytes(c: _Cfg) -> int:
    """Bytes a k tile's copies bring (A's BM and B's BN rows of 128 bytes)."""
    return (c.BM + c.BN) * 128


def _emit_wgmma_tma(c: _Cfg) -> Program:
    """The warpgroup-MMA kernel fed by the tensor memory accelerator, warp specialized as CUTLASS 3's
    TMA kernels are (machines with wgmma and tma; fp16 / bf16, A row-major): BM / 64 consumer
    warpgroups compute the tile as the wgmma kernel's do, and one producer warp (the block's last)
    fills S stages with cp.async.bulk.tensor, each stage's copies completing on its "full"
    mbarrier (arrive.expect_tx of the tile's bytes); a consumer warp waits on it, runs the tile's
    four wgmma, and once wait_group 1 says the previous tile's are done arrives on that tile's
    "empty" barrier (one arrival a consumer warp), which the producer waits on before it reuses
    the stage. The boxes land 128-byte swizzled, the layout the descriptors name; elements outside
    the matrices (the K residue, a first k tile reaching below k = 0; edge rows) arrive as zeros
    from the TMA unit. The epilogue is _tma_c_epilogue's bulk tensor stores where C's layout takes
    them (c.c_tma), else the wgmma kernel's; the producer passes its barriers.

    On clusters of two (c.cluster, CUTLASS's 2 x 1 cluster): the blocks of a cluster hold a pair
    of M tiles in one tile column (_cluster_tile_origin) and share B: each producer copies its own
    A box and one half of each B box (_tma_boxes), multicast into both blocks' stages, so L2 serves B once for two
    tiles. A stage is free for a producer only when the consumers of both blocks are done with it:
    each consumer warp arrives on its own block's empty barrier and, remotely, on the peer's
    (mbarrier.arrive.remote), so empty barriers expect twice the consumer warps. The barriers are
    set up before a barrier.cluster; at the end a consumer also frees its last stage and the
    producer waits until every stage is free, so no block exits while its peer may still arrive
    on its barriers (CUTLASS's producer tail)."""
    ctx = _MmaCtx(c)
    S, SB, T = ctx.S, ctx.SB, ctx.T
    K2 = c.cluster
    full, empty = S * SB, S * SB + 8 * S           # the barriers, after the stages
    a = ctx.a = Asm(ctx.a.b.name + ("_tma" if K2 == 1 else f"_tma_c{K2}"),
                    TMA_PARAMS + (("mapC",) if c.c_tma else ()), S * SB + 16 * S)
    ctx.acc = a.reg(c.BN // 2)
    for i in range(c.BN // 2):
        a("mov.f32", ctx.acc + i, 0.0)
    tid, nt, kt, si, ph, t = a.reg(), a.reg(), a.reg(), a.reg(), a.reg(), a.reg()
    p, pw = a.pred(), a.pred()
    a("s2r", tid, "%tid.x")
    a("ldparam", t, "K")
    a("add.i64", nt, t, 63)
    a("shr.u64", nt, nt, 6)                        # k tiles of 64
    # warp 0 sets the barriers up: full[s] takes the producer's one arrival (and the bytes), empty[s]
    # one arrival from each consumer warp (of both blocks on a cluster of two)
    a("setp.lt.i64", p, tid, 32)
    cnt = a.reg()
    for s in range(S):
        a("mov.b64", cnt, 1)
        a("mbarrier.init", Mem(None, full + 8 * s), cnt, p=p)
        a("mov.b64", cnt, K2 * T // 32)
        a("mbarrier.init", Mem(None, empty + 8 * s), cnt, p=p)
    a.free(cnt)
    a("barrier.cluster" if K2 > 1 else "bar.sync")
    a("mov.b64", kt, 0)
    a("mov.b64", si, 0)                            # the stage, and the phase of its barriers
    a("mov.b64", ph, 0)
    a("setp.ge.i64", p, tid, T)
    a("bra", "PRODUCER", p=p)
    # -- consumers
    desc = _wg_descriptors(ctx, tid)
    bar, prev = a.reg(), a.reg()
    peer = a.reg() if K2 > 1 else None
    if K2 > 1:
        a("s2r", peer, "%cluster_ctarank")
        a("xor.b64", peer, peer, 1)
    a("mov.b64", prev, 0)
    _consumer_k_loop(a, lambda base16: _wgmma_k_tile(ctx, desc, base16), (bar, prev, t, p, pw), (si, ph, kt, nt),
                     S, SB, (full, empty), peer)
    a("wgmma.wait_group", 0)
    if K2 > 1:                                     # the last tile's stage, for the producers' tails
        a("mbarrier.arrive", Mem(prev, empty))
        a("mbarrier.arrive.remote", Mem(prev, empty), peer)
        a.free(peer)
    a.free(desc.wgoff, desc.dA, desc.dB, bar, prev)   # (the producer's path below still reads nt, kt, si, ph)
    if c.c_tma:
        _tma_c_epilogue(ctx)
    else:
        pm = a.pred()
        _epilogue(a, c, pm, ctx.acc, ctx.MI, ctx.NI, ctx.WTM, ctx.WTN, ctx.osz, ctx.accr, S * SB)
    # -- the producer warp: its registers are the consumers' (the same program); it writes no C
    a.label("PRODUCER")
    m0, n0, kc, eph, bytes_, mA, mB, sb = (a.reg() for _ in range(8))
    _tile_origin(a, c, m0, n0)
    a("ldparam", t, "K")
    a("shl.b64", kc, nt, 6)
    a("sub.i64", kc, t, kc)                        # K - 64 nt <= 0: tile 0 starts below k = 0
    zb, zh = batch_index(a)
    a("ldparam", mA, "mapA")
    a("ldparam", mB, "mapB")
    a("mov.b64", bytes_, tma_tile_bytes(c))
    # coordinates (dimension 0 first): A (k, m0, head, batch); B^T (k, n0, ...); B (n0 + 64 j, k, ...)
    ca, cb = a.reg(4), a.reg(4 + (K2 > 1))         # (a multicast's mask after B's coordinates)
    a("mov.b64", ca + 1, m0)
    a("mov.b64", ca + 2, zh)
    a("mov.b64", ca + 3, zb)
    a("mov.b64", cb + 2, zh)
    a("mov.b64", cb + 3, zb)
    if c.trans_b and K2 == 1:
        a("mov.b64", cb + 1, n0)
    pr = _multicast_rank(a, c, cb, t)
    a.free(zb, zh)
    a.label("PLOOP")
    _fill_stage(a, c, (t, sb, eph, p), (si, ph, kt), S, SB, (full, empty), bytes_, (mA, mB), (ca, cb), kc, n0, pr)
    a("add.i64", kc, kc, 64)
    next_stage(a, si, ph, kt, S, p)
    a("setp.lt.i64", p, kt, nt)
    a("bra", "PLOOP", p=p)
    if K2 > 1:                                     # the tail: every stage freed by both blocks' consumers
        a("add.i64", kc, nt, S)
        a.label("PTAIL")
        _empty_wait(a, t, eph, p, si, ph, kt, S, empty)
        next_stage(a, si, ph, kt, S, p)
        a("setp.lt.i64", p, kt, kc)
        a("bra", "PTAIL", p=p)
    if c.c_tma or c.BM * (c.BN * ctx.osz + (16 if ctx.osz == 2 else 32)) <= S * SB:
        a("bar.sync")                              # the epilogue's two barriers (_staged_store, _tma_c_epilogue)
        a("bar.sync")
    a("exit")
    return a.build()


def _consumer_k_loop(a: Asm, k_tile, tmp: tuple, ring: tuple, S: int, SB: int, bars: tuple,
                     peer: Optional[Reg]) -> None:
    """The TMA kernels' consumer loop over k tiles kt < nt: wait until tile kt's stage landed (its
    full barrier), issue its wgmma (``k_tile(base16)``, the stage's offset / 16), and once wait_group
    1 says tile kt-1's are done free that stage (its empty barrier; on clusters of two also the
    peer's, a remote arrival to rank ``peer``). tmp: bar, prev (the last stage's barrier offset
    after the loop), t, p, pw; ring: si, ph, kt, nt; bars: full, empty offsets."""
    bar, prev, t, p, pw = tmp
    si, ph, kt, nt = ring
    full, empty = bars
    a.label("KLOOP")
    a("shl.b64", bar, si, 3)
    a("mbarrier.wait", Mem(bar, full), ph)         # tile kt landed
    a("mul.i64", t, si, SB >> 4)
    k_tile(t)
    a("wgmma.wait_group", 1)                       # tile kt-1's wgmma are done: its stage is free
    a("setp.gt.i64", pw, kt, 0)
    a("mbarrier.arrive", Mem(prev, empty), p=pw)
    if peer is not None:
        a("mbarrier.arrive.remote", Mem(prev, empty), peer, p=pw)
    a("mov.b64", prev, bar)
    next_stage(a, si, ph, kt, S, p)
    a("setp.lt.i64", p, kt, nt)
    a("bra", "KLOOP", p=p)


def _multicast_rank(a: Asm, c: _Cfg, cb: Reg, t: Reg) -> Optional[Pred]:
    """On clusters of two: B's multicast mask (both blocks) after its coordinates at cb, and a
    predicate that is true on rank 0, which copies B's even boxes (rank 1 its odd ones); None on
    single blocks. t: scratch."""
    if c.cluster == 1:
        return None
    a("mov.b64", cb + 4, (1 << c.cluster) - 1)
    pr = a.pred()
    a("s2r", t, "%cluster_ctarank")
    a("setp.eq.i64", pr, t, 0)
    return pr


def _empty_wait(a: Asm, t: Reg, eph: Reg, p: Pred, si: Reg, ph: Reg, count: Reg, S: int, empty: int) -> None:
    """A producer's wait until stage si is free: its empty barrier's phase of one round ago, once
    ``count`` (the k tiles issued so far) has gone round the S stages; leaves t = si * 8."""
    a("shl.b64", t, si, 3)
    a("setp.ge.i64", p, count, S)                  # the stage's previous tile must be consumed:
    a("xor.b64", eph, ph, 1)                       # the empty barrier's phase of one round ago
    a("mbarrier.wait", Mem(t, empty), eph, p=p)


def _fill_stage(a: Asm, c: _Cfg, tmp: tuple, ring: tuple, S: int, SB: int, bars: tuple, bytes_: Reg, maps: tuple,
                coords: tuple, kc: Reg, n0: Reg, pr: Optional[Pred]) -> None:
    """A TMA producer's k tile at kc: wait for the stage (ring: si, ph and the k tiles issued), expect
    the tile's bytes on its full barrier, and copy A's box and B's (_tma_boxes; on clusters of two
    this block's halves, multicast: ``pr`` says rank 0). tmp: t, sb, eph, p; bars: full, empty
    offsets; maps: mA, mB; coords: A's and B's coordinate registers (A's m0 and both batch
    coordinates set; B^T's n0 too on single blocks)."""
    t, sb, eph, p = tmp
    si, ph, count = ring
    full, empty = bars
    mA, mB = maps
    ca, cb = coords
    K2 = c.cluster
    _empty_wait(a, t, eph, p, si, ph, count, S, empty)
    a("mbarrier.arrive.expect_tx", Mem(t, full), bytes_)
    a("mul.i64", sb, si, SB)
    a("mov.b64", ca, kc)      # (A's box: BM rows of 64 k at (k, m0); B's at _tma_boxes' coordinates)
    a("cp.async.bulk.tensor.4d", Mem(sb, 0), Mem(t, full), mA, ca)
    for j, (_, off, col, kr) in enumerate(_tma_boxes(c)[1:]):
        if c.trans_b:
            a("mov.b64", cb, kc)
            if K2 > 1:
                a("add.i64", cb + 1, n0, col)
        else:
            a("add.i64", cb, n0, col)
            if kr:
                a("add.i64", cb + 1, kc, kr)
            else:
                a("mov.b64", cb + 1, kc)
        if K2 > 1:
            a("cp.async.bulk.tensor.4d.multicast", Mem(sb, off), Mem(t, full), mB, cb, p=pr, neg=j % 2 == 1)
        else:
            a("cp.async.bulk.tensor.4d", Mem(sb, off), Mem(t, full), mB, cb)


def _tma_c_epilogue(ctx: "_MmaCtx") -> None:
    """The TMA kernel's epilogue by bulk tensor stores, as CUTLASS 3's TMA epilogue: once every
    warp is past the main loop (a barrier; the producer passes it too) the consumers write their
    accumulators (converted to C's type) into the free stages as boxes of BM rows x 128 bytes, laid
    out as a bulk copy lands them (128-byte swizzle: a row's 16-byte chunk q at q ^ (row % 8), so a
    warp's 8 rows x 16 bytes fall on 32 distinct banks); after a second barrier warp 0 stores the
    BN x osz / 128 boxes to C through the map mapC (elements outside C are not written, so edge
    tiles need no bounds logic), commits them and waits until their sources are read."""
    a, c = ctx.a, ctx.c
    acc, NI, osz = ctx.acc, ctx.NI, ctx.osz
    if c.alpha != 1.0:
        for i in range(NI * 4):
            a("mul.f32", acc + i, acc + i, c.alpha)
    cols = 128 // osz                              # C's elements a box row
    nq = 8 if osz == 2 else 4                      # the accumulator pairs of a box row (the chunks a lane writes)
    tid, g, t, rowb, tmp = a.reg(), a.reg(), a.reg(), a.reg(), a.reg()
    a("s2r", tid, "%tid.x")
    a("bar.sync")                                  # every consumer's wgmma are done with the stages
    a("and.b64", g, tid, 31)
    a("shr.u64", g, g, 2)                          # lane / 4: rows g and g + 8 of the warp's 16
    a("and.b64", t, tid, 3)
    a("shr.u64", rowb, tid, 5)
    a("shl.b64", rowb, rowb, 4)
    a("add.i64", rowb, rowb, g)
    a("shl.b64", rowb, rowb, 7)                    # the row's first byte in a box
    sw = box_chunks(a, g, t, rowb, tmp, osz)
    cvt = CVT_PACK.get(c.out)
    for ni in range(NI):
        q, j = ni % nq, ni // nq
        box_write(a, ctx.accr(0, ni), sw + q, j * c.BM * 128, cvt, tmp)
    a("bar.sync")                                  # the tile is in the scratchpad
    p = a.pred()
    a("setp.ge.i64", p, tid, 32)
    a("exit", p=p)
    a.free(g, t, rowb, tmp, sw)
    m0, n0, mC = a.reg(), a.reg(), a.reg()
    _tile_origin(a, c, m0, n0)
    zb, zh = batch_index(a)
    cc = a.reg(4)
    a("mov.b64", cc + 1, m0)
    a("mov.b64", cc + 2, zh)
    a("mov.b64", cc + 3, zb)
    a("ldparam", mC, "mapC")
    for j in range(c.BN // cols):
        a("add.i64", cc, n0, j * cols)
        a("cp.async.bulk.tensor.4d.store", Mem(None, j * c.BM * 128), mC, cc)
    a("cp.async.bulk.commit_group")
    a("cp.async.bulk.wait_group", 0)
    a("exit")


# ----------------------------------------------------------------------------- persistent ping-pong kernel
PP_THREADS = 2 * 128 + 32      # two consumer warpgroups and the producer warp
PP_STAGES = (8, 7, 6, 5, 4, 3, 2)
PP_C_BOX_ROWS = 16             # the bulk-store epilogue's boxes: a consumer warp's rows of a wgmma half
PP_EPI_WARP_BYTES = 2 * PP_C_BOX_ROWS * 128    # two box buffers a consumer warp
PP_EPI_BYTES = 8 * PP_EPI_WARP_BYTES


def _pp_advance(a: Asm, si: Reg, ph: Reg, n: Reg, S: int, t: Reg, q: Reg, p: Optional[Pred] = None) -> None:
    """si, ph moved on by n stages round the ring of S (ph flips at each wrap)."""
    a("add.i64", t, si, n, p=p)
    a("div.i64", q, t, S, p=p)
    a("rem.i64", si, t, S, p=p)
    a("and.b64", q, q, 1, p=p)
    a("xor.b64", ph, ph, q, p=p)


def _tile_counts(a: Asm, c: "_Cfg", R: Reg, Q: Reg) -> None:
    """R, Q = the C tiles along M and along N (from the parameters)."""
    a("ldparam", R, "M")
    a("add.i64", R, R, c.BM - 1)
    a("shr.u64", R, R, log2(c.BM))
    a("ldparam", Q, "N")
    a("add.i64", Q, Q, c.BN - 1)
    a("shr.u64", Q, Q, log2(c.BN))


def _pp_origin(a: Asm, c: "_Cfg", b: Reg, m0: Reg, n0: Reg) -> None:
    """m0, n0 of the persistent kernel's tile of linear index b (kept), in _tile_origin's raster;
    on clusters of two, b indexes pairs of M tiles as _cluster_tile_origin's clusters do."""
    if c.cluster > 1:
        _cluster_tile_origin(a, c, m0, n0, b)
        return
    bb, R, Q, t = a.reg(), a.reg(), a.reg(), a.reg()
    a("mov.b64", bb, b)
    _tile_counts(a, c, R, Q)
    _raster_origin(a, c, bb, R, Q, t, m0, n0)


def _pp_k_tile(ctx: "_MmaCtx", d: _WgDesc, dA2: Optional[Reg], base16: Reg) -> None:
    """One k tile's wgmma of a ping-pong warpgroup from the stage at ``base16`` (/ 16): the
    warpgroup computes all BM rows, as BM / 64 wgmma a k16 step (A's rows 64 h .. at 8 KiB h into
    the stage, accumulators acc + h BN / 2), one group."""
    a, c = ctx.a, ctx.c
    a("add.i64", d.dA, base16, d.wgoff)
    if dA2 is not None:
        a("add.i64", dA2, d.dA, 64 * 128 >> 4)
    a("add.i64", d.dB, base16, (ctx.B_OFF >> 4) + d.bconst)
    a("wgmma.fence")
    for s_ in range(ctx.NSTEP):
        for h, dA in enumerate((d.dA,) if dA2 is None else (d.dA, dA2)):
            a(d.mn, ctx.acc + h * (c.BN // 2), dA, d.dB, 0 if c.trans_b else 2)
        if s_ + 1 < ctx.NSTEP:
            for dA in (d.dA,) if dA2 is None else (d.dA, dA2):
                a("add.i64", dA, dA, 2)
            a("add.i64", d.dB, d.dB, d.bstep)
    a("wgmma.commit_group")


def _emit_wgmma_pingpong(c: _Cfg) -> Program:
    """The persistent ping-pong kernel (``kernel="tma_pingpong"``; machines with wgmma and tma), as
    CUTLASS 3's KernelTmaWarpSpecializedPingpong: a block stays on its SM and takes C tiles
    ctaid.x, ctaid.x + nctaid.x, ... (in _tile_origin's grouped raster); one producer warp fills
    S stages with the TMA kernel's boxes tile after tile, the ring running on across tiles; two
    consumer warpgroups take alternate tiles, each computing a whole BM x BN tile (BM / 64 wgmma a
    k16 step, BM x BN / 128 accumulators a thread). The warpgroups take turns at the tensor units:
    a warpgroup starts a tile's main loop only once the other has issued its previous tile's last
    wgmma (an mbarrier a warpgroup, the other's four warps arriving on it: the ISA has no named
    barriers), so one warpgroup's epilogue (_pp_store_epilogue's bulk stores through each warp's
    own buffers after the stages, which stay busy with the other's tiles, or the wgmma kernel's
    stores from registers) runs beside the other's main loop. A stage's empty barrier
    counts the four warps of the warpgroup that consumes it; each warpgroup skips the other's
    k tiles round the ring (nt stages a tile).

    On clusters of two (``kernel="tma_pingpong_multicast"``, as CUTLASS's 2 x 1 clusters): the
    cluster's two blocks take the two M tiles of a pair (the multicast
    kernel's pairs, _cluster_tile_origin), pair after pair in step, and share B as that kernel
    does (each producer multicasts one half of each B box into both blocks; a consumer warp frees
    a stage in both blocks, so empty barriers count eight warps; each producer ends with the
    multicast kernel's tail)."""
    ctx = _MmaCtx(c)
    S, SB, H, K2 = ctx.S, ctx.SB, c.BM // 64, c.cluster
    E = PP_EPI_BYTES if c.c_tma else 0             # the bulk-store epilogue's buffers, after the stages
    assert (S * SB) % 1024 == 0                    # (their boxes' 128-byte swizzle runs on 1 KiB-aligned addresses)
    full, empty, turn = S * SB + E, S * SB + E + 8 * S, S * SB + E + 16 * S
    a = ctx.a = Asm(ctx.a.b.name + ("_pingpong" if K2 == 1 else f"_pingpong_c{K2}"),
                    TMA_PARAMS + (("mapC",) if c.c_tma else ()), S * SB + E + 16 * S + 16)
    ctx.acc = a.reg(H * c.BN // 2)
    tid, nt, si, ph, t, b, tiles, step = (a.reg() for _ in range(8))
    p, pw = a.pred(), a.pred()
    a("s2r", tid, "%tid.x")
    a("ldparam", t, "K")
    a("add.i64", nt, t, 63)
    a("shr.u64", nt, nt, 6)                        # k tiles of 64 a C tile
    _tile_counts(a, c, tiles, t)
    if K2 > 1:                                     # pairs of M tiles
        a("add.i64", tiles, tiles, 1)
        a("shr.u64", tiles, tiles, 1)
    a("mul.i64", tiles, tiles, t)
    # warp 0 sets the barriers up: full[s] the producer's arrival (and the bytes), empty[s] the four
    # warps of the consuming warpgroup, turn[g] the four warps of the other warpgroup
    a("setp.lt.i64", p, tid, 32)
    for s_ in range(S):
        a("mov.b64", t, 1)
        a("mbarrier.init", Mem(None, full + 8 * s_), t, p=p)
        a("mov.b64", t, 4 * K2)
        a("mbarrier.init", Mem(None, empty + 8 * s_), t, p=p)
    a("mov.b64", t, 4)
    for g in range(2):
        a("mbarrier.init", Mem(None, turn + 8 * g), t, p=p)
    a("barrier.cluster" if K2 > 1 else "bar.sync")
    a("s2r", b, "%ctaid.x")                        # this block's first tile, and the step between tiles
    a("s2r", step, "%nctaid.x")
    if K2 > 1:                                     # (of pairs, by cluster)
        a("shr.u64", b, b, 1)
        a("shr.u64", step, step, 1)
    a("mov.b64", si, 0)
    a("mov.b64", ph, 0)
    a("setp.ge.i64", p, tid, 256)
    a("bra", "PRODUCER", p=p)
    # -- consumers: warpgroup g takes the block's tiles g, g + 2, ..., its first k tile nt g stages on
    g, q, tw, to, need, tph, kt, bar, prev = (a.reg() for _ in range(9))
    a("shr.u64", g, tid, 7)
    a("setp.ne.i64", pw, g, 0)
    _pp_advance(a, si, ph, nt, S, t, q, pw)
    a("add.i64", b, b, step, p=pw)
    a("shl.b64", step, step, 1)
    a("mul.i64", tw, g, 8)
    a("add.i64", tw, tw, turn)                     # this warpgroup's turn barrier
    a("mov.b64", to, 2 * turn + 8)
    a("sub.i64", to, to, tw)                       # the other's
    a("mov.b64", need, g)                          # warpgroup 0's first tile waits for no turn
    a("mov.b64", tph, 0)
    a("mov.b64", prev, 0)
    peer = a.reg() if K2 > 1 else None
    if K2 > 1:
        a("s2r", peer, "%cluster_ctarank")
        a("xor.b64", peer, peer, 1)
    a("setp.ge.i64", p, b, tiles)
    a("bra", "CDONE", p=p)
    desc = _wg_descriptors(ctx, None)              # every warpgroup reads all BM rows of A
    dA2 = a.reg() if H > 1 else None
    a.label("TILE")
    for i in range(H * c.BN // 2):
        a("mov.f32", ctx.acc + i, 0.0)
    a("setp.ne.i64", p, need, 0)
    a("mbarrier.wait", Mem(tw, 0), tph, p=p)       # the other warpgroup's main loop is issued
    a("xor.b64", tph, tph, 1, p=p)
    a("mov.b64", need, 1)
    a("mov.b64", kt, 0)
    _consumer_k_loop(a, lambda base16: _pp_k_tile(ctx, desc, dA2, base16), (bar, prev, t, p, pw), (si, ph, kt, nt),
                     S, SB, (full, empty), peer)
    if c.pp_overlap:
        a("mbarrier.arrive", Mem(to, 0))           # the other warpgroup's turn at the tensor units
    a("wgmma.wait_group", 0)
    a("mbarrier.arrive", Mem(prev, empty))
    if K2 > 1:
        a("mbarrier.arrive.remote", Mem(prev, empty), peer)
    _pp_advance(a, si, ph, nt, S, t, q)            # past the other warpgroup's tile
    m0, n0 = a.reg(), a.reg()
    _pp_origin(a, c, b, m0, n0)
    if c.c_tma:
        _pp_store_epilogue(ctx, m0, n0, S * SB, "NEXT")
    else:
        _epilogue(a, c, a.pred(), ctx.acc, ctx.MI, ctx.NI, 16, ctx.WTN, ctx.osz, ctx.accr, 0, origin=(m0, n0),
                  end="NEXT", mi_rows=64, wg_warps=4)
    a.label("NEXT")
    if not c.pp_overlap:
        a("mbarrier.arrive", Mem(to, 0))
    a("add.i64", b, b, step)
    a("setp.lt.i64", p, b, tiles)
    a("bra", "TILE", p=p)
    a.label("CDONE")
    if c.c_tma:
        a("cp.async.bulk.wait_group", 0)           # the last boxes' sources read
    a("exit")
    a.free(g, q, tw, to, need, tph, kt, bar, prev, desc.wgoff, desc.dA, desc.dB, m0, n0,
           *(r for r in (dA2, peer) if r is not None))
    # -- the producer warp: the stages tile after tile
    a.label("PRODUCER")
    kt, kc, eph, bytes_, mA, mB, sb, fill, m0, n0 = (a.reg() for _ in range(10))
    zb, zh = batch_index(a)
    a("ldparam", mA, "mapA")
    a("ldparam", mB, "mapB")
    a("mov.b64", bytes_, tma_tile_bytes(c))
    a("mov.b64", fill, 0)                          # k tiles issued: the first S stages are free
    ca, cb = a.reg(4), a.reg(4 + (K2 > 1))         # (a multicast's mask after B's coordinates)
    for r in (ca, cb):
        a("mov.b64", r + 2, zh)
        a("mov.b64", r + 3, zb)
    a.free(zb, zh)
    pr = _multicast_rank(a, c, cb, t)
    a("setp.ge.i64", p, b, tiles)
    a("bra", "PDONE", p=p)
    a.label("PTILE")
    _pp_origin(a, c, b, m0, n0)
    a("mov.b64", ca + 1, m0)
    if c.trans_b and K2 == 1:
        a("mov.b64", cb + 1, n0)
    a("ldparam", t, "K")
    a("shl.b64", kc, nt, 6)
    a("sub.i64", kc, t, kc)                        # K - 64 nt <= 0: k tile 0 starts below k = 0
    a("mov.b64", kt, 0)
    a.label("PLOOP")
    _fill_stage(a, c, (t, sb, eph, p), (si, ph, fill), S, SB, (full, empty), bytes_, (mA, mB), (ca, cb), kc, n0,
                pr)
    a("add.i64", kc, kc, 64)
    a("add.i64", fill, fill, 1)
    next_stage(a, si, ph, kt, S, p)
    a("setp.lt.i64", p, kt, nt)
    a("bra", "PLOOP", p=p)
    a("add.i64", b, b, step)
    a("setp.lt.i64", p, b, tiles)
    a("bra", "PTILE", p=p)
    a.label("PDONE")
    if K2 > 1:                                     # the tail: every stage freed by both blocks' consumers
        a("mov.b64", kt, 0)
        a.label("PTAIL")
        _empty_wait(a, t, eph, p, si, ph, fill, S, empty)
        a("add.i64", fill, fill, 1)
        next_stage(a, si, ph, kt, S, p)
        a("setp.lt.i64", p, kt, S)
        a("bra", "PTAIL", p=p)
    a("exit")
    return a.build()


def box_chunks(a: Asm, g: Reg, t: Reg, rowb: Reg, tmp: Reg, osz: int) -> Reg:
    """The scratchpad offsets (rowb + ...) where lane (g, t) = (lane / 4, lane % 4) writes its
    accumulator pairs of the nq 16-byte chunks of a row of C in a box of 128-byte rows, 128-byte
    swizzled as a bulk copy lays it out (chunk q of row r at q ^ (r % 8), so a warp's 8 rows x 16
    bytes fall on 32 distinct banks): nq new registers, the pair of mma tile ni at sw + ni % nq."""
    nq = 8 if osz == 2 else 4
    sw = a.reg(nq)
    for q in range(nq):
        if osz == 2:                               # f16 / bf16: columns 8 ni + 2t at chunk ni % 8, byte 4t
            a("xor.b64", tmp, g, q)
            a("shl.b64", tmp, tmp, 4)
            a("mad.i64", sw + q, t, 4, tmp)
        else:                                      # f32: chunk 2 (ni % 4) + t / 2, byte 8 (t % 2)
            a("shr.u64", tmp, t, 1)
            a("add.i64", tmp, tmp, 2 * q)
            a("xor.b64", tmp, tmp, g)
            a("shl.b64", tmp, tmp, 4)
            a("and.b64", sw + q, t, 1)
            a("mad.i64", sw + q, sw + q, 8, tmp)
        a("add.i64", sw + q, sw + q, rowb)
    return sw


def box_write(a: Asm, r: Reg, at: Reg, off: int, cvt: Optional[str], tmp: Reg) -> None:
    """Write mma tile accumulators r..r+3 (rows g and g + 8) at their box offsets (box_chunks'
    ``at`` + off), converted by ``cvt`` (f16 / bf16 out) or as f32 pairs."""
    if cvt is not None:
        a(cvt, tmp, r, r + 1)
        a("st.shared.b32", Mem(at, off), tmp)
        a(cvt, tmp, r + 2, r + 3)
        a("st.shared.b32", Mem(at, off + 8 * 128), tmp)
    else:
        a("st.shared.v2.b32", Mem(at, off), r)
        a("st.shared.v2.b32", Mem(at, off + 8 * 128), r + 2)


def _pp_store_epilogue(ctx: "_MmaCtx", m0: Reg, n0: Reg, ebuf: int, end: str) -> None:
    """The ping-pong kernel's epilogue by bulk tensor stores (where C's layout takes them), as
    CUTLASS 3's TMA epilogue through its own scratchpad buffers (the stages are the other
    warpgroup's): each consumer warp stores its own rows, boxes of 16 rows x 128 bytes (a wgmma
    half's rows of the warp, one box column of C), through two 2 KiB buffers of its own at
    ``ebuf``: before writing a buffer it waits until the store that last read it is done reading
    (wait_group 1; the first box of a tile of an odd box count wait_group 0, the previous tile's
    last box having used the same buffer), then writes the box (box_chunks' swizzle) and stores
    it through mapC (edges: the unit writes nothing outside C). No warp waits for another."""
    a, c = ctx.a, ctx.c
    acc, NI, osz = ctx.acc, ctx.NI, ctx.osz
    H = c.BM // 64
    if c.alpha != 1.0:
        for i in range(H * NI * 4):
            a("mul.f32", acc + i, acc + i, c.alpha)
    cols, nq = 128 // osz, (8 if osz == 2 else 4)
    tid, g, t, wb, tmp, mC = (a.reg() for _ in range(6))
    a("s2r", tid, "%tid.x")
    a("and.b64", g, tid, 31)
    a("shr.u64", g, g, 2)
    a("and.b64", t, tid, 3)
    a("shl.b64", wb, g, 7)
    a("shr.u64", tmp, tid, 5)
    a("mad.i64", wb, tmp, PP_EPI_WARP_BYTES, wb)
    a("add.i64", wb, wb, ebuf)                     # row g of this warp's first buffer
    sw = box_chunks(a, g, t, wb, tmp, osz)
    cc = a.reg(4)
    zb, zh = batch_index(a)
    a("mov.b64", cc + 2, zh)
    a("mov.b64", cc + 3, zb)
    a.free(zb, zh)
    a("shr.u64", tmp, tid, 5)
    a("and.b64", tmp, tmp, 3)
    a("shl.b64", tmp, tmp, 4)
    a("add.i64", m0, m0, tmp)                      # the warp's first row
    a("shr.u64", wb, tid, 5)
    a("mul.i64", wb, wb, PP_EPI_WARP_BYTES)
    a("add.i64", wb, wb, ebuf)                     # the warp's first buffer
    a("ldparam", mC, "mapC")
    cvt = CVT_PACK.get(c.out)
    boxes = H * NI // nq
    for i in range(boxes):
        h, j = divmod(i, NI // nq)
        off = (i % 2) * 16 * 128
        # the store two boxes ago has read this buffer; an odd count a tile puts the previous tile's
        # last box in buffer 0 too, so the first box waits for every store
        a("cp.async.bulk.wait_group", 0 if i == 0 and boxes % 2 else 1)
        for ni in range(j * nq, (j + 1) * nq):
            box_write(a, ctx.accr(h, ni), sw + ni % nq, off, cvt, tmp)
        a("add.i64", cc, n0, j * cols)
        a("add.i64", cc + 1, m0, 64 * h)
        a("cp.async.bulk.tensor.4d.store", Mem(wb, off), mC, cc)
        a("cp.async.bulk.commit_group")
    a.free(tid, g, t, wb, tmp, mC, sw, cc)
    a("bra", end)


def next_stage(a: Asm, si: Reg, ph: Reg, kt: Reg, S: int, p: Pred) -> None:
    """kt += 1; the next stage round the ring, the barriers' phase flipping at each wrap."""
    a("add.i64", kt, kt, 1)
    a("add.i64", si, si, 1)
    a("setp.ge.i64", p, si, S)
    a("mov.b64", si, 0, p=p)
    a("xor.b64", ph, ph, 1, p=p)


def _aligned(a: Asm, dst: Reg, params: tuple, mask: int, tmp: Reg) -> None:
    """dst = (params...) & mask: zero when every named parameter (ldc, C's strides) is a multiple
    of mask + 1, so that vector stores of mask + 1 elements stay aligned in every row and matrix."""
    a("ldparam", dst, params[0])
    for name in params[1:]:
        a("ldparam", tmp, name)
        a("or.b64", dst, dst, tmp)
    a("and.b64", dst, dst, mask)


def _full_block(a: Asm, pf: Pred, pq: Pred, origin: tuple, size: tuple, shape: tuple, mask: int, t: Reg,
                t2: Reg) -> None:
    """Emit pf = this block's C tile lies inside C and ldc, C's strides are multiples of mask + 1."""
    # origin: m0, n0; size: BM, BN; shape: the registers holding M, N; pq, t, t2: scratch
    a("add.i64", t, origin[0], size[0])
    a("setp.le.i64", pf, t, shape[0])
    a("add.i64", t, origin[1], size[1])
    a("setp.le.i64", pq, t, shape[1])
    a("and.pred", pf, pf, pq)
    _aligned(a, t, ("ldc", "sc_b", "sc_h"), mask, t2)
    a("setp.eq.i64", pq, t, 0)
    a("and.pred", pf, pf, pq)


def _c_ptr(a: Asm, ptr: Reg, row: Reg, col: Reg, ldc: Reg, t: Reg, osz: int) -> None:
    """Emit ptr = &C[row, col] in this block's matrix, leaving ldc (elements) in `ldc` (t: scratch)."""
    z = batch_index(a)
    batch_ptr(a, ptr, "C", "sc_b", "sc_h", osz, z)
    a.free(*z)
    a("ldparam", ldc, "ldc")
    a("mad.i64", t, row, ldc, col)
    a("shl.b64", t, t, log2(osz))
    a("add.i64", ptr, ptr, t)


def _staged_store(a: Asm, c: _Cfg, acc: Reg, MI: int, NI: int, WTM: int, WTN: int, accr, cvt: Optional[str],
                  RS: int, tid: Reg, ldc: Reg, tmp: tuple, pf: Pred, p: Pred, origin: tuple) -> None:
    """The 16-byte store path (see _epilogue) for a full block (pf) whose ldc and C strides are
    multiples of 16 bytes; other blocks fall through (``origin``: the registers holding the tile's
    m0, n0). Every block passes the two barriers (the
    checker, like the hardware, wants them on every path): the shared-memory writes are guarded
    instead of branched around. f16 / bf16 (``cvt``): 4-byte fragment writes, rows padded by 16
    bytes (8 rows x 4 words on 32 banks: conflict free). f32 (``cvt`` None): 8-byte writes,
    which run in half-warp phases of 4 rows x 8 words, rows padded by 32 bytes (conflict free).
    The 16-byte reads are conflict free when a row has 8 or more chunks (BN >= 64 halves, >= 32
    floats), and take 2 wavefronts a phase for BN = 32 halves. Leaves tid and ldc as they were."""
    t1, t2, t3, t4, t5 = tmp
    osz = 4 if cvt is None else 2                      # bytes of a C element
    T = 32 * c.WM * c.WN
    CPR = c.BN * osz // 16                             # 16-byte chunks of a C row
    RPI = T // CPR                                     # rows the block stores per instruction
    _aligned(a, t1, ("ldc", "sc_b", "sc_h"), 16 // osz - 1, t2)
    a("setp.eq.i64", p, t1, 0)
    a("and.pred", p, p, pf)                            # full block, 16-byte aligned rows
    a("bar.sync")                                      # every warp is done with the k tiles' stages
    # the thread's fragment corner in the tile: row wm*WTM + lane/4, column wn*WTN + 2*(lane%4)
    a("shr.u64", t1, tid, 5)
    a("shr.u64", t1, t1, log2(c.WN))
    a("mul.i64", t1, t1, WTM)
    a("and.b64", t2, tid, 31)
    a("shr.u64", t2, t2, 2)
    a("add.i64", t1, t1, t2)
    a("mul.i64", t1, t1, RS)
    a("shr.u64", t2, tid, 5)
    a("and.b64", t2, t2, c.WN - 1)
    a("mul.i64", t2, t2, WTN)
    a("and.b64", t3, tid, 3)
    a("shl.b64", t3, t3, 1)
    a("add.i64", t2, t2, t3)
    a("shl.b64", t2, t2, log2(osz))
    a("add.i64", t1, t1, t2)                           # shared byte offset of the corner
    for q in range(2 * MI):
        mi, h = divmod(q, 2)
        for ni in range(NI):
            src = accr(mi, ni) + 2 * h
            at = Mem(t1, (16 * mi + 8 * h) * RS + 8 * osz * ni)
            if cvt is None:
                a("st.shared.v2.b32", at, src, p=p)
            else:
                w = t2 if ni % 2 == 0 else t3
                a(cvt, w, src, src + 1, p=p)
                a("st.shared.b32", at, w, p=p)
    a("bar.sync")
    a("bra", "VEC4", p=p, neg=True)
    # thread: chunk tid % CPR of rows tid / CPR + RPI*i; C tile at m0, n0 of this block's matrix
    a("shr.u64", t1, tid, log2(CPR))                   # first row
    a("and.b64", t2, tid, CPR - 1)                     # chunk
    a("shl.b64", t4, t2, log2(16 // osz))
    a("add.i64", t4, t4, origin[1])                    # column n0 + chunk * elements a chunk
    a("add.i64", t3, origin[0], t1)                    # row m0 + first row
    a("mad.i64", t4, t3, ldc, t4)
    z = batch_index(a)
    batch_ptr(a, t5, "C", "sc_b", "sc_h", osz, z)
    a.free(*z)
    a("shl.b64", t4, t4, log2(osz))
    a("add.i64", t5, t5, t4)                           # global address of the first chunk
    a("mul.i64", t1, t1, RS)
    a("shl.b64", t2, t2, 4)
    a("add.i64", t1, t1, t2)                           # its shared offset
    a("mul.i64", t4, ldc, osz * RPI)                   # RPI rows of C
    groups = min(4, MI * NI)                           # the accumulators are free: 4-register buffers
    for i in range(c.BM // RPI):
        buf = acc + 4 * (i % groups)
        a("ld.shared.v4.b32", buf, Mem(t1, i * RPI * RS))
        a("st.global.v4.b32", Mem(t5, 0), buf)
        if i + 1 < c.BM // RPI:
            a("add.i64", t5, t5, t4)
    a("exit")
    a.label("VEC4")


def _epilogue(a: Asm, c: _Cfg, pm: Pred, acc: Reg, MI: int, NI: int, WTM: int, WTN: int, osz: int, accr,
              smem: int, *, origin: Optional[tuple] = None, end: Optional[str] = None, mi_rows: int = 16,
              wg_warps: int = 0) -> None:
    """Store the accumulators: lane (g, t) holds rows g, g+8 and columns 2t, 2t+1 of each 16 x 8
    mma tile. Fast path (whole block inside C, ldc and C's strides even): 8-byte (f32) / 4-byte
    (f16x2) stores. With ldc and strides multiples of 16 bytes, the block's C tile is staged in
    shared memory (`smem` bytes are free after the main loop) and stored 16 bytes a lane, whole
    rows a warp, as CUTLASS's epilogue does: the 4-byte f16x2 stores write 16-byte pieces of
    32-byte sectors, which the L2 must fetch before it can merge them, and the 8-byte f32 stores
    of a warp touch 8 rows of C, one 32-byte sector each (8 write requests, against 4 whole lines
    for a 16-byte store).

    The persistent ping-pong kernel's form: ``origin`` the registers holding the tile's m0, n0;
    ``end`` a label to branch to instead of exiting; accumulator row tiles ``mi_rows`` rows apart
    (a warpgroup's wgmma halves: 64); the warp's place taken within its warpgroup of ``wg_warps``."""
    if c.alpha != 1.0:
        for i in range(MI * NI * 4):
            a("mul.f32", acc + i, acc + i, c.alpha)
    tid, t1, t2 = a.reg(), a.reg(), a.reg()
    Mr, Nr, ptr, row, col, step = a.reg(), a.reg(), a.reg(), a.reg(), a.reg(), a.reg()
    ldc = a.reg()
    t3, t4, t5 = a.reg(), a.reg(), a.reg()
    a("s2r", tid, "%tid.x")
    a("ldparam", Mr, "M")
    a("ldparam", Nr, "N")
    if origin is None:
        m0, n0 = a.reg(), a.reg()
        _tile_origin(a, c, m0, n0)
    else:
        m0, n0 = origin
    pf, pq = a.pred(), a.pred()
    # full block; ldc and C's strides even (2-column stores)
    _full_block(a, pf, pq, (m0, n0), (c.BM, c.BN), (Mr, Nr), 1, row, col)
    # row = m0 + wm*WTM + lane/4, col = n0 + wn*WTN + 2*(lane%4)
    a("shr.u64", row, tid, 5)
    if wg_warps:
        a("and.b64", row, row, wg_warps - 1)
    a("shr.u64", row, row, log2(c.WN))
    a("mul.i64", row, row, WTM)
    a("add.i64", row, row, m0)
    a("and.b64", t1, tid, 31)
    a("shr.u64", t1, t1, 2)
    a("add.i64", row, row, t1)
    a("shr.u64", col, tid, 5)
    a("and.b64", col, col, c.WN - 1)
    a("mul.i64", col, col, WTN)
    a("add.i64", col, col, n0)
    a("and.b64", t1, tid, 3)
    a("shl.b64", t1, t1, 1)
    a("add.i64", col, col, t1)
    _c_ptr(a, ptr, row, col, ldc, t1, osz)
    a("mul.i64", step, ldc, 8 * osz)                   # 8 rows of C
    step_mi = step
    if mi_rows != 16:                                  # from row tile mi's second 8 rows to mi + 1's first
        step_mi = a.reg()
        a("mul.i64", step_mi, ldc, (mi_rows - 8) * osz)
    cvt = CVT_PACK.get(c.out)
    RS = c.BN * osz + (16 if osz == 2 else 32)         # staged row: BN elements + padding (_staged_store)
    if c.BM * RS <= smem:
        _staged_store(a, c, acc, MI, NI, WTM, WTN, accr, cvt, RS, tid, ldc, (t1, t2, t3, t4, t5), pf, pq, (m0, n0))
    a("bra", "EDGE", p=pf, neg=True)
    # -- fast path
    cur = t2
    a("mov.b64", cur, ptr)
    for q in range(2 * MI):
        mi, h = divmod(q, 2)
        for ni in range(NI):
            src = accr(mi, ni) + 2 * h
            if cvt is None:
                a("st.global.v2.b32", Mem(cur, 8 * ni * 4), src)
            else:
                a(cvt, t1, src, src + 1)
                a("st.global.b32", Mem(cur, 8 * ni * 2), t1)
        if q + 1 < 2 * MI:
            a("add.i64", cur, cur, step_mi if q % 2 else step)
    _leave(a, end)
    # -- edge path: every element under (row < M) and (col < N)
    a.label("EDGE")
    a("sub.i64", row, Mr, row)                          # rows left from this thread's first
    a("sub.i64", col, Nr, col)                          # columns left
    pe = a.pred()
    a("mov.b64", cur, ptr)
    for q in range(2 * MI):
        mi, h = divmod(q, 2)
        a("setp.gt.i64", pf, row, mi * mi_rows + 8 * h)
        for ni in range(NI):
            src = accr(mi, ni) + 2 * h
            if cvt is not None:
                a(cvt, t1, src, src + 1)
                a("shr.u64", tid, t1, 16)
            for e in range(2):
                a("setp.gt.i64", pq, col, 8 * ni + e)
                a("and.pred", pe, pf, pq)
                if cvt is None:
                    a("st.global.b32", Mem(cur, (8 * ni + e) * 4), src + e, p=pe)
                else:
                    a("st.global.b16", Mem(cur, (8 * ni + e) * 2), t1 if e == 0 else tid, p=pe)
        if q + 1 < 2 * MI:
            a("add.i64", cur, cur, step_mi if q % 2 else step)
    _leave(a, end)


def _leave(a: Asm, end: Optional[str]) -> None:
    """The end of an epilogue path: exit, or on to label ``end`` (a persistent kernel's next tile)."""
    if end:
        a("bra", end)
    else:
        a("exit")


# ----------------------------------------------------------------------------- FFMA fallback
class _FfmaCtx:
    """The FFMA GEMM being emitted: its tile geometry, its Asm, and the registers and operand
    plans that more than one step of the kernel uses."""

    def __init__(self, c: _Cfg):
        self.c = c
        BM, BN, BK, _ = FFMA_TILE
        self.BM, self.BN, self.BK = BM, BN, BK
        self.es = _ELEM_BYTES[c.dtype]
        self.osz = OUT_BYTES[c.out]
        self.RBs = RBs = (BM + 4) * 4             # shared row: 64 f32 + 16 bytes of padding
        self.B_OFF = BK * RBs
        name = f"gemm_ffma_{c.dtype}_{c.out}{'_ta' if c.trans_a else ''}{'_tb' if c.trans_b else ''}_{BM}x{BN}x{BK}"
        self.a = Asm(name, PARAMS, 2 * BK * RBs)
        # the registers (acc, ra, rb, av, bv, tid, Kr, t1, t2, rA, rB, nt, kt, pv) and the operand plans
        # (opA, opB) are set by the steps that allocate them


def _ffma_row_tile(ctx: _FfmaCtx, buf: str, base_row: Reg, lim: Reg, off: int) -> dict:
    """Emit the plan of an A / B^T tile (64 rows x 16 k, k along the rows in global memory)."""
    # thread: row tid/4, k 4*(tid%4) .. +4, stored transposed (Xs[k][row])
    a, es, RBs, tid, t1, t2 = ctx.a, ctx.es, ctx.RBs, ctx.tid, ctx.t1, ctx.t2
    p, kl, s = a.reg(), a.reg(), a.reg()
    batch_ptr(a, p, buf, f"s{buf.lower()}_b", f"s{buf.lower()}_h", es, ctx.z)
    a("shr.u64", t1, tid, 2)                   # row in tile
    a("and.b64", t2, tid, 3)
    a("shl.b64", t2, t2, 2)                    # kc
    a("sub.i64", kl, ctx.Kr, t2)               # k left at this thread's first element
    a("mul.i64", s, t2, RBs)
    a("add.i64", s, s, off)
    a("shl.b64", t2, t2, log2(es))
    a("add.i64", p, p, t2)                     # + kc
    a("shl.b64", t2, t1, 2)
    a("add.i64", s, s, t2)                     # Xs[kc][row]
    a("add.i64", t1, t1, base_row)
    a("sub.i64", t2, lim, 1)
    a("min.i64", t1, t1, t2)                   # clamp the row
    a("ldparam", t2, f"ld{buf.lower()}")
    a("mul.i64", t1, t1, t2)
    a("shl.b64", t1, t1, log2(es))
    a("add.i64", p, p, t1)
    return {"kind": "row", "ptrs": [p], "kl": kl, "s": s, "step": ctx.BK * es}


def _ffma_kmajor_tile(ctx: _FfmaCtx, buf: str, base_col: Reg, lim: Reg, off: int) -> dict:
    """Emit the plan of a B / A^T tile (16 k x 64 columns, rows k in global memory)."""
    # thread: k-row tid/16, columns 4*(tid%16) .. +4 (each clamped), stored as they are (Xs[k][col])
    a, es, tid, t1, t2 = ctx.a, ctx.es, ctx.tid, ctx.t1, ctx.t2
    kl, s, p = a.reg(), a.reg(), a.reg()
    ptrs = [a.reg() for _ in range(4)]
    batch_ptr(a, p, buf, f"s{buf.lower()}_b", f"s{buf.lower()}_h", es, ctx.z)
    a("shr.u64", t1, tid, 4)                   # k-row
    a("and.b64", t2, tid, 15)
    a("shl.b64", t2, t2, 2)                    # column in tile
    a("sub.i64", kl, ctx.Kr, t1)
    a("mul.i64", s, t1, ctx.RBs)
    a("shl.b64", ptrs[0], t2, 2)
    a("add.i64", s, s, ptrs[0])
    a("add.i64", s, s, off)                    # Xs[krow][col]
    for e in range(4):
        a("add.i64", ptrs[e], t2, base_col)
        if e:
            a("add.i64", ptrs[e], ptrs[e], e)
    a("sub.i64", t2, lim, 1)
    for e in range(4):
        a("min.i64", ptrs[e], ptrs[e], t2)     # clamp the column
    a("ldparam", t2, f"ld{buf.lower()}")
    a("mul.i64", t1, t1, t2)                   # krow*ld
    for e in range(4):
        a("add.i64", ptrs[e], ptrs[e], t1)
        a("shl.b64", ptrs[e], ptrs[e], log2(es))
        a("add.i64", ptrs[e], ptrs[e], p)
    a("mul.i64", p, t2, ctx.BK * es)           # BK rows further per k tile
    return {"kind": "kmaj", "ptrs": ptrs, "kl": kl, "s": s, "step": p}


def _ffma_prologue(ctx: _FfmaCtx) -> None:
    """Emit the zeroed accumulators, the A and B plans, the inner loop's read offsets and the k tiles."""
    a, c, BK = ctx.a, ctx.c, ctx.BK
    ctx.acc = a.reg(16)
    ctx.ra, ctx.rb = a.reg(4), a.reg(4)
    ctx.av, ctx.bv = a.reg(4), a.reg(4)
    for i in range(16):
        a("mov.f32", ctx.acc + i, 0.0)
    tid, m0, n0, Mr, Nr, Kr, t1, t2 = (a.reg() for _ in range(8))
    ctx.tid, ctx.Kr, ctx.t1, ctx.t2 = tid, Kr, t1, t2
    a("s2r", tid, "%tid.x")
    _tile_origin(a, c, m0, n0)
    a("ldparam", Mr, "M")
    a("ldparam", Nr, "N")
    a("ldparam", Kr, "K")
    ctx.z = z = batch_index(a)
    if c.trans_a:
        ctx.opA = _ffma_kmajor_tile(ctx, "A", m0, Mr, 0)
    else:
        ctx.opA = _ffma_row_tile(ctx, "A", m0, Mr, 0)
    if c.trans_b:
        ctx.opB = _ffma_row_tile(ctx, "B", n0, Nr, ctx.B_OFF)
    else:
        ctx.opB = _ffma_kmajor_tile(ctx, "B", n0, Nr, ctx.B_OFF)
    a.free(*z)
    # where the inner loop reads: As[k][4ty], Bs[k][4tx]
    ctx.rA, ctx.rB = rA, rB = a.reg(), a.reg()
    a("shr.u64", rA, tid, 4)
    a("shl.b64", rA, rA, 4)
    a("and.b64", rB, tid, 15)
    a("shl.b64", rB, rB, 4)
    a("add.i64", rB, rB, ctx.B_OFF)
    ctx.nt, ctx.kt = nt, kt = a.reg(), a.reg()
    a("add.i64", nt, Kr, BK - 1)
    a("shr.u64", nt, nt, log2(BK))
    a("mov.b64", kt, 0)
    a.free(m0, n0, Mr, Nr, Kr, t1, t2, tid)
    ctx.pv = a.pred()


def _ffma_load_tile(ctx: _FfmaCtx) -> None:
    """Load the next k tile of A and B into registers ra, rb (zero past K)."""
    a, es, pv = ctx.a, ctx.es, ctx.pv
    ld = {2: "ld.global.u16", 4: "ld.global.b32"}[es]
    for op, r in ((ctx.opA, ctx.ra), (ctx.opB, ctx.rb)):
        if op["kind"] == "row":
            for e in range(4):
                a("mov.b64", r + e, 0)
                a("setp.gt.i64", pv, op["kl"], e)
                a(ld, r + e, Mem(op["ptrs"][0], e * es), p=pv)
        else:
            a("setp.gt.i64", pv, op["kl"], 0)
            for e in range(4):
                a("mov.b64", r + e, 0)
                a(ld, r + e, Mem(op["ptrs"][e], 0), p=pv)


def _ffma_advance(ctx: _FfmaCtx) -> None:
    """Pointers and k left to the next k tile."""
    for op in (ctx.opA, ctx.opB):
        ctx.a("sub.i64", op["kl"], op["kl"], ctx.BK)
        for p in op["ptrs"]:
            ctx.a("add.i64", p, p, op["step"])


def _ffma_to_f32(ctx: _FfmaCtx, r: Reg) -> None:
    """Widen a loaded fp16 / bf16 element to f32 in place (fp32, tf32: nothing)."""
    if ctx.c.dtype == "fp16":
        ctx.a("cvt.f32.f16", r, r)
    elif ctx.c.dtype == "bf16":
        ctx.a("shl.b64", r, r, 16)


def _ffma_main_loop(ctx: _FfmaCtx) -> None:
    """Emit the k loop: store a tile, prefetch the next into registers, multiply; then free its registers."""
    a, BK, RBs, acc, ra, rb, av, bv, pv = ctx.a, ctx.BK, ctx.RBs, ctx.acc, ctx.ra, ctx.rb, ctx.av, ctx.bv, ctx.pv
    opA, opB = ctx.opA, ctx.opB
    _ffma_load_tile(ctx)
    a.label("KLOOP")
    for e in range(4):
        _ffma_to_f32(ctx, ra + e)
        _ffma_to_f32(ctx, rb + e)
    for op, r in ((opA, ra), (opB, rb)):
        if op["kind"] == "row":
            for e in range(4):
                a("st.shared.b32", Mem(op["s"], e * RBs), r + e)   # Xs[kc+e][row] (transposed)
        else:
            a("st.shared.v4.b32", Mem(op["s"], 0), r)
    a("bar.sync")
    _ffma_advance(ctx)
    _ffma_load_tile(ctx)                                 # next tile, while this one is multiplied
    ka, kb = a.reg(), a.reg()
    a("mov.b64", ka, ctx.rA)
    a("mov.b64", kb, ctx.rB)
    a.label("INNER")
    for k in range(4):
        a("ld.shared.v4.b32", av, Mem(ka, k * RBs))
        a("ld.shared.v4.b32", bv, Mem(kb, k * RBs))
        for i in range(4):
            for j in range(4):
                a("fma.f32", acc + 4 * i + j, av + i, bv + j, acc + 4 * i + j)
    a("add.i64", ka, ka, 4 * RBs)
    a("add.i64", kb, kb, 4 * RBs)
    a("setp.lt.i64", pv, ka, BK * RBs)
    a("bra", "INNER", p=pv)
    a("bar.sync")
    a("add.i64", ctx.kt, ctx.kt, 1)
    a("setp.lt.i64", pv, ctx.kt, ctx.nt)
    a("bra", "KLOOP", p=pv)
    for op in (opA, opB):
        a.free(op["kl"], op["s"], *op["ptrs"])
        if op["kind"] == "kmaj":
            a.free(op["step"])
    a.free(ctx.rA, ctx.rB, ctx.nt, ctx.kt, ka, kb)
    a.free(ra, rb, av, bv, k=4)


def _ffma_epilogue(ctx: _FfmaCtx) -> None:
    """Emit the stores of the thread's 4 x 4 outputs (times alpha), rows m0 + 4ty + i, columns n0 + 4tx + j."""
    # rows of 4 for a full block with ldc and C's strides multiples of 4; else each element under
    # (row < M) and (col < N)
    a, c, acc, osz = ctx.a, ctx.c, ctx.acc, ctx.osz
    if c.alpha != 1.0:
        for i in range(16):
            a("mul.f32", acc + i, acc + i, c.alpha)
    tid, Mr, Nr, row, col, ptr, t1, t2 = (a.reg() for _ in range(8))
    a("s2r", tid, "%tid.x")
    a("ldparam", Mr, "M")
    a("ldparam", Nr, "N")
    pf, pq = ctx.pv, a.pred()
    _tile_origin(a, c, row, col)
    _full_block(a, pf, pq, (row, col), (ctx.BM, ctx.BN), (Mr, Nr), 3, t1, t2)
    a("shr.u64", t1, tid, 4)
    a("shl.b64", t1, t1, 2)
    a("add.i64", row, row, t1)
    a("and.b64", t1, tid, 15)
    a("shl.b64", t1, t1, 2)
    a("add.i64", col, col, t1)
    _c_ptr(a, ptr, row, col, t2, t1, osz)
    a("shl.b64", t2, t2, log2(osz))                      # one row of C
    cvt = CVT_PACK.get(c.out)
    a("bra", "EDGE", p=pf, neg=True)
    pk = a.reg(2)
    for i in range(4):
        if cvt is None:
            a("st.global.v4.b32", Mem(ptr, 0), acc + 4 * i)
        else:
            a(cvt, pk, acc + 4 * i, acc + 4 * i + 1)
            a(cvt, pk + 1, acc + 4 * i + 2, acc + 4 * i + 3)
            a("st.global.v2.b32", Mem(ptr, 0), pk)
        if i < 3:
            a("add.i64", ptr, ptr, t2)
    a("exit")
    a.label("EDGE")
    a("sub.i64", row, Mr, row)
    a("sub.i64", col, Nr, col)
    pe = a.pred()
    for i in range(4):
        a("setp.gt.i64", pf, row, i)
        for j in range(4):
            a("setp.gt.i64", pq, col, j)
            a("and.pred", pe, pf, pq)
            if cvt is None:
                a("st.global.b32", Mem(ptr, 4 * j), acc + 4 * i + j, p=pe)
            else:
                a(cvt, pk, acc + 4 * i + j, acc + 4 * i + j)
                a("st.global.b16", Mem(ptr, 2 * j), pk, p=pe)
        if i < 3:
            a("add.i64", ptr, ptr, t2)
    a("exit")


def _emit_ffma(c: _Cfg) -> Program:
    """64 x 64 x 16 block tile, 16 x 16 threads of 4 x 4 outputs, f32 math."""
    ctx = _FfmaCtx(c)
    _ffma_prologue(ctx)
    _ffma_main_loop(ctx)
    _ffma_epilogue(ctx)
    return ctx.a.build()


# ----------------------------------------------------------------------------- tile choice
def _stage_bytes(dtype: str, trans_b: bool, BM: int, BN: int, kb: int = 64, trans_a: bool = False) -> int:
    es = _ELEM_BYTES[dtype]
    a = BM * kb if (not trans_a or es == 2) else ceil_div((kb // es) * (BM * 4 + 32), 128) * 128
    b = BN * kb if (trans_b or es == 2) else (kb // es) * (BN * 4 + 32)
    return ceil_div(a + b, 128) * 128


def _cost(M: int, N: int, BM: int, BN: int, cores: int, rate: float = 1.0) -> float:
    """The tile rule's cost (module docstring); ``rate``: the tensor time of a tile relative to the
    mma kernel's (wgmma: mma.sync's share of the peak), which a tile bound by its operands'
    traffic (arithmetic intensity below 64) does not see."""
    blocks = ceil_div(M, BM) * ceil_div(N, BN)
    eff = min(1.0 / rate, BM * BN / (BM + BN) / 64.0)      # (rate 1: min(1, intensity / 64))
    return ceil_div(blocks, max(cores, 1)) * BM * BN / eff


def _raster(caps, prog: Program, threads: int, c: _Cfg, M: int, N: int,
            tiles_per_block: int = 1) -> tuple[tuple[int, int], int]:
    """((group, raster_n) of _tile_origin, the launch's period). Tile rows are the dimension with
    fewer tiles (R of
    them). A wave of W blocks in groups of G rows reads G row panels and W / G column panels,
    fewest at G = sqrt(W); a group spanning all R rows reads every column panel once and keeps
    the R row panels for the next wave, so up to R = 2 sqrt(W) (a quarter more panels a wave)
    the group is all of R, and beyond that R splits into groups of about sqrt(W) rows, evenly.
    With several groups, the blocks of one (group x columns) repeat the sharing pattern: that is
    the period wave sampling measures over (0 with one group). ``tiles_per_block``: the tiles a
    block works on at once (the ping-pong kernel's two warpgroups), which the wave holds."""
    root = math.sqrt(max(blocks_per_core(caps, prog, threads), 1) * caps.cores_total * tiles_per_block)
    tm, tn = ceil_div(M, c.BM), ceil_div(N, c.BN)
    rows, cols = sorted((tm, tn))
    group = rows if rows <= 2 * root else ceil_div(rows, max(1, round(rows / root)))
    return (group, int(tn < tm)), (group * cols if group < rows else 0)


def _cluster_raster(caps, prog: Program, threads: int, c: _Cfg, M: int, N: int,
                    tiles_per_block: int = 1) -> tuple[tuple[int, int], int]:
    """_raster for the kernel on clusters of two (_cluster_tile_origin): tile rows are pairs of M
    tiles, a wave holds half as many clusters as blocks; ``group`` counts M tiles (twice the
    pairs). The period in blocks."""
    root = math.sqrt(max(blocks_per_core(caps, prog, threads), 1) * caps.cores_total / 2 * tiles_per_block)
    rows, cols = ceil_div(M, 2 * c.BM), ceil_div(N, c.BN)
    group = rows if rows <= 2 * root else ceil_div(rows, max(1, round(rows / root)))
    return (2 * group, 0), (2 * group * cols if group < rows else 0)


def _fits(prog: Program, caps, threads: int) -> bool:
    W = caps.warp_width
    warps = ceil_div(threads, W)
    return (prog.shared_bytes <= caps.scratchpad_bytes and prog.nregs <= caps.max_regs_per_thread
            and prog.nregs * warps * W <= caps.regs_per_core and warps <= caps.warp_slots)


def _normalize(dtype: str, out_dtype: str) -> tuple[str, str]:
    if dtype not in _DTYPES:
        raise InputError("gemm", f"unknown dtype {dtype!r}", "fp16, bf16, tf32, fp32")
    if out_dtype not in OUT_DTYPE_ALIASES:
        raise InputError("gemm", f"unknown out_dtype {out_dtype!r}", "f32, f16, bf16")
    dt, out = _DTYPES[dtype], OUT_DTYPE_ALIASES[out_dtype]
    if out != "f32" and not (dt == "fp16" and out == "f16" or dt == "bf16" and out == "bf16"):
        raise InputError("gemm", f"out_dtype {out_dtype!r} with dtype {dtype!r}",
                         "f32, or the input dtype for fp16 / bf16")
    return dt, out


def _uses_tensor(caps, dt: str) -> bool:
    return (dt in _MMA and dt in caps.tensor_dtypes and "tensor" in caps.units and caps.warp_width == 32
            and caps.has_async_copy)


def split_k(caps, M: int, N: int, K: int, dtype: str = "fp16", trans_b: bool = False, *,
            trans_a: bool = False) -> int:
    """How many slices of K a skinny GEMM is split into, 1 for none (common.split_k_slices over
    the unsplit launch's tiles and the SMs). Each slice is a GEMM of the batch (grid.z) writing f32
    partial sums; a chunk sum adds them up (cuBLAS's split-K with a separate reduction)."""
    if M > SKINNY_ROWS or K < SPLIT_K_MIN_K:
        return 1
    tiles = math.prod(gemm_kernel(caps, M, N, K, dtype, "f32", trans_b, trans_a=trans_a).launch.grid)
    return split_k_slices(M, K, tiles, caps.cores_total)


def choose_tile(caps, M: int, N: int, K: int, dtype: str = "fp16", out_dtype: str = "f32",
                trans_b: bool = False, *, trans_a: bool = False, cw_a: Optional[int] = None,
                cw_b: Optional[int] = None, alpha: float = 1.0, launches: int = 1,
                kernel: Optional[str] = None, tma_ok=None, c_store=None) -> tuple[_Cfg, Program]:
    """The kernel configuration the tile rule picks (see the module docstring), and its program.
    cw_a, cw_b: copy widths in bytes (default: those of dense matrices of this shape); launches:
    the GEMMs of a batch (grid.z), which share the cores; kernel: "mma" or "wgmma" instead of the
    rule's choice between them, or "tma" (the wgmma kernel fed by the TMA unit: machines with
    tma; ``tma_ok(BM, BN)`` says whether the layout takes its boxes, tma_fits, and ``c_store``
    whether C's takes bulk tensor stores, c_store_fits; default: dense matrices of this shape)."""
    dt, out = _normalize(dtype, out_dtype)
    es = _ELEM_BYTES[dt]
    if kernel not in KERNELS:
        raise InputError("gemm", f"kernel {kernel!r}", KERNEL_NAMES)
    if kernel is not None and not _uses_tensor(caps, dt):
        raise InputError(f"gemm on {caps.name}", f"kernel {kernel} with dtype {dtype}, which {caps.name} runs as "
                         "the vector FFMA kernel", "no kernel, or a dtype the tensor units take")
    if not _uses_tensor(caps, dt):
        cfg = _Cfg("ffma", dt, out, trans_b, FFMA_TILE[0], FFMA_TILE[1], 4, 4, 1, es, es,
                   trans_a=trans_a, alpha=alpha)
        prog = _emit_ffma(cfg)
        if not _fits(prog, caps, 32 * FFMA_TILE[3]):
            raise InputError(f"gemm on {caps.name}", "the FFMA kernel (256 threads, "
                             f"{prog.nregs} registers, {prog.shared_bytes} B scratchpad) does not fit a core",
                             "a GPU-family target")
        return cfg, prog
    if cw_a is None:
        cw_a = _copy_width((M if trans_a else K) * es, es)
    if cw_b is None:
        cw_b = _copy_width((K if trans_b else N) * es, es)
    tried = []
    order = sorted(MMA_TILES, key=lambda t: (_cost(M, N, t[0], t[1], caps.cores_total), -t[0] * t[1]))
    # warpgroup MMA where the target has it, for A row-major and more rows than decode's skinny
    # GEMMs (those stream B: the mma kernel's small tiles and wave rule serve them), when the cost
    # of its best tile, at the units' peak, is below that of mma's at the rate mma.sync gets (a
    # small GEMM spreads over more cores in mma's smaller tiles; a tile bound by its operands'
    # traffic gains nothing from the faster units)
    share = dict(caps.mma_sync_share).get(dt, 1.0)
    wg_order = sorted(WGMMA_TILES, key=lambda t: (_cost(M, N, t[0], t[1], caps.cores_total, share), -t[0] * t[1]))
    can_wg = "wgmma" in caps.features and dt in ("fp16", "bf16") and not trans_a
    if kernel in KERNELS[2:] and not can_wg:
        raise InputError(f"gemm on {caps.name}", f"the {kernel} kernel with dtype {dtype}"
                         f"{', A given k-major' if trans_a else ''}", "fp16 or bf16, A row-major, on a machine "
                         "with tensor.wgmma")
    if kernel in KERNELS[3:]:
        if tma_ok is None:                        # dense matrices of this shape
            def tma_ok(BM, BN):
                return tma_fits(M, N, K, dt, trans_b, BM, BN, K, K if trans_b else N, (1, 1), (0, 0), (0, 0))
        if c_store is None:
            c_store = c_store_fits(N, out, N, (1, 1), (0, 0))
        cluster = 2 if kernel.endswith("multicast") else 1
        if kernel.startswith("tma_pingpong"):
            # (the warpgroups' main loops take turns: an SM's tensor units work on one tile at a time)
            pp_order = sorted(PINGPONG_TILES, key=lambda t: (_cost(M, N, t[0], t[1], caps.cores_total, share),
                                                             -t[0] * t[1]))
            return _choose_tma(caps, pp_order, dt, out, trans_b, cw_a, cw_b, alpha, tma_ok, cluster, c_store, True)
        return _choose_tma(caps, wg_order, dt, out, trans_b, cw_a, cw_b, alpha, tma_ok, cluster, c_store)
    if kernel == "wgmma" or (kernel is None and can_wg and M > SKINNY_M):
        mma_best = _cost(M, N, *order[0][:2], caps.cores_total)
        for BM, BN in wg_order:
            if kernel is None and _cost(M, N, BM, BN, caps.cores_total, share) >= mma_best:
                break                             # no wgmma tile that fits beats mma's best
            got = _fit_wg_tile(caps, "wgmma", dt, out, trans_b, BM, BN, cw_a, cw_b, alpha, (4, 3), 0, tried)
            if got is not None:                   # (4 or 3 stages: two or one k tiles copied ahead)
                return got
        if kernel == "wgmma":
            raise InputError(f"gemm on {caps.name}", "no wgmma tile fits: " + "; ".join(tried), "kernel mma")
    # k-tile rows of 128 bytes (BK = 64 halves / 32 tf32) halve the barriers and the cp.async
    # wavefronts of A per flop; they need K of at least two such tiles to pay off
    kbs = ((128, 4), (128, 3), (64, 3), (64, 2)) if K * es >= 256 else ((64, 3), (64, 2))
    for BM, BN, WM, WN in order:
        fit = [(kb, st) for kb, st in kbs
               if st * _stage_bytes(dt, trans_b, BM, BN, kb, trans_a) <= caps.scratchpad_bytes]
        if not fit:
            tried.append(f"{BM}x{BN}: {2 * _stage_bytes(dt, trans_b, BM, BN, 64, trans_a)} B scratchpad")
            continue
        best, threads = None, 32 * WM * WN
        for kb, stages in fit if M <= SKINNY_M else fit[:1]:
            cfg = _Cfg("mma", dt, out, trans_b, BM, BN, WM, WN, stages, cw_a, cw_b, kb, trans_a=trans_a, alpha=alpha)
            try:
                prog = _emit_mma(cfg)
            except OutOfRegisters as e:
                tried.append(f"{BM}x{BN}: {e}")
                continue
            if not _fits(prog, caps, threads):
                tried.append(f"{BM}x{BN}: {prog.nregs} registers")
                continue
            slots = max(blocks_per_core(caps, prog, threads), 1) * caps.cores_total
            waves = ceil_div(ceil_div(M, BM) * ceil_div(N, BN) * launches, slots)
            if best is None or waves < best[0]:      # ties: the deeper pipeline, listed first
                best = (waves, cfg, prog)
        if best is not None:
            return best[1], best[2]
    raise InputError(f"gemm on {caps.name}", "no tile fits: " + "; ".join(tried), "a larger target")


def _fit_wg_tile(caps, kind, dt, out, trans_b, BM, BN, cw_a, cw_b, alpha, stage_counts, barrier_bytes,
                 tried, cluster=1, c_store=False, pingpong=False) -> Optional[tuple[_Cfg, Program]]:
    """The warpgroup kernel ``kind`` ("wgmma", or "tma": a producer warp more and ``barrier_bytes``
    of mbarriers a stage; ``cluster`` blocks a cluster; ``c_store``: C's layout takes bulk tensor
    stores, which it then uses where the stages hold the tile; ``pingpong``: the persistent
    ping-pong kernel, BM x BN a warpgroup's tile) of tile BM x BN with the most of
    ``stage_counts`` stages that fits the target, or None; what did not fit goes to ``tried``."""
    emit = _emit_wgmma_pingpong if pingpong else _emit_wgmma_tma if kind == "tma" else _emit_wgmma
    threads = PP_THREADS if pingpong else 2 * BM + (32 if kind == "tma" else 0)
    name = "tma_pingpong" if pingpong else kind
    for stages in stage_counts:
        smem = stages * (_stage_bytes(dt, trans_b, BM, BN, 128) + barrier_bytes)
        if pingpong:                              # its epilogue buffers and two turn barriers
            smem += (PP_EPI_BYTES if c_store else 0) + 16
        if smem > caps.scratchpad_bytes:
            tried.append(f"{name} {BM}x{BN}: {smem} B scratchpad")
            continue
        c_tma = c_store and (pingpong or BM * BN * OUT_BYTES[out] <= stages * _stage_bytes(dt, trans_b, BM, BN, 128))
        cfg = _Cfg(kind, dt, out, trans_b, BM, BN, 4 if pingpong else BM // 16, 1, stages, cw_a, cw_b, 128,
                   alpha=alpha, cluster=cluster, c_tma=c_tma, pingpong=pingpong)
        try:
            prog = emit(cfg)
        except OutOfRegisters as e:
            tried.append(f"{name} {BM}x{BN}: {e}")
            continue
        if _fits(prog, caps, threads):
            return cfg, prog
        tried.append(f"{name} {BM}x{BN}: {prog.nregs} registers")
    return None


def _choose_tma(caps, wg_order, dt, out, trans_b, cw_a, cw_b, alpha, tma_ok, cluster=1,
                c_store=False, pingpong=False) -> tuple[_Cfg, Program]:
    """The TMA kernel's tile: the wgmma kernel's order, the deepest pipeline that fits (cluster: 2
    for the multicast form; c_store: C's layout takes bulk tensor stores; pingpong: the persistent
    ping-pong kernel, ``wg_order`` its warpgroup tiles, up to 8 stages as CUTLASS fills the
    scratchpad with stages)."""
    where = f"gemm on {caps.name}"
    if "tma" not in caps.features:
        raise InputError(where, f"the {'tma_pingpong' if pingpong else 'tma'} kernel",
                         "a machine with tma (and tensor.wgmma)")
    if cluster > 1 and "cluster_tma" not in caps.features:
        raise InputError(where, f"the {'tma_pingpong' if pingpong else 'tma'}_multicast kernel",
                         "a machine with tma and clusters")
    tried = []
    for BM, BN in wg_order:
        if not tma_ok(BM, BN):
            tried.append(f"tma {BM}x{BN}: a box larger than its matrix, or a stride not a multiple of 16 bytes")
            continue
        got = _fit_wg_tile(caps, "tma", dt, out, trans_b, BM, BN, cw_a, cw_b, alpha,
                           PP_STAGES if pingpong else (4, 3, 2), 16, tried, cluster, c_store, pingpong)
        if got is not None:
            return got
    raise InputError(where, "no tma tile fits: " + "; ".join(tried), "kernel wgmma or mma")


# ----------------------------------------------------------------------------- API
def gemm_kernel(caps, M: int, N: int, K: int, dtype: str = "fp16", out_dtype: str = "f32",
                trans_b: bool = False, tile: Optional[Tile] = None, *, trans_a: bool = False,
                lda: Optional[int] = None, ldb: Optional[int] = None, ldc: Optional[int] = None,
                batch=(1, 1), stride_a=(0, 0), stride_b=(0, 0), stride_c=(0, 0), alpha: float = 1.0,
                kernel: Optional[str] = None) -> GemmKernel:
    """Emit C = alpha * op(A) @ op(B) for a GPU-family target: op(A) is A[M,K] (A given as [K,M]
    with ``trans_a``), op(B) is B[K,N] (B given as [N,K] with ``trans_b``), C is [M,N].

    caps: ``archsim.config.derived.capabilities(machine)``. dtype: fp16 | bf16 (mma.m16n8k16),
    tf32 (f32 buffers, mma.m16n8k8) or fp32 (vector FFMA); a dtype the tensor units lack also
    takes the FFMA kernel. out_dtype: f32, or the input dtype for fp16 / bf16.
    ``tile`` forces a tensor-core tile instead of the rule: BM, BN, BK (64 or 128 bytes of k a
    row, else 64), warps (4: 2 x 2; 8: 4 x 2 or 2 x 4, the longer side split in 4), stages (the
    mma kernel). ``kernel``: "mma" or "wgmma" (machines with warpgroup MMA) instead of the
    rule's choice between the two, or "tma" (the wgmma kernel fed by the TMA unit; machines with
    tma, layouts tma_fits takes), "tma_multicast" (it on clusters of two sharing B), "tma_pingpong"
    (the persistent ping-pong kernel; ``tile`` is then one warpgroup's) or "tma_pingpong_multicast".

    Layout (all in elements; kernel parameters, so one program serves every value of the same
    alignment class): ``lda``, ``ldb``, ``ldc`` are the row strides of A, B, C as stored (default:
    dense rows); ``batch = (nb, nh)`` launches nb*nh GEMMs (grid.z), and block z reads A at
    ``A + (z // nh)*stride_a[0] + (z % nh)*stride_a[1]`` (likewise B and C). ``alpha`` scales the
    f32 result before it is stored. Example, attention's S = Q K^T per (batch, head) from a fused
    [b*s, 3h] QKV buffer: M = N = s, K = d, trans_b, lda = ldb = 3h, stride_a = stride_b =
    (s*3h, d), batch (b, n), C = S[b, n, s, s] (stride_c (n*s*s, s*s)); pass A = qkv.reshape(-1)
    and B = qkv.reshape(-1)[h:]."""
    where = "gemm"
    M, N, K = (check_int(where, n, v, 0, "an integer") for n, v in (("M", M), ("N", N), ("K", K)))
    if min(M, N, K) < 1:
        raise InputError("gemm", f"shape {M}x{N}x{K}", "M, N, K >= 1")
    if caps.family != "gpu":
        raise InputError(f"gemm on {caps.name}", f"the GPU GEMM emitter targets the gpu family, not {caps.family}",
                         "a gpu-family machine")
    dt, out = _normalize(dtype, out_dtype)
    es = _ELEM_BYTES[dt]
    a_cols = M if trans_a else K
    b_cols = K if trans_b else N
    lda = a_cols if lda is None else check_int(where, "lda", lda, a_cols, f"lda >= {a_cols} (a row of A as stored)")
    ldb = b_cols if ldb is None else check_int(where, "ldb", ldb, b_cols, f"ldb >= {b_cols} (a row of B as stored)")
    ldc = N if ldc is None else check_int(where, "ldc", ldc, N, f"ldc >= {N} (a row of C)")
    nb, nh = check_pair(where, "batch", batch, 1, "integers >= 1")
    if nb * nh > MAX_BATCH:
        raise InputError(where, f"batch {(nb, nh)}: {nb * nh} GEMMs", f"nb*nh <= {MAX_BATCH} (grid.z)")
    sa = check_pair(where, "stride_a", stride_a, 0, "integers >= 0")
    sb = check_pair(where, "stride_b", stride_b, 0, "integers >= 0")
    sc = check_pair(where, "stride_c", stride_c, 0, "integers >= 0")
    if not one_to_one(((1, N), (ldc, M), (sc[0], nb), (sc[1], nh))):
        raise InputError(where, f"C layout ldc={ldc}, stride_c={sc} with batch {(nb, nh)} and {M}x{N} matrices "
                         "writes some elements of C more than once",
                         "strides that, sorted, each step past the span of the smaller ones")
    try:
        alpha_f = float(alpha)
    except (TypeError, ValueError):
        raise InputError(where, f"alpha = {alpha!r}", "a finite number") from None
    if not np.isfinite(alpha_f) or abs(alpha_f) > float(np.finfo(np.float32).max):
        raise InputError(where, f"alpha = {alpha!r}", "a finite number within the f32 range")

    def cw(cols, ld, strides):
        """The copy width that keeps every row of every matrix of the operand aligned."""
        g = math.gcd(cols * es, ld * es)
        for s, n in zip(strides, (nb, nh)):
            if n > 1:
                g = math.gcd(g, s * es)
        return _copy_width(g, es)

    cw_a, cw_b = cw(a_cols, lda, sa), cw(b_cols, ldb, sb)
    if kernel not in KERNELS:
        raise InputError(where, f"kernel {kernel!r}", KERNEL_NAMES)
    if tile is not None and kernel in KERNELS[2:]:
        raise InputError(where, f"a tile with kernel {kernel}",
                         f"a tile (the mma kernel's) or kernel {kernel} (its own rule)")
    if tile is not None and not _uses_tensor(caps, dt):
        raise InputError(f"gemm on {caps.name}", f"tile {tile.BM}x{tile.BN} with dtype {dtype}, which {caps.name} runs "
                         "as the vector FFMA kernel (one tile)", "no tile, or a dtype the tensor units take")
    if tile is not None:
        if tile.warps not in (4, 8):
            raise InputError("gemm", f"tile {tile}", "4 or 8 warps")
        wm, wn = (2, 2) if tile.warps == 4 else ((4, 2) if tile.BM >= tile.BN else (2, 4))
        kb = tile.BK * es if tile.BK * es in (64, 128) else 64
        cfg = _Cfg("mma", dt, out, bool(trans_b), tile.BM, tile.BN, wm, wn, tile.stages, cw_a, cw_b, kb,
                   trans_a=bool(trans_a), alpha=alpha_f)
        try:
            prog = _emit_mma(cfg)
        except OutOfRegisters as e:
            raise InputError(f"gemm on {caps.name}", f"tile {tile.BM}x{tile.BN}: {e}", "a smaller tile") from None
        if not _fits(prog, caps, 32 * tile.warps):
            raise InputError(f"gemm on {caps.name}", f"tile {tile.BM}x{tile.BN} x {tile.stages} stages does not fit a "
                             f"core ({prog.nregs} registers, {prog.shared_bytes} B scratchpad)", "a smaller tile")
    else:
        def tma_ok(BM, BN):
            return tma_fits(M, N, K, dt, bool(trans_b), BM, BN, lda, ldb, (nb, nh), sa, sb)

        cfg, prog = choose_tile(caps, M, N, K, dt, out, bool(trans_b), trans_a=bool(trans_a), cw_a=cw_a, cw_b=cw_b,
                                alpha=alpha_f, launches=nb * nh, kernel=kernel, tma_ok=tma_ok,
                                c_store=c_store_fits(N, out, ldc, (nb, nh), sc))
    check(prog, caps)
    if cfg.pingpong:
        threads = PP_THREADS
        t = Tile(cfg.BM, cfg.BN, cfg.kb // es, PP_THREADS // 32, cfg.stages)
    elif cfg.kind in ("mma", "wgmma", "tma"):
        producer = int(cfg.kind == "tma")           # the TMA kernel's producer warp
        threads = 32 * (cfg.WM * cfg.WN + producer)
        t = Tile(cfg.BM, cfg.BN, cfg.kb // es, cfg.WM * cfg.WN + producer, cfg.stages)
    else:
        threads = 32 * FFMA_TILE[3]
        t = Tile(FFMA_TILE[0], FFMA_TILE[1], FFMA_TILE[2], FFMA_TILE[3], 1)
    if cfg.pingpong:                                # persistent: a block an SM slot (of each GEMM of a batch)
        K2 = cfg.cluster
        tiles = ceil_div(M, K2 * t.BM) * ceil_div(N, t.BN)      # (pairs of M tiles on clusters of two)
        slots = max(blocks_per_core(caps, prog, threads), 1) * caps.cores_total // K2
        blocks = K2 * min(tiles, ceil_div(slots, nb * nh))
        if K2 > 1:
            raster, _ = _cluster_raster(caps, prog, threads, cfg, M, N, tiles_per_block=2)
        else:
            raster, _ = _raster(caps, prog, threads, cfg, M, N, tiles_per_block=2)
        launch = Launch((blocks, 1, nb * nh), (threads, 1, 1), cluster=K2)
    elif cfg.cluster > 1:
        raster, period = _cluster_raster(caps, prog, threads, cfg, M, N)
        pairs = ceil_div(M, 2 * t.BM)
        launch = Launch((2 * pairs * ceil_div(N, t.BN), 1, nb * nh), (threads, 1, 1), period=period, cluster=2)
    else:
        raster, period = _raster(caps, prog, threads, cfg, M, N)
        launch = Launch((ceil_div(N, t.BN), ceil_div(M, t.BM), nb * nh), (threads, 1, 1), period=period)
    return GemmKernel(program=prog, launch=launch, tile=t, flops=2 * M * N * K * nb * nh, M=M, N=N, K=K, dtype=dt,
                      out_dtype=out, trans_b=bool(trans_b), kind=cfg.kind, trans_a=bool(trans_a), lda=lda, ldb=ldb,
                      ldc=ldc, batch=(nb, nh), stride_a=sa, stride_b=sb, stride_c=sc, alpha=alpha_f,
                      raster=raster, cluster=cfg.cluster, c_tma=cfg.c_tma, pingpong=cfg.pingpong)
