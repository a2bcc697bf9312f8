"""The tensor memory accelerator of an SM (Hopper TMA): bulk tensor copies into the scratchpad.

Design note (core cycles throughout)
- ``cp.async.bulk.tensor`` executes at issue (execute._tma: the box's data lands functionally and
  its bytes count as complete transactions on the barrier); the timing model then owes the copy's
  memory traffic. Issue puts a descriptor (the box, its coordinates and the tensor's shape and
  strides, read from the tensor map) in the SM's TMA queue (``tma.queue_depth`` copies; a full
  queue stalls the issuing warp, counted as pipe_busy) and takes one of the SM's load trackers,
  which counts the copy's requests in flight (mem_state.TRK_TMA).
- Start-up: a descriptor's first request may leave ``tma.startup_cycles`` after issue (the
  tensor map's fetch and decode; start-ups of queued copies overlap).
- The unit walks the oldest descriptor's box row by row (dimension 0 innermost) and sends, up to
  ``tma.requests_per_cycle`` a cycle, one read request per 128-B line a row touches, for the
  sectors the row covers (core_side.tma_cycle). Rows or parts of rows outside the tensor send
  nothing (the unit fills zeros). Requests take the SM's miss queue to the request fabric and L2
  like any L1 bypass, at most ``tma.max_inflight_lines`` of the SM's in flight; replies take the
  L1 return path into the scratchpad (l1.hit_latency_cycles).
- When a copy's last reply is back its bytes have landed: the barrier's count of bytes in flight
  for that phase drops (warps.mb_landed), and a warp waiting on the phase may go on.
- Multicast (a cluster mask): the issuer's unit reads the box once; each reply lands in every
  block of the mask as it lands in the issuer's (the GPC's crossbar copies it), so the copy's
  bytes count on each block's barrier until its last reply (core_side.tma_issue, mem_state.trk_done).
- Stores (``cp.async.bulk.tensor.Nd.store``, shared to global) take the same queue, start-up and
  walk; each piece is a write request of the sectors it covers, to L2 bypassing the L1. A store
  is done for its warp's bulk groups when its last piece has left (its source is read: PTX's
  wait_group.read); writes need no reply, and the launch ends once they reached L2.
- Not modelled: the tensor-map cache (every copy pays the start-up), the scratchpad port the
  landing data or a store's reads take (a multicast's other SMs' ports included).

State is struct of arrays (``TmaState``); core_side.py runs the unit inside the SM's memory
cycle and mem_state.py counts its copies' completions.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine.jit import njit

INF = np.int64(1) << 62

# cfg fields (TC_ON: 1 with a TMA unit)
TC_ON, TC_START, TC_RPC, TC_DEPTH, TC_MAXFLY, TC_N = range(6)
# descriptor fields: its tracker, the cycle its first request may leave, its issue cycle, the next
# row and the rows of the box, the byte offset reached in the row's span, the tensor's base address
# and element bytes, then per dimension 0..4 the box's coordinate, the tensor's size, the stride in
# bytes (dimension 0: the element size) and the box's size
TD_TRK, TD_READY, TD_T0, TD_ROW, TD_NROWS, TD_OFF, TD_BASE, TD_EB, TD_C0 = range(9)
TD_D0 = TD_C0 + 5
TD_S0 = TD_D0 + 5
TD_B0 = TD_S0 + 5
# a store (TD_STORE 1): TD_TRK holds its warp, TD_AGE the warp's age (TState.age) when it issued
TD_STORE = TD_B0 + 5
TD_AGE = TD_STORE + 1
TD_N = TD_AGE + 1
# counters per SM: copies, their box bytes, line requests, bytes those asked for, and the latency of
# the copies landed (issue to last byte): count, sum, min, max
TX_COPIES, TX_BYTES, TX_REQS, TX_REQ_BYTES, TX_LANDED, TX_LAT_SUM, TX_LAT_MIN, TX_LAT_MAX, TX_STORES, TX_ST_BYTES, \
    TX_ST_REQS, TX_N = range(12)
# (stores: bulk tensor stores, their box bytes and their write requests)


class TmaState(NamedTuple):
    cfg: np.ndarray       # int64 [TC_N]
    desc: np.ndarray      # int64 [cores, tma.queue_depth, TD_N] descriptor queue (a ring)
    head: np.ndarray      # int32 [cores]
    count: np.ndarray     # int32 [cores]
    fly: np.ndarray       # int64 [cores] line requests in flight
    cnt: np.ndarray       # int64 [cores, TX_N]


def make_tma_state(machine, cores: int) -> TmaState:
    t = machine.tma
    cfg = np.zeros(TC_N, np.int64)
    n, depth = max(cores, 1), (t.queue_depth if t is not None else 1)
    if t is not None:
        cfg[TC_ON], cfg[TC_START], cfg[TC_RPC] = 1, t.startup_cycles, t.requests_per_cycle
        cfg[TC_DEPTH], cfg[TC_MAXFLY] = t.queue_depth, t.max_inflight_lines
    cnt = np.zeros((n, TX_N), np.int64)
    cnt[:, TX_LAT_MIN] = INF
    return TmaState(cfg=cfg, desc=np.zeros((n, depth, TD_N), np.int64), head=np.zeros(n, np.int32),
                    count=np.zeros(n, np.int32), fly=np.zeros(n, np.int64), cnt=cnt)


@njit(cache=True)
def tma_push(TM, core, t, box, coords, now, store=0, age=0):
    """Queue a copy (tracker t) of the box execute.tma_box read (``box``: base, element bytes,
    swizzle, dims, strides, box dims) at ``coords`` (5, zero past the rank); the caller checked
    there is room (tma_has_room). ``store``: a bulk tensor store of warp t (its age ``age``), whose
    pieces are writes."""
    depth = TM.desc.shape[1]
    i = TM.head[core] + TM.count[core]
    if i >= depth:
        i -= depth
    TM.count[core] += 1
    d = TM.desc[core, i]
    d[TD_TRK] = t
    d[TD_READY] = now + TM.cfg[TC_START]
    d[TD_T0] = now
    d[TD_ROW] = 0
    d[TD_OFF] = 0
    d[TD_BASE] = box[0]
    d[TD_EB] = box[1]
    rows = np.int64(1)
    for k in range(5):
        d[TD_C0 + k] = coords[k]
        d[TD_D0 + k] = box[3 + k]
        d[TD_S0 + k] = box[8 + k]
        d[TD_B0 + k] = box[13 + k]
        if k > 0:
            rows *= box[13 + k]
    d[TD_NROWS] = rows
    d[TD_STORE] = store
    d[TD_AGE] = age
    if store:
        TM.cnt[core, TX_STORES] += 1
        TM.cnt[core, TX_ST_BYTES] += rows * box[13] * box[1]
    else:
        TM.cnt[core, TX_COPIES] += 1
        TM.cnt[core, TX_BYTES] += rows * box[13] * box[1]


@njit(inline="always")
def tma_has_room(TM, core):
    return TM.count[core] < TM.cfg[TC_DEPTH]


@njit(inline="always")
def tma_ready(TM, core, now):
    """The SM's unit may send a request this cycle: its oldest copy has started and the SM has
    room for another line in flight."""
    return TM.count[core] > 0 and TM.desc[core, TM.head[core], TD_READY] <= now and \
        TM.fly[core] < TM.cfg[TC_MAXFLY]


@njit(inline="always")
def tma_next_event(TM, core, now):
    """The first cycle (> now) the unit may send again, given what it waits for now (INF: a reply,
    or nothing queued)."""
    if TM.count[core] == 0 or TM.fly[core] >= TM.cfg[TC_MAXFLY]:
        return INF
    r = TM.desc[core, TM.head[core], TD_READY]
    return r if r > now else now + 1


@njit(cache=True)
def tma_piece(TM, core, line_bytes):
    """The next piece of the oldest copy: (global address, bytes), within one line and inside the
    tensor; (-1, 0) when the copy has sent every piece (the caller pops it, tma_pop)."""
    d = TM.desc[core, TM.head[core]]
    eb = d[TD_EB]
    while d[TD_ROW] < d[TD_NROWS]:
        # the row's global start; row_in: no coordinate of dimensions 1..4 lies outside the tensor
        r = d[TD_ROW]
        g = d[TD_BASE]
        row_in = True
        for k in range(1, 5):
            x = d[TD_C0 + k] + r % d[TD_B0 + k]
            r //= d[TD_B0 + k]
            if x < 0 or x >= d[TD_D0 + k]:
                row_in = False
                break
            g += x * d[TD_S0 + k]
        x0 = d[TD_C0]
        lo = x0 if x0 > 0 else np.int64(0)
        hi = x0 + d[TD_B0]
        if hi > d[TD_D0]:
            hi = d[TD_D0]
        if not row_in or lo >= hi:
            d[TD_ROW] += 1
            d[TD_OFF] = 0
            continue
        a = g + lo * eb + d[TD_OFF]
        end = g + hi * eb
        lend = (a // line_bytes + 1) * line_bytes
        if lend < end:
            end = lend
        d[TD_OFF] += end - a
        if g + lo * eb + d[TD_OFF] >= g + hi * eb:
            d[TD_ROW] += 1
            d[TD_OFF] = 0
        return a, end - a
    return np.int64(-1), np.int64(0)


@njit(cache=True)
def tma_pop(TM, core):
    """Drop the oldest copy (every piece sent); returns its tracker."""
    t = TM.desc[core, TM.head[core], TD_TRK]
    h = TM.head[core] + 1
    if h >= TM.desc.shape[1]:
        h = 0
    TM.head[core] = h
    TM.count[core] -= 1
    return t


@njit(cache=True)
def tma_done(TM, core, t0, now):
    """A copy issued at t0 has landed: its latency."""
    lat = now - t0
    TM.cnt[core, TX_LANDED] += 1
    TM.cnt[core, TX_LAT_SUM] += lat
    if lat < TM.cnt[core, TX_LAT_MIN]:
        TM.cnt[core, TX_LAT_MIN] = lat
    if lat > TM.cnt[core, TX_LAT_MAX]:
        TM.cnt[core, TX_LAT_MAX] = lat


def tma_counters(TM) -> dict:
    """The TMA units' counters, all SMs together (the memory record's ``tma``)."""
    c = TM.cnt
    landed = int(c[:, TX_LANDED].sum())
    return {"copies": int(c[:, TX_COPIES].sum()), "box_bytes": int(c[:, TX_BYTES].sum()),
            "requests": int(c[:, TX_REQS].sum()), "request_bytes": int(c[:, TX_REQ_BYTES].sum()),
            "copies_landed": landed,
            "latency_mean_cycles": float(c[:, TX_LAT_SUM].sum()) / landed if landed else 0.0,
            "latency_min_cycles": int(c[:, TX_LAT_MIN].min()) if landed else 0,
            "latency_max_cycles": int(c[:, TX_LAT_MAX].max()),
            "stores": int(c[:, TX_STORES].sum()), "store_bytes": int(c[:, TX_ST_BYTES].sum()),
            "store_requests": int(c[:, TX_ST_REQS].sum())}
