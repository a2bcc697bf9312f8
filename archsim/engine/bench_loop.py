"""The minimal issue loop `archsim bench` times beside the engine (bench.host_loop_ns): what a
cycle loop of SIMT issues costs on this host with no model in it."""

from __future__ import annotations

from archsim.engine.jit import njit


@njit(cache=True)
def issue_loop(ready, regs, issues):
    """Cycle by cycle, every warp whose ready cycle has come issues one instruction: a 32-lane
    integer add over its registers (execute at issue), then it waits out a latency that depends on
    its slot (the scoreboard). Stops after ``issues`` issues and returns how many it made."""
    n = 0
    now = 0
    W, R, L = regs.shape
    while n < issues:
        for w in range(W):
            if ready[w] <= now:
                d = n % R
                a = (d + 1) % R
                b = (d + 2) % R
                for lane in range(L):
                    regs[w, d, lane] = regs[w, a, lane] + regs[w, b, lane] + lane
                ready[w] = now + 4 + (w & 3)
                n += 1
        now += 1
    return n
