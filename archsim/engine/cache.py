"""Sectored set-associative caches with MSHRs (every SM's L1, every L2 slice), the LSU coalescer and
the shared-memory bank-conflict counter.

Model (as GPGPU-Sim / Accel-Sim's sector caches): a line of ``line_bytes`` holds ``line_bytes /
sector_bytes`` sectors; the tag is per line, valid and dirty bits per sector. A miss allocates on
miss: it picks a victim way at once (evicting it; a dirty victim is reported for a write-back),
installs the new tag with no valid sectors, marks the way *reserved* and opens an MSHR entry tied
to it. A reserved way is never a victim; when every way of a set is reserved the access fails
(RESERVATION_FAIL) and the caller retries. Later misses to the same line merge into the entry
(MERGED), extending its sector mask when they need sectors not yet requested. A fill installs
sectors; the waiters whose sectors are all valid are read with ``mshr_waiters`` and the entry is
released by ``mshr_free``. With allocate on fill (``fill_alloc``, Accel-Sim's streaming L1 of Pascal
and later), a read miss to a line that is not present opens its entry without a way: the entry
keeps the sectors that arrive until a victim way takes the line, so a miss is refused only for want
of MSHR entries, never because every way of its set waits on a fill.

All instances of one cache level (one per SM, one per L2 slice) live in one ``CacheState``: a
NamedTuple of a few numpy arrays indexed ``[instance, ...]`` with named columns (WAY_*, M_*, I_*,
CNT_*); policies are integer codes in ``C.cfg``. Python code can read the columns as named views
(``C.valid``, ``C.mshr_line``, ``C.mshr_nfree`` ...). Addresses are byte addresses; ``line_addr``
arguments are line-aligned byte addresses.

MSHR budget: ``mshrs`` entries per instance (one per line in flight), plus a limit on the sectors in
flight (``mshr_sectors``; the configs' ``mshrs`` counts outstanding *sector* misses, so the machine
helpers use it for both).

Write policies:
- write-through, no write-allocate (NVIDIA L1): a write never allocates and never waits; on a line
  that is present its fully written sectors become valid (partly written invalid sectors stay
  invalid). Status HIT when the line is present, BYPASS when not; the caller forwards *every*
  write-through write downstream either way.
- write-back, write-allocate at sector granularity (L2): fully written sectors become valid and
  dirty with no fill; partly written sectors that are not valid are fetched (MISS / MERGED: the
  write waits for them; they are already marked dirty, so nothing is redone after the fill). A
  write that needs no fetch returns HIT, also when it allocated a line (counted as a miss).
- write-back without write-allocate: a write that would need a fetch or a line is passed on whole
  (BYPASS).

Counters partition the accesses that did not fail: accesses = hits + misses (line not present) +
sector_misses (line present, some needed sector neither valid nor already requested; an MSHR
extension counts here) + merges (every needed sector valid or already requested).

Speed: the jitted functions here are compiled without numba's reference counting (``_nrt=False``;
they allocate nothing). With it, a function whose control flow has more than one exit keeps an
increment and a decrement per array of the state tuple on every call (~20 ns per array on the
development machine, 0.5 us per call for a 22-array tuple). The state is a few packed arrays rather
than one per field because every call copies the flattened tuple, and the private helpers that take
the state are inlined: a plain hit costs ~35 ns, a miss with its fill a few hundred.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine.jit import njit

# ----------------------------------------------------------------------------- codes
HIT, MISS, MERGED, RESERVATION_FAIL, BYPASS = 0, 1, 2, 3, 4
STATUS_NAMES = ("HIT", "MISS", "MERGED", "RESERVATION_FAIL", "BYPASS")

WRITE_THROUGH, WRITE_BACK = 0, 1
NO_WRITE_ALLOCATE, WRITE_ALLOCATE = 0, 1
REPL_LRU, REPL_FIFO = 0, 1

# cfg fields
CFG_SETS, CFG_ASSOC, CFG_LINE_BYTES, CFG_LINE_SHIFT, CFG_SECTOR_BYTES, CFG_NSECT = 0, 1, 2, 3, 4, 5
CFG_WRITE, CFG_ALLOC, CFG_REPL, CFG_HASH, CFG_SETS_POW2, CFG_SET_BITS = 6, 7, 8, 9, 10, 11
CFG_MSHRS, CFG_MAX_MERGE, CFG_MSHR_SECTORS, CFG_SECTOR_SHIFT = 12, 13, 14, 15
# how an L2 slice numbers its own lines (slice_local_line): lines per slice granule, slices per half
# (0: the set index reads the global line number), lines per half-interleave chunk (0: no halves
# interleave), halves
CFG_SQ_LPG, CFG_SQ_SPH, CFG_SQ_HALF_LINES, CFG_SQ_HALVES = 16, 17, 18, 19
CFG_SHARERS = 20   # an entry's waiter slots beyond max_merge that only cache_access_sharer takes
CFG_SHARER_ENTRIES = 21   # entries beyond mshrs that only cache_access_sharer opens
CFG_FILL_ALLOC = 22   # 1: a read miss to a line not present takes a way only when its data arrives
N_CFG = 23
# way columns: C.way[inst, set, way, WAY_*]
WAY_VALID, WAY_DIRTY, WAY_STAMP, WAY_MSHR = 0, 1, 2, 3
N_WAY = 4
# MSHR columns: C.mshr[inst, entry, M_*]; M_FREE is the free-entry stack (slots 0..nfree-1);
# M_NSHR counts the entry's waiters that are sharers (cache_access_sharer); M_BYSHR is 1 for an
# entry a sharer opened (it counts in I_SHR_OPEN / I_SHR_SECTORS, not in the mshrs budget). An entry
# with no way (M_WAY -1, CFG_FILL_ALLOC) keeps the sectors that arrived in M_VALID and is chained to
# the other wayless entries of its set through M_NEXT (CacheState.wayless holds each set's first)
M_LINE, M_MASK, M_PEND, M_SET, M_WAY, M_T, M_NWAIT, M_FREE, M_NSHR, M_BYSHR, M_NEXT, M_VALID = range(12)
N_M = 12
# waiter columns: C.wait[inst, entry, k, W_*]; W_SHR is 1 for a sharer
W_REQ, W_NEED, W_SHR = 0, 1, 2
N_W = 3
# per-instance columns: C.inst[inst, I_*]; I_SECTORS counts the sectors in flight of the entries
# the instance's own requests opened, I_SHR_* the entries sharers opened and their sectors
I_TICK, I_NFREE, I_SECTORS, I_SHR_OPEN, I_SHR_SECTORS = 0, 1, 2, 3, 4
N_I = 5

# counters
COUNTER_NAMES = ("accesses", "reads", "writes", "hits", "misses", "sector_misses", "merges",
                 "reservation_fails", "bypasses", "evictions", "writebacks", "writeback_sectors", "fills",
                 "fetch_sectors")
(CNT_ACCESSES, CNT_READS, CNT_WRITES, CNT_HITS, CNT_MISSES, CNT_SECTOR_MISSES, CNT_MERGES, CNT_RES_FAILS,
 CNT_BYPASSES, CNT_EVICTIONS, CNT_WRITEBACKS, CNT_WB_SECTORS, CNT_FILLS, CNT_FETCH_SECTORS) = range(14)
N_CNT = len(COUNTER_NAMES)


class CacheState(NamedTuple):
    cfg: np.ndarray    # int64 [N_CFG] geometry and policy codes (CFG_*)
    tag: np.ndarray    # int64 [I, S, W] line number (addr >> line_shift), -1 = empty way
    way: np.ndarray    # int64 [I, S, W, N_WAY] valid / dirty sector masks, replacement stamp
    #                    (LRU: last use, FIFO: insertion), MSHR entry filling the way (-1: none, evictable)
    mshr: np.ndarray   # int64 [I, E, N_M] line (-1 = free entry), sectors requested, sectors pending,
    #                    set, way, cycle opened, waiters, free stack
    wait: np.ndarray   # int64 [I, E, max_merge, 2] waiting request id, sectors it needs
    inst: np.ndarray   # int64 [I, N_I] stamp clock, free entries, sectors in flight, sharers' entries
    #                    and their sectors in flight
    cnt: np.ndarray    # int64 [I, N_CNT] counters (CNT_*)
    evict_addr: np.ndarray   # int64 [I] dirty victim of the last cache_access / cache_fill: line byte
    evict_dirty: np.ndarray  # int64 [I] address and dirty sector mask (0: that call wrote nothing back)
    wayless: np.ndarray      # int64 [I, S] first MSHR entry of the set that holds no way yet (-1: none)

    # named views, for Python code and tests (jitted code indexes the columns)
    valid = property(lambda self: self.way[..., WAY_VALID])
    dirty = property(lambda self: self.way[..., WAY_DIRTY])
    stamp = property(lambda self: self.way[..., WAY_STAMP])
    reserved = property(lambda self: self.way[..., WAY_MSHR])
    mshr_line = property(lambda self: self.mshr[..., M_LINE])
    mshr_mask = property(lambda self: self.mshr[..., M_MASK])
    mshr_pending = property(lambda self: self.mshr[..., M_PEND])
    mshr_set = property(lambda self: self.mshr[..., M_SET])
    mshr_way = property(lambda self: self.mshr[..., M_WAY])
    mshr_t = property(lambda self: self.mshr[..., M_T])
    mshr_nwait = property(lambda self: self.mshr[..., M_NWAIT])
    mshr_wait = property(lambda self: self.wait[..., W_REQ])
    mshr_wneed = property(lambda self: self.wait[..., W_NEED])
    mshr_nfree = property(lambda self: self.inst[:, I_NFREE])
    mshr_sectors = property(lambda self: self.inst[:, I_SECTORS])


def _pow2(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def make_cache_state(n_instances, size_bytes, line_bytes, sector_bytes, assoc, mshrs, max_merge,
                     write_policy=WRITE_BACK, alloc_policy=WRITE_ALLOCATE, replacement=REPL_LRU, *,
                     set_hash=False, mshr_sectors=None, sharer_slots=0, sharer_entries=0,
                     fill_alloc=False) -> CacheState:
    """``n_instances`` caches of ``size_bytes`` each. ``mshrs`` entries (lines in flight) per instance,
    each with up to ``max_merge`` waiters and ``sharer_slots`` more that only cache_access_sharer
    takes; ``mshr_sectors`` caps the sectors in flight (default: no cap beyond mshrs x sectors per
    line). ``sharer_entries`` more entries only cache_access_sharer opens, outside both caps (a
    directory's own resources for the other caches' requests). ``set_hash`` hashes higher
    line-address bits into the set index (see set_index). ``fill_alloc``: a read miss to a line that is
    not present opens its entry without a way, and the line takes a victim way when its data arrives
    (allocate on fill), so a set whose every way waits on a fill never refuses a miss; otherwise the
    miss reserves its way at once (allocate on miss)."""
    n_instances, size_bytes, line_bytes, sector_bytes = int(n_instances), int(size_bytes), int(line_bytes), int(sector_bytes)
    assoc, mshrs, max_merge = int(assoc), int(mshrs), int(max_merge)
    if n_instances <= 0:
        raise ValueError(f"n_instances {n_instances} must be positive")
    if not _pow2(line_bytes) or not _pow2(sector_bytes) or line_bytes % sector_bytes:
        raise ValueError(f"line_bytes {line_bytes} and sector_bytes {sector_bytes} must be powers of two, "
                         "sector_bytes dividing line_bytes")
    nsect = line_bytes // sector_bytes
    if nsect > 62:
        raise ValueError(f"{nsect} sectors per line: at most 62 are supported")
    if assoc <= 0 or size_bytes <= 0 or size_bytes % (line_bytes * assoc):
        raise ValueError(f"size_bytes {size_bytes} is not a whole number of {assoc}-way sets of {line_bytes}-B lines")
    if mshrs <= 0 or max_merge <= 0:
        raise ValueError(f"mshrs {mshrs} and max_merge {max_merge} must be positive")
    if int(sharer_slots) < 0 or int(sharer_entries) < 0:
        raise ValueError(f"sharer_slots {sharer_slots} and sharer_entries {sharer_entries} must not be negative")
    if write_policy not in (WRITE_THROUGH, WRITE_BACK):
        raise ValueError(f"write_policy {write_policy}: one of WRITE_THROUGH={WRITE_THROUGH}, WRITE_BACK={WRITE_BACK}")
    if alloc_policy not in (NO_WRITE_ALLOCATE, WRITE_ALLOCATE):
        raise ValueError(f"alloc_policy {alloc_policy}: one of NO_WRITE_ALLOCATE={NO_WRITE_ALLOCATE}, "
                         f"WRITE_ALLOCATE={WRITE_ALLOCATE}")
    if replacement not in (REPL_LRU, REPL_FIFO):
        raise ValueError(f"replacement {replacement}: one of REPL_LRU={REPL_LRU}, REPL_FIFO={REPL_FIFO}")
    sets = size_bytes // (line_bytes * assoc)
    if sets >= 1 << 31:
        from archsim.errors import InputError

        raise InputError("cache size", f"a cache of {size_bytes:,} bytes has {sets:,} sets",
                         "size_kib / (line_bytes x assoc) below 2^31 sets")
    if mshr_sectors is None:
        mshr_sectors = mshrs * nsect
    if int(mshr_sectors) <= 0:
        raise ValueError(f"mshr_sectors {mshr_sectors} must be positive")
    cfg = np.zeros(N_CFG, np.int64)
    cfg[CFG_SETS] = sets
    cfg[CFG_ASSOC] = assoc
    cfg[CFG_LINE_BYTES] = line_bytes
    cfg[CFG_LINE_SHIFT] = line_bytes.bit_length() - 1
    cfg[CFG_SECTOR_BYTES] = sector_bytes
    cfg[CFG_SECTOR_SHIFT] = sector_bytes.bit_length() - 1
    cfg[CFG_NSECT] = nsect
    cfg[CFG_WRITE] = write_policy
    cfg[CFG_ALLOC] = alloc_policy
    cfg[CFG_REPL] = replacement
    cfg[CFG_HASH] = 1 if set_hash else 0
    cfg[CFG_SETS_POW2] = 1 if _pow2(sets) else 0
    cfg[CFG_SET_BITS] = max(1, (sets - 1).bit_length())
    cfg[CFG_MSHRS] = mshrs
    cfg[CFG_MAX_MERGE] = max_merge
    cfg[CFG_SHARERS] = int(sharer_slots)
    cfg[CFG_SHARER_ENTRIES] = int(sharer_entries)
    cfg[CFG_MSHR_SECTORS] = int(mshr_sectors)
    cfg[CFG_FILL_ALLOC] = 1 if fill_alloc else 0
    I, S, W, E, M = n_instances, sets, assoc, mshrs + int(sharer_entries), max_merge + int(sharer_slots)
    way = np.zeros((I, S, W, N_WAY), np.int64)
    way[..., WAY_MSHR] = -1
    mshr = np.zeros((I, E, N_M), np.int64)
    mshr[..., M_LINE] = -1
    mshr[..., M_FREE] = np.arange(E - 1, -1, -1)   # pop order 0, 1, 2 ...
    inst = np.zeros((I, N_I), np.int64)
    inst[:, I_NFREE] = E
    # an entry's waiters are read only below its M_NWAIT: the array starts as zeros, which the OS
    # hands out untouched (filling a large L1's with -1 cost milliseconds a launch)
    return CacheState(cfg=cfg, tag=np.full((I, S, W), -1, np.int64), way=way, mshr=mshr,
                      wait=np.zeros((I, E, M, N_W), np.int64), inst=inst, cnt=np.zeros((I, N_CNT), np.int64),
                      evict_addr=np.zeros(I, np.int64), evict_dirty=np.zeros(I, np.int64),
                      wayless=np.full((I, S), -1, np.int64))


# the LDM cache keeps 32-B sectors internally so that a store writes through only the bytes' sectors;
# a load miss fills the whole line (mem_state.M_FILL_LINE)
LDM_CACHE_SECTOR = 32
LDM_CACHE_MAX_MERGE = 8   # requests waiting on one LDM-cache MSHR entry (as the GPU L1's default)
REPLACEMENT = {"lru": REPL_LRU, "fifo": REPL_FIFO}   # l1 / l2 .replacement


def make_l1_state(machine, *, set_hash=False):
    """One L1 per core: capacity l1.size_kib minus the shared-memory carveout when carved_from_l1;
    write-through, no write-allocate, l1.replacement (default LRU), linear set index
    (Accel-Sim's "L:T:m:L:L"). The config's l1.mshrs (outstanding sector misses) bounds both entries
    and sectors in flight. None when the machine has no L1 or the carveout leaves no cache."""
    from archsim.config import cores_total, l1_cache_kib

    l1 = machine.l1
    sp = machine.scratchpad
    if l1 is None and sp.kind == "ldm" and sp.cache_kib > 0:
        # the LDM cache of a CPE (Sunway): scratchpad.cache_kib of the LDM, whole lines of
        # cache_line_bytes filled on a miss (core_side.py asks for every sector of the line), stores
        # written through without allocating, as the GPU L1 (the write policy is not in our sources)
        return make_cache_state(cores_total(machine), sp.cache_kib * 1024, sp.cache_line_bytes, LDM_CACHE_SECTOR,
                                sp.cache_assoc, sp.cache_mshrs, LDM_CACHE_MAX_MERGE, WRITE_THROUGH,
                                NO_WRITE_ALLOCATE, REPL_LRU, set_hash=set_hash,
                                mshr_sectors=sp.cache_mshrs * (sp.cache_line_bytes // LDM_CACHE_SECTOR))
    if l1 is None:
        return None
    kib = l1_cache_kib(machine)
    if kib <= 0:
        return None
    size = kib * 1024
    if size % (l1.line_bytes * l1.assoc):
        raise ValueError(f"{machine.name}: l1.size_kib {l1.size_kib} - scratchpad.size_kib "
                         f"{machine.scratchpad.size_kib} = {kib} KiB is not a whole number of {l1.assoc}-way sets "
                         f"of {l1.line_bytes}-B lines (allowed: a multiple of {l1.line_bytes * l1.assoc} B)")
    return make_cache_state(cores_total(machine), size, l1.line_bytes, l1.sector_bytes, l1.assoc, l1.mshrs,
                            l1.max_merge, WRITE_THROUGH, NO_WRITE_ALLOCATE, REPLACEMENT[l1.replacement],
                            set_hash=set_hash, mshr_sectors=l1.mshrs, fill_alloc=l1.allocate == "on_fill")


def make_l2_state(machine, *, set_hash=True):
    """One cache per L2 slice (l2.size_kib / l2.slices each); write-back, write-allocate at sector
    granularity, l2.replacement (default LRU), hashed set index (Accel-Sim's "L:B:m:L:P"; the hash
    also keeps a slice's sets evenly used when addresses are interleaved over slices). l2.mshrs per
    slice bounds both entries and sectors in flight. None when the machine has no L2."""
    l2 = machine.l2
    if l2 is None:
        return None
    size = l2.size_kib * 1024 // l2.slices
    C = make_cache_state(l2.slices, size, l2.line_bytes, l2.sector_bytes, l2.assoc, l2.mshrs, l2.max_merge,
                         WRITE_BACK, WRITE_ALLOCATE, REPLACEMENT[l2.replacement], set_hash=set_hash,
                         mshr_sectors=l2.mshrs, **_sharer_sizes(l2))
    # a slice indexes its sets by its own line numbers (the address with the slice-select bits
    # taken out, as mem_state.slice_of interleaves granules over the slices of a half), so that a
    # contiguous footprint fills every set of every slice evenly, as a hardware slice indexing by
    # the address bits above its select bits does
    granule = machine.memory_controllers.address_mapping.interleave_bytes
    if granule >= l2.line_bytes and granule % l2.line_bytes == 0:
        sph = l2.slices // l2.halves
        chunk = l2.interleave_bytes
        C.cfg[CFG_SQ_LPG] = granule // l2.line_bytes
        C.cfg[CFG_SQ_SPH] = sph
        C.cfg[CFG_SQ_HALVES] = l2.halves
        # slice_of numbers granules within their half when the chunk is whole granules; with
        # consecutive indexing that agrees with its global granule number modulo sph only when a
        # chunk holds a multiple of sph granules (else the global number is the slice's)
        if l2.halves > 1 and chunk % granule == 0 and (
                l2.slice_indexing == "hashed" or (chunk // granule) % sph == 0):
            C.cfg[CFG_SQ_HALF_LINES] = chunk // l2.line_bytes
    return C


def _sharer_sizes(l2):
    """With near_replicas a home slice takes the mirrors' copy requests in resources of their own:
    a mirror slice asks its home once per line it has in flight and once more per sector it adds,
    so mshrs entries and a slot per sector for each other half never refuse one."""
    if not l2.near_replicas or l2.halves < 2:
        return dict(sharer_slots=0, sharer_entries=0)
    return dict(sharer_slots=(l2.halves - 1) * (l2.line_bytes // l2.sector_bytes),
                sharer_entries=(l2.halves - 1) * l2.mshrs)


# ----------------------------------------------------------------------------- helpers
_NOREF = dict()   # jit.py's defaults: no reference counting (see "Speed" in the module docstring)
# private helpers that take the state, inlined (numba IR) into their callers: a call that passes
# the state costs more than their work. Never inline them into reference-counted callers.
_NOREF_INLINE = dict(inline="always")


@njit(**_NOREF)
def popcount(x):
    x = np.int64(x)
    n = 0
    while x:
        x &= x - 1
        n += 1
    return n


@njit(**_NOREF)
def sector_mask_of(cfg, addr, nbytes):
    """Sectors of addr's line touched by [addr, addr + nbytes), clipped to the line."""
    lb = cfg[CFG_LINE_BYTES]
    off = addr & (lb - 1)
    end = min(off + nbytes, lb)
    sh = cfg[CFG_SECTOR_SHIFT]
    m = np.int64(0)
    if end > off:
        s0 = off >> sh
        s1 = (end - 1) >> sh
        m = ((np.int64(1) << (s1 + 1)) - 1) ^ ((np.int64(1) << s0) - 1)
    return m


@njit(**_NOREF)
def full_sector_mask_of(cfg, addr, nbytes):
    """Sectors of addr's line that [addr, addr + nbytes) covers completely."""
    lb = cfg[CFG_LINE_BYTES]
    sb = cfg[CFG_SECTOR_BYTES]
    off = addr & (lb - 1)
    end = min(off + nbytes, lb)
    s0 = (off + sb - 1) // sb
    s1 = end // sb  # exclusive
    m = np.int64(0)
    if s1 > s0:
        m = ((np.int64(1) << s1) - 1) ^ ((np.int64(1) << s0) - 1)
    return m


@njit(**_NOREF)
def _set_of(line, sets, pow2, hashed, bits):
    if pow2:
        lo = line & (sets - 1)
        hi = line >> bits
    else:
        lo = line % sets
        hi = line // sets
    r = lo
    if hashed:
        hi = (hi ^ (hi >> 32)) & 0xFFFFFFFF
        x = (hi * 2654435761) & 0xFFFFFFFF       # Knuth's multiplicative (Fibonacci) hash, 32 bits
        if pow2:
            r = (lo ^ (x >> (32 - bits))) & (sets - 1)
        else:
            r = (lo + x) % sets
    return r


@njit(**_NOREF)
def slice_local_line(cfg, line):
    """An L2 slice's own number for a global line number: the slice's granules numbered
    consecutively (the half's granules, then every sph-th of them), the line's place in its granule
    below. Each group of sph consecutive granules covers each slice once (mem_state.slice_of), so
    granule q is the slice's granule q // sph, q numbered within the half (CFG_SQ_HALF_LINES) or
    globally as slice_of numbers it. Without CFG_SQ_SPH the global line number."""
    sph = cfg[CFG_SQ_SPH]
    if sph == 0:
        return line
    lpg = cfg[CFG_SQ_LPG]
    hl = cfg[CFG_SQ_HALF_LINES]
    if hl > 0:
        q = line // (hl * cfg[CFG_SQ_HALVES]) * (hl // lpg) + (line % hl) // lpg
    else:
        q = line // lpg
    return (q // sph) * lpg + line % lpg


@njit(**_NOREF)
def set_index(cfg, line):
    """Set of a line number (an L2 slice's own number, slice_local_line): line % sets, or with
    CFG_HASH a multiplicative hash of the higher bits (line // sets) XORed (power-of-two sets) or
    added (other set counts) to it. Either way the ``sets`` consecutive lines of one aligned group
    fill every set once (sweeps keep the whole capacity), while strided streams (large power-of-two
    strides) spread over the sets."""
    return _set_of(slice_local_line(cfg, line), cfg[CFG_SETS], cfg[CFG_SETS_POW2] != 0, cfg[CFG_HASH] != 0,
                   cfg[CFG_SET_BITS])


# ----------------------------------------------------------------------------- access / fill
@njit(**_NOREF)
def cache_access(C, inst, addr, nbytes, is_write, req_id, now):
    """One access of [addr, addr + nbytes) (within one line) -> (status, sector_mask); see
    cache_access_mask."""
    cfg = C.cfg
    return _access(C, inst, addr & ~(cfg[CFG_LINE_BYTES] - 1), sector_mask_of(cfg, addr, nbytes),
                   full_sector_mask_of(cfg, addr, nbytes), is_write, req_id, now)


@njit(**_NOREF)
def cache_access_mask(C, inst, line_addr, mask, full_mask, is_write, req_id, now):
    """Access sectors ``mask`` of the line at ``line_addr`` (a coalescer output); for a write,
    ``full_mask`` are the sectors it overwrites completely. Returns (status, sector_mask):
    HIT (0, done), MISS (1, new MSHR entry; fetch sector_mask downstream; req_id waits),
    MERGED (2, req_id waits on an entry in flight; fetch sector_mask too when non-zero),
    RESERVATION_FAIL (3, nothing changed; retry), BYPASS (4, a write passed on, nothing allocated).
    A dirty victim evicted by this call is left in C.evict_addr[inst] / C.evict_dirty[inst] (mask 0
    when there is none)."""
    return _access(C, inst, line_addr, mask, full_mask, is_write, req_id, now)


@njit(**_NOREF)
def cache_access_sharer(C, inst, line_addr, mask, req_id, now):
    """A read of sectors ``mask`` for another cache that keeps a copy of the line (an L2 half's
    mirror slice asking the home slice): as cache_access_mask, but its wait on an entry in flight
    may take the entry's sharer slots beyond max_merge, as a directory marks a sharer in a bit of
    its own rather than in a slot the cores' requests need."""
    C.evict_dirty[inst] = 0
    line = line_addr >> C.cfg[CFG_LINE_SHIFT]
    s, w = _lookup(C, inst, line)
    return _access_slow(C, inst, line, s, w, mask, np.int64(0), np.bool_(False), req_id, now, np.bool_(True))


@njit(**_NOREF_INLINE)
def _lookup(C, inst, line):
    """(set, way) of a line number in instance inst; way -1 when the line is not present."""
    s = set_index(C.cfg, line)
    for k in range(C.tag.shape[2]):
        if C.tag[inst, s, k] == line:
            return s, k
    return s, -1


@njit(**_NOREF_INLINE)
def _access(C, inst, line_addr, mask, full_mask, is_write, req_id, now):
    cfg = C.cfg
    C.evict_dirty[inst] = 0
    line = line_addr >> cfg[CFG_LINE_SHIFT]
    s, w = _lookup(C, inst, line)
    status = np.int64(HIT)
    ret = np.int64(0)
    if w >= 0 and (mask & ~C.way[inst, s, w, WAY_VALID]) == 0:
        # hit on valid sectors (the common case, kept short): the same under every policy
        C.cnt[inst, CNT_ACCESSES] += 1
        C.cnt[inst, CNT_HITS] += 1
        C.cnt[inst, CNT_WRITES if is_write else CNT_READS] += 1
        if cfg[CFG_REPL] == REPL_LRU:
            t = C.inst[inst, I_TICK] + 1
            C.inst[inst, I_TICK] = t
            C.way[inst, s, w, WAY_STAMP] = t
        if is_write and cfg[CFG_WRITE] == WRITE_BACK:
            C.way[inst, s, w, WAY_DIRTY] |= mask
    else:
        status, ret = _access_slow(C, inst, line, s, w, mask, full_mask, is_write, np.int64(req_id), now,
                                   np.bool_(False))
    return status, ret


@njit(**_NOREF_INLINE)
def _wayless(C, inst, s, line):
    """The entry of set s fetching ``line`` without a way yet, -1 when there is none."""
    e = C.wayless[inst, s]
    while e >= 0 and C.mshr[inst, e, M_LINE] != line:
        e = C.mshr[inst, e, M_NEXT]
    return e


@njit(**_NOREF_INLINE)
def _unchain(C, inst, e):
    """Take wayless entry e out of its set's chain."""
    s = C.mshr[inst, e, M_SET]
    p = C.wayless[inst, s]
    if p == e:
        C.wayless[inst, s] = C.mshr[inst, e, M_NEXT]
        return
    while C.mshr[inst, p, M_NEXT] != e:
        p = C.mshr[inst, p, M_NEXT]
    C.mshr[inst, p, M_NEXT] = C.mshr[inst, e, M_NEXT]


@njit(**_NOREF_INLINE)
def _victim(C, inst, s):
    """An empty way, else the non-reserved way with the smallest stamp; -1 when all are reserved."""
    w = -1
    bstamp = np.int64(0)
    k = 0
    n = C.tag.shape[2]
    while k < n:
        if C.way[inst, s, k, WAY_MSHR] < 0:
            if C.tag[inst, s, k] < 0:
                w = k
                k = n
            else:
                st = C.way[inst, s, k, WAY_STAMP]
                if w < 0 or st < bstamp:
                    w = k
                    bstamp = st
        k += 1
    return w


@njit(**_NOREF_INLINE)
def _install(C, inst, s, w, line):
    """Give way w to ``line`` with no valid sectors, evicting what it held (a dirty victim is
    counted and reported)."""
    old = C.tag[inst, s, w]
    if old >= 0:
        C.cnt[inst, CNT_EVICTIONS] += 1
        d = C.way[inst, s, w, WAY_DIRTY]
        if d != 0:
            C.cnt[inst, CNT_WRITEBACKS] += 1
            C.cnt[inst, CNT_WB_SECTORS] += popcount(d)
            C.evict_addr[inst] = old << C.cfg[CFG_LINE_SHIFT]
            C.evict_dirty[inst] = d
    C.tag[inst, s, w] = line
    C.way[inst, s, w, WAY_VALID] = 0
    C.way[inst, s, w, WAY_DIRTY] = 0
    t = C.inst[inst, I_TICK] + 1
    C.inst[inst, I_TICK] = t
    C.way[inst, s, w, WAY_STAMP] = t


@njit(**_NOREF_INLINE)
def _no_entry(C, inst, sharer):
    """Whether a new MSHR entry of the caller's class is out of budget: a sharer's among the
    cfg[CFG_SHARER_ENTRIES] of its class, the instance's own among cfg[CFG_MSHRS]."""
    if sharer:
        return C.inst[inst, I_SHR_OPEN] >= C.cfg[CFG_SHARER_ENTRIES]
    used = C.mshr.shape[1] - C.inst[inst, I_NFREE] - C.inst[inst, I_SHR_OPEN]
    return used >= C.cfg[CFG_MSHRS]


@njit(**_NOREF_INLINE)
def _merge_full(C, inst, e, sharer):
    """Entry e takes no more waiters of this class: a sharer's past cfg[CFG_SHARERS] sharers, a
    request's past max_merge waiters besides the sharers."""
    nshr = C.mshr[inst, e, M_NSHR]
    if sharer:
        return nshr >= C.cfg[CFG_SHARERS]
    return C.mshr[inst, e, M_NWAIT] - nshr >= C.cfg[CFG_MAX_MERGE]


@njit(**_NOREF)
def _access_slow(C, inst, line, s, w, mask, full_mask, is_write, req_id, now, sharer):
    """cache_access_mask past the tag lookup (line in set s, way w or -1), for all but plain hits.
    An entry in flight takes max_merge waiters besides its sharers, and cfg[CFG_SHARERS] sharers. A
    sharer opens entries of its own class (cfg[CFG_SHARER_ENTRIES] of them, no sector cap), so the
    instance's own misses never hold up another cache's request to it (no cycle of waits between
    two caches that are each other's home)."""
    cfg = C.cfg
    write_alloc = is_write and cfg[CFG_ALLOC] == WRITE_ALLOCATE
    full = full_mask & mask if is_write else np.int64(0)
    # 1. decide (no state changes): what is needed, from whom, and whether resources allow it
    status = HIT
    kind = CNT_HITS
    need = np.int64(0)    # sectors this request waits for
    new = np.int64(0)     # sectors to request downstream
    e = np.int64(-1)      # MSHR entry to join (-1: open one when need != 0)
    install = False
    if w >= 0:
        v = C.way[inst, s, w, WAY_VALID]
        if (mask & ~v) != 0:
            kind = CNT_SECTOR_MISSES
        if is_write:
            need = mask & ~full & ~v                    # partly written sectors with no data here
            if not write_alloc and need != 0 and cfg[CFG_WRITE] == WRITE_BACK:
                status = BYPASS                         # cannot hold partial sectors: pass it on
            if not write_alloc:
                need = np.int64(0)                      # write-through: the rest goes downstream
        else:
            need = mask & ~v
        if need != 0 and status == HIT:
            e = C.way[inst, s, w, WAY_MSHR]
            if e >= 0:
                new = need & ~C.mshr[inst, e, M_MASK]
                status = MERGED
                kind = CNT_SECTOR_MISSES if new != 0 else CNT_MERGES
                if _merge_full(C, inst, e, sharer):
                    status = RESERVATION_FAIL
            else:
                new = need
                status = MISS
                if _no_entry(C, inst, sharer):
                    status = RESERVATION_FAIL
    else:
        kind = CNT_MISSES
        if is_write and not write_alloc:
            status = BYPASS
        elif cfg[CFG_FILL_ALLOC] == 1 and not is_write:
            # allocate on fill: the line takes no way before its data arrives (a sharer's read too)
            e = _wayless(C, inst, s, line)
            if e >= 0:   # in flight already: join it (sectors that arrived are in its buffer)
                need = mask & ~C.mshr[inst, e, M_VALID]
                new = need & ~C.mshr[inst, e, M_MASK]
                if need != 0:
                    status = MERGED
                    kind = CNT_SECTOR_MISSES if new != 0 else CNT_MERGES
                    if _merge_full(C, inst, e, sharer):
                        status = RESERVATION_FAIL
                else:
                    kind = CNT_HITS
            else:
                need = mask
                new = need
                status = MISS
                if _no_entry(C, inst, sharer):
                    status = RESERVATION_FAIL
        else:
            need = mask & ~full
            new = need
            status = MISS if need != 0 else HIT
            if need != 0 and _no_entry(C, inst, sharer):
                status = RESERVATION_FAIL
            install = True
    nnew = popcount(new)
    # sectors count in the class of the entry that fetches them: a sharer's entry has no cap
    by_shr = C.mshr[inst, e, M_BYSHR] == 1 if e >= 0 else sharer
    if nnew != 0 and status != RESERVATION_FAIL and not by_shr:
        if C.inst[inst, I_SECTORS] + nnew > cfg[CFG_MSHR_SECTORS]:
            status = RESERVATION_FAIL
    if install and status != RESERVATION_FAIL:
        w = _victim(C, inst, s)
        if w < 0:
            status = RESERVATION_FAIL
    ret = np.int64(0)
    if status == RESERVATION_FAIL:
        C.cnt[inst, CNT_RES_FAILS] += 1
    else:
        # 2. act
        C.cnt[inst, CNT_ACCESSES] += 1
        C.cnt[inst, kind] += 1
        C.cnt[inst, CNT_WRITES if is_write else CNT_READS] += 1
        if status == BYPASS:
            C.cnt[inst, CNT_BYPASSES] += 1
            ret = mask
        else:
            if install:
                _install(C, inst, s, w, line)
            elif w >= 0 and cfg[CFG_REPL] == REPL_LRU:
                t = C.inst[inst, I_TICK] + 1
                C.inst[inst, I_TICK] = t
                C.way[inst, s, w, WAY_STAMP] = t
            if is_write and w >= 0:
                C.way[inst, s, w, WAY_VALID] |= full
                if cfg[CFG_WRITE] == WRITE_BACK:
                    C.way[inst, s, w, WAY_DIRTY] |= mask
            if need == 0:
                status = HIT
            else:
                if e < 0:   # open an entry tied to this way (w -1: wayless, chained to its set)
                    n = C.inst[inst, I_NFREE] - 1
                    e = C.mshr[inst, n, M_FREE]
                    C.inst[inst, I_NFREE] = n
                    C.mshr[inst, e, M_LINE] = line
                    C.mshr[inst, e, M_MASK] = 0
                    C.mshr[inst, e, M_PEND] = 0
                    C.mshr[inst, e, M_SET] = s
                    C.mshr[inst, e, M_WAY] = w
                    C.mshr[inst, e, M_T] = now
                    C.mshr[inst, e, M_NWAIT] = 0
                    C.mshr[inst, e, M_NSHR] = 0
                    C.mshr[inst, e, M_BYSHR] = 1 if sharer else 0
                    C.mshr[inst, e, M_VALID] = 0
                    if sharer:
                        C.inst[inst, I_SHR_OPEN] += 1
                    if w >= 0:
                        C.way[inst, s, w, WAY_MSHR] = e
                    else:
                        C.mshr[inst, e, M_NEXT] = C.wayless[inst, s]
                        C.wayless[inst, s] = e
                k = C.mshr[inst, e, M_NWAIT]
                C.wait[inst, e, k, W_REQ] = req_id
                C.wait[inst, e, k, W_NEED] = need
                C.wait[inst, e, k, W_SHR] = 1 if sharer else 0
                C.mshr[inst, e, M_NWAIT] = k + 1
                if sharer:
                    C.mshr[inst, e, M_NSHR] += 1
                if new != 0:
                    C.mshr[inst, e, M_MASK] |= new
                    C.mshr[inst, e, M_PEND] |= new
                    C.inst[inst, I_SHR_SECTORS if by_shr else I_SECTORS] += nnew
                    C.cnt[inst, CNT_FETCH_SECTORS] += nnew
                ret = new
    return np.int64(status), ret


@njit(**_NOREF)
def cache_fill(C, inst, line_addr, sector_mask, now):
    """Sectors ``sector_mask`` of the line at ``line_addr`` arrive. Returns the MSHR entry fetching
    that line (read its ready waiters with mshr_waiters, then mshr_free), or -1 when none was: the
    sectors are then added to the line if present, else installed in a victim way (a dirty victim is
    reported in C.evict_addr / C.evict_dirty), or dropped when every way of the set is reserved."""
    cfg = C.cfg
    C.evict_dirty[inst] = 0
    line = line_addr >> cfg[CFG_LINE_SHIFT]
    s, w = _lookup(C, inst, line)
    e = np.int64(-1)
    if w < 0:
        wl = _wayless(C, inst, s, line) if cfg[CFG_FILL_ALLOC] == 1 else np.int64(-1)
        if wl >= 0:
            C.mshr[inst, wl, M_VALID] |= sector_mask
        w = _victim(C, inst, s)
        if w >= 0:
            _install(C, inst, s, w, line)
            if wl >= 0:   # the line has its way now: the entry is tied to it from here on
                _unchain(C, inst, wl)
                C.mshr[inst, wl, M_WAY] = w
                C.way[inst, s, w, WAY_MSHR] = wl
                C.way[inst, s, w, WAY_VALID] = C.mshr[inst, wl, M_VALID]
        else:   # every way waits on a fill: the sectors wait in the entry's buffer (if any)
            e = wl
    if w >= 0:
        C.way[inst, s, w, WAY_VALID] |= sector_mask
        e = C.way[inst, s, w, WAY_MSHR]
    if w >= 0 or e >= 0:
        C.cnt[inst, CNT_FILLS] += 1
    if e >= 0:
        p = C.mshr[inst, e, M_PEND]
        got = p & sector_mask
        C.mshr[inst, e, M_PEND] = p & ~got
        C.inst[inst, I_SHR_SECTORS if C.mshr[inst, e, M_BYSHR] == 1 else I_SECTORS] -= popcount(got)
    return e


@njit(**_NOREF)
def cache_evicted(C, inst):
    """(line byte address, dirty sector mask) of the dirty victim the last cache_access / cache_fill
    on ``inst`` evicted; mask 0 when it wrote nothing back."""
    return C.evict_addr[inst], C.evict_dirty[inst]


@njit(inline="always", **_NOREF)
def mshr_waiters(C, inst, e, out):
    """Move the waiters of entry e whose sectors are all valid now into ``out`` (request ids, in
    arrival order); returns how many. The others stay for a later fill."""
    wy = C.mshr[inst, e, M_WAY]
    v = C.way[inst, C.mshr[inst, e, M_SET], wy, WAY_VALID] if wy >= 0 else C.mshr[inst, e, M_VALID]
    k = C.mshr[inst, e, M_NWAIT]
    n = 0
    keep = 0
    for i in range(k):
        r = C.wait[inst, e, i, W_REQ]
        need = C.wait[inst, e, i, W_NEED]
        if (need & ~v) == 0:
            out[n] = r
            n += 1
            C.mshr[inst, e, M_NSHR] -= C.wait[inst, e, i, W_SHR]
        else:
            C.wait[inst, e, keep, W_REQ] = r
            C.wait[inst, e, keep, W_NEED] = need
            C.wait[inst, e, keep, W_SHR] = C.wait[inst, e, i, W_SHR]
            keep += 1
    C.mshr[inst, e, M_NWAIT] = keep
    return n


@njit(inline="always", **_NOREF)
def mshr_free(C, inst, e):
    """Release entry e and unreserve its way once every requested sector arrived and no waiter is
    left; returns whether it was released."""
    ok = C.mshr[inst, e, M_LINE] >= 0 and C.mshr[inst, e, M_PEND] == 0 and C.mshr[inst, e, M_NWAIT] == 0
    if ok:
        if C.mshr[inst, e, M_WAY] >= 0:
            C.way[inst, C.mshr[inst, e, M_SET], C.mshr[inst, e, M_WAY], WAY_MSHR] = -1
        else:
            _unchain(C, inst, e)
        C.mshr[inst, e, M_LINE] = -1
        C.mshr[inst, e, M_MASK] = 0
        C.inst[inst, I_SHR_OPEN] -= C.mshr[inst, e, M_BYSHR]
        C.mshr[inst, e, M_BYSHR] = 0
        n = C.inst[inst, I_NFREE]
        C.mshr[inst, n, M_FREE] = e
        C.inst[inst, I_NFREE] = n + 1
    return ok


@njit(**_NOREF)
def mshr_line_addr(C, inst, e):
    """Byte address of the line entry e fetches."""
    return C.mshr[inst, e, M_LINE] << C.cfg[CFG_LINE_SHIFT]


@njit(**_NOREF)
def cache_probe(C, inst, addr):
    """Valid sector mask of addr's line, -1 when the line is not present (no side effects)."""
    s, w = _lookup(C, inst, addr >> C.cfg[CFG_LINE_SHIFT])
    if w < 0:
        return np.int64(-1)
    return C.way[inst, s, w, WAY_VALID]


@njit(**_NOREF)
def cache_touch(C, inst, addr):
    """A read hit on addr's line that moves no data through this instance's pipeline (the home
    slice answering for a near copy): its replacement stamp and its counters, as a hit."""
    s, w = _lookup(C, inst, addr >> C.cfg[CFG_LINE_SHIFT])
    if w < 0:
        return
    C.cnt[inst, CNT_ACCESSES] += 1
    C.cnt[inst, CNT_HITS] += 1
    C.cnt[inst, CNT_READS] += 1
    if C.cfg[CFG_REPL] == REPL_LRU:
        t = C.inst[inst, I_TICK] + 1
        C.inst[inst, I_TICK] = t
        C.way[inst, s, w, WAY_STAMP] = t


@njit(**_NOREF)
def cache_drop(C, inst, addr):
    """Drop addr's line from instance inst unless a miss is fetching into it (a stale copy after a
    write elsewhere); clean copies only: dirty data is discarded. Returns whether it dropped one."""
    s, w = _lookup(C, inst, addr >> C.cfg[CFG_LINE_SHIFT])
    if w < 0 or C.way[inst, s, w, WAY_MSHR] >= 0:
        return False
    C.tag[inst, s, w] = -1
    C.way[inst, s, w, WAY_VALID] = 0
    C.way[inst, s, w, WAY_DIRTY] = 0
    return True


@njit(**_NOREF)
def cache_invalidate(C, inst):
    """Drop every line of instance inst that no miss is fetching into (an L1 at kernel launch);
    dirty data is discarded, so use it on write-through caches. Returns the lines dropped."""
    n = 0
    for s in range(C.tag.shape[1]):
        for w in range(C.tag.shape[2]):
            if C.way[inst, s, w, WAY_MSHR] < 0 and C.tag[inst, s, w] >= 0:
                C.tag[inst, s, w] = -1
                C.way[inst, s, w, WAY_VALID] = 0
                C.way[inst, s, w, WAY_DIRTY] = 0
                n += 1
    return n


def cache_counters(C: CacheState, level: str | None = None) -> list[dict]:
    """Tidy records, one per instance: the counters plus hit_rate (hits / accesses, 0 when idle)."""
    out = []
    for i in range(C.cnt.shape[0]):
        rec = {"instance": i}
        if level is not None:
            rec["level"] = level
        for k, name in enumerate(COUNTER_NAMES):
            rec[name] = int(C.cnt[i, k])
        rec["hit_rate"] = rec["hits"] / rec["accesses"] if rec["accesses"] else 0.0
        out.append(rec)
    return out


# ----------------------------------------------------------------------------- LSU coalescer
@njit(inline="always", **_NOREF)
def _range_mask(s0, s1):
    """Bits s0..s1-1 (s1 exclusive) of an int64; s1 - s0 >= 64 gives all bits."""
    m = np.int64(0)
    if s1 > s0:
        n = s1 - s0
        m = np.int64(-1) if n >= 64 else ((np.int64(1) << n) - 1) << s0
    return m


@njit(**_NOREF)
def _log2(x):
    """log2 of a power of two, -1 otherwise."""
    r = -1
    if x > 0 and (x & (x - 1)) == 0:
        r = 0
        while (1 << r) < x:
            r += 1
    return r


@njit(**_NOREF_INLINE)
def _line_slot(out_lines, out_masks, n, base, top):
    """Index of line ``base`` in out_lines[:n], appending it (mask 0) when new; n grows by one then.
    ``top`` is the highest line base seen so far: a line above it is new without a search (strided
    warps). Returns (slot, n, top); slot -1 when out_lines is full."""
    j = n
    if base <= top:
        j = 0
        while j < n and out_lines[j] != base:
            j += 1
    else:
        top = base
    if j == n:
        if n < out_lines.shape[0]:
            out_lines[n] = base
            out_masks[n] = 0
            n += 1
        else:
            j = -1
    return j, n, top


@njit(**_NOREF)
def coalesce(addrs, active_mask, nbytes, sector_bytes, line_bytes, out_lines, out_masks, out_full=None):
    """The unique lines (line-aligned byte addresses) that the active lanes of a warp touch, each lane
    reading or writing [addrs[lane], + nbytes), in first-touch order, with the sector mask per line
    (NVIDIA's LSU: one request per line with a sector mask). Returns the number of lines. With
    ``out_full``, also the sectors each line's lanes overwrite completely (for stores). The outputs
    need room for every line touched (2 x lanes always suffices for nbytes <= line_bytes). Returns -1
    when they are too small or line_bytes / sector_bytes are not powers of two."""
    ls = _log2(line_bytes)
    ss = _log2(sector_bytes)
    n = 0
    if ls < 0 or ss < 0 or sector_bytes > line_bytes or nbytes <= 0:
        n = -1
    smask = (line_bytes >> ss) - 1 if n == 0 else 0
    # full coverage: a bitmap of 64 granules per line (granule = line_bytes / 64, at least a byte),
    # kept in out_full while the lanes are scanned; exact when a lane covers whole granules
    want_full = out_full is not None
    g = max(1, line_bytes >> 6)
    gs = _log2(g)
    exact = want_full and nbytes >= g and sector_bytes >= g
    top = np.int64(-1)
    cur = np.int64(-1)      # line base of the current run of lanes; its slot, sector and granule masks
    cj = 0
    cm = np.int64(0)
    cf = np.int64(0)
    i = 0
    W = addrs.shape[0]
    while i < W and n >= 0:
        if (active_mask >> i) & 1:
            a = np.int64(addrs[i])
            e = a + nbytes - 1
            if (a >> ls) == (e >> ls):      # within one line (the usual case)
                base = (a >> ls) << ls
                m = _range_mask((a >> ss) & smask, ((e >> ss) & smask) + 1)
                f = _range_mask((a - base + g - 1) >> gs, (e + 1 - base) >> gs) if exact else np.int64(0)
                if base == cur:
                    cm |= m
                    cf |= f
                else:
                    if cur >= 0:
                        out_masks[cj] = cm
                        if exact:
                            out_full[cj] = cf
                    j, n, top = _line_slot(out_lines, out_masks, n, base, top)
                    if j < 0:
                        n = -1
                    else:
                        if exact and j == n - 1 and out_masks[j] == 0:
                            out_full[j] = 0
                        cur = base
                        cj = j
                        cm = out_masks[j] | m
                        cf = (out_full[j] if exact else np.int64(0)) | f
            else:                             # a lane that straddles lines: update each directly
                if cur >= 0:
                    out_masks[cj] = cm
                    if exact:
                        out_full[cj] = cf
                    cur = -1
                for L in range(a >> ls, (e >> ls) + 1):
                    base = L << ls
                    lo = max(a, base) - base
                    hi = min(e + 1, base + line_bytes) - base
                    j, n, top = _line_slot(out_lines, out_masks, n, base, top)
                    if j < 0:
                        n = -1
                        break
                    if exact and j == n - 1 and out_masks[j] == 0:
                        out_full[j] = 0
                    out_masks[j] |= _range_mask(lo >> ss, ((hi - 1) >> ss) + 1)
                    if exact:
                        out_full[j] |= _range_mask((lo + g - 1) >> gs, hi >> gs)
        i += 1
    if cur >= 0 and n >= 0:
        out_masks[cj] = cm
        if exact:
            out_full[cj] = cf
    if want_full:
        nsect = line_bytes >> ss
        gps = sector_bytes >> gs if exact else 0       # granules per sector
        for j in range(n):
            full = np.int64(0)
            if exact:
                bits = out_full[j]
                for sct in range(nsect):
                    sm = _range_mask(sct * gps, (sct + 1) * gps)
                    if (bits & sm) == sm:
                        full |= np.int64(1) << sct
            else:   # sub-granule lanes (1-byte stores on 128-B lines): extend the covered prefix
                base = out_lines[j]
                for sct in range(nsect):
                    if (out_masks[j] >> sct) & 1:
                        s0 = base + (sct << ss)
                        pos = s0   # bytes [s0, pos) are covered
                        progress = True
                        while progress and pos < s0 + sector_bytes:
                            progress = False
                            for k in range(W):
                                if (active_mask >> k) & 1 and addrs[k] <= pos < addrs[k] + nbytes:
                                    pos = addrs[k] + nbytes
                                    progress = True
                        if pos >= s0 + sector_bytes:
                            full |= np.int64(1) << sct
            out_full[j] = full
    return n


# ----------------------------------------------------------------------------- shared-memory banks
@njit(**_NOREF)
def _word_of(a, bw, bws):
    return a >> bws if bws >= 0 else a // bw


@njit(**_NOREF)
def _bank_of(wd, banks, bks):
    return wd & (banks - 1) if bks >= 0 else wd % banks


@njit(**_NOREF)
def _phase_contiguous(addrs, active_mask, l0, l1, nbytes, banks, bw):
    """Wavefronts of a phase whose lanes are all active and read one contiguous span (lane i at
    the first lane's address + i x nbytes, a vector's or a tile row's access): its n distinct
    words fall ceil(n / banks) to the busiest bank. -1 for any other phase."""
    a0 = addrs[l0]
    for i in range(l0, l1):
        if not (active_mask >> i) & 1 or addrs[i] != a0 + (i - l0) * nbytes:
            return np.int64(-1)
    n = (a0 + (l1 - l0) * nbytes - 1) // bw - a0 // bw + 1
    return (n + banks - 1) // banks


@njit(**_NOREF)
def _phase_clean(addrs, active_mask, l0, l1, nbytes, banks, bw):
    """0 or 1 wavefront when no bank is touched by two different words (repeats of the word just
    seen, as in broadcasts, excepted); -1 when the phase needs a closer look."""
    bws = _log2(bw)
    bks = _log2(banks)
    clean = banks <= 64
    used = np.uint64(0)
    last = np.int64(-1)
    i = l0
    while i < l1 and clean:
        if (active_mask >> i) & 1:
            for wd in range(_word_of(addrs[i], bw, bws), _word_of(addrs[i] + nbytes - 1, bw, bws) + 1):
                if wd != last:
                    bk = np.uint64(1) << np.uint64(_bank_of(wd, banks, bks))
                    if used & bk:
                        clean = False
                    used |= bk
                    last = wd
        i += 1
    r = -1
    if clean:
        r = 1 if used else 0
    return r


@njit(**_NOREF)
def _phase_rounds(addrs, active_mask, l0, l1, nbytes, banks, bw, scratch):
    """Wavefronts of a phase with at most 64 (lane, word) slots and 64 banks."""
    bws = _log2(bw)
    bks = _log2(banks)
    wpl = (nbytes + bw - 1) // bw + 1
    rounds = 0
    # (lane, word) slots still to serve, as a bitmask; each round (wavefront) serves, per bank,
    # the first remaining word and every remaining slot with that same word (broadcast). A lane
    # touching the same words as the previous active lane adds nothing (its words are served
    # whenever that lane's are): it is left out from the start.
    remaining = np.uint64(0)
    plo = np.int64(-1)
    phi = np.int64(-1)
    for i in range(l0, l1):
        if (active_mask >> i) & 1:
            lo = _word_of(addrs[i], bw, bws)
            hi = _word_of(addrs[i] + nbytes - 1, bw, bws)
            if lo != plo or hi != phi:
                remaining |= np.uint64(_range_mask(0, hi - lo + 1)) << np.uint64((i - l0) * wpl)
            plo = lo
            phi = hi
    while remaining:
        used = np.uint64(0)       # banks claimed this round
        claimed = np.uint64(0)    # slots that claimed them
        cbank = -1                # last bank whose claimer was looked up, and its word
        cword = np.int64(0)
        for i in range(l0, l1):
            if (active_mask >> i) & 1:
                lo = _word_of(addrs[i], bw, bws)
                base = (i - l0) * wpl
                for wd in range(lo, _word_of(addrs[i] + nbytes - 1, bw, bws) + 1):
                    bit = np.uint64(1) << np.uint64(base + wd - lo)
                    if remaining & bit:
                        b = _bank_of(wd, banks, bks)
                        bk = np.uint64(1) << np.uint64(b)
                        if not (used & bk):
                            used |= bk
                            claimed |= bit
                            remaining &= ~bit
                            if scratch is not None:
                                scratch[b] = wd
                        else:   # bank taken this round: served too if by the same word
                            if scratch is not None:
                                cword = scratch[b]
                            elif b != cbank:   # find the claimer: search back from this lane
                                j = i
                                found = False
                                while j >= l0 and not found:
                                    if (active_mask >> j) & 1:
                                        lo2 = _word_of(addrs[j], bw, bws)
                                        hi2 = _word_of(addrs[j] + nbytes - 1, bw, bws)
                                        w2 = lo2
                                        while w2 <= hi2 and not found:
                                            b2 = np.uint64(1) << np.uint64((j - l0) * wpl + w2 - lo2)
                                            if (claimed & b2) and _bank_of(w2, banks, bks) == b:
                                                found = True
                                                cword = w2
                                            w2 += 1
                                    j -= 1
                                cbank = b
                            if cword == wd:
                                remaining &= ~bit
        rounds += 1
    return rounds


@njit(**_NOREF)
def _phase_general(addrs, active_mask, l0, l1, nbytes, banks, bw):
    """Wavefronts of a phase of any geometry (slow: for more than 64 banks or slots)."""
    rounds = 0
    # count, for each first touch of a word, the distinct words of its bank touched before
    for i in range(l0, l1):
        if (active_mask >> i) & 1:
            for wd in range(addrs[i] // bw, (addrs[i] + nbytes - 1) // bw + 1):
                if _is_first(addrs, active_mask, l0, i, wd, nbytes, bw):
                    c = 1   # distinct words of this bank first touched before (i, wd)
                    for j in range(l0, i + 1):
                        if (active_mask >> j) & 1:
                            for w2 in range(addrs[j] // bw, (addrs[j] + nbytes - 1) // bw + 1):
                                if (j < i or w2 < wd) and w2 % banks == wd % banks and w2 != wd:
                                    if _is_first(addrs, active_mask, l0, j, w2, nbytes, bw):
                                        c += 1
                    rounds = max(rounds, c)
    return rounds


@njit(**_NOREF)
def _phase_wavefronts(addrs, active_mask, l0, l1, nbytes, banks, bw, scratch):
    """Wavefronts of one phase: max over banks of the distinct words it touches (a word read by
    several lanes is one broadcast)."""
    wpl = (nbytes + bw - 1) // bw + 1  # words one lane can touch (misaligned included)
    r = _phase_contiguous(addrs, active_mask, l0, l1, nbytes, banks, bw)
    if r < 0:
        r = _phase_clean(addrs, active_mask, l0, l1, nbytes, banks, bw)
    if r < 0:
        if (l1 - l0) * wpl <= 64 and banks <= 64:
            r = _phase_rounds(addrs, active_mask, l0, l1, nbytes, banks, bw, scratch)
        else:
            r = _phase_general(addrs, active_mask, l0, l1, nbytes, banks, bw)
    return r


@njit(**_NOREF)
def _is_first(addrs, active_mask, l0, i, word, nbytes, bw):
    """Whether no active lane in [l0, i) touches bank word ``word``."""
    hit = False
    j = l0
    while j < i and not hit:
        if (active_mask >> j) & 1:
            hit = addrs[j] // bw <= word <= (addrs[j] + nbytes - 1) // bw
        j += 1
    return not hit


@njit(**_NOREF)
def shared_bank_conflicts(addrs, active_mask, nbytes, banks, bank_width_bytes, scratch=None):
    """Shared-memory wavefronts (cycles) of one warp access: per phase, the max over banks of the
    distinct bank words touched (same-word lanes broadcast); accesses wider than a bank word run in
    phases of banks x bank_width / nbytes lanes (64-bit: half-warps, 128-bit: quarter-warps with
    32 x 4-B banks), each checked separately and summed. 0 when no lane is active. ``scratch`` (an
    int64 array of at least ``banks`` entries, reused across calls) makes conflicted accesses
    cheaper: O(lanes x wavefronts) instead of a search per colliding lane."""
    W = addrs.shape[0]
    bw = bank_width_bytes
    lpp = W if nbytes <= bw else max(1, (banks * bw) // nbytes)
    total = 0
    p0 = np.int64(0)
    while p0 < W:
        p1 = min(W, p0 + lpp)
        total += _phase_wavefronts(addrs, active_mask, p0, p1, nbytes, banks, bw, scratch)
        p0 = p1
    return total
