"""Strided and broadcast DMA on tiny-sunway: ISA, functional semantics, timing.

Strided (`dma.get.s` / `dma.put.s`): `count` blocks of `bsize` bytes whose global starts are
`stride` apart, packed in the LDM; each block is split into pieces at the piece boundaries of its
own global address. Broadcast (`dma.get.bcast.row|column|array`): collective; memory is read once
when the last participant has issued, the data crosses the CPE mesh to every participant's
cluster, and each CPE's dma.wait covers its own copy.
"""

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine.dma import pieces
from archsim.engine.functional import run_functional
from archsim.engine.timing import Unbacked, buffer_addresses, time_kernel
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def launch(n):
    return Launch((n, 1, 1), (32, 1, 1))


# ----------------------------------------------------------------------------- strided
STRIDED = """.kernel k
.shared 4096
.param a
.param out
.param count
.param bsize
.param stride
.param tout
        s2r r0, %ctaid.x
        ldparam r1, a
        ldparam r2, out
        ldparam r3, count
        ldparam r4, bsize           // r4, r5: the (bsize, stride) pair
        ldparam r5, stride
        ldparam r11, tout
        mov.b64 r6, 0
        mul.i64 r7, r0, 8
        add.i64 r11, r11, r7
        s2r r8, %clock
        dma.get.s [r6], [r1], r3, r4
        dma.wait 0
        s2r r9, %clock
        sub.i64 r9, r9, r8
        st.global.b64 [r11], r9
        mul.i64 r12, r3, r4         // packed bytes: CPE i writes them back at out + i * packed
        mul.i64 r10, r0, r12
        add.i64 r2, r2, r10
        add.i64 r13, r12, 0
        mov.b64 r14, 1
        dma.put.s [r2], [r6], r14, r12
        dma.wait 0
        exit
"""


def strided_prog():
    return assemble(STRIDED, "k.s")


def numpy_strided(a, off, count, bsize, stride):
    return np.concatenate([a[off + i * stride: off + i * stride + bsize] for i in range(count)])


@pytest.mark.parametrize("count,bsize,stride", [(3, 8, 24), (4, 100, 300), (2, 128, 128), (5, 16, 8), (1, 40, 0)])
def test_strided_get_packs_blocks_as_numpy_says(sw, count, bsize, stride):
    a = np.random.default_rng(1).integers(0, 255, 4096, dtype=np.uint8)
    prog = strided_prog()
    args = {"a": a, "out": np.zeros(2 * count * bsize, np.uint8), "count": count, "bsize": bsize,
            "stride": stride, "tout": np.zeros(2, np.int64)}
    want = numpy_strided(a, 0, count, bsize, stride)
    for eng in ("numba", "reference"):
        r = run_functional(prog, args, launch(2), engine=eng)
        got = r.output("out")
        assert np.array_equal(got, np.concatenate([want, want])), eng
    t = time_kernel(prog, sw, launch(2), args)
    assert np.array_equal(t.buffers["out"], np.concatenate([want, want]))
