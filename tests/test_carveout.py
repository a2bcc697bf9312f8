"""Per-kernel shared-memory carveout (scratchpad.carveout: per_kernel): each kernel gets the
smallest allowed carveout that holds the blocks its other limits let a core run, and the rest of
the unified array caches (engine/timing.kernel_machine); the record says which split it got."""

from __future__ import annotations

import pytest

from archsim.config import capabilities, load_machine
from archsim.engine.timing import blocks_per_core, kernel_machine
from archsim.errors import InputError
from archsim.micro import run_micro
from archsim.workloads.emit import Tile, gemm_kernel


def test_a_kernel_without_shared_memory_gets_the_whole_array_as_l1():
    """A 24 KiB pointer chase on tiny-gpu (32 KiB array): with the fixed 16 KiB carveout the L1
    holds 16 KiB and the chase goes to the L2; per kernel the carveout is 0 and every load hits
    the L1 (its hit latency, 33 cycles + the address add)."""
    fixed = run_micro("latency", load_machine("tiny-gpu"), {"footprint_kib": 24})
    per = run_micro("latency", load_machine("tiny-gpu", sets=["scratchpad.carveout=per_kernel"]),
                    {"footprint_kib": 24})
    assert fixed.kernels[0]["carveout"] == {"shared_kib": 16, "l1_cache_kib": 16}
    assert per.kernels[0]["carveout"] == {"shared_kib": 0, "l1_cache_kib": 32}
    l1_hit = load_machine("tiny-gpu").l1.hit_latency_cycles
    assert per.value <= l1_hit + 2 < fixed.value


def test_the_carveout_holds_as_many_blocks_as_the_other_limits_allow():
    """a100 GEMMs: the 128x128 tile's 128 KiB of stages (one block a core by any carveout) gets
    132 KiB; a 64x64 tile of 2 stages (24 KiB, registers for several blocks) gets the smallest
    carveout holding all of them, and as many blocks run as with the full 164 KiB."""
    a100 = load_machine("a100")
    per = load_machine("a100", sets=["scratchpad.carveout=per_kernel"])
    caps = capabilities(a100)
    big = gemm_kernel(caps, 4096, 4096, 4096, "fp16", "f32")
    assert big.program.shared_bytes == 128 * 1024
    assert kernel_machine(big.program, per, big.launch).scratchpad.size_kib == 132
    small = gemm_kernel(caps, 1024, 1024, 256, "fp16", "f32", tile=Tile(64, 64, 32, 4, 2))
    m = kernel_machine(small.program, per, small.launch)
    n = blocks_per_core(small.program, a100, small.launch)
    assert n > 1 and m.scratchpad.size_kib * 1024 >= n * small.program.shared_bytes
    smaller = [k for k in m.scratchpad.carveouts_kib if k < m.scratchpad.size_kib]
    assert all(k * 1024 < n * small.program.shared_bytes for k in smaller)
    assert blocks_per_core(small.program, per, small.launch) == n
    # the fixed policy leaves the machine as it is
    fixed = load_machine("a100", sets=["scratchpad.carveout=fixed"])
    assert kernel_machine(small.program, fixed, small.launch) is fixed


def test_per_kernel_needs_a_carved_l1_with_carveouts():
    with pytest.raises(InputError, match="carveout"):
        load_machine("sw26010pro", sets=["scratchpad.carveout=per_kernel"])


def test_the_drivers_reserve_per_block_counts_for_the_carveout_and_occupancy():
    """scratchpad.reserved_per_block_bytes (1 KB on compute capability 8.x / 9.x): a kernel
    without shared memory pays it for every block a core can hold, so the carveout is the
    smallest one holding max_blocks KiB; a block's shared memory plus the reserve must fit."""
    from archsim.engine.timing import block_shared_bytes, occupancy_limits

    h = load_machine("h100")
    assert h.scratchpad.carveout == "per_kernel" and h.scratchpad.reserved_per_block_bytes == 1024
    chase = run_micro("latency", h, {"footprint_kib": 16, "loads": 16})
    n = h.cores.max_blocks    # one-thread blocks: the block slots are the limit
    need = n * 1024
    pick = min(k for k in h.scratchpad.carveouts_kib if k * 1024 >= need)
    assert chase.kernels[0]["carveout"] == {"shared_kib": pick, "l1_cache_kib": h.l1.size_kib - pick}
    g = gemm_kernel(capabilities(h), 1024, 1024, 256, "fp16", "f32", tile=Tile(64, 64, 32, 4, 2))
    assert block_shared_bytes(g.program, h) == g.program.shared_bytes + 1024
    m = kernel_machine(g.program, h, g.launch)
    per_block = g.program.shared_bytes + 1024
    n = blocks_per_core(g.program, h, g.launch)
    assert m.scratchpad.size_kib * 1024 >= n * per_block
    assert occupancy_limits(g.program, m, g.launch)[1] == per_block
    # without the reserve the same kernel holds at least as many blocks
    free = load_machine("h100", sets=["scratchpad.reserved_per_block_bytes=0"])
    assert blocks_per_core(g.program, free, g.launch) >= n
    # a block whose shared memory fits the largest carveout only without the reserve is rejected
    from archsim.isa.asm import assemble
    from archsim.isa.program import Launch

    top = max(h.scratchpad.carveouts_kib) * 1024
    prog = assemble(f".kernel full\n.shared {top - 512}\n        exit\n")
    with pytest.raises(InputError, match="driver reserves"):
        blocks_per_core(prog, h, Launch((1, 1, 1), (32, 1, 1)))
