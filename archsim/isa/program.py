"""A Program: one kernel as a struct of numpy arrays (one row per instruction) plus its metadata.

Operand placement is generic and driven by the opcode's signature (isa/opcodes.yaml): the
destination (register, first register of a range, or predicate) goes to ``dst``; sources fill
``src0..src3`` in order (a memory operand puts its base register there and its offset in ``imm``,
the second memory operand's offset in ``imm2``); a source immediate sets its slot to -1, its value
in ``imm`` and the slot's bit in ``flags``; a label's instruction index, a special register's code,
a parameter's index and a plain immediate go to ``imm``. ``reconv`` holds each branch's
reconvergence point (its immediate post-dominator; -1 = the warp's exit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

NONE = -1
FLAG_IMM0, FLAG_IMM1, FLAG_IMM2, FLAG_IMM3 = 1, 2, 4, 8
FLAG_PRED_NEG = 16
FLAG_NO_VALUE = 32   # timing runs only: nothing the timing reads needs the instruction's values (engine/value_slice.py)

ARRAYS = ("op", "dst", "src0", "src1", "src2", "src3", "imm", "imm2", "pred", "flags", "reconv")
_DTYPES = {"op": np.int16, "dst": np.int16, "src0": np.int16, "src1": np.int16, "src2": np.int16,
           "src3": np.int16, "imm": np.int64, "imm2": np.int64, "pred": np.int8, "flags": np.int32,
           "reconv": np.int32, "line": np.int32}

ARG_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": None, "f64": np.float64, "i32": np.int32,
              "i64": np.int64, "u8": np.uint8}
ARG_INITS = ("random", "zeros", "ones", "range", "unbacked")   # unbacked: address space only (timing runs)


# One program's instruction arrays (ARRAYS) as the engine's @njit functions take them (Program.arrays).
ProgArrays = NamedTuple("ProgArrays", [(a, np.ndarray) for a in ARRAYS])


@dataclass(frozen=True)
class ArgSpec:
    """Test-harness data for one parameter (`.arg`): a buffer (dtype, shape, init) or a scalar value."""

    name: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    init: str = ""
    value: int | None = None

    @property
    def is_buffer(self) -> bool:
        return self.value is None

    @property
    def nbytes(self) -> int:
        n = int(np.prod(self.shape)) if self.shape else 1
        return n * (2 if self.dtype == "bf16" else np.dtype(ARG_DTYPES[self.dtype]).itemsize)


@dataclass(frozen=True)
class Launch:
    """A kernel launch: grid and block dimensions. ``spread`` (machines of several core groups):
    a launch of fewer blocks than the machine has cores deals them to the core groups in turn,
    and within a group to its clusters in turn (block 0 to group 0, block 1 to group 1, ...), as
    a program that splits its independent work over every core group runs; without it the cores
    fill in order (core group 0 first), which a kernel whose blocks share data by mesh position
    (the Sunway GEMM's row / column broadcasts) needs. A launch that fills the machine, and any
    launch on a GPU (one group), runs the same either way. ``period``: blocks (in dispatch order)
    after which the grid's pattern of data sharing repeats, where it does (a GEMM's raster
    groups); wave sampling measures whole periods. 0: no such pattern is known. ``cluster``:
    blocks per thread-block cluster (machines with clusters), along grid x, which it divides:
    blocks b and b' share a cluster when b // cluster == b' // cluster (isa/README.md)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    spread: bool = False
    period: int = 0
    cluster: int = 1        # blocks per thread-block cluster, along grid x (consecutive block ids)

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(eq=False)
class Program:
    name: str
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
    params: tuple[str, ...] = ()
    nregs: int = 1
    shared_bytes: int = 0
    launch: Launch | None = None
    args: tuple[ArgSpec, ...] = ()
    labels: tuple[tuple[int, str], ...] = ()  # (instruction index, name), sorted
    # debug information, not part of equality
    line: np.ndarray = field(default=None)
    source: str = "<program>"

    def __len__(self) -> int:
        return int(self.op.shape[0])

    def __eq__(self, other) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        if (self.name, self.params, self.nregs, self.shared_bytes, self.launch, self.args, self.labels) != (
                other.name, other.params, other.nregs, other.shared_bytes, other.launch, other.args, other.labels):
            return False
        return all(np.array_equal(getattr(self, a), getattr(other, a)) for a in ARRAYS)

    def where(self, pc: int) -> str:
        """`file:line` of instruction pc, for messages."""
        if self.line is not None and 0 <= pc < len(self.line) and self.line[pc] > 0:
            return f"{self.source}:{int(self.line[pc])}"
        return f"{self.source}: instruction {pc}"

    def content_digest(self) -> bytes:
        """SHA-256 of what the program does (instruction arrays, parameters, registers, shared
        bytes), not of its name or source lines: identical code, identical digest."""
        import hashlib

        h = hashlib.sha256()
        for a in ARRAYS:
            h.update(np.ascontiguousarray(getattr(self, a)).tobytes())
        h.update(repr((self.params, self.nregs, self.shared_bytes)).encode())
        return h.digest()

    def arrays(self):
        """The instruction arrays as the engine's NamedTuple."""
        return ProgArrays(*(getattr(self, a) for a in ARRAYS))

    @staticmethod
    def from_rows(name: str, rows: list[dict], **meta) -> "Program":
        n = len(rows)
        cols = {}
        for a in ARRAYS + ("line",):
            default = 0 if a in ("imm", "imm2", "flags", "line") else NONE
            cols[a] = np.array([r.get(a, default) for r in rows] if n else [], dtype=_DTYPES[a])
        return Program(name=name, **cols, **meta)
