"""The micro-benchmarks' parameters and their checks (docs/commands.md), importable without the engine:
the command line lists the benchmarks and refuses a bad parameter before numba is loaded."""

from __future__ import annotations

from archsim.errors import InputError


def parse_bool(s: str) -> bool:
    if str(s).lower() in ("1", "true", "yes", "on"):
        return True
    if str(s).lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(s)


# name -> {param: (parser, default, allowed text)}; default None = required
PARAMS = {
    "latency": {"footprint_kib": (float, None, "a size in KiB > 0"), "stride_bytes": (int, 128, "a multiple of 8"),
                "warmup": (int, 1, "passes over the chain before timing (0 = cold)"),
                "loads": (int, 4096, "timed loads > 0"),
                "half": (str, "all", "all, near or far: only addresses in the chasing SM's near or far L2 half"),
                "beside_occupancy": (float, 0.0, "0 (the chase alone) or 0 < x <= 1: other blocks stream reads at "
                                                 "this occupancy while the chase runs (latency under load; with "
                                                 "warmup=0, and the streams last as long as the chase: loads=64 "
                                                 "is minutes on a full machine, the default 4096 hours)")},
    "bandwidth": {"kind": (str, "read", "read, write, copy or triad"), "occupancy": (float, 1.0, "0 < x <= 1"),
                  "footprint_mib": (float, 1024.0, "a size in MiB > 0"),
                  "placement": (str, "cross", "private or cross"),
                  "unroll": (int, 4, "16-byte loads (or stores) in flight a thread per iteration: 1, 2, 4 or 8"),
                  "cores": (int, 0, "0 (every core) or the cores that stream, the others idle (GPU)"),
                  "block": (int, 0, "0 (grid-stride over the resident warps) or the threads a block of a launch "
                                    "with one 8-byte element a thread over the footprint (gpu-benches' "
                                    "gpu-stream; GPU)"),
                  "blocks_per_core": (int, 2, "blocks a core holds at once with block > 0 (shared memory "
                                              "limits them, as gpu-stream's carve-out), >= 1")},
    "mma": {"dtype": (str, "fp16", "fp16, bf16, tf32 or fp64"), "iterations": (int, 64, "> 0")},
    "wgmma": {"dtype": (str, "fp16", "fp16 or bf16"), "n": (int, 256, "16, 32, 64, 96, 128, 192 or 256"),
              "a": (str, "shared", "shared (A by descriptor) or registers (.rs)"),
              "warpgroups": (int, 2, "warpgroups a core, >= 1 (within its warp slots)"),
              "iterations": (int, 16, "> 0")},
    "tma": {"box_cols": (int, 64, "elements of the box's inner dimension, 1 .. 256, its bytes a multiple of 16"),
            "box_rows": (int, 64, "1 .. 256 (1: a 1-d box)"), "dtype": (str, "fp16", "fp16 or fp32"),
            "stages": (int, 4, "copies in flight a block, 1 .. 16"), "copies": (int, 32, "boxes a block loads, >= 1"),
            "blocks_per_core": (int, 1, "one-warp blocks a core, >= 1"),
            "cores": (int, 0, "0 (every core) or the cores that stream, the others idle")},
    "dsmem": {"kind": (str, "latency", "latency (a dependent chain, cycles a load) or bandwidth (GB/s, every SM)"),
              "cluster": (int, 2, "blocks a cluster, 2 .. the machine's clusters.max_blocks"),
              "loads": (int, 64, "loads a warp (the slope: loads and 2 x loads), >= 1"),
              "warps": (int, 8, "warps a block (bandwidth), >= 1")},
    "gemm": {"m": (int, 1024, "> 0"), "n": (int, 1024, "> 0"), "k": (int, 1024, "> 0"),
             "dtype": (str, "fp16", "fp16, bf16, tf32 or fp32 (Sunway: fp16, bf16 or fp32)"),
             "out": (str, "f32", "f32, or the input dtype's own for fp16 / bf16: f16 / bf16 (GPU)"),
             "sample": (bool, True, "true (a launch of many waves is timed from its first waves) or false"),
             "tile": (str, "auto", "auto (the tile rule's) or a tensor-core tile BMxBNxBK/warps/stages, as "
                                   "128x128x64/4/4 (GPU; the mma kernel)"),
             "kernel": (str, "auto", "auto (the tile rule's choice), mma, wgmma (machines with warpgroup MMA), tma "
                                     "(wgmma fed by the TMA unit, warp specialized: machines with tma; GPU) or "
                                     "tma_multicast (tma on clusters of two blocks sharing B by multicast: machines "
                                     "with tma and clusters), tma_pingpong (persistent, two consumer warpgroups "
                                     "on alternate tiles: machines with tma) or tma_pingpong_multicast "
                                     "(tma_pingpong on clusters of two sharing B)")},
    "attention": {"batch": (int, 1, "> 0"), "heads": (int, 16, "> 0"), "seq": (int, 1024, "> 0"),
                  "head_dim": (int, 64, "32, 64 or 128"), "fused": (bool, True, "true or false"),
                  "causal": (bool, False, "true or false"), "dtype": (str, "fp16", "fp16, bf16 or fp32"),
                  "kernel": (str, "auto", "auto, mma or wgmma (fused: FlashAttention-2's or -3's kernel)")},
    "dma": {"direction": (str, "get", "get or put"), "size_bytes": (int, None, "bytes per transfer, 1 .. the LDM"),
            "cpes": (int, 1, "CPEs of core group 0 taking part, 1 .. cores per group"),
            "offset_bytes": (int, 0, "start offset from a 256-byte aligned base, >= 0"),
            "spacing_bytes": (int, -1, "bytes between the regions of neighbouring CPEs, >= 0 (default: size_bytes)"),
            "reps": (int, 4, "transfers per CPE, each waited for, >= 1")},
    "rma": {"src": (int, 0, "the issuing CPE of core group 0, 0 .. cores per group - 1"),
            "dst": (int, None, "the target CPE of core group 0, 0 .. cores per group - 1"),
            "size_bytes": (int, 8, "bytes per transfer, 1 .. the LDM"),
            "direction": (str, "put", "put or get"),
            "reps": (int, 16, "transfers, each waited for, >= 1")},
    "asm": {"file": (str, None, "a .s path or a name in isa/validation; {n} in it is replaced by n"),
            "n": (int, 1, "an integer >= 0 put in place of {n} in file's name and text"),
            "iters": (int, 64, "the kernel's .arg iters for the first run (the second runs 2 x iters), >= 1"),
            "per_iter": (float, 1.0, "units of work one loop iteration does (the value is cycles per unit), > 0"),
            "threads": (int, 0, "threads per block (0: the file's .launch)")},
}
UNITS = {"latency": "cycles", "bandwidth": "GB/s", "mma": "TFLOP/s", "wgmma": "TFLOP/s", "tma": "GB/s",
         "dsmem": "cycles", "gemm": "TFLOP/s", "attention": "TFLOP/s", "dma": "B/cycle", "rma": "cycles",
         "asm": "cycles"}   # (dsmem kind=bandwidth: GB/s)


def unit_of(name: str, params: dict) -> str:
    """The unit micro ``name`` measures with these parameters (dsmem: by its kind)."""
    if name == "dsmem" and params.get("kind") == "bandwidth":
        return "GB/s"
    return UNITS[name]


def check_machine(name: str, machine) -> None:
    """A benchmark of a block the machine does not have (DMA or RMA on a GPU) is one clear error."""
    if name == "dma" and machine.dma is None:
        raise InputError("micro dma", f"{machine.name} has no DMA engines", "a Sunway machine (its config has a "
                                                                           "dma: block)")
    if name == "rma" and (machine.rma is None or machine.mesh is None):
        raise InputError("micro rma", f"{machine.name} has no RMA engines", "a Sunway machine (its config has "
                                                                           "rma: and mesh: blocks)")


def parse_params(name: str, given: list[str] | dict) -> dict:
    """KEY=VALUE strings (or a dict) -> typed params with defaults; one clear error otherwise."""
    if name not in PARAMS:
        raise InputError("micro", f"unknown micro-benchmark {name!r}", ", ".join(sorted(PARAMS)))
    spec = PARAMS[name]
    raw = dict(given) if isinstance(given, dict) else {}
    if not isinstance(given, dict):
        for kv in given:
            if "=" not in kv:
                raise InputError("--param", f"{kv!r} is not KEY=VALUE", "e.g. --param footprint_kib=64")
            k, v = kv.split("=", 1)
            raw[k.strip()] = v.strip()
    out = {}
    for k, v in raw.items():
        if k not in spec:
            raise InputError(f"--param {k}", f"micro {name} has no parameter {k!r}", ", ".join(spec))
        parser, _, allowed = spec[k]
        try:
            out[k] = parser(v) if parser is not bool else parse_bool(v)
        except (TypeError, ValueError):
            raise InputError(f"--param {k}", f"{v!r} is not valid", allowed) from None
    for k, (_, default, allowed) in spec.items():
        if k not in out:
            if default is None:
                raise InputError(f"micro {name}", f"parameter {k} is required", f"--param {k}=<{allowed}>")
            out[k] = default
    return out


def asm_path(name: str):
    """A .s file: the path given, else isa/validation/NAME.s; one clear error otherwise."""
    from pathlib import Path

    from archsim.paths import isa_kernel, isa_kernel_names

    path = Path(name)
    if path.is_file():
        return path
    builtin = isa_kernel("validation", name.removesuffix(".s")) if path.name == name else None
    if builtin is not None:
        return builtin
    raise InputError("--param file", f"{name!r}: no such .s file or built-in validation kernel",
                     "a .s path or one of: " + ", ".join(isa_kernel_names("validation")))
