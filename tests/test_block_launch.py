"""A GPU block's launch (core.dispatch_block): a block's warps issue cores.block_launch_cycles after
its slot frees, and a core starts at most one block every cores.block_interval_cycles. Block tests
with formula oracles on tiny-gpu (2 SMs of 8 warp slots and 4 block slots)."""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.timing import time_kernel
from archsim.engine.warps import R_IDLE
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch
from test_sunway_mpe import EXIT, SPIN   # a warp that exits at once; one counting to n


def tiny(launch: int, interval: int):
    return load_machine("tiny-gpu", sets=[f"cores.block_launch_cycles={launch}",
                                          f"cores.block_interval_cycles={interval}"])


def run(m, text, blocks, threads, args=None, skip=True):
    return time_kernel(assemble(text, "k.s"), m, Launch((blocks, 1, 1), (threads, 1, 1)), args or {}, skip=skip)


def per_core(t):
    """(start, done) of each core's blocks in start order."""
    out = {}
    for s, d, c in zip(t.block_start, t.block_done, t.block_core):
        out.setdefault(int(c), []).append((int(s), int(d)))
    return [sorted(v) for _, v in sorted(out.items())]


def test_a_slot_waits_the_launch_latency_between_blocks():
    # 8 warps a block fill a core: its blocks run one after another, each starting exactly
    # block_launch_cycles after the one before it retired (the first after the kernel began)
    L = 70
    t = run(tiny(L, 0), SPIN, blocks=10, threads=256, args={"n": 20})
    for blocks in per_core(t):
        assert len(blocks) == 5
        assert blocks[0][0] == L
        for (_, done), (start, _) in zip(blocks, blocks[1:]):
            assert start - done == L


def test_the_launch_latency_adds_once_a_round():
    # the blocks' own work does not change with the latency: 5 rounds a core cost 5 latencies (from
    # 1 on: at 0 a new block's warps issue in the next cycle anyway when their scheduler has run)
    base = run(tiny(1, 0), SPIN, blocks=10, threads=256, args={"n": 20}).cycles
    for L in (2, 37, 300):
        assert run(tiny(L, 0), SPIN, blocks=10, threads=256, args={"n": 20}).cycles - base == 5 * (L - 1)


def test_a_core_starts_one_block_an_interval():
    # one-warp blocks that only exit, 4 resident a core: the core's set-up rate binds, so its
    # k-th block starts at launch + k x interval
    L, interval = 5, 50
    t = run(tiny(L, interval), EXIT, blocks=24, threads=32)
    for blocks in per_core(t):
        starts = [s for s, _ in blocks]
        assert starts == [L + k * interval for k in range(len(starts))]


def test_the_launch_cycles_are_idle_warp_cycles():
    # one block of 8 warps a core: every warp is resident and idle for the launch's cycles
    L = 120
    t = run(tiny(L, 0), SPIN, blocks=2, threads=256, args={"n": 20})
    t0 = run(tiny(0, 0), SPIN, blocks=2, threads=256, args={"n": 20})
    assert t.stall[:, R_IDLE].sum() == 2 * 8 * L
    assert t0.stall[:, R_IDLE].sum() == 0
    assert np.array_equal(np.delete(t.stall, R_IDLE, axis=1), np.delete(t0.stall, R_IDLE, axis=1))


def test_skipping_ahead_gives_the_same_launch():
    # the event-driven loop and the every-cycle reference agree while warps wait for their launch
    m = tiny(90, 30)
    a = run(m, SPIN, blocks=12, threads=64, args={"n": 15})
    b = run(m, SPIN, blocks=12, threads=64, args={"n": 15}, skip=False)
    assert a.cycles == b.cycles and np.array_equal(a.stall, b.stall)
    assert np.array_equal(a.block_start, b.block_start) and np.array_equal(a.block_done, b.block_done)


@pytest.mark.parametrize("field", ["block_launch_cycles", "block_interval_cycles"])
def test_a_cpe_has_no_block_launch_of_its_own(field):
    with pytest.raises(InputError) as info:
        load_machine("tiny-sunway", sets=[f"cores.{field}=10"])
    line = info.value.line()
    assert f"cores.{field} 10 on a CPE" in line and "MPE" in line and line.endswith("(0)")


def test_a_negative_launch_is_one_line():
    with pytest.raises(InputError) as info:
        load_machine("tiny-gpu", sets=["cores.block_launch_cycles=-1"])
    assert "block_launch_cycles" in info.value.line() and "\n" not in info.value.line()
