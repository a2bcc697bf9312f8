"""Block dispatch order (Launch.spread): on a machine of several core groups a spread launch deals
its first blocks to the groups in turn and, within a group, to its clusters in turn; without
spread the cores fill in order (group 0 first), which the Sunway broadcast GEMM's mesh layout
needs. The Sunway emitters of independent blocks (elementwise, attention, KV append, the per-CPE
GEMM) spread their launches."""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.engine.core import dispatch_order
from archsim.engine.dram import cross_base
from archsim.engine.timing import Unbacked, time_kernel
from archsim.isa.asm import assemble
from archsim.isa.opcodes import opcodes
from archsim.isa.program import Launch
from archsim.workloads.emit import elementwise_sunway as EW
from archsim.workloads.emit.gemm_sunway import gemm_kernel

from test_sunway_mpe import SPIN   # one warp counting to n


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def test_dispatch_order_deals_groups_then_clusters(sw):
    # tiny-sunway: 2 groups of a 4x4 mesh of 2x2 clusters; cluster 0 = CPEs 0, 1, 4, 5,
    # cluster 1 = 2, 3, 6, 7, cluster 2 = 8, 9, 12, 13, cluster 3 = 10, 11, 14, 15
    order = dispatch_order(sw, True, 10)
    assert list(order[:10]) == [0, 16, 2, 18, 8, 24, 10, 26, 1, 17]
    assert sorted(order) == list(range(32))
    assert list(dispatch_order(sw, False, 10)) == list(range(32))
    assert list(dispatch_order(sw, True, 32)) == list(range(32))     # a launch that fills the machine
    gpu = load_machine("tiny-gpu")
    assert list(dispatch_order(gpu, True, 3)) == list(range(gpu.cores.per_group))  # one group: in order


@pytest.mark.parametrize("spread,cores", [(False, [0, 1, 2, 3, 4, 5]), (True, [0, 16, 2, 18, 8, 24])])
def test_a_small_launch_runs_where_the_order_puts_it(sw, spread, cores):
    prog = assemble(SPIN, "k.s")
    t = time_kernel(prog, sw, Launch((6, 1, 1), (32, 1, 1), spread=spread), {"n": 50})
    assert list(t.block_core) == cores
    # a launch larger than the machine fills it in order either way, the rest follow as cores free up
    t = time_kernel(prog, sw, Launch((40, 1, 1), (32, 1, 1), spread=spread), {"n": 50})
    assert list(t.block_core[:32]) == list(range(32)) and (t.block_core >= 0).all()


def test_a_gpu_launch_is_the_same_either_way():
    gpu = load_machine("tiny-gpu")
    prog = assemble(SPIN, "k.s")
    a, b = (time_kernel(prog, gpu, Launch((5, 1, 1), (64, 1, 1), spread=s), {"n": 80}) for s in (False, True))
    assert a.cycles == b.cycles and list(a.block_core) == list(b.block_core)


def test_a_small_sunway_kernel_reaches_every_group(sw):
    """An RMS norm over 8 rows (8 blocks) spreads over both core groups, and each group's stop and
    controller serve its share (buffers in the cross segment, as a run places them)."""
    k = EW.rmsnorm_kernel(capabilities(sw), 8, 1024, "fp16")
    assert k.launch.spread and k.launch.blocks == 8
    nb = k.buffer_bytes()
    t = time_kernel(k.program, sw, k.launch, k.args(**{b: Unbacked(v) for b, v in nb.items()}), base=cross_base(sw))
    assert sorted(int(c) // sw.cores.per_group for c in t.block_core) == [0] * 4 + [1] * 4
    in_order = time_kernel(k.program, sw, Launch(k.launch.grid, k.launch.block), k.args(
        **{b: Unbacked(v) for b, v in nb.items()}), base=cross_base(sw))
    assert set(int(c) // sw.cores.per_group for c in in_order.block_core) == {0}


def test_the_broadcast_gemm_keeps_in_order_dispatch(sw):
    """Its persistent blocks are CPE b = block b: a mesh row / column line shares panels."""
    caps = capabilities(sw)
    ops = opcodes()
    k = gemm_kernel(caps, 64, 64, 64)
    names = {ops[int(c)].mnemonic for c in np.unique(k.program.op)}
    assert any(".bcast." in n for n in names) and not k.launch.spread
