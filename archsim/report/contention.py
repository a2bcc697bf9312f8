"""Where and when memory contends: heatmaps over time (``contention.png``) and the fabric drawn as
its topology (``topology.png``), from the per-unit timeline matrices of a result
(stats.unit_matrices). Matplotlib comes from files.pyplot (Agg backend).

Rows of the heatmaps: every fabric link when there are at most MAX_ROWS of them, else the links of
each kind (``req sm#->xbar``, ...) in runs of neighbours, each run shown by its busiest member; the
CPE-mesh router links of each core group as one row (its busiest link). Columns: each kernel's
windows, kernel after kernel, each kernel the same width (kernel widths are not to scale: the
kernel table and kernels.png give the times).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from archsim.report.files import pyplot, save_figure

MAX_ROWS = 96          # fabric links shown one per row up to this many
RUNS_PER_KIND = 12     # else: rows per kind of link
MAX_SLICE_ROWS = 40    # L2 slices shown one per row up to this many, else in runs


class Unavailable(Exception):
    """A result without what a plot needs (an older record, a functional run): the message says what."""


def _kernels_with_units(result: dict) -> list[dict]:
    ks = [k for k in result.get("kernels", []) if k.get("timeline", {}).get("matrices")]
    if not ks:
        raise Unavailable("no per-unit timeline counters in this result (a record written before they "
                          "existed, a functional run, or no kernel finished)")
    return ks


def _union(ks: list[dict], fam: str) -> list[str]:
    names: dict[str, None] = {}
    for k in ks:
        for n in k["timeline"]["units"].get(fam, []):
            names.setdefault(n, None)
    return list(names)


def stitch(ks: list[dict], fam: str, matrix: str, fill: float = 0.0):
    """[units x columns] of one matrix over the kernels (a unit absent from a kernel: ``fill``),
    the unit names, and each kernel's first column."""
    names = _union(ks, fam)
    idx = {n: i for i, n in enumerate(names)}
    cols, starts = [], []
    for k in ks:
        tl = k["timeline"]
        m = tl["matrices"].get(matrix)
        units = tl["units"].get(fam, [])
        starts.append(sum(c.shape[1] for c in cols))
        if m is None or not units:
            cols.append(np.full((len(names), 1), fill))
            continue
        a = np.full((len(names), len(m)), fill)
        vals = np.array([[np.nan if v is None else v for v in row] for row in m], float).T
        for j, n in enumerate(units):
            a[idx[n]] = vals[j]
        cols.append(a)
    return (np.hstack(cols) if cols else np.zeros((len(names), 0))), names, starts


def _kind(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def link_rows(names: list[str], values: np.ndarray):
    """Display rows: (labels, [rows x columns] the busiest member of each row)."""
    fabric = [i for i, n in enumerate(names) if not n.startswith("mesh ")]
    labels, rows = [], []
    if len(fabric) <= MAX_ROWS:
        for i in fabric:
            labels.append(names[i])
            rows.append(values[i])
    else:
        kinds: dict[str, list[int]] = {}
        for i in fabric:
            kinds.setdefault(_kind(names[i]), []).append(i)
        for kind, members in kinds.items():
            n = -(-len(members) // RUNS_PER_KIND)
            for j in range(0, len(members), n):
                run = members[j:j + n]
                lab = kind
                for a, b in zip(re.findall(r"\d+", names[run[0]]), re.findall(r"\d+", names[run[-1]])):
                    lab = lab.replace("#", a if a == b else f"{a}-{b}", 1)
                labels.append(lab)
                rows.append(np.nanmax(values[run], axis=0))
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        if n.startswith("mesh "):
            m = re.match(r"mesh (cg\d+)", n)
            groups.setdefault(m.group(1) if m else "mesh", []).append(i)
    for g, members in groups.items():
        labels.append(f"mesh {g} (busiest of {len(members)})")
        rows.append(np.nanmax(values[members], axis=0))
    return labels, (np.vstack(rows) if rows else np.zeros((0, values.shape[1])))


def _link_cycles(result: dict, names: list[str], ks: list[dict], starts: list[int], ncols: int) -> np.ndarray:
    """Link cycles per column (fabric links at the fabric clock, mesh links at the core clock)."""
    m = result["machine"]
    win = np.zeros(ncols)
    bounds = starts + [ncols]
    for k, a, b in zip(ks, bounds[:-1], bounds[1:]):
        tl = k["timeline"]
        w = float(tl.get("matrix_window_cycles", tl.get("window_cycles", 1)))
        win[a:b] = w
        end = tl.get("matrix_end_cycle", 0 if k.get("sampled") else k.get("cycles", 0))
        if end and b > a:  # the last window is what is left of the simulated part
            win[b - 1] = max(end - (b - a - 1) * w, 1.0)
    ratio = float(m.get("fabric_clock_ghz", m["clock_ghz"])) / float(m["clock_ghz"])
    r = np.array([1.0 if n.startswith("mesh ") else ratio for n in names])
    return r[:, None] * win[None, :]


def _heat(ax, data, labels, title, cmap, vmax, cbar_label, starts, plt):
    im = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=vmax)
    ax.set_yticks(range(len(labels)), labels, fontsize=6 if len(labels) > 40 else 7)
    ax.set_title(title, fontsize=9, loc="left")
    for s in starts[1:]:
        ax.axvline(s - 0.5, color="w", lw=0.6)
    cb = plt.colorbar(im, ax=ax, fraction=0.025, pad=0.01)
    cb.set_label(cbar_label, fontsize=7)
    cb.ax.tick_params(labelsize=6)
    ax.set_xticks([])


def _kernel_labels(ax, starts, ncols, knames, top):
    """Kernel names as ticks (above the top panel, below the bottom one), centred on their columns;
    with very many kernels every n-th one."""
    bounds = starts + [ncols]
    step = max(1, -(-len(knames) // 40))
    idx = range(0, len(knames), step)
    ax.set_xticks([(bounds[i] + bounds[i + 1]) / 2 - 0.5 for i in idx], [knames[i] for i in idx],
                  rotation=60 if top else -60, fontsize=6, ha="left")
    if top:
        ax.xaxis.tick_top()


def _slices_or_engines(ks: list[dict]):
    """The last panel: (title, row labels, [rows x columns], colour max, colour label) or None.
    L2 slices in runs of neighbours (at most MAX_SLICE_ROWS rows), each run's hit rate over its
    accesses (NaN, drawn blank, where none); or each core group's DMA engines' GB/s together."""
    if any(k["timeline"]["units"].get("l2_slices") for k in ks):
        hit, names, _ = stitch(ks, "l2_slices", "l2_hit_rate", fill=np.nan)
        acc, _, _ = stitch(ks, "l2_slices", "l2_accesses")
        n = -(-len(names) // MAX_SLICE_ROWS)
        labels, rows = [], []
        for j in range(0, len(names), n):
            a = acc[j:j + n]
            h = np.nan_to_num(hit[j:j + n]) * a
            with np.errstate(invalid="ignore", divide="ignore"):
                rows.append(np.where(a.sum(0) > 0, h.sum(0) / np.maximum(a.sum(0), 1e-30), np.nan))
            labels.append(names[j] if n == 1 else f"{names[j]}-{names[min(j + n, len(names)) - 1]}")
        return (f"L2 slice hit rate ({'runs of ' + str(n) + ' slices, ' if n > 1 else ''}blank: no access)",
                labels, np.vstack(rows), 1.0, "hit rate")
    if any(k["timeline"]["units"].get("dma_engines") for k in ks):
        g, names, _ = stitch(ks, "dma_engines", "dma_gbps")
        groups: dict[str, list[int]] = {}
        for i, nm in enumerate(names):
            groups.setdefault(nm.split(".")[0], []).append(i)
        data = np.vstack([g[idx].sum(0) for idx in groups.values()])
        return ("DMA engines of each core group (GB/s into and out of the LDMs; each copy of a broadcast get "
                "counts)", list(groups), data,
                max(float(np.nanmax(data)) if data.size else 1.0, 1.0), "GB/s")
    return None


def plot_contention(result: dict, path: Path) -> Path:
    """contention.png: link utilization, link blocked share, channel queue depth and channel
    bandwidth (share of a channel's peak), then the L2 slices' hit rate (GPU) or the DMA engines'
    GB/s per core group (Sunway); unit x time, kernel boundaries marked."""
    plt = pyplot()
    ks = _kernels_with_units(result)
    util, lnames, starts = stitch(ks, "links", "link_util")
    blocked, _, _ = stitch(ks, "links", "link_blocked")
    ncols = util.shape[1]
    blocked_share = blocked / np.maximum(_link_cycles(result, lnames, ks, starts, ncols), 1.0)
    lab, urows = link_rows(lnames, np.clip(util, 0, 1))
    _, brows = link_rows(lnames, np.clip(blocked_share, 0, 1))
    q, cnames, _ = stitch(ks, "channels", "channel_queue")
    gbps, _, _ = stitch(ks, "channels", "channel_gbps")
    m = result["machine"]
    per_chan = float(m.get("peak_dram_gbps", 0)) / max(len(cnames), 1)
    knames = [k["name"] for k in ks]
    extra = _slices_or_engines(ks)
    heights = [max(len(lab), 4), max(len(lab), 4), max(len(cnames), 3), max(len(cnames), 3)]
    if extra:
        heights.append(max(len(extra[1]), 3))
    fig, axs = plt.subplots(len(heights), 1, figsize=(13, 3.2 + 0.1 * sum(heights)),
                            gridspec_kw={"height_ratios": heights})
    _heat(axs[0], urows, lab, "fabric link utilization (busy share of the link's cycles)", "viridis", 1.0,
          "utilization", starts, plt)
    _kernel_labels(axs[0], starts, ncols, knames, top=True)
    _heat(axs[1], brows, lab, "fabric link blocked (share of the link's cycles a packet waited for room downstream)",
          "Reds", max(0.05, float(np.nanmax(brows)) if brows.size else 0.05), "blocked share", starts, plt)
    _heat(axs[2], q, cnames, "DRAM channel queue (mean requests waiting)", "magma",
          max(1.0, float(np.nanmax(q)) if q.size else 1.0), "requests", starts, plt)
    share = gbps / per_chan if per_chan > 0 else gbps
    _heat(axs[3], share, cnames, f"DRAM channel bandwidth (share of a channel's {per_chan:.1f} GB/s peak)",
          "viridis", 1.0, "share of peak", starts, plt)
    if extra:
        title, labels, data, vmax, unit = extra
        _heat(axs[4], data, labels, title, "viridis", vmax, unit, starts, plt)
    _kernel_labels(axs[-1], starts, ncols, knames, top=False)
    axs[-1].set_xlabel("simulated windows of each kernel, kernel after kernel (kernel widths not to scale; "
                      "sampled launches show their simulated waves)", fontsize=8)
    w = result.get("workload", {})
    fig.suptitle(f"memory contention: {w.get('name', '')} {w.get('phase', '')} on {m['name']}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the title
    save_figure(fig, path)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- topology

def busiest_kernel(result: dict) -> dict:
    """The kernel whose fabric links were busiest: sum of link busy shares x its cycles x count."""
    ks = [k for k in result.get("kernels", []) if k.get("fabric", {}).get("links")]
    if not ks:
        raise Unavailable("no kernel has fabric link counters")
    return max(ks, key=lambda k: sum(x["util"] for x in k["fabric"]["links"]) * k["cycles"] * k.get("count", 1))


def _kernel_by_name(result: dict, name: str | None) -> dict:
    if name is None:
        return busiest_kernel(result)
    for k in result.get("kernels", []):
        if k["name"] == name:
            if not k.get("fabric", {}).get("links"):
                raise Unavailable(f"kernel {name!r} has no fabric counters")
            return k
    raise Unavailable(f"no kernel named {name!r} (kernels: "
                      f"{', '.join(k['name'] for k in result.get('kernels', [])[:12])})")


def _link_colour(ax, p0, p1, util, blocked, cmap, width=3.0, offset=0.0, arrow=True):
    (x0, y0), (x1, y1) = p0, p1
    dx, dy = x1 - x0, y1 - y0
    n = max(np.hypot(dx, dy), 1e-9)
    ox, oy = -dy / n * offset, dx / n * offset
    x0, y0, x1, y1 = x0 + ox, y0 + oy, x1 + ox, y1 + oy
    col = cmap(min(max(util, 0.0), 1.0))
    if arrow:
        ax.annotate("", xy=(x1 - dx * 0.08, y1 - dy * 0.08), xytext=(x0 + dx * 0.08, y0 + dy * 0.08),
                    arrowprops=dict(arrowstyle="-|>", color=col, lw=width, mutation_scale=9))
    else:
        ax.plot([x0, x1], [y0, y1], color=col, lw=width, solid_capstyle="butt")
    if blocked > 0.01:
        ax.plot([(x0 + x1) / 2], [(y0 + y1) / 2], marker="X", color="red", ms=4 + 10 * min(blocked, 1.0),
                mec="k", mew=0.4, zorder=5)


def _shares(k: dict, machine: dict) -> dict:
    """link name -> (util, blocked share of the kernel's link cycles)."""
    fab_cycles = k["cycles"] * float(machine.get("fabric_clock_ghz", machine["clock_ghz"])) / float(machine["clock_ghz"])
    return {x["name"]: (float(x["util"]), float(x["blocked_cycles"]) / max(fab_cycles, 1.0))
            for x in k.get("fabric", {}).get("links", [])}


def _ring(ax, k, machine, cmap, plt):
    links = _shares(k, machine)
    G = int(machine.get("groups", 6))
    ang = [np.pi / 2 - 2 * np.pi * g / G for g in range(G)]
    radius = {"req": 1.0, "resp": 1.45}
    for net, r in radius.items():
        pos = [(r * np.cos(a), r * np.sin(a)) for a in ang]
        for g in range(G if G > 1 else 0):  # one group: no ring link to draw
            h = (g + 1) % G
            for a, b, off in ((g, h, 0.05), (h, g, -0.05)):
                u, bl = links.get(f"{net} ring cg{a}->cg{b}", (0.0, 0.0))
                _link_colour(ax, pos[a], pos[b], u, bl, cmap, width=1.5 + 5 * u, offset=off)
    mcs = {x["name"]: x for x in k.get("memory_controllers", [])}
    for g, a in enumerate(ang):
        stop = (1.2 * np.cos(a), 1.2 * np.sin(a))
        ax.add_patch(plt.Circle(stop, 0.13, color="#dddddd", ec="k", zorder=4))
        ax.text(*stop, f"cg{g}", ha="center", va="center", fontsize=8, zorder=6)
        u_in = max(links.get(f"req cg{g}->ring", (0, 0))[0], links.get(f"resp ring->cg{g}", (0, 0))[0])
        ax.text(stop[0] * 0.72, stop[1] * 0.72, f"port {u_in:.0%}", ha="center", fontsize=6, color="0.25")
        mc = (1.95 * np.cos(a), 1.95 * np.sin(a))
        qs = [x["queue_mean"] for n, x in mcs.items() if n.startswith(f"mc{g}.") or n == f"mc{g}"]
        qv = max(qs) if qs else 0.0
        ax.add_patch(plt.Rectangle((mc[0] - 0.14, mc[1] - 0.09), 0.28, 0.18, color=plt.cm.magma(min(qv / 32, 1)),
                                   ec="k", zorder=4))
        ax.text(mc[0], mc[1] - 0.17, f"mc{g} q {qv:.1f}", ha="center", va="top", fontsize=6)
        u, bl = links.get(f"resp mc{g}->ring", (0.0, 0.0))
        _link_colour(ax, mc, (1.45 * np.cos(a), 1.45 * np.sin(a)), u, bl, cmap, width=1.5 + 4 * u, arrow=False)
    ax.set_xlim(-2.4, 2.4)
    ax.set_ylim(-2.4, 2.4)


def _crossbar(ax, k, machine, cmap, plt):
    links = _shares(k, machine)
    sm = sorted({int(m.group(1)) for n in links for m in [re.match(r"req sm(\d+)->xbar", n)] if m})
    sl = sorted({int(m.group(1)) for n in links for m in [re.match(r"req xbar->l2s(\d+)", n)] if m})
    halves = max(int(machine.get("l2_halves", 1)), 1)
    per_row = max(1, -(-len(sm) // 16))
    for i in range(0, len(sm), per_row):  # SM ports, per_row SMs a row: their busiest request / reply port
        run = sm[i:i + per_row]
        y = 1 - (i / max(len(sm), 1)) * 2
        ur = max(links.get(f"req sm{s}->xbar", (0, 0))[0] for s in run)
        br = max(links.get(f"req sm{s}->xbar", (0, 0))[1] for s in run)
        ux = max(links.get(f"resp xbar->sm{s}", (0, 0))[0] for s in run)
        bx = max(links.get(f"resp xbar->sm{s}", (0, 0))[1] for s in run)
        _link_colour(ax, (-1.6, y), (-0.35, y), ur, br, cmap, width=1.5 + 4 * ur, offset=0.02)
        _link_colour(ax, (-0.35, y), (-1.6, y), ux, bx, cmap, width=1.5 + 4 * ux, offset=0.02)
        ax.text(-1.65, y, f"sm{run[0]}-{run[-1]}", ha="right", va="center", fontsize=6)
    ax.add_patch(plt.Rectangle((-0.35, -1.1), 0.7, 2.2, color="#eeeeee", ec="k"))
    ax.text(0, 0, "crossbar", ha="center", va="center", rotation=90, fontsize=9)
    per_half = max(1, len(sl) // halves)
    cols = 8  # slices a row inside a half's box; each slice a cell: request port left, reply port right
    rows_h = -(-per_half // cols)
    cw, ch = 0.16, min(0.12, 0.9 / max(rows_h, 1))
    for h in range(halves):
        top = 1.0 - h * (2.1 / halves)
        members = sl[h * per_half:(h + 1) * per_half]
        if not members:
            continue
        us = [links.get(f"req xbar->l2s{s}", (0.0, 0.0))[0] for s in members]
        mid = top - rows_h * ch / 2
        _link_colour(ax, (0.35, mid), (0.75, mid), float(np.mean(us)) if us else 0.0, 0.0, cmap, width=4, arrow=False)
        for j, s in enumerate(members):
            r, c = divmod(j, cols)
            x, y = 0.8 + c * cw, top - (r + 1) * ch
            for side, name in ((0, f"req xbar->l2s{s}"), (1, f"resp l2s{s}->xbar")):
                u, b = links.get(name, (0.0, 0.0))
                ax.add_patch(plt.Rectangle((x + side * cw / 2, y), cw / 2, ch * 0.9, color=cmap(min(u, 1.0)),
                                           ec="red" if b > 0.01 else "none", lw=1.2))
        ax.text(0.8, top + 0.02, f"L2 half {h}: slices {members[0]}-{members[-1]} (cell: request | reply port; "
                "red edge: blocked > 1 %)", fontsize=6.5, va="bottom")
    mcs = k.get("memory_controllers", [])
    if mcs:
        for i, x in enumerate(mcs):
            y = 1 - (i + 0.5) / len(mcs) * 2
            ax.add_patch(plt.Rectangle((2.35, y - 0.06), 0.3, 0.12, color=plt.cm.magma(min(x["queue_mean"] / 32, 1)),
                                       ec="k"))
            ax.text(2.7, y, f"{x['name']} queue {x['queue_mean']:.1f}, {x['gbps']:.0f} GB/s", fontsize=6, va="center")
    ax.set_xlim(-2.2, 3.6)
    ax.set_ylim(-1.25, 1.2)


def plot_topology(result: dict, path: Path, kernel: str | None = None) -> Path:
    """topology.png: the fabric of one kernel (default the busiest), links coloured by utilization
    (width grows with it), a red cross where packets waited (size: blocked share), controllers by
    their mean queue."""
    plt = pyplot()
    k = _kernel_by_name(result, kernel)
    m = result["machine"]
    names = [x["name"] for x in k["fabric"]["links"]]
    ring = any(re.match(r"req ring cg\d+->cg\d+", n) for n in names)
    xbar = any(re.match(r"req sm\d+->xbar", n) for n in names) and any(re.match(r"req xbar->l2s\d+", n) for n in names)
    if not (ring or xbar):
        raise Unavailable(f"{m['name']}'s fabric ({m.get('fabric_kind', '?')}) is neither a ring between core "
                          "groups nor a crossbar between SMs and L2 slices: only those two are drawn")
    fig, ax = plt.subplots(figsize=(9, 7.5))
    cmap = plt.cm.viridis
    if ring:
        _ring(ax, k, m, cmap, plt)
        where = ("inner hexagon: request ring, outer: reply ring (arrows: direction); port: the busier of a "
                 "group's request and reply port")
    else:
        _crossbar(ax, k, m, cmap, plt)
        where = "left: SM ports (request and reply), right: L2 slice ports in their halves, then the controllers"
    ax.set_aspect("equal" if ring else "auto")
    ax.axis("off")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, 1))
    cb = plt.colorbar(sm, ax=ax, fraction=0.035, pad=0.02)
    cb.set_label("link utilization (busy share)", fontsize=8)
    import textwrap

    title = (f"{m['name']} fabric during {k['name']} ({k['cycles']:,} cycles): colour = utilization, red X = "
             f"packets blocked (size: share of cycles). {where}; controllers: colour = mean queue (black 0, "
             "bright 32 or more)")
    ax.set_title("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path
