"""Time one kernel launch on a machine: build the engine state from the resolved Machine and the
Program, run the jitted loop, hand back raw counters.

Timing runs execute integer and address arithmetic for real (addresses, loop bounds, pointer
chases) but carry no floating-point values; global memory is backed only for the buffers given
as arrays (a pointer-chase table, say), the rest is address space (``Unbacked(nbytes)``): reads
there give 0 and writes are dropped, so a large timing run allocates no tensors.
"""

from __future__ import annotations

import time

import numpy as np

from archsim.engine import core as K
from archsim.engine import decode as D
from archsim.engine import execute as X
from archsim.engine import machine as MA
from archsim.engine import mem_state as MST
from archsim.engine import memory as M
from archsim.engine import unit_timeline as UT
from archsim.engine.functional import build_fstate
from archsim.engine.jit import compile_seconds
from archsim.engine.launch import ALIGN, GLOBAL_BASE, TensorMap, Unbacked, map_target
from archsim.engine.state import copy_state_array
from archsim.engine import value_slice as VS
from archsim.engine.warps import (K_END, K_FINISHED, K_NEXT, T_BAR, T_BKWAIT, T_CBAR, T_CPWAIT, T_DMAWAIT,
                                  T_GRIDBAR, T_RMAWAIT)
from archsim.errors import InputError, SimulationError
from archsim.resources import check_device
from archsim.isa.check import check
from archsim.isa.opcodes import opcodes, tables
from archsim.isa.program import Launch, Program


def shared_buffers(machine, sizes) -> list:
    """Address space for buffers of these sizes that every core shares: on a machine whose memory
    is split into segments (Sunway) they sit in the cross segment, interleaved over every memory
    controller (how a program that uses all core groups shares data); elsewhere they are laid out
    from the usual base."""
    from archsim.engine.dram import cross_base

    if machine.memory_controllers.address_mapping.kind != "segments":
        return [Unbacked(int(n)) for n in sizes]
    addr = cross_base(machine)
    out = []
    for n in sizes:
        out.append(Unbacked(int(n), at=addr))
        addr += (max(int(n), 1) + ALIGN - 1) // ALIGN * ALIGN
    return out


def _layout(prog: Program, args: dict, base: int | None = None):
    """Lay buffers out as the functional runs do, from global address ``base`` (default
    GLOBAL_BASE, a multiple of ALIGN): in parameter order, ALIGN-aligned; an ``Unbacked(n, at=A)``
    sits at A instead and the others are laid out around it; buffers must not overlap. Returns
    (parameter vector, spans, backed buffers {name: (address, array)}, byte images, base, end of
    the last backed buffer, highest end); no memory image is built."""
    base = GLOBAL_BASE if base is None else int(base)
    if base < GLOBAL_BASE or base % ALIGN:
        raise InputError("buffer placement", f"layout base {base:#x}",
                         f"a multiple of {ALIGN} at or above {GLOBAL_BASE:#x}")
    params = np.zeros(max(len(prog.params), 1), np.int64)
    addr = base
    backed_end = base
    top = base
    images = []
    placed = {}
    spans = []
    for name in prog.params:
        if name not in args:
            raise InputError("arguments", f"no value for parameter {name!r} of kernel {prog.name}",
                             "give every .param a value")
    maps = [(i, name) for i, name in enumerate(prog.params) if isinstance(args[name], TensorMap)]
    for i, name in maps:                    # first, in the backed image (launch.TensorMap)
        addr = (addr + ALIGN - 1) // ALIGN * ALIGN
        params[i] = addr
        spans.append((addr, addr + 128, name))
        addr += 128
        backed_end = top = addr
    for i, name in enumerate(prog.params):
        v = args[name]
        if isinstance(v, TensorMap):
            continue
        if isinstance(v, (np.ndarray, Unbacked)):
            n = max(int(v.nbytes), 1)
            at = v.at if isinstance(v, Unbacked) else None
            if at is None:
                addr = (addr + ALIGN - 1) // ALIGN * ALIGN
                a = addr
                addr += n
            else:
                a = int(at)
                if a < base or a % ALIGN:
                    raise InputError(f"argument {name}", f"Unbacked(at={a:#x})",
                                     f"a multiple of {ALIGN} at or above the layout base {base:#x}")
            params[i] = a
            spans.append((a, a + n, name))
            top = max(top, a + n)
            if isinstance(v, np.ndarray):
                images.append((a, np.ascontiguousarray(v).view(np.uint8).ravel()))
                placed[name] = (a, v)
                backed_end = max(backed_end, a + int(v.nbytes))
        else:
            params[i] = int(v)
    where = {n: int(params[i]) for i, n in enumerate(prog.params) if isinstance(args[n], (np.ndarray, Unbacked))}
    for i, name in maps:
        images.append((int(params[i]), args[name].array(map_target(where, args, name)).view(np.uint8)))
    spans.sort()
    for (a0, e0, n0), (a1, _, n1) in zip(spans, spans[1:]):
        if a1 < e0:
            raise InputError(f"argument {n1}", f"at {a1:#x} it overlaps buffer {n0} [{a0:#x}, {e0:#x})",
                             "non-overlapping buffers (move its Unbacked(at=...))")
    return params, spans, placed, images, base, backed_end, top


def _place(prog: Program, args: dict, base: int | None = None, machine=None):
    """The layout (_layout) and the memory image: backed buffers (numpy arrays) get real bytes,
    the image covering [base, end of the last backed buffer); unbacked ones are address space up
    to the highest end. Given ``machine``, the buffers must end within its DRAM capacity."""
    params, spans, placed, images, base, backed_end, top = _layout(prog, args, base)
    if machine is not None:   # before the image is allocated
        check_device(machine, sum(e - a for a, e, _ in spans), f"the buffers of kernel {prog.name}",
                     f"kernel {prog.name}", "smaller buffers (sizes, footprint, batch or seq)")
    gsize = backed_end - base
    g = np.zeros((gsize + 15) // 16 * 16 + 16, np.uint8)
    for a, raw in images:
        g[a - base:a - base + raw.size] = raw
    return params, g, gsize, top - base, placed


def buffer_addresses(prog: Program, args: dict, base: int | None = None) -> dict[str, int]:
    """The global address each buffer argument gets (a pointer-chase table holds addresses)."""
    params = _layout(prog, args, base)[0]
    return {n: int(params[i]) for i, n in enumerate(prog.params)
            if isinstance(args[n], (np.ndarray, Unbacked, TensorMap))}


def param_values(prog: Program, args: dict, base: int | None = None) -> np.ndarray:
    """The kernel's parameter vector as a timing run sees it: buffer addresses and scalars."""
    return _layout(prog, args, base)[0]


def make_timing_fstate(prog: Program, machine, launch: Launch, args: dict, scratch_rows: int,
                       base: int | None = None, slots: int | None = None):
    """Warp slots of every core (filled by block dispatch; ``slots`` per core, default the
    machine's); timing mode; backed buffers only. Returns ({name: (address, array)} of the
    backed buffers, state)."""
    cores = machine.groups * machine.cores.per_group
    NW = cores * (machine.cores.warp_slots if slots is None else slots)
    params, g, gsize, vsize, placed = _place(prog, args, base, machine)
    zeros = np.zeros(NW, np.int32)
    S = build_fstate(NW=NW, nregs=prog.nregs, W=machine.cores.warp_width, g=g, gsize=gsize, vsize=vsize,
                        smem_rows=scratch_rows, shared=int(prog.shared_bytes), params=params, launch=launch,
                        ncores=cores, mode=X.MODE_TIMING, warp_block=zeros, warp_wib=zeros, warp_smem=zeros,
                        warp_core=zeros, block_smem=np.full(launch.blocks, -1, np.int32), stack_mask0=0)
    S.geom[X.G_GBASE] = GLOBAL_BASE if base is None else int(base)  # global byte 0 of the image
    return placed, S


def scratch_bytes(machine) -> int:
    """Scratchpad bytes a core's blocks can use: the scratchpad less the part kept as a data cache
    (a Sunway LDM's ``cache_kib``)."""
    return machine.scratchpad.size_kib * 1024 - machine.scratchpad.cache_kib * 1024


def kernel_machine(prog: Program, machine, launch: Launch):
    """The machine as this launch sees it. With ``scratchpad.carveout: per_kernel`` the shared
    memory is the smallest allowed carveout (at most ``size_kib``) that holds as many blocks as
    the core's warp slots, registers and block slots allow, or as the largest carveout holds; the
    rest of the unified array is L1 cache (the CUDA driver's choice when a kernel states no
    preference: occupancy first, then as much L1 as remains). A kernel without shared memory gets
    the smallest carveout. Otherwise the machine itself."""
    sp = machine.scratchpad
    if sp.carveout != "per_kernel":
        return machine
    n = _blocks_by_slots_and_registers(prog, machine, launch)
    allowed = sorted(k for k in sp.carveouts_kib if k <= sp.size_kib)
    need = block_shared_bytes(prog, machine)
    if need:
        n = min(n, allowed[-1] * 1024 // need)      # the most the largest carveout holds
    pick = next((k for k in allowed if k * 1024 >= max(n, 1) * need), allowed[-1])
    if pick == sp.size_kib:
        return machine
    return machine.model_copy(update={"scratchpad": sp.model_copy(update={"size_kib": pick})})


def _blocks_by_slots_and_registers(prog: Program, machine, launch: Launch) -> int:
    """Blocks of this launch one core holds by its block slots, warp slots and registers."""
    c = machine.cores
    wpb = (launch.threads_per_block + c.warp_width - 1) // c.warp_width
    return min(c.max_blocks, c.warp_slots // wpb,
               machine.register_file.regs_per_core // max(wpb * prog.nregs * c.warp_width, 1))


def blocks_per_core(prog: Program, machine, launch: Launch) -> int:
    """How many blocks of this launch one core holds at once (warp slots, registers, scratchpad,
    block slots); rejects a block that does not fit (InputError)."""
    machine = kernel_machine(prog, machine, launch)
    _, smem = occupancy_limits(prog, machine, launch)
    n = _blocks_by_slots_and_registers(prog, machine, launch)
    if smem > 0:
        n = min(n, scratch_bytes(machine) // smem)
    return max(int(n), 1)


def resident_slots(prog: Program, machine, launch: Launch) -> tuple[int, int]:
    """(warp slots, block slots) per core that the engine keeps for a launch: as many as its
    occupancy can ever fill (blocks_per_core). A core's slots above those would never hold a warp,
    and block dispatch takes the first free ones, so a launch runs exactly as with the machine's
    whole complement; keeping fewer makes the per-warp state (registers, scoreboard) of the warps
    that run lie close together instead of spread over every slot of every core."""
    c = machine.cores
    wpb = (launch.threads_per_block + c.warp_width - 1) // c.warp_width
    n = blocks_per_core(prog, machine, launch)
    return min(c.warp_slots, n * wpb), n


def block_shared_bytes(prog: Program, machine) -> int:
    """Scratchpad one block holds: its own shared memory plus what the driver reserves per
    resident block (``scratchpad.reserved_per_block_bytes``; 1 KB on compute capability 8.x and
    9.x), which a kernel without shared memory pays too."""
    sp = machine.scratchpad
    return prog.shared_bytes + (sp.reserved_per_block_bytes if sp.kind == "shared" else 0)


def occupancy_limits(prog: Program, machine, launch: Launch) -> tuple[int, int]:
    """(registers per warp, scratchpad bytes per block); rejects a block that cannot fit a core."""
    W = machine.cores.warp_width
    wpb = (launch.threads_per_block + W - 1) // W
    regs_per_warp = prog.nregs * W
    c = machine.cores
    scratch = scratch_bytes(machine)
    where = f"kernel {prog.name}"
    if wpb > c.warp_slots:
        raise InputError(where, f"a block of {launch.threads_per_block} threads needs {wpb} warps; a core of "
                         f"{machine.name} holds {c.warp_slots}", f"at most {c.warp_slots * W} threads per block")
    if wpb * regs_per_warp > machine.register_file.regs_per_core:
        raise InputError(where, f"a block needs {wpb * regs_per_warp} registers ({prog.nregs} per thread); a core "
                         f"of {machine.name} has {machine.register_file.regs_per_core}",
                         "fewer registers per thread or threads per block")
    smem = block_shared_bytes(prog, machine)
    if smem > scratch:
        reserve = smem - prog.shared_bytes
        raise InputError(where, f"a block needs {prog.shared_bytes} bytes of scratchpad"
                         + (f" (+{reserve} the driver reserves)" if reserve else "")
                         + f"; a core of {machine.name} has {scratch}", f"at most {scratch - reserve} bytes")
    return regs_per_warp, smem


PLACEMENTS = ("cross", "private")


def check_placement(machine, placement: str, end: int | None = None, kernel: str = "") -> bool:
    """True for the private placement, False for cross; InputError when the machine has no private
    segments for it, or when the buffers (up to address `end`) do not fit one segment."""
    from archsim.engine.dram import segment_bytes

    if placement not in PLACEMENTS:
        raise InputError("placement", repr(placement), "private or cross")
    if placement == "cross":
        return False
    seg = segment_bytes(machine)
    if seg <= 0:
        raise InputError("placement", f"private: {machine.name} has no private segments (its memory is "
                         "interleaved over every channel)", "cross, or a machine with a segments address mapping")
    if end is not None and end > seg:
        raise InputError("placement", f"private: the buffers of kernel {kernel} end at {end:#x}, beyond one "
                         f"private segment of {seg:#x} bytes", "cross, or smaller buffers (batch, seq)")
    return True


def time_kernel(prog: Program, machine, launch: Launch, args: dict, *, max_cycles: int = 10**9,
                skip: bool = True, window_cycles: int = 1024,
                blocks: tuple[int, int] | None = None, base: int | None = None,
                placement: str = "cross") -> MA.KernelTiming:
    """Time `launch` of `prog`. `blocks` = (first, end) runs only that range of the launch's blocks
    (they keep their grid ids and so their addresses): wave sampling (archsim.sample) uses it.
    `base`: the global address the buffers are laid out from (default GLOBAL_BASE; see _place;
    on a Sunway ``dram.cross_base(machine)`` puts every buffer in the cross segment).
    `placement` "private" (machines with private segments): every core group sees the buffers at
    their laid-out addresses in its own segment (mem_state.placed_addr), so they must lie below one
    segment's size; "cross" (default): addresses are physical."""
    from archsim import kernel_cache

    ckey = kernel_key(prog, machine, launch, args, max_cycles=max_cycles, skip=skip, window_cycles=window_cycles,
                      blocks=blocks, base=base, placement=placement)
    cached = kernel_cache.load(ckey)
    if cached is not None:
        return cached
    run = start_kernel(prog, machine, launch, args, window_cycles=window_cycles, blocks=blocks, base=base,
                       placement=placement, skip=skip)
    run.advance(max_cycles)
    timing = run.finish(max_cycles)
    kernel_cache.store(ckey, timing)
    return timing


def kernel_key(prog: Program, machine, launch: Launch, args: dict, *, max_cycles: int = 10**9, skip: bool = True,
               window_cycles: int = 1024, blocks: tuple[int, int] | None = None, base: int | None = None,
               placement: str = "cross") -> str | None:
    """The kernel cache's key of time_kernel with these arguments."""
    from archsim import kernel_cache

    return kernel_cache.key(prog, machine, launch, args, (max_cycles, skip, window_cycles, blocks, base, placement))


def _clone_state(x, memo: dict):
    """A copy of engine state (NamedTuples of arrays, nested) whose arrays that share memory
    still share it: a register file seen as f32 and u32, the warp states the DMA engines read.
    ``memo``: the copies of the buffers below the arrays, by id, shared by every part of one state.
    A sparse array (state.sparse_zeros) is copied sparse."""
    if isinstance(x, np.ndarray):
        root = x
        while isinstance(root.base, np.ndarray):
            root = root.base
        new = memo.get(id(root))
        if new is None:
            new = memo[id(root)] = copy_state_array(root)
        if x is root:
            return new
        off = x.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        return np.ndarray(x.shape, x.dtype, buffer=new, offset=off, strides=x.strides)
    if isinstance(x, tuple):
        items = [_clone_state(v, memo) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
    return x


class KernelRun:
    """A launch being timed: its engine state, run up to a cycle at a time (``advance``), its
    counters readable at any stop (``counters``). time_kernel runs one to the end; interval
    sampling (archsim.interval) looks at it between stops."""

    def __init__(self, prog: Program, machine, launch: Launch, args: dict, window_cycles: int,
                 blocks: tuple[int, int] | None, base: int | None, placement: str, skip: bool,
                 value_slice: bool = True):
        from archsim.config.derived import capabilities

        check(prog, capabilities(machine))
        self.made_with = (prog, machine, launch, args, window_cycles, base, placement, skip)
        self.prog, self.launch, self.skip = prog, launch, bool(skip)
        machine = self.machine = kernel_machine(prog, machine, launch)
        regs_per_warp, smem = occupancy_limits(prog, machine, launch)
        W = machine.cores.warp_width
        wpb = (launch.threads_per_block + W - 1) // W
        scratch = scratch_bytes(machine)
        self.slots, nbs = resident_slots(prog, machine, launch)
        _check_cluster(prog, machine, launch, blocks)
        self.C = K.make_core_cfg(machine, scratch, self.slots, nbs, launch.cluster)
        cores = int(self.C.v[K.C_CORES])
        self.placed, self.S = make_timing_fstate(prog, machine, launch, args, cores * nbs, base, self.slots)
        S = self.S
        private = check_placement(machine, placement, int(S.geom[X.G_GBASE] + S.geom[X.G_VSIZE]), prog.name)
        first, end = (0, launch.blocks) if blocks is None else (int(blocks[0]), int(blocks[1]))
        if not 0 <= first < end <= launch.blocks:
            raise InputError(f"kernel {prog.name}", f"block range [{first}, {end})",
                             f"a non-empty range within the launch's {launch.blocks} blocks")
        self.first, self.end = first, end
        self.TS = K.make_tstate(self.C, prog.nregs, launch.blocks, wpb, regs_per_warp, smem, first, end,
                                K.dispatch_order(machine, launch.spread, end - first), npc=len(prog),
                                gpc_sms=machine.clusters.gpc_sms if machine.clusters is not None else None)
        self.Dd = D.decode(prog, machine)
        self.MS = MST.make_mstate(machine, self.TS, private)
        self.out = np.zeros(MA.RO_N, np.int64)
        self.TL, self.tlk = MA.make_timeline(self.MS, window_cycles)
        self.simulated = 0          # warp-instructions counted into kernel_cache.stats so far
        self.visits_counted = {}    # unit visits (memory.visit_counts) and cycles counted there so far
        self.cycles_counted = 0
        self.started = False
        # the instructions whose values the timing needs (engine/value_slice.py)
        if value_slice and VS.ENABLED:
            self.P, (S.geom[X.G_WATCH_LO], S.geom[X.G_WATCH_HI]) = VS.timing_view(prog, bool(S.geom[X.G_GSIZE] > 0))
        else:
            self.P = prog.arrays()

    @property
    def now(self) -> int:
        return int(self.out[MA.RO_CYCLES])

    @property
    def done(self) -> bool:
        """The launch ended (done, a fault or a deadlock); it can only go on after a cycle limit."""
        return self.started and int(self.out[MA.RO_OUTCOME]) != MA.CYCLE_LIMIT

    def advance(self, until: int) -> int:
        """Run on until the launch ends or reaches cycle ``until``; returns the outcome. A launch
        that has ended stays as it is."""
        from archsim import kernel_cache

        if self.done:
            return int(self.out[MA.RO_OUTCOME])
        self.started = True
        MA.load_loop(self.C, self.TS, self.S, self.P, tables(), self.Dd, self.MS, self.TL, self.tlk, self.skip)
        t0, c0 = time.perf_counter(), compile_seconds()
        MA.run_loop(self.C, self.TS, self.S, self.P, tables(), self.Dd, self.MS, self.TL, self.tlk,
                    np.int64(until), self.skip, self.out, start=self.now)
        kernel_cache.stats["simulate_seconds"] += time.perf_counter() - t0 - (compile_seconds() - c0)
        self._count_visits()
        issued = int(self.out[MA.RO_ISSUED])
        kernel_cache.stats["simulated_warp_instructions"] += issued - self.simulated
        self.simulated = issued
        if int(self.out[MA.RO_OUTCOME]) == MA.FAULT and int(self.S.fault[0]) == X.F_SLICE:
            # a write landed on the slots the slice watched: the same launch from cycle 0, every
            # value computed, to where this one was asked to go (its blocks as a fork's, if it is one)
            prog, machine, launch, args, window_cycles, base, placement, skip = self.made_with
            again = KernelRun(prog, machine, launch, args, window_cycles, (self.first, self.end), base, placement,
                              skip, value_slice=False)
            again.advance(until)
            self.__dict__.update(again.__dict__)
        return int(self.out[MA.RO_OUTCOME])

    def _count_visits(self) -> None:
        """Add the unit visits and cycles simulated since the last count to kernel_cache.stats."""
        from archsim import kernel_cache

        now = M.visit_counts(self.MS)
        st = kernel_cache.stats
        for fam, (v, c) in now.items():
            v0, c0 = self.visits_counted.get(fam, (0, 0))
            st[f"visits.{fam}"] = st.get(f"visits.{fam}", 0) + v - v0
            st[f"changed.{fam}"] = st.get(f"changed.{fam}", 0) + c - c0
        st["simulated_cycles"] += self.now - self.cycles_counted
        self.visits_counted, self.cycles_counted = now, self.now

    @property
    def dispatched(self) -> int:
        """The grid id of the next block to dispatch."""
        return int(self.TS.k[K_NEXT])

    @property
    def retired(self) -> int:
        """Blocks retired so far, counted from the range's first."""
        return int(self.TS.k[K_FINISHED]) - self.first

    def fork(self, end: int | None = None) -> "KernelRun":
        """A copy of the launch as it stands, to go on by itself. With ``end``, the copy
        dispatches no block from ``end`` on. Taken before block ``end`` is dispatched, it goes on
        exactly as blocks=(first, end) would have run from the start: blocks are dispatched in
        grid order, and the range's end is read only by a dispatch and by the end of the
        launch. (A spread launch of fewer blocks than cores, whose first dispatch order depends
        on its size, is the exception; no such launch has waves to sample.)"""
        new = object.__new__(KernelRun)
        new.__dict__.update(self.__dict__)
        memo: dict = {}
        for name in ("C", "S", "TS", "Dd", "MS", "out", "TL", "tlk"):
            setattr(new, name, _clone_state(getattr(self, name), memo))
        if end is not None:
            if end > self.end:
                raise ValueError(f"fork(end={end}): past the range's end {self.end}")
            if end < self.dispatched:
                raise ValueError(f"fork(end={end}): blocks up to {self.dispatched} are already dispatched")
            new.TS.k[K_END] = end
            new.end = int(end)
        return new

    def counters(self) -> MA.KernelTiming:
        """The counters at the cycle the run stands at (the outcome and cycle of the last advance)."""
        from archsim.config.derived import l1_cache_kib

        TS, S, out, machine = self.TS, self.S, self.out, self.machine
        buffers = {}
        for name, (a, v) in self.placed.items():  # backed buffers as the kernel left them
            o = a - int(S.geom[X.G_GBASE])
            raw = S.g8[o:o + v.nbytes].copy()
            buffers[name] = raw.view(v.dtype).reshape(v.shape)
        first, end = self.first, self.end
        return MA.KernelTiming(
            outcome=int(out[MA.RO_OUTCOME]), cycles=int(out[MA.RO_CYCLES]),
            warp_instructions=int(out[MA.RO_ISSUED]), skipped_cycles=int(out[MA.RO_SKIPPED]), stuck_warp=int(out[MA.RO_WARP]), stall=TS.stall.copy(), flops=int(TS.flops.sum()),
            pipe_busy_cycles=TS.pipe_busy_cycles.copy(),
            memory=dict(M.mem_counters(self.MS, int(out[MA.RO_CYCLES])), carveout={
                "shared_kib": machine.scratchpad.size_kib, "l1_cache_kib": l1_cache_kib(machine)}),
            timeline=MA.timeline_rows(self.TL, self.tlk, TS, self.MS), buffers=buffers,
            timeline_units=UT.unit_layout(machine, self.MS),
            block_start=TS.blk_start[first:end].copy(), block_done=TS.blk_done[first:end].copy(),
            block_core=TS.blk_core[first:end].copy(), first_block=first)

    def finish(self, max_cycles: int) -> MA.KernelTiming:
        """The counters of a launch run to its end; SimulationError (with them) if it did not end."""
        timing = self.counters()
        if timing.outcome == MA.DONE:
            return timing
        prog, S, TS, slots = self.prog, self.S, self.TS, self.slots
        w = timing.stuck_warp
        pc = int(S.stack_pc[w, max(S.sp[w] - 1, 0)]) if w >= 0 else 0
        where = prog.where(pc)
        who = f"core {w // slots} warp slot {w % slots} (block {int(S.warp_block[w])} warp {int(S.warp_wib[w])})" \
            if w >= 0 else "no warp"
        if timing.outcome == MA.FAULT:
            from archsim.engine.functional import FAULT_TEXT

            code, lane, addr, nbytes = (int(v) for v in S.fault[:4])
            text = FAULT_TEXT[code].format(addr=addr, bytes=nbytes, shared=prog.shared_bytes,
                                           blocks=self.launch.blocks)
            raise SimulationError(prog.where(int(S.fault[4])), f"{who} lane {lane}: {text}", partial=timing)
        state = {T_BAR: "waits at bar.sync", T_GRIDBAR: "waits at bar.grid", T_CBAR: "waits at barrier.cluster",
                 T_CPWAIT: "waits at cp.async.wait", T_BKWAIT: "waits at cp.async.bulk.wait_group",
                 T_DMAWAIT: "waits at dma.wait", T_RMAWAIT: "waits at rma.wait"}.get(int(TS.wst[w]), "is stuck") \
            if w >= 0 else ""
        if w >= 0 and state == "is stuck" and opcodes()[int(prog.op[pc])].sem == "mbwait":
            from archsim.engine.functional import mbwait_text

            mask = int(S.stack_mask[w, max(S.sp[w] - 1, 0)])
            lane = max((mask & -mask).bit_length() - 1, 0)   # (the lowest lane on its path: the guard aside)
            addr = int(prog.imm[pc]) + (int(S.regs[w, prog.src0[pc], lane]) if prog.src0[pc] >= 0 else 0)
            state = mbwait_text(S.s64[S.warp_smem[w]], addr) if 0 <= addr < S.s64.shape[1] * 8 else \
                "waits at mbarrier.wait"
        if timing.outcome == MA.DEADLOCK:
            raise SimulationError(where, f"deadlock at cycle {timing.cycles}: {who} {state} and nothing can wake it",
                                  partial=timing)
        raise SimulationError(where, f"stopped at --max-cycles {max_cycles}: {who} was at this instruction",
                              partial=timing)


def _check_cluster(prog: Program, machine, launch: Launch, blocks) -> None:
    """A launch of clusters needs a machine with them, a cluster size it allows, dividing grid x,
    and (a block range) whole clusters."""
    k = launch.cluster
    where = f"kernel {prog.name}"
    if not isinstance(k, int) or k < 1:
        raise InputError(where, f"clusters of {k!r} blocks", "a cluster size >= 1")
    if k == 1:
        return
    cl = machine.clusters
    if cl is None:
        raise InputError(where, f"a launch of clusters of {k} on {machine.name}, which has none",
                         "cluster=1, or a machine with clusters: (h100)")
    if k > cl.max_blocks:
        raise InputError(where, f"clusters of {k} blocks", f"at most {cl.max_blocks} on {machine.name}")
    if launch.grid[0] % k:
        raise InputError(where, f"clusters of {k} with grid x {launch.grid[0]}", "a cluster size dividing grid x")
    if blocks is not None and (blocks[0] % k or blocks[1] % k):
        raise InputError(where, f"block range {tuple(blocks)} splits clusters of {k}", "whole clusters")


def start_kernel(prog: Program, machine, launch: Launch, args: dict, *, window_cycles: int = 1024,
                 blocks: tuple[int, int] | None = None, base: int | None = None, placement: str = "cross",
                 skip: bool = True) -> KernelRun:
    """A KernelRun at cycle 0 (arguments as time_kernel's)."""
    return KernelRun(prog, machine, launch, args, window_cycles, blocks, base, placement, skip)
