"""Load-time checks of a Program: every message names ``file:line``, what is wrong and what is
allowed (InputError, exit status 2).

- registers and predicates read before they are written on some path (definite assignment over
  the control-flow graph; a guarded write counts as a write, as compilers assume);
- control that can run off the end of the program;
- unbalanced barriers: a ``bar.sync`` (or ``barrier.cluster``) inside a conditional region that not every path
  through the region passes the same number of times;
- target capabilities: an opcode whose unit class the machine lacks (MMA on a Sunway CPE),
  more scratchpad or registers than the machine gives a block or a thread.
"""

from __future__ import annotations

import hashlib

from archsim.errors import InputError
from archsim.isa import cfg
from archsim.isa.opcodes import SRC_RANGES, opcodes, operand_width
from archsim.isa.program import ARRAYS, FLAG_IMM0, NONE, Program

WG_GROUPS = 8   # wgmma (and bulk) groups a warp tracks: wait_group N leaves at most N < WG_GROUPS pending


def _uses_defs(prog: Program, pc: int):
    """(registers read, predicates read, registers written, predicates written) as bitsets."""
    op = opcodes()[int(prog.op[pc])]
    ru = pu = rd = pd = 0
    slot = 0
    flags = int(prog.flags[pc])
    for kind in op.operands:
        if kind in ("R", "R2", "R4", "Ra"):
            d = int(prog.dst[pc])
            for j in range(operand_width(op, kind)):
                rd |= 1 << (d + j)
                if kind == "Ra":          # an accumulator is read as well
                    ru |= 1 << (d + j)
        elif kind == "P":
            pd |= 1 << int(prog.dst[pc])
        elif kind in SRC_RANGES + ("ri", "m"):
            r = int(getattr(prog, f"src{slot}")[pc])
            if r != NONE and not (kind == "ri" and flags & (FLAG_IMM0 << slot)):
                for j in range(operand_width(op, kind)):
                    ru |= 1 << (r + j)
            slot += 1
        elif kind == "p":
            pu |= 1 << int(getattr(prog, f"src{slot}")[pc])
            slot += 1
    if int(prog.pred[pc]) != NONE:
        pu |= 1 << int(prog.pred[pc])
    return ru, pu, rd, pd


def check_program(prog: Program) -> None:
    """Target-independent checks. Raises InputError."""
    n = len(prog)
    if n == 0:
        raise InputError(prog.source, f"kernel {prog.name} has no instructions", "at least an exit")
    last = opcodes()[int(prog.op[n - 1])]
    if last.sem not in ("exit", "bra") or int(prog.pred[n - 1]) != NONE:
        raise InputError(prog.where(n - 1), "control can run past the last instruction",
                         "end the program with an unguarded exit or bra")
    ops = opcodes()
    for i, code in enumerate(prog.op.tolist()):
        op = ops[code]
        if op.sem not in ("wgwait", "wgmma", "bkwait"):
            continue
        if op.sem in ("wgwait", "bkwait") and not 0 <= int(prog.imm[i]) < WG_GROUPS:
            raise InputError(prog.where(i), f"{op.mnemonic} {int(prog.imm[i])}: groups left pending",
                             f"0 to {WG_GROUPS - 1}")
        if op.sem == "wgmma" and not 0 <= int(prog.imm[i]) <= 3:
            raise InputError(prog.where(i), f"{op.mnemonic}: layout bits {int(prog.imm[i])}",
                             "0 to 3 (bit 0: A is MN-major, bit 1: B is MN-major)")
        if op.sem == "wgmma" and op.operands[1] == "r4" and int(prog.imm[i]) & 1:
            raise InputError(prog.where(i), f"{op.mnemonic}: A comes from registers, so it has no MN-major layout",
                             "layout bits 0 or 2")
    succ = cfg.successors(prog)
    _check_definite_assignment(prog, succ)
    for sem, name in (("bar", "bar.sync"), ("clusterbar", "barrier.cluster")):
        bad = cfg.unbalanced_barrier(prog, sem)
        if bad is not None:
            b, bar = bad
            raise InputError(prog.where(bar),
                             f"{name} is not reached the same number of times on every path from the branch at "
                             f"{prog.where(b)} (unbalanced barrier)",
                             "barriers outside divergent branches, or on every path alike")


def _check_definite_assignment(prog: Program, succ) -> None:
    n = len(prog)
    info = [_uses_defs(prog, i) for i in range(n)]
    full_r = (1 << 256) - 1
    full_p = (1 << 8) - 1
    preds: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for s in succ[i]:
            if s < n:
                preds[s].append(i)
    in_r = [full_r] * n
    in_p = [full_p] * n
    in_r[0] = in_p[0] = 0
    changed = True
    while changed:
        changed = False
        for i in range(n):
            if i == 0:
                r, p = 0, 0
            else:
                r, p = full_r, full_p
            for q in preds[i]:
                r &= in_r[q] | info[q][2]
                p &= in_p[q] | info[q][3]
            if i != 0 and not preds[i]:
                r, p = full_r, full_p  # unreachable code: nothing to report
            if (r, p) != (in_r[i], in_p[i]):
                in_r[i], in_p[i] = r, p
                changed = True
    for i in range(n):
        ru, pu, _, _ = info[i]
        missing = ru & ~in_r[i]
        if missing:
            reg = (missing & -missing).bit_length() - 1
            raise InputError(prog.where(i), f"register r{reg} is read before it is written on some path",
                             "write a register (mov, ld, ...) on every path before reading it")
        missing = pu & ~in_p[i]
        if missing:
            p = (missing & -missing).bit_length() - 1
            raise InputError(prog.where(i), f"predicate p{p} is read before it is set on some path",
                             "set a predicate (setp, ...) on every path before reading it")


# where the machine config gives each opcode feature (isa.opcodes.FEATURE_NAMES)
_FEATURE_CONFIG = {"wgmma": "warpgroup MMA: tensor.wgmma", "tma": "the tensor memory accelerator: tma",
                   "cluster": "thread-block clusters: clusters",
                   "cluster_tma": "a TMA unit and thread-block clusters: tma and clusters"}


def check_target(prog: Program, caps) -> None:
    """Checks against a machine's capabilities (archsim.config.derived.Capabilities)."""
    units = set(caps.units)
    for i in range(len(prog)):
        op = opcodes()[int(prog.op[i])]
        if op.unit not in units:
            raise InputError(prog.where(i), f"{op.mnemonic}: the target {caps.name} has no {op.unit} unit",
                             f"units of {caps.name}: {', '.join(sorted(units))}")
        if op.bcast != "none" and op.bcast not in caps.dma_broadcast_modes:
            have = ", ".join(m for m in ("row", "column", "array") if m in caps.dma_broadcast_modes)
            raise InputError(prog.where(i), f"{op.mnemonic}: the DMA engines of {caps.name} have no {op.bcast} "
                             "broadcast mode", f"dma.broadcast_modes of {caps.name}: {have or 'none'}")
        if op.feature != "none" and op.feature not in caps.features:
            raise InputError(prog.where(i), f"{op.mnemonic}: the target {caps.name} has no {op.feature} "
                             f"({_FEATURE_CONFIG[op.feature]} in the machine config)",
                             f"features of {caps.name}: {', '.join(sorted(caps.features)) or 'none'}")
        if op.sem in ("mma", "ldmatrix", "wgmma") and caps.warp_width != 32:
            raise InputError(prog.where(i), f"{op.mnemonic} needs a warp width of 32; {caps.name} has "
                             f"{caps.warp_width}", "targets with 32-lane warps")
    if prog.shared_bytes > caps.scratchpad_bytes:
        raise InputError(prog.source, f"kernel {prog.name} needs {prog.shared_bytes} bytes of scratchpad per block; "
                         f"{caps.name} has {caps.scratchpad_bytes}", f"at most {caps.scratchpad_bytes} bytes")
    if prog.nregs > caps.max_regs_per_thread:
        raise InputError(prog.source, f"kernel {prog.name} uses {prog.nregs} registers per thread; {caps.name} "
                         f"allows {caps.max_regs_per_thread}", f"at most {caps.max_regs_per_thread}")


_PASSED: dict[bytes, None] = {}   # digests of the instruction arrays check_program has accepted
_PASSED_MAX = 1024


def _digest(prog: Program) -> bytes:
    """A digest of everything check_program looks at: the instruction arrays (a message's file and
    line come from ``prog`` itself, and only a program that passed is remembered)."""
    h = hashlib.blake2b(digest_size=20)
    for a in ARRAYS:
        v = getattr(prog, a)
        h.update(str(v.dtype).encode())
        h.update(v.tobytes())
    return h.digest()


def check(prog: Program, caps=None) -> None:
    """check_program (once per distinct program: an emitter checks what it emits and the timing
    model checks what it runs, and a workload launches the same kernel many times), then
    check_target when ``caps`` is given."""
    key = _digest(prog)
    if key not in _PASSED:
        check_program(prog)
        if len(_PASSED) >= _PASSED_MAX:
            _PASSED.clear()
        _PASSED[key] = None
    if caps is not None:
        check_target(prog, caps)
