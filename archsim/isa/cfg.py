"""Control flow of a Program: successors, immediate post-dominators (SIMT reconvergence points,
as GPGPU-Sim's PDOM stack uses them) and the forward-path barrier count used by the checker.

Instruction-level graphs in lists: memory and time grow about linearly with program length
(a generated kernel may be unrolled into tens of thousands of instructions).
"""

from __future__ import annotations

import numpy as np

from archsim.isa.opcodes import SEM, opcodes
from archsim.isa.program import NONE, Program

_BRA, _EXIT = SEM["bra"], SEM["exit"]


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


def inner_successors(prog: Program) -> list[list[int]]:
    """Successors of each instruction within the program (the exit node left out)."""
    n = len(prog)
    return [[t for t in out if t < n] for out in successors(prog)]


def grow_backward_slice(succ, dst, kill, always, uses, need: np.ndarray, live: list, also: int = 0) -> None:
    """Grow a backward slice over the control-flow graph to its fixpoint, in place. Per
    instruction, bit sets (registers, predicates, whatever the caller counts): ``dst`` what it
    defines, ``kill`` what it always overwrites (a guarded definition kills nothing), ``always``
    what it reads whether in the slice or not, ``uses`` what it reads when in the slice. An
    instruction joins the slice (``need``) when it defines something live after it, or in
    ``also`` (read anywhere, whatever the path); ``live[pc]`` is what is live into pc."""
    changed = True
    while changed:
        changed = False
        for pc in range(len(succ) - 1, -1, -1):
            out = 0
            for t in succ[pc]:
                out |= live[t]
            if not need[pc] and dst[pc] & (out | also):
                need[pc] = True
                changed = True
            new = (out & ~kill[pc]) | always[pc] | (uses[pc] if need[pc] else 0)
            if new != live[pc]:
                live[pc] = new
                changed = True


def postdominators(prog: Program) -> list[int]:
    """Immediate post-dominator of each instruction (n = the exit node; also for an instruction
    from which the exit cannot be reached). The dominator tree of the reversed graph rooted at
    the exit, by Cooper, Harvey and Kennedy's iteration ("A Simple, Fast Dominance Algorithm",
    2001): linear memory, a few passes over a kernel's graph."""
    n = len(prog)
    succ = successors(prog, for_reconvergence=True)
    if not _all_reach_exit(succ, n):
        # the only ways out are guarded exits (e.g. `@p exit` inside a loop): keep their exit edges
        succ = successors(prog)
    succ = [[min(t, n) for t in ss] for ss in succ] + [[]]
    preds: list[list[int]] = [[] for _ in range(n + 1)]     # edges of the reversed graph: t -> i
    for i in range(n):
        for t in succ[i]:
            preds[t].append(i)
    # postorder of the reversed graph from the exit (iterative depth-first search)
    order = []
    seen = [False] * (n + 1)
    seen[n] = True
    stack = [(n, iter(preds[n]))]
    while stack:
        node, it = stack[-1]
        for q in it:
            if not seen[q]:
                seen[q] = True
                stack.append((q, iter(preds[q])))
                break
        else:
            stack.pop()
            order.append(node)
    number = [-1] * (n + 1)
    for k, node in enumerate(order):
        number[node] = k
    idom = [-1] * (n + 1)
    idom[n] = n
    changed = True
    while changed:
        changed = False
        for node in reversed(order[:-1]):        # reverse postorder, the root (exit) left out
            new = -1
            for p in succ[node]:                  # the node's predecessors in the reversed graph
                if idom[p] < 0:
                    continue
                if new < 0:
                    new = p
                    continue
                a, b = p, new
                while a != b:
                    while number[a] < number[b]:
                        a = idom[a]
                    while number[b] < number[a]:
                        b = idom[b]
                new = a
            if new != idom[node]:
                idom[node] = new
                changed = True
    return [d if d >= 0 else n for d in idom[:n]]


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


def unbalanced_barrier(prog: Program, sem: str = "bar") -> tuple[int, int] | None:
    """A conditional branch whose forward paths to its reconvergence point pass different numbers
    of barriers of this sem (``bar.sync``; "clusterbar": ``barrier.cluster``): returns (branch pc,
    a barrier pc inside), or None. Back edges (loops) are taken as uniform and not followed."""
    n = len(prog)
    succ = successors(prog, for_reconvergence=True)
    sems = _sems(prog)
    barrier = SEM[sem]
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
            add = 1 if sems[i] == barrier else 0
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
