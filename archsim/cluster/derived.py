"""A cluster's bandwidths, measured on its own flow model: each figure is the total max-min rate
of a traffic pattern run over the topology's links, not a sum typed from the config.

- per device inside a node: one device sends to every other device of its node at once;
- node to node: every device of node 0 sends to its counterpart in node 1 at once;
- bisection (one direction): every device of the first half of the nodes sends to its
  counterpart in the second half at once (device g to g + D/2), the pattern bisection
  benchmarks run; per node across is that over the first half's nodes.
"""

from __future__ import annotations

import numpy as np

from .network import maxmin_rates
from .spec import Cluster
from .topology import Topology, build, route


def pattern_rate(t: Topology, pairs) -> float:
    """Total bytes/s of concurrent flows between (src, dst) device pairs, max-min shared."""
    links = [route(t, s, d)[0] for s, d in pairs]
    links = [l for l in links if l]
    if not links:
        return 0.0
    pair_link = np.concatenate([np.asarray(l, dtype=np.int64) for l in links])
    pair_flow = np.repeat(np.arange(len(links)), [len(l) for l in links])
    return float(maxmin_rates(pair_flow, pair_link, len(links), t.capacity).sum())


def cluster_figures(c: Cluster, t: Topology | None = None) -> dict:
    """Derived figures of a cluster, in GB/s and counts."""
    t = t or build(c)
    d, n = c.node.devices, c.nodes
    out = {"devices": c.devices, "nodes": n, "devices_per_node": d}
    out["per_device_in_node_gbps"] = pattern_rate(t, [(0, j) for j in range(1, d)]) / 1e9 if d > 1 else None
    if n > 1:
        out["node_to_node_gbps"] = pattern_rate(t, [(i, d + i) for i in range(d)]) / 1e9
        half = n // 2
        shift = (n - half) * d
        bis = pattern_rate(t, [(g, g + shift) for g in range(half * d)]) / 1e9
        out["bisection_gbps"] = bis
        out["per_node_across_gbps"] = bis / half
        out["groups"] = t.groups
    else:
        out["node_to_node_gbps"] = out["bisection_gbps"] = out["per_node_across_gbps"] = None
        out["groups"] = 1
    return out


def _gb(x) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:,.1f} TB/s" if x >= 10_000 else f"{x:,.1f} GB/s"


def format_cluster(c: Cluster, fig: dict, device_desc: str, peak: dict) -> str:
    """show-config's text for a cluster."""
    lines = [f"cluster {c.name}: {c.description or ''}".rstrip(": "),
             f"  devices      {fig['devices']:,} x {c.device} ({device_desc}), {c.nodes:,} nodes of "
             f"{c.node.devices}"]
    fab = c.node.fabric
    if fab is not None:
        lines.append(f"  node fabric  {fab.kind}, {fab.device_gbps:g} GB/s per device each way, "
                     f"{fab.latency_us:g} us")
    if c.node.nics is not None:
        nic = c.node.nics
        lines.append(f"  NICs         {nic.count} x {nic.gbit_per_s:g} Gb/s per node, {nic.latency_us:g} us")
    if c.network is not None:
        net = c.network
        word = "leaf switch" if net.kind == "fat_tree" else "supernode"
        lines.append(f"  network      {net.kind}: {fig['groups']:,} x {net.group_nodes} nodes a {word}, "
                     f"oversubscription {net.oversubscription:g}:1, {net.hop_latency_us:g} us a hop")
    sw = c.software
    lines.append(f"  software     {sw.collective_step_us:g} us a collective step, {sw.kernel_gap_us:g} us "
                 "between kernels")
    lines.append("  derived (max-min rates of traffic patterns on the links above):")
    lines.append(f"    per device inside a node  {_gb(fig['per_device_in_node_gbps'])}")
    lines.append(f"    node to node              {_gb(fig['node_to_node_gbps'])}")
    lines.append(f"    per node across (all out) {_gb(fig['per_node_across_gbps'])}")
    lines.append(f"    bisection, one direction  {_gb(fig['bisection_gbps'])}")
    for dtype, tf in peak.items():
        lines.append(f"    peak {dtype:<5} {tf * fig['devices'] / 1000:,.1f} PFLOP/s ({tf:,.1f} a device)")
    return "\n".join(lines)


__all__ = ["cluster_figures", "format_cluster", "pattern_rate"]
