"""Interval sampling: time a long launch of one wave from an interval of it (opt-in:
``--sample-interval``, ``sample_interval`` in sweeps).

Wave sampling (archsim.sample) needs many waves of blocks. A launch whose blocks are all resident
at once and loop for a long time (a grid-stride stream, a persistent kernel, a Sunway kernel whose
CPEs each loop over their share) has one wave, so it is sampled inside the blocks:

- engine/counts.py counts every block's warp-instructions, and every instruction's, exactly and
  without timing (a launch whose control flow reads memory or floating-point values cannot be
  counted and is simulated whole; one that reads ``%coreid`` is counted once its blocks are placed);
- the launch is simulated with stops at cycles t = D x 4, 6, 8, 12, 16, 24, 32, ... (D =
  ``STOP_CYCLES``); at each stop from 8D on, the second half of what was simulated, [t/2, t], is
  the measured interval and the first half is warm-up (caches fill, queues reach their depth);
- two ends bound the cycles left: the warp-instructions left, R, at the machine's issue rate
  over the interval (a block that fell behind by chance catches up when others are done), and
  the last block at its own rate (one slower for good, starved by a greedy scheduler, ends the
  launch later). The launch ends at t + their middle (plus, on a Sunway, the MPEs' join, taken
  equal to their launch: both walk the same CPEs), and half their gap is part of the error;
- the error estimate adds, over the share of the cycles extrapolated: the issue rate's drift
  (its change from [t/4, t/2] to the interval, carried on at that pace to the middle of the
  cycles left: a rate that still moves, however slowly, moves on) or twice its standard error
  over the interval's timeline windows, whichever is larger, plus one DRAM refresh's stall over
  the interval when the launch uses
  the DRAM; how far the memory instructions left differ in mix from the interval's, plus the share
  of the work left at instructions the interval never issued; and, over the whole launch, half
  the gap between the two ends. A memory instruction, barrier or wait still to come that the
  interval never issued (a phase it did not see, such as a GEMM epilogue's stores) makes the
  estimate 1;
- at or below ``max_error`` the launch is answered; above, it runs on to the next stop, and past
  two thirds of its warp-instructions to its end (exact, the same cycles as a whole run);
- extensive counters (stall warp-cycles, flops, bytes per level, cache accesses ...) go on at the
  interval's rate per warp-instruction: c(t) + (c(t) - c(t/2)) x R / (I(t) - I(t/2)), I(t) the
  warp-instructions issued by t; warp-instructions are exact. Rates and the timeline are the
  simulated part's.

The record's ``sample_method`` is ``interval`` and ``sample_interval`` says where the interval
lay, what was counted and every stop's error estimate.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from archsim.engine import machine as MA
from archsim.engine import timing as TI
from archsim.engine.counts import control_slice, count_launch
from archsim.isa.program import Launch, Program
from archsim.stats import extensive_memory_fields

STOP_CYCLES = 16384            # D: the first stop is at 4D, the first answer at 8D (a launch of fewer
                               # than 12D cycles ends before two thirds of it could be extrapolated)
MIN_WINDOWS = 6                # timeline windows the interval must hold for an error estimate


def stops(delta: int):
    """D x 4, 6, 8, 12, 16, 24, ...: every stop's half is an earlier stop."""
    j = 4
    while True:
        yield j * delta
        j = j * 3 // 2 if j & (j - 1) == 0 else j * 4 // 3


@dataclasses.dataclass
class IntervalResult:
    timing: MA.KernelTiming      # extrapolated counters (or the whole launch's, when it ran on to its end)
    sampled: bool
    error_est: float
    info: dict                   # the record's sample_interval


def extend_counter(a, b, g: float):
    """b + (b - a) x g for a counter (int, array) at two points a and b."""
    if isinstance(b, np.ndarray):
        return np.rint(b + (b - a) * g).astype(np.int64)
    return int(round(b + (b - a) * g))


def _at(d, path):
    for k in path:
        d = d[k]
    return d


def extend_counters(a: MA.KernelTiming, b: MA.KernelTiming, g: float, **fields) -> MA.KernelTiming:
    """b's timing with its extensive counters carried on along the line from a to b: c_b + (c_b -
    c_a) x g (an interval's rate carried over the work left, a k-loop cut's over the tiles left),
    ``fields`` replaced, and no buffers. It lives here, not in the stats layer, because the kernel
    cache keeps interval answers and its code fingerprint holds this module."""
    mem = extensive_memory_fields(b.memory, lambda d, key, path: extend_counter(_at(a.memory, path), d[key], g))
    ext = {f: extend_counter(getattr(a, f), getattr(b, f), g)
           for f in ("warp_instructions", "skipped_cycles", "stall", "flops", "pipe_busy_cycles")}
    ext.update(memory=mem, buffers={})
    return dataclasses.replace(b, **{**ext, **fields})


def _issue_rate_error(t: MA.KernelTiming, lo: int, hi: int, rest: float) -> float:
    """The relative error of the issue rate of [lo, hi] as the rate of the ``rest`` cycles after
    hi: the larger of twice the standard error of the interval's mean rate (over its timeline
    windows) and the drift of the rate, the change from [lo / 2, lo] to [lo, hi] carried on at
    the same pace to the middle of the cycles left (a rate that still moves, however slowly, moves
    on); 1 when the interval holds fewer than MIN_WINDOWS windows."""
    window, rows = t.timeline
    if rows is None or window <= 0:
        return 1.0
    ends = (np.arange(len(rows) - 1) + 1) * window      # the last row is the run's end, not a window
    sel = np.flatnonzero((ends >= lo) & (ends <= hi))
    before = np.flatnonzero((ends >= lo // 2) & (ends <= lo))
    if len(sel) < MIN_WINDOWS + 1 or len(before) < 2:
        return 1.0
    per = np.diff(rows[sel, 0].astype(np.float64))      # warp-instructions of each window
    m = per.mean()
    if m <= 0:
        return 1.0
    noise = 2 * per.std(ddof=1) / np.sqrt(len(per))
    r_before = float(rows[before[-1], 0] - rows[before[0], 0]) / float(ends[before[-1]] - ends[before[0]])
    r_now = m / window
    centre_before, centre_now = (ends[before[0]] + ends[before[-1]]) / 2, (lo + hi) / 2
    reach = (hi - centre_now + rest / 2) / (centre_now - centre_before)
    drift = abs(r_now - r_before) / r_now * reach
    return float(max(drift, noise / m))


MEMORY_SEMS = frozenset(("ld", "st", "ldmatrix", "cpasync", "cpwait", "dma_get", "dma_put", "dma_wait", "rma_put",
                         "rma_get", "rma_wait", "bar", "bargrid"))


def _memory_pcs(prog: Program) -> np.ndarray:
    """The pcs of instructions whose time depends on the memory system or on other warps."""
    from archsim.isa.opcodes import opcodes

    ops = opcodes()
    return np.array([ops[int(o)].sem in MEMORY_SEMS for o in prog.op], bool)


def _mix_error(left: np.ndarray, seen: np.ndarray, memory: np.ndarray) -> float:
    """How far the work left differs from the interval's: 1 when a memory instruction the interval
    never issued is still to come (a phase it did not see: a GEMM epilogue's stores); else the
    relative difference between the memory instructions left and the interval's scaled to the
    work left, plus the share of the work left at instructions the interval never issued."""
    if left.sum() <= 0:
        return 0.0
    if np.any(memory & (left > 0) & (seen == 0)):
        return 1.0
    g = left.sum() / max(seen.sum(), 1)
    m_left, m_seen = left[memory].astype(np.float64), seen[memory].astype(np.float64) * g
    mix = float(np.abs(m_left - m_seen).sum() / m_seen.sum()) if m_seen.sum() > 0 else 0.0
    return mix + float(left[seen == 0].sum() / left.sum())


def time_interval(prog: Program, machine, launch: Launch, args: dict, *, max_error: float,
                  max_cycles: int = 10**9, window_cycles: int = 1024, placement: str = "cross",
                  refresh: float = 0.0, stop_cycles: int = STOP_CYCLES) -> IntervalResult | None:
    """Time a one-wave launch by interval sampling (module docstring; ``stop_cycles`` is D); None
    when its control flow cannot be counted, and the caller simulates it whole."""
    cslice = control_slice(prog)
    placed = cslice[0] is None                   # countable only once the blocks are on their cores
    if placed:
        cslice = control_slice(prog, placed=True)
        if cslice[0] is None:
            return None
    params = TI.param_values(prog, args)
    counts = None
    if not placed:
        counts, _ = count_launch(prog, launch, params, machine.cores.warp_width, cslice=cslice)
        if counts is None:
            return None
    memory = _memory_pcs(prog)
    run = TI.start_kernel(prog, machine, launch, args, window_cycles=window_cycles, placement=placement)
    run.advance(1)                   # every block placed on its core (one wave): %coreid is known
    if counts is None:
        counts, _ = count_launch(prog, launch, params, machine.cores.warp_width, run.TS.blk_core, cslice=cslice)
        if counts is None:
            return None
    total = int(counts.per_block.sum())
    snaps = {}          # stop cycle -> (counters, per-block issued, per-pc issued, cycle)
    tried = []
    for stop in stops(stop_cycles):
        run.advance(min(stop, max_cycles))
        if run.done or run.now >= max_cycles:
            break
        TS, t = run.TS, run.now
        issued = TS.blk_issued.copy()
        if np.any(issued > counts.per_block):
            break                             # not the counted program's path: simulate it all
        snaps[stop] = (run.counters(), issued, TS.pc_issued.copy(), t)
        if int(run.out[MA.RO_ISSUED]) * 3 > 2 * total:
            break                             # two thirds done: the rest costs less than a wrong answer
        if stop // 2 not in snaps:
            continue
        a, issued_a, pcs_a, t_a = snaps[stop // 2]
        b = snaps[stop][0]
        got = _answer(a, b, issued_a, issued, pcs_a, TS.pc_issued, t_a, t, counts, memory, refresh)
        tried.append({"cycle": t, "error_est": round(got[1], 5)})
        if got[1] <= max_error:
            cycles, err, g = got
            timing = extend_counters(a, b, g, cycles=int(round(cycles)), timeline_end=t, warp_instructions=total,
                                     block_done=np.where(b.block_done >= 0, b.block_done, int(round(cycles))))
            info = {"instructions_total": total, "instructions_simulated": int(b.warp_instructions),
                    "interval_cycles": [int(t_a), int(t)], "stops": tried}
            return IntervalResult(timing, True, float(err), info)
    if not run.done and run.now < max_cycles:
        run.advance(max_cycles)
    timing = run.finish(max_cycles)
    info = {"instructions_total": total, "instructions_simulated": int(timing.warp_instructions), "stops": tried}
    return IntervalResult(timing, False, 0.0, info)


def _answer(a, b, issued_a, issued, pcs_a, pcs, t_a: int, t: int, counts, memory, refresh: float):
    """(cycles, error estimate, extension factor) of the launch from the interval [t_a, t] between
    the counters a and b, and the blocks' and pcs' warp-instructions issued at both ends (module
    docstring); error 1 when the interval cannot answer."""
    if t <= t_a:
        return 0.0, 1.0, 0.0
    left = counts.per_block - issued
    busy = left > 0
    ipc = float((issued - issued_a).sum()) / (t - t_a)      # the machine's issue rate over the interval
    own = (issued - issued_a)[busy] / float(t - t_a)       # each busy block's own rate
    if ipc <= 0 or not busy.any() or np.any(own <= 0):
        return 0.0, 1.0, 0.0
    # two ends bound the launch: the work left at the machine's rate (a block that fell behind by
    # chance, at the scheduler or the memory system, catches up when others are done), and the
    # last block at its own rate (one that is slower for good, e.g. starved by a greedy
    # scheduler, ends the launch later); the answer is their middle, the half gap an error
    lo = float(left.sum()) / ipc
    hi = float(np.max(left[busy] / own))
    rest = (lo + hi) / 2
    spread = (hi - lo) / 2
    join = b.memory["mpe"]["launch_cycles"] if "mpe" in b.memory else 0
    cycles = t + rest + join
    d = b.memory["bytes"]
    rate_err = _issue_rate_error(b, t_a, t, rest) + (refresh / (t - t_a) if d["dram_read"] + d["dram_write"] > 0 else 0.0)
    mix_err = _mix_error(counts.per_pc - pcs, pcs - pcs_a, memory)
    err = 1.0 if mix_err >= 1 else min(1.0, (rate_err + mix_err) * rest / cycles + spread / cycles)
    did = b.warp_instructions - a.warp_instructions
    g = (int(counts.per_block.sum()) - b.warp_instructions) / did if did > 0 else 0.0
    return cycles, err, g
