"""RMA on tiny-sunway: LDM-to-LDM transfers between CPEs over the CPE mesh (archsim/engine/rma.py).

Oracles from the config: an unloaded transfer costs the engine's start-up plus the mesh both ways
(a put's data out and its ack back; a get's request out and its data back): every router on the
path twice at rma.router_latency_cycles, plus each packet's serialization on a
rma.link_bytes_per_cycle link; one more cluster hop adds exactly two router latencies; a stream
runs at the narrowest configured rate (the engine port, rma.bytes_per_cycle).
"""

import json
import math

import numpy as np
import pytest

from archsim import micro as MI
from archsim.config import load_machine
from archsim.engine.noc import cpe_mesh_params
from archsim.engine.rma import rma_pieces
from archsim.engine.timing import time_kernel
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

HEADER = 8  # fabric.header_bytes (default)


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def rma(m, src, dst, size=8, direction="put", reps=4, **kw):
    return MI.run_micro("rma", m, {"src": src, "dst": dst, "size_bytes": size, "direction": direction,
                                   "reps": reps}, **kw)


def hops(m, a, b):
    mm = m.mesh
    cc = mm.cols // mm.cluster_cols

    def cl(k):
        return (k // mm.cols) // mm.cluster_rows, (k % mm.cols) // mm.cluster_cols

    (i, j), (u, v) = cl(a), cl(b)
    return abs(i - u) + abs(j - v)


def unloaded(m, src, dst, size, direction="put"):
    """Start-up + the mesh out and back: (hops + 1) routers each way, and each packet's
    serialization on the links (data: header + size; ack or request: a header)."""
    W, L, _ = cpe_mesh_params(m)
    routers = hops(m, src, dst) + 1
    return m.rma.startup_cycles + 2 * routers * L + math.ceil((HEADER + size) / W) + math.ceil(HEADER / W)


# ----------------------------------------------------------------------------- latency
ONE = """.kernel k
.shared 1024
.param out
.param dst
.param n
        s2r r0, %ctaid.x
        setp.ne.i64 p0, r0, 0
   @p0  bra END
        ldparam r9, out
        ldparam r11, dst
        ldparam r3, n
        mov.b64 r2, 0
        s2r r4, %clock
        OP
        rma.wait 0
        s2r r5, %clock
        sub.i64 r5, r5, r4
        st.global.b64 [r9], r5
END:    bar.grid
        exit
"""


def one(m, dst, n=8, direction="put", **kw):
    """Cycles between two clock reads around one RMA of CPE 0 to CPE dst and its wait."""
    op = "rma.put [r2], [r2], r3, r11" if direction == "put" else "rma.get [r2], [r2], r3, r11"
    t = time_kernel(assemble(ONE.replace("OP", op), "k.s"), m, Launch((max(dst, 1) + 1, 1, 1), (32, 1, 1)),
                    {"out": np.zeros(1, np.int64), "dst": dst, "n": n}, **kw)
    return int(t.buffers["out"][0])


@pytest.mark.parametrize("direction", ["put", "get"])
@pytest.mark.parametrize("dst", [1, 3, 15])   # same cluster, one hop, corner to corner (2 hops)
def test_unloaded_rma_latency_is_start_up_plus_the_mesh_both_ways(sw, direction, dst):
    got = one(sw, dst, 8, direction)
    want = unloaded(sw, 0, dst, 8, direction)
    assert got == one(sw, dst, 8, direction, skip=False)
    assert 0 <= got - want <= 3, (got, want)  # the rest: hand-offs (issue -> engine, mesh -> warp)


def test_each_cluster_hop_adds_two_router_latencies(sw):
    _, L, _ = cpe_mesh_params(sw)
    base = rma(sw, 0, 1).value
    assert rma(sw, 0, 2).value - base == 2 * L          # one hop in x
    assert rma(sw, 0, 8).value - base == 2 * L          # one hop in y
    assert rma(sw, 0, 15).value - base == 4 * L         # corner to corner
    slow = load_machine("tiny-sunway", sets=[f"rma.router_latency_cycles={L + 5}"])
    assert rma(slow, 0, 15).value - rma(sw, 0, 15).value == 2 * 3 * 5   # 3 routers, twice
    later = load_machine("tiny-sunway", sets=[f"rma.startup_cycles={sw.rma.startup_cycles + 17}"])
    assert rma(later, 0, 3).value - rma(sw, 0, 3).value == 17


def stream_rate(m, src=0, dst=2):
    """B/cycle of a stream: d(bytes) / d(cycles) between blocking puts of 16 and 32 KiB (the
    start-up and the last piece's trip cancel)."""
    c = [rma(m, src, dst, size, reps=1).value for size in (16384, 32768)]
    return 16384 / (c[1] - c[0])


def test_streaming_rate_is_the_narrowest_configured_rate(sw):
    W, _, D = cpe_mesh_params(sw)
    P = sw.rma.piece_bytes
    link = P / -(-(P + HEADER) // W)          # a piece's packet holds a link ceil((P + 8) / W) cycles
    assert sw.rma.bytes_per_cycle < link
    assert stream_rate(sw) == pytest.approx(sw.rma.bytes_per_cycle, rel=0.005)      # the engine port
    narrow = load_machine("tiny-sunway", sets=["rma.link_bytes_per_cycle=8", "rma.buffer_depth=40"])
    assert stream_rate(narrow) == pytest.approx(P / -(-(P + HEADER) // 8), rel=0.005)  # now the links
    r = rma(sw, 0, 2, 16384, reps=2)
    rec = r.kernels[0]
    assert rec["rma"]["pieces"] == 2 * rma_pieces(16384, P)
    assert rec["bytes"]["rma"] == 2 * 16384 and rec["bandwidth_gbps"]["rma"] > 0


def test_record_shows_the_rma_transfers_and_the_mesh_links(sw):
    r = rma(sw, 0, 15, 1024)
    k = r.kernels[0]
    assert k["rma"]["puts"] == 4 and k["rma"]["bytes_put"] == 4 * 1024
    assert k["rma"]["latency_mean_cycles"] > 0
    assert k["mesh"]["bytes_delivered"] > 4 * 1024 and k["mesh"]["link_util_max"] > 0
    names = {x["name"] for x in k["mesh"]["links"]}
    assert "mesh cg0.r0c0->cg0.r0c1" in names and "mesh cg0.r1c1->cg0.r1c0" in names  # XY both ways
    assert k["stalls"]["dma_wait"] > 0   # rma.wait counts as a bulk-transfer wait


# ----------------------------------------------------------------------------- data and determinism
MOVE = """.kernel k
.shared 1024
.param a
.param out
.param n
        s2r r0, %ctaid.x
        ldparam r1, a
        ldparam r2, out
        ldparam r3, n
        mov.b64 r4, 0
        mov.b64 r5, 512
        mul.i64 r6, r0, 1024
        add.i64 r1, r1, r6
        dma.get [r4], [r1], r3        // own LDM[0..n) = a[blk]
        dma.wait 0
        bar.grid
        xor.b64 r7, r0, 5             // partner block
        rma.get [r5], [r4], r3, r7    // LDM[512..) = partner's LDM[0..)
        rma.wait 0
        bar.grid
        add.i64 r8, r0, 1
        rem.i64 r8, r8, 16
        rma.put [r4], [r5], r3, r8    // next block's LDM[0..) = my LDM[512..)
        rma.wait 0
        bar.grid
        mul.i64 r6, r0, 1024
        add.i64 r2, r2, r6
        dma.put [r2], [r4], r3
        dma.wait 0
        exit
"""


def test_rma_data_lands_where_the_functional_model_puts_it(sw):
    from archsim.engine.functional import run_functional

    n = 300
    a = np.random.default_rng(3).integers(0, 255, 16 * 1024, dtype=np.uint8)
    args = {"a": a, "out": np.zeros(16 * 1024, np.uint8), "n": n}
    prog = assemble(MOVE, "k.s")
    t = time_kernel(prog, sw, Launch((16, 1, 1), (32, 1, 1)), args)
    want = np.zeros((16, 1024), np.uint8)
    src = a.reshape(16, 1024)
    for b in range(16):
        prev = (b - 1) % 16
        want[b, :n] = src[prev ^ 5, :n]
    assert np.array_equal(t.buffers["out"].reshape(16, 1024), want)
    f = run_functional(prog, args, Launch((16, 1, 1), (32, 1, 1)))
    assert np.array_equal(f.output("out").reshape(16, 1024), want)
    assert t.memory["rma"]["gets"] == 16 and t.memory["rma"]["puts"] == 16


def test_skip_ahead_and_repeat_runs_change_nothing(sw):
    prog = assemble(MOVE, "k.s")
    a = np.arange(16 * 1024, dtype=np.int64).astype(np.uint8)

    def run(skip):
        t = time_kernel(prog, sw, Launch((16, 1, 1), (32, 1, 1)),
                        {"a": a, "out": np.zeros(16 * 1024, np.uint8), "n": 500}, skip=skip)
        return t.cycles, t.memory["rma"], t.memory["mesh"]["links"], t.stall.tolist(), t.buffers["out"].tobytes()

    one, two, off = run(True), run(True), run(False)
    assert one == two == off


# ----------------------------------------------------------------------------- bad input
def test_rma_to_another_core_group_stops_with_the_core_and_instruction(sw):
    src = ".kernel k\n.shared 64\n        s2r r0, %ctaid.x\n        mov.b64 r1, 0\n        mov.b64 r2, 8\n" \
          "        mov.b64 r3, 16\n        rma.put [r1], [r1], r2, r3\n        rma.wait 0\n        bar.grid\n" \
          "        exit\n"
    with pytest.raises(SimulationError) as e:
        time_kernel(assemble(src, "k.s"), sw, Launch((17, 1, 1), (32, 1, 1)), {})
    assert e.value.where == "k.s:7" and "core 0" in str(e.value) and "another core group" in str(e.value)
    src = src.replace("mov.b64 r3, 16", "mov.b64 r3, 40")
    with pytest.raises(SimulationError) as e:   # a block the launch does not have
        time_kernel(assemble(src, "k.s"), sw, Launch((17, 1, 1), (32, 1, 1)), {})
    assert "RMA to block 40" in str(e.value)


@pytest.mark.parametrize("params,where", [
    ({"dst": 16}, "--param dst"),
    ({"dst": 1, "src": -1}, "--param src"),
    ({"dst": 1, "size_bytes": 0}, "--param size_bytes"),
    ({"dst": 1, "size_bytes": 1 << 20}, "--param size_bytes"),
    ({"dst": 1, "direction": "swap"}, "--param direction"),
    ({}, "micro rma"),
])
def test_bad_rma_parameters_are_one_clear_error(sw, params, where):
    with pytest.raises(InputError) as e:
        MI.run_micro("rma", sw, params)
    assert e.value.where == where


def test_rma_on_a_gpu_is_a_clear_error():
    with pytest.raises(InputError) as e:
        MI.run_micro("rma", load_machine("tiny-gpu"), {"dst": 1})
    assert "no RMA engines" in str(e.value)


def test_cli_micro_rma_writes_its_json(tmp_path, capsys):
    from archsim.cli import main

    f = tmp_path / "r.json"
    assert main(["micro", "rma", "--hw", "tiny-sunway", "--param", "dst=15", "--json", str(f)]) == 0
    doc = json.loads(f.read_text())
    assert doc["schema"] == "archsim.micro/1" and doc["unit"] == "cycles" and doc["value"] > 0
    assert doc["cluster_hops"] == 2
    assert main(["micro", "rma", "--hw", "tiny-sunway", "--param", "dst=99"]) == 2
    assert "does not exist" in capsys.readouterr().err
