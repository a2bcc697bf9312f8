"""The numba functional interpreter on its own: run-time faults, deadlocks and limits say where
they stopped (block, warp, lane, source line) and keep the partial state; divergence corner cases."""

import numpy as np
import pytest

from archsim.engine.functional import run_functional
from archsim.errors import SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

ONE = Launch((1, 1, 1), (32, 1, 1))


def run(text, args=None, launch=ONE, **kw):
    return run_functional(assemble(text, "k.s"), args or {}, launch, **kw)


def fails(text, args=None, launch=ONE, **kw):
    with pytest.raises(SimulationError) as e:
        run(text, args, launch, **kw)
    return e.value


def test_global_out_of_bounds_names_lane_and_line():
    e = fails(""".kernel k
.param x
    ldparam r0, x
    s2r r1, %laneid
    shl.b64 r1, r1, 2
    add.i64 r0, r0, r1
    ld.global.b32 r2, [r0+64]
    exit
""", {"x": np.zeros(16, np.float32)})
    assert e.line() == ("k.s:7: block 0 warp 0 lane 0: global access of 4 byte(s) at address 0x10040 "
                        "outside global memory")
    assert e.partial is not None


def test_shared_out_of_bounds_and_misaligned():
    e = fails(".kernel k\n.shared 64\n    mov.b64 r0, 64\n    st.shared.b32 [r0], r0\n    exit\n")
    assert e.line() == "k.s:4: block 0 warp 0 lane 0: scratchpad access of 4 byte(s) at 64 outside the block's 64 bytes"
    e = fails(".kernel k\n.shared 64\n    mov.b64 r0, 2\n    ld.shared.b32 r1, [r0]\n    exit\n")
    assert e.line() == "k.s:4: block 0 warp 0 lane 0: access of 4 byte(s) at address 0x2 is not aligned to its size"


def test_rma_to_missing_block():
    e = fails(""".kernel k
.shared 64
    mov.b64 r0, 0
    mov.b64 r1, 8
    mov.b64 r2, 7
    rma.put [r0], [r0], r1, r2
    exit
""", launch=Launch((2, 1, 1), (32, 1, 1)))
    assert e.line() == "k.s:6: block 0 warp 0 lane 0: RMA to block 7, which does not exist (2 blocks in the launch)"


def test_deadlock_when_a_warp_exits_before_the_barrier():
    e = fails(""".kernel k
    s2r r0, %warpid
    setp.eq.i64 p0, r0, 1
@p0 exit
    bar.sync
    exit
""", launch=Launch((1, 1, 1), (64, 1, 1)))
    assert e.line() == ("k.s:5: deadlock: block 0 warp 0 waits at bar.sync forever; warp(s) 1 of the block "
                        "already exited")


def test_instruction_limit_stops_endless_loops():
    e = fails(".kernel k\nL:  bra L\n", max_instructions=1000)
    assert e.line() == "k.s:2: block 0 warp 0 lane 0: more than 1000 warp-instructions: stopped (a loop that " \
        "never ends? `asm --max-instructions N` raises the limit)"


def test_nested_divergence_reconverges_for_shuffles():
    # lanes split three ways, then a shuffle after the join must see every lane's value
    r = run(""".kernel k
    s2r r0, %laneid
    mov.b64 r1, 0
    setp.lt.i64 p0, r0, 16
@p0 bra LOW
    setp.lt.i64 p1, r0, 24
@p1 bra MID
    mov.b64 r1, 3
    bra JOIN
MID: mov.b64 r1, 2
    bra JOIN
LOW: mov.b64 r1, 1
JOIN: shfl.bfly.b64 r2, r1, 16
    exit
""")
    lane = np.arange(32)
    r1 = np.where(lane < 16, 1, np.where(lane < 24, 2, 3))
    assert np.array_equal(r.regs[0, 1], r1)
    assert np.array_equal(r.regs[0, 2], r1[lane ^ 16])


def test_guarded_exit_inside_loop_still_reconverges():
    # the only way out is a guarded exit: lanes leave one by one, the rest keep reconverging
    r = run(""".kernel k
    s2r r0, %laneid
    mov.b64 r1, 0
    mov.b64 r2, 0
L:  setp.gt.i64 p0, r1, r0
@p0 exit
    add.i64 r1, r1, 1
    setp.lt.i64 p1, r0, 8
@p1 bra SKIP
    add.i64 r2, r2, 1
SKIP: vote.all.pred p2, p1
    bra L
""")
    assert np.array_equal(r.regs[0, 1], np.arange(32) + 1)
    assert np.array_equal(r.regs[0, 2], np.where(np.arange(32) < 8, 0, np.arange(32) + 1))


def test_partial_warp_lanes_never_run():
    r = run(".kernel k\n    mov.b64 r0, 5\n    exit\n", launch=Launch((1, 1, 1), (40, 1, 1)))
    assert np.array_equal(r.regs[1, 0], np.where(np.arange(32) < 8, 5, 0))
    assert r.warp_instructions == 4


def test_same_run_twice_is_identical():
    text = open(__file__.replace("test_functional.py", "../isa/examples/reduce_sum.s")).read()
    from archsim.engine.launch import default_args

    p = assemble(text, "reduce_sum.s")
    a = run_functional(p, default_args(p))
    b = run_functional(p, default_args(p))
    assert np.array_equal(a.memory.data, b.memory.data) and a.warp_instructions == b.warp_instructions


def test_divergent_loop_with_32_trip_counts_does_not_grow_the_stack():
    # lane l runs l+1 trips: every trip some lanes leave; the stack must not grow per trip
    r = run(""".kernel k
    s2r r0, %laneid
    mov.b64 r1, 0
L:  add.i64 r1, r1, 1
    setp.le.i64 p0, r1, r0
@p0 bra L
    shfl.idx.b64 r2, r1, 31
    exit
""")
    assert np.array_equal(r.regs[0, 1], np.arange(32) + 1)
    assert np.all(r.regs[0, 2] == 32)
