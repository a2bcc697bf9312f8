"""The core timing model: one model for an SM sub-core and a Sunway CPE (docs/architecture.md).

Each core has ``subcores`` schedulers; warp slot ``s`` of a core belongs to sub-core
``s % subcores``. Every cycle each scheduler picks at most ``issue_per_cycle`` ready warps by its
policy (GTO: keep the last warp while it is ready, else the oldest; LRR: round robin from the warp
after the last one issued). A warp is ready when the scoreboard says every register and predicate
its next instruction reads (and writes) is available, and the pipe (or tensor units) it needs is
free. Issue executes the instruction functionally (execute.step, execute-at-issue), then books
its timing: the pipe is held ``ii`` cycles, results are ready after ``lat`` cycles, memory
instructions go to the memory system (memory.py), which marks their registers ready when the data
is back.

Every resident warp's cycle is classified once (the stall breakdown the records report,
docs/records.md): issued, not_selected, wait (fixed-latency dependency), long_scoreboard (memory),
short_scoreboard (scratchpad / MUFU), pipe_busy, barrier, dma_wait, idle.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import decode as D
from archsim.engine.cache import popcount
from archsim.engine import execute as X
from archsim.engine.jit import njit
from archsim.engine.core_side import mem_can_issue, mem_issue, scratch_reads, tma_issue, tma_store_issue
from archsim.engine.queues import n_spans
from archsim.engine.sunway_side import mem_core_done
from archsim.engine.warps import (BK_COMMITTED, BK_GROUPS, BK_ISSUED, BK_MARK0, BK_SENT, CP_GROUPS, HOME_CORE,
                                  HOME_SUB, INF, K_AGE, K_CUR, K_END, K_FINISHED, K_GRIDBAR, K_N, K_NEXT, K_REGS,
                                  K_SLOTS, K_SMEM, K_SUBCORES, K_WPB, MB_SLOTS, R_BARRIER, R_DMA_WAIT, R_IDLE,
                                  R_ISSUED, R_LONG_SB, R_NOT_SELECTED, R_PIPE_BUSY, R_SHORT_SB, R_WAIT, T_BAR,
                                  T_BKWAIT, T_CBAR, T_CPWAIT, T_DMAWAIT, T_DONE, T_EMPTY, T_GRIDBAR, T_RMAWAIT,
                                  T_RUN, T_START, WG_DONE0, WG_GROUPS, WG_NCOMMIT, WG_PEND, TState, flush_stalls,
                                  mb_reset, mb_slot, wake_core, wake_placed)

SCHED_LRR, SCHED_GTO = 0, 1


class CoreCfg(NamedTuple):
    """Per-machine constants the core model reads (int64 array; see make_core_cfg)."""

    v: np.ndarray


# CoreCfg.v layout
(C_CORES, C_SUBCORES, C_SLOTS, C_MAX_BLOCKS, C_REGS_PER_CORE, C_SMEM_BYTES, C_SCHED, C_ISSUE, C_NPIPES,
 C_W, C_MMA_HOLD, C_HOLD_PIPES, C_LAUNCH, C_INTERVAL, C_WG_QUEUE, C_TMA, C_CLUSTER, C_DS_LAT, C_DS_BPC, C_GPC_BPC,
 C_CBAR, C_SMEM_LAT, C_N) = range(23)
# C_TMA: 1 with a TMA unit; C_CLUSTER: the launch's blocks per cluster; C_DS_*, C_GPC_BPC, C_CBAR: the SM-to-SM
# network and the cluster barrier (machine.clusters); C_SMEM_LAT: a scratchpad load's latency
# pipes serving any of these unit classes do not wait out an mma's operand reads (C_HOLD_PIPES)
_UNHELD_UNITS = ("lsu", "shfl", "ctrl", "sync")


def make_core_cfg(machine, scratch_bytes: int, slots: int | None = None, max_blocks: int | None = None,
                  cluster: int = 1) -> CoreCfg:
    """``slots`` / ``max_blocks``: the warp and block slots per core the engine keeps (default the
    machine's; a launch passes what its occupancy can fill, timing.resident_slots); ``cluster``:
    the launch's blocks per thread-block cluster."""
    c = machine.cores
    v = np.zeros(C_N, np.int64)
    v[C_CORES] = machine.groups * c.per_group
    v[C_SUBCORES] = c.subcores
    v[C_SLOTS] = c.warp_slots if slots is None else slots
    v[C_MAX_BLOCKS] = c.max_blocks if max_blocks is None else max_blocks
    v[C_REGS_PER_CORE] = machine.register_file.regs_per_core
    v[C_SMEM_BYTES] = scratch_bytes
    v[C_SCHED] = SCHED_GTO if c.scheduler == "gto" else SCHED_LRR
    v[C_ISSUE] = c.issue_per_cycle
    v[C_NPIPES] = len(machine.pipes)
    v[C_W] = c.warp_width
    v[C_MMA_HOLD] = machine.tensor.operand_hold_cycles if machine.tensor is not None else 1
    v[C_LAUNCH] = c.block_launch_cycles
    v[C_INTERVAL] = c.block_interval_cycles
    wg = machine.tensor.wgmma if machine.tensor is not None else None
    v[C_WG_QUEUE] = wg.queue_depth if wg is not None else 1
    v[C_TMA] = int(machine.tma is not None)
    v[C_CLUSTER] = cluster
    v[C_SMEM_LAT] = machine.scratchpad.latency_cycles
    cl = machine.clusters
    if cl is not None:
        v[C_DS_LAT], v[C_DS_BPC], v[C_GPC_BPC] = cl.dsmem_latency_cycles, cl.dsmem_bytes_per_cycle, cl.gpc_bytes_per_cycle
        v[C_CBAR] = cl.barrier_cycles
    v[C_HOLD_PIPES] = sum(1 << i for i, p in enumerate(machine.pipes.values())
                          if not any(u in _UNHELD_UNITS for u in p.serves))
    return CoreCfg(v)


def make_tstate(cfg: CoreCfg, nregs: int, nblocks: int, wpb: int, regs_per_warp: int, smem_per_block: int,
                first_block: int = 0, end_block: int | None = None, core_order=None, *, npc: int,
                gpc_sms=None) -> TState:
    """Timing state for a launch of `nblocks` blocks of which blocks [first_block, end_block) run
    (all of them by default; a range serves wave sampling: the blocks keep their grid ids).
    ``core_order``: the order in which the first dispatch visits the cores (default 0, 1, ...;
    see dispatch_order). ``npc``: the program's length (issues are counted per pc). ``gpc_sms``:
    the SMs of each GPC (machine.clusters), for a launch of clusters."""
    v = cfg.v
    cores, sub, slots, mb, npipes = (int(v[C_CORES]), int(v[C_SUBCORES]), int(v[C_SLOTS]), int(v[C_MAX_BLOCKS]),
                                     int(v[C_NPIPES]))
    NW = cores * slots
    k = np.zeros(K_N, np.int64)
    end = nblocks if end_block is None else end_block
    if not 0 <= first_block <= end <= nblocks:
        raise ValueError(f"block range [{first_block}, {end}) outside the launch's {nblocks} blocks")
    k[K_NEXT], k[K_FINISHED] = first_block, first_block
    k[K_END], k[K_WPB], k[K_REGS], k[K_SMEM], k[K_CUR] = end, wpb, regs_per_warp, smem_per_block, -1
    k[K_SUBCORES], k[K_SLOTS] = sub, slots
    home = np.zeros((2, max(NW, cores * sub)), np.int32)
    w = np.arange(NW)
    home[HOME_SUB, :NW] = (w // slots) * sub + (w % slots) % sub
    home[HOME_CORE, :cores * sub] = np.arange(cores * sub) // sub
    mbs = (cores * mb, MB_SLOTS) if v[C_TMA] else (1, 1)
    k_cl = int(v[C_CLUSTER])
    gsm = list(gpc_sms) if (gpc_sms is not None and k_cl > 1) else [cores]
    gpc_lo = np.concatenate([[0], np.cumsum(gsm)]).astype(np.int32)
    core_gpc = np.repeat(np.arange(len(gsm), dtype=np.int32), gsm)
    ncl = nblocks // k_cl + 1          # (a launch without clusters: clusters of one, block ids)
    return TState(
        reg_ready=np.zeros((NW, max(nregs, 1)), np.int64), reg_kind=np.zeros((NW, max(nregs, 1)), np.int8),
        pred_ready=np.zeros((NW, 8), np.int64), opready=np.full((NW, 3), -1, np.int64),
        wst=np.zeros(NW, np.int32), age=np.zeros(NW, np.int64),
        wait_arg=np.zeros(NW, np.int32), start_at=np.zeros(NW, np.int64), cp_open=np.zeros(NW, np.int32),
        cp_oldest=np.zeros(NW, np.int32),
        cp_pending=np.zeros((NW, CP_GROUPS), np.int32), bulk_pending=np.zeros((NW, 2), np.int32),
        bk=np.zeros((NW, BK_MARK0 + BK_GROUPS), np.int64),
        wg=np.zeros((NW, WG_DONE0 + WG_GROUPS), np.int64), wg_queue=np.zeros((cores * sub, int(v[C_WG_QUEUE]) + 1), np.int64),
        mb_addr=np.full(mbs, -1, np.int64), mb_bytes=np.zeros(mbs + (2,), np.int64), mb_gen=np.zeros(mbs, np.int64),
        mb_ready=np.zeros(mbs + (2,), np.int64),
        slot_block=np.full(NW, -1, np.int32), reason=np.full(NW, -1, np.int8), pipe_free=np.zeros((cores, sub, npipes), np.int64),
        tensor_free=np.zeros((cores, sub), np.int64), last_warp=np.full((cores, sub), -1, np.int32),
        wake=np.zeros(cores * sub, np.int64), wsum=np.zeros(n_spans(cores * sub), np.int64),
        acct=np.zeros(cores * sub, np.int64), mem_wait=np.zeros(cores, np.int64),
        launch_at=np.zeros(cores, np.int64), launch_free=np.zeros(cores, np.int64),
        core_order=np.arange(cores, dtype=np.int32) if core_order is None
        else np.ascontiguousarray(core_order, np.int32),
        bs_block=np.full(cores * mb, -1, np.int32), bs_alive=np.zeros(cores * mb, np.int32),
        bs_arrived=np.zeros(cores * mb, np.int32), bs_first=np.zeros(cores * mb, np.int32),
        bs_nwarps=np.zeros(cores * mb, np.int32), core_warps=np.zeros(cores, np.int32),
        core_smem=np.zeros(cores, np.int64), core_regs=np.zeros(cores, np.int64),
        core_blocks=np.zeros(cores, np.int32), slot_hi=np.zeros(cores, np.int32), stall=np.zeros((cores, 9), np.int64),
        issued=np.zeros(cores, np.int64), flops=np.zeros(cores, np.int64),
        pipe_busy_cycles=np.zeros((cores, npipes + 1), np.int64), pc_issued=np.zeros(max(npc, 1), np.int64),
        blk_issued=np.zeros(nblocks, np.int64), blk_start=np.full(nblocks, -1, np.int64),
        blk_done=np.full(nblocks, -1, np.int64), blk_core=np.full(nblocks, -1, np.int32), core_gpc=core_gpc,
        gpc_lo=gpc_lo, cl_arrived=np.zeros(ncl, np.int32), cl_store=np.zeros(ncl, np.int64),
        cl_pick=np.zeros(max(k_cl, 1), np.int64), ds_port=np.zeros(cores if k_cl > 1 else 1, np.int64),
        ds_gpc=np.zeros(len(gsm), np.int64), k=k, home=home)


# ----------------------------------------------------------------------------- dispatch
@njit(cache=True)
def _fits(C, TS, core):
    v = C.v
    wpb = TS.k[K_WPB]
    if TS.core_blocks[core] >= v[C_MAX_BLOCKS]:
        return False
    if TS.core_warps[core] + wpb > v[C_SLOTS]:
        return False
    if TS.core_regs[core] + wpb * TS.k[K_REGS] > v[C_REGS_PER_CORE]:
        return False
    if TS.core_smem[core] + TS.k[K_SMEM] > v[C_SMEM_BYTES]:
        return False
    return True


@njit(cache=True)
def dispatch_block(C, TS, S, core, now):
    """Place the next launch block on `core` (caller checked _fits). Its warps take consecutive
    free slots when available (any free slots otherwise), and issue from its start: C_LAUNCH cycles
    after its slot freed (the round trip of the block's completion to the work distributor and the
    new block's set-up), and no sooner than C_INTERVAL after the core's previous block started (a
    core sets up one block at a time). Until then they are resident and count as idle."""
    v = C.v
    start = now + v[C_LAUNCH]
    if TS.launch_free[core] > start:
        start = TS.launch_free[core]
    TS.launch_free[core] = start + v[C_INTERVAL]
    slots = v[C_SLOTS]
    mb = v[C_MAX_BLOCKS]
    wpb = TS.k[K_WPB]
    blk = TS.k[K_NEXT]
    wake_core(TS, core, now)  # before its warps change
    TS.k[K_NEXT] += 1
    # a free block slot
    bs = -1
    for b in range(mb):
        if TS.bs_block[core * mb + b] < 0:
            bs = core * mb + b
            break
    # consecutive free warp slots
    first = -1
    run = 0
    for s in range(slots):
        w = core * slots + s
        if TS.wst[w] == T_EMPTY:
            run += 1
            if run == wpb:
                first = w - wpb + 1
                break
        else:
            run = 0
    TS.bs_block[bs] = blk
    TS.blk_start[blk] = start
    TS.blk_core[blk] = core
    TS.bs_alive[bs] = wpb
    TS.bs_arrived[bs] = 0
    TS.bs_first[bs] = first
    TS.bs_nwarps[bs] = wpb
    if first - core * slots + wpb > TS.slot_hi[core]:
        TS.slot_hi[core] = first - core * slots + wpb
    TS.core_blocks[core] += 1
    TS.core_warps[core] += wpb
    TS.core_regs[core] += wpb * TS.k[K_REGS]
    TS.core_smem[core] += TS.k[K_SMEM]
    S.block_smem[blk] = bs
    W = S.geom[X.G_W]
    tpb = S.geom[X.G_TPB]
    for i in range(wpb):
        w = first + i
        TS.wst[w] = T_RUN if start <= now else T_START
        TS.start_at[w] = start
        TS.reason[w] = -1
        TS.age[w] = TS.k[K_AGE]
        TS.k[K_AGE] += 1
        TS.slot_block[w] = bs
        TS.cp_open[w] = 0
        TS.cp_oldest[w] = 0
        for g in range(CP_GROUPS):
            TS.cp_pending[w, g] = 0
        TS.bulk_pending[w, 0] = 0
        TS.bulk_pending[w, 1] = 0
        TS.bk[w, BK_ISSUED] = 0
        TS.bk[w, BK_SENT] = 0
        TS.bk[w, BK_COMMITTED] = 0
        for j in range(TS.wg.shape[1]):
            TS.wg[w, j] = 0
        for r in range(TS.reg_ready.shape[1]):
            TS.reg_ready[w, r] = now
            TS.reg_kind[w, r] = 0
        for p in range(8):
            TS.pred_ready[w, p] = now
        TS.opready[w, 0] = -1
        # functional state of the slot
        S.warp_block[w] = blk
        S.warp_wib[w] = i
        S.warp_smem[w] = bs
        S.warp_core[w] = core
        S.icount[w] = 0
        S.sp[w] = 1
        S.stack_pc[w, 0] = 0
        S.stack_rpc[w, 0] = -1
        live = tpb - i * W
        if live > W:
            live = W
        S.stack_mask[w, 0] = (np.int64(1) << live) - 1 if live < 63 else np.int64(-1)
        for r in range(S.regs.shape[1]):
            for l in range(W):
                S.regs[w, r, l] = 0
        for p in range(8):
            for l in range(W):
                S.preds[w, p, l] = 0
    for j in range(S.s8.shape[1]):
        S.s8[bs, j] = 0
    if v[C_TMA]:
        for j in range(TS.mb_addr.shape[1]):
            TS.mb_addr[bs, j] = -1


def dispatch_order(machine, spread: bool, nblocks: int = 0) -> np.ndarray:
    """The order in which a launch's first dispatch visits the cores (Launch.spread): 0, 1, ...;
    spread, for a launch of fewer blocks than the machine has cores (one block a core: a larger
    launch fills every core either way, and its blocks keep their natural places) on a machine
    of several core groups: group by group in turn, and within a group its clusters in turn
    (mesh.cluster_rows x cluster_cols CPEs; in mesh order without a mesh), so blocks 0..G-1 go to
    the first CPE of each group, the next G to the first CPE of each group's second cluster, and
    so on."""
    G, P = machine.groups, machine.cores.per_group
    if not spread or G * P <= 1 or nblocks >= G * P:
        return np.arange(G * P, dtype=np.int32)
    m = machine.mesh
    if m is not None and m.rows * m.cols == P:
        ccols = m.cols // m.cluster_cols
        key = []
        for k in range(P):
            row, col = divmod(k, m.cols)
            cluster = (row // m.cluster_rows) * ccols + col // m.cluster_cols
            inside = (row % m.cluster_rows) * m.cluster_cols + col % m.cluster_cols
            key.append((inside, cluster))
        within = sorted(range(P), key=lambda k: key[k])
    else:
        within = list(range(P))
    return np.array([g * P + c for c in within for g in range(G)], dtype=np.int32)


@njit(cache=True)
def _place_cluster(C, TS, S, g, now):
    """Place the launch's next cluster (C_CLUSTER consecutive blocks) on as many distinct cores of
    GPC g, those holding the fewest blocks first (ties: the lower core), if that many fit a block;
    True if it did (Hopper co-schedules a cluster in a GPC; each block starts when its core can
    launch it)."""
    k = C.v[C_CLUSTER]
    pick = TS.cl_pick
    for j in range(k):
        best = -1
        for core in range(TS.gpc_lo[g], TS.gpc_lo[g + 1]):
            taken = False
            for i in range(j):
                if pick[i] == core:
                    taken = True
            if not taken and _fits(C, TS, core) and (best < 0 or TS.core_blocks[core] < TS.core_blocks[best]):
                best = core
        if best < 0:
            return False
        pick[j] = best
    for j in range(k):
        dispatch_block(C, TS, S, pick[j], now)
    for j in range(k):
        wake_placed(TS, pick[j])
    return True


@njit(cache=True)
def dispatch_all(C, TS, S, now):
    """Fill every core with blocks, round robin over cores, in launch order (clusters: round robin
    over GPCs, a cluster at a time)."""
    cores = C.v[C_CORES]
    placed = True
    if C.v[C_CLUSTER] > 1:
        while placed and TS.k[K_NEXT] < TS.k[K_END]:
            placed = False
            for g in range(TS.gpc_lo.shape[0] - 1):
                if TS.k[K_NEXT] < TS.k[K_END] and _place_cluster(C, TS, S, g, now):
                    placed = True
        return
    while placed and TS.k[K_NEXT] < TS.k[K_END]:
        placed = False
        for j in range(cores):
            core = np.int64(TS.core_order[j])  # as _retire_block's: one compiled dispatch_block
            if TS.k[K_NEXT] >= TS.k[K_END]:
                break
            if _fits(C, TS, core):
                dispatch_block(C, TS, S, core, now)
                placed = True


@njit(cache=True)
def _retire_block(C, TS, S, bs, now):
    mb = C.v[C_MAX_BLOCKS]
    core = bs // mb
    blk = TS.bs_block[bs]
    wake_core(TS, core, now)  # before its warps change
    for i in range(TS.bs_nwarps[bs]):
        TS.wst[TS.bs_first[bs] + i] = T_EMPTY
        TS.slot_block[TS.bs_first[bs] + i] = -1
    S.block_smem[blk] = -1
    TS.blk_done[blk] = now
    TS.bs_block[bs] = -1
    TS.core_blocks[core] -= 1
    TS.core_warps[core] -= TS.bs_nwarps[bs]
    TS.core_regs[core] -= TS.bs_nwarps[bs] * TS.k[K_REGS]
    TS.core_smem[core] -= TS.k[K_SMEM]
    TS.k[K_FINISHED] += 1
    # the core takes the next block of the launch (clusters: its GPC the next cluster, if it fits now)
    if TS.k[K_NEXT] < TS.k[K_END]:
        if C.v[C_CLUSTER] > 1:
            _place_cluster(C, TS, S, TS.core_gpc[core], now)
        elif _fits(C, TS, core):
            dispatch_block(C, TS, S, core, now)


# ----------------------------------------------------------------------------- readiness
@njit(cache=True)
def operands_ready(TS, Dd, w, pc, now):
    """(ready cycle, kind of the latest operand) of the instruction at pc for warp w: its sources
    and (WAW: a pending write to a destination must land first) its destinations, each register
    once (Dd.opd; a register seen again could not raise the maximum)."""
    t = np.int64(0)
    kind = 0
    for i in range(Dd.nopd[pc]):
        r = Dd.opd[pc, i]
        if TS.reg_ready[w, r] > t:
            t = TS.reg_ready[w, r]
            kind = TS.reg_kind[w, r]
    for i in range(2):
        p = Dd.prd[pc, i]
        if p >= 0 and TS.pred_ready[w, p] > t:
            t = TS.pred_ready[w, p]
            kind = D.SRC_FIXED
    p = Dd.pwr[pc]
    if p >= 0 and TS.pred_ready[w, p] > t:
        t = TS.pred_ready[w, p]
        kind = D.SRC_FIXED
    return t, kind


@njit(cache=True)
def _kind_reason(kind):
    if kind == D.SRC_LONG:
        return R_LONG_SB
    if kind == D.SRC_SHORT:
        return R_SHORT_SB
    return R_WAIT


@njit(cache=True)
def unit_free_at(TS, Dd, core, sub, pc):
    cls = Dd.cls[pc]
    if cls == D.CLS_TENSOR:
        return TS.tensor_free[core, sub]
    if cls == D.CLS_WGMMA:            # the oldest of the last `depth` wgmma, whose slot it takes
        q = TS.wg_queue
        i = core * TS.k[K_SUBCORES] + sub
        return q[i, q[i, q.shape[1] - 1]]
    p = Dd.pipe[pc]
    if p < 0:
        return np.int64(0)
    return TS.pipe_free[core, sub, p]


@njit(cache=True)
def waiting_done(TS, w):
    """Is a warp in a wait state (cp.async.wait, dma.wait, rma.wait, cp.async.bulk.wait_group) free
    to go on?"""
    st = TS.wst[w]
    if st == T_CPWAIT:
        # PTX cp.async.wait_group: every committed group but the newest wait_arg is complete (groups
        # complete out of order; a newer one done does not excuse an older one). cp_oldest: the
        # oldest committed group that may still have copies in flight
        while TS.cp_oldest[w] < TS.cp_open[w] and TS.cp_pending[w, TS.cp_oldest[w] % CP_GROUPS] == 0:
            TS.cp_oldest[w] += 1
        return TS.cp_oldest[w] >= TS.cp_open[w] - TS.wait_arg[w]
    if st == T_BKWAIT:
        # cp.async.bulk.wait_group N: the stores of every committed group but the newest N have
        # left (stores leave in issue order, so a count of them says which groups are done)
        need = TS.bk[w, BK_COMMITTED] - TS.wait_arg[w]
        return need <= 0 or TS.bk[w, BK_SENT] >= TS.bk[w, BK_MARK0 + (need - 1) % BK_GROUPS]
    if st == T_DMAWAIT:
        return TS.bulk_pending[w, 0] <= TS.wait_arg[w]
    if st == T_RMAWAIT:
        return TS.bulk_pending[w, 1] <= TS.wait_arg[w]
    return False


# ----------------------------------------------------------------------------- warpgroup MMA
# Each warp of a warpgroup runs its 16-row slice of a wgmma on its own sub-core's tensor unit (the
# slot a warp takes in its block puts the 4 warps of a group on 4 sub-cores): the slice starts when
# the unit is free, takes decode's ii cycles and is complete lat cycles after it starts, all known
# at issue, so wgmma.wait_group is a wait for a known cycle (no event wakes it). Its operands (the
# warp's A rows unless .rs, a quarter of B) take the SM's shared-memory data pipe as they stream in
# (core_side.scratch_reads): a result is no earlier than its last read. The accumulators
# are not scoreboarded: wait_group and wgmma.fence order them, as PTX requires of a program.
@njit(cache=True)
def _wgmma_issue(TS, Dd, core, sub, w, pc, now, read):
    """``read``: the cycle after the slice's operands are read from the scratchpad (they stream
    in as the unit works; a busy data pipe delays the result)."""
    ii = Dd.ii[pc]
    start = TS.tensor_free[core, sub] if TS.tensor_free[core, sub] > now else now
    TS.tensor_free[core, sub] = start + ii
    TS.pipe_busy_cycles[core, TS.pipe_busy_cycles.shape[1] - 1] += ii
    done = (start + ii if start + ii > read else read) + Dd.lat[pc] - ii
    q = TS.wg_queue
    i = core * TS.k[K_SUBCORES] + sub
    depth = q.shape[1] - 1
    pos = q[i, depth]
    q[i, pos] = done
    q[i, depth] = (pos + 1) % depth
    if done > TS.wg[w, WG_PEND]:
        TS.wg[w, WG_PEND] = done


@njit(cache=True)
def _wgmma_wait(TS, P, Dd, w, pc):
    """(cycle, reason) from which warp w's wgmma.wait_group N (every group but the N newest
    complete) or wgmma.fence (every register write it issued complete) lets it go on."""
    if Dd.cls[pc] == D.CLS_WGWAIT:
        idx = TS.wg[w, WG_NCOMMIT] - 1 - P.imm[pc]   # the newest group that must be complete
        if idx < 0:
            return np.int64(0), R_WAIT
        return TS.wg[w, WG_DONE0 + idx % WG_GROUPS], R_WAIT
    t = np.int64(0)
    kind = 0
    for r in range(TS.reg_ready.shape[1]):
        if TS.reg_ready[w, r] > t:
            t = TS.reg_ready[w, r]
            kind = TS.reg_kind[w, r]
    return t, _kind_reason(kind)


# ----------------------------------------------------------------------------- transaction barriers
# mbarrier.wait issues once the phase it waits for has completed functionally (the arrivals and
# transaction bytes counted at issue, execute.py) and the bulk tensor copies counted into that phase
# have landed (TS.mb_bytes, which the TMA unit's replies lower). An arrival that completes a phase,
# and a phase's last bytes landing, wake the core's schedulers (warps.mb_landed).
@njit(cache=True)
def _mbwait_blocked(TS, S, P, w, pc, now):
    """(cycle, why) warp w's mbarrier.wait may not issue yet: R_BARRIER (its phase has arrivals or
    transaction bytes to come: INF; or an arrival another SM sent it is on its way: the cycle it
    lands), R_LONG_SB (copies counted into it are in flight: INF), or why -1: it may (also when
    its operands would fault: issue reports that)."""
    top = S.sp[w] - 1
    mask = X.active_mask(P, S, w, pc, S.stack_mask[w, top])
    if mask == 0:
        return now, -1
    lane = 0
    while not ((mask >> lane) & 1):
        lane += 1
    addr = (S.regs[w, P.src0[pc], lane] if P.src0[pc] >= 0 else np.int64(0)) + P.imm[pc]
    if addr < 0 or addr & 7 or addr + 8 > S.geom[X.G_SHARED]:
        return now, -1
    bs = S.warp_smem[w]
    v = S.s64[bs, addr >> 3]
    parity = S.regs[w, P.src1[pc], lane] & 1
    if (v >> 22) & X.MB_FIELD == 0:
        return now, -1
    if v & 1 == parity:
        return INF, R_BARRIER
    i = mb_slot(TS, bs, addr, False)
    if i >= 0:
        if TS.mb_bytes[bs, i, parity] > 0:
            return INF, R_LONG_SB
        if TS.mb_ready[bs, i, parity] > now:
            return TS.mb_ready[bs, i, parity], R_BARRIER
    return now, -1


@njit(cache=True)
def _mbar_issue(C, TS, S, P, T, core, w, pc, now):
    """Book an issued mbarrier operation or bulk tensor copy (execute left its operands in S.addr)
    in the block's barrier rows. Returns the barrier's row, -2 for a multicast copy whose mask
    leaves out the issuer's block or a remote arrival (no row of its own), -1 after a fault (the
    rows are full)."""
    bs = S.warp_smem[w]
    sem = T.sem[P.op[pc]]
    if sem == X.S_MBREMOTE:
        return _remote_arrive(C, TS, S, core, w, pc, now)
    tma = sem == X.S_TMA
    if tma and S.addr[w, 7] != 0 and not (S.addr[w, 7] >> (S.warp_block[w] % C.v[C_CLUSTER])) & 1:
        return -2
    addr = S.addr[w, 1] if tma else S.addr[w, 0]
    i = mb_slot(TS, bs, addr, True)
    if i < 0:
        X.fault(S, X.F_MB_SLOTS, S.addr[w, 4] if tma else 0, addr, MB_SLOTS, pc)
        return -1
    if sem == X.S_MBINIT:
        mb_reset(TS, bs, i)
    if tma:
        TS.mb_bytes[bs, i, S.addr[w, 3]] += S.addr[w, 6]
    if S.addr[w, 5] if tma else S.addr[w, 2]:
        wake_core(TS, core, now)        # a phase completed: its waiters look again
    return i


@njit(cache=True)
def _remote_arrive(C, TS, S, core, w, pc, now):
    """mbarrier.arrive.remote: the arrival crosses the SM-to-SM network as an 8-byte st.dsmem does
    (the barrier's own block on this SM: at once); a wait on the phase it counted into goes on no
    sooner than it lands (TS.mb_ready)."""
    tb = S.addr[w, 3]
    tbs = S.block_smem[tb]
    addr = S.addr[w, 0]
    i = mb_slot(TS, tbs, addr, True)
    if i < 0:
        X.fault(S, X.F_MB_SLOTS, 0, addr, MB_SLOTS, pc)
        return -1
    tcore = TS.blk_core[tb]
    if tcore != core:
        t = _ds_send(C, TS, tcore, 8, now)
        par = S.addr[w, 1]
        if t > TS.mb_ready[tbs, i, par]:
            TS.mb_ready[tbs, i, par] = t
    if S.addr[w, 2]:
        wake_core(TS, tcore, now)       # a phase completed: its waiters look again
    return -2


# ----------------------------------------------------------------------------- thread-block clusters
@njit(cache=True)
def _cluster_arrive(C, TS, S, w, now):
    """Warp w arrived at barrier.cluster; the last warp of the cluster releases them all
    C_CBAR cycles on (and no sooner than the cluster's st.dsmem have landed)."""
    k = C.v[C_CLUSTER]
    cid = S.warp_block[w] // k
    TS.wst[w] = T_CBAR
    TS.start_at[w] = INF
    TS.cl_arrived[cid] += 1
    if TS.cl_arrived[cid] < k * TS.k[K_WPB]:
        return
    TS.cl_arrived[cid] = 0
    t = now if now > TS.cl_store[cid] else TS.cl_store[cid]
    t += C.v[C_CBAR]
    for b in range(cid * k, cid * k + k):
        bs = S.block_smem[b]
        for i in range(TS.bs_nwarps[bs]):
            v = TS.bs_first[bs] + i
            if TS.wst[v] == T_CBAR:
                TS.start_at[v] = t
        wake_core(TS, bs // C.v[C_MAX_BLOCKS], now)


@njit(cache=True)
def _ds_send(C, TS, tcore, n, now):
    """n bytes for the SM tcore (of another SM) over the SM-to-SM network: they pass their GPC's
    switch (in issue order, at its rate), then the target SM's port (likewise), and land C_DS_LAT
    cycles (the round trip) after the port. The switch and the ports keep their next free time in
    bytes (cycle x rate), so a rate that is no multiple of an access's bytes is met exactly.
    Returns the cycle they land."""
    g = TS.core_gpc[tcore]
    gb, pb = C.v[C_GPC_BPC], C.v[C_DS_BPC]
    b0 = now * gb if now * gb > TS.ds_gpc[g] else TS.ds_gpc[g]
    TS.ds_gpc[g] = b0 + n
    p0 = (b0 // gb) * pb
    if TS.ds_port[tcore] > p0:
        p0 = TS.ds_port[tcore]
    TS.ds_port[tcore] = p0 + n
    return (p0 + n + pb - 1) // pb + C.v[C_DS_LAT]


@njit(cache=True)
def _dsmem_issue(C, TS, S, Dd, core, w, pc, mask, now):
    """An ld.dsmem / st.dsmem over the SM-to-SM network: each target block's share of the lanes'
    bytes goes as one transfer (_ds_send); a lane's own block's scratchpad answers at the
    scratchpad's latency. Returns the cycle the last bytes land."""
    nb = Dd.access[pc]
    done = now + 1
    handled = np.int64(0)
    W = C.v[C_W]
    for l in range(W):
        if not ((mask >> l) & 1) or (handled >> l) & 1:
            continue
        tb = S.addr[w, l] >> 32                   # the target block (execute._dsmem)
        n = np.int64(0)
        for m in range(l, W):
            if (mask >> m) & 1 and S.addr[w, m] >> 32 == tb:
                n += nb
                handled |= np.int64(1) << m
        tcore = TS.blk_core[tb]
        t = now + C.v[C_SMEM_LAT] if tcore == core else _ds_send(C, TS, tcore, n, now)
        if t > done:
            done = t
    return done


# ----------------------------------------------------------------------------- issue
@njit(cache=True)
def _release_barrier(C, TS, bs, now):
    wake_core(TS, bs // C.v[C_MAX_BLOCKS], now)
    TS.bs_arrived[bs] = 0
    for i in range(TS.bs_nwarps[bs]):
        w = TS.bs_first[bs] + i
        if TS.wst[w] == T_BAR:
            TS.wst[w] = T_RUN


@njit(cache=True)
def _check_barrier(C, TS, bs, now):
    if TS.bs_arrived[bs] > 0 and TS.bs_arrived[bs] == TS.bs_alive[bs]:
        # every warp still alive has arrived; a warp that exited makes it a deadlock (as in the
        # functional interpreter): the block only goes on when none exited
        if TS.bs_alive[bs] == TS.bs_nwarps[bs]:
            _release_barrier(C, TS, bs, now)


@njit(cache=True)
def issue(C, TS, S, P, T, Dd, MS, core, sub, w, now):
    """Issue warp w's next instruction at cycle `now`. Returns an execute.ST_* status."""
    top = S.sp[w] - 1
    pc = S.stack_pc[w, top]
    mask = X.active_mask(P, S, w, pc, S.stack_mask[w, top])
    TS.opready[w, 0] = -1  # its registers' ready cycles change now (_evaluate)
    S.icount[w] = now  # %clock reads the core cycle in timing runs
    st = X.step_masked(P, T, S, w, mask)
    if st == X.ST_FAULT:
        return st
    cls = Dd.cls[pc]
    TS.issued[core] += 1
    TS.pc_issued[pc] += 1
    TS.blk_issued[S.warp_block[w]] += 1
    TS.flops[core] += Dd.flops[pc] * popcount(mask)
    ii = Dd.ii[pc]
    if cls == D.CLS_TENSOR:
        TS.tensor_free[core, sub] = now + ii
        TS.pipe_busy_cycles[core, TS.pipe_busy_cycles.shape[1] - 1] += ii
        hold = C.v[C_MMA_HOLD]
        if hold > 1:  # its operand reads keep the sub-core's arithmetic pipes from issuing
            held = C.v[C_HOLD_PIPES]
            for p in range(C.v[C_NPIPES]):
                if (held >> p) & 1 and TS.pipe_free[core, sub, p] < now + hold:
                    TS.pipe_free[core, sub, p] = now + hold
    elif cls == D.CLS_WGMMA and mask != 0:      # (no lane passes: it does nothing at all)
        _wgmma_issue(TS, Dd, core, sub, w, pc, now, scratch_reads(MS, core, Dd.access[pc], now))
    elif Dd.pipe[pc] >= 0:
        TS.pipe_free[core, sub, Dd.pipe[pc]] = now + ii
        TS.pipe_busy_cycles[core, Dd.pipe[pc]] += ii
    if mask == 0 and cls != D.CLS_BRANCH and cls != D.CLS_EXIT:
        return st  # guarded off: held the pipe, produced nothing
    lat = Dd.lat[pc]
    if cls == D.CLS_ALU or cls == D.CLS_TENSOR:
        for i in range(Dd.nwr[pc]):
            r = Dd.wr[pc, i]
            TS.reg_ready[w, r] = now + lat
            TS.reg_kind[w, r] = Dd.src_kind[pc]
        p = Dd.pwr[pc]
        if p >= 0:
            TS.pred_ready[w, p] = now + lat
    elif cls == D.CLS_CPCOMMIT:
        TS.cp_open[w] += 1
        g = TS.cp_open[w]
        if TS.cp_pending[w, g % CP_GROUPS] > 0:   # the ring's slot still counts an older group's copies
            X.fault(S, X.F_CP_GROUPS, 0, g, g - CP_GROUPS, pc)
            return X.ST_FAULT
        TS.cp_pending[w, g % CP_GROUPS] = 0
    elif cls == D.CLS_WGCOMMIT:
        n = TS.wg[w, WG_NCOMMIT]
        prev = TS.wg[w, WG_DONE0 + (n - 1) % WG_GROUPS] if n > 0 else np.int64(0)
        TS.wg[w, WG_DONE0 + n % WG_GROUPS] = max(prev, TS.wg[w, WG_PEND])
        TS.wg[w, WG_PEND] = 0
        TS.wg[w, WG_NCOMMIT] = n + 1
    elif cls == D.CLS_CPWAIT or cls == D.CLS_DMAWAIT or cls == D.CLS_RMAWAIT or cls == D.CLS_BKWAIT:
        TS.wait_arg[w] = np.int32(P.imm[pc])
        TS.wst[w] = T_CPWAIT if cls == D.CLS_CPWAIT else (T_DMAWAIT if cls == D.CLS_DMAWAIT else (
            T_RMAWAIT if cls == D.CLS_RMAWAIT else T_BKWAIT))
        if waiting_done(TS, w):
            TS.wst[w] = T_RUN
    elif cls == D.CLS_BKCOMMIT:
        g = TS.bk[w, BK_COMMITTED]
        TS.bk[w, BK_MARK0 + g % BK_GROUPS] = TS.bk[w, BK_ISSUED]
        TS.bk[w, BK_COMMITTED] = g + 1
    elif cls == D.CLS_TMAST:
        tma_store_issue(MS, TS, S, P, T, core, w, pc, now)
    elif cls == D.CLS_BAR:
        if st == X.ST_BAR:
            bs = TS.slot_block[w]
            TS.wst[w] = T_BAR
            TS.bs_arrived[bs] += 1
            _check_barrier(C, TS, bs, now)
    elif cls == D.CLS_BARGRID:
        if st == X.ST_GRIDBAR:
            TS.wst[w] = T_GRIDBAR
            TS.k[K_GRIDBAR] += 1
    elif cls == D.CLS_EXIT:
        if st == X.ST_EXITED:
            bs = TS.slot_block[w]
            TS.wst[w] = T_DONE
            TS.bs_alive[bs] -= 1
            if TS.bs_alive[bs] == 0:
                _retire_block(C, TS, S, TS.slot_block[w], now)
                if TS.core_blocks[core] == 0 and TS.k[K_NEXT] >= TS.k[K_END]:
                    mem_core_done(MS, TS, core, now)  # no block left: a Sunway CPE tells its MPE
    elif cls == D.CLS_MBAR or cls == D.CLS_TMA:
        i = _mbar_issue(C, TS, S, P, T, core, w, pc, now)
        if i == -1:
            return X.ST_FAULT
        if cls == D.CLS_TMA and tma_issue(MS, TS, S, P, T, core, w, pc, i, now):
            return X.ST_FAULT
    elif cls == D.CLS_MBWAIT:
        pass
    elif cls == D.CLS_CBAR:
        if st == X.ST_CBAR:
            _cluster_arrive(C, TS, S, w, now)
    elif cls == D.CLS_DSLD or cls == D.CLS_DSST:
        done = _dsmem_issue(C, TS, S, Dd, core, w, pc, mask, now)
        if cls == D.CLS_DSLD:
            for i in range(Dd.nwr[pc]):
                TS.reg_ready[w, Dd.wr[pc, i]] = done
                TS.reg_kind[w, Dd.wr[pc, i]] = D.SRC_LONG
        else:
            cid = S.warp_block[w] // C.v[C_CLUSTER]
            if done > TS.cl_store[cid]:
                TS.cl_store[cid] = done
    elif cls != D.CLS_BRANCH and cls != D.CLS_NOP:
        # memory instructions: the memory system books them and marks results ready later
        if mem_issue(MS, TS, S, P, Dd, core, w, pc, mask, now):
            return X.ST_FAULT  # a fault only the timing model sees (an RMA to another core group ...)
    return st


# ----------------------------------------------------------------------------- scheduling
@njit(cache=True)
def _evaluate(C, TS, S, P, Dd, MS, core, sub, w, now):
    """(ready cycle, stall reason if not ready now) of a resident warp.

    Its operands' ready cycle and the kind of the latest one are remembered (TS.opready) until
    the warp issues or a memory reply brings its registers forward (warps.wake_warp_regs): only
    those change them, so until then the remembered answer holds without reading the operands
    again (a warp waiting on a load is looked at each time its sub-core runs)."""
    st = TS.wst[w]
    if st == T_START:
        if TS.start_at[w] > now:
            return TS.start_at[w], R_IDLE
        TS.wst[w] = T_RUN
    if st == T_BAR or st == T_GRIDBAR:
        return INF, R_BARRIER
    if st == T_CBAR:
        if TS.start_at[w] > now:
            return TS.start_at[w], R_BARRIER
        TS.wst[w] = T_RUN
    if st == T_CPWAIT or st == T_DMAWAIT or st == T_RMAWAIT or st == T_BKWAIT:
        if waiting_done(TS, w):
            TS.wst[w] = T_RUN
        else:
            return INF, (R_LONG_SB if st == T_CPWAIT or st == T_BKWAIT else R_DMA_WAIT)
    pc = S.stack_pc[w, S.sp[w] - 1]
    if TS.opready[w, 0] != pc:
        t, kind = operands_ready(TS, Dd, w, pc, now)
        TS.opready[w, 0] = pc
        TS.opready[w, 1] = t
        TS.opready[w, 2] = kind
    else:
        t = TS.opready[w, 1]
        kind = TS.opready[w, 2]
    if t > now:
        if t >= INF:
            return INF, _kind_reason(kind)
        return t, _kind_reason(kind)
    cls = Dd.cls[pc]
    if cls == D.CLS_WGWAIT or cls == D.CLS_WGFENCE:
        t, reason = _wgmma_wait(TS, P, Dd, w, pc)
        if t > now:
            return t, reason
    elif cls == D.CLS_MBWAIT:
        t, why = _mbwait_blocked(TS, S, P, w, pc, now)
        if why >= 0:        # an arrival completing its phase, or its last bytes landing, wakes it
            return t, why
    u = unit_free_at(TS, Dd, core, sub, pc)
    if u > now:
        return u, R_PIPE_BUSY
    if not mem_can_issue(MS, TS, S, Dd, core, w, pc, now) and not (
            (cls == D.CLS_TMA or cls == D.CLS_TMAST)
            and X.active_mask(P, S, w, pc, S.stack_mask[w, S.sp[w] - 1]) == 0):  # a copy no lane issues takes no entry
        TS.mem_wait[core] |= np.int64(1) << min(sub, 62)  # the memory side wakes it when an entry frees
        return INF, R_PIPE_BUSY
    return now, R_ISSUED


# subcore_cycle's out[]: instructions issued, a fault (1), the faulting warp
SO_ISSUED, SO_FAULT, SO_FAULT_WARP, SO_N = range(4)


@njit(cache=True)
def subcore_cycle(C, TS, S, P, T, Dd, MS, core, sub, now, out):
    """One scheduler cycle of sub-core `sub` of `core` (TS.k[K_CUR] names it while it runs).
    out[SO_ISSUED] += instructions issued; out[SO_FAULT] = 1 and out[SO_FAULT_WARP] = warp on a
    fault. Leaves TS.wake set
    to the first cycle one of its warps may issue (INF: only an event can wake it)."""
    v = C.v
    slots = v[C_SLOTS]
    nsub = v[C_SUBCORES]
    base = core * slots
    budget = v[C_ISSUE]
    gto = v[C_SCHED] == SCHED_GTO
    last = TS.last_warp[core, sub]
    i = core * nsub + sub
    hi = TS.slot_hi[core]     # slots above it were never used
    flush_stalls(TS, i, now)  # the cycles it slept through
    TS.wake[i] = INF          # events during this cycle (a barrier its issue releases) lower it
    nxt = INF
    # evaluate every resident warp of this sub-core once
    best = np.int64(-1)  # not the literal -1, which numba would compile issue() for as well
    best_key = INF
    nready = 0
    for s in range(sub, hi, nsub):
        w = base + s
        st = TS.wst[w]
        if st == T_EMPTY or st == T_DONE:
            TS.reason[w] = -1
            continue
        t, reason = _evaluate(C, TS, S, P, Dd, MS, core, sub, w, now)
        if reason == R_ISSUED:
            TS.reason[w] = R_NOT_SELECTED
            nready += 1
            # policy key: GTO prefers the last issued warp, then the oldest; LRR the next slot after last
            if gto:
                key = np.int64(-1) if w == last else TS.age[w]
            else:
                key = np.int64((s - (last - base) - 1) % slots) if last >= 0 else np.int64(s)
            if key < best_key:
                best_key = key
                best = w
        else:
            TS.reason[w] = reason
            if t < nxt:
                nxt = t
    issued = 0
    while best >= 0 and issued < budget:
        w = best
        st = issue(C, TS, S, P, T, Dd, MS, core, sub, w, now)
        if st == X.ST_FAULT:
            out[SO_FAULT] = 1
            out[SO_FAULT_WARP] = w
            return
        TS.reason[w] = R_ISSUED
        TS.last_warp[core, sub] = w
        issued += 1
        best = np.int64(-1)
        if issued < budget:  # dual issue: the next best among the others
            best_key = INF
            for s in range(sub, hi, nsub):
                w2 = base + s
                if TS.reason[w2] != R_NOT_SELECTED:
                    continue
                t, reason = _evaluate(C, TS, S, P, Dd, MS, core, sub, w2, now)
                if reason != R_ISSUED:
                    continue
                key = TS.age[w2] if gto else np.int64((s - (w - base) - 1) % slots)
                if key < best_key:
                    best_key = key
                    best = w2
    out[SO_ISSUED] += issued
    # account this cycle
    for s in range(sub, hi, nsub):
        w = base + s
        r = TS.reason[w]
        if r >= 0:
            TS.stall[core, r] += 1
    TS.acct[i] = now + 1
    if nready > issued:
        nxt = now + 1  # a ready warp was not selected: it goes next cycle
    elif issued:
        # The warp that issued changed: look at it as the next cycle's evaluation would (its
        # operands, pipes and wait state only change again through events that wake this
        # sub-core), so that a dependent instruction or a busy pipe sleeps until it is ready
        # instead of waking next cycle to find that out. Its reason covers the cycles slept.
        if issued > 1 or TS.wst[TS.last_warp[core, sub]] == T_EMPTY:
            nxt = now + 1
        else:
            w = np.int64(TS.last_warp[core, sub])
            if TS.wst[w] != T_DONE:
                t, reason = _evaluate(C, TS, S, P, Dd, MS, core, sub, w, now + 1)
                TS.reason[w] = reason
                if t < nxt:
                    nxt = t
    if nxt < TS.wake[i]:
        TS.wake[i] = nxt  # (the run loop sets its span's TS.wsum after the look: wake_span_min)


