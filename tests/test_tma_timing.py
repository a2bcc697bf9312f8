"""Bulk tensor copies (TMA) and transaction barriers on h100's timing model (issue 48 item 2):
formula oracles for the unit's start-up and request rate, waits that last until the bytes land,
stall attribution, the copy's data in a timing run, and one-line deadlocks and faults.

A copy's requests leave the SM's TMA unit tma.startup_cycles after its issue, one 128-byte line a
cycle (tma.requests_per_cycle), and take the SM's miss path to L2 like any L1 bypass. Each
oracle differences two runs, so launch and set-up costs cancel.
"""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.isa.tensor_map import TensorMap, tensor_map_words
from archsim.engine.timing import time_kernel
from archsim.errors import SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

ONE_WARP = Launch((1, 1, 1), (32, 1, 1))
COLS = 64                                        # fp16 tensor of 64 columns: 128-byte rows


def with_tma(machine, **kw):
    return machine.model_copy(update={"tma": machine.tma.model_copy(update=kw)})


def copy_program(rows: int, copies: int = 1, warm: bool = False) -> str:
    """One warp copies a box of ``rows`` x 64 fp16 (rows lines) ``copies`` times into the same
    stage, each waited for; out[0] gets the cycles of the timed copies (warm: one copy first, not
    timed, so the timed ones hit in L2)."""
    warmup = """        mbarrier.arrive.expect_tx [8], r4
        cp.async.bulk.tensor.2d [1024], [8], r2, r10
        mbarrier.wait [8], r12
        xor.b64 r12, r12, 1
""" if warm else ""
    return f""".kernel tcopy
.param map
.param out
.param t
.shared {1024 + rows * 128}
        ldparam r2, map
        ldparam r20, out
        mov.b64 r3, 1
        mbarrier.init [8], r3
        mov.b64 r4, {rows * 128}
        mov.b64 r10, 0
        mov.b64 r11, 0
        mov.b64 r12, 0
{warmup}        s2r r30, %clock
        mov.b64 r5, 0
LOOP:   mbarrier.arrive.expect_tx [8], r4
        cp.async.bulk.tensor.2d [1024], [8], r2, r10
        mbarrier.wait [8], r12
        xor.b64 r12, r12, 1
        add.i64 r5, r5, 1
        setp.lt.i64 p0, r5, {copies}
  @p0   bra LOOP
        s2r r31, %clock
        sub.i64 r31, r31, r30
        st.global.b64 [r20], r31
        exit
"""


def run_copy(machine, rows, copies=1, warm=False, x=None, **kw):
    prog = assemble(copy_program(rows, copies, warm), "tcopy.s")
    args = {"map": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, rows], 128)), "out": np.zeros(1, np.int64),
            "t": np.zeros((256, COLS), np.float16) if x is None else x}
    t = time_kernel(prog, machine, ONE_WARP, args, **kw)
    return t, int(t.buffers["out"][0])


def test_a_copy_waits_out_the_units_start_up(h100):
    # the same copy (of a line L2 holds: DRAM's refresh and row state depend on when a request
    # comes) with and without the start-up: the wait ends exactly that much later
    # (a copy's first request leaves in the cycle after its issue at the earliest)
    _, slow = run_copy(with_tma(h100, startup_cycles=190), 1, warm=True)
    _, fast = run_copy(with_tma(h100, startup_cycles=20), 1, warm=True)
    assert slow - fast == 170


def test_a_copys_rows_leave_one_line_a_cycle(h100):
    # on lines L2 holds (the warm-up copy brought them), each further row of the box costs one
    # cycle of the unit's request rate (a few more where two rows meet in one L2 slice); at two
    # requests a cycle the replies' port (128 B of data a cycle) paces them instead
    t1, one = run_copy(h100, 1, warm=True)
    t16, sixteen = run_copy(h100, 16, warm=True)
    assert 15 <= sixteen - one <= 15 + 4
    assert t16.memory["tma"]["requests"] == 2 * 16 and t16.memory["tma"]["request_bytes"] == 2 * 16 * 128
    _, fast16 = run_copy(with_tma(h100, requests_per_cycle=2), 16, warm=True)
    assert abs(fast16 - sixteen) <= 2


def test_back_to_back_copies_cost_their_round_trips(h100):
    # each copy is waited for before the next issues: n copies take n round trips
    _, two = run_copy(h100, 4, copies=2, warm=True)
    _, four = run_copy(h100, 4, copies=4, warm=True)
    t, _ = run_copy(h100, 4, copies=1, warm=True)
    lat = t.memory["tma"]["latency_min_cycles"]
    assert lat >= h100.tma.startup_cycles
    assert abs((four - two) - 2 * lat) <= 2 * 20    # a round trip plus the loop's few instructions


def test_the_box_lands_in_a_timing_run(h100):
    x = (np.arange(256 * COLS) % 2003).astype(np.float16).reshape(256, COLS)
    prog_rows = 8
    src = copy_program(prog_rows).replace("        exit\n", """        mov.b64 r6, 0
        s2r r7, %laneid
        shl.b64 r7, r7, 3
COPY:   ld.shared.b64 r8, [r7+1024]
        add.i64 r9, r20, r7
        st.global.b64 [r9+8], r8
        add.i64 r7, r7, 256
        setp.lt.i64 p1, r7, 1024
  @p1   bra COPY
        exit
""")
    prog = assemble(src, "tcopy.s")
    args = {"map": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, prog_rows], 128)),
            "out": np.zeros(1 + 128, np.int64), "t": x}
    t = time_kernel(prog, h100, ONE_WARP, args)
    got = t.buffers["out"][1:].view(np.uint8)
    # the box's bytes at their 128-byte-swizzled places (logical ^ ((logical >> 7) & 7) << 4)
    raw = x[:prog_rows].view(np.uint8).reshape(-1)
    want = np.empty_like(raw)
    for a in range(raw.size):
        p = (1024 + a) ^ ((((1024 + a) >> 7) & 7) << 4)
        want[p - 1024] = raw[a]
    assert np.array_equal(got, want)


PRODUCER_CONSUMER = """.kernel pc
.param map
.param t
.shared 4096
        s2r r0, %warpid
        ldparam r2, map
        mov.b64 r3, 1
        mov.b64 r12, 0
        setp.ne.i64 p0, r0, 0
  @p0   bra CONSUMER
        mbarrier.init [8], r3
        bar.sync
{producer}
        exit
CONSUMER:
        bar.sync
        mbarrier.wait [8], r12
        exit
"""
SPIN = """        mov.b64 r5, 0
SPIN:   add.i64 r5, r5, 1
        setp.lt.i64 p1, r5, {n}
  @p1   bra SPIN"""
TMA_ONE = """        mov.b64 r4, 128
        mov.b64 r10, 0
        mov.b64 r11, 0
        mbarrier.arrive.expect_tx [8], r4
        cp.async.bulk.tensor.2d [1024], [8], r2, r10"""


def run_pc(machine, producer):
    prog = assemble(PRODUCER_CONSUMER.format(producer=producer), "pc.s")
    args = {"map": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, 1], 128)), "t": np.zeros((256, COLS), np.float16)}
    return time_kernel(prog, machine, Launch((1, 1, 1), (64, 1, 1)), args)


def stalls(t):
    from archsim.engine.names import STALL_NAMES

    return dict(zip(STALL_NAMES, t.stall[0].tolist()))


def test_a_wait_for_arrivals_is_a_barrier_stall_and_for_bytes_a_memory_one(h100):
    # the consumer waits while the producer spins 200 iterations before it arrives: barrier
    arrive = run_pc(h100, SPIN.format(n=200) + "\n        mbarrier.arrive [8]")
    s = stalls(arrive)
    assert s["barrier"] >= 200 * 4 and s["long_scoreboard"] == 0
    # the producer arrives and copies at once: the consumer waits for the bytes, a memory stall
    copy = run_pc(h100, TMA_ONE)
    s = stalls(copy)
    assert s["long_scoreboard"] >= h100.tma.startup_cycles and s["barrier"] < 50


def test_a_wait_nothing_completes_is_a_one_line_deadlock(h100):
    # count 1, but the producer only adds bytes it never copies: nothing can complete the phase
    with pytest.raises(SimulationError) as e:
        run_pc(h100, "        mov.b64 r4, 64\n        mbarrier.arrive.expect_tx [8], r4")
    msg = str(e.value)
    assert "deadlock" in msg and "waits at mbarrier.wait" in msg and "64 transaction byte(s) pending" in msg
    assert "\n" not in msg and "core 0 warp slot 1" in msg


def test_more_live_barriers_than_the_table_holds_is_a_fault(h100):
    from archsim.engine.warps import MB_SLOTS

    inits = "\n".join(f"        mbarrier.init [{8 * i}], r3" for i in range(MB_SLOTS + 1))
    prog = assemble(f""".kernel many
.param t
.shared 4096
        mov.b64 r3, 1
{inits}
        exit
""", "many.s")
    with pytest.raises(SimulationError) as e:
        time_kernel(prog, h100, ONE_WARP, {"t": np.zeros(4, np.int64)})
    assert f"more than {MB_SLOTS} transaction barriers" in str(e.value)
    assert f"many.s:{MB_SLOTS + 5}" in str(e.value)


def test_a_guarded_off_copy_sends_nothing(h100):
    src = copy_program(4).replace("        cp.async.bulk.tensor.2d [1024], [8], r2, r10\n        mbarrier.wait [8], r12",
                                  "        setp.eq.i64 p3, r5, 99\n  @p3   cp.async.bulk.tensor.2d [1024], [8], r2, r10\n"
                                  "        mbarrier.expect_tx [8], r12")
    src = src.replace("mbarrier.arrive.expect_tx [8], r4", "mbarrier.arrive [8]")
    prog = assemble(src, "off.s")
    args = {"map": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, 4], 128)), "out": np.zeros(1, np.int64),
            "t": np.zeros((256, COLS), np.float16)}
    t = time_kernel(prog, h100, ONE_WARP, args)
    assert t.memory["tma"]["copies"] == 0 and t.memory["tma"]["requests"] == 0


def test_rows_outside_the_tensor_send_no_request(h100):
    # a 16-row box starting 12 rows before the tensor's end: 4 rows inside, 4 requests
    src = copy_program(16).replace("        mov.b64 r11, 0\n", "        mov.b64 r11, 252\n")
    prog = assemble(src, "edge.s")
    args = {"map": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, 16], 128)), "out": np.zeros(1, np.int64),
            "t": np.zeros((256, COLS), np.float16)}
    t = time_kernel(prog, h100, ONE_WARP, args)
    assert t.memory["tma"]["requests"] == 4 and t.memory["tma"]["box_bytes"] == 16 * 128


def test_skipping_idle_cycles_changes_nothing(h100):
    a, ca = run_copy(h100, 8, copies=3)
    b, cb = run_copy(h100, 8, copies=3, skip=False)
    assert (a.cycles, ca) == (b.cycles, cb)


def test_a_copy_counted_before_its_barrier_was_initialised_again_lands_on_nothing(h100):
    # the first copy's bytes belong to the barrier's first life: landing after mbarrier.init
    # counted anew, they must not lower the second life's bytes (a false deadlock before)
    src = """.kernel reinit
.param map1
.param map2
.param t
.shared 32768
        ldparam r2, map1
        ldparam r3, map2
        mov.b64 r1, 1
        mov.b64 r10, 0
        mov.b64 r11, 0
        mov.b64 r12, 0
        mbarrier.init [8], r1
        mov.b64 r4, 128
        mbarrier.arrive.expect_tx [8], r4
        cp.async.bulk.tensor.2d [1024], [8], r2, r10
        mbarrier.init [8], r1
        mov.b64 r4, 8192
        mbarrier.arrive.expect_tx [8], r4
        cp.async.bulk.tensor.2d [2048], [8], r3, r10
        mbarrier.wait [8], r12
        exit
"""
    args = {"map1": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, 1], 128)),
            "map2": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, 64], 128)),
            "t": np.zeros((256, COLS), np.float16)}
    t = time_kernel(assemble(src, "reinit.s"), h100, ONE_WARP, args)
    assert t.memory["tma"]["copies_landed"] == 2
    assert t.cycles >= t.memory["tma"]["latency_max_cycles"]


def test_micro_tma_measures_copies_in_flight(h100):
    from archsim.errors import InputError
    from archsim.micro import run_micro

    one = run_micro("tma", h100, {"cores": "1", "stages": "1", "copies": "4", "box_rows": "8"})
    four = run_micro("tma", h100, {"cores": "1", "stages": "4", "copies": "4", "box_rows": "8"})
    assert one.extra["box_bytes"] == 8 * 64 * 2
    # one copy at a time: a copy's time is its latency; four in flight overlap their round trips
    assert one.extra["cycles_per_copy"] >= one.extra["copy_latency_mean_cycles"] >= h100.tma.startup_cycles
    assert four.value > 2 * one.value
    with pytest.raises(InputError, match="tensor memory accelerator"):
        run_micro("tma", load_machine("a100"), {})
    with pytest.raises(InputError, match="box_cols"):
        run_micro("tma", h100, {"box_cols": "12"})          # 24 bytes: not a multiple of 16


def _guard_program(second: str, guarded: bool) -> str:
    """One warp issues a copy of one line, then ``second`` (a copy on barrier [16], or a store),
    guarded off or not, and reads the clock: out[0] gets the cycles from before the first copy to
    after the second."""
    live = not guarded and "store" not in second
    return f""".kernel tguard
.param map
.param out
.param t
.shared 1152
        ldparam r2, map
        ldparam r20, out
        mov.b64 r3, 1
        mbarrier.init [8], r3
        mbarrier.init [16], r3
        mov.b64 r4, 128
        mov.b64 r10, 0
        mov.b64 r11, 0
        mov.b64 r12, 0
        setp.lt.i64 p1, r10, r12
        mbarrier.arrive.expect_tx [8], r4
        {"mbarrier.arrive.expect_tx [16], r4" if live else ""}
        s2r r30, %clock
        cp.async.bulk.tensor.2d [1024], [8], r2, r10
        {"@p1 " if guarded else ""}{second}
        s2r r31, %clock
        mbarrier.wait [8], r12
        {"mbarrier.wait [16], r12" if live else ""}
        sub.i64 r31, r31, r30
        st.global.b64 [r20], r31
        exit
"""


@pytest.mark.parametrize("second", ["cp.async.bulk.tensor.2d [1024], [16], r2, r10",
                                    "cp.async.bulk.tensor.2d.store [1024], r2, r10"])
def test_a_guarded_off_copy_takes_no_queue_entry(h100, second):
    # a queue of one copy, whose start-up holds it 400 cycles: a second copy (or store) waits
    # for that entry; the same instruction with its guard false (p1: 0 < 0) issues at once
    one = with_tma(h100, queue_depth=1, startup_cycles=400)

    def cycles(guarded):
        prog = assemble(_guard_program(second, guarded), "tguard.s")
        args = {"map": TensorMap("t", tensor_map_words([COLS, 256], 2, [COLS, 1], 128)),
                "out": np.zeros(1, np.int64), "t": np.zeros((256, COLS), np.float16)}
        return int(time_kernel(prog, one, ONE_WARP, args).buffers["out"][0])

    assert cycles(guarded=False) >= 400
    assert cycles(guarded=True) < 100
