"""Raw counters of timed launches -> the tidy ``archsim.result/1`` records of docs/records.md.

Derived metrics are declared here once, with their units: seconds = cycles / core clock,
achieved bandwidth (GB/s) = bytes / seconds / 1e9 per level, TFLOP/s = flops / seconds / 1e12,
stall shares = warp-cycles of each reason / all resident warp-cycles.
"""

from __future__ import annotations

import copy

import numpy as np

from archsim.version import __version__
from archsim.config.derived import fabric_clock_ghz, memory_clock_ghz, peak_bandwidth_gbps, peak_tflops
from archsim.engine.names import STALL_NAMES, TL_COUNTERS, VISIT_FAMILIES, KernelTiming

SCHEMA = "archsim.result/1"
BYTE_LEVELS = ("l1", "scratch", "l2", "dram_read", "dram_write", "fabric")


def machine_record(machine) -> dict:
    """The records' machine fields (docs/records.md), plus what the plots draw: the peak GB/s of
    every level (roofline), the fabric and memory clocks (link and channel cycles in the timeline
    matrices), the fabric's kind, core groups and L2 halves (topology)."""
    bw = peak_bandwidth_gbps(machine)
    return {"name": machine.name, "family": machine.family, "clock_ghz": machine.clock_ghz,
            "cores": machine.groups * machine.cores.per_group,
            "peak_tflops": {k: round(v, 3) for k, v in peak_tflops(machine).items()},
            "peak_dram_gbps": round(bw["dram"], 3),
            "peak_gbps": {k: round(v, 3) for k, v in bw.items()},
            "fabric_clock_ghz": round(fabric_clock_ghz(machine), 6),
            "memory_clock_ghz": round(memory_clock_ghz(machine), 6),
            "fabric_kind": machine.fabric.kind, "groups": machine.groups,
            "l2_halves": machine.l2.halves if machine.l2 is not None else 0}


def seconds(machine, cycles: int | float) -> float:
    return float(cycles) / (machine.clock_ghz * 1e9)


def stall_shares(stall: np.ndarray) -> dict:
    """Warp-cycles per reason (summed over cores) as fractions of all resident warp-cycles."""
    tot = stall.sum(axis=0) if stall.ndim == 2 else stall
    n = float(tot.sum())
    return {name: (float(tot[i]) / n if n else 0.0) for i, name in enumerate(STALL_NAMES)}


def round_shares(shares: dict, digits: int = 6) -> dict:
    """Shares rounded to ``digits`` decimals by largest remainder, so that the rounded shares still
    sum to 1 (rounding each one alone drifts by up to half a unit per share)."""
    unit = 10 ** digits
    total = sum(shares.values())
    if total <= 0:
        return {k: 0.0 for k in shares}
    scaled = {k: v / total * unit for k, v in shares.items()}
    floor = {k: int(v) for k, v in scaled.items()}
    left = unit - sum(floor.values())
    for k in sorted(scaled, key=lambda k: (floor[k] - scaled[k], k))[:left]:
        floor[k] += 1
    return {k: floor[k] / unit for k in shares}


def _levels(machine) -> tuple[str, ...]:
    """The bandwidth levels this machine has (the records list only those, docs/records.md)."""
    out = []
    if machine.l1 is not None or machine.scratchpad.cache_kib > 0:   # an SM's L1, a CPE's LDM cache
        out.append("l1")
    out.append("scratch")
    if machine.l2 is not None:
        out.append("l2")
    out += ["dram", "fabric"]
    if machine.dma is not None:
        out.append("dma")
    if getattr(machine, "rma", None) is not None:
        out.append("rma")
    return tuple(out)


def timeline_record(machine, window: int, rows: np.ndarray, end_cycle: int, layout: dict | None = None) -> dict:
    """Per-window series from cumulative rows: IPC, GB/s per level, stall shares; with the
    per-unit layout (unit_timeline.unit_layout) also the per-unit matrices (unit_matrices). The
    last window is usually partial (the end of the run); its rates use its true length."""
    if rows is None or len(rows) == 0:
        return {"window_cycles": window, "series": {}}
    prev = np.vstack([np.zeros((1, rows.shape[1]), np.int64), rows[:-1]])
    d = (rows - prev).astype(np.float64)
    col = {n: i for i, n in enumerate(TL_COUNTERS)}
    ncyc = np.full(len(rows), float(window))
    # the last row is the end of the run: its window is what is left after the full ones
    warps = d[:, [col["stall_" + n] for n in STALL_NAMES]].sum(axis=1)
    ncyc[-1] = max(float(end_cycle - (rows.shape[0] - 1) * window), 1.0)
    sec = ncyc / (machine.clock_ghz * 1e9)
    series: dict[str, list] = {"ipc": list(np.round(d[:, col["warp_instructions"]] / ncyc, 4))}
    for lvl in ("l1", "scratch", "l2", "fabric", "dma"):
        if lvl in _levels(machine):
            series[f"{lvl}_gbps"] = list(np.round(d[:, col[lvl]] / sec / 1e9, 3))
    series["dram_gbps"] = list(np.round((d[:, col["dram_read"]] + d[:, col["dram_write"]]) / sec / 1e9, 3))
    for n in STALL_NAMES:
        series[f"stall_{n}"] = list(np.round(np.where(warps > 0, d[:, col["stall_" + n]] / np.maximum(warps, 1),
                                                      0.0), 4))
    out = {"window_cycles": int(window), "series": {k: [float(x) for x in v] for k, v in series.items()}}
    if layout:
        out.update(unit_matrices(machine, window, rows[:, len(TL_COUNTERS):], end_cycle, layout))
    return out


MATRIX_WINDOWS = 64  # choice: at most this many windows per kernel in the per-unit matrices


def _sig(a: np.ndarray, digits: int = 4) -> list:
    """Rows of a 2-D array of rates as lists of floats with `digits` significant digits; a value
    that is not finite (no access in the window) becomes None, so the JSON stays valid."""
    a = np.asarray(a, np.float64)
    ok = np.isfinite(a)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mag = np.where(ok & (a != 0), np.floor(np.log10(np.abs(a))), 0.0)
        scale = 10.0 ** (digits - 1 - mag)
        r = np.round(a * scale) / scale
    rows = r.tolist()
    if not ok.all():
        rows = [[x if f else None for x, f in zip(row, frow)] for row, frow in zip(rows, ok.tolist())]
    return rows


def _ints(a: np.ndarray) -> list:
    """Rows of a 2-D array of counts as lists of ints."""
    return np.rint(np.asarray(a, np.float64)).astype(np.int64).tolist()


def unit_matrices(machine, window: int, rows: np.ndarray, end_cycle: int, layout: dict) -> dict:
    """Per-window, per-unit matrices ([[per unit] per window]) from the cumulative unit columns of
    the timeline rows. Windows are merged in powers of two until at most MATRIX_WINDOWS remain
    (``matrix_window_cycles``; the last one is what is left up to ``matrix_end_cycle``, the end of
    the simulated part of the launch). Rates use each unit's
    own clock: link_util = busy / link cycles, channel_queue = mean queued requests; rates have 4
    significant digits and are None in a window without accesses; counts (link_blocked: cycles
    of the link's clock, l2_accesses, l2_mshr_busy: the entries in use at the window's end) are
    integers. CPE-mesh
    router links appear only when they carried a packet in the kernel, the mesh's CPE and engine
    ports never; every other unit always does."""
    n = rows.shape[0]
    f = 1
    while -(-n // f) > MATRIX_WINDOWS:
        f *= 2
    keep = list(range(f - 1, n - 1, f)) + [n - 1]
    r = rows[keep].astype(np.float64)
    d = r - np.vstack([np.zeros((1, r.shape[1])), r[:-1]])
    ncyc = np.full(len(keep), float(window * f))
    ncyc[-1] = max(float(end_cycle - (len(keep) - 1) * window * f), 1.0)
    sec = ncyc / (machine.clock_ghz * 1e9)
    units, mats = {}, {}

    def block(fam, counter, x=d):
        L = layout[fam]
        o = L["counters"][counter]
        return x[:, o:o + len(L["units"])]

    def rate(num, den):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)

    for fam, L in layout.items():
        units[fam] = list(L["units"])
        ratio = np.asarray(L["clock_ratio"], np.float64)[None, :]
        if fam == "links":
            busy, blocked = block(fam, "busy"), block(fam, "blocked")
            # CPE-mesh router links (hundreds) only where they carried something in this kernel;
            # the mesh's CPE and engine ports not at all
            net = L.get("net", ["fabric"] * len(units[fam]))
            use = [j for j in range(len(net)) if net[j] == "fabric" or net[j] == "mesh" and (
                r[-1, L["counters"]["busy"] + j] or r[-1, L["counters"]["blocked"] + j])]
            units[fam] = [units[fam][j] for j in use]
            mats["link_util"] = _sig(busy[:, use] / (ncyc[:, None] * ratio[:, use]))
            mats["link_blocked"] = _ints(blocked[:, use])
        elif fam == "channels":
            mats["channel_queue"] = _sig(block(fam, "queue_area") / (ncyc[:, None] * ratio))
            mats["channel_gbps"] = _sig(block(fam, "bytes") / sec[:, None] / 1e9)
            mats["channel_row_hit"] = _sig(rate(block(fam, "row_hits"), block(fam, "row_accesses")))
        elif fam == "l2_slices":
            mats["l2_accesses"] = _ints(block(fam, "accesses"))
            mats["l2_hit_rate"] = _sig(rate(block(fam, "hits"), block(fam, "accesses")))
            mats["l2_mshr_busy"] = _ints(block(fam, "mshr_busy", r))
        elif fam == "dma_engines":
            mats["dma_gbps"] = _sig(block(fam, "bytes") / sec[:, None] / 1e9)
    return {"units": units, "matrix_window_cycles": int(window * f), "matrix_end_cycle": int(end_cycle),
            "matrices": mats}


def kernel_record(name: str, machine, launch, timing: KernelTiming, *, count: int = 1,
                  model_flops: int | None = None, flops: int | None = None, sampled: bool = False,
                  sample_error_est: float = 0.0) -> dict:
    """One entry of ``kernels`` from a timed launch."""
    cyc = int(timing.cycles)
    sec = seconds(machine, cyc)
    fl = int(timing.flops if flops is None else flops)
    mem = timing.memory
    b = mem["bytes"]
    per = {lvl: int(b[lvl]) for lvl in BYTE_LEVELS}
    bw = {}
    for lvl in _levels(machine):
        nbytes = per["dram_read"] + per["dram_write"] if lvl == "dram" else per.get(lvl, int(b.get(lvl, 0)))
        bw[lvl] = round(nbytes / sec / 1e9, 3) if sec > 0 else 0.0
    fab = mem["fabric"]
    mcs = [{"name": r["name"], "queue_mean": round(r["queue_mean"], 4), "queue_max": int(r["queue_max"]),
            "row_hit_rate": round(r["row_hit_rate"], 4), "gbps": round(r["gbps"], 3)} for r in mem["dram"]]
    window, rows = timing.timeline
    rec = {
        "name": name, "count": int(count),
        "grid": [int(x) for x in launch.grid], "block": [int(x) for x in launch.block],
        "cycles": cyc, "seconds": sec, "flops": fl,
        "model_flops": int(fl if model_flops is None else model_flops),
        "tflops": round(fl / sec / 1e12, 4) if sec > 0 else 0.0,
        "warp_instructions": int(timing.warp_instructions),
        "sampled": bool(sampled), "sample_error_est": float(sample_error_est),
        "stalls": round_shares(stall_shares(timing.stall)),
        "bytes": per, "bandwidth_gbps": bw,
        "fabric": {"link_util_mean": round(fab["link_util_mean"], 4), "link_util_max": round(fab["link_util_max"], 4),
                   "blocked_cycles": int(fab["blocked_cycles"]),
                   "links": [{"name": x["name"], "util": round(x["util"], 4), "blocked_cycles": int(x["blocked_cycles"]),
                              "queue_mean": round(x["queue_mean"], 4), "queue_max": int(x["queue_max"])}
                             for x in fab["links"]]},
        "memory_controllers": mcs,
        "timeline": timeline_record(machine, window, rows, timing.timeline_end if timing.timeline_end >= 0 else cyc,
                                    timing.timeline_units),
        "caches": {lvl: _cache_summary(mem[lvl]) for lvl in ("l1", "l2") if lvl in mem},
        "load_latency_mean_cycles": round(mem["load_latency"]["sum"] / mem["load_latency"]["count"], 2)
        if mem["load_latency"]["count"] else 0.0,
        "skipped_cycles": int(timing.skipped_cycles),
    }
    if machine.l1 is not None and "carveout" in mem:    # the split of the unified L1 / shared array
        rec["carveout"] = dict(mem["carveout"])
    if "tma" in mem:
        rec["tma"] = dict(mem["tma"])
    if "dma" in mem:
        rec["dma"] = dict(mem["dma"])
        rec["bytes"]["dma"] = int(b.get("dma", 0))
    if "rma" in mem:
        rec["rma"] = dict(mem["rma"])
        rec["bytes"]["rma"] = int(b.get("rma", 0))
    if "mpe" in mem:  # Sunway: the MPEs' launch and join of the CPEs (engine/mpe.py)
        rec["mpe"] = dict(mem["mpe"])
    if "mesh" in mem:  # the CPE mesh (RMA and DMA broadcast traffic)
        ms = mem["mesh"]
        rec["mesh"] = {"link_util_mean": round(ms["link_util_mean"], 4), "link_util_max": round(ms["link_util_max"], 4),
                       "blocked_cycles": int(ms["blocked_cycles"]), "bytes_delivered": int(ms["bytes_delivered"]),
                       "latency_mean_cycles": round(ms["latency_mean_cycles"], 3),
                       "links": [{"name": x["name"], "util": round(x["util"], 4),
                                  "blocked_cycles": int(x["blocked_cycles"])} for x in ms["links"] if x["packets"]]}
    return rec


def _cache_summary(recs: list[dict]) -> dict:
    acc = sum(r["accesses"] for r in recs)
    hits = sum(r["hits"] for r in recs)
    return {"accesses": acc, "hits": hits, "hit_rate": round(hits / acc, 4) if acc else 0.0}


def totals(kernels: list[dict]) -> dict:
    """The records' ``total`` (docs/records.md): every kernel times its count."""
    cyc = sum(k["cycles"] * k["count"] for k in kernels)
    sec = sum(k["seconds"] * k["count"] for k in kernels)
    fl = sum(k["flops"] * k["count"] for k in kernels)
    mf = sum(k["model_flops"] * k["count"] for k in kernels)
    wi = sum(k["warp_instructions"] * k["count"] for k in kernels)
    return {"cycles": int(cyc), "seconds": sec, "flops": int(fl), "model_flops": int(mf),
            "tflops": round(fl / sec / 1e12, 4) if sec > 0 else 0.0, "warp_instructions": int(wi)}


def seconds_spent(spent: dict, setup_extra: float = 0.0) -> dict:
    """The time split of a run's record (``sim``) from its tasks' counts (workers.run_task):
    compiling the engine, setting launches up (with ``setup_extra``: emission and checks in this
    process) and simulating them, summed over the processes that ran them."""
    compile_s = float(spent.get("compile_seconds", 0.0))
    simulate = float(spent.get("simulate_seconds", 0.0))
    setup = max(float(spent.get("task_seconds", 0.0)) - compile_s - simulate, 0.0) + setup_extra
    return {"compile_seconds": compile_s, "setup_seconds": setup, "simulate_seconds": simulate}


def kernel_effort(counts: dict) -> dict:
    """What timing one kernel cost (its task's counts, workers.run_task): seconds in all and in
    simulation, warp-instructions and cycles simulated (heads and strata of a sampled launch; 0 for
    one read from the kernel cache)."""
    return {"wall_seconds": round(float(counts.get("task_seconds", 0.0)), 4),
            "simulate_seconds": round(float(counts.get("simulate_seconds", 0.0)), 4),
            "simulated_warp_instructions": int(counts.get("simulated_warp_instructions", 0)),
            "simulated_cycles": int(counts.get("simulated_cycles", 0))}


def visit_shares(spent: dict) -> dict:
    """Per unit family (engine/names.VISIT_FAMILIES), from a run's counts (workers.run_task): the
    units the engine's tick looked at, per simulated cycle, and the share of those looks that
    changed nothing (the engine's wasted work)."""
    cycles = max(int(spent.get("simulated_cycles", 0)), 1)
    out = {}
    for fam in VISIT_FAMILIES:
        v, c = int(spent.get(f"visits.{fam}", 0)), int(spent.get(f"changed.{fam}", 0))
        if v:
            out[fam] = {"visits": v, "per_cycle": round(v / cycles, 3), "idle_share": round(1 - c / v, 4)}
    return out


def result(machine, workload: dict, kernels: list[dict], wall_seconds: float, *, complete: bool = True,
           spent: dict | None = None, setup_extra: float = 0.0) -> dict:
    """The whole ``archsim.result/1`` document. ``spent``: the run's counts (workers.run_task):
    the warp-instructions actually simulated (identical kernels run once, launches read from the
    kernel cache not at all), the time split (seconds_spent, with ``setup_extra``), the rate per
    second of simulation alone (summed over worker processes), simulated cycles and unit visits.
    Without it the rate counts every kernel's warp-instructions over the wall seconds."""
    sim = {"wall_seconds": round(wall_seconds, 4)}
    if spent is None:
        sim_wi, per = sum(k["warp_instructions"] for k in kernels), wall_seconds
    else:
        times = seconds_spent(spent, setup_extra)
        sim.update({k: round(v, 4) for k, v in times.items()})
        sim_wi, per = int(spent.get("simulated_warp_instructions", 0)), times["simulate_seconds"]
    sim["simulated_warp_instructions"] = int(sim_wi)
    sim["warp_instructions_per_second"] = round(sim_wi / per, 1) if per > 0 else 0.0
    if spent is not None:
        sim["simulated_cycles"] = int(spent.get("simulated_cycles", 0))
        sim["visits"] = visit_shares(spent)
    sim["archsim_version"] = __version__
    return {"schema": SCHEMA, "complete": bool(complete), "machine": machine_record(machine),
            "workload": workload, "total": totals(kernels), "kernels": kernels, "sim": sim}


def extensive_memory_fields(mem: dict, value) -> dict:
    """A copy of a launch's memory counters whose extensive fields (bytes per level, load latency
    sums and counts, fabric blocked cycles, cache accesses and hits) are ``value(d, key, path)``:
    ``d[key]`` the field, ``path`` the keys and list indices from the root to it."""
    out = copy.deepcopy(mem)

    def put(d, key, path):
        d[key] = value(d, key, path + (key,))

    for k in mem["bytes"]:
        put(out["bytes"], k, ("bytes",))
    for k in ("sum", "count"):
        put(out["load_latency"], k, ("load_latency",))
    put(out["fabric"], "blocked_cycles", ("fabric",))
    for i, ln in enumerate(out["fabric"]["links"]):
        put(ln, "blocked_cycles", ("fabric", "links", i))
    for lvl in ("l1", "l2"):
        for i, rec in enumerate(out.get(lvl, ())):
            for k in ("accesses", "hits"):
                if k in rec:
                    put(rec, k, (lvl, i))
    return out
