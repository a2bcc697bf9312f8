"""Hardware descriptions: YAML -> one frozen, validated ``Machine`` (schema.py, load.py), and the
figures derived from it (derived.py). ``load_machine("a100", overlays=["l2-off"],
sets=["dram.channels=8"])`` is the usual entry point."""

from .derived import (
    Capabilities,
    capabilities,
    clusters_per_group,
    cores_summary,
    cores_total,
    dram_burst_cycles,
    fabric_clock_ghz,
    format_machine,
    l1_cache_kib,
    memory_clock_ghz,
    peak_bandwidth_gbps,
    peak_tflops,
    peak_tflops_detail,
    pipe_lanes,
    pipe_latency,
    pipes_for_unit,
    scratch_usable_kib,
)
from .load import (
    builtin_machines,
    builtin_overlays,
    deep_merge,
    get_value,
    load_machine,
    machine_fingerprint,
    parse_set,
    read_yaml,
    resolve_hw,
    resolve_overlay,
    validate_machine,
)
from .schema import (
    BLOCK_UNITS,
    LATENCY_KEYS,
    PIPE_DTYPES,
    TENSOR_DTYPES,
    UNIT_CLASSES,
    FieldError,
    FrozenDict,
    Machine,
)

__all__ = [
    "BLOCK_UNITS", "Capabilities", "FieldError", "FrozenDict", "LATENCY_KEYS", "Machine", "PIPE_DTYPES",
    "TENSOR_DTYPES", "UNIT_CLASSES", "builtin_machines", "builtin_overlays", "capabilities",
    "clusters_per_group", "cores_summary", "cores_total", "deep_merge", "dram_burst_cycles",
    "fabric_clock_ghz", "format_machine", "get_value", "l1_cache_kib", "load_machine", "machine_fingerprint",
    "memory_clock_ghz", "parse_set", "peak_bandwidth_gbps", "peak_tflops", "peak_tflops_detail", "pipe_lanes",
    "pipe_latency", "pipes_for_unit", "read_yaml", "resolve_hw", "resolve_overlay", "scratch_usable_kib",
    "validate_machine",
]
