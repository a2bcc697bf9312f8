"""Engine state types: NamedTuples of numpy arrays (numba passes them to @njit functions)."""

from __future__ import annotations

from typing import NamedTuple

import mmap

import numpy as np

_SPARSE_MIN_BYTES = 4 << 20


def sparse_zeros(shape, dtype) -> np.ndarray:
    """np.zeros for a big array of which a run touches only parts (the register file and
    scratchpad rows of every warp slot of a whole GPU: hundreds of MB, mostly idle slots). It is an
    anonymous mapping with transparent huge pages turned off, so the kernel zeroes only the 4-KiB
    pages a run touches; with huge pages, the first touch of each slot's registers zeroed a whole
    2-MiB page (an a100 GEMM spent a quarter of its time there)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n < _SPARSE_MIN_BYTES:
        return np.zeros(shape, dt)
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        mm.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mm, dt).reshape(shape)


class OpTables(NamedTuple):
    """Per-opcode lookup arrays (from isa/opcodes.yaml), indexed by Program.op."""

    sem: np.ndarray
    dtype: np.ndarray
    unit: np.ndarray
    cmp: np.ndarray
    space: np.ndarray
    access_bytes: np.ndarray
    signed: np.ndarray
    src_dtype: np.ndarray
    nregs_dst: np.ndarray
    nregs_src: np.ndarray
    matrices: np.ndarray
    trans: np.ndarray
    flops_per_lane: np.ndarray
    shape_m: np.ndarray
    shape_n: np.ndarray
    shape_k: np.ndarray
    strided: np.ndarray       # dma.get.s / dma.put.s
    bcast: np.ndarray         # DMA broadcast mode (archsim.isa.opcodes.BCAST_*)


class ProgArrays(NamedTuple):
    """One program's instruction arrays (see archsim.isa.program)."""

    op: np.ndarray
    dst: np.ndarray
    src0: np.ndarray
    src1: np.ndarray
    src2: np.ndarray
    src3: np.ndarray
    imm: np.ndarray
    imm2: np.ndarray
    pred: np.ndarray
    flags: np.ndarray
    reconv: np.ndarray
