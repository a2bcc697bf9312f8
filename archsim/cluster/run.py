"""`archsim run --cluster C --workload WL --plan ...`: a training step of the model on the cluster
under the plan, every kernel timed by the engine, the step by the discrete-event simulation
(step.py), written as an ``archsim.cluster/1`` record."""

from __future__ import annotations

import math
import time

from archsim.errors import InputError

from . import collectives as C
from .device_collective import check_collective_software, contended_machine, device_reduce_rate
from .plan import (block_parameters, check_fits, check_plan, parse_plan, stage_layers, step_volumes,
                   with_scenario)
from .spec import Cluster, load_cluster, load_device
from .step import StepSim, block_times, check_step, link_table, link_timeline
from .topology import build, link_level, link_name

SCHEMA = "archsim.cluster/1"


def _gemm_seconds(machine, mm: int, nn: int, kk: int, dtype: str, sample: bool) -> float:
    """Seconds of one GEMM on the machine, from micro gemm (through the kernel cache)."""
    from archsim.micro import run_micro

    r = run_micro("gemm", machine, {"m": mm, "n": nn, "k": kk, "dtype": dtype, "sample": sample})
    return 2.0 * mm * nn * kk / (r.value * 1e12) if r.value > 0 else 0.0


def head_times(machine, workload, plan, opts) -> dict:
    """The LM head on the last stage, each TP rank its vocab/tp columns: the logits GEMM forward
    (tokens x vocab/tp x hidden) and its two gradient GEMMs, timed by micro gemm, side by side on
    the workers (each is one long launch)."""
    from archsim.workers import Pool

    m, sc = workload.model, workload.scenario
    rows = plan.micro_batch * (1 if sc.phase == "decode" else sc.seq)
    cols = m.vocab // plan.tp
    dtype = sc.dtype if sc.dtype in ("fp16", "bf16") else "fp32"
    shapes = [(rows, cols, m.hidden)] + ([(rows, m.hidden, cols), (m.hidden, cols, rows)] if sc.phase == "train"
                                         else [])
    with Pool(min(opts.workers, len(shapes))) as pool:
        futs = [pool.submit(_gemm_seconds, machine, *sh, dtype, opts.sample, label=f"lm_head {sh}") for sh in shapes]
        secs = [f.result() for f in futs]
    return {"forward": secs[0], "backward": sum(secs[1:]), "flops_forward": 2.0 * rows * cols * m.hidden}


# The optimizer's update goes in launches of at most OPT_LAUNCH_CHUNKS chunks of OPT_CHUNK
# parameters, as apex's multi_tensor_apply runs FusedAdam (chunk_size 2048 x 32; at most 320
# blocks a launch); the same split on a Sunway, so a device's update is at most two distinct kernels.
OPT_CHUNK = 65536
OPT_LAUNCH_CHUNKS = 320


def _flat_seconds(machine, kernel: str, n: int, *args) -> float:
    """Seconds of one launch of a flat elementwise kernel (``kernel``, the emitters' function
    name) over n elements on the machine, timed by the engine (kernel cache)."""
    from archsim.config import capabilities
    from archsim.engine.timing import shared_buffers, time_kernel

    if machine.family == "gpu":
        from archsim.workloads.emit import elementwise_gpu as ew
    else:
        from archsim.workloads.emit import elementwise_sunway as ew
    k = getattr(ew, kernel)(capabilities(machine), n, *args)
    sizes = k.buffer_bytes()
    t = time_kernel(k.program, machine, k.launch,
                    k.args(**dict(zip(sizes, shared_buffers(machine, list(sizes.values()))))))
    return t.cycles / (machine.clock_ghz * 1e9)


def _adamw_seconds(machine, n: int) -> float:
    """Seconds of one AdamW launch over n fp32 parameters."""
    return _flat_seconds(machine, "adamw_kernel", n)


def _per_size(timer):
    """timer(n) remembered for each size n (a device's launches repeat a few sizes)."""
    times: dict[int, float] = {}

    def launch(n: int) -> float:
        if n not in times:
            times[n] = timer(n)
        return times[n]
    return launch


def _launches_seconds(n: int, launch) -> float:
    """n elements in whole launches of OPT_LAUNCH_CHUNKS x OPT_CHUNK and one of the rest, each
    launch(size) seconds."""
    whole, last = divmod(int(n), OPT_CHUNK * OPT_LAUNCH_CHUNKS)
    return (whole * launch(OPT_CHUNK * OPT_LAUNCH_CHUNKS) if whole else 0.0) + (launch(last) if last else 0.0)


def _grad_accum_seconds(machine, n: int, dtype: str) -> float:
    """Seconds of one fp32 gradient-accumulation launch over n parameters."""
    return _flat_seconds(machine, "grad_accum_kernel", n, dtype)


def _copy_accum_seconds(machine, n: int, dtype: str) -> float:
    """Seconds of copying n 16-bit gradients to fp32 and adding the copy into the fp32 buffer:
    two launches (DeepSpeed's ``hp_grad.add_(lp.grad.to(hp_grad.dtype))``)."""
    return _flat_seconds(machine, "cast_kernel", n, dtype) + _flat_seconds(machine, "add_kernel", n, "fp32")


def _half_accum_seconds(machine, n: int, dtype: str) -> float:
    """Seconds of one 16-bit accumulation launch (g = g + g_new, the add kernel) over n parameters."""
    return _flat_seconds(machine, "add_kernel", n, dtype)


def grad_accum_times(machine, workload, plan, params_block: int) -> dict | None:
    """grad_accum=fp32, fp32_copy or half in a half-precision training step: seconds a device takes after
    each backward to add one block's weight gradients (its TP shard) and the embedding's (or tied
    LM head's) into the accumulation buffer, in launches split as the optimizer's; None otherwise."""
    sc = workload.scenario
    if plan.grad_accum == "fused" or sc.phase != "train" or sc.dtype == "fp32":
        return None
    timer = {"fp32": _grad_accum_seconds, "fp32_copy": _copy_accum_seconds, "half": _half_accum_seconds}[plan.grad_accum]
    launch = _per_size(lambda n: timer(machine, n, sc.dtype))
    m = workload.model
    return {"block": _launches_seconds(params_block, launch),
            "embedding": _launches_seconds(m.vocab * m.hidden // plan.tp, launch)}


def optimizer_times(machine, workload, plan) -> list[float]:
    """Per stage, seconds of the AdamW step on one device over the parameters whose state it
    holds (plan.optimizer_parameters): whole launches of OPT_LAUNCH_CHUNKS x OPT_CHUNK, then one
    of the chunks left. Empty unless the step trains."""
    from .plan import optimizer_parameters

    if workload.scenario.phase != "train":
        return []
    launch = _per_size(lambda n: _adamw_seconds(machine, n))
    return [_launches_seconds(math.ceil(params), launch) for params in optimizer_parameters(plan, workload)]


def prepare_cluster(cluster_arg):
    """The cluster (a name or path, or a resolved Cluster) and its device machine, which must say
    its memory size."""
    if isinstance(cluster_arg, Cluster):
        cluster, label = cluster_arg, cluster_arg.name
    else:
        cluster = load_cluster(cluster_arg)
        label = cluster_arg if "/" in str(cluster_arg) else f"{cluster.name}.yaml"
    machine = load_device(cluster, label)
    if machine.dram.capacity_gib is None:
        raise InputError(f"{machine.name}: dram.capacity_gib", "the device's memory size is not given",
                         "dram.capacity_gib in its config (a cluster run checks memory per device)")
    check_collective_software(cluster, machine, label)
    return cluster, machine


def prepare(cluster_arg, workload, plan_text: str):
    """Everything checked before any kernel is timed: the cluster and its device, the plan
    against both and the model, the step's limits, the memory per device."""
    cluster, machine = prepare_cluster(cluster_arg)
    plan = parse_plan(plan_text)
    check_plan(plan, cluster, workload)
    check_step(plan, workload)
    mem = check_fits(plan, workload, machine.dram.capacity_gib * 2 ** 30, machine.name)
    return cluster, machine, plan, mem


def _covered(calls) -> float:
    """Seconds during which at least one of the calls ((kind, bytes, seconds, stage, start) each) runs."""
    total, end = 0.0, -math.inf
    for t0, t1 in sorted((x[4], x[4] + x[2]) for x in calls):
        if t1 > end:
            total += t1 - max(t0, end)
            end = t1
    return total


def time_kernels(machine, workload, plan, opts, progress=None, contended=None) -> tuple:
    """The engine's times for a plan: the TP / EP shard of one block at the micro-batch (the ops
    beside a tensor-parallel all-reduce also on ``contended``, the device less the collective's
    SMs) and the LM head's GEMMs. Plans with the same tp, ep, sp, tp_async and micro-batch share them."""
    shard = with_scenario(workload, tensor_parallel=plan.tp, expert_parallel=plan.ep, batch=plan.micro_batch,
                          layers=1)
    if progress:
        progress(f"timing the block's kernels on {machine.name} (tp {plan.tp}, micro-batch {plan.micro_batch})")
    bt = block_times(machine, shard, opts, contended=contended, sp=plan.sequence_parallel, tp_async=plan.tp_async)
    if progress:
        progress("timing the LM head's GEMMs")
    return shard, bt, head_times(machine, workload, plan, opts)


def step_flops(workload, plan, head: dict) -> tuple[float, float]:
    """FLOPs of one step: the model's (the op graph's at the micro-batch, the head included) and
    the hardware's (plus what recompute runs again)."""
    m = workload.model
    train = workload.scenario.phase == "train"
    whole = with_scenario(workload, batch=plan.micro_batch, tensor_parallel=1)
    tot = whole.totals()
    ops = whole.block_ops()
    head_flops = (3 if train else 1) * head["flops_forward"] * plan.tp
    per_mb_model = tot["block_model_flops"] * m.layers + head_flops
    fwd_block = sum(o.flops for o in ops if "." not in o.name)
    extra = {"full": fwd_block, "selective": next((o.flops for o in ops if o.name == "attn"), 0.0),
             "none": 0.0}[plan.recompute] * m.layers if train else 0.0
    n_mb = plan.micro_batches * plan.dp
    return per_mb_model * n_mb, (tot["block_flops"] * m.layers + head_flops + extra) * n_mb


def step_topologies(cluster, machine, dtype: str) -> tuple:
    """(the step's network, whose reducers run at the fp32 rate of its gradient reductions; the one
    the block's collectives are timed on, at the storage type's rate; the two rates, None when the
    cluster's reductions cost its devices nothing)."""
    reduce_rate = device_reduce_rate(cluster, machine, dtype)
    grad_rate = reduce_rate if dtype == "fp32" else device_reduce_rate(cluster, machine, "fp32")
    topo = build(cluster, grad_rate)
    return topo, (build(cluster, reduce_rate) if reduce_rate != grad_rate else topo), reduce_rate, grad_rate


def run_cluster(cluster_arg, workload, plan_text: str, opts, progress=None) -> dict:
    from archsim.config.derived import peak_tflops

    t0 = time.perf_counter()
    cluster, machine, plan, mem = prepare(cluster_arg, workload, plan_text)
    m, sc = workload.model, workload.scenario
    contended = contended_machine(cluster, machine)
    topo, block_topo, reduce_rate, grad_rate = step_topologies(cluster, machine, sc.dtype)
    shard, bt, head = time_kernels(machine, workload, plan, opts, progress, contended)
    if progress and sc.phase == "train":
        progress("timing the optimizer's update")
    opt = optimizer_times(machine, workload, plan)
    accum = grad_accum_times(machine, workload, plan, block_parameters(shard))
    t_kernels = time.perf_counter() - t0
    sim = StepSim(topo, plan, workload, bt, head, block_parameters(shard),
                  expert_params_block=block_parameters(shard, experts_only=True), block_topo=block_topo,
                  optimizer=opt, grad_accum=accum)
    out = sim.run()
    step = out["step_seconds"]
    model_flops, hw_flops = step_flops(workload, plan, head)
    whole = with_scenario(workload, batch=plan.micro_batch, tensor_parallel=1)
    devices = plan.devices
    tf_model = model_flops / step / devices / 1e12
    tf_hw = hw_flops / step / devices / 1e12
    peaks = peak_tflops(machine)
    peak = peaks.get(sc.dtype, peaks.get("fp16", 0.0))

    streams = list(sim.streams.values())
    # waiting between tasks, less the waits for transfers already on their way (counted as exposed communication)
    bubble = sum(max(0.0, st.last_end - st.tasks_seconds - st.pp_exposed) for st in streams) / len(streams)
    block_colls = [it for it in bt.forward + sim.b_items if it[0] == "c"]     # TP and EP collectives in a block
    per_block = plan.micro_batches * max(sim.blocks)          # blocks a device runs a step
    tp_seconds = per_block * sum(sim.coll_seconds(it[1], it[2], it[4]) for it in block_colls)
    tp_exposed = max(st.tp_exposed for st in streams)
    pp_log, dp_log = sim.log["pipeline"], sim.log["data_parallel"]
    pp_seconds = sum(x[2] for x in pp_log) / max(len(streams), 1)
    pp_exposed = sum(st.pp_exposed for st in streams) / len(streams)
    # a stage's data-parallel time: while one of its calls runs (a stage's buckets overlap each other),
    # the first and last stage's with their embedding sums; a stage's mean
    emb_log = sim.log["embedding"]
    dp_seconds = sum(_covered([x for x in dp_log if x[3] == s] + (emb_log if s in (0, plan.pp - 1) else []))
                     for s in range(plan.pp)) / plan.pp
    # a stage's data-parallel tail: from its last compute, or from the embedding sum it waited for
    # (waiting for the other stage's compute is not communication), less its optimizer step
    dp_exposed = max(out["stage_end"][s] - max(sim.last_compute[s], sim.sync_start.get(s, 0.0)) - sim.optimizer[s]
                     for s in range(plan.pp)) + \
        sum(st.gather_exposed for st in streams) / len(streams)      # ZeRO 3's waits for weights
    exposed = tp_exposed + pp_exposed + dp_exposed
    # kind by kind: a pipeline send waited for at both its ends is exposed twice a transfer, which
    # must not count against the other kinds' overlap
    overlapped = round(sum(max(0.0, sec - exp) for sec, exp in
                           ((tp_seconds, tp_exposed), (pp_seconds, pp_exposed), (dp_seconds, dp_exposed))), 9)
    collectives = []
    for (kind, nbytes, group), sec in sorted(sim.coll_cache.items()):
        calls = per_block * sum(1 for it in block_colls if (it[1], it[2], it[4]) == (kind, nbytes, group))
        collectives.append({"kind": kind, "group": {"tp": "tensor_parallel", "ep": "expert_parallel"}[group],
                            "bytes": nbytes, "algorithm": C.choose_algorithm(kind), "count": calls,
                            "seconds": round(sec, 9), "exposed_seconds": round(tp_exposed, 9)})
    if pp_log:
        collectives.append({"kind": "send_recv", "group": "pipeline", "bytes": sim.act_bytes, "algorithm": "direct",
                            "count": len(pp_log), "seconds": round(sum(x[2] for x in pp_log) / len(pp_log), 9),
                            "exposed_seconds": round(pp_exposed, 9)})
    if emb_log:
        collectives.append({"kind": "all_reduce", "group": "embedding", "bytes": emb_log[0][1],
                            "algorithm": C.choose_algorithm("all_reduce"), "count": len(emb_log),
                            "seconds": round(sum(x[2] for x in emb_log) / len(emb_log), 9),
                            "exposed_seconds": round(dp_exposed, 9)})
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        calls = [x for x in dp_log if x[0] == kind]
        if calls:
            collectives.append({"kind": kind, "group": "data_parallel", "bytes": max(x[1] for x in calls),
                                "algorithm": "ring", "count": len(calls),
                                "seconds": round(sum(x[2] for x in calls) / len(calls), 9),
                                "exposed_seconds": round(dp_exposed, 9)})
    blocks = stage_layers(m.layers, plan.pp)
    kernels = bt.kernels
    links = link_table(sim.f, topo, step)
    busiest = _busiest_by_level(sim, topo)
    timeline = {
        "tasks": [[s, k, mb, round(t0, 9), round(t1, 9)] for s in range(plan.pp)
                  for (k, mb, t0, t1) in sim.streams[(s, 0)].spans],
        "data_parallel": [[s, round(sim.last_compute[s], 9), round(out["stage_end"][s], 9)] for s in range(plan.pp)],
        "optimizer": [[s, round(a, 9), round(b, 9)] for s, (a, b) in sorted(sim.opt_span.items())],
        "bins": 200,
        "links": [{"name": name, "level": level, "util": u} for (name, level, _), u in
                  zip(busiest, link_timeline(sim.f, topo, step, [x[2] for x in busiest], 200))],
    }
    return {
        "schema": SCHEMA,
        "cluster": {"name": cluster.name, "devices": cluster.devices, "nodes": cluster.nodes,
                    "device": machine.name},
        "workload": {**whole.summary(), "layers": m.layers, "global_batch": plan.batch},
        "plan": plan.summary(),
        "step": {"step_seconds": step,
                 "tokens_per_second": plan.batch * (1 if sc.phase == "decode" else sc.seq) / step,
                 "tflops_per_device_model": round(tf_model, 3), "tflops_per_device_hardware": round(tf_hw, 3),
                 "mfu": round(tf_model / peak, 4) if peak else None, "peak_tflops_per_device": peak,
                 "bubble_share": round(bubble / step, 4),
                 "comm_exposed_seconds": exposed, "comm_overlapped_seconds": overlapped,
                 "reduce_gbps": round(reduce_rate / 1e9, 3) if reduce_rate is not None else None,
                 "reduce_gbps_fp32": round(grad_rate / 1e9, 3) if grad_rate is not None else None,
                 "forward_block_seconds": sim.f_block[0], "backward_block_seconds": sim.b_block[0],
                 "head_seconds": {"forward": head["forward"], "backward": head["backward"]},
                 "optimizer_seconds": [round(x, 9) for x in sim.optimizer] if sc.phase == "train" else [],
                 "grad_accum_seconds": ({k: round(v, 9) for k, v in accum.items()} if accum else None)},
        "memory_per_device": {k: float(mem[k]) for k in ("weights", "gradients", "optimizer", "activations",
                                                         "kv_cache", "total", "capacity")},
        "memory_stages": [{k: (float(v) if k != "stage" and k != "blocks" else v) for k, v in x.items()
                           if k in ("stage", "blocks", "weights", "gradients", "optimizer", "activations", "kv_cache",
                                    "total")} for x in mem["stages"]],
        "volumes": step_volumes(plan, workload),
        "collectives": collectives,
        "links": links,
        "timeline": timeline,
        "stages": [{"stage": s, "layers": blocks[s], "end_seconds": out["stage_end"][s], "kernels": kernels}
                   for s in range(plan.pp)],
        "sim": {"wall_seconds": round(time.perf_counter() - t0, 3), "kernel_seconds": round(t_kernels, 3),
                "event_seconds": round(out["event_seconds"], 3), "flows": sim.f.net.flows_done},
    }


def _busiest_by_level(sim, topo, per_level: int = 3) -> list[tuple]:
    """The links that carried the most bytes, a few per level (inside a node, NICs, uplinks)."""
    import numpy as np

    lb = sim.f.net.link_bytes
    used = np.nonzero(lb > 0)[0]
    used = used[np.argsort(-lb[used])]
    out = []
    for level in ("node", "nic", "uplink", "device"):
        ids = [int(i) for i in used if link_level(topo, int(i)) == level][:per_level]
        out += [(link_name(topo, i), level, i) for i in ids]
    return out


WHAT = {"train": "training step", "prefill": "prefill (the prompt, forward)",
        "decode": "decode step (one token for the batch)"}


def format_cluster_run(r: dict) -> str:
    st, mem = r["step"], r["memory_per_device"]
    p = r["plan"]
    gb = 1e9
    lines = [
        f"{r['workload']['name']} {WHAT[r['workload']['phase']]} on {r['cluster']['name']} ({r['cluster']['devices']:,} x "
        f"{r['cluster']['device']}): tp {p['tp']}, pp {p['pp']}, dp {p['dp']}, micro-batch {p['micro_batch']}, "
        f"global batch {p['global_batch']}, {p['schedule']}, recompute {p['recompute']}, zero {p['zero']}",
        f"  step            {st['step_seconds']:.4g} s   ({st['tokens_per_second']:,.0f} tokens/s)",
        f"  per device      {st['tflops_per_device_model']:.1f} TFLOP/s model, "
        f"{st['tflops_per_device_hardware']:.1f} hardware (with recompute); MFU "
        + (f"{100 * st['mfu']:.1f} %" if st["mfu"] is not None else "-"),
        f"  bubble          {100 * st['bubble_share']:.1f} % of the step",
    ]
    if st.get("optimizer_seconds"):
        lines.append(f"  optimizer       {max(st['optimizer_seconds']) * 1e3:.4g} ms (AdamW on a device's share of its "
                     "stage's parameters, after its last gradient reduction)")
    if st.get("grad_accum_seconds"):
        ga = st["grad_accum_seconds"]
        lines.append(f"  grad accum      {ga['block'] * 1e3:.4g} ms a block, {ga['embedding'] * 1e3:.4g} ms the embedding "
                     "(into the gradient buffer after each backward)")
    lines += [
        f"  communication   {st['comm_exposed_seconds']:.4g} s exposed, {st['comm_overlapped_seconds']:.4g} s "
        "overlapped (a device)",
        f"  memory/device   {mem['total'] / gb:.1f} GB of {mem['capacity'] / gb:.1f} (weights "
        f"{mem['weights'] / gb:.1f}, gradients {mem['gradients'] / gb:.1f}, optimizer {mem['optimizer'] / gb:.1f}, "
        f"activations {mem['activations'] / gb:.1f})",
        "  bytes a step    " + ", ".join(f"{k.replace('_', ' ')} {v['bytes_per_device'] / gb:,.1f} GB a device "
                                         f"({v['collective']})" for k, v in r["volumes"].items()),
    ]
    if r["collectives"]:
        lines.append(f"  {'collective':<16}{'group':<17}{'bytes':>14}{'calls':>8}{'s a call':>11}{'exposed s':>11}")
        for c in r["collectives"]:
            lines.append(f"  {c['kind']:<16}{c['group']:<17}{c['bytes']:>14,.0f}{c['count']:>8}"
                         f"{c['seconds']:>11.4g}{c['exposed_seconds']:>11.4g}")
    if st.get("reduce_gbps") is not None:
        lines.append(f"  reductions      {st['reduce_gbps']:,.1f} GB/s a device, {st['reduce_gbps_fp32']:,.1f} fp32 "
                     "(the collectives' kernel, timed by the engine; kernels beside a tensor-parallel "
                     "all-reduce lose its SMs)")
    if r["links"]:
        busiest = r["links"][0]
        lines.append(f"  busiest link    {busiest['name']}: {100 * busiest['util']:.1f} % busy, "
                     f"{busiest['bytes'] / gb:,.2f} GB")
    s = r["sim"]
    lines.append(f"simulated in {s['wall_seconds']:.1f} s (kernels {s['kernel_seconds']:.1f} s, step "
                 f"{s['event_seconds']:.1f} s, {s['flows']:,} transfers)")
    return "\n".join(lines)


COMPARE_SCHEMA = "archsim.cluster_compare/1"


def _used(r: dict) -> int:
    """Devices a run's plan uses."""
    p = r["plan"]
    return p["tp"] * p["pp"] * p["dp"]


def format_cluster_compare(docs: list[dict]) -> str:
    """Cluster runs side by side: the machine, the step, where its time went, memory."""
    gb = 1e9

    def pct(v):
        return f"{100 * v:.1f} %" if v is not None else "-"

    rows = [
        ("cluster", lambda r: r["cluster"]["name"]),
        ("devices", lambda r: f"{_used(r):,} x {r['cluster']['device']}"),
        ("peak PFLOP/s", lambda r: f"{_used(r) * r['step']['peak_tflops_per_device'] / 1e3:,.4g}"),
        ("plan", lambda r: f"tp {r['plan']['tp']} pp {r['plan']['pp']} dp {r['plan']['dp']} mb {r['plan']['micro_batch']}"),
        ("step s", lambda r: f"{r['step']['step_seconds']:.4g}"),
        ("tokens/s", lambda r: f"{r['step']['tokens_per_second']:,.0f}"),
        ("TFLOP/s a device", lambda r: f"{r['step']['tflops_per_device_model']:.4g} model, "
                                       f"{r['step']['tflops_per_device_hardware']:.4g} hw"),
        ("MFU", lambda r: pct(r["step"]["mfu"])),
        ("bubble", lambda r: pct(r["step"]["bubble_share"])),
        ("comm exposed s", lambda r: f"{r['step']['comm_exposed_seconds']:.4g}"),
        ("memory/device GB", lambda r: f"{r['memory_per_device']['total'] / gb:.1f} of "
                                       f"{r['memory_per_device']['capacity'] / gb:.0f}"),
        ("busiest link", lambda r: (f"{r['links'][0]['name']} {100 * r['links'][0]['util']:.0f} %"
                                    if r["links"] else "-")),
    ]
    cols = [[f(r) for r in docs] for _, f in rows]
    w = max(24, *(len(v) for c in cols for v in c)) + 2
    out = []
    for (label, _), vals in zip(rows, cols):
        out.append(f"{label:<18}" + "".join(f"{v:>{w}}" for v in vals))
    base = docs[0]["step"]["step_seconds"]
    out.append(f"{'step vs first':<18}" + "".join(f"{r['step']['step_seconds'] / base:>{w - 1}.2f}x" for r in docs))
    return "\n".join(out)


__all__ = ["COMPARE_SCHEMA", "SCHEMA", "format_cluster_compare", "format_cluster_run", "head_times", "prepare", "prepare_cluster", "run_cluster", "step_flops", "step_topologies", "time_kernels"]
