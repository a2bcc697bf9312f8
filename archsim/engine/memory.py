"""The memory system around the cores, stepped in the engine's tick order (memory -> fabric ->
cores): DRAM in the memory clock, then the L2 slices or controllers and the request / response
fabrics in the fabric clock, then the core-group side (Sunway), then every core's data pipe and
L1. Each side lives in its own module over one state (mem_state.py): core_side.py (MIO queues,
data pipes, L1s, trackers), l2_side.py (L2 slices and the DRAM path), sunway_side.py (core-group
replies, DMA engines, the CPE mesh); the blocks they use keep their own files (cache.py, noc.py,
dram.py, dma.py, rma.py, mpe.py). Every cycle of latency comes from those queues, links and banks.

Clock domains: the fabric and L2 step in the fabric clock, DRAM in the memory clock, both as
fixed-point phase accumulators against the core clock, so skip-ahead advances them exactly as
stepping would. ``mem_next_event`` tells the next core cycle at which anything can change.
"""

from __future__ import annotations

from archsim.engine import cache as CA
from archsim.engine import dma as DM
from archsim.engine import dram as DR
from archsim.engine import mpe as MPE
from archsim.engine import noc as NC
from archsim.engine import rma as RM
from archsim.engine import tma as TM
from archsim.engine import warps as WS
from archsim.engine.core_side import core_memory, pipe_takes_head
from archsim.engine.jit import njit
from archsim.engine.names import V_CORE, V_DRAM_PATH, V_SLICE, VISIT_FAMILIES
from archsim.engine.l2_side import dram_done, frontend_step, slice_cycle
from archsim.engine.mem_state import (CK_FAB_ACC, CK_MEM_ACC, CK_NOW_FAB, CK_NOW_MEM, LAT_COUNT, LAT_MAX, LAT_MIN,
                                      LAT_SUM, MK_CORE_ITEMS, MK_ON, MK_QUEUED, M_CHANNELS, M_CORES, M_FAB_RATIO,
                                      M_FE_LAT, M_GROUPED, M_GROUPS, M_HAS_L1, M_HAS_L2, M_MEM_RATIO, M_Q_FE,
                                      M_Q_L1D, M_Q_L2D, M_Q_L2F, M_Q_MISS, M_Q_RETRY, M_Q_RFILL, M_SLICES,
                                      ND_REQ_MEM, ND_RESP_CORE, ONE)
from archsim.engine.queues import q_peek, span_bounds
from archsim.engine.sunway_side import dma_engines_cycle, group_replies, mesh_cycle, mesh_next_event

@njit(cache=True)
def mem_cycle(MS, TS, S, Dd, now):
    """One core cycle of the memory system: DRAM (memory clock), then the L2 slices and the
    fabric (fabric clock), then every SM's data pipe and L1."""
    cfg = MS.cfg
    ck = MS.clocks
    C = cfg[M_CHANNELS]
    ck[CK_MEM_ACC] += cfg[M_MEM_RATIO]
    while ck[CK_MEM_ACC] >= ONE:
        DR.dram_step(MS.Dm, MS.Q, MS.R, 0, C, ck[CK_NOW_MEM])
        ck[CK_NOW_MEM] += 1
        ck[CK_MEM_ACC] -= ONE
    ck[CK_FAB_ACC] += cfg[M_FAB_RATIO]
    V = MS.visits
    while ck[CK_FAB_ACC] >= ONE:
        nf = ck[CK_NOW_FAB]
        Q = MS.Q
        busy = 0
        for c in range(C):          # only channels with something queued (a call costs more than the test)
            done = Q.count[C + c] > 0
            if done:
                dram_done(MS, c, nf)
            if cfg[M_FE_LAT] > 0 and Q.count[cfg[M_Q_FE] + c] > 0:
                frontend_step(MS, c, nf)
                done = True
            busy += done
        V[V_DRAM_PATH, 0] += C
        V[V_DRAM_PATH, 1] += busy
        busy = 0
        for sl in range(cfg[M_SLICES]):
            if _slice_has_work(MS, sl, nf):  # a call passes the whole state: skip idle slices
                busy += slice_cycle(MS, sl, nf)
        V[V_SLICE, 0] += cfg[M_SLICES]
        V[V_SLICE, 1] += busy
        NC.noc_step(MS.req, nf)
        NC.noc_step(MS.resp, nf)
        ck[CK_NOW_FAB] += 1
        ck[CK_FAB_ACC] -= ONE
    if cfg[M_GROUPED]:
        for g in range(cfg[M_GROUPS]):
            if NC.noc_deliverable(MS.resp, MS.gnode[g, 1]):
                group_replies(MS, TS, g, now)
        if MS.dma.cfg[DM.DC_ENGINES] > 0:
            DM.dma_bcast_poll(MS.dma, TS, now)
            dma_engines_cycle(MS, TS, now)
    if MS.mk[MK_ON]:
        mesh_cycle(MS, TS, now)
    if cfg[M_GROUPED]:
        # no reply comes to a core directly: only cores with something queued have work, and
        # those sit in the spans citems counts
        if MS.mk[MK_CORE_ITEMS] == 0:
            return
        n = cfg[M_CORES]
        busy = 0
        for j in range(MS.citems.shape[0]):
            if MS.citems[j] == 0:
                continue
            lo, hi = span_bounds(j, n)
            V[V_CORE, 0] += hi - lo
            for core in range(lo, hi):
                if _core_has_work(MS, core, now):
                    busy += core_memory(MS, TS, S, Dd, core, now)
        V[V_CORE, 1] += busy
        return
    busy = 0
    for core in range(cfg[M_CORES]):
        if _core_has_work(MS, core, now):
            busy += core_memory(MS, TS, S, Dd, core, now)
    V[V_CORE, 0] += cfg[M_CORES]
    V[V_CORE, 1] += busy


@njit(inline="always")
def _slice_has_work(MS, sl, now):
    """Anything for slice_cycle to look at: replies due (each reply queue is in due order, so its
    head tells), DRAM retries, a request held or delivered by the request fabric once the data
    array is free again (until then the slice takes no request), a held request that found the
    slice full only after a fill."""
    cfg = MS.cfg
    Q = MS.Q
    return (head_due(MS, cfg[M_Q_L2D] + sl, now) or head_due(MS, cfg[M_Q_L2F] + sl, now)
            or head_due(MS, cfg[M_Q_RFILL] + sl, now) or Q.count[cfg[M_Q_RETRY] + sl] > 0
            or (MS.slice_busy[sl] <= now and (MS.slice_full[sl] == 0 if MS.slice_hold[sl] >= 0
                                              else NC.noc_deliverable(MS.req, MS.node[ND_REQ_MEM, sl]))))


@njit(inline="always")
def head_due(MS, q, now):
    """The oldest request of delay queue q is due (its aux1 cycle has come)."""
    return MS.Q.count[q] > 0 and MS.R.aux1[q_peek(MS.Q, q, 0)] <= now


@njit(inline="always")
def _core_has_work(MS, core, now):
    """Anything for core_memory to look at: replies delivered, L1 hits due, an MIO entry the data
    pipe takes (pipe_takes_head), misses waiting for the request fabric, a TMA copy's next request."""
    cfg = MS.cfg
    Q = MS.Q
    return (pipe_takes_head(MS, core, now) or head_due(MS, cfg[M_Q_L1D] + core, now)
            or Q.count[cfg[M_Q_MISS] + core] > 0 or TM.tma_ready(MS.tma, core, now)
            or (cfg[M_GROUPED] == 0 and NC.noc_deliverable(MS.resp, MS.node[ND_RESP_CORE, core])))


@njit(cache=True)
def mem_idle(MS):
    """No request anywhere in the memory system (DRAM refresh alone does not count)."""
    if MS.R.nfree[0] != MS.R.free.shape[0]:
        return False
    for core in range(MS.cfg[M_CORES]):
        if MS.mio_count[core] > 0 or MS.tma.count[core] > 0:
            return False
    return not DM.dma_busy(MS.dma) and not RM.rma_busy(MS.rma) and MS.mk[MK_QUEUED] == 0 and NC.noc_idle(MS.mesh) \
        and not MPE.mpe_busy(MS.mpe)


@njit(cache=True, inline="always")
def _after(t, lo):
    """An event at cycle t, seen from a step that cannot come before lo."""
    return t if t > lo else lo


@njit(cache=True)
def _core_cycle_of(ck_now, ck_acc, ratio, t, now):
    """The core cycle (> now) in which cycle t of a clock domain is stepped, when its next cycle
    to step is ck_now with accumulator ck_acc and it advances ratio (fixed point) a core cycle."""
    need = (t - ck_now + 1) * ONE - ck_acc
    j = (need + ratio - 1) // ratio
    if j < 1:
        j = 1
    return now + j


@njit(cache=True)
def _fabric_next_event(MS, now):
    """The first fabric cycle (>= the next one to step) at which the networks, the memory endpoints
    (slices) or the DRAM front ends and completions can change anything (WS.INF: none). Packets a
    network has delivered count when their receiver can take them: a slice when its data array
    is free; an SM or a core group's stop at once (-1: in the next core cycle)."""
    cfg = MS.cfg
    Q = MS.Q
    R = MS.R
    F = MS.clocks[CK_NOW_FAB]
    C = cfg[M_CHANNELS]
    t = WS.INF
    for c in range(C):
        if Q.count[C + c] > 0:
            return F                                  # DRAM finished requests: dram_done
        q = cfg[M_Q_FE] + c
        if Q.count[q] > 0:
            t = min(t, _after(MS.fe_t[c, Q.head[q]], F))
    for sl in range(cfg[M_SLICES]):
        for q in (cfg[M_Q_L2D] + sl, cfg[M_Q_L2F] + sl, cfg[M_Q_RFILL] + sl):
            if Q.count[q] > 0:
                t = min(t, _after(R.aux1[q_peek(Q, q, 0)], F))
        if Q.count[cfg[M_Q_RETRY] + sl] > 0:
            return F
        if MS.slice_hold[sl] >= 0:
            if MS.slice_full[sl] == 0:
                t = min(t, _after(MS.slice_busy[sl], F))  # (full: a DRAM fill frees it)
        elif NC.noc_deliverable(MS.req, MS.node[ND_REQ_MEM, sl]):
            t = min(t, _after(MS.slice_busy[sl], F))
    if cfg[M_GROUPED]:
        for g in range(cfg[M_GROUPS]):
            if NC.noc_deliverable(MS.resp, MS.gnode[g, 1]):
                return -1
    else:
        for core in range(cfg[M_CORES]):
            if NC.noc_deliverable(MS.resp, MS.node[ND_RESP_CORE, core]):
                return -1
    for N in (MS.req, MS.resp):
        if not NC.noc_idle(N):
            t = min(t, NC.noc_next_event(N, N.clk[NC.C_LAST]))
    return t


@njit(cache=True)
def mem_next_event(MS, now):
    """The next core cycle (> now) at which the memory system can change anything (WS.INF: never):
    the earliest of the SMs' data pipes, L1 return pipelines and miss queues, the fabric side
    (_fabric_next_event), the DMA engines, the CPE meshes and DRAM. Stepping straight there gives
    the same results as stepping every cycle: whatever waits in between (a packet in a router's
    pipeline, a reply in an L2 slice's, a request in DRAM) has a known cycle."""
    cfg = MS.cfg
    ck = MS.clocks
    Q = MS.Q
    R = MS.R
    f = ck[CK_NOW_FAB] - 1
    if MS.req.clk[NC.C_MOVED] == f or MS.resp.clk[NC.C_MOVED] == f or MS.mesh.clk[NC.C_MOVED] == now:
        return now + 1  # a network moved a packet in its last cycle: it streams, do not look further
    t = WS.INF
    n = cfg[M_CORES]
    for j in range(MS.citems.shape[0] if MS.mk[MK_CORE_ITEMS] > 0 else 0):  # (only cores with items queued)
        if MS.citems[j] == 0:
            continue
        lo, hi = span_bounds(j, n)
        for core in range(lo, hi):
            if Q.count[cfg[M_Q_MISS] + core] > 0:
                return now + 1
            if MS.mio_count[core] > 0 and MS.l1_full[core] == 0:   # (full: an L1 fill frees it)
                t = min(t, _after(MS.mio_next[core], now + 1))
            q = cfg[M_Q_L1D] + core
            if Q.count[q] > 0:
                t = min(t, _after(R.aux1[q_peek(Q, q, 0)], now + 1))
            if MS.tma.count[core] > 0:
                t = min(t, TM.tma_next_event(MS.tma, core, now))
    tf = _fabric_next_event(MS, now)
    if tf < 0:
        return now + 1
    if tf < WS.INF:
        t = min(t, _core_cycle_of(ck[CK_NOW_FAB], ck[CK_FAB_ACC], cfg[M_FAB_RATIO], tf, now))
    if MS.dma.cfg[DM.DC_ENGINES] > 0:
        t = min(t, DM.dma_next_event(MS.dma, now))
    if MS.mk[MK_ON]:
        t = min(t, mesh_next_event(MS, now))
    tm = DR.dram_next_event(MS.Dm, MS.Q, 0, ck[CK_NOW_MEM])
    if tm < DR.NEVER:
        t = min(t, _core_cycle_of(ck[CK_NOW_MEM], ck[CK_MEM_ACC], cfg[M_MEM_RATIO], tm, now))
    return t


@njit(cache=True)
def mem_skip(MS, cycles):
    """Advance the clock domains over `cycles` skipped core cycles (nothing happens in them)."""
    cfg = MS.cfg
    ck = MS.clocks
    a = ck[CK_MEM_ACC] + cycles * cfg[M_MEM_RATIO]
    ck[CK_NOW_MEM] += a // ONE
    ck[CK_MEM_ACC] = a % ONE
    a = ck[CK_FAB_ACC] + cycles * cfg[M_FAB_RATIO]
    ck[CK_NOW_FAB] += a // ONE
    ck[CK_FAB_ACC] = a % ONE


def visit_counts(MS) -> dict:
    """{family: (units looked at, of those the ones that changed something)} so far (names.VISIT_FAMILIES)."""
    out = {name: (int(MS.visits[i, 0]), int(MS.visits[i, 1])) for i, name in enumerate(VISIT_FAMILIES)}
    out["dram_channel"] = (int(MS.Dm.vis[0]), int(MS.Dm.vis[1]))
    out["fabric_port"] = (int(MS.req.clk[NC.C_VISITS] + MS.resp.clk[NC.C_VISITS]),
                          int(MS.req.clk[NC.C_SENT] + MS.resp.clk[NC.C_SENT]))
    out["cpe_mesh"] = (int(MS.mesh.clk[NC.C_VISITS]), int(MS.mesh.clk[NC.C_SENT]))
    return out


def mem_counters(MS, cycles: int) -> dict:
    out = {"bytes": {k: int(MS.bytes[i]) for i, k in enumerate(("l1", "scratch", "l2", "dram_read", "dram_write",
                                                               "fabric", "dma", "rma"))},
           "load_latency": {"sum": int(MS.lat[LAT_SUM]), "count": int(MS.lat[LAT_COUNT]),
                            "min": int(MS.lat[LAT_MIN]) if MS.lat[LAT_COUNT] else 0, "max": int(MS.lat[LAT_MAX])},
           "now_mem": int(MS.clocks[CK_NOW_MEM]), "now_fab": int(MS.clocks[CK_NOW_FAB])}
    if MS.cfg[M_HAS_L1]:
        out["l1"] = CA.cache_counters(MS.L1, "l1")
    if MS.cfg[M_HAS_L2]:
        out["l2"] = CA.cache_counters(MS.L2, "l2")
    out["dram"] = DR.dram_counters(MS.Dm, int(MS.clocks[CK_NOW_MEM]))
    out["fabric"] = NC.fabric_counters(MS.req, MS.resp, max(int(MS.clocks[CK_NOW_FAB]), 1))
    if MS.dma.cfg[DM.DC_ENGINES] > 0:
        out["dma"] = DM.dma_counters(MS.dma)
    if MS.tma.cfg[TM.TC_ON]:
        out["tma"] = TM.tma_counters(MS.tma)
    if MS.rma.cfg[RM.RC_ENGINES] > 0:
        out["rma"] = RM.rma_counters(MS.rma)
    if MS.mk[MK_ON]:
        out["mesh"] = NC.noc_counters(MS.mesh, max(int(cycles), 1))
    if MS.mpe.cfg[MPE.MC_GROUPS] > 0:
        out["mpe"] = MPE.mpe_counters(MS.mpe)
    return out
