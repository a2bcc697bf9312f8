"""`archsim plan --cluster C --workload WL`: the plans that fit in memory, each step simulated,
ranked by step time.

Candidates (choice): tensor parallelism inside a node (tp dividing the devices of a node and the
model's heads, hidden and FFN width); pp dividing the devices left, so every device is used
(dp = devices / (tp x pp)); micro-batches of 1, 2, 4, 8 that divide the global batch over dp;
for a mixture-of-experts model every power-of-two expert parallelism dividing its experts and dp
(placed inside); sequence parallelism off and on where tp > 1; 1F1B, and in training interleaved
1F1B with 2 chunks a stage where it applies. For each of those the cheapest memory rule that fits
is kept: no recompute before selective before full, and the lowest ZeRO stage (0-2) that fits
with it.
Kernels are timed once per (tp, ep, mb, sp) and kept in the kernel cache, so a second search is fast;
the plans' steps, independent of each other, are simulated on the command's worker processes.
"""

from __future__ import annotations

import time
from dataclasses import replace

from archsim.errors import InputError

from .device_collective import contended_machine
from .plan import Plan, block_parameters, check_plan, memory_per_device
from .run import optimizer_times, prepare_cluster, step_flops, step_topologies, time_kernels
from .step import MAX_DP, MAX_STREAMS, StepSim, check_step

SCHEMA = "archsim.plan/1"
MICRO_BATCHES = (1, 2, 4, 8)
MAX_CANDIDATES = 2000


def _variants(tp: int, phase: str) -> list[tuple]:
    """(sequence parallel, schedule, chunks) a (tp, pp, dp, mb, ep) is tried with: sequence
    parallelism where tensor parallelism splits something by tokens, and in training Megatron-LM's
    interleaved 1F1B with 2 chunks a stage beside plain 1F1B (choice: the smallest interleaving,
    which shortens the bubble most for its extra pipeline traffic)."""
    sps = (False, True) if tp > 1 and phase != "decode" else (False,)
    scheds = (("1f1b", 1), ("interleaved", 2)) if phase == "train" else (("1f1b", 1),)
    return [(sp, sched, v) for sp in sps for sched, v in scheds]


def _cheapest_fit(base: Plan, cluster, workload, capacity: float):
    """The plan with the cheapest memory rule that fits (no recompute before selective before
    full, then the lowest ZeRO stage 0-2), None if none does, or "too_big" when the step cannot
    simulate its replicas."""
    for recompute in ("none", "selective", "full"):
        for zero in (0, 1, 2):
            p = replace(base, recompute=recompute, zero=zero)
            try:
                check_plan(p, cluster, workload)
            except InputError:
                break
            try:
                check_step(p, workload)
            except InputError:
                return "too_big"
            if memory_per_device(p, workload, capacity)["total"] <= capacity:
                return p
    return None


def _shapes(cluster, workload):
    """(tp, pp, dp) of the plans tried that use every device: tp a divisor of a node's devices that
    divides the heads, hidden and FFN widths; pp a divisor of the rest, at most the layers."""
    m, per_node = workload.model, cluster.node.devices
    for tp in range(1, per_node + 1):
        if per_node % tp or m.heads % tp or m.hidden % tp or m.ffn_hidden % tp:
            continue
        rest = cluster.devices // tp
        for pp in range(1, min(rest, m.layers) + 1):
            if rest % pp == 0:
                yield tp, pp, rest // pp


def _min_dp(cluster, workload) -> int:
    """The fewest replicas of the plans tried (the most devices a replica: tp x pp)."""
    return min(dp for _, _, dp in _shapes(cluster, workload))


def candidates(cluster, workload, global_batch: int, capacity: float) -> tuple[list[Plan], int, int]:
    """Plans that pass the checks and fit in memory, how many were looked at, and how many had
    more replicas than the step simulates."""
    m = workload.model
    phase = workload.scenario.phase
    out, seen, too_big = [], 0, 0
    for tp, pp, dp in _shapes(cluster, workload):
        # a mixture-of-experts model: every power-of-two expert parallelism dividing its experts and dp
        eps = [1] if m.moe is None else [e for e in (1 << i for i in range(21))
                                         if m.moe.experts % e == 0 and dp % e == 0]
        for mb, ep in ((mb, ep) for mb in MICRO_BATCHES for ep in eps):
            if global_batch % (mb * dp):
                continue
            for sp, sched, v in _variants(tp, phase):
                base = Plan(tp=tp, pp=pp, dp=dp, ep=ep, micro_batch=mb, global_batch=global_batch,
                            schedule=sched, chunks=v, sequence_parallel=sp)
                if sched == "interleaved" and not _interleaves(base, cluster, workload):
                    continue
                seen += 1
                if seen > MAX_CANDIDATES:
                    return out, seen, too_big
                chosen = _cheapest_fit(base, cluster, workload, capacity)
                if chosen == "too_big":
                    too_big += 1
                elif chosen is not None:
                    out.append(chosen)
    return out, seen, too_big


def _interleaves(plan: Plan, cluster, workload) -> bool:
    """Whether the interleaved schedule applies to the plan (pp >= 2, the micro-batches a multiple
    of pp, a block or more a chunk)."""
    try:
        check_plan(plan, cluster, workload)
        check_step(plan, workload)
    except InputError:
        return False
    return True


def search(cluster_arg: str, workload, opts, global_batch: int | None = None, top: int = 10,
           progress=None) -> dict:
    from archsim.config.derived import peak_tflops

    t0 = time.perf_counter()
    cluster, machine = prepare_cluster(cluster_arg)
    check_step(Plan(), workload)
    gbs = global_batch if global_batch is not None else workload.scenario.batch * cluster.devices
    capacity = machine.dram.capacity_gib * 2 ** 30
    plans, seen, too_big = candidates(cluster, workload, gbs, capacity)
    if not plans and too_big:
        raise InputError("plan", f"every plan of {workload.name} that uses all {cluster.devices:,} devices of "
                         f"{cluster.name} has more replicas than the step simulates",
                         f"dp at most {MAX_DP} and pp x dp at most {MAX_STREAMS}: a cluster file with fewer nodes")
    if not seen:       # no (tp, pp) leaves a dp that splits the batch into micro-batches
        raise InputError("--gbs" if global_batch is not None else "plan",
                         f"global batch {gbs:,} does not split over the replicas of any plan that uses all "
                         f"{cluster.devices:,} devices of {cluster.name}",
                         f"a multiple of some plan's dp times a micro-batch of "
                         f"{', '.join(map(str, MICRO_BATCHES[:-1]))} or {MICRO_BATCHES[-1]}; "
                         f"the smallest dp here is {_min_dp(cluster, workload)}")
    if not plans:
        raise InputError("plan", f"no plan of {workload.name} fits {cluster.name}'s devices "
                         f"({machine.dram.capacity_gib:g} GiB each) with global batch {gbs}",
                         "a larger cluster, or a smaller model or batch")
    contended = contended_machine(cluster, machine)
    topo, block_topo, _, _ = step_topologies(cluster, machine, workload.scenario.dtype)
    kernels: dict = {}
    peaks = peak_tflops(machine)
    peak = peaks.get(workload.scenario.dtype, peaks.get("fp16", 0.0))
    for p in plans:
        key = _kernel_key(p)
        if key not in kernels:
            shard, bt, head = time_kernels(machine, workload, p, opts, progress, contended)
            # the step needs the ops' times, not the kernels' records (which workers would be sent)
            kernels[key] = (block_parameters(shard), block_parameters(shard, experts_only=True),
                            replace(bt, kernels=[]), head)
    rows = _simulate_steps(plans, kernels, topo, block_topo, machine, workload, capacity, peak, opts.workers,
                           progress)
    rows.sort(key=lambda r: r["step_seconds"])
    return {"schema": SCHEMA, "cluster": cluster.name, "workload": workload.name, "global_batch": gbs,
            "candidates": seen, "fit": len(plans), "plans": rows[:max(top, 1)], "all_plans": len(rows),
            "sim": {"wall_seconds": round(time.perf_counter() - t0, 2), "distinct_kernel_sets": len(kernels)}}


def _simulate_steps(plans, kernels, topo, block_topo, machine, workload, capacity, peak, workers, progress):
    """Each plan's step, simulated on ``workers`` processes (the plans are independent) in a few
    batches a worker (the network is sent once a batch, not once a plan), the costliest plans
    dealt first; rows in the plans' order, so the ranking does not depend on the workers."""
    from archsim.workers import Pool

    opt, work = {}, []
    for p in plans:          # the optimizer's kernels are timed here, once a size, not in every worker
        k = (p.pp, p.dp, p.tp, p.ep, p.zero)          # what plan.optimizer_parameters depends on
        if k not in opt:
            opt[k] = optimizer_times(machine, workload, p)
        work.append((p, kernels[_kernel_key(p)], opt[k]))
    # a plan's transfers grow with its replicas and its micro-batches a stage
    order = sorted(range(len(plans)), key=lambda i: -plans[i].dp * (plans[i].micro_batches * plans[i].pp
                                                                    + workload.model.layers))
    n = min(len(plans), 4 * max(1, workers))
    batches = [order[b::n] for b in range(n)]
    rows: list = [None] * len(plans)
    with Pool(min(max(1, workers), n), engine=False) as pool:
        futs = []
        for b in batches:
            items = [(i, *work[i]) for i in b]
            futs.append(pool.submit(_plan_rows, topo, block_topo, workload, items, capacity, peak,
                                    label=f"the steps of {len(b)} plans"))
        done = 0
        for f in futs:
            for i, row in f.result():
                rows[i] = row
            done += 1
            if progress:
                progress(f"{done} of {len(futs)} batches of plans simulated")
    return rows


def _kernel_key(p: Plan) -> tuple:
    """What a plan's kernels depend on: plans that share it share their kernel set."""
    return (p.tp, p.ep, p.micro_batch, p.sequence_parallel, p.tp_async)


def _plan_rows(topo, block_topo, workload, items, capacity, peak) -> list:
    """(index, row) of each plan of a batch: (index, plan, its kernels, its optimizer times)."""
    return [(i, _plan_row(topo, block_topo, p, workload, k, o, capacity, peak)) for i, p, k, o in items]


def _plan_row(topo, block_topo, p, workload, kernels, optimizer, capacity, peak) -> dict:
    """One plan's step simulated: its row of the search's table."""
    params, expert_params, bt, head = kernels
    out = StepSim(topo, p, workload, bt, head, params, record_links=False, expert_params_block=expert_params,
                  block_topo=block_topo, optimizer=optimizer).run()
    step = out["step_seconds"]
    model_flops, hw_flops = step_flops(workload, p, head)
    tf = model_flops / step / p.devices / 1e12
    mem = memory_per_device(p, workload, capacity)
    return {**p.summary(), "step_seconds": step, "tflops_per_device_model": round(tf, 3),
            "tflops_per_device_hardware": round(hw_flops / step / p.devices / 1e12, 3),
            "mfu": round(tf / peak, 4) if peak else None, "memory_per_device": mem["total"]}


def format_search(r: dict) -> str:
    lines = [f"{r['workload']} on {r['cluster']}, global batch {r['global_batch']}: {r['candidates']} plans "
             f"looked at, {r['fit']} fit in memory and were simulated; the fastest:",
             f"  {'tp':>3} {'pp':>3} {'dp':>4} {'ep':>3} {'mb':>3} {'sp':>3} {'schedule':<13} {'recompute':<10} "
             f"{'zero':>4} {'step s':>10} "
             f"{'TFLOP/s':>8} {'MFU':>6} {'GB a dev':>9}"]
    for x in r["plans"]:
        mfu = f"{100 * x['mfu']:.1f}%" if x["mfu"] is not None else "-"
        sp = "on" if x["sequence_parallel"] else "off"
        lines.append(f"  {x['tp']:>3} {x['pp']:>3} {x['dp']:>4} {x['ep']:>3} {x['micro_batch']:>3} {sp:>3} "
                     f"{x['schedule']:<13} {x['recompute']:<10} "
                     f"{x['zero']:>4} {x['step_seconds']:>10.4g} {x['tflops_per_device_model']:>8.1f} {mfu:>6} "
                     f"{x['memory_per_device'] / 1e9:>9.1f}")
    lines.append(f"searched in {r['sim']['wall_seconds']:.1f} s ({r['sim']['distinct_kernel_sets']} kernel sets timed)")
    return "\n".join(lines)


__all__ = ["MICRO_BATCHES", "SCHEMA", "candidates", "format_search", "search"]
