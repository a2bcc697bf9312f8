"""L2 slices of the GPU memory system (archsim.engine.l2_side, mem_state): which slice owns an address
(consecutive or hashed slice indexing) and the near / far reply pipelines of a slice."""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine import l2_side as L2
from archsim.engine import mem_state as ST
from archsim.engine import noc as NC
from archsim.engine.jit import njit
from archsim.engine.queues import KIND_READ, q_peek, req_alloc, req_free
from archsim.engine.ref import with_ptr

_ms = {}
# a100's 8-KB half chunk is not a multiple of 40 slices' granules: consecutive slices there need the
# interleave mapping (partitions refuses them)
A100_CONSECUTIVE = ["l2.slice_indexing=consecutive", "memory_controllers.address_mapping.kind=interleave"]


def mstate(name, sets=()):
    key = (name, tuple(sets))
    if key not in _ms:
        m = load_machine(name, sets=list(sets))
        _ms[key] = (m, ST.make_mstate(m, None))
    return _ms[key]


@njit(cache=True)
def _slices_of(MS, addrs, out):
    for i in range(addrs.shape[0]):
        out[i] = ST.slice_of(MS, addrs[i])


def slices(MS, addrs):
    """The home slice of each address, in one jitted call (from Python, each call would hand over
    every array of the memory state)."""
    addrs = np.asarray(addrs, np.int64)
    out = np.empty(len(addrs), np.int64)
    with_ptr(_slices_of, MS, addrs, out)
    return out


def half_granule(m, a):
    """The index of address a's interleave granule among its own half's granules."""
    l2, il = m.l2, m.memory_controllers.address_mapping.interleave_bytes
    return a // (l2.interleave_bytes * l2.halves) * (l2.interleave_bytes // il) + (a % l2.interleave_bytes) // il


def fold_oracle(q, sph):
    """The hashed slice of granule q, written out from the l2.slice_indexing docs."""
    bits = max(1, (sph - 1).bit_length())
    lo, x, h = q % sph, q // sph, 0
    while x:
        h ^= x & ((1 << bits) - 1)
        x >>= bits
    return lo ^ (h & (sph - 1)) if sph & (sph - 1) == 0 else (lo + h) % sph


# ----------------------------------------------------------------------------- slice indexing

@pytest.mark.parametrize("name", ["a100", "tiny-gpu"])
def test_hashed_indexing_matches_its_definition_and_keeps_the_half(name):
    m, MS = mstate(name)
    _, MC = mstate(name, A100_CONSECUTIVE)
    l2 = m.l2
    sph = l2.slices // l2.halves
    il = m.memory_controllers.address_mapping.interleave_bytes
    assert l2.slice_indexing == ("hashed" if name == "a100" else "consecutive")
    _, MS = mstate(name, ["l2.slice_indexing=hashed"])
    rng = np.random.default_rng(1)
    addrs = rng.integers(0, 1 << 36, 3000) // 32 * 32
    hs, cs = slices(MS, addrs), slices(MC, addrs)
    half = (addrs // l2.interleave_bytes) % l2.halves
    assert np.array_equal(hs // sph, half) and np.array_equal(cs // sph, half)   # the half is never hashed
    assert np.array_equal(cs % sph, (addrs // il) % sph)
    assert np.array_equal(hs % sph, [fold_oracle(half_granule(m, int(a)), sph) for a in addrs])


@pytest.mark.parametrize("name", ["a100", "tiny-gpu"])
def test_hashed_indexing_is_a_permutation_of_each_group_of_granules(name):
    m, _ = mstate(name)
    _, MS = mstate(name, ["l2.slice_indexing=hashed"])
    sph = m.l2.slices // m.l2.halves
    il = m.memory_controllers.address_mapping.interleave_bytes
    for g in (0, 1, 7, 12345, 1 << 20):
        within = [ST.hashed_slice(g * sph + k, sph, max(1, (sph - 1).bit_length())) for k in range(sph)]
        assert sorted(within) == list(range(sph))                 # a sequential stream stays balanced
    # a sequential stream over a few MB loads every slice equally
    s = slices(MS, np.arange(0, 4 * m.l2.interleave_bytes * m.l2.halves * sph, il))
    counts = np.bincount(s, minlength=m.l2.slices)
    assert counts.min() == counts.max()


@pytest.mark.parametrize("stride_granules", ["sph", 256, 1000])
def test_hashed_indexing_spreads_strided_streams_over_every_slice(stride_granules):
    m, MC = mstate("a100", A100_CONSECUTIVE)
    _, MH = mstate("a100", ["l2.slice_indexing=hashed"])
    sph = m.l2.slices // m.l2.halves
    il = m.memory_controllers.address_mapping.interleave_bytes
    k = sph if stride_granules == "sph" else stride_granules
    addrs = np.arange(4000, dtype=np.int64) * k * il
    halves = np.unique((addrs // m.l2.interleave_bytes) % m.l2.halves)   # (the half is not hashed)
    cc = np.bincount(slices(MC, addrs), minlength=m.l2.slices)
    ch = np.bincount(slices(MH, addrs), minlength=m.l2.slices)
    # consecutive interleave camps on a few slices (one per half for a stride of sph granules)
    assert np.count_nonzero(cc) <= 10
    # hashed: every slice of the halves the stream touches gets a share, none more than twice the mean
    assert np.count_nonzero(ch) == len(halves) * sph
    assert ch.max() <= 2 * len(addrs) / (len(halves) * sph)


# ----------------------------------------------------------------------------- near / far replies

def _injected(MS, sl):
    return int(MS.resp.nt[MS.node[2, sl], NC.NT_INJECTED])


def test_near_reply_does_not_wait_behind_a_far_one():
    m, MS = mstate("tiny-gpu")
    l2 = m.l2
    sl = 0                                                        # half 0: core 0 is near, core 1 far
    near_core, far_core = 0, 1
    assert ST.is_far(MS, near_core, sl) == 0 and ST.is_far(MS, far_core, sl) == 1
    lat, far_x = l2.hit_latency_cycles, l2.far_half_extra_cycles
    r_far = req_alloc(MS.R, 0, 32, KIND_READ, far_core, 0, 0)
    r_near = req_alloc(MS.R, 128, 32, KIND_READ, near_core, 0, 1)
    with_ptr(L2.respond_l2, MS, sl, r_far, 0)                     # the far one is answered first
    with_ptr(L2.respond_l2, MS, sl, r_near, 1)
    left = {}
    for now in range(0, 200):
        before = _injected(MS, sl)
        with_ptr(L2.slice_cycle, MS, sl, now)
        NC.noc_step(MS.resp, now)
        for _ in range(_injected(MS, sl) - before):
            left[len(left)] = now
        if len(left) == 2:
            break
    # each reply leaves its slice after exactly its own pipeline: the near one first
    assert left == {0: 1 + lat, 1: 0 + lat + far_x}
    got = {}
    for now in range(200, 400):
        NC.noc_step(MS.resp, now)
        for core in (near_core, far_core):
            r = NC.noc_eject(MS.resp, MS.node[3, core])
            if r >= 0:
                got[core] = r
    assert got == {near_core: r_near, far_core: r_far}


def test_a_fill_answering_more_reads_than_the_reply_pipeline_holds_loses_none():
    """The slice stops taking requests when its reply pipeline is nearly full, but one fill
    answers every read waiting on the line at once: the replies that find the ring full wait behind
    it, in order. (Replies pushed into a full ring were once dropped: a100-80gb's BLOOM ffn2.dgrad
    lost seven merged reads of one line and never finished.)"""
    from archsim.engine import cache as CA

    m = load_machine("tiny-gpu")
    MS = ST.make_mstate(m, None)
    sl, core = 0, 0
    q = MS.cfg[ST.M_Q_L2D] + sl
    assert ST.is_far(MS, core, sl) == 0
    first = []
    while MS.Q.count[q] < MS.Q.cap[q]:               # the fabric backed up: the ring full of hits
        r = req_alloc(MS.R, 4096, 32, KIND_READ, core, 0, 0)
        with_ptr(L2.respond_l2, MS, sl, r, 0)
        first.append(r)
    line = 1 << 20
    waiting = [req_alloc(MS.R, line, 32, KIND_READ, core, 0, 1) for _ in range(m.l2.max_merge)]
    for i, r in enumerate(waiting):
        st, _ = CA.cache_access_mask(MS.L2, sl, line, 0b0001, 0, False, r, 1)
        assert st == (CA.MISS if i == 0 else CA.MERGED)
    with_ptr(L2.fill_slice, MS, sl, line, 0b0001, 2)
    assert MS.Q.count[q] == MS.Q.cap[q] and MS.spill[q, 0] == waiting[0] and MS.spill[q, 1] == waiting[-1]
    got = []
    for now in range(3, 100_000):
        with_ptr(L2.slice_cycle, MS, sl, now)
        NC.noc_step(MS.resp, now)
        r = NC.noc_eject(MS.resp, MS.node[3, core])
        if r >= 0:
            got.append(r)
        if len(got) == len(first) + len(waiting):
            break
    assert got == first + waiting                    # every reply, oldest first
    assert MS.Q.count[q] == 0 and MS.spill[q, 0] == -1 and MS.spill[q, 1] == -1


# ----------------------------------------------------------------------------- near replicas
REPL = ["l2.near_replicas=true"]


def test_near_replicas_route_reads_to_the_mirror_of_the_home_and_writes_home():
    from archsim.engine.queues import KIND_WRITE

    m, MS = mstate("tiny-gpu", REPL)
    sph = m.l2.slices // m.l2.halves
    rng = np.random.default_rng(3)
    for a in rng.integers(0, 1 << 30, 400) // 32 * 32:
        home = ST.slice_of(MS, int(a))
        for core in range(4):
            half = core % m.l2.halves
            r = req_alloc(MS.R, int(a), 32, KIND_READ, core, 0, 0)
            w = req_alloc(MS.R, int(a), 32, KIND_WRITE, core, 0, 0)
            want = home if home // sph == half else half * sph + home % sph
            assert ST.dest_slice(MS, core, r) == want
            assert ST.dest_slice(MS, core, w) == home
            assert ST.is_far(MS, core, ST.dest_slice(MS, core, r)) == 0     # a read is always answered near
            req_free(MS.R, r)
            req_free(MS.R, w)
    # without replicas every request goes home
    _, M0 = mstate("tiny-gpu")
    r = req_alloc(M0.R, 8192, 32, KIND_READ, 0, 0, 0)
    assert ST.dest_slice(M0, 0, r) == ST.slice_of(M0, 8192) and ST.slice_of(M0, 8192) // sph == 1


def dram_reads(MS, m):
    """The requests waiting at the DRAM channels and their front ends."""
    fe = MS.cfg[ST.M_Q_FE]
    return [q_peek(MS.Q, q, i) for c in range(m.dram.channels) for q in (c, fe + c) for i in range(MS.Q.count[q])]


def test_a_copy_comes_from_the_home_after_its_lookup_and_the_crossing():
    from archsim.engine import cache as CA

    m = load_machine("tiny-gpu", sets=["l2.near_replicas=true", "l2.slice_indexing=consecutive"])
    MS = ST.make_mstate(m, None)
    l2 = m.l2
    sph = l2.slices // l2.halves
    cross = l2.hit_latency_cycles + l2.far_half_extra_cycles
    line = 8192 * 3                                 # half 1
    home = ST.slice_of(MS, line)
    mirror = ST.mirror_slice(MS, home, 0)
    assert home // sph == 1 and mirror == home % sph
    CA.cache_fill(MS.L2, home, line, 0b1111, 0)     # the home holds the line
    q = MS.cfg[ST.M_Q_RFILL] + mirror
    with_ptr(L2.fetch_copy, MS, mirror, home, line, 0b0011, 100)
    assert MS.Q.count[q] == 1
    rd = q_peek(MS.Q, q, 0)
    assert MS.R.aux1[rd] == 100 + cross
    assert MS.R.aux0[rd] == 0b0011 and MS.R.tag[rd] == mirror and MS.R.src[rd] == ST.COPY_HIT
    with_ptr(L2.slice_cycle, MS, mirror, 100 + cross)
    assert MS.Q.count[q] == 0 and CA.cache_probe(MS.L2, mirror, line) == 0b0011
    # a line the home lacks: the copy waits in the home's MSHR entry, whose one DRAM read is the
    # home's; the home's fill forwards the sectors to the mirror after the crossing
    other = line + 128
    with_ptr(L2.fetch_copy, MS, mirror, home, other, 0b0001, 100)
    assert MS.Q.count[q] == 0
    (rm,) = dram_reads(MS, m)
    assert MS.R.tag[rm] == home and MS.R.aux0[rm] == 0b0001
    with_ptr(L2.fill_slice, MS, home, other, 0b0001, 200)
    assert MS.Q.count[q] == 1 and CA.cache_probe(MS.L2, home, other) == 0b0001
    fw = q_peek(MS.Q, q, 0)
    assert MS.R.src[fw] == ST.COPY_HIT and MS.R.aux1[fw] == 200 + cross
    with_ptr(L2.slice_cycle, MS, mirror, 200 + cross - 1)
    assert CA.cache_probe(MS.L2, mirror, other) == -1   # not yet across
    with_ptr(L2.slice_cycle, MS, mirror, 200 + cross)
    assert CA.cache_probe(MS.L2, mirror, other) == 0b0001
    # a write at the home drops the mirror's copy
    with_ptr(L2.drop_copies, MS, home, other)
    assert CA.cache_probe(MS.L2, mirror, other) == -1 and CA.cache_probe(MS.L2, home, other) == 0b0001


def test_both_halves_missing_on_a_line_read_it_from_dram_once():
    """The home slice is the point of coherence: a copy's miss joins the home's own miss of the
    line, and the home's own read joins a copy's, in sharer slots beyond max_merge; a copy's miss
    opens an entry of the mirrors' class when the home's own misses fill its MSHRs. Only a set
    whose every way waits on a fill sends the copy to DRAM by itself, after the crossing."""
    from archsim.engine import cache as CA

    m = load_machine("tiny-gpu", sets=["l2.near_replicas=true", "l2.slice_indexing=consecutive"])
    MS = ST.make_mstate(m, None)
    line = 8192 * 3
    home = ST.slice_of(MS, line)
    mirror = ST.mirror_slice(MS, home, 0)
    q = MS.cfg[ST.M_Q_RFILL] + mirror

    def homed(start, n, where=lambda a: True):
        cand = np.arange(start, start + (1 << 24), 128)
        return [int(a) for a in cand[slices(MS, cand) == home] if where(int(a))][:n]

    def own_miss(addr, t):
        r = req_alloc(MS.R, addr, 32, KIND_READ, 1, 0, t)
        st0, newm = CA.cache_access_mask(MS.L2, home, addr, 0b0001, 0, False, r, t)
        if st0 == CA.MISS:
            with_ptr(L2._fetch, MS, home, addr, newm, t)
        return st0

    def read_masks():
        return sorted((int(MS.R.addr[r]) & ~127, int(MS.R.aux0[r])) for r in dram_reads(MS, m))

    # the home's cores miss first, max_merge of them: the copy still joins, and a second copy of
    # more sectors of the line joins too (a sharer slot a sector)
    assert own_miss(line, 10) == CA.MISS
    for _ in range(m.l2.max_merge - 1):
        assert own_miss(line, 10) == CA.MERGED
    with_ptr(L2.fetch_copy, MS, mirror, home, line, 0b0001, 20)
    with_ptr(L2.fetch_copy, MS, mirror, home, line, 0b0010, 30)
    assert MS.Q.count[q] == 0 and read_masks() == [(line, 0b0001), (line, 0b0010)]
    # the copy misses first: the home's own read joins it
    two = homed(line + 128, 1)[0]
    with_ptr(L2.fetch_copy, MS, mirror, home, two, 0b0011, 40)
    n = len(dram_reads(MS, m))
    r = req_alloc(MS.R, two, 32, KIND_READ, 1, 0, 0)
    assert CA.cache_access_mask(MS.L2, home, two, 0b0010, 0, False, r, 50) == (CA.MERGED, 0)
    assert len(dram_reads(MS, m)) == n
    # the home's own misses take all its MSHRs: a copy's miss still opens an entry there
    for a in homed(two + 128, 64):
        if CA.cache_access_mask(MS.L2, home, a, 0b0001, 0, False, req_alloc(MS.R, a, 32, KIND_READ, 1, 0, 0),
                                60)[0] == CA.RESERVATION_FAIL:
            break
    three = homed(a + 128, 1)[0]
    assert own_miss(three, 70) == CA.RESERVATION_FAIL
    with_ptr(L2.fetch_copy, MS, mirror, home, three, 0b0001, 70)
    assert MS.Q.count[q] == 0 and (three, 0b0001) in read_masks()
    assert MS.L2.inst[home, CA.I_SHR_OPEN] == 2            # the copies of `two` and `three`
    # every way of a set waits on a fill: the copy reads DRAM itself, after the crossing
    L2c = MS.L2.cfg
    s4 = CA.set_index(L2c, homed(three + 128, 1)[0] >> 7)
    same = homed(three + 128, m.l2.assoc + 1, lambda a: CA.set_index(L2c, a >> 7) == s4)
    for a in same[:-1]:
        CA.cache_access_sharer(MS.L2, home, a, 0b0001, req_alloc(MS.R, a, 32, KIND_READ, 1, 0, 0), 80)
    n = len(dram_reads(MS, m))
    with_ptr(L2.fetch_copy, MS, mirror, home, same[-1], 0b0001, 90)
    assert MS.Q.count[q] == 1 and MS.R.src[q_peek(MS.Q, q, 0)] == ST.COPY_MISS
    assert len(dram_reads(MS, m)) == n


def test_with_near_replicas_a_chase_within_half_the_l2_is_all_near_hits():
    """tiny-gpu (L2 256 KiB in two halves, L1 16 KiB): a warm chase over 64 KiB. Without replicas
    the lines homed in the far half cost far_half_extra_cycles more, so the chase over every
    address sits between the near-only and the far-only ones; with them every line is a near hit
    after the warm-up pass."""
    from archsim.micro import run_micro

    p = {"footprint_kib": 64, "loads": 256}
    off = load_machine("tiny-gpu")
    on = load_machine("tiny-gpu", sets=REPL)
    near = run_micro("latency", off, dict(p, half="near")).value
    far = run_micro("latency", off, dict(p, half="far")).value
    mixed = run_micro("latency", off, p).value
    assert far - near == pytest.approx(off.l2.far_half_extra_cycles, abs=3)
    assert near + 5 < mixed < far - 5
    assert run_micro("latency", on, p).value == pytest.approx(near, abs=1.5)
    assert run_micro("latency", on, dict(p, half="far")).value == pytest.approx(near, abs=1.5)


def test_a_slice_with_more_mshrs_than_retry_room_of_old_loses_no_dram_request():
    """A home slice fetches for its mirrors' misses without the accept gate, so its DRAM retry
    queue must hold every sector its MSHRs may fetch. tiny-gpu grown to 16 SMs of 32 warps with
    4096 L2 MSHRs: the retry queue once held 256 entries, lost the requests beyond them and ran
    into --max-cycles (as a100 with l2.mshrs=1536 did); the stream now reads every byte."""
    from archsim.micro import run_micro

    m = load_machine("tiny-gpu", sets=REPL + ["cores.per_group=16", "cores.warp_slots=32", "l2.mshrs=4096",
                                              "l1.mshrs=2048"])
    res = run_micro("bandwidth", m, {"footprint_mib": 8}, max_cycles=3_000_000)
    assert res.complete and res.value > 0
    assert res.kernels[0]["bytes"]["dram_read"] >= 8 * 2**20


@pytest.mark.parametrize("name,indexing", [("a100", "hashed"), ("h100", "hashed"), ("tiny-gpu", "consecutive"),
                                           ("tiny-gpu", "hashed"), ("a100", "consecutive")])
def test_a_contiguous_footprint_fills_every_set_of_every_slice_evenly(name, indexing):
    """A slice indexes its sets by its own line numbers: a footprint of what one SM can keep (half the
    L2 with near replicas, every line in its half's copies; else all of it) puts exactly assoc lines
    in every set of every slice, and below that no set overflows wherever the footprint starts (with
    the global line number some sets held twice assoc lines at 80 % load)."""
    from archsim.engine import cache as CA

    m, MS = mstate(name, A100_CONSECUTIVE if (name, indexing) == ("a100", "consecutive") else
                   [f"l2.slice_indexing={indexing}"])
    l2 = m.l2
    sph = l2.slices // l2.halves
    sets = int(MS.L2.cfg[CA.CFG_SETS])
    where = sph if l2.near_replicas else l2.slices

    def load(base, nbytes):
        lines = np.arange(base, base + nbytes, l2.line_bytes)
        sl = slices(MS, lines) % where
        st = np.array([CA.set_index(MS.L2.cfg, int(a) // l2.line_bytes) for a in lines])
        return np.bincount(sl * sets + st, minlength=where * sets)

    size = l2.size_kib * 1024 // (l2.halves if l2.near_replicas else 1)
    whole = load(0, size)
    assert whole.min() == whole.max() == l2.assoc
    assert load(0x123456000, size * 15 // 16).max() <= l2.assoc


def test_the_waiter_scratch_holds_the_longest_waiter_list():
    """mshr_waiters writes up to an entry's whole waiter list into MS.waiters: a max_merge above
    its old fixed 64 entries (or an L2 with sharer slots) must not run past it."""
    for sets in (["l1.max_merge=100"], ["l2.max_merge=100", "l2.near_replicas=true"]):
        m, MS = mstate("tiny-gpu", sets)
        assert MS.waiters.size >= max(MS.L1.wait.shape[2], MS.L2.wait.shape[2]) >= 100
    m, MS = mstate("tiny-gpu", ["l2.near_replicas=true"])
    sectors = m.l2.line_bytes // m.l2.sector_bytes
    assert MS.L2.wait.shape[2] == m.l2.max_merge + (m.l2.halves - 1) * sectors
    assert MS.L2.mshr.shape[1] == m.l2.mshrs * m.l2.halves   # the mirrors' own entries besides mshrs
