"""Thread-block clusters on h100's timing model (issue 48 item 3): co-scheduling in a GPC, the
distributed-shared-memory path's latency and port rate, barrier.cluster, and refusals.

A cluster's blocks go to distinct SMs of one GPC (clusters.gpc_sms). A remote scratchpad access
takes the target SM's port (clusters.dsmem_bytes_per_cycle) and its GPC's switch from the first
cycle both are free and lands clusters.dsmem_latency_cycles after; barrier.cluster releases its
warps clusters.barrier_cycles after the last arrival, or after the cluster's remote stores land.
Each oracle differences two runs, so launch and set-up costs cancel.
"""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.timing import time_kernel
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch


def with_clusters(machine, **kw):
    return machine.model_copy(update={"clusters": machine.clusters.model_copy(update=kw)})


def run(machine, body, grid=2, cluster=2, threads=32, shared=1024, **kw):
    src = f""".kernel k
.param out
.shared {shared}
        s2r r0, %cluster_ctarank
        xor.b64 r2, r0, 1
{body}
        exit
"""
    prog = assemble(src, "k.s")
    return time_kernel(prog, machine, Launch((grid, 1, 1), (threads, 1, 1), cluster=cluster),
                       {"out": np.zeros(64, np.int64)}, **kw)


def test_a_clusters_blocks_share_a_gpc_on_distinct_sms(h100):
    gpc = np.repeat(np.arange(8), h100.clusters.gpc_sms)
    t = run(h100, "", grid=264, cluster=4)
    cores = t.block_core.reshape(-1, 4)
    for c in cores:
        assert len(set(c.tolist())) == 4 and len(set(gpc[c].tolist())) == 1
    assert len(set(gpc[cores[:8, 0]].tolist())) == 8      # the first clusters go round the GPCs


def test_clusters_of_16_leave_the_12_sm_gpc_idle(h100):
    # one block an SM (the scratchpad): 7 GPCs hold a cluster of 16 at once, the 8th cluster waits
    # for one to finish (CF25: ~112 SMs active with clusters of 16)
    t = run(h100, "", grid=8 * 16, cluster=16, shared=200 * 1024)
    gpc = np.repeat(np.arange(8), h100.clusters.gpc_sms)
    first = t.block_start[:7 * 16]
    assert len(set(first.tolist())) == 1 and 7 not in set(gpc[t.block_core].tolist())
    assert t.block_start[7 * 16:].min() > first.max()


CHAIN = """        mov.b64 r1, 0
        mov.b64 r5, 0
LOOP:   ld.dsmem.b32 r1, [r1], r2
        add.i64 r5, r5, 1
        setp.lt.i64 p0, r5, {n}
  @p0   bra LOOP
        barrier.cluster"""


def test_a_remote_load_chain_pays_the_network_latency(h100):
    # each load's address is the value it loads (zeros: the same word): n dependent remote loads
    def cyc(m, n):
        return run(m, CHAIN.format(n=n)).cycles
    slow, fast = with_clusters(h100, dsmem_latency_cycles=390), h100
    assert (cyc(slow, 16) - cyc(slow, 8)) - (cyc(fast, 16) - cyc(fast, 8)) == 8 * 200


def test_remote_reads_stream_at_the_target_sms_port(h100):
    # 8 warps of rank 0 each read 8 x 512 bytes (v4 x 32 lanes) from rank 1: bound by rank 1's port
    body = "\n".join(["        s2r r3, %tid.x", "        shl.b64 r3, r3, 4",
                      "        setp.ne.i64 p1, r0, 0", "  @p1   bra DONE"]
                     + [f"        ld.dsmem.v4.b32 r{8 + 4 * i}, [r3+0], r2" for i in range(8)]
                     + ["        mov.b64 r60, r36", "DONE:   barrier.cluster"])   # (waits for the last load)
    t1 = run(h100, body, threads=256, shared=4096)
    t2 = run(with_clusters(h100, dsmem_bytes_per_cycle=16), body, threads=256, shared=4096)
    moved = 8 * 8 * 512
    # half the port rate: the stream takes moved / 32 cycles more
    assert abs((t2.cycles - t1.cycles) - moved // 32) <= 8


def test_barrier_cluster_releases_after_its_latency(h100):
    body = "        barrier.cluster\n        barrier.cluster"
    a = run(h100, body).cycles
    b = run(with_clusters(h100, barrier_cycles=1000), body).cycles
    assert b - a == 2 * (1000 - h100.clusters.barrier_cycles)


def test_barrier_cluster_waits_for_remote_stores_to_land(h100):
    body = "        st.dsmem.b32 [0], r0, r2\n        barrier.cluster"
    a = run(h100, body).cycles
    b = run(with_clusters(h100, dsmem_latency_cycles=990), body).cycles
    assert b - a == 800


def test_an_exited_warp_deadlocks_barrier_cluster(h100):
    body = "        setp.eq.i64 p1, r0, 1\n  @p1   exit\n        barrier.cluster"
    with pytest.raises(SimulationError) as e:
        run(h100, body)
    assert "waits at barrier.cluster" in str(e.value) and "\n" not in str(e.value)


def test_cluster_launches_are_refused_where_they_cannot_run(h100):
    with pytest.raises(InputError, match="has none"):
        run(load_machine("a100"), "")
    with pytest.raises(InputError, match="at most 16"):
        run(h100, "", grid=32, cluster=32)
    with pytest.raises(InputError, match="whole clusters"):
        run(h100, "", grid=8, cluster=4, blocks=(2, 8))


def test_skipping_idle_cycles_changes_nothing(h100):
    a = run(h100, CHAIN.format(n=4))
    b = run(h100, CHAIN.format(n=4), skip=False)
    assert a.cycles == b.cycles


def test_micro_dsmem_latency_and_bandwidth(h100):
    from archsim.micro import run_micro

    lat = run_micro("dsmem", h100, {"kind": "latency", "cluster": "2", "loads": "8"})
    assert lat.value == h100.clusters.dsmem_latency_cycles + 1      # the round trip and a 4-byte port cycle
    bw = run_micro("dsmem", h100, {"kind": "bandwidth", "cluster": "2", "loads": "8", "warps": "4"})
    gpcs = len(h100.clusters.gpc_sms)
    ceiling = gpcs * h100.clusters.gpc_bytes_per_cycle * h100.clock_ghz      # GB/s: every GPC's switch
    assert bw.unit == "GB/s" and 0.3 * ceiling < bw.value <= ceiling
    with pytest.raises(InputError, match="no thread-block clusters"):
        run_micro("dsmem", load_machine("a100"), {})
    with pytest.raises(InputError, match="multiple of 4"):
        run_micro("dsmem", h100, {"kind": "bandwidth", "loads": "6"})


def test_cluster_ops_in_a_launch_without_clusters(h100):
    # clusters of one: barrier.cluster is a block barrier, st.dsmem to rank 0 the block's own
    # scratchpad; many blocks (their ids index the cluster tables)
    body = "        mov.b64 r2, 0\n        st.dsmem.b32 [0], r0, r2\n        barrier.cluster"
    a = run(h100, body, grid=600, cluster=1, threads=128)
    b = run(h100, body, grid=600, cluster=1, threads=128, skip=False)
    assert a.cycles == b.cycles and a.warp_instructions == 600 * 4 * 6


def test_asm_keeps_the_files_cluster(tmp_path, capsys):
    import json

    from archsim.cli import main

    f = tmp_path / "c.s"
    f.write_text(""".kernel c
.param out
.launch grid=4 block=32 cluster=2
.arg out i64[4] zeros
        s2r r0, %cluster_nctarank
        s2r r1, %ctaid.x
        shl.b64 r1, r1, 3
        ldparam r2, out
        add.i64 r2, r2, r1
        st.global.b64 [r2], r0
        exit
""")
    out = tmp_path / "o.json"
    assert main(["asm", str(f), "--hw", "a100"]) == 2            # a machine without clusters
    assert "which has none" in capsys.readouterr().err
    assert main(["asm", str(f), "--hw", "h100", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["launch"]["cluster"] == 2 and rec["written"]["out"]["head"] == [2, 2, 2, 2]


def test_an_unbalanced_barrier_cluster_is_refused_at_load():
    from archsim.config.derived import capabilities
    from archsim.isa.check import check

    prog = assemble(""".kernel u
.param out
        s2r r0, %tid.x
        setp.lt.i64 p0, r0, 16
  @p0   bra SKIP
        barrier.cluster
SKIP:   exit
""", "u.s")
    with pytest.raises(InputError, match="barrier.cluster is not reached the same number of times"):
        check(prog, capabilities(load_machine("h100")))


def test_a_wave_of_clusters_counts_whole_clusters_in_each_gpc(h100):
    from archsim.sample import concurrency, time_sampled

    prog = assemble(""".kernel w
.param out
.shared 204800
        barrier.cluster
        exit
""", "w.s")
    one = Launch((8 * 16, 1, 1), (32, 1, 1), cluster=16)         # one block an SM (the scratchpad)
    assert concurrency(prog, h100, one) == 7 * 16                # the 12-SM GPC holds none
    assert concurrency(prog, h100, Launch((132, 1, 1), (32, 1, 1), cluster=2)) == 132
    s = time_sampled(prog, h100, one, {"out": np.zeros(1, np.int64)})
    assert not s.sampled and s.waves_total == 2


def test_a_launch_of_many_waves_of_clusters_is_sampled_in_whole_clusters(h100):
    from archsim.sample import DEFAULT_MAX_ERROR, time_sampled

    prog = assemble(""".kernel w
.param out
.shared 204800
        mov.b64 r1, 0
LOOP:   add.i64 r1, r1, 1
        setp.lt.i64 p0, r1, 100
   @p0  bra LOOP
        barrier.cluster
        exit
""", "w.s")
    # 16 waves of one block an SM; a period of 333 blocks (long enough for strata) is no whole
    # clusters: no strata, no boundary window
    launch = Launch((132 * 16, 1, 1), (32, 1, 1), cluster=2, period=333)
    whole = time_sampled(prog, h100, launch, {"out": np.zeros(1, np.int64)}, sample=False)
    s = time_sampled(prog, h100, launch, {"out": np.zeros(1, np.int64)})
    assert s.sampled and not whole.sampled and s.boundary is None
    assert abs(s.timing.cycles - whole.timing.cycles) <= 2 * DEFAULT_MAX_ERROR * whole.timing.cycles
