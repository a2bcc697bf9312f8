"""Wave sampling against simulating every block, on the launches of a built-in model's decoder
block (every kernel that sampling would apply to: GEMMs and attention of many waves):

    python scripts/sample_check.py --hw a100 --workload gpt2-small --phase prefill
    python scripts/sample_check.py --hw a100 --workload llama2-7b --seq 2048 --only gemm

For each launch: the whole simulation's cycles, the sampled cycles, their relative difference,
the sampler's error estimate, how it answered (sampled, or whole after heads above the
threshold) and the share of the whole simulation's warp-instructions it ran. Full-size
launches take minutes each to simulate whole.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str]) -> int:
    from archsim.config import load_machine
    from archsim.runner import distinct_kernels, emit_block, timing_args
    from archsim.sample import DEFAULT_MAX_ERROR, DEFAULT_WAVES, concurrency, head_waves, time_sampled
    from archsim.workloads.model import load_workload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="a100")
    ap.add_argument("--workload", default="gpt2-small")
    ap.add_argument("--phase", default="prefill")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--only", default="", help="only kernels whose name contains this")
    ap.add_argument("--max-error", type=float, default=DEFAULT_MAX_ERROR)
    a = ap.parse_args(argv)
    machine = load_machine(a.hw)
    wl = load_workload(a.workload, {"phase": a.phase, "batch": a.batch, "seq": a.seq, "layers": 1})
    print(f"{'kernel':<16} {'waves':>6} {'whole cycles':>13} {'sampled':>13} {'diff':>7} {'est':>6} "
          f"{'method':>21} {'cost':>6} {'wall s':>7}")
    worst = 0.0
    for k, _ in distinct_kernels(emit_block(machine, wl)):
        if a.only not in k.name:
            continue
        C = concurrency(k.program, machine, k.launch)
        nw = -(-k.launch.blocks // C)
        if 2 * head_waves(DEFAULT_WAVES, C, k.launch.period) > nw:
            continue                              # never sampled: nothing to check
        args = timing_args(machine, k.params)
        t0 = time.perf_counter()
        s = time_sampled(k.program, machine, k.launch, args, max_error=a.max_error)
        w = time_sampled(k.program, machine, k.launch, args, sample=False)
        diff = s.timing.cycles / w.timing.cycles - 1
        worst = max(worst, abs(diff))
        method = "sampled" if s.sampled else "whole_after_fallback"
        print(f"{k.name:<16} {nw:>6} {w.timing.cycles:>13,} {s.timing.cycles:>13,} {diff * 100:>6.2f}% "
              f"{s.error_est * 100:>5.2f}% {method:>21} "
              f"{s.simulated_warp_instructions / w.simulated_warp_instructions:>6.2f} {time.perf_counter() - t0:>7.1f}",
              flush=True)
    print(f"largest difference: {worst * 100:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
