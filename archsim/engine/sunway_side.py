"""The Sunway core-group side of the memory system: replies taken off the ring per core group and
handed to their CPE or DMA engine, the DMA engines' pieces onto the ring, and the CPE mesh of each
core group, which carries broadcast copies between clusters, RMA pieces between CPEs and the MPE's
launch and completion messages (dma.py, rma.py and mpe.py keep those engines' own state)."""

from __future__ import annotations

import numpy as np

from archsim.engine import dma as DM
from archsim.engine import mpe as MPE
from archsim.engine import noc as NC
from archsim.engine import rma as RM
from archsim.engine import warps as WS
from archsim.engine.core_side import core_reply
from archsim.engine.jit import njit
from archsim.engine.names import V_DMA
from archsim.engine.mem_state import (BY_DMA, BY_FABRIC, BY_RMA, CK_NOW_FAB, MK_CCOLS, MK_CORES, MK_NCL, MK_NODES,
                                      MK_QUEUED, M_HEADER, ND_REQ_MEM, TAG_BCAST, TAG_DMA, TAG_MPE_DONE,
                                      TAG_MPE_LAUNCH, TAG_RMA_REQ, TAG_RMA_RESP, placed_addr, slice_of)
from archsim.engine.queues import KIND_READ, KIND_WRITE, q_peek, q_pop, q_push, req_alloc, req_free, span_bounds

@njit(cache=True)
def group_replies(MS, TS, g, now):
    """Replies at core group g's ring stop: DMA pieces to their engine, the rest (CPE global
    loads) to the core that asked."""
    R = MS.R
    while True:
        r = NC.noc_eject(MS.resp, MS.gnode[g, 1])
        if r < 0:
            break
        if R.tag[r] == TAG_DMA:
            a = R.aux0[r]
            n = R.nbytes[r]
            e = a // MS.dma.desc.shape[1]
            slot = a % MS.dma.desc.shape[1]
            if MS.dma.desc[e, slot, DM.DD_LINE] >= 0:
                # a broadcast piece: r is its token from here on, until every cluster has it
                R.aux1[r] = 1
                cl = MS.dma.engine_cluster[e]
                MS.bytes[BY_DMA] += DM.dma_bcast_land(MS.dma, TS, e, slot, cl, n, now)
                _bcast_forward(MS, r, e, slot, cl)
                _bcast_token_done(MS, TS, r, now)
                continue
            req_free(R, r)
            MS.bytes[BY_DMA] += n
            DM.dma_piece_done(MS.dma, TS, e, slot, n, now)
        else:
            core_reply(MS, TS, np.int64(R.src[r]), r, now)


@njit(cache=True)
def _dma_send(MS, e, r, now_f):
    """Put DMA piece request r of engine e on the request ring at its group's stop; a refused one
    is held and retried next cycle (back-pressure)."""
    R = MS.R
    nbytes = MS.cfg[M_HEADER] + (R.nbytes[r] if R.kind[r] == KIND_WRITE else 0)
    dest = MS.node[ND_REQ_MEM, slice_of(MS, R.addr[r])]
    if NC.noc_inject(MS.req, MS.gnode[MS.dma.engine_group[e], 0], r, nbytes, dest, now_f):
        MS.bytes[BY_FABRIC] += nbytes
        MS.dma.eng[e, DM.EN_HOLD] = -1
        return True
    MS.dma.eng[e, DM.EN_HOLD] = r
    return False


@njit(cache=True)
def dma_engines_cycle(MS, TS, now):
    """One core cycle of every DMA engine: retry a piece the ring refused, then send the pieces
    the port, the in-flight limit and the descriptors' start-up allow. Engines are looked at span
    by span (DmaState.espan: the earliest cycle one of the span may send; a descriptor queued or a
    piece back sets it to 0)."""
    DMs = MS.dma
    R = MS.R
    now_f = MS.clocks[CK_NOW_FAB]
    ne = DMs.cfg[DM.DC_ENGINES]
    looked = 0
    sent = 0
    for j in range(DMs.espan.shape[0]):
        if DMs.espan[j] > now:
            continue
        t = WS.INF
        lo, hi = span_bounds(j, ne)
        looked += hi - lo
        for e in range(lo, hi):
            en = DMs.eng[e]
            if en[DM.EN_COUNT] == 0:
                continue
            if en[DM.EN_HOLD] >= 0:
                if not _dma_send(MS, e, en[DM.EN_HOLD], now_f):
                    t = min(t, now + 1)
                    continue
            elif en[DM.EN_WAKE] > now:
                t = min(t, en[DM.EN_WAKE])
                continue          # nothing to send before then, or until a piece or descriptor comes (dma_wake)
            sent += 1             # (sending, or finding what it sends next)
            while True:
                slot = DM.dma_ready_piece(DMs, e, now)
                if slot < 0:
                    en[DM.EN_WAKE] = DM.dma_wake(DMs, e)
                    break
                addr, n = DM.dma_piece(DMs, e, slot)
                d = DMs.desc[e, slot]
                addr = placed_addr(MS.cfg, d[DM.DD_CORE], addr)
                put = d[DM.DD_PUT] != 0
                r = req_alloc(R, addr, n, KIND_WRITE if put else KIND_READ, d[DM.DD_CORE], TAG_DMA, now)
                if r < 0:
                    en[DM.EN_WAKE] = now + 1  # the request table is full: try again next cycle
                    break
                R.aux0[r] = e * MS.dma.desc.shape[1] + slot
                DM.dma_piece_sent(DMs, e, slot, n, now)
                if not _dma_send(MS, e, r, now_f):
                    break             # held: retried next cycle
            t = min(t, now + 1 if en[DM.EN_HOLD] >= 0 else en[DM.EN_WAKE])
        DMs.espan[j] = t
    MS.visits[V_DMA, 0] += looked
    MS.visits[V_DMA, 1] += sent


# ----------------------------------------------------------------------------- the CPE mesh
@njit(cache=True, inline="always")
def obox_push(MS, node, r):
    q_push(MS.obox, node, r)
    MS.mk[MK_QUEUED] += 1


@njit(cache=True)
def _bcast_hop(MS, tok, g, src_cl, dst_cl):
    """Queue a hop of broadcast piece `tok` from cluster src_cl's port to cluster dst_cl's."""
    R = MS.R
    base = MS.mk[MK_CORES] + g * MS.mk[MK_NCL]
    r = req_alloc(R, base + dst_cl, R.nbytes[tok], KIND_WRITE, dst_cl, TAG_BCAST, 0)
    R.aux0[r] = tok
    R.aux1[tok] += 1
    obox_push(MS, base + src_cl, r)


@njit(cache=True)
def _bcast_forward(MS, tok, e, slot, cl):
    """The hops a broadcast piece takes on from cluster `cl` (an XY tree rooted at engine e's
    cluster: along the root's cluster row, then up and down every column), only towards
    clusters with participants."""
    DMs = MS.dma
    ccols = MS.mk[MK_CCOLS]
    crows = MS.mk[MK_NCL] // ccols
    mask = DMs.desc[e, slot, DM.DD_CLMASK]
    root = DMs.engine_cluster[e]
    g = DMs.engine_group[e]
    ri, rj = root // ccols, root % ccols
    i, j = cl // ccols, cl % ccols
    if i == ri:
        if j <= rj and DM.bcast_any(mask, ccols, 0, crows - 1, 0, j - 1):
            _bcast_hop(MS, tok, g, cl, cl - 1)
        if j >= rj and DM.bcast_any(mask, ccols, 0, crows - 1, j + 1, ccols - 1):
            _bcast_hop(MS, tok, g, cl, cl + 1)
    if i <= ri and DM.bcast_any(mask, ccols, 0, i - 1, j, j):
        _bcast_hop(MS, tok, g, cl, cl - ccols)
    if i >= ri and DM.bcast_any(mask, ccols, i + 1, crows - 1, j, j):
        _bcast_hop(MS, tok, g, cl, cl + ccols)


@njit(cache=True)
def _bcast_token_done(MS, TS, tok, now):
    """One cluster of broadcast piece `tok` is served; the last one ends the piece at its engine."""
    R = MS.R
    R.aux1[tok] -= 1
    if R.aux1[tok] > 0:
        return
    a = R.aux0[tok]
    n = R.nbytes[tok]
    req_free(R, tok)
    DM.dma_piece_done(MS.dma, TS, a // MS.dma.desc.shape[1], a % MS.dma.desc.shape[1], n, now)


@njit(inline="always")
def _mesh_wire_bytes(R, r, header):
    """Bytes a mesh packet puts on the links: a header, plus data where it carries some."""
    t = R.tag[r]
    if t == TAG_BCAST or (t == TAG_RMA_REQ and R.kind[r] == KIND_WRITE) or \
            (t == TAG_RMA_RESP and R.kind[r] == KIND_READ) or t == TAG_MPE_LAUNCH:
        return header + R.nbytes[r]
    return header


@njit(cache=True)
def _mesh_deliver(MS, TS, node, r, now):
    """Packet r reached mesh node `node` (a CPE's LDM, or a cluster port)."""
    R = MS.R
    t = R.tag[r]
    if t == TAG_BCAST:
        tok = R.aux0[r]
        cl = R.src[r]
        req_free(R, r)
        a = R.aux0[tok]
        e = a // MS.dma.desc.shape[1]
        slot = a % MS.dma.desc.shape[1]
        MS.bytes[BY_DMA] += DM.dma_bcast_land(MS.dma, TS, e, slot, cl, R.nbytes[tok], now)
        _bcast_forward(MS, tok, e, slot, cl)
        _bcast_token_done(MS, TS, tok, now)
    elif t == TAG_MPE_LAUNCH:  # at the CPE: it may start
        req_free(R, r)
        MPE.mpe_arrived(MS.mpe, TS, node, now)
    elif t == TAG_MPE_DONE:    # at the MPE's port
        g = R.src[r]
        req_free(R, r)
        MPE.mpe_done_arrived(MS.mpe, g, now)
    elif t == TAG_RMA_REQ:
        # the target's LDM takes the data (put) or reads it (get) and answers the engine
        R.tag[r] = TAG_RMA_RESP
        e = R.src[r]
        dest = MS.rma.engine_node[e]
        R.addr[r] = dest
        obox_push(MS, node, r)
    else:  # TAG_RMA_RESP at the engine's port
        a = R.aux0[r]
        n = R.nbytes[r]
        req_free(R, r)
        MS.bytes[BY_RMA] += n
        RM.rma_piece_done(MS.rma, TS, a // MS.rma.desc.shape[1], a % MS.rma.desc.shape[1], n, now)


@njit(cache=True)
def _rma_engines(MS, TS, now):
    """One core cycle of every RMA engine: pieces the port, the in-flight limit and the
    descriptors' start-up allow go to the engine's cluster port."""
    RMs = MS.rma
    R = MS.R
    Q = MS.obox
    for e in range(RMs.cfg[RM.RC_ENGINES] if RMs.cfg[RM.RC_QUEUED] > 0 else 0):   # (none queued: none sends)
        if RMs.eng[e, RM.EN_COUNT] == 0:
            continue
        node = RMs.engine_node[e]
        while True:
            slot = RM.rma_ready_piece(RMs, e, now)
            if slot < 0 or Q.count[node] >= Q.cap[node]:
                break
            d = RMs.desc[e, slot]
            n = RM.rma_piece_bytes(RMs, e, slot)
            put = d[RM.RD_PUT] != 0
            r = req_alloc(R, d[RM.RD_TARGET], n, KIND_WRITE if put else KIND_READ, e, TAG_RMA_REQ, now)
            if r < 0:
                break
            R.aux0[r] = e * MS.rma.desc.shape[1] + slot
            RM.rma_piece_sent(RMs, e, slot, n, now)
            obox_push(MS, node, r)


@njit(cache=True)
def _mpe_cycle(MS, TS, now):
    """One core cycle of every launching MPE: the launch messages its spawn loop has finished go
    to its port's outbox; it takes the completions that have arrived (mpe.py)."""
    MP = MS.mpe
    R = MS.R
    Q = MS.obox
    for g in range(MP.cfg[MPE.MC_GROUPS]):
        node = MP.grp[g, MPE.GP_NODE]
        while True:
            c = MPE.mpe_launch_ready(MP, g, now)
            if c < 0 or Q.count[node] >= Q.cap[node]:
                break
            r = req_alloc(R, c, MP.cfg[MPE.MC_MSG_BYTES], KIND_WRITE, g, TAG_MPE_LAUNCH, now)
            if r < 0:
                break
            MPE.mpe_launch_sent(MP, g, now)
            obox_push(MS, node, r)
        MPE.mpe_take(MP, g, now)


@njit(cache=True)
def mem_core_done(MS, TS, core, now):
    """Core `core` retired its last block (called at issue): on a Sunway its completion goes to its
    group's MPE over the mesh; nothing on a GPU."""
    MP = MS.mpe
    if MP.cfg[MPE.MC_GROUPS] == 0:
        return
    g = MPE.mpe_core_done(MP, core, now)
    r = req_alloc(MS.R, MP.grp[g, MPE.GP_NODE], 0, KIND_WRITE, g, TAG_MPE_DONE, now)
    obox_push(MS, core, r)  # the request table holds one completion per CPE (make_mstate)


@njit(cache=True)
def mesh_cycle(MS, TS, now):
    """One core cycle of the CPE mesh: take what arrived at every node, let the RMA engines send,
    put what waits in the outboxes on the mesh, step it."""
    N = MS.mesh
    R = MS.R
    Q = MS.obox
    nn = MS.mk[MK_NODES]
    if not NC.noc_idle(N):
        for node in range(nn):
            while True:
                r = NC.noc_eject(N, node)
                if r < 0:
                    break
                _mesh_deliver(MS, TS, node, r, now)
    if MS.rma.cfg[RM.RC_ENGINES] > 0:
        _rma_engines(MS, TS, now)
    if MS.mpe.cfg[MPE.MC_GROUPS] > 0:
        _mpe_cycle(MS, TS, now)
    if MS.mk[MK_QUEUED] > 0:
        for node in range(nn):
            while Q.count[node] > 0:
                r = q_peek(Q, node, 0)
                if not NC.noc_inject(N, node, r, _mesh_wire_bytes(R, r, MS.cfg[M_HEADER]), R.addr[r], now):
                    break
                q_pop(Q, node)
                MS.mk[MK_QUEUED] -= 1
    if not NC.noc_idle(N):
        NC.noc_step(N, now)


@njit(cache=True)
def mesh_next_event(MS, now):
    """The next core cycle at which the mesh or the RMA engines can change anything (WS.INF)."""
    t = RM.rma_next_event(MS.rma, now) if MS.rma.cfg[RM.RC_ENGINES] > 0 else WS.INF
    if MS.mpe.cfg[MPE.MC_GROUPS] > 0:
        u = MPE.mpe_next_event(MS.mpe, now)
        if u < t:
            t = u
    if MS.mk[MK_QUEUED] > 0:
        return now + 1
    N = MS.mesh
    if NC.noc_idle(N):
        return t
    for node in range(MS.mk[MK_NODES]):
        if NC.noc_deliverable(N, node):
            return now + 1
    u = NC.noc_next_event(N, now)
    return u if u < t else t
