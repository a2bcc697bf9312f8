"""Engine state storage: big, mostly idle arrays allocated so that only the pages a run touches cost memory."""

from __future__ import annotations

import mmap

import numpy as np

_SPARSE_MIN_BYTES = 4 << 20


def sparse_zeros(shape, dtype) -> np.ndarray:
    """np.zeros for a big array of which a run touches only parts (the register file and
    scratchpad rows of every warp slot of a whole GPU: hundreds of MB, mostly idle slots). It is an
    anonymous mapping with transparent huge pages turned off, so the kernel zeroes only the 4-KiB
    pages a run touches; with huge pages, the first touch of each slot's registers zeroed a whole
    2-MiB page (an a100 GEMM spent a quarter of its time there)."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n < _SPARSE_MIN_BYTES:
        return np.zeros(shape, dt)
    mm = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
        mm.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mm, dt).reshape(shape)


def copy_state_array(a: np.ndarray) -> np.ndarray:
    """A copy of a state array; one from sparse_zeros (its buffer an anonymous mapping) stays
    sparse: only its 4-KiB pages that hold a non-zero byte are written into a new mapping (a
    read of an untouched page maps the shared zero page, so the scan costs no memory)."""
    if not (isinstance(a.base, mmap.mmap) and a.flags.c_contiguous):
        return a.copy(order="K")
    new = sparse_zeros(a.shape, a.dtype)
    src, dst = a.reshape(-1).view(np.uint8), new.reshape(-1).view(np.uint8)
    n = src.size // 4096 * 4096
    rows = src[:n].reshape(-1, 4096)
    touched = np.flatnonzero(rows.any(axis=1))
    dst[:n].reshape(-1, 4096)[touched] = rows[touched]
    dst[n:] = src[n:]
    return new
