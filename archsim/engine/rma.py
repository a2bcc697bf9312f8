"""RMA engines of a Sunway core group: LDM-to-LDM transfers between CPEs over the CPE mesh.

Design note (core cycles throughout)
- One engine per cluster of CPEs (``rma.engines_per_cluster`` per 2x2 cluster; the CPE at
  position k inside its cluster uses engine k % engines_per_cluster). The engines of a cluster
  send and receive at the cluster's port on the CPE mesh (noc.make_cpe_meshes: a router per
  cluster, every CPE a node of its cluster's router, links ``rma.link_bytes_per_cycle`` wide,
  ``rma.router_latency_cycles`` per router). sunway_side.py steps the mesh in the core clock.
- ``rma.put [remote], [local], n, blk`` / ``rma.get [local], [remote], n, blk`` become, at issue,
  a descriptor in the engine's FIFO (``rma.descriptors_per_engine`` entries; a full FIFO stalls the CPE, counted as
  pipe_busy). The target is the CPE that runs launch block ``blk``; it must be in the issuer's
  core group (the mesh joins only those): another group is a status-3 fault at issue.
- Start-up: a descriptor may send its first piece ``rma.startup_cycles`` after issue (descriptor
  decode, the local LDM read; pipelined over queued descriptors). The transfer is split into
  pieces of at most ``rma.piece_bytes``; at most ``rma.max_inflight`` per engine are in flight,
  through a port of ``rma.bytes_per_cycle`` (fixed point, as the DMA port).
- A put piece carries its data from the engine's port to the target CPE's node; the target's LDM
  takes it and acknowledges (a header) back to the engine. A get piece is a request (a header) to
  the target CPE; its LDM answers with the data. So a transfer crosses every router on its path
  twice, and its unloaded latency is start-up + 2 x (routers x router latency) + the packets'
  serialization; one more cluster hop costs 2 router latencies (the published ~4 cycles).
- A transfer is complete when its last piece is back at the engine: the issuing warp's RMA count
  (``TS.bulk_pending[w, 1]``) drops and a warp in ``rma.wait`` wakes.
- Not modelled: the LDM port contention between RMA, DMA and the CPE's own accesses.

State is struct of arrays (``RmaState``); the memory state (mem_state.py) holds the mesh,
its outboxes and the request table, and sunway_side.py calls the step functions here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import bulk as BK
from archsim.engine import warps as WS
from archsim.engine.bulk import EN_COUNT, EN_CUR, EN_HEAD, EN_INFLIGHT, EN_N, EN_PORT_FX, FX
from archsim.engine.jit import njit
from archsim.errors import InputError

INF = np.int64(1) << 62

# cfg fields (RC_QUEUED: descriptors queued at all engines together, kept as they come and go)
RC_ENGINES, RC_PIECE, RC_INFLIGHT, RC_START, RC_BPC_FX, RC_QUEUED, RC_N = range(7)
# descriptor fields
(RD_WARP, RD_CORE, RD_PUT, RD_TARGET, RD_NBYTES, RD_NEXT, RD_OUT, RD_READY, RD_T0, RD_DONE) = range(BK.D_N)
RD_N = BK.D_N
# per-engine scalars: bulk.EN_*
# counters per engine
(RX_GETS, RX_PUTS, RX_BYTES_GET, RX_BYTES_PUT, RX_PIECES, RX_LAT_SUM, RX_LAT_MIN, RX_LAT_MAX, RX_N) = range(9)


class RmaState(NamedTuple):
    cfg: np.ndarray           # int64 [RC_N]
    desc: np.ndarray          # int64 [engines, rma.descriptors_per_engine, RD_N]
    eng: np.ndarray           # int64 [engines, EN_N]
    core_engine: np.ndarray   # int32 [cores] engine serving each core (-1: none)
    core_group: np.ndarray    # int32 [cores]
    engine_node: np.ndarray   # int32 [engines] its cluster's port on the CPE mesh
    engine_cores: np.ndarray  # int32 [engines, k] cores an engine serves (-1 padded)
    cnt: np.ndarray           # int64 [engines, RX_N]


def make_rma_state(machine) -> RmaState:
    """The RMA engines of a machine (none, as an empty state, without ``rma`` or ``mesh``)."""
    from archsim.config import cores_total

    ncores = max(cores_total(machine), 1)
    cfg = np.zeros(RC_N, np.int64)
    r, m = machine.rma, machine.mesh

    def empty():
        cnt = np.zeros((1, RX_N), np.int64)
        cnt[:, RX_LAT_MIN] = INF
        return RmaState(cfg=cfg, desc=np.zeros((1, 1, RD_N), np.int64), eng=np.zeros((1, EN_N), np.int64),
                        core_engine=np.full(ncores, -1, np.int32), core_group=np.zeros(ncores, np.int32),
                        engine_node=np.zeros(1, np.int32), engine_cores=np.full((1, 1), -1, np.int32), cnt=cnt)

    if r is None:
        return empty()
    if m is None:
        raise InputError(f"{machine.name}: rma", "an RMA block needs the CPE mesh", "add mesh: {rows, cols, ...}")
    if m.rows * m.cols != machine.cores.per_group:
        raise InputError(f"{machine.name}: mesh", f"a {m.rows}x{m.cols} mesh does not hold cores.per_group = "
                         f"{machine.cores.per_group} CPEs", "rows x cols = cores.per_group")
    ccols = m.cols // m.cluster_cols
    ncl = (m.rows // m.cluster_rows) * ccols
    epc = r.engines_per_cluster
    csz = m.cluster_rows * m.cluster_cols
    per_group = ncl * epc
    engines = machine.groups * per_group
    cfg[RC_ENGINES] = engines
    cfg[RC_PIECE] = r.piece_bytes
    cfg[RC_INFLIGHT] = r.max_inflight
    cfg[RC_START] = r.startup_cycles if r.startup_cycles is not None else r.latency_cycles
    cfg[RC_BPC_FX] = int(round(r.bytes_per_cycle * int(FX)))
    cnt = np.zeros((engines, RX_N), np.int64)
    cnt[:, RX_LAT_MIN] = INF
    S = RmaState(cfg=cfg, desc=np.zeros((engines, r.descriptors_per_engine, RD_N), np.int64),
                 eng=np.zeros((engines, EN_N), np.int64),
                 core_engine=np.full(ncores, -1, np.int32), core_group=np.zeros(ncores, np.int32),
                 engine_node=np.zeros(engines, np.int32),
                 engine_cores=np.full((engines, (csz + epc - 1) // epc), -1, np.int32), cnt=cnt)
    fill = np.zeros(engines, np.int32)
    cpg = machine.cores.per_group
    for core in range(cores_total(machine)):
        g, k = divmod(core, cpg)
        row, col = divmod(k, m.cols)
        cluster = (row // m.cluster_rows) * ccols + col // m.cluster_cols
        inside = (row % m.cluster_rows) * m.cluster_cols + col % m.cluster_cols
        e = g * per_group + cluster * epc + inside % epc
        S.core_engine[core] = e
        S.core_group[core] = g
        S.engine_node[e] = cores_total(machine) + g * ncl + cluster   # noc.make_cpe_meshes numbering
        S.engine_cores[e, fill[e]] = core
        fill[e] += 1
    return S


def rma_pieces(nbytes: int, piece_bytes: int) -> int:
    """Pieces a transfer of nbytes is split into (Python twin of the engine's rule)."""
    return 0 if nbytes <= 0 else -(-nbytes // piece_bytes)


# ----------------------------------------------------------------------------- issue side
@njit(cache=True)
def rma_can_issue(RM, core):
    e = RM.core_engine[core]
    return e >= 0 and RM.eng[e, EN_COUNT] < RM.desc.shape[1]


@njit(cache=True)
def rma_issue(RM, TS, w, core, put, target, nbytes, now):
    """Queue the transfer warp w (on `core`) just issued to CPE `target` (the caller checked
    rma_can_issue and that target is in the same core group)."""
    if nbytes <= 0:
        return
    e = RM.core_engine[core]
    slot = RM.eng[e, EN_HEAD] + RM.eng[e, EN_COUNT]
    if slot >= RM.desc.shape[1]:
        slot -= RM.desc.shape[1]
    d = RM.desc[e, slot]
    d[RD_WARP] = w
    d[RD_CORE] = core
    d[RD_PUT] = put
    d[RD_TARGET] = target
    d[RD_NBYTES] = nbytes
    d[RD_NEXT] = 0
    d[RD_OUT] = 0
    d[RD_READY] = now + RM.cfg[RC_START]
    d[RD_T0] = now
    d[RD_DONE] = 0
    RM.eng[e, EN_COUNT] += 1
    RM.cfg[RC_QUEUED] += 1
    TS.bulk_pending[w, 1] += 1
    RM.cnt[e, RX_PUTS if put else RX_GETS] += 1


# ----------------------------------------------------------------------------- engine side
@njit(cache=True)
def rma_ready_piece(RM, e, now):
    """The FIFO slot of the descriptor whose next piece engine e may send in cycle `now`, or -1."""
    en = RM.eng[e]
    if en[EN_CUR] >= en[EN_COUNT] or en[EN_INFLIGHT] >= RM.cfg[RC_INFLIGHT] or en[EN_PORT_FX] > now * FX:
        return -1
    slot = en[EN_HEAD] + en[EN_CUR]
    if slot >= RM.desc.shape[1]:
        slot -= RM.desc.shape[1]
    if RM.desc[e, slot, RD_READY] > now:
        return -1
    return slot


@njit(cache=True)
def rma_piece_bytes(RM, e, slot):
    d = RM.desc[e, slot]
    n = d[RD_NBYTES] - d[RD_NEXT]
    return n if n < RM.cfg[RC_PIECE] else RM.cfg[RC_PIECE]


@njit(cache=True)
def rma_piece_sent(RM, e, slot, nbytes, now):
    BK.piece_sent(RM.eng[e], RM.desc[e, slot], nbytes, now, RM.cfg[RC_BPC_FX])
    RM.cnt[e, RX_PIECES] += 1


@njit(cache=True)
def rma_piece_done(RM, TS, e, slot, nbytes, now):
    """A piece of descriptor `slot` of engine e is back (get: its data; put: the target's ack)."""
    d = RM.desc[e, slot]
    d[RD_OUT] -= 1
    RM.eng[e, EN_INFLIGHT] -= 1
    RM.cnt[e, RX_BYTES_PUT if d[RD_PUT] else RX_BYTES_GET] += nbytes
    if d[RD_OUT] == 0 and d[RD_NEXT] >= d[RD_NBYTES]:
        d[RD_DONE] = 1
        w = d[RD_WARP]
        TS.bulk_pending[w, 1] -= 1
        WS.wake_warp(TS, w, now)
        BK.count_latency(RM.cnt[e], now - d[RD_T0], RX_LAT_SUM, RX_LAT_MIN, RX_LAT_MAX)
    RM.cfg[RC_QUEUED] -= BK.retire_done(RM.eng[e], RM.desc[e], RM.engine_cores[e], TS, now)


@njit(cache=True)
def rma_next_event(RM, now):
    """The first cycle after `now` at which an engine may send a piece on its own (INF: none)."""
    t = INF
    for e in range(RM.cfg[RC_ENGINES] if RM.cfg[RC_QUEUED] > 0 else 0):
        en = RM.eng[e]
        if en[EN_CUR] >= en[EN_COUNT] or en[EN_INFLIGHT] >= RM.cfg[RC_INFLIGHT]:
            continue
        slot = en[EN_HEAD] + en[EN_CUR]
        if slot >= RM.desc.shape[1]:
            slot -= RM.desc.shape[1]
        u = RM.desc[e, slot, RD_READY]
        p = (en[EN_PORT_FX] + FX - 1) // FX
        if p > u:
            u = p
        if u < t:
            t = u
    if t <= now:
        t = now + 1
    return t


@njit(cache=True)
def rma_busy(RM):
    return RM.cfg[RC_QUEUED] > 0


def rma_counters(RM) -> dict:
    """The ``rma`` record: transfers, bytes, pieces, latency (issue -> complete)."""
    n = int(RM.cfg[RC_ENGINES])
    c = RM.cnt[:n]
    done = int(c[:, RX_GETS].sum() + c[:, RX_PUTS].sum())
    lat_min = int(c[:, RX_LAT_MIN].min()) if n else 0
    return {"engines": n, "gets": int(c[:, RX_GETS].sum()), "puts": int(c[:, RX_PUTS].sum()),
            "bytes_get": int(c[:, RX_BYTES_GET].sum()), "bytes_put": int(c[:, RX_BYTES_PUT].sum()),
            "pieces": int(c[:, RX_PIECES].sum()),
            "latency_mean_cycles": float(c[:, RX_LAT_SUM].sum()) / done if done else 0.0,
            "latency_min_cycles": lat_min if done and lat_min < int(INF) else 0,
            "latency_max_cycles": int(c[:, RX_LAT_MAX].max()) if n else 0}
