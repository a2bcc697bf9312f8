"""Collectives as the steps of their algorithms, each step a transfer on the flow network.

- ring (NCCL's ring): reduce-scatter and all-gather are n-1 steps in which every rank sends a
  1/n chunk to the next rank; all-reduce is the two back to back. A rank starts its next step
  once its last send is done and the chunk it forwards has arrived (and, when reducing, once the
  reduction of that chunk is done). Across nodes the buffer is split over one ring (a channel)
  per NIC of a node: channel c runs through every rank of a node and leaves it from the rank
  on NIC c, so each NIC carries one channel, as NCCL builds its rings.
- hierarchical (inside the node, then across; the same number of ranks on every node, else a
  ring): a ring reduce-scatter among each node's ranks,
  a ring all-reduce of each rank's shard among the ranks of the same local index across the
  nodes (one ring per rail, so every NIC carries its share), then a ring all-gather in the node.
- double binary tree (NCCL's tree): per channel (one per NIC, as for rings), inside each node
  the ranks form a chain from the rank on that NIC; the chains' heads form two binary trees over
  the nodes (the second shifted by one, so a node inner in one is
  mostly a leaf in the other), each tree carrying half the data in pipelined chunks: reduce up
  to the root, broadcast down.
- all-to-all: every rank sends its 1/n of the buffer to every other rank at once.
- broadcast: a pipelined chain in chunks from the root.
- send / receive: one transfer.

Every step pays the cluster's software cost per step (``software.collective_step_us``) before its
transfer. A chunk that is reduced where it arrives (a ring's reduce-scatter steps, a tree's reduce
phase) also crosses its receiver's reducer when the topology has them (device_collective.py: the
collective kernel's reduction rate, timed by the engine); without them a reduction is free.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from .network import Events, FlowNetwork
from .topology import Topology, route

US = 1e-6
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ALGORITHMS = ("ring", "hierarchical", "tree", "direct", "chain", "auto")
# choice: a tree or chain pipelines its buffer in chunks of at least 1 MiB and at most 64 chunks
# (NCCL moves a buffer in slices of hundreds of KiB; a flow-level step per slice would cost events
# without changing a large transfer's time by more than a chunk's share)
CHUNK_BYTES = 1 << 20
MAX_CHUNKS = 64
# choice: a ring's reduce-scatter or all-gather of more steps moves as this many transfers a rank
# (a data-parallel ring over 384 ranks and 4 channels is 1.2 million transfers a bucket step by step)
RING_STEPS = 8


def _chunks(nbytes: float) -> int:
    return int(min(MAX_CHUNKS, max(1, nbytes // CHUNK_BYTES)))


class Fabric:
    """A topology, its flow network and clock, and the per-step software cost."""

    def __init__(self, topo: Topology, record: bool = False, events: Optional[Events] = None):
        self.topo = topo
        self.ev = events or Events()
        self.net = FlowNetwork(self.ev, topo.capacity, record=record)
        self.step_s = topo.cluster.software.collective_step_us * US
        self._routes: dict = {}

    def send(self, src: int, dst: int, nbytes: float, on_done: Callable[[], None], reduce: bool = False,
             steps: int = 1) -> None:
        """A transfer; ``reduce``: dst reduces what arrives (through its reducer, when there is one);
        ``steps``: the algorithm steps it stands for, each paying the route's latency and the
        software cost."""
        reduce = reduce and self.topo.reduce0 >= 0 and src != dst
        key = (src, dst, reduce)
        got = self._routes.get(key)
        if got is None:
            links, lat = route(self.topo, src, dst)
            if reduce:
                links = list(links) + [self.topo.reduce0 + dst]
            got = self._routes[key] = (np.asarray(links, dtype=np.int64), lat + self.step_s)
        links, step = got
        self.net.transfer(links, nbytes, step * steps, on_done)


def barrier(n: int, then: Callable[[], None]) -> Callable[[], None]:
    """A callback that runs ``then`` on its n-th call (at once when n is 0)."""
    if n <= 0:
        then()
        return lambda: None
    left = [n]

    def hit():
        left[0] -= 1
        if left[0] == 0:
            then()
    return hit


def ring_phases(steps: int, reduce_steps: int, limit: int) -> list[tuple[int, bool]]:
    """The ring's steps as (ring steps it covers, reduced) transfers: the reduced steps and the rest
    each as they are when there are at most ``limit`` of them, else merged into ``limit`` runs of
    consecutive steps as near equal as can be."""
    out = []
    for count, red in ((reduce_steps, True), (steps - reduce_steps, False)):
        parts = min(count, limit)
        for i in range(parts):
            out.append(((i + 1) * count // parts - i * count // parts, red))
    return out


def ring(f: Fabric, ranks: Sequence[int], steps: int, chunk: float, reduce_steps: int,
         on_done: Callable[[], None]) -> None:
    """``steps`` ring steps: at each, rank i sends ``chunk`` bytes to rank i+1; the first
    ``reduce_steps`` steps' received chunks are reduced before they are forwarded. A long ring
    (more than RING_STEPS reduced or forwarded steps) moves g consecutive steps as one transfer of
    g chunks paying g steps' latency and software cost (ring_phases): in step with each other, as
    a ring's ranks are, the same time, with fewer events."""
    n = len(ranks)
    if n < 2 or steps == 0:
        f.ev.at(f.ev.now, on_done)
        return
    phases = ring_phases(steps, reduce_steps, RING_STEPS)
    steps = len(phases)
    sent = [0] * n          # steps whose send has completed, per rank
    got = [0] * n           # steps received (and reduced) in order, per rank
    early = [set() for _ in range(n)]   # steps received before an earlier one's reduction ended
    started = [0] * n       # steps started, per rank
    finish = barrier(n, on_done)

    def try_start(i):
        k = started[i]
        if k < steps and sent[i] >= k and got[i] >= k:
            started[i] += 1
            g, red = phases[k]
            f.send(ranks[i], ranks[(i + 1) % n], chunk * g, lambda: arrived(i, k), reduce=red, steps=g)

    def arrived(i, k):
        sent[i] = k + 1
        received((i + 1) % n, k)
        try_start(i)

    def received(j, k):
        early[j].add(k)
        while got[j] in early[j]:
            early[j].discard(got[j])
            got[j] += 1
            if got[j] == steps:
                finish()
        try_start(j)

    for i in range(n):
        try_start(i)


def _tree_parents(n: int, shift: int) -> list[int]:
    """Parents of ranks 0..n-1 in a binary tree over positions (rank + shift) mod n, built as
    NCCL's double binary tree does: the in-order layout, root at the middle."""
    parent = [-1] * n

    def build(lo, hi, par):
        if lo > hi:
            return
        mid = (lo + hi) // 2
        parent[(mid - shift) % n] = par
        me = (mid - shift) % n
        build(lo, mid - 1, me)
        build(mid + 1, hi, me)
    build(0, n - 1, -1)
    return parent


def tree_all_reduce(f: Fabric, ranks: Sequence[int], nbytes: float, on_done: Callable[[], None]) -> None:
    """Double binary tree: two trees, each reducing then broadcasting half the bytes in pipelined
    chunks; inside a node a chain, across nodes a binary tree of the chains' heads."""
    n = len(ranks)
    if n < 2:
        f.ev.at(f.ev.now, on_done)
        return
    channels = _channel_heads(f, list(_nodes_of(f, ranks).values()))
    finish = barrier(2 * len(channels), on_done)
    for by_node in channels:
        order = [r for members in by_node for r in members]
        index = {r: i for i, r in enumerate(order)}
        for shift in (0, 1):
            node_parent = _tree_parents(len(by_node), shift)
            parent = [-1] * n
            for k, members in enumerate(by_node):
                for a, b in zip(members, members[1:]):
                    parent[index[b]] = index[a]
                if node_parent[k] >= 0:
                    parent[index[members[0]]] = index[by_node[node_parent[k]][0]]
            _one_tree(f, order, parent, nbytes / 2 / len(channels), finish)


def _channel_heads(f: Fabric, by_node: list[list[int]]) -> list[list[list[int]]]:
    """Per channel (one per NIC of a node when the ranks span nodes), each node's ranks rotated so
    that the rank on that channel's NIC comes first (the one that talks across nodes)."""
    nics = f.topo.cluster.node.nics
    if len(by_node) < 2 or nics is None:
        return [by_node]
    out = []
    for c in range(nics.count):
        rotated = []
        for members in by_node:
            on_c = [i for i, r in enumerate(members) if f.topo.nic_of(r) == c]
            e = on_c[0] if on_c else c % len(members)
            rotated.append(members[e:] + members[:e])
        out.append(rotated)
    return out


def _one_tree(f, ranks, parent, nbytes, on_done):
    n = len(ranks)
    chunks = _chunks(nbytes)
    chunk = nbytes / chunks
    children = [[] for _ in range(n)]
    root = 0
    for i, p in enumerate(parent):
        if p < 0:
            root = i
        else:
            children[p].append(i)
    up_got = [[0] * chunks for _ in range(n)]     # children's chunks received, per rank and chunk
    up_sent = [0] * n                             # chunks sent to the parent (in order)
    up_busy = [False] * n
    down_got = [0] * n                            # chunks received from the parent
    down_sent = [0] * n                           # chunks forwarded to all children, per rank
    finish = barrier(n, on_done)

    def up_ready(i):
        c = up_sent[i]
        return c < chunks and up_got[i][c] == len(children[i])

    def try_up(i):
        if up_busy[i] or not up_ready(i):
            return
        if i == root:                             # the root's reduced chunk turns round
            c = up_sent[i]
            up_sent[i] += 1
            got_down(i, c)
            try_up(i)
            return
        c = up_sent[i]
        up_busy[i] = True

        def sent():
            up_busy[i] = False
            up_sent[i] += 1
            reduced(parent[i], c)
            try_up(i)
        f.send(ranks[i], ranks[parent[i]], chunk, sent, reduce=True)

    def reduced(p, c):
        up_got[p][c] += 1
        try_up(p)

    down_busy = [False] * n

    def got_down(i, c):
        down_got[i] = c + 1
        if down_got[i] == chunks:
            finish()
        try_down(i)

    def try_down(i):
        c = down_sent[i]
        if down_busy[i] or c >= down_got[i] or not children[i]:
            return
        down_busy[i] = True
        done = barrier(len(children[i]), lambda: after_down(i))
        for ch in children[i]:
            f.send(ranks[i], ranks[ch], chunk, lambda ch=ch, c=c: (got_down(ch, c), done()))

    def after_down(i):
        down_busy[i] = False
        down_sent[i] += 1
        try_down(i)

    for i in range(n):
        try_up(i)


def _nodes_of(f: Fabric, ranks: Sequence[int]) -> dict[int, list[int]]:
    by_node: dict[int, list[int]] = {}
    for r in ranks:
        by_node.setdefault(f.topo.node_of(r), []).append(r)
    return by_node


def choose_algorithm(kind: str) -> str:
    """The algorithm ``auto`` picks: NCCL's ring for reductions and gathers (its choice for large
    buffers), direct for all-to-all and send/receive, a chain for broadcast."""
    return {"all_to_all": "direct", "send_recv": "direct", "broadcast": "chain"}.get(kind, "ring")


def run(f: Fabric, kind: str, ranks: Sequence[int], nbytes: float, on_done: Callable[[], None],
        algorithm: str = "auto") -> str:
    """Start collective ``kind`` of ``nbytes`` (each rank's buffer; for all-gather the gathered
    whole, for reduce-scatter the buffer before scattering) over ``ranks``; ``on_done`` runs when
    every rank has its result. Returns the algorithm used."""
    ranks = list(ranks)
    n = len(ranks)
    if algorithm == "auto":
        algorithm = choose_algorithm(kind)
    if n < 2 or nbytes <= 0:
        f.ev.at(f.ev.now, on_done)
        return algorithm
    if kind == "send_recv":
        f.send(ranks[0], ranks[1], nbytes, on_done)
    elif kind == "all_to_all":
        finish = barrier(n * (n - 1), on_done)
        for a in ranks:
            for b in ranks:
                if a != b:
                    f.send(a, b, nbytes / n, finish)
    elif kind == "broadcast":
        _chain(f, ranks, nbytes, on_done)
    elif algorithm == "hierarchical" and len({len(v) for v in _nodes_of(f, ranks).values()}) == 1:
        _hierarchical(f, kind, ranks, nbytes, on_done)
    elif algorithm == "tree" and kind == "all_reduce":
        tree_all_reduce(f, ranks, nbytes, on_done)
    else:
        steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1}[kind]
        red = 0 if kind == "all_gather" else n - 1
        orders = channel_orders(f, ranks)
        done = barrier(len(orders), on_done)
        for order in orders:
            ring(f, order, steps, nbytes / n / len(orders), red, done)
        algorithm = "ring"
    return algorithm


def channel_orders(f: Fabric, ranks: Sequence[int]) -> list[list[int]]:
    """The rings of a ring collective: one over ``ranks`` inside a node; across nodes, one per NIC
    of a node, channel c visiting each node's ranks so that it leaves the node from the rank on
    NIC c (or the c-th rank when none is on it)."""
    by_node = list(_nodes_of(f, ranks).values())
    if len(by_node) < 2:
        return [list(ranks)]
    # each node's ranks start with the one on NIC c; the ring leaves the node from there
    return [[r for members in heads for r in members[1:] + members[:1]] for heads in _channel_heads(f, by_node)]


def _chain(f, ranks, nbytes, on_done):
    """A broadcast as a chain root -> rank 1 -> ... in pipelined chunks."""
    n = len(ranks)
    chunks = _chunks(nbytes)
    chunk = nbytes / chunks
    have = [chunks] + [0] * (n - 1)
    sent = [0] * n
    busy = [False] * n
    finish = barrier(n - 1, on_done)

    def try_send(i):
        if i == n - 1 or busy[i] or sent[i] >= have[i]:
            return
        busy[i] = True

        def done():
            busy[i] = False
            sent[i] += 1
            have[i + 1] += 1
            if have[i + 1] == chunks:
                finish()
            try_send(i + 1)
            try_send(i)
        f.send(ranks[i], ranks[i + 1], chunk, done)

    try_send(0)


def _hierarchical(f, kind, ranks, nbytes, on_done):
    by_node = list(_nodes_of(f, ranks).values())
    local = len(by_node[0])
    rails = [[node[i] for node in by_node] for i in range(local)]

    def inside(step_kind, size, then):
        done = barrier(len(by_node), then)
        for node in by_node:
            run(f, step_kind, node, size, done, "ring")

    def across(step_kind, size, then):
        done = barrier(local, then)
        for rail in rails:
            run(f, step_kind, rail, size, done, "ring")

    if kind == "all_reduce":
        inside("reduce_scatter", nbytes,
               lambda: across("all_reduce", nbytes / local, lambda: inside("all_gather", nbytes, on_done)))
    elif kind == "all_gather":
        across("all_gather", nbytes / local, lambda: inside("all_gather", nbytes, on_done))
    else:
        inside("reduce_scatter", nbytes, lambda: across("reduce_scatter", nbytes / local, on_done))


def time_collective(topo: Topology, kind: str, ranks: Sequence[int], nbytes: float,
                    algorithm: str = "auto") -> tuple[float, str]:
    """Seconds one collective takes alone on an idle network, and the algorithm used."""
    f = Fabric(topo)
    end = [0.0]
    algo = run(f, kind, ranks, nbytes, lambda: end.__setitem__(0, f.ev.now), algorithm)
    f.ev.run()
    return end[0], algo


def time_concurrent(topo: Topology, kind: str, groups: Sequence[Sequence[int]], nbytes: float) -> float:
    """Seconds until the last of one collective run by every group at once ends, on an otherwise
    idle network (groups that share links slow each other)."""
    f = Fabric(topo)
    end = [0.0]

    def done():
        end[0] = f.ev.now
    last = barrier(len(groups), done)
    for g in groups:
        run(f, kind, g, nbytes, last)
    f.ev.run()
    return end[0]


def bus_bandwidth(kind: str, n: int, nbytes: float, seconds: float) -> float:
    """nccl-tests' bus bandwidth in bytes/s: algorithm bandwidth (bytes / time) times the factor
    that makes it comparable with a link's speed (2(n-1)/n for all-reduce, (n-1)/n for all-gather
    and reduce-scatter, 1 for broadcast and send/receive)."""
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_to_all": (n - 1) / n}.get(kind, 1.0)
    return nbytes / seconds * factor if seconds > 0 else 0.0


__all__ = ["ALGORITHMS", "Fabric", "KINDS", "barrier", "bus_bandwidth", "choose_algorithm", "ring", "run",
           "time_collective", "time_concurrent", "tree_all_reduce", "channel_orders", "ring_phases"]
