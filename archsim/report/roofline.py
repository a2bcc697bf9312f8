"""Rooflines (``roofline.png``) and each kernel's bound, from a result's measured flops and bytes.

A kernel's arithmetic intensity is its flops over its DRAM bytes (read + written); its height is
the TFLOP/s it reached. The roofs are the machine's compute peaks per dtype and its DRAM (and, where
it has one, L2) bandwidth. A kernel's bound (``kernel_bound``) is the compare table's bottleneck.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from archsim.report.files import pyplot, save_figure

LABELLED = 8  # kernels named on a panel (the ones with the most time); the rest are unnamed points


def kernel_bound(k: dict, result: dict) -> str:
    """The kernel's bottleneck as the compare table names it (report.tables.bottleneck), with the
    share of the peak of the resource closest to it: "memory 83%", "latency (fabric 31%)"."""
    from archsim.report.tables import bottleneck, utilizations

    u = utilizations(k, result)
    name = max(u, key=u.get)
    b = bottleneck(k, result)
    return f"{b} {u[name]:.0%}" if b == name else f"{b} ({name} {u[name]:.0%})"


def _points(result: dict):
    ks = result.get("kernels", [])
    total = sum(k.get("seconds", 0.0) * k.get("count", 1) for k in ks) or 1.0
    pts = []
    for k in ks:
        b = k.get("bytes", {})
        dram = b.get("dram_read", 0) + b.get("dram_write", 0)
        pts.append({"name": k["name"], "flops": k.get("flops", 0), "dram": dram, "tflops": k.get("tflops", 0.0),
                    "share": k.get("seconds", 0.0) * k.get("count", 1) / total})
    return pts


def _limits(results: list[dict]):
    xs, ys = [], []
    for r in results:
        for p in _points(r):
            if p["flops"] > 0 and p["dram"] > 0:
                xs.append(p["flops"] / p["dram"])
            if p["tflops"] > 0:
                ys.append(p["tflops"])
        ys += list(r["machine"].get("peak_tflops", {}).values())
    xlo = min(xs + [0.1]) / 3
    xhi = max(xs + [1000.0]) * 3
    ylo = max(min(ys + [0.01]) / 3, 1e-4)
    yhi = max(ys + [1.0]) * 2.5
    return (xlo, xhi), (ylo, yhi)


def _panel(ax, r: dict, xl, yl):
    m = r["machine"]
    x = np.logspace(np.log10(xl[0]), np.log10(xl[1]), 200)
    bws = [("DRAM", m.get("peak_dram_gbps", 0.0), "-")]
    if m.get("peak_gbps", {}).get("l2"):
        bws.append(("L2", m["peak_gbps"]["l2"], ":"))
    seen: dict[float, list[str]] = {}
    for dt, pk in m.get("peak_tflops", {}).items():
        if dt != "int8" and pk > 0:
            seen.setdefault(round(pk, 3), []).append(dt)
    for pk, dts in sorted(seen.items(), reverse=True):
        for name, bw, ls in bws:
            if bw > 0:
                ax.plot(x, np.minimum(pk, x * bw / 1e3), color="0.35" if name == "DRAM" else "0.6", ls=ls, lw=1)
        ax.text(1.01, pk, "/".join(dts) + f"\n{pk:g} TFLOP/s", transform=ax.get_yaxis_transform(), ha="left",
                va="center", fontsize=7, color="0.3")  # beside the panel: clear of the points
    for name, bw, _ in bws:
        if bw > 0:
            x0 = xl[0] * 2
            ax.text(x0, x0 * bw / 1e3 * 1.15, f"{name} {bw:,.0f} GB/s", fontsize=7, color="0.3", rotation=30)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(*xl)
    ax.set_ylim(*yl)
    pts = _points(r)
    order = sorted(range(len(pts)), key=lambda i: -pts[i]["share"])
    named = set(order[:LABELLED])
    placed: list[tuple[float, float]] = []  # label anchors (display points) already used
    off = []
    for i, p in enumerate(pts):
        s = 20 + 600 * p["share"]
        if p["tflops"] <= 0 or p["flops"] <= 0:
            off.append(p["name"])
            continue
        if p["dram"] <= 0:
            xi, mk = xl[1] / 1.5, ">"
        else:
            xi, mk = p["flops"] / p["dram"], "o"
        ax.scatter([xi], [p["tflops"]], s=s, marker=mk, alpha=0.6, color="#1f77b4", edgecolor="k", lw=0.5, zorder=3)
        if i in named:  # the nearest free line above or below (7-pt text), a leader line when moved
            px, py = ax.transData.transform((xi, p["tflops"]))
            for dy in (4.0 + 12 * (j // 2) * (1 if j % 2 == 0 else -1) for j in range(40)):
                if not any(abs(px - qx) < 70 and abs(py + dy - qy) < 11 for qx, qy in placed):
                    break
            placed.append((px, py + dy))
            ax.annotate(f"{p['name']} ({p['share']:.0%})", (xi, p["tflops"]), xytext=(8, dy),
                        textcoords="offset pixels", fontsize=7, va="center",
                        arrowprops=dict(arrowstyle="-", color="0.5", lw=0.5) if abs(dy) > 8 else None)
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("TFLOP/s")
    note = "point area: share of the run's time; > at the right edge: no DRAM traffic"
    if off:
        note += f"\nnot drawn (no flops): {', '.join(off[:8])}{' ...' if len(off) > 8 else ''}"
    ax.set_title(f"{m['name']}", fontsize=10)
    ax.text(0.01, 0.01, note, transform=ax.transAxes, fontsize=6.5, va="bottom", color="0.3")
    ax.grid(True, which="major", alpha=0.3)


def plot_roofline(results: list[dict], path: Path) -> Path:
    """One panel per machine on the same axes."""
    plt = pyplot()
    xl, yl = _limits(results)
    fig, axs = plt.subplots(1, len(results), figsize=(7.5 * len(results), 5.2), squeeze=False)
    for ax, r in zip(axs[0], results):
        _panel(ax, r, xl, yl)
    w = results[0].get("workload", {})
    fig.suptitle(f"roofline: {w.get('name', '')} {w.get('phase', '')}", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path
