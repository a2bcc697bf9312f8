"""The memory system's state (MState), its layout constants, ``make_mstate`` (a machine -> the state
of a launch) and the helpers every side of the memory system uses: which L2 slice or controller
owns an address, private placement (Sunway), the trackers of loads and async copies in flight.
The sides that step it: core_side.py (the cores' MIO queues, data pipes and L1s), l2_side.py (the
L2 slices and the DRAM path), sunway_side.py (core-group replies, DMA engines, the CPE mesh);
memory.py steps them in order and tells the next event."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import cache as CA
from archsim.engine import dma as DM
from archsim.engine import dram as DR
from archsim.engine import mpe as MPE
from archsim.engine import noc as NC
from archsim.engine import rma as RM
from archsim.engine import slice_map as SM
from archsim.engine import tma as TM
from archsim.engine import warps as WS
from archsim.engine.jit import njit
from archsim.engine.names import VISIT_FAMILIES
from archsim.engine.queues import KIND_WRITE, Queues, Requests, make_queues, make_requests, n_spans

COPY_HIT, COPY_MISS = -2, -3   # src of a near copy's request to its home slice: the home has it / not
DELAY_CAP = 512        # fixed-latency return pipelines (L1 hits per SM, L2 responses per slice)
ONE = np.int64(1) << 32  # fixed point: one cycle of a clock domain

# MIO entry fields
(E_WARP, E_PC, E_CLS, E_MASK, E_BYTES, E_TRK, E_NLINES, E_IDX, E_STARTED, E_N) = range(10)
# tracker fields
TK_WARP, TK_DST, TK_NDST, TK_PENDING, TK_KIND, TK_GROUP, TK_T0, TK_N = range(8)
TRK_LOAD, TRK_CP, TRK_TMA = 0, 1, 2   # TRK_TMA: a bulk tensor copy (TK_DST its bytes, TK_NDST its barrier's
# address + its row's generation << 32, TK_GROUP (block slot x MB_SLOTS + the barrier's row) x 2 + the phase
# parity its bytes count into)
# cfg fields
(M_CORES, M_W, M_SLICES, M_HALVES, M_SPH, M_IL_HALF, M_IL_SLICE, M_L1_LAT, M_L2_LAT, M_FAR, M_SMEM_LAT,
 M_BANKS, M_BANK_W, M_L2_BPC, M_SECTOR, M_LINE_BYTES, M_HAS_L1, M_HAS_L2, M_CHANNELS, M_FAB_RATIO, M_MEM_RATIO,
 M_Q_MISS, M_Q_L1D, M_Q_L2D, M_Q_RETRY, M_Q_FE, M_FE_LAT, M_GROUPED, M_GROUPS, M_SLICE_HASH, M_SPH_BITS,
 M_HALF_GRAN, M_Q_L2F, M_FILL_LINE, M_PRIV_SEG, M_PER_GROUP, M_REPL, M_Q_RFILL, M_HEADER, M_RETRY_GATE,
 M_N) = range(41)
# M_Q_L2D: per memory endpoint, the near-reply delay pipeline (L2 hits for SMs of the slice's own
# half, DRAM replies without an L2); M_Q_L2F: the far-reply one (SMs of the other half)
# M_REPL: l2.near_replicas (reads go to the mirror slice of the SM's own half); M_Q_RFILL: per slice,
# the copies its home slice sends, due after the home lookup and the crossing (fills in due order)
# M_PRIV_SEG: private placement (Sunway): the bytes of one private segment; a core of group g that
# addresses [0, M_PRIV_SEG) reaches the same offset in g's own segment (0: addresses are physical)
# M_GROUPED: the cores of a group share one fabric node (Sunway: a ring stop per core group), so
# replies are taken off the fabric per group and handed to their core or DMA engine
# MState.node rows: the fabric node of each core and memory endpoint, per network
ND_REQ_CORE, ND_REQ_MEM, ND_RESP_MEM, ND_RESP_CORE = range(4)
# MState.lat fields: global load latency (issue -> data)
LAT_SUM, LAT_COUNT, LAT_MIN, LAT_MAX = range(4)
# clocks
CK_FAB_ACC, CK_MEM_ACC, CK_NOW_FAB, CK_NOW_MEM, CK_N = range(5)
# bytes moved per level
BY_L1, BY_SCRATCH, BY_L2, BY_DRAM_R, BY_DRAM_W, BY_FABRIC, BY_DMA, BY_RMA, BY_N = range(9)
# request tags of packets in flight below the L1
TAG_WRITE = -(1 << 30)   # a write: no answer expected
TAG_DMA = -(1 << 29)     # a DMA piece (aux0 = engine * descriptors per engine + slot); its write is acknowledged
# packets on the CPE mesh (addr = destination node, nbytes = payload; sunway_side.py's mesh functions)
TAG_BCAST = -(1 << 28)   # a broadcast piece hop to a cluster port (aux0 = its token: the piece's reply
                         # request, whose aux1 counts the hops still to land; src = destination cluster)
TAG_RMA_REQ = -(1 << 27)  # an RMA piece to its target CPE (kind WRITE: put data; READ: get request;
                          # aux0 = engine * rma.descriptors_per_engine + slot, src = engine)
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
    mio: np.ndarray          # int64 [cores, cores.mio_queue_entries, E_N]
    mio_addr: np.ndarray     # int64 [cores, cores.mio_queue_entries, W]
    mio_lines: np.ndarray    # int64 [cores, cores.mio_queue_entries, 2W]
    mio_masks: np.ndarray    # int64 [cores, cores.mio_queue_entries, 2W]
    mio_full: np.ndarray     # int64 [cores, cores.mio_queue_entries, 2W]
    mio_head: np.ndarray     # int32 [cores]
    mio_count: np.ndarray    # int32 [cores]
    l1_full: np.ndarray      # int32 [cores] 1: the MIO head's L1 access found no MSHR or way free; it
                             # is tried again after the next fill of that L1
    mio_next: np.ndarray     # int64 [cores] the first cycle the data pipe takes the MIO head again (a
                             # scratchpad entry holds it for all its wavefronts: its last one then)
    trk: np.ndarray          # int64 [cores, cores.load_trackers, TK_N]
    trk_free: np.ndarray     # int32 [cores, cores.load_trackers]
    trk_nfree: np.ndarray    # int32 [cores]
    mc: np.ndarray           # int64 [cores, cores.load_trackers, clusters.max_blocks] a multicast bulk tensor
                             # copy's other blocks: each one's barrier row (mc_entry)
    mc_n: np.ndarray         # int32 [cores, cores.load_trackers] entries of mc in use
    slice_busy: np.ndarray   # int64 [slices] fabric cycle the slice's data array is free again
    slice_hold: np.ndarray   # int32 [slices] request taken from the fabric, not accepted yet (-1)
    slice_full: np.ndarray   # int32 [slices] 1: the held request found no MSHR or way free; only a fill
                             # of the slice can change that, so it is tried again after one
    L1: CA.CacheState
    L2: CA.CacheState
    req: NC.NocState         # cores -> memory side
    resp: NC.NocState        # memory side -> cores
    node: np.ndarray         # int32 [ND_*, max(cores, slices)]: req core, req mem, resp mem, resp core
    Dm: DR.DramState
    waiters: np.ndarray      # int32 scratch for mshr_waiters
    runs: np.ndarray         # int64 [2, 8] scratch: sector runs (first, length)
    bytes: np.ndarray        # int64 [BY_N]
    lat: np.ndarray          # int64 [LAT_*]: global load latency sum, count, min, max (issue -> data)
    fe_t: np.ndarray         # int64 [channels, front-end capacity]: fabric cycle each front-end slot leaves
    ep_pending: np.ndarray   # int64 [endpoints] no L2: accepted requests whose reply has not left yet
    spill: np.ndarray        # int32 [queues, 2] first and last request waiting behind a full reply
                             # pipeline (chained through R.nxt; -1: none), see l2_side.pipe_push
    dma: DM.DmaState         # DMA engines (none on a GPU)
    tma: TM.TmaState         # the SMs' tensor memory accelerators (none without machine.tma)
    gnode: np.ndarray        # int32 [groups, 2] fabric node of each core group: req, resp (M_GROUPED)
    rma: RM.RmaState         # RMA engines (none on a GPU)
    mesh: NC.NocState        # the CPE meshes of all core groups (noc.make_cpe_meshes; a stub without one)
    obox: Queues             # per mesh node: packets waiting to enter the mesh (request ids)
    mpe: MPE.MpeState        # the MPEs' launch and join (inactive on a GPU)
    mk: np.ndarray           # int64 [MK_N]
    citems: np.ndarray       # int64 [n_spans(cores)] MK_CORE_ITEMS per span of cores
    visits: np.ndarray       # int64 [len(names.VISIT_FAMILIES), 2]: units looked at, and of those, changed


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
    # misses come in without the accept gate of slice_cycle) plus l2.retry_spare_entries for writebacks
    spare = machine.l2.retry_spare_entries if machine.l2 is not None else 256
    retry_cap = (machine.l2.mshrs if machine.l2 is not None else 0) + spare
    caps = [qcap] * chans + [DR.dram_queue_capacity(machine) * 4] * chans + \
        [machine.cores.miss_queue_entries] * cores + [DELAY_CAP] * cores \
        + [DELAY_CAP] * nmem + [retry_cap] * nmem + [fe_cap] * chans + [DELAY_CAP] * nmem
    # a slice has at most one copy in flight per sector its MSHRs fetch
    rfill_cap = 4 * machine.l2.mshrs + 64 if (machine.l2 is not None and machine.l2.near_replicas) else 1
    caps += [rfill_cap] * nmem
    Q = make_queues(caps)
    l1c, l2c = machine.l1, machine.l2
    sc = machine.scratchpad
    cfg = np.zeros(M_N, np.int64)
    cfg[M_CORES] = cores
    cfg[M_HEADER] = machine.fabric.header_bytes
    cfg[M_RETRY_GATE] = spare - 8
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
    cfg[M_LINE_BYTES] = l1c.line_bytes if l1c else (l2c.line_bytes if l2c else 128)
    if l1c is None and l1 is not None:        # a CPE's LDM cache: whole lines filled on a miss
        cfg[M_SECTOR] = CA.LDM_CACHE_SECTOR
        cfg[M_LINE_BYTES] = sc.cache_line_bytes
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
    cfg[M_SPH_BITS] = SM.fold_bits(int(cfg[M_SPH]))
    cfg[M_HALF_GRAN] = SM.half_granules(machine)
    if private:
        seg = DR.segment_bytes(machine)
        if seg <= 0:
            raise ValueError(f"{machine.name}: private placement needs the segments address mapping")
        cfg[M_PRIV_SEG] = seg
    cfg[M_PER_GROUP] = machine.cores.per_group
    nodes = np.full((4, max(cores, nmem)), -1, np.int32)
    grouped = len(fab.req_core) != cores  # Sunway: one fabric node per core group
    core_node = np.arange(cores) // machine.cores.per_group if grouped else np.arange(cores)
    nodes[ND_REQ_CORE, :cores] = fab.req_core[core_node]
    nodes[ND_REQ_MEM, :nmem] = fab.req_mem
    nodes[ND_RESP_MEM, :nmem] = fab.resp_mem
    nodes[ND_RESP_CORE, :cores] = fab.resp_core[core_node]
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
    trackers, mio_cap = machine.cores.load_trackers, machine.cores.mio_queue_entries
    trk_free = np.tile(np.arange(trackers - 1, -1, -1, dtype=np.int32), (cores, 1))
    l2_mshrs = l2c.mshrs if l2c else 0
    # requests in flight at once, bounded by the queues and engines that hold them (with room to spare)
    miss_q = machine.cores.miss_queue_entries
    tma_fly = machine.tma.max_inflight_lines if machine.tma is not None else 0
    nreq = cores * (trackers + 2 * miss_q + tma_fly) + nmem * ((6 if cfg[M_REPL] else 2) * l2_mshrs + 2 * spare + 64) \
        + 4096 + \
        int(dma.cfg[DM.DC_ENGINES]) * (machine.dma.max_inflight + 1 if machine.dma is not None else 0) + mesh_reqs
    lat = np.zeros(4, np.int64)
    lat[LAT_MIN] = 1 << 62
    max_wait = max([1] + [c.wait.shape[2] for c in (l1, l2) if c is not None])   # mshr_waiters' scratch
    return MState(
        cfg=cfg, clocks=np.zeros(CK_N, np.int64), Q=Q, R=make_requests(nreq),
        mio=np.zeros((cores, mio_cap, E_N), np.int64), mio_addr=np.zeros((cores, mio_cap, W), np.int64),
        mio_lines=np.zeros((cores, mio_cap, 2 * W), np.int64), mio_masks=np.zeros((cores, mio_cap, 2 * W), np.int64),
        mio_full=np.zeros((cores, mio_cap, 2 * W), np.int64), mio_head=np.zeros(cores, np.int32),
        mio_count=np.zeros(cores, np.int32), mio_next=np.zeros(cores, np.int64), l1_full=np.zeros(cores, np.int32),
        trk=np.zeros((cores, trackers, TK_N), np.int64), trk_free=trk_free,
        mc=np.zeros((cores, trackers, machine.clusters.max_blocks if machine.clusters is not None else 1)
                    if machine.tma is not None else (1, 1, 1), np.int64),
        mc_n=np.zeros((cores, trackers) if machine.tma is not None else (1, 1), np.int32),
        trk_nfree=np.full(cores, trackers, np.int32), slice_busy=np.zeros(nmem, np.int64),
        slice_hold=np.full(nmem, -1, np.int32), slice_full=np.zeros(nmem, np.int32),
        L1=l1 if l1 is not None else _dummy_cache(), L2=l2 if l2 is not None else _dummy_cache(),
        req=fab.req, resp=fab.resp, node=nodes, Dm=Dm, waiters=np.zeros(max_wait, np.int32), runs=np.zeros((2, 8), np.int64),
        bytes=np.zeros(BY_N, np.int64), lat=lat, fe_t=np.zeros((chans, fe_cap), np.int64), ep_pending=np.zeros(nmem, np.int64),
        spill=np.full((len(caps), 2), -1, np.int32), dma=dma, tma=TM.make_tma_state(machine, cores),
        gnode=gnode, rma=rma, mesh=mesh, obox=obox, mpe=mpe, mk=mk, citems=np.zeros(n_spans(cores), np.int64),
        visits=np.zeros((len(VISIT_FAMILIES), 2), np.int64))


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
def slice_of(MS, addr):
    """The memory-side endpoint of an address: its L2 slice, or without an L2 the controller of
    its DRAM channel."""
    cfg = MS.cfg
    if cfg[M_HAS_L2] == 0:
        c, _, _, _ = DR.dram_map(MS.Dm, addr)
        return c // (cfg[M_CHANNELS] // cfg[M_SLICES])
    sph = cfg[M_SPH]
    if cfg[M_SLICE_HASH] == 0:
        return (addr // cfg[M_IL_HALF]) % cfg[M_HALVES] * sph + (addr // cfg[M_IL_SLICE]) % sph
    half, q = SM.half_granule(addr, cfg[M_IL_HALF], cfg[M_HALVES], cfg[M_HALF_GRAN], cfg[M_IL_SLICE])
    return half * sph + SM.hashed_slice(q, sph, cfg[M_SPH_BITS])


hashed_slice = SM.hashed_slice


@njit(cache=True)
def mirror_slice(MS, sl, half):
    """The slice of ``half`` that keeps copies of home slice sl's lines."""
    sph = MS.cfg[M_SPH]
    return half * sph + sl % sph


@njit(cache=True)
def dest_slice(MS, core, r):
    """Where a core's request goes: the home slice of its address; with near replicas a read goes
    to the home's mirror in the core's own half."""
    sl = slice_of(MS, MS.R.addr[r])
    cfg = MS.cfg
    if cfg[M_REPL] and MS.R.kind[r] != KIND_WRITE:
        half = core % cfg[M_HALVES]
        if sl // cfg[M_SPH] != half:
            return mirror_slice(MS, sl, half)
    return sl


@njit(cache=True)
def is_far(MS, core, sl):
    cfg = MS.cfg
    if cfg[M_HALVES] <= 1:
        return 0
    return 1 if (sl // cfg[M_SPH]) != (core % cfg[M_HALVES]) else 0


@njit(inline="always")
def mc_entry(gen, bs, row, parity):
    """A multicast target's barrier: its row's generation, the block slot, the row, the parity."""
    return (gen << 26) | (bs << 6) | (row << 1) | parity


@njit(cache=True)
def trk_done(MS, TS, core, t, now):
    """A tracker's last piece arrived: its registers (a load), its cp.async group (a copy) or its
    barrier's bytes in flight (a bulk tensor copy; a multicast: in each block of its mask)."""
    w = MS.trk[core, t, TK_WARP]
    kind = MS.trk[core, t, TK_KIND]
    if kind == TRK_TMA:
        TM.tma_done(MS.tma, core, MS.trk[core, t, TK_T0], now)
        g = MS.trk[core, t, TK_GROUP]
        row = g >> 1
        key = MS.trk[core, t, TK_NDST]
        nb = MS.trk[core, t, TK_DST]
        if g >= 0:
            WS.mb_landed(TS, core, row // WS.MB_SLOTS, row % WS.MB_SLOTS, g & 1, key & 0xFFFFFFFF, key >> 32,
                         nb, now)
        per_core = TS.mb_addr.shape[0] // MS.trk.shape[0]
        for j in range(MS.mc_n[core, t]):
            e = MS.mc[core, t, j]
            bs = (e >> 6) & 0xFFFFF
            WS.mb_landed(TS, bs // per_core, bs, (e >> 1) & 31, e & 1, key & 0xFFFFFFFF, e >> 26, nb, now)
        MS.mc_n[core, t] = 0
    elif kind == TRK_LOAD:
        d = MS.trk[core, t, TK_DST]
        for j in range(MS.trk[core, t, TK_NDST]):
            TS.reg_ready[w, d + j] = now
        lat = now - MS.trk[core, t, TK_T0]
        MS.lat[LAT_SUM] += lat
        MS.lat[LAT_COUNT] += 1
        if lat < MS.lat[LAT_MIN]:
            MS.lat[LAT_MIN] = lat
        if lat > MS.lat[LAT_MAX]:
            MS.lat[LAT_MAX] = lat
        WS.wake_warp_regs(TS, w, now)  # its scheduler looks again if it waits on them
    else:
        g = MS.trk[core, t, TK_GROUP]
        TS.cp_pending[w, g % WS.CP_GROUPS] -= 1
        if TS.wst[w] == WS.T_CPWAIT or (TS.mem_wait[core] >> min(WS.subcore_of(TS, w), 62)) & 1:
            # a finished copy group matters to a warp waiting on its groups (a running warp checks
            # them when its cp.async.wait issues) and the freed tracker to a warp of its sub-core
            # refused for want of one: with neither, its scheduler would find what it found before
            WS.wake_warp(TS, w, now)
    n = MS.trk_nfree[core]
    MS.trk_free[core, n] = t
    MS.trk_nfree[core] = n + 1


@njit(cache=True)
def trk_piece(MS, TS, core, t, now):
    """A reply for tracker t came back."""
    if MS.trk[core, t, TK_KIND] == TRK_TMA:
        MS.tma.fly[core] -= 1
    trk_release(MS, TS, core, t, now)


@njit(cache=True)
def trk_release(MS, TS, core, t, now):
    """One of tracker t's pending pieces is over (a reply, or a copy's last request sent)."""
    MS.trk[core, t, TK_PENDING] -= 1
    if MS.trk[core, t, TK_PENDING] == 0:
        trk_done(MS, TS, core, t, now)


@njit(cache=True)
def mask_runs(mask, out_first, out_len):
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


def l2_half_of(machine, addr):
    """The L2 half (partition) an address (int or array) lives in, as the slices map it."""
    l2c = machine.l2
    return (addr // l2c.interleave_bytes) % l2c.halves if l2c is not None and l2c.halves > 1 else addr * 0


def near_half_of_core(machine, core: int) -> int:
    """The L2 half that is near an SM (see is_far)."""
    l2c = machine.l2
    return core % l2c.halves if l2c is not None and l2c.halves > 1 else 0
