"""validate.png: the simulated figures of ``archsim validate`` against the published ones."""

from __future__ import annotations

import math

from archsim.report.files import pyplot, save_figure


def plot_validation(doc: dict, path: str) -> None:
    """Left: simulated against measured, log-log, one colour per curve (rows in grey), with y = x
    and the +-25 % band, as Accel-Sim plots correlation. Right: each curve against its x, measured
    points and the simulated line, so a step that lands in the wrong place shows where."""
    plt = pyplot()
    curves = doc["curves"]
    ncols = 1 + (1 if curves else 0) + (1 if len(curves) > 2 else 0)
    nright = len(curves)
    rows_right = max(1, -(-nright // max(ncols - 1, 1))) if curves else 1
    fig = plt.figure(figsize=(6.5 + 4.2 * (ncols - 1), max(6.0, 2.9 * rows_right)))
    grid = fig.add_gridspec(rows_right, ncols)
    ax = fig.add_subplot(grid[:, 0])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lo, hi = float("inf"), 0.0
    for i, c in enumerate(curves):
        ref = [p["reference"] for p in c["points"]]
        sim = [max(p["simulated"], 1e-12) for p in c["points"]]
        ax.plot(ref, sim, "o-", ms=4, lw=0.8, color=colours[i % len(colours)],
                label=f"{c['name']} ({c['unit']}, MAPE {c['mape_pct']:.0f}%)")
        lo, hi = min(lo, *ref, *sim), max(hi, *ref, *sim)
    if doc["rows"]:
        ref = [r["reference"] for r in doc["rows"]]
        sim = [max(r["simulated"], 1e-12) for r in doc["rows"]]
        ax.plot(ref, sim, "s", color="0.5", ms=5, label="single figures (rows)")
        for r in doc["rows"]:
            ax.annotate(r["quantity"], (r["reference"], max(r["simulated"], 1e-12)), fontsize=6, color="0.4",
                        xytext=(3, -3), textcoords="offset points")
        lo, hi = min(lo, *ref, *sim), max(hi, *ref, *sim)
    if hi > 0:
        lo, hi = lo / 1.5, hi * 1.5
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.fill_between([lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="0.9", zorder=0,
                        label="within 25 %")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):        # 1, 2, 5 per decade as plain numbers, unlabelled minor ticks
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("measured / published")
    ax.set_ylabel("simulated")
    ax.set_title(f"archsim validate {doc['machine']}: MAPE {doc['mape_pct']:.1f}% (worst {doc['max_error_pct']:.0f}%)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    for i, c in enumerate(curves):
        sub = fig.add_subplot(grid[i // (ncols - 1), 1 + i % (ncols - 1)])
        n = len(c["x"])     # a shape sits at its product; a number x for n params is the shape x, x, ...
        xs = [math.prod(map(float, p["x"])) if isinstance(p["x"], list) else float(p["x"]) ** n for p in c["points"]]
        colour = colours[i % len(colours)]
        sub.plot(xs, [p["reference"] for p in c["points"]], "o", ms=4, color=colour, label="measured")
        line = sorted(zip(xs, (p["simulated"] for p in c["points"])))   # shapes' products need not rise
        sub.plot([x for x, _ in line], [y for _, y in line], "-x", lw=1.2, ms=5, color=colour, alpha=0.7,
                 label="simulated")   # the marker shows a one-point curve's simulated figure
        if max(xs) / min(xs) > 20:
            sub.set_xscale("log")
            sub.tick_params(axis="x", which="minor", labelbottom=False)   # decades only: minor labels overlap
        name = "x".join(c["x"]) if len(c["x"]) > 1 else c["x"][0]
        sub.set_xlabel(name + (" (product)" if len(c["x"]) > 1 else ""), fontsize=8)
        sub.set_ylabel(c["unit"], fontsize=8)
        sub.set_title(f"{c['name']}: MAPE {c['mape_pct']:.0f}%, worst {c['max_error_pct']:.0f}%", fontsize=9)
        sub.tick_params(labelsize=7)
        sub.grid(True, which="both", lw=0.3, alpha=0.5)
        sub.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
