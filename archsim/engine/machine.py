"""Resolved config -> engine state, and the jitted tick loop of a kernel launch.

Tick order per core cycle: memory (DRAM in its clock domain, then L2 and the fabric in theirs)
-> the cores' LSU/L1 side -> the schedulers (drain before fill). When no scheduler issued and the
memory system has nothing due before some later cycle, the clock jumps there (skip-ahead): every
resident warp keeps its stall reason over the skipped cycles, so results are identical with the
jump on or off (tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archsim.engine import core as K
from archsim.engine import decode as D
from archsim.engine import execute as X
from archsim.engine import memory as M
from archsim.engine.jit import njit

# run_loop outcomes
DONE, FAULT, DEADLOCK, CYCLE_LIMIT = 0, 1, 2, 3


@njit(cache=True)
def run_loop(C, TS, S, P, T, Dd, MS, max_cycles, skip, out):
    """Run one launch to completion. out: [0] outcome, [1] cycles, [2] warp (fault/deadlock),
    [3] warp-instructions, [4] skipped cycles."""
    cores = C.v[K.C_CORES]
    nsub = C.v[K.C_SUBCORES]
    now = np.int64(0)
    K.dispatch_all(C, TS, S, now)
    step_out = np.zeros(4, np.int64)
    nblocks = TS.k[3]
    while TS.k[1] < nblocks:
        M.mem_cycle(MS, TS, S, Dd, now)
        step_out[0] = 0
        step_out[1] = K.INF
        step_out[2] = 0
        for c in range(cores):
            if TS.core_blocks[c] == 0:
                continue
            for sb in range(nsub):
                K.subcore_cycle(C, TS, S, P, T, Dd, MS, c, sb, now, step_out)
                if step_out[2]:
                    out[0] = FAULT
                    out[1] = now
                    out[2] = step_out[3]
                    out[3] = TS.issued.sum()
                    return
        _grid_barrier(TS)
        nxt = now + 1
        if step_out[0] == 0:
            t_mem = M.mem_next_event(MS, now)
            t = step_out[1]
            if t >= K.INF and M.mem_idle(MS):
                t = K.INF  # no warp can become ready and no request is in flight: only refresh ticks on
            elif t_mem < t:
                t = t_mem
            if t >= K.INF:
                if TS.k[1] < nblocks:
                    out[0] = DEADLOCK
                    out[1] = now
                    out[2] = _first_stuck(TS)
                    out[3] = TS.issued.sum()
                    return
            elif skip and t > nxt:
                K.account_skip(C, TS, t - nxt)
                M.mem_skip(MS, t - nxt)
                out[4] += t - nxt
                nxt = t
        now = nxt
        if now >= max_cycles:
            out[0] = CYCLE_LIMIT
            out[1] = now
            out[2] = _first_stuck(TS)
            out[3] = TS.issued.sum()
            return
    out[0] = DONE
    out[1] = now
    out[3] = TS.issued.sum()


@njit(cache=True)
def _grid_barrier(TS):
    if TS.k[7] == 0:
        return
    alive = 0
    for w in range(TS.wst.shape[0]):
        if TS.wst[w] != K.T_EMPTY and TS.wst[w] != K.T_DONE:
            alive += 1
    if TS.k[7] == alive and TS.k[0] >= TS.k[3]:
        TS.k[7] = 0
        for w in range(TS.wst.shape[0]):
            if TS.wst[w] == K.T_GRIDBAR:
                TS.wst[w] = K.T_RUN


@njit(cache=True)
def _first_stuck(TS):
    for w in range(TS.wst.shape[0]):
        if TS.wst[w] != K.T_EMPTY and TS.wst[w] != K.T_DONE:
            return w
    return -1


@dataclass
class KernelTiming:
    """What one timed launch leaves: the raw counters the stats layer turns into records."""

    outcome: int
    cycles: int
    warp_instructions: int
    skipped_cycles: int
    stuck_warp: int
    stall: np.ndarray
    flops: int
    pipe_busy_cycles: np.ndarray
    memory: dict
