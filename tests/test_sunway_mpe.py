"""The Sunway MPE's launch and join of the CPE array (archsim/engine/mpe.py) on tiny-sunway.

Oracles come from the config: the MPE's k-th launch message leaves after (k + 1) spawn costs (MPE
cycles, converted by the clock ratio) and reaches a CPE d cluster hops from the MPE's attach router
after (d + 1) router latencies plus its serialization on the mesh links (noc.py: routers x L +
ceil(bytes / W)); a CPE's completion comes back the same way as a header, and the MPE takes it in
join_cycles_per_cpe MPE cycles.
"""

import math

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.timing import Unbacked, time_kernel
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch
from archsim.sample import time_sampled

HEADER = 8  # fabric.header_bytes (default): every mesh packet's header

EXIT = """.kernel k
        exit
"""

SPIN = """.kernel k
.param n
        ldparam r1, n
        mov.b64 r2, 0
LOOP:   add.i64 r2, r2, 1
        setp.lt.i64 p0, r2, r1
   @p0  bra LOOP
        exit
"""

DMA = """.kernel k
.shared 4096
.param buf
        s2r r0, %ctaid.x
        ldparam r1, buf
        mul.i64 r3, r0, 1024
        add.i64 r1, r1, r3
        mov.b64 r2, 0
        mov.b64 r4, 1024
        dma.get [r2], [r1], r4
        dma.wait 0
        dma.put [r1], [r2], r4
        dma.wait 0
        exit
"""


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def run(m, text=EXIT, blocks=16, args=None, **kw):
    return time_kernel(assemble(text, "k.s"), m, Launch((blocks, 1, 1), (32, 1, 1)), args or {}, **kw)


def hops(m, core):
    """Cluster hops from the MPE's attach cluster to CPE `core` (of its group)."""
    mm = m.mesh
    k = core % m.cores.per_group
    cr, cc = (k // mm.cols) // mm.cluster_rows, (k % mm.cols) // mm.cluster_cols
    ar, ac = m.mpe.attach_cluster
    return abs(cr - ar) + abs(cc - ac)


def mesh_latency(m, core, nbytes):
    """Unloaded mesh latency between the MPE's port and CPE `core` (noc.py)."""
    return (hops(m, core) + 1) * m.rma.router_latency_cycles + math.ceil((HEADER + nbytes) / m.rma.link_bytes_per_cycle)


def core_cycles(m, mpe_cycles):
    return mpe_cycles * m.clock_ghz / m.mpe.clock_ghz


def launch_oracle(m, k, core):
    """Cycle the CPE that is k-th in its MPE's order starts: its message leaves when the MPE has
    spent k + 1 spawn costs, then crosses the mesh."""
    leave = math.ceil(core_cycles(m, (k + 1) * m.mpe.spawn_cycles_per_cpe) - 1e-9)
    return leave + mesh_latency(m, core, m.mpe.launch_message_bytes)


def test_unloaded_launch_latency_is_the_sum_of_its_stages(sw):
    t = run(sw)
    want = [launch_oracle(sw, b, b) for b in range(16)]
    assert list(t.block_start) == want
    rec = t.memory["mpe"]
    assert rec["cpes_launched"] == 16 and rec["launch_cycles"] == max(want)
    assert [g["group"] for g in rec["groups"]] == [0]  # group 1 has no block: its MPE takes no part


@pytest.mark.parametrize("sets", [["mpe.clock_ghz=1.6", "mpe.spawn_cycles_per_cpe=3"],   # 3.75 core cycles each
                                  ["mpe.attach_cluster=[1,1]", "rma.router_latency_cycles=5"],
                                  ["mpe.launch_message_bytes=100"]])
def test_each_stage_moves_the_launch_by_its_share(sets):
    m = load_machine("tiny-sunway", sets=sets)
    t = run(m)
    assert list(t.block_start) == [launch_oracle(m, b, b) for b in range(16)]


def test_farther_cpes_start_later(sw):
    """One CPE (core 0) launched alone: moving the MPE's port one cluster away costs one router
    latency per hop."""
    starts = {}
    for a in ([0, 0], [0, 1], [1, 1]):
        m = load_machine("tiny-sunway", sets=[f"mpe.attach_cluster=[{a[0]},{a[1]}]"])
        starts[tuple(a)] = int(run(m, blocks=1).block_start[0])
    L = sw.rma.router_latency_cycles
    assert starts[(0, 1)] - starts[(0, 0)] == L
    assert starts[(1, 1)] - starts[(0, 0)] == 2 * L
    # and in one launch the farthest cluster's CPEs start after the near ones issued at about the same time
    t = run(sw)
    assert t.block_start[15] > t.block_start[0]


def test_an_empty_kernel_takes_the_launch_and_the_join(sw):
    t = run(sw)
    rec = t.memory["mpe"]
    g = rec["groups"][0]
    last = 15
    assert g["last_cpe_start_cycle"] == launch_oracle(sw, last, last)
    assert g["last_cpe_done_cycle"] == g["last_cpe_start_cycle"]  # exit issues at once
    # each completion leaves the cycle after the CPE's exit and crosses the mesh as a header; the
    # MPE takes them in arrival order once its spawn loop is over, join_cycles_per_cpe each
    J = core_cycles(sw, sw.mpe.join_cycles_per_cpe)
    arrive = sorted(launch_oracle(sw, b, b) + 1 + mesh_latency(sw, b, 0) for b in range(16))
    fin = core_cycles(sw, 16 * sw.mpe.spawn_cycles_per_cpe)
    for a in arrive:
        fin = max(fin, a) + J
    join_at = math.ceil(fin - 1e-9)
    assert g["join_cycle"] == join_at
    assert rec["join_cycles"] == join_at - g["last_cpe_done_cycle"]
    assert t.cycles == join_at + 1
    assert t.warp_instructions == 16


def test_a_lone_cpe_join_is_the_sum_of_its_stages(sw):
    """One CPE, far from the MPE: done -> (next cycle) header over the mesh -> the MPE takes it."""
    m = load_machine("tiny-sunway", sets=["mpe.attach_cluster=[1,1]"])
    t = run(m, blocks=1)
    join = 1 + mesh_latency(m, 0, 0) + math.ceil(core_cycles(m, m.mpe.join_cycles_per_cpe) - 1e-9)
    assert t.memory["mpe"]["join_cycles"] == join
    assert t.cycles == launch_oracle(m, 0, 0) + join + 1


def test_both_groups_launch_and_join_in_parallel(sw):
    t = run(sw, blocks=32)
    rec = t.memory["mpe"]
    assert [g["group"] for g in rec["groups"]] == [0, 1]
    a, b = rec["groups"]
    assert a["last_cpe_start_cycle"] == b["last_cpe_start_cycle"]  # same distances, same MPE
    assert list(t.block_start[16:]) == list(t.block_start[:16])
    assert t.cycles == max(a["join_cycle"], b["join_cycle"]) + 1


def test_a_cpe_with_several_blocks_joins_after_its_last(sw):
    """A launch larger than the machine: later blocks start when the previous one on the CPE
    retires (no new launch message), and the CPE signals its MPE once, after its last block."""
    t = run(sw, SPIN, blocks=48, args={"n": 50})
    rec = t.memory["mpe"]
    assert rec["cpes_launched"] == 32
    core0 = [i for i in range(48) if t.block_core[i] == 0]
    assert len(core0) >= 2
    for prev, nxt in zip(core0, core0[1:]):
        assert t.block_start[nxt] == t.block_done[prev]
    assert max(g["last_cpe_done_cycle"] for g in rec["groups"]) == int(t.block_done.max())
    assert t.cycles == max(g["join_cycle"] for g in rec["groups"]) + 1


def test_no_stall_cycles_before_the_launch(sw):
    """A CPE waiting for its launch message is not running: it counts no warp-cycles."""
    t = run(sw, SPIN, blocks=16, args={"n": 20})
    resident = int(t.stall.sum())
    spans = int((t.block_done - t.block_start + 1).sum())  # from its launch through its exit cycle
    assert resident == spans


def test_skip_ahead_gives_identical_results(sw):
    args = {"buf": Unbacked(1 << 16)}
    a = run(sw, DMA, blocks=24, args=args)
    b = run(sw, DMA, blocks=24, args=args, skip=False)
    assert a.cycles == b.cycles and a.skipped_cycles > 0 and b.skipped_cycles == 0
    assert a.memory["mpe"] == b.memory["mpe"]
    assert np.array_equal(a.block_start, b.block_start) and np.array_equal(a.block_done, b.block_done)
    assert np.array_equal(a.stall, b.stall)


def test_deterministic(sw):
    args = {"buf": Unbacked(1 << 16)}
    a = run(sw, DMA, blocks=32, args=args)
    b = run(sw, DMA, blocks=32, args=args)
    assert a.cycles == b.cycles and a.memory == b.memory and np.array_equal(a.stall, b.stall)


def test_a_gpu_kernel_has_no_launch_model():
    g = load_machine("tiny-gpu")
    t = run(g, SPIN, blocks=4, args={"n": 20})
    assert "mpe" not in t.memory
    # its blocks start by the cores' own launch (core.dispatch_block): two a core on tiny-gpu's two
    # SMs, the first block_launch_cycles in, the second one block_interval_cycles later
    c = g.cores
    first, second = c.block_launch_cycles, c.block_launch_cycles + c.block_interval_cycles
    assert sorted(t.block_start) == [first, first, second, second]


def test_sampled_launch_keeps_the_join(sw):
    """Wave sampling adds the head's join once to the extrapolated cycles."""
    prog = assemble(SPIN, "k.s")
    launch = Launch((32 * 16, 1, 1), (32, 1, 1))         # 16 waves: a 6-wave head is sampled
    s = time_sampled(prog, sw, launch, {"n": 30})
    assert s.sampled
    whole = time_kernel(prog, sw, launch, {"n": 30})
    assert abs(s.timing.cycles - whole.cycles) / whole.cycles < 0.02


def test_record_fields(sw):
    from archsim.stats import kernel_record

    t = run(sw)
    rec = kernel_record("k", sw, Launch((16, 1, 1), (32, 1, 1)), t)
    assert set(rec["mpe"]) >= {"launch_cycles", "join_cycles", "cpes_launched", "groups"}


@pytest.mark.parametrize("sets, field", [(["mpe.attach_cluster=[2,0]"], "mpe.attach_cluster"),
                                         (["mpe.spawn_cycles_per_cpe=0"], "mpe.spawn_cycles_per_cpe"),
                                         (["mpe.launch_message_bytes=-8"], "mpe.launch_message_bytes"),
                                         (["rma=null"], "rma")])
def test_bad_mpe_config_names_the_field(sets, field):
    with pytest.raises(InputError) as e:
        load_machine("tiny-sunway", sets=sets)
    assert field in str(e.value)
