"""On-chip networks (archsim.engine.noc): formula oracles for latency and bandwidth, credits and
back-pressure, ring saturation, crossbar fairness, determinism and skip-ahead equivalence."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.config import load_machine
from archsim.engine import noc as M
from archsim.engine.noc import (cpe_mesh_params, link_names, make_cpe_mesh, make_crossbar, make_fabric, make_mesh, make_ring,
                                noc_counters, noc_drive, noc_eject, noc_idle, noc_inject, noc_next_event,
                                noc_step)


def drive(N, src, dsts, nbytes, period, cycles, t0=0, skip=False, seed=1):
    """noc_drive with Python lists: returns (sent, delivered, steps)."""
    src = np.asarray(src, np.int32)
    ns = len(src)
    K = max(len(d) for d in dsts)
    D = np.zeros((ns, K), np.int32)
    nd = np.zeros(ns, np.int32)
    for i, d in enumerate(dsts):
        D[i, :len(d)] = d
        nd[i] = len(d)
    per = np.broadcast_to(np.asarray(period, np.int64), (ns,)).copy()
    sent, dl = np.zeros(ns, np.int64), np.zeros(ns, np.int64)
    steps = noc_drive(N, src, D, nd, int(nbytes), per, int(t0), int(cycles), int(seed), bool(skip), sent, dl)
    return sent, dl, steps


def latency(N, src, dst, nbytes, t0=5):
    """Cycles from injection (before the step of cycle t0) to the end of the cycle the tail arrives."""
    for t in range(t0):
        noc_step(N, t)
    assert noc_inject(N, src, 42, nbytes, dst, t0)
    for now in range(t0, t0 + 5000):
        noc_step(N, now)
        r = noc_eject(N, dst)
        if r >= 0:
            assert r == 42 and noc_idle(N)
            return now - t0 + 1
    raise AssertionError("packet never delivered")


def state_arrays(N):
    """Every array of the state except per-step scratch columns."""
    out = {}
    for name, v in N._asdict().items():
        if name == "Q":
            for qn, qv in v._asdict().items():
                out["Q." + qn] = qv
        elif name == "li":
            out[name] = v[:, :M.LI_WANT]
        elif name == "lt":
            out[name] = v[:, :M.LT_GAP]
        elif name == "bi":                  # a port's sleep (noc.py "Sleeping ports") is scratch:
            out[name] = v[:, :M.BI_LOST]    # with skip-ahead ports scan at other cycles
        elif name == "bt":
            out[name] = v[:, :M.BT_SLEEP]
        elif name == "clk":
            out[name] = v[:M.C_STAMP]
        elif name in ("bw", "bc", "ls"):
            continue
        else:
            out[name] = v
    return out


def assert_same_state(A, B):
    a, b = state_arrays(A), state_arrays(B)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


# ----------------------------------------------------------------------------- unloaded latency

@pytest.mark.parametrize("nbytes", [1, 32, 64, 65, 200])
def test_crossbar_unloaded_latency_is_pipeline_plus_serialization(nbytes):
    W, L = 64, 10
    for s, d in [(0, 3), (2, 4)]:
        N = make_crossbar(3, 2, W, 4, L)
        assert latency(N, s, d, nbytes) == L + math.ceil(nbytes / W)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_ring_unloaded_latency_follows_the_shortest_direction(bidirectional):
    n, W, L, nb = 6, 16, 7, 100
    for s in range(n):
        for d in range(n):
            N = make_ring(n, W, 4, L, bidirectional)
            cw = (d - s) % n
            hops = min(cw, n - cw) if bidirectional else cw
            assert latency(N, s, d, nb) == (hops + 1) * L + math.ceil(nb / W), (s, d)
            used = {x["name"] for x in noc_counters(N, 1)["links"] if x["packets"] and x["name"].startswith("ring ")}
            assert len(used) == hops
            if bidirectional and cw == n - cw:           # a tie goes clockwise from an even stop
                step = 1 if s % 2 == 0 else -1
                assert f"ring s{s}->s{(s + step) % n}" in used


def test_mesh_unloaded_latency_counts_xy_hops_and_routes_x_first():
    rows, cols, W, L, nb = 3, 4, 24, 5, 100
    for s in range(rows * cols):
        for d in range(rows * cols):
            N = make_mesh(rows, cols, W, 8, L)
            hops = abs(s // cols - d // cols) + abs(s % cols - d % cols)
            assert latency(N, s, d, nb) == (hops + 1) * L + math.ceil(nb / W), (s, d)
    N = make_mesh(rows, cols, W, 8, L)
    latency(N, 0, 11, nb)
    used = [x["name"] for x in noc_counters(N, 1)["links"] if x["packets"] and x["name"].startswith("mesh")]
    assert used == ["mesh r0c0->r0c1", "mesh r0c1->r0c2", "mesh r0c2->r0c3", "mesh r0c3->r1c3", "mesh r1c3->r2c3"]


def test_tail_trails_the_narrowest_link_on_the_path():
    # ring links 16 B, local ports 64 B: the 16-B ring links set the tail's delay
    N = make_ring(4, 16, 8, 3, True, port_bytes_per_cycle=64)
    assert latency(N, 0, 2, 128) == 3 * 3 + 128 // 16
    N = make_ring(4, 16, 8, 3, True, port_bytes_per_cycle=64)
    assert latency(N, 1, 1, 128) == 3 + 128 // 64            # same stop: never touches the ring


# ----------------------------------------------------------------------------- bandwidth

@pytest.mark.parametrize("mk,src,dst,nbytes", [
    (lambda: make_ring(6, 16, 8, 8, True), 0, 3, 128),       # sw26010pro ring: a packet fills a buffer
    (lambda: make_ring(4, 16, 4, 4, True), 0, 2, 128),       # tiny-sunway: a packet is larger than a buffer
    (lambda: make_crossbar(4, 4, 64, 8, 50), 1, 6, 128),     # a100: a 50-cycle pipeline, 8-flit buffers
    (lambda: make_mesh(3, 3, 24, 8, 4), 0, 8, 96),
])
def test_one_stream_saturates_its_links_at_exactly_the_link_width(mk, src, dst, nbytes):
    N = mk()
    W = int(N.par[M.P_WIDTH])
    drive(N, [src], [[dst]], nbytes, 1, 400)
    f0 = N.lt[:, M.LT_FLITS].copy()
    _, dl, _ = drive(N, [src], [[dst]], nbytes, 1, 4000, t0=400)
    util = (N.lt[:, M.LT_FLITS] - f0) / 4000
    busy = util > 0
    assert abs(util[busy] - 1.0).max() <= nbytes / W / 4000      # every link on the path: 100 % busy
    assert abs(dl.sum() * nbytes / 4000 - W) <= nbytes / 4000 * 2  # delivered bytes/cycle = width
    assert N.lt[:, M.LT_BLOCKED].sum() == 0


def test_crossbar_output_port_is_shared_round_robin():
    N = make_crossbar(8, 2, 64, 8, 20)
    sent, dl, _ = drive(N, range(8), [[8]] * 8, 128, 1, 8000)
    assert dl.max() - dl.min() <= 1                               # each source gets 1/8
    c = noc_counters(N, 8000)
    out = next(x for x in c["links"] if x["name"] == "xbar->dst0")
    assert out["util"] > 0.99 and out["blocked_cycles"] > 7000
    assert dl.sum() * 128 / 8000 == pytest.approx(64, rel=0.01)
    assert c["inject_stalls"] > 0


# ----------------------------------------------------------------------------- lookahead (head-of-line blocking)

def _hol_scene(look, extra_for_blocked=0):
    """One source, two destinations; dst0 never ejects, so after two packets fill its ejection
    buffer the third (A2) is a head blocked for ever. B, for dst1, is queued behind it (then
    `extra_for_blocked` more packets for dst0). Returns the network, B's injection cycle and
    the request ids in injection order."""
    W, D, L = 64, 2, 10
    N = make_crossbar(1, 2, W, D, L, lookahead=look)
    src, dst0, dst1 = 0, 1, 2
    plan = [dst0, dst0, dst0, dst1] + [dst0] * extra_for_blocked
    t = 0
    sent = []
    for i, d in enumerate(plan):
        while not noc_inject(N, src, i, W, d, t):
            noc_step(N, t)
            t += 1
        sent.append((i, d, t))
        noc_step(N, t)
        t += 1
    return N, t, sent


@pytest.mark.parametrize("look", [1, 2, 8])
def test_lookahead_lets_a_packet_for_a_free_output_pass_a_blocked_head(look):
    N, t, sent = _hol_scene(look, extra_for_blocked=3)
    L, W = 10, 64
    b_inj = sent[3][2]
    got = None
    for now in range(t, t + 200):
        noc_step(N, now)
        r = noc_eject(N, 2)
        if r >= 0:
            got = (r, now)
            break
    assert got is not None and got[0] == 3
    assert got[1] - b_inj + 1 == L + math.ceil(W / W)           # the unloaded latency: no wait at all
    # packets for dst0 never pass each other: once dst0 drains, they come out in order
    out = []
    for now in range(got[1] + 1, got[1] + 300):
        noc_step(N, now)
        while True:
            r = noc_eject(N, 1)
            if r < 0:
                break
            out.append(r)
    assert out == [0, 1, 2, 4, 5, 6] and noc_idle(N)


def test_lookahead_0_is_a_fifo_port():
    N, t, sent = _hol_scene(0)
    for now in range(t, t + 500):
        noc_step(N, now)
        assert noc_eject(N, 2) < 0                                # B waits behind the blocked head
    c = noc_counters(N, t + 500)
    blocked = {x["name"]: x["blocked_cycles"] for x in c["links"]}
    assert blocked["xbar->dst0"] > 400 and blocked["xbar->dst1"] == 0


def test_lookahead_lifts_the_saturation_throughput_of_uniform_random_traffic():
    # Karol, Hluchyj & Morgan 1987: an input-queued switch with FIFO inputs saturates at 2 - sqrt(2)
    # = 0.586 of its outputs' rate under uniform traffic (0.618 for 8 ports); looking past the head
    # removes most of that loss
    n, cycles = 8, 20000
    rates = {}
    for look in (0, 8):
        N = make_crossbar(n, n, 64, 32, 4, lookahead=look)
        _, dl, _ = drive(N, range(n), [list(range(n, 2 * n))] * n, 64, 1, cycles, seed=3)
        rates[look] = dl.sum() / (n * cycles)
    assert 0.57 <= rates[0] <= 0.66
    assert rates[8] >= 0.9


# ----------------------------------------------------------------------------- credits

def test_credits_bound_every_buffer_and_back_pressure_loses_nothing():
    n, W, D, L = 4, 16, 4, 2
    N = make_ring(n, W, D, L, True)
    pool = N.bi[:, M.BI_POOL]
    assert set(pool.tolist()) == {D, D + L}          # node buffers D flits; router ports D + pipeline L
    sent = {s: [] for s in range(3)}
    got = {s: [] for s in range(3)}
    seq = 0
    stalls = 0
    for now in range(600):
        draining = now >= 300
        if draining:
            while (r := noc_eject(N, 3)) >= 0:
                got[r % 3].append(r)
        elif now > 0:
            assert noc_eject(N, 0) == -1                 # nothing is addressed to node 0
        for s in range(3):
            if now < 300:
                if noc_inject(N, s, seq * 3 + s, 48, 3, now):
                    sent[s].append(seq * 3 + s)
                else:
                    stalls += 1
        seq += 1
        noc_step(N, now)
        assert (N.bi[:, M.BI_OCC] <= pool).all() and (N.bi[:, M.BI_OCC] >= 0).all()
        if now == 299:                                   # node 3 never drained: everything is stuck
            assert noc_next_event(N, now) == M.INF
            blocked_before = N.lt[:, M.LT_BLOCKED].copy()
    assert (N.bi[:, M.BI_MAX] <= pool).all()
    assert stalls > 0 and N.nt[:, M.NT_STALLS].sum() == stalls
    c = noc_counters(N, 600)
    names = link_names(N)
    into3 = [names.index("ring s2->s3"), names.index("ring s0->s3")]
    assert all(blocked_before[i] > 100 for i in into3)               # upstream of the stall
    assert blocked_before[names.index("n0->ring")] > 100               # ... back to the sources
    assert noc_idle(N)
    for s in range(3):
        assert got[s] == sent[s]                                      # every packet, once, in order
    assert c["packets_delivered"] == sum(len(v) for v in sent.values())


# ----------------------------------------------------------------------------- ring saturation

def _sw_ring(W=16, D=8, L=8):
    names = [f"cg{i}" for i in range(6)] + [f"mc{i}" for i in range(6)]
    return make_ring(6, W, D, L, True, list(range(6)) * 2, names, [f"cg{i}" for i in range(6)], 2 * W)


def _uniform(N, nsrc, period, warm=1000, cycles=8000, nbytes=128):
    src, dsts = list(range(nsrc)), [list(range(6, 12))] * nsrc
    drive(N, src, dsts, nbytes, period, warm)
    f0, b0 = N.lt[:, M.LT_FLITS].copy(), N.lt[:, M.LT_BLOCKED].sum()
    _, dl, _ = drive(N, src, dsts, nbytes, period, cycles, t0=warm)
    util = (N.lt[:, M.LT_FLITS] - f0) / cycles
    return dl * nbytes / cycles, util[:12].max(), N.lt[:, M.LT_BLOCKED].sum() - b0


def test_ring_all_to_all_saturates():
    # offered load per core group: 128 B every `period` cycles, to all six controllers uniformly
    rows = {p: _uniform(_sw_ring(), 6, p) for p in (64, 16, 8, 4, 1)}
    tput = {p: r[0].sum() for p, r in rows.items()}
    blocked = {p: r[2] for p, r in rows.items()}
    assert tput[64] == pytest.approx(6 * 128 / 64, rel=0.02)          # below the knee: all delivered
    assert tput[16] == pytest.approx(6 * 128 / 16, rel=0.02)
    assert tput[8] < 6 * 128 / 8 * 0.8                                # past the knee ...
    assert max(tput[8], tput[4], tput[1]) < 1.04 * min(tput[8], tput[4], tput[1])   # ... a plateau
    assert blocked[64] < blocked[16] < blocked[8] and blocked[1] > 0.9 * blocked[8]
    assert rows[1][1] > 0.6                                           # the busiest ring link
    # delivered per source falls as sources are added
    per_src = [_uniform(_sw_ring(), k, 1)[0].mean() for k in (1, 2, 4, 6)]
    assert all(a > b for a, b in zip(per_src, per_src[1:]))
    assert per_src[-1] < 0.7 * per_src[0]


def test_unidirectional_ring_saturates_its_busiest_link():
    N = make_ring(6, 16, 8, 8, False)
    src, dsts = list(range(6)), [[d for d in range(6) if d != s] for s in range(6)]
    drive(N, src, dsts, 128, 1, 1000)
    f0 = N.lt[:, M.LT_FLITS].copy()
    _, dl, _ = drive(N, src, dsts, 128, 1, 8000, t0=1000)
    util = (N.lt[:, M.LT_FLITS] - f0) / 8000
    assert util[:6].max() > 0.95
    assert dl.sum() * 128 / 8000 < 6 * 16 / 3                  # at most ring capacity / mean hops (3)


def test_halving_the_link_width_halves_saturated_ring_throughput():
    full = _uniform(_sw_ring(W=16), 6, 1)[0].sum()
    half = _uniform(_sw_ring(W=8), 6, 1)[0].sum()
    assert half / full == pytest.approx(0.5, abs=0.05)


# ----------------------------------------------------------------------------- determinism, skip-ahead

def test_two_runs_give_identical_counters():
    runs = []
    for _ in range(2):
        N = _sw_ring()
        drive(N, range(6), [list(range(6, 12))] * 6, 128, 3, 3000, seed=7)
        runs.append((N, noc_counters(N, 3000)))
    assert runs[0][1] == runs[1][1]
    assert_same_state(runs[0][0], runs[1][0])


@pytest.mark.parametrize("mk", [lambda: _sw_ring(), lambda: make_crossbar(6, 3, 32, 4, 12),
                                lambda: make_crossbar(6, 3, 32, 4, 12, lookahead=4),
                                lambda: make_mesh(2, 3, 16, 4, 3), lambda: make_mesh(2, 3, 16, 4, 3, lookahead=2)])
def test_skip_ahead_gives_identical_results(mk):
    # bursty traffic: every source fires together every 90 cycles, so packets contend and wait
    A, B = mk(), mk()
    nn = int(A.par[M.P_NODES])
    recv = [n for n in range(nn) if A.ni[n, M.NI_EJ] >= 0]
    send = [n for n in range(nn) if A.ni[n, M.NI_SRC] >= 0][:6]
    dsts = [recv[:3]] * len(send)
    _, da, steps_a = drive(A, send, dsts, 96, 90, 5000, skip=False)
    _, db, steps_b = drive(B, send, dsts, 96, 90, 5000, skip=True)
    C = mk()
    C.par[M.P_SLEEP] = 0                     # the oracle: every port scanned every cycle
    _, dc, _ = drive(C, send, dsts, 96, 90, 5000, skip=False)
    assert steps_a == 5000 and steps_b < 2500
    assert np.array_equal(da, db) and np.array_equal(da, dc)
    assert noc_counters(A, 5000) == noc_counters(B, 5000) == noc_counters(C, 5000)
    assert A.lt[:, M.LT_BLOCKED].sum() > 0
    assert_same_state(A, B)


@settings(max_examples=15)
@given(st.sampled_from(["ring", "uring", "mesh", "xbar"]), st.integers(2, 5), st.sampled_from([8, 16, 32]),
       st.integers(1, 6), st.integers(1, 9), st.integers(1, 200), st.lists(st.integers(0, 40), min_size=1, max_size=6),
       st.integers(0, 99), st.sampled_from([0, 0, 1, 3]))
def test_random_traffic_conserves_packets_and_skips_exactly(topo, n, W, D, L, nbytes, periods, seed, look):
    def mk():
        if topo == "ring":
            return make_ring(n, W, D, L, True, lookahead=look)
        if topo == "uring":
            return make_ring(n, W, D, L, False, lookahead=look)
        if topo == "mesh":
            return make_mesh(2, n, W, D, L, lookahead=look)
        return make_crossbar(n, n, W, D, L, lookahead=look)
    A, B = mk(), mk()
    nn = int(A.par[M.P_NODES])
    recv = [k for k in range(nn) if A.ni[k, M.NI_EJ] >= 0]
    send = [k for k in range(nn) if A.ni[k, M.NI_SRC] >= 0]
    src = [send[i % len(send)] for i in range(len(periods))]
    dsts = [recv] * len(src)
    C = mk()
    C.par[M.P_SLEEP] = 0                     # the oracle: every port scanned every cycle
    sa, da, _ = drive(A, src, dsts, nbytes, periods, 600, skip=False, seed=seed)
    sb, db, _ = drive(B, src, dsts, nbytes, periods, 600, skip=True, seed=seed)
    sc, dc, _ = drive(C, src, dsts, nbytes, periods, 600, skip=False, seed=seed)
    assert np.array_equal(sa, sb) and np.array_equal(da, db)
    assert_same_state(A, B)
    assert np.array_equal(sa, sc) and np.array_equal(da, dc)
    assert noc_counters(B, 600) == noc_counters(C, 600)
    assert (A.bi[:, M.BI_MAX] <= A.bi[:, M.BI_POOL]).all()
    _, d2, _ = drive(A, src, dsts, nbytes, [0] * len(src), 20000, t0=600, skip=True)   # drain
    assert noc_idle(A) and np.array_equal(da + d2, sa)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["ring", "mesh", "xbar"]), st.integers(2, 4), st.sampled_from([8, 16]), st.integers(1, 3),
       st.integers(1, 4), st.integers(1, 64), st.sampled_from([0, 1, 3, 8]), st.sampled_from([0.5, 1, 2]),
       st.integers(0, 2**31 - 1))
def test_sleeping_ports_give_exactly_what_scanning_every_port_every_cycle_gives(topo, n, W, D, L, nbytes, look, port,
                                                                                  seed):
    # The oracle never lets a port sleep (P_SLEEP 0): it scans every port with packets every cycle.
    # Receivers that withhold their ejection for random stretches make ports wait for credits
    # while other packets of their window wait for busy links or are still arriving, so ports
    # fall asleep, are woken early by credits with several packets of different kinds in their
    # window, and get packets pushed while asleep. Node ports narrower than a flit keep a link busy
    # for longer than its packet's credits last.
    pw = int(W * port)
    def mk():
        if topo == "ring":
            return make_ring(n, W, D, L, True, port_bytes_per_cycle=pw, lookahead=look)
        if topo == "mesh":
            return make_mesh(2, n, W, D, L, port_bytes_per_cycle=pw, lookahead=look)
        return make_crossbar(n, n, W, D, L, lookahead=look)
    A, B = mk(), mk()
    B.par[M.P_SLEEP] = 0
    nn = int(A.par[M.P_NODES])
    recv = [k for k in range(nn) if A.ni[k, M.NI_EJ] >= 0]
    send = [k for k in range(nn) if A.ni[k, M.NI_SRC] >= 0]
    rng = np.random.default_rng(seed)
    held = np.zeros(nn, bool)
    rid = 0
    for now in range(400):
        for d in recv:
            if rng.random() < 0.15:
                held[d] = not held[d]                 # a receiver stops or starts draining
            while not held[d]:
                ra, rb = noc_eject(A, d), noc_eject(B, d)
                assert ra == rb
                if ra < 0:
                    break
        for s in send:
            if rng.random() < 0.6:
                d = recv[rng.integers(len(recv))]
                if d != s or topo == "xbar":
                    size = int(rng.integers(1, nbytes + 1))
                    assert noc_inject(A, s, rid, size, d, now) == noc_inject(B, s, rid, size, d, now)
                    rid += 1
        noc_step(A, now)
        noc_step(B, now)
    assert noc_counters(A, 400) == noc_counters(B, 400)
    assert A.lt[:, M.LT_BLOCKED].sum() > 0 or rid < 10
    B.par[M.P_SLEEP] = 1                                                # (the one difference by design)
    assert_same_state(A, B)


# ----------------------------------------------------------------------------- machines

def test_a100_fabric_is_two_crossbars_of_108_sms_and_80_slices():
    F = make_fabric(load_machine("a100"))
    assert F.kind == "crossbar" and len(F.core_names) == 108 and len(F.mem_names) == 80
    assert int(F.req.par[M.P_ROUTERS]) == 1 and int(F.req.par[M.P_LINKS]) == 188
    assert int(F.req.par[M.P_LOOK]) == int(F.resp.par[M.P_LOOK]) == 8     # fabric.lookahead_packets
    rn, pn = link_names(F.req), link_names(F.resp)
    assert "sm3->xbar" in rn and "xbar->l2s5" in rn and "l2s5->xbar" in pn and "xbar->sm3" in pn
    assert latency(F.req, int(F.req_core[107]), int(F.req_mem[79]), 128) == 50 + 2
    assert latency(F.resp, int(F.resp_mem[0]), int(F.resp_core[3]), 32) == 50 + 1
    with pytest.raises(ValueError):                  # replies do not travel the request network
        noc_inject(F.req, int(F.req_mem[0]), 0, 32, int(F.req_core[0]), 0)
    c = M.fabric_counters(F.req, F.resp, 100)
    assert {"link_util_mean", "link_util_max", "blocked_cycles", "links"} <= set(c)
    assert set(c["links"][0]) >= {"name", "util", "blocked_cycles"} and c["links"][0]["name"].startswith("req ")


def test_sw26010pro_fabric_is_a_ring_of_six_groups_with_controllers_at_their_stops():
    m = load_machine("sw26010pro")
    F = make_fabric(m)
    assert F.kind == "ring" and F.core_names == tuple(f"cg{i}" for i in range(6))
    assert F.mem_names == tuple(f"mc{i}" for i in range(6))
    N = F.req
    assert int(N.par[M.P_ROUTERS]) == 6
    assert list(N.ni[F.req_mem, M.NI_ROUTER]) == list(range(6))      # mc j at group j's stop
    names = link_names(N)
    assert "ring cg2->cg3" in names and "ring cg3->cg2" in names and "cg2->ring" in names
    L, W = m.fabric.router_latency_cycles, m.fabric.link_bytes_per_cycle
    assert latency(N, int(F.req_core[0]), int(F.req_mem[3]), 128) == 4 * L + 128 // W
    N = make_fabric(m).resp
    assert latency(N, int(F.resp_mem[2]), int(F.resp_core[2]), 128) == L + 128 // (2 * W)   # own stop


@pytest.mark.parametrize("hw,overlay,kind,ncore,nmem", [("tiny-gpu", None, "crossbar", 2, 4),
                                                        ("tiny-sunway", None, "ring", 2, 2),
                                                        ("a100", "l2-off", "crossbar", 108, 10)])
def test_small_machines_build_and_carry_traffic(hw, overlay, kind, ncore, nmem):
    F = make_fabric(load_machine(hw, overlays=[overlay] if overlay else []))
    assert F.kind == kind and len(F.req_core) == ncore and len(F.req_mem) == nmem
    s, d, _ = drive(F.req, F.req_core, [list(F.req_mem)] * ncore, 64, 2, 500)
    assert d.sum() > 0 and d.sum() <= s.sum()


def test_cpe_mesh_for_rma():
    m = load_machine("sw26010pro")
    N = make_cpe_mesh(m)
    assert int(N.par[M.P_ROUTERS]) == 16 and int(N.par[M.P_NODES]) == 64
    assert int(N.ni[9, M.NI_ROUTER]) == 0 and int(N.ni[63, M.NI_ROUTER]) == 15   # CPE (1,1) in cluster 0
    assert latency(N, 0, 63, 8) == 7 * cpe_mesh_params(m)[1] + 1                   # 6 cluster hops
