"""Exact warp-instruction counts of a launch, block by block, without timing it.

Interval sampling (archsim.interval) extrapolates a long launch from part of it, and needs to know
how much work is left. A warp's path through its program depends only on its branches, exits
and barriers, so the counter runs the launch's *control slice*: the instructions whose values
reach a branch's, exit's or barrier's guard (a backward slice along the control-flow graph,
through registers and predicates), every other instruction standing in as a no-op that counts. Runs of such
instructions between two labels or reconvergence points fold into one weighted no-op, so a
GEMM's loop costs a handful of steps a trip. The functional interpreter (engine/functional.py)
runs the folded program with its SIMT stack, so divergence and guarded exits count exactly as
the timing engine issues them (a guarded-off instruction issues and counts, in both).

A launch can be counted when its control slice computes the same values in a functional and a
timing run: integer and predicate arithmetic, special registers, parameters, moves and shuffles.
A slice that reads memory through a register (a loop bound loaded from a buffer; a scratchpad
slot at a constant address, where an emitter keeps a loop variable, is followed), floating-point
values (timing runs carry none) or ``%clock`` is not countable, and the launch is simulated on;
``%coreid`` is countable once the timing run has placed every block on its core. Blocks whose
slice reads neither ``%ctaid`` nor ``%coreid`` all count alike, and one is run for all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from archsim.engine import execute as X
from archsim.engine.functional import DONE, FO_N, FO_OUTCOME, FO_PC, FO_STEPS, build_fstate, run_loop
from archsim.isa import cfg
from archsim.isa import opcodes as O
from archsim.isa.program import NONE, Launch, Program

CONTROL = ("bra", "exit", "bar", "bargrid")
# instructions whose results a timing run computes as a functional run does (integer, predicate)
EXACT_SEMS = frozenset(("s2r", "ldparam", "mov", "selp", "add", "sub", "mul", "min", "max", "fma", "div",
                        "rem", "and", "or", "xor", "not", "shl", "shr", "sra", "setp", "pand", "por", "pxor",
                        "pnot", "vote_any", "vote_all", "shfl_bfly", "shfl_down", "shfl_up", "shfl_idx"))
INT_DTYPES = frozenset(("b", "i64", "pred"))
CLOCK, COREID = O.SPECIAL["clock"], O.SPECIAL["coreid"]
BLOCK_IDS = (O.SPECIAL["ctaid.x"], O.SPECIAL["ctaid.y"], O.SPECIAL["ctaid.z"], O.SPECIAL["cluster_ctarank"], COREID)
MAX_STEPS = 2_000_000_000     # folded steps before the counter gives up (a loop that never ends)
CHUNK_BYTES = 256 << 20       # register file of one chunk of blocks run together
PRED_BIT = O.MAX_REGS + 1     # bit of predicate 0 in an instruction's bit sets
SLOT_BIT = PRED_BIT + O.MAX_PREDS   # bit of the first scratchpad slot word


def _slot_words(prog: Program, pc: int, op: O.Opcode):
    """The 8-byte scratchpad words of a load or store at a constant address (no base register:
    the slots where an emitter keeps a loop's variables), or None."""
    if op.sem not in ("ld", "st") or op.space != "shared":
        return None
    if prog.src0[pc] != NONE:      # the address operand's base register (ld R, m / st m, r)
        return None
    addr = int(prog.imm[pc])
    return range(addr // 8, (addr + op.access_bytes - 1) // 8 + 1)


def _bulk_writes_slots(prog: Program, pc: int, op: O.Opcode) -> bool:
    """A copy (cp.async, DMA, RMA) that writes the scratchpad at a constant address: its size is
    a register's, so it may cover a slot (copies through a register address are taken not to)."""
    return op.sem in ("cpasync", "dma_get", "rma_get", "rma_put", "tma") and prog.src0[pc] == NONE


def _operands(prog: Program, pc: int, op: O.Opcode, word_bit: dict) -> tuple[int, int, int]:
    """(defined, killed, read) of one instruction as bit sets: register r is bit r, predicate p
    bit PRED_BIT + p, a scratchpad slot word its bit in ``word_bit``; its guard is read. A
    guarded definition, or a store of part of a word, kills nothing."""
    dst, src = 0, 0
    slot = 0
    for kind in op.operands:
        if kind in ("R", "R2", "R4", "Ra"):
            dst |= ((1 << O.operand_width(op, kind)) - 1) << int(prog.dst[pc])
            if kind == "Ra":                # an accumulator is read as well
                src |= ((1 << O.operand_width(op, kind)) - 1) << int(prog.dst[pc])
        elif kind == "P":
            dst |= 1 << (PRED_BIT + int(prog.dst[pc]))
        elif kind in O.SRC_RANGES + ("ri", "p", "m"):
            r = int(getattr(prog, f"src{slot}")[pc])
            slot += 1
            if r != NONE:
                src |= (1 << (PRED_BIT + r)) if kind == "p" else ((1 << O.operand_width(op, kind)) - 1) << r
    kill = dst
    words = _slot_words(prog, pc, op)
    if words is not None:
        bits = 0
        for w in words:
            bits |= 1 << (SLOT_BIT + word_bit.setdefault(w, len(word_bit)))
        if op.sem == "ld":
            src |= bits
        else:
            dst |= bits
            kill = dst if op.access_bytes % 8 == 0 and int(prog.imm[pc]) % 8 == 0 else 0
    if prog.pred[pc] != NONE:
        src |= 1 << (PRED_BIT + int(prog.pred[pc]))
        kill = 0
    return dst, kill, src


def control_slice(prog: Program, placed: bool = False) -> tuple[np.ndarray | None, str, bool, int]:
    """(keep, why, per_block, shared): ``keep[pc]`` marks the instructions the counter must
    execute: the control instructions and every definition that reaches what their guards read (a
    backward slice over the control-flow graph; a guarded definition does not kill the value it
    replaces); None and the reason when the slice is not countable (``%coreid`` is countable when
    the blocks are ``placed`` on their cores). ``per_block``: the slice reads %ctaid or %coreid, so
    blocks may count differently. ``shared``: the scratchpad bytes its slot loads and
    stores reach (an emitter that keeps a loop variable in a scratchpad slot at a constant
    address; stores through a register are taken not to touch such slots)."""
    ops = O.opcodes()
    n = len(prog)
    sems = [ops[int(prog.op[pc])].sem for pc in range(n)]
    dst, src, kill = [0] * n, [0] * n, [0] * n
    word_bit: dict = {}
    for pc in range(n):
        d, k, r = _operands(prog, pc, ops[int(prog.op[pc])], word_bit)
        dst[pc], kill[pc], src[pc] = d, k, r
    succ = cfg.inner_successors(prog)
    keep = np.array([s in CONTROL for s in sems], bool)
    live = [0] * n          # values some later control instruction may read, live into pc
    slots = ~((1 << SLOT_BIT) - 1)
    grew = True
    while grew:
        grew = False
        cfg.grow_backward_slice(succ, dst, kill, [0] * n, src, keep, live)
        # a slot is the block's, not the thread's: another warp's store to a slot the slice reads
        # reaches it whatever the path, so every store to such a slot is kept
        read = 0
        for pc in np.flatnonzero(keep):
            read |= src[pc] & slots
        for pc in range(n):
            if not keep[pc] and dst[pc] & read:
                keep[pc] = True
                live[pc] |= src[pc]
                grew = True
    if read and any(_bulk_writes_slots(prog, pc, ops[int(prog.op[pc])]) for pc in range(n)):
        return None, "control flow depends on a scratchpad slot that a bulk copy at a constant address may write", \
            False, 0
    per_block = False
    shared = 0
    for pc in np.flatnonzero(keep):
        op = ops[int(prog.op[pc])]
        if op.sem in CONTROL:
            continue
        if _slot_words(prog, int(pc), op) is not None:
            shared = max(shared, int(prog.imm[pc]) + op.access_bytes)
            continue
        bad = op.sem not in EXACT_SEMS or (op.dtype not in INT_DTYPES and op.sem != "mov") \
            or (op.sem == "s2r" and (int(prog.imm[pc]) == CLOCK or (int(prog.imm[pc]) == COREID and not placed)))
        if bad:
            return None, f"control flow depends on {op.mnemonic} at {prog.where(int(pc))}", False, 0
        per_block |= op.sem == "s2r" and int(prog.imm[pc]) in BLOCK_IDS
    return keep, "", per_block, shared


def fold(prog: Program, keep: np.ndarray, shared: int = 0) -> tuple[Program, np.ndarray, np.ndarray]:
    """The counting program: kept instructions as they are, each run of the others between two
    entry points (labels, branch targets, reconvergence points) one no-op; each folded
    instruction's weight (the original instructions it stands for) and first original pc."""
    ops = O.opcodes()
    n = len(prog)
    entries = {0, n}
    for pc in range(n):
        if ops[int(prog.op[pc])].sem == "bra":
            entries.add(int(prog.imm[pc]))
        if prog.reconv[pc] >= 0:
            entries.add(int(prog.reconv[pc]))
    entries.update(i for i, _ in prog.labels)
    start = []          # original pc of each folded instruction
    weight = []
    for pc in range(n):
        if keep[pc] or pc in entries or not start or keep[start[-1]]:
            start.append(pc)
            weight.append(1)
        else:
            weight[-1] += 1
    new_of = {pc: i for i, pc in enumerate(start)}
    new_of[n] = len(start)
    nop = O.by_mnemonic()["nop"].code
    rows = {a: np.asarray(getattr(prog, a))[start].copy() for a in ("op", "dst", "src0", "src1", "src2", "src3",
                                                                     "imm", "imm2", "pred", "flags", "reconv")}
    folded = ~keep[start]
    rows["op"][folded] = nop
    for a in ("dst", "src0", "src1", "src2", "src3", "pred", "reconv"):
        rows[a][folded] = NONE
    for a in ("imm", "imm2", "flags"):
        rows[a][folded] = 0
    for i, pc in enumerate(start):
        if not folded[i] and ops[int(prog.op[pc])].sem == "bra":
            rows["imm"][i] = new_of[int(prog.imm[pc])]
        if rows["reconv"][i] >= 0:
            rows["reconv"][i] = new_of[int(rows["reconv"][i])]
    out = Program(name=prog.name, **rows, params=prog.params, nregs=prog.nregs, shared_bytes=shared,
                  launch=prog.launch, source=prog.source)
    return out, np.array(weight, np.int64), np.array(start, np.int64)


@dataclass
class Counts:
    """A launch's warp-instructions, exactly as the timing engine issues them."""

    per_block: np.ndarray      # int64 [blocks]
    per_pc: np.ndarray         # int64 [program length]: over the whole launch


def count_launch(prog: Program, launch: Launch, params: np.ndarray, warp_width: int,
                 block_core: np.ndarray | None = None, cslice: tuple | None = None) -> tuple[Counts | None, str]:
    """(the launch's counts, ""), or (None, why it cannot be counted). ``params``: the parameter
    vector a timing run sees (timing.param_values); ``block_core``: the core each block runs on
    (%coreid), when the launch has placed them all; ``cslice``: control_slice(prog, placed=
    block_core is not None) when the caller has it."""
    keep, why, per_block, shared = cslice if cslice is not None else control_slice(prog, block_core is not None)
    if keep is None:
        return None, why
    fprog, weight, start = fold(prog, keep, shared)
    P, T = fprog.arrays(), O.tables()
    W = int(warp_width)
    tpb = launch.threads_per_block
    wpb = (tpb + W - 1) // W
    B = launch.blocks
    gridbar = any(O.opcodes()[int(o)].sem == "bargrid" for o in prog.op)
    if not per_block and not gridbar:
        run_blocks = [np.zeros(1, np.int64)]   # every block alike: block 0 counts for all
    else:
        per_chunk = B if gridbar else max(1, CHUNK_BYTES // (wpb * max(prog.nregs, 1) * W * 8))
        run_blocks = [np.arange(b, min(b + per_chunk, B), dtype=np.int64) for b in range(0, B, per_chunk)]
    live = np.minimum(W, tpb - np.arange(wpb) * W)
    mask_of_wib = np.where(live < 64, (np.int64(1) << live.astype(np.int64)) - 1, -1)
    counts = np.zeros(B, np.int64)
    visits = np.zeros(len(fprog), np.int64)
    steps = 0
    for blocks in run_blocks:
        nb = len(blocks)
        warp_block = np.repeat(blocks, wpb)
        wib = np.tile(np.arange(wpb), nb)
        local = np.repeat(np.arange(nb), wpb)
        S = build_fstate(NW=nb * wpb, nregs=prog.nregs, W=W, g=np.zeros(16, np.uint8), gsize=0, vsize=0,
                         smem_rows=nb, shared=int(fprog.shared_bytes), params=params, launch=launch, ncores=1,
                         mode=X.MODE_FUNCTIONAL, warp_block=warp_block, warp_wib=wib, warp_smem=local,
                         warp_core=np.zeros(nb * wpb, np.int32) if block_core is None else
                         np.repeat(block_core[blocks], wpb).astype(np.int32), block_smem=np.arange(nb),
                         stack_mask0=mask_of_wib[wib])
        out = np.zeros(FO_N, np.int64)
        per_warp = np.zeros(nb * wpb, np.int64)
        run_loop(P, T, S, np.int64(MAX_STEPS - steps), out, weight, per_warp, visits)
        if int(out[FO_OUTCOME]) != DONE:
            at = int(start[min(max(int(out[FO_PC]), 0), len(start) - 1)])   # the folded pc's first original pc
            return None, "the instruction counter did not finish (a fault, a deadlock or over " \
                         f"{MAX_STEPS} steps at {prog.where(at)})"
        steps += int(out[FO_STEPS])
        counts[blocks] = per_warp.reshape(nb, wpb).sum(axis=1)
    if len(run_blocks) == 1 and len(run_blocks[0]) == 1 and B > 1:
        counts[:] = counts[0]
        visits *= B
    # every instruction of a folded run issues as often as the run
    per_pc = visits[np.searchsorted(start, np.arange(len(prog)), side="right") - 1]
    return Counts(counts, per_pc), ""
