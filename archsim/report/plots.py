"""Plots of results (PNG). Matplotlib is imported only through ``files.pyplot`` (the Agg backend, so it
works without a display), here and in the report modules beside this one.

- ``kernels.png``: per kernel, the time of all its launches, and beside it the stall breakdown of
  its warp-cycles;
- ``timeline.png``: the kernels' timelines end to end: IPC, DRAM GB/s against the machine's peak,
  and the share of warp-cycles waiting on memory (long scoreboard);
- ``contention.png`` / ``topology.png``: links and channels over time, the fabric of one kernel
  (report/contention.py); ``roofline.png`` (report/roofline.py);
- ``compare.png`` (several machines): time per kernel, machine beside machine, each bar with its
  kernel's bound and share of that peak;
- ``report.html``: one page with all of them (report/html.py);
- ``sweep.png`` (a sweep's directory): total time against each varied value, one line per setting
  of the other varied values (and machine).
"""

from __future__ import annotations

import json
from pathlib import Path

from archsim.report.files import pyplot, save_figure

STALL_COLORS = {"issued": "#2ca02c", "not_selected": "#98df8a", "wait": "#ffbb78", "long_scoreboard": "#d62728",
                "short_scoreboard": "#ff9896", "pipe_busy": "#1f77b4", "barrier": "#9467bd", "dma_wait": "#8c564b",
                "idle": "#c7c7c7"}


def plot_kernels(result: dict, path: Path) -> Path:
    plt = pyplot()
    ks = result["kernels"]
    names = [k["name"] for k in ks]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.4 * len(ks) + 1.8), sharey=True)
    ys = range(len(ks))
    ax1.barh(ys, [k["seconds"] * k["count"] * 1e3 for k in ks], color="#1f77b4")
    ax1.set_yticks(list(ys), names)
    ax1.invert_yaxis()
    ax1.set_xlabel("time of all launches (ms)")
    left = [0.0] * len(ks)
    for st, col in STALL_COLORS.items():
        vals = [k.get("stalls", {}).get(st, 0.0) for k in ks]
        ax2.barh(ys, vals, left=left, color=col, label=st)
        left = [a + b for a, b in zip(left, vals)]
    ax2.set_xlim(0, 1)
    ax2.set_xlabel("share of resident warp-cycles")
    # below the bars, so that it never hides one
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5, frameon=False)
    w = result.get("workload", {})
    fig.suptitle(f"{w.get('name', '')} {w.get('phase', '')} on {result['machine']['name']}")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


# the stall a machine's warps (CPEs) show while they wait on memory: a load's scoreboard on a GPU,
# a DMA reply on a Sunway CPE (its loads from main memory go through DMA)
MEMORY_STALL = {"gpu": ("long_scoreboard", "long-scoreboard share"), "sunway": ("dma_wait", "dma-wait share")}


def plot_timeline(result: dict, path: Path) -> Path:
    plt = pyplot()
    ghz = float(result["machine"]["clock_ghz"])
    stall, stall_label = MEMORY_STALL.get(result["machine"].get("family", "gpu"), MEMORY_STALL["gpu"])
    fig, axs = plt.subplots(3, 1, figsize=(11, 7.5), sharex=True)
    t0 = 0.0
    for k in result["kernels"]:
        tl = k.get("timeline", {})
        win = tl.get("window_cycles", 0)
        s = tl.get("series", {})
        n = len(s.get("ipc", []))
        xs = [(t0 + (j + 0.5) * win) / (ghz * 1e3) for j in range(n)]
        axs[0].plot(xs, s.get("ipc", []), lw=0.8)
        axs[1].plot(xs, s.get("dram_gbps", []), lw=0.8, label=k["name"])
        axs[2].plot(xs, s.get(f"stall_{stall}", []), lw=0.8)
        t0 += n * win
    peak = result["machine"].get("peak_dram_gbps")
    if peak:
        axs[1].axhline(peak, color="k", ls="--", lw=0.7)
    axs[0].set_ylabel("IPC (warp-instr/cycle)")
    axs[1].set_ylabel("DRAM GB/s")
    axs[2].set_ylabel(stall_label)
    axs[2].set_xlabel("simulated time (us; sampled launches show their simulated waves)")
    if len(result["kernels"]) <= 16:
        # below the panels, so that it never hides a curve
        axs[2].legend(*axs[1].get_legend_handles_labels(), fontsize=7, ncol=6, loc="upper center",
                      bbox_to_anchor=(0.5, -0.32), frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def plot_compare(results: list[dict], path: Path) -> Path:
    plt = pyplot()
    names = []
    for r in results:
        for k in r["kernels"]:
            if k["name"] not in names:
                names.append(k["name"])
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(names) * len(results) + 1.5))
    h = 0.8 / len(results)
    for i, r in enumerate(results):
        by = {k["name"]: k["seconds"] * k["count"] * 1e3 for k in r["kernels"]}
        ax.barh([j + i * h for j in range(len(names))], [by.get(n, 0.0) for n in names], height=h,
                label=r["machine"]["name"])
    from archsim.report.roofline import kernel_bound

    for i, r in enumerate(results):  # each bar: the kernel's bound and the share of that peak it reached
        for j, n in enumerate(names):
            k = next((k for k in r["kernels"] if k["name"] == n), None)
            if k is None or k["seconds"] <= 0:
                continue
            ax.text(k["seconds"] * k["count"] * 1e3 * 1.05, j + i * h, kernel_bound(k, r), va="center",
                    fontsize=6.5)
    ax.set_yticks([j + 0.4 - h / 2 for j in range(len(names))], names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, hi * 4)  # room for the bound labels
    ax.set_xlabel("time of all launches (ms, log scale); beside each bar: its bound and the share of the peak "
                  "of the resource closest to it (latency: none reaches half)")
    ax.legend()
    w = results[0].get("workload", {})
    ax.set_title(f"{w.get('name', '')} {w.get('phase', '')} (batch {w.get('batch', '-')}, seq {w.get('seq', '-')})")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def timed_results(doc: dict) -> list[dict]:
    """The results of a result, compare or micro document that have timed kernels to plot."""
    if doc.get("schema") == "archsim.micro/1":
        doc = doc.get("result") or {}
    rs = doc.get("results", []) if doc.get("schema") == "archsim.compare/1" else [doc]
    return [r for r in rs if isinstance(r, dict) and r.get("mode") != "functional" and r.get("kernels")]


def write_plots(doc: dict, out: Path, kernel: str | None = None) -> tuple[list[Path], list[str]]:
    """Plots and report.html for a result (archsim.result/1), a comparison (archsim.compare/1) or a
    micro-benchmark (archsim.micro/1: its result). Returns the files written and one line for
    each plot that could not be drawn, saying why. ``kernel``: the kernel topology.png shows
    (default: the busiest)."""
    from archsim.report.contention import Unavailable, plot_contention, plot_topology
    from archsim.report.html import write_report
    from archsim.report.roofline import plot_roofline

    out.mkdir(parents=True, exist_ok=True)
    if doc.get("schema") == "archsim.micro/1":
        doc = doc.get("result") or {}
    multi = doc.get("schema") == "archsim.compare/1"
    files: list[Path] = []
    missing: list[str] = []
    for r in (doc.get("results", []) if multi else [doc]):
        if not isinstance(r, dict):
            missing.append(f"a result that is not a JSON object: {str(r)[:40]}")
            continue
        name = (r.get("machine") or {}).get("name", "?")
        if r.get("mode") == "functional":
            missing.append(f"{name}: a functional run has no timing to plot")
        elif not r.get("kernels"):
            missing.append(f"{name}: no kernel finished, nothing to plot")
    timed = timed_results(doc)

    def draw(fn, name, *args, **kw):
        try:
            files.append(fn(*args, out / name, **kw))
        except Unavailable as e:
            missing.append(f"{name}: {e}")
        except Exception as e:  # noqa: BLE001 - a plot that fails must not lose the others (nor the run)
            missing.append(f"{name}: the plot failed ({type(e).__name__}: {e}); please report it")

    if multi and timed:
        draw(plot_compare, "compare.png", timed)
    for r in timed:
        sfx = f"-{r['machine']['name']}" if multi else ""
        draw(plot_kernels, f"kernels{sfx}.png", r)
        draw(plot_timeline, f"timeline{sfx}.png", r)
        draw(plot_contention, f"contention{sfx}.png", r)
        draw(plot_topology, f"topology{sfx}.png", r, kernel=kernel)
    if timed:
        draw(plot_roofline, "roofline.png", timed)
        draw(lambda path: write_report(doc, timed, list(files), missing, path), "report.html")
    return files, missing


def _label(v) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def plot_sweep(rows: list[dict], vary: dict, path: Path, title: str = "") -> Path:
    """Total time (us) against each varied value: one panel per vary key, one line per setting of
    the other keys and the machine. Values are placed in spec order (numbers on a linear axis,
    anything else as categories). ``rows``: finished runs, each with ``hw``, ``values`` and
    ``seconds``. With nothing varied, a bar per machine."""
    plt = pyplot()
    keys = list(vary)
    if not keys:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar([r["hw"] for r in rows], [r["seconds"] * 1e6 for r in rows])
        ax.set_ylabel("total time (us)")
    else:
        fig, axs = plt.subplots(1, len(keys), figsize=(5.2 * len(keys), 4), squeeze=False)
        for ax, k in zip(axs[0], keys):
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vary[k])
            pos = {_label(v): (v if numeric else i) for i, v in enumerate(vary[k])}
            lines: dict = {}
            for r in rows:
                rest = tuple([r["hw"]] + [f"{o}={_label(r['values'][o])}" for o in keys if o != k])
                lines.setdefault(rest, []).append((pos[_label(r["values"][k])], r["seconds"] * 1e6))
            for rest, pts in lines.items():
                pts.sort()
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", lw=1, label=", ".join(rest))
            if not numeric:
                ax.set_xticks(list(range(len(vary[k]))), [_label(v) for v in vary[k]], rotation=20)
            ax.set_xlabel(k)
            ax.set_ylabel("total time (us)")
            ax.set_ylim(bottom=0)
            if 1 < len(lines) <= 10:
                ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


def write_sweep_plots(sweep_dir: Path, out: Path) -> list[Path]:
    """``sweep.png`` for a sweep's directory (sweep.json names the varied keys and every point;
    the totals come from runs/<key>.json, the same documents results.parquet is made of)."""
    from archsim.errors import InputError

    sweep_dir = Path(sweep_dir)
    try:
        meta = json.loads((sweep_dir / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(str(sweep_dir / "sweep.json"), f"cannot read: {e}", "a sweep's --out directory") from None
    if meta.get("schema") != "archsim.sweep/1":
        raise InputError(str(sweep_dir / "sweep.json"), f"schema {meta.get('schema')!r}", "archsim.sweep/1")
    rows = []
    for p in meta.get("points", []):
        try:
            doc = json.loads((sweep_dir / "runs" / f"{p['key']}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        sec = doc.get("total", {}).get("seconds")
        if doc.get("complete") and "error" not in doc and sec is not None:
            rows.append({"hw": p["hw"], "values": p["values"], "seconds": sec})
    if not rows:
        raise InputError(str(sweep_dir), "no finished timing run to plot", "a sweep with finished timing runs")
    out.mkdir(parents=True, exist_ok=True)
    title = f"{meta.get('workload', '')} {meta.get('options', {}).get('phase', '')}".strip()
    return [plot_sweep(rows, meta.get("vary", {}), out / "sweep.png", title)]
