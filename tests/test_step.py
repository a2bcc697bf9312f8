"""The training step as a discrete-event simulation: the stream schedules against closed-form
pipeline times, tensor-parallel all-reduces beside or between kernels, data-parallel buckets on
the flow network, and the whole `run --cluster` on a tiny cluster with engine-timed kernels."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from archsim.cli import main
from archsim.cluster.plan import parse_plan
from archsim.cluster.spec import validate_cluster
from archsim.cluster.step import BlockTimes, StepSim, _op_seconds, _run_items, schedule
from archsim.errors import InputError
from archsim.cluster.topology import build
from archsim.workloads.model import load_workload

TINY = {"name": "tc", "device": "tiny-gpu", "nodes": 4,
        "node": {"devices": 4, "fabric": {"kind": "switch", "device_gbps": 100.0, "latency_us": 1.0},
                 "nics": {"count": 2, "gbit_per_s": 200.0, "latency_us": 2.0}},
        "network": {"kind": "fat_tree", "group_nodes": 2, "oversubscription": 1.0, "hop_latency_us": 0.5},
        "software": {"collective_step_us": 2.0, "kernel_gap_us": 1.0}}


def _fast():
    """Links so fast and latencies zero that transfers take no time."""
    d = json.loads(json.dumps(TINY))
    d["node"]["fabric"].update(device_gbps=1e6, latency_us=0.0)
    d["node"]["nics"].update(gbit_per_s=1e6, latency_us=0.0)
    d["network"]["hop_latency_us"] = 0.0
    d["software"] = {"collective_step_us": 0.0, "kernel_gap_us": 0.0}
    return build(validate_cluster(d))


def _synthetic(fwd=3e-3, bwd=5e-3):
    return BlockTimes(forward=[("k", fwd)], backward=[("k", bwd)], attention_forward=1e-3, kernels=[])


NO_HEAD = {"forward": 0.0, "backward": 0.0, "flops_forward": 0.0}


@pytest.mark.parametrize("sched", ["1f1b", "gpipe"])
@pytest.mark.parametrize("m", [1, 4, 7])
def test_pipeline_makespan_is_m_plus_p_minus_1_stages(sched, m):
    wl = load_workload("tiny", {"phase": "train"})          # 2 layers: stages of one block each
    plan = parse_plan(f"pp=2,mb=1,gbs={m},schedule={sched}")
    out = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000).run()
    assert out["step_seconds"] == pytest.approx((m + 1) * 8e-3, abs=1e-8)   # (free links: bytes cost ~1e-10 s)


def _slow_pipeline():
    """One device a node and 1 GB/s NICs: a pipeline send takes a while."""
    d = json.loads(json.dumps(TINY))
    d["node"]["devices"] = 1
    d["node"]["nics"] = {"count": 1, "gbit_per_s": 8.0, "latency_us": 2.0}
    d["network"]["group_nodes"] = 1
    d["software"]["kernel_gap_us"] = 0.0
    return build(validate_cluster(d))


@pytest.mark.parametrize("m", [1, 4])
def test_p2p_wait_holds_the_sender_until_delivered(m):
    """p2p=wait: a stage's stream goes on only once its pipeline send has arrived (Megatron-LM's
    exchange ends in a synchronize, DeepSpeed sends with a blocking dist.send). GPipe over two
    stages whose sends take tau each: stage 0 runs m x (f + tau) of forwards, stage 1 each forward
    as it arrives and then m x (b + tau) of backwards with their sends, stage 0 the last backward:
    its compute ends at m (f + b + 2 tau) + f + b. With p2p=overlap the sender runs on: the step
    is (m - 1) tau shorter or more, and no stream waits for its sends."""
    wl = load_workload("tiny", {"phase": "train"})
    f, b = 3e-3, 5e-3
    sims = {mode: StepSim(_slow_pipeline(), parse_plan(f"pp=2,mb=1,gbs={m},schedule=gpipe,p2p={mode}"), wl,
                          _synthetic(f, b), NO_HEAD, 1000) for mode in ("wait", "overlap")}
    out = {mode: sim.run() for mode, sim in sims.items()}
    taus = [x[2] for x in sims["wait"].log["pipeline"]]
    assert len(taus) == 2 * m and max(taus) - min(taus) < 1e-12 and taus[0] > 5e-6
    tau = taus[0]
    last = sims["wait"].last_compute          # (the step then sums the tied embedding's gradients)
    assert last[0] == pytest.approx(m * (f + b + 2 * tau) + f + b, rel=1e-9)
    spans = sims["wait"].streams[(0, 0)].spans
    for (k0, _, _, e0), (k1, mb, s1, e1), (k2, _, s2, _) in zip(spans, spans[1:], spans[2:]):
        if k1 == "P":                                   # from the end of the task that sent to the next one
            assert k0 == "F" and s1 == e0 and e1 - s1 == pytest.approx(tau, rel=1e-9)
            assert e1 == s2 if k2 == "F" else e1 < s2     # (a backward waits for its gradient)
    assert sum(k == "P" for k, *_ in spans) == m
    # stage 1 waits for its gradients' sends but the last, which runs beside its data-parallel tail
    assert sum(k == "P" for k, *_ in sims["wait"].streams[(1, 0)].spans) == m - 1
    # exposed: waiting for its own sends, and for its gradients' transfers to arrive
    assert sims["wait"].streams[(0, 0)].pp_exposed == pytest.approx(2 * m * tau, rel=1e-9)
    assert out["overlap"]["step_seconds"] <= out["wait"]["step_seconds"] - (m - 1) * tau + 1e-12
    assert not any(k == "P" for st in sims["overlap"].streams.values() for k, *_ in st.spans)


@pytest.mark.parametrize("rec", ["full", "selective", "none"])
def test_backward_spans_show_each_blocks_recompute(rec):
    """A backward with recompute is drawn as each block's recompute (R) and backward (B) in turn:
    full recompute runs the block's forward again (3 ms here), selective its attention (1 ms)."""
    wl = load_workload("tiny", {"phase": "train"})              # 2 blocks on one stage
    sim = StepSim(_fast(), parse_plan(f"mb=1,gbs=2,recompute={rec}"), wl, _synthetic(), NO_HEAD, 1000)
    sim.run()
    spans = sim.streams[(0, 0)].spans
    r = {"full": 3e-3, "selective": 1e-3, "none": 0.0}[rec]
    for mb in (0, 1):
        back = [(k, t1 - t0) for k, m, t0, t1 in spans if m == mb and k in "RB"]
        want = [("R", r), ("B", 5e-3)] * 2 if r else [("B", 10e-3)]
        assert [k for k, _ in back] == [k for k, _ in want]
        assert [d for _, d in back] == pytest.approx([d for _, d in want], rel=1e-9)


def test_backward_spans_whole_past_the_timeline_bound(monkeypatch):
    """Past MAX_SPLIT_SPANS a backward stays one span (the pictures' bound on a record's tasks)."""
    import archsim.cluster.step as ST

    monkeypatch.setattr(ST, "MAX_SPLIT_SPANS", 7)            # 2 micro-batches x 2 layers x 2 = 8
    wl = load_workload("tiny", {"phase": "train"})
    sim = StepSim(_fast(), parse_plan("mb=1,gbs=2,recompute=full"), wl, _synthetic(), NO_HEAD, 1000)
    sim.run()
    assert [k for k, *_ in sim.streams[(0, 0)].spans] == ["F", "B", "F", "B"]


def test_p2p_plan_key():
    assert parse_plan("pp=2").p2p == "wait"
    assert parse_plan("pp=2,p2p=overlap").summary()["p2p"] == "overlap"
    with pytest.raises(InputError, match="p2p='later'"):
        parse_plan("pp=2,p2p=later")


def test_one_f_one_b_order():
    plan = parse_plan("pp=4,mb=1,gbs=6")
    assert [t[:2] for t in schedule(plan, 0)] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("F", 4),
                                                  ("B", 1), ("F", 5), ("B", 2), ("B", 3), ("B", 4), ("B", 5)]
    assert schedule(plan, 3) == [x for i in range(6) for x in (("F", i, 0), ("B", i, 0))]


def test_interleaved_order_is_megatrons():
    """pp 2, v 2 chunks, 4 micro-batches: forwards go round the chunks pp micro-batches at a time;
    stage 0 warms up (pp - 1)*2 + (v - 1)*pp = 4 forwards, stage 1 two."""
    plan = parse_plan("pp=2,mb=1,gbs=4,schedule=interleaved:2")
    f = [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0), ("F", 3, 0), ("F", 2, 1), ("F", 3, 1)]
    b = [("B", 0, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0), ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)]
    assert schedule(plan, 0) == f[:4] + [x for i in range(4) for x in (f[4 + i], b[i])] + b[4:]
    assert schedule(plan, 1) == f[:2] + [x for i in range(6) for x in (f[2 + i], b[i])] + b[6:]


@pytest.mark.parametrize("v,m", [(1, 4), (2, 4), (2, 8), (4, 2), (4, 6)])
def test_interleaving_cuts_the_bubble_by_the_chunks(v, m):
    """Two stages of v blocks (the embedding and the head count as units: 2v blocks), a block a
    chunk, free communication: the step is (m*v + pp - 1) chunk forwards and backwards, the bubble
    (pp - 1)/v of a stage's whole forward and backward."""
    pp = 2
    wl = load_workload("tiny", {"phase": "train", "layers": pp * v})
    sched = f"interleaved:{v}" if v > 1 else "1f1b"
    plan = parse_plan(f"pp={pp},mb=1,gbs={m},schedule={sched}")
    out = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000).run()
    assert out["step_seconds"] == pytest.approx((m * v + pp - 1) * 8e-3, abs=1e-8)


def test_interleaving_shortens_a_deep_pipeline():
    """pp 4 (stages of 3, 4, 4, 3 blocks), 8 micro-batches: 3 chunks a stage leave less idle time
    than one, the same work done."""
    wl = load_workload("tiny", {"phase": "train", "layers": 14})
    steps = {}
    for sched in ("1f1b", "interleaved:3"):
        sim = StepSim(_fast(), parse_plan(f"pp=4,mb=1,gbs=8,schedule={sched}"), wl, _synthetic(), NO_HEAD, 1000)
        steps[sched] = sim.run()["step_seconds"]
        busy = [sum(t1 - t0 for _, _, t0, t1 in sim.streams[(s, 0)].spans) for s in range(4)]
        assert busy == pytest.approx([8 * b * 8e-3 for b in (3, 4, 4, 3)])
    assert steps["interleaved:3"] < steps["1f1b"] - 8e-3


def test_all_reduces_between_and_beside_kernels():
    ar = lambda kind, b, group: {100: 4.0, 200: 5.0}[b]  # noqa: E731
    assert _run_items([("k", 1.0), ("c", "all_reduce", 100, False), ("k", 2.0)], ar, 0.0) == (7.0, 3.0, 4.0)
    # beside: the next kernel (2 s) runs under the 5-s all-reduce; the one after waits 3 s
    assert _run_items([("k", 1.0), ("c", "all_reduce", 200, True), ("k", 2.0), ("k", 3.0)], ar, 0.0) == (9.0, 6.0, 3.0)
    # beside a kernel longer than the all-reduce: nothing exposed; gaps count as busy time
    assert _run_items([("c", "all_reduce", 100, True), ("k", 6.0), ("k", 1.0)], ar, 0.5) == (8.0, 8.0, 0.0)


def test_a_kernel_beside_an_all_reduce_runs_on_the_sms_it_leaves():
    ar = lambda kind, b, group: {100: 4.0, 200: 5.0}[b]  # noqa: E731
    # the 5-s all-reduce outlasts the kernel's 4 contended seconds: the kernel takes them all
    assert _run_items([("k", 1.0), ("c", "all_reduce", 200, True), ("k", 2.0, 1, 4.0), ("k", 3.0)], ar, 0.0) == (9.0, 8.0, 1.0)
    # a 4-s all-reduce beside a kernel of 6 s alone, 8 s contended: half its work in the 4 s, the
    # other half at its own rate (3 s)
    assert _run_items([("c", "all_reduce", 100, True), ("k", 6.0, 1, 8.0)], ar, 0.0) == (7.0, 7.0, 0.0)
    # without an all-reduce beside it the contended time is not used
    assert _run_items([("k", 6.0, 1, 8.0)], ar, 0.0) == (6.0, 6.0, 0.0)


def _with_ctas(tmp_path, name="tcc.yaml", **software):
    d = json.loads(json.dumps(TINY))
    d["software"].update(software)
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return str(p)


def test_collective_kernels_cost_the_device(capsys, tmp_path):
    """With the collectives' CTAs given, reductions cross each device's reducer (the add kernel's
    rate on those CTAs, timed by the engine) and the weight-gradient GEMMs beside the backward's
    all-reduces run on the SMs left: the step takes longer than with free collectives."""
    plan = ["--plan", "tp=2,pp=2,dp=2,mb=1,gbs=8,zero=1", "--workers", "1"]
    docs = []
    for cl in (_with_ctas(tmp_path, "free.yaml"),
               _with_ctas(tmp_path, collective_ctas=1, collective_threads=64, collective_unroll=2)):
        out = tmp_path / (cl.rsplit("/", 1)[1] + ".json")
        assert main(["run", "--cluster", cl, "--workload", "tiny", "--phase", "train", *plan, "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    free, busy = docs
    assert free["step"]["reduce_gbps"] is None and busy["step"]["reduce_gbps"] > 0
    assert "reductions" in capsys.readouterr().out
    assert busy["step"]["backward_block_seconds"] > free["step"]["backward_block_seconds"]
    assert busy["step"]["step_seconds"] > free["step"]["step_seconds"]
    assert any(link["name"].endswith(" reduce") for link in busy["links"])
    dp = {c["kind"]: c["seconds"] for c in busy["collectives"] if c["group"] == "data_parallel"}
    dp0 = {c["kind"]: c["seconds"] for c in free["collectives"] if c["group"] == "data_parallel"}
    assert dp["reduce_scatter"] > dp0["reduce_scatter"] and dp["all_gather"] == pytest.approx(dp0["all_gather"])


@pytest.mark.parametrize("software,what", [
    ({"collective_ctas": 2}, "fewer than 2, one SM a CTA"),
    ({"collective_ctas": 1, "collective_threads": 48}, "a multiple of 32"),
    ({"collective_ctas": 1, "collective_unroll": 99}, "1 to 16"),
])
def test_bad_collective_kernel_is_one_line(capsys, tmp_path, software, what):
    cl = _with_ctas(tmp_path, **software)
    assert main(["run", "--cluster", cl, "--workload", "tiny", "--phase", "train", "--plan",
                 "tp=2,pp=2,dp=2,mb=1,gbs=8", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert what in err and "software.collective" in err and "\n" not in err


def test_data_parallel_buckets_cost_network_time():
    wl = load_workload("tiny", {"phase": "train"})
    topo = build(validate_cluster(TINY))
    alone = StepSim(topo, parse_plan("pp=2,mb=1,gbs=4"), wl, _synthetic(), NO_HEAD, 10 ** 6).run()["step_seconds"]
    sim = StepSim(topo, parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=1"), wl, _synthetic(), NO_HEAD, 10 ** 6)
    out = sim.run()
    kinds = [x[0] for x in sim.log["data_parallel"]]
    assert kinds.count("reduce_scatter") == 2 * 2 and kinds.count("all_gather") == 2    # buckets, then weights
    assert out["step_seconds"] > alone + 1e-6 * 0.5
    # one device a node and a node a leaf: every reduction crosses the uplinks; tapered, the step grows
    flat = json.loads(json.dumps(TINY))
    flat["node"] = {"devices": 1, "nics": {"count": 1, "gbit_per_s": 200.0, "latency_us": 2.0}}
    flat["network"]["group_nodes"] = 1
    tight = json.loads(json.dumps(flat))
    tight["network"]["oversubscription"] = 16.0
    plan = parse_plan("pp=2,dp=2,mb=1,gbs=8")
    wide = StepSim(build(validate_cluster(flat)), plan, wl, _synthetic(), NO_HEAD, 10 ** 7).run()["step_seconds"]
    slow = StepSim(build(validate_cluster(tight)), plan, wl, _synthetic(), NO_HEAD, 10 ** 7).run()["step_seconds"]
    assert slow > wide * 1.5


def test_gradients_reduced_after_the_backward_are_one_exposed_collective():
    """grad_reduce=after (Megatron-LM's local DDP, DeepSpeed's pipeline engine): each stage reduces
    all its gradients in one collective after its last backward, so the step ends that collective's
    own time after the last compute; overlapped buckets hide part of it behind the backward."""
    from archsim.cluster import collectives as C

    wl = load_workload("tiny", {"phase": "train"})
    topo = build(validate_cluster(TINY))
    params = 10 ** 6
    sim = StepSim(topo, parse_plan("dp=2,mb=1,gbs=8,grad_reduce=after"), wl, _synthetic(), NO_HEAD, params)
    out = sim.run()
    stage = sim.stage_params(0)
    assert [x[:2] for x in sim.log["data_parallel"]] == [("all_reduce", stage * 4)]
    alone = C.time_concurrent(topo, "all_reduce", [sim.dp_group(0, 0)], stage * 4)
    assert out["step_seconds"] == pytest.approx(sim.last_compute[0] + alone, rel=1e-9)
    overlap = StepSim(topo, parse_plan("dp=2,mb=1,gbs=8"), wl, _synthetic(), NO_HEAD, params).run()
    assert overlap["step_seconds"] < out["step_seconds"] - 1e-6
    # two stages and ZeRO 1: a reduce-scatter a stage after the tied embedding's sum, then the gather
    sim2 = StepSim(topo, parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=1,grad_reduce=after"), wl, _synthetic(), NO_HEAD,
                   params)
    sim2.run()
    kinds = [x[:2] for x in sim2.log["data_parallel"]]
    assert sorted(kinds) == sorted([("reduce_scatter", sim2.stage_params(s) * 4) for s in (0, 1)] +
                                   [("all_gather", sim2.stage_params(s) * sim2.e) for s in (0, 1)])
    assert len(sim2.log["embedding"]) == 2


def test_grad_reduce_plan_key():
    assert parse_plan("dp=2").grad_reduce == "overlap"
    assert parse_plan("dp=2,grad_reduce=after").summary()["grad_reduce"] == "after"
    for text, what in (("dp=2,grad_reduce=later", "grad_reduce='later'"),
                       ("dp=2,zero=3,grad_reduce=after", "zero=3")):
        with pytest.raises(InputError, match=what):
            parse_plan(text)


def test_recompute_adds_a_forward_to_each_backward():
    wl = load_workload("tiny", {"phase": "train"})
    base = StepSim(_fast(), parse_plan("pp=2,mb=1,gbs=4"), wl, _synthetic(), NO_HEAD, 1).run()["step_seconds"]
    full = StepSim(_fast(), parse_plan("pp=2,mb=1,gbs=4,recompute=full"), wl, _synthetic(), NO_HEAD, 1).run()
    sel = StepSim(_fast(), parse_plan("pp=2,mb=1,gbs=4,recompute=selective"), wl, _synthetic(), NO_HEAD, 1).run()
    assert full["step_seconds"] == pytest.approx(5 * 11e-3) and base == pytest.approx(5 * 8e-3)
    assert sel["step_seconds"] == pytest.approx(5 * 9e-3)


@pytest.mark.parametrize("plan_text", ["pp=2,mb=1,gbs=4", "pp=2,dp=2,mb=1,gbs=8,zero=1", "pp=2,dp=2,mb=1,gbs=8,zero=3"])
def test_the_optimizer_runs_after_the_last_gradient_reduction(plan_text):
    """A stage's optimizer step starts when its last bucket is reduced and ends the stage's step (a
    ZeRO 1-2 gather after it); with links free of cost it adds its own time to the step."""
    wl = load_workload("tiny", {"phase": "train"})
    plan = parse_plan(plan_text)
    base = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000).run()
    sim = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000, optimizer=[2e-3, 7e-3])
    out = sim.run()
    assert out["step_seconds"] == pytest.approx(max(base["stage_end"][s] + x for s, x in enumerate((2e-3, 7e-3))))
    for s, x in enumerate((2e-3, 7e-3)):
        a, b = sim.opt_span[s]
        assert b - a == pytest.approx(x) and a >= sim.last_compute[s] and out["stage_end"][s] >= b


def test_tied_embedding_gradients_are_summed_between_first_and_last_stage():
    """Each replica's first and last stage sum their copies of the word embeddings' gradient (fp32,
    a TP rank's vocabulary shard) before the data-parallel buckets take them; one stage has no
    second copy. Over a slow inter-node network the sum lengthens the step's tail."""
    wl = load_workload("tiny", {"phase": "train"})
    sim = StepSim(build(validate_cluster(TINY)), parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=1"), wl, _synthetic(),
                  NO_HEAD, 1000)
    sim.run()
    m = wl.model
    assert [x[:2] for x in sim.log["embedding"]] == [("all_reduce", m.vocab * m.hidden * 4)] * 2   # a replica each
    assert all(x[2] > 0 for x in sim.log["embedding"])
    z3 = StepSim(build(validate_cluster(TINY)), parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=3"), wl, _synthetic(),
                 NO_HEAD, 1000)
    z3.run()
    assert len(z3.log["embedding"]) == 2                                   # under ZeRO 3 too
    one = StepSim(_fast(), parse_plan("pp=1,dp=2,mb=1,gbs=8"), wl, _synthetic(), NO_HEAD, 1000)
    one.run()
    assert one.log["embedding"] == []
    slow = json.loads(json.dumps(TINY))
    slow["node"] = {"devices": 1, "nics": {"count": 1, "gbit_per_s": 1.0, "latency_us": 2.0}}
    plan = parse_plan("pp=2,mb=1,gbs=4")
    base = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000).run()["step_seconds"]
    tail = StepSim(build(validate_cluster(slow)), plan, wl, _synthetic(), NO_HEAD, 1000)
    out = tail.run()
    summed = tail.log["embedding"][0][2]
    assert summed > (m.vocab * m.hidden * 4 / 2) / (1e9 / 8) * 0.9       # half the buffer each way at 1 Gb/s
    assert out["step_seconds"] >= base + summed


def test_optimizer_times_split_the_update_as_apex_launches(monkeypatch):
    """A device's update goes in launches of 320 x 65,536 parameters, each an engine-timed kernel:
    whole launches, then one of the parameters left (timed once per distinct size)."""
    from archsim.cluster import run as R
    from archsim.cluster.plan import optimizer_parameters

    wl = load_workload("tiny", {"phase": "train"})
    plan = parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=1")
    seen = []
    monkeypatch.setattr(R, "_adamw_seconds", lambda machine, n: seen.append(n) or n * 1e-9)
    monkeypatch.setattr(R, "OPT_CHUNK", 64)
    monkeypatch.setattr(R, "OPT_LAUNCH_CHUNKS", 4)           # 256 parameters a launch
    params = optimizer_parameters(plan, wl)
    got = R.optimizer_times(None, wl, plan)
    for n, t in zip(params, got):
        whole, last = divmod(int(np.ceil(n)), 256)
        assert t == pytest.approx((whole * 256 + last) * 1e-9)
    assert all(n <= 256 for n in seen) and len(seen) == len(set(seen))
    assert R.optimizer_times(None, load_workload("tiny", {"phase": "prefill"}), plan) == []


def test_grad_accum_kernel_runs_after_each_backward():
    """grad_accum=fp32: every backward task ends with the fp32 accumulation of its blocks'
    gradients and, on the stage holding it, the embedding's (or tied head's): on two stages of
    one block each, each holding one of them, the closed-form pipeline with longer backwards."""
    wl = load_workload("tiny", {"phase": "train"})
    plan = parse_plan("pp=2,mb=1,gbs=4,grad_accum=fp32")
    accum = {"block": 1e-3, "embedding": 5e-4}
    out = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000, grad_accum=accum).run()
    assert out["step_seconds"] == pytest.approx(5 * (3e-3 + 5e-3 + 1.5e-3), abs=1e-8)
    none = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 1000).run()
    assert none["step_seconds"] == pytest.approx(5 * 8e-3, abs=1e-8)


def test_grad_accum_times_split_as_the_optimizer(monkeypatch):
    """A block's and the embedding's gradients are accumulated in launches of 320 x 65,536
    parameters (each an engine-timed kernel, once a size): into fp32 with the accumulation
    kernel, into the 16-bit gradient with the add kernel; nothing when fused, in fp32 training or
    out of training."""
    from archsim.cluster import run as R

    seen = []
    monkeypatch.setattr(R, "_grad_accum_seconds", lambda machine, n, dt: seen.append(("fp32", n, dt)) or n * 1e-9)
    monkeypatch.setattr(R, "_half_accum_seconds", lambda machine, n, dt: seen.append(("half", n, dt)) or n * 2e-9)
    monkeypatch.setattr(R, "_copy_accum_seconds", lambda machine, n, dt: seen.append(("fp32_copy", n, dt)) or n * 3e-9)
    monkeypatch.setattr(R, "OPT_CHUNK", 64)
    monkeypatch.setattr(R, "OPT_LAUNCH_CHUNKS", 4)           # 256 parameters a launch
    wl = load_workload("tiny", {"phase": "train", "dtype": "bf16"})
    m = wl.model
    for mode, per in (("fp32", 1e-9), ("half", 2e-9), ("fp32_copy", 3e-9)):
        seen.clear()
        plan = parse_plan(f"tp=2,pp=2,mb=1,gbs=4,grad_accum={mode}")
        got = R.grad_accum_times(None, wl, plan, 1000)
        assert got == pytest.approx({"block": 1000 * per, "embedding": m.vocab * m.hidden // 2 * per})
        assert {(k, dt) for k, _, dt in seen} == {(mode, "bf16")} and all(n <= 256 for _, n, _ in seen)
        assert len(seen) == len(set(seen))
    assert R.grad_accum_times(None, wl, parse_plan("tp=2,pp=2,mb=1,gbs=4"), 1000) is None
    assert R.grad_accum_times(None, load_workload("tiny", {"phase": "train", "dtype": "fp32"}), plan, 1000) is None
    assert R.grad_accum_times(None, load_workload("tiny", {"phase": "prefill"}), plan, 1000) is None
    with pytest.raises(InputError, match="grad_accum='later'"):
        parse_plan("dp=2,grad_accum=later")


def test_half_accumulation_reduces_16_bit_gradients():
    """grad_accum=half keeps the gradients in the storage type, so the data-parallel reduction and
    the tied embedding's sum move half the bytes of fp32 accumulation."""
    wl = load_workload("tiny", {"phase": "train", "dtype": "fp16"})
    topo = build(validate_cluster(TINY))
    logs = {}
    for mode in ("fp32", "half"):
        sim = StepSim(topo, parse_plan(f"pp=2,dp=2,mb=1,gbs=8,grad_reduce=after,grad_accum={mode}"), wl, _synthetic(),
                      NO_HEAD, 1000)
        sim.run()
        logs[mode] = sim.log
    for key in ("data_parallel", "embedding"):
        assert [x[1] for x in logs["half"][key]] == [x[1] / 2 for x in logs["fp32"][key]]
    assert parse_plan("grad_accum=half").grad_bytes("fp32") == 4


def test_grad_accum_launch_is_timed_by_the_engine():
    """The accumulation kernel on tiny-gpu and tiny-sunway: memory-bound, longer for more
    parameters, the same time again from the kernel cache."""
    from archsim.cluster.run import _grad_accum_seconds
    from archsim.config import load_machine

    for name in ("tiny-gpu", "tiny-sunway"):
        hw = load_machine(name)
        t1, t2 = _grad_accum_seconds(hw, 1 << 14, "fp16"), _grad_accum_seconds(hw, 1 << 16, "fp16")
        assert 0 < t1 < t2 and _grad_accum_seconds(hw, 1 << 14, "fp16") == t1
        assert t2 > 2 * t1


def test_copy_then_add_costs_more_than_one_accumulation():
    """fp32_copy (DeepSpeed's add of an fp32 copy) is two launches, 18 bytes a parameter against
    the accumulation kernel's 10: on tiny-gpu it takes longer."""
    from archsim.cluster.run import _copy_accum_seconds, _grad_accum_seconds
    from archsim.config import load_machine

    tiny = load_machine("tiny-gpu")
    assert _copy_accum_seconds(tiny, 1 << 16, "bf16") > 1.3 * _grad_accum_seconds(tiny, 1 << 16, "bf16")


def test_adamw_launch_is_timed_by_the_engine():
    """The optimizer's kernel on tiny-gpu: memory-bound, its time follows the bytes it moves (more
    parameters, longer), and the kernel cache gives the same time again."""
    from archsim.cluster.run import _adamw_seconds
    from archsim.config import load_machine

    tiny = load_machine("tiny-gpu")
    t1, t2 = _adamw_seconds(tiny, 1 << 14), _adamw_seconds(tiny, 1 << 16)
    assert 0 < t1 < t2 and _adamw_seconds(tiny, 1 << 14) == t1
    assert t2 > 2 * t1


def test_run_cluster_on_a_tiny_cluster(capsys, tmp_path):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "c.json"
    code = main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--plan",
                 "tp=2,pp=2,dp=2,mb=1,gbs=8,zero=1", "--workers", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "training step on tc" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.cluster/1" and doc["plan"]["tp"] == 2 and doc["cluster"]["devices"] == 16
    st = doc["step"]
    assert st["step_seconds"] > 0 and 0 < st["mfu"] < 1 and 0 <= st["bubble_share"] < 1
    assert st["tflops_per_device_hardware"] >= st["tflops_per_device_model"] > 0
    # the step is at least the stage's kernels: m micro-batches of forward and backward
    m = 8 // (1 * 2)
    assert st["step_seconds"] >= m * (st["forward_block_seconds"] + st["backward_block_seconds"])
    assert {c["group"] for c in doc["collectives"]} == {"tensor_parallel", "pipeline", "data_parallel", "embedding"}
    assert doc["links"] and all(0 <= link["util"] <= 1 for link in doc["links"])
    assert len(doc["stages"]) == 2 and doc["stages"][0]["kernels"]
    opt = st["optimizer_seconds"]
    assert len(opt) == 2 and all(x > 0 for x in opt)
    assert [s for s, a, b in doc["timeline"]["optimizer"]] == [0, 1]
    assert all(b - a == pytest.approx(opt[s]) for s, a, b in doc["timeline"]["optimizer"])


def test_grad_accum_kernel_in_a_tiny_cluster_run(capsys, tmp_path):
    """grad_accum=fp32 in a whole run: the record gives the accumulation's seconds a block and
    for the embedding, and the step is longer than with the accumulation fused."""
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    steps = {}
    for mode in ("fused", "fp32"):
        out = tmp_path / f"{mode}.json"
        assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--dtype", "fp16",
                     "--plan", f"tp=2,pp=2,dp=2,mb=1,gbs=8,grad_accum={mode}", "--workers", "1",
                     "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        steps[mode] = doc["step"]
    capsys.readouterr()
    assert steps["fused"]["grad_accum_seconds"] is None
    acc = steps["fp32"]["grad_accum_seconds"]
    assert acc["block"] > 0 and acc["embedding"] > 0
    assert steps["fp32"]["step_seconds"] > steps["fused"]["step_seconds"] + acc["block"]


def test_cluster_run_pictures(capsys, tmp_path):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "o"
    assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--layers", "4", "--plan",
                 "tp=2,pp=4,dp=2,gbs=16", "--workers", "1", "--out", str(out), "--trace"]) == 0
    doc = json.loads((out / "cluster.json").read_text())
    tasks = doc["timeline"]["tasks"]
    assert all(t1 > t0 for _, _, _, t0, t1 in tasks)
    assert sum(k in "FB" for _, k, _, _, _ in tasks) == 4 * 2 * 8
    # p2p=wait: each stage but the last waits for its forward sends, each but the first for its
    # backward's, but for its last send, which runs beside its data-parallel tail
    assert sum(k == "P" for _, k, _, _, _ in tasks) == 2 * 3 * 8 - 3
    assert {x["level"] for x in doc["timeline"]["links"]} <= {"node", "nic", "uplink"}
    for name in ("pipeline.png", "network.png", "memory.png"):
        assert (out / name).stat().st_size > 5000
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "collectives" in page
    ev = json.loads((out / "trace.json").read_text())["traceEvents"]
    spans = [e for e in ev if e["ph"] == "X" and e["tid"] == 0]
    assert len(spans) == len(tasks) and {e["pid"] for e in spans} == {1, 2, 3, 4}
    assert all(e["dur"] > 0 for e in spans)
    assert any(e["ph"] == "C" for e in ev)              # the busiest links' utilization
    (out / "pipeline.png").unlink()
    capsys.readouterr()
    assert main(["plot", str(out)]) == 0 and (out / "pipeline.png").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "archsim.cluster/1", "plan": 3}')
    assert main(["plot", str(bad)]) == 2
    assert "not a whole archsim.cluster/1 record" in capsys.readouterr().err


@pytest.mark.parametrize("argv,what", [
    (["--plan", "tp=2"], "a cluster run needs both --cluster and --plan"),
    (["--cluster", "jean-zay-a100", "--plan", "tp=2", "--hw", "a100"], "--hw does not apply to a cluster run"),
    (["--cluster", "jean-zay-a100", "--plan", "tp=2,schedule=interleaved:2"], "pp >= 2"),
    (["--cluster", "jean-zay-a100", "--layers", "8", "--plan", "pp=2,gbs=3,schedule=interleaved:2"],
     "a multiple of pp"),
    (["--cluster", "jean-zay-a100", "--layers", "16", "--plan", "pp=4,gbs=4,schedule=interleaved:4"],
     "at most 3 chunks"),
    (["--cluster", "jean-zay-a100", "--layers", "8", "--phase", "decode", "--plan",
      "pp=2,gbs=4,schedule=interleaved:2"], "a training step"),
    (["--cluster", "jean-zay-a100", "--phase", "decode", "--plan", "tp=2,sp=on"], "sequence parallelism in a decode"),
    (["--cluster", "jean-zay-a100", "--plan", "tp=2,sp=on"], "tp dividing micro-batch x seq"),
    (["--cluster", "sunway-supernodes", "--plan", "dp=50000,gbs=50000"], "streams"),
])
def test_cluster_run_refusals_are_one_line(capsys, argv, what):
    code = main(["run", "--workload", "tiny", "--phase", "train", *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and what in err, err


def test_plan_search_ranks_plans_that_fit(capsys, tmp_path):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "p.json"
    assert main(["plan", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--layers", "4", "--gbs",
                 "32", "--top", "100", "--workers", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.plan/1" and doc["fit"] == doc["all_plans"] == len(doc["plans"]) >= 5
    steps = [p["step_seconds"] for p in doc["plans"]]
    assert steps == sorted(steps) and all(p["tp"] * p["pp"] * p["dp"] == 16 for p in doc["plans"])
    # sequence parallelism where tp > 1, interleaving where the pipeline allows it
    assert {p["sequence_parallel"] for p in doc["plans"] if p["tp"] > 1} == {False, True}
    assert not any(p["sequence_parallel"] for p in doc["plans"] if p["tp"] == 1)
    inter = [p for p in doc["plans"] if p["schedule"] == "interleaved:2"]
    assert inter and all(p["pp"] >= 2 and (32 // (p["micro_batch"] * p["dp"])) % p["pp"] == 0 for p in inter)
    # kernels timed once per (tp, micro-batch, sp)
    assert doc["sim"]["distinct_kernel_sets"] == len({(p["tp"], p["micro_batch"], p["sequence_parallel"])
                                                       for p in doc["plans"]})
    # the best plan's step, and an interleaved one's, is what run --cluster gives for it
    for best in (doc["plans"][0], inter[0]):
        plan = (f"tp={best['tp']},pp={best['pp']},dp={best['dp']},mb={best['micro_batch']},gbs=32,"
                f"recompute={best['recompute']},zero={best['zero']},schedule={best['schedule']},"
                f"sp={'on' if best['sequence_parallel'] else 'off'}")
        rec = tmp_path / "r.json"
        assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--layers", "4",
                     "--plan", plan, "--workers", "1", "--json", str(rec)]) == 0
        assert json.loads(rec.read_text())["step"]["step_seconds"] == pytest.approx(best["step_seconds"], rel=1e-12)


def test_plan_steps_on_two_workers_are_the_ones_on_one(monkeypatch):
    from archsim.cluster import search as S

    wl = load_workload("tiny", {"phase": "train"})
    cluster = validate_cluster(TINY)
    plans, _, _ = S.candidates(cluster, wl, 32, 2 ** 30)
    monkeypatch.setattr(S, "optimizer_times", lambda machine, workload, p: [1e-4 / p.dp] * p.pp)
    kernels = {S._kernel_key(p):
               (1000, 0, _synthetic(1e-3 * p.micro_batch / p.tp, 2e-3 * p.micro_batch / p.tp), NO_HEAD)
               for p in plans}
    topo = build(cluster)
    rows = [S._simulate_steps(plans, kernels, topo, topo, None, wl, 2 ** 30, 100.0, n, None) for n in (1, 2)]
    assert len(rows[0]) == len(plans) >= 15 and len({r["step_seconds"] for r in rows[0]}) > 10
    assert rows[0] == rows[1]


def test_plan_refusals(capsys, tmp_path):
    assert main(["plan", "--cluster", "jean-zay-a100", "--workload", "tiny", "--phase", "train", "--top", "0"]) == 2
    assert "--top" in capsys.readouterr().err
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))        # 1-GiB devices: nothing of BLOOM fits
    assert main(["plan", "--cluster", str(cl), "--workload", "bloom-176b", "--gbs", "16"]) == 2
    assert "no plan of bloom-176b fits" in capsys.readouterr().err


@pytest.mark.parametrize("m", [1, 3, 6])
def test_inference_pipelines_forwards_only(m):
    wl = load_workload("tiny", {"phase": "decode"})
    out = StepSim(_fast(), parse_plan(f"pp=2,mb=1,gbs={m}"), wl, _synthetic(), NO_HEAD, 1000).run()
    assert out["step_seconds"] == pytest.approx((m + 1) * 3e-3, rel=1e-9)


def test_decode_on_a_tiny_cluster(capsys, tmp_path):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "d.json"
    assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "decode", "--plan",
                 "tp=2,pp=2,mb=2,gbs=4", "--workers", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    st = doc["step"]
    assert st["tokens_per_second"] == pytest.approx(4 / st["step_seconds"])
    assert st["backward_block_seconds"] == 0 and st["head_seconds"]["backward"] == 0
    assert doc["memory_per_device"]["kv_cache"] > 0 and doc["memory_per_device"]["optimizer"] == 0
    assert not [c for c in doc["collectives"] if c["group"] == "data_parallel"]


# ---- validation: training-step curves ---------------------------------------------------------------

def _step_reference(tmp_path, points, **curve):
    wl = load_workload("tiny", {"phase": "train"}).model_dump(mode="json")
    ref = tmp_path / "ref.yaml"
    ref.write_text(yaml.safe_dump({"cluster": "tc", "curves": [
        {"name": "steps", "source": "test", "workload": wl, "x": "gpus", "unit": "TFLOP/s", "points": points,
         **curve}]}))
    return ref


def test_a_step_curve_reports_what_run_cluster_reports(capsys, tmp_path):
    """Each point is the step `run --cluster` simulates for its plan and model: the same TFLOP/s,
    and a point's model change (more layers) shows in its step."""
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    plan = "tp=2,pp=2,dp=2,mb=1,gbs=8"
    ref = _step_reference(tmp_path, [{"x": 8, "value": 1.0, "plan": plan},
                                     {"x": 16, "value": 1.0, "plan": "tp=2,pp=2,dp=4,mb=1,gbs=16",
                                      "model": {"layers": 4}}])
    out = tmp_path / "v.json"
    assert main(["validate", "--cluster", str(cl), "--reference", str(ref), "--workers", "1", "--plot", "none",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    (c,) = doc["curves"]
    assert c["kind"] == "step" and c["x"] == ["gpus"] and [p["x"] for p in c["points"]] == [8, 16]
    run = tmp_path / "r.json"
    assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--plan", plan,
                 "--workers", "1", "--json", str(run)]) == 0
    st = json.loads(run.read_text())["step"]
    p0, p1 = c["points"]
    assert p0["simulated"] == pytest.approx(st["tflops_per_device_hardware"], rel=1e-3)
    assert p0["step_seconds"] == pytest.approx(st["step_seconds"], rel=1e-9)
    assert p0["error_pct"] == pytest.approx((p0["simulated"] - 1.0) * 100, abs=0.01)
    assert p1["step_seconds"] > p0["step_seconds"]        # twice the layers per stage, twice the batch
    assert "steps" in capsys.readouterr().out


@pytest.mark.parametrize("points,curve,where,what", [
    ([{"x": 6, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {}, "points[0].x", "plan uses 8"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"ranks": 8}, "curve steps.ranks",
     "a field of collective curves"),
    ([{"x": 8, "value": 1.0, "plan": "tp=3,pp=2,dp=2,mb=1,gbs=8"}], {}, "points[0]", "tp"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8", "model": {"heads": 0}}], {}, "points[0]",
     "heads"),
    ([{"x": 8, "value": 0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {}, "points[0]", "value > 0"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8", "gpus": 8}], {}, "points[0]",
     "not a step point"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"unit": "GB/s"}, "curve steps.x",
     "TFLOP/s or s or ms/token"),
    ([{"x": 4, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"x": "batch"}, "points[0].x",
     "global batch is 8"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8", "scenario": {"phase": "decode"}}], {},
     "points[0]", "TFLOP/s of a decode step"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"workload": 7}, "curve steps.workload",
     "neither a workload name nor a mapping"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"workload": "nosuch"}, "curve steps.workload",
     "nosuch"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"workload": {"name": "w", "model": "big"}},
     "curve steps.workload.model", "not a mapping"),
    ([{"x": 8, "value": 1.0, "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8"}], {"unit": "ms/token"}, "points[0]",
     "ms/token of a train step"),
])
def test_bad_step_curve_is_one_line(capsys, tmp_path, points, curve, where, what):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    ref = _step_reference(tmp_path, points, **curve)
    assert main(["validate", "--cluster", str(cl), "--reference", str(ref), "--workers", "1", "--plot", "none"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and where in err and what in err and not cap.out, err


def test_compare_of_clusters(capsys, tmp_path):
    """Two clusters, one plan: the slower network's step is no shorter, the kernels the same."""
    fast, slow = tmp_path / "fast.yaml", tmp_path / "slow.yaml"
    fast.write_text(yaml.safe_dump(TINY))
    d = json.loads(json.dumps(TINY))
    d["name"] = "slow"
    d["node"]["nics"]["gbit_per_s"] = 1.0
    d["node"]["fabric"]["device_gbps"] = 1.0
    slow.write_text(yaml.safe_dump(d))
    out = tmp_path / "c.json"
    assert main(["compare", "--cluster", str(fast), "--cluster", str(slow), "--workload", "tiny", "--phase", "train",
                 "--plan", "tp=2,pp=2,dp=2,mb=1,gbs=8", "--workers", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step vs first" in text and "peak PFLOP/s" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.cluster_compare/1"
    a, b = doc["runs"]
    assert (a["cluster"]["name"], b["cluster"]["name"]) == ("tc", "slow")
    assert b["step"]["step_seconds"] > a["step"]["step_seconds"]
    assert b["stages"][0]["kernels"] == a["stages"][0]["kernels"]


@pytest.mark.parametrize("args,what", [
    (["--cluster", "X"], "compare got 1 cluster"),
    (["--cluster", "X", "--cluster", "Y", "--plan", "tp=1", "--plan", "tp=1", "--plan", "tp=1"], "3 plans for 2"),
    (["--cluster", "X", "--cluster", "X", "--plan", "tp=1", "--hw", "a100"], "--hw does not apply"),
    (["--hw", "tiny-gpu"], "compare got 1 machine"),
    (["--hw", "tiny-gpu", "--hw", "a100", "--plan", "tp=1"], "a plan applies to a compare of clusters"),
])
def test_bad_compare_of_clusters_is_one_line(capsys, tmp_path, args, what):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    args = [str(cl) if x == "X" else x for x in args]
    assert main(["compare", "--workload", "tiny", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and what in err, err


def test_each_kernel_launch_of_an_op_costs_a_gap():
    """An op emitted as two kernels (split-K's partial and reduce, split-KV's split and combine)
    pays the gap between kernels twice."""
    t, busy, exposed = _run_items([("k", 1.0, 2), ("k", 0.5), ("k", 0.25, 3)], lambda k, b, g: 0.0, 0.1)
    assert t == pytest.approx(1.0 + 0.2 + 0.5 + 0.1 + 0.25 + 0.3) and busy == pytest.approx(t) and exposed == 0.0


def test_an_inference_curve_reads_milliseconds_a_token_by_batch(capsys, tmp_path):
    """x: batch, unit: ms/token, a decode point a batch: the step over the batch, as the
    simulated step's tokens_per_second says."""
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    pts = [{"x": b, "value": 1.0, "plan": f"tp=2,pp=1,dp=1,mb={b},gbs={b}", "scenario": {"batch": b}}
           for b in (1, 4)]
    ref = _step_reference(tmp_path, pts, x="batch", unit="ms/token")
    doc = yaml.safe_load(ref.read_text())
    doc["curves"][0]["workload"]["scenario"].update(phase="decode", seq=16)
    ref.write_text(yaml.safe_dump(doc))
    out = tmp_path / "v.json"
    assert main(["validate", "--cluster", str(cl), "--reference", str(ref), "--workers", "1", "--plot", "none",
                 "--json", str(out)]) == 0
    (c,) = json.loads(out.read_text())["curves"]
    assert c["x"] == ["batch"] and c["unit"] == "ms/token"
    for p in c["points"]:
        assert p["simulated"] == pytest.approx(p["step_seconds"] * 1e3 / p["x"], rel=1e-3)
    assert c["points"][1]["simulated"] < c["points"][0]["simulated"]     # a bigger batch, less time a token


def test_a_kernel_timed_once_for_several_ops_counts_for_each_op():
    """The runner times identical kernels once and lists the others' ops in also_ops: norm1's
    backward kernels, timed as norm2's, count for norm1.grad (its kernels have other names)."""
    recs = [{"name": "norm2.grad.dx", "op": "norm2.grad", "seconds": 2.0, "also": ["norm1.grad.dx"],
             "also_ops": ["norm1.grad"]},
            {"name": "norm2.grad.dgamma", "op": "norm2.grad", "seconds": 1.0, "also": ["norm1.grad.dgamma"],
             "also_ops": ["norm1.grad"]},
            {"name": "ffn2.partial", "op": "ffn2", "seconds": 3.0}]
    secs, launches = _op_seconds(recs)
    assert secs == {"norm2.grad": 3.0, "norm1.grad": 3.0, "ffn2": 3.0}
    assert launches == {"norm2.grad": 2, "norm1.grad": 2, "ffn2": 1}


def test_interleaving_sends_once_a_chunk():
    from archsim.cluster.plan import step_volumes

    wl = load_workload("tiny", {"phase": "train", "layers": 8})
    one = step_volumes(parse_plan("pp=2,mb=1,gbs=4"), wl)["pipeline"]
    two = step_volumes(parse_plan("pp=2,mb=1,gbs=4,schedule=interleaved:2"), wl)["pipeline"]
    assert two["calls_per_device"] == 2 * one["calls_per_device"] == 2 * 4 * 2
    assert two["bytes_total"] == one["bytes_total"] * 3          # pp*v - 1 = 3 boundaries against 1
    sim = StepSim(_fast(), parse_plan("pp=2,mb=1,gbs=4,schedule=interleaved:2"), wl, _synthetic(), NO_HEAD, 1000)
    sim.run()
    assert len(sim.log["pipeline"]) == 4 * 2 * 3              # micro-batches x (F, B) x boundaries, tp 1



def test_sunway_collectives_reduce_on_cpes_and_take_none_from_kernels():
    from archsim.cluster.device_collective import contended_machine, device_reduce_rate
    from archsim.config import load_machine
    from archsim.errors import InputError

    d = json.loads(json.dumps(TINY))
    d["device"] = "tiny-sunway"
    d["software"]["collective_ctas"] = 4
    c = validate_cluster(d)
    m = load_machine("tiny-sunway")
    assert device_reduce_rate(c, m, "fp16") > 0 and contended_machine(c, m) is None
    d["software"]["collective_threads"] = 64
    with pytest.raises(InputError, match="collective_threads.*Sunway"):
        device_reduce_rate(validate_cluster(d), m, "fp16")


def test_sequence_parallel_layout_replaces_each_all_reduce():
    """Megatron's sequence parallelism: every all-reduce becomes a reduce-scatter after the
    row-parallel GEMMs and an all-gather before the column-parallel ones, with the backward's
    gathers of the weight-gradient inputs beside the dgrads."""
    from archsim.cluster.plan import with_scenario
    from archsim.cluster.step import beside_ops, block_layout

    shard = with_scenario(load_workload("tiny", {"phase": "train"}), tensor_parallel=2)
    plain = block_layout(shard)
    sp = block_layout(shard, sp=True)
    assert [it[1] for it in plain if it[0] == "c"] == ["all_reduce"] * 4
    kinds = [(it[1], it[2], it[3]) for it in sp if it[0] == "c"]
    assert kinds == [("all_gather", "x_n1", False), ("reduce_scatter", "proj_out", False),
                     ("all_gather", "x_n2", False), ("reduce_scatter", "ffn2_out", False),
                     ("all_gather", "d_y", False), ("all_gather", "x_n2", True), ("reduce_scatter", "d_x_n2", True),
                     ("all_gather", "d_x_mid", False), ("all_gather", "x_n1", True),
                     ("reduce_scatter", "d_x_n1", True)]
    ops = [it[1] for it in sp if it[0] == "k"]
    assert sp[sp.index(("k", "qkv")) - 1] == ("c", "all_gather", "x_n1", False, "tp")
    assert ops == [it[1] for it in plain if it[0] == "k"]
    assert beside_ops(plain) == ["ffn1.wgrad", "qkv.wgrad"]
    assert beside_ops(sp) == ["ffn1.dgrad", "ffn1.wgrad", "qkv.dgrad", "qkv.wgrad"]
    assert block_layout(with_scenario(shard, tensor_parallel=1), sp=True) == [("k", o) for o in ops]


def test_tp_async_off_exposes_the_backward_all_reduce():
    """tp_async=off (Megatron-LM before its async all-reduce, bigscience's Megatron-DeepSpeed): the
    backward's all-reduces run after the layer's backward, none beside a kernel; a block's
    backward then lasts its kernels plus every all-reduce, where with tp_async=on the weight-gradient
    GEMM hides the two it runs beside."""
    from archsim.cluster.plan import with_scenario
    from archsim.cluster.step import beside_ops, block_layout

    shard = with_scenario(load_workload("tiny", {"phase": "train"}), tensor_parallel=2)
    on, off = block_layout(shard), block_layout(shard, tp_async=False)
    assert [it[:3] for it in on] == [it[:3] for it in off] and beside_ops(off) == []
    assert beside_ops(block_layout(shard, sp=True, tp_async=False)) == []
    assert parse_plan("tp=2").tp_async and not parse_plan("tp=2,tp_async=off").tp_async
    assert parse_plan("tp=2,tp_async=off").summary()["tp_async"] is False
    with pytest.raises(InputError, match="tp_async='no'"):
        parse_plan("tp=2,tp_async=no")
    ar = lambda kind, b, group: 2.0  # noqa: E731
    # backward: dgrad (1 s), all-reduce (2 s) beside or after the wgrad (3 s), then the next dgrad
    items = [("k", 1.0), ("c", "all_reduce", 8, True), ("k", 3.0), ("k", 1.0)]
    assert _run_items(items, ar, 0.0) == (5.0, 5.0, 0.0)
    exposed = [it[:3] + (False,) if it[0] == "c" else it for it in items]
    assert _run_items(exposed, ar, 0.0) == (7.0, 5.0, 2.0)


def _tiny_runs(tmp_path, plans: dict) -> dict:
    """archsim.cluster/1 records of training steps of tiny on the TINY cluster, one per plan."""
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    docs = {}
    for name, plan in plans.items():
        out = tmp_path / f"{name}.json"
        assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--plan", plan,
                     "--workers", "1", "--json", str(out)]) == 0
        docs[name] = json.loads(out.read_text())
    return docs


def test_tp_async_reaches_the_timed_step(capsys, tmp_path):
    """A cluster run with tp_async=off lays its block out with the backward's all-reduces exposed:
    the block's backward is longer than with them beside the weight-gradient GEMMs."""
    docs = _tiny_runs(tmp_path, {mode: f"tp=2,gbs=1,tp_async={mode}" for mode in ("on", "off")})
    capsys.readouterr()
    assert docs["on"]["plan"]["tp_async"] is True and docs["off"]["plan"]["tp_async"] is False
    steps = {mode: d["step"] for mode, d in docs.items()}
    assert steps["off"]["backward_block_seconds"] > steps["on"]["backward_block_seconds"]
    assert steps["off"]["forward_block_seconds"] == steps["on"]["forward_block_seconds"]


def test_sequence_parallel_step_on_a_tiny_cluster(capsys, tmp_path):
    """The same step with sp=on: each all-reduce's bytes move as a reduce-scatter and an
    all-gather (a ring's two halves, so about the same network time), the norms and residual
    adds run on half the tokens, and less activation memory is kept."""
    docs = _tiny_runs(tmp_path, {sp: f"tp=2,pp=2,dp=2,mb=2,gbs=8,sp={sp}" for sp in ("off", "on")})
    off, on = docs["off"], docs["on"]
    tp_on = {c["kind"]: c for c in on["collectives"] if c["group"] == "tensor_parallel"}
    tp_off = {c["kind"]: c for c in off["collectives"] if c["group"] == "tensor_parallel"}
    assert set(tp_off) == {"all_reduce"} and set(tp_on) == {"all_gather", "reduce_scatter"}
    assert tp_on["all_gather"]["bytes"] == tp_off["all_reduce"]["bytes"]
    # a device's calls: 4 all-reduces a block; with sp 6 gathers and 4 reduce-scatters a block
    assert tp_off["all_reduce"]["count"] * 6 == tp_on["all_gather"]["count"] * 4
    assert tp_off["all_reduce"]["count"] == tp_on["reduce_scatter"]["count"]
    assert on["plan"]["sequence_parallel"] and on["step"]["step_seconds"] > 0
    assert on["memory_per_device"]["activations"] < off["memory_per_device"]["activations"]


def test_sequence_parallel_norms_run_on_a_share_of_the_tokens():
    from archsim.cluster.plan import with_scenario
    from archsim.cluster.step import block_times
    from archsim.config import load_machine
    from archsim.runner import RunOptions

    shard = with_scenario(load_workload("tiny", {"phase": "train"}), tensor_parallel=2, batch=2, layers=1)
    m = load_machine("tiny-gpu")
    opts = RunOptions(workers=1)
    whole, part = (block_times(m, shard, opts, sp=sp) for sp in (False, True))
    assert whole.forward[0][0] == part.forward[0][0] == "k"          # norm1 leads the block either way
    assert part.forward[0][1] < whole.forward[0][1]
    assert [it for it in part.forward if it[0] == "k"][1] == [it for it in whole.forward if it[0] == "k"][1]  # qkv


def test_zero3_gathers_each_blocks_weights_before_it_runs():
    """ZeRO 3: every forward and backward task gathers its blocks' weights over the data-parallel
    group (one gather a block, the embedding or head with the first); with free transfers the
    step is the compute alone, and on a slow network the waits for weights lengthen it."""
    wl = load_workload("tiny", {"phase": "train"})
    plan = parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=3")
    free = StepSim(_fast(), plan, wl, _synthetic(), NO_HEAD, 10 ** 6)
    base = StepSim(_fast(), parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=0"), wl, _synthetic(), NO_HEAD, 10 ** 6).run()
    assert free.run()["step_seconds"] == pytest.approx(base["step_seconds"], rel=1e-5)   # transfers near free
    gathers = [x for x in free.log["data_parallel"] if x[0] == "all_gather"]
    assert len(gathers) == 2 * 4 * 2              # stages x micro-batches x (F, B), one block each: one
    #                                               collective of every replica
    assert {x[0] for x in free.log["data_parallel"]} == {"all_gather", "reduce_scatter"}
    # a block's weights and, on both stages (the first holds the embedding, the last the head), the embedding
    assert {x[1] for x in gathers} == {(10 ** 6 + free.embed_params) * 2}
    slow_cl = json.loads(json.dumps(TINY))
    slow_cl["node"]["devices"] = 1
    slow_cl["node"]["nics"] = {"count": 1, "gbit_per_s": 8.0, "latency_us": 2.0}
    slow_cl["network"]["group_nodes"] = 1
    topo = build(validate_cluster(slow_cl))
    z1 = StepSim(topo, parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=1"), wl, _synthetic(), NO_HEAD, 10 ** 6)
    z3 = StepSim(topo, plan, wl, _synthetic(), NO_HEAD, 10 ** 6)
    t1, t3 = z1.run()["step_seconds"], z3.run()["step_seconds"]
    assert t3 > t1
    assert all(st.gather_exposed > 0 for st in z3.streams.values())
    for st in z3.streams.values():
        if st.replica == 0:     # a task lasts at least its compute
            assert all(t1_ - t0_ >= (3e-3 if k == "F" else 5e-3) * (1 - 1e-9) for k, _, t0_, t1_ in st.spans
                       if k != "P")


def test_zero3_step_volume_counts_every_gather():
    from archsim.cluster.plan import step_volumes

    wl = load_workload("tiny", {"phase": "train"})
    v1 = step_volumes(parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=1"), wl)["data_parallel"]["bytes_per_device"]
    v3 = step_volumes(parse_plan("pp=2,dp=2,mb=1,gbs=8,zero=3"), wl)["data_parallel"]["bytes_per_device"]
    grad_plus_weights = v1                         # fp32 gradients, then the fp16 weights once
    weights = grad_plus_weights / 3                # (4 + 2) bytes a parameter: weights are a third
    assert v3 == pytest.approx(grad_plus_weights - weights + 2 * 4 * weights)


def test_zero3_run_on_a_tiny_cluster(capsys, tmp_path):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "z3.json"
    assert main(["run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--plan",
                 "tp=2,pp=2,dp=2,mb=2,gbs=16,zero=3,sp=on,recompute=full", "--workers", "1", "--json",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    dp = {c["kind"]: c for c in doc["collectives"] if c["group"] == "data_parallel"}
    assert dp["all_gather"]["count"] == 2 * 4 * 2 and dp["reduce_scatter"]["count"] == 2 * 2
    assert doc["plan"]["zero"] == 3 and doc["step"]["comm_exposed_seconds"] > 0
    assert doc["memory_per_device"]["weights"] < doc["memory_per_device"]["gradients"] * 10


def test_expert_parallel_step_on_a_tiny_cluster(capsys, tmp_path):
    """ep 2 over dp 4: all-to-alls in every block (two forward, two backward), a device holds half
    the experts, and their gradients go over the replicas that hold them (less data-parallel traffic)."""
    from archsim.cluster.plan import step_volumes
    from archsim.cluster.step import block_layout
    from archsim.cluster.plan import with_scenario

    shard = with_scenario(load_workload("tiny-moe", {"phase": "train"}), expert_parallel=2)
    a2a = [(it[2], it[4]) for it in block_layout(shard) if it[0] == "c"]
    assert a2a == [("expert_in", "ep"), ("expert_out", "ep"), ("d_expert_out", "ep"), ("d_expert_in", "ep")]
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    docs = {}
    for ep in (1, 2):
        out = tmp_path / f"ep{ep}.json"
        assert main(["run", "--cluster", str(cl), "--workload", "tiny-moe", "--phase", "train", "--plan",
                     f"pp=2,dp=4,ep={ep},mb=1,gbs=8,zero=1", "--workers", "1", "--json", str(out)]) == 0
        docs[ep] = json.loads(out.read_text())
    one, two = docs[1], docs[2]
    ep_calls = [c for c in two["collectives"] if c["group"] == "expert_parallel"]
    assert len(ep_calls) == 1 and ep_calls[0]["kind"] == "all_to_all" and ep_calls[0]["count"] == 2 * 4
    assert not [c for c in one["collectives"] if c["group"] == "expert_parallel"]
    assert two["memory_per_device"]["weights"] < one["memory_per_device"]["weights"]
    rs = {ep: next(c["bytes"] for c in docs[ep]["collectives"] if c["kind"] == "reduce_scatter") for ep in (1, 2)}
    assert rs[2] < rs[1]
    v = step_volumes(parse_plan("pp=2,dp=4,ep=2,mb=1,gbs=8"), load_workload("tiny-moe", {"phase": "train"}))
    assert v["expert_parallel"]["collective"] == "all_to_all" and v["expert_parallel"]["calls_per_device"] == 8


@pytest.mark.parametrize("plan,what", [("dp=4,ep=3,gbs=4", "ep dividing the experts and dp"),
                                       ("dp=2,ep=4,gbs=2", "ep dividing the experts and dp"),
                                       ("tp=2,dp=2,gbs=2", "tp=1 for a mixture-of-experts model")])
def test_bad_expert_parallel_plan_is_one_line(capsys, tmp_path, plan, what):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    assert main(["run", "--cluster", str(cl), "--workload", "tiny-moe", "--phase", "train", "--plan", plan]) == 2
    err = capsys.readouterr().err.strip()
    assert what in err and len(err.splitlines()) == 1, err


def test_expert_parallel_groups_inside_or_across():
    """dp 8, ep 2: inside, groups of consecutive replicas and each expert on every other replica;
    across, groups of replicas 4 apart and each expert on a run of consecutive ones."""
    inside = parse_plan("dp=8,ep=2,gbs=8")
    across = parse_plan("dp=8,ep=2,gbs=8,ep_place=across")
    assert inside.ep_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert inside.expert_replicas() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert across.ep_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert across.expert_replicas() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert across.summary()["ep_place"] == "across" and "ep_place" not in parse_plan("dp=8").summary()
    with pytest.raises(InputError, match="inside or across"):
        parse_plan("dp=8,ep=2,ep_place=near")


def test_all_to_alls_across_a_tapered_network_slow_each_other():
    """Four EP groups at once: inside a node each crosses only its devices' ports; across nodes
    they share the tapered uplinks, and the all-to-all takes longer than one group's alone."""
    from archsim.cluster import collectives as C

    d = json.loads(json.dumps(TINY))
    d["network"]["oversubscription"] = 4.0
    topo = build(validate_cluster(d))
    inside = [[4 * n + i for i in range(2)] for n in range(4)]         # devices of one node
    across = [[n, n + 8] for n in range(4)]                             # node 0 with node 2: other leaves
    t_in = C.time_concurrent(topo, "all_to_all", inside, 8e6)
    t_across = C.time_concurrent(topo, "all_to_all", across, 8e6)
    alone = C.time_collective(topo, "all_to_all", across[0], 8e6)[0]
    assert t_across > alone * 1.5 and t_across > t_in * 2


def test_zero3_gather_is_one_collective_of_every_replica():
    """On an idle network with compute near free, each ZeRO 3 gather takes what the all-gather over
    the data-parallel group takes alone (the replicas join one collective, not one each)."""
    from archsim.cluster import collectives as C

    wl = load_workload("tiny", {"phase": "prefill"})
    d = json.loads(json.dumps(TINY))
    d["node"]["devices"] = 1
    d["node"]["nics"] = {"count": 1, "gbit_per_s": 8.0, "latency_us": 2.0}
    d["network"]["group_nodes"] = 4
    topo = build(validate_cluster(d))
    sim = StepSim(topo, parse_plan("dp=4,mb=1,gbs=4,zero=3"), wl, _synthetic(1e-9, 1e-9), NO_HEAD, 10 ** 6,
                  record_links=False)
    sim.run()
    gathers = [x for x in sim.log["data_parallel"] if x[0] == "all_gather"]
    assert len(gathers) == 2                      # the two blocks (the first with the embedding)
    for _, nbytes, sec, *_ in gathers:
        assert sec == pytest.approx(C.time_collective(topo, "all_gather", [0, 1, 2, 3], nbytes)[0], rel=1e-6)


@pytest.mark.parametrize("software,what", [({"collective_threads": 64}, "collective_threads without collective_ctas"),
                                           ({"collective_unroll": 4}, "collective_unroll without collective_ctas")])
def test_collective_kernel_fields_need_the_ctas(software, what):
    d = json.loads(json.dumps(TINY))
    d["software"].update(software)
    with pytest.raises(InputError, match=what):
        validate_cluster(d)


def test_ep_place_needs_expert_parallelism():
    with pytest.raises(InputError, match="without expert parallelism"):
        parse_plan("dp=4,ep_place=across")


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_expert_parallel_inference_step(capsys, tmp_path, phase):
    """Inference with experts split over ep 2: the forward's two all-to-alls a block and micro-batch."""
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "i.json"
    assert main(["run", "--cluster", str(cl), "--workload", "tiny-moe", "--phase", phase, "--plan",
                 "pp=2,dp=4,ep=2,mb=1,gbs=8", "--workers", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    a2a = [c for c in doc["collectives"] if c["group"] == "expert_parallel"]
    assert len(a2a) == 1 and a2a[0]["count"] == 2 * 2          # micro-batches a replica x 2 a block
    assert doc["step"]["step_seconds"] > 0


def test_plan_search_tries_expert_parallelism_for_a_moe_model(capsys, tmp_path):
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "p.json"
    assert main(["plan", "--cluster", str(cl), "--workload", "tiny-moe", "--phase", "train", "--top", "50",
                 "--workers", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    eps = {p["ep"] for p in doc["plans"]}
    assert eps == {1, 2, 4} and all(p["tp"] == 1 for p in doc["plans"])
    assert " ep " in capsys.readouterr().out


def test_cluster_runs_check_the_scale_before_any_kernel(capsys, tmp_path):
    """--scale on a cluster: its device must take it (one line before anything is timed), and the
    step's --trace is not the kernels' block trace that --scale refuses."""
    cl = tmp_path / "tc.yaml"
    cl.write_text(yaml.safe_dump(TINY))
    argv = ["--workload", "tiny", "--phase", "train", "--plan", "tp=2,pp=2,dp=2,mb=1,gbs=8", "--scale", "2"]
    code = main(["run", "--cluster", str(cl), *argv, "--trace", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--scale: 2:" in err and "--trace" not in err.split(":")[1]
    code = main(["compare", "--cluster", str(cl), "--cluster", str(cl), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "--scale: 2:" in err
