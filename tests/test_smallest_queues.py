"""Every bounded queue at the smallest capacity the config schema allows still lets the tiny
workload finish (issue 20, item 1: with 1-3 MSHRs the engine once waited forever). The schema
is the oracle of "allowed": the smallest value it accepts for each capacity, alone and all of
them at once."""

from __future__ import annotations

import pytest

from archsim.config.load import get_value, load_machine
from archsim.errors import InputError
from archsim.runner import RunOptions, run_workload
from archsim.workloads.model import load_workload

CAPACITIES = {
    "tiny-gpu": ["l1.mshrs", "l2.mshrs", "fabric.buffer_depth", "fabric.lookahead_packets",
                 "memory_controllers.queue_depth", "cores.mio_queue_entries", "cores.load_trackers",
                 "cores.miss_queue_entries", "l1.max_merge", "l2.max_merge", "l2.retry_spare_entries",
                 "memory_controllers.row_hit_cap"],
    "tiny-sunway": ["dma.max_inflight", "dma.max_inflight_per_transfer", "rma.max_inflight", "rma.buffer_depth",
                    "fabric.buffer_depth", "fabric.lookahead_packets", "memory_controllers.queue_depth",
                    "dma.descriptors_per_engine", "rma.descriptors_per_engine", "cores.mio_queue_entries",
                    "cores.miss_queue_entries"],
}


def smallest_allowed(config: str, path: str) -> int:
    """The smallest value in 0..(the config's own) that the schema accepts at ``path``."""
    own = get_value(load_machine(config), path)
    own = 64 if own is None else int(own)
    for v in range(0, own + 1):
        try:
            load_machine(config, sets=[f"{path}={v}"])
            return v
        except InputError:
            continue
    return own


def _finishes(config: str, sets: list[str]) -> None:
    machine = load_machine(config, sets=sets)
    wl = load_workload("tiny", {"layers": 1, "phase": "train"})
    doc = run_workload(machine, wl, RunOptions(sample=False, max_cycles=20_000_000))
    assert doc["complete"] and all(k["cycles"] > 0 for k in doc["kernels"]), sets


@pytest.mark.parametrize("config", sorted(CAPACITIES))
def test_every_queue_at_its_smallest_lets_the_workload_finish(config):
    smallest = {p: smallest_allowed(config, p) for p in CAPACITIES[config]}
    for p, v in smallest.items():
        _finishes(config, [f"{p}={v}"])
    _finishes(config, [f"{p}={v}" for p, v in smallest.items()])
