"""Sectored caches with MSHRs, the LSU coalescer and shared-memory bank conflicts: model and formula
oracles (a pure-Python LRU/FIFO cache, the LRU capacity cliff, sector and MSHR behaviour, NVIDIA's
coalescing and bank-conflict rules)."""

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from archsim.config import load_machine
from archsim.engine import cache as K
from archsim.engine.cache import (BYPASS, HIT, MERGED, MISS, NO_WRITE_ALLOCATE, REPL_FIFO, REPL_LRU,
                                  RESERVATION_FAIL, WRITE_ALLOCATE, WRITE_BACK, WRITE_THROUGH, cache_access,
                                  cache_counters, cache_fill, cache_probe, coalesce, make_cache_state,
                                  mshr_free, mshr_waiters, shared_bank_conflicts)

LINE, SECT = 128, 32
ALL = (1 << 32) - 1


def small(sets=4, assoc=2, mshrs=8, max_merge=4, write=WRITE_BACK, alloc=WRITE_ALLOCATE, repl=REPL_LRU, **kw):
    return make_cache_state(1, sets * assoc * LINE, LINE, SECT, assoc, mshrs, max_merge, write, alloc, repl, **kw)


def acc(C, addr, nbytes=4, write=False, req=0, inst=0):
    s, m = cache_access(C, inst, addr, nbytes, write, req, 0)
    return int(s), int(m)


def fill_all(C, line_addr, mask, inst=0):
    """Fill, read the released waiters, free the entry: the waiting request ids (None: no entry)."""
    e = cache_fill(C, inst, line_addr, mask, 0)
    if e < 0:
        return None
    out = np.zeros(64, np.int32)
    n = mshr_waiters(C, inst, e, out)
    mshr_free(C, inst, e)
    return list(out[:n])


def counters(C, inst=0):
    return cache_counters(C)[inst]


def evicted(C, inst=0):
    d = int(C.evict_dirty[inst])
    return (int(C.evict_addr[inst]), d) if d else None


# ----------------------------------------------------------------------------- pure-Python model
def masks(addr, nbytes):
    off = addr % LINE
    end = min(off + nbytes, LINE)
    m = f = 0
    for s in range(LINE // SECT):
        lo, hi = s * SECT, (s + 1) * SECT
        if off < hi and end > lo:
            m |= 1 << s
            if off <= lo and end >= hi:
                f |= 1 << s
    return m, f


class ModelCache:
    """A sectored cache with immediate fills: per set an ordered dict line -> [valid, dirty]
    (order = replacement order: LRU moves a line to the end on every use, FIFO only on insertion)."""

    def __init__(self, sets, assoc, wb, alloc, lru):
        self.sets, self.assoc, self.wb, self.alloc, self.lru = sets, assoc, wb, alloc, lru
        self.data = [OrderedDict() for _ in range(sets)]

    def _use(self, d, line):
        if self.lru:
            d.move_to_end(line)

    def _install(self, d, line):
        ev = None
        if len(d) == self.assoc:
            old, (v, dirty) = d.popitem(last=False)
            if dirty:
                ev = (old * LINE, dirty)
        d[line] = [0, 0]
        return ev

    def access(self, addr, nbytes, write):
        line = addr // LINE
        d = self.data[line % self.sets]
        m, f = masks(addr, nbytes)
        if not write:
            if line in d:
                need = m & ~d[line][0]
                self._use(d, line)
                d[line][0] |= m
                return (HIT, 0, None) if need == 0 else (MISS, need, None)
            ev = self._install(d, line)
            d[line][0] = m
            return MISS, m, ev
        if line in d:
            ent = d[line]
            need = m & ~f & ~ent[0]
            if not self.alloc:
                ent[0] |= f
                self._use(d, line)
                return HIT, 0, None
            ent[0] |= m  # the fetch (if any) completes at once
            if self.wb:
                ent[1] |= m
            self._use(d, line)
            return (MISS, need, None) if need else (HIT, 0, None)
        if not self.alloc:
            return BYPASS, m, None
        ev = self._install(d, line)
        d[line] = [m, m if self.wb else 0]
        need = m & ~f
        return (MISS, need, ev) if need else (HIT, 0, ev)


access_st = st.tuples(st.integers(0, 19), st.sampled_from([4, 8, 32, 64, 128]), st.integers(0, 31), st.booleans())


@given(st.lists(access_st, min_size=1, max_size=120),
       st.sampled_from([(WRITE_BACK, WRITE_ALLOCATE), (WRITE_THROUGH, NO_WRITE_ALLOCATE)]),
       st.sampled_from([REPL_LRU, REPL_FIFO]))
def test_matches_pure_python_model(stream, policy, repl):
    wb, alloc = policy
    C = small(sets=4, assoc=3, write=wb, alloc=alloc, repl=repl)
    M = ModelCache(4, 3, wb == WRITE_BACK, alloc == WRITE_ALLOCATE, repl == REPL_LRU)
    for req, (line, nbytes, slot, write) in enumerate(stream):
        addr = 0x10000 + line * LINE + (slot * nbytes) % LINE
        want = M.access(addr, nbytes, write)
        got = acc(C, addr, nbytes, write, req)
        assert (got[0], got[1], evicted(C)) == want, (req, addr, nbytes, write)
        if got[0] == MISS:
            assert fill_all(C, addr - addr % LINE, got[1]) == [req]
    r = counters(C)
    assert r["accesses"] == len(stream) == r["hits"] + r["misses"] + r["sector_misses"] + r["merges"]
    assert r["reservation_fails"] == 0


@pytest.mark.parametrize("repl, victim", [(REPL_LRU, 0x1000), (REPL_FIFO, 0x0000)])
def test_lru_evicts_least_recently_used_fifo_the_oldest(repl, victim):
    C = small(sets=1, assoc=2, repl=repl)
    for a in (0x0000, 0x1000):
        fill_all(C, a, acc(C, a, LINE)[1])
    assert acc(C, 0x0000, LINE) == (HIT, 0)
    fill_all(C, 0x2000, acc(C, 0x2000, LINE)[1])
    assert cache_probe(C, 0, victim) == -1 and cache_probe(C, 0, 0x1000 - victim) == 0b1111


# ----------------------------------------------------------------------------- capacity
@pytest.mark.parametrize("repl", [REPL_LRU, REPL_FIFO])
@pytest.mark.parametrize("set_hash", [False, True])
def test_sweep_within_capacity_hits_after_first_pass(repl, set_hash):
    sets, assoc = 8, 4
    C = small(sets=sets, assoc=assoc, repl=repl, set_hash=set_hash)
    for p in range(4):
        for i in range(sets * assoc):
            s, m = acc(C, i * LINE, LINE, req=i)
            assert s == (MISS if p == 0 else HIT)
            if s == MISS:
                fill_all(C, i * LINE, m)
    r = counters(C)
    assert r["misses"] == sets * assoc and r["hits"] == 3 * sets * assoc and r["evictions"] == 0


@pytest.mark.parametrize("repl", [REPL_LRU, REPL_FIFO])
def test_lru_cliff_one_line_per_set_over_capacity_misses_every_time(repl):
    sets, assoc = 8, 4
    C = small(sets=sets, assoc=assoc, repl=repl)
    n = sets * assoc + sets  # every set cycles through assoc + 1 lines
    for _ in range(4):
        for i in range(n):
            s, m = acc(C, i * LINE, LINE, req=i)
            assert s == MISS
            fill_all(C, i * LINE, m)
    r = counters(C)
    assert r["hits"] == 0 and r["misses"] == 4 * n and r["hit_rate"] == 0.0


def test_set_hash_spreads_a_set_aliasing_stride():
    sets, assoc = 64, 4
    stride = sets * LINE
    for set_hash, want_hits in [(False, 0), (True, 32)]:
        C = small(sets=sets, assoc=assoc, set_hash=set_hash)
        for p in range(2):
            for i in range(32):
                s, m = acc(C, i * stride, LINE, req=i)
                if s == MISS:
                    fill_all(C, i * stride, m)
        assert counters(C)["hits"] == want_hits


# ----------------------------------------------------------------------------- sectors
def test_one_sector_fetched_then_next_sector_is_a_sector_miss():
    C = small()
    assert acc(C, 0x1000, 4, req=1) == (MISS, 0b0001)
    assert fill_all(C, 0x1000, 0b0001) == [1]
    assert cache_probe(C, 0, 0x1000) == 0b0001
    assert acc(C, 0x1004, 4, req=2) == (HIT, 0)
    assert acc(C, 0x1020, 4, req=3) == (MISS, 0b0010)
    r = counters(C)
    assert (r["misses"], r["sector_misses"], r["hits"], r["fetch_sectors"]) == (1, 1, 1, 2)
    assert acc(C, 0x2040, 64, req=4) == (MISS, 0b1100)


# ----------------------------------------------------------------------------- MSHRs
def test_two_misses_to_one_line_merge_and_one_fill_releases_both():
    C = small()
    assert acc(C, 0x1000, 4, req=7) == (MISS, 0b0001)
    assert acc(C, 0x1010, 4, req=9) == (MERGED, 0)
    assert fill_all(C, 0x1000, 0b0001) == [7, 9]
    assert acc(C, 0x1008, 4, req=11) == (HIT, 0)
    assert C.mshr_nfree[0] == 8 and C.mshr_sectors[0] == 0
    r = counters(C)
    assert (r["misses"], r["merges"], r["hits"], r["fills"]) == (1, 1, 1, 1)


def test_merge_extends_the_entry_and_partial_fills_release_only_ready_waiters():
    C = small()
    assert acc(C, 0x1000, 4, req=1) == (MISS, 0b0001)
    assert acc(C, 0x1040, 4, req=2) == (MERGED, 0b0100)      # fetch sector 2 too
    assert acc(C, 0x1044, 4, req=3) == (MERGED, 0)
    e = cache_fill(C, 0, 0x1000, 0b0001, 5)
    out = np.zeros(8, np.int32)
    assert mshr_waiters(C, 0, e, out) == 1 and out[0] == 1
    assert not mshr_free(C, 0, e)                             # sector 2 still in flight
    assert fill_all(C, 0x1000, 0b0100) == [2, 3]
    assert counters(C)["sector_misses"] == 1 and counters(C)["merges"] == 1


def test_mshr_exhaustion_fails_counts_and_changes_nothing():
    C = small(sets=4, assoc=4, mshrs=2, max_merge=2)
    assert acc(C, 0x0000, req=1)[0] == MISS
    assert acc(C, 0x0080, req=2)[0] == MISS
    assert acc(C, 0x0100, req=3) == (RESERVATION_FAIL, 0)    # no free entry
    assert cache_probe(C, 0, 0x0100) == -1
    assert acc(C, 0x0004, req=4) == (MERGED, 0)
    assert acc(C, 0x0008, req=5) == (RESERVATION_FAIL, 0)    # merge list full
    r = counters(C)
    assert r["reservation_fails"] == 2 and r["accesses"] == 3
    assert fill_all(C, 0x0000, 0b0001) == [1, 4]
    assert acc(C, 0x0100, req=3)[0] == MISS                  # the retry succeeds


def test_a_sharer_waits_in_slots_of_its_own_beyond_max_merge():
    """cache_access_sharer (an L2 mirror slice asking the home slice for a line) waits in the
    entry's sharer slots: it neither takes nor is refused by the max_merge slots of the cores'
    requests, and a partial fill keeps the count of sharers right."""
    C = small(mshrs=4, max_merge=2, sharer_slots=1, sharer_entries=1)

    def share(addr, mask, req):
        s, m = K.cache_access_sharer(C, 0, addr, mask, req, 0)
        return int(s), int(m)

    assert acc(C, 0x0000, req=1) == (MISS, 0b0001)
    assert acc(C, 0x0004, req=2) == (MERGED, 0)
    assert acc(C, 0x0008, req=3) == (RESERVATION_FAIL, 0)      # the cores' slots are full
    assert share(0x0000, 0b0011, 4) == (MERGED, 0b0010)       # the sharer's slot is free
    assert share(0x0000, 0b0001, 5) == (RESERVATION_FAIL, 0)   # and now taken
    assert fill_all(C, 0x0000, 0b0011) == [1, 2, 4]
    # a sharer opens the entry: the cores still have both their slots
    assert share(0x1000, 0b0011, 6) == (MISS, 0b0011)
    assert acc(C, 0x1000, req=7) == (MERGED, 0)
    assert acc(C, 0x1004, req=8) == (MERGED, 0)
    assert acc(C, 0x1008, req=9) == (RESERVATION_FAIL, 0)
    e = cache_fill(C, 0, 0x1000, 0b0001, 0)
    out = np.zeros(8, np.int32)
    assert mshr_waiters(C, 0, e, out) == 2 and list(out[:2]) == [7, 8]
    assert share(0x1000, 0b0010, 10) == (RESERVATION_FAIL, 0)  # the sharer still waits for sector 1
    assert acc(C, 0x1020, req=11) == (MERGED, 0)
    assert fill_all(C, 0x1000, 0b0010) == [6, 11]
    assert C.mshr[0, :, K.M_NSHR].sum() == 0


def test_a_sharer_opens_entries_of_its_own_class():
    """A sharer's miss opens one of sharer_entries entries, outside mshrs and the sector cap: a
    cache whose own misses fill its MSHRs still takes another cache's request, and its own
    requests never take a sharer's entry."""
    C = small(mshrs=2, mshr_sectors=2, sharer_entries=1)

    def share(addr, mask, req):
        s, m = K.cache_access_sharer(C, 0, addr, mask, req, 0)
        return int(s), int(m)

    assert acc(C, 0x0000, req=1) == (MISS, 0b0001)
    assert acc(C, 0x0100, req=2) == (MISS, 0b0001)
    assert acc(C, 0x0200, req=3) == (RESERVATION_FAIL, 0)      # its own two entries are taken
    assert share(0x0300, 0b1111, 4) == (MISS, 0b1111)         # beyond mshrs and the sector cap
    assert share(0x0400, 0b0001, 5) == (RESERVATION_FAIL, 0)   # the sharers' one entry is taken
    assert acc(C, 0x0200, req=3) == (RESERVATION_FAIL, 0)      # and never the cores'
    assert acc(C, 0x0304, req=6) == (MERGED, 0)                # a core's read joins the sharer's entry
    assert C.mshr_sectors[0] == 2 and C.inst[0, K.I_SHR_SECTORS] == 4
    assert fill_all(C, 0x0300, 0b1111) == [4, 6]
    assert C.inst[0, K.I_SHR_OPEN] == 0 and C.inst[0, K.I_SHR_SECTORS] == 0
    assert share(0x0400, 0b0001, 5) == (MISS, 0b0001)
    assert acc(C, 0x0200, req=3) == (RESERVATION_FAIL, 0)
    assert fill_all(C, 0x0000, 0b0001) == [1]
    assert acc(C, 0x0200, req=3) == (MISS, 0b0001)


def test_sector_budget_limits_sectors_in_flight():
    C = small(mshrs=8, mshr_sectors=5)
    assert acc(C, 0x0000, LINE, req=1) == (MISS, 0b1111)
    assert acc(C, 0x1000, 64, req=2) == (RESERVATION_FAIL, 0)   # 4 + 2 > 5
    assert acc(C, 0x1000, 32, req=2) == (MISS, 0b0001)


def test_reserved_ways_are_never_victims():
    C = small(sets=1, assoc=2)
    assert acc(C, 0x0000, req=1)[0] == MISS
    assert acc(C, 0x1000, req=2)[0] == MISS
    assert acc(C, 0x2000, req=3) == (RESERVATION_FAIL, 0)    # both ways wait on fills
    assert fill_all(C, 0x0000, 0b0001) == [1]
    assert acc(C, 0x2000, req=3)[0] == MISS                  # evicts 0x0000, not the reserved 0x1000
    assert cache_probe(C, 0, 0x0000) == -1
    assert fill_all(C, 0x1000, 0b0001) == [2]
    assert fill_all(C, 0x2000, 0b0001) == [3]


op_st = st.one_of(st.tuples(st.just("acc"), st.integers(0, 23), st.sampled_from([4, 32, 128]),
                            st.integers(0, 31), st.booleans()),
                  st.tuples(st.just("fill"), st.integers(0, 99), st.integers(1, 15)),
                  st.tuples(st.just("share"), st.integers(0, 23), st.integers(1, 15)))


@given(st.lists(op_st, max_size=150), st.sampled_from([(WRITE_BACK, False), (WRITE_THROUGH, False),
                                                      (WRITE_THROUGH, True)]))
@example([("acc", 0, 4, 0, False), ("share", 0, 1)], (WRITE_THROUGH, True))  # a sharer's read joins a wayless entry
def test_random_interleaving_keeps_mshr_invariants(ops, policy):
    """Accesses and (partial) fills in any order: in-flight lines stay put, every waiting request is
    released exactly once, the sector budget balances, the counters partition the accesses. With
    allocate on fill (the L1's streaming mode) an entry without a way is chained to its set and its
    line is in none of the set's ways."""
    wp, fill_alloc = policy
    alloc = WRITE_ALLOCATE if wp == WRITE_BACK else NO_WRITE_ALLOCATE
    C = small(sets=2, assoc=2, mshrs=3, max_merge=3, write=wp, alloc=alloc, sharer_slots=1, sharer_entries=2,
              fill_alloc=fill_alloc)
    E = C.mshr.shape[1]
    waiting, released, req = set(), [], 0
    out = np.zeros(8, np.int32)
    for op in ops:
        if op[0] == "acc":
            _, line, nbytes, slot, write = op
            addr = line * LINE + (slot * nbytes) % LINE
            req += 1
            s, m = acc(C, addr, nbytes, write, req)
            if s in (MISS, MERGED):
                waiting.add(req)
        elif op[0] == "share":
            req += 1
            s, m = K.cache_access_sharer(C, 0, op[1] * LINE, op[2], req, 0)
            if s in (MISS, MERGED):
                waiting.add(req)
        else:
            open_e = [e for e in range(E) if C.mshr_line[0, e] >= 0]
            if not open_e:
                continue
            e = open_e[op[1] % len(open_e)]
            la = int(C.mshr_line[0, e]) * LINE
            mask = op[2] & int(C.mshr_mask[0, e]) or int(C.mshr_pending[0, e])
            assert cache_fill(C, 0, la, mask, 0) == e
            n = mshr_waiters(C, 0, e, out)
            released += list(out[:n])
            mshr_free(C, 0, e)
        for e in range(E):
            if C.mshr_line[0, e] >= 0:
                s, w = C.mshr_set[0, e], C.mshr_way[0, e]
                if w < 0:
                    assert fill_alloc and e in chain(C, s) and C.mshr_line[0, e] not in C.tag[0, s]
                else:
                    assert C.tag[0, s, w] == C.mshr_line[0, e] and C.reserved[0, s, w] == e
                    assert e not in chain(C, s)
                k = C.mshr_nwait[0, e]
                nshr = int(C.wait[0, e, :k, K.W_SHR].sum())
                assert nshr == C.mshr[0, e, K.M_NSHR] <= 1 and k - nshr <= 3
        # each class within its own budget, its sectors in flight counted apart
        live = [e for e in range(E) if C.mshr_line[0, e] >= 0]
        by_shr = [e for e in live if C.mshr[0, e, K.M_BYSHR]]
        assert len(by_shr) == C.inst[0, K.I_SHR_OPEN] <= 2 and len(live) - len(by_shr) <= 3
        for cls, col in ((set(by_shr), K.I_SHR_SECTORS), (set(live) - set(by_shr), K.I_SECTORS)):
            assert C.inst[0, col] == sum(bin(int(C.mshr_pending[0, e])).count("1") for e in cls)
    assert len(released) == len(set(released)) and set(released) <= waiting
    still = {int(C.mshr_wait[0, e, k]) for e in range(E) if C.mshr_line[0, e] >= 0
             for k in range(C.mshr_nwait[0, e])}
    assert set(released) | still == waiting
    r = counters(C)
    assert r["accesses"] == r["hits"] + r["misses"] + r["sector_misses"] + r["merges"]


def chain(C, s, inst=0):
    """The entries of set s that hold no way yet (allocate on fill), in chain order."""
    out, e = [], int(C.wayless[inst, s])
    while e >= 0:
        out.append(e)
        e = int(C.mshr[inst, e, K.M_NEXT])
    return out


def streaming(sets=1, assoc=2, mshrs=8, max_merge=4):
    return small(sets, assoc, mshrs, max_merge, WRITE_THROUGH, NO_WRITE_ALLOCATE, fill_alloc=True)


def test_allocate_on_fill_misses_never_wait_for_a_way():
    # one 2-way set: allocate on miss refuses the third line while two wait on fills; allocate on
    # fill takes it, and each line takes its way when its data arrives (the LRU one gives way)
    C = small(sets=1, assoc=2, write=WRITE_THROUGH, alloc=NO_WRITE_ALLOCATE)
    assert [acc(C, a, req=r)[0] for r, a in enumerate((0x0000, 0x1000, 0x2000))] == [MISS, MISS, RESERVATION_FAIL]
    C = streaming()
    assert [acc(C, a, req=r) for r, a in enumerate((0x0000, 0x1000, 0x2000))] == [(MISS, 0b0001)] * 3
    assert acc(C, 0x1000, req=7) == (MERGED, 0)                # the line in flight is found without a way
    assert acc(C, 0x1020, req=8) == (MERGED, 0b0010)           # and takes more sectors
    assert (C.tag[0, 0] == -1).all() and chain(C, 0) == [2, 1, 0]
    assert fill_all(C, 0x0000, 0b0001) == [0]
    assert fill_all(C, 0x1000, 0b0011) == [1, 7, 8]
    assert fill_all(C, 0x2000, 0b0001) == [2]                   # evicts 0x0000, the least recently used
    assert cache_probe(C, 0, 0x0000) == -1 and cache_probe(C, 0, 0x1000) == 0b0011
    assert chain(C, 0) == [] and counters(C)["reservation_fails"] == 0


def test_a_fill_with_every_way_waiting_serves_from_its_entry():
    C = streaming(assoc=1)
    assert acc(C, 0x0000, 64, req=1) == (MISS, 0b0011)
    assert acc(C, 0x1000, req=2) == (MISS, 0b0001)
    assert cache_fill(C, 0, 0x0000, 0b0001, 0) == 0             # half of it: the line takes the way
    assert C.mshr_way[0, 0] == 0 and C.reserved[0, 0, 0] == 0 and chain(C, 0) == [1]
    assert fill_all(C, 0x1000, 0b0001) == [2]                   # no way free: served from the entry
    assert cache_probe(C, 0, 0x1000) == -1 and chain(C, 0) == []
    assert acc(C, 0x1000, req=3) == (MISS, 0b0001)              # not kept: a new miss
    assert fill_all(C, 0x0000, 0b0010) == [1]
    assert cache_probe(C, 0, 0x0000) == 0b0011


def test_allocate_on_fill_entry_serves_arrived_sectors_as_hits():
    C = streaming(assoc=1)
    acc(C, 0x0000, 64, req=1)
    acc(C, 0x1000, req=2)
    cache_fill(C, 0, 0x0000, 0b0001, 0)                         # 0x0000 holds the only way
    e = cache_fill(C, 0, 0x1000, 0b0001, 0)                     # 0x1000 waits in its entry
    assert acc(C, 0x1000, req=3) == (HIT, 0)                    # its arrived sector answers at once
    assert mshr_waiters(C, 0, e, np.zeros(8, np.int32)) == 1 and mshr_free(C, 0, e)


# ----------------------------------------------------------------------------- write policies
def test_write_back_dirty_victim_is_returned():
    C = small(sets=1, assoc=2)
    assert acc(C, 0x0000, LINE, write=True, req=1) == (HIT, 0)     # full-line write: no fill
    assert acc(C, 0x1000, 4, write=True, req=2) == (MISS, 0b0001)  # partial sector: fetched
    assert fill_all(C, 0x1000, 0b0001) == [2]
    assert acc(C, 0x2000, 4, req=3)[0] == MISS                     # evicts 0x0000 (LRU)
    assert evicted(C) == (0x0000, 0b1111)
    assert acc(C, 0x3000, 4, req=4)[0] == MISS                     # 0x2000 is reserved: evicts 0x1000
    assert evicted(C) == (0x1000, 0b0001)
    r = counters(C)
    assert r["writebacks"] == 2 and r["writeback_sectors"] == 5 and r["evictions"] == 2


def test_write_back_victim_reported_by_fill_install():
    C = small(sets=1, assoc=1)
    assert acc(C, 0x0000, 32, write=True, req=1) == (HIT, 0)
    assert cache_fill(C, 0, 0x1000, 0b1111, 0) == -1               # an unrequested fill installs
    assert evicted(C) == (0x0000, 0b0001)
    assert cache_probe(C, 0, 0x1000) == 0b1111


def test_write_through_no_allocate_never_installs():
    C = small(write=WRITE_THROUGH, alloc=NO_WRITE_ALLOCATE)
    rng = np.random.default_rng(1)
    for i in range(200):
        a = int(rng.integers(0, 1 << 16)) & ~3
        assert acc(C, a, 4, write=True, req=i) == (BYPASS, 1 << (a % LINE // SECT))
    assert (C.tag == -1).all() and C.mshr_nfree[0] == 8
    assert counters(C)["bypasses"] == 200 and counters(C)["misses"] == 200
    # a line brought in by a read: writes hit it and validate the sectors they fully overwrite
    assert acc(C, 0x1000, 4, req=1) == (MISS, 0b0001)
    fill_all(C, 0x1000, 0b0001)
    assert acc(C, 0x1000, 4, write=True) == (HIT, 0)
    assert acc(C, 0x1040, 32, write=True) == (HIT, 0)
    assert acc(C, 0x1020, 4, write=True) == (HIT, 0)
    assert cache_probe(C, 0, 0x1000) == 0b0101 and (C.dirty == 0).all()


def test_invalidate_drops_lines_but_not_lines_in_flight():
    C = small(write=WRITE_THROUGH, alloc=NO_WRITE_ALLOCATE)
    fill_all(C, 0x0000, acc(C, 0x0000, LINE, req=1)[1])
    assert acc(C, 0x1000, 4, req=2)[0] == MISS
    assert K.cache_invalidate(C, 0) == 1
    assert cache_probe(C, 0, 0x0000) == -1 and cache_probe(C, 0, 0x1000) == 0
    e = cache_fill(C, 0, 0x1000, 0b0001, 0)
    assert K.mshr_line_addr(C, 0, e) == 0x1000 and K.cache_evicted(C, 0)[1] == 0


# ----------------------------------------------------------------------------- machine helpers
def test_machine_helpers():
    a100 = load_machine("a100")
    L1, L2 = K.make_l1_state(a100), K.make_l2_state(a100)
    assert L1.tag.shape == (108, 28 * 1024 // (128 * 4), 4)           # 192 - 164 KiB carveout
    assert L1.cfg[K.CFG_WRITE] == WRITE_THROUGH and L1.cfg[K.CFG_ALLOC] == NO_WRITE_ALLOCATE
    assert L1.cfg[K.CFG_MSHR_SECTORS] == a100.l1.mshrs
    assert L2.tag.shape == (80, 512 * 1024 // (128 * 16), 16)
    assert L2.cfg[K.CFG_WRITE] == WRITE_BACK and L2.cfg[K.CFG_HASH] == 1
    tiny = load_machine("tiny-gpu")
    T = K.make_l1_state(tiny)
    assert T.tag.shape[1:] == (32, 4)
    assert T.tag.shape[0] == 2
    assert acc(T, 0x4000, 4, req=1, inst=1) == (MISS, 1)                # instances are independent
    assert acc(T, 0x4000, 4, req=2, inst=0) == (MISS, 1)
    assert T.cnt[:, K.CNT_MISSES].tolist() == [1, 1]
    assert K.make_l1_state(load_machine("sw26010pro")) is None
    assert K.make_l2_state(load_machine("sw26010pro")) is None
    recs = cache_counters(L1)
    assert len(recs) == 108 and recs[0]["hit_rate"] == 0.0


# ----------------------------------------------------------------------------- coalescer
def run_coalesce(addrs, nbytes, active=ALL):
    a = np.asarray(addrs, np.int64)
    ol, om, of = (np.zeros(2 * len(a), np.int64) for _ in range(3))
    n = coalesce(a, active, nbytes, SECT, LINE, ol, om, of)
    return list(ol[:n]), list(om[:n]), list(of[:n])


def test_coalesce_consecutive_strided_and_partial():
    lanes = np.arange(32)
    assert run_coalesce(0x1000 + 4 * lanes, 4) == ([0x1000], [0b1111], [0b1111])
    lines, ms, _ = run_coalesce(0x1000 + 128 * lanes, 4)
    assert lines == [0x1000 + 128 * i for i in range(32)] and ms == [1] * 32
    assert run_coalesce(0x1000 + 8 * lanes, 4) == ([0x1000, 0x1080], [0b1111, 0b1111], [0, 0])
    assert run_coalesce(0x1000 + 8 * lanes, 8)[0] == [0x1000, 0x1080]
    assert run_coalesce(0x1000 + 4 * lanes, 4, active=0xFF) == ([0x1000], [0b0001], [0b0001])
    assert run_coalesce(0x1000 + 4 * lanes, 4, active=0) == ([], [], [])
    assert run_coalesce([0x107E] + [0x1000] * 31, 4, active=1)[:2] == ([0x1000, 0x1080], [0b1000, 0b0001])
    ol, om = np.zeros(64, np.int64), np.zeros(64, np.int64)
    assert coalesce((0x1000 + 4 * lanes).astype(np.int64), ALL, 4, SECT, LINE, ol, om) == 1
    # byte stores: 32 lanes x 1 B fill one sector exactly; a gap leaves it partial
    b = (0x1000 + lanes).astype(np.int64)
    of = np.zeros(64, np.int64)
    for gap, want in [(False, 0b0001), (True, 0)]:
        b[7] = 0x1000 + (40 if gap else 7)
        assert coalesce(b, ALL, 1, SECT, LINE, ol, om, of) == 1 and (om[0], of[0]) == (0b0011 if gap else 1, want)
    # 128-B sectors (coverage tracked in 2-B granules): one missing byte leaves the sector partial
    a = (0x1000 + 4 * lanes).astype(np.int64)
    for first, want in [(0x1000, 1), (0x1001, 0)]:
        a[0] = first
        assert coalesce(a, ALL, 4, 128, 128, ol, om, of) == 1 and (om[0], of[0]) == (1, want)


@given(st.lists(st.integers(0, 1 << 12), min_size=32, max_size=32), st.integers(0, ALL), st.sampled_from([1, 4, 8, 16]),
       st.booleans())
@example([0] * 16 + [503] + [0] * 11 + [519, 528, 0, 0], 1042612224, 16, False)  # found by CI: half granules
def test_coalesce_random_is_unique_lines_in_first_touch_order(addrs, active, nbytes, aligned):
    if aligned:
        addrs = [a - a % nbytes for a in addrs]
    want_lines, want_masks, cover = [], {}, {}
    for i, a in enumerate(addrs):
        if active >> i & 1:
            for L in range(a - a % LINE, a + nbytes, LINE):   # a lane may straddle two lines
                if L not in want_masks:
                    want_lines.append(L)
                    want_masks[L] = 0
                want_masks[L] |= masks(max(a, L), min(a + nbytes, L + LINE) - max(a, L))[0]
                cover.setdefault(L, set()).update(range(a, a + nbytes))
    full = [sum(1 << s for s in range(4) if set(range(L + s * SECT, L + (s + 1) * SECT)) <= cover[L])
            for L in want_lines]
    lines, ms, got_full = run_coalesce(addrs, nbytes, active)
    assert (lines, ms) == (want_lines, [want_masks[L] for L in want_lines])
    if aligned or nbytes == 1:
        assert got_full == full
    else:
        # lanes not aligned to their size (the ISA faults on them) may each cover half of a 2-B
        # coverage granule: the coalescer may then call a covered sector partial, never the reverse
        assert all(int(g) & ~f == 0 for g, f in zip(got_full, full))


# ----------------------------------------------------------------------------- shared-memory banks
def ref_wavefronts(addrs, active, nbytes, banks, bw):
    per_phase = len(addrs) if nbytes <= bw else max(1, banks * bw // nbytes)
    total = 0
    for p0 in range(0, len(addrs), per_phase):
        words = {w for i in range(p0, min(len(addrs), p0 + per_phase)) if active >> i & 1
                 for w in range(addrs[i] // bw, (addrs[i] + nbytes - 1) // bw + 1)}
        if words:
            total += max(sum(1 for w in words if w % banks == b) for b in range(banks))
    return total


def banks(addrs, nbytes=4, active=ALL, nb=32, bw=4):
    """Wavefronts, checked to be the same with and without the scratch array."""
    a = np.asarray(addrs, np.int64)
    n = shared_bank_conflicts(a, active, nbytes, nb, bw)
    assert shared_bank_conflicts(a, active, nbytes, nb, bw, np.zeros(nb, np.int64)) == n
    return n


def test_bank_conflict_formulas():
    lanes = np.arange(32)
    assert banks(4 * lanes) == 1
    assert banks(8 * lanes) == 2
    assert banks(128 * lanes) == 32
    assert banks(np.full(32, 0x40)) == 1                     # broadcast
    assert banks(4 * (lanes // 2)) == 1                      # pairs share words
    assert banks(16 * lanes, 16) == 4                        # 128-bit: four conflict-free quarter-warps
    assert banks(8 * lanes, 8) == 2                          # 64-bit: two conflict-free half-warps
    assert banks(128 * lanes, 4, active=0b1111) == 4
    assert banks(4 * lanes, active=0) == 0


@given(st.lists(st.integers(0, 4096), min_size=32, max_size=32), st.integers(0, ALL),
       st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([(32, 4), (8, 8), (128, 4), (24, 4)]), st.booleans())
def test_bank_conflicts_match_reference(addrs, active, nbytes, geom, aligned):
    nb, bw = geom
    if aligned:
        addrs = [a - a % nbytes for a in addrs]
    else:  # few distinct words, so that broadcasts and conflicts both occur
        addrs = [a % 320 for a in addrs]
    assert banks(addrs, nbytes, active, nb, bw) == ref_wavefronts(addrs, active, nbytes, nb, bw)


@given(st.integers(0, 4096), st.sampled_from([1, 2, 4, 8, 16]),
       st.sampled_from([(32, 4), (8, 8), (128, 4), (24, 4), (8, 4)]), st.sampled_from([ALL, ALL >> 1, ALL - 2]),
       st.booleans())
def test_contiguous_accesses_match_reference(base, nbytes, geom, active, aligned):
    """A warp reading one contiguous span (the fast path), or nearly so (a lane off or out of place:
    the general one)."""
    nb, bw = geom
    if aligned:
        base -= base % nbytes
    addrs = [base + i * nbytes for i in range(32)]
    assert banks(addrs, nbytes, active, nb, bw) == ref_wavefronts(addrs, active, nbytes, nb, bw)
    addrs[7] += nbytes
    assert banks(addrs, nbytes, active, nb, bw) == ref_wavefronts(addrs, active, nbytes, nb, bw)

