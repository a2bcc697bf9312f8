"""Control flow of a Program: successors, immediate post-dominators (SIMT reconvergence points,
as GPGPU-Sim's PDOM stack uses them) and the forward-path barrier count used by the checker.

Instruction-level graphs with Python-int bitsets: kernels are loops, so programs stay a few
hundred instructions whatever the problem size.
"""

from __future__ import annotations

import numpy as np

from archsim.isa.opcodes import SEM, opcodes
from archsim.isa.program import NONE, Program

_BRA, _EXIT, _BAR = SEM["bra"], SEM["exit"], SEM["bar"]


def _sems(prog: Program) -> list[int]:
    ops = opcodes()
    return [SEM[ops[int(o)].sem] for o in prog.op]


def successors(prog: Program, for_reconvergence: bool = False) -> list[list[int]]:
    """Successor instruction indices; len(prog) stands for the virtual exit node.

    A guarded exit continues to the next instruction for the lanes that stay; with
    ``for_reconvergence`` its edge to the exit node is left out (lanes that leave are simply
    removed from the SIMT stack), so branches around it still reconverge.
    """
    n = len(prog)
    sems = _sems(prog)
    out = []
    for i in range(n):
        guarded = int(prog.pred[i]) != NONE
        s = sems[i]
        if s == _BRA:
            t = int(prog.imm[i])
            out.append([t, i + 1] if guarded and t != i + 1 else [t])
        elif s == _EXIT:
            if guarded:
                out.append([i + 1] if for_reconvergence else [i + 1, n])
            else:
                out.append([n])
        else:
            out.append([i + 1])
    return out


def postdominators(prog: Program) -> list[int]:
    """Immediate post-dominator of each instruction (n = the exit node)."""
    n = len(prog)
    succ = successors(prog, for_reconvergence=True)
    if not _all_reach_exit(succ, n):
        # the only ways out are guarded exits (e.g. `@p exit` inside a loop): keep their exit edges
        succ = successors(prog)
    full = (1 << (n + 1)) - 1
    pdom = [full] * n + [1 << n]
    changed = True
    while changed:
        changed = False
        for i in range(n - 1, -1, -1):
            acc = full
            for s in succ[i]:
                acc &= pdom[min(s, n)]
            new = acc | (1 << i)
            if new != pdom[i]:
                pdom[i] = new
                changed = True
    ipdom = []
    for i in range(n):
        strict = pdom[i] & ~(1 << i)
        # the immediate post-dominator is the strict one whose own set equals the rest
        best = n
        m = strict
        while m:
            low = m & -m
            j = low.bit_length() - 1
            m ^= low
            if j <= n and pdom[j] == strict:
                best = j
                break
        ipdom.append(best)
    return ipdom


def _all_reach_exit(succ, n: int) -> bool:
    preds: list[list[int]] = [[] for _ in range(n + 1)]
    for i, ss in enumerate(succ):
        for t in ss:
            preds[min(t, n)].append(i)
    seen = {n}
    todo = [n]
    while todo:
        for q in preds[todo.pop()]:
            if q not in seen:
                seen.add(q)
                todo.append(q)
    return len(seen) == n + 1


def set_reconvergence(prog: Program) -> None:
    """Fill Program.reconv for every branch (-1 = reconverge only at the warp's exit)."""
    n = len(prog)
    reconv = np.full(n, NONE, dtype=np.int32)
    if n:
        ipdom = postdominators(prog)
        sems = _sems(prog)
        for i in range(n):
            if sems[i] == _BRA:
                reconv[i] = ipdom[i] if ipdom[i] < n else NONE
    prog.reconv = reconv


def unbalanced_barrier(prog: Program) -> tuple[int, int] | None:
    """A conditional branch whose forward paths to its reconvergence point pass different numbers
    of ``bar.sync``: returns (branch pc, a barrier pc inside), or None. Back edges (loops) are taken
    as uniform and not followed."""
    n = len(prog)
    succ = successors(prog, for_reconvergence=True)
    sems = _sems(prog)
    for b in range(n):
        if sems[b] != _BRA or int(prog.pred[b]) == NONE:
            continue
        stop = int(prog.reconv[b]) if int(prog.reconv[b]) != NONE else n
        counts: dict[int, set[int]] = {}
        inside_bar = None
        # forward nodes only, in index order (forward edges go to higher indices)
        frontier = {s: {0} for s in succ[b] if s > b}
        order = sorted(frontier)
        seen = dict(frontier)
        work = list(order)
        while work:
            work.sort()
            i = work.pop(0)
            here = seen[i]
            if i >= stop or i >= n:
                counts.setdefault(stop, set()).update(here)
                continue
            add = 1 if sems[i] == _BAR else 0
            if add and inside_bar is None:
                inside_bar = i
            for s in succ[i]:
                if s <= i:
                    continue  # back edge
                vals = {c + add for c in here}
                old = seen.get(s)
                if old is None:
                    seen[s] = set(vals)
                    work.append(s)
                elif not vals <= old:
                    old |= vals
                    if s not in work:
                        work.append(s)
        reached = counts.get(stop, set())
        if len(reached) > 1 or (inside_bar is not None and any(c > 0 for c in reached) and
                                _exits_before(prog, succ, b, stop)):
            return b, inside_bar if inside_bar is not None else b
    return None


def _exits_before(prog: Program, succ, b: int, stop: int) -> bool:
    """Does some forward path from branch b leave the warp (exit) before reaching stop?"""
    n = len(prog)
    todo = [s for s in succ[b] if s > b]
    seen = set()
    while todo:
        i = todo.pop()
        if i in seen or i >= stop:
            continue
        seen.add(i)
        for s in succ[i]:
            if s >= n and stop < n:
                return True
            if s > i:
                todo.append(s)
    return False
