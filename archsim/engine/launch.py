"""Launch set-up shared by the numba interpreter and its Python twin: the global-memory image,
kernel arguments (buffers and scalars), and reading results back.

Global memory in a functional run is one byte array covering ``[GLOBAL_BASE, GLOBAL_BASE+size)``;
buffers are placed 256-byte aligned in parameter order. Address 0 .. GLOBAL_BASE-1 is never
mapped, so a null or small pointer faults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from archsim.errors import InputError
from archsim.isa.program import ARG_DTYPES, Launch, Program
from archsim.isa.tensor_map import TensorMap

GLOBAL_BASE = 0x10000
ALIGN = 256


def f32_to_bf16_bits(x) -> np.ndarray:
    """float32 array -> bfloat16 bit patterns (uint16), round to nearest even, NaN kept."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = ((b & 0x7F800000) == 0x7F800000) & ((b & 0x7FFFFF) != 0)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = np.where(nan, (b >> 16) | 0x40, r)
    return (r & 0xFFFF).astype(np.uint16)


def bf16_bits_to_f32(h) -> np.ndarray:
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


@dataclass
class Memory:
    """A functional global-memory image."""

    data: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    buffers: dict = field(default_factory=dict)  # name -> (address, nbytes, dtype name, shape)

    def alloc(self, name: str, nbytes: int, dtype: str = "u8", shape=()) -> int:
        end = GLOBAL_BASE + len(self.data)
        addr = (end + ALIGN - 1) // ALIGN * ALIGN
        size = addr - GLOBAL_BASE + max(int(nbytes), 1)
        grown = np.zeros(size, np.uint8)
        grown[: len(self.data)] = self.data
        self.data = grown
        self.buffers[name] = (addr, int(nbytes), dtype, tuple(shape))
        return addr

    def write(self, addr: int, arr: np.ndarray) -> None:
        raw = np.ascontiguousarray(arr).view(np.uint8).ravel()
        o = addr - GLOBAL_BASE
        self.data[o:o + raw.size] = raw

    def read(self, name: str) -> np.ndarray:
        addr, nbytes, dtype, shape = self.buffers[name]
        o = addr - GLOBAL_BASE
        raw = self.data[o:o + nbytes].copy()
        if dtype == "bf16":
            return raw.view(np.uint16).reshape(shape)
        return raw.view(ARG_DTYPES[dtype]).reshape(shape)


def host_array(spec, rng: np.random.Generator) -> np.ndarray:
    """The initial contents of a `.arg` buffer (bf16 as uint16 bit patterns)."""
    n = int(np.prod(spec.shape))
    if spec.init == "random":
        base = rng.standard_normal(n)
    elif spec.init == "zeros":
        base = np.zeros(n)
    elif spec.init == "ones":
        base = np.ones(n)
    else:
        base = np.arange(n)
    if spec.dtype == "bf16":
        return f32_to_bf16_bits(base.astype(np.float32)).reshape(spec.shape)
    dt = ARG_DTYPES[spec.dtype]
    if np.issubdtype(dt, np.integer) and spec.init == "random":
        base = rng.integers(-100, 100, n) if dt != np.uint8 else rng.integers(0, 255, n)
    return base.astype(dt).reshape(spec.shape)


@dataclass(frozen=True)
class Unbacked:
    """A buffer argument that exists only as address space in a timing run. ``at``: the global
    address it starts at (a multiple of ALIGN, at or above the layout base); None lays it out in
    parameter order after the buffers before it. A Sunway buffer is placed in a memory segment
    this way: ``Unbacked(n, at=archsim.engine.dram.cross_base(machine))`` puts it in the cross
    segment, ``segment_base(machine, g)`` (at least GLOBAL_BASE) in core group g's own."""

    nbytes: int
    at: int | None = None


def arg_nbytes(spec) -> int:
    """Bytes of a `.arg` buffer."""
    size = 2 if spec.dtype == "bf16" else np.dtype(ARG_DTYPES[spec.dtype]).itemsize
    return int(np.prod(spec.shape)) * size


def default_args(prog: Program, seed: int = 0, timing: bool = False) -> dict:
    """Arguments from the program's `.arg` directives (what `archsim asm` runs with). An
    ``unbacked`` buffer is address space only: a timing run gets an Unbacked of its size (its
    loads read zeros, nothing is allocated); a functional run cannot take one."""
    rng = np.random.default_rng(seed)
    out = {}
    for a in prog.args:
        if a.is_buffer and a.init == "unbacked":
            if not timing:
                raise InputError(f"kernel {prog.name}: .arg {a.name}", "is unbacked (no values to compute with)",
                                 "run it with --timing, or give it random, zeros, ones or range")
            out[a.name] = Unbacked(arg_nbytes(a))
        else:
            out[a.name] = host_array(a, rng) if a.is_buffer else int(a.value)
    return out


def build_memory(prog: Program, args: dict, where: str = "arguments") -> tuple[Memory, np.ndarray, dict]:
    """Place buffer arguments in a Memory image and make the parameter vector.

    ``args`` maps parameter name -> numpy array (a buffer; bf16 as uint16) or int (a scalar).
    Returns (memory, params int64 array, buffer dtype names).
    """
    missing = [p for p in prog.params if p not in args]
    if missing:
        raise InputError(where, f"no value for parameter {missing[0]!r} of kernel {prog.name}",
                         "give every .param a .arg or an argument")
    extra = [k for k in args if k not in prog.params]
    if extra:
        raise InputError(where, f"{extra[0]!r} is not a parameter of kernel {prog.name}",
                         "parameters: " + ", ".join(prog.params))
    mem = Memory()
    params = np.zeros(max(len(prog.params), 1), np.int64)
    spec = {a.name: a for a in prog.args}
    maps = [(i, name) for i, name in enumerate(prog.params) if isinstance(args[name], TensorMap)]
    for i, name in maps:                               # first (TensorMap): filled in below
        params[i] = mem.alloc(name, 128, "i64", (16,))
    for i, name in enumerate(prog.params):
        v = args[name]
        if isinstance(v, TensorMap):
            continue
        if isinstance(v, np.ndarray):
            dt = "bf16" if (name in spec and spec[name].dtype == "bf16") else _dtype_name(v.dtype)
            addr = mem.alloc(name, v.nbytes, dt, v.shape)
            mem.write(addr, v)
            params[i] = addr
        else:
            params[i] = int(v)
    for i, name in maps:
        mem.write(int(params[i]), args[name].array(map_target(mem.buffers, args, name)))
    return mem, params, {n: mem.buffers[n][2] for n in mem.buffers}


def map_target(addresses: dict, args: dict, name: str) -> int:
    """The address of the buffer tensor map ``name`` describes (``addresses``: buffer name ->
    address, or a tuple starting with it)."""
    of = args[name].of
    if of not in addresses or isinstance(args.get(of), TensorMap):
        raise InputError(f"argument {name}", f"TensorMap of {of!r}, which is not a buffer argument",
                         "a TensorMap of one of the kernel's buffer parameters")
    a = addresses[of]
    return int(a[0] if isinstance(a, tuple) else a)


def _dtype_name(dt) -> str:
    dt = np.dtype(dt)
    for k, v in ARG_DTYPES.items():
        if v is not None and np.dtype(v) == dt:
            return k
    if dt == np.uint16:
        return "bf16"
    raise InputError("arguments", f"unsupported buffer dtype {dt}", ", ".join(ARG_DTYPES))


def resolve_launch(prog: Program, launch: Launch | None) -> Launch:
    launch = launch or prog.launch
    if launch is None:
        raise InputError(prog.source, f"kernel {prog.name} has no launch", "a .launch directive or --grid/--block")
    k = launch.cluster
    if not isinstance(k, int) or k < 1 or launch.grid[0] % k:
        raise InputError(f"kernel {prog.name}", f"clusters of {k} with grid x {launch.grid[0]}",
                         "a cluster size >= 1 dividing grid x")
    return launch


@dataclass
class FunctionalResult:
    """What a functional run leaves behind (both interpreters return this)."""

    memory: Memory
    regs: np.ndarray        # int64 [total warps, nregs, W]: every lane's registers at the end
    preds: np.ndarray       # bool  [total warps, 8, W]
    warp_instructions: int  # warp-instructions issued (guarded-off instructions count too)
    launch: Launch = None

    def output(self, name: str) -> np.ndarray:
        return self.memory.read(name)
