"""Immediate post-dominators (SIMT reconvergence points) against the textbook fixpoint over
bitsets on random control flow, and linear growth with program length."""

from __future__ import annotations

import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from archsim.isa.asm import assemble
from archsim.isa.cfg import postdominators, successors


def fixpoint_ipdom(prog) -> list[int]:
    """pdom(i) = {i} | AND of pdom(s) over successors, from all-ones; the immediate one is the strict
    post-dominator whose own set is the rest (n: the exit, or none for an instruction that cannot
    reach it)."""
    n = len(prog)

    def reaching(succ):
        reach = {n}
        changed = True
        while changed:
            changed = False
            for i in range(n):
                if i not in reach and any(min(s, n) in reach for s in succ[i]):
                    reach.add(i)
                    changed = True
        return reach

    succ = successors(prog, for_reconvergence=True)
    reach = reaching(succ)
    if len(reach) != n + 1:
        succ = successors(prog)
        reach = reaching(succ)
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
                pdom[i], changed = new, True
    out = []
    for i in range(n):
        strict = pdom[i] & ~(1 << i)
        if i not in reach:   # a loop that never ends: no post-dominator
            out.append(n)
            continue
        out.append(next((j for j in range(n + 1) if strict >> j & 1 and pdom[j] == strict), n))
    return out


def _program(kinds: list[tuple[str, int]]):
    n = len(kinds)
    lines = [".kernel k"]
    for i, (kind, t) in enumerate(kinds):
        ins = {"op": "add.i64 r0, r0, 1", "bra": f"bra L{t % n}", "cbra": f"@p0 bra L{t % n}", "exit": "exit",
               "cexit": "@p0 exit"}[kind]
        lines.append(f"L{i}: {ins}")
    lines.append("    exit")
    return assemble("\n".join(lines) + "\n")


@given(st.lists(st.tuples(st.sampled_from(["op", "op", "bra", "cbra", "cbra", "exit", "cexit"]),
                          st.integers(0, 63)), min_size=1, max_size=40))
def test_post_dominators_match_the_bitset_fixpoint(kinds):
    prog = _program(kinds)
    assert postdominators(prog) == fixpoint_ipdom(prog)


def test_memory_grows_linearly_with_program_length():
    """issue 20, item 4: the bitsets took n^2 / 8 bytes (200 k instructions: 5.5 GB)."""
    def peak(n):
        kinds = [("cbra", i + 3) if i % 4 == 0 else ("op", 0) for i in range(n)]
        prog = _program(kinds)
        tracemalloc.start()
        postdominators(prog)
        p = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return p

    small, big = peak(5000), peak(40000)
    assert big < 12 * small, (small, big)       # 8x the instructions: ~8x the memory, not 64x
