"""The GPU memory system around the cores: the MIO queue and the unified L1/shared data pipe of
each SM, L1 (sectored, MSHRs), the request and response crossbars, the L2 slices (two halves,
near and far) and the DRAM channels. The blocks live in their own files (cache.py, noc.py,
dram.py); this module wires them together in the tick order of DESIGN.md (memory -> fabric ->
cores).

Per SM, memory instructions enter the MIO queue at issue (a full queue stalls issue: pipe_busy).
The data pipe takes one wavefront per cycle (banks x bank_width bytes, 128 B on an A100 SM): a
shared-memory access costs one wavefront per bank-conflict way, a global access one per line it
touches. Shared loads are ready ``scratchpad.latency_cycles`` after their last wavefront, L1 hits
``l1.hit_latency_cycles`` after theirs. Misses allocate L1 MSHRs and travel the request crossbar
to the L2 slice that owns the address (``l2.halves`` partitions interleaved in
``l2.interleave_bytes``; slices within a half in the controllers' interleave granule, round-robin
or, with ``l2.slice_indexing: hashed``, permuted by an XOR fold of the higher address bits); a
slice's data array moves ``l2.bytes_per_cycle``; hits answer after ``l2.hit_latency_cycles`` (plus
``far_half_extra_cycles`` for an SM of the other half: near and far replies wait in separate
delay pipelines, so a near reply never queues behind a far one), misses go through the slice's
MSHRs to the DRAM channel of the address. With ``l2.near_replicas`` an SM reads through the slice
of its own half that mirrors the address's home slice: a miss there takes the line from the home
slice (``hit_latency_cycles + far_half_extra_cycles`` later) or, when the home lacks it, from DRAM
into both; a write goes to the home slice and drops the mirrors' copies. Data comes back over the
response crossbar and through the L1 pipeline. Every other cycle of latency comes from these
queues, links and banks.

Clock domains: the fabric and L2 step in the fabric clock, DRAM in the memory clock, both as
fixed-point phase accumulators against the core clock, so skip-ahead advances them exactly as
stepping would.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import cache as CA
from archsim.engine import core as K
from archsim.engine import decode as D
from archsim.engine import dma as DM
from archsim.engine import dram as DR
from archsim.engine import execute as X
from archsim.engine import mpe as MPE
from archsim.engine import noc as NC
from archsim.engine import rma as RM
from archsim.engine.jit import njit
from archsim.engine.queues import (KIND_READ, KIND_WRITE, SPAN_SHIFT, Queues, Requests, make_queues, make_requests,
                                   n_spans, q_empty, q_full, q_peek, q_pop, q_push, req_alloc, req_free, span_bounds)

COPY_HIT, COPY_MISS = -2, -3   # src of a near copy's request to its home slice: the home has it / not
MIO_CAP = 8            # choice: memory instructions queued per SM between issue and the data pipe
TRACKERS = 512         # choice: loads / async copies in flight per SM (L1 MSHRs bound the misses)
DELAY_CAP = 512        # fixed-latency return pipelines (L1 hits per SM, L2 responses per slice)
HEADER_BYTES = 8       # request / response packet header on the fabric
RETRY_SPARE = 256      # a slice's DRAM retry entries beyond its MSHRs; it takes no new request while RETRY_SPARE - 8 wait
ONE = np.int64(1) << 32  # fixed point: one cycle of a clock domain

# MIO entry fields
(E_WARP, E_PC, E_CLS, E_MASK, E_BYTES, E_TRK, E_NLINES, E_IDX, E_STARTED, E_N) = range(10)
# tracker fields
TK_WARP, TK_DST, TK_NDST, TK_PENDING, TK_KIND, TK_GROUP, TK_T0, TK_N = range(8)
TRK_LOAD, TRK_CP = 0, 1
# cfg fields
(M_CORES, M_W, M_SLICES, M_HALVES, M_SPH, M_IL_HALF, M_IL_SLICE, M_L1_LAT, M_L2_LAT, M_FAR, M_SMEM_LAT,
 M_BANKS, M_BANK_W, M_L2_BPC, M_SECTOR, M_LINE, M_HAS_L1, M_HAS_L2, M_CHANNELS, M_FAB_RATIO, M_MEM_RATIO,
 M_Q_MISS, M_Q_L1D, M_Q_L2D, M_Q_RETRY, M_Q_FE, M_FE_LAT, M_GROUPED, M_GROUPS, M_SLICE_HASH, M_SPH_BITS,
 M_HALF_GRAN, M_Q_L2F, M_FILL_LINE, M_PRIV_SEG, M_PER_GROUP, M_REPL, M_Q_RFILL, M_N) = range(39)
# M_Q_L2D: per memory endpoint, the near-reply delay pipeline (L2 hits for SMs of the slice's own
# half, DRAM replies without an L2); M_Q_L2F: the far-reply one (SMs of the other half)
# M_REPL: l2.near_replicas (reads go to the mirror slice of the SM's own half); M_Q_RFILL: per slice,
# the copies its home slice sends, due after the home lookup and the crossing (fills in due order)
# M_PRIV_SEG: private placement (Sunway): the bytes of one private segment; a core of group g that
# addresses [0, M_PRIV_SEG) reaches the same offset in g's own segment (0: addresses are physical)
# M_GROUPED: the cores of a group share one fabric node (Sunway: a ring stop per core group), so
# replies are taken off the fabric per group and handed to their core or DMA engine
# clocks
CK_FAB_ACC, CK_MEM_ACC, CK_NOW_FAB, CK_NOW_MEM, CK_N = range(5)
# bytes moved per level
BY_L1, BY_SCRATCH, BY_L2, BY_DRAM_R, BY_DRAM_W, BY_FABRIC, BY_DMA, BY_RMA, BY_N = range(9)
# request tags of packets in flight below the L1
TAG_WRITE = -(1 << 30)   # a write: no answer expected
TAG_DMA = -(1 << 29)     # a DMA piece (aux0 = engine * DESC_CAP + descriptor slot); its write is acknowledged
# packets on the CPE mesh (addr = destination node, nbytes = payload; memory.py's _mesh_* functions)
TAG_BCAST = -(1 << 28)   # a broadcast piece hop to a cluster port (aux0 = its token: the piece's reply
                         # request, whose aux1 counts the hops still to land; src = destination cluster)
TAG_RMA_REQ = -(1 << 27)  # an RMA piece to its target CPE (kind WRITE: put data; READ: get request;
                          # aux0 = engine * RCAP + slot, src = engine)
TAG_RMA_RESP = -(1 << 26)  # its answer back to the engine (get data, put ack)
TAG_MPE_LAUNCH = -(1 << 25)  # an MPE's launch message to a CPE (addr = the CPE's node, src = group; mpe.py)
TAG_MPE_DONE = -(1 << 24)    # a CPE's completion to its MPE (a header; src = group)
# MState.mk: scalars: the CPE mesh's; MK_STORES: core stores not yet accepted by their memory-side
# endpoint (L2 slice, or the controller's queue without an L2): a launch ends when they are
# MK_CORE_ITEMS: MIO entries, L1 returns and misses queued at the cores, all cores together (when
# none is and replies come through the core groups, no core's memory side has anything to do);
# MState.citems counts them per span of cores (queues.SPAN: the scan looks only into spans that hold some)
MK_ON, MK_QUEUED, MK_CORES, MK_NODES, MK_NCL, MK_CCOLS, MK_PER_GROUP, MK_STORES, MK_CORE_ITEMS, MK_N = range(10)


class MState(NamedTuple):
    cfg: np.ndarray          # int64 [M_N]
    clocks: np.ndarray       # int64 [CK_N]
    Q: Queues                # internal queues (layout: see make_mstate)
    R: Requests
    mio: np.ndarray          # int64 [cores, MIO_CAP, E_N]
    mio_addr: np.ndarray     # int64 [cores, MIO_CAP, W]
    mio_lines: np.ndarray    # int64 [cores, MIO_CAP, 2W]
    mio_masks: np.ndarray    # int64 [cores, MIO_CAP, 2W]
    mio_full: np.ndarray     # int64 [cores, MIO_CAP, 2W]
    mio_head: np.ndarray     # int32 [cores]
    mio_count: np.ndarray    # int32 [cores]
    l1_full: np.ndarray      # int32 [cores] 1: the MIO head's L1 access found no MSHR or way free; it
                             # is tried again after the next fill of that L1
    mio_next: np.ndarray     # int64 [cores] the first cycle the data pipe takes the MIO head again (a
                             # scratchpad entry holds it for all its wavefronts: its last one then)
    trk: np.ndarray          # int64 [cores, TRACKERS, TK_N]
    trk_free: np.ndarray     # int32 [cores, TRACKERS]
    trk_nfree: np.ndarray    # int32 [cores]
    slice_busy: np.ndarray   # int64 [slices] fabric cycle the slice's data array is free again
    slice_hold: np.ndarray   # int32 [slices] request taken from the fabric, not accepted yet (-1)
    slice_full: np.ndarray   # int32 [slices] 1: the held request found no MSHR or way free; only a fill
                             # of the slice can change that, so it is tried again after one
    L1: CA.CacheState
    L2: CA.CacheState
    req: NC.NocState         # cores -> memory side
    resp: NC.NocState        # memory side -> cores
    node: np.ndarray         # int32 [4, max(cores, slices)]: req core, req mem, resp mem, resp core
    Dm: DR.DramState
    waiters: np.ndarray      # int32 scratch for mshr_waiters
    runs: np.ndarray         # int64 [2, 8] scratch: sector runs (first, length)
    bytes: np.ndarray        # int64 [BY_N]
    lat: np.ndarray          # int64 [4]: global load latency sum, count, min, max (issue -> data)
    fe_t: np.ndarray         # int64 [channels, front-end capacity]: fabric cycle each front-end slot leaves
    ep_pending: np.ndarray   # int64 [endpoints] no L2: accepted requests whose reply has not left yet
    dma: DM.DmaState         # DMA engines (none on a GPU)
    gnode: np.ndarray        # int32 [groups, 2] fabric node of each core group: req, resp (M_GROUPED)
    rma: RM.RmaState         # RMA engines (none on a GPU)
    mesh: NC.NocState        # the CPE meshes of all core groups (noc.make_cpe_meshes; a stub without one)
    obox: Queues             # per mesh node: packets waiting to enter the mesh (request ids)
    mpe: MPE.MpeState        # the MPEs' launch and join (inactive on a GPU)
    mk: np.ndarray           # int64 [MK_N]
    citems: np.ndarray       # int64 [n_spans(cores)] MK_CORE_ITEMS per span of cores


def _dummy_cache():
    return CA.make_cache_state(1, 128, 128, 32, 1, 1, 1)


def make_mstate(machine, TS, private: bool = False) -> MState:
    """The memory side of a launch. ``private``: each core group's addresses below one segment
    size are its own private segment (see ``placed_addr``); needs the segments address mapping."""
    from archsim.config import cores_total

    cores = cores_total(machine)
    W = machine.cores.warp_width
    l1 = CA.make_l1_state(machine)
    l2 = CA.make_l2_state(machine)
    fab = NC.make_fabric(machine)
    nmem = len(fab.mem_names)
    chans = machine.dram.channels
    qcap = DR.dram_queue_capacity(machine)
    Dm = DR.make_dram_state(machine, queue_cap=qcap)
    # queues: dram in [0,C), dram out [C,2C), per core miss [2C, 2C+cores), per core L1-hit delay,
    # per memory endpoint response delay (near), per memory endpoint DRAM retry, per channel
    # controller front end, per memory endpoint far-response delay
    q_miss = 2 * chans
    q_l1d = q_miss + cores
    q_l2d = q_l1d + cores
    q_retry = q_l2d + nmem
    q_fe = q_retry + nmem
    q_l2f = q_fe + chans
    q_rfill = q_l2f + nmem
    fe_lat = machine.memory_controllers.frontend_latency_cycles
    fe_cap = frontend_capacity(machine)
    # a slice's DRAM retry queue: every sector its MSHRs fetch (the home fetches for its mirrors'
    # misses come in without the accept gate of _slice_cycle) plus RETRY_SPARE for writebacks
    retry_cap = (machine.l2.mshrs if machine.l2 is not None else 0) + RETRY_SPARE
    caps = [qcap] * chans + [DR.dram_queue_capacity(machine) * 4] * chans + [64] * cores + [DELAY_CAP] * cores \
        + [DELAY_CAP] * nmem + [retry_cap] * nmem + [fe_cap] * chans + [DELAY_CAP] * nmem
    # a slice has at most one copy in flight per sector its MSHRs fetch
    rfill_cap = 4 * machine.l2.mshrs + 64 if (machine.l2 is not None and machine.l2.near_replicas) else 1
    caps += [rfill_cap] * nmem
    Q = make_queues(caps)
    l1c, l2c = machine.l1, machine.l2
    sc = machine.scratchpad
    cfg = np.zeros(M_N, np.int64)
    cfg[M_CORES] = cores
    cfg[M_W] = W
    cfg[M_SLICES] = nmem
    cfg[M_HALVES] = l2c.halves if l2c else 1
    cfg[M_SPH] = nmem // (l2c.halves if l2c else 1)
    cfg[M_IL_HALF] = l2c.interleave_bytes if l2c else 1 << 62
    cfg[M_IL_SLICE] = machine.memory_controllers.address_mapping.interleave_bytes
    cfg[M_L1_LAT] = l1c.hit_latency_cycles if l1c else sc.latency_cycles
    cfg[M_L2_LAT] = l2c.hit_latency_cycles if l2c else 0
    cfg[M_FAR] = l2c.far_half_extra_cycles if l2c else 0
    cfg[M_SMEM_LAT] = sc.latency_cycles
    cfg[M_BANKS] = sc.banks
    cfg[M_BANK_W] = sc.bank_width_bytes
    cfg[M_L2_BPC] = l2c.bytes_per_cycle if l2c else 1 << 20
    cfg[M_SECTOR] = l1c.sector_bytes if l1c else (l2c.sector_bytes if l2c else 32)
    cfg[M_LINE] = l1c.line_bytes if l1c else (l2c.line_bytes if l2c else 128)
    if l1c is None and l1 is not None:        # a CPE's LDM cache: whole lines filled on a miss
        cfg[M_SECTOR] = CA.LDM_CACHE_SECTOR
        cfg[M_LINE] = sc.cache_line_bytes
        cfg[M_FILL_LINE] = 1
    cfg[M_HAS_L1] = int(l1 is not None)
    cfg[M_HAS_L2] = int(l2 is not None)
    cfg[M_CHANNELS] = chans
    cfg[M_FAB_RATIO] = int(round(machine.clock_ratios.fabric * ONE))
    cfg[M_MEM_RATIO] = int(round(machine.clock_ratios.memory * ONE))
    cfg[M_Q_MISS], cfg[M_Q_L1D], cfg[M_Q_L2D], cfg[M_Q_RETRY] = q_miss, q_l1d, q_l2d, q_retry
    cfg[M_Q_FE], cfg[M_FE_LAT] = q_fe, fe_lat
    cfg[M_Q_L2F] = q_l2f
    cfg[M_Q_RFILL] = q_rfill
    cfg[M_REPL] = int(l2c is not None and l2c.near_replicas and l2c.halves > 1)
    cfg[M_SLICE_HASH] = int(l2c is not None and l2c.slice_indexing == "hashed")
    cfg[M_SPH_BITS] = max(1, (int(cfg[M_SPH]) - 1).bit_length())
    il_h, il_s = int(cfg[M_IL_HALF]), int(cfg[M_IL_SLICE])
    cfg[M_HALF_GRAN] = il_h // il_s if (l2c is not None and l2c.halves > 1 and il_h % il_s == 0) else 0
    if private:
        seg = DR.segment_bytes(machine)
        if seg <= 0:
            raise ValueError(f"{machine.name}: private placement needs the segments address mapping")
        cfg[M_PRIV_SEG] = seg
    cfg[M_PER_GROUP] = machine.cores.per_group
    nodes = np.full((4, max(cores, nmem)), -1, np.int32)
    grouped = len(fab.req_core) != cores  # Sunway: one fabric node per core group
    core_node = np.arange(cores) // machine.cores.per_group if grouped else np.arange(cores)
    nodes[0, :cores] = fab.req_core[core_node]
    nodes[1, :nmem] = fab.req_mem
    nodes[2, :nmem] = fab.resp_mem
    nodes[3, :cores] = fab.resp_core[core_node]
    cfg[M_GROUPED] = int(grouped)
    cfg[M_GROUPS] = len(fab.req_core) if grouped else 0
    gnode = np.stack([fab.req_core, fab.resp_core], axis=1).astype(np.int32) if grouped else \
        np.full((1, 2), -1, np.int32)
    dma = DM.make_dma_state(machine, TS.wst if TS is not None else None)
    rma = RM.make_rma_state(machine)
    mk = np.zeros(MK_N, np.int64)
    mpe = MPE.make_mpe_state(machine, machine.cores.subcores)
    n_mpe = machine.groups if mpe.cfg[MPE.MC_GROUPS] > 0 else 0
    if machine.rma is not None and machine.mesh is not None:
        mesh = NC.make_cpe_meshes(machine)
        m = machine.mesh
        ncl = (m.rows // m.cluster_rows) * (m.cols // m.cluster_cols)
        mk[MK_ON], mk[MK_CORES], mk[MK_NODES] = 1, cores, cores + machine.groups * ncl + n_mpe
        mk[MK_NCL], mk[MK_CCOLS], mk[MK_PER_GROUP] = ncl, m.cols // m.cluster_cols, machine.cores.per_group
        # outboxes never refuse (a node must always take what the mesh delivers to it): a CPE answers
        # at most every RMA piece of its group in flight; a cluster port sends its own RMA pieces and
        # up to 4 hops for every broadcast piece of its group in flight
        rma_fly = ncl * machine.rma.engines_per_cluster * machine.rma.max_inflight
        dma_fly = ncl * machine.dma.engines_per_cluster * machine.dma.max_inflight if machine.dma is not None else 0
        # (+ a CPE's completion to its MPE; an MPE port holds at most its group's launch messages)
        obox = make_queues([rma_fly + 9] * cores + [4 * dma_fly + rma_fly + 8] * (machine.groups * ncl)
                           + [machine.cores.per_group + 8] * n_mpe)
        mesh_reqs = int(rma.cfg[RM.RC_ENGINES]) * machine.rma.max_inflight + \
            int(dma.cfg[DM.DC_ENGINES]) * (machine.dma.max_inflight * ncl if machine.dma is not None else 0) + \
            2 * cores * int(n_mpe > 0)  # a launch message and a completion per CPE
    else:
        mesh = NC.make_mesh(1, 1, 8, 1, 1)
        obox = make_queues([1])
        mesh_reqs = 0
    trk_free = np.tile(np.arange(TRACKERS - 1, -1, -1, dtype=np.int32), (cores, 1))
    l2_mshrs = l2c.mshrs if l2c else 0
    nreq = cores * (TRACKERS + 128) + nmem * ((6 if cfg[M_REPL] else 2) * l2_mshrs + 2 * 256 + 64) + 4096 + \
        int(dma.cfg[DM.DC_ENGINES]) * (machine.dma.max_inflight + 1 if machine.dma is not None else 0) + mesh_reqs
    lat = np.zeros(4, np.int64)
    lat[2] = 1 << 62
    return MState(
        cfg=cfg, clocks=np.zeros(CK_N, np.int64), Q=Q, R=make_requests(nreq),
        mio=np.zeros((cores, MIO_CAP, E_N), np.int64), mio_addr=np.zeros((cores, MIO_CAP, W), np.int64),
        mio_lines=np.zeros((cores, MIO_CAP, 2 * W), np.int64), mio_masks=np.zeros((cores, MIO_CAP, 2 * W), np.int64),
        mio_full=np.zeros((cores, MIO_CAP, 2 * W), np.int64), mio_head=np.zeros(cores, np.int32),
        mio_count=np.zeros(cores, np.int32), mio_next=np.zeros(cores, np.int64), l1_full=np.zeros(cores, np.int32),
        trk=np.zeros((cores, TRACKERS, TK_N), np.int64), trk_free=trk_free,
        trk_nfree=np.full(cores, TRACKERS, np.int32), slice_busy=np.zeros(nmem, np.int64),
        slice_hold=np.full(nmem, -1, np.int32), slice_full=np.zeros(nmem, np.int32),
        L1=l1 if l1 is not None else _dummy_cache(), L2=l2 if l2 is not None else _dummy_cache(),
        req=fab.req, resp=fab.resp, node=nodes, Dm=Dm, waiters=np.zeros(64, np.int32), runs=np.zeros((2, 8), np.int64),
        bytes=np.zeros(BY_N, np.int64), lat=lat, fe_t=np.zeros((chans, fe_cap), np.int64), ep_pending=np.zeros(nmem, np.int64), dma=dma,
        gnode=gnode, rma=rma, mesh=mesh, obox=obox, mpe=mpe, mk=mk, citems=np.zeros(n_spans(cores), np.int64))


def frontend_capacity(machine) -> int:
    """Slots of one channel's controller front end: a pipeline of frontend_latency_cycles that
    never limits throughput, so it holds what the channel can take in that time at its peak rate
    in sector-sized requests (at least one slot)."""
    lat = machine.memory_controllers.frontend_latency_cycles
    sector = machine.l2.sector_bytes if machine.l2 is not None else 32
    fab_ghz = machine.clock_ghz * machine.clock_ratios.fabric
    per_cycle = machine.dram.channel_gbps / fab_ghz / sector    # requests per fabric cycle at peak
    return max(1, int(np.ceil(lat * per_cycle)) + 1)


# ----------------------------------------------------------------------------- helpers
@njit(cache=True)
def placed_addr(cfg, core, addr):
    """The physical address of global address `addr` issued by `core`. Private placement (Sunway,
    M_PRIV_SEG > 0): each core group runs as its own process whose buffers sit at the same offsets
    of its own private segment (inputs replicated or sharded per group, the usual one-rank-per-CG
    layout), so an address below the segment size lands in the issuing group's segment; other
    addresses (the cross segment) and every address under the cross placement are physical."""
    seg = cfg[M_PRIV_SEG]
    if seg > 0 and addr < seg:
        return addr + (core // cfg[M_PER_GROUP]) * seg
    return addr


@njit(cache=True)
def _slice_of(MS, addr):
    """The memory-side endpoint of an address: its L2 slice, or without an L2 the controller of
    its DRAM channel."""
    cfg = MS.cfg
    if cfg[M_HAS_L2] == 0:
        c, _, _, _ = DR.dram_map(MS.Dm, addr)
        return c // (cfg[M_CHANNELS] // cfg[M_SLICES])
    half = (addr // cfg[M_IL_HALF]) % cfg[M_HALVES]
    sph = cfg[M_SPH]
    if cfg[M_SLICE_HASH] == 0:
        return half * sph + (addr // cfg[M_IL_SLICE]) % sph
    # hashed: number the half's own granules consecutively (the granules of a half-interleave
    # chunk, then those of the half's next chunk), then permute each group of sph of them
    g = cfg[M_HALF_GRAN]
    if g > 0:
        ilh = cfg[M_IL_HALF]
        q = addr // (ilh * cfg[M_HALVES]) * g + (addr % ilh) // cfg[M_IL_SLICE]
    else:
        q = addr // cfg[M_IL_SLICE]
    return half * sph + hashed_slice(q, sph, cfg[M_SPH_BITS])


@njit(cache=True)
def hashed_slice(q, sph, bits):
    """Slice within a half of interleave granule q (l2.slice_indexing: hashed): q's position in
    its group of sph consecutive granules, XORed (sph a power of two) or added modulo sph (other
    sph) with the XOR fold of the group number in `bits`-bit pieces. Each group of sph granules
    still covers every slice once (sequential streams stay balanced), and granules sph apart,
    or any power-of-two stride, land on different slices."""
    lo = q % sph
    x = q // sph
    mask = (np.int64(1) << bits) - 1
    h = np.int64(0)
    while x > 0:
        h ^= x & mask
        x >>= bits
    if sph & (sph - 1) == 0:
        return lo ^ (h & (sph - 1))
    return (lo + h) % sph


@njit(cache=True)
def _mirror(MS, sl, half):
    """The slice of ``half`` that keeps copies of home slice sl's lines."""
    sph = MS.cfg[M_SPH]
    return half * sph + sl % sph


@njit(cache=True)
def _dest_slice(MS, core, r):
    """Where a core's request goes: the home slice of its address; with near replicas a read goes
    to the home's mirror in the core's own half."""
    sl = _slice_of(MS, MS.R.addr[r])
    cfg = MS.cfg
    if cfg[M_REPL] and MS.R.kind[r] != KIND_WRITE:
        half = core % cfg[M_HALVES]
        if sl // cfg[M_SPH] != half:
            return _mirror(MS, sl, half)
    return sl


@njit(cache=True)
def _far(MS, core, sl):
    cfg = MS.cfg
    if cfg[M_HALVES] <= 1:
        return 0
    return 1 if (sl // cfg[M_SPH]) != (core % cfg[M_HALVES]) else 0


@njit(cache=True)
def _trk_done(MS, TS, core, t, now):
    """A tracker's last piece arrived: its registers (a load) or its cp.async group (a copy)."""
    w = MS.trk[core, t, TK_WARP]
    if MS.trk[core, t, TK_KIND] == TRK_LOAD:
        d = MS.trk[core, t, TK_DST]
        for j in range(MS.trk[core, t, TK_NDST]):
            TS.reg_ready[w, d + j] = now
        lat = now - MS.trk[core, t, TK_T0]
        MS.lat[0] += lat
        MS.lat[1] += 1
        if lat < MS.lat[2]:
            MS.lat[2] = lat
        if lat > MS.lat[3]:
            MS.lat[3] = lat
        K.wake_warp_regs(TS, w, now)  # its scheduler looks again if it waits on them
    else:
        g = MS.trk[core, t, TK_GROUP]
        TS.cp_pending[w, g % K.CP_GROUPS] -= 1
        if TS.wst[w] == K.T_CPWAIT or (TS.mem_wait[core] >> min(K.subcore_of(TS, w), 62)) & 1:
            # a finished copy group matters to a warp waiting on its groups (a running warp checks
            # them when its cp.async.wait issues) and the freed tracker to a warp of its sub-core
            # refused for want of one: with neither, its scheduler would find what it found before
            K.wake_warp(TS, w, now)
    n = MS.trk_nfree[core]
    MS.trk_free[core, n] = t
    MS.trk_nfree[core] = n + 1


@njit(cache=True)
def _trk_piece(MS, TS, core, t, now):
    MS.trk[core, t, TK_PENDING] -= 1
    if MS.trk[core, t, TK_PENDING] == 0:
        _trk_done(MS, TS, core, t, now)


# ----------------------------------------------------------------------------- issue side
_MEM_CLASSES = (D.CLS_LD_GLOBAL, D.CLS_ST_GLOBAL, D.CLS_LD_SHARED, D.CLS_ST_SHARED, D.CLS_LDMATRIX, D.CLS_CPASYNC)


@njit(cache=True)
def mem_can_issue(MS, TS, S, Dd, core, w, pc, now):
    cls = Dd.cls[pc]
    if cls == D.CLS_LD_GLOBAL or cls == D.CLS_ST_GLOBAL or cls == D.CLS_LD_SHARED or cls == D.CLS_ST_SHARED \
            or cls == D.CLS_LDMATRIX or cls == D.CLS_CPASYNC:
        if MS.mio_count[core] >= MIO_CAP:
            return False
        if (cls == D.CLS_LD_GLOBAL or cls == D.CLS_CPASYNC) and MS.trk_nfree[core] == 0:
            return False
    elif cls == D.CLS_DMA or cls == D.CLS_DMA_PUT:
        return DM.dma_can_issue(MS.dma, core, Dd.bcast[pc])  # the engine's descriptor FIFO has room
    elif cls == D.CLS_RMA or cls == D.CLS_RMA_PUT:
        return RM.rma_can_issue(MS.rma, core)
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
                X._fault(S, X.F_BCAST, _lowest_lane(mask), first, S.addr[w, 2], pc)
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
            X._fault(S, X.F_RMA_GROUP, S.addr[w, 4], blk, n, pc)
            return 1
        RM.rma_issue(MS.rma, TS, w, core, cls == D.CLS_RMA_PUT, target, n, now)
        return 0
    if not (cls == D.CLS_LD_GLOBAL or cls == D.CLS_ST_GLOBAL or cls == D.CLS_LD_SHARED or cls == D.CLS_ST_SHARED
            or cls == D.CLS_LDMATRIX or cls == D.CLS_CPASYNC):
        return 0
    i = MS.mio_head[core] + MS.mio_count[core]
    if i >= MIO_CAP:
        i -= MIO_CAP
    MS.mio_count[core] += 1
    _items(MS, core, 1)
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
        TS.reg_ready[w, r] = K.INF
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
            TS.cp_pending[w, TS.cp_open[w] % K.CP_GROUPS] += 1
    return 0


# ----------------------------------------------------------------------------- the SM side
@njit(cache=True)
def _response(MS, TS, core, r, now):
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
                _core_push(MS, core, q, rr)
            CA.mshr_free(MS.L1, core, e)
    else:
        R.tag[r] = -1 - tag
        R.aux1[r] = now + MS.cfg[M_L1_LAT]
        _core_push(MS, core, q, r)


@njit(inline="always")
def _items(MS, core, d):
    """The items queued at a core's memory side change by d (MK_CORE_ITEMS, citems)."""
    MS.mk[MK_CORE_ITEMS] += d
    MS.citems[core >> SPAN_SHIFT] += d


@njit(inline="always")
def _core_push(MS, core, q, r):
    """Push request r on the core's L1-return or miss queue q, counted in MK_CORE_ITEMS."""
    if q_push(MS.Q, q, r):
        _items(MS, core, 1)


@njit(inline="always")
def _core_pop(MS, core, q):
    """Pop the head of the core's L1-return or miss queue q, counted in MK_CORE_ITEMS (_core_push's twin)."""
    _items(MS, core, -1)
    return q_pop(MS.Q, q)


@njit(cache=True)
def _pop_mio(MS, core):
    h = MS.mio_head[core] + 1
    if h >= MIO_CAP:
        h = 0
    MS.mio_head[core] = h
    MS.mio_count[core] -= 1
    _items(MS, core, -1)


@njit(cache=True)
def _runs(mask, out_first, out_len):
    """Contiguous runs of set bits of a sector mask."""
    n = 0
    i = 0
    while mask >> i:
        if (mask >> i) & 1:
            j = i
            while (mask >> j) & 1:
                j += 1
            out_first[n] = i
            out_len[n] = j - i
            n += 1
            i = j
        else:
            i += 1
    return n


@njit(cache=True)
def _data_pipe(MS, TS, S, Dd, core, now):
    """One wavefront of the oldest MIO entry through the L1 / shared-memory data pipe."""
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
                return
        if cls != D.CLS_ST_SHARED:
            for j in range(Dd.nwr[pc]):
                TS.reg_ready[w, Dd.wr[pc, j]] = now + cfg[M_SMEM_LAT] - 1
            K.wake_warp_regs(TS, w, now)  # a warp waiting on them learns the ready cycle
        _pop_mio(MS, core)
        return
    if e[E_STARTED] == 0:
        full = MS.mio_full[core, i]
        n = CA.coalesce(MS.mio_addr[core, i], e[E_MASK], e[E_BYTES], cfg[M_SECTOR], cfg[M_LINE],
                        MS.mio_lines[core, i], MS.mio_masks[core, i], full)
        e[E_NLINES] = n
        e[E_STARTED] = 1
        t = e[E_TRK]
        if t >= 0:
            MS.trk[core, t, TK_PENDING] = n
            if n == 0:
                _trk_done(MS, TS, core, t, now)
        if n == 0:
            _pop_mio(MS, core)
            return
    k = e[E_IDX]
    line = placed_addr(cfg, core, MS.mio_lines[core, i, k])
    m = MS.mio_masks[core, i, k]
    sb = cfg[M_SECTOR]
    qm = cfg[M_Q_MISS] + core
    ql = cfg[M_Q_L1D] + core
    if MS.Q.count[qm] >= MS.Q.cap[qm] - 2 or MS.Q.count[ql] >= MS.Q.cap[ql] - 2 or R.nfree[0] < 4:
        return  # the miss or return path is backed up: retry next cycle
    t = e[E_TRK]
    if cls == D.CLS_LD_GLOBAL and cfg[M_HAS_L1]:
        r = req_alloc(R, line, CA.popcount(m) * sb, KIND_READ, core, t, now)
        if r < 0:
            return
        R.aux0[r] = m
        am = m
        if cfg[M_FILL_LINE]:  # an LDM cache fills (and waits for) the whole line
            am = (np.int64(1) << (cfg[M_LINE] // sb)) - 1
        status, newm = CA.cache_access_mask(MS.L1, core, line, am, np.int64(0), False, r, now)
        if status == CA.RESERVATION_FAIL:
            req_free(R, r)
            MS.l1_full[core] = 1
            return
        if status == CA.HIT:
            R.aux1[r] = now + cfg[M_L1_LAT]
            _core_push(MS, core, ql, r)
        elif newm != 0:
            r2 = req_alloc(R, line, CA.popcount(newm) * sb, KIND_READ, core, 0, now)
            R.aux0[r2] = newm
            _core_push(MS, core, qm, r2)
    elif cls == D.CLS_ST_GLOBAL:
        r = req_alloc(R, line, CA.popcount(m) * sb, KIND_WRITE, core, TAG_WRITE, now)
        if r < 0:
            return
        MS.mk[MK_STORES] += 1
        R.aux0[r] = m
        R.aux1[r] = MS.mio_full[core, i, k]
        if cfg[M_HAS_L1]:
            CA.cache_access_mask(MS.L1, core, line, m, MS.mio_full[core, i, k], True, r, now)
        _core_push(MS, core, qm, r)
    else:  # a read that bypasses the L1: cp.async (.cg) or a machine without an L1 cache
        r = req_alloc(R, line, CA.popcount(m) * sb, KIND_READ, core, -1 - t, now)
        if r < 0:
            return
        R.aux0[r] = m
        _core_push(MS, core, qm, r)
    MS.bytes[BY_L1] += CA.popcount(m) * sb
    k += 1
    e[E_IDX] = k
    if k == e[E_NLINES]:
        _pop_mio(MS, core)


@njit(cache=True)
def _core_memory(MS, TS, S, Dd, core, now):
    cfg = MS.cfg
    R = MS.R
    Q = MS.Q
    node = MS.node[3, core]
    mio0 = MS.mio_count[core]
    trk0 = MS.trk_nfree[core]
    while cfg[M_GROUPED] == 0:  # grouped: _group_replies took them off the fabric
        r = NC.noc_eject(MS.resp, node)
        if r < 0:
            break
        _response(MS, TS, core, r, now)
    q = cfg[M_Q_L1D] + core
    while Q.count[q] > 0 and R.aux1[q_peek(Q, q, 0)] <= now:
        r = _core_pop(MS, core, q)
        t = R.tag[r]
        req_free(R, r)
        _trk_piece(MS, TS, core, t, now)
    if _pipe_takes_head(MS, core, now):
        _data_pipe(MS, TS, S, Dd, core, now)
    if TS.mem_wait[core] and (MS.mio_count[core] < mio0 or MS.trk_nfree[core] > trk0):
        K.wake_refused(TS, core, now)  # a warp refused for a full MIO queue or no tracker may go now
    q = cfg[M_Q_MISS] + core
    now_f = MS.clocks[CK_NOW_FAB]
    while Q.count[q] > 0:
        r = q_peek(Q, q, 0)
        nbytes = HEADER_BYTES + (R.nbytes[r] if R.kind[r] == KIND_WRITE else 0)
        dest = MS.node[1, _dest_slice(MS, core, r)]
        if not NC.noc_inject(MS.req, MS.node[0, core], r, nbytes, dest, now_f):
            break
        MS.bytes[BY_FABRIC] += nbytes
        _core_pop(MS, core, q)


# ----------------------------------------------------------------------------- the memory side
@njit(cache=True)
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
def _frontend(MS, c, now):
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
    n = _runs(mask, first, ln)
    for j in range(n):
        rd = req_alloc(MS.R, line + first[j] * sb, ln[j] * sb, kind, -1, tag, now)
        MS.R.aux0[rd] = ((np.int64(1) << ln[j]) - 1) << first[j]
        if not _to_dram(MS, rd) and not q_push(MS.Q, MS.cfg[M_Q_RETRY] + sl, rd):
            raise RuntimeError("DRAM retry queue full")   # sized for every sector the MSHRs can fetch


@njit(cache=True)
def _fetch(MS, sl, line, mask, now):
    """DRAM reads for the sectors of a line missing in slice sl; the fill goes back to sl."""
    _to_dram_runs(MS, sl, line, mask, KIND_READ, sl, now)


@njit(cache=True)
def _fetch_copy(MS, sl, home, line, mask, now):
    """Sectors `mask` of a line missing in slice sl, which mirrors home slice `home`. The request
    crosses to the home and back (hit_latency_cycles + far_half_extra_cycles, lumped before its
    answer): the home's copy when it holds every sector, else a DRAM read issued then, whose fill
    goes to sl and to the home (_dram_done)."""
    v = CA.cache_probe(MS.L2, home, line)
    hit = v >= 0 and (mask & ~v) == 0
    nb = CA.popcount(mask) * MS.cfg[M_SECTOR]
    rd = req_alloc(MS.R, line, nb, KIND_READ, COPY_HIT if hit else COPY_MISS, sl, now)
    MS.R.aux0[rd] = mask
    MS.R.aux1[rd] = now + MS.cfg[M_L2_LAT] + MS.cfg[M_FAR]
    if not q_push(MS.Q, MS.cfg[M_Q_RFILL] + sl, rd):   # sized for every sector the MSHRs can fetch
        raise RuntimeError("near-copy queue full")
    if hit:
        CA.cache_touch(MS.L2, home, line)
        MS.bytes[BY_L2] += nb


@njit(cache=True)
def _drop_copies(MS, sl, line):
    """A write reached home slice sl: the other halves' copies of the line are stale."""
    cfg = MS.cfg
    own = sl // cfg[M_SPH]
    for h in range(cfg[M_HALVES]):
        if h != own:
            CA.cache_drop(MS.L2, _mirror(MS, sl, h), line)


@njit(cache=True)
def _fill_slice(MS, sl, line, mask, now):
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
        else:
            _respond_l2(MS, sl, rr, now)
    CA.mshr_free(MS.L2, sl, e)


@njit(cache=True)
def _writeback(MS, sl, now):
    """Write the dirty victim the last L2 access or fill of slice sl evicted back to DRAM."""
    dirty = MS.L2.evict_dirty[sl]
    if dirty == 0:
        return
    _to_dram_runs(MS, sl, MS.L2.evict_addr[sl], dirty, KIND_WRITE, TAG_WRITE, now)
    MS.L2.evict_dirty[sl] = 0


@njit(cache=True)
def _respond(MS, sl, r, ready):
    MS.R.aux1[r] = ready
    q_push(MS.Q, MS.cfg[M_Q_L2D] + sl, r)


@njit(cache=True)
def _respond_l2(MS, sl, r, now):
    """An L2 slice answers read r: after the slice pipeline for an SM of its own half (the near
    pipeline), plus far_half_extra_cycles for an SM of the other half (the far pipeline). Each
    pipeline is a FIFO of one fixed latency, so its ready cycles never decrease."""
    cfg = MS.cfg
    if _far(MS, MS.R.src[r], sl):
        MS.R.aux1[r] = now + cfg[M_L2_LAT] + cfg[M_FAR]
        q_push(MS.Q, cfg[M_Q_L2F] + sl, r)
    else:
        MS.R.aux1[r] = now + cfg[M_L2_LAT]
        q_push(MS.Q, cfg[M_Q_L2D] + sl, r)


@njit(cache=True)
def _slice_cycle(MS, sl, now):
    """One fabric cycle of L2 slice (or, without an L2, memory endpoint) sl."""
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
        nbytes = HEADER_BYTES + (R.nbytes[r] if R.kind[r] != KIND_WRITE else 0)  # a write's ack: a header
        if not NC.noc_inject(MS.resp, MS.node[2, sl], r, nbytes, MS.node[3, R.src[r]], now):
            break
        MS.bytes[BY_FABRIC] += nbytes
        q_pop(Q, q)
        if cfg[M_HAS_L2] == 0:
            MS.ep_pending[sl] -= 1
    # copies from the home slice whose lookup and crossing have passed (or the DRAM read the home
    # sends for a line it lacks)
    q = cfg[M_Q_RFILL] + sl
    while Q.count[q] > 0 and R.aux1[q_peek(Q, q, 0)] <= now:
        rd = q_pop(Q, q)
        if R.src[rd] == COPY_HIT:
            _fill_slice(MS, sl, R.addr[rd], R.aux0[rd], now)
        else:
            _fetch(MS, sl, R.addr[rd], R.aux0[rd], now)
        req_free(R, rd)
    # DRAM requests that found their channel queue full
    q = cfg[M_Q_RETRY] + sl
    while Q.count[q] > 0:
        if not _to_dram(MS, q_peek(Q, q, 0)):
            break
        q_pop(Q, q)
    # one new request per cycle when the data array is free
    if MS.slice_busy[sl] > now:
        return
    if MS.slice_hold[sl] < 0:
        MS.slice_hold[sl] = NC.noc_eject(MS.req, MS.node[1, sl])
    r = MS.slice_hold[sl]
    if r < 0:
        return
    if Q.count[cfg[M_Q_RETRY] + sl] >= RETRY_SPARE - 8 or Q.count[qn] >= Q.cap[qn] - 8 \
            or Q.count[qf] >= Q.cap[qf] - 8:
        return
    line = R.addr[r]
    is_write = R.kind[r] == KIND_WRITE
    if cfg[M_HAS_L2] == 0:
        # a reply must never be refused: accept a request that will be answered (a read, an
        # acknowledged DMA write) only while the reply queue could hold every accepted one
        answered = R.kind[r] != KIND_WRITE or R.tag[r] == TAG_DMA
        if answered and MS.ep_pending[sl] >= Q.cap[cfg[M_Q_L2D] + sl]:
            return
        if not _to_dram(MS, r):
            return
        if answered:
            MS.ep_pending[sl] += 1
        elif R.tag[r] == TAG_WRITE:
            MS.mk[MK_STORES] -= 1             # a core's store reached its controller
        MS.slice_hold[sl] = -1
        return
    if MS.slice_full[sl]:
        return
    full = R.aux1[r] if is_write else np.int64(0)
    status, newm = CA.cache_access_mask(MS.L2, sl, line, R.aux0[r], full, is_write, r, now)
    if status == CA.RESERVATION_FAIL:
        MS.slice_full[sl] = 1
        return
    MS.slice_hold[sl] = -1
    if is_write and R.tag[r] == TAG_WRITE:
        MS.mk[MK_STORES] -= 1                 # a core's store reached the L2 (the point of coherence)
    if is_write and cfg[M_REPL]:
        _drop_copies(MS, sl, line)
    bpc = cfg[M_L2_BPC]
    MS.slice_busy[sl] = now + (R.nbytes[r] + bpc - 1) // bpc
    MS.bytes[BY_L2] += R.nbytes[r]
    _writeback(MS, sl, now)
    if status == CA.HIT:
        if is_write:
            req_free(R, r)
        else:
            _respond_l2(MS, sl, r, now)
    elif newm != 0:
        la = line & ~(cfg[M_LINE] - 1)
        home = _slice_of(MS, la) if cfg[M_REPL] else sl
        if home != sl:
            _fetch_copy(MS, sl, home, la, newm, now)
        else:
            _fetch(MS, sl, la, newm, now)


@njit(cache=True)
def _dram_done(MS, c, now):
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
                _respond(MS, _slice_of(MS, R.addr[rd]), rd, now)
            else:
                req_free(R, rd)
            continue
        MS.bytes[BY_DRAM_R] += R.nbytes[rd]
        if cfg[M_HAS_L2] == 0:
            # no L2: the request itself goes back from its memory endpoint
            sl = _slice_of(MS, R.addr[rd])
            _respond(MS, sl, rd, now)
            continue
        sl = R.tag[rd]
        line = R.addr[rd] & ~(cfg[M_LINE] - 1)
        mask = R.aux0[rd]
        req_free(R, rd)
        _fill_slice(MS, sl, line, mask, now)
        if cfg[M_REPL]:
            home = _slice_of(MS, line)
            if home != sl:                    # a copy's miss in DRAM: the home keeps the line too
                _fill_slice(MS, home, line, mask, now)


@njit(cache=True)
def _group_replies(MS, TS, g, now):
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
            e = a // DM.DESC_CAP
            slot = a % DM.DESC_CAP
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
            _response(MS, TS, R.src[r], r, now)


@njit(cache=True)
def _dma_send(MS, e, r, now_f):
    """Put DMA piece request r of engine e on the request ring at its group's stop; a refused one
    is held and retried next cycle (back-pressure)."""
    R = MS.R
    nbytes = HEADER_BYTES + (R.nbytes[r] if R.kind[r] == KIND_WRITE else 0)
    dest = MS.node[1, _slice_of(MS, R.addr[r])]
    if NC.noc_inject(MS.req, MS.gnode[MS.dma.engine_group[e], 0], r, nbytes, dest, now_f):
        MS.bytes[BY_FABRIC] += nbytes
        MS.dma.eng[e, DM.EN_HOLD] = -1
        return True
    MS.dma.eng[e, DM.EN_HOLD] = r
    return False


@njit(cache=True)
def _dma_engines(MS, TS, now):
    """One core cycle of every DMA engine: retry a piece the ring refused, then send the pieces
    the port, the in-flight limit and the descriptors' start-up allow. Engines are looked at span
    by span (DmaState.espan: the earliest cycle one of the span may send; a descriptor queued or a
    piece back sets it to 0)."""
    DMs = MS.dma
    R = MS.R
    now_f = MS.clocks[CK_NOW_FAB]
    ne = DMs.cfg[DM.DC_ENGINES]
    for j in range(DMs.espan.shape[0]):
        if DMs.espan[j] > now:
            continue
        t = K.INF
        lo, hi = span_bounds(j, ne)
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
                R.aux0[r] = e * DM.DESC_CAP + slot
                DM.dma_piece_sent(DMs, e, slot, n, now)
                if not _dma_send(MS, e, r, now_f):
                    break             # held: retried next cycle
            t = min(t, now + 1 if en[DM.EN_HOLD] >= 0 else en[DM.EN_WAKE])
        DMs.espan[j] = t


# ----------------------------------------------------------------------------- the CPE mesh
@njit(cache=True)
def _obox_push(MS, node, r):
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
    _obox_push(MS, base + src_cl, r)


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
    DM.dma_piece_done(MS.dma, TS, a // DM.DESC_CAP, a % DM.DESC_CAP, n, now)


@njit(inline="always")
def _mesh_wire_bytes(R, r):
    """Bytes a mesh packet puts on the links: a header, plus data where it carries some."""
    t = R.tag[r]
    if t == TAG_BCAST or (t == TAG_RMA_REQ and R.kind[r] == KIND_WRITE) or \
            (t == TAG_RMA_RESP and R.kind[r] == KIND_READ) or t == TAG_MPE_LAUNCH:
        return HEADER_BYTES + R.nbytes[r]
    return HEADER_BYTES


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
        e = a // DM.DESC_CAP
        slot = a % DM.DESC_CAP
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
        _obox_push(MS, node, r)
    else:  # TAG_RMA_RESP at the engine's port
        a = R.aux0[r]
        n = R.nbytes[r]
        req_free(R, r)
        MS.bytes[BY_RMA] += n
        RM.rma_piece_done(MS.rma, TS, a // RM.RCAP, a % RM.RCAP, n, now)


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
            R.aux0[r] = e * RM.RCAP + slot
            RM.rma_piece_sent(RMs, e, slot, n, now)
            _obox_push(MS, node, r)


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
            _obox_push(MS, node, r)
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
    _obox_push(MS, core, r)  # the request table holds one completion per CPE (make_mstate)


@njit(cache=True)
def _mesh_cycle(MS, TS, now):
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
                if not NC.noc_inject(N, node, r, _mesh_wire_bytes(R, r), R.addr[r], now):
                    break
                q_pop(Q, node)
                MS.mk[MK_QUEUED] -= 1
    if not NC.noc_idle(N):
        NC.noc_step(N, now)


@njit(cache=True)
def _mesh_next_event(MS, now):
    """The next core cycle at which the mesh or the RMA engines can change anything (K.INF)."""
    t = RM.rma_next_event(MS.rma, now) if MS.rma.cfg[RM.RC_ENGINES] > 0 else K.INF
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
    while ck[CK_FAB_ACC] >= ONE:
        nf = ck[CK_NOW_FAB]
        Q = MS.Q
        for c in range(C):          # only channels with something queued (a call costs more than the test)
            if Q.count[C + c] > 0:
                _dram_done(MS, c, nf)
            if cfg[M_FE_LAT] > 0 and Q.count[cfg[M_Q_FE] + c] > 0:
                _frontend(MS, c, nf)
        for sl in range(cfg[M_SLICES]):
            if _slice_has_work(MS, sl, nf):  # a call passes the whole state: skip idle slices
                _slice_cycle(MS, sl, nf)
        NC.noc_step(MS.req, nf)
        NC.noc_step(MS.resp, nf)
        ck[CK_NOW_FAB] += 1
        ck[CK_FAB_ACC] -= ONE
    if cfg[M_GROUPED]:
        for g in range(cfg[M_GROUPS]):
            if NC.noc_deliverable(MS.resp, MS.gnode[g, 1]):
                _group_replies(MS, TS, g, now)
        if MS.dma.cfg[DM.DC_ENGINES] > 0:
            DM.dma_bcast_poll(MS.dma, TS, now)
            _dma_engines(MS, TS, now)
    if MS.mk[MK_ON]:
        _mesh_cycle(MS, TS, now)
    if cfg[M_GROUPED]:
        # no reply comes to a core directly: only cores with something queued have work, and
        # those sit in the spans citems counts
        if MS.mk[MK_CORE_ITEMS] == 0:
            return
        n = cfg[M_CORES]
        for j in range(MS.citems.shape[0]):
            if MS.citems[j] == 0:
                continue
            lo, hi = span_bounds(j, n)
            for core in range(lo, hi):
                if _core_has_work(MS, core, now):
                    _core_memory(MS, TS, S, Dd, core, now)
        return
    for core in range(cfg[M_CORES]):
        if _core_has_work(MS, core, now):
            _core_memory(MS, TS, S, Dd, core, now)


@njit(inline="always")
def _slice_has_work(MS, sl, now):
    """Anything for _slice_cycle to look at: replies due (each reply queue is in due order, so its
    head tells), DRAM retries, a request held or delivered by the request fabric once the data
    array is free again (until then the slice takes no request), a held request that found the
    slice full only after a fill."""
    cfg = MS.cfg
    Q = MS.Q
    return (_head_due(MS, cfg[M_Q_L2D] + sl, now) or _head_due(MS, cfg[M_Q_L2F] + sl, now)
            or _head_due(MS, cfg[M_Q_RFILL] + sl, now) or Q.count[cfg[M_Q_RETRY] + sl] > 0
            or (MS.slice_busy[sl] <= now and (MS.slice_full[sl] == 0 if MS.slice_hold[sl] >= 0
                                              else NC.noc_deliverable(MS.req, MS.node[1, sl]))))


@njit(inline="always")
def _head_due(MS, q, now):
    """The oldest request of delay queue q is due (its aux1 cycle has come)."""
    return MS.Q.count[q] > 0 and MS.R.aux1[q_peek(MS.Q, q, 0)] <= now


@njit(inline="always")
def _pipe_takes_head(MS, core, now):
    """The data pipe takes the core's oldest MIO entry this cycle: there is one, it is not in the
    middle of its wavefronts (mio_next), and it is not a load waiting for an L1 fill (l1_full: it
    found no MSHR or way free, and only a fill of that L1 changes that)."""
    return MS.mio_count[core] > 0 and MS.mio_next[core] <= now and MS.l1_full[core] == 0


@njit(inline="always")
def _core_has_work(MS, core, now):
    """Anything for _core_memory to look at: replies delivered, L1 hits due, an MIO entry the data
    pipe takes (_pipe_takes_head), misses waiting for the request fabric."""
    cfg = MS.cfg
    Q = MS.Q
    return (_pipe_takes_head(MS, core, now) or _head_due(MS, cfg[M_Q_L1D] + core, now)
            or Q.count[cfg[M_Q_MISS] + core] > 0
            or (cfg[M_GROUPED] == 0 and NC.noc_deliverable(MS.resp, MS.node[3, core])))


@njit(cache=True)
def mem_idle(MS):
    """No request anywhere in the memory system (DRAM refresh alone does not count)."""
    if MS.R.nfree[0] != MS.R.free.shape[0]:
        return False
    for core in range(MS.cfg[M_CORES]):
        if MS.mio_count[core] > 0:
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
    (slices) or the DRAM front ends and completions can change anything (K.INF: none). Packets a
    network has delivered count when their receiver can take them: a slice when its data array
    is free; an SM or a core group's stop at once (-1: in the next core cycle)."""
    cfg = MS.cfg
    Q = MS.Q
    R = MS.R
    F = MS.clocks[CK_NOW_FAB]
    C = cfg[M_CHANNELS]
    t = K.INF
    for c in range(C):
        if Q.count[C + c] > 0:
            return F                                  # DRAM finished requests: _dram_done
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
        elif NC.noc_deliverable(MS.req, MS.node[1, sl]):
            t = min(t, _after(MS.slice_busy[sl], F))
    if cfg[M_GROUPED]:
        for g in range(cfg[M_GROUPS]):
            if NC.noc_deliverable(MS.resp, MS.gnode[g, 1]):
                return -1
    else:
        for core in range(cfg[M_CORES]):
            if NC.noc_deliverable(MS.resp, MS.node[3, core]):
                return -1
    for N in (MS.req, MS.resp):
        if not NC.noc_idle(N):
            t = min(t, NC.noc_next_event(N, N.clk[NC.C_LAST]))
    return t


@njit(cache=True)
def mem_next_event(MS, now):
    """The next core cycle (> now) at which the memory system can change anything (K.INF: never):
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
    t = K.INF
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
    tf = _fabric_next_event(MS, now)
    if tf < 0:
        return now + 1
    if tf < K.INF:
        t = min(t, _core_cycle_of(ck[CK_NOW_FAB], ck[CK_FAB_ACC], cfg[M_FAB_RATIO], tf, now))
    if MS.dma.cfg[DM.DC_ENGINES] > 0:
        t = min(t, DM.dma_next_event(MS.dma, now))
    if MS.mk[MK_ON]:
        t = min(t, _mesh_next_event(MS, now))
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


def l2_half_of(machine, addr):
    """The L2 half (partition) an address (int or array) lives in, as the slices map it."""
    l2c = machine.l2
    return (addr // l2c.interleave_bytes) % l2c.halves if l2c is not None and l2c.halves > 1 else addr * 0


def near_half_of_core(machine, core: int) -> int:
    """The L2 half that is near an SM (see _far)."""
    l2c = machine.l2
    return core % l2c.halves if l2c is not None and l2c.halves > 1 else 0


def mem_counters(MS, cycles: int) -> dict:
    out = {"bytes": {k: int(MS.bytes[i]) for i, k in enumerate(("l1", "scratch", "l2", "dram_read", "dram_write",
                                                               "fabric", "dma", "rma"))},
           "load_latency": {"sum": int(MS.lat[0]), "count": int(MS.lat[1]),
                            "min": int(MS.lat[2]) if MS.lat[1] else 0, "max": int(MS.lat[3])},
           "now_mem": int(MS.clocks[CK_NOW_MEM]), "now_fab": int(MS.clocks[CK_NOW_FAB])}
    if MS.cfg[M_HAS_L1]:
        out["l1"] = CA.cache_counters(MS.L1, "l1")
    if MS.cfg[M_HAS_L2]:
        out["l2"] = CA.cache_counters(MS.L2, "l2")
    out["dram"] = DR.dram_counters(MS.Dm, int(MS.clocks[CK_NOW_MEM]))
    out["fabric"] = NC.fabric_counters(MS.req, MS.resp, max(int(MS.clocks[CK_NOW_FAB]), 1))
    if MS.dma.cfg[DM.DC_ENGINES] > 0:
        out["dma"] = DM.dma_counters(MS.dma)
    if MS.rma.cfg[RM.RC_ENGINES] > 0:
        out["rma"] = RM.rma_counters(MS.rma)
    if MS.mk[MK_ON]:
        out["mesh"] = NC.noc_counters(MS.mesh, max(int(cycles), 1))
    if MS.mpe.cfg[MPE.MC_GROUPS] > 0:
        out["mpe"] = MPE.mpe_counters(MS.mpe)
    return out
