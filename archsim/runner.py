"""`archsim run`: a workload (decoder blocks of a model in a phase) on a machine.

One decoder block is emitted (archsim.workloads.emit) and its kernels run in op order; the
workload is ``layers`` identical blocks, so every kernel counts ``layers`` times. Within a block,
kernels with the same program, launch and arguments (the two residual adds, norm1 and norm2 of
the same shape) are timed once and counted for each occurrence: `count` in the result.

- timing mode: each distinct kernel is timed on the cycle model (archsim.sample: big launches
  from a few simulated waves) with address-space-only buffers;
- functional mode (small shapes): every kernel runs on real values in block order, each output is
  compared with the op's float64 numpy reference computed from the kernel's actual inputs, and the
  block's final hidden state with a float64 numpy forward pass of the whole block
  (archsim.workloads.reference); any failure exits 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from archsim.config.derived import capabilities
from archsim.errors import InputError, SimulationError
from archsim.resources import check_work, check_workload
from archsim.options import (MAX_ERROR_DEFAULT, WAVES_DEFAULT, RunOptions, check_options,  # noqa: F401 (re-exported)
                             parse_error_bound)
from archsim.stats import result as result_doc
from archsim.stats import kernel_effort, totals


def emit_block(machine, wl) -> list:
    """The kernels of one decoder block for this machine (InputError if it cannot run them)."""
    from archsim.workloads.emit.block import emit_block as emit

    return emit(capabilities(machine), wl)


def preflight(machine, wl, opts: RunOptions, option: str = "--max-instructions N") -> list:
    """The block's kernels for this machine, after the checks that refuse a job before it starts:
    its tensors fit the device (and, functional, the host), its kernels can be emitted, and the
    warp-instructions it would simulate are estimated within ``opts.max_instructions`` (``option``
    names what raises it)."""
    functional = opts.mode == "functional"
    check_workload(machine, wl, functional)
    machine_scale(machine, opts)
    kernels = emit_block(machine, wl)
    waves = opts.waves if opts.sample and not functional else None
    check_work(machine.name, [k for k, _ in distinct_kernels(kernels)], capabilities(machine).cores_total, waves,
               opts.max_instructions, f"workload {wl.name}", option)
    return kernels


def placement_for(machine, wl, strict: bool = True) -> str:
    """The placement the workload's tensors get on this machine: the scenario's, except that a
    machine without private segments (memory interleaved over every channel) has only cross
    (InputError when ``strict``)."""
    from archsim.engine.timing import check_placement

    want = wl.scenario.placement
    if want == "private" and not strict:
        from archsim.engine.dram import segment_bytes

        if segment_bytes(machine) <= 0:
            return "cross"
    check_placement(machine, want)
    return want


def workload_record(wl, placement: str | None = None) -> dict:
    """The result's workload record; ``placement``: the one applied when it differs from the
    scenario's (the scenario's then appears as ``placement_requested``)."""
    rec = wl.summary()
    if placement is not None and placement != rec["placement"]:
        rec["placement_requested"] = rec["placement"]
        rec["placement"] = placement
    return rec


def distinct_kernels(kernels: list) -> list[tuple]:
    """(kernel, occurrences in the block), first occurrence order."""
    seen: dict[str, list] = {}
    for k in kernels:
        key = k.key()
        if key in seen:
            seen[key][1] += 1
        else:
            seen[key] = [k, 1]
    return [tuple(v) for v in seen.values()]


def timing_args(machine, params: dict, placement: str = "cross") -> dict:
    """An emitted kernel's timing arguments: each tensor slot becomes address space. cross: shared
    by every core (on Sunway: in the cross segment, see timing.shared_buffers); private: laid out
    from the usual base, which every core group reaches in its own segment (mem_state.placed_addr)."""
    from archsim.engine.launch import Unbacked
    from archsim.engine.timing import shared_buffers
    from archsim.workloads.emit.block import Slot

    slots = [p for p, v in params.items() if isinstance(v, Slot)]
    sizes = [params[p].nbytes for p in slots]
    bufs = [Unbacked(int(n)) for n in sizes] if placement == "private" else shared_buffers(machine, sizes)
    placed = dict(zip(slots, bufs))
    return {p: placed.get(p, v) for p, v in params.items()}


def run_timing(machine, wl, opts: RunOptions, placement: str, progress=None, pool=None) -> dict:
    """``placement``: the one the tensors get on this machine (placement_for). ``pool``: a
    workers.Pool the distinct kernels are timed on (default: one of ``opts.workers`` processes)."""
    return start_timing(machine, wl, opts, placement, pool).finish(progress)


def start_timing(machine, wl, opts: RunOptions, placement: str, pool=None) -> "_PendingRun":
    """Submit the block's distinct kernels to ``pool`` (None: a pool of ``opts.workers``, at most
    one per kernel, closed by ``finish``); ``.finish()`` gathers the result, so that compare can
    have every machine's kernels in one pool at once."""
    from archsim.workers import Pool

    t0 = time.perf_counter()
    kernels = preflight(machine, wl, opts)
    groups = distinct_kernels(kernels)
    own = pool is None
    if own:
        pool = Pool(min(opts.workers, len(groups)))
    layers = wl.model.layers
    timer, how = kernel_timer(machine, opts, wl, kernels)
    futures = [pool.defer(_cost(machine, k, opts), timer, k.name, k.program, machine, k.launch,
                          timing_args(machine, k.params, placement), count=n * layers, flops=k.flops,
                          model_flops=k.model_flops, waves=opts.waves, max_error=opts.max_error,
                          max_cycles=opts.max_cycles, sample=opts.sample, trace=opts.trace, placement=placement,
                          interval=opts.interval, label=f"kernel {k.name} on {machine.name}",
                          **how[k.name])
               for k, n in groups]
    return _PendingRun(machine, wl, placement, kernels, groups, futures, t0, pool.workers, pool if own else None,
                       time.perf_counter() - t0, pool)


def machine_scale(machine, opts: RunOptions) -> int:
    """The scale model ``machine``'s kernels run on: ``opts.scale`` when the machine's unit counts
    divide by it; otherwise an InputError, or (``opts.strict_scale`` off: compare) 1."""
    if opts.scale == 1:
        return 1
    from archsim.scale_model import check_scale

    try:
        return check_scale(machine, opts.scale)
    except InputError:
        if opts.strict_scale:
            raise
        return 1


def kernel_timer(machine, opts: RunOptions, wl, kernels: list) -> tuple:
    """(the function that times a kernel into its record, {kernel name: its extra arguments}):
    sample.sampled_record, or on a scale model (machine_scale above 1) scale_model.scaled_record
    with the scale and each kernel's kind (whose measured error decides whether it runs there);
    with ``opts.k_loop``, a GEMM's k tile (its k-loop sampled)."""
    scale = machine_scale(machine, opts)
    how = {k.name: {"k_tile": k.k_tile} if opts.k_loop and k.k_tile else {} for k in kernels}
    if scale == 1:
        from archsim.sample import sampled_record

        return sampled_record, how
    from archsim.scale_model import kernel_kinds, scaled_record

    return scaled_record, {name: {"scale": scale, "kind": kind, **how[name]}
                           for name, kind in kernel_kinds(wl, kernels).items()}


def _cost(machine, k, opts: RunOptions) -> float:
    """A guess at a kernel's simulation time, to start the longest first on a pool: the core-cycles
    its flops take at the machine's peak, in the share of the grid sampling simulates at least."""
    from archsim.config.derived import peak_tflops
    from archsim.resources import MAX_FLOPS_PER_INSTRUCTION, least_instructions

    caps = capabilities(machine)
    peak = max(peak_tflops(machine).values(), default=0.0)
    per_core_cycle = peak * 1e12 / (machine.clock_ghz * 1e9 * caps.cores_total) if peak > 0 else 1.0
    waves = opts.waves if opts.sample else None
    flops = least_instructions([k], caps.cores_total, waves) * MAX_FLOPS_PER_INSTRUCTION
    return flops / per_core_cycle


@dataclass
class _PendingRun:
    machine: object
    wl: object
    placement: str
    kernels: list
    groups: list
    futures: list
    t0: float
    workers: int
    own_pool: object = None          # the pool start_timing made, closed here
    setup_seconds: float = 0.0       # start_timing's own time (emission, checks)
    pool: object = None              # the pool the kernels run on (its warm-up is counted once)

    def finish(self, progress=None) -> dict:
        """The result document, kernels in op order; the first kernel that cannot finish raises
        SimulationError with the partial document (the kernels before it)."""
        try:
            return self._gather(progress)
        finally:
            if self.own_pool is not None:
                self.own_pool.close(cancel=True)

    def _gather(self, progress) -> dict:
        from archsim.workers import add_spent

        if self.workers <= 1:   # the kernels run now, in this process: this machine's time only (compare)
            self.t0 = time.perf_counter() - self.setup_seconds
        spent = {}
        efforts = {}
        recs = []

        def document(complete: bool) -> dict:
            if self.pool is not None:   # the engine's compile before the workers started, counted once
                add_spent(spent, self.pool.take_warm())
            doc = result_doc(self.machine, workload_record(self.wl, self.placement), recs,
                             time.perf_counter() - self.t0, complete=complete, spent=spent,
                             setup_extra=self.setup_seconds)
            doc["sim"]["kernel_cache"] = {"hits": spent.get("hits", 0), "misses": spent.get("misses", 0),
                                          "workers": self.workers}
            doc["sim"]["kernels"] = dict(efforts)   # what each distinct kernel's timing cost
            return doc

        for i, ((k, n), fut) in enumerate(zip(self.groups, self.futures)):
            if progress:
                progress(i, len(self.groups), k.name)
            try:
                rec = fut.result()
            except SimulationError as e:
                add_spent(spent, fut.counts)
                done = document(False)
                # where the run stopped: the kernel, the instruction, and why (the warp and core in `why`)
                done["error"] = e.line()
                done["stopped"] = {"kernel": k.name, "kernel_index": i, "kernels_total": len(self.groups),
                                   "where": e.where, "why": e.what}
                e.partial_document = done
                raise
            add_spent(spent, fut.counts)
            rec["op"] = k.op
            efforts[k.name] = kernel_effort(fut.counts)
            if n > 1:
                rec["also"] = [x.name for x in self.kernels if x.key() == k.key() and x.name != k.name]
                rec["also_ops"] = [x.op for x in self.kernels if x.key() == k.key() and x.name != k.name]
            recs.append(rec)
        if progress:
            progress(len(self.groups), len(self.groups), "")
        return document(True)


# tolerances (atol, rtol) of an op's outputs against float64 numpy from the exact inputs the
# kernels read, by storage dtype: f32 math, one rounding to the storage format per kernel (an op of
# several kernels rounds its intermediates too, hence 2-4 ulps of the format)
OP_TOL = {"i32": (0.5, 0.0), "u8": (0.5, 0.0), "fp32": (1e-4, 1e-4), "f32": (1e-4, 1e-4), "fp16": (4e-3, 8e-3), "f16": (4e-3, 8e-3),
          "bf16": (3e-2, 6e-2)}
# the whole block's output against a float64 forward pass from the same initial tensors: every
# intermediate was rounded to the storage format (about 10 roundings on the longest path)
BLOCK_TOL = {"fp32": (1e-3, 1e-3), "fp16": (3e-2, 3e-2), "bf16": (2.5e-1, 2.5e-1)}


def _verify(got: np.ndarray, ref: np.ndarray, tol: tuple, slack=0.0) -> dict:
    """``slack``: an extra per-element allowance (a GEMM accumulating below f32: its bound)."""
    atol, rtol = tol
    got = np.asarray(got, np.float64).reshape(ref.shape)
    err = np.abs(got - ref)
    rel = err / np.maximum(np.abs(ref), atol)
    passed = bool(np.all(err <= atol + rtol * np.abs(ref) + slack))
    return {"max_abs_err": float(err.max()) if err.size else 0.0,
            "max_rel_err": float(rel.max()) if rel.size else 0.0, "passed": passed}


def _merge_ver(a: dict | None, b: dict) -> dict:
    if a is None:
        return dict(b)
    return {"max_abs_err": max(a["max_abs_err"], b["max_abs_err"]),
            "max_rel_err": max(a["max_rel_err"], b["max_rel_err"]), "passed": a["passed"] and b["passed"]}


def _initial_tensors(wl, seed: int) -> dict:
    """float64 values of the tensors the block reads before writing: the weights (scaled 1/sqrt(K)
    as random_weights draws them), the input x, the KV cache (decode), d_y (train): N(0, 1)."""
    from archsim.workloads.reference import random_weights

    weights = random_weights(wl, seed)
    rng = np.random.default_rng(seed + 1)
    shapes = wl.tensor_shapes()
    produced = set()
    init = {}
    for op in wl.block_ops():
        for name in op.inputs:
            if name not in produced and name not in init:
                init[name] = weights[name] if name in weights else rng.standard_normal(shapes[name])
        produced.update(op.outputs)
    return init


# a mixture-of-experts block's discrete routing: the whole-block check takes the kernels' choices
# (rounded logits may pick another expert than float64 would; each op is checked on its own inputs)
ROUTING = ("route_e", "route_slot", "slot_token")


def _execute_block(wl, tensors: dict, routing: dict | None = None) -> dict:
    """The op graph in float64 (reference.run_op), with the decode step's KV-cache append: the new
    tokens' K, V rows of qkv enter the caches' last row before attention (as the kernels do).
    ``routing``: the route op's discrete outputs to keep (its weights recomputed from the logits)."""
    from archsim.workloads import reference as R

    env = dict(tensors)
    for op in wl.block_ops():
        if op.kind == "moe_route" and routing:
            env.update(zip(op.outputs, R.ref_moe_route_kept(env[op.inputs[0]], routing)))
            continue
        if op.kind == "attention" and "k_cache" in op.inputs:
            h = op.dims["heads"] * op.dims["head_dim"]
            for name, lo in (("k_cache", h), ("v_cache", 2 * h)):
                c = np.array(env[name], np.float64)
                c[:, -1, :] = env["qkv"][:, lo:lo + h]
                env[name] = c
        env.update(R.run_op(op, env, wl.model.norm_eps))
    return env


def run_functional_block(machine, wl, opts: RunOptions, placement: str, progress=None) -> dict:
    """Every kernel of one block on real values, in op order. After an op's kernels, its outputs
    are checked against archsim.workloads.reference.run_op on the exact values its kernels read;
    at the end the block's outputs against a float64 pass of the whole op graph from the same
    initial tensors (execute_ops) and, in prefill, against reference_block, an independent numpy
    forward pass. A mixture-of-experts block's whole-block passes keep the routing choices its
    kernels made (route_e, route_slot, slot_token, checked exactly op by op): rounded logits may
    choose another expert than float64 would. ``placement`` is recorded only: the values do not
    depend on it."""
    from archsim.engine.functional import run_functional
    from archsim.workloads import reference as R
    from archsim.workloads.emit.gemm_gpu import to_host
    from archsim.workloads.emit.block import Slot, host_to_float

    t0 = time.perf_counter()
    caps = capabilities(machine)
    kernels = preflight(machine, wl, opts)
    ops = wl.block_ops()
    shapes = wl.tensor_shapes()
    specs = {}
    for k in kernels:
        for t in k.tensors:
            specs.setdefault(t.name, t)
    init = _initial_tensors(wl, opts.seed)
    host = {n: to_host(np.asarray(v, np.float32).reshape(specs[n].shape), specs[n].dtype)
            for n, v in init.items() if n in specs}

    def value(n):
        return host_to_float(host[n], specs[n].dtype).reshape(specs[n].shape)

    def bind(slot):
        """The slot's part of its tensor as the kernel wants it (a copy: kernels get their own memory)."""
        if slot.tensor not in host:
            spec = specs[slot.tensor]
            host[slot.tensor] = to_host(np.zeros(spec.shape, np.float32), spec.dtype)
        flat = host[slot.tensor].reshape(-1)[slot.offset:]
        if slot.view is not None:
            flat = flat[:int(np.prod(slot.view))].reshape(slot.view)
        return np.ascontiguousarray(flat).copy()

    def write_back(slot, given, arr):
        """The elements the kernel changed go back into the tensor (several output parameters
        of one kernel may cover different parts of one tensor, e.g. dK and dV of d_qkv)."""
        flat = host[slot.tensor].reshape(-1)
        a, g = np.asarray(arr).reshape(-1), np.asarray(given).reshape(-1)
        bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize]
        changed = np.nonzero(a.view(bits) != g.view(bits))[0]
        flat[slot.offset + changed] = a[changed]

    recs, op_ver = [], {}
    done = 0
    for op in ops:
        before = {n: value(n) for n in op.inputs if n in host and n in op.outputs}
        for k in (k for k in kernels if k.op == op.name):
            if progress:
                progress(done, len(kernels), k.name)
            args = {p: bind(v) if isinstance(v, Slot) else v for p, v in k.params.items()}
            res = run_functional(k.program, args, k.launch, warp_width=caps.warp_width, ncores=caps.cores_total)
            for p in k.outputs:
                write_back(k.params[p], args[p], res.output(p))
            recs.append({"name": k.name, "op": k.op, "count": wl.model.layers, "grid": list(k.launch.grid),
                         "block": list(k.launch.block), "flops": int(k.flops), "model_flops": int(k.model_flops),
                         "warp_instructions": int(res.warp_instructions)})
            done += 1
        env = {n: value(n) for n in host if n in shapes}
        env.update(before)  # an op that updates a tensor in place is checked from what it read
        ver = None
        # a GEMM whose kernel accumulates below f32 (Sunway's f16x2 panel chains) may be off by its
        # accumulation bound times sum_k |a b| (the same op on |inputs|)
        acc = max((k.acc_error for k in kernels if k.op == op.name), default=0.0) if op.kind == "gemm" else 0.0
        mag = R.run_op(op, {n: np.abs(v) for n, v in env.items()}, wl.model.norm_eps) if acc else {}
        for n, ref in R.run_op(op, env, wl.model.norm_eps).items():
            slack = acc * np.abs(np.asarray(mag[n])).reshape(ref.shape) if acc else 0.0
            ver = _merge_ver(ver, _verify(value(n), ref, OP_TOL[specs[n].dtype], slack))
        op_ver[op.name] = ver
    for r in recs:
        r["verification"] = op_ver[r["op"]]
    if progress:
        progress(len(kernels), len(kernels), "")
    # the whole block from the same initial values (as the kernels read them: rounded)
    start = {n: value(n) for n in init if n in host}
    routing = {n: value(n) for n in ROUTING if n in host} or None
    env = _execute_block(wl, start, routing)
    tol = BLOCK_TOL[wl.scenario.dtype]
    consumed = {n for op in ops for n in op.inputs}
    finals = [n for op in ops for n in op.outputs if n not in consumed]  # y; d_x and every weight gradient
    block = None
    for n in finals:
        block = _merge_ver(block, _verify(value(n), env[n], tol))
    if wl.scenario.phase == "prefill":
        y = R.reference_block(wl, {n: v for n, v in start.items() if n != "x"}, start["x"], routing=routing)
        block = _merge_ver(block, _verify(value("y"), y, tol))
    block["tensors"] = finals
    wall = time.perf_counter() - t0
    doc = {"schema": "archsim.result/1", "complete": True, "mode": "functional",
           "machine": {"name": machine.name},
           "workload": workload_record(wl, placement),
           "total": {"flops": sum(r["flops"] * r["count"] for r in recs),
                     "model_flops": sum(r["model_flops"] * r["count"] for r in recs),
                     "warp_instructions": sum(r["warp_instructions"] * r["count"] for r in recs)},
           "kernels": recs, "block_verification": block, "sim": {"wall_seconds": round(wall, 4)}}
    doc["passed"] = all(r["verification"]["passed"] for r in recs) and block["passed"]
    return doc


def run_workload(machine, wl, opts: RunOptions | None = None, progress=None, pool=None) -> dict:
    return start_workload(machine, wl, opts, pool).finish(progress)


class _Functional:
    def __init__(self, *args):
        self.args = args

    def finish(self, progress=None) -> dict:
        return run_functional_block(*self.args, progress)


def start_workload(machine, wl, opts: RunOptions | None = None, pool=None):
    """A run whose timed kernels are submitted to ``pool`` (workers.Pool; None: its own of
    ``opts.workers``); ``.finish(progress)`` returns the document. A functional run runs in
    ``finish``, in this process."""
    opts = opts or RunOptions()
    placement = placement_for(machine, wl, opts.strict_placement)   # a placement the machine lacks: before any run
    if opts.mode == "functional":
        return _Functional(machine, wl, opts, placement)
    return start_timing(machine, wl, opts, placement, pool)


def run_many(machines: list, wl, opts: RunOptions, progress_for=None) -> list:
    """The workload on each machine, every machine's kernels in one pool of ``opts.workers``; a
    machine whose run stops gives its SimulationError (with ``partial_document``) in its place.
    ``progress_for(machine)``: (update, close) of that machine's progress bar."""
    from archsim.workers import Pool

    out = []
    pool = Pool(opts.workers)
    try:
        pending = [start_workload(m, wl, opts, pool) for m in machines]
        pool.flush()                  # every machine's kernels queued, the costliest first
        for m, run in zip(machines, pending):
            update, close = progress_for(m) if progress_for else (None, lambda: None)
            try:
                out.append(run.finish(update))
            except SimulationError as e:
                if getattr(e, "partial_document", None) is None:
                    raise
                out.append(e)
            finally:
                close()
    finally:
        pool.close(cancel=True)       # every result is in (or none will be): stop what is left running
    return out


__all__ = ["RunOptions", "check_options", "compare_document", "distinct_kernels", "emit_block", "kernel_timer",
           "machine_scale", "placement_for", "preflight", "run_workload", "totals"]


def compare_document(results: list[dict], complete: bool = True) -> dict:
    """The ``archsim.compare/1`` document of several machines' results on one workload."""
    return {"schema": "archsim.compare/1", "complete": complete and all(r.get("complete", True) for r in results),
            "machines": [r["machine"]["name"] for r in results], "workload": results[0]["workload"],
            "results": results}
