"""Which instructions' values a timing run needs.

A timing run carries no floating-point values (execute.MODE_TIMING); of the integer and
predicate values it does compute, only some reach what the timing reads: a guard (which lanes
issue), a branch, an exit, a memory instruction's address, a bulk copy's operands. The rest (a
GEMM's operand loads from the scratchpad, which feed only its FMAs; the integer packing of those
operands) cost the engine time and change nothing. ``needed`` finds the others: a backward
liveness over the control-flow graph from those sinks, through registers and predicates (a
guarded definition kills nothing), and through memory by class, since another warp's store
reaches a load whatever the path: global memory; the scratchpad at register addresses; and the
scratchpad's *slots*, the words ld / st reach at constant addresses (where emitters keep loop
variables). A store or copy is needed when a needed load reads its class (a load at a register
address reads slots too). A shuffle reads other lanes' registers, which may hold a definition
from another path, so a needed shuffle makes every definition of its source needed; so does
every ldmatrix for its address register (it reads the address of each lane of its matrices,
active or not). A floating-point op (but mov and setp), an mma and an ldmatrix leave their
destination as it was in a timing run: like a guarded definition, they kill nothing.

A write at a register address may land on a slot. When a needed load reads slots and none
reads the scratchpad at register addresses, such writes are not needed, and the run watches
the slots' byte range (``FState.geom[G_WATCH_LO:G_WATCH_HI]``): a write that lands there stops
the run (fault F_SLICE), which is timed again without the slice (timing.KernelRun).

``timing_view`` marks the instructions not needed with ``FLAG_NO_VALUE``: a marked load or
store still checks its lanes' addresses (the same faults) and hands them to the timing model,
and moves no value; a marked integer or predicate instruction only issues. Control
instructions, bulk copies and tensor instructions are never marked (the last two move no
values in a timing run anyway). Results are those of an unmarked run (tests/test_value_slice.py).
"""

from __future__ import annotations

import numpy as np

from archsim.isa import cfg
from archsim.isa import opcodes as O
from archsim.isa.program import FLAG_IMM0, FLAG_NO_VALUE, NONE, Program, ProgArrays

PRED_BIT = O.MAX_REGS                    # bit of predicate 0 (registers are bits 0 .. MAX_REGS - 1)
GLOBAL, SHARED, SLOTS = 1, 2, 4          # memory classes (bits): global; scratchpad at register addresses; slots
_CONTROL = frozenset(("bra", "exit", "bar", "bargrid", "clusterbar"))
_BULK = frozenset(("dma_get", "dma_put", "rma_get", "rma_put", "tmastore"))
# transaction barriers: their operands are always needed, and their barrier words are state of their
# own (no memory class: a program keeps its data off them)
_MBAR = frozenset(("mbinit", "mbarrive", "mbtx", "mbwait", "mbremote"))
_NEVER_MARKED = _CONTROL | _BULK | _MBAR | frozenset(("ldmatrix", "mma", "nop", "cpcommit", "cpwait", "dma_wait",
                                                      "rma_wait", "wgmma", "wgfence", "wgcommit", "wgwait",
                                                      "bkcommit", "bkwait"))
_FLOAT = frozenset(("f32", "f64", "f16x2", "bf16x2"))
_DS_RANK_SLOT = {"dsld": 1, "dsst": 2}   # the source slot of ld.dsmem's / st.dsmem's rank register
ENABLED = True                           # off: timing runs compute every value (tests compare the two)
_CACHE: dict = {}
_CACHE_MAX = 64


def _regs(first: int, n: int) -> int:
    return ((1 << n) - 1) << first


class _Ins:
    """One instruction's operands as bit sets: ``dst`` (registers and predicates it defines),
    ``kill`` (those it always overwrites), ``addr`` (read whatever its values: the guard, address
    operands, a bulk copy's operands), ``val`` (read to compute its values); ``reads`` /
    ``writes``: the memory classes whose values it reads / writes; ``slot``: the byte range of
    a load or store at a constant scratchpad address."""

    __slots__ = ("sem", "dst", "kill", "addr", "val", "reads", "writes", "shfl_src", "slot", "all_lanes")

    def __init__(self, prog: Program, pc: int, op: O.Opcode):
        self.sem = op.sem
        dst = addr = val = 0
        slot = 0
        self.shfl_src = 0
        for kind in op.operands:
            if kind in ("R", "R2", "R4", "Ra"):
                dst |= _regs(int(prog.dst[pc]), O.operand_width(op, kind))
                if kind == "Ra":                 # an accumulator is read as well
                    val |= _regs(int(prog.dst[pc]), O.operand_width(op, kind))
            elif kind == "P":
                dst |= 1 << (PRED_BIT + int(prog.dst[pc]))
            elif kind in O.SRC_RANGES + ("ri", "p", "m"):
                r = int(getattr(prog, f"src{slot}")[pc])
                imm = kind == "ri" and int(prog.flags[pc]) & (FLAG_IMM0 << slot)
                slot += 1
                if r == NONE or imm:
                    continue
                bits = (1 << (PRED_BIT + r)) if kind == "p" else _regs(r, O.operand_width(op, kind))
                rank = slot - 1 == _DS_RANK_SLOT.get(op.sem, -1)   # a dsmem access's cluster rank
                if kind == "m" or op.sem in _BULK or op.sem in _MBAR or op.sem == "tma" or rank or \
                        (op.sem == "wgmma" and kind == "r"):   # (a descriptor; a dsmem access's cluster rank)
                    addr |= bits
                else:
                    val |= bits
                if op.sem.startswith("shfl") and slot == 1:
                    self.shfl_src = bits
        # a timing run leaves the destination of a floating-point op (but mov and setp), an mma, a
        # wgmma and an ldmatrix as it was: they kill nothing, like a guarded definition
        writes_nothing = sem_writes_nothing(op)
        if prog.pred[pc] != NONE:
            addr |= 1 << (PRED_BIT + int(prog.pred[pc]))
        self.kill = 0 if prog.pred[pc] != NONE or writes_nothing else dst
        # an ldmatrix reads the address register of its first 8 x matrices lanes, active or not
        self.all_lanes = addr & ((1 << PRED_BIT) - 1) if op.sem == "ldmatrix" else 0
        self.dst, self.addr, self.val = dst, addr, val
        const = prog.src0[pc] == NONE            # the (first) memory operand has no base register
        self.slot = None
        here = GLOBAL if op.space == "global" else (SLOTS if const else SHARED | SLOTS)
        self.reads = self.writes = 0
        sem = op.sem
        if sem == "ld":                          # (an ldmatrix reads no values in a timing run)
            self.reads = here
        elif sem == "dsld":                      # another block's scratchpad: any of its words
            self.reads = SHARED | SLOTS
        elif sem == "dsst":
            self.writes = SHARED | SLOTS
        elif sem == "st":
            self.writes = GLOBAL if op.space == "global" else (SLOTS if const else SHARED)
        elif sem in ("cpasync", "dma_get", "tma"):
            self.reads, self.writes = GLOBAL, SHARED
        elif sem in ("dma_put", "tmastore"):
            self.reads, self.writes = SHARED | SLOTS, GLOBAL
        elif sem in ("rma_get", "rma_put"):
            self.reads, self.writes = SHARED | SLOTS, SHARED
        if sem in ("ld", "st") and op.space == "shared" and const:
            lo = int(prog.imm[pc])
            self.slot = (lo, lo + op.access_bytes)


def sem_writes_nothing(op: O.Opcode) -> bool:
    """A timing run leaves this instruction's destination registers as they were
    (execute._alu's floating-point early return, mma, wgmma, ldmatrix)."""
    if op.sem in ("mma", "ldmatrix", "wgmma"):
        return True
    return op.dtype in _FLOAT and op.sem not in ("mov", "setp") and bool(op.operands) and \
        op.operands[0] in ("R", "R2", "R4")


def needed(prog: Program, backed: bool) -> tuple[np.ndarray, tuple[int, int]]:
    """(``needed[pc]``: the instruction's values may reach what a timing run reads; the byte
    range of the scratchpad's slots to watch, (0, 0) when none): see the module docstring.
    ``backed``: the run's global memory holds values (buffers the caller reads back, such as a
    micro-benchmark's clock readings), so every global write is needed; unbacked global memory
    reads as zeros whatever was written."""
    ops = O.opcodes()
    n = len(prog)
    ins = [_Ins(prog, pc, ops[int(prog.op[pc])]) for pc in range(n)]
    succ = cfg.inner_successors(prog)
    dst, kill, addr, val = ([getattr(i, f) for i in ins] for f in ("dst", "kill", "addr", "val"))
    need = np.array([i.sem in _CONTROL or backed and bool(i.writes & GLOBAL) for i in ins], bool)
    live = [0] * n                 # registers and predicates live into pc
    mem = 0                        # memory classes a needed instruction reads (global: only when backed)
    everywhere = 0                 # registers read in other lanes: a needed shuffle's source, an ldmatrix's address
    for i in ins:
        everywhere |= i.all_lanes
    grew = True
    while grew:
        grew = False
        cfg.grow_backward_slice(succ, dst, kill, addr, val, need, live, everywhere)
        for pc in np.flatnonzero(need):
            i = ins[pc]
            reads = i.reads if backed else i.reads & ~GLOBAL
            if reads & ~mem:
                mem |= reads
                grew = True
            if i.shfl_src & ~everywhere:
                everywhere |= i.shfl_src
                grew = True
        for pc in range(n):       # a write to a class a needed instruction reads
            if not need[pc] and ins[pc].writes & mem:
                need[pc] = True
                grew = True
    watch = (0, 0)
    if mem & SLOTS and not mem & SHARED:
        spans = [i.slot for i in ins if i.slot is not None]
        if not spans:                            # (only constant-address ld / st read slots)
            return np.ones(n, bool), watch
        watch = (min(a for a, _ in spans), max(b for _, b in spans))
    return need, watch


def timing_view(prog: Program, backed: bool) -> tuple[ProgArrays, tuple[int, int]]:
    """The program's arrays for a timing run, the instructions whose values it does not need
    marked ``FLAG_NO_VALUE``, and the slots' byte range to watch (kept for the last programs
    seen). ``backed``: as for ``needed``."""
    key = (prog.content_digest(), bool(backed))
    got = _CACHE.get(key)
    if got is None:
        ops = O.opcodes()
        flags = prog.flags.copy()
        need, watch = needed(prog, backed)
        for pc in range(len(prog)):
            if not need[pc] and ops[int(prog.op[pc])].sem not in _NEVER_MARKED:
                flags[pc] |= FLAG_NO_VALUE
        got = (prog.arrays()._replace(flags=flags), watch)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = got
    return got
