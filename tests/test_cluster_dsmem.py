"""Thread-block clusters on both functional engines: the numba interpreter and its Python twin
(archsim/engine/reference.py), against numpy / Python oracles written from isa/README.md ("Machine
state seen by a kernel": thread-block clusters; the special registers %cluster_ctarank and
%cluster_nctarank; the `clusterbar` and `dsld` / `dsst` rows). Every case runs on both engines;
results must equal the oracle and each other (memory image, registers, predicates,
warp-instructions), faults and deadlocks must name the same rule at the same instruction.

(tests/test_cluster.py holds the multi-device cluster networks, an unrelated subject.)"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.functional import run_functional
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble, disassemble
from archsim.isa.check import check_program, check_target
from archsim.isa.program import Launch
from engine_pair import ENGINES, copy_args, run_both

WIDTHS = {4: ("b32", "b32"), 8: ("b64", "b64"), 16: ("v4.b32", "v4.b32")}   # access bytes -> (dsmem, ld/st)


# ------------------------------------------------------------------------- running both engines
def kern(body: str, params=(), *, shared=0, grid="2", block="32", cluster=2) -> str:
    head = [".kernel k"] + [f".param {p}" for p in params] + [f".shared {shared}"]
    head.append(f".launch grid={grid} block={block}" + (f" cluster={cluster}" if cluster else ""))
    return "\n".join(head) + "\n" + body


def assemble_checked(src: str):
    prog = assemble(src)
    check_program(prog)
    check_target(prog, capabilities(load_machine("h100")))
    return prog


def line_of(src: str, text: str) -> int:
    hits = [i for i, line in enumerate(src.splitlines(), start=1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def fails_both(prog, args, src: str, marker: str, *fragments, engines=ENGINES) -> dict:
    """Both engines stop with a SimulationError at the line holding `marker`, each naming every fragment."""
    errs = {}
    for eng in engines:
        with pytest.raises(SimulationError) as e:
            run_functional(prog, copy_args(args), engine=eng)
        err = e.value
        assert err.where == f"<asm>:{line_of(src, marker)}", (eng, err.where, err.what)
        for f in fragments:
            assert f in err.what, (eng, f, err.what)
        assert err.partial is not None
        errs[eng] = err.what
    return errs


# ------------------------------------------------------------------------- special registers
@pytest.mark.parametrize("grid,cluster", [("4,2", 2), ("4,2", 4), ("6", 3), ("3", 0), ("4", 1)])
def test_cluster_specials(grid, cluster):
    src = kern("""
        s2r r0, %ctaid.x
        s2r r1, %ctaid.y
        s2r r2, %nctaid.x
        mad.i64 r3, r1, r2, r0          // linear block id b
        s2r r4, %cluster_ctarank
        s2r r5, %cluster_nctarank
        s2r r6, %tid.x
        setp.ne.i64 p0, r6, 0
   @p0  exit
        ldparam r7, out
        shl.b64 r8, r3, 4
        add.i64 r7, r7, r8
        st.global.b64 [r7], r4
        st.global.b64 [r7+8], r5
        exit
""", ("out",), grid=grid, block="40", cluster=cluster)
    prog = assemble_checked(src)
    nb = int(np.prod([int(g) for g in grid.split(",")]))
    res = run_both(prog, dict(out=np.full(2 * nb, -7, np.int64)))["numba"]
    N = cluster or 1
    b = np.arange(nb)
    want = np.stack([b % N, np.full(nb, N)], axis=1).ravel()
    assert np.array_equal(res.output("out"), want)
    # every lane of every warp read the specials (warp 1 of each block: lanes 0..7 live)
    wpb = 2
    ranks = res.regs[:, 4, 0].reshape(nb, wpb)
    assert np.array_equal(ranks, np.repeat((b % N)[:, None], wpb, axis=1))
    assert np.all(res.regs[:, 5, 0] == N)


# ------------------------------------------------------------------------- exchanging data: ld.dsmem
OFF = 16    # scratchpad bytes before the exchanged data (the memory operand's immediate)


def _slice_load(n: int, gw: str) -> str:
    """Thread t of block b loads its n bytes of src, at (b * ntid + t) * n, into r8; r0..r4 hold
    tid, ctaid, cluster rank, cluster size and ntid."""
    return f"""        s2r r0, %tid.x
        s2r r1, %ctaid.x
        s2r r2, %cluster_ctarank
        s2r r3, %cluster_nctarank
        s2r r4, %ntid.x
        mad.i64 r5, r1, r4, r0          // global thread id
        mul.i64 r6, r5, {n}
        ldparam r7, src
        add.i64 r7, r7, r6
        ld.global.{gw} r8, [r7]
"""


def load_kernel(n: int, N: int, grid: int, T: int, lane_step: int) -> str:
    """Each block copies its slice of src (T threads x n bytes) into its scratchpad at OFF, then after
    barrier.cluster thread t reads n bytes at OFF + t*n of cluster rank (ctarank + lane_step*t + 1) % N
    and stores them to out; a last barrier.cluster keeps every scratchpad alive until all have read."""
    ds, gw = WIDTHS[n]
    return kern(f"""
{_slice_load(n, gw)}        mul.i64 r20, r0, {n}
        st.shared.{gw} [r20+{OFF}], r8
        barrier.cluster
        mul.i64 r21, r0, {lane_step}
        add.i64 r21, r21, r2
        add.i64 r21, r21, 1
        rem.i64 r21, r21, r3            // the rank this lane reads
        ld.dsmem.{ds} r12, [r20+{OFF}], r21
        ldparam r22, out
        add.i64 r22, r22, r6
        st.global.{gw} [r22], r12
        barrier.cluster
        exit
""", ("src", "out"), shared=OFF + T * n, grid=str(grid), block=str(T), cluster=N)


def oracle_load(src: np.ndarray, n: int, N: int, grid: int, T: int, lane_step: int) -> np.ndarray:
    s = src.reshape(grid, T, n)
    out = np.empty_like(s)
    for b in range(grid):
        for t in range(T):
            rank = (b % N + lane_step * t + 1) % N
            out[b, t] = s[(b // N) * N + rank, t]
    return out.ravel()


@pytest.mark.parametrize("N,grid,lane_step", [(2, 4, 0), (4, 4, 0), (4, 8, 1), (2, 2, 1)])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_ld_dsmem_exchange(n, N, grid, lane_step):
    T = 48        # two warps, the second partly live: barrier.cluster counts every warp of every block
    src = load_kernel(n, N, grid, T, lane_step)
    prog = assemble_checked(src)
    data = np.random.default_rng(n * 100 + N).integers(0, 256, grid * T * n, dtype=np.uint8)
    data[::4] |= 0x80                                # high bits set: loads zero-extend
    res = run_both(prog, dict(src=data, out=np.zeros(grid * T * n, np.uint8)))["numba"]
    assert np.array_equal(res.output("out"), oracle_load(data, n, N, grid, T, lane_step)), src
    # registers: zero-extended words (b32 / v4: 4 bytes each, b64: 8 bytes)
    want = oracle_load(data, n, N, grid, T, lane_step).reshape(grid, T, n)
    regs = res.regs.reshape(grid, 2, -1, 32).transpose(0, 1, 3, 2).reshape(grid, 64, -1)[:, :T]  # [b, t, reg]
    if n == 8:
        assert np.array_equal(regs[:, :, 12], want.view("<i8")[..., 0])
    else:
        words = want.view("<u4").astype(np.int64)
        for j in range(n // 4):
            assert np.array_equal(regs[:, :, 12 + j], words[..., j])


def test_ld_dsmem_own_rank_and_cluster_of_one():
    """Rank = %cluster_ctarank reaches the block's own scratchpad; without clusters that is rank 0."""
    src = kern("""
        s2r r0, %tid.x
        s2r r1, %ctaid.x
        s2r r2, %cluster_ctarank
        shl.b64 r3, r0, 3
        mad.i64 r4, r1, 1000, r0
        st.shared.b64 [r3], r4
        ld.dsmem.b64 r5, [r3], r2
        ldparam r6, out
        s2r r7, %ntid.x
        mad.i64 r8, r1, r7, r0
        shl.b64 r8, r8, 3
        add.i64 r6, r6, r8
        st.global.b64 [r6], r5
        exit
""", ("out",), shared=256, grid="3", block="32", cluster=0)
    prog = assemble_checked(src)
    res = run_both(prog, dict(out=np.zeros(96, np.int64)))["numba"]
    assert np.array_equal(res.output("out"), (np.arange(3)[:, None] * 1000 + np.arange(32)).ravel())


# ------------------------------------------------------------------------- st.dsmem into a peer
def store_kernel(n: int, N: int, grid: int, T: int, lane_step: int) -> str:
    """Thread t of rank q stores its n bytes of src into slot q*T + t (at OFF) of the scratchpad of
    rank (q + lane_step*t + 1) % N; after barrier.cluster each block dumps its own scratchpad."""
    ds, gw = WIDTHS[n]
    dump = "\n".join(f"""
        ld.shared.{gw} r8, [r20+{OFF + j * T * n}]
        st.global.{gw} [r23+{j * T * n}], r8""" for j in range(N))
    return kern(f"""
{_slice_load(n, gw)}        mul.i64 r21, r0, {lane_step}
        add.i64 r21, r21, r2
        add.i64 r21, r21, 1
        rem.i64 r21, r21, r3            // the rank this lane writes to
        mad.i64 r22, r2, r4, r0         // slot q*T + t
        mul.i64 r22, r22, {n}
        st.dsmem.{ds} [r22+{OFF}], r8, r21
        barrier.cluster
        mul.i64 r20, r0, {n}
        mul.i64 r23, r1, {N * T * n}
        ldparam r24, out
        add.i64 r23, r23, r24
        add.i64 r23, r23, r20{dump}
        exit
""", ("src", "out"), shared=OFF + N * T * n, grid=str(grid), block=str(T), cluster=N)


def oracle_store(src: np.ndarray, n: int, N: int, grid: int, T: int, lane_step: int) -> np.ndarray:
    s = src.reshape(grid, T, n)
    spad = np.zeros((grid, N * T, n), np.uint8)
    for b in range(grid):
        q = b % N
        for t in range(T):
            target = (b // N) * N + (q + lane_step * t + 1) % N
            spad[target, q * T + t] = s[b, t]
    return spad.ravel()


@pytest.mark.parametrize("N,grid,lane_step", [(2, 2, 0), (4, 8, 0), (4, 4, 1)])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_st_dsmem_then_barrier_then_own_scratchpad(n, N, grid, lane_step):
    T = 40
    src = store_kernel(n, N, grid, T, lane_step)
    prog = assemble_checked(src)
    data = np.random.default_rng(7 * n + N).integers(0, 256, grid * T * n, dtype=np.uint8)
    res = run_both(prog, dict(src=data, out=np.zeros(grid * N * T * n, np.uint8)))["numba"]
    assert np.array_equal(res.output("out"), oracle_store(data, n, N, grid, T, lane_step))


def test_st_dsmem_stores_the_low_bytes_and_the_highest_lane_wins():
    """st.dsmem.b32 writes the low 4 bytes of a 64-bit register; lanes writing one address: the
    highest lane's value stays (as st.shared)."""
    src = kern("""
        s2r r0, %laneid
        s2r r2, %cluster_ctarank
        xor.b64 r3, r2, 1               // the peer
        mov.b64 r4, 0x1122334455667700
        add.i64 r4, r4, r0
        mov.b64 r5, 0
        st.dsmem.b32 [r5+8], r4, r3     // every lane: the same address
        barrier.cluster
        ld.shared.b64 r6, [8]
        exit
""", (), shared=16, grid="2", block="32", cluster=2)
    res = run_both(assemble_checked(src), {})["numba"]
    assert np.all(res.regs[:, 6, :] == 0x5566771F)


# ------------------------------------------------------------------------- barrier.cluster guards
def test_guarded_barrier_cluster():
    """A fully guarded-off barrier.cluster is no arrival; one active lane is a warp's arrival. Rank 0
    arrives at the second barrier (the first is guarded off there), the others at the first: that
    is one cluster-wide barrier; the reads after it see every block's scratchpad."""
    src = kern("""
        s2r r0, %laneid
        s2r r1, %ctaid.x
        s2r r2, %cluster_ctarank
        s2r r3, %cluster_nctarank
        s2r r9, %warpid
        shl.b64 r4, r0, 3
        mad.i64 r5, r1, 100, r0
        st.shared.b64 [r4], r5
        setp.ne.i64 p0, r2, 0
        setp.eq.i64 p1, r0, 5
        and.pred p2, p0, p1                 // rank != 0: lane 5 only
        not.pred p3, p0
   @p2  barrier.cluster
   @p3  barrier.cluster
        add.i64 r6, r2, 1
        rem.i64 r6, r6, r3
        ld.dsmem.b64 r7, [r4], r6
        setp.lt.i64 p4, r0, 0           // false in every lane
   @p4  barrier.cluster
        barrier.cluster
        exit
""", (), shared=256, grid="6", block="64", cluster=3)
    res = run_both(assemble_checked(src), {})["numba"]
    b = np.arange(6)
    peer = (b // 3) * 3 + (b % 3 + 1) % 3
    want = peer[:, None, None] * 100 + np.arange(32)[None, None, :]
    assert np.array_equal(res.regs[:, 7, :].reshape(6, 2, 32), np.broadcast_to(want, (6, 2, 32)))
    # every warp issues every instruction (guarded-off ones too): 21 per warp
    assert res.warp_instructions == 12 * 21


def test_barrier_cluster_waits_for_the_whole_cluster_only():
    """Clusters are independent: cluster 1 passes its barriers and exits while cluster 0 still spins
    (longer than a scheduling quantum) before its first barrier, which cluster 1's exit must not
    deadlock; each block reads its peer's data after the barrier."""
    src = kern("""
        s2r r0, %laneid
        s2r r1, %ctaid.x
        s2r r2, %cluster_ctarank
        shl.b64 r4, r0, 3
        setp.ge.i64 p0, r1, 2
   @p0  bra WRITE
        mov.b64 r10, 0
LOOP:   add.i64 r10, r10, 1             // cluster 0 spins a while before writing
        setp.lt.i64 p1, r10, 200
   @p1  bra LOOP
WRITE:  mad.i64 r5, r1, 100, r0
        st.shared.b64 [r4], r5
        barrier.cluster
        xor.b64 r6, r2, 1
        ld.dsmem.b64 r7, [r4], r6
        barrier.cluster
        exit
""", (), shared=256, grid="4", block="32", cluster=2)
    res = run_both(assemble_checked(src), {})["numba"]
    assert np.array_equal(res.regs[:, 7, :], (np.arange(4) ^ 1)[:, None] * 100 + np.arange(32))


# ------------------------------------------------------------------------- faults
FAULT_BODY = """
        s2r r0, %laneid
        s2r r2, %cluster_ctarank
        xor.b64 r3, r2, 1               // the peer
        shl.b64 r4, r0, 4               // a good address (aligned for every width)
        mov.b64 r5, {bad}
        setp.eq.i64 p0, r0, {lane}
        selp.b64 r3, r5, r3, p0{fix}
        barrier.cluster
        {op}
        barrier.cluster
        exit
"""


def fault_case(op: str, *, bad_rank=None, bad_addr=None, lane=3, also=""):
    """A kernel in which lane `lane` of every warp has a bad rank (r3) or a bad address (r4)."""
    if bad_rank is not None:
        body = FAULT_BODY.format(bad=bad_rank, lane=lane, fix=also, op=op)
    else:
        body = FAULT_BODY.format(bad=bad_addr, lane=lane, fix=also, op=op).replace(
            "selp.b64 r3, r5, r3, p0", "selp.b64 r4, r5, r4, p0")
    return kern(body, (), shared=512, grid="4", block="32", cluster=2)


DS_OPS = ["ld.dsmem.b64 r6, [r4], r3", "st.dsmem.b64 [r4], r0, r3", "ld.dsmem.v4.b32 r8, [r4], r3",
          "st.dsmem.b32 [r4], r0, r3"]


@pytest.mark.parametrize("op", DS_OPS)
@pytest.mark.parametrize("rank", [-1, 2, 1 << 40])
def test_fault_rank_outside_the_cluster(op, rank):
    src = fault_case(op, bad_rank=rank)
    errs = fails_both(assemble_checked(src), {}, src, op, "block 0 warp 0 lane 3:",
                      f"distributed shared memory access to cluster rank {rank}, outside the cluster's 2 blocks")
    assert errs["numba"] == errs["reference"]


@pytest.mark.parametrize("op", DS_OPS)
@pytest.mark.parametrize("addr", [512, -16, 1 << 20])      # aligned for every width, outside 0 .. 511
def test_fault_out_of_bounds(op, addr):
    src = fault_case(op, bad_addr=addr)
    fails_both(assemble_checked(src), {}, src, op, "block 0 warp 0 lane 3:", "outside")


@pytest.mark.parametrize("op,addr", [(DS_OPS[0], 4), (DS_OPS[1], 12), (DS_OPS[2], 8), (DS_OPS[3], 2)])
def test_fault_misaligned(op, addr):
    src = fault_case(op, bad_addr=addr)
    fails_both(assemble_checked(src), {}, src, op, "block 0 warp 0 lane 3:", "aligned")


def test_fault_bounds_before_alignment():
    """16 bytes at 504 of 512 are both outside and misaligned: the bounds fault (as ld.shared)."""
    op = DS_OPS[2]
    src = fault_case(op, bad_addr=504)
    fails_both(assemble_checked(src), {}, src, op, "block 0 warp 0 lane 3:", "outside")


def test_fault_order_rank_before_bounds_and_lane_order():
    """One lane with a bad rank and a bad address: the rank fault; a lower lane with only a bad
    address faults first (lanes in order, each checked rank, exited, bounds)."""
    op = DS_OPS[0]
    src = fault_case(op, bad_rank=5, also="\n        selp.b64 r4, r5, r4, p0   // lane 3: address 5 too")
    fails_both(assemble_checked(src), {}, src, op, "lane 3:", "cluster rank 5")
    src = fault_case(op, bad_rank=5, also="\n        setp.eq.i64 p1, r0, 2\n        mov.b64 r11, 4\n"
                                          "        selp.b64 r4, r11, r4, p1   // lane 2: misaligned")
    fails_both(assemble_checked(src), {}, src, op, "block 0 warp 0 lane 2:", "aligned")


def test_guarded_off_lanes_do_not_fault():
    src = fault_case("@!p0 ld.dsmem.b64 r6, [r4], r3", bad_rank=-1)   # p0: lane 3 only
    res = run_both(assemble_checked(src), {})["numba"]
    assert np.all(res.regs[:, 6, 3] == 0)


EXITED_PEER = """
        s2r r0, %laneid
        s2r r2, %cluster_ctarank
        s2r r9, %warpid
        setp.eq.i64 p0, r2, 1
        setp.eq.i64 p2, r9, 0
        and.pred p3, p0, p2
   @p3  exit                            // rank 1, warp 0: leaves at once
        mov.b64 r10, 0
LOOP:   add.i64 r10, r10, 1             // everyone else spins (longer than a scheduling quantum)
        setp.lt.i64 p1, r10, {spin}
   @p1  bra LOOP
   @p0  exit                            // rank 1's other warps leave after spinning
        shl.b64 r4, r0, 3
        mov.b64 r3, 1
        ld.dsmem.b64 r6, [r4], r3
        exit
"""


# isa/README.md (`dsld` / `dsst`): "a block of the cluster that has exited, is a fault"
EXITED_ENGINES = ["numba", "reference"]


@pytest.mark.parametrize("eng", EXITED_ENGINES)
def test_fault_peer_block_exited(eng):
    """Rank 1's block (one warp) exits at once; rank 0 then reads its scratchpad."""
    src = kern(EXITED_PEER.format(spin=400), (), shared=256, grid="2", block="32", cluster=2)
    try:
        fails_both(assemble_checked(src), {}, src, "ld.dsmem.b64", "block 0 warp 0 lane 0:",
                   "distributed shared memory access to cluster rank 1, whose block has exited", engines=(eng,))
    except pytest.fail.Exception as e:       # "DID NOT RAISE": report it as the discrepancy
        raise AssertionError(str(e)) from None


def test_peer_block_with_a_live_warp_has_not_exited():
    """Rank 1's warp 0 exits at once but its warp 1 spins longer than rank 0 waits: the block has not
    exited, so the read is fine (functional runs keep every block resident)."""
    src = kern(EXITED_PEER.format(spin=400).replace("setp.lt.i64 p1, r10, 400",
                                                    "mov.b64 r12, 2000\n        selp.b64 r11, r12, 400, p0\n"
                                                    "        setp.lt.i64 p1, r10, r11"),
               (), shared=256, grid="2", block="64", cluster=2)
    res = run_both(assemble_checked(src), {})["numba"]
    assert np.all(res.regs[:2, 6, :] == 0)


@pytest.mark.parametrize("eng", EXITED_ENGINES)
def test_fault_reading_after_the_peer_left_without_a_last_barrier(eng):
    """Without a barrier.cluster before exit, a block that finished may be gone when its peer reads:
    block 0 (scheduled first) reads and exits, then block 1 reads block 0's scratchpad."""
    src = kern("""
        s2r r0, %laneid
        s2r r2, %cluster_ctarank
        shl.b64 r4, r0, 3
        st.shared.b64 [r4], r0
        barrier.cluster
        xor.b64 r3, r2, 1
        ld.dsmem.b64 r6, [r4], r3
        exit
""", (), shared=256, grid="2", block="32", cluster=2)
    try:
        fails_both(assemble_checked(src), {}, src, "ld.dsmem.b64", "block 1 warp 0 lane 0:",
                   "cluster rank 0, whose block has exited", engines=(eng,))
    except pytest.fail.Exception as e:
        raise AssertionError(str(e)) from None


# ------------------------------------------------------------------------- deadlock
def test_deadlock_when_a_warp_of_the_cluster_exited():
    src = kern("""
        s2r r1, %ctaid.x
        s2r r9, %warpid
        setp.eq.i64 p0, r1, 1
        setp.eq.i64 p1, r9, 1
        and.pred p2, p0, p1
   @p2  exit                            // block 1, warp 1
        barrier.cluster
        exit
""", (), grid="4", block="64", cluster=2)
    errs = fails_both(assemble_checked(src), {}, src, "barrier.cluster", "deadlock: block ",
                      "waits at barrier.cluster forever", "warp(s) of block(s) [1] of the cluster already exited")
    assert errs["numba"] == errs["reference"], errs


def test_deadlock_when_a_whole_block_of_the_cluster_exited():
    src = kern("""
        s2r r2, %cluster_ctarank
        setp.eq.i64 p0, r2, 2
   @p0  exit
        barrier.cluster
        exit
""", (), grid="3", block="32", cluster=3)
    errs = fails_both(assemble_checked(src), {}, src, "barrier.cluster", "deadlock: block ",
                      "waits at barrier.cluster forever", "block(s) [2]")
    assert errs["numba"] == errs["reference"], errs


def test_block_barrier_and_cluster_barrier_do_not_mix():
    """bar.sync and barrier.cluster are different barriers: warp 0 at one, warp 1 at the other,
    never meet (the checker would refuse the unbalanced bar.sync; the engines run it anyway)."""
    src = kern("""
        s2r r9, %warpid
        setp.eq.i64 p0, r9, 1
   @p0  bra CL
        bar.sync
        exit
CL:     barrier.cluster
        exit
""", (), grid="2", block="64", cluster=2)
    prog = assemble(src)
    for eng in ENGINES:
        with pytest.raises(SimulationError) as e:
            run_functional(prog, {}, engine=eng)
        assert "deadlock" in e.value.what, (eng, e.value.what)


# ------------------------------------------------------------------------- assembler, disassembler, launch
def test_launch_cluster_directive_and_disassembly():
    src = kern("        barrier.cluster\n        exit\n", grid="8,2", block="32", cluster=4)
    prog = assemble_checked(src)
    assert prog.launch == Launch((8, 2, 1), (32, 1, 1), cluster=4)
    text = disassemble(prog)
    assert ".launch grid=8,2 block=32 cluster=4" in text.splitlines()
    again = assemble(text)
    assert again.launch.cluster == 4 and disassemble(again) == text
    plain = disassemble(assemble(kern("        exit\n", cluster=0)))
    assert "cluster=" not in plain
    assert assemble(kern("        exit\n", cluster=1)).launch.cluster == 1


@pytest.mark.parametrize("grid,cluster", [("6", 4), ("3,4", 2), ("2", 0)])
def test_launch_cluster_must_divide_grid_x(grid, cluster):
    src = kern("        exit\n", grid=grid, cluster=None)
    src = src.replace(f".launch grid={grid} block=32", f".launch grid={grid} block=32 cluster={cluster}")
    with pytest.raises(InputError):
        assemble(src)


def test_cluster_ops_need_a_machine_with_clusters():
    prog = assemble(kern("        barrier.cluster\n        exit\n"))
    check_target(prog, capabilities(load_machine("h100")))
    with pytest.raises(InputError, match="cluster"):
        check_target(prog, capabilities(load_machine("a100")))


def test_launch_argument_overrides_the_directive():
    """A Launch passed to the run sets the cluster size (here 4 instead of the directive's 2)."""
    src = kern("""
        s2r r4, %cluster_ctarank
        s2r r5, %cluster_nctarank
        exit
""", grid="4", block="32", cluster=2)
    res = run_both(assemble_checked(src), {}, Launch((4, 1, 1), (32, 1, 1), cluster=4))["numba"]
    assert np.array_equal(res.regs[:, 4, 0], np.arange(4)) and np.all(res.regs[:, 5, 0] == 4)


@pytest.mark.parametrize("eng", ["numba", "reference"])
@pytest.mark.parametrize("cluster", [2, 0])
def test_a_launch_whose_cluster_does_not_divide_grid_x_is_refused(eng, cluster):
    """A Launch built in Python (no assembler check) with cluster not dividing grid x: an input error."""
    src = kern("""
        s2r r0, %laneid
        shl.b64 r1, r0, 3
        mov.b64 r3, 1
        barrier.cluster
        ld.dsmem.b64 r6, [r1], r3
        barrier.cluster
        exit
""", (), shared=256, grid="4", block="32", cluster=2)
    with pytest.raises(InputError, match="cluster"):
        run_functional(assemble_checked(src), {}, Launch((3, 1, 1), (32, 1, 1), cluster=cluster), engine=eng)
