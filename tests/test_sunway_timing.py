"""The Sunway timing model on tiny-sunway: CPEs (one warp slot, vector pipes, LDM), the DMA
engines on the ring, CPE global loads, `micro dma`.

Oracles come from the config: the unloaded latency of a DMA transfer is the sum of the stage
latencies along its path (engine start-up, ring stops and link serialization each way, DDR4
bank timing), streaming rates are the narrowest configured rate, and a change of one stage's
config value moves the result by exactly that stage's share. Kernels time themselves with
%clock around the instruction under test, so launch costs cancel.
"""

import json
import math

import numpy as np
import pytest

from archsim import micro as MI
from archsim.config import dram_burst_cycles, load_machine
from archsim.engine.dma import pieces
from archsim.engine.timing import Unbacked, buffer_addresses, time_kernel
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

CPE = Launch((1, 1, 1), (32, 1, 1))


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def timed(op: str, shared: int = 4096) -> str:
    """Block `who` runs `op` between two %clock reads and stores the difference; the others exit."""
    return f""".kernel k
.shared {shared}
.param buf
.param out
.param n
.param who
        s2r r0, %ctaid.x
        ldparam r10, who
        setp.ne.i64 p0, r0, r10
   @p0  exit
        ldparam r1, buf
        ldparam r9, out
        ldparam r3, n
        mov.b64 r2, 0
        s2r r4, %clock
        {op}
        s2r r5, %clock
        sub.i64 r5, r5, r4
        st.global.b64 [r9], r5
        exit
"""


GET = "dma.get [r2], [r1], r3\n        dma.wait 0"
PUT = "dma.put [r1], [r2], r3\n        dma.wait 0"
GLD = "ld.global.b64 r6, [r1]\n        add.i64 r7, r6, 1"


def measure(m, op, n=8, who=0, **kw):
    """Cycles between the two clock reads around `op`, run by CPE `who` (block `who`)."""
    args = {"buf": Unbacked(1 << 16), "out": np.zeros(2, np.int64), "n": n, "who": who}
    t = time_kernel(assemble(timed(op), "k.s"), m, Launch((who + 1, 1, 1), (32, 1, 1)), args, **kw)
    return int(t.buffers["out"][0])


def ring_stage(m, nbytes, stops=1, link=None):
    """Unloaded ring latency (noc.py): L per stop traversed + the packet's serialization on the
    narrowest link of its path (a stop's local ports are 2 links wide on a bidirectional ring)."""
    f = m.fabric
    w = link or f.link_bytes_per_cycle * (2 if f.bidirectional else 1)
    return stops * f.router_latency_cycles + math.ceil(nbytes / w)


def dram_stage(m, col_cycles, nbytes):
    """Unloaded DDR4 access from an idle bank: ACT, then RD/WR, then the data bursts (memory clock),
    in core cycles."""
    bursts = math.ceil(nbytes / m.dram.burst_bytes)
    return (m.dram.timing.tRCD + col_cycles + bursts * dram_burst_cycles(m)) / m.clock_ratios.memory


# ----------------------------------------------------------------------------- CPE core
def loop(body: str, n: int, shared: int = 0) -> str:
    return f""".kernel k
.shared {shared}
    mov.b64 r40, 0
    mov.f32 r1, 1.0
    mov.f32 r2, 1.0
    mov.f32 r3, 1.0
    mov.f32 r4, 1.0
    mov.b64 r10, 0
    mov.b64 r20, 0
    mov.b64 r21, 0
L:  {body}
    add.i64 r40, r40, 1
    setp.lt.i64 p0, r40, {n}
@p0 bra L
    exit
"""


def per_iter(m, body, shared=0, n=32):
    c = [time_kernel(assemble(loop(body, k, shared), "k.s"), m, CPE, {}).cycles for k in (n, 2 * n)]
    return (c[1] - c[0]) / n


def longer(m, unit, k, **kw):
    """Extra cycles per iteration of 2k `unit` instructions over k (loop overhead cancels)."""
    return per_iter(m, "\n    ".join(unit(i) for i in range(2 * k)), **kw) - \
        per_iter(m, "\n    ".join(unit(i) for i in range(k)), **kw)


@pytest.mark.parametrize("dtype", ["f32", "f16x2"])
def test_cpe_vector_fma_issues_at_the_configured_lanes_per_cycle(sw, dtype):
    pipe = sw.pipes["vector"]
    ii = math.ceil(sw.cores.warp_width / pipe.lanes_per_cycle[dtype])  # f32: 32 / 8 = 4 cycles
    got = longer(sw, lambda i: f"fma.{dtype} r{1 + i % 4}, r{1 + i % 4}, r20, r21", 16)
    assert got == pytest.approx(16 * ii, abs=1.0)
    dep = longer(sw, lambda i: f"fma.{dtype} r1, r1, r20, r21", 8)
    assert dep == pytest.approx(8 * pipe.latency_cycles, abs=1.0)


def test_ldm_load_latency_and_wavefronts(sw):
    lat = sw.scratchpad.latency_cycles
    assert longer(sw, lambda i: "ld.shared.b32 r10, [r10]", 4, shared=4096) == pytest.approx(4 * lat, abs=1.0)
    # 32 lanes x 8 B = 256 B over 8 banks x 8 B: 4 wavefronts, the data comes 3 cycles later
    body = "\n    ".join(["ld.shared.b64 r10, [r11]", "add.i64 r11, r30, r10"] * 4)
    plain = loop(body, 8, 4096).replace("L:", "    s2r r30, %laneid\n    mul.i64 r30, r30, 8\n"
                                        "    mov.b64 r11, r30\nL:")
    same = loop(body, 8, 4096).replace("L:", "    mov.b64 r30, 0\n    mov.b64 r11, 0\nL:")
    a = [time_kernel(assemble(t.replace("r40, 8", f"r40, {k}"), "k.s"), sw, CPE, {}).cycles
         for t in (plain, same) for k in (8, 16)]
    assert (a[1] - a[0]) / 8 - (a[3] - a[2]) / 8 == pytest.approx(4 * 3, abs=1.0)


# ----------------------------------------------------------------------------- DMA latency
def test_unloaded_dma_get_latency_is_the_sum_of_its_stages(sw):
    n = 8
    stages = (sw.dma.get_startup_cycles + ring_stage(sw, 8) + dram_stage(sw, sw.dram.timing.tCL, n)
              + ring_stage(sw, 8 + n))
    got = measure(sw, GET, n)
    assert 0 <= got - stages <= 3  # the rest: hand-offs between blocks (one cycle each at most)


def test_unloaded_dma_put_latency_is_the_sum_of_its_stages(sw):
    n = sw.dram.burst_bytes                   # a whole burst: written as it is
    stages = (sw.dma.put_startup_cycles + ring_stage(sw, 8 + n) + dram_stage(sw, sw.dram.timing.tCWL, n)
              + ring_stage(sw, 8))
    got = measure(sw, PUT, n)
    assert 0 <= got - stages <= 3


def test_a_put_of_part_of_a_burst_reads_the_burst_first(sw):
    """partial_writes: rmw: an 8-B put's burst is read (tCL and the burst back), then written."""
    t, n, burst = sw.dram.timing, 8, dram_burst_cycles(sw)
    stages = (sw.dma.put_startup_cycles + ring_stage(sw, 8 + n) + dram_stage(sw, t.tCL + burst + t.tCWL, n)
              + ring_stage(sw, 8))
    assert sw.dram.partial_writes == "rmw"
    got = measure(sw, PUT, n)
    assert 0 <= got - stages <= 3
    masked = load_machine("tiny-sunway", sets=["dram.partial_writes=masked"])
    assert 0 <= measure(masked, PUT, n) - (stages - (t.tCL + burst) / sw.clock_ratios.memory) <= 3


def test_each_stage_moves_the_dma_latency_by_its_own_share(sw):
    base = measure(sw, GET)
    slower = load_machine("tiny-sunway", sets=["dma.get_startup_cycles=137"])
    assert measure(slower, GET) - base == 137 - sw.dma.get_startup_cycles
    L = sw.fabric.router_latency_cycles
    routers = load_machine("tiny-sunway", sets=[f"fabric.router_latency_cycles={L + 10}"])
    assert measure(routers, GET) - base == 2 * 10  # one stop out, one stop back
    # a CPE of group 1 reading group 0's private segment: one ring hop each way, two more stops
    assert measure(sw, GET, who=sw.cores.per_group) - base == 2 * L
    assert measure(routers, GET, who=sw.cores.per_group) - measure(routers, GET) == 2 * (L + 10)


def test_cpe_global_load_travels_the_ring_without_the_dma_start_up(sw):
    gld = measure(sw, GLD)
    path = measure(sw, GET) - sw.dma.get_startup_cycles  # the same request and reply over the ring
    # plus the CPE's side: the load's data pipe and return pipeline, and the dependent add; the two
    # kernels reach DRAM at different phases of the memory clock (ratio 0.8: up to one memory cycle,
    # which the MPE's launch time at kernel start shifts)
    phase = math.ceil(1 / sw.clock_ratios.memory) - 1
    assert 0 < gld - path <= sw.scratchpad.latency_cycles + 4 + phase
    L = sw.fabric.router_latency_cycles
    routers = load_machine("tiny-sunway", sets=[f"fabric.router_latency_cycles={L + 10}"])
    assert measure(routers, GLD) - gld == 2 * 10


# ----------------------------------------------------------------------------- DMA streaming
def stream_cycles(m, size):
    r = MI.run_micro("dma", m, {"size_bytes": size, "cpes": 1, "reps": 1})
    return r.kernels[0]["cycles"]


def test_streaming_rate_is_the_narrowest_configured_rate(sw):
    # default tiny-sunway: the group's one DDR4 channel (12.8 B per core cycle) is narrower than
    # the engine port (32 B/cycle) and the ring stop (32 B/cycle)
    dram_bpc = sw.dram.channel_gbps * (sw.dram.channels // sw.memory_controllers.count) / sw.clock_ghz
    d = stream_cycles(sw, 8192) - stream_cycles(sw, 4096)
    assert 4096 / d == pytest.approx(dram_bpc, rel=0.02)
    # an 8 B/cycle engine port is the narrowest: the engine's rate
    slow = load_machine("tiny-sunway", sets=["dma.bytes_per_cycle=8"])
    d = stream_cycles(slow, 8192) - stream_cycles(slow, 4096)
    assert 4096 / d == pytest.approx(8.0, rel=0.01)


def test_unaligned_transfers_take_extra_pieces_and_cost_more(sw):
    out = {}
    for d in ("get", "put"):
        for off in (0, 8):
            r = MI.run_micro("dma", sw, {"direction": d, "size_bytes": 1024, "reps": 4, "offset_bytes": off})
            k = r.kernels[0]
            base = buffer_addresses(assemble(MI.dma_kernel(d, 1024)),
                                    {"buf": Unbacked(1), "offset": 0, "spacing": 0, "stride": 0, "size": 0,
                                     "reps": 0})["buf"] + off
            assert k["dma"]["pieces"] == 4 * pieces(base, 1024, sw.dma.piece_bytes)
            out[d, off] = k["cycles"]
    assert pieces(0x10000, 1024, 128) == 8 and pieces(0x10008, 1024, 128) == 9 and pieces(0x10008, 8, 128) == 1
    assert out["get", 8] > out["get", 0] and out["put", 8] > out["put", 0]


def test_group_bandwidth_grows_with_cpes_and_saturates_at_its_controller(sw):
    ctrl_bpc = sw.dram.channel_gbps * (sw.dram.channels // sw.memory_controllers.count) / sw.clock_ghz
    v = [MI.run_micro("dma", sw, {"size_bytes": 2048, "cpes": c, "reps": 4}).value for c in (1, 2, 8)]
    assert v[0] < v[1] < v[2] <= ctrl_bpc
    assert v[2] > 0.9 * ctrl_bpc


# ----------------------------------------------------------------------------- invariance, records
def _strip(doc):
    doc = json.loads(json.dumps(doc))
    doc["result"]["sim"] = None
    return doc


@pytest.mark.parametrize("direction", ["get", "put"])
def test_skip_ahead_and_repeat_runs_change_nothing(sw, monkeypatch, direction):
    import archsim.micro as mod
    from archsim.engine import timing

    p = {"direction": direction, "size_bytes": 600, "cpes": 5, "reps": 3, "offset_bytes": 40}
    a = MI.run_micro("dma", sw, p)
    a2 = MI.run_micro("dma", sw, p)
    assert _strip(a.document(sw)) == _strip(a2.document(sw))
    orig = timing.time_kernel
    monkeypatch.setattr(mod, "time_kernel", lambda *x, **kw: orig(*x, **dict(kw, skip=False)))
    b = MI.run_micro("dma", sw, p)
    da, db = _strip(a.document(sw)), _strip(b.document(sw))
    assert da["result"]["kernels"][0].pop("skipped_cycles") > 0
    assert db["result"]["kernels"][0].pop("skipped_cycles") == 0
    assert da == db


def test_latency_runs_are_identical_with_skip_ahead_off(sw):
    for op in (GET, PUT, GLD):
        assert measure(sw, op, 300, who=17) == measure(sw, op, 300, who=17, skip=False)


def test_result_record_carries_dma_bytes_bandwidth_and_dma_wait(sw):
    r = MI.run_micro("dma", sw, {"size_bytes": 1024, "cpes": 4, "reps": 2})
    k = r.kernels[0]
    assert k["bytes"]["dma"] == 4 * 2 * 1024 == r.extra["bytes_moved"]
    assert k["dma"]["gets"] == 8 and k["dma"]["bytes_get"] == 8192
    assert k["bandwidth_gbps"]["dma"] > 0 and "l1" not in k["bandwidth_gbps"]
    assert k["stalls"]["dma_wait"] > 0.5 and sum(k["stalls"].values()) == pytest.approx(1.0)
    tl = k["timeline"]
    n = len(tl["series"]["dma_gbps"])
    sec = [tl["window_cycles"]] * (n - 1) + [k["cycles"] - (n - 1) * tl["window_cycles"]]
    moved = sum(g * c / (sw.clock_ghz * 1e9) * 1e9 for g, c in zip(tl["series"]["dma_gbps"], sec))
    assert moved == pytest.approx(8192, rel=1e-3)  # the timeline adds back up to the DMA bytes
    assert k["memory_controllers"][0]["gbps"] > 0 and k["fabric"]["link_util_max"] > 0
    assert r.value == pytest.approx(8192 / k["cycles"])


def test_dma_data_lands_where_the_functional_model_puts_it(sw):
    src = """.kernel k
.shared 256
.param a
.param b
        ldparam r1, a
        ldparam r2, b
        mov.b64 r3, 0
        mov.b64 r4, 200
        dma.get [r3], [r1+8], r4
        dma.wait 0
        dma.put [r2], [r3], r4
        dma.wait 0
        exit
"""
    a = np.arange(256, dtype=np.uint8)
    t = time_kernel(assemble(src, "k.s"), sw, CPE, {"a": a, "b": np.zeros(256, np.uint8)})
    assert np.array_equal(t.buffers["b"][:200], a[8:208]) and not t.buffers["b"][200:].any()
    assert t.memory["dma"]["pieces"] == pieces(0x10008, 200, 128) + pieces(0x10100, 200, 128)


def test_sw26010pro_core_group_streams_with_all_64_cpes():
    m = load_machine("sw26010pro")
    r = MI.run_micro("dma", m, {"size_bytes": 2048, "cpes": 64, "reps": 1})
    k = r.kernels[0]
    assert k["dma"]["pieces"] == 64 * 16 and k["bytes"]["dma"] == 64 * 2048
    peak = m.dram.channel_gbps * (m.dram.channels // m.memory_controllers.count) / m.clock_ghz
    assert 0 < r.value <= peak


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("params,where", [
    ({"size_bytes": 64 * 1024 + 8}, "--param size_bytes"),
    ({"size_bytes": 0}, "--param size_bytes"),
    ({"size_bytes": 128, "cpes": 0}, "--param cpes"),
    ({"size_bytes": 128, "cpes": 17}, "--param cpes"),
    ({"size_bytes": 128, "direction": "bcast"}, "--param direction"),
    ({"size_bytes": 128, "offset_bytes": -8}, "--param offset_bytes"),
    ({}, "micro dma"),
])
def test_bad_dma_parameters_are_one_clear_error(sw, params, where):
    with pytest.raises(InputError) as e:
        MI.run_micro("dma", sw, params)
    assert e.value.where == where


def test_dma_on_a_gpu_is_a_clear_error(sw):
    with pytest.raises(InputError) as e:
        MI.run_micro("dma", load_machine("tiny-gpu"), {"size_bytes": 128})
    assert "no DMA engines" in str(e.value)


def test_cli_micro_dma_writes_its_json(tmp_path, capsys):
    from archsim.cli import main

    f = tmp_path / "d.json"
    code = main(["micro", "dma", "--hw", "tiny-sunway", "--param", "size_bytes=512", "--param", "cpes=2",
                 "--json", str(f)])
    assert code == 0
    doc = json.loads(f.read_text())
    assert doc["schema"] == "archsim.micro/1" and doc["unit"] == "B/cycle" and doc["value"] > 0
    assert main(["micro", "dma", "--hw", "tiny-sunway", "--param", "size_bytes=999999"]) == 2
    assert "does not fit the LDM" in capsys.readouterr().err


def test_dma_outside_the_ldm_stops_with_the_core_and_instruction(sw):
    from archsim.errors import SimulationError

    src = ".kernel k\n.shared 256\n.param a\n        ldparam r1, a\n        mov.b64 r2, 128\n" \
          "        mov.b64 r3, 200\n        dma.get [r2], [r1], r3\n        dma.wait 0\n        exit\n"
    with pytest.raises(SimulationError) as e:
        time_kernel(assemble(src, "k.s"), sw, CPE, {"a": np.zeros(256, np.uint8)})
    assert e.value.where == "k.s:7" and "core 0" in str(e.value) and "outside the block's 256 bytes" in str(e.value)


def test_pointer_chase_from_a_cpe_goes_over_the_ring(sw):
    # every load is a ring round trip and a DDR4 access; an open row saves tRCD
    r = MI.run_micro("latency", sw, {"footprint_kib": 16, "loads": 128})
    cold = measure(sw, GLD)
    trcd = sw.dram.timing.tRCD / sw.clock_ratios.memory
    assert cold - trcd - 4 <= r.value <= cold + 4


def test_cpe_global_store_goes_out_on_the_ring(sw):
    src = ".kernel k\n.param a\n        ldparam r1, a\n        mov.b64 r2, 77\n        st.global.b64 [r1+8], r2\n" \
          "        exit\n"
    t = time_kernel(assemble(src, "k.s"), sw, CPE, {"a": np.zeros(4, np.int64)})
    assert list(t.buffers["a"]) == [0, 77, 0, 0]
    # the store leaves on the request ring as one packet: an 8-B header and the 32-B sector the
    # coalescer rounds it to (the kernel ends when its CPE exits: as on the GPU, a run does not
    # wait for stores still in flight)
    b = t.memory["bytes"]
    assert b["fabric"] == 8 + 32 and b["dram_read"] == 0


@pytest.mark.parametrize("dtype,published_tflops", [("f16x2", 55.3), ("f32", 13.82)])
def test_sw26010pro_cpe_vector_fma_reaches_the_published_peak(dtype, published_tflops):
    # [BGL]: 55.3 fp16 TFLOP/s from the 384 CPEs; 14.03 fp32 of which 13.82 from the CPEs
    m = load_machine("sw26010pro")
    cycles_per_fma = longer(m, lambda i: f"fma.{dtype} r{1 + i % 4}, r{1 + i % 4}, r20, r21", 16) / 16
    flops = 32 * (4 if dtype == "f16x2" else 2)  # a warp-instruction: 32 lanes, f16x2 packs two FMAs
    tflops = flops / cycles_per_fma * 384 * m.clock_ghz / 1000
    assert tflops == pytest.approx(published_tflops, rel=0.01)


# ----------------------------------------------------------------------------- LDM cache
def _with_cache(kib=8):
    return load_machine("tiny-sunway", sets=[f"scratchpad.cache_kib={kib}"])


def _gld_run(m, op):
    args = {"buf": Unbacked(1 << 16), "out": np.zeros(2, np.int64), "n": 8, "who": 0}
    return time_kernel(assemble(timed(op, shared=1024), "k.s"), m, CPE, args)


def test_ldm_cache_hits_at_the_ldm_latency_and_fills_whole_lines(sw):
    """With scratchpad.cache_kib > 0 a CPE's global loads go through its LDM cache: a miss fetches
    the whole cache_line_bytes line over the ring, a hit answers at the LDM's latency (plus the
    load's fixed return stage) without leaving the CPE."""
    c = _with_cache()
    one, two = measure(c, GLD), measure(c, GLD + "\n        " + GLD)
    assert c.scratchpad.latency_cycles <= two - one <= c.scratchpad.latency_cycles + 2
    assert one >= measure(sw, GLD)                      # a miss: the ring trip, a longer reply
    line = c.scratchpad.cache_line_bytes
    assert _gld_run(c, GLD).memory["bytes"]["dram_read"] == line
    assert _gld_run(sw, GLD).memory["bytes"]["dram_read"] == 32   # no cache: the load's sector


def test_ldm_cache_latency_steps_at_its_capacity():
    """Pointer chase on one CPE: a footprint inside the LDM cache runs at its hit latency, one
    four times its size misses (the chase's random cycle defeats the cache)."""
    c = _with_cache(8)
    inside = MI.run_micro("latency", c, {"footprint_kib": 4, "loads": 256}).value
    outside = MI.run_micro("latency", c, {"footprint_kib": 32, "loads": 256}).value
    assert inside <= c.scratchpad.latency_cycles + 2 < 20 < outside
    rec = MI.run_micro("latency", c, {"footprint_kib": 4, "loads": 64}).kernels[0]
    assert "l1" in rec["bandwidth_gbps"]


def test_ldm_cache_writes_stores_through_without_allocating():
    """A store is written through in its own 32-B sector (no line fill, no allocation)."""
    c = _with_cache()
    t = _gld_run(c, "st.global.b64 [r1], r3")
    assert t.memory["bytes"]["dram_read"] == 0
    assert _gld_run(c, "st.global.b64 [r1], r3\n        " + GLD).memory["bytes"]["dram_read"] == \
        c.scratchpad.cache_line_bytes                   # the later load still misses: no allocation


def test_ldm_cache_organisation_is_checked():
    with pytest.raises(InputError, match="cache_assoc"):
        load_machine("tiny-sunway", sets=["scratchpad.cache_kib=8", "scratchpad.cache_assoc=3"])
    with pytest.raises(InputError, match="cache_line_bytes"):
        load_machine("tiny-sunway", sets=["scratchpad.cache_kib=8", "scratchpad.cache_line_bytes=96"])
