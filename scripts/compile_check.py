"""Compile the timing engine from an empty numba cache, as a first run after install does, and say
how long each step took and whether the loop's own compile compiled a part again.

    python scripts/compile_check.py [--serial]

warmup.ensure_timing_engine compiles machine.loop_parts in two processes, then the loop, which
should load both parts from the cache: a part function compiled again under the loop means its
entry in loop_parts no longer has the types _run calls it with (the split then buys nothing for
that part). ``--serial`` compiles the loop alone in one process, for comparison. Takes one to two
minutes; the cache is a temporary directory, removed at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time


def main(argv: list[str]) -> int:
    tmp = tempfile.TemporaryDirectory(prefix="archsim-numba-")
    os.environ["NUMBA_CACHE_DIR"] = tmp.name        # before numba is imported (engine/jit.py honours it)
    from numba.core.event import install_recorder

    from archsim import warmup
    from archsim.engine import machine as MA

    t0 = time.perf_counter()
    with install_recorder("numba:compile") as rec:
        if "--serial" in argv:
            run = warmup._tiny_runs()[0]
            run.advance(10**7)
        else:
            warmup.ensure_timing_engine()
    wall = time.perf_counter() - t0
    parts = {fn.py_func.__qualname__ for fns in MA.loop_parts(*_states()).values() for fn, _ in fns}
    depth, top, again = 0, None, []
    for ts, ev in rec.buffer:
        name = ev.data["dispatcher"].py_func.__qualname__
        if ev.is_start:
            if depth == 0:
                top, start = name, ts
            elif top == "_run_slice" and name in parts:
                again.append(name)
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                print(f"  {top:<24} {ts - start:6.1f} s")
    print(f"compiled in {wall:.1f} s wall" + ("" if "--serial" in argv else " (the memory part on a helper process)"))
    if again:
        print("compiled again under the loop (loop_parts' types differ from _run's): " + ", ".join(sorted(set(again))))
        return 1
    return 0


def _states():
    from archsim import warmup
    from archsim.isa.opcodes import tables

    r = warmup._tiny_runs()[0]
    return r.C, r.TS, r.S, r.prog.arrays(), tables(), r.Dd, r.MS, r.TL, r.tlk


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
