"""What a job asks of the modelled device and of the host, estimated before anything is allocated
or simulated, so that a job that cannot fit or cannot finish is refused with one line naming the
estimate and, where there is one, the option that raises the limit.

- Device memory: the buffers one kernel lays out (``time_kernel``), one decoder block's tensors
  (``run`` / ``compare``), a micro kernel's footprint, and an assembly file's ``.arg`` buffers
  must fit the machine's DRAM (``dram.capacity_gib``; a machine without it is not checked).
- Host memory: what a functional run keeps (its tensors and float64 reference copies, the
  reference attention's scores) and the ``.arg`` buffers of an assembly file must fit what the
  host has available.
- Work: a lower bound of the warp-instructions a run simulates, from each kernel's flops (no
  ISA instruction does more than ``MAX_FLOPS_PER_INSTRUCTION``: a warp's mma.m16n8k16) and the
  share of its blocks that wave sampling simulates at the least (the head of waves over a grid
  at one block a core). ``--max-instructions`` sets the limit.
"""

from __future__ import annotations

import math
import os

from archsim.errors import InputError

# the most flops one warp-instruction of the ISA performs: mma.m16n8k16 (2 x 16 x 8 x 16)
MAX_FLOPS_PER_INSTRUCTION = 4096
# default limit on the estimated (lower bound of) simulated warp-instructions of one job: at the
# engine's 0.5-2 M warp-instructions a second, a day or more of simulation (the largest built-in
# job, bloom-176b's train step on sw26010pro, is bounded at 1.5e10)
DEFAULT_MAX_INSTRUCTIONS = 10**11
# share of the host's available memory a job may plan to use
HOST_SHARE = 0.8


def gib(nbytes: float) -> str:
    """A byte count for a message, 3 significant digits in the largest binary unit it reaches."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def device_bytes(machine) -> int | None:
    """The machine's DRAM capacity in bytes (None: not given in its config)."""
    cap = machine.dram.capacity_gib
    return None if cap is None else int(cap * 2**30)


def check_device(machine, nbytes: int, what: str, where: str, allowed: str) -> None:
    """InputError when ``nbytes`` (what ``what`` needs) exceed the machine's DRAM."""
    cap = device_bytes(machine)
    if cap is not None and nbytes > cap:
        raise InputError(where, f"{what}: {gib(nbytes)}, more than the {gib(cap)} of DRAM {machine.name} has", allowed)


def host_available_bytes() -> int:
    """Memory the host can give a job now: MemAvailable (Linux), else the physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**62   # unknown: no check


def check_host(nbytes: int, what: str, where: str, allowed: str) -> None:
    """InputError when ``nbytes`` exceed the host's share for one job."""
    have = int(host_available_bytes() * HOST_SHARE)
    if nbytes > have:
        raise InputError(where, f"{what}: about {gib(nbytes)} of host memory, more than the {gib(have)} available",
                         allowed)


def check_asm_args(machine, prog, timing: bool) -> None:
    """Before `archsim asm` fills its ``.arg`` buffers: they fit the device, and the backed ones
    (all of them in a functional run; with --timing those not ``unbacked``) fit the host."""
    from archsim.engine.launch import arg_nbytes

    bufs = [(a, arg_nbytes(a)) for a in prog.args if a.is_buffer]
    where = f"kernel {prog.name}: .arg"
    allowed = "smaller .arg shapes"
    check_device(machine, sum(n for _, n in bufs), "its .arg buffers", where, allowed)
    backed = sum(n for a, n in bufs if not (timing and a.init == "unbacked"))
    check_host(3 * backed, "its .arg buffers (with their copies)", where,
               allowed + (", or unbacked buffers with --timing" if timing else ""))


# ---- workloads ----------------------------------------------------------------------------------

_STORE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}


def block_tensor_bytes(wl) -> int:
    """Bytes of one decoder block's tensors (weights, activations, KV cache, gradients) on the device."""
    es = _STORE_BYTES[wl.scenario.dtype]
    return sum(math.prod(s) for s in wl.tensor_shapes().values()) * es


def functional_host_bytes(wl) -> int:
    """Host memory a functional run of one block keeps at its peak: the tensors in their storage
    format and as float64 (initial values, the reference pass, the checks: about four copies),
    and the reference attention's float64 scores with the softmax's temporaries (about four)."""
    elems = sum(math.prod(s) for s in wl.tensor_shapes().values())
    cells = max((o.dims["batch"] * o.dims["heads"] * o.dims["q_len"] * o.dims["kv_len"]
                 for o in wl.block_ops() if o.kind == "attention"), default=0)
    return elems * (_STORE_BYTES[wl.scenario.dtype] + 4 * 8) + 4 * 8 * cells


_SHAPE_HINT = "a smaller --batch or --seq, or a machine with more memory"


def check_workload(machine, wl, functional: bool) -> None:
    """Before emission: one block's tensors fit the device; a functional run fits the host."""
    where = f"workload {wl.name}"
    check_device(machine, block_tensor_bytes(wl), "one decoder block's tensors", where, _SHAPE_HINT)
    if functional:
        check_host(functional_host_bytes(wl), "a functional run of one block and its numpy checks", where,
                   "a smaller --batch or --seq (functional runs check small shapes against numpy)")


def least_instructions(kernels, cores: int, waves: int | None) -> int:
    """A lower bound of the warp-instructions simulating ``kernels`` takes: each (kernel, count)
    runs at least flops / MAX_FLOPS_PER_INSTRUCTION of them, of which wave sampling (``waves``;
    None: every block) simulates at least ``waves * cores`` blocks of the grid."""
    total = 0
    for k in kernels:
        blocks = max(int(k.launch.blocks), 1)
        share = 1.0 if waves is None else min(1.0, waves * cores / blocks)
        total += int(k.flops / MAX_FLOPS_PER_INSTRUCTION * share)
    return total


def check_work(machine_name: str, kernels, cores: int, waves: int | None, limit: int, where: str,
               option: str = "--max-instructions N") -> None:
    """InputError when the lower bound of the simulated warp-instructions exceeds ``limit``
    (``option``: what raises it)."""
    need = least_instructions(kernels, cores, waves)
    if need > limit:
        raise InputError(where, f"simulating it on {machine_name} takes at least {need:.3g} warp-instructions "
                         f"(estimated from its flops), beyond the limit {limit:.3g}",
                         f"{option} to raise the limit, or a smaller --batch or --seq")


__all__ = ["DEFAULT_MAX_INSTRUCTIONS", "MAX_FLOPS_PER_INSTRUCTION", "block_tensor_bytes", "check_asm_args", "check_device",
           "check_host", "check_work", "check_workload", "device_bytes", "functional_host_bytes", "gib",
           "host_available_bytes", "least_instructions"]
