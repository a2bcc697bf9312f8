"""Flow-level network: transfers share each link's bandwidth max-min fairly.

The model ASTRA-sim's analytical backend and SimGrid use: a transfer (a flow) crosses a fixed
route of links; at every flow start and end the rates of all active flows are recomputed by
progressive filling (raise every unfrozen flow's rate together until a link fills, freeze the
flows crossing it, repeat), so each flow gets its max-min fair share. A flow joins its links
after its route's start-up latency and completes when its last byte has crossed them.

``Events`` is the discrete-event clock the network, the collectives and the step share.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

import numpy as np


class Events:
    """A discrete-event clock: callbacks at times, run in time order (ties in scheduling order)."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._seq = 0

    def at(self, t: float, fn: Callable, *args) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), self._seq, fn, args))

    def run(self) -> float:
        while self._heap:
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)
        return self.now


def _link_index(pair_link: np.ndarray, capacity: np.ndarray) -> tuple:
    """(links counted over, each pair's index among them): every link when the pairs are not
    much fewer than the links, else only the links the pairs use (np.unique)."""
    if len(capacity) <= 4 * len(pair_link):
        return None, pair_link
    return np.unique(pair_link, return_inverse=True)


def maxmin_rates(pair_flow: np.ndarray, pair_link: np.ndarray, flows: int, capacity: np.ndarray,
                 index: tuple | None = None) -> np.ndarray:
    """Max-min fair rates of ``flows`` flows; flow pair_flow[i] crosses link pair_link[i].
    ``index``: _link_index of the pairs, when the caller has it already."""
    rates = np.zeros(flows)
    if flows == 0:
        return rates
    links, inv = index if index is not None else _link_index(pair_link, capacity)
    left = capacity.astype(np.float64) if links is None else capacity[links].astype(np.float64)
    _filling()(np.ascontiguousarray(pair_flow, dtype=np.int64), np.ascontiguousarray(inv, dtype=np.int64), left,
               rates, np.ones(flows, dtype=np.bool_), np.zeros(len(left)), np.zeros(len(left), dtype=np.bool_))
    return rates


def _progressive_filling(pair_flow, inv, left, rates, active, count, full):
    """Raise every active flow's rate by the smallest fair share of a link (its capacity left over
    the active flows crossing it), freeze the flows crossing the links that filled, repeat. The
    arithmetic of each round is numpy's over the same arrays (bincount's sums in pair order), so
    the rates are those of the vectorised form, bit for bit."""
    nl = left.shape[0]
    npairs = pair_flow.shape[0]
    while True:
        for j in range(nl):
            count[j] = 0.0
        for i in range(npairs):
            if active[pair_flow[i]]:
                count[inv[i]] += 1.0
        level = math.inf
        used = False
        for j in range(nl):
            if count[j] > 0:
                used = True
                share = left[j] / count[j]
                if share < level:
                    level = share
        if not used:
            return
        for f in range(rates.shape[0]):
            if active[f]:
                rates[f] += level
        for j in range(nl):
            full[j] = count[j] > 0 and left[j] / count[j] <= level * (1 + 1e-12)
            left[j] -= level * count[j]
        for i in range(npairs):
            if full[inv[i]]:
                active[pair_flow[i]] = False


_FILLING = []


def _filling():
    """_progressive_filling compiled (numba is loaded on the first share, not when a command that
    refuses its input imports this module)."""
    if not _FILLING:
        from archsim.engine.jit import njit

        _FILLING.append(njit(_progressive_filling))
    return _FILLING[0]


class FlowNetwork:
    """Active flows over links of ``capacity`` bytes/s, driven by an ``Events`` clock. Counts the
    bytes each link carried and, with ``record``, each link's rate over time.

    Flows that start or end at one instant are shared out once: a change marks the rates stale
    and one re-share runs after every event of that instant (a ring step's flows all start
    together, so a step costs one re-share, not one per flow)."""

    def __init__(self, events: Events, capacity: np.ndarray, record: bool = False):
        self.ev = events
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.link_bytes = np.zeros(len(self.capacity))
        self.record = record
        self.changes: list[tuple[float, np.ndarray, np.ndarray]] = []   # (t, links, rate) when rates move
        self.flows_done = 0
        self._ids = 0
        # active flows, one entry each: id, bytes left, bytes in all, rate; and their (flow, link) pairs
        self._fid = np.zeros(0, dtype=np.int64)
        self._rem = np.zeros(0)
        self._tot = np.zeros(0)
        self._rate = np.zeros(0)
        self._pf = np.zeros(0, dtype=np.int64)
        self._pl = np.zeros(0, dtype=np.int64)
        self._cb: dict[int, Callable[[], None]] = {}
        self._new: list[tuple] = []             # flows joining at this instant
        self._link_rate = np.zeros(len(self.capacity))
        self._active = np.zeros(0, dtype=np.int64)    # links carrying flows now
        self._mask = np.zeros(len(self.capacity), dtype=bool)   # scratch, all False between uses
        self._t = 0.0
        self._version = 0
        self._stale = False

    def transfer(self, links, nbytes: float, latency_s: float, on_done: Callable[[], None]) -> None:
        """Move ``nbytes`` over ``links``: after ``latency_s`` the flow joins them; ``on_done``
        runs when its last byte is across."""
        if type(links) is not np.ndarray or links.dtype != np.int64:
            links = np.asarray(links, dtype=np.int64)
        if nbytes <= 0 or len(links) == 0:
            self.ev.at(self.ev.now + latency_s, self._done_empty, on_done)
            return
        self.ev.at(self.ev.now + latency_s, self._start, links, float(nbytes), on_done)

    def _done_empty(self, on_done) -> None:
        self.flows_done += 1
        on_done()

    def _settle(self) -> None:
        dt = self.ev.now - self._t
        if dt > 0 and len(self._rem):
            self._rem -= self._rate * dt
            self.link_bytes[self._active] += self._link_rate[self._active] * dt
        self._t = self.ev.now

    def _mark(self) -> None:
        self._version += 1                  # any planned finish is void until the re-share
        if not self._stale:
            self._stale = True
            self.ev.at(self.ev.now, self._reshare)

    def _start(self, links: np.ndarray, nbytes: float, on_done) -> None:
        self._ids += 1
        self._cb[self._ids] = on_done
        self._new.append((self._ids, links, nbytes))
        self._mark()

    def _reshare(self) -> None:
        self._stale = False
        self._settle()
        if self._new:
            n0 = len(self._fid)
            add = np.array([x[2] for x in self._new])
            self._fid = np.concatenate([self._fid, [x[0] for x in self._new]])
            self._rem = np.concatenate([self._rem, add])
            self._tot = np.concatenate([self._tot, add])
            self._pl = np.concatenate([self._pl] + [x[1] for x in self._new])
            self._pf = np.concatenate([self._pf, np.repeat(np.arange(n0, n0 + len(self._new)),
                                                           [len(x[1]) for x in self._new])])
            self._new = []
        self._version += 1
        n = len(self._fid)
        if n == 0:
            self._rate = np.zeros(0)
            self._set_link_rate(np.zeros(0, dtype=np.int64), np.zeros(0))
            return
        index = _link_index(self._pl, self.capacity)
        self._rate = maxmin_rates(self._pf, self._pl, n, self.capacity, index)
        links, inv = index
        if links is None:                                  # counted over every link
            total = np.bincount(self._pl, weights=self._rate[self._pf], minlength=len(self.capacity))
            links = np.nonzero(total)[0]
            self._set_link_rate(links, total[links])
        else:
            self._set_link_rate(links, np.bincount(inv, weights=self._rate[self._pf], minlength=len(links)))
        wait = float((np.maximum(self._rem, 0.0) / self._rate).min())
        # never the same instant again: at a large `now` a tiny wait rounds away and would loop
        self.ev.at(max(self.ev.now + wait, math.nextafter(self.ev.now, math.inf)), self._finish, self._version)

    def _set_link_rate(self, links: np.ndarray, rates: np.ndarray) -> None:
        """The links now carrying flows and their total rates; every other link is idle."""
        old = self._active
        if self.record:
            before = self._link_rate[links].copy()
            keep = self._mask
            keep[links] = True
            gone = old[~keep[old]]                    # (both sorted: as np.setdiff1d, cheaper)
            keep[links] = False
            moved = np.concatenate([links[before != rates], gone])
            if len(moved):
                vals = np.concatenate([rates[before != rates], np.zeros(len(gone))])
                self.changes.append((self.ev.now, moved, vals))
        self._link_rate[old] = 0.0
        self._link_rate[links] = rates
        self._active = links

    def _finish(self, version: int) -> None:
        if version != self._version:
            return                          # the rates changed since this finish was planned
        self._settle()
        # done: within rounding of its size, or what is left would take less than the clock's resolution
        tick = 2 * (math.nextafter(self.ev.now, math.inf) - self.ev.now)
        done = (self._rem <= 1e-9 * self._tot + 1e-6) | (self._rem <= self._rate * tick)
        if not done.any():                  # rounding left a sliver: plan again from here
            self._mark()
            return
        callbacks = [self._cb.pop(f) for f in self._fid[done].tolist()]
        keep = ~done
        pair_keep = keep[self._pf]
        self._pf = (np.cumsum(keep) - 1)[self._pf[pair_keep]]
        self._pl = self._pl[pair_keep]
        self._fid, self._rem, self._tot, self._rate = (self._fid[keep], self._rem[keep], self._tot[keep],
                                                       self._rate[keep])
        self.flows_done += len(callbacks)
        self._mark()
        for cb in callbacks:
            cb()


__all__ = ["Events", "FlowNetwork", "maxmin_rates"]
