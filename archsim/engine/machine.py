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
from archsim.engine.ref import as_ptr

# run_loop outcomes
DONE, FAULT, DEADLOCK, CYCLE_LIMIT = 0, 1, 2, 3

# Timeline: cumulative counters sampled at every window boundary (rows), then differenced by the
# stats layer into per-window rates. When the rows run out, every other row is dropped and the
# window doubles, so any run fits in a fixed array.
TL_COUNTERS = ("warp_instructions", "l1", "scratch", "l2", "dram_read", "dram_write", "fabric") + \
    tuple("stall_" + n for n in K.STALL_NAMES)
TL_ROWS = 512
TLK_WINDOW, TLK_ROWS, TLK_NEXT = 0, 1, 2


def make_timeline(window_cycles: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((TL_ROWS, len(TL_COUNTERS)), np.int64), np.array([window_cycles, 0, window_cycles], np.int64)


def timeline_rows(TL, tlk, TS, MS, end_cycle: int) -> tuple[int, np.ndarray]:
    """(window, rows): the sampled rows plus a last one with the totals at the end of the run."""
    n = int(tlk[TLK_ROWS])
    last = np.concatenate([[TS.issued.sum()], MS.bytes[:6], TS.stall.sum(axis=0)]).astype(np.int64)
    return int(tlk[TLK_WINDOW]), np.vstack([TL[:n], last[None, :]])


@njit(cache=True)
def _tl_sample(TL, tlk, TS, MS):
    """Record the cumulative counters as the row of boundary tlk[TLK_NEXT]."""
    if tlk[TLK_ROWS] == TL.shape[0]:
        half = TL.shape[0] // 2
        for i in range(half):
            for j in range(TL.shape[1]):
                TL[i, j] = TL[2 * i + 1, j]
        tlk[TLK_ROWS] = half
        tlk[TLK_WINDOW] *= 2
        tlk[TLK_NEXT] = (half + 1) * tlk[TLK_WINDOW]
        return False  # the boundary moved: the caller checks again
    r = tlk[TLK_ROWS]
    TL[r, 0] = TS.issued.sum()
    for i in range(6):
        TL[r, 1 + i] = MS.bytes[i]
    for k in range(TS.stall.shape[1]):
        TL[r, 7 + k] = TS.stall[:, k].sum()
    tlk[TLK_ROWS] = r + 1
    tlk[TLK_NEXT] += tlk[TLK_WINDOW]
    return True


@njit(nrt=True)  # allocates the scheduler's scratch
def run_loop(C, TS, S, P, T, Dd, MS, TL, tlk, max_cycles, skip, out):
    """Run one launch to completion. out: [0] outcome, [1] cycles, [2] warp (fault/deadlock),
    [3] warp-instructions, [4] skipped cycles. TL/tlk: the timeline (make_timeline). The state
    tuples travel as StatePtrs (archsim.engine.ref: one word a call) from here on."""
    _run(as_ptr(C), as_ptr(TS), as_ptr(S), as_ptr(P), as_ptr(T), as_ptr(Dd), as_ptr(MS), TL, tlk, max_cycles,
         skip, out, np.zeros(4, np.int64))


@njit(cache=True)
def _run(C, TS, S, P, T, Dd, MS, TL, tlk, max_cycles, skip, out, step_out):
    cores = C.v[K.C_CORES]
    nsub = C.v[K.C_SUBCORES]
    now = np.int64(0)
    K.dispatch_all(C, TS, S, now)
    nblocks = TS.k[3]
    while TS.k[1] < nblocks:
        while now >= tlk[TLK_NEXT]:
            _tl_sample(TL, tlk, TS, MS)
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
                out[4] += t - nxt
                while nxt < t:  # split the jump at timeline boundaries: the timeline stays exact
                    stop = min(t, tlk[TLK_NEXT]) if tlk[TLK_NEXT] > nxt else t
                    K.account_skip(C, TS, stop - nxt)
                    M.mem_skip(MS, stop - nxt)
                    nxt = stop
                    while nxt >= tlk[TLK_NEXT] and nxt < t:
                        _tl_sample(TL, tlk, TS, MS)
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
    timeline: tuple = (0, None)  # (window cycles, cumulative counter rows at window ends; last row = end)
    buffers: dict = None         # backed buffer arguments as the kernel left them
