"""The decode step's KV-cache append for the GPU family: the new token's K and V (its row of the
fused qkv tensor [b, 3h], columns h..2h-1 and 2h..3h-1) are copied into row ``pos`` of each
sequence of the caches [b, kv_len, h], before attention reads them (a serving engine does this in
the QKV GEMM's epilogue or, as here, in a small copy kernel).

grid = (batch, 2): block (i, 0) copies sequence i's K row, block (i, 1) its V row; each thread
moves 16-byte vectors (8- / 4- / 2-byte when h's row is not a multiple of 16 bytes) with a
block-stride loop, so the program does not depend on h. Byte offsets are kernel parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.check import check
from archsim.isa.program import Launch, Program

from .common import ELEM_BYTES

THREADS = 128
_MOVE = {16: ("ld.global.v4.b32", "st.global.v4.b32"), 8: ("ld.global.v2.b32", "st.global.v2.b32"),
         4: ("ld.global.b32", "st.global.b32"), 2: ("ld.global.u16", "st.global.b16")}


def _program(width: int) -> str:
    ld, st = _MOVE[width]
    return f""".kernel kv_append_{width}
.param qkv                      // [b, 3h]: the new tokens' q, k, v
.param k_cache                  // [b, kv_len, h]
.param v_cache
.param row_bytes                // h * element bytes
.param seq_bytes                // kv_len * h * element bytes: one sequence of a cache
.param pos_bytes                // pos * h * element bytes: the row written
        s2r r0, %ctaid.x                // sequence
        s2r r1, %ctaid.y                // 0: K, 1: V
        s2r r2, %tid.x
        ldparam r3, row_bytes
        ldparam r4, qkv
        mul.i64 r5, r0, r3
        mul.i64 r5, r5, 3               // qkv row of the sequence
        add.i64 r6, r1, 1
        mul.i64 r6, r6, r3              // K at +h, V at +2h
        add.i64 r4, r4, r5
        add.i64 r4, r4, r6              // source row
        ldparam r5, k_cache
        ldparam r6, v_cache
        setp.ne.i64 p0, r1, 0
        selp.b64 r5, r6, r5, p0         // the cache this block writes
        ldparam r6, seq_bytes
        mul.i64 r6, r6, r0
        add.i64 r5, r5, r6
        ldparam r6, pos_bytes
        add.i64 r5, r5, r6              // destination row
        mul.i64 r2, r2, {width}         // byte j of the row this thread starts at
        s2r r7, %ntid.x
        mul.i64 r7, r7, {width}
        setp.ge.i64 p1, r2, r3
   @p1  bra DONE
LOOP:   add.i64 r12, r4, r2
        {ld} r8, [r12]
        add.i64 r13, r5, r2
        {st} [r13], r8
        add.i64 r2, r2, r7
        setp.lt.i64 p1, r2, r3
   @p1  bra LOOP
DONE:   exit
"""


@dataclass(frozen=True)
class KvAppendKernel:
    program: Program
    launch: Launch
    batch: int
    kv_len: int
    hidden: int
    pos: int
    dtype: str

    def buffer_bytes(self) -> dict:
        es = ELEM_BYTES[self.dtype]
        return {"qkv": self.batch * 3 * self.hidden * es, "k_cache": self.batch * self.kv_len * self.hidden * es,
                "v_cache": self.batch * self.kv_len * self.hidden * es}

    def args(self, qkv, k_cache, v_cache) -> dict:
        want = self.buffer_bytes()
        for name, v in (("qkv", qkv), ("k_cache", k_cache), ("v_cache", v_cache)):
            if int(getattr(v, "nbytes", -1)) < want[name]:
                raise InputError("kv_append", f"{name} has {getattr(v, 'nbytes', None)} bytes", f"at least {want[name]}")
        es = ELEM_BYTES[self.dtype]
        return {"qkv": qkv, "k_cache": k_cache, "v_cache": v_cache, "row_bytes": self.hidden * es,
                "seq_bytes": self.kv_len * self.hidden * es, "pos_bytes": self.pos * self.hidden * es}

    def reference(self, qkv, k_cache, v_cache) -> tuple:
        """The caches after the append (arrays of the host dtype)."""
        h = self.hidden
        q = np.asarray(qkv).reshape(self.batch, 3 * h)
        k = np.array(k_cache).reshape(self.batch, self.kv_len, h)
        v = np.array(v_cache).reshape(self.batch, self.kv_len, h)
        k[:, self.pos] = q[:, h:2 * h]
        v[:, self.pos] = q[:, 2 * h:]
        return k, v


def kv_append_kernel(caps, batch: int, kv_len: int, hidden: int, pos: int, dtype: str = "fp16") -> KvAppendKernel:
    """Copy the new tokens' K, V (from qkv [batch, 3*hidden]) into row ``pos`` of the caches."""
    for n, v in (("batch", batch), ("kv_len", kv_len), ("hidden", hidden)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise InputError("kv_append", f"{n} = {v!r}", "an integer >= 1")
    if not 0 <= pos < kv_len:
        raise InputError("kv_append", f"pos = {pos}", f"a cache row 0 .. {kv_len - 1}")
    if dtype not in ELEM_BYTES:
        raise InputError("kv_append", f"dtype {dtype!r}", ", ".join(ELEM_BYTES))
    row = hidden * ELEM_BYTES[dtype]
    width = next(w for w in (16, 8, 4, 2) if row % w == 0)
    prog = assemble(_program(width))
    check(prog, caps)
    return KvAppendKernel(prog, Launch((int(batch), 2, 1), (THREADS, 1, 1)), int(batch), int(kv_len), int(hidden),
                          int(pos), dtype)
