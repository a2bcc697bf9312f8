"""The model's side of measure_gpu.py gemm_parts: where the GEMM main loop's k-tile cycles go.

The workload emitter's tensor-core GEMM (128 x 128 x 64 tile, 4 warps, 4 stages: the chip twin's
kernel) is timed with parts of its main loop left out, as the chip's twin was built with
-DTW_NO_COPY / LDM / MMA / BAR: the loop's cp.async copies, ldmatrix fragment loads, mma or barrier.
Cycles a k-tile are the slope between two depths (K and 2 K), on one block alone and on one wave (a
block on every SM), whole simulations; the chip's figures (measured/<machine>-gemm-parts.json) beside.

    python scripts/gemm_parts.py [--hw h100] [--grids 1,wave] [--variants full,copy_only,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

VARIANTS = {"full": (), "no_copy": ("copy",), "no_ldm": ("ldm",), "no_mma": ("mma",), "no_bar": ("bar",),
            "mma_only": ("copy", "ldm", "bar"), "copy_only": ("ldm", "mma"), "mma_ldm": ("copy", "bar")}
PART_OPS = {"copy": ("cp.async.16", "cp.async.8", "cp.async.4"), "ldm": ("ldmatrix.x4", "ldmatrix.x4.trans",
                                                                         "ldmatrix.x2", "ldmatrix.x1"),
            "mma": ("mma.m16n8k16.f32.f16", "mma.m16n8k16.f32.bf16"), "bar": ("bar.sync",)}
MEASURED = {"h100": "configs/reference/measured/h100-sxm5-gemm-parts.json"}


def opcode_names() -> list:
    from archsim.isa.opcodes import opcodes

    return [o.mnemonic for o in opcodes()]


def _renumber(prog, cols: dict, old_to_new: np.ndarray):
    """Point the branches and reconvergence points in ``cols`` (prog's rows after instructions
    were dropped or inserted) at the new positions of the instructions they named; prog's labels,
    moved the same way."""
    names = opcode_names()
    bra = np.array([names[o] == "bra" for o in cols["op"]], dtype=bool)
    cols["imm"][bra] = old_to_new[cols["imm"][bra]]
    r = cols["reconv"]
    r[r >= 0] = old_to_new[r[r >= 0]]
    return tuple((int(old_to_new[i]), s) for i, s in prog.labels)


def drop(prog, lo: int, hi: int, mnemonics: set):
    """prog without the instructions in [lo, hi) whose mnemonic is in ``mnemonics``; branch targets,
    reconvergence points and labels follow the instructions they named."""
    from dataclasses import replace

    from archsim.isa.program import ARRAYS

    names = opcode_names()
    keep = np.array([not (lo <= i < hi and names[o] in mnemonics) for i, o in enumerate(prog.op)], dtype=bool)
    new_index = np.cumsum(np.concatenate([[0], keep.astype(np.int64)]))   # kept rows before each index
    cols = {a: getattr(prog, a)[keep].copy() for a in ARRAYS}
    labels = _renumber(prog, cols, new_index)
    line = prog.line[keep] if prog.line is not None else None
    return replace(prog, **cols, labels=labels, line=line)


def zero_before(prog, at: int, regs: list):
    """prog with ``mov.b64 r, 0`` for each of ``regs`` inserted before instruction ``at`` (a loop's
    head: the branch back to it lands after them)."""
    from dataclasses import replace

    from archsim.isa.opcodes import by_mnemonic
    from archsim.isa.program import ARRAYS, FLAG_IMM0, NONE

    k = len(regs)
    row = {a: NONE for a in ARRAYS}
    row.update(op=by_mnemonic()["mov.b64"].code, imm=0, imm2=0, flags=FLAG_IMM0, reconv=NONE)
    cols = {}
    for a in ARRAYS:
        v = getattr(prog, a)
        ins = np.array([r if a == "dst" else row[a] for r in regs], dtype=v.dtype)
        cols[a] = np.concatenate([v[:at], ins, v[at:]])
    old = np.arange(len(prog) + 1)
    labels = _renumber(prog, cols, old + k * (old >= at))
    line = np.concatenate([prog.line[:at], np.zeros(k, prog.line.dtype), prog.line[at:]]) if prog.line is not None \
        else None
    return replace(prog, **cols, labels=labels, line=line)


def loop_range(prog) -> tuple[int, int]:
    """The GEMM main loop: from its KLOOP label to the branch back to it."""
    names = opcode_names()
    start = dict((s, i) for i, s in prog.labels)["KLOOP"]
    back = [i for i in range(len(prog)) if names[prog.op[i]] == "bra" and prog.imm[i] == start]
    return start, back[-1] + 1


def cycles(machine, caps, m: int, n: int, k: int, parts: tuple) -> tuple[int, float]:
    from archsim.engine.timing import shared_buffers, time_kernel
    from archsim.workloads.emit.gemm_gpu import Tile, gemm_kernel

    g = gemm_kernel(caps, m, n, k, "fp16", "f32", tile=Tile(128, 128, 64, 4, 4))
    lo, hi = loop_range(g.program)
    gone = {op for p in parts for op in PART_OPS[p]}
    prog = drop(g.program, lo, hi, gone)
    if "ldm" in parts:   # the fragments the loop no longer loads: registers written once, before it
        names = opcode_names()
        regs = sorted({int(g.program.dst[i]) + j for i in range(lo, hi) if names[g.program.op[i]] in PART_OPS["ldm"]
                       for j in range(4)})
        prog = zero_before(prog, lo, regs)
    args = g.args(*shared_buffers(machine, g.buffer_bytes().values()))
    t0 = time.time()
    t = time_kernel(prog, machine, g.launch, args)
    return t.cycles, time.time() - t0


def main() -> None:
    from archsim.config import load_machine
    from archsim.config.derived import capabilities

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--grids", default="1,wave", help="1 (one block) and / or wave (a block on every SM)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--k", type=int, default=2048, help="the shallower depth (the other is twice it)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    machine = load_machine(a.hw)
    caps = capabilities(machine)
    sms = machine.groups * machine.cores.per_group
    tiles = (12, 11) if sms == 132 else (sms, 1)
    chip = {}
    if a.hw in MEASURED and os.path.exists(MEASURED[a.hw]):
        for row in json.load(open(MEASURED[a.hw]))["benchmarks"]["gemm_parts"]["points"]:
            chip[(row[0], row[1])] = row[7]
    rows = []
    print(f"{'grid':>9} {'variant':>9} {'model cyc/ktile':>16} {'chip':>8} {'error':>7} {'wall s':>7}")
    for grid in a.grids.split(","):
        m, n, gname = (128, 128, "1 block") if grid == "1" else (128 * tiles[1], 128 * tiles[0], "one wave")
        for v in a.variants.split(","):
            c1, w1 = cycles(machine, caps, m, n, a.k, VARIANTS[v])
            c2, w2 = cycles(machine, caps, m, n, 2 * a.k, VARIANTS[v])
            per = (c2 - c1) / (a.k // 64)
            ref = chip.get((gname, v))
            err = f"{(per - ref) / ref * 100:+.1f}%" if ref else ""
            print(f"{gname:>9} {v:>9} {per:16.1f} {ref or '':>8} {err:>7} {w1 + w2:7.1f}", flush=True)
            rows.append({"grid": gname, "variant": v, "model_cycles_per_ktile": per, "chip": ref})
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
