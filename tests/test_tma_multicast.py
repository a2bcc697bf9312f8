"""TMA multicast to a cluster's blocks and remote mbarrier arrivals (issue 48 item 2), on both
functional engines (numba and reference.py) against numpy oracles written from isa/README.md (the
`tma` row's .multicast form and the `mbremote` row), and on h100's timing model: one read of L2
for every block of the mask, and a remote arrival that lands after the SM-to-SM network's latency.
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.timing import time_kernel
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.check import check_program, check_target
from archsim.isa.tensor_map import TensorMap, tensor_map_words
from engine_pair import run_both
from test_cluster_dsmem import fails_both
from test_tma import mb_word

ROWS, COLS = 64, 64                     # an fp16 tensor of 64 x 64: 128-byte rows


def tensor() -> np.ndarray:
    return (np.arange(ROWS * COLS) % 2039).astype(np.float16).reshape(ROWS, COLS)


def tmap(box_rows: int) -> TensorMap:
    return TensorMap("t", tensor_map_words([COLS, ROWS], 2, [COLS, box_rows], 0))


def assemble_checked(src: str, machine="h100"):
    prog = assemble(src)
    check_program(prog)
    check_target(prog, capabilities(load_machine(machine)))
    return prog


# ------------------------------------------------------------------------- one multicast
def multicast_kernel(K: int, grid: int, mask: int, issuer: int, box_rows: int, *, shared=2048) -> str:
    """Each block: barrier [0] expecting one arrival; the blocks of `mask` expect the box's bytes;
    barrier.cluster (every barrier initialised); the block of rank `issuer` multicasts the box of
    rows 8 x cluster id .. to [1024] of the blocks of `mask`; every block waits for phase 0, then
    dumps its scratchpad to out (block b at out + b x shared)."""
    return f""".kernel mc
.param map
.param out
.param t
.shared {shared}
.launch grid={grid} block=32 cluster={K}
        s2r r9, %ctaid.x
        s2r r8, %cluster_ctarank
        mov.b64 r1, 1
        mbarrier.init [0], r1
        mov.b64 r2, {mask}
        shr.u64 r3, r2, r8
        and.b64 r3, r3, 1
        mul.i64 r3, r3, {box_rows * 128}
        mbarrier.arrive.expect_tx [0], r3
        barrier.cluster
        ldparam r4, map
        mov.b64 r10, 0
        div.i64 r11, r9, {K}
        mul.i64 r11, r11, 8
        mov.b64 r12, {mask}
        setp.ne.i64 p0, r8, {issuer}
   @p0  bra WAIT
        cp.async.bulk.tensor.2d.multicast [1024], [0], r4, r10    // MC
WAIT:   mov.b64 r6, 0
        mbarrier.wait [0], r6
        s2r r7, %laneid
        shl.b64 r7, r7, 4
        ldparam r5, out
        mul.i64 r15, r9, {shared}
        add.i64 r5, r5, r15
LOOP:   setp.ge.i64 p1, r7, {shared}
   @p1  bra DONE
        ld.shared.v4.b32 r20, [r7]
        add.i64 r15, r5, r7
        st.global.v4.b32 [r15], r20
        add.i64 r7, r7, 512
        bra LOOP
DONE:   barrier.cluster
        exit
"""


def multicast_expected(K, grid, mask, box_rows, shared=2048) -> np.ndarray:
    t = tensor().view(np.uint8).reshape(ROWS, COLS * 2)
    img = np.zeros((grid, shared), np.uint8)
    for b in range(grid):
        img[b, 0:8] = np.array([mb_word(1, 1, 1, 0)], np.int64).view(np.uint8)
        if mask >> (b % K) & 1:
            r0 = 8 * (b // K)
            box = np.zeros((box_rows, COLS * 2), np.uint8)
            n = max(0, min(box_rows, ROWS - r0))
            box[:n] = t[r0:r0 + n]
            img[b, 1024:1024 + box.size] = box.ravel()
    return img


@pytest.mark.parametrize("K,grid,mask,issuer", [(2, 2, 0b11, 0), (2, 4, 0b11, 1), (4, 4, 0b1010, 0),
                                                (4, 8, 0b0110, 2), (1, 2, 0b1, 0)])
def test_multicast_lands_in_every_block_of_the_mask(K, grid, mask, issuer):
    box_rows = 4
    prog = assemble_checked(multicast_kernel(K, grid, mask, issuer, box_rows))
    res = run_both(prog, {"map": tmap(box_rows), "out": np.zeros(grid * 2048, np.uint8), "t": tensor()})
    want = multicast_expected(K, grid, mask, box_rows)
    for eng, r in res.items():
        got = r.output("out").reshape(grid, 2048)
        assert np.array_equal(got, want), (eng, np.argwhere(got != want)[:8])


# ------------------------------------------------------------------------- a pipeline across a cluster
def pipeline_kernel(rounds: int) -> str:
    """A cluster of two blocks of one warp, one stage at [1024]: in round j each block's producer
    waits until both blocks' consumers freed the stage (its empty barrier [8], two arrivals: one
    local, one remote), then multicasts rows 4 (2j + rank) .. +3 to both blocks; each full barrier
    [0] expects both boxes. The consumer waits for them, copies the stage to out[j][block] and
    frees the stage in both blocks (mbarrier.arrive.remote to ranks 0 and 1)."""
    return f""".kernel pipe
.param map
.param out
.param t
.shared 2048
.launch grid=2 block=32 cluster=2
        s2r r9, %ctaid.x
        s2r r8, %cluster_ctarank
        mov.b64 r1, 1
        mbarrier.init [0], r1
        mov.b64 r1, 2
        mbarrier.init [8], r1
        barrier.cluster
        ldparam r4, map
        ldparam r5, out
        mov.b64 r13, 0                  // round j
        mov.b64 r14, 0                  // phase
        mov.b64 r16, 1024               // bytes a round
        mov.b64 r17, 0
        mov.b64 r18, 1
ROUND:  setp.eq.i64 p0, r13, 0
        xor.b64 r6, r14, 1
   @!p0 mbarrier.wait [8], r6           // both consumers freed the stage
        mbarrier.arrive.expect_tx [0], r16
        mov.b64 r10, 0
        shl.b64 r11, r13, 1
        add.i64 r11, r11, r8
        shl.b64 r11, r11, 2             // rows 4 (2j + rank)
        mov.b64 r12, 3
        shl.b64 r7, r8, 9
        add.i64 r7, r7, 1024
        cp.async.bulk.tensor.2d.multicast [r7], [0], r4, r10
        mbarrier.wait [0], r14
        s2r r7, %laneid
        shl.b64 r7, r7, 4
        shl.b64 r15, r13, 1
        add.i64 r15, r15, r9
        shl.b64 r15, r15, 10
        add.i64 r15, r15, r5
        ld.shared.v4.b32 r20, [r7+1024]
        add.i64 r15, r15, r7
        st.global.v4.b32 [r15], r20
        ld.shared.v4.b32 r20, [r7+1536]
        st.global.v4.b32 [r15+512], r20
        mbarrier.arrive.remote [8], r17    // REMOTE
        mbarrier.arrive.remote [8], r18
        xor.b64 r14, r14, 1
        add.i64 r13, r13, 1
        setp.lt.i64 p1, r13, {rounds}
   @p1  bra ROUND
        barrier.cluster
        exit
"""


def pipeline_expected(rounds: int) -> np.ndarray:
    t = tensor().view(np.uint8).reshape(ROWS, COLS * 2)
    out = np.zeros((rounds, 2, 1024), np.uint8)
    for j in range(rounds):
        for b in range(2):
            out[j, b, :512] = t[8 * j:8 * j + 4].ravel()         # rank 0's box at 1024
            out[j, b, 512:] = t[8 * j + 4:8 * j + 8].ravel()     # rank 1's at 1536
    return out


def test_a_stage_shared_by_multicast_and_freed_by_remote_arrivals():
    rounds = 4
    prog = assemble_checked(pipeline_kernel(rounds))
    args = {"map": tmap(4), "out": np.zeros(rounds * 2048, np.uint8), "t": tensor()}
    res = run_both(prog, args)
    for eng, r in res.items():
        assert np.array_equal(r.output("out").reshape(rounds, 2, 1024), pipeline_expected(rounds)), eng


def test_the_pipeline_in_a_timing_run():
    rounds = 4
    prog = assemble_checked(pipeline_kernel(rounds))
    args = {"map": tmap(4), "out": np.zeros(rounds * 2048, np.uint8), "t": tensor()}
    t = time_kernel(prog, load_machine("h100"), prog.launch, args)
    assert np.array_equal(t.buffers["out"].reshape(rounds, 2, 1024), pipeline_expected(rounds))
    tma = t.memory["tma"]
    assert tma["copies"] == 2 * rounds and tma["copies_landed"] == 2 * rounds
    assert tma["requests"] == 2 * rounds * 4          # 4 lines a box, read once for both blocks


# ------------------------------------------------------------------------- faults
def fault_kernel(body: str, K=2, grid=2) -> str:
    return f""".kernel f
.param map
.param t
.shared 2048
.launch grid={grid} block=32 cluster={K}
        s2r r8, %cluster_ctarank
        mov.b64 r1, 1
        mbarrier.init [0], r1
        barrier.cluster
        ldparam r4, map
        mov.b64 r10, 0
        mov.b64 r11, 0
{body}
        barrier.cluster
        exit
"""


def faults_both(src: str, marker: str, *fragments):
    """Both engines fault at the line holding `marker` (test_cluster_dsmem.fails_both)."""
    fails_both(assemble_checked(src), {"map": tmap(4), "t": tensor()}, src, marker, *fragments)


@pytest.mark.parametrize("mask,text", [(0, "0x0"), (4, "0x4"), (-1, "-0x1")])
def test_fault_multicast_mask(mask, text):
    src = fault_kernel(f"""        mov.b64 r12, {mask}
        cp.async.bulk.tensor.2d.multicast [1024], [0], r4, r10    // MC""")
    faults_both(src, "// MC", f"TMA multicast mask {text} names no block or a rank outside the cluster's 2 blocks")


def test_fault_multicast_to_an_uninitialised_barrier():
    src = fault_kernel("""        mov.b64 r12, 3
        cp.async.bulk.tensor.2d.multicast [1024], [16], r4, r10    // MC""")
    faults_both(src, "// MC", "mbarrier at scratchpad 16 is not initialised")


def test_fault_multicast_to_a_block_that_exited():
    src = fault_kernel("""        setp.ne.i64 p0, r8, 0
   @p0  exit
        mov.b64 r1, 0
LOOP:   add.i64 r1, r1, 1
        setp.lt.i64 p1, r1, 300
   @p1  bra LOOP
        mov.b64 r12, 3
        cp.async.bulk.tensor.2d.multicast [1024], [0], r4, r10    // MC""").replace("        barrier.cluster\n        exit",
                                                                                    "        exit")
    faults_both(src, "// MC", "cluster rank 1, whose block has exited")


@pytest.mark.parametrize("rank,text", [(2, "cluster rank 2, outside the cluster's 2 blocks"),
                                       (-1, "cluster rank -1, outside")])
def test_fault_remote_arrival_outside_the_cluster(rank, text):
    src = fault_kernel(f"""        mov.b64 r12, {rank}
        mbarrier.arrive.remote [0], r12    // RA""")
    faults_both(src, "// RA", text)


def test_fault_remote_arrival_on_an_uninitialised_barrier():
    src = fault_kernel("""        mov.b64 r12, 1
        mbarrier.arrive.remote [24], r12    // RA""")
    faults_both(src, "// RA", "mbarrier at scratchpad 24 is not initialised")


def test_fault_remote_arrival_with_none_pending():
    # rank 0's barrier awaits 128 bytes: its one arrival leaves none pending, so a second one faults
    src = fault_kernel("""        setp.ne.i64 p0, r8, 0
   @p0  bra SKIP
        mov.b64 r12, 128
        mbarrier.expect_tx [0], r12
        mov.b64 r12, 0
        mbarrier.arrive.remote [0], r12
        mbarrier.arrive.remote [0], r12    // RA
SKIP:   nop""")
    faults_both(src, "// RA", "an arrival with none pending")


def test_refused_where_the_machine_lacks_clusters_or_tma():
    src = """.kernel r
.shared 64
        mov.b64 r1, 1
        mbarrier.init [0], r1
        mov.b64 r12, 0
        mbarrier.arrive.remote [0], r12
        exit
"""
    prog = assemble(src)
    with pytest.raises(InputError) as e:
        check_target(prog, capabilities(load_machine("a100")))
    assert "<asm>:4: mbarrier.init: the target a100 has no tma (the tensor memory accelerator" in str(e.value)
    no_clusters = load_machine("h100").model_copy(update={"clusters": None})
    with pytest.raises(InputError) as e:
        check_target(prog, capabilities(no_clusters))
    assert "<asm>:6: mbarrier.arrive.remote: the target h100 has no cluster_tma (a TMA unit and thread-block " \
        "clusters" in str(e.value)


# ------------------------------------------------------------------------- timing
def timing_kernel(multicast: bool, box_rows: int) -> str:
    """Two blocks of a cluster take the same box: by one multicast from rank 0, or each its own
    copy. out[b] = the cycle block b's wait passed."""
    copy = ("""        setp.ne.i64 p0, r8, 0
        mov.b64 r12, 3
   @!p0 cp.async.bulk.tensor.2d.multicast [1024], [0], r4, r10""" if multicast else
            "        cp.async.bulk.tensor.2d [1024], [0], r4, r10")
    return f""".kernel tm
.param map
.param out
.param t
.shared {1024 + box_rows * 128}
.launch grid=2 block=32 cluster=2
        s2r r9, %ctaid.x
        s2r r8, %cluster_ctarank
        mov.b64 r1, 1
        mbarrier.init [0], r1
        mov.b64 r3, {box_rows * 128}
        mbarrier.arrive.expect_tx [0], r3
        barrier.cluster
        ldparam r4, map
        mov.b64 r10, 0
        mov.b64 r11, 0
{copy}
        mov.b64 r6, 0
        mbarrier.wait [0], r6
        s2r r7, %clock
        ldparam r5, out
        shl.b64 r9, r9, 3
        add.i64 r5, r5, r9
        st.global.b64 [r5], r7
        barrier.cluster
        exit
"""


def test_a_multicast_reads_l2_once_and_lands_in_both_blocks():
    h100 = load_machine("h100")
    rows = 32
    out = {}
    for mc in (False, True):
        prog = assemble_checked(timing_kernel(mc, rows))
        args = {"map": tmap(rows), "out": np.zeros(2, np.int64), "t": tensor()}
        out[mc] = time_kernel(prog, h100, prog.launch, args)
    uni, mc = out[False].memory["tma"], out[True].memory["tma"]
    assert uni["requests"] == 2 * rows and uni["copies"] == 2
    assert mc["requests"] == rows and mc["copies"] == 1 and mc["copies_landed"] == 1
    t0, t1 = out[True].buffers["out"]
    assert abs(int(t0) - int(t1)) < 50                # both blocks' bytes land with the issuer's replies


def test_a_remote_arrival_lands_after_the_networks_latency():
    h100 = load_machine("h100")
    src = """.kernel ra
.param out
.shared 1024
.launch grid=2 block=32 cluster=2
        s2r r8, %cluster_ctarank
        mov.b64 r1, 1
        mbarrier.init [0], r1
        barrier.cluster
        ldparam r5, out
        setp.ne.i64 p0, r8, 0
   @p0  bra WAITER
        mov.b64 r12, 1
        s2r r7, %clock
        mbarrier.arrive.remote [0], r12
        st.global.b64 [r5], r7
        bra END
WAITER: mov.b64 r6, 0
        mbarrier.wait [0], r6
        s2r r7, %clock
        st.global.b64 [r5+8], r7
END:    barrier.cluster
        exit
"""
    prog = assemble_checked(src)
    t = time_kernel(prog, h100, prog.launch, {"out": np.zeros(2, np.int64)})
    sent, seen = (int(v) for v in t.buffers["out"])
    lat = h100.clusters.dsmem_latency_cycles
    assert lat <= seen - sent <= lat + 40, (sent, seen)
    from archsim.engine.names import STALL_NAMES
    stalls = dict(zip(STALL_NAMES, t.stall.sum(0).tolist()))
    assert stalls["barrier"] >= lat and stalls["long_scoreboard"] == 0   # waiting on an arrival, not on bytes


def test_a_multicast_that_leaves_out_its_issuer_in_a_timing_run():
    # rank 0 copies into rank 1's scratchpad only: rank 1's wait holds for the bytes, rank 0's
    # barrier counts nothing (its own arrival completes its phase)
    h100 = load_machine("h100")
    rows = 8
    src = timing_kernel(True, rows).replace("mov.b64 r12, 3", "mov.b64 r12, 2").replace(
        "        mov.b64 r3, {}\n".format(rows * 128),
        "        mov.b64 r3, {}\n        mul.i64 r3, r3, r8\n".format(rows * 128))
    prog = assemble_checked(src)
    t = time_kernel(prog, h100, prog.launch, {"map": tmap(rows), "out": np.zeros(2, np.int64), "t": tensor()})
    tma = t.memory["tma"]
    assert tma["copies"] == 1 == tma["copies_landed"] and tma["requests"] == rows
    t0, t1 = (int(v) for v in t.buffers["out"])
    assert t1 - t0 >= h100.tma.startup_cycles      # rank 1 waited for the bytes, rank 0 did not
