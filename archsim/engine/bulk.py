"""What the Sunway DMA engines (dma.py) and RMA engines (rma.py) share: an engine takes transfer
descriptors into a FIFO and sends each as pieces through one port of a fixed byte rate. The
descriptor and engine rows begin with the fields below in both; each module adds its own after
them."""

from __future__ import annotations

import numpy as np

from archsim.engine import warps as WS
from archsim.engine.jit import njit

FX = np.int64(1) << 16  # fixed point: one core cycle of the engine port

# the leading descriptor fields: the warp and core that issued it, put or get, its address,
# bytes, bytes sent, pieces out, then the cycles it became ready, started and completed
D_WARP, D_CORE, D_PUT, D_ADDR, D_NBYTES, D_NEXT, D_OUT, D_READY, D_T0, D_DONE, D_N = range(11)
# the leading engine fields: FIFO head and count, offset (from head) of the first descriptor with
# pieces left to send, pieces in flight, port free (fixed point)
EN_HEAD, EN_COUNT, EN_CUR, EN_INFLIGHT, EN_PORT_FX, EN_N = range(6)


@njit(cache=True, inline="always")
def piece_sent(en, d, nbytes, now, bpc_fx):
    """An engine (row ``en``) sent ``nbytes`` of descriptor ``d``: the port is held for them at
    ``bpc_fx`` bytes per cycle (fixed point), the piece is in flight, and the engine moves to the
    next descriptor once this one has sent everything."""
    d[D_NEXT] += nbytes
    d[D_OUT] += 1
    en[EN_INFLIGHT] += 1
    # a piece that waited only for the port starts when the port freed (a fraction of a cycle ago):
    # back-to-back pieces meet a fractional rate exactly; after an idle cycle it starts now
    t = en[EN_PORT_FX]
    if t <= (now - 1) * FX:
        t = now * FX
    en[EN_PORT_FX] = t + (nbytes * FX * FX + bpc_fx - 1) // bpc_fx
    if d[D_NEXT] >= d[D_NBYTES]:
        en[EN_CUR] += 1


@njit(cache=True, inline="always")
def count_latency(cnt, lat, i_sum, i_min, i_max):
    """A transfer's latency into an engine's counter row: the sum, the least and the most."""
    cnt[i_sum] += lat
    if lat < cnt[i_min]:
        cnt[i_min] = lat
    if lat > cnt[i_max]:
        cnt[i_max] = lat


@njit(cache=True, inline="always")
def retire_done(en, desc, cores, TS, now):
    """Retire the completed descriptors at the head of an engine's FIFO (``desc``: its rows;
    ``cores``: the cores it serves, -1 padded) and wake the cores refused for a full FIFO, which
    may issue now. Returns how many were retired."""
    n = 0
    while en[EN_COUNT] > 0 and en[EN_CUR] > 0 and desc[en[EN_HEAD], D_DONE] == 1:
        h = en[EN_HEAD] + 1
        if h >= desc.shape[0]:
            h = 0
        en[EN_HEAD] = h
        en[EN_COUNT] -= 1
        en[EN_CUR] -= 1
        n += 1
    if n:
        for i in range(cores.shape[0]):
            c = np.int64(cores[i])
            if c >= 0 and TS.mem_wait[c]:
                WS.wake_refused(TS, c, now)
    return n
