"""Wave sampling (archsim.sample) and the block ranges it rests on, on tiny-gpu.

Oracles: a range of blocks runs exactly those blocks (warp-instructions add up over a split of the
grid); the whole range is the whole launch; a sampled GEMM of many waves lands near the whole
simulation (uniform blocks: warp-instructions exact) and says it was sampled; small launches and
grid-barrier kernels are never sampled.
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.engine.timing import Unbacked, time_kernel
from archsim.sample import (BOUNDARY_AFTER_WAVES, DEFAULT_MAX_ERROR, DEFAULT_WAVES, concurrency, head_waves,
                            sampled_record, time_sampled)
from archsim.workloads.emit import Tile, gemm_kernel


@pytest.fixture(scope="module")
def tiny():
    return load_machine("tiny-gpu")


def _gemm(tiny, M, N, K, tile=None):
    g = gemm_kernel(capabilities(tiny), M, N, K, "fp16", "f16", tile=tile)
    return g, g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))


def test_block_ranges_split_the_launch(tiny):
    g, args = _gemm(tiny, 96, 64, 64, Tile(32, 32, 32, 4, 2))
    B = g.launch.blocks
    whole = time_kernel(g.program, tiny, g.launch, args)
    same = time_kernel(g.program, tiny, g.launch, args, blocks=(0, B))
    assert same.cycles == whole.cycles and same.warp_instructions == whole.warp_instructions
    a = time_kernel(g.program, tiny, g.launch, args, blocks=(0, 2))
    b = time_kernel(g.program, tiny, g.launch, args, blocks=(2, B))
    assert a.warp_instructions + b.warp_instructions == whole.warp_instructions
    assert a.cycles < whole.cycles and b.cycles < whole.cycles
    # every block of the range ran once, on a real core, after it was dispatched
    assert len(b.block_done) == B - 2 and b.first_block == 2
    assert (b.block_start >= 0).all() and (b.block_done > b.block_start).all()
    assert set(b.block_core.tolist()) <= set(range(tiny.groups * tiny.cores.per_group))
    # the launch ends once the last block has retired and its stores have reached the L2
    assert whole.block_done.max() <= whole.cycles


def test_bad_block_range_is_one_input_error(tiny):
    from archsim.errors import InputError

    g, args = _gemm(tiny, 64, 64, 32)
    with pytest.raises(InputError, match="block range"):
        time_kernel(g.program, tiny, g.launch, args, blocks=(3, 3))


@pytest.mark.parametrize("shape", [(768, 512, 256), (512, 512, 512)])
def test_sampled_gemm_lands_within_the_threshold_of_the_whole_simulation(tiny, shape):
    """GEMMs of many waves whose raster groups repeat (Launch.period): the head covers the
    warm-up wave and three whole periods, and the sampled cycles land within the 3 % threshold
    of simulating every block, at under 40 % of the cost."""
    g, args = _gemm(tiny, *shape, Tile(32, 32, 32, 4, 2))
    C = concurrency(g.program, tiny, g.launch)
    assert g.launch.blocks >= 16 * C and g.launch.period > 0
    s = time_sampled(g.program, tiny, g.launch, args)
    w = time_sampled(g.program, tiny, g.launch, args, sample=False)
    assert s.sampled and not w.sampled and w.attempts == []
    assert s.attempts == [(head_waves(DEFAULT_WAVES, C, g.launch.period), round(s.error_est, 5))]
    assert s.simulated_warp_instructions < 0.4 * w.simulated_warp_instructions
    assert s.timing.warp_instructions == pytest.approx(w.timing.warp_instructions, rel=1e-3)
    assert 0.0 <= s.error_est <= DEFAULT_MAX_ERROR
    assert s.timing.cycles == pytest.approx(w.timing.cycles, rel=DEFAULT_MAX_ERROR)
    # bytes scale with the blocks
    sb, wb = s.timing.memory["bytes"], w.timing.memory["bytes"]
    assert sb["l2"] == pytest.approx(wb["l2"], rel=0.05)
    rec = sampled_record("g", g.program, tiny, g.launch, args, trace=True)
    assert rec["sampled"] and rec["waves"] == -(-g.launch.blocks // C) and rec["cycles"] == s.timing.cycles
    assert rec["sample_method"] == "sampled" and rec["sample_max_error"] == DEFAULT_MAX_ERROR
    assert len(rec["block_trace"]["start"]) == s.waves_simulated * C
    assert sum(rec["stalls"].values()) == pytest.approx(1.0)


def test_a_head_above_the_threshold_grows_then_gives_way_to_the_whole_launch(tiny):
    """A threshold no head can meet: the head doubles until it would pass two thirds of the launch, then
    every block is simulated; the record names each head tried and counts its cost."""
    g, args = _gemm(tiny, 768, 512, 64, Tile(32, 32, 32, 4, 2))
    w = time_sampled(g.program, tiny, g.launch, args, sample=False)
    s = time_sampled(g.program, tiny, g.launch, args, max_error=1e-9)
    assert not s.sampled and s.error_est == 0.0 and s.timing.cycles == w.timing.cycles
    heads = [a[0] for a in s.attempts]
    assert heads and all(b == 2 * a for a, b in zip(heads, heads[1:])) and 3 * 2 * heads[-1] > 2 * s.waves_total
    assert all(e > 1e-9 for _, e in s.attempts)
    assert s.simulated_warp_instructions > w.simulated_warp_instructions
    rec = sampled_record("g", g.program, tiny, g.launch, args, max_error=1e-9)
    assert rec["sample_method"] == "whole_after_fallback" and len(rec["sample_attempts"]) == len(heads)


def test_small_launches_are_not_sampled(tiny):
    g, args = _gemm(tiny, 64, 64, 32, Tile(32, 32, 32, 4, 2))
    s = time_sampled(g.program, tiny, g.launch, args)
    assert not s.sampled and s.error_est == 0.0 and s.waves_simulated == s.waves_total
    assert np.all(s.timing.block_done >= 0)


def test_a_head_too_short_to_bound_its_rate_grows(tiny, recwarn):
    """--sample-waves 3 without a period leaves one steady wave: no bound (error 1.0 of the
    extrapolated share, never NaN), so the head grows until it can give one."""
    from archsim.isa.program import Launch

    g, args = _gemm(tiny, 384, 256, 64, Tile(32, 32, 32, 4, 2))
    s = time_sampled(g.program, tiny, Launch(g.launch.grid, g.launch.block), args, waves=3)
    assert s.attempts[0][0] == 3 and 0.5 < s.attempts[0][1] <= 1.0
    assert all(np.isfinite(e) for _, e in s.attempts) and not recwarn.list


def test_the_rate_is_read_from_whole_waves_not_from_their_last_block():
    """Synthetic heads: waves of C blocks centred T cycles apart whose blocks straggle more and more
    (exponential delays, as blocks of long waves drift apart). The waves' mean retirements recover
    T, so the extrapolation is T per wave within its error estimate; the k*C-th retirement alone,
    the last straggler, was off by 2-11 % on these heads."""
    from types import SimpleNamespace

    from archsim.sample import _extrapolate

    C, S, T, B = 108, 6, 200_000, 43 * 108
    for seed in range(10):
        rng = np.random.default_rng(seed)
        done = np.concatenate([(i + 1) * T + (rng.exponential(0.1 * T, C) - 0.1 * T) * min(i, 3) / 3
                               for i in range(S)])
        est = _extrapolate(SimpleNamespace(block_done=done.astype(np.int64), memory={}), C, B, S, 0,
                           DEFAULT_MAX_ERROR)
        expect = done.max() + (B - S * C) * T / C
        assert abs(est.cycles / expect - 1) <= est.error + 0.001 and est.error < 0.025, seed


def test_a_last_partial_wave_ends_when_its_blocks_say():
    """The launch's last block runs in the slot of the block C retirements before it. Blocks in
    step (every block of a wave retires together): a last wave of 72 blocks of 108 ends when a
    full wave would. Blocks spread evenly over a wave: the launch ends at its last block's place."""
    from types import SimpleNamespace

    from archsim.sample import _extrapolate

    C, S, T = 108, 6, 200_000
    B = 42 * C + 72                                          # 43 waves, the last one two thirds full
    step = np.repeat((np.arange(S) + 1) * T, C).astype(np.int64)
    est = _extrapolate(SimpleNamespace(block_done=step, memory={}), C, B, S, 0, DEFAULT_MAX_ERROR)
    assert est.cycles == pytest.approx(43 * T, rel=1e-9)
    spread = (T + (np.arange(S * C) + 1) * T // C).astype(np.int64)
    est = _extrapolate(SimpleNamespace(block_done=spread, memory={}), C, B, S, 0, DEFAULT_MAX_ERROR)
    assert est.cycles == pytest.approx(T + B * T / C, rel=1e-6)


def test_a_short_head_with_a_small_period_leaves_enough_steady_waves(recwarn):
    """The warm-up may not eat the steps the rate is read from (no mean of an empty slice)."""
    from types import SimpleNamespace

    from archsim.sample import _extrapolate

    done = np.array([100, 101, 102, 103, 104, 105, 106, 107, 108]).repeat(3) + np.arange(27) % 3 * 40
    est = _extrapolate(SimpleNamespace(block_done=done, memory={}), 9, 90, 3, 2, DEFAULT_MAX_ERROR)
    assert np.isfinite(est.cycles) and np.isfinite(est.error) and not recwarn.list


def test_steady_waves_before_the_l2_fills_count_in_the_error():
    """A write stream's head whose waves all step alike while its L2 still takes the writes (it
    fills at wave 38 of 40): its steps bound nothing about the writebacks to come, so the waves
    before the fill, times the writes' share of the lines, enter the error; a head past the fill
    keeps its small error."""
    from types import SimpleNamespace

    from archsim.sample import _extrapolate, _l2_fill, _l2_writes

    m = load_machine("tiny-gpu")
    C, S, B = 4, 40, 4000
    lines = m.l2.size_kib * 1024 // m.l2.line_bytes
    done = np.repeat(np.arange(1, S + 1) * 10.0, C).astype(np.int64)

    def head(writes, fills):
        return SimpleNamespace(block_done=done, memory={"l2": [{"writes": writes, "fills": fills, "writebacks": 0}]})

    absorbing = head(lines * 40 // 38, 0)
    fill = _l2_fill(_l2_writes(absorbing, m, B / (S * C)), m, S)
    assert fill == pytest.approx((38.0, 1.0), rel=0.01)
    assert _extrapolate(absorbing, C, B, S, 0, DEFAULT_MAX_ERROR).error < 0.01
    assert _extrapolate(absorbing, C, B, S, 0, DEFAULT_MAX_ERROR, 0.0, fill).error > 0.8
    # full by wave 4, a quarter of the lines written: a small share of the steady waves
    early = head(lines * 10 // 4, lines * 30 // 4)
    f = _l2_fill(_l2_writes(early, m, B / (S * C)), m, S)
    assert f == pytest.approx((4.0, 0.25), rel=0.01)
    assert _extrapolate(early, C, B, S, 0, DEFAULT_MAX_ERROR, 0.0, f).error < DEFAULT_MAX_ERROR
    # nothing written, or a launch the L2 holds: no fill to wait for
    assert _l2_writes(head(0, 9 * lines), m, 100) is None and _l2_fill(None, m, S) == (0.0, 0.0)
    assert _l2_writes(head(lines // 2, 0), m, 1.5) is None


def test_a_long_period_is_sampled_in_two_strata(tiny):
    """A GEMM whose raster groups each sweep every column panel (a period of 12 waves: three
    periods do not fit in half the launch) is sampled from a head inside the first period and a
    window around the first boundary, where a group's row panels are new. Its boundaries cost
    ~40 % of a wave each here: the sampled cycles land near the whole simulation, and nearer than
    the head's rate alone."""
    g = gemm_kernel(capabilities(tiny), 768, 512, 256, "fp16", "f16")
    args = g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))
    C, B, P = concurrency(g.program, tiny, g.launch), g.launch.blocks, g.launch.period
    assert 2 * head_waves(DEFAULT_WAVES, C, P) > B // C and DEFAULT_WAVES * C < P
    w = time_sampled(g.program, tiny, g.launch, args, sample=False)
    s = time_sampled(g.program, tiny, g.launch, args, max_error=0.05)
    assert s.sampled and s.error_est <= 0.05 and s.boundary is not None
    b = s.boundary
    S = s.attempts[-1][0]
    lo, hi = b["window_blocks"]
    assert b["period_blocks"] == P and b["boundaries"] == (B - 1) // P - (S * C - 1) // P > 0
    assert lo < P < hi and (hi - P) == BOUNDARY_AFTER_WAVES * C and s.waves_simulated == S + (hi - lo) / C
    assert s.simulated_warp_instructions < w.simulated_warp_instructions
    assert abs(s.timing.cycles / w.timing.cycles - 1) <= s.error_est
    head_only = s.timing.cycles - b["boundaries"] * b["excess_cycles"]
    assert b["excess_cycles"] > 0 and abs(s.timing.cycles - w.timing.cycles) < abs(head_only - w.timing.cycles)
    rec = sampled_record("g", g.program, tiny, g.launch, args, max_error=0.05)
    assert rec["sample_method"] == "sampled" and rec["sample_boundaries"] == b
    # at the default threshold the same launch is simulated whole (no head passes)
    d = time_sampled(g.program, tiny, g.launch, args)
    assert not d.sampled and d.timing.cycles == w.timing.cycles


def _same_timing(a, b, where: str = "") -> None:
    """Every field of two KernelTimings equal, arrays element by element, dicts and lists deep."""
    import dataclasses

    def same(x, y, path):
        if dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                same(getattr(x, f.name), getattr(y, f.name), f"{path}.{f.name}")
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert np.array_equal(np.asarray(x), np.asarray(y)), path
        elif isinstance(x, dict):
            assert x.keys() == y.keys(), path
            for k in x:
                same(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y)):
                same(u, v, f"{path}[{i}]")
        else:
            assert x == y, path

    same(a, b, where)


def test_heads_forked_from_one_run_are_the_separate_runs(tiny):
    """_Heads runs the launch once and forks each head off it before the head's end block is
    dispatched: every head, and the whole launch after them, equal time_kernel's own runs in
    every counter, while the engine runs little more than the longest head (each fork repeats
    the end of its head). A head whose end block the run has already dispatched is run by itself."""
    from archsim.sample import _Heads

    g, args = _gemm(tiny, 768, 512, 64, Tile(32, 32, 32, 4, 2))
    C = concurrency(g.program, tiny, g.launch)
    h = _Heads(g.program, tiny, g.launch, args, C, 10**9, 1024, "cross")
    for end in (6 * C, 12 * C, 24 * C):
        want = time_kernel(g.program, tiny, g.launch, args, blocks=(0, end))
        _same_timing(h.head(end), want, f"head {end}")
    assert want.warp_instructions < h.spent < 1.1 * want.warp_instructions
    assert h.run.dispatched > 24 * C + 1            # so this head cannot be forked off the run
    _same_timing(h.head(24 * C + 1), time_kernel(g.program, tiny, g.launch, args, blocks=(0, 24 * C + 1)))
    want = time_kernel(g.program, tiny, g.launch, args)
    _same_timing(h.whole(), want, "whole")
    with pytest.raises(ValueError, match="already dispatched"):
        h.run.fork(C)


def test_a_state_copy_keeps_shared_buffers_shared_and_sparse_arrays_sparse():
    """KernelRun.fork's copy: two arrays over one buffer (a register file seen as i64 and f64)
    still share the copy of it, and the copy is independent of the original; a sparse_zeros
    array (an anonymous mapping) comes back equal, written only where it holds data."""
    from typing import NamedTuple

    from archsim.engine.state import copy_state_array, sparse_zeros
    from archsim.engine.timing import _clone_state

    class Inner(NamedTuple):
        i64: np.ndarray
        f64: np.ndarray

    class State(NamedTuple):
        inner: Inner
        again: np.ndarray
        n: int

    big = sparse_zeros((1024, 2048), np.int64)          # 16 MiB, mapped lazily
    big[3, 5], big[700, 2047], big[-1, -1] = 7, -1, 9
    st = State(Inner(big, big.view(np.float64)[10:20]), big[700], 3)
    new = _clone_state(st, {})
    assert new.n == 3 and np.array_equal(new.inner.i64, big) and new.inner.i64 is not big
    new.inner.i64[10, 10:12] = np.float64(2.5).view(np.int64)
    assert new.inner.f64[0, 10] == 2.5 and st.inner.f64[0, 10] == 0.0     # shared in the copy only
    new.again[0] = 11
    assert new.inner.i64[700, 0] == 11 and big[700, 0] == 0
    c = copy_state_array(big.base)
    assert np.array_equal(c, big.base) and not np.shares_memory(c, big)
    small = np.arange(10)
    assert np.array_equal(copy_state_array(small), small) and copy_state_array(small) is not small
