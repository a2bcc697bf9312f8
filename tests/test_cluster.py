"""Clusters: the schema and its one-line errors, links and routes, max-min sharing (formula
oracles), collectives as algorithm steps (closed-form times on uniform fabrics), contention
between collectives, and show-config's derived bandwidths."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.cli import main
from archsim.cluster import collectives as C
from archsim.cluster.derived import cluster_figures
from archsim.cluster.network import Events, FlowNetwork, maxmin_rates
from archsim.cluster.spec import builtin_clusters, load_cluster, validate_cluster
from archsim.cluster.topology import build, link_level, link_name, route
from archsim.errors import InputError

BASE = {"name": "t", "device": "tiny-gpu", "nodes": 4,
        "node": {"devices": 4, "fabric": {"kind": "switch", "device_gbps": 100.0, "latency_us": 1.0},
                 "nics": {"count": 2, "gbit_per_s": 200.0, "latency_us": 2.0}},
        "network": {"kind": "fat_tree", "group_nodes": 2, "oversubscription": 1.0, "hop_latency_us": 0.5}}


def cluster(**changes):
    d = copy.deepcopy(BASE)
    for path, v in changes.items():
        *head, last = path.split("__")
        blk = d
        for k in head:
            blk = blk[k]
        if v is None:
            blk.pop(last, None)
        else:
            blk[last] = v
    return validate_cluster(d, "t.yaml")


# ---- schema -----------------------------------------------------------------------------------

def test_builtin_clusters_load():
    assert builtin_clusters() == ["dgx-a100-superpod", "jean-zay-a100", "sunway-supernodes"]
    for name in builtin_clusters():
        c = load_cluster(name)
        assert c.devices == c.nodes * c.node.devices and c.sources


@pytest.mark.parametrize("changes,where,what", [
    ({"node__nics": None}, "t.yaml: node.nics", "4 nodes need NICs"),
    ({"network": None}, "t.yaml: network", "need a network"),
    ({"node__fabric": None}, "t.yaml: node.fabric", "needs a fabric"),
    ({"node__fabric__device_gbps": 0.0}, "t.yaml: node.fabric.device_gbps", "out of range"),
    ({"node__nics__gbit_per_s": 0}, "t.yaml: node.nics.gbit_per_s", ""),
    ({"node__nics__count": 5}, "t.yaml: node.nics.count", "a NIC no device uses"),
    ({"nodes": 10 ** 7}, "t.yaml: nodes", ""),
    ({"network__oversubscription": 0.5}, "t.yaml: network.oversubscription", ""),
    ({"network__kind": "torus"}, "t.yaml: network.kind", ""),
    ({"nodes": 300_000}, "t.yaml: nodes", "1,200,000 devices"),
    ({"node__fabric__bogus": 1}, "t.yaml: node.fabric.bogus", "unknown key 'bogus'"),
])
def test_bad_cluster_is_one_line(changes, where, what):
    with pytest.raises(InputError) as e:
        cluster(**changes)
    assert e.value.where == where and what in e.value.what and "\n" not in e.value.line()


def test_one_node_needs_no_network():
    c = cluster(nodes=1, network=None, node__nics=None)
    assert build(c).groups == 1 and cluster_figures(c)["bisection_gbps"] is None


field_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 10 ** 8) | st.floats(allow_nan=True)
                            | st.text(max_size=5), lambda s: st.lists(s, max_size=3)
                            | st.dictionaries(st.text(max_size=8), s, max_size=3), max_leaves=6)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["nodes", "node", "node__devices", "node__fabric", "node__fabric__kind",
                        "node__fabric__device_gbps", "node__nics__count", "node__nics__latency_us",
                        "network", "network__group_nodes", "network__oversubscription", "software",
                        "device", "name"]), field_values)
def test_any_value_is_a_cluster_or_one_line(path, value):
    try:
        c = cluster(**{path: value}) if value is not None else cluster(**{path: "x"})
    except InputError as e:
        assert e.line() and "\n" not in e.line()
        return
    t = build(c)                          # whatever validates builds and routes
    route(t, 0, c.devices - 1)


# ---- links and routes ---------------------------------------------------------------------------

def test_routes_cross_the_named_links():
    t = build(cluster())
    names = lambda s, d: [link_name(t, x) for x in route(t, s, d)[0]]   # noqa: E731
    assert names(0, 1) == ["node0 dev0 -> switch", "switch -> node0 dev1"]
    assert names(3, 5) == ["node0 nic1 up", "node1 nic0 down"]            # same leaf: no uplink
    assert names(2, 13) == ["node0 nic1 up", "leaf0 up", "leaf1 down", "node3 nic0 down"]
    assert route(t, 2, 13)[1] == pytest.approx(2e-6 + 2 * 0.5e-6)
    assert route(t, 6, 6) == ([], 0.0)


def test_ring_fabric_takes_the_short_way_round():
    t = build(cluster(node__devices=6, node__fabric__kind="ring", node__nics__count=2))
    fwd, lat = route(t, 0, 2)
    assert [link_name(t, x) for x in fwd] == ["node0 dev0 -> next", "node0 dev1 -> next"] and lat == 2e-6
    back, _ = route(t, 0, 5)
    assert [link_name(t, x) for x in back] == ["node0 dev0 -> prev"]
    assert t.capacity[fwd[0]] == 50e9          # device_gbps split over the two neighbours


def test_full_mesh_links_each_pair():
    t = build(cluster(node__fabric__kind="full_mesh"))
    seen = {route(t, s, d)[0][0] for s in range(4) for d in range(4) if s != d}
    assert len(seen) == 12 and all(t.capacity[x] == pytest.approx(100e9 / 3) for x in seen)


# ---- max-min sharing ----------------------------------------------------------------------------

def test_maxmin_classic_example():
    # link 0 (10) carries flows 0, 1; link 1 (4) carries flows 1, 2: flows 1, 2 get 2, flow 0 the rest
    r = maxmin_rates(np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), 3, np.array([10.0, 4.0]))
    assert r.tolist() == pytest.approx([8.0, 2.0, 2.0])


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.data())
def test_maxmin_is_feasible_and_every_flow_has_a_bottleneck(links, flows, data):
    cap = np.array(data.draw(st.lists(st.floats(1, 100), min_size=links, max_size=links)))
    pairs = [(f, l) for f in range(flows)
             for l in sorted(data.draw(st.sets(st.integers(0, links - 1), min_size=1, max_size=links)))]
    pf = np.array([p[0] for p in pairs])
    pl = np.array([p[1] for p in pairs])
    r = maxmin_rates(pf, pl, flows, cap)
    load = np.bincount(pl, weights=r[pf], minlength=links)
    assert (load <= cap * (1 + 1e-9)).all()
    for f in range(flows):   # a saturated link on its route where it has the largest rate
        mine = pl[pf == f]
        assert any(load[l] >= cap[l] * (1 - 1e-9) and r[f] >= r[pf[pl == l]].max() * (1 - 1e-9) for l in mine)


def test_flow_network_times():
    ev = Events()
    net = FlowNetwork(ev, np.array([100.0]), record=True)
    done = {}
    net.transfer([0], 1000.0, 1.0, lambda: done.setdefault("a", ev.now))       # alone 1 .. 6, then shared
    ev.at(6.0, lambda: net.transfer([0], 1000.0, 0.0, lambda: done.setdefault("b", ev.now)))
    ev.run()
    # a: 500 B alone in 5 s, then 500 B at 50 B/s; b: 500 B at 50 B/s, then 500 B alone
    assert done["a"] == pytest.approx(16.0) and done["b"] == pytest.approx(21.0)
    assert net.link_bytes[0] == pytest.approx(2000.0)
    # the link's rate moves twice: to 100 B/s at 1 s, back to 0 when the last flow ends (two flows
    # of 50 B/s in between leave its total unchanged)
    assert [(t, c.tolist(), v.tolist()) for t, c, v in net.changes] == [(1.0, [0], [100.0]), (21.0, [0], [0.0])]


@pytest.mark.parametrize("start", [30.0, 50.0, 1e4, 1e7])
def test_a_late_small_flow_finishes(start):
    """At a large clock a tiny remaining wait rounds to the same instant; the flow must still end."""
    ev = Events()
    net = FlowNetwork(ev, np.array([240e9]))
    done = []
    ev.at(start, lambda: net.transfer([0], 1e5, 2e-6, lambda: done.append(ev.now)))
    ev.run()
    assert done and done[0] == pytest.approx(start + 2e-6 + 1e5 / 240e9, rel=1e-12)


# ---- collectives --------------------------------------------------------------------------------

def _one_node(n, gbps=100.0, lat_us=1.0, step_us=0.0, reduce_gbps=None):
    return build(validate_cluster({"name": "n", "device": "tiny-gpu", "nodes": 1, "software": {
        "collective_step_us": step_us}, "node": {"devices": n, "fabric": {
            "kind": "switch", "device_gbps": gbps, "latency_us": lat_us}}}),
        reduce_gbps * 1e9 if reduce_gbps is not None else None)


@pytest.mark.parametrize("n", [2, 3, 8, 21])       # 21: 20 steps a phase, moved as RING_STEPS transfers
@pytest.mark.parametrize("kind,steps", [("all_reduce", 2), ("all_gather", 1), ("reduce_scatter", 1)])
def test_ring_time_is_steps_times_chunk(n, kind, steps):
    t = _one_node(n, step_us=3.0)
    size = 64e6
    sec, algo = C.time_collective(t, kind, list(range(n)), size)
    step = 4e-6 + size / n / 100e9
    assert algo == "ring" and sec == pytest.approx(steps * (n - 1) * step, rel=1e-9)


@pytest.mark.parametrize("n", [2, 4])
def test_ring_reduce_steps_run_at_the_reducer_rate(n):
    """A reducer slower than the link paces the reduce-scatter steps; the all-gather steps, which
    reduce nothing, keep the link's rate."""
    size = 4e6
    chunk = size / n
    sec, _ = C.time_collective(_one_node(n, reduce_gbps=25.0), "all_reduce", list(range(n)), size)
    assert sec == pytest.approx((n - 1) * (1e-6 + chunk / 25e9) + (n - 1) * (1e-6 + chunk / 100e9), rel=1e-9)
    fast, _ = C.time_collective(_one_node(n, reduce_gbps=400.0), "all_reduce", list(range(n)), size)
    free, _ = C.time_collective(_one_node(n), "all_reduce", list(range(n)), size)
    assert fast == pytest.approx(free, rel=1e-12)


def test_reductions_on_one_device_share_its_reducer():
    """Two all-reduces at once over the same devices: each reduce step gets half the reducer."""
    t = _one_node(4, gbps=1000.0, reduce_gbps=10.0)
    f = C.Fabric(t)
    ends = []
    for _ in range(2):
        C.run(f, "all_reduce", [0, 1, 2, 3], 4e6, lambda: ends.append(f.ev.now))
    f.ev.run()
    alone, _ = C.time_collective(t, "all_reduce", [0, 1, 2, 3], 4e6)
    assert alone == pytest.approx(3 * (1e-6 + 1e6 / 10e9) + 3 * (1e-6 + 1e6 / 1000e9), rel=1e-9)
    # reduce steps at half the reducer each, gather steps at half the link each
    both = 3 * (1e-6 + 1e6 / 5e9) + 3 * (1e-6 + 1e6 / 500e9)
    assert ends[0] == pytest.approx(ends[1]) and ends[0] == pytest.approx(both, rel=1e-9)


def test_tree_reduces_at_the_parent_reducer():
    t = _one_node(4, gbps=1000.0, reduce_gbps=5.0)
    slow, _ = C.time_collective(t, "all_reduce", [0, 1, 2, 3], 64e6, "tree")
    free, _ = C.time_collective(_one_node(4, gbps=1000.0), "all_reduce", [0, 1, 2, 3], 64e6, "tree")
    # each tree carries half the buffer up a chain of 3 links into reducers of 5 GB/s (shared by
    # the two trees where a rank is a parent in both), far slower than the links
    assert slow > 32e6 / 5e9 and slow > 3 * free


def test_reducer_links_are_named_and_levelled():
    t = _one_node(4, reduce_gbps=25.0)
    assert t.reduce0 == len(t.capacity) - 4 and t.capacity[-1] == 25e9
    assert link_name(t, t.reduce0 + 2) == "node0 dev2 reduce" and link_level(t, t.reduce0) == "device"
    assert _one_node(4).reduce0 == -1


def test_all_to_all_is_bound_by_each_port():
    t = _one_node(8)
    sec, algo = C.time_collective(t, "all_to_all", list(range(8)), 80e6)
    assert algo == "direct" and sec == pytest.approx(1e-6 + 7 * 10e6 / 100e9)


def test_broadcast_chain_pipelines_chunks():
    t = _one_node(4)
    size = 16 * C.CHUNK_BYTES
    sec, algo = C.time_collective(t, "broadcast", list(range(4)), size)
    chunk = 1e-6 + C.CHUNK_BYTES / 100e9
    assert algo == "chain" and sec == pytest.approx((3 + 15) * chunk)


def test_tree_all_reduce_approaches_the_bandwidth_bound():
    t = _one_node(8, lat_us=0.0)
    size = 256e6
    tree, _ = C.time_collective(t, "all_reduce", list(range(8)), size, "tree")
    ring, _ = C.time_collective(t, "all_reduce", list(range(8)), size, "ring")
    assert size / 100e9 <= tree <= 2 * ring
    assert C._tree_parents(7, 0).count(-1) == 1 and C._tree_parents(7, 1).count(-1) == 1


def test_send_recv_and_single_rank():
    t = _one_node(2)
    sec, _ = C.time_collective(t, "send_recv", [0, 1], 1e6)
    assert sec == pytest.approx(1e-6 + 1e6 / 100e9)
    assert C.time_collective(t, "all_reduce", [1], 1e9)[0] == 0.0


def test_channels_use_every_nic():
    t = build(cluster())
    orders = C.channel_orders(C.Fabric(t), list(range(16)))
    assert len(orders) == 2
    ups = [{link_name(t, route(t, o[i], o[(i + 1) % 16])[0][0]) for i in range(16)
            if t.node_of(o[i]) != t.node_of(o[(i + 1) % 16])} for o in orders]
    assert ups[0] == {f"node{n} nic0 up" for n in range(4)} and ups[1] == {f"node{n} nic1 up" for n in range(4)}


@pytest.mark.parametrize("algo", ["ring", "hierarchical", "tree"])
def test_multi_node_all_reduce_is_bound_by_the_nics(algo):
    t = build(cluster())
    size = 512e6
    sec, used = C.time_collective(t, "all_reduce", list(range(16)), size, algo)
    nic_bound = size * 2 * 15 / 16 / (2 * 25e9)        # bus bandwidth at most a node's two 25 GB/s NICs
    assert used == algo and nic_bound < sec < 3 * nic_bound


@given(st.integers(0, 300), st.integers(0, 300), st.integers(1, 40))
def test_ring_phases_cover_every_step_in_order(reduced, forwarded, limit):
    ph = C.ring_phases(reduced + forwarded, reduced, limit)
    red = [g for g, r in ph if r]
    fwd = [g for g, r in ph if not r]
    assert [r for _, r in ph] == [True] * len(red) + [False] * len(fwd)
    assert sum(red) == reduced and sum(fwd) == forwarded and all(g >= 1 for g, _ in ph)
    assert len(red) == min(reduced, limit) and len(fwd) == min(forwarded, limit)
    assert all(max(part) - min(part) <= 1 for part in (red, fwd) if part)


def test_long_rings_in_runs_of_steps_keep_their_time(monkeypatch):
    """Rings of 16 ranks over 4 nodes (15 steps a phase), two groups sharing NICs and uplinks and
    starting apart: moved in RING_STEPS runs of steps or step by step, the same end times within
    0.2 % (the rings keep in step but for the moments the other group starts and ends)."""
    t = build(cluster(network__oversubscription=4.0))

    def ends():
        f = C.Fabric(t)
        out = []
        C.run(f, "all_reduce", list(range(16)), 64e6, lambda: out.append(f.ev.now))
        f.ev.at(3e-4, lambda: C.run(f, "reduce_scatter", [1, 5, 9, 13, 0, 4, 8, 12], 32e6,
                                     lambda: out.append(f.ev.now)))
        f.ev.run()
        return out, f.net.flows_done
    coarse, n_coarse = ends()
    monkeypatch.setattr(C, "RING_STEPS", 10 ** 6)
    exact, n_exact = ends()
    assert n_coarse < n_exact
    assert coarse == pytest.approx(exact, rel=2e-3)


def test_concurrent_collectives_over_shared_uplinks_slow_each_other():
    # 8:1 oversubscribed leaves (25 GB/s up, one NIC's rate); rails 0 and 2 each all-reduce across
    # the 4 nodes of two leaves: alone a ring fills one NIC, together they share the uplinks
    t = build(cluster(network__oversubscription=8.0, node__nics__count=4))
    rail = lambda r: [n * 4 + r for n in range(4)]   # noqa: E731
    alone, _ = C.time_collective(t, "all_reduce", rail(0), 256e6)
    f = C.Fabric(t)
    ends = []
    for r in (0, 2):
        C.run(f, "all_reduce", rail(r), 256e6, lambda: ends.append(f.ev.now))
    f.ev.run()
    assert min(ends) > 1.5 * alone


# ---- derived figures and the command line --------------------------------------------------------

def test_derived_figures_of_the_builtins():
    jz = cluster_figures(load_cluster("jean-zay-a100"))
    assert jz["per_device_in_node_gbps"] == pytest.approx(240) and jz["node_to_node_gbps"] == pytest.approx(50)
    assert jz["bisection_gbps"] == pytest.approx(24 * 50)
    sw = cluster_figures(load_cluster("sunway-supernodes"))
    assert sw["per_node_across_gbps"] == pytest.approx(56.25 * 3 / 16, rel=1e-5)
    assert sw["node_to_node_gbps"] == pytest.approx(56.25)


def test_show_config_cluster(capsys, tmp_path):
    out_json = tmp_path / "c.json"
    assert main(["show-config", "jean-zay-a100", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "384 x a100-80gb" in out and "bisection, one direction  1,200.0 GB/s" in out
    doc = json.loads(out_json.read_text())
    assert doc["schema"] == "archsim.cluster_config/1" and doc["derived"]["nodes"] == 48


def test_show_config_bad_cluster_file(capsys, tmp_path):
    p = tmp_path / "c.yaml"
    d = copy.deepcopy(BASE)
    d["node"]["nics"]["gbit_per_s"] = -1
    p.write_text(yaml.safe_dump(d))
    assert main(["show-config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "node.nics.gbit_per_s" in err and "Traceback" not in err
    assert main(["show-config", "jean-zay-a100", "--set", "nodes=2"]) == 2
    assert "--set" in capsys.readouterr().err
    d = copy.deepcopy(BASE)
    d["device"] = "nosuch"
    p.write_text(yaml.safe_dump(d))
    assert main(["show-config", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"archsim: error: {p}: device: unknown machine 'nosuch'") and len(err.splitlines()) == 1


def test_no_nan_rates():
    t = build(cluster(node__fabric__kind="ring"))
    sec, _ = C.time_collective(t, "all_reduce", list(range(16)), 1e3)
    assert math.isfinite(sec) and sec > 0


# ---- validation against published collectives ----------------------------------------------------

def test_validate_cluster_meets_the_curve_bounds(capsys, tmp_path):
    out = tmp_path / "v.json"
    assert main(["validate", "--cluster", "dgx-a100-superpod", "--curve", "nccl", "--plot", "none", "--json",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.validate/1" and doc["cluster"] == "dgx-a100-superpod"
    assert doc["mape_pct"] <= 10 and doc["max_error_pct"] <= 20
    assert {c["name"] for c in doc["curves"]} >= {"nccl_allreduce_node", "nccl_allreduce_2node_4hdr"}
    assert "nccl_allreduce_node" in capsys.readouterr().out


@pytest.mark.parametrize("curve,where,what", [
    ({"collective": "gather"}, "curve c.collective", "'gather' is not a collective"),
    ({"ranks": 100000}, "curve c.ranks", "not a rank count"),
    ({"set": {"node.nics.count": 0}}, "with", "node.nics.count"),
    ({"points": [[2, 1.0], [1, 1.0]]}, "curve c.points[1]", "not a point after the last"),
    ({"unit": "GB"}, "curve c.x", "unit 'GB'"),
    ({"bogus": 1}, "curves[0]", "unknown field 'bogus'"),
])
def test_bad_cluster_reference_is_one_line(capsys, tmp_path, curve, where, what):
    good = {"name": "c", "source": "s", "collective": "all_reduce", "ranks": 8, "x": "bytes", "unit": "GB/s",
            "points": [[1.0e6, 10.0]]}
    ref = tmp_path / "r.yaml"
    ref.write_text(yaml.safe_dump({"cluster": "dgx-a100-superpod", "curves": [{**good, **curve}]}))
    assert main(["validate", "--cluster", "dgx-a100-superpod", "--reference", str(ref), "--plot", "none"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and where in err and what in err and not cap.out, err


def test_validate_needs_a_machine_or_a_cluster(capsys):
    assert main(["validate", "--plot", "none"]) == 2
    assert "--hw" in capsys.readouterr().err
    assert main(["validate", "--cluster", "sunway-supernodes", "--plot", "none"]) == 2
    assert "no published figures" in capsys.readouterr().err
    assert main(["validate", "--hw", "tiny-gpu", "--workers", "1", "--plot", "none"]) == 2
    assert "--workers with --cluster" in capsys.readouterr().err


def test_ring_forwards_steps_in_order_when_reductions_lag():
    """A reducer much slower than a transfer: the ring is paced by the reductions, each step's
    forward waiting for the chunk before it."""
    n, size = 4, 4e6
    sec, _ = C.time_collective(_one_node(n, reduce_gbps=1.0), "all_reduce", list(range(n)), size)
    step = 1e-6 + size / n / 100e9
    assert sec == pytest.approx(3 * (1e-6 + size / n / 1e9) + 3 * step, rel=1e-9)


def test_hierarchical_on_uneven_nodes_falls_back_to_a_ring():
    t = build(load_cluster("dgx-a100-superpod"))
    sec, algo = C.time_collective(t, "all_reduce", list(range(12)), 64e6, "hierarchical")
    assert algo == "ring" and sec > 0


@pytest.mark.parametrize("changes,what", [
    ({"node__fabric__device_gbps": 1e-300}, "out of range"),
    ({"nodes": 16384, "node__devices": 64, "node__fabric__kind": "full_mesh", "node__nics__count": 2},
     "links"),
])
def test_degenerate_clusters_are_refused(changes, what):
    with pytest.raises(InputError) as e:
        cluster(**changes)
    assert what in e.value.what or what in e.value.allowed

@pytest.mark.parametrize("name", ["dgx-a100-superpod", "jean-zay-a100"])
def test_builtin_cluster_references_pass_their_checks(name):
    """Every curve of a built-in cluster reference loads, and each training point's plan passes
    the checks a run makes before timing anything (devices, divisibility, schedule, memory)."""
    from archsim.cluster.validate import prepare

    _cluster, curves = prepare(name)
    steps = [c for c in curves if c.get("kind") == "step"]
    assert steps and all(c["points"] for c in curves)
    for c in steps:
        for p in c["points"]:
            # the training points' frameworks (2021 Megatron-LM, Megatron-DeepSpeed) reduce the backward's
            # tensor-parallel gradients after the layer's backward
            assert "grad_reduce=" in p["plan"] and "grad_accum=" in p["plan"] and "tp_async=off" in p["plan"] \
                or c["unit"] == "ms/token", p["plan"]
