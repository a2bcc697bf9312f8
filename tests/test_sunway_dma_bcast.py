"""Strided and broadcast DMA on tiny-sunway: ISA, functional semantics, timing.

Strided (`dma.get.s` / `dma.put.s`): `count` blocks of `bsize` bytes whose global starts are
`stride` apart, packed in the LDM; each block is split into pieces at the piece boundaries of its
own global address. Broadcast (`dma.get.bcast.row|column|array`): collective; memory is read once
when the last participant has issued, the data crosses the CPE mesh to every participant's
cluster, and each CPE's dma.wait covers its own copy.
"""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.dma import pieces
from archsim.engine.functional import run_functional
from archsim.engine.timing import Unbacked, buffer_addresses, time_kernel
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def launch(n):
    return Launch((n, 1, 1), (32, 1, 1))


# ----------------------------------------------------------------------------- strided
STRIDED = """.kernel k
.shared 4096
.param a
.param out
.param count
.param bsize
.param stride
.param tout
        s2r r0, %ctaid.x
        ldparam r1, a
        ldparam r2, out
        ldparam r3, count
        ldparam r4, bsize           // r4, r5: the (bsize, stride) pair
        ldparam r5, stride
        ldparam r11, tout
        mov.b64 r6, 0
        mul.i64 r7, r0, 8
        add.i64 r11, r11, r7
        s2r r8, %clock
        dma.get.s [r6], [r1], r3, r4
        dma.wait 0
        s2r r9, %clock
        sub.i64 r9, r9, r8
        st.global.b64 [r11], r9
        mul.i64 r12, r3, r4         // packed bytes: CPE i writes them back at out + i * packed
        mul.i64 r10, r0, r12
        add.i64 r2, r2, r10
        add.i64 r13, r12, 0
        mov.b64 r14, 1
        dma.put.s [r2], [r6], r14, r12
        dma.wait 0
        exit
"""


def strided_prog():
    return assemble(STRIDED, "k.s")


def numpy_strided(a, off, count, bsize, stride):
    return np.concatenate([a[off + i * stride: off + i * stride + bsize] for i in range(count)])


@pytest.mark.parametrize("count,bsize,stride", [(3, 8, 24), (4, 100, 300), (2, 128, 128), (5, 16, 8), (1, 40, 0)])
def test_strided_get_packs_blocks_as_numpy_says(sw, count, bsize, stride):
    a = np.random.default_rng(1).integers(0, 255, 4096, dtype=np.uint8)
    prog = strided_prog()
    args = {"a": a, "out": np.zeros(2 * count * bsize, np.uint8), "count": count, "bsize": bsize,
            "stride": stride, "tout": np.zeros(2, np.int64)}
    want = numpy_strided(a, 0, count, bsize, stride)
    for eng in ("numba", "reference"):
        r = run_functional(prog, args, launch(2), engine=eng)
        got = r.output("out")
        assert np.array_equal(got, np.concatenate([want, want])), eng
    t = time_kernel(prog, sw, launch(2), args)
    assert np.array_equal(t.buffers["out"], np.concatenate([want, want]))


def test_strided_pieces_and_dram_bytes_follow_the_blocks(sw):
    args = {"a": np.zeros(1 << 15, np.uint8), "out": np.zeros(1 << 12, np.uint8), "count": 4, "bsize": 8,
            "stride": 4096, "tout": np.zeros(2, np.int64)}
    t = time_kernel(strided_prog(), sw, launch(1), args)
    base = buffer_addresses(strided_prog(), args)["a"]
    d = t.memory["dma"]
    assert d["gets"] == 1 and d["puts"] == 1
    assert d["pieces"] == pieces(base, 8, 128, count=4, stride=4096) + pieces(0, 32, 128) == 4 + 1
    assert t.memory["bytes"]["dram_read"] == 32


def test_strided_get_of_adjacent_blocks_is_timed_as_the_contiguous_get(sw):
    def cycles(count, bsize, stride):
        args = {"a": np.zeros(1 << 14, np.uint8), "out": np.zeros(1 << 12, np.uint8), "count": count,
                "bsize": bsize, "stride": stride, "tout": np.zeros(2, np.int64)}
        return int(time_kernel(strided_prog(), sw, launch(1), args).buffers["tout"][0])

    assert cycles(4, 128, 128) == cycles(1, 512, 0)
    assert cycles(4, 8, 1024) > cycles(1, 32, 0)     # four pieces (and DRAM accesses) instead of one


# ----------------------------------------------------------------------------- broadcast
BCAST = """.kernel k
.shared 4096
.param a
.param out
.param tout
.param n
.param quit
        s2r r0, %ctaid.x
        ldparam r10, quit
        setp.eq.i64 p0, r0, r10
   @p0  exit                        // a block that leaves without taking part
        ldparam r1, a
        ldparam r2, out
        ldparam r3, n
        ldparam r11, tout
        mov.b64 r4, 0
        bar.grid                        // every CPE launched (the MPE's launch reaches them apart)
        s2r r8, %clock
        dma.get.bcast.MODE [r4], [r1], r3
        dma.wait 0
        s2r r9, %clock
        sub.i64 r9, r9, r8
        mul.i64 r7, r0, 8
        add.i64 r11, r11, r7
        st.global.b64 [r11], r9
        mul.i64 r7, r0, r3
        add.i64 r2, r2, r7
        dma.put [r2], [r4], r3
        dma.wait 0
        exit
"""


def bcast_run(m, mode, n=8, blocks=16, quit=-1, **kw):
    prog = assemble(BCAST.replace("MODE", mode), "k.s")
    a = np.random.default_rng(7).integers(0, 255, 4096, dtype=np.uint8)
    args = {"a": a, "out": np.zeros(blocks * n, np.uint8), "tout": np.zeros(blocks, np.int64), "n": n, "quit": quit}
    return prog, args, a, time_kernel(prog, m, launch(blocks), args, **kw)


@pytest.mark.parametrize("mode", ["row", "column", "array"])
def test_broadcast_delivers_the_data_to_every_participant_and_reads_memory_once(sw, mode):
    n = 1000
    prog, args, a, t = bcast_run(sw, mode, n)
    want = np.tile(a[:n], 16)
    assert np.array_equal(t.buffers["out"], want)
    for eng in ("numba", "reference"):
        assert np.array_equal(run_functional(prog, args, launch(16), engine=eng).output("out"), want)
    lines = {"row": 4, "column": 4, "array": 1}[mode]
    d = t.memory["dma"]
    assert d["broadcasts"] == lines and d["broadcast_copies"] == 16 and d["gets"] == 16
    assert d["broadcast_bytes_read"] == lines * n
    assert t.memory["bytes"]["dram_read"] == lines * n        # one copy per line from DRAM
    assert t.memory["bytes"]["dma"] == 2 * 16 * n             # every LDM got its copy (and put it back)
    assert t.memory["mesh"]["bytes_delivered"] > 0


def plain_get_latency(m, core, n):
    """Cycles of a plain get of n bytes by CPE `core` alone (the same address as the broadcast)."""
    src = BCAST.replace("dma.get.bcast.MODE", "dma.get")
    a = np.zeros(4096, np.uint8)
    args = {"a": a, "out": np.zeros((core + 1) * n, np.uint8), "tout": np.zeros(core + 1, np.int64), "n": n,
            "quit": -1}
    prog = assemble(src.replace("        s2r r0, %ctaid.x\n", "        s2r r0, %ctaid.x\n        setp.ne.i64 p1, r0, "
                                f"{core}\n   @p1  exit\n"), "k.s")
    return int(time_kernel(prog, m, launch(core + 1), args).buffers["tout"][core])


@pytest.mark.parametrize("mode,last,hops", [
    ("row", 3, {0: 1, 1: 1, 2: 0, 3: 0}),                  # row 0: clusters 0 and 1; CPE 3 joins last
    ("column", 12, {0: 1, 4: 1, 8: 0, 12: 0}),             # column 0: clusters 0 and 2
    ("array", 15, {15: 0, 14: 0, 10: 0, 11: 0, 12: 1, 8: 1, 3: 1, 0: 2}),  # XY tree from cluster 3
])
def test_each_participant_waits_for_its_own_copy_to_cross_the_mesh(sw, mode, last, hops):
    """All CPEs issue in the same cycle, so the last to join is the highest CPE of the line: its
    cluster gets the data when a plain get would; every other cluster one mesh hop (two
    routers + the packet's serialization) per tree level later (array mode: the root sends left
    first, then up, so the cluster above it waits one more link cycle)."""
    from archsim.engine.noc import cpe_mesh_params

    n = 8
    W, L, _ = cpe_mesh_params(sw)
    hop = 2 * L + -(-(8 + n) // W)
    t = bcast_run(sw, mode, n)[3]
    base = int(t.buffers["tout"][last])
    assert abs(base - plain_get_latency(sw, last, n)) <= 2   # (its issue cycle moves the DRAM clock phase)
    for cpe, h in hops.items():
        extra = 1 if (mode == "array" and cpe == 3) else 0
        assert int(t.buffers["tout"][cpe]) == base + h * hop + extra, cpe


def test_partial_lines_at_the_grid_edge_and_early_leavers_are_not_waited_for(sw):
    n = 64
    # 6 blocks: row 1 holds blocks 4 and 5 only; block 1 leaves at once
    prog, args, a, t = bcast_run(sw, "row", n, blocks=6, quit=1)
    out = t.buffers["out"].reshape(6, n)
    for b in (0, 2, 3, 4, 5):
        assert np.array_equal(out[b], a[:n])
    assert t.memory["dma"]["broadcasts"] == 2 and t.memory["dma"]["broadcast_copies"] == 5
    _, _, _, ta = bcast_run(sw, "array", n, blocks=6, quit=1)
    assert ta.memory["dma"]["broadcasts"] == 1 and ta.memory["bytes"]["dram_read"] == n


@pytest.mark.parametrize("mode", ["row", "array"])
def test_broadcast_timing_is_the_same_with_skip_ahead_off(sw, mode):
    a = bcast_run(sw, mode, 700)[3]
    b = bcast_run(sw, mode, 700, skip=False)[3]
    assert a.cycles == b.cycles and np.array_equal(a.buffers["tout"], b.buffers["tout"])
    assert a.memory["dma"] == b.memory["dma"] and a.memory["mesh"] == b.memory["mesh"]
    assert a.skipped_cycles > 0


def test_a_mode_the_machine_lacks_is_a_load_time_error():
    m = load_machine("tiny-sunway", sets=["dma.broadcast_modes=[row]"])
    with pytest.raises(InputError) as e:
        bcast_run(m, "column")
    assert e.value.where == "k.s:19" and "dma.get.bcast.column" in str(e.value) and "row" in e.value.allowed
    bcast_run(m, "row")  # the mode it has runs


def test_participants_that_disagree_stop_with_the_core_and_instruction(sw):
    src = BCAST.replace("        ldparam r3, n\n", "        ldparam r3, n\n        add.i64 r3, r3, r0\n")
    prog = assemble(src.replace("MODE", "row"), "k.s")
    args = {"a": np.zeros(4096, np.uint8), "out": np.zeros(4096, np.uint8), "tout": np.zeros(16, np.int64),
            "n": 8, "quit": -1}
    with pytest.raises(SimulationError) as e:
        time_kernel(prog, sw, launch(16), args)
    assert e.value.where == "k.s:20" and "core 1" in str(e.value) and "differ from those core 0" in str(e.value)


def test_bad_strided_operands_are_faults(sw):
    src = STRIDED.replace("        ldparam r4, bsize", "        ldparam r4, bsize\n        sub.i64 r4, r0, 1")
    args = {"a": np.zeros(4096, np.uint8), "out": np.zeros(4096, np.uint8), "count": 2, "bsize": 8,
            "stride": 8, "tout": np.zeros(2, np.int64)}
    with pytest.raises(SimulationError):
        time_kernel(assemble(src, "k.s"), sw, launch(1), args)          # bsize -1
    args["stride"] = 1 << 20
    with pytest.raises(SimulationError) as e:                            # the last block outside the buffer
        time_kernel(strided_prog(), sw, launch(1), args)
    assert "outside" in str(e.value)


def test_a_fractional_engine_port_rate_is_met_exactly(sw):
    """128-B pieces through a 9.5 B/cycle port take 13.47 cycles each: back-to-back pieces carry
    the fraction over instead of rounding every piece up to 14 cycles (9.14 B/cycle)."""
    from archsim import micro as MI

    slow = load_machine("tiny-sunway", sets=["dma.bytes_per_cycle=9.5"])

    def cycles(size):
        return MI.run_micro("dma", slow, {"size_bytes": size, "cpes": 1, "reps": 1}).kernels[0]["cycles"]

    assert 8192 / (cycles(16384) - cycles(8192)) == pytest.approx(9.5, rel=0.003)
