"""Functional semantics of every opcode, executed at issue (as GPGPU-Sim does).

``step(P, T, S, w)`` runs the next instruction of warp ``w`` (its SIMT-stack top) and returns a
status code. The functional interpreter (functional.py) loops over it; the timing engine calls
the same function at issue and times the effects. Semantics: isa/README.md. The pure-Python
twin (reference.py) implements the same text independently.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from archsim.engine.jit import njit

from archsim.engine.numerics import (bf16_to_f64, f32_bits_to_f64, f64_to_bf16, f64_to_half, fma_round_to_odd,
                                     half_to_f64)
from archsim.isa import opcodes as _opc
from archsim.isa.program import FLAG_IMM0, FLAG_NO_VALUE, FLAG_PRED_NEG

# ---- the opcode module's codes, bound to names (the engine's numba cache is keyed by a digest of
# the opcode module as well as the engine's own files: engine/jit.py)
_S, _DT, _SDT, _CMP = _opc.SEM, _opc.DT, _opc.SDT, _opc.CMP
(S_NOP, S_BRA, S_EXIT, S_BAR, S_BARGRID, S_S2R, S_LDPARAM, S_MOV, S_SELP,
 S_ADD, S_SUB, S_MUL, S_MIN, S_MAX, S_FMA, S_DIV, S_REM, S_AND, S_OR, S_XOR, S_NOT, S_SHL, S_SHR, S_SRA,
 S_SETP, S_PAND, S_POR, S_PXOR, S_PNOT, S_VOTE_ANY, S_VOTE_ALL, S_NEG, S_ABS,
 S_EX2, S_LG2, S_RCP, S_RSQRT, S_SQRT, S_TANH, S_CVT,
 S_SHFL_BFLY, S_SHFL_DOWN, S_SHFL_UP, S_SHFL_IDX,
 S_LD, S_ST, S_LDMATRIX, S_CPASYNC, S_CPCOMMIT, S_CPWAIT, S_MMA,
 S_DMA_GET, S_DMA_PUT, S_DMA_WAIT, S_RMA_PUT, S_RMA_GET, S_RMA_WAIT,
 S_WGMMA, S_WGFENCE, S_WGCOMMIT, S_WGWAIT, S_MBINIT, S_MBARRIVE, S_MBTX, S_MBWAIT, S_TMA, S_CLUSTERBAR, S_DSLD,
 S_DSST, S_MBREMOTE, S_TMASTORE, S_BKCOMMIT, S_BKWAIT) = (_S[n] for n in (
    "nop", "bra", "exit", "bar", "bargrid", "s2r", "ldparam", "mov", "selp",
    "add", "sub", "mul", "min", "max", "fma", "div", "rem", "and", "or", "xor", "not", "shl", "shr", "sra",
    "setp", "pand", "por", "pxor", "pnot", "vote_any", "vote_all", "neg", "abs",
    "ex2", "lg2", "rcp", "rsqrt", "sqrt", "tanh", "cvt",
    "shfl_bfly", "shfl_down", "shfl_up", "shfl_idx",
    "ld", "st", "ldmatrix", "cpasync", "cpcommit", "cpwait", "mma",
    "dma_get", "dma_put", "dma_wait", "rma_put", "rma_get", "rma_wait",
    "wgmma", "wgfence", "wgcommit", "wgwait", "mbinit", "mbarrive", "mbtx", "mbwait", "tma", "clusterbar", "dsld",
    "dsst", "mbremote", "tmastore", "bkcommit", "bkwait"))
DT_B, DT_I64, DT_F32, DT_F16X2, DT_BF16X2, DT_F64, DT_PRED = (
    _DT[n] for n in ("b", "i64", "f32", "f16x2", "bf16x2", "f64", "pred"))
SDT_NONE, SDT_F16, SDT_F16H, SDT_BF16, SDT_BF16H, SDT_F32, SDT_I64, SDT_F64, SDT_TF32 = (
    _SDT[n] for n in ("none", "f16", "f16h", "bf16", "bf16h", "f32", "i64", "f64", "tf32"))
C_NONE, C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE = (_CMP[n] for n in ("none", "eq", "ne", "lt", "le", "gt", "ge"))
SPACE_GLOBAL, SPACE_SHARED = _opc.SPACE_GLOBAL, _opc.SPACE_SHARED

(SP_TIDX, SP_TIDY, SP_TIDZ, SP_NTIDX, SP_NTIDY, SP_NTIDZ, SP_CTAX, SP_CTAY, SP_CTAZ,
 SP_NCTAX, SP_NCTAY, SP_NCTAZ, SP_LANE, SP_WARP, SP_NWARP, SP_CLOCK, SP_CORE, SP_WARPSIZE, SP_CRANK,
 SP_NCRANK) = range(20)

# step() results
# (ST_MBWAIT: an mbarrier.wait whose phase has not completed; the warp stays at it; ST_CBAR: barrier.cluster)
ST_OK, ST_BAR, ST_GRIDBAR, ST_EXITED, ST_MBWAIT, ST_CBAR, ST_FAULT = 0, 1, 2, 3, 4, 5, -1
# warp states (W_MBWAIT: the functional interpreter's warp at an incomplete mbarrier.wait; W_CBAR: at
# barrier.cluster)
W_RUN, W_BAR, W_GRIDBAR, W_DONE, W_MBWAIT, W_CBAR = 0, 1, 2, 3, 4, 5
# fault codes (S.fault[0])
# (F_RMA_GROUP, F_BCAST: timing runs only, raised by the memory system at issue; F_CP_GROUPS: timing
# runs only, raised by the core at cp.async.commit)
(F_NONE, F_GLOBAL_OOB, F_SHARED_OOB, F_MISALIGNED, F_RMA_CORE, F_STACK, F_WARP_WIDTH, F_BAD_OP, F_LIMIT, F_RMA_GROUP,
 F_BCAST, F_CP_GROUPS, F_SLICE, F_WARPGROUP, F_WG_ALIGN, F_MB_COUNT, F_MB_INIT, F_MB_OVER, F_MB_TX, F_MB_SLOTS,
 F_TMA_MAP, F_TMA_RANK, F_TMA_FORMAT, F_TMA_STRIDE, F_TMA_BOX, F_TMA_INNER, F_TMA_DST, F_CLUSTER_RANK,
 F_CLUSTER_GONE, F_MCAST_MASK) = range(30)
# F_MB_SLOTS: timing runs only (the core's table of live transaction barriers is full)
# F_SLICE: a timing run's write landed on the scratchpad slots it watches (engine/value_slice.py); the
# launch is timed again without the slice, never reported

# S.geom layout
(G_W, G_WPB, G_TPB, G_BX, G_BY, G_BZ, G_GX, G_GY, G_GZ, G_NBLK, G_NCORES, G_SHARED, G_GBASE, G_GSIZE, G_MODE, G_VSIZE,
 G_WATCH_LO, G_WATCH_HI, G_CLUSTER) = range(19)   # WATCH: the scratchpad bytes [LO, HI) a timing run watches
# (value_slice); CLUSTER: blocks per thread-block cluster (1: none)
G_N = 19
MODE_FUNCTIONAL, MODE_TIMING = 0, 1  # timing: integer/address values and scratchpad only (no float math)

NAN32 = np.float32(np.nan)
INT64_MAX = 9223372036854775807
INT64_MIN = -9223372036854775808


class FState(NamedTuple):
    """Functional state of every resident warp (struct of arrays)."""

    regs: np.ndarray      # int64 [NW, R, W]
    rf32: np.ndarray      # float32 view [NW, R, 2W]: lane l's f32 at 2l
    ru32: np.ndarray      # uint32 view  [NW, R, 2W]
    ru16: np.ndarray      # uint16 view  [NW, R, 4W]: lane l's halves at 4l, 4l+1
    rf64: np.ndarray      # float64 view [NW, R, W]
    preds: np.ndarray     # uint8 [NW, 8, W]
    g8: np.ndarray        # global memory views (byte offset 0 = address G_GBASE)
    g16: np.ndarray
    g32: np.ndarray
    g64: np.ndarray       # int64
    s8: np.ndarray        # scratchpads [blocks, bytes] and views
    s16: np.ndarray
    s32: np.ndarray
    s64: np.ndarray
    params: np.ndarray    # int64 [K]
    geom: np.ndarray      # int64 [16], see G_*
    warp_block: np.ndarray  # int32 [NW] launch block id of the warp in each slot
    warp_wib: np.ndarray    # int32 [NW] warp index inside its block
    warp_smem: np.ndarray   # int32 [NW] scratchpad row of its block (s8[row])
    warp_core: np.ndarray   # int32 [NW] core (SM / CPE) it runs on
    block_smem: np.ndarray  # int32 [blocks] scratchpad row of each launch block (-1: not resident)
    stack_pc: np.ndarray  # int32 [NW, D]
    stack_rpc: np.ndarray
    stack_mask: np.ndarray  # int64 [NW, D]
    sp: np.ndarray        # int32 [NW] entries on the stack
    wstate: np.ndarray    # int32 [NW]
    icount: np.ndarray    # int64 [NW] %clock: instructions issued (functional), set to the core cycle at issue (timing)
    fault: np.ndarray     # int64 [6]: code, lane, address, bytes, pc, 0
    tmp_u32: np.ndarray   # uint32 [2] scratch for bit casts
    tmp_f32: np.ndarray   # float32 view of tmp_u32
    tmp_i64: np.ndarray   # int64 [1] scratch for bit casts
    tmp_f64: np.ndarray   # float64 view of tmp_i64
    vals: np.ndarray      # int64 [W] shuffle scratch
    mat: np.ndarray       # float64 [3, 16, 256] mma / wgmma scratch (A [m, k], B [k, n], C [m, n])
    rows: np.ndarray      # uint16 [8, 8] ldmatrix scratch
    addr: np.ndarray      # int64 [NW, W] effective addresses of the last memory instruction


# ----------------------------------------------------------------------------- helpers
@njit(cache=True, inline="always")
def fault(S, code, lane, addr, nbytes, pc):
    S.fault[0] = code
    S.fault[1] = lane
    S.fault[2] = addr
    S.fault[3] = nbytes
    S.fault[4] = pc
    return ST_FAULT


@njit(cache=True)
def _f32_of_bits(S, bits):
    S.tmp_u32[0] = np.uint32(bits & 0xFFFFFFFF)
    return S.tmp_f32[0]


@njit(cache=True)
def _bits_of_f32(S, x):
    S.tmp_f32[0] = x
    return np.int64(S.tmp_u32[0])


@njit(cache=True)
def _f32_canon(x):
    if x != x:
        return NAN32
    return np.float32(x)


@njit(cache=True)
def _get_f32(S, P, w, pc, slot_reg, slot, lane, immf):
    if P.flags[pc] & (FLAG_IMM0 << slot):
        return immf
    return S.rf32[w, slot_reg, 2 * lane]


@njit(cache=True, inline="always")
def _set_f32(S, w, r, lane, x):
    S.regs[w, r, lane] = 0
    S.rf32[w, r, 2 * lane] = _f32_canon(x)


@njit(inline="always")  # per lane: a call costs more than the work
def _get_i(S, P, w, pc, slot_reg, slot, lane):
    if P.flags[pc] & (FLAG_IMM0 << slot):
        return P.imm[pc]
    return S.regs[w, slot_reg, lane]


@njit(inline="always")  # per lane: a call costs more than the work
def _get_f64(S, P, w, pc, slot_reg, slot, lane, immd):
    if P.flags[pc] & (FLAG_IMM0 << slot):
        return immd
    return S.rf64[w, slot_reg, lane]


@njit(cache=True, inline="always")
def _set_f64(S, w, r, lane, x):
    if x != x:
        x = np.nan
    S.rf64[w, r, lane] = x


@njit(cache=True, inline="always")
def _half(S, dt, h):
    """A 16-bit element of f16x2 / bf16x2 -> float64 (exact)."""
    if dt == DT_F16X2:
        return half_to_f64(h)
    return bf16_to_f64(h, S.tmp_u32, S.tmp_f32)


@njit(cache=True)
def _to_half(dt, x):
    if dt == DT_F16X2:
        return f64_to_half(x)
    return f64_to_bf16(x)


@njit(cache=True, inline="always")
def _set_halves(S, w, r, lane, lo, hi):
    S.regs[w, r, lane] = (np.int64(lo) & 0xFFFF) | ((np.int64(hi) & 0xFFFF) << 16)


@njit(cache=True)
def _fmin(a, b):
    """IEEE minNum: a NaN operand yields the other; -0 counts as below +0."""
    if a != a:
        return b
    if b != b:
        return a
    if a == b:
        return a if math.copysign(1.0, a) < 0 else b
    return a if a < b else b


@njit(cache=True)
def _fmax(a, b):
    if a != a:
        return b
    if b != b:
        return a
    if a == b:
        return b if math.copysign(1.0, a) < 0 else a
    return a if a > b else b


@njit(cache=True)
def _cmp(c, a, b):
    if c == C_EQ:
        return a == b
    if c == C_NE:
        return a != b
    if c == C_LT:
        return a < b
    if c == C_LE:
        return a <= b
    if c == C_GT:
        return a > b
    return a >= b


@njit(cache=True)
def _f_to_i64(x):
    if x != x:
        return np.int64(0)
    if x >= 9.223372036854775807e18:
        return np.int64(INT64_MAX)
    if x < -9.223372036854775808e18:
        return np.int64(INT64_MIN)
    return np.int64(math.trunc(x))


@njit(cache=True)
def _mufu(sem, x):
    """Transcendentals in float64 from an fp32 input; the caller rounds to fp32."""
    if sem == S_EX2:
        if x != x:
            return np.nan
        return 2.0 ** x
    if sem == S_LG2:
        if x != x or x < 0.0:
            return np.nan
        if x == 0.0:
            return -np.inf
        if x == np.inf:
            return np.inf
        return math.log2(x)
    if sem == S_RCP:
        if x == 0.0:
            return math.copysign(np.inf, x)
        return 1.0 / x
    if sem == S_RSQRT:
        if x != x or x < 0.0:
            return np.nan
        if x == 0.0:
            return math.copysign(np.inf, x)
        return 1.0 / math.sqrt(x)
    if sem == S_SQRT:
        if x != x or x < 0.0:
            return np.nan
        return math.sqrt(x)
    return math.tanh(x)


@njit(cache=True)
def active_mask(P, S, w, pc, mask):
    """Stack-top mask narrowed by the instruction's guard predicate."""
    p = P.pred[pc]
    if p < 0:
        return mask
    neg = (P.flags[pc] & FLAG_PRED_NEG) != 0
    W = S.geom[G_W]
    m = np.int64(0)
    for l in range(W):
        if (mask >> l) & 1:
            v = S.preds[w, p, l] != 0
            if v != neg:
                m |= np.int64(1) << l
    return m


# ----------------------------------------------------------------------------- memory
@njit(inline="always")  # per lane: a call costs more than the work
def _gcheck(S, addr, nb, lane, pc):
    """Bounds and alignment of a global access. Returns (status, byte offset); an offset of -1
    with ST_OK means a timing run's unbacked memory: reads give 0, writes are dropped."""
    off = addr - S.geom[G_GBASE]
    if off < 0 or off + nb > S.geom[G_VSIZE]:
        return fault(S, F_GLOBAL_OOB, lane, addr, nb, pc), off
    if addr & (nb - 1):                  # access sizes are powers of two (isa/opcodes.py checks)
        return fault(S, F_MISALIGNED, lane, addr, nb, pc), off
    if off + nb > S.geom[G_GSIZE]:
        return ST_OK, np.int64(-1)
    return ST_OK, off


@njit(inline="always")  # per lane: a call costs more than the work
def _scheck(S, addr, nb, lane, pc, align):
    if addr < 0 or addr + nb > S.geom[G_SHARED]:
        return fault(S, F_SHARED_OOB, lane, addr, nb, pc)
    if align and addr & (nb - 1):
        return fault(S, F_MISALIGNED, lane, addr, nb, pc)
    return ST_OK


@njit(inline="always")
def _watched(S, addr, nb):
    """A write of nb scratchpad bytes at addr lands on the slots the run watches (value_slice)."""
    return nb > 0 and addr < S.geom[G_WATCH_HI] and addr + nb > S.geom[G_WATCH_LO]


@njit(inline="always")  # per lane: a call costs more than the work
def _load(S, space, blk, off, nb, signed, w, d, lane, nd):
    """Read nb bytes at byte offset off (global: from GBASE; shared: block blk) into register d."""
    if space == SPACE_GLOBAL and off < 0:
        for j in range(nd):
            S.regs[w, d + j, lane] = 0
    elif space == SPACE_GLOBAL:
        if nd == 1:
            if nb == 1:
                v = np.int64(S.g8[off])
            elif nb == 2:
                v = np.int64(S.g16[off >> 1])
            elif nb == 4:
                v = np.int64(S.g32[off >> 2])
                if signed and v >= 2147483648:
                    v -= 4294967296
            else:
                v = S.g64[off >> 3]
            S.regs[w, d, lane] = v
        else:
            for j in range(nd):
                S.regs[w, d + j, lane] = np.int64(S.g32[(off >> 2) + j])
    else:
        if nd == 1:
            if nb == 1:
                v = np.int64(S.s8[blk, off])
            elif nb == 2:
                v = np.int64(S.s16[blk, off >> 1])
            elif nb == 4:
                v = np.int64(S.s32[blk, off >> 2])
                if signed and v >= 2147483648:
                    v -= 4294967296
            else:
                v = S.s64[blk, off >> 3]
            S.regs[w, d, lane] = v
        else:
            for j in range(nd):
                S.regs[w, d + j, lane] = np.int64(S.s32[blk, (off >> 2) + j])


@njit(inline="always")  # per lane: a call costs more than the work
def _store(S, space, blk, off, nb, w, r, lane, nr):
    if space == SPACE_GLOBAL and off < 0:
        return
    if space == SPACE_GLOBAL:
        if nr == 1:
            v = S.regs[w, r, lane]
            if nb == 1:
                S.g8[off] = np.uint8(v & 0xFF)
            elif nb == 2:
                S.g16[off >> 1] = np.uint16(v & 0xFFFF)
            elif nb == 4:
                S.g32[off >> 2] = np.uint32(v & 0xFFFFFFFF)
            else:
                S.g64[off >> 3] = v
        else:
            for j in range(nr):
                S.g32[(off >> 2) + j] = np.uint32(S.regs[w, r + j, lane] & 0xFFFFFFFF)
    else:
        if nr == 1:
            v = S.regs[w, r, lane]
            if nb == 1:
                S.s8[blk, off] = np.uint8(v & 0xFF)
            elif nb == 2:
                S.s16[blk, off >> 1] = np.uint16(v & 0xFFFF)
            elif nb == 4:
                S.s32[blk, off >> 2] = np.uint32(v & 0xFFFFFFFF)
            else:
                S.s64[blk, off >> 3] = v
        else:
            for j in range(nr):
                S.s32[blk, (off >> 2) + j] = np.uint32(S.regs[w, r + j, lane] & 0xFFFFFFFF)


@njit(inline="always")  # per lane: a call costs more than the work
def _base(S, P, w, pc, reg, lane):
    if reg < 0:
        return np.int64(0)
    return S.regs[w, reg, lane]


@njit(cache=True)
def _bulk(S, P, T, w, pc, mask, blk, sem):
    """dma.get/put (contiguous, strided, broadcast) and rma.put/get: once per warp, operands of
    the lowest active lane. Leaves the operands in S.addr[w]: 0, 1 the two addresses, 2 the bytes
    moved; DMA forms with W >= 8 also 3 count, 4 bsize, 5 stride, 6 broadcast mode."""
    W = S.geom[G_W]
    lane = 0
    while lane < W and not ((mask >> lane) & 1):
        lane += 1
    a0 = _base(S, P, w, pc, P.src0[pc], lane) + P.imm[pc]
    a1 = _base(S, P, w, pc, P.src1[pc], lane) + P.imm2[pc]
    n = S.regs[w, P.src2[pc], lane]
    op = P.op[pc]
    strided = (sem == S_DMA_GET or sem == S_DMA_PUT) and T.strided[op] != 0
    count = np.int64(1)
    bsize = n
    stride = n
    if strided:  # dma.get.s [s], [g], count, rB: rB = bsize, rB+1 = stride
        count = n
        bsize = S.regs[w, P.src3[pc], lane]
        stride = S.regs[w, P.src3[pc] + 1, lane]
        if count < 0 or bsize < 0:
            return fault(S, F_SHARED_OOB, lane, a0, count if count < 0 else bsize, pc)
        n = count * bsize
    S.addr[w, 0] = a0
    S.addr[w, 1] = a1
    S.addr[w, 2] = n
    if W >= 8:
        S.addr[w, 3] = count
        S.addr[w, 4] = bsize
        S.addr[w, 5] = stride
        S.addr[w, 6] = T.bcast[op]
    if n < 0:
        return fault(S, F_SHARED_OOB, lane, a0, n, pc)
    if sem == S_DMA_GET or sem == S_DMA_PUT:
        sh = a0 if sem == S_DMA_GET else a1
        gl = a1 if sem == S_DMA_GET else a0
        if sh < 0 or sh + n > S.geom[G_SHARED]:
            return fault(S, F_SHARED_OOB, lane, sh, n, pc)
        if sem == S_DMA_GET and _watched(S, sh, n):
            return fault(S, F_SLICE, lane, sh, n, pc)
        if n == 0:
            return ST_OK
        # the global span the blocks cover (stride may be negative or smaller than bsize)
        lo = gl
        hi = gl + bsize
        last = gl + (count - 1) * stride
        if last < lo:
            lo = last
        if last + bsize > hi:
            hi = last + bsize
        goff = lo - S.geom[G_GBASE]
        if goff < 0 or hi - S.geom[G_GBASE] > S.geom[G_VSIZE]:
            return fault(S, F_GLOBAL_OOB, lane, lo if goff < 0 else gl, hi - lo, pc)
        if hi - S.geom[G_GBASE] > S.geom[G_GSIZE]:
            return ST_OK  # a timing run's unbacked memory
        g0 = gl - S.geom[G_GBASE]
        for b in range(count):
            go = g0 + b * stride
            so = sh + b * bsize
            if sem == S_DMA_GET:
                for i in range(bsize):
                    S.s8[blk, so + i] = S.g8[go + i]
            else:
                for i in range(bsize):
                    S.g8[go + i] = S.s8[blk, so + i]
        return ST_OK
    core = S.regs[w, P.src3[pc], lane]
    if core < 0 or core >= S.geom[G_NBLK] or S.block_smem[core] < 0:
        return fault(S, F_RMA_CORE, lane, core, n, pc)
    if W >= 8:
        S.addr[w, 3] = core  # the target block (the timing model finds its CPE)
        S.addr[w, 4] = lane
    core = S.block_smem[core]
    remote = a0 if sem == S_RMA_PUT else a1
    local = a1 if sem == S_RMA_PUT else a0
    if remote < 0 or remote + n > S.geom[G_SHARED]:
        return fault(S, F_SHARED_OOB, lane, remote, n, pc)
    if local < 0 or local + n > S.geom[G_SHARED]:
        return fault(S, F_SHARED_OOB, lane, local, n, pc)
    if _watched(S, remote if sem == S_RMA_PUT else local, n):
        return fault(S, F_SLICE, lane, remote if sem == S_RMA_PUT else local, n, pc)
    if sem == S_RMA_PUT:
        for i in range(n):
            S.s8[core, remote + i] = S.s8[blk, local + i]
    else:
        for i in range(n):
            S.s8[blk, local + i] = S.s8[core, remote + i]
    return ST_OK


# ----------------------------------------------------------------------------- tensor ops
@njit(cache=True, inline="always")
def _a_frag16(S, w, a, L, dt, A):
    """Lane L's four registers from a of a 16 x 16 fp16 / bf16 A fragment (mma.m16n8k16's layout,
    isa/README.md; a .rs wgmma's A slice) into A[row, col]."""
    g = L >> 2
    t = L & 3
    for j in range(4):
        v = S.regs[w, a + j, L]
        row = g + 8 * (j & 1)
        col = 2 * t + 8 * (j >> 1)
        A[row, col] = _half(S, dt, v & 0xFFFF)
        A[row, col + 1] = _half(S, dt, (v >> 16) & 0xFFFF)


@njit(cache=True)
def _mma(S, P, T, w, pc, op, mask):
    W = S.geom[G_W]
    if W != 32:
        return fault(S, F_WARP_WIDTH, 0, W, 0, pc)
    A = S.mat[0]
    B = S.mat[1]
    C = S.mat[2]
    a = P.src0[pc]
    b = P.src1[pc]
    c = P.src2[pc]
    d = P.dst[pc]
    sdt = T.src_dtype[op]
    M = T.shape_m[op]
    N = T.shape_n[op]
    K = T.shape_k[op]
    for L in range(32):
        g = L >> 2
        t = L & 3
        if sdt == SDT_F16 or sdt == SDT_BF16:
            dt = DT_F16X2 if sdt == SDT_F16 else DT_BF16X2
            _a_frag16(S, w, a, L, dt, A)
            for j in range(2):
                v = S.regs[w, b + j, L]
                B[2 * t + 8 * j, g] = _half(S, dt, v & 0xFFFF)
                B[2 * t + 8 * j + 1, g] = _half(S, dt, (v >> 16) & 0xFFFF)
        elif sdt == SDT_TF32:
            for j in range(4):
                bits = S.regs[w, a + j, L] & 0xFFFFE000
                A[g + 8 * (j & 1), t + 4 * (j >> 1)] = float(_f32_of_bits(S, bits))
            for j in range(2):
                bits = S.regs[w, b + j, L] & 0xFFFFE000
                B[t + 4 * j, g] = float(_f32_of_bits(S, bits))
        else:  # f64 m8n8k4
            A[g, t] = S.rf64[w, a, L]
            B[t, g] = S.rf64[w, b, L]
        if sdt == SDT_F64:
            C[g, 2 * t] = S.rf64[w, c, L]
            C[g, 2 * t + 1] = S.rf64[w, c + 1, L]
        else:
            for j in range(4):
                C[g + 8 * (j >> 1), 2 * t + (j & 1)] = float(S.rf32[w, c + j, 2 * L])
    # D = A*B + C, accumulated in k order from C
    for i in range(M):
        for j in range(N):
            if sdt == SDT_F64:
                acc = C[i, j]
                for k in range(K):
                    acc = acc + A[i, k] * B[k, j]
                C[i, j] = acc
            else:
                acc32 = np.float32(C[i, j])
                for k in range(K):
                    acc32 = np.float32(acc32 + np.float32(A[i, k] * B[k, j]))
                C[i, j] = float(acc32)
    for L in range(32):
        if not ((mask >> L) & 1):
            continue
        g = L >> 2
        t = L & 3
        if sdt == SDT_F64:
            _set_f64(S, w, d, L, C[g, 2 * t])
            _set_f64(S, w, d + 1, L, C[g, 2 * t + 1])
        else:
            for j in range(4):
                _set_f32(S, w, d + j, L, np.float32(C[g + 8 * (j >> 1), 2 * t + (j & 1)]))
    return ST_OK


@njit(cache=True)
def _ldmatrix(S, P, T, w, pc, op, mask, blk):
    W = S.geom[G_W]
    if W != 32:
        return fault(S, F_WARP_WIDTH, 0, W, 0, pc)
    nm = T.matrices[op]
    trans = T.trans[op]
    d = P.dst[pc]
    R = S.rows
    values = S.geom[G_MODE] == MODE_FUNCTIONAL  # timing: the rows' addresses only (matrix data
    for i in range(nm):                         # feeds mma, which carries no values there)
        for r in range(8):
            lane = 8 * i + r
            addr = _base(S, P, w, pc, P.src0[pc], lane) + P.imm[pc]
            S.addr[w, lane] = addr
            if addr < 0 or addr + 16 > S.geom[G_SHARED]:
                return fault(S, F_SHARED_OOB, lane, addr, 16, pc)
            if addr % 16 != 0:
                return fault(S, F_MISALIGNED, lane, addr, 16, pc)
            if not values:
                continue
            for c in range(8):
                R[r, c] = S.s16[blk, (addr >> 1) + c]
        for L in range(32 if values else 0):
            if not ((mask >> L) & 1):
                continue
            if trans:
                lo = R[2 * (L & 3), L >> 2]
                hi = R[2 * (L & 3) + 1, L >> 2]
            else:
                lo = R[L >> 2, 2 * (L & 3)]
                hi = R[L >> 2, 2 * (L & 3) + 1]
            _set_halves(S, w, d + i, L, lo, hi)
    return ST_OK


# ----------------------------------------------------------------------------- warpgroup MMA
@njit(cache=True, inline="always")
def _wg_swizzle(desc):
    """The swizzle width S in bytes of a wgmma descriptor (0: none)."""
    sw = (desc >> 62) & 3
    return 0 if sw == 0 else (128 if sw == 1 else (64 if sw == 2 else 32))


@njit(cache=True, inline="always")
def _wg_rpart(lbo, sbo, sz, kmaj, r):
    """The part of element (r, k)'s logical address that depends on r (isa/README.md), for a
    descriptor's LBO, SBO and swizzle width."""
    if kmaj:
        return (r >> 3) * sbo + (r & 7) * (sz if sz else 16)
    h = sz // 2 if sz else 8
    return (r // h) * lbo + 2 * (r % h)


@njit(cache=True, inline="always")
def _wg_kpart(lbo, sbo, sz, kmaj, k):
    """The part of element (r, k)'s logical address that depends on k."""
    if kmaj:
        return 2 * k if sz else ((2 * k) >> 4) * lbo + (2 * k) % 16
    return (k >> 3) * sbo + (k & 7) * (sz if sz else 16)


@njit(cache=True, inline="always")
def _wg_phys(sz, a):
    """A logical scratchpad address of a wgmma tile -> physical (the swizzle of width sz, by
    absolute address)."""
    if sz == 0:
        return a
    return a ^ (((a >> 7) & (sz // 16 - 1)) << 4)


@njit(cache=True)
def _wg_tile(S, desc, kmaj, r0, nr, blk, pc, out, trans, values):
    """Check (and with ``values`` read) rows r0 .. r0+nr-1 x k 0..15 of a wgmma operand tile into
    out[k, i] (trans: B as [k, n]) or out[i, k]. A swizzled tile's element stays in the aligned
    S-byte row of its logical address, so a tile whose rows all lie inside the scratchpad needs no
    scan of its elements in a timing run."""
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    sz = _wg_swizzle(desc)
    if sz and ((kmaj and start % sz + 32 > sz) or (not kmaj and start % sz != 0)):
        return fault(S, F_WG_ALIGN, 0, start, sz, pc)
    shared = S.geom[G_SHARED]
    if not values:
        hi_r = 0
        for i in range(nr):
            v = _wg_rpart(lbo, sbo, sz, kmaj, r0 + i)
            if v > hi_r:
                hi_r = v
        hi_k = 0
        for k in range(16):
            v = _wg_kpart(lbo, sbo, sz, kmaj, k)
            if v > hi_k:
                hi_k = v
        top = start + hi_r + hi_k + 2
        if sz:
            top = (top + sz - 1) // sz * sz
        if top <= shared:
            return ST_OK
    for i in range(nr):
        ra = start + _wg_rpart(lbo, sbo, sz, kmaj, r0 + i)
        for k in range(16):
            a = _wg_phys(sz, ra + _wg_kpart(lbo, sbo, sz, kmaj, k))
            if a + 2 > shared:
                return fault(S, F_SHARED_OOB, 0, a, 2, pc)
            if values:
                h = S.s16[blk, a >> 1]
                if trans:
                    out[k, i] = h
                else:
                    out[i, k] = h
    return ST_OK


@njit(cache=True)
def _wgmma(S, P, T, w, pc, op, mask, blk):
    """One warp's part of a warpgroup MMA (isa/README.md): rows 16q..16q+15 of D = A*B + D, q its
    rank in the warpgroup. A timing run checks the tiles' addresses and computes nothing."""
    W = S.geom[G_W]
    if W != 32:
        return fault(S, F_WARP_WIDTH, 0, W, 0, pc)
    wib = S.warp_wib[w]
    if mask != 0xFFFFFFFF or (wib >> 2) * 4 + 3 >= S.geom[G_WPB]:
        return fault(S, F_WARPGROUP, 0, mask, 0, pc)
    q = wib & 3
    N = T.shape_n[op]
    lay = P.imm[pc]
    values = S.geom[G_MODE] == MODE_FUNCTIONAL
    A = S.mat[0]
    B = S.mat[1]
    C = S.mat[2]
    rs = T.wg_rs[op] == 1
    dt = DT_F16X2 if T.src_dtype[op] == SDT_F16 else DT_BF16X2
    if not rs:
        st = _wg_tile(S, S.regs[w, P.src0[pc], 0], (lay & 1) == 0, 16 * q, 16, blk, pc, A, False, values)
        if st != ST_OK:
            return st
    st = _wg_tile(S, S.regs[w, P.src1[pc], 0], (lay & 2) == 0, 0, N, blk, pc, B, True, values)
    if st != ST_OK or not values:
        return st
    for i in range(16):               # the tiles' raw halves -> values
        if not rs:
            for k in range(16):
                A[i, k] = _half(S, dt, np.int64(A[i, k]))
        for n in range(N):
            B[i, n] = _half(S, dt, np.int64(B[i, n]))
    a = P.src0[pc]
    d = P.dst[pc]
    for L in range(32):
        g = L >> 2
        t = L & 3
        if rs:
            _a_frag16(S, w, a, L, dt, A)
        for c in range(N >> 3):
            for j in range(4):
                C[g + 8 * (j >> 1), 8 * c + 2 * t + (j & 1)] = float(S.rf32[w, d + 4 * c + j, 2 * L])
    for i in range(16):
        for n in range(N):
            acc32 = np.float32(C[i, n])
            for k in range(16):
                acc32 = np.float32(acc32 + np.float32(A[i, k] * B[k, n]))
            C[i, n] = float(acc32)
    for L in range(32):
        g = L >> 2
        t = L & 3
        for c in range(N >> 3):
            for j in range(4):
                _set_f32(S, w, d + 4 * c + j, L, np.float32(C[g + 8 * (j >> 1), 8 * c + 2 * t + (j & 1)]))
    return ST_OK


# ----------------------------------------------------------------------------- control
@njit(cache=True, inline="always")
def _advance(S, w, top, nxt):
    """Set the top entry's pc and pop entries that reached their reconvergence point."""
    S.stack_pc[w, top] = nxt
    sp = S.sp[w]
    while sp > 0 and S.stack_rpc[w, sp - 1] >= 0 and S.stack_pc[w, sp - 1] == S.stack_rpc[w, sp - 1]:
        sp -= 1
    S.sp[w] = sp


@njit(cache=True)
def _exit_lanes(S, w, lanes):
    sp = S.sp[w]
    for e in range(sp):
        S.stack_mask[w, e] &= ~lanes
    while sp > 0 and S.stack_mask[w, sp - 1] == 0:
        sp -= 1
    S.sp[w] = sp


@njit(cache=True)
def _branch(S, P, w, pc, top, mask, taken):
    target = np.int32(P.imm[pc])
    nottaken = mask & ~taken
    if taken == 0:
        _advance(S, w, top, pc + 1)
        return ST_OK
    if nottaken == 0 or target == pc + 1:
        _advance(S, w, top, target)
        return ST_OK
    rpc = P.reconv[pc]
    D = S.stack_pc.shape[1]
    if rpc >= 0 and S.stack_rpc[w, top] == rpc:
        # the top entry already waits to reconverge at rpc (a divergent loop's next trip): the new
        # paths replace it instead of stacking a copy per iteration (GPGPU-Sim does the same)
        sp = top
    else:
        # the top entry becomes the reconvergence entry
        S.stack_pc[w, top] = rpc
        sp = top + 1
    # paths that go straight to the reconvergence point are not pushed
    if pc + 1 != rpc:
        if sp >= D:
            return fault(S, F_STACK, 0, sp, 0, pc)
        S.stack_pc[w, sp] = pc + 1
        S.stack_rpc[w, sp] = rpc
        S.stack_mask[w, sp] = nottaken
        sp += 1
    if target != rpc:
        if sp >= D:
            return fault(S, F_STACK, 0, sp, 0, pc)
        S.stack_pc[w, sp] = target
        S.stack_rpc[w, sp] = rpc
        S.stack_mask[w, sp] = taken
        sp += 1
    S.sp[w] = sp
    return ST_OK


# ----------------------------------------------------------------------------- transaction barriers, TMA
# An mbarrier is a 64-bit scratchpad word (isa/README.md): bit 0 the phase parity, bits 1-21 pending
# arrivals, bits 22-42 expected arrivals, bits 43-63 the transaction count + MB_BIAS.
MB_MAX = (1 << 20) - 1        # the largest count, byte count or |transaction count|
MB_BIAS = 1 << 20
MB_FIELD = (1 << 21) - 1
TMAP_WORDS = 16               # a tensor map: 16 int64 words, 64-byte aligned
TMA_BOX_MAX = 256             # elements in one box dimension


@njit(cache=True, inline="always")
def mb_pack(phase, pend, exp, tx):
    return phase | (pend << 1) | (exp << 22) | ((tx + MB_BIAS) << 43)


@njit(cache=True)
def mb_update(S, blk, addr, arrive, tx_add, lane, pc):
    """Add tx_add to the barrier's transaction count, then arrive (arrive: 1) or not; complete the
    phase when no arrival and no byte is pending. Returns (status, the phase the update counted
    into, 1 if it completed that phase)."""
    v = S.s64[blk, addr >> 3]
    phase = v & 1
    pend = (v >> 1) & MB_FIELD
    exp = (v >> 22) & MB_FIELD
    tx = ((v >> 43) & MB_FIELD) - MB_BIAS
    if exp == 0:
        return fault(S, F_MB_INIT, lane, addr, 0, pc), phase, 0
    tx += tx_add
    if tx > MB_MAX or tx < -MB_MAX:
        return fault(S, F_MB_TX, lane, addr, tx, pc), phase, 0
    if arrive:
        if pend == 0:
            return fault(S, F_MB_OVER, lane, addr, 0, pc), phase, 0
        pend -= 1
    done = 0
    if pend == 0 and tx == 0:
        S.s64[blk, addr >> 3] = mb_pack(phase ^ 1, exp, exp, 0)
        done = 1
    else:
        S.s64[blk, addr >> 3] = mb_pack(phase, pend, exp, tx)
    return ST_OK, phase, done


@njit(cache=True, inline="always")
def _lowest(mask, W):
    lane = 0
    while lane < W and not ((mask >> lane) & 1):
        lane += 1
    return lane


@njit(cache=True)
def _mbar(S, P, T, w, pc, mask, blk, sem):
    """mbarrier.init / arrive[.expect_tx] / expect_tx / wait: once per warp, the lowest active
    lane's operands. Leaves in S.addr[w]: 0 the barrier's address, 1 the phase the operation counted
    into (wait: the parity waited for), 2 1 if it completed that phase. ST_MBWAIT: a wait whose phase
    has not completed (the warp stays at it)."""
    if S.geom[G_W] != 32:
        return fault(S, F_WARP_WIDTH, 0, S.geom[G_W], 0, pc)
    lane = _lowest(mask, S.geom[G_W])
    addr = _base(S, P, w, pc, P.src0[pc], lane) + P.imm[pc]
    status = _scheck(S, addr, 8, lane, pc, True)
    if status != ST_OK:
        return status
    S.addr[w, 0] = addr
    S.addr[w, 2] = 0
    n = S.regs[w, P.src1[pc], lane] if P.src1[pc] >= 0 else np.int64(0)
    if sem == S_MBINIT:
        if n < 1 or n > MB_MAX:
            return fault(S, F_MB_COUNT, lane, addr, n, pc)
        S.s64[blk, addr >> 3] = mb_pack(0, n, n, 0)
        S.addr[w, 1] = 0
        return ST_OK
    v = S.s64[blk, addr >> 3]
    if (v >> 22) & MB_FIELD == 0:
        return fault(S, F_MB_INIT, lane, addr, 0, pc)
    if sem == S_MBWAIT:
        S.addr[w, 1] = n & 1
        return ST_MBWAIT if (v & 1) == (n & 1) else ST_OK
    if n < 0 or n > MB_MAX:
        return fault(S, F_MB_COUNT, lane, addr, n, pc)
    status, phase, done = mb_update(S, blk, addr, sem == S_MBARRIVE, n, lane, pc)
    S.addr[w, 1] = phase
    S.addr[w, 2] = done
    return status


@njit(cache=True)
def tma_box(S, m, rank, lane, pc, out):
    """Read and check the tensor map at global address m for a copy of `rank` dimensions into
    out[]: 0 base, 1 element bytes, 2 swizzle, 3-7 dims, 8-12 strides (8: the element size), 13-17
    box dims (1 past the rank). Returns a status (a fault names the broken rule)."""
    off = m - S.geom[G_GBASE]
    if m & 63 or off < 0 or off + TMAP_WORDS * 8 > S.geom[G_GSIZE]:
        return fault(S, F_TMA_MAP, lane, m, 0, pc)
    o = off >> 3
    if S.g64[o + 1] != rank:
        return fault(S, F_TMA_RANK, lane, S.g64[o + 1], rank, pc)
    eb = S.g64[o + 2]
    sw = S.g64[o + 3]
    if not (eb == 1 or eb == 2 or eb == 4 or eb == 8) or not (sw == 0 or sw == 32 or sw == 64 or sw == 128):
        return fault(S, F_TMA_FORMAT, lane, eb, sw, pc)
    out[0] = S.g64[o]
    out[1] = eb
    out[2] = sw
    out[8] = eb
    if out[0] & 15:
        return fault(S, F_TMA_STRIDE, lane, out[0], 0, pc)
    for k in range(5):
        if k < rank:
            d = S.g64[o + 4 + k]
            b = (S.g64[o + 13] >> (16 * k)) & 0xFFFF if k < 4 else S.g64[o + 14] & 0xFFFF
            if k > 0:
                st = S.g64[o + 8 + k]
                if st <= 0 or st & 15:
                    return fault(S, F_TMA_STRIDE, lane, st, k, pc)
                out[8 + k] = st
            if b < 1 or b > TMA_BOX_MAX or d < b:
                return fault(S, F_TMA_BOX, lane, k, b, pc)
            out[3 + k] = d
            out[13 + k] = b
        else:
            out[3 + k] = 1
            out[13 + k] = 1
            if k > 0:
                out[8 + k] = 0
    inner = out[13] * eb
    if inner & 15 or (sw > 0 and inner > sw):
        return fault(S, F_TMA_INNER, lane, inner, sw, pc)
    return ST_OK


@njit(cache=True)
def _box_at(S, bx, at, lane, pc):
    """A box (tma_box's bx) at scratchpad address `at`: (status, rows, bytes a row, bytes), the
    status a fault unless the box lies 128-byte aligned inside the scratchpad (swizzled: its
    bytes rounded up to whole 128-byte rows, within which a swizzle moves them)."""
    rows = bx[14] * bx[15] * bx[16] * bx[17]
    inner = bx[13] * bx[1]
    total = rows * inner
    extent = (total + 127) // 128 * 128 if bx[2] > 0 else total
    if at < 0 or at & 127 or at + extent > S.geom[G_SHARED]:
        return fault(S, F_TMA_DST, lane, at, total, pc), rows, inner, total
    return ST_OK, rows, inner, total


@njit(cache=True, inline="always")
def _box_row(S, w, c, rank, lane, bx, row):
    """Row `row` of a box (tma_box's bx; its coordinates in registers c ..): the global address of
    its element at dimension-0 index 0, and True when none of its coordinates of dimensions 1 .. 4
    lies outside the tensor."""
    r = row
    g = bx[0]
    for kk in range(1, 5):
        i = r % bx[13 + kk]
        r //= bx[13 + kk]
        x = (S.regs[w, c + kk, lane] if kk < rank else np.int64(0)) + i
        if x < 0 or x >= bx[3 + kk]:
            return g, False
        g += x * bx[8 + kk]
    return g, True


@njit(cache=True)
def _tma(S, P, T, w, pc, op, mask, blk):
    """cp.async.bulk.tensor.Nd[.multicast] [dst], [bar], map, coords[, mask]: once per warp, the
    lowest active lane's operands. Copies the box (zeros outside the tensor; swizzled as a wgmma
    tile) and completes its bytes on the barrier, in the issuer's scratchpad or (multicast) in that
    of each block of the cluster mask, at the same addresses. Leaves in S.addr[w]: 0 dst, 1 the
    barrier, 2 the map, 3 the phase its bytes counted into, 4 the lane, 5 1 if it completed that
    phase, 6 the box's bytes, 7 the multicast mask (0: none); multicast: 8 + r the phase counted
    into in the block of rank r, | 2 if it completed it."""
    W = S.geom[G_W]
    if W != 32:
        return fault(S, F_WARP_WIDTH, 0, W, 0, pc)
    lane = _lowest(mask, W)
    rank = T.rank[op]
    dst = _base(S, P, w, pc, P.src0[pc], lane) + P.imm[pc]
    bar = _base(S, P, w, pc, P.src1[pc], lane) + P.imm2[pc]
    m = S.regs[w, P.src2[pc], lane]
    bx = S.vals  # (scratch: 18 words; W >= 32 on a machine with a TMA unit)
    status = tma_box(S, m, rank, lane, pc, bx)
    if status != ST_OK:
        return status
    status, rows, inner, total = _box_at(S, bx, dst, lane, pc)
    if status != ST_OK:
        return status
    eb = bx[1]
    sw = bx[2]
    status = _scheck(S, bar, 8, lane, pc, True)
    if status != ST_OK:
        return status
    c = P.src3[pc]
    k = S.geom[G_CLUSTER]
    me = S.warp_block[w] % k
    first = S.warp_block[w] - me
    mc = T.multicast[op]
    msk = np.int64(1) << me
    if mc:
        msk = S.regs[w, c + rank, lane]
        if msk <= 0 or msk >> k:
            return fault(S, F_MCAST_MASK, lane, msk, k, pc)
        for r in range(k):
            if (msk >> r) & 1:
                status = _cluster_rank(S, first, r, lane, pc)
                if status != ST_OK:
                    return status
    moves = (P.flags[pc] & FLAG_NO_VALUE) == 0
    for tr in range(k):
        if not (msk >> tr) & 1:
            continue
        trow = blk if tr == me else S.block_smem[first + tr]
        for row in range(rows):
            g, row_in = _box_row(S, w, c, rank, lane, bx, row)
            x0 = S.regs[w, c, lane]
            base = dst + row * inner
            for i in range(bx[13]):
                x = x0 + i
                p = _wg_phys(sw, base + i * eb)
                inside = row_in and 0 <= x < bx[3]
                goff = np.int64(-1)
                if inside:
                    ga = g + x * eb
                    goff = ga - S.geom[G_GBASE]
                    if goff < 0 or goff + eb > S.geom[G_VSIZE]:
                        return fault(S, F_GLOBAL_OOB, lane, ga, eb, pc)
                    if goff + eb > S.geom[G_GSIZE]:
                        goff = -1                          # a timing run's unbacked memory: zeros
                if not moves:                              # (a timing run that needs none of its values)
                    if _watched(S, p, eb):
                        return fault(S, F_SLICE, lane, p, eb, pc)
                    continue
                for b in range(eb):
                    S.s8[trow, p + b] = S.g8[goff + b] if goff >= 0 else 0
    S.addr[w, 3] = 0
    S.addr[w, 5] = 0
    for tr in range(k):
        if not (msk >> tr) & 1:
            continue
        trow = blk if tr == me else S.block_smem[first + tr]
        status, phase, done = mb_update(S, trow, bar, 0, -total, lane, pc)
        if status != ST_OK:
            return status
        if tr == me:
            S.addr[w, 3] = phase
            S.addr[w, 5] = done
        if mc:
            S.addr[w, 8 + tr] = phase | (done << 1)
    S.addr[w, 0] = dst
    S.addr[w, 1] = bar
    S.addr[w, 2] = m
    S.addr[w, 4] = lane
    S.addr[w, 6] = total
    S.addr[w, 7] = msk if mc else 0
    return ST_OK


@njit(cache=True)
def _tma_store(S, P, T, w, pc, op, mask, blk):
    """cp.async.bulk.tensor.Nd.store [src], map, coords: once per warp, the lowest active lane's
    operands. Writes the box, laid out in the scratchpad as a copy would land it (swizzled by the
    map's swizzle), to the tensor at the coordinates; elements outside the tensor are not written.
    Leaves in S.addr[w]: 0 src, 2 the map, 4 the lane, 6 the box's bytes."""
    W = S.geom[G_W]
    if W != 32:
        return fault(S, F_WARP_WIDTH, 0, W, 0, pc)
    lane = _lowest(mask, W)
    rank = T.rank[op]
    src = _base(S, P, w, pc, P.src0[pc], lane) + P.imm[pc]
    m = S.regs[w, P.src1[pc], lane]
    bx = S.vals
    status = tma_box(S, m, rank, lane, pc, bx)
    if status != ST_OK:
        return status
    status, rows, inner, total = _box_at(S, bx, src, lane, pc)
    if status != ST_OK:
        return status
    eb = bx[1]
    sw = bx[2]
    c = P.src2[pc]
    moves = (P.flags[pc] & FLAG_NO_VALUE) == 0
    for row in range(rows):
        g, row_in = _box_row(S, w, c, rank, lane, bx, row)
        if not row_in:
            continue
        x0 = S.regs[w, c, lane]
        base = src + row * inner
        for i in range(bx[13]):
            x = x0 + i
            if x < 0 or x >= bx[3]:
                continue
            ga = g + x * eb
            goff = ga - S.geom[G_GBASE]
            if goff < 0 or goff + eb > S.geom[G_VSIZE]:
                return fault(S, F_GLOBAL_OOB, lane, ga, eb, pc)
            if not moves or goff + eb > S.geom[G_GSIZE]:
                continue                               # (no values, or a timing run's unbacked memory)
            p = _wg_phys(sw, base + i * eb)
            for b in range(eb):
                S.g8[goff + b] = S.s8[blk, p + b]
    S.addr[w, 0] = src
    S.addr[w, 2] = m
    S.addr[w, 4] = lane
    S.addr[w, 6] = total
    return ST_OK


@njit(cache=True)
def _mbremote(S, P, w, pc, mask):
    """mbarrier.arrive.remote [s], r: once per warp, the lowest active lane's operands; one arrival
    on the barrier at s in the scratchpad of the cluster's block of rank r. Leaves in S.addr[w]: 0
    the barrier, 1 the phase it counted into, 2 1 if it completed that phase, 3 the target block."""
    if S.geom[G_W] != 32:
        return fault(S, F_WARP_WIDTH, 0, S.geom[G_W], 0, pc)
    lane = _lowest(mask, S.geom[G_W])
    addr = _base(S, P, w, pc, P.src0[pc], lane) + P.imm[pc]
    r = S.regs[w, P.src1[pc], lane]
    k = S.geom[G_CLUSTER]
    first = S.warp_block[w] - S.warp_block[w] % k
    status = _cluster_rank(S, first, r, lane, pc)
    if status != ST_OK:
        return status
    status = _scheck(S, addr, 8, lane, pc, True)
    if status != ST_OK:
        return status
    status, phase, done = mb_update(S, S.block_smem[first + r], addr, 1, 0, lane, pc)
    S.addr[w, 0] = addr
    S.addr[w, 1] = phase
    S.addr[w, 2] = done
    S.addr[w, 3] = first + r
    return status


@njit(cache=True, inline="always")
def _block_exited(S, b):
    """Have all warps of block b exited? (The functional interpreter, which holds every block: a
    timing run unmaps a block's scratchpad when it retires.)"""
    wpb = S.geom[G_WPB]
    for v in range(b * wpb, (b + 1) * wpb):
        if S.wstate[v] != W_DONE:
            return False
    return True


@njit(cache=True)
def _cluster_rank(S, first, r, lane, pc):
    """Is rank r a block of the cluster whose first block is `first`, still running? (A fault
    names which rule it breaks.)"""
    k = S.geom[G_CLUSTER]
    if r < 0 or r >= k:
        return fault(S, F_CLUSTER_RANK, lane, r, k, pc)
    if S.block_smem[first + r] < 0 or (S.geom[G_MODE] == MODE_FUNCTIONAL and _block_exited(S, first + r)):
        return fault(S, F_CLUSTER_GONE, lane, r, k, pc)
    return ST_OK


@njit(cache=True)
def _dsmem(S, P, T, w, pc, op, mask, sem):
    """ld.dsmem / st.dsmem: per lane, the scratchpad of the cluster's block of rank r (a register:
    the last operand). Leaves in S.addr[w, l] the target block << 32 | the address (the timing
    model's)."""
    nb = T.access_bytes[op]
    k = S.geom[G_CLUSTER]
    blk = S.warp_block[w]
    first = blk - blk % k
    rr = P.src1[pc] if sem == S_DSLD else P.src2[pc]
    moves = (P.flags[pc] & FLAG_NO_VALUE) == 0
    for l in range(S.geom[G_W]):
        if not ((mask >> l) & 1):
            continue
        r = S.regs[w, rr, l]
        addr = _base(S, P, w, pc, P.src0[pc], l) + P.imm[pc]
        status = _cluster_rank(S, first, r, l, pc)
        if status != ST_OK:
            return status
        row = S.block_smem[first + r]
        status = _scheck(S, addr, nb, l, pc, True)
        if status != ST_OK:
            return status
        S.addr[w, l] = ((first + r) << 32) | addr
        if not moves:
            if sem == S_DSST and _watched(S, addr, nb):
                return fault(S, F_SLICE, l, addr, nb, pc)
            continue
        if sem == S_DSLD:
            _load(S, SPACE_SHARED, row, addr, nb, 0, w, P.dst[pc], l, T.nregs_dst[op])
        else:
            _store(S, SPACE_SHARED, row, addr, nb, w, P.src1[pc], l, T.nregs_src[op])
    return ST_OK


# ----------------------------------------------------------------------------- one instruction
@njit(cache=True)
def step(P, T, S, w):
    """Execute warp w's next instruction. Returns ST_OK, ST_BAR, ST_GRIDBAR, ST_EXITED, ST_MBWAIT
    (an mbarrier.wait whose phase is incomplete: nothing changed) or ST_FAULT."""
    top = S.sp[w] - 1
    pc = S.stack_pc[w, top]
    return step_masked(P, T, S, w, active_mask(P, S, w, pc, S.stack_mask[w, top]))


@njit(cache=True)
def step_masked(P, T, S, w, mask):
    """step, given the lanes that execute: active_mask of the warp's next instruction (a caller
    that already has it saves computing it again)."""
    top = S.sp[w] - 1
    pc = S.stack_pc[w, top]
    mask0 = S.stack_mask[w, top]
    op = P.op[pc]
    sem = T.sem[op]
    dt = T.dtype[op]
    W = S.geom[G_W]
    blk = S.warp_smem[w]  # this warp's scratchpad row
    clock_before = S.icount[w]
    S.icount[w] += 1
    d = P.dst[pc]
    s0 = P.src0[pc]
    s1 = P.src1[pc]
    s2 = P.src2[pc]

    if sem == S_BRA:
        return _branch(S, P, w, pc, top, mask0, mask)
    if sem == S_EXIT:
        _exit_lanes(S, w, mask)
        if S.sp[w] == 0:
            return ST_EXITED
        if S.sp[w] - 1 == top:  # guarded exit: the remaining lanes go on
            _advance(S, w, top, pc + 1)
        return ST_OK
    if mask == 0:  # no lane passes the guard: the instruction does nothing (no barrier arrival either)
        _advance(S, w, top, pc + 1)
        return ST_OK
    if sem == S_BAR:
        _advance(S, w, top, pc + 1)
        return ST_BAR
    if sem == S_BARGRID:
        _advance(S, w, top, pc + 1)
        return ST_GRIDBAR
    if sem == S_CLUSTERBAR:
        _advance(S, w, top, pc + 1)
        return ST_CBAR

    status = ST_OK
    if sem == S_NOP or sem == S_CPCOMMIT or sem == S_CPWAIT or sem == S_DMA_WAIT or sem == S_RMA_WAIT or \
            sem == S_WGFENCE or sem == S_WGCOMMIT or sem == S_WGWAIT or sem == S_BKCOMMIT or sem == S_BKWAIT:
        pass
    elif sem == S_WGMMA:
        status = _wgmma(S, P, T, w, pc, op, mask, blk)
    elif sem == S_MBINIT or sem == S_MBARRIVE or sem == S_MBTX or sem == S_MBWAIT:
        status = _mbar(S, P, T, w, pc, mask, blk, sem)     # (ST_MBWAIT: the warp stays at the wait)
    elif sem == S_TMA:
        status = _tma(S, P, T, w, pc, op, mask, blk)
    elif sem == S_MBREMOTE:
        status = _mbremote(S, P, w, pc, mask)
    elif sem == S_TMASTORE:
        status = _tma_store(S, P, T, w, pc, op, mask, blk)
    elif sem == S_DSLD or sem == S_DSST:
        status = _dsmem(S, P, T, w, pc, op, mask, sem)
    elif sem == S_MMA:
        if S.geom[G_MODE] == MODE_FUNCTIONAL:
            status = _mma(S, P, T, w, pc, op, mask)
    elif sem == S_LDMATRIX:
        status = _ldmatrix(S, P, T, w, pc, op, mask, blk)
    elif sem == S_DMA_GET or sem == S_DMA_PUT or sem == S_RMA_PUT or sem == S_RMA_GET:
        status = _bulk(S, P, T, w, pc, mask, blk, sem)
    elif P.flags[pc] & FLAG_NO_VALUE and sem != S_LD and sem != S_ST and sem != S_CPASYNC:
        pass  # a timing run needs none of its values (engine/value_slice.py)
    elif sem == S_VOTE_ANY or sem == S_VOTE_ALL:
        acc = sem == S_VOTE_ALL
        for l in range(W):
            if (mask >> l) & 1:
                v = S.preds[w, s0, l] != 0
                acc = (acc or v) if sem == S_VOTE_ANY else (acc and v)
        for l in range(W):
            if (mask >> l) & 1:
                S.preds[w, d, l] = 1 if acc else 0
    elif sem == S_SHFL_BFLY or sem == S_SHFL_DOWN or sem == S_SHFL_UP or sem == S_SHFL_IDX:
        for l in range(W):
            S.vals[l] = S.regs[w, s0, l]
        for l in range(W):
            if not ((mask >> l) & 1):
                continue
            b = _get_i(S, P, w, pc, s1, 1, l)
            if sem == S_SHFL_BFLY:
                src = l ^ b
            elif sem == S_SHFL_DOWN:
                src = l + b
            elif sem == S_SHFL_UP:
                src = l - b
            else:
                src = b
            S.regs[w, d, l] = S.vals[src] if 0 <= src < W else S.vals[l]
    elif sem == S_LD or sem == S_ST or sem == S_CPASYNC:
        space = T.space[op]
        nb = T.access_bytes[op]
        moves = (P.flags[pc] & FLAG_NO_VALUE) == 0   # else: the addresses and their checks only
        for l in range(W):
            if not ((mask >> l) & 1):
                continue
            addr = _base(S, P, w, pc, s0, l) + P.imm[pc]
            S.addr[w, l] = addr
            if sem == S_CPASYNC:
                gaddr = _base(S, P, w, pc, s1, l) + P.imm2[pc]
                S.addr[w, l] = gaddr  # the timing model moves the global side
                status, goff = _gcheck(S, gaddr, nb, l, pc)
                if status != ST_OK:
                    break
                status = _scheck(S, addr, nb, l, pc, True)
                if status != ST_OK:
                    break
                if not moves:
                    if _watched(S, addr, nb):
                        status = fault(S, F_SLICE, l, addr, nb, pc)
                        break
                    continue
                if (nb | addr) & 7 == 0 and goff < 0:          # unbacked source (a timing run): zeros
                    for i in range(nb >> 3):
                        S.s64[blk, (addr >> 3) + i] = 0
                elif goff >= 0 and (nb | goff | addr) & 7 == 0:  # whole aligned words (cp.async moves 4, 8, 16 B)
                    for i in range(nb >> 3):
                        S.s64[blk, (addr >> 3) + i] = S.g64[(goff >> 3) + i]
                else:
                    for i in range(nb):
                        S.s8[blk, addr + i] = S.g8[goff + i] if goff >= 0 else 0
                continue
            if space == SPACE_GLOBAL:
                status, off = _gcheck(S, addr, nb, l, pc)
            else:
                status = _scheck(S, addr, nb, l, pc, True)
                off = addr
            if status != ST_OK:
                break
            if not moves:
                if sem == S_ST and space != SPACE_GLOBAL and _watched(S, off, nb):
                    status = fault(S, F_SLICE, l, addr, nb, pc)
                    break
                continue
            if sem == S_LD:
                _load(S, space, blk, off, nb, T.signed[op], w, d, l, T.nregs_dst[op])
            else:
                _store(S, space, blk, off, nb, w, s1, l, T.nregs_src[op])
    else:
        status = _alu(P, T, S, w, pc, op, sem, dt, mask, clock_before)
    if status == ST_MBWAIT:
        S.icount[w] = clock_before      # a wait that must wait has not issued (%clock counts issues)
        return status
    if status != ST_OK:
        return status
    _advance(S, w, top, pc + 1)
    return ST_OK




@njit(cache=True)
def _special(S, w, l, code, clock_before):
    W = S.geom[G_W]
    blk = S.warp_block[w]
    wib = S.warp_wib[w]
    tid = wib * W + l
    if code == SP_TIDX:
        return tid % S.geom[G_BX]
    if code == SP_TIDY:
        return (tid // S.geom[G_BX]) % S.geom[G_BY]
    if code == SP_TIDZ:
        return tid // (S.geom[G_BX] * S.geom[G_BY])
    if code == SP_NTIDX:
        return S.geom[G_BX]
    if code == SP_NTIDY:
        return S.geom[G_BY]
    if code == SP_NTIDZ:
        return S.geom[G_BZ]
    if code == SP_CTAX:
        return blk % S.geom[G_GX]
    if code == SP_CTAY:
        return (blk // S.geom[G_GX]) % S.geom[G_GY]
    if code == SP_CTAZ:
        return blk // (S.geom[G_GX] * S.geom[G_GY])
    if code == SP_NCTAX:
        return S.geom[G_GX]
    if code == SP_NCTAY:
        return S.geom[G_GY]
    if code == SP_NCTAZ:
        return S.geom[G_GZ]
    if code == SP_LANE:
        return np.int64(l)
    if code == SP_WARP:
        return wib
    if code == SP_NWARP:
        return S.geom[G_WPB]
    if code == SP_CLOCK:
        return clock_before
    if code == SP_WARPSIZE:
        return W
    if code == SP_CRANK:
        return blk % S.geom[G_CLUSTER]
    if code == SP_NCRANK:
        return S.geom[G_CLUSTER]
    return np.int64(S.warp_core[w])


@njit(cache=True)
def _int_op(sem, a, b, c):
    """64-bit integer / bitwise ops (wrap-around)."""
    if sem == S_ADD:
        return a + b
    if sem == S_SUB:
        return a - b
    if sem == S_MUL:
        return a * b
    if sem == S_FMA:
        return a * b + c
    if sem == S_MIN:
        return a if a < b else b
    if sem == S_MAX:
        return a if a > b else b
    if sem == S_DIV or sem == S_REM:
        if b == 0:
            return np.int64(-1) if sem == S_DIV else a
        if b == -1:
            return -a if sem == S_DIV else np.int64(0)
        q = a // b  # floor; truncate toward zero without abs(), which overflows at INT64_MIN
        if q < 0 and q * b != a:
            q += 1
        return q if sem == S_DIV else a - q * b
    if sem == S_AND:
        return a & b
    if sem == S_OR:
        return a | b
    if sem == S_XOR:
        return a ^ b
    if sem == S_NOT:
        return ~a
    if sem == S_SHL:
        return a << (b & 63)
    if sem == S_SHR:
        return np.int64(np.uint64(a) >> np.uint64(b & 63))
    return a >> (b & 63)  # S_SRA


@njit(cache=True)
def _f32_op(sem, a, b, c):
    """fp32 add/sub/mul/min/max (fma goes through _fma_f32)."""
    if sem == S_ADD:
        return a + b
    if sem == S_SUB:
        return a - b
    if sem == S_MUL:
        return a * b
    if sem == S_MIN:
        return _fmin(a, b)
    return _fmax(a, b)


@njit(cache=True)
def _f64_op(sem, a, b, c):
    if sem == S_ADD:
        return a + b
    if sem == S_SUB:
        return a - b
    if sem == S_MUL:
        return a * b
    if sem == S_FMA:
        return a * b + c
    if sem == S_MIN:
        return _fmin(a, b)
    return _fmax(a, b)


@njit(cache=True)
def _half2_op(S, sem, dt, ra, rb, rc):
    """f16x2 / bf16x2: each half computed in fp32 (fma: fp64) and rounded to the half format."""
    out = np.int64(0)
    for h in range(2):
        sh = 16 * h
        x = _half(S, dt, (ra >> sh) & 0xFFFF)
        y = _half(S, dt, (rb >> sh) & 0xFFFF)
        if sem == S_FMA:
            r = fma_round_to_odd(x, y, _half(S, dt, (rc >> sh) & 0xFFFF), S.tmp_i64, S.tmp_f64)
        elif sem == S_MIN:
            r = _fmin(x, y)
        elif sem == S_MAX:
            r = _fmax(x, y)
        else:
            r = float(_f32_op(sem, np.float32(x), np.float32(y), np.float32(0.0)))
        out |= np.int64(_to_half(dt, r)) << sh
    return out




@njit(cache=True)
def _int_lanes(S, P, w, pc, sem, d, s0, s1, s2, imm, mask, W):
    """The common 64-bit integer ops over the active lanes: one loop per op (the op, the operand
    kinds and the mask test are decided once, not per lane). Same results as _int_op."""
    R = S.regs
    if sem == S_MOV:
        if P.flags[pc] & FLAG_IMM0:
            for l in range(W):
                if (mask >> l) & 1:
                    R[w, d, l] = imm
        else:
            for l in range(W):
                if (mask >> l) & 1:
                    R[w, d, l] = R[w, s0, l]
        return
    bimm = (P.flags[pc] & (FLAG_IMM0 << 1)) != 0
    for l in range(W):
        if (mask >> l) & 1:
            S.vals[l] = imm if bimm else R[w, s1, l]
    if sem == S_ADD:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] + S.vals[l]
    elif sem == S_SUB:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] - S.vals[l]
    elif sem == S_MUL:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] * S.vals[l]
    elif sem == S_FMA:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] * S.vals[l] + R[w, s2, l]
    elif sem == S_AND:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] & S.vals[l]
    elif sem == S_OR:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] | S.vals[l]
    elif sem == S_XOR:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] ^ S.vals[l]
    elif sem == S_SHL:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] << (S.vals[l] & 63)
    elif sem == S_SHR:
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = np.int64(np.uint64(R[w, s0, l]) >> np.uint64(S.vals[l] & 63))
    else:  # S_SRA
        for l in range(W):
            if (mask >> l) & 1:
                R[w, d, l] = R[w, s0, l] >> (S.vals[l] & 63)


@njit(cache=True)
def _alu(P, T, S, w, pc, op, sem, dt, mask, clock_before):
    W = S.geom[G_W]
    d = P.dst[pc]
    s0 = P.src0[pc]
    s1 = P.src1[pc]
    s2 = P.src2[pc]
    imm = P.imm[pc]
    if S.geom[G_MODE] == MODE_TIMING and sem != S_SETP and sem != S_MOV and (
            dt == DT_F32 or dt == DT_F64 or dt == DT_F16X2 or dt == DT_BF16X2):
        return ST_OK  # timing runs carry no floating-point values
    if (dt == DT_I64 or dt == DT_B) and (sem == S_ADD or sem == S_SUB or sem == S_MUL or sem == S_FMA
                                         or sem == S_AND or sem == S_OR or sem == S_XOR or sem == S_SHL
                                         or sem == S_SHR or sem == S_SRA or sem == S_MOV):
        _int_lanes(S, P, w, pc, sem, d, s0, s1, s2, imm, mask, W)
        return ST_OK
    if sem == S_SETP and (dt == DT_I64 or dt == DT_B):
        cmpc = T.cmp[op]                       # a loop's or a guard's test: the compare decided once
        bimm = (P.flags[pc] & (FLAG_IMM0 << 1)) != 0
        for l in range(W):
            if (mask >> l) & 1:
                S.preds[w, d, l] = 1 if _cmp(cmpc, S.regs[w, s0, l], imm if bimm else S.regs[w, s1, l]) else 0
        return ST_OK
    immf = _f32_of_bits(S, imm)
    S.tmp_i64[0] = imm
    immd = S.tmp_f64[0]
    cmpc = T.cmp[op]
    mufu = sem == S_EX2 or sem == S_LG2 or sem == S_RCP or sem == S_RSQRT or sem == S_SQRT or sem == S_TANH
    for l in range(W):
        if not ((mask >> l) & 1):
            continue
        if sem == S_S2R:
            S.regs[w, d, l] = _special(S, w, l, imm, clock_before)
        elif sem == S_LDPARAM:
            S.regs[w, d, l] = S.params[imm]
        elif sem == S_MOV:
            S.regs[w, d, l] = _get_i(S, P, w, pc, s0, 0, l)
        elif sem == S_SELP:
            S.regs[w, d, l] = _get_i(S, P, w, pc, s0, 0, l) if S.preds[w, s2, l] else _get_i(S, P, w, pc, s1, 1, l)
        elif sem == S_PAND:
            S.preds[w, d, l] = S.preds[w, s0, l] & S.preds[w, s1, l]
        elif sem == S_POR:
            S.preds[w, d, l] = S.preds[w, s0, l] | S.preds[w, s1, l]
        elif sem == S_PXOR:
            S.preds[w, d, l] = S.preds[w, s0, l] ^ S.preds[w, s1, l]
        elif sem == S_PNOT:
            S.preds[w, d, l] = 1 - S.preds[w, s0, l]
        elif sem == S_CVT:
            _cvt(P, T, S, w, pc, op, l)
        elif dt == DT_I64 or dt == DT_B:
            ia = S.regs[w, s0, l]
            ib = _get_i(S, P, w, pc, s1, 1, l)
            if sem == S_SETP:
                S.preds[w, d, l] = 1 if _cmp(cmpc, ia, ib) else 0
            else:
                ic = S.regs[w, s2, l] if sem == S_FMA else np.int64(0)
                S.regs[w, d, l] = _int_op(sem, ia, ib, ic)
        elif dt == DT_F32:
            if sem == S_NEG:
                S.regs[w, d, l] = (S.regs[w, s0, l] & 0xFFFFFFFF) ^ 0x80000000
            elif sem == S_ABS:
                S.regs[w, d, l] = S.regs[w, s0, l] & 0x7FFFFFFF
            elif mufu:
                _set_f32(S, w, d, l, np.float32(_mufu(sem, f32_bits_to_f64(S.regs[w, s0, l]))))
            else:
                fa = S.rf32[w, s0, 2 * l]
                fb = _get_f32(S, P, w, pc, s1, 1, l, immf)
                if sem == S_SETP:
                    S.preds[w, d, l] = 1 if _cmp(cmpc, fa, fb) else 0
                else:
                    if sem == S_FMA:
                        bb = imm if P.flags[pc] & (FLAG_IMM0 << 1) else S.regs[w, s1, l]
                        r = fma_round_to_odd(f32_bits_to_f64(S.regs[w, s0, l]), f32_bits_to_f64(bb),
                                             f32_bits_to_f64(S.regs[w, s2, l]), S.tmp_i64, S.tmp_f64)
                        _set_f32(S, w, d, l, np.float32(r))
                    else:
                        _set_f32(S, w, d, l, _f32_op(sem, fa, fb, np.float32(0.0)))
        elif dt == DT_F64:
            if sem == S_NEG:
                S.regs[w, d, l] = S.regs[w, s0, l] ^ INT64_MIN
            elif sem == S_ABS:
                S.regs[w, d, l] = S.regs[w, s0, l] & INT64_MAX
            else:
                da = S.rf64[w, s0, l]
                db = _get_f64(S, P, w, pc, s1, 1, l, immd)
                dc = S.rf64[w, s2, l] if sem == S_FMA else 0.0
                _set_f64(S, w, d, l, _f64_op(sem, da, db, dc))
        elif dt == DT_F16X2 or dt == DT_BF16X2:
            ra = S.regs[w, s0, l]
            if sem == S_NEG:
                S.regs[w, d, l] = (ra & 0xFFFFFFFF) ^ 0x80008000
            elif sem == S_ABS:
                S.regs[w, d, l] = ra & 0x7FFF7FFF
            else:
                rb = _get_i(S, P, w, pc, s1, 1, l)
                rc = S.regs[w, s2, l] if sem == S_FMA else np.int64(0)
                S.regs[w, d, l] = _half2_op(S, sem, dt, ra, rb, rc)
        else:
            return fault(S, F_BAD_OP, l, op, 0, pc)
    return ST_OK


@njit(cache=True)
def _cvt(P, T, S, w, pc, op, l):
    d = P.dst[pc]
    s0 = P.src0[pc]
    sdt = T.src_dtype[op]
    dt = T.dtype[op]
    ra = S.regs[w, s0, l]
    if dt == DT_F32:
        if sdt == SDT_F16:
            _set_f32(S, w, d, l, np.float32(half_to_f64(ra & 0xFFFF)))
        elif sdt == SDT_F16H:
            _set_f32(S, w, d, l, np.float32(half_to_f64((ra >> 16) & 0xFFFF)))
        elif sdt == SDT_BF16:
            S.regs[w, d, l] = (ra & 0xFFFF) << 16
        elif sdt == SDT_BF16H:
            S.regs[w, d, l] = ((ra >> 16) & 0xFFFF) << 16
        elif sdt == SDT_I64:
            _set_f32(S, w, d, l, np.float32(ra))
        else:  # f64
            _set_f32(S, w, d, l, np.float32(S.rf64[w, s0, l]))
    elif dt == DT_F16X2 or dt == DT_BF16X2:
        lo = float(S.rf32[w, s0, 2 * l])
        hi = float(S.rf32[w, P.src1[pc], 2 * l])
        _set_halves(S, w, d, l, _to_half(dt, lo), _to_half(dt, hi))
    elif dt == DT_I64:
        if sdt == SDT_F32:
            S.regs[w, d, l] = _f_to_i64(float(S.rf32[w, s0, 2 * l]))
        else:
            S.regs[w, d, l] = _f_to_i64(S.rf64[w, s0, l])
    else:  # f64
        if sdt == SDT_F32:
            _set_f64(S, w, d, l, float(S.rf32[w, s0, 2 * l]))
        else:
            _set_f64(S, w, d, l, float(ra))
