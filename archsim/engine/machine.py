"""Resolved config -> engine state, and the jitted tick loop of a kernel launch.

Tick order per core cycle: memory (DRAM in its clock domain, then L2 and the fabric in theirs)
-> the cores' LSU/L1 side -> the schedulers (drain before fill). Scheduling is event-driven: a
sub-core's scheduler runs only from the cycle one of its warps may issue (core.py, "event-driven
scheduling"); a memory reply, a barrier, a freed MIO entry or a new block wakes it. When no
scheduler is due and the memory system has nothing due before some later cycle, the clock jumps
there (skip-ahead). Sleeping warps keep their stall reasons and are accounted lazily, so results
are identical with ``skip`` on or off (off: every scheduler every cycle, no jumps; tests check it).

On a Sunway the blocks are placed at cycle 0 as on a GPU, but a CPE issues only from the cycle its
MPE's launch message reaches it over the CPE mesh, and a launch ends when every MPE has taken its
CPEs' completions (mpe.py); a launch that ends in a cycle without an issue stops at the next cycle,
never after a jump.
"""

from __future__ import annotations

import time

import numpy as np

from archsim.engine import core as K
from archsim.engine import mem_state as MST
from archsim.engine import memory as M
from archsim.engine import mpe as MP
from archsim.engine import unit_timeline as UT
from archsim.engine.jit import njit
from archsim.engine.queues import span_bounds
from archsim.engine.names import TL_BYTES, TL_COUNTERS, TL_UNITS_AT, V_SCHED, KernelTiming  # noqa: F401 (re-exported)
from archsim.engine.ref import as_ptr
from archsim.engine import warps as WS
from archsim.engine.core_side import core_memory

# run_loop outcomes
DONE, FAULT, DEADLOCK, CYCLE_LIMIT = 0, 1, 2, 3
# run_loop's out[]: outcome, the cycle it stopped at, the warp (fault, deadlock), warp-instructions
# issued, cycles jumped over
RO_OUTCOME, RO_CYCLES, RO_WARP, RO_ISSUED, RO_SKIPPED, RO_N = range(6)

# Timeline: cumulative counters sampled at every window boundary (rows), then differenced by the
# stats layer into per-window rates. When the rows run out, every other row is dropped and the
# window doubles, so any run fits in a fixed array. The machine-wide counters (TL_COUNTERS) come
# first in a row, then the per-unit ones (unit_timeline: links, channels, slices, DMA engines).
TL_ROWS = 512
TLK_WINDOW, TLK_ROWS, TLK_NEXT = 0, 1, 2


def make_timeline(MS, window_cycles: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(TL, tlk). TL's rows up to TL_ROWS take the window samples; its row TL_ROWS, the per-unit
    counters as of the cycle the loop last stopped at (_run_slice writes them there)."""
    width = TL_UNITS_AT + UT.unit_columns(MS)
    return np.zeros((TL_ROWS + 1, width), np.int64), np.array([window_cycles, 0, window_cycles], np.int64)


def timeline_rows(TL, tlk, TS, MS) -> tuple[int, np.ndarray]:
    """(window, rows): the sampled rows plus a last one with the totals at the cycle the loop
    stopped at (the end of the run)."""
    n = int(tlk[TLK_ROWS])
    last = TL[TL_ROWS].copy()  # the per-unit columns as _run_slice left them
    g = TL_UNITS_AT
    last[:g] = np.concatenate([[TS.issued.sum()], MS.bytes[:len(TL_BYTES)], TS.stall.sum(axis=0)])
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
    WS.flush_all(TS, tlk[TLK_NEXT])
    TL[r, 0] = TS.issued.sum()
    nb = len(TL_BYTES)
    for i in range(nb):
        TL[r, 1 + i] = MS.bytes[i]
    for k in range(TS.stall.shape[1]):
        TL[r, 1 + nb + k] = TS.stall[:, k].sum()
    UT.unit_sample(MS, TL[r], 1 + nb + TS.stall.shape[1], tlk[TLK_NEXT])
    tlk[TLK_ROWS] = r + 1
    tlk[TLK_NEXT] += tlk[TLK_WINDOW]
    return True


# The jitted loop returns to Python after a slice of cycles, and run_loop goes on where it stopped:
# a Ctrl-C (KeyboardInterrupt) or an alarm is seen between slices, and the results are the same as
# one call's whatever the slices (the loop's state lives in the state tuples; test_engine_slices).
# A slice starts at SLICE_CYCLES and is resized to last about SLICE_SECONDS of wall time (a
# machine of many cores or a busy memory system makes each cycle dearer).
SLICE_CYCLES = 1 << 12
SLICE_SECONDS = 0.25


def run_loop(C, TS, S, P, T, Dd, MS, TL, tlk, max_cycles, skip, out, slice_cycles: int | None = None,
             start: int = 0):
    """Run one launch to completion. out: RO_* (outcome, cycles, warp on a fault or deadlock,
    warp-instructions, skipped cycles). TL/tlk: the timeline (make_timeline). The loop
    runs in slices (``slice_cycles`` fixed, else sized by wall time from SLICE_CYCLES) and goes
    on where each stopped. ``start``: the cycle a launch stopped at ``max_cycles`` (CYCLE_LIMIT)
    goes on from (interval sampling looks at the launch between such stops); 0 starts it."""
    step_out = np.zeros(K.SO_N, np.int64)
    limit = int(max_cycles)
    fixed = slice_cycles is not None
    step = max(int(slice_cycles if fixed else SLICE_CYCLES), 1)
    now = int(start)
    while True:
        t0 = time.perf_counter()
        _run_slice(*_slice_args(C, TS, S, P, T, Dd, MS, TL, tlk, min(limit, now + step), skip, out, step_out, now))
        if out[RO_OUTCOME] != CYCLE_LIMIT or int(out[RO_CYCLES]) >= limit:
            return
        ran = int(out[RO_CYCLES]) - now
        now = int(out[RO_CYCLES])
        if not fixed and ran > 0:
            dt = max(time.perf_counter() - t0, 1e-6)
            step = int(min(max(ran * SLICE_SECONDS / dt, 1), 4 * step, 1 << 30))


def _slice_args(C, TS, S, P, T, Dd, MS, TL, tlk, end, skip, out, step_out, now) -> tuple:
    return (C, TS, S, P, T, Dd, MS, TL[:TL_ROWS], tlk, np.int64(end), skip, out, step_out, np.int64(now),
            TL[TL_ROWS])


def load_loop(C, TS, S, P, T, Dd, MS, TL, tlk, skip) -> None:
    """Have the jitted loop ready for these state types before it runs: loaded from numba's
    cache, or compiled (so that a run's simulation seconds hold neither)."""
    from numba import typeof

    args = _slice_args(C, TS, S, P, T, Dd, MS, TL, tlk, 0, skip, np.zeros(RO_N, np.int64), np.zeros(K.SO_N, np.int64), 0)
    sig = tuple(typeof(a) for a in args)
    if sig not in _run_slice.overloads:
        _run_slice.compile(sig)


@njit(nrt=True)  # allocates the scheduler's scratch
def _run_slice(C, TS, S, P, T, Dd, MS, TL, tlk, end, skip, out, step_out, start, last):
    """The state tuples travel as StatePtrs (archsim.engine.ref: one word a call) from here on.
    ``last`` takes the per-unit counters as of the cycle the slice stops at (timeline_rows' last
    row; sampled here, not from Python, so that unit_sample compiles once, for the StatePtr)."""
    ms = as_ptr(MS)
    _run(as_ptr(C), as_ptr(TS), as_ptr(S), as_ptr(P), as_ptr(T), as_ptr(Dd), ms, TL, tlk, end,
         skip, out, step_out, start)
    UT.unit_sample(ms, last, np.int64(TL_UNITS_AT), out[RO_CYCLES])


@njit(cache=True, inline="always")   # into _run_slice: the whole loop is optimised once, not twice
def _run(C, TS, S, P, T, Dd, MS, TL, tlk, max_cycles, skip, out, step_out, start):
    """The loop from cycle ``start`` (0: the launch begins) until it ends or reaches ``max_cycles``."""
    cores = C.v[K.C_CORES]
    nsub = C.v[K.C_SUBCORES]
    every = not skip  # the reference order: every scheduler every cycle, no jumps
    now = np.int64(start)
    nspan = TS.wsum.shape[0]
    nsc = TS.wake.shape[0]
    if start == 0:
        TS.k[WS.K_CUR] = -1
        K.dispatch_all(C, TS, S, now)
        MP.mpe_start(MS.mpe, TS, now)  # Sunway: the CPEs wait for their MPE's launch messages
        for j in range(nspan):
            TS.wsum[j] = WS.wake_span_min(TS, j)
    nblocks = TS.k[WS.K_END]
    # a launch ends when its last block has retired, every MPE (Sunway) has joined its CPEs, and
    # its stores have reached the L2 (the memory controller without one): the next kernel would
    # see them there, as at a real kernel boundary
    while TS.k[WS.K_FINISHED] < nblocks or not MP.mpe_joined(MS.mpe) or \
            (MS.mk[MST.MK_STORES] > 0 and not M.mem_idle(MS)):
        while now >= tlk[TLK_NEXT]:
            _tl_sample(TL, tlk, TS, MS)
        TS.k[WS.K_CUR] = -1  # memory events wake sub-cores for this cycle
        M.mem_cycle(MS, TS, S, Dd, now)
        step_out[K.SO_ISSUED] = 0
        step_out[K.SO_FAULT] = 0
        # the schedulers in sub-core order, span by span: a span whose earliest wake lies ahead
        # holds none that is due (WS.wake_span_min)
        looked = 0
        issuing = 0
        for j in range(nspan):
            if TS.wsum[j] > now and not every:
                continue
            lo, hi = span_bounds(j, nsc)
            looked += hi - lo
            for i in range(lo, hi):
                if TS.wake[i] > now and not every:
                    continue  # nothing it waits on is due: it sleeps (stalls accounted later)
                c = TS.home[WS.HOME_CORE, i]
                if TS.core_blocks[c] == 0 or TS.launch_at[c] > now:
                    continue  # no block, or (Sunway) not launched yet
                TS.k[WS.K_CUR] = i
                before = step_out[K.SO_ISSUED]
                K.subcore_cycle(C, TS, S, P, T, Dd, MS, c, i - c * nsub, now, step_out)
                issuing += step_out[K.SO_ISSUED] > before
                if step_out[K.SO_FAULT]:
                    _stop(TS, out, np.int64(FAULT), now, step_out[K.SO_FAULT_WARP])
                    return
            TS.wsum[j] = WS.wake_span_min(TS, j)
        MS.visits[V_SCHED, 0] += looked
        MS.visits[V_SCHED, 1] += issuing
        TS.k[WS.K_CUR] = cores * nsub  # every scheduler has run: later events wake them next cycle
        _grid_barrier(TS, now)
        nxt = now + 1
        # the launch may have ended in this cycle without an issue (an MPE's join, stores drained):
        # the loop stops at now + 1 as it would with skip off, never after a jump
        ended = TS.k[WS.K_FINISHED] >= nblocks and MP.mpe_joined(MS.mpe) and \
            not (MS.mk[MST.MK_STORES] > 0 and not M.mem_idle(MS))
        if step_out[K.SO_ISSUED] == 0 and not ended:
            t = WS.INF  # the first cycle a scheduler may issue
            for j in range(nspan):
                if TS.wsum[j] < t:
                    t = TS.wsum[j]
            t_mem = M.mem_next_event(MS, now)
            if t >= WS.INF and M.mem_idle(MS):
                t = WS.INF  # no warp can become ready and no request is in flight: only refresh ticks on
            elif t_mem < t:
                t = t_mem
            if t >= WS.INF:
                if TS.k[WS.K_FINISHED] < nblocks or not MP.mpe_joined(MS.mpe):
                    _stop(TS, out, np.int64(DEADLOCK), now, _first_stuck(TS))
                    return
            elif skip and t > nxt:
                out[RO_SKIPPED] += t - nxt
                M.mem_skip(MS, t - nxt)
                while tlk[TLK_NEXT] < t:  # samples inside the jump (sleeping warps keep their reasons)
                    _tl_sample(TL, tlk, TS, MS)
                nxt = t
        now = nxt
        if now >= max_cycles:
            _stop(TS, out, np.int64(CYCLE_LIMIT), now, _first_stuck(TS))
            return
    _stop(TS, out, np.int64(DONE), now, np.int64(-1))


# ----------------------------------------------------------------------------- compiling in parts
# The loop's first compile takes minutes, most of it in two subtrees: the memory system's cycle
# (mem_cycle) and the cores' side (schedulers, dispatch, the memory side's next event, counters).
# loop_parts lists the functions _run calls with the numba types it calls them with; compiling
# one of them (dispatcher.compile) compiles and caches its subtree. warmup.py compiles the two
# parts in two processes at once, then the loop, which loads them from numba's cache.
def loop_parts(C, TS, S, P, T, Dd, MS, TL, tlk) -> dict:
    """{part: [(jitted function, argument types as _run passes them)]}, the heavier first."""
    from numba import typeof, types

    from archsim.engine.ref import ptr_type

    c, ts, s, p, t, dd, ms = (ptr_type(typeof(x)) for x in (C, TS, S, P, T, Dd, MS))
    mpe = ptr_type(typeof(MS.mpe))
    i64, i32 = types.int64, types.int32
    arr = typeof(np.zeros(1, np.int64))
    return {
        "memory": [(M.mem_cycle, (ms, ts, s, dd, i64))],
        "cores": [(core_memory, (ms, ts, s, dd, i64, i64)),       # first: mem_cycle calls it last
                  (K.subcore_cycle, (c, ts, s, p, t, dd, ms, i32, i64, i64, arr)),
                  (K.dispatch_all, (c, ts, s, i64)), (MP.mpe_start, (mpe, ts, i64)), (MP.mpe_joined, (mpe,)),
                  (WS.wake_span_min, (ts, i64)), (M.mem_idle, (ms,)), (M.mem_next_event, (ms, i64)),
                  (M.mem_skip, (ms, i64)), (_tl_sample, (typeof(TL[:TL_ROWS]), typeof(tlk), ts, ms)),
                  (_grid_barrier, (ts, i64)), (_first_stuck, (ts,)), (_stop, (ts, arr, i64, i64, i64)),
                  (UT.unit_sample, (ms, arr, i64, i64))],
    }


def compile_loop_part(name: str, C, TS, S, P, T, Dd, MS, TL, tlk) -> None:
    """Compile (or load from numba's cache) one part of loop_parts for these state types."""
    for fn, sig in loop_parts(C, TS, S, P, T, Dd, MS, TL, tlk)[name]:
        fn.compile(sig)


def loop_compiled() -> bool:
    """The jitted loop is compiled in this process, or numba's on-disk cache holds it for the
    engine's current source (engine/jit.py), so a run loads it instead of compiling."""
    if _run_slice.overloads:
        return True
    try:
        return bool(_run_slice._cache._cache_file._load_index())   # numba's index of the cached signatures
    except Exception:  # noqa: BLE001  (no index, or one that cannot be read: numba compiles)
        return False


@njit(cache=True)
def _stop(TS, out, outcome, now, warp):
    WS.flush_all(TS, now)
    out[RO_OUTCOME] = outcome
    out[RO_CYCLES] = now
    out[RO_WARP] = warp
    out[RO_ISSUED] = TS.issued.sum()


@njit(cache=True)
def _grid_barrier(TS, now):
    if TS.k[WS.K_GRIDBAR] == 0:
        return
    alive = 0
    for w in range(TS.wst.shape[0]):
        if TS.wst[w] != WS.T_EMPTY and TS.wst[w] != WS.T_DONE:
            alive += 1
    if TS.k[WS.K_GRIDBAR] == alive and TS.k[WS.K_NEXT] >= TS.k[WS.K_END]:
        TS.k[WS.K_GRIDBAR] = 0
        for c in range(TS.core_blocks.shape[0]):
            WS.wake_core(TS, c, now)
        for w in range(TS.wst.shape[0]):
            if TS.wst[w] == WS.T_GRIDBAR:
                TS.wst[w] = WS.T_RUN


@njit(cache=True)
def _first_stuck(TS):
    for w in range(TS.wst.shape[0]):
        if TS.wst[w] != WS.T_EMPTY and TS.wst[w] != WS.T_DONE:
            return w
    return -1
