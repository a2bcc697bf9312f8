"""Sunway calibration mechanisms and the behaviour that must emerge from them (issue 4), on
tiny-sunway: a DMA transfer's window of pieces in flight (one CPE's stream = window x piece /
round trip), buffers placed at chosen global addresses (private / cross segments), `micro
bandwidth` on CPEs (DMA through the LDM), ring congestion under cross-segment streaming, and
`archsim validate --hw sw26010pro`.

Oracles: the round trip of one piece is measured unloaded (a single 128-B get, start-up removed)
and bounds the windowed stream rate; the segments mapping says which controllers an address
reaches; relative behaviour (more CPEs, narrower links, cross vs private) is compared run to run.
"""

import json

import numpy as np
import pytest

from archsim import micro as MI
from archsim.config import load_machine
from archsim.engine import dram as DR
from archsim.engine.functional import run_functional
from archsim.engine.launch import GLOBAL_BASE
from archsim.engine.timing import Unbacked, buffer_addresses, time_kernel
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

CPE = Launch((1, 1, 1), (32, 1, 1))


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def windowed(w, *sets):
    return load_machine("tiny-sunway", sets=[f"dma.max_inflight_per_transfer={w}", *sets])


def one_get(m, n=128):
    """Cycles of one blocking get of n bytes from CPE 0, timed with %clock."""
    o = MI.MicroResult("x", {}, 0.0, "cycles")
    return MI.dma_startup(m, o, "get", n)


def stream_cycles(m, size, offset=0, direction="get"):
    r = MI.run_micro("dma", m, {"direction": direction, "size_bytes": size, "cpes": 1, "reps": 1,
                                "offset_bytes": offset})
    return r.kernels[0]["cycles"]


def rate(m, direction="get"):
    return 4096 / (stream_cycles(m, 8192, direction=direction) - stream_cycles(m, 4096, direction=direction))


# ----------------------------------------------------------------------------- the transfer window
def test_window_bounds_one_cpe_stream_by_its_round_trip(sw):
    m1 = windowed(1)
    rt_miss = one_get(m1) - m1.dma.get_startup_cycles      # one piece from an idle bank: ACT + RD
    rt_hit = rt_miss - m1.dram.timing.tRCD / m1.clock_ratios.memory  # the row already open
    r1 = rate(m1)
    assert 128 / rt_miss * 0.97 <= r1 <= 128 / rt_hit * 1.03
    r2, r4 = rate(windowed(2)), rate(windowed(4))
    assert r2 == pytest.approx(2 * r1, rel=0.12)  # unloaded: the round trip barely grows
    ctrl = sw.dram.channel_gbps * (sw.dram.channels // sw.memory_controllers.count) / sw.clock_ghz
    assert r1 < r2 < r4 <= ctrl * 1.001
    assert rate(sw) == pytest.approx(ctrl, rel=0.02)  # no window: the controller is the limit


def test_put_stream_is_windowed_too(sw):
    p1, p2 = rate(windowed(1), "put"), rate(windowed(2), "put")
    assert p1 < p2 < rate(sw, "put") * 1.001
    assert p2 == pytest.approx(2 * p1, rel=0.12)


def test_unaligned_transfer_costs_an_extra_piece_round_trip():
    m1 = windowed(1)
    rt_miss = one_get(m1) - m1.dma.get_startup_cycles
    extra = stream_cycles(m1, 4096, offset=8) - stream_cycles(m1, 4096)
    assert 0.4 * rt_miss <= extra <= 1.2 * rt_miss  # 33 pieces instead of 32, one at a time


def test_group_dma_grows_with_cpes_and_saturates_at_its_controller_with_a_window(sw):
    m = windowed(2)
    ctrl = sw.dram.channel_gbps * (sw.dram.channels // sw.memory_controllers.count) / sw.clock_ghz
    v = [MI.run_micro("dma", m, {"size_bytes": 4096, "cpes": c, "reps": 2}).value for c in (1, 2, 4, 16)]
    assert v[0] < 0.6 * ctrl  # one CPE is held by its window, not by the controller
    assert v[0] < v[1] < v[2] <= v[3] <= ctrl * 1.001
    assert v[3] > 0.9 * ctrl


def test_window_runs_are_identical_with_skip_ahead_off(monkeypatch):
    import archsim.micro as mod
    from archsim.engine import timing

    m = windowed(3)
    p = {"direction": "get", "size_bytes": 1000, "cpes": 5, "reps": 2, "offset_bytes": 24}
    a = MI.run_micro("dma", m, p).kernels[0]
    orig = timing.time_kernel
    monkeypatch.setattr(mod, "time_kernel", lambda *x, **kw: orig(*x, **dict(kw, skip=False)))
    b = MI.run_micro("dma", m, p).kernels[0]
    assert a.pop("skipped_cycles") > 0 and b.pop("skipped_cycles") == 0
    a.pop("sim", None), b.pop("sim", None)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_sw26010pro_window_is_in_its_config():
    m = load_machine("sw26010pro")
    assert m.dma.max_inflight_per_transfer * 4 <= m.dma.max_inflight  # a cluster's 4 CPEs never hit the engine cap


# ----------------------------------------------------------------------------- placement
GETPUT = """.kernel k
.shared 4096
.param src
.param dst
.param n
        ldparam r1, src
        ldparam r2, dst
        ldparam r3, n
        mov.b64 r4, 0
        dma.get [r4], [r1], r3
        dma.wait 0
        dma.put [r2], [r4], r3
        dma.wait 0
        exit
"""


def test_buffers_go_where_at_and_base_put_them(sw):
    prog = assemble(GETPUT, "k.s")
    cross = DR.cross_base(sw)
    g1 = DR.segment_base(sw, 1)
    got = buffer_addresses(prog, {"src": Unbacked(4096, at=g1), "dst": Unbacked(4096), "n": 8})
    assert got == {"src": g1, "dst": GLOBAL_BASE}
    got = buffer_addresses(prog, {"src": np.zeros(16, np.uint8), "dst": Unbacked(64), "n": 8}, base=cross)
    assert got == {"src": cross, "dst": cross + 256}
    for args, base, where in [
        ({"src": Unbacked(4096, at=GLOBAL_BASE + 100), "dst": Unbacked(8), "n": 8}, None, "argument src"),
        ({"src": Unbacked(4096), "dst": Unbacked(8, at=GLOBAL_BASE + 256), "n": 8}, None, "argument dst"),
        ({"src": Unbacked(8), "dst": Unbacked(8), "n": 8}, 0x100, "buffer placement"),
        ({"src": Unbacked(8, at=GLOBAL_BASE), "dst": Unbacked(8), "n": 8}, cross, "argument src"),
    ]:
        with pytest.raises(InputError) as e:
            buffer_addresses(prog, args, base=base)
        assert e.value.where == where


@pytest.mark.parametrize("where", ["private0", "private1", "cross"])
def test_a_buffers_segment_decides_which_controllers_serve_it(sw, where):
    base = {"private0": GLOBAL_BASE, "private1": DR.segment_base(sw, 1), "cross": DR.cross_base(sw)}[where]
    a = np.arange(4096, dtype=np.uint8)
    t = time_kernel(assemble(GETPUT, "k.s"), sw, CPE, {"src": a, "dst": np.zeros(4096, np.uint8), "n": 4096},
                    base=base)
    assert np.array_equal(t.buffers["dst"], a)  # backed buffers at the base: real data
    busy = [ch["bytes_read"] + ch["bytes_written"] > 0 for ch in t.memory["dram"]]  # one channel per controller
    want = {"private0": [True, False], "private1": [False, True], "cross": [True, True]}[where]
    assert busy == want


# ----------------------------------------------------------------------------- micro bandwidth on CPEs
@pytest.mark.parametrize("kind", ["read", "write", "copy", "triad"])
def test_sunway_stream_kernels_compute_the_right_arrays(sw, kind):
    p = MI.parse_params("bandwidth", {"kind": kind, "footprint_mib": 0.75, "placement": "cross"})
    prog, launch, args, lay = MI.sw_stream_setup(sw, p)
    x = np.random.default_rng(1).standard_normal(args["buf"].nbytes // 4).astype(np.float32)
    y = run_functional(prog, dict(args, buf=x.copy()), launch, ncores=sw.groups * sw.cores.per_group)
    y = y.memory.data[:x.nbytes].view(np.float32)
    A, G = lay["array_stride_bytes"] // 4, lay["group_stride_bytes"] // 4
    for g in range(sw.groups):
        o = g * G
        a, b, c = x[o:o + A], x[o + A:o + 2 * A], x[o + 2 * A:o + 3 * A]
        want = {"read": a, "write": np.zeros_like(a), "copy": b, "triad": b + np.float32(2) * c}[kind]
        assert np.array_equal(y[o:o + A], want)
        assert np.array_equal(y[o + A:o + 3 * A], x[o + A:o + 3 * A])


def test_sunway_bandwidth_moves_the_footprint_at_its_placement(sw):
    r = MI.run_micro("bandwidth", sw, {"kind": "read", "footprint_mib": 1, "placement": "private"})
    k = r.kernels[0]
    assert k["bytes"]["dma"] == r.extra["moved_bytes"] == 2**20
    assert r.value == pytest.approx(2**20 / (k["cycles"] / sw.clock_ghz))
    assert r.extra["ring_link_util_max"] == 0.0  # private: every byte stays at its group's stop
    half = MI.run_micro("bandwidth", sw, {"kind": "read", "footprint_mib": 1, "occupancy": 0.5})
    assert half.extra["cpes_per_group"] == sw.cores.per_group // 2 and half.extra["ring_link_util_max"] > 0


@pytest.mark.parametrize("params,where", [
    ({"footprint_mib": 4096, "placement": "private"}, "--param footprint_mib"),
    ({"placement": "near"}, "--param placement"),
    ({"kind": "scale"}, "--param kind"),
    ({"occupancy": 0}, "--param occupancy"),
])
def test_bad_sunway_bandwidth_parameters_are_one_clear_error(sw, params, where):
    with pytest.raises(InputError) as e:
        MI.run_micro("bandwidth", sw, params)
    assert e.value.where == where


# ----------------------------------------------------------------------------- ring congestion
def stream(m, placement):
    return MI.run_micro("bandwidth", m, {"kind": "read", "footprint_mib": 2, "placement": placement})


def test_cross_segment_streaming_congests_the_ring_and_narrower_links_make_it_worse():
    # a narrow ring (8 B links) so that the cross traffic of both groups exceeds it
    ring8 = load_machine("tiny-sunway", sets=["fabric.link_bytes_per_cycle=8"])
    ring4 = load_machine("tiny-sunway", sets=["fabric.link_bytes_per_cycle=4"])
    priv, cross, cross4 = stream(ring8, "private"), stream(ring8, "cross"), stream(ring4, "cross")
    assert priv.extra["ring_link_util_max"] == 0 and priv.extra["ring_blocked_cycles"] == 0
    # the ring links are busy, packets wait for them, every CPE gets less
    assert cross.extra["ring_link_util_max"] > 0.45 and cross.extra["ring_blocked_cycles"] > 10000
    assert cross.extra["per_cpe_gbps"] < 0.85 * priv.extra["per_cpe_gbps"]
    # halving the links: cross-segment bandwidth falls, blocked cycles grow ...
    assert cross4.value < 0.75 * cross.value
    assert cross4.extra["ring_blocked_cycles"] > cross.extra["ring_blocked_cycles"]
    # ... while one core group reading its own segment barely changes
    g = [MI.run_micro("dma", m, {"size_bytes": 4096, "cpes": 16, "reps": 2}).value for m in (ring8, ring4)]
    assert g[1] == pytest.approx(g[0], rel=0.03)
    assert stream(ring4, "private").value == pytest.approx(priv.value, rel=0.06)  # flits (buffers) shrink with the links


# ----------------------------------------------------------------------------- validate
def test_validate_sw26010pro_every_row_within_ten_percent():
    from archsim.validate import validate

    doc = validate(load_machine("sw26010pro"))
    q = {r["quantity"]: r for r in doc["rows"]}
    assert set(q) >= {"dma_get_startup", "dma_put_startup", "dma_get_stream", "dma_put_stream", "dma_group_gbps",
                      "vector_fp16_tflops", "vector_fp32_tflops"}
    bad = {k: r["error_pct"] for k, r in q.items() if abs(r["error_pct"]) > 10}
    assert not bad


def test_sunway_stream_is_identical_with_skip_ahead_off(monkeypatch):
    import archsim.micro as mod
    from archsim.engine import timing

    m = windowed(4)
    p = {"kind": "triad", "footprint_mib": 0.75, "placement": "cross", "occupancy": 0.5}
    a = MI.run_micro("bandwidth", m, p).kernels[0]
    orig = timing.time_kernel
    monkeypatch.setattr(mod, "time_kernel", lambda *x, **kw: orig(*x, **dict(kw, skip=False)))
    b = MI.run_micro("bandwidth", m, p).kernels[0]
    assert a.pop("skipped_cycles") > 0 and b.pop("skipped_cycles") == 0
    a.pop("sim", None), b.pop("sim", None)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
