"""The core side of the memory system, per SM (or CPE): memory instructions enter the MIO queue at
issue (a full queue stalls issue: pipe_busy); the data pipe takes one wavefront per cycle (banks x
bank_width bytes, 128 B on an A100 SM): a shared-memory access costs one wavefront per
bank-conflict way, a global access one per line it touches. Shared loads are ready
``scratchpad.latency_cycles`` after their last wavefront, L1 hits ``l1.hit_latency_cycles`` after
theirs. Misses allocate L1 MSHRs and go into the core's miss queue toward the request fabric;
replies come back through the L1 pipeline and make the load's registers ready (trackers)."""

from __future__ import annotations

import numpy as np

from archsim.engine import cache as CA
from archsim.engine import decode as D
from archsim.engine import dma as DM
from archsim.engine import execute as X
from archsim.engine import noc as NC
from archsim.engine import rma as RM
from archsim.engine import tma as TM
from archsim.engine import warps as WS
from archsim.engine.jit import njit
from archsim.engine.mem_state import (BY_FABRIC, BY_L1, BY_SCRATCH, CK_NOW_FAB, E_BYTES, E_CLS, E_IDX, E_MASK,
                                      E_NLINES, E_PC, E_STARTED, E_TRK, E_WARP, MK_CORE_ITEMS, MK_STORES, M_BANKS,
                                      M_BANK_W, M_FILL_LINE, M_GROUPED, M_HAS_L1, M_HEADER, M_L1_LAT, M_LINE_BYTES,
                                      M_Q_L1D, M_Q_MISS, M_SECTOR, M_SMEM_LAT, M_W, ND_REQ_CORE, ND_REQ_MEM,
                                      ND_RESP_CORE, TAG_WRITE, TK_DST, TK_GROUP, TK_KIND, TK_NDST, TK_PENDING, TK_T0,
                                      TK_WARP, TRK_CP, TRK_LOAD, TRK_TMA, dest_slice, mc_entry, placed_addr, trk_done,
                                      trk_piece, trk_release)
from archsim.engine.queues import KIND_READ, KIND_WRITE, SPAN_SHIFT, q_peek, q_pop, q_push, req_alloc, req_free

# ----------------------------------------------------------------------------- issue side
_MEM_CLASSES = (D.CLS_LD_GLOBAL, D.CLS_ST_GLOBAL, D.CLS_LD_SHARED, D.CLS_ST_SHARED, D.CLS_LDMATRIX, D.CLS_CPASYNC)


@njit(cache=True)
def mem_can_issue(MS, TS, S, Dd, core, w, pc, now):
    cls = Dd.cls[pc]
    if cls == D.CLS_LD_GLOBAL or cls == D.CLS_ST_GLOBAL or cls == D.CLS_LD_SHARED or cls == D.CLS_ST_SHARED \
            or cls == D.CLS_LDMATRIX or cls == D.CLS_CPASYNC:
        if MS.mio_count[core] >= MS.mio.shape[1]:
            return False
        if (cls == D.CLS_LD_GLOBAL or cls == D.CLS_CPASYNC) and MS.trk_nfree[core] == 0:
            return False
    elif cls == D.CLS_DMA or cls == D.CLS_DMA_PUT:
        return DM.dma_can_issue(MS.dma, core, Dd.bcast[pc])  # the engine's descriptor FIFO has room
    elif cls == D.CLS_RMA or cls == D.CLS_RMA_PUT:
        return RM.rma_can_issue(MS.rma, core)
    elif cls == D.CLS_TMA:
        return TM.tma_has_room(MS.tma, core) and MS.trk_nfree[core] > 0
    elif cls == D.CLS_TMAST:
        return TM.tma_has_room(MS.tma, core)
    return True


@njit(cache=True)
def _lowest_lane(mask):
    lane = 0
    while lane < 63 and not ((mask >> lane) & 1):
        lane += 1
    return lane


@njit(cache=True)
def mem_issue(MS, TS, S, P, Dd, core, w, pc, mask, now):
    """Book a memory instruction just executed at issue (its addresses are in S.addr[w]).
    Returns 0, or 1 after a fault only the timing model sees (S.fault says which)."""
    cls = Dd.cls[pc]
    if cls == D.CLS_DMA or cls == D.CLS_DMA_PUT:
        # execute left the operands in S.addr: get [ldm], [global], n | put [global], [ldm], n
        # (execute._bulk: [3] count, [4] bsize, [5] stride of a strided form, [6] broadcast mode)
        put = cls == D.CLS_DMA_PUT
        mode = Dd.bcast[pc]
        if mode > 0:
            first = DM.dma_bcast_join(MS.dma, TS, w, core, mode, S.addr[w, 1], S.addr[w, 2], S.addr[w, 3],
                                      S.addr[w, 4], S.addr[w, 5], S.addr[w, 0], now)
            if first >= 0:
                X.fault(S, X.F_BCAST, _lowest_lane(mask), first, S.addr[w, 2], pc)
                return 1
            return 0
        DM.dma_issue(MS.dma, TS, w, core, put, S.addr[w, 0] if put else S.addr[w, 1], S.addr[w, 2], now,
                     S.addr[w, 3], S.addr[w, 4], S.addr[w, 5])
        return 0
    if cls == D.CLS_RMA or cls == D.CLS_RMA_PUT:
        # rma.put [remote], [local], n, blk | rma.get [local], [remote], n, blk: [3] blk, [4] lane
        blk = S.addr[w, 3]
        target = TS.blk_core[blk]
        n = S.addr[w, 2]
        if MS.rma.core_group[target] != MS.rma.core_group[core]:
            X.fault(S, X.F_RMA_GROUP, S.addr[w, 4], blk, n, pc)
            return 1
        RM.rma_issue(MS.rma, TS, w, core, cls == D.CLS_RMA_PUT, target, n, now)
        return 0
    if not (cls == D.CLS_LD_GLOBAL or cls == D.CLS_ST_GLOBAL or cls == D.CLS_LD_SHARED or cls == D.CLS_ST_SHARED
            or cls == D.CLS_LDMATRIX or cls == D.CLS_CPASYNC):
        return 0
    i = MS.mio_head[core] + MS.mio_count[core]
    if i >= MS.mio.shape[1]:
        i -= MS.mio.shape[1]
    MS.mio_count[core] += 1
    core_items(MS, core, 1)
    e = MS.mio[core, i]
    e[E_WARP] = w
    e[E_PC] = pc
    e[E_CLS] = cls
    e[E_MASK] = mask
    e[E_BYTES] = Dd.access[pc]
    e[E_TRK] = -1
    e[E_NLINES] = 0
    e[E_IDX] = 0
    e[E_STARTED] = 0
    W = MS.cfg[M_W]
    for l in range(W):
        MS.mio_addr[core, i, l] = S.addr[w, l]
    if cls == D.CLS_LDMATRIX:
        # lanes 8i..8i+7 give the rows of matrix i: only the lanes of the matrices that exist count
        nm = Dd.nwr[pc]
        lanes = np.int64(0)
        for l in range(8 * nm):
            lanes |= np.int64(1) << l
        e[E_MASK] = lanes
    # destination registers wait for the data
    for j in range(Dd.nwr[pc]):
        r = Dd.wr[pc, j]
        TS.reg_ready[w, r] = WS.INF
        TS.reg_kind[w, r] = Dd.src_kind[pc]
    if cls == D.CLS_LD_GLOBAL or cls == D.CLS_CPASYNC:
        n = MS.trk_nfree[core] - 1
        MS.trk_nfree[core] = n
        t = MS.trk_free[core, n]
        e[E_TRK] = t
        MS.trk[core, t, TK_WARP] = w
        MS.trk[core, t, TK_DST] = Dd.wr[pc, 0] if Dd.nwr[pc] > 0 else 0
        MS.trk[core, t, TK_NDST] = Dd.nwr[pc]
        MS.trk[core, t, TK_PENDING] = 1 << 40  # set to the line count when the data pipe coalesces
        MS.trk[core, t, TK_KIND] = TRK_CP if cls == D.CLS_CPASYNC else TRK_LOAD
        MS.trk[core, t, TK_GROUP] = TS.cp_open[w]
        MS.trk[core, t, TK_T0] = now
        if cls == D.CLS_CPASYNC:
            TS.cp_pending[w, TS.cp_open[w] % WS.CP_GROUPS] += 1
    return 0


@njit(cache=True)
def _box_and_coords(S, P, T, w, pc, lane, creg):
    """A bulk tensor copy's or store's box (execute.tma_box of the map execute left in S.addr[w, 2];
    it checked the map: no fault now) and its 5 coordinates (registers creg .., zero past the
    rank), in the scratch S.vals."""
    rank = T.rank[P.op[pc]]
    box = S.vals[:18]
    X.tma_box(S, S.addr[w, 2], rank, lane, pc, box)
    coords = S.vals[18:23]
    for k in range(5):
        coords[k] = S.regs[w, creg + k, lane] if k < rank else 0
    return box, coords


@njit(cache=True)
def tma_issue(MS, TS, S, P, T, core, w, pc, row, now):
    """Queue an issued bulk tensor copy at the SM's TMA unit (execute._tma left its operands in
    S.addr[w]; ``row``: its barrier's row in the block's table, core._mbar_issue, -2 when a
    multicast leaves the issuer's block out) with a tracker for its requests; the unit starts it
    after its start-up (tma.py). A multicast copy reads L2 once: its replies land in every block
    of the mask as they land in the issuer's (the GPC's crossbar copies them), so its bytes count
    on each block's barrier (their rows listed in MS.mc) until its last reply. True after a fault
    (a target block's barrier table is full)."""
    lane = S.addr[w, 4]
    bar = S.addr[w, 1]
    mc = S.addr[w, 7]
    k = S.geom[X.G_CLUSTER]
    me = S.warp_block[w] % k
    first = S.warp_block[w] - me
    if mc:
        for r in range(k):             # every target's barrier gets its row first (a fault: nothing queued)
            if r != me and (mc >> r) & 1 and WS.mb_slot(TS, S.block_smem[first + r], bar, True) < 0:
                X.fault(S, X.F_MB_SLOTS, lane, bar, WS.MB_SLOTS, pc)
                return True
    box, coords = _box_and_coords(S, P, T, w, pc, lane, P.src3[pc])
    t = MS.trk_free[core, MS.trk_nfree[core] - 1]
    MS.trk_nfree[core] -= 1
    bs = S.warp_smem[w]
    MS.trk[core, t, TK_WARP] = w
    MS.trk[core, t, TK_DST] = S.addr[w, 6]
    MS.trk[core, t, TK_NDST] = bar | ((TS.mb_gen[bs, row] << 32) if row >= 0 else 0)  # the barrier, its generation
    MS.trk[core, t, TK_PENDING] = 1              # until its last request is sent
    MS.trk[core, t, TK_KIND] = TRK_TMA
    MS.trk[core, t, TK_GROUP] = ((bs * WS.MB_SLOTS + row) << 1) | S.addr[w, 3] if row >= 0 else -1
    MS.trk[core, t, TK_T0] = now
    n = 0
    if mc:
        per_core = TS.mb_addr.shape[0] // MS.trk.shape[0]
        for r in range(k):
            if r == me or not (mc >> r) & 1:
                continue
            tbs = S.block_smem[first + r]
            i = WS.mb_slot(TS, tbs, bar, False)
            par = S.addr[w, 8 + r] & 1
            TS.mb_bytes[tbs, i, par] += S.addr[w, 6]
            if (S.addr[w, 8 + r] >> 1) & 1:
                WS.wake_core(TS, tbs // per_core, now)   # a phase completed: its waiters look again
            MS.mc[core, t, n] = mc_entry(TS.mb_gen[tbs, i], tbs, i, par)
            n += 1
    MS.mc_n[core, t] = n
    TM.tma_push(MS.tma, core, t, box, coords, now)
    core_items(MS, core, 1)                      # the SM's memory side has the copy to send
    return False


@njit(cache=True)
def tma_store_issue(MS, TS, S, P, T, core, w, pc, now):
    """Queue an issued bulk tensor store (execute._tma_store left its operands in S.addr[w]) at the
    SM's TMA unit; its warp counts it in its bulk groups until its last piece has left."""
    box, coords = _box_and_coords(S, P, T, w, pc, S.addr[w, 4], P.src2[pc])
    TS.bk[w, WS.BK_ISSUED] += 1
    MS.mk[MK_STORES] += 1                        # until its last piece has left (its pieces count their own)
    TM.tma_push(MS.tma, core, w, box, coords, now, 1, TS.age[w])
    core_items(MS, core, 1)


# ----------------------------------------------------------------------------- the SM side
@njit(cache=True)
def core_reply(MS, TS, core, r, now):
    """Data for this SM came back over the fabric: fill the L1 (waiters then take the L1 pipeline
    back to the registers) or, for a bypassing read (cp.async), finish that piece."""
    R = MS.R
    q = MS.cfg[M_Q_L1D] + core
    tag = R.tag[r]
    if tag >= 0:
        e = CA.cache_fill(MS.L1, core, R.addr[r], R.aux0[r], now)
        MS.l1_full[core] = 0
        req_free(R, r)
        if e >= 0:
            n = CA.mshr_waiters(MS.L1, core, e, MS.waiters)
            for i in range(n):
                rr = MS.waiters[i]
                R.aux1[rr] = now + MS.cfg[M_L1_LAT]
                core_push(MS, core, q, rr)
            CA.mshr_free(MS.L1, core, e)
    else:
        R.tag[r] = -1 - tag
        R.aux1[r] = now + MS.cfg[M_L1_LAT]
        core_push(MS, core, q, r)


@njit(inline="always")
def core_items(MS, core, d):
    """The items queued at a core's memory side change by d (MK_CORE_ITEMS, citems)."""
    MS.mk[MK_CORE_ITEMS] += d
    MS.citems[core >> SPAN_SHIFT] += d


@njit(inline="always")
def core_push(MS, core, q, r):
    """Push request r on the core's L1-return or miss queue q, counted in MK_CORE_ITEMS."""
    if q_push(MS.Q, q, r):
        core_items(MS, core, 1)


@njit(inline="always")
def _core_pop(MS, core, q):
    """Pop the head of the core's L1-return or miss queue q, counted in MK_CORE_ITEMS (core_push's twin)."""
    core_items(MS, core, -1)
    return q_pop(MS.Q, q)


@njit(cache=True)
def pop_mio(MS, core):
    h = MS.mio_head[core] + 1
    if h >= MS.mio.shape[1]:
        h = 0
    MS.mio_head[core] = h
    MS.mio_count[core] -= 1
    core_items(MS, core, -1)


@njit(cache=True)
def _data_pipe(MS, TS, S, Dd, core, now):
    """One wavefront of the oldest MIO entry through the L1 / shared-memory data pipe; False when
    the entry could not move (the miss or return path backed up, no request entry free)."""
    cfg = MS.cfg
    R = MS.R
    i = MS.mio_head[core]
    e = MS.mio[core, i]
    cls = e[E_CLS]
    w = e[E_WARP]
    pc = e[E_PC]
    if cls == D.CLS_LD_SHARED or cls == D.CLS_ST_SHARED or cls == D.CLS_LDMATRIX:
        if e[E_STARTED] == 0:
            waves = CA.shared_bank_conflicts(MS.mio_addr[core, i], e[E_MASK], e[E_BYTES], cfg[M_BANKS],
                                             cfg[M_BANK_W])
            e[E_STARTED] = 1
            MS.bytes[BY_SCRATCH] += CA.popcount(e[E_MASK]) * e[E_BYTES]
            if waves > 1:
                # one wavefront a cycle, and nothing but this entry uses the pipe meanwhile: the
                # entry completes with its last wavefront, waves - 1 cycles on (mio_next)
                MS.mio_next[core] = now + waves - 1
                return True
        if cls != D.CLS_ST_SHARED:
            for j in range(Dd.nwr[pc]):
                TS.reg_ready[w, Dd.wr[pc, j]] = now + cfg[M_SMEM_LAT] - 1
            WS.wake_warp_regs(TS, w, now)  # a warp waiting on them learns the ready cycle
        pop_mio(MS, core)
        return True
    if e[E_STARTED] == 0:
        full = MS.mio_full[core, i]
        n = CA.coalesce(MS.mio_addr[core, i], e[E_MASK], e[E_BYTES], cfg[M_SECTOR], cfg[M_LINE_BYTES],
                        MS.mio_lines[core, i], MS.mio_masks[core, i], full)
        e[E_NLINES] = n
        e[E_STARTED] = 1
        t = e[E_TRK]
        if t >= 0:
            MS.trk[core, t, TK_PENDING] = n
            if n == 0:
                trk_done(MS, TS, core, t, now)
        if n == 0:
            pop_mio(MS, core)
            return True
    k = e[E_IDX]
    line = placed_addr(cfg, core, MS.mio_lines[core, i, k])
    m = MS.mio_masks[core, i, k]
    sb = cfg[M_SECTOR]
    qm = cfg[M_Q_MISS] + core
    ql = cfg[M_Q_L1D] + core
    if MS.Q.count[qm] >= MS.Q.cap[qm] - 2 or MS.Q.count[ql] >= MS.Q.cap[ql] - 2 or R.nfree[0] < 4:
        return False  # the miss or return path is backed up: retry next cycle
    t = e[E_TRK]
    if cls == D.CLS_LD_GLOBAL and cfg[M_HAS_L1]:
        r = req_alloc(R, line, CA.popcount(m) * sb, KIND_READ, core, t, now)
        if r < 0:
            return False
        R.aux0[r] = m
        am = m
        if cfg[M_FILL_LINE]:  # an LDM cache fills (and waits for) the whole line
            am = (np.int64(1) << (cfg[M_LINE_BYTES] // sb)) - 1
        status, newm = CA.cache_access_mask(MS.L1, core, line, am, np.int64(0), np.bool_(False), r, now)
        if status == CA.RESERVATION_FAIL:
            req_free(R, r)
            MS.l1_full[core] = 1
            return True
        if status == CA.HIT:
            R.aux1[r] = now + cfg[M_L1_LAT]
            core_push(MS, core, ql, r)
        elif newm != 0:
            r2 = req_alloc(R, line, CA.popcount(newm) * sb, KIND_READ, core, 0, now)
            R.aux0[r2] = newm
            core_push(MS, core, qm, r2)
    elif cls == D.CLS_ST_GLOBAL:
        r = req_alloc(R, line, CA.popcount(m) * sb, KIND_WRITE, core, TAG_WRITE, now)
        if r < 0:
            return False
        MS.mk[MK_STORES] += 1
        R.aux0[r] = m
        R.aux1[r] = MS.mio_full[core, i, k]
        if cfg[M_HAS_L1]:
            CA.cache_access_mask(MS.L1, core, line, m, MS.mio_full[core, i, k], np.bool_(True), r, now)
        core_push(MS, core, qm, r)
    else:  # a read that bypasses the L1: cp.async (.cg) or a machine without an L1 cache
        r = req_alloc(R, line, CA.popcount(m) * sb, KIND_READ, core, -1 - t, now)
        if r < 0:
            return False
        R.aux0[r] = m
        core_push(MS, core, qm, r)
    MS.bytes[BY_L1] += CA.popcount(m) * sb
    k += 1
    e[E_IDX] = k
    if k == e[E_NLINES]:
        pop_mio(MS, core)
    return True


@njit(cache=True)
def _tma_cycle(MS, TS, core, now):
    """Up to tma.requests_per_cycle line requests of the SM's oldest bulk tensor copies onto its
    miss queue (tma.py); False when none could go (the miss or return path is backed up)."""
    cfg = MS.cfg
    R = MS.R
    U = MS.tma
    qm = cfg[M_Q_MISS] + core
    ql = cfg[M_Q_L1D] + core
    lb = cfg[M_LINE_BYTES]
    sb = cfg[M_SECTOR]
    moved = False
    sent = 0
    while sent < U.cfg[TM.TC_RPC] and TM.tma_ready(U, core, now):
        if MS.Q.count[qm] >= MS.Q.cap[qm] - 2 or MS.Q.count[ql] >= MS.Q.cap[ql] - 2 or R.nfree[0] < 4:
            break
        d = U.desc[core, U.head[core]]
        t = d[TM.TD_TRK]
        store = d[TM.TD_STORE]
        a, n = TM.tma_piece(U, core, lb)
        moved = True
        if a < 0:                                # every piece sent: the copy leaves the queue
            age = d[TM.TD_AGE]
            TM.tma_pop(U, core)
            core_items(MS, core, -1)
            if not store:
                trk_release(MS, TS, core, t, now)
                continue
            MS.mk[MK_STORES] -= 1
            if TS.age[t] == age:                 # (its warp, not a later one in its slot)
                TS.bk[t, WS.BK_SENT] += 1
                if TS.wst[t] == WS.T_BKWAIT:
                    WS.wake_warp(TS, t, now)
            continue
        line = a - a % lb
        first = (a - line) // sb
        last = (a + n - 1 - line) // sb
        nbytes = (last - first + 1) * sb
        m = ((np.int64(1) << (last + 1)) - 1) ^ ((np.int64(1) << first) - 1)
        if store:                                # a write of the sectors the piece covers
            r = req_alloc(R, placed_addr(cfg, core, line), nbytes, KIND_WRITE, core, TAG_WRITE, now)
            MS.mk[MK_STORES] += 1
            R.aux0[r] = m
            lo = (a - line + sb - 1) // sb       # sectors the piece writes whole
            hi = (a + n - line) // sb
            R.aux1[r] = ((np.int64(1) << hi) - 1) ^ ((np.int64(1) << lo) - 1) if hi > lo else 0
            core_push(MS, core, qm, r)
            U.cnt[core, TM.TX_ST_REQS] += 1
        else:
            r = req_alloc(R, placed_addr(cfg, core, line), nbytes, KIND_READ, core, -1 - t, now)
            R.aux0[r] = m
            core_push(MS, core, qm, r)
            MS.trk[core, t, TK_PENDING] += 1
            U.fly[core] += 1
            U.cnt[core, TM.TX_REQS] += 1
            U.cnt[core, TM.TX_REQ_BYTES] += nbytes
        sent += 1
    return moved


@njit(cache=True)
def core_memory(MS, TS, S, Dd, core, now):
    """One cycle of a core's memory side (replies, L1 hits, the data pipe, misses onto the
    request fabric); True when it changed anything."""
    cfg = MS.cfg
    R = MS.R
    Q = MS.Q
    node = MS.node[ND_RESP_CORE, core]
    mio0 = MS.mio_count[core]
    trk0 = MS.trk_nfree[core]
    moved = False
    while cfg[M_GROUPED] == 0:  # grouped: group_replies took them off the fabric
        r = NC.noc_eject(MS.resp, node)
        if r < 0:
            break
        core_reply(MS, TS, core, r, now)
        moved = True
    q = cfg[M_Q_L1D] + core
    while Q.count[q] > 0 and R.aux1[q_peek(Q, q, 0)] <= now:
        r = _core_pop(MS, core, q)
        t = R.tag[r]
        req_free(R, r)
        trk_piece(MS, TS, core, t, now)
        moved = True
    if pipe_takes_head(MS, core, now):
        moved |= _data_pipe(MS, TS, S, Dd, core, now)
    tma0 = MS.tma.count[core]
    if TM.tma_ready(MS.tma, core, now):
        moved |= _tma_cycle(MS, TS, core, now)
    if TS.mem_wait[core] and (MS.mio_count[core] < mio0 or MS.trk_nfree[core] > trk0 or MS.tma.count[core] < tma0):
        WS.wake_refused(TS, core, now)  # a warp refused for a full MIO queue, TMA queue or no tracker may go now
    q = cfg[M_Q_MISS] + core
    now_f = MS.clocks[CK_NOW_FAB]
    while Q.count[q] > 0:
        r = q_peek(Q, q, 0)
        nbytes = MS.cfg[M_HEADER] + (R.nbytes[r] if R.kind[r] == KIND_WRITE else 0)
        dest = MS.node[ND_REQ_MEM, dest_slice(MS, core, r)]
        if not NC.noc_inject(MS.req, MS.node[ND_REQ_CORE, core], r, nbytes, dest, now_f):
            break
        MS.bytes[BY_FABRIC] += nbytes
        _core_pop(MS, core, q)
        moved = True
    return moved


@njit(cache=True)
def scratch_reads(MS, core, nbytes, now):
    """Operand reads that bypass the MIO queue (a wgmma's tiles) take the core's shared-memory data
    pipe, one wavefront of banks x bank width bytes a cycle, from the first cycle after this one it
    is free: queued MIO entries wait behind them (an entry in the middle of its wavefronts finishes
    after them). Returns the cycle after the last read."""
    cfg = MS.cfg
    wave = cfg[M_BANKS] * cfg[M_BANK_W]
    r0 = MS.mio_next[core]
    if r0 < now + 1:
        r0 = now + 1
    MS.mio_next[core] = r0 + (nbytes + wave - 1) // wave
    MS.bytes[BY_SCRATCH] += nbytes
    return MS.mio_next[core]


@njit(inline="always")
def pipe_takes_head(MS, core, now):
    """The data pipe takes the core's oldest MIO entry this cycle: there is one, it is not in the
    middle of its wavefronts (mio_next), and it is not a load waiting for an L1 fill (l1_full: it
    found no MSHR or way free, and only a fill of that L1 changes that)."""
    return MS.mio_count[core] > 0 and MS.mio_next[core] <= now and MS.l1_full[core] == 0
