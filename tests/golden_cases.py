"""The golden baselines' cases: small runs on every config in configs/, each a real micro-benchmark
or workload run, whose exact cycles, warp-instructions and bytes per level are kept in
tests/golden/<config>.json. ``scripts/update_golden.py`` regenerates those files on purpose; the
test (tests/test_golden.py) fails on any change, so a commit that moves them says why.

A case is (name, kind, arguments): kind "micro" runs ``archsim.micro.run_micro(NAME, machine,
params)``; kind "run" runs ``archsim.runner.run_workload`` on a built-in workload with scenario
overrides (no sampling, so every block is simulated).
"""

from __future__ import annotations

CONFIGS = ("a100", "a100-80gb", "h100", "sw26010pro", "tiny-gpu", "tiny-sunway")

_GPU = [
    ("pchase_16k", "micro", ("latency", {"footprint_kib": 16, "loads": 256})),
    ("pchase_512k", "micro", ("latency", {"footprint_kib": 512, "loads": 256, "warmup": 0})),
    ("stream_read", "micro", ("bandwidth", {"kind": "read", "footprint_mib": 2, "occupancy": 0.25})),
    ("stream_triad", "micro", ("bandwidth", {"kind": "triad", "footprint_mib": 2, "occupancy": 0.25})),
    ("mma_fp16", "micro", ("mma", {"dtype": "fp16", "iterations": 16})),
    ("gemm_256", "micro", ("gemm", {"m": 256, "n": 256, "k": 256, "sample": False})),
    ("gemm_odd", "micro", ("gemm", {"m": 200, "n": 136, "k": 72, "sample": False})),
    ("gemm_fp32", "micro", ("gemm", {"m": 128, "n": 128, "k": 64, "dtype": "fp32", "sample": False})),
    ("attn_fused", "micro", ("attention", {"heads": 2, "seq": 128, "head_dim": 64})),
    ("attn_unfused", "micro", ("attention", {"heads": 2, "seq": 128, "head_dim": 64, "fused": False})),
]
_SUNWAY = [
    ("dma_get_1", "micro", ("dma", {"direction": "get", "size_bytes": 2048, "cpes": 1})),
    ("dma_put_16", "micro", ("dma", {"direction": "put", "size_bytes": 2048, "cpes": 16})),
    ("dma_put_misaligned", "micro", ("dma", {"direction": "put", "size_bytes": 2048, "cpes": 16, "offset_bytes": 8})),
    ("rma_near", "micro", ("rma", {"src": 0, "dst": 1, "size_bytes": 8})),
    ("stream_cross", "micro", ("bandwidth", {"kind": "copy", "footprint_mib": 1, "placement": "cross"})),
    ("stream_private", "micro", ("bandwidth", {"kind": "copy", "footprint_mib": 1, "placement": "private"})),
    ("gemm_256", "micro", ("gemm", {"m": 256, "n": 256, "k": 256, "sample": False})),
    ("attn_fused", "micro", ("attention", {"heads": 2, "seq": 128, "head_dim": 64})),
]
_TINY_RUNS = [
    ("tiny_prefill", "run", ("tiny", {"phase": "prefill"})),
    ("tiny_decode", "run", ("tiny", {"phase": "decode"})),
    ("tiny_train", "run", ("tiny", {"phase": "train"})),
]


_BIG_RUNS = [
    ("gpt2_decode", "run", ("gpt2-small", {"phase": "decode", "layers": 1, "seq": 256})),
    ("gpt2_prefill", "run", ("gpt2-small", {"phase": "prefill", "layers": 1, "seq": 128})),
]


def cases(config: str) -> list:
    """The golden cases of one config: the family's micro-benchmarks, the tiny workload's three
    phases, and on the full-size machines GPT-2 small's decode and a short prefill."""
    sunway = config in ("sw26010pro", "tiny-sunway")
    out = list(_SUNWAY if sunway else _GPU) + _TINY_RUNS
    if config == "h100":                # the warpgroup-MMA kernel, which the tile rule keeps for big GEMMs
        out.append(("gemm_wgmma", "micro", ("gemm", {"m": 256, "n": 256, "k": 256, "sample": False,
                                                     "kernel": "wgmma"})))
    if not config.startswith("tiny"):
        out += _BIG_RUNS
    return out


def measure(config: str, case) -> list[dict]:
    """The kept figures of one case: per kernel its name, cycles, warp-instructions and bytes."""
    from archsim.config import load_machine

    name, kind, (what, params) = case
    machine = load_machine(config)
    if kind == "micro":
        from archsim.micro import run_micro

        kernels = run_micro(what, machine, dict(params)).kernels
    else:
        from archsim.runner import RunOptions, run_workload
        from archsim.workloads.model import load_workload

        kernels = run_workload(machine, load_workload(what, dict(params)), RunOptions(sample=False))["kernels"]
    return [{"name": k["name"], "cycles": int(k["cycles"]), "warp_instructions": int(k["warp_instructions"]),
             "bytes": {b: int(v) for b, v in sorted(k["bytes"].items())}} for k in kernels]
