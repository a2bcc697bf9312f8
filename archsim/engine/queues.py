"""Fixed-capacity ring buffers and the memory-request table, shared by every timing block.

Queues: many queues of int32 items (request ids) in one NamedTuple of arrays; queue ``q`` holds
``count[q]`` items starting at ``head[q]`` in ``buf[q, :cap[q]]``. A full queue refuses a push:
the producer stalls and counts the stall (back-pressure); nothing is dropped.

Requests: one table of in-flight memory requests (struct of arrays), allocated from a free list.
A request carries its address, size, kind, source and the cycle it was created, plus two free
fields for the block that currently owns it (``aux0``, ``aux1``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from archsim.engine.jit import njit


class Queues(NamedTuple):
    buf: np.ndarray    # int32 [nq, max cap]
    head: np.ndarray   # int32 [nq]
    count: np.ndarray  # int32 [nq]
    cap: np.ndarray    # int32 [nq]


def make_queues(caps) -> Queues:
    wide = np.asarray(caps, np.int64).ravel()
    if wide.size == 0 or wide.min() <= 0 or wide.max() >= 1 << 31:
        from archsim.errors import InputError

        # a capacity the machine's numbers make non-positive or beyond 32 bits (a buffer depth
        # or latency near 2^31 overflows the int32 sizing before it gets here)
        raise InputError("machine", "a queue capacity from its buffer depths, latencies or queue depths is "
                         f"out of range ({int(wide.min()) if wide.size else 0:,} .. {int(wide.max()) if wide.size else 0:,} "
                         "entries)", "buffer depths, latencies and queue depths that keep every queue below 2^31 entries")
    caps = wide.astype(np.int32)
    return Queues(buf=np.full((caps.size, int(caps.max())), -1, np.int32), head=np.zeros(caps.size, np.int32),
                  count=np.zeros(caps.size, np.int32), cap=caps.copy())


@njit(cache=True, inline="always")
def q_full(Q, q):
    return Q.count[q] >= Q.cap[q]


@njit(cache=True, inline="always")
def q_empty(Q, q):
    return Q.count[q] == 0


@njit(cache=True, inline="always")
def q_push(Q, q, item):
    """Append; False (and no change) when the queue is full."""
    c = Q.count[q]
    cap = Q.cap[q]
    if c >= cap:
        return False
    i = Q.head[q] + c
    if i >= cap:
        i -= cap
    Q.buf[q, i] = item
    Q.count[q] = c + 1
    return True


@njit(cache=True, inline="always")
def q_peek(Q, q, k=0):
    """The k-th item from the head (0 = oldest); the queue must hold more than k items."""
    i = Q.head[q] + k
    cap = Q.cap[q]
    if i >= cap:
        i -= cap
    return Q.buf[q, i]


@njit(cache=True, inline="always")
def q_pop(Q, q):
    """Remove and return the oldest item; the queue must not be empty."""
    h = Q.head[q]
    item = Q.buf[q, h]
    h += 1
    if h >= Q.cap[q]:
        h = 0
    Q.head[q] = h
    Q.count[q] -= 1
    return item


@njit(cache=True)
def q_remove(Q, q, k):
    """Remove the k-th item from the head (for out-of-order schedulers such as FR-FCFS),
    keeping the order of the others; returns it."""
    cap = Q.cap[q]
    c = Q.count[q]
    i = Q.head[q] + k
    if i >= cap:
        i -= cap
    item = Q.buf[q, i]
    for j in range(k, c - 1):
        a = Q.head[q] + j
        if a >= cap:
            a -= cap
        b = a + 1
        if b >= cap:
            b -= cap
        Q.buf[q, a] = Q.buf[q, b]
    Q.count[q] = c - 1
    return item


# ----------------------------------------------------------------------------- spans
# A block with many entities (schedulers, cores, DMA engines) that are each looked at only when
# something is due keeps a summary per span of SPAN consecutive ones (the earliest cycle one of
# them is due, or a count of their queued items), so a cycle passes the spans with nothing to do.
SPAN_SHIFT = 4
SPAN = 1 << SPAN_SHIFT


def n_spans(n: int) -> int:
    """Spans covering n entities."""
    return -(-int(n) // SPAN)


@njit(cache=True, inline="always")
def span_bounds(j, n):
    """(first, end) of the entities of span j, of n entities."""
    lo = j << SPAN_SHIFT
    hi = lo + SPAN
    return lo, (hi if hi < n else n)


# ----------------------------------------------------------------------------- requests
KIND_READ, KIND_WRITE, KIND_ATOMIC = 0, 1, 2


class Requests(NamedTuple):
    addr: np.ndarray       # int64 [N] byte address
    nbytes: np.ndarray     # int32 [N]
    kind: np.ndarray       # int8  [N] KIND_*
    src: np.ndarray        # int32 [N] requesting core (SM / CPE) or engine
    tag: np.ndarray        # int32 [N] requester's own tag (warp slot, MSHR entry, DMA piece ...)
    t_created: np.ndarray  # int64 [N] cycle the request was made
    aux0: np.ndarray       # int64 [N] owner's scratch
    aux1: np.ndarray       # int64 [N] owner's scratch
    nxt: np.ndarray        # int32 [N] the next request of a spill chain (a queue that must never refuse)
    free: np.ndarray       # int32 [N] free list (stack of ids)
    nfree: np.ndarray      # int32 [1]


def make_requests(n: int) -> Requests:
    n = int(n)
    return Requests(addr=np.zeros(n, np.int64), nbytes=np.zeros(n, np.int32), kind=np.zeros(n, np.int8),
                    src=np.zeros(n, np.int32), tag=np.zeros(n, np.int32), t_created=np.zeros(n, np.int64),
                    aux0=np.zeros(n, np.int64), aux1=np.zeros(n, np.int64), nxt=np.full(n, -1, np.int32),
                    free=np.arange(n - 1, -1, -1, dtype=np.int32), nfree=np.array([n], np.int32))


@njit(cache=True, inline="always")
def req_alloc(R, addr, nbytes, kind, src, tag, now):
    """A new request id, or -1 when the table is full (the requester stalls)."""
    n = R.nfree[0]
    if n == 0:
        return -1
    n -= 1
    r = R.free[n]
    R.nfree[0] = n
    R.addr[r] = addr
    R.nbytes[r] = nbytes
    R.kind[r] = kind
    R.src[r] = src
    R.tag[r] = tag
    R.t_created[r] = now
    R.aux0[r] = 0
    R.aux1[r] = 0
    return r


@njit(cache=True, inline="always")
def req_free(R, r):
    n = R.nfree[0]
    R.free[n] = r
    R.nfree[0] = n + 1
