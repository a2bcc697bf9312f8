"""Wave sampling: time a big launch from a few simulated waves of thread blocks.

A transformer's GEMMs launch thousands of blocks that all do the same work; once the machine is
full, blocks retire at a steady rate. A launch of more than ``waves + 1`` waves (a wave is C
blocks, as many as the machine holds at once) is timed as

    cycles = e_S + (B - S*C) * T_w / C

- the first S waves (S = ``waves``; blocks [0, S*C) of the grid) are simulated cycle by cycle;
  e_S is the cycle the last of them retires, so it holds the cold start (empty caches, idle DRAM)
  and one final drain, which the whole launch has too;
- T_w, the steady time of a wave, is the mean of waves 2..S, each measured between the
  retirements of the (i-1)*C-th and the i*C-th block (wave 1 is the cold start);
- the B - S*C blocks left retire at C / T_w blocks a cycle; on a Sunway the MPEs' join of the
  head (last CPE done to join, engine/mpe.py) is added once (their launch is in wave 1). Blocks
  are dispatched as slots free up, so a last partial wave overlaps the full wave before it; a separately simulated tail would
  count a second drain (tried: +7% on a 10-wave a100 GEMM, against +5.7% for this rule).

Blocks keep their grid ids (``time_kernel(blocks=...)``), so they touch the addresses they touch
in the whole launch. Extensive counters (warp-instructions, flops, bytes per level, stall
warp-cycles, fabric blocked cycles, cache accesses) of the sampled waves are scaled by
B / (S*C); rates (link utilization, queue depths, row-hit rates) and the timeline are those of
the sampled waves. ``sample_error_est`` is the relative difference of the last two steady waves'
durations times the extrapolated share of the cycles (S >= 3). On a 10-wave a100 GEMM
(4096x4096x256 fp16) the sampled estimate is within 6% of the whole simulation, at a third of
the cost; warp-instructions are exact when every block runs the same code.

A ``bar.grid`` kernel is never sampled: its whole grid must be resident, so it is one wave.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from archsim.engine import timing as TI
from archsim.engine.machine import KernelTiming
from archsim.isa.program import Launch, Program
from archsim.stats import kernel_record

DEFAULT_WAVES = 3


def concurrency(prog: Program, machine, launch: Launch) -> int:
    """Blocks the whole machine holds at once: one wave."""
    return TI.blocks_per_core(prog, machine, launch) * machine.groups * machine.cores.per_group


@dataclasses.dataclass
class Sampled:
    """The outcome of a timed launch, whole or sampled."""

    timing: KernelTiming       # counters (extrapolated when sampled)
    sampled: bool
    error_est: float
    waves_total: int
    waves_simulated: float
    simulated_warp_instructions: int  # what the engine actually ran (the sampled waves when sampled)


def _scale_memory(mem: dict, f: float) -> dict:
    """Memory counters of the sampled waves with the extensive ones scaled by f."""
    out = copy.deepcopy(mem)

    def scale(d, key):
        d[key] = int(round(d[key] * f))

    for k in mem["bytes"]:
        scale(out["bytes"], k)
    for k in ("sum", "count"):
        scale(out["load_latency"], k)
    scale(out["fabric"], "blocked_cycles")
    for ln in out["fabric"]["links"]:
        scale(ln, "blocked_cycles")
    for lvl in ("l1", "l2"):
        for rec in out.get(lvl, ()):
            for k in ("accesses", "hits"):
                if k in rec:
                    scale(rec, k)
    return out


def time_sampled(prog: Program, machine, launch: Launch, args: dict, *, waves: int = DEFAULT_WAVES,
                 max_cycles: int = 10**9, window_cycles: int = 1024, sample: bool = True,
                 placement: str = "cross") -> Sampled:
    """Time a launch, sampling waves when it has more than ``waves + 1`` of them (see the module
    docstring). ``sample=False`` simulates every block. ``placement``: see timing.time_kernel."""
    C = concurrency(prog, machine, launch)
    B = launch.blocks
    nwaves = -(-B // C)
    if not sample or waves < 3 or nwaves <= waves + 1:
        t = TI.time_kernel(prog, machine, launch, args, max_cycles=max_cycles, window_cycles=window_cycles,
                           placement=placement)
        return Sampled(t, False, 0.0, nwaves, float(nwaves), t.warp_instructions)
    S = waves
    head = TI.time_kernel(prog, machine, launch, args, max_cycles=max_cycles, window_cycles=window_cycles,
                          blocks=(0, S * C), placement=placement)
    done = np.sort(head.block_done)
    ends = [int(done[i * C - 1]) for i in range(1, S + 1)]
    dur = np.diff(np.array([0] + ends, np.float64))
    steady = dur[1:]
    T_w = float(steady.mean())
    rest = B - S * C
    # a Sunway launch ends when the MPEs have joined their CPEs: the head's join (the last block's
    # completion reaching its MPE, engine/mpe.py) follows the whole launch's last block too
    join = head.memory["mpe"]["join_cycles"] if "mpe" in head.memory else 0
    cycles = ends[-1] + join + rest * T_w / C
    spread = abs(float(steady[-1] - steady[-2])) / T_w if T_w > 0 else 0.0
    err = spread * (rest * T_w / C) / cycles if cycles > 0 else 0.0
    f = B / (S * C)

    def ext(a):  # an extensive counter of the head, scaled to the whole launch
        return np.rint(a * f).astype(np.int64) if isinstance(a, np.ndarray) else int(round(a * f))

    t = dataclasses.replace(
        head, cycles=int(round(cycles)), timeline_end=head.cycles, warp_instructions=ext(head.warp_instructions),
        skipped_cycles=ext(head.skipped_cycles), stall=ext(head.stall), flops=ext(head.flops),
        pipe_busy_cycles=ext(head.pipe_busy_cycles), memory=_scale_memory(head.memory, f), buffers={})
    return Sampled(t, True, float(err), nwaves, float(S), int(head.warp_instructions))


def sampled_record(name: str, prog: Program, machine, launch: Launch, args: dict, *, count: int = 1,
                   flops: int | None = None, model_flops: int | None = None, waves: int = DEFAULT_WAVES,
                   max_cycles: int = 10**9, sample: bool = True, trace: bool = False,
                   placement: str = "cross") -> dict:
    """One ``kernels`` entry of archsim.result/1 for a launch, sampled when it is big. ``trace``
    adds ``block_trace``: dispatch and retire cycle and core of every simulated block (for
    archsim.report.trace)."""
    s = time_sampled(prog, machine, launch, args, waves=waves, max_cycles=max_cycles, sample=sample,
                     placement=placement)
    rec = kernel_record(name, machine, launch, s.timing, count=count, model_flops=model_flops, flops=flops,
                        sampled=s.sampled, sample_error_est=round(s.error_est, 5))
    rec["waves"] = s.waves_total
    rec["waves_simulated"] = round(s.waves_simulated, 3)
    rec["simulated_warp_instructions"] = int(s.simulated_warp_instructions)
    if trace:
        t = s.timing
        rec["block_trace"] = {"first_block": int(t.first_block), "start": [int(x) for x in t.block_start],
                              "done": [int(x) for x in t.block_done], "core": [int(x) for x in t.block_core]}
    return rec
