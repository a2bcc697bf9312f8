"""The timing loop returns to Python after each slice of cycles (so a Ctrl-C is seen) and goes on
where it stopped: any slices give the same kernel records as one call (the golden cases' kernels on
both tiny machines, with every counter, stall and timeline row)."""

from __future__ import annotations

import pytest

from archsim.config import load_machine
from archsim.engine import machine as MA
from archsim.micro import run_micro


def _records(config: str, name: str, params: dict, slice_cycles: int, monkeypatch) -> list[dict]:
    monkeypatch.setattr(MA, "SLICE_CYCLES", slice_cycles)
    monkeypatch.setattr(MA, "SLICE_SECONDS", 1e-9)      # the first slice's length, then one cycle each
    kernels = run_micro(name, load_machine(config), dict(params)).kernels
    return [{k: v for k, v in r.items() if "wall" not in k and k != "sim"} for r in kernels]


@pytest.mark.parametrize("config,name,params", [
    ("tiny-gpu", "gemm", {"m": 200, "n": 136, "k": 72, "sample": False}),
    ("tiny-gpu", "bandwidth", {"kind": "triad", "footprint_mib": 2, "occupancy": 0.25}),
    ("tiny-gpu", "attention", {"heads": 2, "seq": 128, "head_dim": 64, "fused": False}),
    ("tiny-sunway", "dma", {"direction": "put", "size_bytes": 2048, "cpes": 16, "offset_bytes": 8}),
    ("tiny-sunway", "gemm", {"m": 256, "n": 256, "k": 256, "sample": False}),
])
def test_any_slice_length_gives_the_same_records(config, name, params, monkeypatch):
    whole = _records(config, name, params, 1 << 40, monkeypatch)
    for n in (1, 97):
        assert _records(config, name, params, n, monkeypatch) == whole, f"slices from {n} cycles"


def test_a_stop_at_max_cycles_is_where_one_call_stops(monkeypatch):
    from archsim.errors import SimulationError

    stops = []
    for n in (1 << 40, 333):
        monkeypatch.setattr(MA, "SLICE_CYCLES", n)
        with pytest.raises(SimulationError) as e:
            run_micro("gemm", load_machine("tiny-gpu"), {"m": 256, "n": 256, "k": 256, "sample": False},
                      max_cycles=1000)
        k = e.value.partial.kernels[-1]
        stops.append((e.value.line(), k["cycles"], k["warp_instructions"], k["stalls"]))
    assert stops[0] == stops[1] and stops[0][1] == 1000
