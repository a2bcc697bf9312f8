"""Tensor maps (``cp.async.bulk.tensor``; the 16-word format is in isa/README.md) as kernel
arguments: what the host's cuTensorMapEncodeTiled builds. The launch layout (engine/launch.py,
engine/timing.py) places them and fills in the address of the buffer they describe."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorMap:
    """A tensor map argument (``cp.async.bulk.tensor``; isa/README.md): the 16 words describing a
    tensor of buffer argument ``of``, whose word 0 (the address of element 0) is filled in once
    the buffers are laid out, at ``of``'s address + ``offset`` bytes, as the host's
    cuTensorMapEncodeTiled takes a device pointer. Tensor maps take the first addresses of the
    layout, so they stay in the backed image of a timing run whatever follows them.
    ``tensor_map_words`` builds ``words``."""

    of: str
    words: tuple
    offset: int = 0
    nbytes: int = 128

    def array(self, address: int) -> np.ndarray:
        w = np.array(self.words, np.int64)
        w[0] = address + self.offset
        return w


def tensor_map_words(dims, elem_bytes: int, box, swizzle: int = 0, strides=None) -> tuple:
    """The 16 words of a tensor map (word 0 left 0) for a tensor of ``dims`` elements, dimension 0
    innermost; ``strides``: bytes of dimensions 1.. (default dense)."""
    m = [0] * 16
    rank = len(dims)
    m[1], m[2], m[3] = rank, elem_bytes, swizzle
    m[4:4 + rank] = [int(d) for d in dims]
    if strides is None:
        strides, s = [], elem_bytes
        for d in dims[:-1]:
            s *= int(d)
            strides.append(s)
    m[9:9 + rank - 1] = [int(s) for s in strides]
    for k, b in enumerate(box):
        if k < 4:
            m[13] |= int(b) << (16 * k)
        else:
            m[14] = int(b)
    return tuple(m)
