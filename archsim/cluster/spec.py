"""A cluster description: devices (a machine config by name), nodes, the fabric inside a node,
the NICs, and the network between nodes. YAML in configs/clusters/, validated like a machine:
unknown keys and bad values are one line naming the file, the field and what is allowed.

Conventions, as for machines: units in field names (``*_gbps`` is GB/s, ``gbit_per_s`` a line
rate in Gb/s, ``*_us`` microseconds), every figure with its source in a comment.

The network between nodes is two levels, the shape both built-in kinds share:
- ``fat_tree``: ``group_nodes`` nodes hang off each leaf switch; the leaves join a core whose
  uplinks carry the leaf's NIC bandwidth divided by ``oversubscription`` (1 = non-blocking).
- ``supernodes``: ``group_nodes`` nodes form a supernode with a direct path between any two of
  them (a non-blocking switch); supernodes join a central network through uplinks tapered by
  ``oversubscription``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import Field, ValidationError, model_validator

from archsim.config import schema_errors as SE
from archsim.config.load import read_yaml, resolve_file
from archsim.config.schema import (FieldError, FMap, Frozen, FrozenDict, NonNegFloat, PosFloat, PosInt,
                                   Text)
from archsim.errors import InputError
from archsim.paths import data_dir

# choice: at most a million nodes, 64 devices a node and 2^20 devices in all (the largest machines
# built have about 10^5 nodes); it bounds every array the network model allocates
MAX_NODES = 1_000_000
MAX_DEVICES_PER_NODE = 64
MAX_DEVICES = 1 << 20
Nodes = Annotated[int, Field(strict=True, gt=0, le=MAX_NODES)]
DevicesPerNode = Annotated[int, Field(strict=True, gt=0, le=MAX_DEVICES_PER_NODE)]
# choice: no bandwidth above 10^6 GB/s and no latency above a second (past any link built)
Gbps = Annotated[float, Field(strict=True, ge=1e-6, le=1e6, allow_inf_nan=False)]
MAX_LINKS = 1 << 24         # choice: links of a cluster (arrays of this many floats stay in memory)
Micros = Annotated[float, Field(strict=True, ge=0, le=1e6, allow_inf_nan=False)]


class NodeFabric(Frozen):
    # switch: every device has one port of device_gbps each way into a non-blocking switch (NVSwitch);
    # ring: each device links to its two neighbours, device_gbps each way split over the two;
    # full_mesh: each device links to every other, device_gbps each way split evenly over them
    kind: Literal["switch", "ring", "full_mesh"]
    device_gbps: Gbps               # GB/s one device can send (and receive) through the fabric
    latency_us: Micros              # one transfer's start-up, device to device


class Nics(Frozen):
    count: PosInt                   # NICs per node; device d of D uses NIC d * count // D (its rail)
    gbit_per_s: Gbps                # line rate of one NIC, each direction
    latency_us: Micros              # one message's start-up through the NICs and one switch


class Node(Frozen):
    devices: DevicesPerNode
    fabric: Optional[NodeFabric] = None   # needed when a node holds more than one device
    nics: Optional[Nics] = None           # needed when the cluster has more than one node


class Network(Frozen):
    kind: Literal["fat_tree", "supernodes"]
    group_nodes: PosInt             # nodes per leaf switch (fat_tree) or per supernode
    oversubscription: Annotated[float, Field(strict=True, ge=1, le=1e6, allow_inf_nan=False)] = 1.0
    hop_latency_us: Micros          # one more switch on the path (leaf -> core -> leaf adds two)


class Software(Frozen):
    collective_step_us: Micros = 0.0   # a collective's cost per algorithm step (launch, handshake)
    kernel_gap_us: Micros = 0.0        # idle time on a device between one kernel and the next
    # what a collective's kernel reduces on (device_collective.py): CTAs, one an SM (Sunway: CPEs),
    # threads a CTA and vectors a thread loads before its math (GPUs only); not given: reductions
    # cost nothing on the device
    collective_ctas: Optional[PosInt] = None
    collective_threads: Optional[PosInt] = None
    collective_unroll: Optional[PosInt] = None

    @model_validator(mode="after")
    def _ctas_first(self):
        for name in ("collective_threads", "collective_unroll"):
            if getattr(self, name) is not None and self.collective_ctas is None:
                raise FieldError(name, f"{name} without collective_ctas", "collective_ctas with it (the CTAs "
                                 "the collective's kernel runs on)", related=("collective_ctas",))
        return self


class Cluster(Frozen):
    name: Text
    description: Optional[str] = None
    sources: FMap[Text, Text] = Field(default_factory=FrozenDict)
    device: Text                    # a machine config: a built-in name or a path
    nodes: Nodes
    node: Node
    network: Optional[Network] = None
    software: Software = Software()

    @model_validator(mode="after")
    def _check(self):
        if self.nodes * self.node.devices > MAX_DEVICES:
            raise FieldError("nodes", f"{self.nodes:,} nodes of {self.node.devices} devices make "
                             f"{self.nodes * self.node.devices:,} devices", f"at most {MAX_DEVICES:,} devices in all",
                             ("node.devices",))
        links = self.link_count()
        if links > MAX_LINKS:
            raise FieldError("nodes", f"{self.nodes:,} nodes of {self.node.devices} devices make {links:,} links",
                             f"at most {MAX_LINKS:,} links (a smaller cluster, or a switch instead of a full mesh)",
                             ("node.devices", "node.fabric.kind"))
        if self.node.devices > 1 and self.node.fabric is None:
            raise FieldError("node.fabric", f"a node of {self.node.devices} devices needs a fabric joining them",
                             "node.fabric: {kind, device_gbps, latency_us}", ("node.devices",))
        if self.nodes > 1:
            if self.node.nics is None:
                raise FieldError("node.nics", f"{self.nodes} nodes need NICs to reach each other",
                                 "node.nics: {count, gbit_per_s, latency_us}", ("nodes",))
            if self.network is None:
                raise FieldError("network", f"{self.nodes} nodes need a network between them",
                                 "network: {kind, group_nodes, oversubscription, hop_latency_us}", ("nodes",))
        if self.node.nics is not None and self.node.nics.count > self.node.devices:
            raise FieldError("node.nics.count", f"{self.node.nics.count} NICs for {self.node.devices} devices: "
                             "a NIC no device uses", f"at most {self.node.devices}", ("node.devices",))
        return self

    @property
    def devices(self) -> int:
        return self.nodes * self.node.devices

    def link_count(self) -> int:
        """Links topology.build makes: the node fabrics', each NIC up and down, each group's."""
        d, n = self.node.devices, self.nodes
        fab = 0
        if d > 1 and self.node.fabric is not None:
            fab = n * d * (d - 1) if self.node.fabric.kind == "full_mesh" else 2 * n * d
        nics = 2 * n * self.node.nics.count if self.node.nics is not None and n > 1 else 0
        groups = 2 * -(-n // self.network.group_nodes) if self.network is not None and n > 1 else 0
        return fab + nics + groups


def builtin_clusters() -> list[str]:
    d = data_dir("configs") / "clusters"
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def resolve_cluster(arg: str, where: str = "--cluster") -> Path:
    return resolve_file(arg, where, "cluster", data_dir("configs") / "clusters", builtin_clusters())


def is_cluster_file(arg: str) -> bool:
    """Whether ``arg`` names a cluster (a built-in cluster name, or a YAML file with a top-level
    ``node`` block) rather than a machine; for commands that take either."""
    stem = arg[:-5] if arg.endswith(".yaml") else arg
    if "/" not in arg and stem in builtin_clusters():
        return True
    p = Path(arg).expanduser()
    if not p.is_file() or p.stat().st_size > 1 << 20:
        return False
    try:
        data = read_yaml(p, arg)
    except InputError:
        return False
    # a machine says its family; a cluster its device, nodes, node or network (one of them may be missing)
    return "family" not in data and any(k in data for k in ("device", "nodes", "node", "network"))


def validate_cluster(data, label: str = "<cluster>") -> Cluster:
    if not isinstance(data, dict):
        raise InputError(label, f"expected a mapping of keys at the top level, got {type(data).__name__}",
                         "a YAML mapping such as `name: ...`")
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        loc, _paths, what, allowed, _ = SE.explain(e, Cluster)
        raise InputError(f"{label}: {SE.dotted(loc)}" if loc else label, what, allowed) from None


def load_device(c: Cluster, label: str):
    """The cluster's device machine; a bad name or file is an error at the cluster's ``device``."""
    from archsim.config.load import load_machine

    if is_cluster_file(c.device):
        raise InputError(f"{label}: device", f"{c.device!r} is a cluster, not a machine",
                         "a machine: a built-in name or a machine YAML file")
    try:
        return load_machine(c.device)
    except InputError as e:
        where = e.where if e.where.startswith(c.device) else f"{label}: device"
        raise InputError(where, e.what, e.allowed) from None


def load_cluster(arg: str, where: str = "--cluster") -> Cluster:
    """A cluster by built-in name or path, validated; its device machine is loaded by the caller."""
    path = resolve_cluster(arg, where)
    label = path.name if "/" not in str(arg) else str(arg)
    c = validate_cluster(read_yaml(path, label), label)
    dev = Path(c.device).expanduser()
    if ("/" in c.device or c.device.endswith((".yaml", ".yml"))) and not dev.is_absolute() \
            and (path.parent / dev).is_file():   # a device file beside the cluster file, as a relative path says
        c = c.model_copy(update={"device": str(path.parent / dev)})
    return c


__all__ = ["Cluster", "MAX_NODES", "Network", "Node", "NodeFabric", "Nics", "Software", "builtin_clusters",
           "is_cluster_file", "load_cluster", "load_device", "resolve_cluster", "validate_cluster"]
