"""`archsim bench`: simulator speed in warp-instructions per wall second, single process.

A Sunway case counts CPE instructions (a CPE runs one warp). Each case also records its CPU
seconds (``warp_instructions_per_cpu_second``: the figure to compare on a loaded machine).
Every case runs once on a tiny config first so that numba's compilation (or cache load) is not
timed, then ``repeat`` times timed; a case's figures are those of its median run (by wall time;
``wall_seconds_runs`` lists every run), so one run slowed by the rest of the machine does not move
them. The figure is the median over cases (``archsim.bench/1`` in docs/records.md).

Each case also records its seconds of simulation alone, the engine's nanoseconds per
warp-instruction over them, and its unit visits per family (stats.visit_shares: units looked at per
simulated cycle, the share that changed nothing); the record carries the host's figure for a
minimal SIMT issue loop measured in the same run (``host_loop_ns_per_issue``), so that the
engine's cost per warp-instruction can be read against this host's speed (``--profile`` prints
them).

``--jobs``: whole jobs users wait for (a compare, full-size models), each run once in one process
and once on a pool of workers (archsim.workers), with the kernel timing cache off: wall seconds,
modelled cycles per wall second and warp-instructions per second of both, beside each other in
``jobs``. They take minutes to hours; ``--job NAME`` picks some.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from archsim.config import load_machine
from archsim import kernel_cache
from archsim.stats import visit_shares

SCHEMA = "archsim.bench/1"

# name, machine, micro, params (sizes that take seconds, not minutes, on one core)
CASES = (
    ("a100-gemm-fp16-1024", "a100", "gemm", {"m": 1024, "n": 1024, "k": 1024}),
    ("a100-stream-read-64MiB", "a100", "bandwidth", {"kind": "read", "footprint_mib": 64}),
    ("a100-pchase-l2", "a100", "latency", {"footprint_kib": 4096, "loads": 4096}),
    # the Sunway GEMM emitter on all 384 CPEs (LDM tiles, DMA panels, vector f16x2 FMA)
    ("sw26010pro-gemm-fp16-1024", "sw26010pro", "gemm", {"m": 1024, "n": 1024, "k": 1024}),
    # all 384 CPEs stream 48 MiB through their LDMs with DMA (16 blocks of 8 KiB each), cross segment
    ("sw26010pro-stream-read-48MiB", "sw26010pro", "bandwidth", {"kind": "read", "footprint_mib": 48}),
)
# name, machines, workload, scenario overrides: the jobs of issue 22's table
JOBS = (
    ("compare-gpt2-small", ("a100", "sw26010pro"), "gpt2-small", {}),
    ("a100-gpt3-175b-prefill", ("a100",), "gpt3-175b", {}),
    ("a100-bloom-176b-train", ("a100",), "bloom-176b", {}),
    ("sw26010pro-bloom-176b-train", ("sw26010pro",), "bloom-176b", {}),
)
WARMUP = (("tiny-gpu", "gemm", {"m": 64, "n": 64, "k": 64}), ("tiny-gpu", "bandwidth", {"footprint_mib": 1}),
          ("tiny-gpu", "latency", {"footprint_kib": 4, "loads": 64}),
          ("tiny-sunway", "bandwidth", {"footprint_mib": 1}), ("tiny-sunway", "gemm", {"m": 64, "n": 64, "k": 64}))


def run_bench(cases=CASES, progress=None, repeat: int = 3, warmup=WARMUP) -> dict:
    """Every case simulated ``repeat`` times (the kernel timing cache is not used)."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    with kernel_cache.disabled():
        return _run_bench(cases, progress, repeat, warmup)


def _run_bench(cases, progress, repeat: int, warmup) -> dict:
    from archsim import micro as MI   # the engine: not loaded before the options are checked

    for hw, name, params in warmup:  # JIT compile / cache load, not timed
        MI.run_micro(name, load_machine(hw), params)
    out = []
    for case, hw, name, params in cases:
        runs = []
        for _ in range(repeat):
            m = load_machine(hw)
            t0, c0 = time.perf_counter(), time.process_time()
            r = MI.run_micro(name, m, params)
            runs.append((time.perf_counter() - t0, time.process_time() - c0, r))
        walls = [x[0] for x in runs]
        wall, cpu, r = sorted(runs, key=lambda x: x[0])[(repeat - 1) // 2]   # the median run
        wi = sum(k["warp_instructions"] for k in r.kernels)
        sim_s, simulated = r.spent["simulate_seconds"], r.spent["simulated_warp_instructions"]
        rec = {"name": case, "machine": hw, "micro": name, "params": r.params, "warp_instructions": wi,
               "simulated_cycles": sum(k["cycles"] for k in r.kernels), "wall_seconds": round(wall, 3),
               "warp_instructions_per_second": round(wi / wall, 1), "cpu_seconds": round(cpu, 3),
               "warp_instructions_per_cpu_second": round(wi / max(cpu, 1e-9), 1), "value": r.value, "unit": r.unit,
               "repeat": repeat, "wall_seconds_runs": [round(w, 3) for w in walls],
               "simulate_seconds": round(sim_s, 4),
               "ns_per_warp_instruction": round(sim_s * 1e9 / simulated, 1) if simulated else None,
               "visits": visit_shares(r.spent)}
        out.append(rec)
        if progress:
            progress(rec)
    return {"schema": SCHEMA, "cases": out,
            "warp_instructions_per_second": statistics.median(c["warp_instructions_per_second"] for c in out),
            "host_loop_ns_per_issue": round(host_loop_ns(), 2)}


def host_loop_ns(warps: int = 64, issues: int = 2_000_000) -> float:
    """The host's figure for a minimal numba issue loop, measured now: nanoseconds per warp
    instruction of a cycle loop over ``warps`` warps that each issue when their ready cycle has
    come, execute a 32-lane integer add over their registers and wait out a fixed latency. The
    engine's nanoseconds per warp-instruction over this is what its model costs beyond a bare
    SIMT issue loop on the same host (the host's own speed divides out)."""
    from archsim.engine.bench_loop import issue_loop

    ready = np.zeros(warps, np.int64)
    regs = np.zeros((warps, 8, 32), np.int64)
    issue_loop(ready, regs, 1000)                # compiled (or loaded) before timing
    best = float("inf")
    for _ in range(3):
        ready[:] = 0
        t0 = time.perf_counter()
        n = issue_loop(ready, regs, issues)
        best = min(best, (time.perf_counter() - t0) * 1e9 / n)
    return best


def _job_once(machines: list, wl, workers: int) -> dict:
    from archsim.runner import RunOptions, run_many

    before = kernel_cache.stats["simulated_warp_instructions"]
    t0 = time.perf_counter()
    docs = run_many(machines, wl, RunOptions(workers=workers))
    wall = time.perf_counter() - t0
    for d in docs:
        if isinstance(d, Exception):
            raise d
    cycles = sum(d["total"]["cycles"] for d in docs)
    wi = kernel_cache.stats["simulated_warp_instructions"] - before
    return {"wall_seconds": round(wall, 3), "simulated_cycles": int(cycles),
            "cycles_per_second": round(cycles / wall, 1), "warp_instructions": wi,
            "warp_instructions_per_second": round(wi / wall, 1),
            "kernels": [row for d in docs for row in job_kernels(d)],
            "totals": [d["total"] for d in docs]}


def job_kernels(doc: dict) -> list[dict]:
    """Where a run's time went, one row per distinct kernel of a result record: its launch's
    waves and the waves simulated (all of them unless wave-sampled), its warp-instructions and
    those simulated, and the wall and simulation seconds its timing cost."""
    effort = doc.get("sim", {}).get("kernels", {})
    rows = []
    for k in doc["kernels"]:
        e = effort.get(k["name"], {})
        tried = k.get("sample_attempts") or []
        sampled = k.get("sample_method") == "sampled" and tried
        simulated = tried[-1]["waves"] if sampled else (
            k["waves_simulated"] if k.get("sample_method") == "k_loop" else k.get("waves", 1))
        rows.append({"machine": doc["machine"]["name"], "kernel": k["name"], "waves": k.get("waves", 1),
                     "simulated_waves": simulated,
                     "sample_method": k.get("sample_method", "whole"),
                     "warp_instructions": int(k["warp_instructions"]),
                     "simulated_warp_instructions": int(e.get("simulated_warp_instructions", 0)),
                     "wall_seconds": float(e.get("wall_seconds", 0.0)),
                     "simulate_seconds": float(e.get("simulate_seconds", 0.0))})
    return rows


def check_jobs(names) -> list[str]:
    """The job names, each one of JOBS (InputError naming the first that is not)."""
    from archsim.errors import InputError

    known = [j[0] for j in JOBS]
    for n in names:
        if n not in known:
            raise InputError("--job", f"unknown job {n!r}", "one of: " + ", ".join(known))
    return list(names)


def run_jobs(names=None, workers: int | None = None, progress=None) -> list[dict]:
    """The JOBS named (all by default), each in one process and on ``workers`` processes (default:
    the cores available); the totals of both runs must be identical."""
    from archsim.workers import default_workers
    from archsim.workloads.model import load_workload

    known = {j[0]: j for j in JOBS}
    names = check_jobs(names or known)
    workers = workers or default_workers()
    out = []
    with kernel_cache.disabled():
        for name in names:
            _, hws, wl_name, over = known[name]
            machines = [load_machine(h) for h in hws]
            wl = load_workload(wl_name, dict(over))
            one = _job_once(machines, wl, 1)
            par = _job_once(machines, wl, workers)
            if one.pop("totals") != par.pop("totals"):
                raise AssertionError(f"job {name}: {workers} workers gave other totals than one process")
            rec = {"name": name, "machines": list(hws), "workload": wl_name, "single": one,
                   "workers": workers, "parallel": par,
                   "speedup": round(one["wall_seconds"] / par["wall_seconds"], 3) if par["wall_seconds"] else 0.0}
            out.append(rec)
            if progress:
                progress(rec)
    return out
