"""The functional interpreter: every warp of a launch resident at once, run round-robin with the
numba ``execute.step`` until all exit. Used by ``archsim asm``, by kernel verification and as the
oracle beside the pure-Python twin (``engine="reference"``).
"""

from __future__ import annotations

import numpy as np

from archsim.engine import execute as X
from archsim.engine.jit import njit
from archsim.engine.launch import FunctionalResult, Launch, build_memory, resolve_launch
from archsim.engine.ref import as_ptr
from archsim.engine.state import sparse_zeros
from archsim.errors import SimulationError
from archsim.isa.opcodes import tables
from archsim.isa.program import Program

STACK_DEPTH = 32
QUANTUM = 256  # instructions a warp runs before the next warp gets its turn
FAULT_TEXT = {
    X.F_GLOBAL_OOB: "global access of {bytes} byte(s) at address {addr:#x} outside global memory",
    X.F_SHARED_OOB: "scratchpad access of {bytes} byte(s) at {addr} outside the block's {shared} bytes",
    X.F_MISALIGNED: "access of {bytes} byte(s) at address {addr:#x} is not aligned to its size",
    X.F_RMA_CORE: "RMA to block {addr}, which does not exist ({blocks} blocks in the launch)",
    X.F_STACK: "SIMT reconvergence stack overflow (depth {addr}; divergence nested too deeply)",
    X.F_WARP_WIDTH: "needs a warp width of 32, the target has {addr}",
    X.F_BAD_OP: "opcode {addr} has no functional semantics for its dtype",
    X.F_LIMIT: "more than {addr} warp-instructions: stopped (a loop that never ends? `asm --max-instructions N` "
               "raises the limit)",
    X.F_RMA_GROUP: "RMA to block {addr}, which runs in another core group (RMA reaches the CPEs of the issuer's "
                   "core group only)",
    X.F_BCAST: "DMA broadcast operands differ from those core {addr} gave for the same line (every participant "
               "issues the same get)",
    X.F_CP_GROUPS: "cp.async.commit opens group {addr} while group {bytes} still has copies in flight: the timing "
                   "model tracks 8 groups a warp (wait with cp.async.wait before committing more)",
    X.F_SLICE: "a write of {bytes} byte(s) at {addr} landed on the scratchpad slots the timing run watched",
    X.F_WARPGROUP: "wgmma needs the 4 warps of its warpgroup in the block, each with all 32 lanes active "
                   "(active lanes {addr:#x})",
    X.F_WG_ALIGN: "wgmma tile at scratchpad address {addr} is misaligned for its {bytes}-byte swizzle (isa/README.md: "
                  "a K-major tile's 32 bytes of k within one swizzle row, an MN-major tile's start on one)",
    X.F_MB_COUNT: "mbarrier at scratchpad {addr}: count {bytes} out of range (arrivals 1 .. 2^20-1, bytes 0 .. "
                  "2^20-1)",
    X.F_MB_INIT: "mbarrier at scratchpad {addr} is not initialised (mbarrier.init first)",
    X.F_MB_OVER: "mbarrier at scratchpad {addr}: an arrival with none pending (more arrivals than mbarrier.init "
                 "expects in one phase)",
    X.F_MB_TX: "mbarrier at scratchpad {addr}: transaction count {bytes} leaves -(2^20-1) .. 2^20-1",
    X.F_MB_SLOTS: "mbarrier at scratchpad {addr}: more than {bytes} transaction barriers live on one core (the "
                  "timing model's table)",
    X.F_TMA_MAP: "tensor map at {addr:#x} is not 64-byte aligned inside a backed global buffer of 128 bytes",
    X.F_TMA_RANK: "tensor map rank {addr} for a {bytes}-d copy (the rank equals the instruction's)",
    X.F_TMA_FORMAT: "tensor map element size {addr} or swizzle {bytes} not allowed (element 1, 2, 4 or 8 bytes; "
                    "swizzle 0, 32, 64 or 128)",
    X.F_TMA_STRIDE: "tensor map base or stride {addr} (dimension {bytes}; 0: the base) is not a multiple of 16 "
                    "bytes (strides: positive)",
    X.F_TMA_BOX: "TMA box dimension {addr} of {bytes} elements: 1 .. 256 and at most the tensor's",
    X.F_TMA_INNER: "TMA box inner row of {addr} bytes: a multiple of 16, at most the swizzle ({bytes} bytes; "
                   "0: none)",
    X.F_TMA_DST: "TMA box of {bytes} bytes at scratchpad {addr}: 128-byte aligned, inside the block's {shared} "
                 "bytes (swizzled: rounded up to 128)",
    X.F_CLUSTER_RANK: "distributed shared memory access to cluster rank {addr}, outside the cluster's {bytes} "
                      "blocks (0 .. {bytes}-1)",
    X.F_CLUSTER_GONE: "distributed shared memory access to cluster rank {addr}, whose block has exited "
                      "(barrier.cluster before a block exits keeps its scratchpad)",
    X.F_MCAST_MASK: "TMA multicast mask {addr:#x} names no block or a rank outside the cluster's {bytes} blocks "
                    "(a non-zero mask of bits 0 .. {bytes}-1)",
}
# outcome codes of run_loop
DONE, FAULT, DEADLOCK, LIMIT = 0, 1, 2, 3
# run_loop's out[]: outcome, the warp and pc it stopped at (fault, deadlock, limit), warp-instructions run
FO_OUTCOME, FO_WARP, FO_PC, FO_STEPS, FO_N = range(5)


def build_fstate(*, NW: int, nregs: int, W: int, g: np.ndarray, gsize: int, vsize: int, smem_rows: int,
                 shared: int, params, launch: Launch, ncores: int, mode: int, warp_block, warp_wib, warp_smem,
                 warp_core, block_smem, stack_mask0) -> X.FState:
    """The functional state of NW warp slots (shared by functional and timing runs). `g` is the
    global-memory image, padded to a multiple of 16 bytes."""
    R = max(int(nregs), 1)
    regs = sparse_zeros((NW, R, W), np.int64)
    spad = max((shared + 15) // 16 * 16, 16)
    smem = sparse_zeros((smem_rows, spad), np.uint8)
    tpb = launch.threads_per_block
    geom = np.zeros(X.G_N, np.int64)
    geom[[X.G_W, X.G_WPB, X.G_TPB, X.G_BX, X.G_BY, X.G_BZ, X.G_GX, X.G_GY, X.G_GZ, X.G_NBLK, X.G_NCORES,
          X.G_SHARED, X.G_GBASE, X.G_GSIZE, X.G_MODE, X.G_VSIZE, X.G_CLUSTER]] = [
        W, (tpb + W - 1) // W, tpb, *launch.block, *launch.grid, launch.blocks, max(ncores, 1), shared,
        mem_base(), gsize, mode, vsize, launch.cluster]
    stack_mask = np.zeros((NW, STACK_DEPTH), np.int64)
    stack_mask[:, 0] = stack_mask0
    tmp_u32 = np.zeros(2, np.uint32)
    tmp_i64 = np.zeros(1, np.int64)
    return X.FState(
        regs=regs, rf32=regs.view(np.float32), ru32=regs.view(np.uint32), ru16=regs.view(np.uint16),
        rf64=regs.view(np.float64), preds=np.zeros((NW, 8, W), np.uint8),
        g8=g, g16=g.view(np.uint16), g32=g.view(np.uint32), g64=g.view(np.int64),
        s8=smem, s16=smem.view(np.uint16), s32=smem.view(np.uint32), s64=smem.view(np.int64),
        params=np.array(params, np.int64), geom=geom, warp_block=np.array(warp_block, np.int32),  # copies:
        warp_wib=np.array(warp_wib, np.int32), warp_smem=np.array(warp_smem, np.int32),  # never aliased
        warp_core=np.array(warp_core, np.int32), block_smem=np.array(block_smem, np.int32),
        stack_pc=np.zeros((NW, STACK_DEPTH), np.int32), stack_rpc=np.full((NW, STACK_DEPTH), -1, np.int32),
        stack_mask=stack_mask, sp=np.ones(NW, np.int32), wstate=np.zeros(NW, np.int32),
        icount=np.zeros(NW, np.int64), fault=np.zeros(6, np.int64), tmp_u32=tmp_u32,
        tmp_f32=tmp_u32.view(np.float32), tmp_i64=tmp_i64, tmp_f64=tmp_i64.view(np.float64),
        vals=np.zeros(W, np.int64), mat=np.zeros((3, 16, 256), np.float64), rows=np.zeros((8, 8), np.uint16),
        addr=np.zeros((NW, W), np.int64))


def make_state(prog: Program, launch: Launch, mem, params, warp_width: int, ncores: int) -> X.FState:
    """Every warp of the launch resident at once, block-major."""
    W = int(warp_width)
    tpb = launch.threads_per_block
    wpb = (tpb + W - 1) // W
    nblk = launch.blocks
    NW = nblk * wpb
    gsize = len(mem.data)
    gpad = np.zeros((gsize + 15) // 16 * 16 + 16, np.uint8)
    gpad[:gsize] = mem.data
    warp = np.arange(NW)
    blocks = warp // wpb
    live = np.minimum(W, tpb - (warp % wpb) * W)
    mask0 = np.where(live < 64, (np.int64(1) << live.astype(np.int64)) - 1, -1)
    return build_fstate(NW=NW, nregs=prog.nregs, W=W, g=gpad, gsize=gsize, vsize=gsize, smem_rows=nblk,
                        shared=int(prog.shared_bytes), params=params, launch=launch, ncores=ncores,
                        mode=X.MODE_FUNCTIONAL, warp_block=blocks, warp_wib=warp % wpb, warp_smem=blocks,
                        warp_core=blocks % max(ncores, 1), block_smem=np.arange(nblk), stack_mask0=mask0)


def mem_base() -> int:
    from archsim.engine.launch import GLOBAL_BASE

    return GLOBAL_BASE


@njit(cache=True)
def run_loop(P, T, S, max_instructions, out, weight, counts, visits):
    """Run every warp to completion. out: FO_* (outcome, warp, pc, and the instructions executed,
    to which the limit applies). ``counts[w]`` adds ``weight[pc]`` for every
    instruction warp w executes (the instruction counter runs a compressed program whose
    instructions stand for runs of the original's: engine/counts.py), and ``visits[pc]`` one. The
    state tuples travel as StatePtrs (archsim.engine.ref) from here on."""
    _run(as_ptr(P), as_ptr(T), as_ptr(S), max_instructions, out, weight, counts, visits)


@njit(cache=True)
def _run(P, T, S, max_instructions, out, weight, counts, visits):
    NW = S.wstate.shape[0]
    wpb = S.geom[X.G_WPB]
    nblk = NW // wpb  # the blocks this state holds (the instruction counter runs a launch in chunks)
    total = np.int64(0)
    while True:
        ran = False
        for w in range(NW):
            if S.wstate[w] != X.W_RUN and S.wstate[w] != X.W_MBWAIT:
                continue
            for _ in range(QUANTUM):
                pc = S.stack_pc[w, S.sp[w] - 1]
                st = X.step(P, T, S, w)
                if st == X.ST_MBWAIT:   # its phase is incomplete: no progress, the next warp's turn
                    S.wstate[w] = X.W_MBWAIT
                    break
                S.wstate[w] = X.W_RUN
                ran = True
                total += 1
                counts[w] += weight[pc]
                visits[pc] += 1
                if st == X.ST_OK:
                    if total >= max_instructions:
                        out[FO_OUTCOME] = LIMIT
                        out[FO_WARP] = w
                        out[FO_PC] = S.stack_pc[w, S.sp[w] - 1]
                        out[FO_STEPS] = total
                        return
                    continue
                if st == X.ST_FAULT:
                    out[FO_OUTCOME] = FAULT
                    out[FO_WARP] = w
                    out[FO_PC] = pc
                    out[FO_STEPS] = total
                    return
                if st == X.ST_BAR:
                    S.wstate[w] = X.W_BAR
                elif st == X.ST_CBAR:
                    S.wstate[w] = X.W_CBAR
                elif st == X.ST_GRIDBAR:
                    S.wstate[w] = X.W_GRIDBAR
                else:
                    S.wstate[w] = X.W_DONE
                break
        if ran:
            continue
        # nobody can run: release barriers, or finish, or report a deadlock
        released = False
        for b in range(nblk):
            nbar = 0
            for w in range(b * wpb, (b + 1) * wpb):
                if S.wstate[w] == X.W_BAR:
                    nbar += 1
            if nbar == wpb:
                for w in range(b * wpb, (b + 1) * wpb):
                    S.wstate[w] = X.W_RUN
                released = True
        k = S.geom[X.G_CLUSTER]
        for c in range(nblk // k if not released else 0):   # barrier.cluster: every warp of the cluster
            lo, hi = c * k * wpb, (c + 1) * k * wpb
            ncb = 0
            for w in range(lo, hi):
                if S.wstate[w] == X.W_CBAR:
                    ncb += 1
            if ncb == hi - lo:
                for w in range(lo, hi):
                    S.wstate[w] = X.W_RUN
                released = True
        if not released:
            ngrid = 0
            for w in range(NW):
                if S.wstate[w] == X.W_GRIDBAR:
                    ngrid += 1
            if ngrid == NW:
                for w in range(NW):
                    S.wstate[w] = X.W_RUN
                released = True
        if released:
            continue
        for w in range(NW):
            if S.wstate[w] != X.W_DONE:
                out[FO_OUTCOME] = DEADLOCK
                out[FO_WARP] = w
                out[FO_PC] = S.stack_pc[w, S.sp[w] - 1] - (S.wstate[w] != X.W_MBWAIT)
                out[FO_STEPS] = total
                return
        out[FO_OUTCOME] = DONE
        out[FO_STEPS] = total
        return


def _deadlock_text(S, prog: Program, w: int) -> str:
    wpb = int(S.geom[X.G_WPB])
    b = w // wpb
    if S.wstate[w] == X.W_MBWAIT:
        return f"deadlock: block {b} warp {w - b * wpb} {mbwait_text(S.s64[S.warp_smem[w]], int(S.addr[w, 0]))}"
    if S.wstate[w] == X.W_CBAR:
        k = int(S.geom[X.G_CLUSTER])
        first = b - b % k
        exited = [v for v in range(first * wpb, (first + k) * wpb) if S.wstate[v] == X.W_DONE]
        why = (f"; warp(s) of block(s) {sorted({v // wpb for v in exited})} of the cluster already exited" if exited
               else "")
        return f"deadlock: block {b} warp {w - b * wpb} waits at barrier.cluster forever{why}"
    states = [int(S.wstate[v]) for v in range(b * wpb, (b + 1) * wpb)]
    kind = "bar.grid" if S.wstate[w] == X.W_GRIDBAR else "bar.sync"
    exited = [v - b * wpb for v in range(b * wpb, (b + 1) * wpb) if S.wstate[v] == X.W_DONE]
    others = ""
    if exited:
        others = f"; warp(s) {', '.join(map(str, exited))} of the block already exited"
    elif kind == "bar.sync" and X.W_GRIDBAR in states:
        others = "; other warps of the block wait at bar.grid"
    elif kind == "bar.grid":
        others = "; not every warp of the launch reached bar.grid"
    return f"deadlock: block {b} warp {w - b * wpb} waits at {kind} forever{others}"


def mbwait_text(smem64, addr: int) -> str:
    """What a warp stuck at mbarrier.wait waits for: the barrier's state (smem64: its block's
    scratchpad as int64 words)."""
    v = int(smem64[addr >> 3])
    pend, tx = (v >> 1) & X.MB_FIELD, ((v >> 43) & X.MB_FIELD) - X.MB_BIAS
    return (f"waits at mbarrier.wait forever: the barrier at scratchpad {addr} is in phase {v & 1} with {pend} "
            f"arrival(s) and {tx} transaction byte(s) pending, and no warp left can complete it")


MAX_INSTRUCTIONS = 200_000_000   # the numba engine's default limit (a loop that never ends stops there)


def run_functional(prog: Program, args: dict, launch: Launch | None = None, *, warp_width: int = 32,
                   ncores: int = 1, engine: str = "numba", max_instructions: int | None = None) -> FunctionalResult:
    """Run a kernel on real values. ``args``: parameter name -> numpy array (buffer) or int.
    ``max_instructions``: stop after that many warp-instructions (default: the engine's own
    limit, MAX_INSTRUCTIONS; the reference engine's is lower)."""
    if engine == "reference":
        from archsim.engine.reference import run_reference

        more = {} if max_instructions is None else {"max_instructions": max_instructions}
        return run_reference(prog, args, launch, warp_width=warp_width, ncores=ncores, **more)
    if max_instructions is None:
        max_instructions = MAX_INSTRUCTIONS
    if engine != "numba":
        raise ValueError(f"unknown engine {engine!r}")
    launch = resolve_launch(prog, launch)
    mem, params, _ = build_memory(prog, args)
    S = make_state(prog, launch, mem, params, warp_width, ncores)
    out = np.zeros(FO_N, np.int64)
    run_loop(prog.arrays(), tables(), S, np.int64(max_instructions), out, np.ones(max(len(prog), 1), np.int64),
             np.zeros(S.wstate.shape[0], np.int64), np.zeros(max(len(prog), 1), np.int64))
    mem.data[:] = S.g8[: len(mem.data)]
    result = FunctionalResult(memory=mem, regs=S.regs, preds=S.preds.astype(bool),
                              warp_instructions=int(out[FO_STEPS]), launch=launch)
    outcome, w, pc = int(out[FO_OUTCOME]), int(out[FO_WARP]), int(out[FO_PC])
    if outcome == DONE:
        return result
    wpb = int(S.geom[X.G_WPB])
    where = prog.where(max(pc, 0))
    if outcome == DEADLOCK:
        raise SimulationError(where, _deadlock_text(S, prog, w), partial=result)
    code, lane, addr, nbytes = (int(v) for v in S.fault[:4])
    if outcome == LIMIT:
        code, addr = X.F_LIMIT, max_instructions
        lane = 0
    text = FAULT_TEXT[code].format(addr=addr, bytes=nbytes, shared=prog.shared_bytes, blocks=launch.blocks)
    raise SimulationError(where, f"block {w // wpb} warp {w % wpb} lane {lane}: {text}", partial=result)
