"""Which L2 slice of its half holds an address, as numbers any block can use: the L2 (mem_state's
slice_of) and, with the ``partitions`` address mapping, the DRAM (a channel serves the slices of
its partition, so the slice decides the channel).

Addresses interleave over ``l2.halves`` in ``l2.interleave_bytes`` chunks; within a half, over its
``sph`` slices in granules of ``memory_controllers.address_mapping.interleave_bytes``.
``half_granule`` numbers a half's own granules consecutively (a chunk's granules, then those of
the half's next chunk); ``slice_in_half`` places granule q round-robin (``consecutive``) or
permutes each group of sph consecutive granules by a fold of the group number (``hashed``)."""

from __future__ import annotations

import numpy as np

from archsim.engine.jit import njit


def fold_bits(sph: int) -> int:
    """The piece width of hashed_slice's fold for sph slices a half."""
    return max(1, (sph - 1).bit_length())


def half_granules(machine) -> int:
    """half_granule's half_gran: the slice granules in one l2.interleave_bytes chunk, or 0 (no L2,
    one half, or a chunk that is not whole granules: granules numbered globally)."""
    l2 = machine.l2
    il = machine.memory_controllers.address_mapping.interleave_bytes
    if l2 is None or l2.halves <= 1 or l2.interleave_bytes % il:
        return 0
    return l2.interleave_bytes // il


@njit(cache=True)
def half_granule(addr, il_half, halves, half_gran, il):
    """(half, q): the L2 half of ``addr`` and its granule number within the half (half_gran =
    il_half // il granules a chunk; 0 numbers granules globally, as one half does)."""
    half = (addr // il_half) % halves
    if half_gran > 0:
        return half, addr // (il_half * halves) * half_gran + (addr % il_half) // il
    return half, addr // il


@njit(cache=True)
def hashed_slice(q, sph, bits):
    """Slice within a half of interleave granule q (l2.slice_indexing: hashed): q's position in
    its group of sph consecutive granules, XORed (sph a power of two) or added modulo sph (other
    sph) with the XOR fold of the group number in `bits`-bit pieces. Each group of sph granules
    still covers every slice once (sequential streams stay balanced), and granules sph apart,
    or any power-of-two stride, land on different slices."""
    return _permute(q % sph, _fold_group(q // sph, bits), sph)


@njit(cache=True)
def _fold_group(x, bits):
    mask = (np.int64(1) << bits) - 1
    h = np.int64(0)
    while x > 0:
        h ^= x & mask
        x >>= bits
    return h


@njit(cache=True)
def _permute(lo, h, sph):
    if sph & (sph - 1) == 0:
        return lo ^ (h & (sph - 1))
    return (lo + h) % sph


def unhash_slice(sl, x, sph, bits, hashed):
    """Inverse of slice_in_half within group x (Python ints): the position in the group whose
    slice is sl."""
    if not hashed:
        return sl
    h = int(_fold_group(x, bits))
    return sl ^ (h & (sph - 1)) if sph & (sph - 1) == 0 else (sl - h) % sph


@njit(cache=True)
def slice_in_half(q, sph, bits, hashed):
    """The slice (within its half) of a half's granule q."""
    if hashed:
        return hashed_slice(q, sph, bits)
    return q % sph
