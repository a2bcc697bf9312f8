"""The instruction counter (engine/counts.py) against the timing engine: every block's and every
instruction's warp-instructions, exactly, on the built-in kernels of the tiny configs."""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine import timing as TI
from archsim.engine.counts import control_slice, count_launch
from archsim.engine.launch import Unbacked
from archsim.isa.asm import assemble
from archsim.isa.program import Launch
from archsim.runner import distinct_kernels, emit_block, timing_args
from archsim.workloads.model import load_workload


def _timed(prog, machine, launch, args):
    run = TI.start_kernel(prog, machine, launch, args)
    run.advance(10**9)
    run.finish(10**9)
    return run


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_counts_equal_the_timing_engines_issues_on_every_kernel_of_a_block(hw):
    machine = load_machine(hw)
    wl = load_workload("gpt2-small", {"phase": "prefill", "layers": 1, "seq": 64, "batch": 1})
    counted = 0
    for k, _ in distinct_kernels(emit_block(machine, wl)):
        args = timing_args(machine, k.params)
        counts, why = count_launch(k.program, k.launch, TI.param_values(k.program, args), machine.cores.warp_width)
        assert counts is not None, f"{k.name}: {why}"
        run = _timed(k.program, machine, k.launch, args)
        assert np.array_equal(counts.per_block, run.TS.blk_issued), k.name
        assert np.array_equal(counts.per_pc, run.TS.pc_issued), k.name
        counted += 1
    assert counted >= 6


_HEAD = """.kernel k
.param x
.param n
.launch grid=4 block=64
"""


def _count_to(bound: str, counter: str) -> str:
    """A loop that counts ``counter`` from 0 up to the value in ``bound``, then exits."""
    return f"""        mov.b64 {counter}, 0
LOOP:   add.i64 {counter}, {counter}, 1
        setp.lt.i64 p0, {counter}, {bound}
   @p0  bra LOOP
        exit
"""


def test_a_loop_bound_loaded_from_memory_is_not_countable():
    prog = assemble(_HEAD + """
        ldparam r0, x
        ld.global.b64 r1, [r0]
""" + _count_to("r1", "r2"))
    keep, why, _, _ = control_slice(prog)
    assert keep is None and why == "control flow depends on ld.global.b64 at <asm>:7"


def test_registers_reused_after_a_loop_do_not_enter_the_slice():
    # r1 holds the trip count, then a loaded value: only the first definition reaches the branch
    prog = assemble(_HEAD + """
        ldparam r1, n
        mov.b64 r2, 0
LOOP:   add.i64 r2, r2, 1
        setp.lt.i64 p0, r2, r1
   @p0  bra LOOP
        ldparam r0, x
        ld.global.b64 r1, [r0]
        st.global.b64 [r0], r1
        exit
""")
    keep, why, per_block, _ = control_slice(prog)
    assert keep is not None, why
    assert not per_block
    assert not keep[6] and not keep[7]     # the load and the store are not executed by the counter


def test_divergent_trip_counts_by_block_and_lane():
    prog = assemble(_HEAD + """
        s2r r0, %ctaid.x
        s2r r1, %tid.x
        and.b64 r1, r1, 3            // lane-dependent trips: the warp diverges
        shl.b64 r0, r0, 1
        add.i64 r1, r1, r0           // and block-dependent ones
        mov.b64 r2, 0
LOOP:   setp.ge.i64 p0, r2, r1
   @p0  bra DONE
        add.i64 r2, r2, 1
        ldparam r3, x
        st.global.b64 [r3], r2
        bra LOOP
DONE:   exit
""")
    machine = load_machine("tiny-gpu")
    launch = Launch((4, 1, 1), (64, 1, 1))
    args = {"x": Unbacked(64), "n": 0}
    counts, why = count_launch(prog, launch, TI.param_values(prog, args), 32)
    assert counts is not None, why
    run = _timed(prog, machine, launch, args)
    assert np.array_equal(counts.per_block, run.TS.blk_issued)
    assert np.array_equal(counts.per_pc, run.TS.pc_issued)
    assert len(set(counts.per_block.tolist())) > 1


def test_coreid_is_counted_once_blocks_are_placed_and_clock_never():
    src = _HEAD + """
        s2r r0, %coreid
""" + _count_to("r0", "r2")
    prog = assemble(src)
    machine = load_machine("tiny-gpu")
    launch = Launch((4, 1, 1), (64, 1, 1))
    args = {"x": Unbacked(64), "n": 0}
    params = TI.param_values(prog, args)
    counts, why = count_launch(prog, launch, params, 32)
    assert counts is None and "s2r" in why
    run = _timed(prog, machine, launch, args)
    counts, why = count_launch(prog, launch, params, 32, run.TS.blk_core)
    assert counts is not None, why
    assert np.array_equal(counts.per_block, run.TS.blk_issued)
    clock, why = control_slice(assemble(src.replace("%coreid", "%clock")), placed=True)[:2]
    assert clock is None and "s2r" in why


def test_every_store_to_a_slot_the_slice_reads_is_kept():
    # the store's path exits before the load: another warp's load still sees it (slots are the block's)
    prog = assemble(_HEAD + """
        s2r r0, %tid.x
        setp.lt.i64 p1, r0, 32
   @p1  bra L
        mov.b64 r1, 5
        st.shared.b64 [8], r1
        exit
L:      ld.shared.b64 r2, [8]
""" + _count_to("r2", "r3"))
    keep, why, _, shared = control_slice(prog)
    assert keep is not None, why
    assert keep[3] and keep[4] and shared == 16       # the mov and the store to slot [8]
    copied = assemble(_HEAD + ".shared 64\n        ldparam r5, x\n        mov.b64 r6, 16\n"
                      "        dma.get [0], [r5], r6\n        ld.shared.b64 r2, [8]\n" + _count_to("r2", "r3"))
    keep, why, _, _ = control_slice(copied)
    assert keep is None and "bulk copy" in why
