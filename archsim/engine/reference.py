"""The pure-Python reference interpreter: the slow twin of the numba engine (execute.py).

Written straight from isa/README.md for clarity, not speed: plain Python ints for the 64-bit
registers (kept as unsigned values 0 .. 2**64-1), per-lane loops, exact rational arithmetic where
the spec asks for a single rounding.  Differential tests run both interpreters on the same programs
and compare memory, registers, predicates and the instruction count.

Model (see the module-level constants and ``run_reference``):

* Every warp of every block is resident at once.  Warps are scheduled round-robin; each runs until
  it waits at a barrier, exits, or has issued ``QUANTUM`` instructions.
* SIMT divergence uses a PDOM reconvergence stack of ``[pc, lane mask, reconvergence pc]``
  entries.  A divergent branch turns the top entry into the reconvergence entry (pc = the
  branch's ``Program.reconv``; or, when that equals the top entry's own reconvergence pc, drops the
  top entry as GPGPU-Sim does) and pushes the fall-through path, then the taken path: the
  **taken path runs first**.  An entry is popped when it reaches its reconvergence pc or has no
  lanes left; ``exit`` removes its lanes from every entry.  Reconvergence pc -1 means "at exit".
* Warp-collective reads (shuffles, ``ldmatrix`` row addresses, ``mma`` and ``wgmma .rs`` fragments) read every lane's
  registers whether or not that lane is active; results are written to active lanes only.
* Thread-block clusters (``Launch.cluster`` = N): blocks b and b' share a cluster when
  b // N == b' // N.  ``barrier.cluster`` is ``bar.sync`` over every warp of the cluster;
  ``ld.dsmem`` / ``st.dsmem`` reach the scratchpad of the cluster's block of rank r (the lane's
  register); a multicast bulk tensor copy lands in the scratchpad of each block of its mask and
  ``mbarrier.arrive.remote`` arrives on a barrier of another block of the cluster.  Every block is
  resident, so a block "has exited" once all of its warps have.
* ``mbarrier.wait`` on a phase not yet complete does not issue: the warp stays at the wait (pc
  unchanged, no instruction counted) and the other warps run; it retries on its next turn.  When
  no warp can issue and no barrier can be released, the run is a deadlock.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np

from archsim.engine.launch import GLOBAL_BASE, FunctionalResult, build_memory, resolve_launch
from archsim.errors import InputError, SimulationError
from archsim.isa.opcodes import SPECIAL_NAMES, opcodes
from archsim.isa.program import FLAG_IMM0, FLAG_PRED_NEG, NONE, Launch, Program

__all__ = ["run_reference", "QUANTUM"]

QUANTUM = 64          # instructions a warp issues before the scheduler moves to the next warp
MASK64 = (1 << 64) - 1
MASK32 = 0xFFFFFFFF
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# binary floating-point formats: (explicit mantissa bits, exponent bits)
F16 = (10, 5)
BF16 = (7, 8)
F32 = (23, 8)

_RUN, _BAR, _GRID, _DONE = "run", "bar.sync", "bar.grid", "done"
_CLUSTER = "barrier.cluster"
_MBWAIT = "mbarrier.wait"

# transaction barriers (isa/README.md, `mbinit`): a 64-bit scratchpad word
MB_FIELD = (1 << 21) - 1     # pending arrivals (bits 1-21), expected arrivals (22-42), tx + 2^20 (43-63)
MB_BIAS = 1 << 20
MB_MAX = (1 << 20) - 1       # counts 1 .. 2^20-1, bytes 0 .. 2^20-1, |transaction count| <= 2^20-1


# ============================================================================ bit-level helpers
def _s64(v: int) -> int:
    """Signed value of the low 64 bits."""
    v &= MASK64
    return v - (1 << 64) if v >> 63 else v


def _f32_val(bits: int) -> float:
    """f32 bit pattern (low 32 bits) -> exact Python float."""
    return struct.unpack("<f", struct.pack("<I", bits & MASK32))[0]


def _f32_bits(x: float) -> int:
    """Python float -> nearest f32 (round to nearest even, overflow to inf) bit pattern.

    The C cast that struct uses is a correctly rounded IEEE conversion; CPython refuses to pack a
    finite value that rounds to infinity, which is then infinity by definition."""
    try:
        return struct.unpack("<I", struct.pack("<f", x))[0]
    except OverflowError:
        return 0xFF800000 if x < 0 else 0x7F800000


def _f32_round(x: float) -> float:
    return _f32_val(_f32_bits(x))


def _f64_val(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits & MASK64))[0]


def _f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def _fmt_to_float(h: int, fmt) -> float:
    """A small-format (f16 / bf16 / f32) bit pattern -> its exact Python float."""
    mb, eb = fmt
    sign = (h >> (mb + eb)) & 1
    e = (h >> mb) & ((1 << eb) - 1)
    m = h & ((1 << mb) - 1)
    if e == (1 << eb) - 1:
        if m == 0:
            return -math.inf if sign else math.inf
        return _f64_val((sign << 63) | (0x7FF << 52) | (m << (52 - mb)))  # NaN, payload kept
    bias = (1 << (eb - 1)) - 1
    v = math.ldexp(m, 1 - bias - mb) if e == 0 else math.ldexp(m | (1 << mb), e - bias - mb)
    return -v if sign else v


def _round_rational(q: Fraction, fmt) -> int:
    """Exact nonzero rational -> bits of the nearest value of the format (ties to even,
    subnormals, overflow to infinity)."""
    mb, eb = fmt
    sign = 1 if q < 0 else 0
    if sign:
        q = -q
    bias = (1 << (eb - 1)) - 1
    emin, emax = 1 - bias, bias
    n, d = q.numerator, q.denominator
    e = n.bit_length() - d.bit_length()          # 2^e <= q < 2^(e+2)
    if (n << max(0, -e)) < (d << max(0, e)):     # q < 2^e
        e -= 1
    if (n << max(0, -(e + 1))) >= (d << max(0, e + 1)):  # q >= 2^(e+1)
        e += 1
    e = max(e, emin)
    sh = mb - e                                  # q * 2^sh has mb+1 integer bits (normal case)
    num, den = (n << sh, d) if sh >= 0 else (n, d << -sh)
    m, rem = divmod(num, den)
    if 2 * rem > den or (2 * rem == den and m & 1):
        m += 1
    if m >> (mb + 1):                            # rounding carried into a new binade
        m >>= 1
        e += 1
    top = sign << (mb + eb)
    if e > emax:
        return top | (((1 << eb) - 1) << mb)     # infinity
    if m < (1 << mb):                            # subnormal (or zero after rounding)
        return top | m
    return top | ((e + bias) << mb) | (m - (1 << mb))


def _round_float(x: float, fmt) -> int:
    """Python float -> bits of the nearest value of fmt (round to nearest even).
    NaN keeps its sign and the top payload bits and is made quiet."""
    mb, eb = fmt
    expmask = ((1 << eb) - 1) << mb
    if x != x:
        b = _f64_bits(x)
        return ((b >> 63) << (mb + eb)) | expmask | (1 << (mb - 1)) | ((b >> (52 - mb)) & ((1 << mb) - 1))
    sign = (1 << (mb + eb)) if math.copysign(1.0, x) < 0 else 0
    if math.isinf(x):
        return sign | expmask
    if x == 0:
        return sign
    return _round_rational(Fraction(x), fmt)


def _round_int(v: int, fmt) -> int:
    """Signed integer -> nearest value of fmt (one rounding)."""
    return 0 if v == 0 else _round_rational(Fraction(v), fmt)


def _fma_bits(a: float, b: float, c: float, fmt) -> int:
    """a*b + c computed exactly and rounded once to fmt (f16 / bf16 / f32 operands)."""
    r = a * b + c  # exact product; IEEE special cases (inf, NaN, signed zero) come out right here
    if r != r or math.isinf(r) or r == 0:
        return _round_float(r, fmt)
    return _round_rational(Fraction(a) * Fraction(b) + Fraction(c), fmt)


def _fmin_bits(x: float, y: float, xb: int, yb: int, want_max: bool) -> int:
    """IEEE minNum / maxNum: a NaN operand yields the other one; -0 counts as below +0."""
    if x != x:
        return yb
    if y != y:
        return xb
    if x == y:
        # equal values: only +-0 can differ; min takes the negative zero, max the positive one
        xneg = math.copysign(1.0, x) < 0
        if want_max:
            return yb if xneg else xb
        return xb if xneg else yb
    if want_max:
        return xb if x > y else yb
    return xb if x < y else yb


def _trunc_sat(x: float) -> int:
    """Float -> i64: truncate toward zero, NaN -> 0, saturate out of range."""
    if x != x:
        return 0
    if x >= 9223372036854775808.0:
        return INT64_MAX
    if x < -9223372036854775808.0:
        return INT64_MIN
    return int(x)


# ============================================================================ the machine
class _Ins:
    """One decoded instruction."""

    __slots__ = ("pc", "opc", "sem", "dtype", "dst", "src", "imm", "imm2", "pred", "neg", "flags", "reconv")

    def __init__(self, prog: Program, pc: int):
        self.pc = pc
        self.opc = opcodes()[int(prog.op[pc])]
        self.sem = self.opc.sem
        self.dtype = self.opc.dtype
        self.dst = int(prog.dst[pc])
        self.src = (int(prog.src0[pc]), int(prog.src1[pc]), int(prog.src2[pc]), int(prog.src3[pc]))
        self.imm = int(prog.imm[pc])
        self.imm2 = int(prog.imm2[pc])
        self.pred = int(prog.pred[pc])
        self.flags = int(prog.flags[pc])
        self.neg = bool(self.flags & FLAG_PRED_NEG)
        self.reconv = int(prog.reconv[pc])


class _Warp:
    __slots__ = ("block", "widx", "gidx", "regs", "preds", "stack", "issued", "state", "wait_pc", "wait_bar")

    def __init__(self, block, widx, gidx, nregs, W, live_mask):
        self.block = block
        self.widx = widx
        self.gidx = gidx
        self.regs = [[0] * W for _ in range(nregs)]
        self.preds = [[False] * W for _ in range(8)]
        self.stack = [[0, live_mask, NONE]] if live_mask else []
        self.issued = 0
        self.state = _RUN if live_mask else _DONE
        self.wait_pc = -1
        self.wait_bar = -1    # scratchpad address of the barrier an mbarrier.wait waits on


class _Machine:
    def __init__(self, prog: Program, args: dict, launch: Launch, W: int, ncores: int, max_instructions: int):
        if W < 1:
            raise ValueError("warp_width must be positive")
        self.prog = prog
        self.launch = launch
        self.W = W
        self.ncores = max(1, int(ncores))
        self.max_instructions = int(max_instructions)
        self.memory, self.params, _ = build_memory(prog, args)
        self.gmem = bytearray(self.memory.data.tobytes())
        self.code = [_Ins(prog, pc) for pc in range(len(prog))]
        self.nblocks = launch.blocks
        self.cluster = int(launch.cluster)
        if self.cluster < 1 or launch.grid[0] % self.cluster:
            raise InputError(prog.source, f"launch cluster={launch.cluster} does not divide grid x {launch.grid[0]}",
                             "a cluster size dividing grid x")
        self.tpb = launch.threads_per_block
        self.wpb = -(-self.tpb // W)
        self.shared = [bytearray(prog.shared_bytes) for _ in range(self.nblocks)]
        self.warps = []
        for b in range(self.nblocks):
            for w in range(self.wpb):
                live = sum(1 << l for l in range(W) if w * W + l < self.tpb)
                self.warps.append(_Warp(b, w, len(self.warps), prog.nregs, W, live))
        self.total = 0

    # ------------------------------------------------------------------ results and errors
    def result(self) -> FunctionalResult:
        self.memory.data = np.frombuffer(bytes(self.gmem), dtype=np.uint8).copy()
        nw = len(self.warps)
        regs = np.zeros((nw, self.prog.nregs, self.W), np.int64)
        preds = np.zeros((nw, 8, self.W), bool)
        for w in self.warps:
            regs[w.gidx] = np.array([[_s64(v) for v in row] for row in w.regs], dtype=np.int64).reshape(
                self.prog.nregs, self.W)
            preds[w.gidx] = np.array(w.preds, dtype=bool)
        return FunctionalResult(self.memory, regs, preds, self.total, self.launch)

    def error(self, pc: int, what: str) -> SimulationError:
        return SimulationError(self.prog.where(pc), what, partial=self.result())

    def fault(self, w: _Warp, pc: int, lane: int, what: str) -> SimulationError:
        return self.error(pc, f"block {w.block} warp {w.widx} lane {lane}: {what}")

    # ------------------------------------------------------------------ scheduling
    def run(self) -> FunctionalResult:
        while True:
            progressed = False
            for w in self.warps:
                if w.state in (_RUN, _MBWAIT):
                    progressed |= self.run_warp(w)
            released = self.release_barriers()
            if all(w.state == _DONE for w in self.warps):
                return self.result()
            if not progressed and not released:
                self.deadlock()

    def run_warp(self, w: _Warp) -> bool:
        """Run the warp for up to QUANTUM instructions; True if it issued one or finished (a warp
        that only found its mbarrier.wait phase incomplete made no progress)."""
        w.state = _RUN
        start = w.issued
        for _ in range(QUANTUM):
            if not self.settle(w):
                return True
            self.step(w)
            if w.state != _RUN:
                return w.issued != start or w.state == _DONE
        self.settle(w)
        return True

    def settle(self, w: _Warp) -> bool:
        """Pop finished stack entries; mark the warp done when none is left. True if it can run."""
        st = w.stack
        n = len(self.code)
        while st:
            top = st[-1]
            if top[1] == 0 or top[0] == top[2]:
                st.pop()
            elif top[0] < 0 or top[0] >= n:
                # reconvergence "at exit" or running off the end of the program: the lanes finish
                gone = top[1]
                for e in st:
                    e[1] &= ~gone
            else:
                return True
        w.state = _DONE
        return False

    def release_barriers(self) -> bool:
        released = False
        for b in range(self.nblocks):
            ws = self.warps[b * self.wpb:(b + 1) * self.wpb]
            waiting = [w for w in ws if w.state == _BAR]
            if not waiting:
                continue
            done = [w for w in ws if w.state == _DONE]
            if done:
                v = waiting[0]
                raise self.error(v.wait_pc, f"deadlock: block {v.block} warp {v.widx} waits at bar.sync, but warp "
                                            f"{done[0].widx} of the block has exited and will never arrive")
            if len(waiting) == len(ws):
                for w in ws:
                    w.state = _RUN
                released = True
        N = self.cluster
        span = N * self.wpb                      # the warps of one cluster, block-major
        for c in range(self.nblocks // N):
            ws = self.warps[c * span:(c + 1) * span]
            waiting = [w for w in ws if w.state == _CLUSTER]
            if not waiting:
                continue
            done = [w for w in ws if w.state == _DONE]
            if done:
                v = waiting[0]
                raise self.error(v.wait_pc, f"deadlock: block {v.block} warp {v.widx} waits at barrier.cluster "
                                            f"forever; warp(s) of block(s) {sorted({d.block for d in done})} of "
                                            "the cluster already exited")
            if len(waiting) == len(ws):
                for w in ws:
                    w.state = _RUN
                released = True
        waiting = [w for w in self.warps if w.state == _GRID]
        if waiting:
            done = [w for w in self.warps if w.state == _DONE]
            if done:
                v = waiting[0]
                raise self.error(v.wait_pc, f"deadlock: block {v.block} warp {v.widx} waits at bar.grid, but block "
                                            f"{done[0].block} warp {done[0].widx} has exited and will never arrive")
            if len(waiting) == len(self.warps):
                for w in self.warps:
                    w.state = _RUN
                released = True
        return released

    def deadlock(self) -> None:
        first = next(w for w in self.warps if w.state != _DONE)
        if first.state == _MBWAIT:
            v = self._mb_read(first, first.wait_bar)
            pend, tx = (v >> 1) & MB_FIELD, ((v >> 43) & MB_FIELD) - MB_BIAS
            raise self.error(first.wait_pc, f"deadlock: block {first.block} warp {first.widx} waits at mbarrier.wait "
                                            f"forever: the barrier at scratchpad {first.wait_bar} is in phase {v & 1} "
                                            f"with {pend} arrival(s) and {tx} transaction byte(s) pending, and no "
                                            "warp left can complete it")
        v = next(w for w in self.warps if w.state in (_BAR, _GRID, _CLUSTER))
        others = sorted({f"block {w.block} warp {w.widx} at {w.state}" for w in self.warps
                         if w.state in (_BAR, _GRID, _CLUSTER, _MBWAIT) and w.state != v.state})
        extra = f" (while {others[0]})" if others else ""
        raise self.error(v.wait_pc, f"deadlock: block {v.block} warp {v.widx} waits at {v.state} and nothing can "
                                    f"make progress{extra}")

    # ------------------------------------------------------------------ one warp-instruction
    def step(self, w: _Warp) -> None:
        top = w.stack[-1]
        pc = top[0]
        ins = self.code[pc]
        if self.total >= self.max_instructions:
            raise self.error(pc, f"block {w.block} warp {w.widx}: more than {self.max_instructions} "
                                 "warp-instructions: stopped (a loop that never ends? `asm --max-instructions N` "
                                 "raises the limit; this slow engine's default is low, --engine numba's 2e8)")
        self.total += 1
        clock = w.issued
        w.issued += 1
        active = top[1]
        if ins.pred != NONE:
            p = w.preds[ins.pred]
            guard = 0
            for l in range(self.W):
                if p[l] != ins.neg:
                    guard |= 1 << l
            active &= guard
        top[0] = pc + 1
        handler = getattr(self, "op_" + ins.sem)
        handler(w, ins, active, top, clock)

    def lanes(self, mask: int):
        return [l for l in range(self.W) if (mask >> l) & 1]

    def src(self, w: _Warp, ins: _Ins, slot: int, lane: int) -> int:
        if ins.flags & (FLAG_IMM0 << slot):
            return ins.imm & MASK64
        return w.regs[ins.src[slot]][lane]

    # ------------------------------------------------------------------ control and sync
    def op_nop(self, w, ins, active, top, clock):
        pass

    op_cpcommit = op_cpwait = op_dma_wait = op_rma_wait = op_nop  # timing only

    def op_bra(self, w, ins, active, top, clock):
        pc, target = ins.pc, ins.imm
        taken = active
        fall = top[1] & ~active
        if fall == 0:
            top[0] = target
            return
        if taken == 0 or target == pc + 1:
            return
        r = ins.reconv
        if r == top[2]:
            w.stack.pop()          # the paths reconverge where this entry does
        else:
            top[0] = r             # the top entry waits at the reconvergence point (-1: at exit)
        w.stack.append([pc + 1, fall, r])
        w.stack.append([target, taken, r])   # taken path runs first
        if len(w.stack) > 2 * self.W + 2:    # cannot happen: every split has fewer lanes
            raise self.error(pc, f"block {w.block} warp {w.widx}: SIMT stack overflow")

    def op_exit(self, w, ins, active, top, clock):
        for e in w.stack:
            e[1] &= ~active

    def op_bar(self, w, ins, active, top, clock):
        if active:
            w.state, w.wait_pc = _BAR, ins.pc

    def op_bargrid(self, w, ins, active, top, clock):
        if active:
            w.state, w.wait_pc = _GRID, ins.pc

    def op_clusterbar(self, w, ins, active, top, clock):
        if active:    # a fully guarded-off barrier.cluster is no arrival
            w.state, w.wait_pc = _CLUSTER, ins.pc

    # ------------------------------------------------------------------ moves, specials, params
    def op_s2r(self, w, ins, active, top, clock):
        name = SPECIAL_NAMES[ins.imm]
        bx, by, bz = self.launch.block
        gx, gy, gz = self.launch.grid
        b = w.block
        ctaid = {"x": b % gx, "y": (b // gx) % gy, "z": b // (gx * gy)}
        for l in self.lanes(active):
            t = w.widx * self.W + l
            kind, _, axis = name.partition(".")
            if kind == "tid":
                v = {"x": t % bx, "y": (t // bx) % by, "z": t // (bx * by)}[axis]
            elif kind == "ntid":
                v = {"x": bx, "y": by, "z": bz}[axis]
            elif kind == "ctaid":
                v = ctaid[axis]
            elif kind == "nctaid":
                v = {"x": gx, "y": gy, "z": gz}[axis]
            elif name == "laneid":
                v = l
            elif name == "warpid":
                v = w.widx
            elif name == "nwarpid":
                v = self.wpb
            elif name == "clock":
                v = clock
            elif name == "coreid":
                v = b % self.ncores
            elif name == "warpsize":
                v = self.W
            elif name == "cluster_ctarank":
                v = b % self.cluster
            elif name == "cluster_nctarank":
                v = self.cluster
            else:  # pragma: no cover - the assembler rejects unknown names
                raise self.error(ins.pc, f"unknown special register {name}")
            w.regs[ins.dst][l] = v & MASK64

    def op_ldparam(self, w, ins, active, top, clock):
        v = int(self.params[ins.imm]) & MASK64
        for l in self.lanes(active):
            w.regs[ins.dst][l] = v

    def op_mov(self, w, ins, active, top, clock):
        for l in self.lanes(active):
            w.regs[ins.dst][l] = self.src(w, ins, 0, l)

    def op_selp(self, w, ins, active, top, clock):
        p = w.preds[ins.src[2]]
        for l in self.lanes(active):
            w.regs[ins.dst][l] = self.src(w, ins, 0, l) if p[l] else self.src(w, ins, 1, l)

    # ------------------------------------------------------------------ arithmetic
    def _binary(self, w, ins, active, fn):
        for l in self.lanes(active):
            w.regs[ins.dst][l] = fn(self.src(w, ins, 0, l), self.src(w, ins, 1, l)) & MASK64

    def op_add(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: self._float2(ins, "add", a, b) if ins.dtype != "i64" else a + b)

    def op_sub(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: self._float2(ins, "sub", a, b) if ins.dtype != "i64" else a - b)

    def op_mul(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: self._float2(ins, "mul", a, b) if ins.dtype != "i64" else a * b)

    def op_min(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: self._float2(ins, "min", a, b) if ins.dtype != "i64"
                     else min(_s64(a), _s64(b)))

    def op_max(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: self._float2(ins, "max", a, b) if ins.dtype != "i64"
                     else max(_s64(a), _s64(b)))

    def op_fma(self, w, ins, active, top, clock):
        for l in self.lanes(active):
            a, b, c = self.src(w, ins, 0, l), self.src(w, ins, 1, l), self.src(w, ins, 2, l)
            if ins.dtype == "i64":
                v = a * b + c
            elif ins.dtype == "f32":
                v = _fma_bits(_f32_val(a), _f32_val(b), _f32_val(c), F32)
            elif ins.dtype == "f64":
                v = _f64_bits(_f64_val(a) * _f64_val(b) + _f64_val(c))
            else:
                fmt = F16 if ins.dtype == "f16x2" else BF16
                v = 0
                for h in (0, 16):
                    x, y, z = (_fmt_to_float((s >> h) & 0xFFFF, fmt) for s in (a, b, c))
                    v |= _fma_bits(x, y, z, fmt) << h
            w.regs[ins.dst][l] = v & MASK64

    def _float2(self, ins, what, a, b):
        """Binary float op on register bit patterns a, b -> result bit pattern."""
        dt = ins.dtype
        if dt == "f64":
            x, y = _f64_val(a), _f64_val(b)
            if what in ("min", "max"):
                return _fmin_bits(x, y, a, b, what == "max")
            return _f64_bits(x + y if what == "add" else x - y if what == "sub" else x * y)
        if dt == "f32":
            x, y = _f32_val(a), _f32_val(b)
            if what in ("min", "max"):
                return _fmin_bits(x, y, a & MASK32, b & MASK32, what == "max")
            return _f32_bits(x + y if what == "add" else x - y if what == "sub" else x * y)
        fmt = F16 if dt == "f16x2" else BF16
        out = 0
        for h in (0, 16):
            ha, hb = (a >> h) & 0xFFFF, (b >> h) & 0xFFFF
            x, y = _fmt_to_float(ha, fmt), _fmt_to_float(hb, fmt)
            if what in ("min", "max"):
                r = _fmin_bits(x, y, ha, hb, what == "max")
            else:
                # computed in fp32, then rounded to the half format
                r32 = _f32_round(x + y if what == "add" else x - y if what == "sub" else x * y)
                r = _round_float(r32, fmt)
            out |= r << h
        return out

    def op_div(self, w, ins, active, top, clock):
        def div(a, b):
            a, b = _s64(a), _s64(b)
            if b == 0:
                return -1
            q = abs(a) // abs(b)
            return -q if (a < 0) != (b < 0) else q
        self._binary(w, ins, active, div)

    def op_rem(self, w, ins, active, top, clock):
        def rem(a, b):
            a, b = _s64(a), _s64(b)
            if b == 0:
                return a
            q = abs(a) // abs(b)
            q = -q if (a < 0) != (b < 0) else q
            return a - q * b
        self._binary(w, ins, active, rem)

    def op_and(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: a & b)

    def op_or(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: a | b)

    def op_xor(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: a ^ b)

    def op_not(self, w, ins, active, top, clock):
        for l in self.lanes(active):
            w.regs[ins.dst][l] = ~self.src(w, ins, 0, l) & MASK64

    def op_shl(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: a << (b & 63))

    def op_shr(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: a >> (b & 63))

    def op_sra(self, w, ins, active, top, clock):
        self._binary(w, ins, active, lambda a, b: _s64(a) >> (b & 63))

    def op_neg(self, w, ins, active, top, clock):
        self._sign_op(w, ins, active, flip=True)

    def op_abs(self, w, ins, active, top, clock):
        self._sign_op(w, ins, active, flip=False)

    def _sign_op(self, w, ins, active, flip):
        if ins.dtype == "f64":
            bit, keep = 1 << 63, MASK64
        elif ins.dtype == "f32":
            bit, keep = 1 << 31, MASK32
        else:
            bit, keep = (1 << 15) | (1 << 31), MASK32
        for l in self.lanes(active):
            a = self.src(w, ins, 0, l) & keep
            w.regs[ins.dst][l] = a ^ bit if flip else a & ~bit

    # ------------------------------------------------------------------ predicates
    def op_setp(self, w, ins, active, top, clock):
        cmp = ins.opc.cmp
        for l in self.lanes(active):
            a, b = self.src(w, ins, 0, l), self.src(w, ins, 1, l)
            if ins.dtype == "i64":
                x, y = _s64(a), _s64(b)
            else:
                x, y = _f32_val(a), _f32_val(b)
            # Python float comparisons are IEEE: false with a NaN, except !=
            r = {"eq": x == y, "ne": x != y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[cmp]
            w.preds[ins.dst][l] = r

    def _pred_op(self, w, ins, active, fn, nsrc=2):
        for l in self.lanes(active):
            a = w.preds[ins.src[0]][l]
            b = w.preds[ins.src[1]][l] if nsrc == 2 else False
            w.preds[ins.dst][l] = bool(fn(a, b))

    def op_pand(self, w, ins, active, top, clock):
        self._pred_op(w, ins, active, lambda a, b: a and b)

    def op_por(self, w, ins, active, top, clock):
        self._pred_op(w, ins, active, lambda a, b: a or b)

    def op_pxor(self, w, ins, active, top, clock):
        self._pred_op(w, ins, active, lambda a, b: a != b)

    def op_pnot(self, w, ins, active, top, clock):
        self._pred_op(w, ins, active, lambda a, b: not a, nsrc=1)

    def op_vote_any(self, w, ins, active, top, clock):
        lanes = self.lanes(active)
        r = any(w.preds[ins.src[0]][l] for l in lanes)
        for l in lanes:
            w.preds[ins.dst][l] = r

    def op_vote_all(self, w, ins, active, top, clock):
        lanes = self.lanes(active)
        r = all(w.preds[ins.src[0]][l] for l in lanes)
        for l in lanes:
            w.preds[ins.dst][l] = r

    # ------------------------------------------------------------------ MUFU (fp32 in, fp64 math)
    def _mufu(self, w, ins, active, fn):
        with np.errstate(all="ignore"):
            for l in self.lanes(active):
                x = np.float64(_f32_val(self.src(w, ins, 0, l)))
                w.regs[ins.dst][l] = _f32_bits(float(fn(x)))

    def op_ex2(self, w, ins, active, top, clock):
        self._mufu(w, ins, active, np.exp2)

    def op_lg2(self, w, ins, active, top, clock):
        self._mufu(w, ins, active, np.log2)

    def op_rcp(self, w, ins, active, top, clock):
        self._mufu(w, ins, active, lambda x: np.float64(1.0) / x)

    def op_rsqrt(self, w, ins, active, top, clock):
        self._mufu(w, ins, active, lambda x: np.float64(1.0) / np.sqrt(x))

    def op_sqrt(self, w, ins, active, top, clock):
        self._mufu(w, ins, active, np.sqrt)

    def op_tanh(self, w, ins, active, top, clock):
        self._mufu(w, ins, active, np.tanh)

    # ------------------------------------------------------------------ conversions
    def op_cvt(self, w, ins, active, top, clock):
        sd, dt = ins.opc.src_dtype, ins.dtype
        for l in self.lanes(active):
            a = self.src(w, ins, 0, l)
            if dt == "f32" and sd in ("f16", "f16h"):
                h = (a >> (16 if sd == "f16h" else 0)) & 0xFFFF
                v = _f16_to_f32_bits(h)
            elif dt == "f32" and sd in ("bf16", "bf16h"):
                v = ((a >> (16 if sd == "bf16h" else 0)) & 0xFFFF) << 16
            elif dt in ("f16x2", "bf16x2"):
                fmt = F16 if dt == "f16x2" else BF16
                b = self.src(w, ins, 1, l)
                v = _round_float(_f32_val(a), fmt) | (_round_float(_f32_val(b), fmt) << 16)
            elif dt == "f32" and sd == "i64":
                v = _round_int(_s64(a), F32)
            elif dt == "f32" and sd == "f64":
                v = _f32_bits(_f64_val(a))
            elif dt == "i64" and sd == "f32":
                v = _trunc_sat(_f32_val(a))
            elif dt == "i64" and sd == "f64":
                v = _trunc_sat(_f64_val(a))
            elif dt == "f64" and sd == "f32":
                v = _f64_bits(_f32_val(a))
            elif dt == "f64" and sd == "i64":
                v = _f64_bits(float(_s64(a)))  # int -> float is correctly rounded (ties to even)
            else:  # pragma: no cover
                raise self.error(ins.pc, f"unsupported conversion {ins.opc.mnemonic}")
            w.regs[ins.dst][l] = v & MASK64

    # ------------------------------------------------------------------ shuffles
    def _shfl(self, w, ins, active, lane_of):
        old = list(w.regs[ins.src[0]])  # every lane's value before any write
        for l in self.lanes(active):
            src = lane_of(l, _s64(self.src(w, ins, 1, l)))
            w.regs[ins.dst][l] = old[src] if 0 <= src < self.W else old[l]

    def op_shfl_bfly(self, w, ins, active, top, clock):
        self._shfl(w, ins, active, lambda l, b: l ^ b)

    def op_shfl_down(self, w, ins, active, top, clock):
        self._shfl(w, ins, active, lambda l, b: l + b)

    def op_shfl_up(self, w, ins, active, top, clock):
        self._shfl(w, ins, active, lambda l, b: l - b)

    def op_shfl_idx(self, w, ins, active, top, clock):
        self._shfl(w, ins, active, lambda l, b: b)

    # ------------------------------------------------------------------ memory
    def addr(self, w, base: int, off: int, lane: int) -> int:
        b = 0 if base == NONE else w.regs[base][lane]
        return _s64(b + off)

    def space(self, w, space: str):
        """(byte buffer, address of its first byte) of a memory space."""
        if space == "global":
            return self.gmem, GLOBAL_BASE
        return self.shared[w.block], 0

    def check(self, w, pc, lane, space, addr, n, align, what, block=None):
        """Fault unless [addr, addr+n) lies in the space and addr is aligned to `align`."""
        if space == "global":
            lo, hi = GLOBAL_BASE, GLOBAL_BASE + len(self.gmem)
            name = "global"
        else:
            lo, hi = 0, self.prog.shared_bytes
            name = "scratchpad" if block is None else f"scratchpad of block {block}"
        if addr < lo or addr + n > hi:
            raise self.fault(w, pc, lane, f"{what} of {n} bytes at {name} address {addr:#x} is outside "
                                          f"[{lo:#x}, {hi:#x})")
        if align > 1 and addr % align:
            raise self.fault(w, pc, lane, f"{what} of {n} bytes at {name} address {addr:#x} is not "
                                          f"aligned to {align} bytes")

    def op_ld(self, w, ins, active, top, clock):
        op = ins.opc
        nvec = {"R": 1, "R2": 2, "R4": 4}[op.operands[0]]
        n = op.access_bytes
        todo = []
        for l in self.lanes(active):
            a = self.addr(w, ins.src[0], ins.imm, l)
            self.check(w, ins.pc, l, op.space, a, n, n, "load")
            todo.append((l, a))
        buf, org = self.space(w, op.space)
        for l, a in todo:
            o = a - org
            if nvec == 1:
                v = int.from_bytes(buf[o:o + n], "little")
                if op.signed and v >> (8 * n - 1):
                    v -= 1 << (8 * n)
                w.regs[ins.dst][l] = v & MASK64
            else:
                for j in range(nvec):
                    w.regs[ins.dst + j][l] = int.from_bytes(buf[o + 4 * j:o + 4 * j + 4], "little")

    def op_st(self, w, ins, active, top, clock):
        op = ins.opc
        nvec = {"r": 1, "r2": 2, "r4": 4}[op.operands[1]]
        n = op.access_bytes
        todo = []
        for l in self.lanes(active):
            a = self.addr(w, ins.src[0], ins.imm, l)
            self.check(w, ins.pc, l, op.space, a, n, n, "store")
            todo.append((l, a))
        buf, org = self.space(w, op.space)
        for l, a in todo:  # lane order: with equal addresses the highest lane's value stays
            o = a - org
            if nvec == 1:
                buf[o:o + n] = (w.regs[ins.src[1]][l] & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
            else:
                for j in range(nvec):
                    buf[o + 4 * j:o + 4 * j + 4] = (w.regs[ins.src[1] + j][l] & MASK32).to_bytes(4, "little")

    # ------------------------------------------------------------------ distributed shared memory
    def block_exited(self, b: int) -> bool:
        return all(v.state == _DONE for v in self.warps[b * self.wpb:(b + 1) * self.wpb])

    def _cluster_block(self, w, ins, lane, r: int) -> int:
        """The block of cluster rank r, which must lie inside the cluster and not have exited."""
        N = self.cluster
        if not 0 <= r < N:
            raise self.fault(w, ins.pc, lane, f"distributed shared memory access to cluster rank {r}, outside the "
                                              f"cluster's {N} blocks (0 .. {N}-1)")
        b = (w.block // N) * N + r
        if self.block_exited(b):
            raise self.fault(w, ins.pc, lane, f"distributed shared memory access to cluster rank {r}, whose block "
                                              "has exited (barrier.cluster before a block exits keeps its "
                                              "scratchpad)")
        return b

    def _dsmem_lanes(self, w, ins, active, rank_slot: int, what: str):
        """[(lane, target block, scratchpad address)] of a dsmem access, each lane checked in turn:
        its rank inside the cluster, then the target block not exited, then bounds and alignment."""
        n = ins.opc.access_bytes
        todo = []
        for l in self.lanes(active):
            b = self._cluster_block(w, ins, l, _s64(w.regs[ins.src[rank_slot]][l]))
            a = self.addr(w, ins.src[0], ins.imm, l)
            self.check(w, ins.pc, l, "shared", a, n, n, what, block=b)
            todo.append((l, b, a))
        return todo

    def op_dsld(self, w, ins, active, top, clock):
        n = ins.opc.access_bytes
        nvec = {"R": 1, "R4": 4}[ins.opc.operands[0]]
        for l, b, a in self._dsmem_lanes(w, ins, active, 1, "ld.dsmem"):
            buf = self.shared[b]
            if nvec == 1:
                w.regs[ins.dst][l] = int.from_bytes(buf[a:a + n], "little")
            else:
                for j in range(nvec):
                    w.regs[ins.dst + j][l] = int.from_bytes(buf[a + 4 * j:a + 4 * j + 4], "little")

    def op_dsst(self, w, ins, active, top, clock):
        n = ins.opc.access_bytes
        nvec = {"r": 1, "r4": 4}[ins.opc.operands[1]]
        for l, b, a in self._dsmem_lanes(w, ins, active, 2, "st.dsmem"):  # lane order: the highest lane's value stays
            buf = self.shared[b]
            if nvec == 1:
                buf[a:a + n] = (w.regs[ins.src[1]][l] & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
            else:
                for j in range(nvec):
                    buf[a + 4 * j:a + 4 * j + 4] = (w.regs[ins.src[1] + j][l] & MASK32).to_bytes(4, "little")

    def op_ldmatrix(self, w, ins, active, top, clock):
        if self.W != 32:
            raise self.error(ins.pc, f"block {w.block} warp {w.widx}: ldmatrix needs warp width 32, not {self.W}")
        if not active:
            return
        nmat, trans = ins.opc.matrices, ins.opc.trans
        rows = []  # rows[i][r] = scratchpad address of row r of matrix i, given by lane 8i+r
        for i in range(nmat):
            rows.append([])
            for r in range(8):
                lane = 8 * i + r
                a = self.addr(w, ins.src[0], ins.imm, lane)
                self.check(w, ins.pc, lane, "shared", a, 16, 16, "ldmatrix row")
                rows[i].append(a)
        sh = self.shared[w.block]

        def elem(i, r, c):
            o = rows[i][r] + 2 * c
            return sh[o] | (sh[o + 1] << 8)

        for l in self.lanes(active):
            g, t = l // 4, l % 4
            for i in range(nmat):
                if trans:
                    lo, hi = elem(i, 2 * t, g), elem(i, 2 * t + 1, g)
                else:
                    lo, hi = elem(i, g, 2 * t), elem(i, g, 2 * t + 1)
                w.regs[ins.dst + i][l] = lo | (hi << 16)

    def op_cpasync(self, w, ins, active, top, clock):
        n = ins.opc.access_bytes
        todo = []
        for l in self.lanes(active):
            s = self.addr(w, ins.src[0], ins.imm, l)
            g = self.addr(w, ins.src[1], ins.imm2, l)
            self.check(w, ins.pc, l, "global", g, n, n, "cp.async read")
            self.check(w, ins.pc, l, "shared", s, n, n, "cp.async write")
            todo.append((s, g))
        sh = self.shared[w.block]
        for s, g in todo:
            o = g - GLOBAL_BASE
            sh[s:s + n] = self.gmem[o:o + n]

    def _bulk_operands(self, w, ins, active, nsrc, regs=None):
        """Operands of the lowest active lane: (lane, addr0, addr1, [registers ...]): the registers
        of source slots 2 .. 2+nsrc-1, or those named in `regs`, as signed values."""
        lane = (active & -active).bit_length() - 1
        a0 = self.addr(w, ins.src[0], ins.imm, lane)
        a1 = self.addr(w, ins.src[1], ins.imm2, lane) if regs is None else None
        if regs is None:
            regs = [ins.src[k] for k in range(2, 2 + nsrc)]
        return lane, a0, a1, [_s64(w.regs[r][lane]) for r in regs]

    def _size(self, w, ins, lane, n, what):
        if n < 0:
            raise self.fault(w, ins.pc, lane, f"{what} of a negative size {n}")

    def _dma_blocks(self, w, ins, lane, n, what):
        """(count, bsize, stride) of a DMA transfer: one block of n bytes, or the strided form's
        count = n blocks of bsize (register src3) bytes, stride (src3 + 1) bytes apart."""
        if not ins.opc.strided:
            self._size(w, ins, lane, n, what)
            return 1, n, n
        b = ins.src[3]
        bsize, stride = _s64(w.regs[b][lane]), _s64(w.regs[b + 1][lane])
        self._size(w, ins, lane, n, what)
        self._size(w, ins, lane, bsize, what)
        return n, bsize, stride

    def _dma(self, w, ins, active, get):
        if not active:
            return
        what = ins.opc.mnemonic
        lane, a0, a1, (n,) = self._bulk_operands(w, ins, active, 1)
        s, g = (a0, a1) if get else (a1, a0)
        count, bsize, stride = self._dma_blocks(w, ins, lane, n, what)
        total = count * bsize
        self.check(w, ins.pc, lane, "shared", s, total, 1, what + (" write" if get else " read"))
        if total == 0:
            return
        lo, hi = min(g, g + (count - 1) * stride), max(g, g + (count - 1) * stride) + bsize
        self.check(w, ins.pc, lane, "global", lo, hi - lo, 1, what + (" read" if get else " write"))
        sh = self.shared[w.block]
        for b in range(count):
            o = g + b * stride - GLOBAL_BASE
            t = s + b * bsize
            if get:
                sh[t:t + bsize] = self.gmem[o:o + bsize]
            else:
                self.gmem[o:o + bsize] = sh[t:t + bsize]

    def op_dma_get(self, w, ins, active, top, clock):
        """dma.get[.s][.bcast.MODE]: a broadcast is collective (every participant issues the same
        one), so each participant's own scratchpad receives the data, as a plain get."""
        self._dma(w, ins, active, get=True)

    def op_dma_put(self, w, ins, active, top, clock):
        self._dma(w, ins, active, get=False)

    def _rma(self, w, ins, active, put):
        if not active:
            return
        what = "rma.put" if put else "rma.get"
        lane, a0, a1, (n, core) = self._bulk_operands(w, ins, active, 2)
        remote, local = (a0, a1) if put else (a1, a0)
        if not 0 <= core < self.nblocks:
            raise self.fault(w, ins.pc, lane, f"{what} to block {core}, which does not exist "
                                              f"(the launch has blocks 0..{self.nblocks - 1})")
        self._size(w, ins, lane, n, what)
        self.check(w, ins.pc, lane, "shared", local, n, 1, f"{what} local access")
        self.check(w, ins.pc, lane, "shared", remote, n, 1, f"{what} remote access", block=core)
        mine, theirs = self.shared[w.block], self.shared[core]
        if put:
            theirs[remote:remote + n] = bytes(mine[local:local + n])
        else:
            mine[local:local + n] = bytes(theirs[remote:remote + n])

    def op_rma_put(self, w, ins, active, top, clock):
        self._rma(w, ins, active, put=True)

    def op_rma_get(self, w, ins, active, top, clock):
        self._rma(w, ins, active, put=False)

    # ------------------------------------------------------------------ transaction barriers and TMA
    def _mb_addr(self, w, ins, lane, addr):
        """A barrier operand: 8 bytes, 8-byte aligned, inside the scratchpad (as an 8-byte ld.shared)."""
        self.check(w, ins.pc, lane, "shared", addr, 8, 8, f"{ins.opc.mnemonic} barrier access")

    def _mb_read(self, w, addr, block=None) -> int:
        return int.from_bytes(self.shared[w.block if block is None else block][addr:addr + 8], "little")

    def _mb_write(self, w, addr, v, block=None) -> None:
        self.shared[w.block if block is None else block][addr:addr + 8] = (v & MASK64).to_bytes(8, "little")

    def _mb_fields(self, v):
        """(parity, pending arrivals, expected arrivals, transaction count) of a barrier word."""
        return v & 1, (v >> 1) & MB_FIELD, (v >> 22) & MB_FIELD, ((v >> 43) & MB_FIELD) - MB_BIAS

    def _mb_init_check(self, w, ins, lane, addr, expected):
        if expected == 0:
            raise self.fault(w, ins.pc, lane, f"mbarrier at scratchpad {addr} is not initialised (mbarrier.init "
                             "first)")

    def _mb_bytes(self, w, ins, lane, addr, n, lo):
        if not lo <= n <= MB_MAX:
            raise self.fault(w, ins.pc, lane, f"mbarrier at scratchpad {addr}: count {n} out of range (arrivals "
                             "1 .. 2^20-1, bytes 0 .. 2^20-1)")

    def _mb_update(self, w, ins, lane, addr, tx_delta, arrive, block=None):
        """Add tx_delta bytes to the transaction count, then (arrive) one arrival; the phase
        completes when pending arrivals and the transaction count are both 0 (block: the
        barrier's block, the warp's own by default)."""
        parity, pend, expected, tx = self._mb_fields(self._mb_read(w, addr, block))
        self._mb_init_check(w, ins, lane, addr, expected)
        tx += tx_delta
        if abs(tx) > MB_MAX:
            raise self.fault(w, ins.pc, lane, f"mbarrier at scratchpad {addr}: transaction count {tx} leaves "
                             "-(2^20-1) .. 2^20-1")
        if arrive:
            if pend == 0:
                raise self.fault(w, ins.pc, lane, f"mbarrier at scratchpad {addr}: an arrival with none pending "
                                 "(more arrivals than mbarrier.init expects in one phase)")
            pend -= 1
        if pend == 0 and tx == 0:
            parity ^= 1
            pend = expected
        self._mb_write(w, addr, parity | (pend << 1) | (expected << 22) | ((tx + MB_BIAS) << 43), block)

    def _needs_32(self, w, ins):
        if self.W != 32:
            raise self.error(ins.pc, f"block {w.block} warp {w.widx}: {ins.opc.mnemonic} needs warp width 32, "
                             f"not {self.W}")

    def op_mbinit(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        lane, addr, _, (count,) = self._bulk_operands(w, ins, active, 0, regs=(ins.src[1],))
        self._mb_addr(w, ins, lane, addr)
        self._mb_bytes(w, ins, lane, addr, count, 1)
        self._mb_write(w, addr, (count << 1) | (count << 22) | (MB_BIAS << 43))

    def op_mbarrive(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        with_tx = len(ins.opc.operands) == 2
        lane, addr, _, regs = self._bulk_operands(w, ins, active, 0, regs=(ins.src[1],) if with_tx else ())
        self._mb_addr(w, ins, lane, addr)
        self._mb_init_check(w, ins, lane, addr, self._mb_fields(self._mb_read(w, addr))[2])
        n = regs[0] if with_tx else 0
        self._mb_bytes(w, ins, lane, addr, n, 0)
        self._mb_update(w, ins, lane, addr, n, arrive=True)

    def op_mbtx(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        lane, addr, _, (n,) = self._bulk_operands(w, ins, active, 0, regs=(ins.src[1],))
        self._mb_addr(w, ins, lane, addr)
        self._mb_init_check(w, ins, lane, addr, self._mb_fields(self._mb_read(w, addr))[2])
        self._mb_bytes(w, ins, lane, addr, n, 0)
        self._mb_update(w, ins, lane, addr, n, arrive=False)

    def op_mbwait(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        lane, addr, _, (p,) = self._bulk_operands(w, ins, active, 0, regs=(ins.src[1],))
        self._mb_addr(w, ins, lane, addr)
        parity, _, expected, _ = self._mb_fields(self._mb_read(w, addr))
        self._mb_init_check(w, ins, lane, addr, expected)
        if parity == (p & 1):
            # the phase of that parity is still running: the wait does not issue; retry later
            self.total -= 1
            w.issued -= 1
            top[0] = ins.pc
            w.state, w.wait_pc, w.wait_bar = _MBWAIT, ins.pc, addr

    def _tma_box(self, w, ins, lane, m, N, at):
        """The tensor map at global address m and its box at scratchpad address `at`, checked:
        (base, element bytes, swizzle, dims, strides in bytes, box dims, box bytes)."""
        def bad(text):
            return self.fault(w, ins.pc, lane, text)

        # the tensor map: 16 words, 64-byte aligned, inside global memory
        if m % 64 or m < GLOBAL_BASE or m + 128 > GLOBAL_BASE + len(self.gmem):
            raise bad(f"tensor map at {m:#x} is not 64-byte aligned inside a backed global buffer of 128 bytes")
        o = m - GLOBAL_BASE
        word = [_s64(int.from_bytes(self.gmem[o + 8 * i:o + 8 * i + 8], "little")) for i in range(16)]
        base, rank, eb, S = word[0], word[1], word[2], word[3]
        if rank != N:
            raise bad(f"tensor map rank {rank} for a {N}-d copy (the rank equals the instruction's)")
        if eb not in (1, 2, 4, 8) or S not in (0, 32, 64, 128):
            raise bad(f"tensor map element size {eb} or swizzle {S} not allowed (element 1, 2, 4 or 8 bytes; "
                      "swizzle 0, 32, 64 or 128)")
        if base % 16:
            raise bad(f"tensor map base or stride {base} (dimension 0; 0: the base) is not a multiple of 16 bytes "
                      "(strides: positive)")
        dims = word[4:9]
        strides = [eb] + word[9:13]                          # bytes between consecutive elements of dim k
        box = [(word[13] >> (16 * k)) & 0xFFFF for k in range(4)] + [word[14] & 0xFFFF]
        for k in range(N):
            if k >= 1 and (strides[k] <= 0 or strides[k] % 16):
                raise bad(f"tensor map base or stride {strides[k]} (dimension {k}; 0: the base) is not a multiple "
                          "of 16 bytes (strides: positive)")
            if not 1 <= box[k] <= 256 or box[k] > dims[k]:
                raise bad(f"TMA box dimension {k} of {box[k]} elements: 1 .. 256 and at most the tensor's")
        inner = box[0] * eb
        if inner % 16 or (S and inner > S):
            raise bad(f"TMA box inner row of {inner} bytes: a multiple of 16, at most the swizzle ({S} bytes; "
                      "0: none)")
        nel = 1
        for k in range(N):
            nel *= box[k]
        total = nel * eb
        extent = -(-total // 128) * 128 if S else total       # a swizzle moves bytes within 128-byte rows
        if at % 128 or at < 0 or at + extent > self.prog.shared_bytes:
            raise bad(f"TMA box of {total} bytes at scratchpad {at}: 128-byte aligned, inside the block's "
                      f"{self.prog.shared_bytes} bytes (swizzled: rounded up to 128)")
        return base, eb, S, dims, strides, box, total

    def op_tma(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        N = ins.opc.rank
        lane, dst, bar, _ = self._bulk_operands(w, ins, active, 0)
        m = _s64(w.regs[ins.src[2]][lane])
        coords = [_s64(w.regs[ins.src[3] + k][lane]) for k in range(N)]

        def bad(text):
            return self.fault(w, ins.pc, lane, text)

        base, eb, S, dims, strides, box, total = self._tma_box(w, ins, lane, m, N, dst)
        nel = total // eb
        self._mb_addr(w, ins, lane, bar)
        targets = [w.block]
        if ins.opc.multicast:        # the cluster mask: the register after the coordinates
            K = self.cluster
            msk = _s64(w.regs[ins.src[3] + N][lane])
            if msk <= 0 or msk >> K:
                raise bad(f"TMA multicast mask {msk:#x} names no block or a rank outside the cluster's {K} blocks "
                          f"(a non-zero mask of bits 0 .. {K}-1)")
            targets = [self._cluster_block(w, ins, lane, r) for r in range(K) if msk >> r & 1]
        # the copy: box element (i0, .., iN-1) lands densely (dimension 0 innermost), then swizzled
        data = bytearray(total)
        idx = [0] * N
        for e in range(nel):
            r = e
            for k in range(N):
                r, idx[k] = divmod(r, box[k])
            inside = all(0 <= coords[k] + idx[k] < dims[k] for k in range(N))
            if inside:
                g = base + sum((coords[k] + idx[k]) * strides[k] for k in range(N))
                self.check(w, ins.pc, lane, "global", g, eb, 1, f"{ins.opc.mnemonic} read")
                data[e * eb:e * eb + eb] = self.gmem[g - GLOBAL_BASE:g - GLOBAL_BASE + eb]
        for b in targets:
            sh = self.shared[b]
            for c in range(0, total, 16):    # 16-byte chunks (rows are multiples of 16 bytes): the swizzle's unit
                a = dst + c
                if S:
                    a ^= ((a >> 7) & (S // 16 - 1)) << 4
                sh[a:a + 16] = data[c:c + 16]
        for b in targets:
            self._mb_update(w, ins, lane, bar, -total, arrive=False, block=b)

    def op_tmastore(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        N = ins.opc.rank
        lane = (active & -active).bit_length() - 1
        src = self.addr(w, ins.src[0], ins.imm, lane)
        m = _s64(w.regs[ins.src[1]][lane])
        coords = [_s64(w.regs[ins.src[2] + k][lane]) for k in range(N)]
        base, eb, S, dims, strides, box, total = self._tma_box(w, ins, lane, m, N, src)
        sh = self.shared[w.block]
        data = bytearray(total)           # the box as it lies in the scratchpad, unswizzled
        for c in range(0, total, 16):
            a = src + c
            if S:
                a ^= ((a >> 7) & (S // 16 - 1)) << 4
            data[c:c + 16] = sh[a:a + 16]
        idx = [0] * N
        for e in range(total // eb):      # element (i0, .., iN-1): written only inside the tensor
            r = e
            for k in range(N):
                r, idx[k] = divmod(r, box[k])
            if all(0 <= coords[k] + idx[k] < dims[k] for k in range(N)):
                g = base + sum((coords[k] + idx[k]) * strides[k] for k in range(N))
                self.check(w, ins.pc, lane, "global", g, eb, 1, f"{ins.opc.mnemonic} write")
                self.gmem[g - GLOBAL_BASE:g - GLOBAL_BASE + eb] = data[e * eb:e * eb + eb]

    def op_bkcommit(self, w, ins, active, top, clock):
        pass                              # bulk stores complete at issue here

    def op_bkwait(self, w, ins, active, top, clock):
        pass

    def op_mbremote(self, w, ins, active, top, clock):
        self._needs_32(w, ins)
        if not active:
            return
        lane, addr, _, (r,) = self._bulk_operands(w, ins, active, 0, regs=(ins.src[1],))
        b = self._cluster_block(w, ins, lane, r)
        self._mb_addr(w, ins, lane, addr)
        self._mb_update(w, ins, lane, addr, 0, arrive=True, block=b)

    # ------------------------------------------------------------------ tensor (mma)
    def op_mma(self, w, ins, active, top, clock):
        if self.W != 32:
            raise self.error(ins.pc, f"block {w.block} warp {w.widx}: mma needs warp width 32, not {self.W}")
        if not active:
            return
        M, N, K = ins.opc.shape
        sd = ins.opc.src_dtype
        ra, rb, rc = ins.src[0], ins.src[1], ins.src[2]
        R = w.regs
        A = [[0.0] * K for _ in range(M)]
        B = [[0.0] * N for _ in range(K)]
        C = [[0.0] * N for _ in range(M)]
        for L in range(32):  # every lane's fragment, active or not
            g, t = L // 4, L % 4
            if sd in ("f16", "bf16"):
                fmt = F16 if sd == "f16" else BF16

                def halves(v):
                    return _fmt_to_float(v & 0xFFFF, fmt), _fmt_to_float((v >> 16) & 0xFFFF, fmt)
                for j, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                    A[row][col], A[row][col + 1] = halves(R[ra + j][L])
                for j, k in enumerate((2 * t, 2 * t + 8)):
                    B[k][g], B[k + 1][g] = halves(R[rb + j][L])
            elif sd == "tf32":
                def tf32(v):
                    return _f32_val(v & 0xFFFFE000)
                for j, (row, col) in enumerate(((g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4))):
                    A[row][col] = tf32(R[ra + j][L])
                for j, k in enumerate((t, t + 4)):
                    B[k][g] = tf32(R[rb + j][L])
            else:  # f64, m8n8k4
                A[g][t] = _f64_val(R[ra][L])
                B[t][g] = _f64_val(R[rb][L])
            for j, (row, col) in enumerate(self._cd_layout(sd, g, t)):
                C[row][col] = _f64_val(R[rc + j][L]) if sd == "f64" else _f32_val(R[rc + j][L])
        D = [[0.0] * N for _ in range(M)]
        for i in range(M):
            for j in range(N):
                acc = C[i][j]
                for k in range(K):
                    if sd == "f64":
                        acc = acc + A[i][k] * B[k][j]
                    else:
                        acc = _f32_round(acc + _f32_round(A[i][k] * B[k][j]))
                D[i][j] = acc
        for L in self.lanes(active):
            g, t = L // 4, L % 4
            for j, (row, col) in enumerate(self._cd_layout(sd, g, t)):
                v = D[row][col]
                R[ins.dst + j][L] = _f64_bits(v) if sd == "f64" else _f32_bits(v)

    # ------------------------------------------------------------------ warpgroup MMA (wgmma)
    op_wgfence = op_wgcommit = op_wgwait = op_nop  # timing only

    def _wg_tile(self, w, ins, desc: int, rows: range, mn_major: bool, what: str):
        """Elements (row r, k) of a descriptor tile for r in `rows`, k < 16, as exact floats:
        tile[r - rows.start][k]. Faults (lane 0: the descriptor's lane) on a misaligned
        swizzled start or an element outside the scratchpad."""
        start = (desc & 0x3FFF) << 4
        lbo = ((desc >> 16) & 0x3FFF) << 4
        sbo = ((desc >> 32) & 0x3FFF) << 4
        swz = (desc >> 62) & 3
        S = (0, 128, 64, 32)[swz]
        if S:
            if not mn_major and start % S + 32 > S:
                raise self.fault(w, ins.pc, 0, f"{ins.opc.mnemonic}: {what} tile (K-major, {S}-byte swizzle) starts "
                                                f"at scratchpad address {start:#x}, so its 32 bytes of k cross a "
                                                f"{S}-byte row (misaligned)")
            if mn_major and start % S:
                raise self.fault(w, ins.pc, 0, f"{ins.opc.mnemonic}: {what} tile (MN-major, {S}-byte swizzle) starts "
                                                f"at scratchpad address {start:#x}, not aligned to {S} bytes "
                                                "(misaligned)")
        fmt = F16 if ins.opc.src_dtype == "f16" else BF16
        sh = self.shared[w.block]
        out = []
        for r in rows:
            row = []
            for k in range(16):
                if not mn_major:
                    if S:
                        a = start + (r // 8) * sbo + (r % 8) * S + 2 * k
                    else:
                        a = start + (r // 8) * sbo + (2 * k // 16) * lbo + (r % 8) * 16 + (2 * k) % 16
                elif S:
                    h = S // 2
                    a = start + (r // h) * lbo + (k // 8) * sbo + (k % 8) * S + 2 * (r % h)
                else:
                    a = start + (r // 8) * lbo + (k // 8) * sbo + (k % 8) * 16 + 2 * (r % 8)
                if S:
                    a ^= ((a >> 7) & (S // 16 - 1)) << 4
                self.check(w, ins.pc, 0, "shared", a, 2, 2, f"{ins.opc.mnemonic} {what} element ({r}, {k})")
                row.append(_fmt_to_float(sh[a] | (sh[a + 1] << 8), fmt))
            out.append(row)
        return out

    def op_wgmma(self, w, ins, active, top, clock):
        if self.W != 32:
            raise self.error(ins.pc, f"block {w.block} warp {w.widx}: wgmma needs warp width 32, not {self.W}")
        if not active:
            return
        if 4 * (w.widx // 4) + 3 >= self.wpb:
            lane = (active & -active).bit_length() - 1
            raise self.fault(w, ins.pc, lane, f"{ins.opc.mnemonic}: warp {w.widx} is in warpgroup {w.widx // 4} "
                                              f"(warps {4 * (w.widx // 4)}..{4 * (w.widx // 4) + 3}), but the "
                                              f"block has {self.wpb} warps: not a whole warpgroup")
        if active != (1 << 32) - 1:
            lane = next(l for l in range(32) if not (active >> l) & 1)
            raise self.fault(w, ins.pc, lane, f"{ins.opc.mnemonic}: lane {lane} is not active (wgmma needs all 32 "
                                              "lanes of the warp)")
        _, N, K = ins.opc.shape
        q = w.widx % 4
        rs = ins.opc.operands[1] == "r4"
        R = w.regs
        ra, rb = ins.src[0], ins.src[1]
        # A: the warp's 16 x 16 slice (rows 16q .. 16q+15 of the 64 x 16 tile)
        if rs:
            fmt = F16 if ins.opc.src_dtype == "f16" else BF16
            A = [[0.0] * K for _ in range(16)]
            for L in range(32):
                g, t = L // 4, L % 4
                for j, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                    v = R[ra + j][L]
                    A[row][col] = _fmt_to_float(v & 0xFFFF, fmt)
                    A[row][col + 1] = _fmt_to_float((v >> 16) & 0xFFFF, fmt)
        else:
            A = self._wg_tile(w, ins, R[ra][0], range(16 * q, 16 * q + 16), bool(ins.imm & 1), "A")
        Bt = self._wg_tile(w, ins, R[rb][0], range(N), bool(ins.imm & 2), "B")  # Bt[n][k] = B[k][n]
        # the accumulators: register 4c+j of lane L holds D(row, col) of the warp's 16 x N slice
        places = []
        for L in range(32):
            g, t = L // 4, L % 4
            for c in range(N // 8):
                for j, (row, col) in enumerate(((g, 8 * c + 2 * t), (g, 8 * c + 2 * t + 1),
                                                (g + 8, 8 * c + 2 * t), (g + 8, 8 * c + 2 * t + 1))):
                    places.append((L, ins.dst + 4 * c + j, row, col))
        D = [[0.0] * N for _ in range(16)]
        for L, reg, row, col in places:
            D[row][col] = _f32_val(R[reg][L])
        for i in range(16):
            for n in range(N):
                acc = D[i][n]
                for k in range(K):
                    acc = _f32_round(acc + _f32_round(A[i][k] * Bt[n][k]))
                D[i][n] = acc
        for L, reg, row, col in places:
            R[reg][L] = _f32_bits(D[row][col])

    @staticmethod
    def _cd_layout(sd, g, t):
        if sd == "f64":
            return ((g, 2 * t), (g, 2 * t + 1))
        return ((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))


def _f16_to_f32_bits(h: int) -> int:
    """f16 -> f32, exact (NaN payload shifted up, not changed)."""
    sign = (h >> 15) << 31
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return sign | 0x7F800000 | (m << 13)
    return sign | _f32_bits(abs(_fmt_to_float(h & 0x7FFF, F16)))


def run_reference(prog: Program, args: dict, launch: Launch | None = None, *, warp_width: int = 32,
                  ncores: int = 1, max_instructions: int = 10_000_000) -> FunctionalResult:
    """Run ``prog`` functionally, slowly and simply; the twin of the numba interpreter.

    ``args`` maps parameter name -> numpy array (a buffer; bf16 as uint16 bits) or int.
    Returns the final memory image, every lane's registers ([total warps, nregs, W] int64, warps
    block-major), predicates ([total warps, 8, W] bool) and the number of warp-instructions issued.
    Raises SimulationError (with ``partial`` = the state so far) on a run-time fault or deadlock.
    """
    launch = resolve_launch(prog, launch)
    m = _Machine(prog, args, launch, int(warp_width), ncores, max_instructions)
    with np.errstate(all="ignore"):
        return m.run()
