"""Perfetto / Chrome trace (JSON trace-event format) of a run: open trace.json in ui.perfetto.dev.

One process per machine. Its "kernels" thread shows each distinct kernel once, end to end in block
order (a kernel that runs `count` times says so in its args); one thread per core shows the thread
blocks the simulation ran on it (for a sampled launch: the sampled waves); counter tracks show the
kernel timelines (IPC, DRAM GB/s). Times are microseconds of simulated time.
"""

from __future__ import annotations

MAX_BLOCK_EVENTS = 200_000  # per machine; a trace beyond that is too big to open
MAX_LINK_TRACKS = 32        # per machine: the links with the most busy time get a counter track


def _busiest_links(result: dict) -> list[str]:
    busy: dict[str, float] = {}
    for k in result["kernels"]:
        for x in k.get("fabric", {}).get("links", []):
            busy[x["name"]] = busy.get(x["name"], 0.0) + x["util"] * k["cycles"]
    return [n for n, v in sorted(busy.items(), key=lambda t: -t[1]) if v > 0][:MAX_LINK_TRACKS]


def _unit_counters(k: dict, t0: float, us: float, pid: int, links: set) -> list[dict]:
    """Counter events from a kernel's per-unit matrices: link utilization, channel queue and GB/s."""
    tl = k.get("timeline", {})
    mats, units = tl.get("matrices", {}), tl.get("units", {})
    win = tl.get("matrix_window_cycles", 0)
    ev = []
    for fam, mat, label in (("links", "link_util", "util"), ("channels", "channel_queue", "queue"),
                            ("channels", "channel_gbps", "GB/s")):
        names = units.get(fam, [])
        for j, n in enumerate(names):
            if fam == "links" and n not in links:
                continue
            for w, row in enumerate(mats.get(mat, [])):
                v = row[j] if j < len(row) else None
                ev.append({"ph": "C", "pid": pid, "name": f"{n} {label}", "ts": round(t0 + w * win * us, 3),
                           "args": {label: 0.0 if v is None else v}})
    return ev


def trace_events(result: dict, pid: int = 1) -> list[dict]:
    ghz = float(result["machine"]["clock_ghz"])
    us = 1.0 / (ghz * 1e3)  # microseconds per cycle
    ev = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": result["machine"]["name"]}},
          {"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "kernels"}}]
    t0 = 0.0
    cores_named = set()
    blocks = 0
    links = set(_busiest_links(result))
    for k in result["kernels"]:
        dur = k["cycles"] * us
        ev.append({"ph": "X", "pid": pid, "tid": 0, "name": k["name"], "ts": round(t0, 3), "dur": round(dur, 3),
                   "args": {"count": k["count"], "cycles": k["cycles"], "tflops": k["tflops"],
                            "dram_gbps": k["bandwidth_gbps"].get("dram", 0.0), "sampled": k.get("sampled", False),
                            "grid": k["grid"]}})
        bt = k.get("block_trace")
        if bt:
            for i, (s, d, c) in enumerate(zip(bt["start"], bt["done"], bt["core"])):
                if s < 0 or d < 0 or blocks >= MAX_BLOCK_EVENTS:
                    continue
                if c not in cores_named:
                    cores_named.add(c)
                    ev.append({"ph": "M", "pid": pid, "tid": 1 + c, "name": "thread_name",
                               "args": {"name": f"core {c}"}})
                ev.append({"ph": "X", "pid": pid, "tid": 1 + c, "name": f"{k['name']} block {bt['first_block'] + i}",
                           "ts": round(t0 + s * us, 3), "dur": round((d - s) * us, 3)})
                blocks += 1
        tl = k.get("timeline", {})
        win = tl.get("window_cycles", 0)
        series = tl.get("series", {})
        for name in ("ipc", "dram_gbps"):
            for j, v in enumerate(series.get(name, [])):
                ev.append({"ph": "C", "pid": pid, "name": name, "ts": round(t0 + j * win * us, 3), "args": {name: v}})
        ev.extend(_unit_counters(k, t0, us, pid, links))
        t0 += dur
    return ev


def trace_document(results: list[dict]) -> dict:
    ev = []
    for i, r in enumerate(results):
        ev.extend(trace_events(r, pid=i + 1))
    return {"traceEvents": ev, "displayTimeUnit": "ns"}
