"""The decode step's KV-cache append for the Sunway family: the new token's K and V (columns
h..2h-1 and 2h..3h-1 of its row of qkv [b, 3h]) go into row ``pos`` of each sequence of the caches
[b, kv_len, h], as ``kvcache_gpu.kv_append_kernel`` (same API, same ``KvAppendKernel`` object and
kernel parameters), written the way a CPE moves memory: with DMA through its LDM.

Why not the GPU kernel: it launches 128-thread blocks (a CPE holds one 32-lane warp, so it cannot
run on a Sunway core) and its lanes move the row with per-lane ``ld.global`` / ``st.global``, one
request each over the ring, where a CPE moves bulk data with DMA.

grid = (batch, 2): CPE (i, 0) copies sequence i's K row, CPE (i, 1) its V row (grids larger than
the machine run in waves). The row is moved in chunks of at most ``CHUNK_MAX`` bytes: dma.get into
the LDM, dma.put to the cache, double buffered (chunk c+1's get overlaps chunk c's put).
"""

from __future__ import annotations


from archsim.errors import InputError
from archsim.isa.builder import Mem
from archsim.isa.program import Launch

from .common import ELEM_BYTES, log2, pow2_floor
from .elementwise_sunway import LdmAsm, build_checked
from .kvcache_gpu import KvAppendKernel

CHUNK_MAX = 16384             # choice: bytes per DMA (a 16 KiB transfer runs at one CPE's streaming rate)


def kv_append_kernel(caps, batch: int, kv_len: int, hidden: int, pos: int, dtype: str = "fp16") -> KvAppendKernel:
    """Copy the new tokens' K, V (from qkv [batch, 3*hidden]) into row ``pos`` of the caches."""
    for n, v in (("batch", batch), ("kv_len", kv_len), ("hidden", hidden)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise InputError("kv_append", f"{n} = {v!r}", "an integer >= 1")
    if not 0 <= pos < kv_len:
        raise InputError("kv_append", f"pos = {pos}", f"a cache row 0 .. {kv_len - 1}")
    if dtype not in ELEM_BYTES:
        raise InputError("kv_append", f"dtype {dtype!r}", ", ".join(ELEM_BYTES))
    if caps.family != "sunway" or not caps.has_dma:
        raise InputError(f"kv_append on {caps.name}", f"the Sunway KV append needs a sunway-family target with DMA, "
                         f"not {caps.family}", "a sunway-family machine (kvcache_gpu for a GPU)")
    chunk = min(CHUNK_MAX, pow2_floor(caps.scratchpad_bytes // 2))
    e = LdmAsm(f"kv_append_sw_c{chunk}", ("qkv", "k_cache", "v_cache", "row_bytes", "seq_bytes", "pos_bytes"), "fp16",
               2, 2 * chunk, caps)
    seq, kv, src, dst, rowb, t, p = e.reg(), e.reg(), e.reg(), e.reg(), e.reg(), e.reg(), e.a.pred()
    e("s2r", seq, "%ctaid.x")
    e("s2r", kv, "%ctaid.y")                  # 0: K, 1: V
    e("ldparam", rowb, "row_bytes")
    e("ldparam", src, "qkv")
    e("mul.i64", t, seq, rowb)
    e("mul.i64", t, t, 3)
    e("add.i64", src, src, t)
    e("add.i64", t, kv, 1)
    e("mul.i64", t, t, rowb)
    e("add.i64", src, src, t)                 # the source row: qkv + (3 seq + 1 + kv) * row_bytes
    e("ldparam", dst, "k_cache")
    e("ldparam", t, "v_cache")
    e("setp.ne.i64", p, kv, 0)
    e("selp.b64", dst, t, dst, p)
    e("ldparam", t, "seq_bytes")
    e("mul.i64", t, t, seq)
    e("add.i64", dst, dst, t)
    e("ldparam", t, "pos_bytes")
    e("add.i64", dst, dst, t)                 # the destination row
    e.free(seq, kv, t)
    e.a.pfree(p)
    c, nch = e.reg(), e.reg()
    e("mov.b64", c, 0)
    e("add.i64", nch, rowb, chunk - 1)
    e("shr.u64", nch, nch, log2(chunk))

    def span(cc):
        off, ln = e.reg(), e.reg()
        e("shl.b64", off, cc, log2(chunk))
        e("sub.i64", ln, rowb, off)
        e("min.i64", ln, ln, chunk)
        return off, ln

    def gets(cc, boff):
        off, ln = span(cc)
        e("add.i64", off, off, src)
        e("dma.get", Mem(boff, 0), Mem(off, 0), ln)
        e.free(off, ln)

    def puts(cc, boff):
        off, ln = span(cc)
        e("add.i64", off, off, dst)
        e("dma.put", Mem(off, 0), Mem(boff, 0), ln)
        e.free(off, ln)

    e.pipeline(c, 1, nch, chunk, gets, lambda cc, b: None, puts)
    e("exit")
    prog = build_checked(e, caps)
    return KvAppendKernel(prog, Launch((int(batch), 2, 1), (32, 1, 1), spread=True), int(batch), int(kv_len), int(hidden), int(pos),
                          dtype)


__all__ = ["kv_append_kernel", "KvAppendKernel"]
