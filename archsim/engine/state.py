"""Engine state types: NamedTuples of numpy arrays (numba passes them to @njit functions)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


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
