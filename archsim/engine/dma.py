"""DMA engines of a Sunway core group: bulk copies between main memory and a CPE's LDM.

Design note (core cycles throughout)
- One engine per cluster of CPEs (``dma.engines_per_cluster`` per 2x2 cluster; the CPE at
  position k inside its cluster uses engine k % engines_per_cluster). A core group's engines
  share the group's stop on the ring: their requests enter the request ring at the group's node
  and their replies leave the response ring there (memory.py does that wiring).
- ``dma.get`` / ``dma.put`` become, at issue, a transfer descriptor in the engine's FIFO
  (``DESC_CAP`` entries; a full FIFO stalls the issuing CPE, counted as pipe_busy, and wakes it
  when an entry frees). The global range is split into pieces at ``dma.piece_bytes`` boundaries
  of the global address, so an unaligned start or length costs an extra, partial piece.
- Start-up: a descriptor may send its first piece ``dma.get_startup_cycles`` (put:
  ``put_startup_cycles``) after the instruction issued: the engine-side fixed cost (descriptor
  decode, address translation). Start-ups of queued descriptors overlap (a pipelined engine).
  The rest of a transfer's latency is the path: ring hops, router pipelines, link serialization,
  controller queues and DDR4 bank timing, all from their own blocks.
- Pieces leave in FIFO order, at most ``dma.max_inflight`` per engine in flight and at most
  ``dma.max_inflight_per_transfer`` of one descriptor (its window: a descriptor issues its next
  piece only when an earlier one came back, so one CPE's stream runs at window x piece / round
  trip, below what the engine and the controller could take), through a port of
  ``dma.bytes_per_cycle``: a piece of n bytes holds it n / bytes_per_cycle cycles (fixed point,
  1/65536 cycle, so a fractional rate is met exactly and never exceeded).
- A get piece is a read request (header only) to the memory controller owning its address and a
  reply carrying the data; a put piece carries its data and the controller acknowledges it
  (header only) once DRAM has written it. A transfer is complete when its last piece is back:
  the issuing warp's DMA count (``TS.bulk_pending[w, 0]``) drops and a warp in ``dma.wait`` wakes.
- Not modelled yet: broadcast modes, LDM port contention between the engine and the CPE's own
  LDM accesses, the descriptor's trip from the CPE to the engine (inside the start-up constant).

State is struct of arrays (``DmaState``); the step functions are free @njit functions that
memory.py calls in its tick (it owns the request table and the ring).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import core as K
from archsim.engine.jit import njit
from archsim.errors import InputError

DESC_CAP = 8           # choice: transfer descriptors queued per engine (a CPE issuing more stalls)
FX = np.int64(1) << 16  # fixed point: one core cycle of the engine port
INF = np.int64(1) << 62

# cfg fields
DC_ENGINES, DC_PIECE, DC_INFLIGHT, DC_GET_START, DC_PUT_START, DC_BPC_FX, DC_XFER_INFLIGHT, DC_N = range(8)
# descriptor fields
(DD_WARP, DD_CORE, DD_PUT, DD_GADDR, DD_NBYTES, DD_NEXT, DD_OUT, DD_READY, DD_T0, DD_DONE, DD_N) = range(11)
# per-engine scalars: FIFO head and count, offset (from head) of the first descriptor with pieces
# left to send, pieces in flight, port free (fixed point), request refused by the ring (-1 none)
EN_HEAD, EN_COUNT, EN_CUR, EN_INFLIGHT, EN_PORT_FX, EN_HOLD, EN_N = range(7)
# counters per engine
(DX_GETS, DX_PUTS, DX_BYTES_GET, DX_BYTES_PUT, DX_PIECES, DX_LAT_SUM, DX_LAT_MIN, DX_LAT_MAX, DX_N) = range(9)


class DmaState(NamedTuple):
    cfg: np.ndarray           # int64 [DC_N]
    desc: np.ndarray          # int64 [engines, DESC_CAP, DD_N] descriptor FIFOs
    eng: np.ndarray           # int64 [engines, EN_N]
    core_engine: np.ndarray   # int32 [cores] engine serving each core (-1: none)
    core_group: np.ndarray    # int32 [cores] core group of each core
    engine_group: np.ndarray  # int32 [engines] core group of each engine
    engine_cores: np.ndarray  # int32 [engines, k] cores an engine serves (-1 padded)
    cnt: np.ndarray           # int64 [engines, DX_N]


def _state(ncores: int, engines: int, per_engine: int, cfg: np.ndarray) -> DmaState:
    e = max(engines, 1)
    eng = np.zeros((e, EN_N), np.int64)
    eng[:, EN_HOLD] = -1
    cnt = np.zeros((e, DX_N), np.int64)
    cnt[:, DX_LAT_MIN] = INF
    return DmaState(cfg=cfg, desc=np.zeros((e, DESC_CAP, DD_N), np.int64), eng=eng,
                    core_engine=np.full(max(ncores, 1), -1, np.int32), core_group=np.zeros(max(ncores, 1), np.int32),
                    engine_group=np.zeros(e, np.int32), engine_cores=np.full((e, max(per_engine, 1)), -1, np.int32),
                    cnt=cnt)


def make_dma_state(machine) -> DmaState:
    """The DMA engines of a machine (none, as an empty state, on a machine without ``dma``)."""
    from archsim.config import cores_total

    ncores = cores_total(machine)
    cfg = np.zeros(DC_N, np.int64)
    d, m = machine.dma, machine.mesh
    if d is None:
        return _state(ncores, 0, 0, cfg)
    if m is None:
        raise InputError(f"{machine.name}: dma", "a DMA block needs the CPE mesh (its clusters own the engines)",
                         "add mesh: {rows, cols, cluster_rows, cluster_cols}")
    if m.rows * m.cols != machine.cores.per_group:
        raise InputError(f"{machine.name}: mesh", f"a {m.rows}x{m.cols} mesh does not hold cores.per_group = "
                         f"{machine.cores.per_group} CPEs", "rows x cols = cores.per_group")
    il = machine.memory_controllers.address_mapping.interleave_bytes
    if d.piece_bytes > il or il % d.piece_bytes:
        raise InputError(f"{machine.name}: dma.piece_bytes", f"{d.piece_bytes} B pieces would straddle the "
                         f"{il} B interleave granule of the memory controllers", f"a divisor of {il}")
    csz = m.cluster_rows * m.cluster_cols
    clusters = (m.rows // m.cluster_rows) * (m.cols // m.cluster_cols)
    epc = d.engines_per_cluster
    per_group = clusters * epc
    engines = machine.groups * per_group
    cfg[DC_ENGINES] = engines
    cfg[DC_PIECE] = d.piece_bytes
    cfg[DC_INFLIGHT] = d.max_inflight
    cfg[DC_GET_START] = d.get_startup_cycles
    cfg[DC_PUT_START] = d.put_startup_cycles
    cfg[DC_BPC_FX] = int(round(d.bytes_per_cycle * int(FX)))
    cfg[DC_XFER_INFLIGHT] = d.max_inflight_per_transfer or 0  # 0: no per-transfer window
    per_engine = (csz + epc - 1) // epc
    D = _state(ncores, engines, per_engine, cfg)
    fill = np.zeros(engines, np.int32)
    ccols = m.cols // m.cluster_cols
    for core in range(ncores):
        g, k = divmod(core, machine.cores.per_group)
        row, col = divmod(k, m.cols)
        cluster = (row // m.cluster_rows) * ccols + col // m.cluster_cols
        inside = (row % m.cluster_rows) * m.cluster_cols + col % m.cluster_cols
        e = g * per_group + cluster * epc + inside % epc
        D.core_engine[core] = e
        D.core_group[core] = g
        D.engine_group[e] = g
        D.engine_cores[e, fill[e]] = core
        fill[e] += 1
    return D


def pieces(gaddr: int, nbytes: int, piece_bytes: int) -> int:
    """Pieces a transfer of nbytes at global address gaddr is split into (Python twin of the
    engine's rule, for tests and micro-benchmarks)."""
    if nbytes <= 0:
        return 0
    return (gaddr + nbytes - 1) // piece_bytes - gaddr // piece_bytes + 1


# ----------------------------------------------------------------------------- issue side
@njit(cache=True)
def dma_can_issue(DM, core):
    """Has the engine of `core` room for one more descriptor?"""
    e = DM.core_engine[core]
    return e >= 0 and DM.eng[e, EN_COUNT] < DESC_CAP


@njit(cache=True)
def dma_issue(DM, TS, w, core, put, gaddr, nbytes, now):
    """Queue the transfer warp w (on `core`) just issued (the caller checked dma_can_issue)."""
    if nbytes <= 0:
        return  # nothing to move: complete at issue
    e = DM.core_engine[core]
    cap = DESC_CAP
    slot = DM.eng[e, EN_HEAD] + DM.eng[e, EN_COUNT]
    if slot >= cap:
        slot -= cap
    d = DM.desc[e, slot]
    d[DD_WARP] = w
    d[DD_CORE] = core
    d[DD_PUT] = put
    d[DD_GADDR] = gaddr
    d[DD_NBYTES] = nbytes
    d[DD_NEXT] = 0
    d[DD_OUT] = 0
    d[DD_READY] = now + (DM.cfg[DC_PUT_START] if put else DM.cfg[DC_GET_START])
    d[DD_T0] = now
    d[DD_DONE] = 0
    DM.eng[e, EN_COUNT] += 1
    TS.bulk_pending[w, 0] += 1
    if put:
        DM.cnt[e, DX_PUTS] += 1
    else:
        DM.cnt[e, DX_GETS] += 1


# ----------------------------------------------------------------------------- engine side
@njit(cache=True)
def dma_ready_piece(DM, e, now):
    """The FIFO slot of the descriptor whose next piece engine e may send in cycle `now`, or -1."""
    en = DM.eng[e]
    if en[EN_HOLD] >= 0 or en[EN_CUR] >= en[EN_COUNT]:
        return -1
    if en[EN_INFLIGHT] >= DM.cfg[DC_INFLIGHT]:
        return -1
    if en[EN_PORT_FX] > now * FX:
        return -1
    slot = en[EN_HEAD] + en[EN_CUR]
    if slot >= DESC_CAP:
        slot -= DESC_CAP
    if DM.desc[e, slot, DD_READY] > now:
        return -1
    w = DM.cfg[DC_XFER_INFLIGHT]
    if w > 0 and DM.desc[e, slot, DD_OUT] >= w:
        return -1  # the transfer's window is full: a returning piece reopens it
    return slot


@njit(cache=True)
def dma_piece(DM, e, slot):
    """(global address, bytes) of the next piece of descriptor `slot` of engine e."""
    d = DM.desc[e, slot]
    P = DM.cfg[DC_PIECE]
    a = d[DD_GADDR] + d[DD_NEXT]
    end = d[DD_GADDR] + d[DD_NBYTES]
    b = (a // P + 1) * P
    if b > end:
        b = end
    return a, b - a


@njit(cache=True)
def dma_piece_sent(DM, e, slot, nbytes, now):
    """The engine sent nbytes of descriptor `slot`: hold the port, count it in flight."""
    d = DM.desc[e, slot]
    d[DD_NEXT] += nbytes
    d[DD_OUT] += 1
    en = DM.eng[e]
    en[EN_INFLIGHT] += 1
    t = now * FX
    if en[EN_PORT_FX] > t:
        t = en[EN_PORT_FX]
    bpc = DM.cfg[DC_BPC_FX]
    en[EN_PORT_FX] = t + (nbytes * FX * FX + bpc - 1) // bpc
    DM.cnt[e, DX_PIECES] += 1
    if d[DD_NEXT] >= d[DD_NBYTES]:
        en[EN_CUR] += 1


@njit(cache=True)
def dma_piece_done(DM, TS, e, slot, nbytes, now):
    """A piece of descriptor `slot` of engine e is back (get: its data; put: the write's ack).
    Completes the transfer when it was the last; retires finished descriptors at the FIFO head."""
    d = DM.desc[e, slot]
    d[DD_OUT] -= 1
    DM.eng[e, EN_INFLIGHT] -= 1
    DM.cnt[e, DX_BYTES_PUT if d[DD_PUT] else DX_BYTES_GET] += nbytes
    if d[DD_OUT] == 0 and d[DD_NEXT] >= d[DD_NBYTES]:
        d[DD_DONE] = 1
        w = d[DD_WARP]
        TS.bulk_pending[w, 0] -= 1
        K.wake_warp(TS, w, now)
        lat = now - d[DD_T0]
        DM.cnt[e, DX_LAT_SUM] += lat
        if lat < DM.cnt[e, DX_LAT_MIN]:
            DM.cnt[e, DX_LAT_MIN] = lat
        if lat > DM.cnt[e, DX_LAT_MAX]:
            DM.cnt[e, DX_LAT_MAX] = lat
    en = DM.eng[e]
    freed = False
    while en[EN_COUNT] > 0 and en[EN_CUR] > 0 and DM.desc[e, en[EN_HEAD], DD_DONE] == 1:
        h = en[EN_HEAD] + 1
        if h >= DESC_CAP:
            h = 0
        en[EN_HEAD] = h
        en[EN_COUNT] -= 1
        en[EN_CUR] -= 1
        freed = True
    if freed:  # a CPE refused for a full FIFO may issue now
        for i in range(DM.engine_cores.shape[1]):
            c = DM.engine_cores[e, i]
            if c >= 0 and TS.mem_wait[c]:
                TS.mem_wait[c] = 0
                K.wake_core(TS, c, now)


@njit(cache=True)
def dma_next_event(DM, now):
    """The first cycle after `now` at which an engine may send a piece on its own (K.INF: none;
    engines waiting for replies are woken by the memory system's own events)."""
    t = INF
    for e in range(DM.cfg[DC_ENGINES]):
        en = DM.eng[e]
        if en[EN_CUR] >= en[EN_COUNT] or en[EN_INFLIGHT] >= DM.cfg[DC_INFLIGHT]:
            continue
        if en[EN_HOLD] >= 0:
            return now + 1
        slot = en[EN_HEAD] + en[EN_CUR]
        if slot >= DESC_CAP:
            slot -= DESC_CAP
        if DM.cfg[DC_XFER_INFLIGHT] > 0 and DM.desc[e, slot, DD_OUT] >= DM.cfg[DC_XFER_INFLIGHT]:
            continue  # waits for one of its pieces to come back (a memory-system event)
        u = DM.desc[e, slot, DD_READY]
        p = (en[EN_PORT_FX] + FX - 1) // FX
        if p > u:
            u = p
        if u < t:
            t = u
    if t <= now:
        t = now + 1
    return t


@njit(cache=True)
def dma_busy(DM):
    """Any transfer queued or in flight."""
    for e in range(DM.cfg[DC_ENGINES]):
        if DM.eng[e, EN_COUNT] > 0 or DM.eng[e, EN_HOLD] >= 0:
            return True
    return False


def dma_counters(DM) -> dict:
    """Totals over the engines: transfers, bytes, pieces, latency (issue -> complete)."""
    n = int(DM.cfg[DC_ENGINES])
    c = DM.cnt[:n] if n else np.zeros((0, DX_N), np.int64)
    done = int(c[:, DX_GETS].sum() + c[:, DX_PUTS].sum()) if n else 0
    lat_min = int(c[:, DX_LAT_MIN].min()) if n else 0
    return {"engines": n, "gets": int(c[:, DX_GETS].sum()), "puts": int(c[:, DX_PUTS].sum()),
            "bytes_get": int(c[:, DX_BYTES_GET].sum()), "bytes_put": int(c[:, DX_BYTES_PUT].sum()),
            "pieces": int(c[:, DX_PIECES].sum()),
            "latency_mean_cycles": float(c[:, DX_LAT_SUM].sum()) / done if done else 0.0,
            "latency_min_cycles": lat_min if done and lat_min < int(INF) else 0,
            "latency_max_cycles": int(c[:, DX_LAT_MAX].max()) if n else 0}
