"""On-chip networks: routers joined by links of finite width, with buffers and credit back-pressure.

One engine serves three topologies (``TOPO_CROSSBAR``, ``TOPO_RING``, ``TOPO_MESH``): the builders
turn a topology into the same arrays (buffers, links, arbiter groups, a routing table) and the
jitted functions below never look at the topology code again.

Model (fabric-clock cycles; ``W`` = ``link_bytes_per_cycle`` of the network)
- A flit is ``W`` bytes. A packet of ``nbytes`` is ``F = ceil(nbytes / W)`` flits (at least 1).
  Credits and buffer occupancy count flits.
- Nodes are endpoints. A node that sends has a source queue (``buffer_depth`` flits, its network
  interface) and an injection link into an input port of its router; a node that receives has an
  ejection link from its router into an ejection buffer (``buffer_depth`` flits) that the node
  drains with ``noc_eject``.
- A router input port is a pipeline of ``router_latency_cycles`` stages (one flit each) followed by
  an input buffer of ``buffer_depth`` flits; credits cover both, so a port holds at most
  ``buffer_depth + router_latency_cycles`` flits and the pipeline never limits the throughput of
  an unloaded stream. A packet whose header entered the port at ``t`` may leave at ``t + L``
  (virtual cut-through, at packet granularity).
- A link carries one packet at a time for ``ceil(nbytes / link width)`` cycles. A buffer starts
  one packet at a time, at the rate of the link that fills it (an input port of a wide local link
  can feed two narrower outputs at once). A packet is sent only when the downstream buffer has
  credits for all its flits, or is empty (a packet larger than a whole buffer streams through an
  empty one, holding all its credits meanwhile), so no buffer ever holds more than its credits.
  Credits freed in cycle ``t`` are usable from ``t + 1``, so results never depend on the order in
  which routers are visited.
- Each output link picks among the router's input buffers whose head packet wants it, can go
  (credits) and has arrived, round-robin from the last winner.
- Unloaded latency from ``noc_inject(..., t0)`` (before ``noc_step(t0)``) to the end of the cycle
  in which the tail reaches the destination: ``routers_traversed x L + ceil(nbytes / w)`` with
  ``w`` the narrowest link on the path (the tail trails the header by the slowest serialization).
  The packet can be ejected after ``noc_step`` of cycle ``t0 + latency - 1``.
- Ring: input ports on the ring carry two virtual channels (one buffer of each size per VC); a
  packet moves to VC 1 when it crosses the dateline (the link into stop 0 clockwise, out of stop 0
  counter-clockwise), which keeps the ring free of deadlock. Shortest direction; a tie (half way
  round) goes clockwise from an even stop and counter-clockwise from an odd one.
- Mesh: dimension-order (X then Y) routing, deadlock-free without virtual channels.

Calling order per cycle ``now``: ``noc_eject`` (sees tails that arrived by the end of the last
stepped cycle), ``noc_inject(..., now)``, ``noc_step(N, now)``; a node may also inject after the
step (the packet then leaves in ``now + 1``). With ``lookahead`` 0 ports are FIFOs, so a head
packet waiting for a busy output holds up the packets behind it (head-of-line blocking), as in an
input-queued router. With ``lookahead`` K a port looks at its first K + 1 packets and offers the
oldest one that can go (arrived, output link free, credits), skipping packets whose output an
older packet in that window already wants (packets for one output never pass each other). A port
still starts at most one packet at a time; each output arbitrates among the offers as above, and
ports that lost offer again to the outputs still free, for up to ``fabric.lookahead_rounds`` rounds per cycle
(an iterative matching, as iSLIP-style crossbar allocators do).

Sleeping ports (speed only; results are the same as scanning every port every cycle): a port
whose scan offered nothing (every packet of its window not yet arrived, waiting for a busy link
or waiting for credits) sleeps until the first arrival or link-free time it saw, or until one of
the buffers it waits credits of has room: until then each cycle's scan would want the same links
and offer nothing, so a sleeping port only adds its remembered wants (and checks the remembered
buffers' room, which costs less than the scan). A credit that wakes it early is looked at through
the packets that waited for credits alone (the others still wait for the same arrival or busy
link). A packet pushed into a sleeping port wakes it no later than that packet's arrival, and not
at all when it lands beyond the port's window. Two cases sleep without a scan, wanting nothing
(_doze): a port whose read port is busy after a send, until it frees, and a port a packet is
pushed into while empty, until that packet can go (a scan would stop at its first packet).

A step visits only the groups and input ports that hold packets, through a bitmap of each
(``gm``, ``pm``), in the ascending order a scan of every one would take.

Counters per link: flits sent (= busy cycles), packets, bytes, blocked cycles (cycles in which at
least one arrived packet wanted the link and did not get it: lost arbitration, no credit, or link
busy with another input's packet), occupancy of the buffers the link feeds (time integral and
maximum); per node: injection stalls (``noc_inject`` refused). Skip-ahead: ``noc_next_event``
gives the next cycle anything can change; stepping straight there gives the same counters as
stepping every cycle.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import numpy as np

from archsim.engine.jit import njit
from archsim.engine.queues import Queues, make_queues, q_peek, q_pop, q_push

TOPO_CROSSBAR, TOPO_RING, TOPO_MESH = 0, 1, 2
TOPO_CODES = {"crossbar": TOPO_CROSSBAR, "ring": TOPO_RING, "mesh": TOPO_MESH}

BUF_SRC, BUF_IN, BUF_EJ = 0, 1, 2        # node source queue | router input port | node ejection buffer

# par[] (int64): network parameters
P_TOPO, P_WIDTH, P_DEPTH, P_LAT, P_NODES, P_GROUPS, P_ROUTERS, P_LINKS, P_BUFS, P_LOOK, P_SLEEP, P_ROUNDS = range(12)
# clk[] (int64): mutable scalars
C_LAST, C_NFREE, C_DELIVERED, C_LAT_SUM, C_BYTES, C_STAMP, C_MOVED, C_VISITS, C_SENT, C_N = range(10)
# columns of the per-entity tables (one row per buffer / group / link / node / packet slot)
(BI_KIND, BI_POOL, BI_LAT, BI_GRP, BI_OCC, BI_MAX, BI_REL, BI_RELF, BI_RDW, BI_OFF, BI_LOST, BI_NWANT,
 BI_NCRED, BI_K) = range(14)  # bi int32 [B, 14]
BT_FREE, BT_AREA, BT_T, BT_SLEEP = range(4)                                # bt int64 [B, 4]
G_IN0, G_NIN, G_OUT0, G_NOUT, G_NPKT, G_PW0 = range(6)                     # gi int32 [G, 6]
LI_GRP, LI_DST0, LI_DST1, LI_DATELINE, LI_WIDTH, LI_RR, LI_WANT, LI_CAND, LI_DIST, LI_GOT = range(10)  # li int32 [Lk, 10]
LT_BUSY, LT_FLITS, LT_PKTS, LT_BYTES, LT_BLOCKED, LT_GAP, LT_SEEN = range(7)  # lt int64 [Lk, 7]
NI_ROUTER, NI_GRP, NI_SRC, NI_EJ = range(4)                                # ni int32 [nodes, 4]
NT_STALLS, NT_INJECTED, NT_DELIVERED = range(3)                            # nt int64 [nodes, 3]
PI_REQ, PI_BYTES, PI_FLITS, PI_DST, PI_VC, PI_SER, PI_LINK = range(7)      # pi int32 [P, 7]
PT_READY, PT_TINJ = range(2)                                               # pt int64 [P, 2]

INF = np.int64(1) << np.int64(62)
LOOKAHEAD_ROUNDS = 3   # offer / grant rounds per step when ports look ahead (fabric.lookahead_rounds; one
                       # round: a port that lost arbitration idles although another output could take one
                       # of its packets)
_NAME_LEN = 40


class NocState(NamedTuple):
    """One network as tables of numbers (few fields: each one costs numba compile and call time).

    Buffers (bi/bt): kind (BUF_*), pool (credits, flits), lat (cycles from header entry to
    eligibility: L for router ports), grp (arbiter group reading it, -1 for ejection buffers),
    occ (credits in use), max, credit-return scratch, read width (bytes per cycle), the window
    position of the packet offered this step (lookahead), place among its group's inputs; read port
    busy-until, occupancy integral, cycle from which occ holds. Groups (gi): routers 0..R-1, then
    one per sending node's interface: slices of gin (input buffers) and gout (output links),
    packets waiting, first word of its input ports' bitmap in pm. Links (li/lt): driving
    group, buffer fed per virtual channel, dateline flag, width (bytes per cycle), last round-robin
    winner (index in the group's inputs), per-step scratch; busy-until, busy cycles, packets,
    bytes, blocked cycles, scratch. Nodes (ni/nt): router, interface group (-1: cannot send),
    source queue, ejection buffer (-1: cannot receive); injection stalls, injected, delivered.
    Packet slots (pi/pt): request id, bytes, flits, destination node, virtual channel, tail lag
    (longest serialization so far), the link it wants out of the buffer it is in; eligible-from
    cycle (ejection buffer: tail arrived by the end of it), injection cycle. ``pfree`` is the stack
    of free slots (``clk[C_NFREE]`` of them). ``bw`` / ``bc``: what a sleeping port remembers."""

    par: np.ndarray          # int64 [12] P_* (P_SLEEP 0: ports never sleep, the tests' oracle)
    clk: np.ndarray          # int64 [C_N] C_* (C_MOVED: the last cycle a packet moved; C_VISITS: input
                             # ports looked at by the steps, C_SENT: those that sent a packet)
    Q: Queues                # one FIFO of packet slots per buffer
    bi: np.ndarray
    bt: np.ndarray
    gi: np.ndarray
    gin: np.ndarray          # int32 flat
    gout: np.ndarray         # int32 flat
    route: np.ndarray        # int32 [G, nodes] output link, -1 unreachable
    li: np.ndarray
    lt: np.ndarray
    ni: np.ndarray
    nt: np.ndarray
    pi: np.ndarray
    pt: np.ndarray
    pfree: np.ndarray        # int32 [P]
    bw: np.ndarray           # int32 [B, lookahead + 1] links a sleeping port's packets want (BT_SLEEP)
    bc: np.ndarray           # int32 [B, lookahead + 1, 4] (buffer, flits, window place, index in bw) of
                             # each packet that waits credits, in window order
    gm: np.ndarray           # int64 [ceil(G / 64)] bitmap of the groups holding packets (G_NPKT > 0)
    pm: np.ndarray           # int64 flat: per group (from G_PW0), bitmap of its input ports holding packets
    ls: np.ndarray           # int32 [3, Lk] step scratch: links of the group wanted (or granted) this
                             # step; links offered a packet in this offer round; input ports (index
                             # in the group) that offered in the last round (a router has no more
                             # input ports than the network has links)
    link_names: np.ndarray   # uint8 [Lk, 40] NUL padded
    node_names: np.ndarray   # uint8 [nodes, 40]


# ----------------------------------------------------------------------------- jitted engine

@njit(cache=True, inline="always")
def _occ_change(bi, bt, b, delta, t):
    """Buffer b's credits in use change by delta, effective from cycle t."""
    bt[b, BT_AREA] += np.int64(bi[b, BI_OCC]) * (t - bt[b, BT_T])
    bt[b, BT_T] = t
    o = bi[b, BI_OCC] + delta
    bi[b, BI_OCC] = o
    if o > bi[b, BI_MAX]:
        bi[b, BI_MAX] = o


# The lowest set bit of a word by de Bruijn multiplication: bitmaps of the groups and ports that
# hold packets let a step visit those alone, in ascending order, as a scan of every one would.
_DEBRUIJN = np.array([0, 1, 56, 2, 57, 49, 28, 3, 61, 58, 42, 50, 38, 29, 17, 4, 62, 47, 59, 36, 45, 43, 51,
                      22, 53, 39, 33, 30, 24, 18, 12, 5, 63, 55, 48, 27, 60, 41, 37, 16, 46, 35, 44, 21, 52, 32,
                      23, 11, 54, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6], np.int64)
_DEBRUIJN_MUL = np.int64(0x03F79D71B4CA8B09)


@njit(cache=True, inline="always")
def _low_bit(w):
    """Index of the lowest set bit of a non-zero int64 word."""
    return _DEBRUIJN[((w & -w) * _DEBRUIJN_MUL >> 58) & 63]


@njit(cache=True, inline="always")
def _above(bit):
    """Mask of the bits above ``bit`` (none above 63)."""
    return -(np.int64(2) << bit)


@njit(cache=True, inline="always")
def _port_filled(N, b):
    """Input buffer b took a packet: its group holds one more; both bitmaps say so."""
    g = N.bi[b, BI_GRP]
    if N.Q.count[b] == 1:
        k = N.bi[b, BI_K]
        N.pm[N.gi[g, G_PW0] + (k >> 6)] |= np.int64(1) << (k & 63)
    n = N.gi[g, G_NPKT] + 1
    N.gi[g, G_NPKT] = n
    if n == 1:
        N.gm[g >> 6] |= np.int64(1) << (g & 63)
    return g


@njit(cache=True, inline="always")
def _port_drained(N, b, g):
    """Input buffer b of group g gave up a packet."""
    if N.Q.count[b] == 0:
        k = N.bi[b, BI_K]
        N.pm[N.gi[g, G_PW0] + (k >> 6)] &= ~(np.int64(1) << (k & 63))
    n = N.gi[g, G_NPKT] - 1
    N.gi[g, G_NPKT] = n
    if n == 0:
        N.gm[g >> 6] &= ~(np.int64(1) << (g & 63))


@njit(cache=True, inline="always")
def _ports_listed(N, g, row):
    """Write group g's input ports that hold packets into ls[row] in ascending order; their count."""
    if N.gi[g, G_NIN] == 1:
        N.ls[row, 0] = 0
        return 1
    n = 0
    w0 = N.gi[g, G_PW0]
    for i in range((N.gi[g, G_NIN] + 63) >> 6):
        w = N.pm[w0 + i]
        while w != 0:
            bit = _low_bit(w)
            N.ls[row, n] = (i << 6) + bit
            n += 1
            w &= _above(bit)
    return n


@njit(cache=True, inline="always")
def _take(Q, b, j):
    """Remove and return the j-th packet from buffer b's head (0: the head): the j packets in
    front of it move back one place, so the cost is O(j), not O(queue length)."""
    if j == 0:
        return q_pop(Q, b)
    cap = Q.cap[b]
    h = Q.head[b]
    i = h + j
    if i >= cap:
        i -= cap
    item = Q.buf[b, i]
    for _ in range(j):
        k = i - 1
        if k < 0:
            k += cap
        Q.buf[b, i] = Q.buf[b, k]
        i = k
    h += 1
    if h >= cap:
        h = 0
    Q.head[b] = h
    Q.count[b] -= 1
    return item


@njit(cache=True, inline="always")
def _new_scan(N):
    """A fresh stamp for one scan of a port's window (see _window_dup)."""
    N.clk[C_STAMP] += 1
    return N.clk[C_STAMP]


@njit(cache=True, inline="always")
def _wants_from(bt, pt, b, p, gap_lo):
    """The first skipped cycle (from gap_lo) in which packet p, in buffer b, wanted its link: once it
    had arrived and the buffer's read port was free."""
    e = pt[p, PT_READY]
    if bt[b, BT_FREE] > e:
        e = bt[b, BT_FREE]
    return e if e > gap_lo else gap_lo


@njit(cache=True, inline="always")
def _window_dup(lt, l, stamp):
    """True when a packet in front of the current one in this scan of a port's window (the scan
    stamped ``stamp``) also goes to link l; marks l as wanted in this scan. O(1): each scan stamps
    the links its packets want (comparing with every packet in front was O(window) a packet).
    A window of one packet needs no test (callers skip it)."""
    if lt[l, LT_SEEN] == stamp:
        return True
    lt[l, LT_SEEN] = stamp
    return False


@njit(cache=True, inline="always")
def _doze(N, b, t):
    """Port b sleeps until t wanting nothing and waiting for no credit: until then a scan would
    stop at its first packet (not eligible before t), want nothing and offer nothing."""
    if N.par[P_SLEEP]:
        N.bt[b, BT_SLEEP] = t
        N.bi[b, BI_NWANT] = 0
        N.bi[b, BI_NCRED] = 0


@njit(cache=True, inline="always")
def _pushed(N, b, g, ready):
    """A packet that arrives at ``ready`` was pushed into input buffer b of group g. It can go no
    earlier than ``e = max(ready, the buffer's read port free)``. Into an empty port: the port
    sleeps until e with nothing wanted (until then a scan stops at that packet). A sleeping port
    sleeps on when the packet lies beyond the port's window (nothing a scan looks at changed), and
    at most until e when it lies within (it is the window's last packet: until e a scan either
    stops at an earlier packet not yet arrived, or stops at it)."""
    bt = N.bt
    e = ready if ready > bt[b, BT_FREE] else bt[b, BT_FREE]
    if N.Q.count[b] == 1:
        _doze(N, b, e)
        return
    if bt[b, BT_SLEEP] == 0:
        return
    win = N.par[P_LOOK] + 1 if N.gi[g, G_NOUT] > 1 else 1
    if N.Q.count[b] <= win and e < bt[b, BT_SLEEP]:
        bt[b, BT_SLEEP] = e


@njit(cache=True, inline="always")
def _offer(N, b, j, k, l, nin, ncl):
    """Input port k (buffer b) of a group of nin offers the j-th packet of its window to link l,
    which takes the offer nearest after its last winner (round robin); returns the new count of
    links offered to in this round (ls[1])."""
    bi, li, ls = N.bi, N.li, N.ls
    bi[b, BI_OFF] = j             # the port offers this packet
    bi[b, BI_LOST] = 1            # until an output grants it
    d = k - li[l, LI_RR] - 1
    if d < 0:
        d += nin
    if li[l, LI_CAND] < 0:
        ls[1, ncl] = l
        ncl += 1
    if d < li[l, LI_DIST]:
        li[l, LI_DIST] = d
        li[l, LI_CAND] = k
    return ncl


@njit(cache=True, inline="always")   # inlined into jitted callers: no per-call copy of N
def noc_inject(N, node, req_id, nbytes, dest_node, now):
    """Offer a packet at node's source queue in cycle ``now`` (call before ``noc_step(now)`` for it
    to leave in cycle ``now``). False, and a counted stall, when the source queue has no room."""
    ni, bi, nt = N.ni, N.bi, N.nt             # each field read once: every read costs a refcount
    b = ni[node, NI_SRC]
    g = ni[node, NI_GRP]
    if b < 0 or N.route[g, dest_node] < 0:
        raise ValueError("noc_inject: this node cannot send to that destination")
    w = N.par[P_WIDTH]
    f = (nbytes + w - 1) // w
    if f < 1:
        f = 1
    o = bi[b, BI_OCC]
    pool = bi[b, BI_POOL]
    if o != 0 and o + f > pool:
        nt[node, NT_STALLS] += 1
        return False
    clk, pi, pt = N.clk, N.pi, N.pt
    n = clk[C_NFREE] - 1
    p = N.pfree[n]
    clk[C_NFREE] = n
    pi[p, PI_REQ] = req_id
    pi[p, PI_BYTES] = nbytes
    pi[p, PI_FLITS] = f
    pi[p, PI_DST] = dest_node
    pi[p, PI_VC] = 0
    pi[p, PI_SER] = 0
    pi[p, PI_LINK] = N.route[g, dest_node]
    pt[p, PT_READY] = now
    pt[p, PT_TINJ] = now
    t = clk[C_LAST] + 1                       # before noc_step(now) that is now; after it, now + 1
    if now > t:
        t = now
    _occ_change(bi, N.bt, b, min(f, pool), t)
    q_push(N.Q, b, p)
    _pushed(N, b, g, now)
    _port_filled(N, b)
    nt[node, NT_INJECTED] += 1
    return True


@njit(cache=True, inline="always")
def _gap_wants(N, b, nwin, gap_lo, gap_hi, ntl):
    """Port b over the skipped cycles [gap_lo, gap_hi]: nothing could move, so every packet of its
    window that had arrived wanted its link (as stepping each cycle would have counted it).
    Returns the new length of the wanted-links list ls[0]."""
    Q, lt, li, ls = N.Q, N.lt, N.li, N.ls
    stamp = _new_scan(N) if nwin > 1 else 0
    for j in range(nwin):
        p = q_peek(Q, b, j)
        l = N.pi[p, PI_LINK]
        if nwin > 1 and _window_dup(lt, l, stamp):
            continue
        lo = _wants_from(N.bt, N.pt, b, p, gap_lo)
        if lo > gap_hi:
            break
        if gap_hi - lo + 1 > lt[l, LT_GAP]:
            if lt[l, LT_GAP] == 0 and li[l, LI_WANT] == 0:
                ls[0, ntl] = l
                ntl += 1
            lt[l, LT_GAP] = gap_hi - lo + 1
    return ntl


@njit(cache=True, inline="always")
def _sleeper_offer(N, b, k, nin, ncl, ntl, now):
    """An asleep port b (input k of its group) in a step's first round: only its packets that
    waited credits can go, looked at alone in window order (see noc_step). Counts the links it
    wants and offers the first packet that has room and a free link. Returns (offers, wanted
    links, whether it offered)."""
    bi, lt, li, ls = N.bi, N.lt, N.li, N.ls
    woke = False
    sent = False
    upto = bi[b, BI_NWANT]
    for x in range(bi[b, BI_NCRED]):
        tb = N.bc[b, x, 0]
        o = bi[tb, BI_OCC]
        if o != 0 and o + N.bc[b, x, 1] > bi[tb, BI_POOL]:
            continue
        woke = True
        l = N.bw[b, N.bc[b, x, 3]]
        if lt[l, LT_BUSY] > now:
            continue
        upto = N.bc[b, x, 3] + 1
        ncl = _offer(N, b, N.bc[b, x, 2], k, l, nin, ncl)
        sent = True
        break
    for j in range(upto):
        l = N.bw[b, j]
        if li[l, LI_WANT] == 0 and lt[l, LT_GAP] == 0:
            ls[0, ntl] = l
            ntl += 1
        li[l, LI_WANT] += 1
    if woke:
        N.bt[b, BT_SLEEP] = 0
    return ncl, ntl, sent


@njit(cache=True, inline="always")
def _grant(N, g, l, i0, nrel, ntl, now):
    """Output link l of group g takes its offer: the packet leaves its input port's buffer, holds
    the link for its serialization and lands in the buffer downstream. Returns (credits to return
    at the end of the step, wanted-links list length)."""
    Q, bi, bt, gi, li, lt, pi, pt, ls = N.Q, N.bi, N.bt, N.gi, N.li, N.lt, N.pi, N.pt, N.ls
    k = li[l, LI_CAND]
    li[l, LI_CAND] = -1
    li[l, LI_DIST] = 1 << 30
    if li[l, LI_WANT] == 0 and lt[l, LT_GAP] == 0:   # a later round's offer: not yet listed
        ls[0, ntl] = l
        ntl += 1
    li[l, LI_GOT] = 1
    N.clk[C_MOVED] = now
    b = N.gin[i0 + k]
    p = _take(Q, b, bi[b, BI_OFF])
    bi[b, BI_LOST] = 0
    _port_drained(N, b, g)
    f = pi[p, PI_FLITS]
    w = li[l, LI_WIDTH]
    ser = (pi[p, PI_BYTES] + w - 1) // w
    if ser < 1:
        ser = 1
    bi[nrel, BI_REL] = b          # credits come back at the end of the step
    bi[nrel, BI_RELF] = min(f, bi[b, BI_POOL])
    nrel += 1
    rw = bi[b, BI_RDW]              # the buffer is read at the rate of the link filling it
    bt[b, BT_FREE] = now + max((pi[p, PI_BYTES] + rw - 1) // rw, 1)
    if bt[b, BT_FREE] > now + 1:
        _doze(N, b, bt[b, BT_FREE])     # it reads the packet out until then
    lt[l, LT_BUSY] = now + ser
    lt[l, LT_FLITS] += ser
    lt[l, LT_PKTS] += 1
    lt[l, LT_BYTES] += pi[p, PI_BYTES]
    li[l, LI_RR] = k
    if li[l, LI_DATELINE]:
        pi[p, PI_VC] = 1
    tb = li[l, LI_DST1] if pi[p, PI_VC] else li[l, LI_DST0]
    _occ_change(bi, bt, tb, min(f, bi[tb, BI_POOL]), now + 1)
    q_push(Q, tb, p)
    if ser > pi[p, PI_SER]:
        pi[p, PI_SER] = ser
    if bi[tb, BI_KIND] == BUF_EJ:
        pt[p, PT_READY] = now + pi[p, PI_SER] - 1
    else:
        pt[p, PT_READY] = now + bi[tb, BI_LAT]
        g2 = _port_filled(N, tb)
        pi[p, PI_LINK] = N.route[g2, pi[p, PI_DST]]  # the link it wants next
        _pushed(N, tb, g2, now + bi[tb, BI_LAT])
    return nrel, ntl


@njit(cache=True)
def noc_step(N, now):
    """Advance the network through fabric cycle ``now`` (> the previous step's cycle; cycles in
    between count as idle ones, which is exact when ``now <= noc_next_event``)."""
    last = N.clk[C_LAST]
    if now <= last:
        raise ValueError("noc_step: cycles must increase")
    gap_lo = last + 1
    gap_hi = now - 1
    has_gap = gap_hi >= gap_lo
    Q, bi, bt, gi, li, lt, pi, pt = N.Q, N.bi, N.bt, N.gi, N.li, N.lt, N.pi, N.pt
    look = N.par[P_LOOK]
    iters = 1 if look == 0 else N.par[P_ROUNDS]
    nrel = 0
    ls = N.ls
    looked = 0                    # input ports looked at (those holding packets)
    gm = N.gm
    for gw in range(gm.shape[0]):
        # the groups holding packets in ascending order, each word read again after each group (a
        # grant may fill a later group's port), as a scan of every group would find them
        above = np.int64(-1)
        while (gm[gw] & above) != 0:
            gbit = _low_bit(gm[gw] & above)
            above = _above(gbit)
            g = (gw << 6) + gbit
            # The group's links are visited through two lists rather than all its outputs (a crossbar
            # has ~100): ls[0] holds the links wanted (LI_WANT or LT_GAP > 0) or granted this step,
            # whose counters are read and cleared at the end; ls[1] the links offered a packet in the
            # current round (LI_CAND >= 0), cleared by the grants. Between steps every link has
            # LI_WANT = LI_GOT = LT_GAP = 0 and LI_CAND = -1.
            ntl = 0
            i0 = gi[g, G_IN0]
            nin = gi[g, G_NIN]
            # a group with one output (a node's interface) has every packet want that link: only the
            # head can go, and the packets behind it would all be skipped as wanting it too
            glook = look if gi[g, G_NOUT] > 1 else 0
            nlost = 0                             # ls[2, :nlost]: the ports that offered in the last round
            for it in range(iters):
                # offers: each input port offers one packet (FIFO: its head; lookahead: the oldest of
                # its window that can go); later iterations let ports that lost offer another packet
                # to an output still free (their own read port is busy once they sent)
                ncl = 0
                offered = False
                if it == 0:
                    nk = _ports_listed(N, g, 2)   # the ports holding packets
                    looked += nk
                else:
                    nk = nlost
                nlost = 0
                for kk in range(nk):
                    # ls[2]: the ports holding packets, then after the first round those that
                    # offered (ascending): the list is rewritten in place, never ahead of the reading
                    k = ls[2, kk]
                    b = N.gin[i0 + k]
                    cnt = Q.count[b]
                    if cnt == 0:
                        continue
                    if it > 0 and bi[b, BI_LOST] == 0:
                        # only a port that offered and lost can offer again: the grants of this step
                        # only took links and credits, and a port that sent is busy reading out
                        continue
                    bi[b, BI_LOST] = 0
                    nwin = cnt if cnt <= glook else glook + 1
                    if has_gap and it == 0:
                        ntl = _gap_wants(N, b, nwin, gap_lo, gap_hi, ntl)
                    if it == 0 and bt[b, BT_SLEEP] > now:
                        # asleep (see "Sleeping ports" above): unless a buffer it waits credits of
                        # has room now, the scan would find what it found when the port fell asleep:
                        # the same links wanted, nothing to offer
                        # Woken by a credit before its wake cycle, the scan would find the same window:
                        # the packets not yet arrived are still on their way and the busy links still
                        # busy (a link's busy time only grows), so only the packets that waited
                        # credits can go; they are looked at alone, in window order. Wanted links are
                        # counted up to the packet offered (a scan stops there), all when none is.
                        # The port is awake from then on (next cycle it scans in full).
                        ncl, ntl, sent = _sleeper_offer(N, b, k, nin, ncl, ntl, now)
                        if sent:
                            offered = True
                            ls[2, nlost] = k
                            nlost += 1
                        continue
                    stamp = _new_scan(N) if nwin > 1 else 0
                    nw = 0                        # links wanted (iteration 0), for the port's sleep
                    nc = 0                        # buffers its packets wait credits of
                    wake = INF                    # the first cycle the scan can find anything else
                    for j in range(nwin):         # the head, then (lookahead) packets for other outputs
                        p = q_peek(Q, b, j)
                        l = pi[p, PI_LINK]
                        if nwin > 1 and _window_dup(lt, l, stamp):
                            continue
                        e = pt[p, PT_READY]
                        if bt[b, BT_FREE] > e:
                            e = bt[b, BT_FREE]
                        if e > now:
                            if e < wake:
                                wake = e
                            break                 # packets arrive in order: the later ones are not here yet
                        if it == 0:
                            if li[l, LI_WANT] == 0 and lt[l, LT_GAP] == 0:
                                ls[0, ntl] = l
                                ntl += 1
                            li[l, LI_WANT] += 1
                            N.bw[b, nw] = l
                            nw += 1
                        if lt[l, LT_BUSY] > now:
                            if lt[l, LT_BUSY] < wake:
                                wake = lt[l, LT_BUSY]
                            continue
                        tb = li[l, LI_DST1] if (li[l, LI_DATELINE] or pi[p, PI_VC]) else li[l, LI_DST0]
                        o = bi[tb, BI_OCC]
                        if o != 0 and o + pi[p, PI_FLITS] > bi[tb, BI_POOL]:
                            if it == 0:
                                N.bc[b, nc, 0] = tb
                                N.bc[b, nc, 1] = pi[p, PI_FLITS]
                                N.bc[b, nc, 2] = j
                                N.bc[b, nc, 3] = nw - 1   # its link's place in bw
                                nc += 1
                            continue
                        ncl = _offer(N, b, j, k, l, nin, ncl)
                        offered = True
                        ls[2, nlost] = k
                        nlost += 1
                        break
                    if it == 0 and bi[b, BI_LOST] == 0 and wake > now + 1 and N.par[P_SLEEP]:
                        bt[b, BT_SLEEP] = wake    # nothing to offer before `wake` or room in a buffer
                        bi[b, BI_NWANT] = nw
                        bi[b, BI_NCRED] = nc
                if not offered:
                    break
                # grants: each output link takes the offer nearest after its last winner (the grants
                # of a round touch disjoint links, input ports and buffers: their order is immaterial)
                for j in range(ncl):
                    nrel, ntl = _grant(N, g, ls[1, j], i0, nrel, ntl, now)
            # blocked: an arrived packet wanted the link and did not get it (lost arbitration, no
            # credit, link busy); the skipped cycles before this one count as the gap says
            for j in range(ntl):
                l = ls[0, j]
                if has_gap:
                    lt[l, LT_BLOCKED] += lt[l, LT_GAP]
                if li[l, LI_WANT] > li[l, LI_GOT]:
                    lt[l, LT_BLOCKED] += 1
                li[l, LI_WANT] = 0
                li[l, LI_GOT] = 0
                lt[l, LT_GAP] = 0
    for i in range(nrel):
        _occ_change(bi, bt, bi[i, BI_REL], -bi[i, BI_RELF], now + 1)
    N.clk[C_LAST] = now
    N.clk[C_VISITS] += looked
    N.clk[C_SENT] += nrel         # one credit return per packet sent


@njit(cache=True, inline="always")   # inlined into jitted callers: no per-call copy of N
def noc_deliverable(N, node):
    """True when node's oldest delivered packet can be taken by noc_eject now."""
    b = N.ni[node, NI_EJ]
    Q = N.Q
    if b < 0 or Q.count[b] == 0:
        return False
    return N.pt[q_peek(Q, b, 0), PT_READY] <= N.clk[C_LAST]


@njit(cache=True, inline="always")   # inlined into jitted callers: no per-call copy of N
def noc_eject(N, node):
    """The request id of the oldest packet delivered to node (its tail arrived by the end of the
    last stepped cycle), removing it and returning its credits; -1 when none."""
    b = N.ni[node, NI_EJ]
    Q, clk, pt = N.Q, N.clk, N.pt
    if b < 0 or Q.count[b] == 0:
        return -1
    p = q_peek(Q, b, 0)
    last = clk[C_LAST]
    if pt[p, PT_READY] > last:
        return -1
    q_pop(Q, b)
    pi, bi = N.pi, N.bi
    _occ_change(bi, N.bt, b, -min(pi[p, PI_FLITS], bi[b, BI_POOL]), last + 1)
    clk[C_DELIVERED] += 1
    clk[C_LAT_SUM] += pt[p, PT_READY] + 1 - pt[p, PT_TINJ]
    clk[C_BYTES] += pi[p, PI_BYTES]
    N.nt[node, NT_DELIVERED] += 1
    n = clk[C_NFREE]
    N.pfree[n] = p
    clk[C_NFREE] = n + 1
    return pi[p, PI_REQ]


@njit(cache=True)
def noc_next_event(N, now):
    """Earliest cycle > now at which noc_step can change anything (a packet can move, or a
    delivery completes); INF when the network is idle or every packet waits for a node to eject.
    Stepping straight to it (no noc_step in between) gives the same results as every cycle."""
    best = INF
    Q, bi, bt, gi, li, lt, pi, pt = N.Q, N.bi, N.bt, N.gi, N.li, N.lt, N.pi, N.pt
    look = N.par[P_LOOK]
    for gw in range(N.gm.shape[0]):
        w = N.gm[gw]
        while w != 0:
            gbit = _low_bit(w)
            w &= _above(gbit)
            g = (gw << 6) + gbit
            i0 = gi[g, G_IN0]
            glook = look if gi[g, G_NOUT] > 1 else 0  # one output: only the head can go (as in noc_step)
            for kk in range(_ports_listed(N, g, 2)):
                b = N.gin[i0 + N.ls[2, kk]]
                cnt = Q.count[b]
                nwin = cnt if cnt <= glook else glook + 1
                stamp = _new_scan(N) if nwin > 1 else 0
                for j in range(nwin):
                    p = q_peek(Q, b, j)
                    l = pi[p, PI_LINK]
                    if nwin > 1 and _window_dup(lt, l, stamp):
                        continue
                    tb = li[l, LI_DST1] if (li[l, LI_DATELINE] or pi[p, PI_VC]) else li[l, LI_DST0]
                    o = bi[tb, BI_OCC]
                    if o != 0 and o + pi[p, PI_FLITS] > bi[tb, BI_POOL]:
                        continue                  # waits for a credit: another event frees it
                    e = pt[p, PT_READY]
                    if bt[b, BT_FREE] > e:
                        e = bt[b, BT_FREE]
                    if lt[l, LT_BUSY] > e:
                        e = lt[l, LT_BUSY]
                    if e < best:
                        best = e
    for n in range(N.par[P_NODES]):
        b = N.ni[n, NI_EJ]
        if b >= 0 and Q.count[b] > 0:
            t = pt[q_peek(Q, b, 0), PT_READY]
            if now < t < best:
                best = t
    if best <= now:
        best = now + 1
    return best


@njit(cache=True)
def noc_blocked_until(N, t, row, c0):
    """row[c0 + l] = link l's blocked cycles through cycle t - 1 (read-only): those counted, plus
    what the next step will add for the skipped cycles since the last one (noc_step's gap scan:
    a packet that had arrived wants its link in every skipped cycle from its arrival on), so that
    a timeline sample inside a skip-ahead jump reads what stepping every cycle would have counted.
    The per-link maximum over the ports is kept in row while scanning (a link is charged once).
    noc_step skips a later packet of a port's window that wants a link an earlier one wants
    (_window_dup); the maximum gives the same count, since a buffer's packets become ready in
    queue order (the earlier one's gap is the longer)."""
    lt = N.lt
    L = lt.shape[0]
    for l in range(L):
        row[c0 + l] = 0
    gap_lo = N.clk[C_LAST] + 1
    gap_hi = t - 1
    if gap_hi >= gap_lo:
        Q, bt, gi, pi, pt = N.Q, N.bt, N.gi, N.pi, N.pt
        look = N.par[P_LOOK]
        for gw in range(N.gm.shape[0]):
            w = N.gm[gw]
            while w != 0:
                gbit = _low_bit(w)
                w &= _above(gbit)
                g = (gw << 6) + gbit
                glook = look if gi[g, G_NOUT] > 1 else 0
                i0 = gi[g, G_IN0]
                for kk in range(_ports_listed(N, g, 2)):
                    b = N.gin[i0 + N.ls[2, kk]]
                    cnt = Q.count[b]
                    nwin = cnt if cnt <= glook else glook + 1
                    for j in range(nwin):
                        p = q_peek(Q, b, j)
                        lo = _wants_from(bt, pt, b, p, gap_lo)
                        if lo > gap_hi:
                            break
                        l = pi[p, PI_LINK]
                        if gap_hi - lo + 1 > row[c0 + l]:
                            row[c0 + l] = gap_hi - lo + 1
    for l in range(L):
        row[c0 + l] += lt[l, LT_BLOCKED]


@njit(cache=True)
def noc_idle(N):
    """No packet anywhere in the network (source queues and ejection buffers included)."""
    return N.clk[C_NFREE] == N.pfree.shape[0]


@njit(nrt=True)  # allocates its backlog
def noc_drive(N, src, dsts, ndst, nbytes, period, t0, n_cycles, seed, skip, sent, delivered):
    """Synthetic traffic for tests and micro-benchmarks over cycles t0 .. t0+n_cycles-1.

    Source i (node ``src[i]``) creates a packet of ``nbytes`` every ``period[i]`` cycles (1: as
    fast as it can; 0: silent) into an unbounded backlog, picks its destination uniformly from
    ``dsts[i, :ndst[i]]`` (xorshift, ``seed``) and offers it every cycle until ``noc_inject``
    takes it. Every receiving node drains its ejection buffer at the start of each cycle (before
    the step). ``sent[i]`` and ``delivered[i]`` count packets per source (request id = source
    index). With ``skip`` the clock jumps to the next event whenever no packet is waiting to be
    offered or ejected. Returns the number of cycles stepped."""
    ns = src.shape[0]
    nn = N.par[P_NODES]
    backlog = np.zeros(ns, np.int64)
    pend = np.full(ns, -1, np.int64)
    x = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1)
    end = t0 + n_cycles
    now = t0
    steps = 0
    while now < end:
        for n in range(nn):
            while True:
                r = noc_eject(N, n)
                if r < 0:
                    break
                delivered[r] += 1
        waiting = False
        for i in range(ns):
            if period[i] > 0 and (now - t0) % period[i] == 0:
                backlog[i] += 1
            if backlog[i] > 0:
                if pend[i] < 0:
                    x ^= x >> np.uint64(12)
                    x ^= x << np.uint64(25)
                    x ^= x >> np.uint64(27)
                    pend[i] = dsts[i, np.int64(((x * np.uint64(2685821657736338717)) >> np.uint64(33))
                                               % np.uint64(ndst[i]))]
                if noc_inject(N, np.int64(src[i]), i, nbytes, pend[i], now):
                    backlog[i] -= 1
                    sent[i] += 1
                    pend[i] = -1
                if backlog[i] > 0:
                    waiting = True
        noc_step(N, now)
        steps += 1
        nxt = now + 1
        if skip and not waiting:
            ready = False
            for n in range(nn):
                if noc_deliverable(N, n):
                    ready = True
                    break
            if not ready:
                nxt = noc_next_event(N, now)
                for i in range(ns):
                    if period[i] > 0:
                        k = now - t0 + 1
                        tg = t0 + ((k + period[i] - 1) // period[i]) * period[i]
                        if tg < nxt:
                            nxt = tg
                if nxt >= end and now < end - 1:
                    nxt = end - 1               # always step the last cycle: counters end there
        now = nxt
    return steps


# ----------------------------------------------------------------------------- builders

def _name_array(names: Sequence[str]) -> np.ndarray:
    a = np.zeros((max(len(names), 1), _NAME_LEN), np.uint8)
    for i, s in enumerate(names):
        raw = s.encode()[:_NAME_LEN]
        a[i, :len(raw)] = np.frombuffer(raw, np.uint8)
    return a[:len(names)] if names else a[:0]


def _decode(row: np.ndarray) -> str:
    return bytes(row).rstrip(b"\0").decode()


def link_names(N: NocState) -> list[str]:
    return [_decode(r) for r in N.link_names]


def node_names(N: NocState) -> list[str]:
    return [_decode(r) for r in N.node_names]


class _Builder:
    """Collects routers, nodes and links in Python, then packs them into a NocState."""

    def __init__(self, topo: int, width: int, depth: int, latency: int, n_routers: int,
                 router_names: Sequence[str], lookahead: int = 0):
        for what, v in (("link_bytes_per_cycle", width), ("buffer_depth", depth),
                        ("router_latency_cycles", latency)):
            if int(v) != v or v < 1:
                raise ValueError(f"{what} must be a positive integer, got {v!r}")
        if int(lookahead) != lookahead or lookahead < 0:
            raise ValueError(f"lookahead_packets must be a non-negative integer, got {lookahead!r}")
        self.topo, self.W, self.D, self.L = topo, int(width), int(depth), int(latency)
        self.look = int(lookahead)
        self.R = n_routers
        self.router_names = list(router_names)
        self.port_names = list(router_names)   # how node port links name their router
        self.bufs: list[tuple] = []            # (kind, pool, lat, grp)
        self.links: list[list] = []            # [grp, dst0, dst1, dateline, width, name]
        self.g_in: list[list[int]] = [[] for _ in range(n_routers)]
        self.g_out: list[list[int]] = [[] for _ in range(n_routers)]
        self.nodes: list[dict] = []

    def _buf(self, kind, grp):
        pool = self.D + self.L if kind == BUF_IN else self.D
        lat = self.L if kind == BUF_IN else 0
        self.bufs.append((kind, pool, lat, grp))
        b = len(self.bufs) - 1
        if grp >= 0:
            self.g_in[grp].append(b)
        return b

    def _link(self, grp, dst0, dst1, dateline, width, name):
        self.links.append([grp, dst0, dst1, int(dateline), int(width), name])
        l = len(self.links) - 1
        self.g_out[grp].append(l)
        return l

    def router_link(self, ra, rb, name, vcs=1, dateline=False):
        b0 = self._buf(BUF_IN, rb)
        b1 = self._buf(BUF_IN, rb) if vcs == 2 else b0
        return self._link(ra, b0, b1, dateline, self.W, name)

    def node(self, name, router, send=True, recv=True, port_width=None):
        pw = int(port_width or self.W)
        nd = {"name": name, "router": router, "grp": -1, "src": -1, "ej": -1, "inj_link": -1, "ej_link": -1}
        rname = self.port_names[router]
        if send:
            g = len(self.g_in)
            self.g_in.append([])
            self.g_out.append([])
            nd["grp"] = g
            nd["src"] = self._buf(BUF_SRC, g)
            b_in = self._buf(BUF_IN, router)
            nd["inj_link"] = self._link(g, b_in, b_in, False, pw, f"{name}->{rname}")
        if recv:
            nd["ej"] = self._buf(BUF_EJ, -1)
            nd["ej_link"] = self._link(router, nd["ej"], nd["ej"], False, pw, f"{rname}->{name}")
        self.nodes.append(nd)
        return len(self.nodes) - 1

    def build(self, next_link) -> NocState:
        """next_link(router, dest_router) -> link index, or None when dest_router == router."""
        R, nn = self.R, len(self.nodes)
        G = len(self.g_in)
        route = np.full((G, nn), -1, np.int32)
        # a router's link towards node d: its ejection link when d is attached to it, else the next
        # hop towards d's router (next_link once per pair of routers, not per node)
        node_r = np.array([nd["router"] for nd in self.nodes], np.int64).reshape(nn)
        ej = np.array([nd["ej_link"] for nd in self.nodes], np.int64).reshape(nn)
        used = sorted(set(node_r.tolist()))
        col = {dr: j for j, dr in enumerate(used)}
        hop = np.full((R, len(used)), -1, np.int64)
        for r in range(R):
            for dr in used:
                if dr != r:
                    hop[r, col[dr]] = next_link(r, dr)
        if nn:
            cols = np.array([col[x] for x in node_r.tolist()], np.int64)
            here = node_r[None, :] == np.arange(R)[:, None]
            route[:R] = np.where(here, ej[None, :], hop[:, cols])
        recv = np.array([dn["ej"] >= 0 for dn in self.nodes], bool).reshape(nn)
        for nd in self.nodes:                  # a sending node's interface: its injection link, to any receiver
            if nd["grp"] >= 0:
                route[nd["grp"], recv] = nd["inj_link"]
        route[:R, ~recv] = -1                  # every router-to-ejection route must reach a receiving node
        B, Lk = len(self.bufs), len(self.links)
        bi = np.zeros((B, 14), np.int32)
        bi[:, [BI_KIND, BI_POOL, BI_LAT, BI_GRP]] = np.array(self.bufs, np.int64).reshape(B, 4)
        for ins in self.g_in:
            bi[ins, BI_K] = np.arange(len(ins))
        lk = np.array([l[:5] for l in self.links], np.int64).reshape(Lk, 5)   # grp, dst0, dst1, dateline, width
        # a buffer reads out at the rate of the link filling it (both virtual channels of a link)
        bi[lk[:, 1:3].ravel(), BI_RDW] = np.repeat(lk[:, 4], 2)
        srcs = [(n["src"], self.links[n["inj_link"]][4]) for n in self.nodes if n["src"] >= 0]
        if srcs:
            bi[[b for b, _ in srcs], BI_RDW] = [w for _, w in srcs]
        bt = np.zeros((B, 4), np.int64)
        Q = make_queues(bi[:, BI_POOL])        # a packet is at least one flit
        maxp = int(bi[:, BI_POOL].sum())

        def flat(lists):
            count = np.array([len(x) for x in lists], np.int32)
            start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int32)
            return start, count, np.array([i for x in lists for i in x] or [0], np.int32)

        gi = np.zeros((G, 6), np.int32)
        gi[:, G_IN0], gi[:, G_NIN], gin = flat(self.g_in)
        gi[:, G_OUT0], gi[:, G_NOUT], gout = flat(self.g_out)
        words = (gi[:, G_NIN] + 63) // 64
        gi[:, G_PW0] = np.concatenate([[0], np.cumsum(words)[:-1]]) if G else words
        li = np.zeros((Lk, 10), np.int32)
        li[:, [LI_GRP, LI_DST0, LI_DST1, LI_DATELINE, LI_WIDTH]] = lk
        li[:, LI_RR] = gi[lk[:, 0], G_NIN] - 1
        li[:, LI_CAND] = -1                    # no offer (noc_step restores these after each round)
        li[:, LI_DIST] = 1 << 30
        ni = np.array([[n["router"], n["grp"], n["src"], n["ej"]] for n in self.nodes], np.int32).reshape(nn, 4)
        par = np.zeros(12, np.int64)
        par[[P_TOPO, P_WIDTH, P_DEPTH, P_LAT, P_NODES, P_GROUPS, P_ROUTERS, P_LINKS, P_BUFS, P_LOOK, P_SLEEP,
             P_ROUNDS]] = [self.topo, self.W, self.D, self.L, nn, G, R, Lk, B, self.look, 1, LOOKAHEAD_ROUNDS]
        clk = np.zeros(C_N, np.int64)
        clk[C_LAST] = -1
        clk[C_MOVED] = -1
        clk[C_NFREE] = maxp
        return NocState(
            par=par, clk=clk, Q=Q, bi=bi, bt=bt, gi=gi, gin=gin, gout=gout, route=route,
            li=li, lt=np.zeros((Lk, 7), np.int64), ni=ni, nt=np.zeros((nn, 3), np.int64),
            pi=np.zeros((maxp, 7), np.int32), pt=np.zeros((maxp, 2), np.int64),
            pfree=np.arange(maxp - 1, -1, -1, dtype=np.int32), bw=np.zeros((B, self.look + 1), np.int32),
            bc=np.zeros((B, self.look + 1, 4), np.int32), gm=np.zeros(max((G + 63) // 64, 1), np.int64),
            pm=np.zeros(max(int(words.sum()), 1), np.int64), ls=np.zeros((3, max(Lk, 1)), np.int32),
            link_names=_name_array([l[5] for l in self.links]),
            node_names=_name_array([n["name"] for n in self.nodes]))


def make_crossbar(n_src: int, n_dst: int, link_bytes_per_cycle: int, buffer_depth: int, latency_cycles: int,
                  src_names: Optional[Sequence[str]] = None, dst_names: Optional[Sequence[str]] = None,
                  router_name: str = "xbar", lookahead: int = 0) -> NocState:
    """One direction of a crossbar: nodes 0..n_src-1 send, nodes n_src..n_src+n_dst-1 receive.
    Each source has an input port, each destination an output port, both link_bytes_per_cycle
    wide; latency_cycles is the crossbar pipeline (one router); lookahead: packets behind a
    blocked head an input port may send instead (0: FIFO). Build a second one for replies."""
    src_names = list(src_names or [f"src{i}" for i in range(n_src)])
    dst_names = list(dst_names or [f"dst{j}" for j in range(n_dst)])
    bld = _Builder(TOPO_CROSSBAR, link_bytes_per_cycle, buffer_depth, latency_cycles, 1, [router_name], lookahead)
    for i in range(n_src):
        bld.node(src_names[i], 0, send=True, recv=False)
    for j in range(n_dst):
        bld.node(dst_names[j], 0, send=False, recv=True)
    return bld.build(lambda r, d: -1)


def make_ring(n_stops: int, link_bytes_per_cycle: int, buffer_depth: int, latency_cycles: int,
              bidirectional: bool = True, node_stop: Optional[Sequence[int]] = None,
              node_names: Optional[Sequence[str]] = None, stop_names: Optional[Sequence[str]] = None,
              port_bytes_per_cycle: Optional[int] = None, lookahead: int = 0) -> NocState:
    """A ring of n_stops routers; node i sits at stop node_stop[i] (default: one node per stop)
    and both sends and receives through ports port_bytes_per_cycle wide (default: the link
    width). Clockwise links go stop s -> s+1; bidirectional adds s -> s-1."""
    node_stop = list(range(n_stops) if node_stop is None else node_stop)
    stop_names = list(stop_names or [f"s{i}" for i in range(n_stops)])
    node_names = list(node_names or [f"n{i}" for i in range(len(node_stop))])
    bld = _Builder(TOPO_RING, link_bytes_per_cycle, buffer_depth, latency_cycles, n_stops, stop_names, lookahead)
    bld.port_names = ["ring"] * n_stops       # node ports: "cg0->ring", "ring->mc0"
    cw, ccw = {}, {}
    if n_stops > 1:
        for s in range(n_stops):
            t = (s + 1) % n_stops
            cw[s] = bld.router_link(s, t, f"ring {stop_names[s]}->{stop_names[t]}", vcs=2, dateline=(t == 0))
        if bidirectional:
            for s in range(n_stops):
                t = (s - 1) % n_stops
                ccw[s] = bld.router_link(s, t, f"ring {stop_names[s]}->{stop_names[t]}", vcs=2, dateline=(s == 0))
    for i, s in enumerate(node_stop):
        if not 0 <= s < n_stops:
            raise ValueError(f"node {i} at stop {s}: no such stop (0..{n_stops - 1})")
        bld.node(node_names[i], s, port_width=port_bytes_per_cycle)

    def next_link(r, d):
        dcw = (d - r) % n_stops
        if not bidirectional:
            return cw[r]
        dccw = n_stops - dcw
        if dcw < dccw or (dcw == dccw and r % 2 == 0):
            return cw[r]
        return ccw[r]

    return bld.build(next_link)


def make_mesh(rows: int, cols: int, link_bytes_per_cycle: int, buffer_depth: int, latency_cycles: int,
              node_router: Optional[Sequence[int]] = None, node_names: Optional[Sequence[str]] = None,
              port_bytes_per_cycle: Optional[int] = None, lookahead: int = 0) -> NocState:
    """A rows x cols mesh of routers (router r at row r // cols, column r % cols) with XY routing;
    node i attaches to router node_router[i] (default: one node per router)."""
    n = rows * cols
    node_router = list(range(n) if node_router is None else node_router)
    rnames = [f"r{r // cols}c{r % cols}" for r in range(n)]
    node_names = list(node_names or [f"n{i}" for i in range(len(node_router))])
    bld = _Builder(TOPO_MESH, link_bytes_per_cycle, buffer_depth, latency_cycles, n, rnames, lookahead)
    nb = {}
    for r in range(n):
        i, j = divmod(r, cols)
        for di, dj in ((0, 1), (0, -1), (1, 0), (-1, 0)):
            if 0 <= i + di < rows and 0 <= j + dj < cols:
                t = (i + di) * cols + j + dj
                nb[r, t] = bld.router_link(r, t, f"mesh {rnames[r]}->{rnames[t]}")
    for k, r in enumerate(node_router):
        if not 0 <= r < n:
            raise ValueError(f"node {k} at router {r}: no such router (0..{n - 1})")
        bld.node(node_names[k], r, port_width=port_bytes_per_cycle)

    def next_link(r, d):
        (i, j), (di, dj) = divmod(r, cols), divmod(d, cols)
        if dj != j:
            return nb[r, r + (1 if dj > j else -1)]
        return nb[r, r + (cols if di > i else -cols)]

    return bld.build(next_link)


# ----------------------------------------------------------------------------- machine fabrics

class FabricNets(NamedTuple):
    """A machine's fabric: requests (cores -> memory side) and replies travel separate networks.
    Node ids of each endpoint in each network are in the four index arrays."""

    kind: str
    req: NocState
    resp: NocState
    core_names: tuple        # core-side endpoints: SMs (GPU) or core groups (Sunway)
    mem_names: tuple         # memory-side endpoints: L2 slices, or memory controllers without L2
    req_core: np.ndarray     # int32 [n_core] node id in req
    req_mem: np.ndarray      # int32 [n_mem]
    resp_mem: np.ndarray     # int32 [n_mem] node id in resp
    resp_core: np.ndarray    # int32 [n_core]


def _grid(n: int) -> tuple[int, int]:
    rows = max(r for r in range(1, int(math.isqrt(n)) + 1) if n % r == 0)
    return rows, n // rows


def make_fabric(machine) -> FabricNets:
    """The fabric of a resolved Machine, chosen by machine.fabric.kind.

    crossbar: every SM (cores.per_group x groups) to every L2 slice (memory controller when there
    is no L2) and back, one port each. ring / mesh: one stop per core group on a Sunway (a GPU:
    one per memory-side endpoint, SMs spread evenly over them); memory controller j shares the
    stop of group j x stops // count (the controller of each core group sits at its group's
    stop). On a ring each stop's local ports are ``fabric.port_bytes_per_cycle`` wide (default: as
    wide as the ring links that arrive at it, 2 x the link width when bidirectional), so a group's
    private-segment traffic to its own controller is not squeezed through one ring link (and a
    config that sets the port keeps it when a sweep narrows the links)."""
    fb = machine.fabric
    W, D, L, K = fb.link_bytes_per_cycle, fb.buffer_depth, fb.router_latency_cycles, fb.lookahead_packets
    sunway = machine.family == "sunway"
    if sunway:
        core_names = [f"cg{i}" for i in range(machine.groups)]
    else:
        core_names = [f"sm{i}" for i in range(machine.cores.per_group * machine.groups)]
    if machine.l2 is not None:
        mem_names = [f"l2s{j}" for j in range(machine.l2.slices)]
    else:
        mem_names = [f"mc{j}" for j in range(machine.memory_controllers.count)]
    nc, nm = len(core_names), len(mem_names)
    if fb.kind == "crossbar":
        req = make_crossbar(nc, nm, W, D, L, core_names, mem_names, lookahead=K)
        resp = make_crossbar(nm, nc, W, D, L, mem_names, core_names, lookahead=K)
        req.par[P_ROUNDS] = resp.par[P_ROUNDS] = fb.lookahead_rounds
        ar = np.arange
        return FabricNets("crossbar", req, resp, tuple(core_names), tuple(mem_names),
                          ar(nc, dtype=np.int32), ar(nc, nc + nm, dtype=np.int32),
                          ar(nm, dtype=np.int32), ar(nm, nm + nc, dtype=np.int32))
    stops = machine.groups if sunway else nm
    core_stop = list(range(nc)) if sunway else [i * stops // nc for i in range(nc)]
    mem_stop = [j * stops // nm for j in range(nm)]
    node_stop = core_stop + mem_stop
    names = core_names + mem_names
    if fb.kind == "ring":
        stop_names = [f"cg{s}" for s in range(stops)] if sunway else [f"stop{s}" for s in range(stops)]
        pw = fb.port_bytes_per_cycle or W * (2 if fb.bidirectional else 1)

        def mk():
            return make_ring(stops, W, D, L, fb.bidirectional, node_stop, names, stop_names, pw, K)
    else:
        rows, cols = _grid(stops)

        def mk():
            return make_mesh(rows, cols, W, D, L, node_stop, names, lookahead=K)
    ids_c, ids_m = np.arange(nc, dtype=np.int32), np.arange(nc, nc + nm, dtype=np.int32)
    req, resp = mk(), mk()
    req.par[P_ROUNDS] = resp.par[P_ROUNDS] = fb.lookahead_rounds
    return FabricNets(fb.kind, req, resp, tuple(core_names), tuple(mem_names), ids_c, ids_m, ids_m, ids_c)


def cpe_mesh_params(machine) -> tuple[int, int, int]:
    """(link bytes per cycle, router latency cycles, buffer depth flits) of the CPE mesh: links
    rma.link_bytes_per_cycle wide, one router traversal rma.router_latency_cycles (default
    max(1, hop_cycles // 2): a transfer crosses every router twice, out and back, so one more
    cluster hop costs the published hop_cycles), buffers of rma.buffer_depth flits (default: two
    whole pieces with their header, so a stream of pieces never waits for a buffer to drain)."""
    rma = machine.rma
    W = int(rma.link_bytes_per_cycle)
    L = rma.router_latency_cycles if rma.router_latency_cycles is not None else max(1, rma.hop_cycles // 2)
    piece = rma.piece_bytes + machine.fabric.header_bytes
    D = rma.buffer_depth if rma.buffer_depth is not None else 2 * -(-piece // W)
    return W, int(L), int(D)


def make_cpe_mesh(machine) -> NocState:
    """The CPE mesh of one Sunway core group: a router per cluster (mesh.rows / cluster_rows x
    mesh.cols / cluster_cols), every CPE a node of its cluster's router (CPE k at row
    k // mesh.cols); parameters from cpe_mesh_params."""
    m, rma = machine.mesh, machine.rma
    if m is None or rma is None:
        raise ValueError(f"machine {machine.name!r} has no mesh/rma block")
    rows, cols = m.rows // m.cluster_rows, m.cols // m.cluster_cols
    nr = [(k // m.cols) // m.cluster_rows * cols + (k % m.cols) // m.cluster_cols for k in range(m.rows * m.cols)]
    W, L, D = cpe_mesh_params(machine)
    return make_mesh(rows, cols, W, D, L, nr, [f"cpe{k}" for k in range(len(nr))])


def make_cpe_meshes(machine) -> NocState:
    """The CPE meshes of every core group of a Sunway as one network of disjoint meshes (no link
    between groups): router g * clusters + k is cluster k of group g (row-major over the
    clusters); node c is CPE c (global core id, at its cluster's router) and node
    cores + g * clusters + k the cluster's engine port (its DMA and RMA engines send and receive
    there), then, with an ``mpe`` block, node cores + G * clusters + g group g's MPE port at the
    router of ``mpe.attach_cluster``. XY routing inside a group; a destination in another group is unreachable (route -1:
    the RMA engine never sends there). Parameters from cpe_mesh_params."""
    m = machine.mesh
    if m is None or machine.rma is None:
        raise ValueError(f"machine {machine.name!r} has no mesh/rma block")
    W, L, D = cpe_mesh_params(machine)
    crows, ccols = m.rows // m.cluster_rows, m.cols // m.cluster_cols
    ncl = crows * ccols
    G = machine.groups
    per = m.rows * m.cols
    rnames = [f"cg{g}.r{k // ccols}c{k % ccols}" for g in range(G) for k in range(ncl)]
    bld = _Builder(TOPO_MESH, W, D, L, G * ncl, rnames)
    nb = {}
    for g in range(G):
        for k in range(ncl):
            i, j = divmod(k, ccols)
            r = g * ncl + k
            for di, dj in ((0, 1), (0, -1), (1, 0), (-1, 0)):
                if 0 <= i + di < crows and 0 <= j + dj < ccols:
                    t = g * ncl + (i + di) * ccols + j + dj
                    nb[r, t] = bld.router_link(r, t, f"mesh {rnames[r]}->{rnames[t]}")
    for c in range(G * per):
        g, k = divmod(c, per)
        cl = (k // m.cols) // m.cluster_rows * ccols + (k % m.cols) // m.cluster_cols
        bld.node(f"cpe{c}", g * ncl + cl)
    for r in range(G * ncl):
        bld.node(f"eng.{rnames[r]}", r)
    if machine.mpe is not None:  # each group's MPE port, at its attach cluster's router (engine/mpe.py)
        ar, ac = machine.mpe.attach_cluster
        for g in range(G):
            bld.node(f"mpe.cg{g}", g * ncl + ar * ccols + ac)

    def next_link(r, d):
        if r // ncl != d // ncl:
            return -1
        (i, j), (di, dj) = divmod(r % ncl, ccols), divmod(d % ncl, ccols)
        if dj != j:
            return nb[r, r + (1 if dj > j else -1)]
        return nb[r, r + (ccols if di > i else -ccols)]

    return bld.build(next_link)


# ----------------------------------------------------------------------------- results

def noc_counters(N: NocState, elapsed_cycles: int) -> dict:
    """The ``fabric`` record (docs/records.md) for one network, plus extra fields: per link utilization
    (busy cycles / elapsed_cycles), blocked cycles, bytes, packets, occupancy of the buffers the
    link feeds (flits; mean over elapsed_cycles, max); deliveries, mean latency (injection to tail
    arrival), injection stalls."""
    el = max(int(elapsed_cycles), 1)
    end = int(N.clk[C_LAST]) + 1
    area = N.bt[:, BT_AREA] + N.bi[:, BI_OCC].astype(np.int64) * np.maximum(end - N.bt[:, BT_T], 0)
    links = []
    for l, name in enumerate(link_names(N)):
        b0, b1 = int(N.li[l, LI_DST0]), int(N.li[l, LI_DST1])
        qa = int(area[b0]) + (int(area[b1]) if b1 != b0 else 0)
        qm = max(int(N.bi[b0, BI_MAX]), int(N.bi[b1, BI_MAX]))
        links.append({"name": name, "util": float(N.lt[l, LT_FLITS]) / el,
                      "blocked_cycles": int(N.lt[l, LT_BLOCKED]), "bytes": int(N.lt[l, LT_BYTES]),
                      "packets": int(N.lt[l, LT_PKTS]), "queue_mean": qa / el, "queue_max": qm})
    utils = [x["util"] for x in links] or [0.0]
    nd = int(N.clk[C_DELIVERED])
    return {"link_util_mean": float(np.mean(utils)), "link_util_max": float(np.max(utils)),
            "blocked_cycles": int(N.lt[:, LT_BLOCKED].sum()), "links": links,
            "packets_delivered": nd, "bytes_delivered": int(N.clk[C_BYTES]),
            "latency_mean_cycles": (float(N.clk[C_LAT_SUM]) / nd) if nd else 0.0,
            "inject_stalls": int(N.nt[:, NT_STALLS].sum())}


def fabric_counters(req: NocState, resp: NocState, elapsed_cycles: int) -> dict:
    """Both networks of a machine fabric in one ``fabric`` record (link names prefixed req/resp)."""
    a, b = noc_counters(req, elapsed_cycles), noc_counters(resp, elapsed_cycles)
    links = [dict(x, name="req " + x["name"]) for x in a["links"]] + \
            [dict(x, name="resp " + x["name"]) for x in b["links"]]
    utils = [x["util"] for x in links] or [0.0]
    nd = a["packets_delivered"] + b["packets_delivered"]
    lat = (a["latency_mean_cycles"] * a["packets_delivered"] + b["latency_mean_cycles"] * b["packets_delivered"])
    return {"link_util_mean": float(np.mean(utils)), "link_util_max": float(np.max(utils)),
            "blocked_cycles": a["blocked_cycles"] + b["blocked_cycles"], "links": links,
            "packets_delivered": nd, "bytes_delivered": a["bytes_delivered"] + b["bytes_delivered"],
            "latency_mean_cycles": lat / nd if nd else 0.0,
            "inject_stalls": a["inject_stalls"] + b["inject_stalls"]}


__all__ = [
    "BUF_EJ", "BUF_IN", "BUF_SRC", "FabricNets", "INF", "NocState", "TOPO_CODES", "TOPO_CROSSBAR", "TOPO_MESH",
    "TOPO_RING", "cpe_mesh_params", "fabric_counters", "link_names", "make_cpe_mesh", "make_cpe_meshes", "make_crossbar", "make_fabric", "make_mesh",
    "make_ring", "noc_counters", "noc_deliverable", "noc_drive", "noc_eject", "noc_idle",
    "noc_inject", "noc_next_event", "noc_step", "node_names",
]
