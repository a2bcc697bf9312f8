"""DRAM channels: formula oracles for latency and bandwidth, timing rules checked on the command
log by an independent Python checker, scheduling policies, back-pressure, address mapping and
skip-ahead. The block is driven by a small Python harness: push request ids, step, pop."""

from collections import deque
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archsim.config import dram_burst_cycles, load_machine
from archsim.engine.dram import (B_HITS, B_OPEN, H_BANK, H_OLDER, H_ROW, H_SEQ, H_YOUNGER, K_NSEEN, P_BFP, P_BINT,
                                 P_BTAB, P_S, S_OLDEST, S_YOUNGEST, channel_address, cross_base, dram_address,
                                 dram_counters, dram_log, dram_map, dram_next_event, dram_queue_capacity, dram_step,
                                 make_dram_state, private_rows, refresh_first_due, refresh_interval, segment_base,
                                 segment_bytes)
from archsim.engine.queues import KIND_READ, KIND_WRITE, make_queues, make_requests, q_peek, q_pop, q_push, req_alloc

NO_REFRESH = ["dram.timing.tREFI=1000000000"]
_machines = {}


def machine(name, sets=()):
    key = (name, tuple(sets))
    if key not in _machines:
        _machines[key] = load_machine(name, sets=list(sets))
    return _machines[key]


class Run:
    """Drive every channel of a DramState with a trace of (arrival cycle, addr, nbytes, kind).
    Requests wait in a per-channel FIFO until their input queue has room (the producer stalls)."""

    def __init__(self, m, *, log_len=0, out_cap=4096, qcap=None, **kw):
        self.m = m
        self.D = make_dram_state(m, log_len=log_len, **kw)
        self.C = m.dram.channels
        self.Q = make_queues([qcap or dram_queue_capacity(m)] * self.C + [out_cap] * self.C)
        self.R = make_requests(1 << 16)
        self.pend = [deque() for _ in range(self.C)]
        self.done = {}
        self.order = []
        self.ids = []
        self.now = 0

    def add(self, t, addr, nbytes=64, kind=KIND_READ):
        rid = int(req_alloc(self.R, addr, nbytes, kind, 0, 0, t))
        self.pend[int(dram_map(self.D, addr)[0])].append((t, rid))
        self.ids.append(rid)
        return rid

    def _push(self):
        for c in range(self.C):
            p = self.pend[c]
            while p and p[0][0] <= self.now and self.Q.count[c] < self.Q.cap[c]:
                q_push(self.Q, c, p.popleft()[1])

    def pop(self):
        for c in range(self.C):
            while self.Q.count[self.C + c]:
                rid = int(q_pop(self.Q, self.C + c))
                assert rid not in self.done, "a request completed twice"
                self.done[rid] = self.now
                self.order.append(rid)

    def run(self, until=None, *, skip=False, pop=True, max_cycles=2_000_000):
        """Step until every added request is done (or cycle ``until``); returns the cycle after."""
        while self.now < max_cycles:
            if until is None and len(self.done) == len(self.ids) and self.ids:
                break
            if until is not None and self.now >= until:
                break
            self._push()
            dram_step(self.D, self.Q, self.R, 0, self.C, self.now)
            if pop:
                self.pop()
            nxt = self.now + 1
            if skip and not (until is None and len(self.done) == len(self.ids)):
                nxt = int(dram_next_event(self.D, self.Q, 0, self.now + 1))
                for c in range(self.C):
                    if self.pend[c] and self.Q.count[c] < self.Q.cap[c]:
                        nxt = min(nxt, max(self.pend[c][0][0], self.now + 1))
                if until is not None:
                    nxt = min(nxt, until)
            self.now = nxt
        assert self.now < max_cycles, "the run did not finish"
        return self.now

    def latency(self, rid):
        return self.done[rid] - int(self.R.t_created[rid])

    def counters(self, elapsed=None):
        return dram_counters(self.D, elapsed_mem_cycles=elapsed)


def tm(m):
    return m.dram.timing


def burst(D):
    return int(D.prm[P_BINT])


# ------------------------------------------------------------------------------ timing checker

def check_timing(m, D, channel):
    """Every logged command of ``channel`` obeys the timing table (an independent reference of
    the rules; per sub-channel: banks, bank groups, tFAW, one command per cycle)."""
    t = tm(m)
    S = int(D.prm[P_S])
    nbs, bpg = m.dram.banks // S, m.dram.banks // m.dram.bank_groups
    B = burst(D)
    FPU, bfp = 1 << 16, int(D.prm[P_BFP])
    log = dram_log(D, channel)
    assert log, "empty command log"
    last = {}       # (kind, bank) -> cycle of the last such command on the bank
    last_g = {}     # (kind, group) -> cycle
    last_s = {}     # (kind, sub-channel) -> cycle
    acts = {}       # sub-channel -> ACT cycles
    slots = set()
    auto_pre = [(cyc, b) for cyc, cmd, b, arg in log if arg == -2]
    act_at = [(cyc, b) for cyc, cmd, b, arg in log if cmd == "ACT"]

    def closing(b, cyc):
        """An automatic precharge of bank b (committed earlier) is still to come: PREA skips it."""
        tp = min((tp for tp, bb in auto_pre if bb == b and tp >= cyc), default=None)
        nxt = min((ta for ta, bb in act_at if bb == b and ta > cyc), default=10**18)
        return tp is not None and tp <= nxt

    open_row = {}
    refresh_until = {}
    bank_refresh_until = {}
    for cyc, cmd, x, arg in log:
        if arg == -2:                                   # automatic precharge: no command slot
            b = x
            assert cyc >= last.get(("ACT", b), -10**9) + t.tRAS
            assert cyc >= last.get(("RD", b), -10**9) + t.tRTP
            assert cyc >= last.get(("WR", b), -10**9) + t.tCWL + B + t.tWR
            last[("PRE", b)] = cyc
            open_row.pop(b, None)
            continue
        s = x if cmd in ("REF", "PREA") else x // nbs
        assert (s, cyc) not in slots, f"two commands on sub-channel {s} at cycle {cyc}"
        slots.add((s, cyc))
        if cmd == "REFSB":                              # per-bank refresh of bank x
            assert x not in open_row, "REFSB on an open bank"
            assert cyc >= last.get(("PRE", x), -10**9) + t.tRP
            assert cyc >= last.get(("ACT", x), -10**9) + t.tRC
            bank_refresh_until[x] = cyc + t.tRFCpb
            continue
        if cmd in ("REF", "PREA"):
            banks = range(s * nbs, (s + 1) * nbs)
            if cmd == "PREA":
                for b in banks:
                    if b in open_row and not closing(b, cyc):
                        assert cyc >= last.get(("ACT", b), -10**9) + t.tRAS
                        assert cyc >= last.get(("RD", b), -10**9) + t.tRTP
                        assert cyc >= last.get(("WR", b), -10**9) + t.tCWL + B + t.tWR
                        open_row.pop(b)
                        last[("PRE", b)] = cyc
            else:
                for b in banks:
                    assert b not in open_row, "REF with an open bank"
                    assert cyc >= last.get(("PRE", b), -10**9) + t.tRP
                    assert cyc >= last.get(("ACT", b), -10**9) + t.tRC
                refresh_until[s] = cyc + t.tRFC
            continue
        b, g = x, x // bpg
        if cmd == "ACT":
            assert b not in open_row
            assert cyc >= refresh_until.get(s, -10**9), "ACT during tRFC"
            assert cyc >= bank_refresh_until.get(b, -10**9), "ACT during the bank's tRFCpb"
            assert cyc >= last.get(("ACT", b), -10**9) + t.tRC
            assert cyc >= last.get(("PRE", b), -10**9) + t.tRP
            assert cyc >= last_g.get(("ACT", g), -10**9) + t.tRRD_L
            assert cyc >= last_s.get(("ACT", s), -10**9) + t.tRRD_S
            a = acts.setdefault(s, [])
            if len(a) >= 4:
                assert cyc >= a[-4] + t.tFAW, f"tFAW: ACTs at {a[-4:]} and {cyc}"
            a.append(cyc)
            open_row[b] = arg
            last[("ACT", b)] = cyc
            last_g[("ACT", g)] = cyc
            last_s[("ACT", s)] = cyc
        elif cmd == "PRE":
            assert b in open_row
            assert cyc >= last.get(("ACT", b), -10**9) + t.tRAS
            assert cyc >= last.get(("RD", b), -10**9) + t.tRTP
            assert cyc >= last.get(("WR", b), -10**9) + t.tCWL + B + t.tWR
            open_row.pop(b)
            last[("PRE", b)] = cyc
        else:                                           # RD / WR
            assert b in open_row
            assert cyc >= last[("ACT", b)] + t.tRCD
            for k in ("RD", "WR"):
                assert cyc >= last_g.get((k, g), -10**9) + t.tCCD_L
                assert cyc >= last_s.get((k, s), -10**9) + t.tCCD_S
            if cmd == "RD":
                assert cyc >= last_g.get(("WR", g), -10**9) + t.tCWL + B + t.tWTR_L
                assert cyc >= last_s.get(("WR", s), -10**9) + t.tCWL + B + t.tWTR_S
            lat = t.tCL if cmd == "RD" else t.tCWL
            start = (cyc + lat) * FPU                   # data: the bus frees within its first cycle
            bus = last_s.get(("DATA", s), -10**12)
            assert bus < start + FPU, f"data-bus overlap at cycle {cyc}"
            last_s[("DATA", s)] = max(start, bus) + bfp
            last[(cmd, b)] = cyc
            last_g[(cmd, g)] = cyc
            last_s[(cmd, s)] = cyc
    return log


def check_hits_invariant(D, Q, C):
    """The incremental per-bank hit counts equal a recount of the queued requests."""
    for c in range(C):
        want = np.zeros(D.bank.shape[1], np.int64)
        for k in range(int(Q.count[c])):
            sl = (int(Q.head[c]) + k) % int(Q.cap[c])
            b, row = int(D.shadow[c, sl, H_BANK]), int(D.shadow[c, sl, H_ROW])
            if D.bank[c, b, B_OPEN] == row:
                want[b] += 1
        assert np.array_equal(D.bank[c, :, B_HITS], want)


def check_age_lists(D, Q, C):
    """Each sub-channel's age list (what FR-FCFS scans, oldest first) holds exactly the seen queued
    requests whose next burst goes to that sub-channel, in arrival order, linked both ways."""
    S = int(D.prm[P_S])
    for c in range(C):
        want = [[] for _ in range(S)]
        for k in range(int(D.chan[c, K_NSEEN])):                # seen entries stay in front
            sl = (int(Q.head[c]) + k) % int(Q.cap[c])
            want[int(D.prm[P_BTAB + 2 * int(D.shadow[c, sl, H_BANK])])].append((int(D.shadow[c, sl, H_SEQ]), sl))
        for s in range(S):
            got, sl, prev = [], int(D.sub[c, s, S_OLDEST]), -1
            while sl >= 0:
                assert int(D.shadow[c, sl, H_OLDER]) == prev
                got.append(sl)
                prev, sl = sl, int(D.shadow[c, sl, H_YOUNGER])
                assert len(got) <= int(Q.count[c]), "the list loops"
            assert int(D.sub[c, s, S_YOUNGEST]) == prev
            assert got == [x for _, x in sorted(want[s])]


# ------------------------------------------------------------------------------ oracles

@pytest.mark.parametrize("name", ["tiny-gpu", "a100"])
def test_unloaded_latencies_match_the_timing_formulas(name):
    m = machine(name, NO_REFRESH)
    t = tm(m)
    r = Run(m, log_len=256)
    D = r.D
    B = burst(D)
    S = int(D.prm[P_S])
    # a sub-channel carries 1/S of the channel: its burst takes S x burst_cycles (rounded up
    # only by the configs' rounding of clock ratios)
    assert abs(S * dram_burst_cycles(m) - B) < 0.01 * B
    assert D.prm[P_BFP] >= S * dram_burst_cycles(m) * (1 << 16) - 1
    bb = m.dram.burst_bytes                                      # one burst per request
    a_row5 = dram_address(D, 0, 3, 5, 0)
    closed = r.add(0, a_row5, bb)
    hit = r.add(200, dram_address(D, 0, 3, 5, bb), bb)
    conflict = r.add(400, dram_address(D, 0, 3, 9, 0), bb)      # tRAS long past
    early = r.add(410, dram_address(D, 0, 3, 5, 2 * bb), bb)    # conflicts again, before tRAS
    wr_closed = r.add(800, dram_address(D, 0, 7, 2, 0), bb, kind=KIND_WRITE)
    r.run()
    assert r.latency(closed) == t.tRCD + t.tCL + B
    assert r.latency(hit) == t.tCL + B
    assert r.latency(conflict) == t.tRP + t.tRCD + t.tCL + B
    act9 = 400 + t.tRP                                           # PRE at 400, ACT of row 9
    assert r.done[early] == act9 + t.tRAS + t.tRP + t.tRCD + t.tCL + B
    assert r.latency(wr_closed) == t.tRCD + t.tCWL + B
    rec = r.counters()[0]
    assert (rec["row_hits"], rec["row_misses"], rec["row_conflicts"]) == (1, 2, 2)
    assert (rec["reads"], rec["writes"], rec["bytes_read"], rec["bytes_written"]) == (4, 1, 4 * bb, bb)
    assert rec["latency_sum"] == sum(r.latency(i) for i in r.ids) and rec["latency_count"] == 5
    check_timing(m, D, 0)


def test_a_request_crossing_a_row_needs_both_rows():
    m = machine("tiny-gpu", NO_REFRESH)
    t = tm(m)
    r = Run(m, log_len=64)
    last_col = m.dram.row_bytes - 64
    bank = next(b for b in range(m.dram.banks)                  # keep both bursts on channel 0
                if dram_map(r.D, dram_address(r.D, 0, b, 7, last_col) + 64)[0] == 0)
    a = dram_address(r.D, 0, bank, 7, last_col)
    assert dram_map(r.D, a + 64)[1:3] != (bank, 7)              # the second burst: another row or bank
    rid = r.add(0, a, 128)
    r.run()
    rec = r.counters()[0]
    assert rec["activates"] == 2 and rec["reads"] == 1 and rec["bytes_read"] == 128
    assert r.latency(rid) >= t.tRCD + t.tCL + 2 * burst(r.D)
    check_timing(m, r.D, 0)


def stream(m, n, *, random_rows=False, kind=KIND_READ, size=128, seed=0):
    """n requests to channel 0 only: sequential addresses, or random banks and rows."""
    r = Run(m)
    rng = np.random.default_rng(seed)
    if random_rows:
        for b, row in zip(rng.integers(0, m.dram.banks, n), rng.integers(0, 1 << 14, n)):
            r.add(0, dram_address(r.D, 0, int(b), int(row), 0), size, kind)
    else:
        for i in range(n):
            r.add(0, channel_address(r.D, 0, i * size), size, kind)   # channel 0's own sequence
    end = r.run()
    return r, end


@pytest.mark.parametrize("name", ["tiny-gpu", "a100"])
def test_sequential_stream_reaches_the_channel_rate_and_never_exceeds_it(name):
    m = machine(name, NO_REFRESH)
    r, end = stream(m, 6000)
    rec = r.counters(end)[0]
    peak = m.dram.channel_gbps
    assert 0.90 * peak <= rec["gbps"] <= peak
    # a 128-B stream misses once per row (the row's first column)
    assert rec["data_bus_util"] <= 1.0 and rec["row_hit_rate"] > 1 - 128 / m.dram.row_bytes - 0.01
    assert rec["queue_max"] == dram_queue_capacity(m) and rec["queue_mean"] > 0.9 * dram_queue_capacity(m)
    # never above the channel rate in any window, either (a request counts when its last burst
    # ends: each of the S sub-channels may bring one into a window with most of its data before it)
    ghz = float(r.D.clk[0])
    done = np.array(sorted(r.done.values()))
    W, S = 500, int(r.D.prm[P_S])
    for w0 in range(0, end - W, W):
        nbytes = 128 * np.count_nonzero((done >= w0) & (done < w0 + W))
        assert nbytes * ghz / W <= peak * (1 + max(2, S) * 128 / (W * peak / ghz))


@pytest.mark.parametrize("name", ["tiny-gpu", "a100"])
def test_refresh_costs_about_tRFC_per_tREFI_of_streaming(name):
    m = machine(name, ["dram.refresh=all_bank"])
    t = tm(m)
    r, end = stream(m, 6000)
    rec = r.counters(end)[0]
    eff = rec["gbps"] / m.dram.channel_gbps
    S = int(r.D.prm[P_S])
    n_ref = len(range(refresh_first_due(m, 0), end, t.tREFI))
    assert n_ref >= 1 and rec["refreshes"] == S * n_ref
    expect = 1 - n_ref * t.tRFC / end                          # the channel stops tRFC per refresh
    assert expect - 0.06 <= eff <= expect + 0.01


@pytest.mark.parametrize("name", ["tiny-gpu", "a100"])
def test_random_rows_miss_the_row_buffer_and_lose_bandwidth(name):
    m = machine(name, NO_REFRESH)
    seq = stream(m, 2000, size=64)
    rnd = stream(m, 2000, size=64, random_rows=True)
    s, q = seq[0].counters(seq[1])[0], rnd[0].counters(rnd[1])[0]
    assert q["row_hit_rate"] < 0.05 < 0.9 < s["row_hit_rate"]
    assert q["gbps"] < 0.75 * s["gbps"]
    assert q["activates"] >= 0.95 * 2000 and q["latency_mean"] > s["latency_mean"]


def test_refresh_every_tREFI_blocks_for_tRFC():
    m = machine("tiny-gpu")
    t = tm(m)
    r = Run(m, log_len=256)
    due0 = refresh_first_due(m, 0)
    due1 = refresh_first_due(m, 1)
    assert due0 == t.tREFI and t.tREFI < due1 < 2 * t.tREFI      # channels are staggered
    opened = r.add(due0 - 60, dram_address(r.D, 0, 1, 4, 0))      # leaves bank 1 open at the refresh
    late = r.add(due0 + 1, dram_address(r.D, 0, 5, 6, 0))          # arrives during tRFC
    r.run()
    end = r.run(until=3 * t.tREFI + 10, skip=True)
    log = dram_log(r.D, 0)
    S = int(r.D.prm[P_S])
    assert S == 2
    refs = {s: [c for c, cmd, x, _ in log if cmd == "REF" and x == s] for s in range(S)}
    prea = [(c, x) for c, cmd, x, _ in log if cmd == "PREA"]
    act1 = due0 - 60
    # sub-channel 0 (banks 0-7) has an open bank at each refresh but the last: it precharges first
    assert prea == [(max(due0, act1 + t.tRAS), 0), (due0 + t.tREFI, 0)]
    assert refs[0] == [due0 + t.tRP, due0 + t.tREFI + t.tRP, due0 + 2 * t.tREFI]
    assert refs[1] == [due0, due0 + t.tREFI, due0 + 2 * t.tREFI]       # idle: exactly every tREFI
    assert r.done[late] == due0 + t.tRP + t.tRFC + t.tRCD + t.tCL + burst(r.D)
    assert r.done[opened] == act1 + t.tRCD + t.tCL + burst(r.D)
    rec = r.counters(end)
    assert rec[0]["refreshes"] == 3 * S and rec[1]["refreshes"] == 2 * S
    check_timing(m, r.D, 0)


PER_BANK = ["dram.refresh=per_bank", "dram.timing.tRFCpb=160"]


@pytest.mark.parametrize("mode", ["per_bank", "all_bank"])
def test_per_bank_refresh_blocks_only_its_bank_for_tRFCpb_and_all_bank_blocks_all(mode):
    m = machine("tiny-gpu", PER_BANK + [f"dram.refresh={mode}"])
    t = tm(m)
    r = Run(m, log_len=512)
    S = int(r.D.prm[P_S])
    nbs = m.dram.banks // S
    T = refresh_interval(m)
    due0 = refresh_first_due(m, 0)
    assert S == 2 and due0 == T and T == (t.tREFI // nbs if mode == "per_bank" else t.tREFI)
    opened = r.add(due0 - 60, dram_address(r.D, 0, 0, 4, 0))      # bank 0 (its turn first) is open at the due cycle
    same = r.add(due0 + 1, dram_address(r.D, 0, 0, 6, 0))          # bank 0 again, during its refresh
    other = r.add(due0 + 1, dram_address(r.D, 0, nbs - 1, 6, 0))   # another bank of sub-channel 0 (its turn comes last)
    r.run()
    end = r.run(until=due0 + 3 * T + 10, skip=True)
    log = dram_log(r.D, 0)
    act0 = due0 - 60
    ref0 = max(due0, act0 + t.tRAS) + t.tRP                      # the refresh precharges bank 0 first
    full = t.tRCD + t.tCL + burst(r.D)
    assert r.done[opened] == act0 + full
    if mode == "per_bank":
        refs = [(c, x) for c, cmd, x, _ in log if cmd == "REFSB"]
        # each sub-channel's banks take turns, one every T; an idle bank refreshes exactly when due
        assert refs[:2] == [(due0, nbs), (ref0, 0)]
        assert sorted(refs[2:6]) == [(due0 + T, 1), (due0 + T, nbs + 1), (due0 + 2 * T, 2), (due0 + 2 * T, nbs + 2)]
        assert r.done[same] == ref0 + t.tRFCpb + full                # its bank: blocked for tRFCpb
        assert r.done[other] == due0 + 1 + full                      # another bank: not blocked at all
        assert not any(cmd in ("REF", "PREA") for _, cmd, _, _ in log)
        assert r.counters(end)[0]["refreshes"] == len(refs)
    else:
        assert [c for c, cmd, x, _ in log if cmd == "REF" and x == 0][0] == ref0
        assert r.done[same] == ref0 + t.tRFC + full                  # every bank waits for tRFC
        assert r.done[other] == ref0 + t.tRFC + t.tRRD_S + full      # (after `same`'s ACT: tRRD_S)
        assert not any(cmd == "REFSB" for _, cmd, _, _ in log)
    check_timing(m, r.D, 0)


@pytest.mark.parametrize("name", ["tiny-gpu", "a100"])
def test_per_bank_refresh_keeps_more_of_the_stream_bandwidth_than_all_bank(name):
    sets = ["dram.timing.tRFCpb=195"] if name == "a100" else PER_BANK
    pb = machine(name, sets + ["dram.refresh=per_bank"])
    ab = machine(name, sets + ["dram.refresh=all_bank"])
    (rp, ep), (ra, ea) = stream(pb, 6000), stream(ab, 6000)
    gp, ga = rp.counters(ep)[0]["gbps"], ra.counters(ea)[0]["gbps"]
    S = int(rp.D.prm[P_S])
    n_due = len(range(refresh_first_due(pb, 0), ep, refresh_interval(pb)))
    assert S * (n_due - 1) <= rp.counters(ep)[0]["refreshes"] <= S * n_due   # (the last one may still wait on its bank)
    assert gp > ga
    if name == "a100":      # (tiny-gpu's 8-deep queue fills with requests for the refreshing bank)
        assert gp >= 0.9 * pb.dram.channel_gbps


@pytest.mark.parametrize("faw", [None, 40])
def test_tFAW_limits_the_activate_rate(faw):
    m = machine("tiny-gpu", NO_REFRESH + ([f"dram.timing.tFAW={faw}"] if faw else []))
    t = tm(m)
    r = Run(m, log_len=256)
    S = int(r.D.prm[P_S])
    nbs, bpg = m.dram.banks // S, m.dram.banks // m.dram.bank_groups
    # six closed banks of sub-channel 0, alternating bank groups (so tRRD_S applies)
    banks = [g * bpg + k for k in range(bpg) for g in range(nbs // bpg)][:6]
    for b in banks:
        r.add(0, dram_address(r.D, 0, b, 3, 0))
    r.run()
    acts = [c for c, cmd, b, _ in dram_log(r.D, 0) if cmd == "ACT"]
    assert acts[:4] == [0, t.tRRD_S, 2 * t.tRRD_S, 3 * t.tRRD_S]
    assert acts[4] == max(4 * t.tRRD_S, t.tFAW)                   # four ACTs, then a wait
    assert acts[5] == max(acts[4] + t.tRRD_S, acts[1] + t.tFAW)
    check_timing(m, r.D, 0)


def mixed_trace(r, rows=(1, 2), n=24):
    D = r.D
    for i in range(n):
        r.add(0, dram_address(D, 0, 4, rows[i % 2], 64 * (i // 2)))


def test_frfcfs_finishes_a_mixed_hit_conflict_trace_sooner_than_fcfs():
    fr = Run(machine("tiny-gpu", NO_REFRESH), log_len=512)
    fc = Run(machine("tiny-gpu", NO_REFRESH + ["memory_controllers.policy=fcfs"]), log_len=512)
    for r in (fr, fc):
        mixed_trace(r)
        r.run()
        check_timing(r.m, r.D, 0)
    a, b = fr.counters()[0], fc.counters()[0]
    assert max(fr.done.values()) < 0.5 * max(fc.done.values())
    assert a["row_hit_rate"] > 0.6 and b["row_hit_rate"] == 0 and b["row_conflicts"] == 23
    assert fc.order == fc.ids                                   # FCFS serves strictly in order


def test_closed_rows_precharge_after_the_last_queued_hit():
    m = machine("tiny-gpu", NO_REFRESH + ["memory_controllers.row_policy=closed"])
    t = tm(m)
    r = Run(m, log_len=64)
    a = r.add(0, dram_address(r.D, 0, 3, 5, 0))
    b = r.add(0, dram_address(r.D, 0, 3, 5, 64))                # queued hit: the row stays open for it
    c = r.add(300, dram_address(r.D, 0, 3, 5, 128))             # same row, but it was closed meanwhile
    r.run()
    B = burst(r.D)
    assert r.latency(a) == t.tRCD + t.tCL + B
    assert r.latency(c) == t.tRCD + t.tCL + B                   # a miss, not a conflict
    rec = r.counters()[0]
    assert (rec["row_hits"], rec["row_misses"], rec["row_conflicts"]) == (1, 2, 0)
    assert rec["precharges"] == 2 and rec["activates"] == 2
    check_timing(m, r.D, 0)


def test_a_full_output_queue_blocks_and_loses_nothing():
    m = machine("tiny-gpu", NO_REFRESH)
    r = Run(m, out_cap=1)
    n = 120
    for i in range(n):
        r.add(0, channel_address(r.D, i % r.C, i // r.C * 64))    # both channels
    r.run(until=400, pop=False)
    rec = r.counters()
    assert sum(x["blocked_cycles"] for x in rec) > 300
    held = sum(int(r.Q.count[c]) for c in range(r.C))
    assert held > 0 and sum(x["reads"] for x in rec) == 2         # one per output queue so far
    r.run()                                                     # now pop every cycle
    assert sorted(r.done) == sorted(r.ids) and len(r.order) == n
    assert sum(x["reads"] for x in r.counters()) == n


@pytest.mark.parametrize("mode", ["masked", "rmw"])
def test_a_write_covering_part_of_a_burst_is_read_merged_and_written_under_rmw(mode):
    m = machine("tiny-sunway", NO_REFRESH + [f"dram.partial_writes={mode}"])
    t = tm(m)
    r = Run(m, log_len=64)
    B = burst(r.D)
    bb = m.dram.burst_bytes
    a = dram_address(r.D, 0, 5, 3, 0)
    r.add(0, a, bb, KIND_READ)                                   # opens the row
    full = r.add(200, a + bb, bb, kind=KIND_WRITE)               # whole burst
    part = r.add(400, a + 8, 2 * bb - 16, kind=KIND_WRITE)      # the same two bursts, both in part
    r.run()
    rec = r.counters()[0]
    cmds = [(cyc, name) for cyc, name, _, rid in dram_log(r.D, 0) if rid == part and name in ("RD", "WR")]
    assert rec["writes"] == 2 and rec["bytes_written"] == bb + 2 * bb - 16
    assert r.latency(full) == t.tCWL + B                         # a whole burst is never read first
    if mode == "masked":
        assert rec["rmw_reads"] == 0 and [n for _, n in cmds] == ["WR", "WR"]
        assert r.latency(part) == t.tCWL + max(t.tCCD_L, B) + B   # two writes to one bank group
    else:
        assert rec["rmw_reads"] == 2 and [n for _, n in cmds] == ["RD", "WR", "RD", "WR"]
        for (t_rd, _), (t_wr, _) in ((cmds[0], cmds[1]), (cmds[2], cmds[3])):
            assert t_wr >= t_rd + t.tCL + B                      # the old data is back before the merge
        assert r.latency(part) > t.tCWL + 2 * B + t.tCL
        assert rec["row_hits"] + rec["row_misses"] + rec["row_conflicts"] == 3   # one class per request
    check_timing(m, r.D, 0)


def test_misaligned_writes_lose_most_of_the_channel_under_rmw():
    """A stream of writes that each start 8 B into a burst: under rmw every burst turns the bus
    around twice (a read, then the write after its data), under masked writes it streams."""
    def run(mode, offset):
        m = machine("tiny-sunway", NO_REFRESH + [f"dram.partial_writes={mode}"])
        r = Run(m)
        for i in range(256):
            r.add(0, channel_address(r.D, 0, i * 256 + offset), 128, KIND_WRITE)
        return r.run(), r.counters()[0]
    aligned, _ = run("rmw", 0)
    masked, _ = run("masked", 8)
    rmw, rec = run("rmw", 8)
    assert rec["rmw_reads"] == 2 * 256
    assert masked < 1.6 * aligned          # three bursts a write instead of two
    assert rmw > 1.5 * masked


# ------------------------------------------------------------------------------ mapping

@pytest.mark.parametrize("bank_hash", ["row", "fold"])
@pytest.mark.parametrize("order", ["banks_low", "columns_low"])
@pytest.mark.parametrize("name", ["tiny-gpu", "a100"])
def test_interleave_spreads_chunks_over_channels_and_streams_over_banks(name, order, bank_hash):
    m = machine(name, ["memory_controllers.address_mapping.kind=interleave",
                       f"memory_controllers.address_mapping.bank_order={order}",
                       f"memory_controllers.address_mapping.bank_hash={bank_hash}"])
    D = make_dram_state(m)
    IL, C = m.memory_controllers.address_mapping.interleave_bytes, m.dram.channels
    for i in range(4 * C):
        chans = {dram_map(D, i * IL + off)[0] for off in (0, 64, IL - 1)}
        assert chans == {i % C}
    # channel 0's own sequence: 128-B chunks rotate over sub-channels and bank groups, each bank
    # reads its row from column 0 up
    S = int(D.prm[P_S])
    nbs, bpg = m.dram.banks // S, m.dram.banks // m.dram.bank_groups
    span = 2 * m.dram.banks * m.dram.row_bytes          # two rows of every bank
    locs = [dram_map(D, (la // IL * C) * IL + la % IL) for la in range(0, span, 128)]
    assert all(loc[0] == 0 for loc in locs)
    assert [channel_address(D, 0, la) for la in range(0, span, 128)] == [(la // IL * C) * IL + la % IL
                                                                       for la in range(0, span, 128)]
    same = sum((prev[1] // nbs, prev[1] // bpg) == (cur[1] // nbs, cur[1] // bpg) for prev, cur in zip(locs, locs[1:]))
    field = m.dram.bank_groups if order == "columns_low" else m.dram.banks   # the hashed field's size
    # row: never twice in a row; fold: only where a carry ripples through digits of the hash
    assert same == 0 if bank_hash == "row" else same <= len(locs) / field ** 2
    assert len({loc[1] for loc in locs}) == m.dram.banks
    rows, last, gaps = {}, {}, []
    for i, (ch, b, row, col) in enumerate(locs):
        assert col == rows.get((b, row), -128) + 128
        rows[(b, row)] = col
        if col:
            gaps.append(i - last[(b, row)])
        last[(b, row)] = i
    # the next column of an open row: S x bank groups chunks on (columns_low), after every bank
    # (banks_low); fold moves the field by one per column, so the gap varies about that
    if bank_hash == "row":
        assert set(gaps) == {field}
    else:
        assert 1 <= min(gaps) and max(gaps) < 2 * field and abs(np.mean(gaps) - field) < 0.05 * field
    for args in ((C - 1, 5, 77, 320), (0, m.dram.banks - 1, 3, m.dram.row_bytes - 64)):
        assert dram_map(D, dram_address(D, *args)) == args


STREAM_CH0 = Path(__file__).parent / "data" / "a100_stream_channel0.npz"


@pytest.mark.parametrize("bank_hash", ["row", "fold"])
def test_fold_keeps_a_gpu_streams_requests_spread_over_pseudo_channels(bank_hash):
    """9953 requests in the order a100's channel 0 received them in the middle of `micro bandwidth`
    read over 128 MiB (pseudo-channel geometry), as channel-local addresses. Warps drift apart
    over a long stream, so the requests in flight come from everywhere and share low address bits
    with their warp: the row hash leaves some pseudo-channels with twice the requests of others
    and the channel, kept full, moves 0.76 of its peak; fold spreads them evenly and it moves 0.96."""
    local = np.load(STREAM_CH0)["local"].astype(np.int64)
    m = machine("a100", [f"memory_controllers.address_mapping.bank_hash={bank_hash}"] + NO_REFRESH)
    r = Run(m)
    for la in local:
        r.add(0, channel_address(r.D, 0, int(la)), 128)
    S = int(r.D.prm[P_S])
    count = np.bincount([dram_map(r.D, r.R.addr[i])[1] // (m.dram.banks // S) for i in r.ids], minlength=S)
    end = r.run(skip=True)
    util = r.counters(end)[0]["data_bus_util"]
    if bank_hash == "fold":
        assert count.max() < 1.05 * count.mean() and util > 0.93
    else:
        assert count.max() > 1.2 * count.mean() and util < 0.85


@pytest.mark.parametrize("order", ["banks_low", "columns_low"])
def test_row_chunk_keeps_an_interleave_granule_in_one_row(order):
    """row_chunk_bytes 256: the two lines of each 256-B granule a channel gets share one bank row
    (consecutive columns), consecutive granules go to other banks, and the map inverts."""
    m = machine("a100", ["memory_controllers.address_mapping.kind=interleave",
                         f"memory_controllers.address_mapping.bank_order={order}",
                         "memory_controllers.address_mapping.row_chunk_bytes=256"])
    D = make_dram_state(m)
    IL, C = 256, m.dram.channels
    for g in range(64):
        a = g * IL * C + 3 * IL                          # granule g of channel 3
        ch0, b0, r0, c0 = dram_map(D, a)
        assert dram_map(D, a + 128) == (ch0, b0, r0, c0 + 128) and ch0 == 3 and c0 % 256 == 0
        assert dram_map(D, a + IL * C)[1] != b0
    for args in ((C - 1, 5, 77, 320), (0, m.dram.banks - 1, 3, m.dram.row_bytes - 64)):
        assert dram_map(D, dram_address(D, *args)) == args


def test_row_chunk_must_divide_the_row():
    from archsim.errors import InputError

    for bad in (192, 4096):
        with pytest.raises(InputError, match="row_chunk_bytes"):
            machine("a100", [f"memory_controllers.address_mapping.row_chunk_bytes={bad}"])


@pytest.mark.parametrize("name", ["a100", "h100", "tiny-gpu"])
def test_partitions_send_each_slice_to_its_own_channel(name):
    """partitions: an address's channel is its home L2 slice's (a channel serves slices / channels
    of its half, in order); the map is one-to-one and inverts, channel_address walks a channel's
    own addresses, and a contiguous footprint of whole slice groups spreads evenly over channels."""
    from archsim.engine import mem_state as ST

    m = machine(name)
    assert m.memory_controllers.address_mapping.kind == "partitions"
    D = make_dram_state(m)
    MS = ST.make_mstate(m, None)
    C, l2 = m.dram.channels, m.l2
    sph = l2.slices // l2.halves
    spc = sph // (C // l2.halves)                       # slices a channel
    span = 2 * l2.interleave_bytes * l2.halves * sph    # whole groups of sph granules in every half
    rng = np.random.default_rng(3)
    seen = {}
    for a in np.concatenate([np.arange(0, span, 64), rng.integers(0, 1 << 36, 2000) // 32 * 32]):
        loc = tuple(int(x) for x in dram_map(D, int(a)))
        assert loc[0] == ST.slice_of(MS, int(a)) // spc  # half * sph + s -> half * (sph / spc) + s // spc
        assert seen.setdefault(loc, int(a)) == int(a)
        assert dram_address(D, *loc) == int(a)
    counts = np.bincount([dram_map(D, a)[0] for a in range(0, span, 64)], minlength=C)
    assert counts.min() == counts.max()
    for c in (0, C - 1):
        assert all(dram_map(D, channel_address(D, c, la))[0] == c for la in range(0, 1 << 16, 256))


def test_partitions_need_an_l2_whose_slices_split_over_the_channels():
    from archsim.errors import InputError

    for name, sets, what in [("tiny-gpu", ["dram.channels=6"], "split evenly over its 6 / 2 channels"),
                             ("a100", ["l2.slice_indexing=consecutive"], "a multiple of the 40 slices a half")]:
        with pytest.raises(InputError, match=what):
            machine(name, sets)
    # without an L2 the controllers are the endpoints: addresses interleave over them
    D = make_dram_state(machine("a100", ["l2=null"]))
    IL = 256
    assert [dram_map(D, i * IL)[0] for i in range(20)] == [i % 10 for i in range(20)]


@pytest.mark.parametrize("name", ["tiny-sunway", "sw26010pro"])
def test_segments_keep_private_addresses_on_their_group_and_spread_the_cross_segment(name):
    m = machine(name)
    D = make_dram_state(m)
    G, C = m.groups, m.dram.channels
    IL = m.memory_controllers.address_mapping.interleave_bytes
    seg = segment_bytes(m)
    assert seg == int(m.dram.capacity_gib * 2**30) // G and cross_base(m) == G * seg
    cpg = C // G
    rng = np.random.default_rng(1)
    for g in range(G):
        base = segment_base(m, g)
        assert base == g * seg
        offs = np.concatenate([np.arange(0, 64 * IL, 64), rng.integers(0, seg, 500)])
        chans = {dram_map(D, base + int(o))[0] for o in offs}
        assert chans == set(range(g * cpg, (g + 1) * cpg))
    cb = cross_base(m)
    for k in range(3):
        chunk_chans = [dram_map(D, cb + (k * C + i) * IL)[0] for i in range(C)]
        assert sorted(chunk_chans) == list(range(C))             # every channel once per C chunks
        ctrls = [ch // (C // m.memory_controllers.count) for ch in chunk_chans]
        assert ctrls[:m.memory_controllers.count] == list(range(m.memory_controllers.count))
    # the cross segment's rows come after the private ones, so the two never share a row
    pr = private_rows(D)
    assert all(dram_map(D, cb + int(o))[2] >= pr for o in rng.integers(0, 1 << 30, 200))
    assert all(dram_map(D, segment_base(m, 1) + int(o))[2] < pr for o in rng.integers(0, seg, 200))
    for ch, b, row in [(0, 1, 3), (C - 1, 7, pr + 11)]:
        assert dram_map(D, dram_address(D, ch, b, row, 448)) == (ch, b, row, 448)


# ------------------------------------------------------------------------------ skip-ahead, determinism

def random_trace(r, seed, n=150, span=3000, hot_rows=4, misaligned=False):
    """Requests to a few rows of random banks; aligned 32-128 B, or (``misaligned``) any 8-B
    multiple of 8-200 B at any 8-B offset, so writes cover bursts in part and cross chunks."""
    rng = np.random.default_rng(seed)
    D, m = r.D, r.m
    for _ in range(n):
        ch = int(rng.integers(0, r.C))
        b = int(rng.integers(0, m.dram.banks))
        row = int(rng.integers(0, hot_rows))
        col = int(rng.integers(0, m.dram.row_bytes // 32)) * 32
        size = int(rng.integers(1, 26)) * 8 if misaligned else int(rng.choice([32, 64, 128]))
        kind = KIND_WRITE if rng.random() < 0.3 else KIND_READ
        addr = dram_address(D, ch, b, row, col)
        if misaligned:
            addr += int(rng.integers(0, 8)) * 8
        else:
            addr -= addr % size                                # aligned, never across a chunk
        r.add(int(rng.integers(0, span)), addr, size, kind)


def partial_bursts(r):
    """Bursts the trace's writes cover only in part (each is read first under partial_writes: rmw)."""
    bb, n = r.m.dram.burst_bytes, 0
    for i in r.ids:
        if r.R.kind[i] == KIND_WRITE:
            a, e = int(r.R.addr[i]), int(r.R.addr[i]) + int(r.R.nbytes[i])
            first, last = a % bb != 0, e % bb != 0
            n += (first or last) if (e - 1) // bb == a // bb else first + last
    return n


@pytest.mark.parametrize("name,sets", [("tiny-gpu", ()), ("a100", ()),
                                       ("tiny-gpu", ("memory_controllers.policy=fcfs",
                                                     "memory_controllers.row_policy=closed")),
                                       ("tiny-sunway", ("dram.partial_writes=rmw",)),
                                       ("tiny-sunway", ("dram.partial_writes=rmw", "memory_controllers.row_hit_cap=1",
                                                        "memory_controllers.row_policy=closed"))])
def test_skip_ahead_gives_the_same_cycles_as_stepping_every_cycle(name, sets):
    m = machine(name, sets)
    runs = []
    for skip in (False, True, False):
        r = Run(m, log_len=4096)
        random_trace(r, seed=7, span=3 * tm(m).tREFI // 2, misaligned=name == "tiny-sunway")
        end = r.run(skip=skip)
        end = r.run(until=end + 2 * tm(m).tREFI, skip=skip)         # idle time with refreshes
        runs.append((r, end))
    (a, ea), (b, eb), (c, ec) = runs
    assert ea == eb == ec
    assert a.done == b.done == c.done and a.order == b.order
    assert np.array_equal(a.D.cnt, b.D.cnt) and np.array_equal(a.D.cnt, c.D.cnt)   # deterministic
    assert a.counters(ea) == b.counters(eb)
    assert sum(x["reads"] + x["writes"] for x in a.counters()) == len(a.ids)
    rmw = m.dram.partial_writes == "rmw"
    assert sum(x["rmw_reads"] for x in a.counters()) == (partial_bursts(a) if rmw else 0)
    assert sum(x["row_hits"] + x["row_misses"] + x["row_conflicts"] for x in a.counters()) == len(a.ids)
    for ch in range(a.C):
        check_timing(m, a.D, ch)
        assert dram_log(a.D, ch) == dram_log(b.D, ch)


@settings(max_examples=15)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["frfcfs", "fcfs"]), st.sampled_from(["open", "closed"]),
       st.integers(2, 16), st.booleans())
def test_random_traces_finish_and_obey_the_timing_rules(seed, policy, row_policy, qcap, rmw):
    name, sets = ("tiny-sunway", ("dram.partial_writes=rmw", "dram.timing.tREFI=800")) if rmw else \
        ("tiny-gpu", ("dram.timing.tREFI=700", "dram.timing.tRFC=90"))
    m = machine(name, (f"memory_controllers.policy={policy}", f"memory_controllers.row_policy={row_policy}") + sets)
    r = Run(m, log_len=4096, qcap=qcap, out_cap=3)
    random_trace(r, seed, n=60, span=600, hot_rows=3, misaligned=rmw)
    while len(r.done) < len(r.ids):
        r.run(until=r.now + 37)
        check_hits_invariant(r.D, r.Q, r.C)
        assert r.now < 50_000
    recs = r.counters()
    assert sum(x["row_hits"] + x["row_misses"] + x["row_conflicts"] for x in recs) == len(r.ids)
    assert sum(x["bytes_read"] + x["bytes_written"] for x in recs) == sum(int(r.R.nbytes[i]) for i in r.ids)
    assert sum(x["rmw_reads"] for x in recs) == (partial_bursts(r) if rmw else 0)
    for ch in range(r.C):
        check_timing(m, r.D, ch)


@settings(max_examples=12)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["a100", "tiny-gpu"]))
def test_age_lists_follow_arrivals_issues_and_requests_whose_next_burst_changes_sub_channel(seed, name):
    """Misaligned requests of several bursts cross a 128-byte chunk into another bank, on the a100
    often into another sub-channel: the request then moves to that sub-channel's list, at its age."""
    m = machine(name, ())
    r = Run(m, qcap=16)
    rng = np.random.default_rng(seed)
    for _ in range(120):
        chunk = int(rng.integers(0, 1 << 14)) * 256             # one interleave granule (a100, tiny-gpu)
        off = int(rng.choice([0, 8, 64, 96, 120]))
        r.add(int(rng.integers(0, 400)), chunk + off, int(rng.choice([32, 64, 100, 128])),  # within the granule
              KIND_WRITE if rng.random() < 0.3 else KIND_READ)
    moved = 0
    while len(r.done) < len(r.ids):
        r.run(until=r.now + 5)
        check_age_lists(r.D, r.Q, r.C)
        check_hits_invariant(r.D, r.Q, r.C)
        assert r.now < 100_000
    for rid in r.ids:
        a, nb = int(r.R.addr[rid]), int(r.R.nbytes[rid])
        b0 = dram_map(r.D, a)[1]
        b1 = dram_map(r.D, a + nb - 1)[1]
        moved += int(r.D.prm[P_BTAB + 2 * b0]) != int(r.D.prm[P_BTAB + 2 * b1])
    assert name != "a100" or moved > 0                          # the case the lists must follow


def test_an_oversized_input_queue_is_refused_with_a_clear_error():
    m = machine("tiny-gpu")
    D = make_dram_state(m, queue_cap=4)
    Q = make_queues([8, 8, 4, 4])
    R = make_requests(4)
    q_push(Q, 0, req_alloc(R, 0, 64, KIND_READ, 0, 0, 0))
    dram_step(D, Q, R, 0, 2, 0)
    assert q_peek(Q, 0, 0) == 0 and Q.count[0] == 1              # untouched
    with pytest.raises(ValueError, match="queue_cap"):
        dram_counters(D)


# every standard the schema names, on a machine of that kind (a config's own, or a tiny one set to it)
STANDARDS = [("hbm2", "tiny-gpu", ()), ("hbm2e", "tiny-gpu", ("dram.kind=hbm2e",)), ("hbm3", "h100", ()),
             ("ddr4", "tiny-sunway", ()), ("ddr5", "tiny-sunway", ("dram.kind=ddr5",))]


def test_every_standard_of_the_schema_has_a_rule_table():
    import typing

    from archsim.config.schema import Dram
    from archsim.engine.dram_rules import RULES

    kinds = typing.get_args(Dram.model_fields["kind"].annotation)
    assert set(kinds) == set(RULES) == {k for k, _, _ in STANDARDS}


@pytest.mark.parametrize("kind, name, sets", STANDARDS, ids=[s[0] for s in STANDARDS])
def test_every_standard_obeys_its_rules_in_the_command_log(kind, name, sets):
    """The command-log checker (an independent statement of the rules) over a random trace of
    reads and writes, row hits, misses and conflicts and refreshes, on each standard's table."""
    m = machine(name, sets)
    assert m.dram.kind == kind
    r = Run(m, log_len=4096)
    assert r.D.rules.shape[0] > 0
    random_trace(r, seed=11, span=3 * tm(m).tREFI // 2)
    end = r.run()
    r.run(until=end + 2 * tm(m).tREFI)
    assert len(r.done) == len(r.ids)
    for ch in range(r.C):
        if dram_log(r.D, ch):
            check_timing(m, r.D, ch)
