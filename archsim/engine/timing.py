"""Time one kernel launch on a machine: build the engine state from the resolved Machine and the
Program, run the jitted loop, hand back raw counters.

Timing runs execute integer and address arithmetic for real (addresses, loop bounds, pointer
chases) but carry no floating-point values; global memory is backed only for the buffers given
as arrays (a pointer-chase table, say), the rest is address space (``Unbacked(nbytes)``): reads
there give 0 and writes are dropped, so a large timing run allocates no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archsim.engine import core as K
from archsim.engine import decode as D
from archsim.engine import execute as X
from archsim.engine import machine as MA
from archsim.engine import memory as M
from archsim.engine.functional import STACK_DEPTH
from archsim.engine.launch import ALIGN, GLOBAL_BASE
from archsim.errors import InputError, SimulationError
from archsim.isa.check import check
from archsim.isa.opcodes import tables
from archsim.isa.program import Launch, Program


@dataclass(frozen=True)
class Unbacked:
    """A buffer argument that exists only as address space in a timing run."""

    nbytes: int


def _place(prog: Program, args: dict):
    """Lay buffers out as the functional runs do; backed ones first get real bytes."""
    params = np.zeros(max(len(prog.params), 1), np.int64)
    addr = GLOBAL_BASE
    backed_end = GLOBAL_BASE
    images = []
    for i, name in enumerate(prog.params):
        if name not in args:
            raise InputError("arguments", f"no value for parameter {name!r} of kernel {prog.name}",
                             "give every .param a value")
        v = args[name]
        if isinstance(v, (np.ndarray, Unbacked)):
            addr = (addr + ALIGN - 1) // ALIGN * ALIGN
            params[i] = addr
            n = v.nbytes
            if isinstance(v, np.ndarray):
                images.append((addr, np.ascontiguousarray(v).view(np.uint8).ravel()))
                backed_end = max(backed_end, addr + n)
            addr += max(int(n), 1)
        else:
            params[i] = int(v)
    gsize = backed_end - GLOBAL_BASE
    g = np.zeros((gsize + 15) // 16 * 16 + 16, np.uint8)
    for a, raw in images:
        g[a - GLOBAL_BASE:a - GLOBAL_BASE + raw.size] = raw
    return params, g, gsize, addr - GLOBAL_BASE


def make_timing_fstate(prog: Program, machine, launch: Launch, args: dict, scratch_rows: int) -> X.FState:
    W = machine.cores.warp_width
    cores = machine.groups * machine.cores.per_group
    NW = cores * machine.cores.warp_slots
    R = max(prog.nregs, 1)
    params, g, gsize, vsize = _place(prog, args)
    tpb = launch.threads_per_block
    wpb = (tpb + W - 1) // W
    shared = int(prog.shared_bytes)
    spad = max((shared + 15) // 16 * 16, 16)
    smem = np.zeros((scratch_rows, spad), np.uint8)
    regs = np.zeros((NW, R, W), np.int64)
    geom = np.zeros(16, np.int64)
    geom[[X.G_W, X.G_WPB, X.G_TPB, X.G_BX, X.G_BY, X.G_BZ, X.G_GX, X.G_GY, X.G_GZ, X.G_NBLK, X.G_NCORES,
          X.G_SHARED, X.G_GBASE, X.G_GSIZE, X.G_MODE, X.G_VSIZE]] = [
        W, wpb, tpb, *launch.block, *launch.grid, launch.blocks, cores, shared, GLOBAL_BASE, gsize,
        X.MODE_TIMING, vsize]
    tmp_u32 = np.zeros(2, np.uint32)
    tmp_i64 = np.zeros(1, np.int64)
    return X.FState(
        regs=regs, rf32=regs.view(np.float32), ru32=regs.view(np.uint32), ru16=regs.view(np.uint16),
        rf64=regs.view(np.float64), preds=np.zeros((NW, 8, W), np.uint8),
        g8=g, g16=g.view(np.uint16), g32=g.view(np.uint32), g64=g.view(np.int64),
        s8=smem, s16=smem.view(np.uint16), s32=smem.view(np.uint32), s64=smem.view(np.int64),
        params=params, geom=geom, warp_block=np.zeros(NW, np.int32), warp_wib=np.zeros(NW, np.int32),
        warp_smem=np.zeros(NW, np.int32), warp_core=np.zeros(NW, np.int32),
        block_smem=np.full(launch.blocks, -1, np.int32),
        stack_pc=np.zeros((NW, STACK_DEPTH), np.int32), stack_rpc=np.full((NW, STACK_DEPTH), -1, np.int32),
        stack_mask=np.zeros((NW, STACK_DEPTH), np.int64), sp=np.zeros(NW, np.int32), wstate=np.zeros(NW, np.int32),
        icount=np.zeros(NW, np.int64), fault=np.zeros(6, np.int64), tmp_u32=tmp_u32,
        tmp_f32=tmp_u32.view(np.float32), tmp_i64=tmp_i64, tmp_f64=tmp_i64.view(np.float64),
        vals=np.zeros(W, np.int64), mat=np.zeros((3, 16, 16), np.float64), rows=np.zeros((8, 8), np.uint16),
        addr=np.zeros((NW, W), np.int64))


def occupancy_limits(prog: Program, machine, launch: Launch) -> tuple[int, int]:
    """(registers per warp, scratchpad bytes per block); rejects a block that cannot fit a core."""
    W = machine.cores.warp_width
    wpb = (launch.threads_per_block + W - 1) // W
    regs_per_warp = prog.nregs * W
    c = machine.cores
    scratch = machine.scratchpad.size_kib * 1024 - machine.scratchpad.cache_kib * 1024
    where = f"kernel {prog.name}"
    if wpb > c.warp_slots:
        raise InputError(where, f"a block of {launch.threads_per_block} threads needs {wpb} warps; a core of "
                         f"{machine.name} holds {c.warp_slots}", f"at most {c.warp_slots * W} threads per block")
    if wpb * regs_per_warp > machine.register_file.regs_per_core:
        raise InputError(where, f"a block needs {wpb * regs_per_warp} registers ({prog.nregs} per thread); a core "
                         f"of {machine.name} has {machine.register_file.regs_per_core}",
                         "fewer registers per thread or threads per block")
    if prog.shared_bytes > scratch:
        raise InputError(where, f"a block needs {prog.shared_bytes} bytes of scratchpad; a core of {machine.name} "
                         f"has {scratch}", f"at most {scratch} bytes")
    return regs_per_warp, prog.shared_bytes


def time_kernel(prog: Program, machine, launch: Launch, args: dict, *, max_cycles: int = 10**9,
                skip: bool = True) -> MA.KernelTiming:
    from archsim.config.derived import capabilities

    check(prog, capabilities(machine))
    regs_per_warp, smem = occupancy_limits(prog, machine, launch)
    W = machine.cores.warp_width
    wpb = (launch.threads_per_block + W - 1) // W
    scratch = machine.scratchpad.size_kib * 1024 - machine.scratchpad.cache_kib * 1024
    C = K.make_core_cfg(machine, scratch)
    cores = int(C.v[K.C_CORES])
    S = make_timing_fstate(prog, machine, launch, args, cores * machine.cores.max_blocks)
    TS = K.make_tstate(C, prog.nregs, launch.blocks, wpb, regs_per_warp, smem)
    Dd = D.decode(prog, machine)
    MS = M.make_mstate(machine, TS)
    out = np.zeros(5, np.int64)
    MA.run_loop(C, TS, S, prog.arrays(), tables(), Dd, MS, np.int64(max_cycles), skip, out)
    timing = MA.KernelTiming(outcome=int(out[0]), cycles=int(out[1]), warp_instructions=int(out[3]),
                             skipped_cycles=int(out[4]), stuck_warp=int(out[2]), stall=TS.stall.copy(),
                             flops=int(TS.flops.sum()), pipe_busy_cycles=TS.pipe_busy_cycles.copy(),
                             memory=M.mem_counters(MS, int(out[1])))
    if timing.outcome == MA.DONE:
        return timing
    w = timing.stuck_warp
    slots = machine.cores.warp_slots
    pc = int(S.stack_pc[w, max(S.sp[w] - 1, 0)]) if w >= 0 else 0
    where = prog.where(pc)
    who = f"core {w // slots} warp slot {w % slots} (block {int(S.warp_block[w])} warp {int(S.warp_wib[w])})" \
        if w >= 0 else "no warp"
    if timing.outcome == MA.FAULT:
        from archsim.engine.functional import FAULT_TEXT

        code, lane, addr, nbytes = (int(v) for v in S.fault[:4])
        text = FAULT_TEXT[code].format(addr=addr, bytes=nbytes, shared=prog.shared_bytes, blocks=launch.blocks)
        raise SimulationError(prog.where(int(S.fault[4])), f"{who} lane {lane}: {text}", partial=timing)
    state = {K.T_BAR: "waits at bar.sync", K.T_GRIDBAR: "waits at bar.grid", K.T_CPWAIT: "waits at cp.async.wait",
             K.T_DMAWAIT: "waits at dma.wait", K.T_RMAWAIT: "waits at rma.wait"}.get(int(TS.wst[w]), "is stuck") \
        if w >= 0 else ""
    if timing.outcome == MA.DEADLOCK:
        raise SimulationError(where, f"deadlock at cycle {timing.cycles}: {who} {state} and nothing can wake it",
                              partial=timing)
    raise SimulationError(where, f"stopped at --max-cycles {max_cycles}: {who} was at this instruction",
                          partial=timing)
