"""Warpgroup MMA timing on h100 (issue 48 item 1): formula oracles for wgmma's rate, its groups,
wgmma.fence, the tensor unit's queue, and skip-ahead invariance.

A warp's 16-row slice of m64nNk16 runs on its own sub-core's tensor unit at mac_steps_per_cycle:
(16/4)(N/4)(16/4) = 4N steps at 8 a cycle, N/2 cycles (Luo et al. measured 32 / 64 / 128 cycles for
N = 64 / 128 / 256). Each oracle differences two runs, so launch and set-up costs cancel.
"""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.timing import time_kernel
from archsim.isa.asm import assemble
from archsim.isa.program import Launch

WARPGROUP = Launch((1, 1, 1), (128, 1, 1))
SW128 = 1 << 62
DESC_A = (1024 >> 4) << 32 | SW128               # A at 0, 8-row groups 1 KiB apart, 128-byte swizzle
DESC_B = (8192 >> 4) | (1024 >> 4) << 32 | SW128  # B at 8 KiB


def program(n: int, body: list[str], setup: str = "") -> str:
    acc = "\n".join(f"    mov.f32 r{10 + r}, 0.0" for r in range(n // 2))
    lines = "\n".join("    " + b for b in body)
    return f""".kernel wg
.param x
.regs {n // 2 + 60}
.shared 49152
{acc}
    mov.b64 r1, {DESC_A}
    mov.b64 r2, {DESC_B}
{setup}
{lines}
    exit
"""


def run(machine, n, body, setup="", **kw):
    prog = assemble(program(n, body, setup), "wg.s")
    return time_kernel(prog, machine, WARPGROUP, {"x": np.zeros(64, np.float32)}, **kw)


def wg(n):
    return f"wgmma.m64n{n}k16.f32.f16 r10, r1, r2, 0"


@pytest.mark.parametrize("n", [64, 256])
def test_back_to_back_wgmma_take_n_over_2_cycles_each(h100, n):
    def cyc(k):
        return run(h100, n, ["wgmma.fence"] + [wg(n)] * k + ["wgmma.commit_group", "wgmma.wait_group 0"]).cycles
    # one accumulator chained: the tensor unit paces the chain, no scoreboard wait between them
    assert cyc(8) - cyc(4) == 4 * n // 2
    t = run(h100, n, ["wgmma.fence"] + [wg(n)] * 4 + ["wgmma.commit_group", "wgmma.wait_group 0"])
    assert t.flops == 4 * 4 * 2 * 16 * n * 16     # 4 warps x 4 wgmma x a 16 x N x 16 slice
    assert t.pipe_busy_cycles[0, -1] == 4 * 4 * n // 2   # the tensor column: each sub-core busy 4 x N/2
    # the operands read from the scratchpad: each warp's 16 rows of A, and B once a warpgroup
    assert t.memory["bytes"]["scratch"] == 4 * (64 * 16 * 2 + n * 16 * 2)


def test_narrow_wgmma_from_shared_memory_is_bound_by_its_data_pipe(h100):
    # m64n32k16: each warp's slice takes 16 cycles of its unit but reads 16 x 16 x 2 bytes of A and a
    # quarter of B (32 x 16 x 2 / 4): 768 bytes, 6 of the SM's 128-byte wavefronts, 24 for the 4
    # warps. From registers (.rs) only B's 2 wavefronts a warp: the units' 16 cycles bind (Luo et
    # al.: below N = 64, SS is slower than RS)
    setup = "\n".join(f"    mov.b64 r{r}, 0" for r in range(3, 7))
    rs = "wgmma.m64n32k16.f32.f16.rs r10, r3, r2, 0"

    def cyc(op, k):
        return run(h100, 32, ["wgmma.fence"] + [op] * k + ["wgmma.commit_group", "wgmma.wait_group 0"],
                   setup=setup).cycles
    assert cyc(wg(32), 8) - cyc(wg(32), 4) == 4 * 24
    assert cyc(rs, 8) - cyc(rs, 4) == 4 * 16


def test_wait_group_n_leaves_the_newest_groups_pending(h100):
    body = ["wgmma.fence", wg(64), wg(64), "wgmma.commit_group", wg(64), wg(64), "wgmma.commit_group"]
    both = run(h100, 64, body + ["wgmma.wait_group 0"]).cycles
    first = run(h100, 64, body + ["wgmma.wait_group 1"]).cycles
    # the exit waits for the first group only: the second's two wgmma (2 x 32 cycles) still run
    assert both - first == 64
    # a wait for more groups than were committed does not wait at all
    none = run(h100, 64, body + ["wgmma.wait_group 7"]).cycles
    assert none < first


def test_wait_group_stalls_count_as_fixed_latency_waits(h100):
    t = run(h100, 256, ["wgmma.fence", wg(256), "wgmma.commit_group", "wgmma.wait_group 0"])
    from archsim.engine.names import STALL_NAMES
    wait = t.stall[:, STALL_NAMES.index("wait")].sum()
    assert wait >= 4 * 128 - 8          # each warp waits out its slice


def test_queue_depth_stalls_issue_not_throughput(h100):
    body = ["wgmma.fence"] + [wg(64)] * 8 + ["wgmma.commit_group", "wgmma.wait_group 0"]
    deep = run(h100, 64, body)
    shallow = run(load_machine("h100", sets=["tensor.wgmma.queue_depth=1"]), 64, body)
    from archsim.engine.names import STALL_NAMES
    busy = STALL_NAMES.index("pipe_busy")
    assert deep.cycles == shallow.cycles       # the unit is the bottleneck either way
    assert shallow.stall[:, busy].sum() > deep.stall[:, busy].sum()


def test_fence_waits_for_outstanding_register_writes(h100):
    # a global load in flight before the fence: the wgmma issues only once it has landed
    load = "    ldparam r5, x\n    ld.global.b32 r6, [r5]"
    plain = run(h100, 64, ["wgmma.fence", wg(64), "wgmma.commit_group", "wgmma.wait_group 0"], setup=load)
    nofence = run(h100, 64, [wg(64), "wgmma.commit_group", "wgmma.wait_group 0"], setup=load)
    assert plain.cycles - nofence.cycles > 200   # a DRAM round trip


def test_mma_sync_waits_behind_queued_wgmma(h100):
    # an mma.sync takes the sub-core's tensor unit only after the two wgmma queued on it (2 x 128 cycles)
    setup = "\n".join(f"    mov.f32 r{r}, 0.0" for r in range(160, 172))
    mma = ["mma.m16n8k16.f32.f16 r160, r164, r168, r160", "mov.f32 r172, r160"]
    after = run(h100, 256, ["wgmma.fence", wg(256), wg(256), "wgmma.commit_group"] + mma, setup=setup).cycles
    alone = run(h100, 256, ["wgmma.fence"] + mma, setup=setup).cycles
    assert after - alone >= 2 * 128 - 4


def test_skip_ahead_changes_nothing(h100):
    body = ["wgmma.fence", wg(128), "wgmma.commit_group", wg(128), "wgmma.commit_group", "wgmma.wait_group 1",
            wg(128), "wgmma.commit_group", "wgmma.wait_group 0"]
    a = run(h100, 128, body, skip=True)
    b = run(h100, 128, body, skip=False)
    assert (a.cycles, a.warp_instructions) == (b.cycles, b.warp_instructions)
    assert (a.stall == b.stall).all()


def test_a_guarded_off_wgmma_does_nothing(h100):
    body = ["wgmma.fence", "setp.lt.i64 p1, r1, 0", f"@p1 {wg(256)}", "wgmma.commit_group", "wgmma.wait_group 0"]
    t = run(h100, 256, body)
    assert t.flops == 0 and t.memory["bytes"]["scratch"] == 0 and t.pipe_busy_cycles[:, -1].sum() == 0


def test_a_machine_without_wgmma_refuses_it_at_decode():
    from archsim.errors import InputError
    with pytest.raises(InputError, match="warpgroup MMA"):
        run(load_machine("a100"), 64, ["wgmma.fence", wg(64), "wgmma.commit_group", "wgmma.wait_group 0"])
