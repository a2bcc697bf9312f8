"""Warp slots and the wake API: the timing state of every warp slot and core (TState), the warp
states and stall reasons, and how the memory side (memory, DMA, RMA, MPE) tells a sleeping
scheduler that what its warps wait on changed. The core model (core.py) and every block that
answers a warp use this module; it imports nothing of theirs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine.jit import njit
from archsim.engine.names import STALL_NAMES  # noqa: F401 (re-exported)
from archsim.engine.queues import SPAN_SHIFT, span_bounds
from archsim.isa.check import WG_GROUPS  # noqa: F401 (re-exported)

INF = np.int64(1) << 62

# warp states (timing)
# T_START: its block is placed but not launched yet (TState.start_at); T_CBAR: at barrier.cluster (start_at:
# the cycle its cluster's barrier releases it, INF until every warp arrived)
# T_BKWAIT: at cp.async.bulk.wait_group (TState.bk)
T_EMPTY, T_RUN, T_BAR, T_GRIDBAR, T_DONE, T_CPWAIT, T_DMAWAIT, T_RMAWAIT, T_START, T_CBAR, T_BKWAIT = range(11)

# stall reasons, in docs/records.md order (names.STALL_NAMES)
(R_ISSUED, R_NOT_SELECTED, R_WAIT, R_LONG_SB, R_SHORT_SB, R_PIPE_BUSY, R_BARRIER, R_DMA_WAIT,
 R_IDLE) = range(9)

# TState.k: the next block to dispatch, blocks finished, the age counter, the end of the block range
# (blocks total unless sampling), warps per block, registers per warp, shared bytes per block, grid
# barrier arrivals, the sub-core whose scheduler is running (-1: none), sub-cores per core, warp
# slots per core
K_NEXT, K_FINISHED, K_AGE, K_END, K_WPB, K_REGS, K_SMEM, K_GRIDBAR, K_CUR, K_SUBCORES, K_SLOTS, K_N = range(12)
HOME_SUB, HOME_CORE = 0, 1   # TState.home rows
# cp.async commit groups a warp's bookkeeping ring tracks: the groups a warp has committed and not
# waited for must not exceed it (a GEMM pipeline keeps at most stages - 1). Not a machine figure:
# real hardware has no such limit, so it is no config setting.
CP_GROUPS = 8
# TState.bk columns: a warp's bulk tensor stores issued, those whose last piece has left (in issue
# order: one TMA unit an SM takes them in turn), its bulk groups committed, then (a ring of
# BK_GROUPS by group number) the stores issued when each group was committed
BK_ISSUED, BK_SENT, BK_COMMITTED, BK_MARK0 = range(4)
BK_GROUPS = 8
# transaction barriers (mbarrier) a block may use at once: TState.mb_addr columns. Bookkeeping of the
# timing model (an mbarrier is a scratchpad word, unlimited in hardware), so no config setting.
MB_SLOTS = 32
# wgmma groups a warp tracks (the ISA refuses wait_group WG_GROUPS or more): TState.wg columns
WG_PEND, WG_NCOMMIT, WG_DONE0 = 0, 1, 2


class TState(NamedTuple):
    """Timing state of every warp slot and core (struct of arrays)."""

    reg_ready: np.ndarray    # int64 [NW, R] cycle the register's value is available
    reg_kind: np.ndarray     # int8  [NW, R] producer kind (decode.SRC_*) of the pending value
    pred_ready: np.ndarray   # int64 [NW, 8]
    opready: np.ndarray      # int64 [NW, 3] the warp's last operands_ready: (pc, cycle, kind), pc -1 when none
                             # (see _evaluate)
    wst: np.ndarray          # int32 [NW] T_*
    age: np.ndarray          # int64 [NW] dispatch order (GTO picks the oldest)
    wait_arg: np.ndarray     # int32 [NW] N of the cp.async.wait / dma.wait / rma.wait it waits on
    start_at: np.ndarray     # int64 [NW] first cycle the warp may issue (its block's launch; T_START until then)
    cp_open: np.ndarray      # int32 [NW] number of the open cp.async group
    cp_oldest: np.ndarray    # int32 [NW] oldest group that may still have copies in flight
    cp_pending: np.ndarray   # int32 [NW, CP_GROUPS] copies in flight per group (ring by group number)
    bk: np.ndarray           # int64 [NW, BK_MARK0 + BK_GROUPS] bulk tensor stores and their groups (BK_*)
    bulk_pending: np.ndarray  # int32 [NW, 2] DMA and RMA transfers in flight
    wg: np.ndarray           # int64 [NW, WG_DONE0 + WG_GROUPS] warpgroup MMA: the latest completion of its
                             # uncommitted wgmma, groups committed, and (ring by group number) the cycle by
                             # which a group and every older one are complete
    wg_queue: np.ndarray     # int64 [cores * subcores, depth + 1] the completion cycles of the last `depth`
                             # wgmma each sub-core's tensor unit took (a ring), and the ring's next slot
    slot_block: np.ndarray   # int32 [NW] block slot (core * max_blocks + b) the warp belongs to
    mb_addr: np.ndarray      # int64 [block slots, MB_SLOTS] scratchpad address of each transaction barrier a
                             # block initialised (-1 free); [1, 1] on a machine without a TMA unit
    mb_bytes: np.ndarray     # int64 [block slots, MB_SLOTS, 2] bytes of bulk tensor copies counted into the
                             # barrier's phase of each parity and not landed yet
    mb_gen: np.ndarray       # int64 [block slots, MB_SLOTS] the row's initialisations so far: a copy counted
                             # into an earlier one (a barrier initialised again, a block gone) lands on nothing
    mb_ready: np.ndarray     # int64 [block slots, MB_SLOTS, 2] the cycle the last arrival another SM sent
                             # into the barrier's phase of each parity lands (mbarrier.arrive.remote)
    reason: np.ndarray       # int8  [NW] the warp's stall reason this cycle (R_*; -1 not resident)
    pipe_free: np.ndarray    # int64 [cores, subcores, pipes]
    tensor_free: np.ndarray  # int64 [cores, subcores]
    last_warp: np.ndarray    # int32 [cores, subcores] last issued slot (-1)
    # event-driven scheduling (skip-ahead per sub-core): sub-core i = core * subcores + sub
    wake: np.ndarray         # int64 [cores * subcores] first cycle its scheduler may issue again
    wsum: np.ndarray         # int64 [n_spans(cores * subcores)] the earliest wake of the sub-cores of a
                             # span (queues.SPAN) whose core holds a block (the run loop looks into a
                             # span only from that cycle on; see wake_span_min)
    acct: np.ndarray         # int64 [cores * subcores] stall cycles are accounted up to here (excl.)
    mem_wait: np.ndarray     # int64 [cores] bit s: a warp of sub-core s (62: s >= 62) found the SM's MIO
                             # queue, trackers or DMA / RMA FIFO full (wake_refused)
    launch_at: np.ndarray    # int64 [cores] cycle the core may start issuing (Sunway: its MPE launch
                             # message arrived, engine/mpe.py; INF until then; 0 on a GPU)
    launch_free: np.ndarray  # int64 [cores] first cycle the core's next block may start (block_interval_cycles)
    core_order: np.ndarray   # int32 [cores] the order the first dispatch visits cores (dispatch_order)
    # block slots
    bs_block: np.ndarray     # int32 [cores * max_blocks] launch block id (-1 free)
    bs_alive: np.ndarray     # int32 warps not exited
    bs_arrived: np.ndarray   # int32 warps waiting at bar.sync
    bs_first: np.ndarray     # int32 first warp slot of the block (its warps are consecutive)
    bs_nwarps: np.ndarray    # int32
    core_warps: np.ndarray   # int32 [cores] warp slots in use
    core_smem: np.ndarray    # int64 [cores] scratchpad bytes in use
    core_regs: np.ndarray    # int64 [cores] registers in use
    core_blocks: np.ndarray  # int32 [cores]
    slot_hi: np.ndarray      # int32 [cores] 1 + the highest warp slot ever used (the scheduler's loops stop there)
    # counters
    stall: np.ndarray        # int64 [cores, 9] warp-cycles by reason
    issued: np.ndarray       # int64 [cores] warp-instructions
    flops: np.ndarray        # int64 [cores]
    pipe_busy_cycles: np.ndarray  # int64 [cores, pipes + 1] (last: tensor)
    pc_issued: np.ndarray    # int64 [program length] warp-instructions issued at each pc (interval sampling)
    blk_issued: np.ndarray   # int64 [blocks] warp-instructions each block issued (interval sampling)
    # per launch block (for wave sampling and traces; -1 until it happens)
    blk_start: np.ndarray    # int64 [blocks] first cycle its warps may issue (placed, then launched)
    blk_done: np.ndarray     # int64 [blocks] cycle its last warp exited
    blk_core: np.ndarray     # int32 [blocks] core it ran on
    # thread-block clusters (the launch's cluster size C_CLUSTER > 1; else arrays of one)
    core_gpc: np.ndarray     # int32 [cores] GPC of each core
    gpc_lo: np.ndarray       # int32 [GPCs + 1] first core of each GPC
    cl_arrived: np.ndarray   # int32 [clusters] warps of the cluster at barrier.cluster
    cl_store: np.ndarray     # int64 [clusters] the latest cycle a st.dsmem of the cluster lands
    cl_pick: np.ndarray      # int64 [max cluster] scratch: the cores a cluster is placed on
    ds_port: np.ndarray      # int64 [cores] an SM's port into the SM-to-SM network is free from this cycle x its
                             # bytes per cycle (bytes: a fractional rate is met exactly)
    ds_gpc: np.ndarray       # int64 [GPCs] the same for a GPC's SM-to-SM switch
    k: np.ndarray            # int64 [K_N] kernel-wide scalars (K_*)
    home: np.ndarray         # int32 [2, max(NW, cores * subcores)]: the sub-core (core * subcores + sub) of
                             # each warp slot (HOME_SUB), the core of each sub-core (HOME_CORE), so that
                             # the hot paths look them up instead of dividing


# ----------------------------------------------------------------------------- event-driven scheduling
# A sub-core's scheduler runs only from the cycle in TS.wake on: the earliest cycle at which one of
# its warps may issue, as its last run found it (an operand's ready cycle, a pipe's free cycle; for
# the warp it issued, what the next cycle's evaluation would find). What its warps wait on beyond
# that wakes it (wake_subcore): a reply to a register a warp waits on, a finished copy group a warp
# waits on, a freed memory-side entry it was refused, a barrier, a new block. Its warps keep their
# stall reasons while it sleeps; the cycles are accounted lazily (flush_stalls) when it runs again,
# before anything changes its warps, at each timeline sample and at the end. With skip off
# (machine.run_loop) every scheduler runs every cycle: results are identical (tests check it).
@njit(cache=True)
def flush_stalls(TS, i, upto):
    """Account sub-core i's resident warps for cycles [acct, upto) with their last reasons."""
    n = upto - TS.acct[i]
    if n <= 0:
        return
    TS.acct[i] = upto
    nsub = TS.k[K_SUBCORES]
    slots = TS.k[K_SLOTS]
    core = TS.home[HOME_CORE, i]
    for s in range(i - core * nsub, TS.slot_hi[core], nsub):
        w = core * slots + s
        r = TS.reason[w]
        if r >= 0 and TS.wst[w] != T_EMPTY and TS.wst[w] != T_DONE:
            TS.stall[core, r] += n


@njit(cache=True)
def flush_all(TS, upto):
    for i in range(TS.acct.shape[0]):
        flush_stalls(TS, i, upto)


@njit(cache=True)
def wake_subcore(TS, i, now):
    """Something sub-core i's warps wait on changed during cycle `now`: its scheduler looks again
    at the first cycle of its own that has not run yet (this one if it comes later in the cycle's
    order, else the next)."""
    cur = TS.k[K_CUR]
    if i == cur:
        at = now + 1  # the running scheduler accounts this cycle itself
    else:
        at = now + 1 if i < cur else now
        flush_stalls(TS, i, at)
    if at < TS.wake[i]:
        TS.wake[i] = at
        if at < TS.wsum[i >> SPAN_SHIFT] and TS.core_blocks[TS.home[HOME_CORE, i]] > 0:
            TS.wsum[i >> SPAN_SHIFT] = at   # (wake_span_min)


@njit(cache=True)
def wake_placed(TS, core):
    """A block was placed on `core` from outside its span's look (a cluster placed over a GPC at
    another core's retirement): its sub-cores' wakes, set while the core held no block, enter
    their spans' entries now (wake_span_min)."""
    nsub = TS.k[K_SUBCORES]
    for i in range(core * nsub, core * nsub + nsub):
        if TS.wake[i] < TS.wsum[i >> SPAN_SHIFT]:
            TS.wsum[i >> SPAN_SHIFT] = TS.wake[i]


@njit(cache=True, inline="always")
def subcore_of(TS, w):
    """The sub-core (within its core) that warp slot w belongs to."""
    i = TS.home[HOME_SUB, w]
    return i - TS.home[HOME_CORE, i] * TS.k[K_SUBCORES]


@njit(cache=True, inline="always")
def wake_warp(TS, w, now):
    wake_subcore(TS, np.int64(TS.home[HOME_SUB, w]), now)


@njit(cache=True)
def wake_refused(TS, core, now):
    """An entry of the core's memory side (MIO queue, tracker, DMA / RMA FIFO) freed: wake the
    sub-cores whose warps were refused for want of one (the others' warps did not ask: they find
    what they found before) and clear the record."""
    mask = TS.mem_wait[core]
    TS.mem_wait[core] = 0
    nsub = TS.acct.shape[0] // TS.core_blocks.shape[0]
    for sb in range(nsub):
        if (mask >> min(sb, 62)) & 1:
            wake_subcore(TS, core * nsub + sb, now)


@njit(cache=True)
def wake_warp_regs(TS, w, now):
    """A memory reply made registers of warp w ready: its scheduler looks again only when the
    warp waits on a register (scoreboard) or has not been looked at yet. A warp whose last
    evaluation found a fixed-latency wait, a busy pipe, a barrier or a wait state, or found it
    ready, does not read (or write) a register still pending on memory (such a register would
    have made it a scoreboard stall): its scheduler would find what it found before. The
    warp's remembered operand readiness (core._evaluate) is forgotten."""
    TS.opready[w, 0] = -1
    r = TS.reason[w]
    if r < 0 or r == R_LONG_SB or r == R_SHORT_SB:
        wake_warp(TS, w, now)


@njit(cache=True)
def mb_slot(TS, bs, addr, create):
    """Block slot bs's row for its barrier at scratchpad address addr (-1: none); create: take a
    free row, its bytes cleared, when it has none (-1: the table is full)."""
    free = -1
    for i in range(TS.mb_addr.shape[1]):
        a = TS.mb_addr[bs, i]
        if a == addr:
            return i
        if a < 0 and free < 0:
            free = i
    if not create or free < 0:
        return -1
    TS.mb_addr[bs, free] = addr
    mb_reset(TS, bs, free)
    return free


@njit(cache=True)
def mb_reset(TS, bs, i):
    """Row i of block slot bs starts afresh (its barrier initialised): nothing in flight, a new
    generation."""
    TS.mb_bytes[bs, i, 0] = 0
    TS.mb_bytes[bs, i, 1] = 0
    TS.mb_ready[bs, i, 0] = 0
    TS.mb_ready[bs, i, 1] = 0
    TS.mb_gen[bs, i] += 1


@njit(cache=True)
def mb_landed(TS, core, bs, i, parity, addr, gen, nbytes, now):
    """A bulk tensor copy's nbytes landed for the phase of that parity of block slot bs's barrier
    in row i (if it is still the barrier at addr of generation gen: not initialised again since,
    nor its block gone): the warps of the core look again when none is left in flight."""
    if TS.mb_addr[bs, i] != addr or TS.mb_gen[bs, i] != gen:
        return
    TS.mb_bytes[bs, i, parity] -= nbytes
    if TS.mb_bytes[bs, i, parity] == 0:
        wake_core(TS, core, now)


@njit(cache=True)
def wake_core(TS, core, now):
    nsub = TS.acct.shape[0] // TS.core_blocks.shape[0]
    for sb in range(nsub):
        wake_subcore(TS, core * nsub + sb, now)


@njit(cache=True)
def wake_span_min(TS, j):
    """The earliest wake of the sub-cores of span j whose core holds a block (INF: none). The run
    loop sets TS.wsum[j] to it at launch and after each look into the span. Between two looks a
    wake only falls, through an event that lowers the span's entry with it (wake_subcore for a
    core with a block); what raises a wake or changes a core's blocks happens inside the look
    (a scheduler sets its own wake; a block retires and the next is placed at the issue of its
    last exit; a Sunway CPE's wake stays INF until its launch message lowers it). So the entry
    stays exact: a span whose entry lies beyond the cycle holds no scheduler due, and the
    earliest entry is the earliest wake of all."""
    lo, hi = span_bounds(j, TS.wake.shape[0])
    t = INF
    for i in range(lo, hi):
        if TS.wake[i] < t and TS.core_blocks[TS.home[HOME_CORE, i]] > 0:
            t = TS.wake[i]
    return t
