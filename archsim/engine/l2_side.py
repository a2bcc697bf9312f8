"""The memory side: the L2 slices and the path to DRAM. A request reaches the slice that owns its
address (``l2.halves`` partitions interleaved in ``l2.interleave_bytes``; slices within a half in
the controllers' interleave granule, round-robin or, with ``l2.slice_indexing: hashed``, permuted
by an XOR fold of the higher address bits); a slice's data array moves ``l2.bytes_per_cycle``;
hits answer after ``l2.hit_latency_cycles`` (plus ``far_half_extra_cycles`` for an SM of the
other half: near and far replies wait in separate delay pipelines, so a near reply never queues
behind a far one), misses go through the slice's MSHRs to the DRAM channel of the address. With
``l2.near_replicas`` an SM reads through the slice of its own half that mirrors the address's
home slice: a miss there takes the line from the home slice (``hit_latency_cycles +
far_half_extra_cycles`` later) or, when the home lacks it, waits in the home's MSHR entry (one
DRAM read for both halves); a write goes to the home slice and drops the mirrors' copies. Without
an L2 the endpoint is the controller."""

from __future__ import annotations

import numpy as np

from archsim.engine import cache as CA
from archsim.engine import dram as DR
from archsim.engine import noc as NC
from archsim.engine.jit import njit
from archsim.engine.mem_state import (BY_DRAM_R, BY_DRAM_W, BY_FABRIC, BY_L2, CK_NOW_FAB, COPY_HIT, COPY_MISS,
                                      MK_STORES, M_CHANNELS, M_FAR, M_FE_LAT, M_HALVES, M_HAS_L2, M_HEADER, M_L2_BPC,
                                      M_L2_LAT, M_LINE_BYTES, M_Q_FE, M_Q_L2D, M_Q_L2F, M_Q_RETRY, M_Q_RFILL, M_REPL,
                                      M_RETRY_GATE, M_SECTOR, M_SPH, ND_REQ_MEM, ND_RESP_CORE, ND_RESP_MEM, TAG_DMA,
                                      TAG_WRITE, is_far, mask_runs, mirror_slice, slice_of)
from archsim.engine.queues import KIND_READ, KIND_WRITE, q_peek, q_pop, q_push, req_alloc, req_free

# ----------------------------------------------------------------------------- the memory side
@njit(cache=True, inline="always")
def _to_dram(MS, r):
    """Queue a DRAM request at its channel (through the controller front end when the machine has
    one); False when that queue is full."""
    c, _, _, _ = DR.dram_map(MS.Dm, MS.R.addr[r])
    lat = MS.cfg[M_FE_LAT]
    if lat == 0:
        return q_push(MS.Q, c, r)
    q = MS.cfg[M_Q_FE] + c
    Q = MS.Q
    i = Q.head[q] + Q.count[q]
    if i >= Q.cap[q]:
        i -= Q.cap[q]
    if not q_push(Q, q, r):
        return False
    MS.fe_t[c, i] = MS.clocks[CK_NOW_FAB] + lat
    return True


@njit(cache=True)
def frontend_step(MS, c, now):
    """Requests whose front-end latency has passed enter channel c's scheduler queue, oldest
    first, while it has room (a full scheduler queue holds them: back-pressure)."""
    Q = MS.Q
    q = MS.cfg[M_Q_FE] + c
    while Q.count[q] > 0 and MS.fe_t[c, Q.head[q]] <= now:
        if not q_push(Q, c, q_peek(Q, q, 0)):
            break
        q_pop(Q, q)


@njit(cache=True)
def _to_dram_runs(MS, sl, line, mask, kind, tag, now):
    """DRAM requests for the sectors `mask` of a line, one per run of consecutive sectors, queued at
    their channel (or in slice sl's retry queue when the channel's queue is full)."""
    sb = MS.cfg[M_SECTOR]
    first = MS.runs[0]
    ln = MS.runs[1]
    n = mask_runs(mask, first, ln)
    for j in range(n):
        rd = req_alloc(MS.R, line + first[j] * sb, ln[j] * sb, kind, -1, tag, now)
        MS.R.aux0[rd] = ((np.int64(1) << ln[j]) - 1) << first[j]
        if not _to_dram(MS, rd) and not q_push(MS.Q, MS.cfg[M_Q_RETRY] + sl, rd):
            raise RuntimeError("DRAM retry queue full")   # sized for every sector the MSHRs can fetch


@njit(cache=True)
def _fetch(MS, sl, line, mask, now):
    """DRAM reads for the sectors of a line missing in slice sl; the fill goes back to sl."""
    _to_dram_runs(MS, sl, line, mask, np.int64(KIND_READ), sl, now)


@njit(cache=True)
def _cross(MS, sl, rd, now):
    """Queue near copy rd for mirror slice sl, due after the home's lookup and the crossing
    (hit_latency_cycles + far_half_extra_cycles). Every entry of that queue waits this one latency
    from the cycle it is queued, so the queue stays in due order (slice_cycle reads only its head)."""
    MS.R.aux1[rd] = now + MS.cfg[M_L2_LAT] + MS.cfg[M_FAR]
    if not q_push(MS.Q, MS.cfg[M_Q_RFILL] + sl, rd):   # sized for every sector the MSHRs can fetch
        raise RuntimeError("near-copy queue full")


@njit(cache=True)
def fetch_copy(MS, sl, home, line, mask, now):
    """Sectors `mask` of a line missing in slice sl, which mirrors home slice `home`. The home's
    copy when it holds every sector: it reaches sl hit_latency_cycles + far_half_extra_cycles
    later. Else the home takes the request as a read of its own (the point of coherence): it joins
    the home's pending miss of the line or opens one, so the two halves' misses of a line make one
    DRAM read, and the home's fill forwards the sectors to sl that latency later (fill_slice). The
    home takes it in MSHR entries and waiter slots of the mirrors' own (cache_access_sharer), so
    its own misses never refuse it and the halves never wait on each other in a cycle. Only when
    every way of the line's set at the home is waiting on a fill, a DRAM read issued after that
    latency fills sl and the home (dram_done)."""
    v = CA.cache_probe(MS.L2, home, line)
    hit = v >= 0 and (mask & ~v) == 0
    nb = CA.popcount(mask) * MS.cfg[M_SECTOR]
    rd = req_alloc(MS.R, line, nb, KIND_READ, COPY_HIT if hit else COPY_MISS, sl, now)
    MS.R.aux0[rd] = mask
    if not hit:
        status, newm = CA.cache_access_sharer(MS.L2, home, line, mask, rd, now)
        if status != CA.RESERVATION_FAIL:
            MS.bytes[BY_L2] += nb
            _writeback(MS, home, now)
            if newm != 0:
                _fetch(MS, home, line, newm, now)
            return                            # waits in the home's MSHR entry
    _cross(MS, sl, rd, now)
    if hit:
        CA.cache_touch(MS.L2, home, line)
        MS.bytes[BY_L2] += nb


@njit(cache=True)
def drop_copies(MS, sl, line):
    """A write reached home slice sl: the other halves' copies of the line are stale."""
    cfg = MS.cfg
    own = sl // cfg[M_SPH]
    for h in range(cfg[M_HALVES]):
        if h != own:
            CA.cache_drop(MS.L2, mirror_slice(MS, sl, h), line)


@njit(cache=True)
def fill_slice(MS, sl, line, mask, now):
    """Sectors `mask` of a line arrive at slice sl (from DRAM, or from its home slice): fill,
    answer the reads waiting on them, free the MSHR entry when it is done."""
    R = MS.R
    e = CA.cache_fill(MS.L2, sl, line, mask, now)
    MS.slice_full[sl] = 0
    _writeback(MS, sl, now)
    if e < 0:
        return
    n = CA.mshr_waiters(MS.L2, sl, e, MS.waiters)
    for i in range(n):
        rr = MS.waiters[i]
        if R.kind[rr] == KIND_WRITE:
            req_free(R, rr)
        elif R.src[rr] == COPY_MISS:
            R.src[rr] = COPY_HIT              # a near copy's miss that waited at its home
            _cross(MS, np.int64(R.tag[rr]), rr, now)
        else:
            respond_l2(MS, sl, rr, now)
    CA.mshr_free(MS.L2, sl, e)


@njit(cache=True)
def _writeback(MS, sl, now):
    """Write the dirty victim the last L2 access or fill of slice sl evicted back to DRAM."""
    dirty = MS.L2.evict_dirty[sl]
    if dirty == 0:
        return
    _to_dram_runs(MS, sl, MS.L2.evict_addr[sl], dirty, np.int64(KIND_WRITE), np.int64(TAG_WRITE), now)
    MS.L2.evict_dirty[sl] = 0


@njit(cache=True, inline="always")
def pipe_push(MS, q, r):
    """Append reply r to delay pipeline q; never refused. The pipeline's ring holds DELAY_CAP
    replies and the slice stops taking requests near that, but one fill answers every read waiting
    in its MSHR entry at once: what finds the ring full waits behind it in a chain through R.nxt
    (in order: the ring holds the oldest), instead of being lost."""
    if MS.spill[q, 0] < 0 and q_push(MS.Q, q, r):
        return
    R = MS.R
    R.nxt[r] = -1
    t = MS.spill[q, 1]
    if t < 0:
        MS.spill[q, 0] = r
    else:
        R.nxt[t] = r
    MS.spill[q, 1] = r


@njit(cache=True, inline="always")
def pipe_pop(MS, q):
    """Remove and return the oldest reply of delay pipeline q; the first of its chain takes the
    place freed in the ring."""
    r = q_pop(MS.Q, q)
    h = MS.spill[q, 0]
    if h >= 0:
        q_push(MS.Q, q, h)
        nx = MS.R.nxt[h]
        MS.spill[q, 0] = nx
        if nx < 0:
            MS.spill[q, 1] = -1
    return r


@njit(cache=True)
def _respond(MS, sl, r, ready):
    MS.R.aux1[r] = ready
    pipe_push(MS, MS.cfg[M_Q_L2D] + sl, r)


@njit(cache=True)
def respond_l2(MS, sl, r, now):
    """An L2 slice answers read r: after the slice pipeline for an SM of its own half (the near
    pipeline), plus far_half_extra_cycles for an SM of the other half (the far pipeline). Each
    pipeline is a FIFO of one fixed latency, so its ready cycles never decrease."""
    cfg = MS.cfg
    if is_far(MS, MS.R.src[r], sl):
        MS.R.aux1[r] = now + cfg[M_L2_LAT] + cfg[M_FAR]
        pipe_push(MS, cfg[M_Q_L2F] + sl, r)
    else:
        MS.R.aux1[r] = now + cfg[M_L2_LAT]
        pipe_push(MS, cfg[M_Q_L2D] + sl, r)


@njit(cache=True)
def slice_cycle(MS, sl, now):
    """One fabric cycle of L2 slice (or, without an L2, memory endpoint) sl; True when it changed
    anything (a reply sent, a fill or DRAM request handled, a request taken or accepted)."""
    moved = False
    cfg = MS.cfg
    R = MS.R
    Q = MS.Q
    # responses whose latency has passed go out on the response fabric, the earliest ready of the
    # near and far pipelines first (near first on a tie)
    qn = cfg[M_Q_L2D] + sl
    qf = cfg[M_Q_L2F] + sl
    while True:
        q = -1
        r = -1
        if Q.count[qn] > 0:
            r = q_peek(Q, qn, 0)
            if R.aux1[r] <= now:
                q = qn
        if Q.count[qf] > 0:
            rf = q_peek(Q, qf, 0)
            if R.aux1[rf] <= now and (q < 0 or R.aux1[rf] < R.aux1[r]):
                q = qf
                r = rf
        if q < 0:
            break
        nbytes = MS.cfg[M_HEADER] + (R.nbytes[r] if R.kind[r] != KIND_WRITE else 0)  # a write's ack: a header
        if not NC.noc_inject(MS.resp, MS.node[ND_RESP_MEM, sl], r, nbytes, MS.node[ND_RESP_CORE, R.src[r]], now):
            break
        MS.bytes[BY_FABRIC] += nbytes
        pipe_pop(MS, q)
        moved = True
        if cfg[M_HAS_L2] == 0:
            MS.ep_pending[sl] -= 1
    # copies from the home slice whose lookup and crossing have passed (or the DRAM read the home
    # sends for a line it lacks)
    q = cfg[M_Q_RFILL] + sl
    while Q.count[q] > 0 and R.aux1[q_peek(Q, q, 0)] <= now:
        rd = q_pop(Q, q)
        if R.src[rd] == COPY_HIT:
            fill_slice(MS, sl, R.addr[rd], R.aux0[rd], now)
        else:
            _fetch(MS, sl, R.addr[rd], R.aux0[rd], now)
        req_free(R, rd)
        moved = True
    # DRAM requests that found their channel queue full
    q = cfg[M_Q_RETRY] + sl
    while Q.count[q] > 0:
        if not _to_dram(MS, q_peek(Q, q, 0)):
            break
        q_pop(Q, q)
        moved = True
    # one new request per cycle when the data array is free
    if MS.slice_busy[sl] > now:
        return moved
    if MS.slice_hold[sl] < 0:
        MS.slice_hold[sl] = NC.noc_eject(MS.req, MS.node[ND_REQ_MEM, sl])
        moved |= MS.slice_hold[sl] >= 0
    r = MS.slice_hold[sl]
    if r < 0:
        return moved
    if Q.count[cfg[M_Q_RETRY] + sl] >= cfg[M_RETRY_GATE] or Q.count[qn] >= Q.cap[qn] - 8 \
            or Q.count[qf] >= Q.cap[qf] - 8:
        return moved
    line = R.addr[r]
    is_write = R.kind[r] == KIND_WRITE
    if cfg[M_HAS_L2] == 0:
        # a reply must never be refused: accept a request that will be answered (a read, an
        # acknowledged DMA write) only while the reply queue could hold every accepted one
        answered = R.kind[r] != KIND_WRITE or R.tag[r] == TAG_DMA
        if answered and MS.ep_pending[sl] >= Q.cap[cfg[M_Q_L2D] + sl]:
            return moved
        if not _to_dram(MS, r):
            return moved
        if answered:
            MS.ep_pending[sl] += 1
        elif R.tag[r] == TAG_WRITE:
            MS.mk[MK_STORES] -= 1             # a core's store reached its controller
        MS.slice_hold[sl] = -1
        return True
    if MS.slice_full[sl]:
        return moved
    full = R.aux1[r] if is_write else np.int64(0)
    status, newm = CA.cache_access_mask(MS.L2, sl, line, R.aux0[r], full, is_write, r, now)
    if status == CA.RESERVATION_FAIL:
        MS.slice_full[sl] = 1
        return True
    MS.slice_hold[sl] = -1
    if is_write and R.tag[r] == TAG_WRITE:
        MS.mk[MK_STORES] -= 1                 # a core's store reached the L2 (the point of coherence)
    if is_write and cfg[M_REPL]:
        drop_copies(MS, sl, line)
    bpc = cfg[M_L2_BPC]
    MS.slice_busy[sl] = now + (R.nbytes[r] + bpc - 1) // bpc
    MS.bytes[BY_L2] += R.nbytes[r]
    _writeback(MS, sl, now)
    if status == CA.HIT:
        if is_write:
            req_free(R, r)
        else:
            respond_l2(MS, sl, r, now)
    elif newm != 0:
        la = line & ~(cfg[M_LINE_BYTES] - 1)
        home = slice_of(MS, la) if cfg[M_REPL] else sl
        if home != sl:
            fetch_copy(MS, sl, home, la, newm, now)
        else:
            _fetch(MS, sl, la, newm, now)
    return True


@njit(cache=True)
def dram_done(MS, c, now):
    """Requests the DRAM channel finished (fabric time `now`)."""
    cfg = MS.cfg
    R = MS.R
    Q = MS.Q
    q = cfg[M_CHANNELS] + c
    while Q.count[q] > 0:
        rd = q_pop(Q, q)
        if R.kind[rd] == KIND_WRITE:
            MS.bytes[BY_DRAM_W] += R.nbytes[rd]
            if R.tag[rd] == TAG_DMA:  # a DMA put piece: the controller acknowledges it
                _respond(MS, slice_of(MS, R.addr[rd]), rd, now)
            else:
                req_free(R, rd)
            continue
        MS.bytes[BY_DRAM_R] += R.nbytes[rd]
        if cfg[M_HAS_L2] == 0:
            # no L2: the request itself goes back from its memory endpoint
            sl = slice_of(MS, R.addr[rd])
            _respond(MS, sl, rd, now)
            continue
        sl = np.int64(R.tag[rd])  # int64 as every other caller's slice: one compiled fill_slice
        line = R.addr[rd] & ~(cfg[M_LINE_BYTES] - 1)
        mask = R.aux0[rd]
        req_free(R, rd)
        fill_slice(MS, sl, line, mask, now)
        if cfg[M_REPL]:
            home = slice_of(MS, line)
            if home != sl:                    # a copy's miss in DRAM: the home keeps the line too
                fill_slice(MS, home, line, mask, now)
