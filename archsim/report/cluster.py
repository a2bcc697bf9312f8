"""Pictures of a cluster step (archsim.cluster/1): pipeline.png (a row per stage, forward,
recompute and backward spans over the step, the waits for pipeline sends, the data-parallel
tail; the bubbles are the gaps), network.png (utilization of the busiest links inside a node, at
the NICs and on the uplinks over the step) and memory.png (memory per device of each stage,
stacked by kind, against the capacity); the page that holds them (report.html) and a Perfetto
trace (trace.json: a process per stage's device with its compute stream and data-parallel tail,
a counter track per busy link)."""

from __future__ import annotations

import warnings
from pathlib import Path

from archsim.report.files import pyplot, save_figure, write_text

COLOURS = {"F": "#4C72B0", "R": "#8172B3", "B": "#DD8452", "P": "#C44E52", "dp": "#55A868"}


def plot_pipeline(doc: dict, path: Path) -> Path:
    plt = pyplot()
    tl = doc["timeline"]
    pp = doc["plan"]["pp"]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.45 * pp))
    scale, unit = (1e3, "ms") if doc["step"]["step_seconds"] < 10 else (1.0, "s")
    spans: dict = {}        # (stage, kind) -> [(left, width)]: one broken_barh a row and kind, not a bar a task
    for s, kind, mb, t0, t1 in tl["tasks"]:
        spans.setdefault((s, kind), []).append((t0 * scale, (t1 - t0) * scale))
    for s, t0, t1 in tl["data_parallel"]:
        if t1 > t0:
            spans.setdefault((s, "dp"), []).append((t0 * scale, (t1 - t0) * scale))
    for (s, kind), xs in spans.items():
        ax.broken_barh(xs, (s - 0.4, 0.8), facecolors=COLOURS.get(kind, "grey"),
                       **({"edgecolor": "white", "lw": 0.3} if kind not in ("dp", "P") else {}))
    rec = doc["plan"]["recompute"]
    kinds = [("F", "forward"), ("R", f"recompute ({rec})"), ("B", "backward"), ("P", "waiting for its pipeline send"),
             ("dp", "data-parallel reduction after the last backward")]
    drawn = {kind for _, kind in spans}
    kinds = [(k, label) for k, label in kinds if k in ("F", "B", "dp") or k in drawn]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k, _ in kinds]
    ax.legend(handles, [label for _, label in kinds], loc="upper center",
              bbox_to_anchor=(0.5, -0.25 if pp > 2 else -0.45), ncol=min(len(kinds), 3), fontsize=8, frameon=False)
    ax.set_yticks(range(pp))
    ax.set_yticklabels([f"stage {s}" for s in range(pp)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    st = doc["step"]
    ax.set_title(f"{_cut(doc['workload']['name'])} on {_cut(doc['cluster']['name'])}: "
                 f"step {st['step_seconds']:.4g} s, "
                 f"bubble {100 * st['bubble_share']:.1f} % (replica 0)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def plot_network(doc: dict, path: Path) -> Path:
    plt = pyplot()
    tl = doc["timeline"]
    step = doc["step"]["step_seconds"]
    levels = [lv for lv in ("node", "nic", "uplink", "device") if any(x["level"] == lv for x in tl["links"])]
    names = {"node": "inside a node", "nic": "NICs", "uplink": "uplinks between leaf switches / supernodes",
             "device": "devices' reducers (the collectives' kernels)"}
    fig, axes = plt.subplots(max(len(levels), 1), 1, figsize=(11, 1.0 + 2.0 * max(len(levels), 1)), sharex=True,
                             squeeze=False)
    scale, unit = (1e3, "ms") if step < 10 else (1.0, "s")
    n = tl["bins"]
    xs = [(i + 0.5) * step / n * scale for i in range(n)]
    for ax, lv in zip(axes[:, 0], levels):
        for x in [x for x in tl["links"] if x["level"] == lv]:
            ax.plot(xs, [100 * u for u in x["util"]], lw=0.9, label=_cut(x["name"]))
        ax.set_ylabel("% busy")
        ax.set_ylim(0, 105)
        ax.set_title(names[lv], fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes[-1, 0].set_xlabel(unit)
    fig.suptitle(f"busiest links over the step ({_cut(doc['cluster']['name'])})", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def plot_memory(doc: dict, path: Path) -> Path:
    plt = pyplot()
    stages = doc["memory_stages"]
    kinds = ("weights", "gradients", "optimizer", "activations", "kv_cache")
    fig, ax = plt.subplots(figsize=(max(5, 0.5 * len(stages) + 3), 3.6))
    bottom = [0.0] * len(stages)
    for k in kinds:
        vals = [s[k] / 1e9 for s in stages]
        if any(vals):
            ax.bar(range(len(stages)), vals, bottom=bottom, label=k.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
    cap = doc["memory_per_device"]["capacity"] / 1e9
    ax.axhline(cap, color="k", lw=0.8, ls="--")
    ax.text(len(stages) - 0.5, cap, f" capacity {cap:.0f} GB", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(stages)))
    ax.set_xticklabels([str(s["stage"]) for s in stages], fontsize=8)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GB a device")
    ax.set_ylim(0, max(cap, max(bottom)) * 1.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("memory per device", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


# choice: bounds of a record the pictures are drawn from (a step the simulator writes stays far inside)
MAX_STAGES = 4096           # step.MAX_STREAMS
MAX_TASKS = 2_000_000
MAX_BINS = 10_000
MAX_LINKS = 1000


def _cut(name, n: int = 60) -> str:
    name = str(name)
    return name if len(name) <= n else name[:n - 3] + "..."


def check_record(doc: dict) -> None:
    """Raise ValueError when the record's sizes are past what its pictures are drawn for."""
    tl = doc["timeline"]
    for what, n, lo, hi in (("plan.pp", doc["plan"]["pp"], 1, MAX_STAGES), ("timeline.bins", tl["bins"], 1, MAX_BINS),
                            ("timeline.tasks", len(tl["tasks"]), 0, MAX_TASKS),
                            ("timeline.links", len(tl["links"]), 0, MAX_LINKS),
                            ("memory_stages", len(doc["memory_stages"]), 0, MAX_STAGES)):
        if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
            raise ValueError(f"{what} {_cut(n, 30)} out of range ({lo} to {hi:,})")


def write_cluster_plots(doc: dict, out: Path) -> list[Path]:
    """pipeline.png, network.png, memory.png and the report.html that holds them."""
    check_record(doc)
    out = Path(out)
    with warnings.catch_warnings():     # matplotlib's layout notes on odd records: the picture is drawn anyway
        warnings.simplefilter("ignore")
        imgs = [plot_pipeline(doc, out / "pipeline.png"), plot_network(doc, out / "network.png"),
                plot_memory(doc, out / "memory.png")]
    return imgs + [write_cluster_report(doc, imgs, out / "report.html")]


def cluster_trace_events(doc: dict) -> list[dict]:
    """Trace events (JSON trace-event format, microseconds of simulated time) of a cluster step:
    one process per pipeline stage (its first replica's device) with a compute thread (forward and
    backward of each micro-batch) and a data-parallel thread (the gradient reduction after the
    last backward); one process of counter tracks, the busiest links' utilization over the step."""
    tl = doc["timeline"]
    us = 1e6
    ev = []
    names = {"F": "forward", "R": "recompute", "B": "backward", "P": "pipeline send"}
    for s in range(doc["plan"]["pp"]):
        pid = s + 1
        ev += [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"stage {s} (device of replica 0)"}},
               {"ph": "M", "pid": pid, "tid": 0, "name": "thread_name", "args": {"name": "compute"}},
               {"ph": "M", "pid": pid, "tid": 1, "name": "thread_name", "args": {"name": "data parallel"}}]
    for s, kind, mb, t0, t1 in tl["tasks"]:
        ev.append({"ph": "X", "pid": s + 1, "tid": 0, "name": f"{names.get(kind, kind)} mb {mb}",
                   "ts": round(t0 * us, 3), "dur": round((t1 - t0) * us, 3), "args": {"micro_batch": mb}})
    for s, t0, t1 in tl["data_parallel"]:
        if t1 > t0:
            ev.append({"ph": "X", "pid": s + 1, "tid": 1, "name": "gradient reduction", "ts": round(t0 * us, 3),
                       "dur": round((t1 - t0) * us, 3)})
    pid = doc["plan"]["pp"] + 1
    ev.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "links (utilization)"}})
    n = tl["bins"]
    width = doc["step"]["step_seconds"] / n * us
    for x in tl["links"]:
        for i, u in enumerate(x["util"]):
            ev.append({"ph": "C", "pid": pid, "name": f"{x['name']} ({x['level']})", "ts": round(i * width, 3),
                       "args": {"util": u}})
    return ev


def _html_table(rows: list[tuple]) -> str:
    import html

    body = "".join(f"<tr><td class=n>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def write_cluster_report(doc: dict, images: list[Path], path: Path) -> Path:
    """report.html of a cluster step: the plan, the step's figures, the collectives and the plots."""
    import html

    from archsim.report.html import CSS, img_tag

    st, p, mem = doc["step"], doc["plan"], doc["memory_per_device"]
    title = f"archsim: {doc['workload']['name']} {doc['workload'].get('phase', '')} on {doc['cluster']['name']}"
    summary = [("devices", f"{doc['cluster']['devices']:,} x {doc['cluster']['device']}"),
               ("plan", ", ".join(f"{k} {v}" for k, v in p.items())),
               ("step", f"{st['step_seconds']:.4g} s ({st['tokens_per_second']:,.0f} tokens/s)"),
               ("TFLOP/s a device", f"{st['tflops_per_device_model']:.1f} model, "
                                    f"{st['tflops_per_device_hardware']:.1f} hardware (recompute counted)"),
               ("MFU", f"{100 * st['mfu']:.1f} %" if st["mfu"] is not None else "-"),
               ("bubble", f"{100 * st['bubble_share']:.1f} % of the step"),
               ("communication", f"{st['comm_exposed_seconds']:.4g} s exposed, {st['comm_overlapped_seconds']:.4g} s "
                                 "overlapped"),
               ("memory a device", f"{mem['total'] / 1e9:.1f} GB of {mem['capacity'] / 1e9:.1f}")]
    coll = [("<tr><th class=n>collective</th><th class=n>group</th><th>bytes</th><th>calls</th><th>s a call</th>"
             "<th>exposed s</th></tr>")]
    for c in doc["collectives"]:
        coll.append(f"<tr><td class=n>{html.escape(c['kind'])}</td><td class=n>{html.escape(c['group'])}</td>"
                    f"<td>{c['bytes']:,.0f}</td><td>{c['count']}</td><td>{c['seconds']:.4g}</td>"
                    f"<td>{c['exposed_seconds']:.4g}</td></tr>")
    parts = [f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)}</title><style>{CSS}"
             f"</style></head><body><h1>{html.escape(title)}</h1>", _html_table(summary),
             "<h2>collectives</h2><table>" + "".join(coll) + "</table>"]
    for img in images:
        parts.append(f"<h2>{html.escape(Path(img).stem)}</h2>{img_tag(img)}")
    parts.append("</body></html>")
    write_text(path, "\n".join(parts))
    return path


__all__ = ["cluster_trace_events", "plot_memory", "plot_network", "plot_pipeline", "write_cluster_plots",
           "write_cluster_report"]
