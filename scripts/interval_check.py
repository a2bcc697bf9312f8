"""Interval sampling against simulating every cycle, on the one-wave launches of a built-in model's
decoder block, or on the synthetic loops of tests/test_interval.py (``--synthetic``):

    python scripts/interval_check.py --hw sw26010pro --workload gpt2-small --phase prefill
    python scripts/interval_check.py --hw tiny-gpu --synthetic

For each launch: its counted warp-instructions, how interval sampling answered it (interval, or
whole when no interval could), its cycles and error estimate, the whole simulation's cycles, their
difference, the share of the warp-instructions simulated and the wall time of each. Launches the
counter cannot count are listed as such. Full-size launches take minutes each to simulate whole.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

LOOPS = {
    # an FMA chain: one block a core, every warp alike (steady)
    "fma_loop": ("""
LOOP:   fma.f32 r2, r2, r2, r2
        fma.f32 r3, r2, r2, r2
        add.i64 r1, r1, 1
        setp.lt.i64 p0, r1, r0
   @p0  bra LOOP
        exit
""", 20000, 1),
    # the same with two blocks a core: the greedy scheduler starves the younger block
    "fma_loop_2_blocks": (None, 20000, 2),
    # a grid-stride load loop (its rate falls later in the launch)
    "load_loop": ("""
        s2r r4, %ctaid.x
        s2r r5, %ntid.x
        s2r r6, %tid.x
        mad.i64 r4, r4, r5, r6
        shl.b64 r4, r4, 2
        ldparam r7, x
        add.i64 r7, r7, r4
        s2r r8, %nctaid.x
        mul.i64 r8, r8, r5
        shl.b64 r8, r8, 2
LOOP:   ld.global.b32 r9, [r7]
        add.i64 r7, r7, r8
        add.i64 r1, r1, 1
        setp.lt.i64 p0, r1, r0
   @p0  bra LOOP
        exit
""", 4000, 2),
}


def _synthetic(machine):
    from archsim.engine.launch import Unbacked
    from archsim.isa.asm import assemble
    from archsim.isa.program import Launch

    cores = machine.groups * machine.cores.per_group
    for name, (body, n, per_core) in LOOPS.items():
        body = body or LOOPS["fma_loop"][0]
        prog = assemble(".kernel loop\n.param n\n.param x\n.launch grid=1 block=128\n"
                        "        ldparam r0, n\n        mov.b64 r1, 0\n        mov.f32 r2, 1.0\n" + body)
        launch = Launch((cores * per_core, 1, 1), (128, 1, 1))
        yield name, prog, launch, {"n": n, "x": Unbacked(4 * n * cores * per_core * 128)}


def _workload(machine, a):
    from archsim.runner import distinct_kernels, emit_block, timing_args
    from archsim.sample import concurrency
    from archsim.workloads.model import load_workload

    wl = load_workload(a.workload, {"phase": a.phase, "batch": a.batch, "seq": a.seq, "layers": 1})
    for k, _ in distinct_kernels(emit_block(machine, wl)):
        if a.only in k.name and k.launch.blocks <= concurrency(k.program, machine, k.launch):
            yield k.name, k.program, k.launch, timing_args(machine, k.params)


def main(argv: list[str]) -> int:
    os.environ["ARCHSIM_CACHE_DIR"] = "off"
    from archsim.config import load_machine
    from archsim.engine import timing as TI
    from archsim.interval import time_interval
    from archsim.sample import DEFAULT_MAX_ERROR, refresh_stall_cycles

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="tiny-gpu")
    ap.add_argument("--synthetic", action="store_true", help="the synthetic loops instead of a model's kernels")
    ap.add_argument("--workload", default="gpt2-small")
    ap.add_argument("--phase", default="prefill")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--only", default="", help="only kernels whose name contains this")
    ap.add_argument("--stop-cycles", type=int, default=None, help="D, the first stops' spacing")
    ap.add_argument("--max-error", type=float, default=DEFAULT_MAX_ERROR)
    a = ap.parse_args(argv)
    machine = load_machine(a.hw)
    launches = _synthetic(machine) if a.synthetic else _workload(machine, a)
    more = {} if a.stop_cycles is None else {"stop_cycles": a.stop_cycles}
    print(f"{'kernel':<18} {'instr':>12} {'method':>8} {'cycles':>11} {'est':>6} {'whole':>11} {'diff':>7} "
          f"{'sim':>5} {'wall s':>7} {'whole s':>7}")
    worst = 0.0
    for name, prog, launch, args in launches:
        t0 = time.perf_counter()
        got = time_interval(prog, machine, launch, args, max_error=a.max_error,
                            refresh=refresh_stall_cycles(machine), **more)
        t1 = time.perf_counter()
        if got is None:
            print(f"{name:<18} not countable", flush=True)
            continue
        whole = TI.time_kernel(prog, machine, launch, args)
        t2 = time.perf_counter()
        diff = got.timing.cycles / whole.cycles - 1
        if got.sampled:
            worst = max(worst, abs(diff))
        share = got.info["instructions_simulated"] / max(got.info["instructions_total"], 1)
        print(f"{name:<18} {got.info['instructions_total']:>12,} {'interval' if got.sampled else 'whole':>8} "
              f"{got.timing.cycles:>11,} {got.error_est * 100:>5.2f}% {whole.cycles:>11,} {diff * 100:>+6.2f}% "
              f"{share:>5.2f} {t1 - t0:>7.1f} {t2 - t1:>7.1f}", flush=True)
    print(f"largest difference of an interval answer: {worst * 100:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
