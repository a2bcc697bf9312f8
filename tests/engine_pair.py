"""Both functional engines on one program: the numba engine and the pure-Python reference twin
must agree on memory, registers, predicates and instruction count."""

from __future__ import annotations

import numpy as np

from archsim.engine.functional import run_functional

ENGINES = ("numba", "reference")


def copy_args(args: dict) -> dict:
    """The arguments with every array copied (each engine writes its own)."""
    return {p: (v.copy() if isinstance(v, np.ndarray) else v) for p, v in args.items()}


def run_both(prog, args, launch=None) -> dict:
    """{engine: result} of running prog on copies of args with each engine, after checking they agree."""
    out = {eng: run_functional(prog, copy_args(args), launch, engine=eng) for eng in ENGINES}
    a, b = out["numba"], out["reference"]
    assert np.array_equal(a.memory.data, b.memory.data), \
        f"memory differs at bytes {np.nonzero(a.memory.data != b.memory.data)[0][:8]}"
    assert np.array_equal(a.regs, b.regs), np.argwhere(a.regs != b.regs)[:5]
    assert np.array_equal(a.preds, b.preds)
    assert a.warp_instructions == b.warp_instructions, (a.warp_instructions, b.warp_instructions)
    return out
