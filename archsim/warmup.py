"""The timing engine compiled once, before any worker needs it, on two cores when it has them.

numba compiles the engine the first time a process runs it and keeps the result in its on-disk
cache (engine/jit.py: one directory per engine source; the compile is announced there, in one
line). Worker processes started before that cache exists would each compile the whole engine
again, side by side. So a pool of workers (workers.spawn_executor) first has this process
compile it, and the workers then load it from the cache.

The compile itself is split (machine.loop_parts): a helper process compiles the memory system's
cycle while this one compiles the cores' side; then this process compiles the loop, which loads
both parts from the cache. On a host with one core the parts are compiled one after the other.
"""

from __future__ import annotations

import os
import time

_ready = False


def ensure_timing_engine() -> dict:
    """Compile the timing engine in this process (and a helper) unless numba's cache already holds
    it. Its seconds count as compile seconds in kernel_cache.stats (the small launches that finish
    the compile add nothing else there); returns them (empty when there was nothing to do)."""
    global _ready
    if _ready:
        return {}
    from archsim.engine.machine import loop_compiled

    _ready = True
    if loop_compiled():
        return {}
    from archsim import kernel_cache
    from archsim.engine.jit import ENTRY_POINTS, announce, compile_seconds, record_compile

    entry = ENTRY_POINTS["archsim.engine.machine._run_slice"]
    announce(entry)
    before = dict(kernel_cache.stats)
    t0, c0 = time.perf_counter(), compile_seconds()
    helper = _start_helper("memory") if _cores() > 1 else None
    try:
        compile_part("cores")
        if helper is None or not _finished(helper):
            compile_part("memory")         # (loaded from the cache when the helper compiled it)
    finally:
        if helper is not None and helper.poll() is None:   # interrupted or stuck: the helper goes too
            helper.kill()
            helper.wait()
    for run in _tiny_runs():               # the loop itself, and what the timing path calls from Python
        run.advance(10**7)
        run.finish(10**7)
    wall = time.perf_counter() - t0
    if compile_seconds() - c0 > 1.0:       # (a compile, not a load from the cache)
        record_compile(entry, wall, final=True)
    kernel_cache.stats.clear()
    kernel_cache.stats.update(before)      # the small launches are the compile's, not the user's work
    kernel_cache.stats["task_seconds"] += wall
    kernel_cache.stats["compile_seconds"] += wall
    return {"task_seconds": wall, "compile_seconds": wall}


HELPER_TIMEOUT_SECONDS = 900   # a helper still compiling after this is stopped; this process compiles its part


def _finished(helper) -> bool:
    import subprocess

    try:
        return helper.wait(timeout=HELPER_TIMEOUT_SECONDS) == 0
    except subprocess.TimeoutExpired:
        return False


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _start_helper(part: str):
    """A process compiling ``part`` (a fresh interpreter: it imports nothing of the caller's main
    module), or None when it cannot be started; if it fails, this process compiles that part."""
    import subprocess
    import sys

    code = f"from archsim.warmup import compile_part; compile_part({part!r}, parent={os.getpid()})"
    try:
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    except OSError:
        return None


def compile_part(part: str, parent: int | None = None) -> None:
    """Compile one part of machine.loop_parts for the engine's state types (those of any machine);
    ``parent``: in a helper process, the process it ends with."""
    if parent is not None:
        from archsim.lifetime import watch_parent

        watch_parent(parent)
    from archsim.engine.machine import compile_loop_part
    from archsim.isa.opcodes import tables

    r = _tiny_runs()[0]
    compile_loop_part(part, r.C, r.TS, r.S, r.prog.arrays(), tables(), r.Dd, r.MS, r.TL, r.tlk)


# a Sunway launch: each CPE gets a block into its LDM by DMA and puts it back
_SUNWAY_KERNEL = """.kernel warm_dma
.shared 256
.param buf
        s2r r0, %ctaid.x
        ldparam r1, buf
        mov.b64 r2, 256
        mad.i64 r1, r0, r2, r1
        mov.b64 r3, 0
        dma.get [r3], [r1], r2
        dma.wait 0
        dma.put [r1], [r3], r2
        dma.wait 0
        exit
"""


def _tiny_runs() -> list:
    """Small launches, not yet run, on each family's tiny machine: a vector add on tiny-gpu and a
    DMA round trip on tiny-sunway (the timing path reads back the counters of every block both
    have)."""
    from archsim.config import load_machine
    from archsim.engine.launch import Unbacked
    from archsim.engine.timing import shared_buffers, start_kernel
    from archsim.isa.asm import assemble, assemble_file
    from archsim.isa.program import Launch
    from archsim.paths import isa_kernel

    gpu = load_machine("tiny-gpu")
    n = 4096
    prog = assemble_file(isa_kernel("examples", "vector_add"))
    args = {"x": Unbacked(4 * n), "y": Unbacked(4 * n), "out": Unbacked(4 * n), "n": n}
    runs = [start_kernel(prog, gpu, Launch((8, 1, 1), (128, 1, 1)), args)]
    sw = load_machine("tiny-sunway")
    cpes = sw.groups * sw.cores.per_group
    (buf,) = shared_buffers(sw, [256 * cpes])
    runs.append(start_kernel(assemble(_SUNWAY_KERNEL), sw, Launch((cpes, 1, 1), (sw.cores.warp_width, 1, 1)),
                             {"buf": buf}))
    return runs
