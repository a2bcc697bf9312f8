"""Figures derived from a resolved Machine: peaks, bandwidths, capabilities, show-config text.

Nothing here is typed into a config: peak TFLOP/s come from lanes per cycle x sub-cores x cores x
groups x clock (and tensor MAC steps), bandwidths from bytes per cycle x ports x clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import yaml

from .schema import REQUIRED_UNITS, Machine, Pipe

# dtype -> (ISA unit class, pipe dtype key, elements per lane); an FMA counts 2 flops per element
VECTOR_DTYPES = {
    "fp16": ("fp16", "f16x2", 2),
    "bf16": ("fp16", "bf16x2", 2),
    "fp32": ("fp32", "f32", 1),
    "fp64": ("fp64", "f64", 1),
}
DTYPE_ORDER = ("fp8", "int8", "fp16", "bf16", "tf32", "fp32", "fp64")


# ---- small helpers the engine and emitters can share ------------------------------------------

def cores_total(m: Machine) -> int:
    """Cores that run warps (SMs, or CPEs over all core groups); MPEs not counted."""
    return m.groups * m.cores.per_group


def fabric_clock_ghz(m: Machine) -> float:
    return m.clock_ghz * m.clock_ratios.fabric


def memory_clock_ghz(m: Machine) -> float:
    return m.clock_ghz * m.clock_ratios.memory


def pipe_lanes(pipe: Pipe, dtype: str) -> Optional[float]:
    """Lanes per cycle per sub-core for ``dtype`` (its own entry, else the pipe's ``b`` rate)."""
    lanes = pipe.lanes_per_cycle
    return lanes.get(dtype, lanes.get("b"))


def pipe_latency(pipe: Pipe, key: str) -> int:
    """Latency in core cycles for an opcode with latency key ``key`` on this pipe."""
    return pipe.latency_overrides_cycles.get(key, pipe.latency_cycles)


def pipes_for_unit(pipes, unit: str) -> tuple[str, ...]:
    """Names of the pipes that serve ISA unit class ``unit`` (in config order)."""
    return tuple(name for name, p in pipes.items() if unit in p.serves)


def l1_cache_kib(m: Machine) -> int:
    """The part of the l1 array that caches (the rest is shared memory when carved_from_l1)."""
    if m.l1 is None:
        return 0
    return m.l1.size_kib - (m.scratchpad.size_kib if m.scratchpad.carved_from_l1 else 0)


def scratch_usable_kib(m: Machine) -> int:
    """Scratchpad a kernel can address (an LDM minus its cache part)."""
    return m.scratchpad.size_kib - m.scratchpad.cache_kib


def clusters_per_group(m: Machine) -> int:
    if m.mesh is None:
        return 0
    return (m.mesh.rows // m.mesh.cluster_rows) * (m.mesh.cols // m.mesh.cluster_cols)


def dram_burst_cycles(m: Machine) -> float:
    """Memory-clock cycles one burst keeps a channel's data bus busy (from channel_gbps)."""
    bytes_per_mem_cycle = m.dram.channel_gbps / memory_clock_ghz(m)
    return m.dram.burst_bytes / bytes_per_mem_cycle


def _vector_rate(pipes, subcores: int, dtype: str) -> float:
    """FLOP per cycle of one core for a vector dtype."""
    unit, key, elems = VECTOR_DTYPES[dtype]
    total = 0.0
    for name in pipes_for_unit(pipes, unit):
        lanes = pipe_lanes(pipes[name], key)
        if lanes:
            total += lanes * elems * 2
    return total * subcores


# ---- peaks ------------------------------------------------------------------------------------

def peak_tflops_detail(m: Machine) -> dict[str, dict[str, float]]:
    """{'vector': {dtype: TFLOP/s}, 'tensor': {dtype: TFLOP/s}}; dtypes with no rate are left out.
    Vector includes the MPEs of a Sunway machine."""
    n = cores_total(m)
    vector: dict[str, float] = {}
    for dt in VECTOR_DTYPES:
        v = _vector_rate(m.pipes, m.cores.subcores, dt) * n * m.clock_ghz / 1000.0
        if m.mpe is not None:
            v += _vector_rate(m.mpe.pipes, 1, dt) * m.mpe.per_group * m.groups * m.mpe.clock_ghz / 1000.0
        if v > 0:
            vector[dt] = v
    tensor: dict[str, float] = {}
    if m.tensor is not None:
        t = m.tensor
        fma_per_step = t.mac_array[0] * t.mac_array[1] * t.mac_array[2]
        for dt, steps in t.mac_steps_per_cycle.items():
            tensor[dt] = t.units_per_core * steps * fma_per_step * 2 * n * m.clock_ghz / 1000.0
    order = {d: i for i, d in enumerate(DTYPE_ORDER)}
    srt = lambda d: dict(sorted(d.items(), key=lambda kv: order.get(kv[0], 99)))  # noqa: E731
    return {"vector": srt(vector), "tensor": srt(tensor)}


def peak_tflops(m: Machine) -> dict[str, float]:
    """Peak TFLOP/s per dtype: the larger of the vector-pipe and tensor-unit rates."""
    d = peak_tflops_detail(m)
    out: dict[str, float] = {}
    for dt in DTYPE_ORDER:
        v = max(d["vector"].get(dt, 0.0), d["tensor"].get(dt, 0.0))
        if v > 0:
            out[dt] = v
    return out


def peak_bandwidth_gbps(m: Machine) -> dict[str, float]:
    """Peak GB/s per level the machine has: dram, l2, l1, scratch, fabric, dma, rma.
    fabric = injection capacity at the core side: one port per core (crossbar, mesh) or per
    core-group ring stop and direction (ring)."""
    n = cores_total(m)
    out = {"dram": m.dram.channels * m.dram.channel_gbps}
    if m.l2 is not None:
        out["l2"] = m.l2.slices * m.l2.bytes_per_cycle * fabric_clock_ghz(m)
    if m.l1 is not None:
        out["l1"] = m.l1.bytes_per_cycle * n * m.clock_ghz
    sp = m.scratchpad
    out["scratch"] = sp.banks * sp.bank_width_bytes * n * m.clock_ghz
    f = m.fabric
    ports = m.groups * (2 if f.bidirectional else 1) if f.kind == "ring" else n
    out["fabric"] = ports * f.link_bytes_per_cycle * fabric_clock_ghz(m)
    clusters = clusters_per_group(m) * m.groups
    if m.dma is not None:
        out["dma"] = m.dma.engines_per_cluster * clusters * m.dma.bytes_per_cycle * m.clock_ghz
    if m.rma is not None:
        out["rma"] = m.rma.engines_per_cluster * clusters * m.rma.bytes_per_cycle * m.clock_ghz
    return out


# ---- capabilities (what the ISA checker and the emitters may ask) -----------------------------

@dataclass(frozen=True)
class Capabilities:
    name: str
    family: str                          # gpu | sunway
    warp_width: int
    warp_slots: int                      # per core
    subcores: int
    scratchpad_bytes: int                # per block/core, usable (an LDM's cache part excluded)
    max_regs_per_thread: int
    regs_per_core: int
    max_blocks_per_core: int
    cores_total: int
    units: frozenset                     # ISA unit classes this core can run
    tensor_dtypes: frozenset             # fp16, bf16, tf32, fp64, int8, fp8 present in tensor
    tensor_mac_array: Optional[tuple]    # (m, n, k) of one tensor MAC step, None without tensor
    has_async_copy: bool
    has_dma: bool
    has_rma: bool
    dma_broadcast_modes: frozenset
    features: frozenset = frozenset()    # opcode features beyond the units (isa opcodes.FEATURE_NAMES)
    # ((dtype, the ISA's warp-level mma rate over the unit's peak), ...) where it is below 1 (Hopper)
    mma_sync_share: tuple = ()
    # the CPE mesh of a core group (Sunway; 0 without one): a block on CPE k of group g sits at
    # mesh row k // mesh_cols, column k % mesh_cols (the lines of DMA broadcast)
    mesh_rows: int = 0
    mesh_cols: int = 0
    cores_per_group: int = 0
    # rates a tile rule balances, per core and core cycle: the DRAM's peak bandwidth over every
    # core, and the vector pipes' FLOP per cycle of each dtype ((dtype, rate), ...)
    dram_bytes_per_cycle: float = 0.0
    vector_flops_per_cycle: tuple = ()


def capabilities(m: Machine) -> Capabilities:
    units = set(REQUIRED_UNITS) | {"ctrl", "sync"}
    for p in m.pipes.values():
        units.update(p.serves)
    if m.tensor is not None:
        units.add("tensor")
    if m.dma is not None:
        units.add("dma")
    if m.rma is not None:
        units.add("rma")
    rates = {dt: _vector_rate(m.pipes, m.cores.subcores, dt) for dt in VECTOR_DTYPES}
    return Capabilities(
        name=m.name,
        family=m.family,
        warp_width=m.cores.warp_width,
        warp_slots=m.cores.warp_slots,
        subcores=m.cores.subcores,
        scratchpad_bytes=scratch_usable_kib(m) * 1024,
        max_regs_per_thread=m.register_file.max_regs_per_thread,
        regs_per_core=m.register_file.regs_per_core,
        max_blocks_per_core=m.cores.max_blocks,
        cores_total=cores_total(m),
        units=frozenset(units),
        tensor_dtypes=frozenset(m.tensor.mac_steps_per_cycle) if m.tensor is not None else frozenset(),
        tensor_mac_array=tuple(m.tensor.mac_array) if m.tensor is not None else None,
        mma_sync_share=tuple((dt, r / m.tensor.mac_steps_per_cycle[dt]) for dt, r in
                             m.tensor.mma_sync_steps_per_cycle.items()) if m.tensor is not None else (),
        has_async_copy=m.async_copy,
        has_dma=m.dma is not None,
        has_rma=m.rma is not None,
        dma_broadcast_modes=frozenset(m.dma.broadcast_modes) if m.dma is not None else frozenset(),
        features=frozenset(({"wgmma"} if m.tensor is not None and m.tensor.wgmma is not None else set())
                           | ({"tma"} if m.tma is not None else set())
                           | ({"cluster"} if m.clusters is not None else set())
                           | ({"cluster_tma"} if m.clusters is not None and m.tma is not None else set())),
        mesh_rows=m.mesh.rows if m.mesh is not None else 0,
        mesh_cols=m.mesh.cols if m.mesh is not None else 0,
        cores_per_group=m.cores.per_group,
        dram_bytes_per_cycle=peak_bandwidth_gbps(m)["dram"] / m.clock_ghz / cores_total(m),
        vector_flops_per_cycle=tuple((dt, f) for dt, f in rates.items() if f > 0),
    )


# ---- show-config ------------------------------------------------------------------------------

def _num(x: float) -> float:
    """4 significant digits, as a plain number for YAML."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.4g}")


def _tflops(x: float) -> float:
    """Whole TFLOP/s from 100 up (312, 156, 990), else 4 significant digits (19.49, 55.3, 14.03)."""
    return float(round(x)) if x >= 100 else _num(x)


def cores_summary(m: Machine) -> str:
    """'108 SMs' / '6 core groups x 64 CPEs (384 total) + 6 MPEs'."""
    noun = {"sm": "SMs", "cpe": "CPEs"}[m.cores.kind]
    if m.groups == 1:
        text = f"{m.cores.per_group} {noun}"
    else:
        text = f"{m.groups} core groups x {m.cores.per_group} {noun} ({cores_total(m)} total)"
    if m.mpe is not None:
        text += f" + {m.groups * m.mpe.per_group} MPEs"
    return text


def derived_dict(m: Machine) -> dict:
    detail = peak_tflops_detail(m)
    return {
        "cores": cores_summary(m),
        "cores_total": cores_total(m),
        "clocks_ghz": {"core": _num(m.clock_ghz), "fabric": _num(fabric_clock_ghz(m)),
                       "memory": _num(memory_clock_ghz(m))},
        "peak_tflops": {k: _tflops(v) for k, v in peak_tflops(m).items()},
        "peak_tflops_vector": {k: _tflops(v) for k, v in detail["vector"].items()},
        "peak_tflops_tensor": {k: _tflops(v) for k, v in detail["tensor"].items()},
        "peak_bandwidth_gbps": {k: _num(v) for k, v in peak_bandwidth_gbps(m).items()},
        "l1_cache_kib": l1_cache_kib(m),
        "scratchpad_usable_kib": scratch_usable_kib(m),
        "units": sorted(capabilities(m).units),
    }


def format_machine(m: Machine) -> str:
    """What ``archsim show-config HW`` prints: the resolved config as YAML, then derived figures."""
    body = yaml.safe_dump(m.model_dump(mode="json"), sort_keys=False, default_flow_style=None, width=100,
                          allow_unicode=True)
    derived = yaml.safe_dump({"derived": derived_dict(m)}, sort_keys=False, default_flow_style=None, width=100)
    head = f"# {m.name}: {cores_summary(m)}, resolved config (peaks below are derived, not configured)\n"
    return head + body + "\n# derived from the values above\n" + derived


__all__ = [
    "Capabilities", "VECTOR_DTYPES", "capabilities", "clusters_per_group", "cores_summary", "cores_total",
    "derived_dict", "dram_burst_cycles", "fabric_clock_ghz", "format_machine", "l1_cache_kib",
    "memory_clock_ghz", "peak_bandwidth_gbps", "peak_tflops", "peak_tflops_detail", "pipe_latency",
    "pipe_lanes", "pipes_for_unit", "scratch_usable_kib",
]
