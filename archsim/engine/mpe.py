"""The MPE of a Sunway core group: it launches the CPE array at kernel start and joins it at the end.

Design note (core cycles throughout; the MPE's own clock enters as a ratio)
- One MPE per core group does the launch (the first when ``mpe.per_group`` > 1). It is an in-order
  core that runs an athread_spawn-like loop: for every CPE of its group that has a block at kernel
  start, in CPE order, it spends ``mpe.spawn_cycles_per_cpe`` MPE cycles issuing that CPE's launch
  message. MPE cycles are ``mpe.clock_ghz`` cycles: in core cycles one costs
  ``clock_ghz / mpe.clock_ghz``, kept in fixed point (``FX``) so a fractional ratio never drifts.
- A launch message (the mesh header + ``mpe.launch_message_bytes``: entry, arguments, the CPE's
  id) leaves the MPE's port, a node of the group's CPE mesh at the router of cluster
  ``mpe.attach_cluster`` (noc.make_cpe_meshes), and travels the mesh (XY routing,
  ``rma.router_latency_cycles`` per router, ``rma.link_bytes_per_cycle`` links, credits) to the
  CPE's node. The CPE's first block may issue from the cycle its message is ejected
  (``TS.launch_at``); until then its warps are resident but not scheduled and count no stall
  cycles. Unloaded: the CPE k-th in the MPE's order, d cluster hops from the attach router, starts
  at ceil((k + 1) x spawn x clock_ghz / mpe.clock_ghz) + (d + 1) x L + ceil((fabric.header_bytes + bytes) / W).
- Later blocks of a CPE (a launch larger than the machine) start when its previous one retires,
  as before: the CPE's thread runs on. When a CPE has no block left it sends a completion (a
  header) to its MPE over the mesh. The MPE takes completions in arrival order, each
  ``mpe.join_cycles_per_cpe`` MPE cycles, after its launch loop; the group has joined when it has
  taken all of its own. A kernel ends when every launching MPE has joined (and, as before, the
  stores have drained).
- Choices: one message per CPE (no broadcast of the launch); a core group with no block at kernel
  start takes no part; a CPE without a block is not launched (its thread would exit at once).

State is struct of arrays (``MpeState``); the memory state (mem_state.py) holds the mesh,
its outboxes and the request table, and sunway_side.py calls the step functions here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine import warps as WS
from archsim.engine.jit import njit

FX = np.int64(1) << 16  # fixed point: one core cycle
INF = np.int64(1) << 62

# cfg fields: groups (0: no MPE model), spawn and join cost per CPE (core cycles, fixed point),
# launch payload bytes, CPEs per group, sub-cores per core
MC_GROUPS, MC_SPAWN_FX, MC_JOIN_FX, MC_MSG_BYTES, MC_PER_GROUP, MC_SUBCORES, MC_N = range(7)
# per group
(GP_NODE, GP_NLAUNCH, GP_SENT, GP_ARRIVED, GP_TAKEN, GP_FREE_FX, GP_JOIN_AT, GP_FIRST_START, GP_LAST_START,
 GP_LAST_DONE, GP_N) = range(11)


class MpeState(NamedTuple):
    cfg: np.ndarray      # int64 [MC_N]
    grp: np.ndarray      # int64 [groups, GP_N]
    order: np.ndarray    # int32 [groups, per_group] cores to launch, in the MPE's order
    arrive: np.ndarray   # int64 [groups, per_group] arrival cycle of each completion, in arrival order
    start: np.ndarray    # int64 [cores] cycle the core's launch message arrived (-1: not launched)


def make_mpe_state(machine, nsub: int = 1) -> MpeState:
    """The MPEs' launch state (an empty one, MC_GROUPS = 0, on a machine without ``mpe``)."""
    from archsim.config import cores_total

    cfg = np.zeros(MC_N, np.int64)
    ncores = max(cores_total(machine), 1)
    mp = machine.mpe
    if mp is None or machine.mesh is None or machine.rma is None:
        return MpeState(cfg=cfg, grp=np.zeros((1, GP_N), np.int64), order=np.full((1, 1), -1, np.int32),
                        arrive=np.zeros((1, 1), np.int64), start=np.full(ncores, -1, np.int64))
    G, per = machine.groups, machine.cores.per_group
    ratio = machine.clock_ghz / mp.clock_ghz   # core cycles per MPE cycle
    cfg[MC_GROUPS] = G
    cfg[MC_SPAWN_FX] = int(round(mp.spawn_cycles_per_cpe * ratio * int(FX)))
    cfg[MC_JOIN_FX] = int(round(mp.join_cycles_per_cpe * ratio * int(FX)))
    cfg[MC_MSG_BYTES] = mp.launch_message_bytes
    cfg[MC_PER_GROUP] = per
    cfg[MC_SUBCORES] = nsub
    grp = np.zeros((G, GP_N), np.int64)
    for g in range(G):
        grp[g, GP_NODE] = mpe_node(machine, g)
    grp[:, GP_JOIN_AT] = -1
    grp[:, GP_FIRST_START] = -1
    grp[:, GP_LAST_START] = -1
    grp[:, GP_LAST_DONE] = -1
    return MpeState(cfg=cfg, grp=grp, order=np.full((G, per), -1, np.int32), arrive=np.zeros((G, per), np.int64),
                    start=np.full(ncores, -1, np.int64))


def mpe_node(machine, g: int) -> int:
    """Mesh node of group g's MPE port (noc.make_cpe_meshes numbering: CPEs, cluster ports, MPEs)."""
    from archsim.config import cores_total

    m = machine.mesh
    ncl = (m.rows // m.cluster_rows) * (m.cols // m.cluster_cols)
    return cores_total(machine) + machine.groups * ncl + g


def mpe_router(machine, g: int) -> int:
    """Mesh router (cluster) of group g that the MPE's port hangs on."""
    m = machine.mesh
    ccols = m.cols // m.cluster_cols
    ncl = (m.rows // m.cluster_rows) * ccols
    r, c = machine.mpe.attach_cluster
    return g * ncl + r * ccols + c


# ----------------------------------------------------------------------------- kernel start
@njit(cache=True)
def mpe_start(MP, TS, now):
    """Kernel start (after dispatch_all): every group's MPE queues a launch for each CPE of its group
    that holds a block; those CPEs wait (TS.launch_at = INF, asleep) until their message arrives."""
    G = MP.cfg[MC_GROUPS]
    if G == 0:
        return
    per = MP.cfg[MC_PER_GROUP]
    nsub = MP.cfg[MC_SUBCORES]
    for g in range(G):
        n = 0
        for k in range(per):
            c = g * per + k
            if TS.core_blocks[c] > 0:
                MP.order[g, n] = c
                n += 1
                TS.launch_at[c] = WS.INF
                for sb in range(nsub):
                    TS.wake[c * nsub + sb] = WS.INF
                    TS.acct[c * nsub + sb] = now
        MP.grp[g, GP_NLAUNCH] = n
        MP.grp[g, GP_FREE_FX] = now * FX
        if n == 0:
            MP.grp[g, GP_JOIN_AT] = now  # nothing to launch: this MPE takes no part


# ----------------------------------------------------------------------------- the MPE's work
@njit(cache=True)
def mpe_launch_ready(MP, g, now):
    """The core whose launch message group g's MPE may send in cycle `now`, or -1."""
    gp = MP.grp[g]
    if gp[GP_SENT] >= gp[GP_NLAUNCH]:
        return -1
    if gp[GP_FREE_FX] + MP.cfg[MC_SPAWN_FX] > now * FX:
        return -1
    return MP.order[g, gp[GP_SENT]]


@njit(cache=True)
def mpe_launch_sent(MP, g, now):
    gp = MP.grp[g]
    fin = gp[GP_FREE_FX] + MP.cfg[MC_SPAWN_FX]
    # the MPE finished the message at `fin` (a fraction of a cycle ago); later, if the mesh port
    # held it back, it goes on from now
    gp[GP_FREE_FX] = fin if fin > (now - 1) * FX else now * FX
    gp[GP_SENT] += 1


@njit(cache=True)
def mpe_arrived(MP, TS, core, now):
    """Core `core`'s launch message was ejected at its node: its block(s) may issue from now."""
    g = core // MP.cfg[MC_PER_GROUP]
    gp = MP.grp[g]
    MP.start[core] = now
    if gp[GP_FIRST_START] < 0:
        gp[GP_FIRST_START] = now
    if now > gp[GP_LAST_START]:
        gp[GP_LAST_START] = now
    TS.launch_at[core] = now
    mb = TS.bs_block.shape[0] // TS.core_blocks.shape[0]
    for b in range(mb):  # its blocks start now (their dispatch at kernel start placed them)
        blk = TS.bs_block[core * mb + b]
        if blk >= 0:
            TS.blk_start[blk] = now
    nsub = MP.cfg[MC_SUBCORES]
    for sb in range(nsub):
        TS.acct[core * nsub + sb] = now  # nothing to account before the launch
        TS.wake[core * nsub + sb] = WS.INF
    WS.wake_core(TS, core, now)


@njit(cache=True)
def mpe_done_arrived(MP, g, now):
    """A completion reached group g's MPE."""
    gp = MP.grp[g]
    MP.arrive[g, gp[GP_ARRIVED]] = now
    gp[GP_ARRIVED] += 1


@njit(cache=True)
def mpe_take(MP, g, now):
    """Group g's MPE takes the completions it can finish by cycle `now` (after its launch loop)."""
    gp = MP.grp[g]
    if gp[GP_SENT] < gp[GP_NLAUNCH]:
        return
    while gp[GP_TAKEN] < gp[GP_ARRIVED]:
        a = MP.arrive[g, gp[GP_TAKEN]] * FX
        t = gp[GP_FREE_FX] if gp[GP_FREE_FX] > a else a
        fin = t + MP.cfg[MC_JOIN_FX]
        if fin > now * FX:
            return
        gp[GP_FREE_FX] = fin
        gp[GP_TAKEN] += 1
        if gp[GP_TAKEN] == gp[GP_NLAUNCH]:
            gp[GP_JOIN_AT] = now


@njit(cache=True)
def mpe_core_done(MP, core, now):
    """Record that `core` has no block left (the caller sends its completion); returns its group."""
    g = core // MP.cfg[MC_PER_GROUP]
    if now > MP.grp[g, GP_LAST_DONE]:
        MP.grp[g, GP_LAST_DONE] = now
    return g


@njit(cache=True)
def mpe_joined(MP):
    """Has every launching MPE taken all its completions?"""
    for g in range(MP.cfg[MC_GROUPS]):
        if MP.grp[g, GP_JOIN_AT] < 0:
            return False
    return True


@njit(cache=True)
def mpe_busy(MP):
    """An MPE has a launch to send or an arrived completion to take."""
    for g in range(MP.cfg[MC_GROUPS]):
        gp = MP.grp[g]
        if gp[GP_SENT] < gp[GP_NLAUNCH] or gp[GP_TAKEN] < gp[GP_ARRIVED]:
            return True
    return False


@njit(cache=True)
def mpe_next_event(MP, now):
    """The first cycle after `now` at which an MPE can do something on its own (INF: none)."""
    t = INF
    for g in range(MP.cfg[MC_GROUPS]):
        gp = MP.grp[g]
        if gp[GP_SENT] < gp[GP_NLAUNCH]:
            fin = gp[GP_FREE_FX] + MP.cfg[MC_SPAWN_FX]
        elif gp[GP_TAKEN] < gp[GP_ARRIVED]:
            a = MP.arrive[g, gp[GP_TAKEN]] * FX
            fin = (gp[GP_FREE_FX] if gp[GP_FREE_FX] > a else a) + MP.cfg[MC_JOIN_FX]
        else:
            continue
        u = (fin + FX - 1) // FX
        if u < t:
            t = u
    if t <= now:
        t = now + 1
    return t


def mpe_counters(MP) -> dict:
    """The ``mpe`` record of a kernel: launch cycles (kernel start to the last CPE start), join
    cycles (the last CPE done to the MPE's join), per launching group and the worst over groups."""
    G = int(MP.cfg[MC_GROUPS])
    groups = []
    for g in range(G):
        gp = MP.grp[g]
        n = int(gp[GP_NLAUNCH])
        if n == 0:
            continue
        last_start, last_done, join = int(gp[GP_LAST_START]), int(gp[GP_LAST_DONE]), int(gp[GP_JOIN_AT])
        groups.append({"group": g, "cpes_launched": n, "first_cpe_start_cycle": int(gp[GP_FIRST_START]),
                       "last_cpe_start_cycle": last_start, "last_cpe_done_cycle": last_done, "join_cycle": join,
                       "launch_cycles": max(last_start, 0),
                       "join_cycles": (join - last_done) if join >= 0 and last_done >= 0 else 0})
    return {"cpes_launched": sum(x["cpes_launched"] for x in groups),
            "launch_cycles": max((x["launch_cycles"] for x in groups), default=0),
            "join_cycles": max((x["join_cycles"] for x in groups), default=0),
            "groups": groups}
