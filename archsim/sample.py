"""Wave sampling: time a big launch from a few simulated waves of thread blocks.

A transformer's GEMMs launch thousands of blocks that all do the same work; once the machine is
full, blocks retire at a steady rate. A launch of at least 2S waves (a wave is C blocks, as many
as the machine holds at once; S = ``waves``, 6 by default) is timed from a head of S waves:

    cycles = e_j + (B - 1 - j) * T_w / C,   j = (S-1)*C + (B-1) % C

- blocks [0, S*C) of the grid are simulated cycle by cycle; e_j is the cycle of the j-th of
  their retirements (in order), so it holds the cold start (empty caches, idle DRAM) and the
  drain of the head's last wave, which the whole launch has too;
- a wave's time is the mean retirement cycle of its C blocks (a GEMM's blocks drift apart wave
  by wave, so the last block of a wave is a straggler whose time says little about the rate).
  Wave 1 is warm-up (caches fill, DRAM queues reach their working depth); so is each following
  wave whose step to the next wave's mean still differs from the mean of the steps after it by
  more than ``max_error`` (the state has not settled), as long as three steady segments remain (a
  segment is a wave, or the launch's ``period`` of blocks where it has one, e.g. a GEMM's raster
  group). T_w is C times the slope between the mean retirement of the first steady segment and
  that of the last; the head's last wave is its drain, and e_j stands for the launch's drain;
- the blocks left retire at C / T_w blocks a cycle. Blocks are dispatched as slots free up, so
  the launch's last block runs in the slot of the block C retirements before it: it retires a
  whole number of wave times after the head's j-th retirement, the one at its place in the
  head's last wave (a last partial wave of blocks that stay in step ends when a full one would;
  of blocks that drifted apart, sooner). On a Sunway the MPEs' join of the head (last CPE done
  to join, engine/mpe.py) is added once (their launch is in wave 1).

A period too long for such a head (three periods and the warm-up more than half the launch: a
GEMM whose raster groups each sweep every column panel; one grid plane) is sampled in two
strata. The head holds waves of the first period only (its segments are waves). A second run,
a window of blocks around the first period boundary, measures what a boundary adds. The window
starts cold: its warm-up waves (as many as the head's, and until its L2 has filled; a head
shorter than that grows first), one steady wave, then BOUNDARY_AFTER_WAVES waves from the
boundary on. A boundary adds the window's time from its last steady wave to the wave before its
drain, less the head's rate over those blocks, once for each boundary the head left out; its
error (twice the spread of the head's steady steps, and how far the window's last step before
the drain still is from the steady one beyond that) is added to the estimate's. A head whose own
estimate is above the threshold grows without a window; one that would cross a boundary, or a
window that would leave the launch, gives way to the whole launch.

A launch that writes and brings more lines into the L2 than it holds is steady only once its L2
is full: until then the L2 takes the writes with no writebacks, later waves pay the writebacks of
the dirty lines their fills evict. The L2 fills at the wave where the head's lines (writes and
fills, spread evenly over its waves) reach its capacity; the share of the steady segments before
that wave, times the writes' share of those lines, is added to the rate's error (the traffic the
head's rate may leave out), so a head measured while its L2 still takes the writes grows. A head
whose writes all still sit in the L2 gets error 1.

``sample_error_est`` bounds the error from the steady segments themselves: the larger of their
trend (the mean step between the later half of the segments against the earlier half) and twice
the standard error of the mean step, over the mean step, plus one DRAM refresh's stall over the
measured span (a head shorter than a few refresh intervals has not seen its share of them),
times the extrapolated share of the cycles. Segment times vary systematically (a GEMM's raster
groups share panels in L2 differently wave by wave) as well as by chance, hence the trend term.
It cannot see a change of rate that starts after the head (a launch whose L2 hit rate keeps
rising for ten waves). When it is above ``max_error`` (3 % by default, ``--sample-max-error``),
the head doubles; a head that would cover more than two thirds of the launch gives way to the
whole launch (exact, error 0). The record lists every head tried (``sample_attempts``) and how
the launch was answered (``sample_method``), and counts the warp-instructions the engine ran
for it (``simulated_warp_instructions``).

Blocks keep their grid ids (``time_kernel(blocks=...)``), so they touch the addresses they touch
in the whole launch. The heads are forked off one run of the whole launch just before each
head's first block beyond it is dispatched (_Heads), so a grown head, or the whole launch after
the heads, goes on from where the last head left the run instead of starting again; each is
the same as its own run. Extensive counters (warp-instructions, flops, bytes per level, stall
warp-cycles, fabric blocked cycles, cache accesses) of the sampled waves are scaled by
B / (S*C); rates (link utilization, queue depths, row-hit rates) and the timeline are those of
the sampled waves; warp-instructions are exact when every block runs the same code.

A ``bar.grid`` kernel is never sampled: its whole grid must be resident, so it is one wave.

With ``k_tile`` (opt-in, ``--sample-k-loop``) a GEMM whose blocks loop long over K is timed instead
from its loop cut short and carried along the loop (_time_k_loop).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from archsim.engine import timing as TI
from archsim.engine.machine import KernelTiming
from archsim.isa.program import Launch, Program
from archsim.options import DEFAULT_MAX_ERROR, DEFAULT_WAVES
from archsim.stats import extensive_memory_fields, kernel_record


def concurrency(prog: Program, machine, launch: Launch) -> int:
    """Blocks the whole machine holds at once: one wave (clusters of k: whole clusters of k distinct
    SMs in each GPC)."""
    bpc = TI.blocks_per_core(prog, machine, launch)
    k = launch.cluster
    if k > 1 and getattr(machine, "clusters", None) is not None:
        return k * sum(n * bpc // k for n in machine.clusters.gpc_sms if n >= k)
    return bpc * machine.groups * machine.cores.per_group


@dataclasses.dataclass
class Sampled:
    """The outcome of a timed launch, whole or sampled."""

    timing: KernelTiming       # counters (extrapolated when sampled)
    sampled: bool
    error_est: float
    waves_total: int
    waves_simulated: float
    simulated_warp_instructions: int  # what the engine ran for the answer, every head tried included
    attempts: list = dataclasses.field(default_factory=list)  # (waves, error estimate) of each head tried
    warmup_waves: int = 0      # leading waves of the head left out of the steady rate
    interval: dict | None = None  # interval sampling's account (archsim.interval), when it was tried
    boundary: dict | None = None  # the period-boundary window of a long-period launch (_with_boundaries)
    k_loop: dict | None = None    # k-loop sampling's account (_time_k_loop), when it was tried


def _scale_memory(mem: dict, f: float) -> dict:
    """Memory counters of the sampled waves with the extensive ones scaled by f."""
    return extensive_memory_fields(mem, lambda d, key, path: int(round(d[key] * f)))


def scale_counters(t: KernelTiming, f: float, **fields) -> KernelTiming:
    """A launch's timing with its extensive counters (warp-instructions, skipped cycles, stall
    warp-cycles, flops, pipe busy cycles, the memory side's bytes, accesses and blocked cycles)
    scaled by f, ``fields`` replaced, and no buffers (a part of the launch stands for all of it)."""
    def ext(a):
        return np.rint(a * f).astype(np.int64) if isinstance(a, np.ndarray) else int(round(a * f))

    scaled = dict(warp_instructions=ext(t.warp_instructions), skipped_cycles=ext(t.skipped_cycles),
                  stall=ext(t.stall), flops=ext(t.flops), pipe_busy_cycles=ext(t.pipe_busy_cycles),
                  memory=_scale_memory(t.memory, f), buffers={})
    return dataclasses.replace(t, **{**scaled, **fields})


@dataclasses.dataclass
class _Estimate:
    cycles: float
    error: float
    warmup: int               # waves before the steady ones (the cold start and any settling)
    per_block: float = 0.0    # the steady rate: cycles a block
    step_sd: float = 0.0      # standard deviation of the steady segments' steps (cycles)


def refresh_stall_cycles(machine) -> float:
    """Core cycles one DRAM refresh blocks its bank (per_bank) or channel (all_bank): a head that
    uses the DRAM and whose steady span holds one refresh more or less than its share misjudges
    the rate by this over the span."""
    d = machine.dram
    t = d.timing.tRFCpb if d.refresh == "per_bank" else d.timing.tRFC
    return float(t) / machine.clock_ratios.memory


def _extrapolate(head, C: int, B: int, S: int, P: int, max_error: float, refresh: float = 0.0,
                 fill: tuple = (0.0, 0.0)) -> _Estimate:
    """The whole launch's cycles from a head of S waves (see the module docstring). A wave's or a
    segment's time is the mean retirement cycle of its blocks: the k*C-th retirement alone moves
    with the spread of a wave's blocks, which grows as they drift apart. The rate is measured
    between the means of segments of P blocks (the launch's period; a wave, C blocks, without one)
    from the end of the warm-up to the head's end; the head's last wave is its drain (no blocks
    follow it) and its last retirement stands for the launch's. Wave 1 is warm-up; a later leading
    wave is too while its step to the next wave differs from the mean of the steps after it by
    more than ``max_error`` and three segments remain. ``fill``: (the wave the head's L2 fills at,
    the writes' share of its lines), see _l2_fill."""
    done = np.sort(head.block_done).astype(np.float64)
    steps = np.diff(done[:S * C].reshape(S, C).mean(axis=1))   # steps[i]: wave i's mean to wave i + 1's
    seg = P if P > 0 else C
    w0 = 1
    while ((S - w0 - 1) * C >= 3 * seg and S - 2 - w0 >= 2
           and abs(steps[w0] - steps[w0 + 1:].mean()) > max_error * steps[w0 + 1:].mean()):
        w0 += 1
    n = ((S - w0) * C) // seg                                # whole segments after the warm-up
    lo = w0 * C
    means = done[lo:lo + n * seg].reshape(n, seg).mean(axis=1)
    per_block = float(means[-1] - means[0]) / ((n - 1) * seg) if n >= 2 else float(steps[-1]) / C
    # a Sunway launch ends when the MPEs have joined their CPEs: the head's join (the last block's
    # completion reaching its MPE, engine/mpe.py) follows the whole launch's last block too
    join = head.memory["mpe"]["join_cycles"] if "mpe" in head.memory else 0
    # the launch's last block takes the slot of the block C retirements before it, as the head's
    # block at the same place in its last wave did: it retires a whole number of wave times after
    # that block (blocks in step, a last partial wave ends when a full one would; blocks drifted
    # apart, it ends that many block times sooner)
    j0 = (S - 1) * C + (B - 1) % C
    tail = (B - 1 - j0) * per_block
    cycles = float(done[j0]) + join + tail
    d = np.diff(means)
    if len(d) < 2 or per_block <= 0:                          # one step bounds nothing
        rate_err = 1.0
    else:
        h = len(d) // 2
        drift = abs(d[h:].mean() - d[:h].mean())              # trend: later steps against earlier ones
        noise = 2 * d.std(ddof=1) / np.sqrt(len(d))           # about a 95 % interval of the mean
        # plus one DRAM refresh's stall over the measured span: refreshes come every tREFI, which
        # a short head may not have spanned (a small stream's waves last a fraction of it)
        rate_err = float(max(drift, noise)) / float(d.mean()) + refresh / float(means[-1] - means[0])
        # steady waves before the L2 filled paid none of the writebacks the later ones pay
        rate_err += min(max(fill[0] - w0, 0.0) / (S - w0), 1.0) * fill[1]
    sd = float(d.std(ddof=1)) if len(d) >= 2 else 0.0
    return _Estimate(cycles, rate_err * tail / cycles if cycles > 0 else 0.0, w0, per_block, sd)


def head_waves(waves: int, C: int, P: int) -> int:
    """Waves in the first head: ``waves``, and with a period of P blocks enough for the warm-up
    wave and three whole periods (two steps between their means)."""
    return max(waves, 1 + -(-3 * P // C)) if P > 0 else waves


def _first_head(waves: int, C: int, P: int, nwaves: int, launch: Launch) -> tuple[bool, int]:
    """(sampled in strata, waves of the first head) of a launch of ``nwaves`` waves of C blocks
    and period P. A period too long for a head of three of them: the head measures waves inside
    the first period, and a window around the first period boundary measures what a boundary
    adds (one grid plane: a batched launch's periods restart at every plane)."""
    strata = P > 0 and 2 * head_waves(waves, C, P) > nwaves and launch.grid[2] == 1
    return strata, (waves if strata else head_waves(waves, C, P))


def time_sampled(prog: Program, machine, launch: Launch, args: dict, *, waves: int = DEFAULT_WAVES,
                 max_error: float = DEFAULT_MAX_ERROR, max_cycles: int = 10**9, window_cycles: int = 1024,
                 sample: bool = True, placement: str = "cross", interval: bool = False,
                 upto: int | None = None, k_tile: int = 0) -> Sampled:
    """Time a launch, sampling waves when a head (head_waves) is at most half of it (see the
    module docstring); while the error estimate is above ``max_error`` the head doubles, and a
    head that would be more than two thirds of the launch gives way to the whole launch. A launch
    of one wave is sampled inside its blocks (archsim.interval) when ``interval``.
    ``sample=False`` simulates every block. ``placement``: see timing.time_kernel. ``upto``: the
    launch is cut to its first ``upto`` blocks (a scale model's grid, archsim.scale_model).
    ``k_tile``: a GEMM's k tile (Kernel.k_tile; 0: none), whose long k-loop is then sampled
    (_time_k_loop) before any of the above is tried. A launch of thread-block clusters is sampled
    in whole clusters (a wave holds whole clusters, and its period counts for strata only when it
    is whole clusters too), never inside its blocks."""
    if launch.cluster > 1:
        interval = False
    kinfo = None
    if sample and k_tile > 0:
        got, kinfo = _time_k_loop(prog, machine, launch, args, k_tile, waves=waves, max_error=max_error,
                                  max_cycles=max_cycles, window_cycles=window_cycles, placement=placement, upto=upto)
        if got is not None:
            return got
    s = _time_waves(prog, machine, launch, args, waves=waves, max_error=max_error, max_cycles=max_cycles,
                    window_cycles=window_cycles, sample=sample, placement=placement, interval=interval, upto=upto)
    if kinfo is None:
        return s
    return dataclasses.replace(s, k_loop=kinfo, simulated_warp_instructions=s.simulated_warp_instructions
                               + kinfo["simulated_warp_instructions"])


def _time_waves(prog: Program, machine, launch: Launch, args: dict, *, waves: int, max_error: float,
                max_cycles: int, window_cycles: int, sample: bool, placement: str, interval: bool,
                upto: int | None) -> Sampled:
    """time_sampled without the k-loop."""
    C = concurrency(prog, machine, launch)
    B = launch.blocks if upto is None else upto
    nwaves = -(-B // C)
    if sample and interval and nwaves == 1 and upto is None:
        got = _time_interval(prog, machine, launch, args, max_error, max_cycles, window_cycles, placement)
        if got is not None:
            return got

    def run(blocks):
        return TI.time_kernel(prog, machine, launch, args, max_cycles=max_cycles, window_cycles=window_cycles,
                              blocks=blocks, placement=placement)

    whole_blocks = None if upto is None else (0, B)

    attempts = []
    P = launch.period if launch.period % launch.cluster == 0 else 0
    strata, S = _first_head(waves, C, P, nwaves, launch)
    heads = _Heads(prog, machine, launch, args, C, max_cycles, window_cycles, placement, whole_blocks)
    if sample and waves >= 3:
        # the first head is at most half the launch, a grown one at most two thirds of it
        while (3 * S <= 2 * nwaves) if attempts else (2 * S <= nwaves):
            if strata and S * C > P:              # the head would cross a boundary: no strata
                break
            head = heads.head(S * C)
            b = head.memory["bytes"]
            refresh = refresh_stall_cycles(machine) if b["dram_read"] + b["dram_write"] > 0 else 0.0
            w = _l2_writes(head, machine, B / (S * C))
            est = _extrapolate(head, C, B, S, 0 if strata else P, max_error, refresh, _l2_fill(w, machine, S))
            if w is not None and w[1] == 0:       # every write still sits in the L2: not steady
                est = dataclasses.replace(est, error=1.0)
            bound = None
            if strata:
                # the window's waves before the boundary: its warm-up, as long as the head's and
                # until its L2 has filled, then one steady wave
                pre = max(est.warmup, _fill_wave(w, machine, S)) + 1
                lo, hi = P - pre * C, P + BOUNDARY_AFTER_WAVES * C
                if lo < 0 or hi > B:
                    break
                # a window longer than the head: grow the head first; a head above the threshold
                # grows without one
                if pre > S:
                    est = dataclasses.replace(est, error=1.0)
                elif est.error <= max_error:
                    win = run((lo, hi))
                    heads.spent += int(win.warp_instructions)
                    est, bound = _with_boundaries(est, win, C, B, S, P, pre)
            attempts.append((S, round(est.error, 5)))
            if est.error <= max_error:
                return _scaled(head, est, C, B, S, nwaves, attempts, heads.spent, bound)
            S *= 2
    t = heads.whole()
    return Sampled(t, False, 0.0, nwaves, float(nwaves), heads.spent, attempts=attempts)


# k-loop sampling: the shortest cut of the loop, in k tiles (the cuts are n, 2n, 4n: two slopes over
# equal doublings of the loop, the later carried on, their difference the error), the longest such
# n first; a loop is cut only when it is at least 16n long (the cuts cost at most 7/16 of it)
K_LOOP_FIRST = (8, 4)
K_LOOP_MIN_TILES = 16 * K_LOOP_FIRST[-1]


def k_loop_cuts(tiles: int) -> tuple | None:
    """The k-loop cuts (n, 2n, 4n tiles) of a loop of ``tiles`` k tiles; None when it is too short."""
    n = next((n for n in K_LOOP_FIRST if 16 * n <= tiles), None)
    return None if n is None else (n, 2 * n, 4 * n)


def _time_k_loop(prog: Program, machine, launch: Launch, args: dict, k_tile: int, *, waves: int, max_error: float,
                 max_cycles: int, window_cycles: int, placement: str, upto: int | None) -> tuple:
    """(Sampled, its account) of a GEMM timed from its k-loop cut short, or (None, account or None)
    when that does not apply, its cuts do not grow alike or its error estimate is above ``max_error``.

    A GEMM block's time is its prologue, n passes of its k-loop at a steady cost each once the
    copy pipeline is full, and its epilogue; so is a launch's. The same program and launch are
    timed whole with the K argument cut to n, 2n and 4n k tiles (k_loop_cuts: n = 8, or 4 for a
    loop of 64 to 127 tiles; K - (tiles - n) x k_tile: the residue tile is kept, and each block
    reads the first K columns of its operands at their real addresses). Each counter (cycles,
    each block's dispatch and retirement, the extensive counters) is carried along the line
    through the 2n- and 4n-tile cuts to the launch's tiles. The error estimate is the slope's
    change from the first doubling to the second, carried over the tiles left (a cost a tile that
    still moves, moves on). Warp-instructions must grow by the same count a tile in both
    doublings (the loop is the only thing K changes), and then they are exact.

    Not tried where an L2 sits between the operands and the cores and the launch has more than
    one wave: at short K the L2 keeps one wave's operand panels for the next, at the full K it
    does not, so the DRAM traffic a tile (and a memory-bound launch's time) changes beyond the
    cuts (gpt3-175b's ffn2 on a100, 15 waves: its cycles carried within 0.1 %, its DRAM bytes
    half the launch's). A Sunway's CPEs read their operands by DMA from memory, with no cache to
    keep them. Not tried either on a loop shorter than K_LOOP_MIN_TILES tiles, or on a launch of
    many waves whose cuts, each run whole, would cost more than half the head wave sampling
    simulates at the full K. The DRAM bytes read a tile must agree between the doublings within
    ``max_error``."""
    from archsim.interval import extend_counter, extend_counters

    K = args.get("K")
    if not isinstance(K, (int, np.integer)) or k_tile <= 0:
        return None, None
    nt = -(-int(K) // k_tile)
    cuts = k_loop_cuts(nt)
    if cuts is None:
        return None, None
    C = concurrency(prog, machine, launch)
    B = launch.blocks if upto is None else upto
    nwaves = -(-B // C)
    if machine.l2 is not None and nwaves > 1:
        return None, None
    P = launch.period if launch.period % launch.cluster == 0 else 0   # (as _time_waves counts it)
    S = _first_head(waves, C, P, nwaves, launch)[1]
    if waves >= 3 and 2 * S <= nwaves and 2 * nwaves * sum(cuts) > S * nt:
        return None, None                   # the cuts, each whole, would cost more than half a head
    blocks = None if upto is None else (0, B)
    pts = [TI.time_kernel(prog, machine, launch, {**args, "K": int(K) - (nt - n) * k_tile}, max_cycles=max_cycles,
                          window_cycles=window_cycles, blocks=blocks, placement=placement) for n in cuts]
    spent = sum(int(t.warp_instructions) for t in pts)
    n1, n2, n3 = cuts
    w = [int(t.warp_instructions) for t in pts]
    c = [float(t.cycles) for t in pts]
    info = {"k_tile": int(k_tile), "k_tiles": nt, "simulated_warp_instructions": spent,
            "points": [{"k_tiles": n, "cycles": int(x), "warp_instructions": y} for n, x, y in zip(cuts, c, w)]}
    if (w[2] - w[1]) * (n2 - n1) != (w[1] - w[0]) * (n3 - n2):
        info["refused"] = "its warp-instructions do not grow by the same count a k tile"
        return None, info
    s12, s23 = (c[1] - c[0]) / (n2 - n1), (c[2] - c[1]) / (n3 - n2)
    info["slope_cycles"] = [round(s12, 2), round(s23, 2)]
    r = [int(t.memory["bytes"]["dram_read"]) for t in pts]
    b12, b23 = (r[1] - r[0]) / (n2 - n1), (r[2] - r[1]) / (n3 - n2)
    if abs(b23 - b12) > max_error * max(b23, b12):
        info["refused"] = "its DRAM bytes read a k tile differ between the doublings"
        return None, info
    g = (nt - n3) / (n3 - n2)
    timing = extend_counters(pts[1], pts[2], g, cycles=extend_counter(pts[1].cycles, pts[2].cycles, g),
                             timeline_end=pts[2].cycles,
                             block_start=extend_counter(pts[1].block_start, pts[2].block_start, g),
                             block_done=extend_counter(pts[1].block_done, pts[2].block_done, g))
    err = min(1.0, abs(s23 - s12) * (nt - n3) / timing.cycles) if timing.cycles > 0 else 1.0
    info["error_est"] = round(err, 5)
    if err > max_error or timing.cycles > max_cycles:
        info["refused"] = f"error estimate {err:.4f} above {max_error}" if err > max_error else \
            "the launch would pass --max-cycles"
        return None, info
    return Sampled(timing, True, err, nwaves, round(nwaves * sum(cuts) / nt, 4), spent, k_loop=info), info


class _Heads:
    """The heads of a launch (its blocks [0, end), as time_kernel(blocks=(0, end)) gives them)
    from one run of the whole launch: the run goes on to just before block ``end`` is dispatched,
    a fork of it (KernelRun.fork) runs on with no block from ``end`` on, and the run itself goes
    on towards the next head or the whole launch. A head costs its last wave and drain once more,
    not all its waves; the results are the same. Heads and the whole launch already in the kernel
    cache are read from it. ``spent``: the warp-instructions the engine ran (the windows' are
    added by the caller), or a cached head's own."""

    def __init__(self, prog: Program, machine, launch: Launch, args: dict, C: int, max_cycles: int,
                 window_cycles: int, placement: str, whole: tuple[int, int] | None = None):
        self.prog, self.machine, self.launch, self.args, self.C = prog, machine, launch, args, C
        self.opts = dict(max_cycles=max_cycles, window_cycles=window_cycles, placement=placement)
        self.blocks = whole       # the blocks of the whole launch (None: all of them)
        self.run = None           # the whole launch, run as far as the last head needed
        self.spent = 0

    def _key(self, blocks):
        return TI.kernel_key(self.prog, self.machine, self.launch, self.args, blocks=blocks, **self.opts)

    def _start(self, blocks):
        return TI.start_kernel(self.prog, self.machine, self.launch, self.args, blocks=blocks,
                               window_cycles=self.opts["window_cycles"], placement=self.opts["placement"])

    def _advance(self, run, until: int) -> None:
        from archsim import kernel_cache

        before = kernel_cache.stats["simulated_warp_instructions"]   # all the engine ran (a re-timed
        run.advance(until)                                             # launch's first try included)
        self.spent += kernel_cache.stats["simulated_warp_instructions"] - before

    def head(self, end: int):
        from archsim import kernel_cache

        key = self._key((0, end))
        got = kernel_cache.load(key)
        if got is not None:
            self.spent += int(got.warp_instructions)
            return got
        if self.run is None:
            self.run = self._start(self.blocks)
        fork = self._fork_before(end)
        self._advance(fork, self.opts["max_cycles"])
        timing = fork.finish(self.opts["max_cycles"])
        kernel_cache.store(key, timing)
        return timing

    def _fork_before(self, end: int):
        """A fork of the run with no block from ``end`` on, taken at the run's last stop before
        block ``end`` was dispatched, as late as the stops allow: the run stops at half the
        cycles its retirement rate (C blocks in flight) says are left until the retirement that
        frees a slot for block ``end``, at most twice as far as its last step, and keeps a fork
        at each stop in the last wave before it."""
        run, C, limit = self.run, self.C, self.opts["max_cycles"]
        target = end - C + 1                      # retirements when block `end` is dispatched
        snap = run.fork(end) if run.dispatched <= end and run.retired >= target - C else None
        step = 512
        while run.dispatched <= end and run.now < limit and not run.done:
            left = target - run.retired
            step = max(256, min(2 * step, int(left * run.now / (run.retired + C) / 2)))
            self._advance(run, min(run.now + step, limit))
            if run.dispatched <= end and target - run.retired <= C:
                snap = None                       # one copy of the state at a time
                snap = run.fork(end)
        if snap is None:                          # passed it before a stop in its last wave
            snap = self._start((0, end))
        return snap

    def whole(self):
        """The whole launch: the run goes on to its end (time_kernel's result)."""
        from archsim import kernel_cache

        if self.run is None:                      # no head was simulated: time_kernel's own run or entry
            got = TI.time_kernel(self.prog, self.machine, self.launch, self.args, blocks=self.blocks, **self.opts)
            self.spent += int(got.warp_instructions)
            return got
        key = self._key(self.blocks)
        got = kernel_cache.load(key)
        if got is not None:
            self.spent += int(got.warp_instructions)
            return got
        if self.run.now < self.opts["max_cycles"]:
            self._advance(self.run, self.opts["max_cycles"])
        timing = self.run.finish(self.opts["max_cycles"])
        kernel_cache.store(key, timing)
        return timing


# a boundary window's waves from the boundary on: the boundary's, two to settle, the drain
BOUNDARY_AFTER_WAVES = 4


def _with_boundaries(est: _Estimate, win, C: int, B: int, S: int, P: int, pre: int) -> tuple:
    """A long-period launch's estimate with its period boundaries: ``win`` ran the blocks from
    ``pre`` waves before the boundary at block P to BOUNDARY_AFTER_WAVES after it, started cold;
    all but the last of the ``pre`` waves are its warm-up. What a boundary adds is the window's
    time from the mean of its last wave before the boundary to the mean of its last wave but
    one (the last is its drain), less the head's steady rate over those blocks; it is added once
    for every boundary after the head. Its error: twice the standard deviation of the head's
    steady steps (the noise of two wave means), and the distance of the step into that wave from
    the steady step beyond that (the boundary's effect has not settled)."""
    lo, hi = win.first_block, win.first_block + len(win.block_done)
    n = (hi - lo) // C
    mu = np.sort(win.block_done).astype(np.float64)[:n * C].reshape(n, C).mean(axis=1)
    step = C * est.per_block
    excess = float(mu[-2] - mu[pre - 1]) - (n - 1 - pre) * step
    unsettled = max(0.0, abs(float(mu[-2] - mu[-3]) - step) - 2 * est.step_sd)
    err = 2 * est.step_sd + unsettled
    count = (B - 1) // P - (S * C - 1) // P                # boundaries at block ids S*C .. B-1
    cycles = est.cycles + count * excess
    error = (est.error * est.cycles + count * err) / cycles if cycles > 0 else 1.0
    bound = {"period_blocks": P, "boundaries": int(count), "window_blocks": [int(lo), int(hi)],
             "excess_cycles": round(excess, 1), "error_cycles": round(err, 1)}
    return dataclasses.replace(est, cycles=cycles, error=error), bound


def _time_interval(prog: Program, machine, launch: Launch, args: dict, max_error: float, max_cycles: int,
                   window_cycles: int, placement: str) -> Sampled | None:
    """A one-wave launch timed by interval sampling; None when that does not apply to it. The
    kernel cache holds the answer under the launch and the sampling options."""
    from archsim import kernel_cache
    from archsim.interval import time_interval

    ckey = kernel_cache.key(prog, machine, launch, args, ("interval", max_error, max_cycles, window_cycles,
                                                          placement))
    got = kernel_cache.load(ckey)
    if got is None:
        got = time_interval(prog, machine, launch, args, max_error=max_error, max_cycles=max_cycles,
                            window_cycles=window_cycles, placement=placement,
                            refresh=refresh_stall_cycles(machine))
        if got is None:
            return None
        kernel_cache.store(ckey, got)
    done = got.info["instructions_simulated"] / max(got.info["instructions_total"], 1)
    return Sampled(got.timing, got.sampled, got.error_est, 1, round(done, 4) if got.sampled else 1.0,
                   got.info["instructions_simulated"], interval=got.info)


def _l2_writes(head, machine, scale: float) -> tuple | None:
    """(writes, writebacks, lines brought in: writes and fills) of a head's L2, for a launch that
    writes and brings more lines into the L2 than it holds (``scale``: the launch over the head);
    None otherwise."""
    caches = head.memory.get("l2") if isinstance(head.memory, dict) else None
    if not caches or machine.l2 is None:
        return None
    writes = sum(c["writes"] for c in caches)
    lines = writes + sum(c["fills"] for c in caches)
    if writes == 0 or lines * machine.l2.line_bytes * scale <= machine.l2.size_kib * 1024:
        return None
    return writes, sum(c["writebacks"] for c in caches), lines


def _fill_wave(w, machine, S: int) -> int:
    """The whole waves a launch's L2 takes to fill from cold, at a head of S waves' lines a wave
    (_l2_writes' ``w``; 0 for None: no fill to wait for)."""
    if w is None:
        return 0
    return int(np.ceil(S * machine.l2.size_kib * 1024 / (w[2] * machine.l2.line_bytes)))


def _l2_fill(w, machine, S: int) -> tuple:
    """(the wave of a head of S waves its L2 fills at, the writes' share of the lines the head
    brought into it) from _l2_writes ((0, 0) for None): the head's lines taken as spread evenly
    over its waves."""
    if w is None:
        return 0.0, 0.0
    writes, _, lines = w
    return min(float(S), S * machine.l2.size_kib * 1024 / (lines * machine.l2.line_bytes)), writes / lines


def _scaled(head, est: _Estimate, C: int, B: int, S: int, nwaves: int, attempts: list, spent: int,
            bound: dict | None = None) -> Sampled:
    """The sampled launch's record: the head's counters, the extensive ones scaled to B blocks
    (a boundary window adds its time, not its counters)."""
    t = scale_counters(head, B / (S * C), cycles=int(round(est.cycles)), timeline_end=head.cycles)
    simulated = S + ((bound["window_blocks"][1] - bound["window_blocks"][0]) / C if bound else 0)
    return Sampled(t, True, float(est.error), nwaves, float(simulated), spent, attempts=attempts,
                   warmup_waves=est.warmup, boundary=bound)


def sampled_record(name: str, prog: Program, machine, launch: Launch, args: dict, *, count: int = 1,
                   flops: int | None = None, model_flops: int | None = None, waves: int = DEFAULT_WAVES,
                   max_error: float = DEFAULT_MAX_ERROR, max_cycles: int = 10**9, sample: bool = True,
                   trace: bool = False, placement: str = "cross", interval: bool = False, k_tile: int = 0) -> dict:
    """One ``kernels`` entry of archsim.result/1 for a launch, sampled when it is big. ``trace``
    adds ``block_trace``: dispatch and retire cycle and core of every simulated block (for
    archsim.report.trace). ``k_tile``: see time_sampled."""
    s = time_sampled(prog, machine, launch, args, waves=waves, max_error=max_error, max_cycles=max_cycles,
                     sample=sample, placement=placement, interval=interval, k_tile=k_tile)
    rec = record_of(name, machine, launch, s, count=count, flops=flops, model_flops=model_flops, max_error=max_error)
    if trace:
        t = s.timing
        rec["block_trace"] = {"first_block": int(t.first_block), "start": [int(x) for x in t.block_start],
                              "done": [int(x) for x in t.block_done], "core": [int(x) for x in t.block_core]}
    return rec


def record_of(name: str, machine, launch: Launch, s: Sampled, *, count: int = 1, flops: int | None = None,
              model_flops: int | None = None, max_error: float = DEFAULT_MAX_ERROR,
              timing: KernelTiming | None = None) -> dict:
    """The kernel record of a timed launch with its sampling fields; ``timing``: the counters to
    report instead of ``s.timing`` (a scale model's, read back to the whole machine)."""
    rec = kernel_record(name, machine, launch, s.timing if timing is None else timing, count=count,
                        model_flops=model_flops, flops=flops, sampled=s.sampled,
                        sample_error_est=round(s.error_est, 5))
    sample_fields(rec, s, max_error)
    return rec


def sample_fields(rec: dict, s: Sampled, max_error: float) -> None:
    """The sampling fields of a kernel record: waves in the launch and simulated, the warm-up
    waves left out, every head tried with its error estimate, the threshold, and how the launch
    was answered (``sample_method``: whole, sampled, or whole after heads above the threshold)."""
    rec["waves"] = s.waves_total
    rec["waves_simulated"] = round(s.waves_simulated, 3)
    rec["simulated_warp_instructions"] = int(s.simulated_warp_instructions)
    rec["sample_max_error"] = max_error
    rec["sample_attempts"] = [{"waves": w, "error_est": e} for w, e in s.attempts]
    if s.sampled:
        rec["sample_warmup_waves"] = s.warmup_waves
    if s.boundary is not None:
        rec["sample_boundaries"] = s.boundary
    refused_cuts = False
    if s.k_loop is not None:
        rec["sample_k_loop"] = s.k_loop
        refused_cuts = "refused" in s.k_loop
        if not refused_cuts:                  # the cuts answered
            rec["sample_method"] = "k_loop"
            return
    if s.interval is not None:
        rec["sample_interval"] = s.interval
        rec["sample_method"] = "interval" if s.sampled else (
            "whole_after_fallback" if s.interval["stops"] or refused_cuts else "whole")
        return
    rec["sample_method"] = "sampled" if s.sampled else (
        "whole_after_fallback" if s.attempts or refused_cuts else "whole")
