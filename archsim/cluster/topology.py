"""The links of a cluster and the route between any two devices.

Every link is one direction of one physical connection, numbered arithmetically (no object per
device, so a cluster of 10^5 nodes costs a few arrays):

- the node fabric: ``switch``: device -> switch and switch -> device, one port each way;
  ``ring``: device -> next and device -> previous device of its node; ``full_mesh``: device ->
  every other device of its node;
- each NIC of each node: up (node -> its leaf switch or supernode) and down;
- each group (leaf switch or supernode) of the network: up to the core and down from it;
- with a reduction rate (device_collective.py), each device's reducer: the collective kernel's
  reduction, which a reduced chunk crosses after the links that carried it.

A device reaches a NIC over PCIe, which is not modelled as a link (choice: a Gen4 x16 port carries
about twice a 100 Gb/s NIC's line rate). Device d of a node's D devices uses NIC d * count // D,
its rail, as NCCL pairs each GPU with its nearest NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import Cluster

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class Topology:
    cluster: Cluster
    capacity: np.ndarray          # bytes/s of every link
    fabric_links: int             # links [0, fabric_links) are the node fabrics'
    nic0: int                     # first NIC link: up links nic0 + n*K + k, then the down links
    group0: int                   # first group link: up links group0 + g, then the down links
    groups: int                   # leaf switches or supernodes
    reduce0: int = -1             # device d's reducer is link reduce0 + d (-1: reductions are free)

    @property
    def devices(self) -> int:
        return self.cluster.devices

    @property
    def per_node(self) -> int:
        return self.cluster.node.devices

    def node_of(self, dev: int) -> int:
        return dev // self.per_node

    def group_of_node(self, node: int) -> int:
        net = self.cluster.network
        return node // net.group_nodes if net is not None else 0

    def nic_of(self, dev: int) -> int:
        nics = self.cluster.node.nics
        return (dev % self.per_node) * nics.count // self.per_node if nics is not None else 0


def build(cluster: Cluster, reduce_rate: float | None = None) -> Topology:
    """The cluster's links and their capacities; ``reduce_rate`` (bytes/s), each device's reducer."""
    d_node, n = cluster.node.devices, cluster.nodes
    devs = n * d_node
    fab = cluster.node.fabric
    caps = []
    if d_node > 1:
        per_dev = fab.device_gbps * GB
        if fab.kind == "switch":
            caps.append(np.full(2 * devs, per_dev))
        elif fab.kind == "ring":
            caps.append(np.full(2 * devs, per_dev if d_node == 2 else per_dev / 2))
        else:
            caps.append(np.full(devs * (d_node - 1), per_dev / (d_node - 1)))
    fabric_links = int(sum(len(c) for c in caps))
    nics = cluster.node.nics
    k = nics.count if nics is not None and n > 1 else 0
    if k:
        caps.append(np.full(2 * n * k, nics.gbit_per_s * GB / 8))
    net = cluster.network
    groups = -(-n // net.group_nodes) if net is not None and n > 1 else 1
    if groups > 1:
        up = net.group_nodes * k * nics.gbit_per_s * GB / 8 / net.oversubscription
        caps.append(np.full(2 * groups, up))
    reduce0 = -1
    if reduce_rate is not None and np.isfinite(reduce_rate):
        reduce0 = int(sum(len(c) for c in caps))
        caps.append(np.full(devs, float(reduce_rate)))
    capacity = np.concatenate(caps) if caps else np.zeros(0)
    return Topology(cluster, capacity, fabric_links, fabric_links, fabric_links + 2 * n * k, groups, reduce0)


def _fabric_route(t: Topology, src: int, dst: int) -> tuple[list[int], float]:
    fab = t.cluster.node.fabric
    d_node, devs = t.per_node, t.devices
    lat = fab.latency_us * US
    if fab.kind == "switch":
        return [src, devs + dst], lat
    if fab.kind == "full_mesh":
        ls, ld = src % d_node, dst % d_node
        return [src * (d_node - 1) + (ld if ld < ls else ld - 1)], lat
    base = src - src % d_node
    ls, ld = src % d_node, dst % d_node
    fwd = (ld - ls) % d_node
    links = []
    if d_node == 2 or fwd <= d_node - fwd:            # forward round the ring (ties go forward)
        for i in range(fwd):
            links.append(base + (ls + i) % d_node)
    else:
        for i in range(d_node - fwd):
            links.append(devs + base + (ls - i) % d_node)
    return links, lat * len(links)


def route(t: Topology, src: int, dst: int) -> tuple[list[int], float]:
    """The links a transfer from device ``src`` to device ``dst`` crosses, and its start-up
    latency in seconds (empty and zero for a device to itself)."""
    if src == dst:
        return [], 0.0
    ns, nd = t.node_of(src), t.node_of(dst)
    if ns == nd:
        return _fabric_route(t, src, dst)
    c = t.cluster
    k = c.node.nics.count
    links = [t.nic0 + ns * k + t.nic_of(src)]
    lat = c.node.nics.latency_us * US
    gs, gd = t.group_of_node(ns), t.group_of_node(nd)
    if gs != gd:
        links += [t.group0 + gs, t.group0 + t.groups + gd]
        lat += 2 * c.network.hop_latency_us * US
    links.append(t.nic0 + c.nodes * k + nd * k + t.nic_of(dst))
    return links, lat


def link_name(t: Topology, link: int) -> str:
    """A link in words: ``node3 dev2 -> switch``, ``node3 nic1 up``, ``leaf2 up`` ..."""
    c = t.cluster
    d_node, devs = t.per_node, t.devices
    if link < t.fabric_links:
        kind = c.node.fabric.kind
        if kind == "switch":
            dev = link % devs
            where = f"node{dev // d_node} dev{dev % d_node}"
            return f"{where} -> switch" if link < devs else f"switch -> {where}"
        if kind == "ring":
            dev = link % devs
            step = "next" if link < devs else "prev"
            return f"node{dev // d_node} dev{dev % d_node} -> {step}"
        dev, j = divmod(link, d_node - 1)
        ls = dev % d_node
        return f"node{dev // d_node} dev{ls} -> dev{j if j < ls else j + 1}"
    if t.reduce0 >= 0 and link >= t.reduce0:
        dev = link - t.reduce0
        return f"node{dev // d_node} dev{dev % d_node} reduce"
    if link < t.group0:
        k = c.node.nics.count
        i = link - t.nic0
        up = i < c.nodes * k
        node, nic = divmod(i % (c.nodes * k), k)
        return f"node{node} nic{nic} {'up' if up else 'down'}"
    g = link - t.group0
    word = "leaf" if c.network.kind == "fat_tree" else "supernode"
    return f"{word}{g % t.groups} {'up' if g < t.groups else 'down'}"


def link_level(t: Topology, link: int) -> str:
    """Which level a link belongs to: ``node`` (inside a node), ``nic``, ``uplink`` or ``device``
    (a device's reducer)."""
    if t.reduce0 >= 0 and link >= t.reduce0:
        return "device"
    return "node" if link < t.fabric_links else ("nic" if link < t.group0 else "uplink")


__all__ = ["Topology", "build", "link_level", "link_name", "route"]
