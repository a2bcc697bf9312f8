"""Per-unit timeline counters: every fabric link, DRAM channel, L2 slice and DMA engine, sampled
cumulatively at each timeline window boundary beside the machine-wide counters (machine.py).

A sample is one row of int64 columns, family by family, counter-major inside a family (all links'
busy cycles, then all links' blocked cycles, ...), so each counter of a family is a contiguous
block of columns. ``unit_layout`` says, in Python, which block holds what and names the units;
``unit_sample`` (jitted) fills the columns from the blocks' own cumulative counters. The stats
layer differences the rows into per-window matrices (stats.unit_matrices).

Families (only those the machine has):
- ``links``: the request and reply fabric links (fabric clock), then the CPE-mesh links (core
  clock) when the machine has a mesh: busy cycles (flits sent, counted when a packet leaves),
  blocked cycles.
- ``channels``: DRAM channels (memory clock): bytes read + written, queue occupancy integral
  (queued requests x memory cycles, the lazily added part of a skipped gap included), row hits,
  row accesses (hits + misses + conflicts).
- ``l2_slices`` (GPU): accesses, hits, MSHR entries in use at the sample (a snapshot).
- ``dma_engines`` (Sunway): bytes got + put (a broadcast get's bytes once per copy landed).
"""

from __future__ import annotations

from archsim.engine import cache as CA
from archsim.engine import dma as DM
from archsim.engine import dram as DR
from archsim.engine import mem_state as MST
from archsim.engine import noc as NC
from archsim.engine.jit import njit

# counters of each family, in column order
FAMILY_COUNTERS = {"links": ("busy", "blocked"),
                   "channels": ("bytes", "queue_area", "row_hits", "row_accesses"),
                   "l2_slices": ("accesses", "hits", "mshr_busy"),
                   "dma_engines": ("bytes",)}


@njit(cache=True)
def _has_mesh(MS):
    return MS.mk[MST.MK_ON] != 0


def unit_columns(MS) -> int:
    """How many columns unit_sample fills (the layout's width). Python: jitted, it would compile
    for the memory state as a NamedTuple, which the loops never pass (they pass a StatePtr)."""
    nl = MS.req.lt.shape[0] + MS.resp.lt.shape[0]
    if MS.mk[MST.MK_ON] != 0:
        nl += MS.mesh.lt.shape[0]
    n = 2 * nl + 4 * MS.Dm.cnt.shape[0]
    if MS.cfg[MST.M_HAS_L2]:
        n += 3 * MS.L2.cnt.shape[0]
    return int(n + MS.dma.cfg[DM.DC_ENGINES])


@njit(cache=True, inline="always")
def _links(N, row, c0, nl, j0, t):
    """Busy and blocked cycles of a network's links through its cycle t - 1."""
    for l in range(N.lt.shape[0]):
        row[c0 + j0 + l] = N.lt[l, NC.LT_FLITS]
    NC.noc_blocked_until(N, t, row, c0 + nl + j0)


@njit(cache=True)
def cycles_before(t_core, ratio):
    """Cycles a clock domain (ratio: its cycles per core cycle, x ONE = 2^32) has stepped in the core
    cycles before t_core: floor(t_core x ratio / 2^32), exactly, without a product that overflows
    int64 (t_core = hi x 2^20 + lo: floor((hi x ratio + floor(lo x ratio / 2^20)) / 2^12))."""
    return ((t_core >> 20) * ratio + (((t_core & 0xFFFFF) * ratio) >> 20)) >> 12


@njit(cache=True)
def unit_sample(MS, row, c0, t_core):
    """Write the cumulative per-unit counters into row[c0:] as of core cycle ``t_core`` (a window
    boundary): what stepping every cycle before it would have counted, so the rows are the same
    with skip-ahead on or off (the lazily counted parts of skipped cycles, link blocked cycles and
    a DRAM queue's occupancy, are added up to the boundary)."""
    cfg = MS.cfg
    nr, ns = MS.req.lt.shape[0], MS.resp.lt.shape[0]
    nl = nr + ns + (MS.mesh.lt.shape[0] if _has_mesh(MS) else 0)
    t_fab = cycles_before(t_core, cfg[MST.M_FAB_RATIO])
    _links(MS.req, row, c0, nl, 0, t_fab)
    _links(MS.resp, row, c0, nl, nr, t_fab)
    if _has_mesh(MS):
        _links(MS.mesh, row, c0, nl, nr + ns, t_core)  # the mesh runs at the core clock
    c = c0 + 2 * nl
    D = MS.Dm
    C = D.cnt.shape[0]
    t_mem = cycles_before(t_core, cfg[MST.M_MEM_RATIO])
    for ch in range(C):
        row[c + ch] = D.cnt[ch, DR.C_BYTES_READ] + D.cnt[ch, DR.C_BYTES_WRITTEN]
        gap = t_mem - D.last_step[0] - 1               # cycles not stepped yet: the queue held still
        row[c + C + ch] = D.cnt[ch, DR.C_QUEUE_OCC] + (D.chan[ch, DR.K_LASTCOUNT] * gap if gap > 0 else 0)
        row[c + 2 * C + ch] = D.cnt[ch, DR.C_ROW_HITS]
        row[c + 3 * C + ch] = D.cnt[ch, DR.C_ROW_HITS] + D.cnt[ch, DR.C_ROW_MISSES] + D.cnt[ch, DR.C_ROW_CONFLICTS]
    c += 4 * C
    if cfg[MST.M_HAS_L2]:
        L2 = MS.L2
        n = L2.cnt.shape[0]
        E = L2.mshr.shape[1]
        for s in range(n):
            row[c + s] = L2.cnt[s, CA.CNT_ACCESSES]
            row[c + n + s] = L2.cnt[s, CA.CNT_HITS]
            row[c + 2 * n + s] = E - L2.inst[s, CA.I_NFREE]
        c += 3 * n
    for e in range(MS.dma.cfg[DM.DC_ENGINES]):
        row[c + e] = MS.dma.cnt[e, DM.DX_BYTES_GET] + MS.dma.cnt[e, DM.DX_BYTES_PUT]


def unit_layout(machine, MS) -> dict:
    """family -> {"units": names, "counters": {name: column offset from the first unit column},
    "clock_ratio": the unit's clock over the core clock (one per unit)}, in unit_sample's order;
    links also have "net": fabric, mesh (a CPE-mesh router link) or mesh_port (a CPE's or DMA
    engine's port on the mesh)."""
    mesh = bool(MS.mk[MST.MK_ON])
    links = ["req " + n for n in NC.link_names(MS.req)] + ["resp " + n for n in NC.link_names(MS.resp)]
    ratio = [machine.clock_ratios.fabric] * len(links)
    net = ["fabric"] * len(links)
    if mesh:  # the CPE mesh's router links are named "mesh ..."; the rest are CPE / engine ports
        mesh_names = NC.link_names(MS.mesh)
        links += mesh_names
        ratio += [1.0] * len(mesh_names)
        net += ["mesh" if n.startswith("mesh ") else "mesh_port" for n in mesh_names]
    fams = [("links", links, ratio)]
    chans = DR.channel_names(MS.Dm)
    fams.append(("channels", chans, [machine.clock_ratios.memory] * len(chans)))
    if MS.cfg[MST.M_HAS_L2]:
        nodes = NC.node_names(MS.req)
        slices = [nodes[int(MS.node[MST.ND_REQ_MEM, s])] for s in range(MS.L2.cnt.shape[0])]
        fams.append(("l2_slices", slices, [1.0] * len(slices)))
    ne = int(MS.dma.cfg[DM.DC_ENGINES])
    if ne:
        fams.append(("dma_engines", dma_engine_names(machine, ne), [1.0] * ne))
    out, off = {}, 0
    for fam, names, ratios in fams:
        cols = {}
        for k in FAMILY_COUNTERS[fam]:
            cols[k] = off
            off += len(names)
        out[fam] = {"units": names, "counters": cols, "clock_ratio": ratios}
    out["links"]["net"] = net
    return out


def dma_engine_names(machine, n: int) -> list[str]:
    """cg<g>.cl<cluster>[.e<k>]: engine k of a cluster (dma.engines_per_cluster of them)."""
    epc = machine.dma.engines_per_cluster
    per_group = n // machine.groups
    names = []
    for e in range(n):
        g, r = divmod(e, per_group)
        cl, k = divmod(r, epc)
        names.append(f"cg{g}.cl{cl}" + (f".e{k}" if epc > 1 else ""))
    return names
