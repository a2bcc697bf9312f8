"""Scale models (``--scale N``, opt-in): a launch timed on a 1/N machine, read back to the whole one.

A sweep over big models spends its time simulating one wave after another of identical blocks
on every core of the machine. A scale model keeps each core's share of the machine and simulates
1/N of the cores with it:

- the machine: a GPU keeps 1/N of its SMs (rounded), L2 slices and capacity, memory controllers
  and DRAM channels, so the crossbar has 1/N of its ports and every SM still sees its share of
  the L2 and DRAM bandwidth, the same L2 slice and DRAM channel timings and the same path to the
  other L2 half; a Sunway keeps 1/N of its core groups with their memory controllers, channels
  and capacity (each group's own segment stays as large), on a ring of fewer stops;
- the launch: its first B' = ceil(B x C' / C) blocks (C and C': the blocks each machine holds
  at once), so the scale model runs as many waves as the whole launch, each of the same blocks
  with the same addresses as the whole launch's first ones (wave-sampled as any launch);
- the read-back: the scale model's cycles are the launch's; its extensive counters
  (warp-instructions, flops, bytes, stall warp-cycles, accesses) are scaled by B / B'. Rates (link
  utilisation, queue depths, hit rates) and the timeline are the scale model's own units.

What it cannot see, and why it is measured rather than assumed: fewer blocks share the L2 at once
(a GEMM wave's row and column panels are shared by fewer blocks, so each block brings more lines
from DRAM), addresses spread over fewer channels and banks, a shorter ring or arbitration among
fewer crossbar ports. ``configs/reference/scale/<machine>.yaml`` lists, per scale and kernel
kind, the largest error against the whole machine measured on the built-in models' kernels
(scripts/scale_check.py). A kernel of a kind whose error at that scale exceeds
``MAX_SCALE_ERROR`` or was measured on fewer than ``MIN_MEASURED`` kernels, or whose cut cannot
stand for the launch (cut_refusal), is timed on the whole machine, and its record says why
(``scale_refused``). Interval sampling does not apply on a scale model.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from archsim.errors import InputError
from archsim.options import DEFAULT_MAX_ERROR
from archsim.paths import data_dir

MAX_SCALE_ERROR = 0.03          # a kind whose measured error at a scale exceeds this is timed whole
MIN_MEASURED = 3                # choice: a kind measured on fewer kernels than this is timed whole
KINDS = ("gemm", "gemv", "attention", "decode_attention", "elementwise")
GEMV_ROWS = 64                  # a GEMM of at most this many rows is a GEMV (decode)
MAX_CUT_SKEW = 0.01             # the cut's mean work a block may differ this much from the launch's


def kernel_kind(op, kernel_name: str = "") -> str:
    """The kind a kernel's scale errors are measured and looked up by, from its op
    (workloads/ops.py): GEMMs of more than GEMV_ROWS rows (dense, batched and the experts'), GEMVs
    (at most that many rows: decode's, whose blocks share no weights), attention (forward and
    backward, fused or not) and decode's attention (at most GEMV_ROWS queries: a pass over the KV
    cache, bound by memory as a GEMV is), and the rest (norms, activations, adds, softmax, routing,
    a split-K GEMM's reduction: elementwise)."""
    if kernel_name.endswith(".reduce"):
        return "elementwise"
    if op.kind in ("gemm", "moe_gemm"):
        return "gemv" if op.dims["M"] <= GEMV_ROWS else "gemm"
    if op.kind.startswith("attention"):
        return "decode_attention" if op.dims["q_len"] <= GEMV_ROWS else "attention"
    return "elementwise"


def kernel_kinds(wl, kernels) -> dict:
    """{kernel name: kind} for a block's kernels: a kernel belongs to the op whose name is its own
    or the longest prefix of it ("attn.grad.dq" to "attn", "ffn2.partial" to "ffn2")."""
    from archsim.workloads.ops import build_block

    ops = {o.name: o for o in build_block(wl)[0]}
    out = {}
    for k in kernels:
        parts = k.name.split(".")
        op = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in ops), None)
        out[k.name] = kernel_kind(ops[op], k.name) if op is not None else "elementwise"
    return out


def scaled_fields(machine, n: int) -> dict:
    """{dotted path: value} that make ``machine`` its 1/n scale model; InputError (naming --scale)
    when a unit count does not divide by n."""
    if n == 1:
        return {}
    out = {}

    def cut(path: str, value, exact: bool = True):
        if value % n and exact:
            raise InputError("--scale", f"{n}: {machine.name}'s {path} {value} does not divide by {n}",
                             f"a scale dividing {_unit_counts(machine)}")
        out[path] = value // n if exact else max(1, round(value / n))

    if machine.family == "sunway":              # whole core groups with their memory
        cut("groups", machine.groups)
        if machine.dram.capacity_gib is not None:
            out["dram.capacity_gib"] = machine.dram.capacity_gib / n
    else:
        cut("cores.per_group", machine.cores.per_group, exact=False)
        if machine.l2 is not None:
            cut("l2.slices", machine.l2.slices)
            if (machine.l2.slices // n) % machine.l2.halves:
                raise InputError("--scale", f"{n}: {machine.name}'s {machine.l2.slices // n} L2 slices would not "
                                 f"split over its {machine.l2.halves} halves", f"a scale dividing {_unit_counts(machine)}")
            out["l2.size_kib"] = machine.l2.size_kib * (machine.l2.slices // n) // machine.l2.slices
    cut("memory_controllers.count", machine.memory_controllers.count)
    cut("dram.channels", machine.dram.channels)
    if getattr(machine, "clusters", None) is not None:
        out["clusters"] = None    # GPCs are not cut: a scale model runs no thread-block clusters
    return out


def _unit_counts(machine) -> str:
    if machine.family == "sunway":
        return (f"groups {machine.groups}, memory_controllers.count {machine.memory_controllers.count} and "
                f"dram.channels {machine.dram.channels}")
    l2 = f"l2.slices {machine.l2.slices} (by halves), " if machine.l2 is not None else ""
    return f"{l2}memory_controllers.count {machine.memory_controllers.count} and dram.channels {machine.dram.channels}"


def scaled_machine(machine, n: int):
    """The 1/n scale model of ``machine`` (itself for n = 1); InputError when it cannot be cut so."""
    if n == 1:
        return machine
    return _scaled(machine, n)


@lru_cache(maxsize=8)
def _scaled(machine, n: int):
    from archsim.config.load import apply_set, validate_machine

    data = machine.model_dump(mode="json")
    for path, value in scaled_fields(machine, n).items():
        data = apply_set(data, tuple(path.split(".")), value)
    data["description"] = f"{machine.description} (1/{n} scale model)"
    try:
        return validate_machine(data, f"{machine.name} at --scale {n}")
    except InputError as e:
        raise InputError("--scale", f"{n}: the 1/{n} model of {machine.name} is no machine ({e.what})",
                         f"a scale dividing {_unit_counts(machine)}") from None


def check_scale(machine, n) -> int:
    """n as a scale for ``machine``: an integer >= 1 whose scale model exists (InputError otherwise)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError("--scale", f"{n!r}", "a positive integer (1: the whole machine)")
    scaled_machine(machine, n)
    return n


def table_path(name: str) -> Path:
    """configs/reference/scale/<name>.yaml: a machine's measured scale-model errors."""
    return data_dir("configs") / "reference" / "scale" / f"{name}.yaml"


@lru_cache(maxsize=None)
def measured_errors(name: str) -> dict:
    """{scale: {kind: (largest measured |error|, kernels measured)}} for a built-in machine name
    ({} when none). Looked up by name: a variant of the machine (``--set``, an overlay, a sweep's
    point) is taken to keep its base machine's errors (a choice, docs/scale-models.md)."""
    from archsim.config.load import read_yaml

    path = table_path(name)
    if not path.is_file():
        return {}
    data = read_yaml(path)
    out = {}
    for s, kinds in (data.get("scales") or {}).items():
        out[int(s)] = {k: (float(v["max_error"]), int(v["kernels"])) for k, v in kinds.items() if k in KINDS}
    return out


def refusal(machine, n: int, kind: str) -> str | None:
    """Why a kernel of ``kind`` is not timed on the 1/n scale model of ``machine`` (None: it is)."""
    if n == 1:
        return None
    got = measured_errors(machine.name).get(n, {})
    if kind not in got:
        return f"{kind} kernels were never measured at scale {n} on {machine.name}"
    if got[kind][1] < MIN_MEASURED:
        return f"{kind} kernels were measured on {got[kind][1]} kernels only at scale {n} on {machine.name}"
    if got[kind][0] > MAX_SCALE_ERROR:
        return (f"{kind} kernels measured {got[kind][0]:.1%} off at scale {n} on {machine.name} "
                f"(above {MAX_SCALE_ERROR:.0%})")
    return None


def scaled_blocks(prog, machine, small, launch) -> int:
    """B': the first blocks of ``launch`` the scale model ``small`` runs, as many waves of it as
    the whole launch has on ``machine``."""
    from archsim.sample import concurrency

    C = concurrency(prog, machine, launch)
    Cs = concurrency(prog, small, launch)
    return min(launch.blocks, max(1, math.ceil(launch.blocks * Cs / C)))


def cut_refusal(prog, machine, launch, args: dict, scale: int, placement: str) -> str | None:
    """Why this launch cannot be read back from its 1/scale model, whatever its kind's measured
    error (None: it can): on a Sunway, buffers in the cross segment (each group's traffic goes
    round the ring to every controller; a model of fewer groups has a shorter ring and fewer
    controllers), or fewer blocks than the machine holds (the whole machine packs them into its
    first groups, or deals them to every group in turn, block g to group g; the model's groups
    would run other blocks than the whole machine's first groups do); anywhere, a cut whose
    blocks do other work than the launch's (_unrepresentative)."""
    if scale == 1:
        return None
    if machine.family == "sunway":
        from archsim.sample import concurrency

        if placement == "cross":
            return "its buffers interleave over every core group's memory (placement cross)"
        if launch.blocks < concurrency(prog, machine, launch):
            return ("its blocks do not fill the machine (dealt to the groups in turn)" if launch.spread else
                    "its blocks fill the core groups in order without filling the machine")
    return _unrepresentative(prog, machine, launch, args, scaled_blocks(prog, machine, scaled_machine(machine, scale),
                                                                         launch))


def _unrepresentative(prog, machine, launch, args: dict, Bs: int) -> str | None:
    """Why the launch's first Bs blocks do not stand for all of it (None: they do), from the
    warp-instructions of each block, counted exactly without timing (engine/counts.py); also when
    the launch's control flow cannot be counted.

    Blocks that share one memory system (a GPU; a launch of several waves): the cut's mean work a
    block must be the grid's within MAX_CUT_SKEW (a causal attention's blocks do more work the
    later their query tile; a grid-stride kernel's first blocks take its tail's extra trip).
    A Sunway launch of one wave in the groups' own segments: each group runs alone, and the
    launch lasts as long as its heaviest group (the most work, and the longest block), which
    the model's groups must include (a GEMM whose last groups hold fewer tiles)."""
    from archsim.engine.counts import count_launch
    from archsim.engine.timing import param_values

    if Bs == launch.blocks:
        return None
    counts, why = count_launch(prog, launch, param_values(prog, args), machine.cores.warp_width)
    if counts is None:
        return f"its blocks' work cannot be counted to check the cut ({why})"
    per = counts.per_block.astype(float)
    per_group = launch.blocks // machine.groups
    if machine.family == "sunway" and launch.blocks % machine.groups == 0 and Bs % per_group == 0:
        from archsim.sample import concurrency

        if launch.blocks == concurrency(prog, machine, launch):       # one wave: the groups run apart
            groups = per.reshape(machine.groups, -1)
            kept = Bs * machine.groups // launch.blocks
            for name, load in (("work", groups.sum(axis=1)), ("longest block", groups.max(axis=1))):
                if load[:kept].max() < (1 - MAX_CUT_SKEW) * load.max():
                    return (f"its first {kept} core groups' {name} is {load[:kept].max() / load.max() - 1:+.1%} "
                            "against the heaviest group's")
            return None
    skew = per[:Bs].mean() / per.mean() - 1 if per.mean() > 0 else 0.0
    if abs(skew) > MAX_CUT_SKEW:
        return f"its first {Bs} blocks average {skew:+.1%} against the launch's mean work a block"
    return None


def scaled_record(name: str, prog, machine, launch, args: dict, *, scale: int = 1, kind: str = "elementwise",
                  check: bool = True, **kw) -> dict:
    """sample.sampled_record of a launch timed on the 1/scale model of ``machine`` (module
    docstring); a kernel of a kind ``refusal`` names is timed on the whole machine (``check``
    False: on the scale model anyway, to measure its error). The record says how: ``scale`` (1:
    whole), ``scale_blocks`` (the blocks the scale model ran) and ``scale_refused`` (why a kernel
    asked to scale was not)."""
    from archsim.sample import record_of, scale_counters, time_sampled

    why = (refusal(machine, scale, kind) or cut_refusal(prog, machine, launch, args, scale,
                                                        kw.get("placement", "cross"))) if check else None
    if scale == 1 or why is not None:
        from archsim.sample import sampled_record

        rec = sampled_record(name, prog, machine, launch, args, **kw)
        rec["scale"] = 1
        if why is not None:
            rec["scale_refused"] = why
        return rec
    small = scaled_machine(machine, scale)
    Bs = scaled_blocks(prog, machine, small, launch)
    opts = {k: kw[k] for k in ("waves", "max_error", "max_cycles", "sample", "placement", "k_tile") if k in kw}
    s = time_sampled(prog, small, launch, args, upto=Bs, **opts)
    rec = record_of(name, machine, launch, s, count=kw.get("count", 1), flops=kw.get("flops"),
                    model_flops=kw.get("model_flops"), max_error=kw.get("max_error", DEFAULT_MAX_ERROR),
                    timing=scale_counters(s.timing, launch.blocks / Bs))
    rec["scale"] = scale
    rec["scale_blocks"] = Bs
    return rec
