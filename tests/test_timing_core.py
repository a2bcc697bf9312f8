"""The GPU timing engine, core side, on tiny-gpu: formula oracles for the pipes, the tensor units
and the scratchpad, the scheduler, skip-ahead invariance and determinism.

Each oracle takes the difference of two runs that differ only in the length of a chain, so the
fixed cost of launching and finishing cancels: (cycles(2n) - cycles(n)) / n is the per-
instruction figure the config implies.
"""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.timing import time_kernel
from archsim.errors import SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

ONE_WARP = Launch((1, 1, 1), (32, 1, 1))


@pytest.fixture(scope="module")
def tiny():
    return load_machine("tiny-gpu")


def kernel(body: str, n: int, shared: int = 0, setup: str = "") -> str:
    """A loop of n iterations around `body`; the loop overhead is the same for every body."""
    return f""".kernel k
.shared {shared}
    mov.b64 r40, 0
    mov.f32 r1, 1.0
    mov.f32 r2, 1.0
    mov.f32 r3, 1.0
    mov.f32 r4, 1.0
    mov.f32 r5, 1.0
    mov.f32 r6, 1.0
    mov.f32 r7, 1.0
    mov.f32 r8, 1.0
    mov.b64 r10, 0
    mov.b64 r11, 0
    mov.b64 r12, 0
    mov.b64 r13, 0
    mov.b64 r14, 0
    mov.b64 r15, 0
    mov.b64 r16, 0
    mov.b64 r17, 0
    mov.b64 r18, 0
    mov.b64 r19, 0
    mov.b64 r20, 0
    mov.b64 r21, 0
    mov.b64 r22, 0
    mov.b64 r23, 0
{setup}
L:  {body}
    add.i64 r40, r40, 1
    setp.lt.i64 p0, r40, {n}
@p0 bra L
    exit
"""


def cycles(machine, text, launch=ONE_WARP, **kw):
    return time_kernel(assemble(text, "k.s"), machine, launch, {}, **kw).cycles


def per_iteration(machine, body, shared=0, setup="", n=64):
    a = cycles(machine, kernel(body, n, shared, setup))
    b = cycles(machine, kernel(body, 2 * n, shared, setup))
    return (b - a) / n


def longer(tiny, unit, k, **kw):
    """Extra cycles per iteration of a body of 2k `unit` instructions over one of k: the loop's own
    overhead (which overlaps the body's tail) cancels."""
    return per_iteration(tiny, "\n    ".join(unit(i) for i in range(2 * k)), **kw) - \
        per_iteration(tiny, "\n    ".join(unit(i) for i in range(k)), **kw)


def test_dependent_ffma_chain_costs_its_latency(tiny):
    pipe = tiny.pipes["fma"]
    assert longer(tiny, lambda i: "fma.f32 r1, r1, r2, r3", 8) == pytest.approx(8 * pipe.latency_cycles, abs=0.5)


def test_independent_ffma_issue_at_the_pipe_rate(tiny):
    pipe = tiny.pipes["fma"]
    ii = -(-tiny.cores.warp_width // pipe.lanes_per_cycle["f32"])
    # eight accumulators rotate; the other sources (r20, r21) are never written
    got = longer(tiny, lambda i: f"fma.f32 r{1 + i % 8}, r{1 + i % 8}, r20, r21", 32)
    assert got == pytest.approx(32 * ii, abs=1.0)


def test_mma_occupies_the_tensor_units_for_its_mac_steps(tiny):
    t = tiny.tensor
    steps = (16 // 4) * (8 // 4) * (16 // 4)
    units = max(t.units_per_core // tiny.cores.subcores, 1)
    busy = max(1, -(-steps // int(t.mac_steps_per_cycle["fp16"] * units)))
    independent = longer(tiny, lambda i: f"mma.m16n8k16.f32.f16 r{10 + 4 * (i % 3)}, r1, r5, r{10 + 4 * (i % 3)}", 6)
    dependent = longer(tiny, lambda i: "mma.m16n8k16.f32.f16 r10, r1, r5, r10", 6)
    assert dependent == pytest.approx(6 * (busy + t.latency_cycles), abs=1.0)
    assert independent == pytest.approx(6 * busy, abs=1.0)


def test_h100_mma_sync_runs_at_its_measured_rate_not_the_peak():
    # measured on an H100 SXM5 (configs/reference/measured/h100-sxm5-gemm-twin.json, mma_rate): a sub-core
    # issues one mma.sync every 6 cycles (m16n8k16 f16 and bf16, m16n8k8 tf32), and a dependent chain takes
    # 24 cycles an instruction; the derived peak stays the units' own (wgmma's) 989 TFLOP/s
    from archsim.config import peak_tflops
    h100 = load_machine("h100")
    setup = "    mov.b64 r24, 0\n    mov.b64 r25, 0"      # the fourth chain's r22..r25
    for op in ("mma.m16n8k16.f32.f16", "mma.m16n8k16.f32.bf16"):
        # four chains cover the latency (24 / 6), as on the chip; two leave it half exposed
        independent = longer(h100, lambda i: f"{op} r{10 + 4 * (i % 4)}, r1, r5, r{10 + 4 * (i % 4)}", 8, setup=setup)
        two = longer(h100, lambda i: f"{op} r{10 + 4 * (i % 2)}, r1, r5, r{10 + 4 * (i % 2)}", 8)
        dependent = longer(h100, lambda i: f"{op} r10, r1, r5, r10", 8)
        assert independent == pytest.approx(8 * 6, abs=1.0)
        assert two == pytest.approx(8 * 12, abs=1.0)
        assert dependent == pytest.approx(8 * 24, abs=1.0)
    tf32 = longer(h100, lambda i: f"mma.m16n8k8.f32.tf32 r{10 + 4 * (i % 4)}, r1, r5, r{10 + 4 * (i % 4)}", 8, setup=setup)
    assert tf32 == pytest.approx(8 * 6, abs=1.0)
    assert round(peak_tflops(h100)["fp16"]) == 989
    # an ldmatrix.x4 beside every mma hides in its shadow, as on the chip (6.2 cycles an mma, mma_mix)
    setup += "\n    s2r r120, %laneid\n    mul.i64 r120, r120, 16"
    beside = longer(h100, lambda i: f"mma.m16n8k16.f32.f16 r{10 + 4 * (i % 4)}, r1, r5, r{10 + 4 * (i % 4)}\n    "
                    f"ldmatrix.x4 r{70 + 4 * (i % 8)}, [r120+{(i % 4) * 512}]", 8, setup=setup, shared=4096)
    assert beside == pytest.approx(8 * 6, abs=1.0)


@pytest.mark.parametrize("ffma, cycles", [(2, 6), (4, 8), (8, 12)])
def test_h100_mma_operand_reads_hold_the_arithmetic_pipes(ffma, cycles):
    # an mma's operand reads keep its sub-core's arithmetic pipes for tensor.operand_hold_cycles (4): n
    # independent FFMA after each of 4 mma chains cost max(6, 4 + n) cycles an mma; the chip, 2 warps a
    # sub-core: 6.8, 7.8, 12.2 (configs/reference/measured/h100-sxm5-mma-mix.json)
    h100 = load_machine("h100")
    setup = "    mov.b64 r24, 0\n    mov.b64 r25, 0\n" + "\n".join(f"    mov.f32 r{r}, 1.0" for r in range(50, 70))

    def unit(i):
        fmas = "".join(f"\n    fma.f32 r{61 + (i * ffma + j) % 8}, r{61 + (i * ffma + j) % 8}, r50, r50"
                       for j in range(ffma))
        return f"mma.m16n8k16.f32.f16 r{10 + 4 * (i % 4)}, r1, r5, r{10 + 4 * (i % 4)}" + fmas
    assert longer(h100, unit, 8, setup=setup) == pytest.approx(8 * cycles, abs=1.0)
    # without the hold the FFMA hide in the mma's 6 cycles until they need more issue slots than it leaves
    free = load_machine("h100", sets=["tensor.operand_hold_cycles=1"])
    assert longer(free, unit, 8, setup=setup) == pytest.approx(8 * max(6, 1 + ffma), abs=1.0)


def test_shared_memory_load_latency_and_bank_conflicts(tiny):
    lat = tiny.scratchpad.latency_cycles
    # a dependent chain: each load's address comes from the previous load (the value is 0)
    assert longer(tiny, lambda i: "ld.shared.b32 r10, [r10]", 4, shared=4096) == pytest.approx(4 * lat, abs=1.0)
    # 32 lanes hitting one bank with 32 different words: 32 wavefronts before the data comes
    setup = "    s2r r30, %laneid\n    mul.i64 r30, r30, 128"
    conflict = "\n    ".join(["ld.shared.b32 r10, [r30]", "add.i64 r30, r30, r10"] * 4)
    plain_setup = "    s2r r30, %laneid\n    mul.i64 r30, r30, 4"
    c = per_iteration(tiny, conflict, shared=4096, setup=setup)
    p = per_iteration(tiny, conflict, shared=4096, setup=plain_setup)
    assert c - p == pytest.approx(4 * (32 - 1), abs=1.0)  # 32 wavefronts instead of 1, per load


def test_skip_ahead_changes_nothing_and_runs_repeat(tiny):
    text = kernel("\n    ".join(["fma.f32 r1, r1, r2, r3", "ld.shared.b32 r10, [r10]"] * 3), 20, shared=256)
    prog = assemble(text, "k.s")
    launch = Launch((3, 1, 1), (96, 1, 1))
    a = time_kernel(prog, tiny, launch, {}, skip=True)
    b = time_kernel(prog, tiny, launch, {}, skip=False)
    c = time_kernel(prog, tiny, launch, {}, skip=True)
    assert a.skipped_cycles > 0 and b.skipped_cycles == 0
    assert a.cycles == b.cycles == c.cycles
    assert np.array_equal(a.stall, b.stall) and np.array_equal(a.stall, c.stall)


def _same_timing(a, b):
    assert a.cycles == b.cycles and a.warp_instructions == b.warp_instructions
    assert np.array_equal(a.stall, b.stall) and np.array_equal(a.pipe_busy_cycles, b.pipe_busy_cycles)
    assert a.timeline[0] == b.timeline[0] and np.array_equal(a.timeline[1], b.timeline[1])
    assert a.memory == b.memory


@pytest.mark.parametrize("shape", [(128, 96, 160), (160, 96, 40)])
def test_sleeping_schedulers_change_nothing_in_a_tiled_gemm(tiny, shape):
    """Event-driven scheduling (a sub-core runs only when an operand, a pipe, a memory reply, a
    barrier, a freed MIO entry or a new block can let a warp go) against every scheduler every
    cycle: cp.async groups, bar.sync, ldmatrix, full MIO queues, block retire and dispatch."""
    from archsim.config.derived import capabilities
    from archsim.engine.timing import Unbacked
    from archsim.workloads.emit import gemm_kernel

    g = gemm_kernel(capabilities(tiny), *shape, "fp16")
    args = g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))
    a = time_kernel(g.program, tiny, g.launch, args, skip=True, window_cycles=64)
    b = time_kernel(g.program, tiny, g.launch, args, skip=False, window_cycles=64)
    assert g.launch.blocks > tiny.groups * tiny.cores.per_group  # blocks retire and new ones come
    assert a.stall[:, 5].sum() > 0 and a.stall[:, 6].sum() > 0   # pipe_busy and barrier waits happened
    _same_timing(a, b)


def test_sleeping_schedulers_change_nothing_across_a_grid_barrier(tiny):
    text = """.kernel k
.param buf
    s2r r0, %ctaid.x
    s2r r1, %tid.x
    shl.b64 r2, r0, 6
    add.i64 r2, r2, r1
    ldparam r3, buf
    shl.b64 r4, r2, 3
    add.i64 r4, r3, r4
    ld.global.b64 r5, [r4]
    bar.grid
    add.i64 r5, r5, 1
    st.global.b64 [r4], r5
    exit
"""
    prog = assemble(text, "k.s")
    launch = Launch((4, 1, 1), (64, 1, 1))
    a = time_kernel(prog, tiny, launch, {"buf": np.zeros(256, np.int64)}, skip=True, window_cycles=16)
    b = time_kernel(prog, tiny, launch, {"buf": np.zeros(256, np.int64)}, skip=False, window_cycles=16)
    assert np.array_equal(a.buffers["buf"], np.ones(256)) and np.array_equal(b.buffers["buf"], np.ones(256))
    assert a.stall[:, 6].sum() > 0
    _same_timing(a, b)


def test_stall_breakdown_covers_every_resident_warp_cycle(tiny):
    prog = assemble(kernel("fma.f32 r1, r1, r2, r3", 50), "k.s")
    r = time_kernel(prog, tiny, Launch((1, 1, 1), (64, 1, 1)), {})
    assert r.stall.sum() > 0
    # two warps resident from dispatch to exit: every one of their cycles has exactly one reason
    assert r.stall[:, 0].sum() == r.warp_instructions  # issued


def test_deadlock_stops_with_status_3(tiny):
    text = """.kernel k
    s2r r0, %warpid
    setp.eq.i64 p0, r0, 1
@p0 exit
    bar.sync
    exit
"""
    with pytest.raises(SimulationError) as e:
        time_kernel(assemble(text, "k.s"), tiny, Launch((1, 1, 1), (64, 1, 1)), {})
    assert "deadlock" in e.value.line() and "waits at bar.sync" in e.value.line()


def test_max_cycles_stops_and_says_where(tiny):
    with pytest.raises(SimulationError) as e:
        time_kernel(assemble(".kernel k\nL:  bra L\n", "k.s"), tiny, ONE_WARP, {}, max_cycles=500)
    assert e.value.line().startswith("k.s:2: stopped at --max-cycles 500")


def test_a_launch_ends_when_its_stores_reach_the_l2():
    """A kernel boundary waits for stores: a warp that stores and exits does not end the launch
    until its write has crossed the request fabric into its L2 slice, so a slower router moves
    the end by exactly the extra router latency (formula oracle), and the last block retires
    before the launch ends."""
    from archsim.engine.timing import Unbacked

    text = """.kernel k
.param out
    ldparam r1, out
    mov.b64 r2, 7
    st.global.b32 [r1], r2
    exit
"""
    ends = []
    for lat in (10, 110):
        m = load_machine("tiny-gpu", sets=[f"fabric.router_latency_cycles={lat}"])
        r = time_kernel(assemble(text, "k.s"), m, ONE_WARP, {"out": Unbacked(128)})
        assert r.block_done.max() < r.cycles - lat
        ends.append(r.cycles)
    assert ends[1] - ends[0] == 100


def test_vector_add_moves_exactly_its_buffers_through_the_hierarchy(tiny):
    """Every level sees the bytes the kernel touches: reads of x and y come from DRAM once, the
    L1 data pipe carries x, y and out, and out stays dirty in the write-back L2."""
    from archsim.isa.examples import load_example, make_args

    args, launch = make_args("vector_add", 0)
    r = time_kernel(load_example("vector_add"), tiny, launch, args)
    n = int(args["n"])
    b = r.memory["bytes"]
    assert b["dram_read"] == 2 * 4 * n
    assert b["l1"] == 3 * 4 * n
    assert b["dram_write"] == 0
    lat = r.memory["load_latency"]
    assert lat["count"] > 0 and lat["min"] > tiny.l1.hit_latency_cycles + tiny.l2.hit_latency_cycles


def test_the_scoreboard_checks_each_operand_register_once(tiny):
    from archsim.engine.decode import decode

    prog = assemble(""".kernel k
    mma.m16n8k16.f32.f16 r10, r1, r5, r10
    add.i64 r3, r3, r3
    mma.m16n8k16.f32.f16 r20, r1, r5, r10
    exit
""")
    Dd = decode(prog, tiny)
    a, b, c10, d20 = [1, 2, 3, 4], [5, 6], [10, 11, 12, 13], [20, 21, 22, 23]  # A, B, C / D fragments
    expect = [a + b + c10, [3], a + b + c10 + d20]                              # sources first, no repeats
    for pc in range(3):
        assert list(Dd.opd[pc, :Dd.nopd[pc]]) == expect[pc]
    assert list(Dd.wr[0, :Dd.nwr[0]]) == c10                                    # C and D are one set


def test_warp_slots_and_sub_cores_know_their_home(tiny):
    """TState.home, which the hot paths read instead of dividing: the sub-core of each warp slot
    (slots go round the sub-cores of their core) and the core of each sub-core, also for a slot
    count that is no multiple of the sub-cores."""
    from archsim.engine import core as K
    from archsim.engine import warps as WS

    C = K.make_core_cfg(tiny, 1024, slots=6, max_blocks=2)
    TS = K.make_tstate(C, nregs=8, nblocks=4, wpb=3, regs_per_warp=8 * 32, smem_per_block=0, npc=1)
    cores, sub = int(C.v[K.C_CORES]), int(C.v[K.C_SUBCORES])
    for w in range(cores * 6):
        core, slot = divmod(w, 6)
        assert TS.home[WS.HOME_SUB, w] == core * sub + slot % sub
        assert WS.subcore_of(TS, w) == slot % sub
    for i in range(cores * sub):
        assert TS.home[WS.HOME_CORE, i] == i // sub
    assert (TS.k[WS.K_SUBCORES], TS.k[WS.K_SLOTS]) == (sub, 6)
