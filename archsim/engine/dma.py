"""DMA engines of a Sunway core group: bulk copies between main memory and a CPE's LDM.

Design note (core cycles throughout)
- One engine per cluster of CPEs (``dma.engines_per_cluster`` per 2x2 cluster; the CPE at
  position k inside its cluster uses engine k % engines_per_cluster). A core group's engines
  share the group's stop on the ring: their requests enter the request ring at the group's node
  and their replies leave the response ring there (sunway_side.py does that wiring).
- ``dma.get`` / ``dma.put`` become, at issue, a transfer descriptor in the engine's FIFO
  (``dma.descriptors_per_engine`` entries; a full FIFO stalls the issuing CPE, counted as pipe_busy, and wakes it
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
- Strided transfers (``dma.get.s`` / ``dma.put.s``): ``count`` blocks of ``bsize`` bytes whose
  global starts are ``stride`` apart; each block is split at piece boundaries of its own global
  address (a block of 200 B at offset 0 is a 128-B and a 72-B piece), so narrow blocks cost a
  piece (a request and a reply on the ring, a DRAM access) each.
- Broadcast gets: see "broadcast" below (rendezvous, one memory read, fan-out over the CPE mesh).
- Not modelled yet: LDM port contention between the engine and the CPE's own
  LDM accesses, the descriptor's trip from the CPE to the engine (inside the start-up constant).

State is struct of arrays (``DmaState``); the step functions are free @njit functions that
sunway_side.py calls in its tick (the memory state owns the request table and the ring).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import bulk as BK
from archsim.engine import warps as WS
from archsim.engine.bulk import EN_COUNT, EN_CUR, EN_HEAD, EN_INFLIGHT, EN_PORT_FX, FX
from archsim.engine.jit import njit
from archsim.engine.queues import SPAN_SHIFT, n_spans
from archsim.errors import InputError

INF = np.int64(1) << 62

# cfg fields (DC_OPEN: broadcast lines open now; DC_SLOTS: warp slots per core; DC_NCL / DC_CCOLS:
# clusters per group and cluster columns; DC_CORES: cores of the machine; DC_XFER_INFLIGHT: a transfer's
# window of pieces in flight, 0 none)
(DC_ENGINES, DC_PIECE, DC_INFLIGHT, DC_GET_START, DC_PUT_START, DC_BPC_FX, DC_OPEN, DC_SLOTS, DC_NCL, DC_CCOLS,
 DC_CORES, DC_XFER_INFLIGHT, DC_N) = range(13)
# broadcast modes (archsim.isa.opcodes.BCAST_*)
BC_NONE, BC_ROW, BC_COLUMN, BC_ARRAY = range(4)
# broadcast line fields: joined participants (0: closed), the operands of the first participant,
# its core, the last participant's core
(BL_JOINED, BL_GADDR, BL_NBYTES, BL_COUNT, BL_BSIZE, BL_STRIDE, BL_LDM, BL_FIRST, BL_LAST, BL_N) = range(10)
# descriptor fields
# (a strided transfer: DD_COUNT blocks of DD_BSIZE bytes, DD_STRIDE apart in global memory; a contiguous
# one is a single block of DD_NBYTES; DD_NEXT counts bytes sent in packed order)
# (a broadcast: DD_LINE its line, DD_NPART participants in dpart, DD_CLMASK the clusters they sit in,
# DD_WARP -1: each participant completes on its own when its copy has landed)
(DD_WARP, DD_CORE, DD_PUT, DD_GADDR, DD_NBYTES, DD_NEXT, DD_OUT, DD_READY, DD_T0, DD_DONE) = range(BK.D_N)
DD_COUNT, DD_BSIZE, DD_STRIDE, DD_LINE, DD_NPART, DD_CLMASK, DD_N = range(BK.D_N, BK.D_N + 7)
# per-engine scalars after bulk.EN_*: the request refused by the ring (-1 none), the first cycle it
# may send a piece unless an event comes first (dma_wake: INF waits for one)
EN_HOLD, EN_WAKE, EN_N = range(BK.EN_N, BK.EN_N + 3)
# counters per engine
# (DX_BCASTS: broadcasts launched, DX_BC_READ: bytes they read from memory, DX_BC_COPIES: copies landed)
(DX_GETS, DX_PUTS, DX_BYTES_GET, DX_BYTES_PUT, DX_PIECES, DX_LAT_SUM, DX_LAT_MIN, DX_LAT_MAX, DX_BCASTS, DX_BC_READ,
 DX_BC_COPIES, DX_N) = range(12)


class DmaState(NamedTuple):
    cfg: np.ndarray           # int64 [DC_N]
    desc: np.ndarray          # int64 [engines, dma.descriptors_per_engine, DD_N] descriptor FIFOs
    eng: np.ndarray           # int64 [engines, EN_N]
    core_engine: np.ndarray   # int32 [cores] engine serving each core (-1: none)
    core_group: np.ndarray    # int32 [cores] core group of each core
    engine_group: np.ndarray  # int32 [engines] core group of each engine
    engine_cores: np.ndarray  # int32 [engines, k] cores an engine serves (-1 padded)
    cnt: np.ndarray           # int64 [engines, DX_N]
    # broadcast: lines (a mesh row, column or whole group of CPEs) and their rendezvous
    engine_cluster: np.ndarray  # int32 [engines] cluster (index in its group) of each engine
    core_cluster: np.ndarray    # int32 [cores] cluster (index in its group) of each core
    core_line: np.ndarray       # int32 [cores, 4] line of each core per mode (BC_*; column 0 unused)
    core_lidx: np.ndarray       # int32 [cores, 4] the core's index among its line's members
    line_cores: np.ndarray      # int32 [lines, per_group] member cores (-1 padded)
    lines: np.ndarray           # int64 [lines, BL_N]
    line_warp: np.ndarray       # int32 [lines, per_group] warp of each joined member (-1: not joined)
    line_t0: np.ndarray         # int64 [lines, per_group] cycle each member issued
    dpart: np.ndarray           # int32 [engines, dma.descriptors_per_engine, per_group] participant warps of a broadcast
    dgot: np.ndarray            # int64 [engines, dma.descriptors_per_engine, per_group] bytes landed in each one's LDM
    dt0: np.ndarray             # int64 [engines, dma.descriptors_per_engine, per_group] cycle each one issued
    wst: np.ndarray             # int32 [warps] the timing warp states (TState.wst, shared): who has exited
    espan: np.ndarray           # int64 [n_spans(engines)] the first cycle an engine of the span (queues.SPAN)
                                # with descriptors may send (sunway_side.dma_engines_cycle; an event sets it to 0)


def _state(ncores: int, engines: int, per_engine: int, cfg: np.ndarray, nlines: int = 1, per_group: int = 1,
           descs: int = 8) -> DmaState:
    e = max(engines, 1)
    eng = np.zeros((e, EN_N), np.int64)
    eng[:, EN_HOLD] = -1
    cnt = np.zeros((e, DX_N), np.int64)
    cnt[:, DX_LAT_MIN] = INF
    nc = max(ncores, 1)
    pg = max(per_group, 1)
    nl = max(nlines, 1)
    return DmaState(cfg=cfg, desc=np.zeros((e, descs, DD_N), np.int64), eng=eng,
                    core_engine=np.full(nc, -1, np.int32), core_group=np.zeros(nc, np.int32),
                    engine_group=np.zeros(e, np.int32), engine_cores=np.full((e, max(per_engine, 1)), -1, np.int32),
                    cnt=cnt, engine_cluster=np.zeros(e, np.int32), core_cluster=np.zeros(nc, np.int32),
                    core_line=np.full((nc, 4), -1, np.int32), core_lidx=np.zeros((nc, 4), np.int32),
                    line_cores=np.full((nl, pg), -1, np.int32), lines=np.zeros((nl, BL_N), np.int64),
                    line_warp=np.full((nl, pg), -1, np.int32), line_t0=np.zeros((nl, pg), np.int64),
                    dpart=np.full((e, descs, pg), -1, np.int32), dgot=np.zeros((e, descs, pg), np.int64),
                    dt0=np.zeros((e, descs, pg), np.int64), wst=np.zeros(1, np.int32),
                    espan=np.zeros(n_spans(e), np.int64))


def make_dma_state(machine, wst=None) -> DmaState:
    """The DMA engines of a machine (none, as an empty state, on a machine without ``dma``).
    ``wst``: the timing warp states (a broadcast waits for the members that have not exited)."""
    D = _make_dma_state(machine)
    return D._replace(wst=wst) if wst is not None else D


def _make_dma_state(machine) -> DmaState:
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
    if d.broadcast_modes and machine.rma is None:
        raise InputError(f"{machine.name}: dma.broadcast_modes", "a DMA broadcast crosses the CPE mesh, whose "
                         "parameters are in the rma block", "add rma: {...} or broadcast_modes: []")
    if d.broadcast_modes and machine.cores.warp_slots != 1:
        raise InputError(f"{machine.name}: dma.broadcast_modes", "a DMA broadcast is collective over CPEs of one "
                         "warp slot each", "cores.warp_slots: 1")
    cpg = machine.cores.per_group
    lines_per_group = m.rows + m.cols + 1          # rows, then columns, then the whole array
    cfg[DC_SLOTS] = machine.cores.warp_slots
    cfg[DC_NCL] = clusters
    cfg[DC_CCOLS] = m.cols // m.cluster_cols
    cfg[DC_CORES] = ncores
    D = _state(ncores, engines, per_engine, cfg, machine.groups * lines_per_group, cpg,
               machine.dma.descriptors_per_engine)
    fill = np.zeros(engines, np.int32)
    lfill = np.zeros(machine.groups * lines_per_group, np.int32)
    ccols = m.cols // m.cluster_cols
    for core in range(ncores):
        g, k = divmod(core, cpg)
        row, col = divmod(k, m.cols)
        cluster = (row // m.cluster_rows) * ccols + col // m.cluster_cols
        inside = (row % m.cluster_rows) * m.cluster_cols + col % m.cluster_cols
        e = g * per_group + cluster * epc + inside % epc
        D.core_engine[core] = e
        D.core_group[core] = g
        D.core_cluster[core] = cluster
        D.engine_group[e] = g
        D.engine_cluster[e] = cluster
        D.engine_cores[e, fill[e]] = core
        fill[e] += 1
        for mode, line in ((BC_ROW, row), (BC_COLUMN, m.rows + col), (BC_ARRAY, m.rows + m.cols)):
            li = g * lines_per_group + line
            D.core_line[core, mode] = li
            D.core_lidx[core, mode] = lfill[li]
            D.line_cores[li, lfill[li]] = core
            lfill[li] += 1
    return D


def pieces(gaddr: int, nbytes: int, piece_bytes: int, count: int = 1, stride: int = 0) -> int:
    """Pieces a transfer of nbytes at global address gaddr is split into (Python twin of the
    engine's rule, for tests and micro-benchmarks); with count > 1, a strided transfer of
    `count` blocks of nbytes each, `stride` bytes apart."""
    if nbytes <= 0:
        return 0
    return sum((a + nbytes - 1) // piece_bytes - a // piece_bytes + 1
               for a in (gaddr + i * stride for i in range(count)))


# ----------------------------------------------------------------------------- issue side
@njit(cache=True)
def dma_can_issue(DM, core, mode=0):
    """Has the engine of `core` room for one more descriptor (and, for a broadcast of `mode`, has
    the core no unlaunched broadcast of that mode)?"""
    e = DM.core_engine[core]
    if e < 0 or DM.eng[e, EN_COUNT] >= DM.desc.shape[1]:
        return False
    if mode > 0:
        li = DM.core_line[core, mode]
        if DM.lines[li, BL_JOINED] > 0 and DM.line_warp[li, DM.core_lidx[core, mode]] >= 0:
            return False
    return True


@njit(cache=True)
def dma_issue(DM, TS, w, core, put, gaddr, nbytes, now, count=1, bsize=-1, stride=0):
    """Queue the transfer warp w (on `core`) just issued (the caller checked dma_can_issue):
    nbytes at gaddr, or (strided) `count` blocks of `bsize` bytes `stride` apart from gaddr."""
    if nbytes <= 0:
        return  # nothing to move: complete at issue
    if bsize < 0:
        count = 1
        bsize = nbytes
        stride = nbytes
    e = DM.core_engine[core]
    cap = DM.desc.shape[1]
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
    d[DD_COUNT] = count
    d[DD_BSIZE] = bsize
    d[DD_STRIDE] = stride
    d[DD_LINE] = -1
    DM.eng[e, EN_COUNT] += 1
    _engine_due(DM, e)
    TS.bulk_pending[w, 0] += 1
    if put:
        DM.cnt[e, DX_PUTS] += 1
    else:
        DM.cnt[e, DX_GETS] += 1


# ----------------------------------------------------------------------------- broadcast
# A broadcast get is collective over a line (the CPEs of a mesh row / column / the whole core
# group of the issuer). Each participant's issue joins the line's rendezvous (its own dma.wait
# counts the transfer); when every member that runs a block of the launch and has not exited
# has joined, one descriptor is queued at the engine of the last one to join: memory is read
# once, and each piece is carried over the CPE mesh from that engine's cluster to every cluster
# with participants (sunway_side.py: an XY tree of engine-to-engine hops); a participant completes
# when all its bytes have landed in its cluster.
@njit(cache=True, inline="always")
def _line_ready(DM, li):
    """Has every live member of line li joined?"""
    slots = DM.cfg[DC_SLOTS]
    for k in range(DM.line_cores.shape[1]):
        c = DM.line_cores[li, k]
        if c < 0:
            break
        if DM.line_warp[li, k] >= 0:
            continue
        st = DM.wst[c * slots]
        if st != WS.T_EMPTY and st != WS.T_DONE:
            return False
    return True


@njit(cache=True)
def dma_bcast_try(DM, TS, li, now):
    """Launch line li's broadcast when it is complete and its engine has room; True if launched."""
    L = DM.lines[li]
    if L[BL_JOINED] == 0 or not _line_ready(DM, li):
        return False
    e = DM.core_engine[L[BL_LAST]]
    if DM.eng[e, EN_COUNT] >= DM.desc.shape[1]:
        return False
    slot = DM.eng[e, EN_HEAD] + DM.eng[e, EN_COUNT]
    if slot >= DM.desc.shape[1]:
        slot -= DM.desc.shape[1]
    d = DM.desc[e, slot]
    d[DD_WARP] = -1
    d[DD_CORE] = L[BL_LAST]
    d[DD_PUT] = 0
    d[DD_GADDR] = L[BL_GADDR]
    d[DD_NBYTES] = L[BL_NBYTES]
    d[DD_NEXT] = 0
    d[DD_OUT] = 0
    d[DD_READY] = now + DM.cfg[DC_GET_START]
    d[DD_T0] = now
    d[DD_DONE] = 0
    d[DD_COUNT] = L[BL_COUNT]
    d[DD_BSIZE] = L[BL_BSIZE]
    d[DD_STRIDE] = L[BL_STRIDE]
    d[DD_LINE] = li
    n = 0
    mask = np.int64(0)
    for k in range(DM.line_cores.shape[1]):
        c = DM.line_cores[li, k]
        if c < 0:
            break
        wk = DM.line_warp[li, k]
        if wk < 0:
            continue
        DM.dpart[e, slot, n] = wk
        DM.dgot[e, slot, n] = 0
        DM.dt0[e, slot, n] = DM.line_t0[li, k]
        mask |= np.int64(1) << DM.core_cluster[c]
        DM.line_warp[li, k] = -1
        n += 1
    d[DD_NPART] = n
    d[DD_CLMASK] = mask
    DM.eng[e, EN_COUNT] += 1
    _engine_due(DM, e)
    DM.cnt[e, DX_BCASTS] += 1
    L[BL_JOINED] = 0
    DM.cfg[DC_OPEN] -= 1
    for k in range(DM.line_cores.shape[1]):  # members refused for a second broadcast may issue now
        c = np.int64(DM.line_cores[li, k])
        if c < 0:
            break
        if TS.mem_wait[c]:
            WS.wake_refused(TS, c, now)
    return True


@njit(cache=True)
def dma_bcast_join(DM, TS, w, core, mode, gaddr, nbytes, count, bsize, stride, ldm, now):
    """Warp w (on `core`) issued a broadcast get of `mode`: join its line. Returns -1, or the core
    of the first participant when the operands differ from that one's (a fault)."""
    if nbytes <= 0:
        return -1  # nothing to move: complete at issue
    li = np.int64(DM.core_line[core, mode])
    L = DM.lines[li]
    if L[BL_JOINED] == 0:
        L[BL_GADDR] = gaddr
        L[BL_NBYTES] = nbytes
        L[BL_COUNT] = count
        L[BL_BSIZE] = bsize
        L[BL_STRIDE] = stride
        L[BL_LDM] = ldm
        L[BL_FIRST] = core
        DM.cfg[DC_OPEN] += 1
    elif (L[BL_GADDR] != gaddr or L[BL_NBYTES] != nbytes or L[BL_COUNT] != count or L[BL_BSIZE] != bsize
          or (count > 1 and L[BL_STRIDE] != stride) or L[BL_LDM] != ldm):
        return L[BL_FIRST]
    k = DM.core_lidx[core, mode]
    DM.line_warp[li, k] = w
    DM.line_t0[li, k] = now
    L[BL_JOINED] += 1
    L[BL_LAST] = core
    TS.bulk_pending[w, 0] += 1
    DM.cnt[DM.core_engine[core], DX_GETS] += 1
    dma_bcast_try(DM, TS, li, now)
    return -1


@njit(cache=True)
def dma_bcast_poll(DM, TS, now):
    """Launch the open lines that became complete because a member exited (or whose engine had
    no room when they did)."""
    if DM.cfg[DC_OPEN] == 0:
        return
    for li in range(DM.lines.shape[0]):
        if DM.lines[li, BL_JOINED] > 0:
            dma_bcast_try(DM, TS, li, now)


@njit(cache=True)
def dma_bcast_land(DM, TS, e, slot, cluster, nbytes, now):
    """A piece of broadcast descriptor `slot` of engine e (nbytes) reached `cluster`: it lands in
    the LDM of every participant there. Returns the bytes landed (all copies)."""
    d = DM.desc[e, slot]
    slots = DM.cfg[DC_SLOTS]
    got = 0
    for k in range(d[DD_NPART]):
        wk = DM.dpart[e, slot, k]
        if DM.core_cluster[wk // slots] != cluster:
            continue
        DM.dgot[e, slot, k] += nbytes
        got += nbytes
        DM.cnt[e, DX_BYTES_GET] += nbytes
        if DM.dgot[e, slot, k] >= d[DD_NBYTES]:
            DM.cnt[e, DX_BC_COPIES] += 1
            TS.bulk_pending[wk, 0] -= 1
            WS.wake_warp(TS, wk, now)
            lat = now - DM.dt0[e, slot, k]
            DM.cnt[e, DX_LAT_SUM] += lat
            if lat < DM.cnt[e, DX_LAT_MIN]:
                DM.cnt[e, DX_LAT_MIN] = lat
            if lat > DM.cnt[e, DX_LAT_MAX]:
                DM.cnt[e, DX_LAT_MAX] = lat
    return got


@njit(cache=True, inline="always")
def bcast_any(mask, ccols, i0, i1, j0, j1):
    """Has the cluster mask a cluster in rows i0..i1 and columns j0..j1 (inclusive)?"""
    if i0 > i1 or j0 > j1:
        return False
    m = mask
    c = 0
    while m:
        if m & 1:
            i = c // ccols
            j = c - i * ccols
            if i0 <= i <= i1 and j0 <= j <= j1:
                return True
        m >>= 1
        c += 1
    return False


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
    if slot >= DM.desc.shape[1]:
        slot -= DM.desc.shape[1]
    if DM.desc[e, slot, DD_READY] > now:
        return -1
    w = DM.cfg[DC_XFER_INFLIGHT]
    if w > 0 and DM.desc[e, slot, DD_OUT] >= w:
        return -1  # the transfer's window is full: a returning piece reopens it
    return slot


@njit(cache=True, inline="always")
def _engine_due(DM, e):
    """An event (a descriptor queued, a piece back) may let engine e send: look at it next."""
    DM.eng[e, EN_WAKE] = 0
    DM.espan[e >> SPAN_SHIFT] = 0


@njit(cache=True)
def dma_wake(DM, e):
    """When dma_ready_piece found nothing to send: the first cycle it can find a piece with no
    event in between (its port frees, its descriptor's start-up ends), INF when only an event
    can give it one (a new descriptor, a piece back). Those events clear EN_WAKE."""
    en = DM.eng[e]
    if en[EN_CUR] >= en[EN_COUNT] or en[EN_INFLIGHT] >= DM.cfg[DC_INFLIGHT]:
        return INF
    slot = en[EN_HEAD] + en[EN_CUR]
    if slot >= DM.desc.shape[1]:
        slot -= DM.desc.shape[1]
    w = DM.cfg[DC_XFER_INFLIGHT]
    if w > 0 and DM.desc[e, slot, DD_OUT] >= w:
        return INF
    t = (en[EN_PORT_FX] + FX - 1) // FX
    if DM.desc[e, slot, DD_READY] > t:
        t = DM.desc[e, slot, DD_READY]
    return t


@njit(cache=True)
def dma_piece(DM, e, slot):
    """(global address, bytes) of the next piece of descriptor `slot` of engine e: the rest of
    the current block up to the next piece boundary of the global address."""
    d = DM.desc[e, slot]
    P = DM.cfg[DC_PIECE]
    bs = d[DD_BSIZE]
    blk = d[DD_NEXT] // bs
    off = d[DD_NEXT] - blk * bs
    a = d[DD_GADDR] + blk * d[DD_STRIDE] + off
    end = a - off + bs
    b = (a // P + 1) * P
    if b > end:
        b = end
    return a, b - a


@njit(cache=True)
def dma_piece_sent(DM, e, slot, nbytes, now):
    """The engine sent nbytes of descriptor `slot`: hold the port, count it in flight."""
    BK.piece_sent(DM.eng[e], DM.desc[e, slot], nbytes, now, DM.cfg[DC_BPC_FX])
    DM.cnt[e, DX_PIECES] += 1


@njit(cache=True)
def dma_piece_done(DM, TS, e, slot, nbytes, now):
    """A piece of descriptor `slot` of engine e is back (get: its data; put: the write's ack).
    Completes the transfer when it was the last; retires finished descriptors at the FIFO head."""
    d = DM.desc[e, slot]
    d[DD_OUT] -= 1
    DM.eng[e, EN_INFLIGHT] -= 1
    _engine_due(DM, e)
    bc = d[DD_LINE] >= 0  # a broadcast: its copies were counted (and completed) as they landed
    if bc:
        DM.cnt[e, DX_BC_READ] += nbytes
    else:
        DM.cnt[e, DX_BYTES_PUT if d[DD_PUT] else DX_BYTES_GET] += nbytes
    if d[DD_OUT] == 0 and d[DD_NEXT] >= d[DD_NBYTES]:
        d[DD_DONE] = 1
    if d[DD_DONE] == 1 and not bc and d[DD_WARP] >= 0:
        w = d[DD_WARP]
        d[DD_WARP] = -1
        TS.bulk_pending[w, 0] -= 1
        WS.wake_warp(TS, w, now)
        BK.count_latency(DM.cnt[e], now - d[DD_T0], DX_LAT_SUM, DX_LAT_MIN, DX_LAT_MAX)
    BK.retire_done(DM.eng[e], DM.desc[e], DM.engine_cores[e], TS, now)


@njit(cache=True)
def dma_next_event(DM, now):
    """The first cycle after `now` at which an engine may send a piece on its own (WS.INF: none;
    engines waiting for replies are woken by the memory system's own events)."""
    t = INF
    if DM.cfg[DC_OPEN] > 0:  # a line that became complete (a member exited) launches next cycle
        for li in range(DM.lines.shape[0]):
            if DM.lines[li, BL_JOINED] > 0 and _line_ready(DM, li) and \
                    DM.eng[DM.core_engine[DM.lines[li, BL_LAST]], EN_COUNT] < DM.desc.shape[1]:
                return now + 1
    for e in range(DM.cfg[DC_ENGINES]):
        if DM.eng[e, EN_HOLD] >= 0:
            return now + 1  # a piece the ring refused is offered again next cycle
        u = dma_wake(DM, e)  # (INF: it waits for a piece back or a descriptor, memory-system events)
        if u < t:
            t = u
    if t <= now:
        t = now + 1
    return t


@njit(cache=True)
def dma_busy(DM):
    """Any transfer queued or in flight, or a broadcast waiting for its participants."""
    if DM.cfg[DC_OPEN] > 0:
        return True
    for e in range(DM.cfg[DC_ENGINES]):
        if DM.eng[e, EN_COUNT] > 0 or DM.eng[e, EN_HOLD] >= 0:
            return True
    return False


def dma_counters(DM) -> dict:
    """Totals over the engines: transfers, bytes, pieces, latency (issue -> complete)."""
    n = int(DM.cfg[DC_ENGINES])
    c = DM.cnt[:n] if n else np.zeros((0, DX_N), np.int64)
    # transfers completed: plain gets and puts (one latency each) + broadcast copies (one per participant)
    done = int(c[:, DX_GETS].sum() + c[:, DX_PUTS].sum()) if n else 0
    lat_min = int(c[:, DX_LAT_MIN].min()) if n else 0
    return {"engines": n, "gets": int(c[:, DX_GETS].sum()), "puts": int(c[:, DX_PUTS].sum()),
            "bytes_get": int(c[:, DX_BYTES_GET].sum()), "bytes_put": int(c[:, DX_BYTES_PUT].sum()),
            "pieces": int(c[:, DX_PIECES].sum()), "broadcasts": int(c[:, DX_BCASTS].sum()) if n else 0,
            "broadcast_bytes_read": int(c[:, DX_BC_READ].sum()) if n else 0,
            "broadcast_copies": int(c[:, DX_BC_COPIES].sum()) if n else 0,
            "latency_mean_cycles": float(c[:, DX_LAT_SUM].sum()) / done if done else 0.0,
            "latency_min_cycles": lat_min if done and lat_min < int(INF) else 0,
            "latency_max_cycles": int(c[:, DX_LAT_MAX].max()) if n else 0}
