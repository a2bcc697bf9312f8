"""Perfetto / Chrome trace (JSON trace-event format) of a run: open trace.json in ui.perfetto.dev.

One process per machine. Its "kernels" thread shows each distinct kernel once, end to end in block
order (a kernel that runs `count` times says so in its args); one thread per core shows the thread
blocks the simulation ran on it (for a sampled launch: the sampled waves); counter tracks show the
kernel timelines (IPC, DRAM GB/s). Times are microseconds of simulated time.
"""

from __future__ import annotations

MAX_BLOCK_EVENTS = 200_000  # per machine; a trace beyond that is too big to open


def trace_events(result: dict, pid: int = 1) -> list[dict]:
    ghz = float(result["machine"]["clock_ghz"])
    us = 1.0 / (ghz * 1e3)  # microseconds per cycle
    ev = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": result["machine"]["name"]}},
          {"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "kernels"}}]
    t0 = 0.0
    cores_named = set()
    blocks = 0
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
        t0 += dur
    return ev


def trace_document(results: list[dict]) -> dict:
    ev = []
    for i, r in enumerate(results):
        ev.extend(trace_events(r, pid=i + 1))
    return {"traceEvents": ev, "displayTimeUnit": "ns"}
