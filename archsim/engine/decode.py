"""Timing decode: (Program, Machine) -> per-instruction arrays the timing engine reads at issue.

For every instruction: the registers and predicates it reads and writes (the scoreboard), its
issue class (ALU, tensor, global/shared memory, barrier, ...), the pipe that serves it on this
machine, how long it holds that pipe (``ceil(warp_width / lanes_per_cycle)`` for its dtype) and
its result latency (the pipe's, or the pipe's override for the opcode's latency key). MMA holds
the sub-core's tensor units for the MAC steps its shape needs at the configured rate.
Nothing here is a per-kernel constant: everything comes from isa/opcodes.yaml and the config.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from archsim.errors import InputError
from archsim.isa.opcodes import BCAST, SRC_RANGES, opcodes, operand_width
from archsim.isa.program import FLAG_IMM0, NONE, Program

MAX_RD = 12
MAX_WR = 4

# issue classes
(CLS_ALU, CLS_TENSOR, CLS_LD_GLOBAL, CLS_ST_GLOBAL, CLS_LD_SHARED, CLS_ST_SHARED, CLS_LDMATRIX, CLS_CPASYNC,
 CLS_CPCOMMIT, CLS_CPWAIT, CLS_DMA, CLS_DMAWAIT, CLS_RMA, CLS_RMAWAIT, CLS_BRANCH, CLS_EXIT, CLS_BAR,
 CLS_BARGRID, CLS_NOP, CLS_DMA_PUT, CLS_RMA_PUT, CLS_WGMMA, CLS_WGFENCE, CLS_WGCOMMIT,
 CLS_WGWAIT, CLS_MBAR, CLS_MBWAIT, CLS_TMA, CLS_CBAR, CLS_DSLD, CLS_DSST, CLS_TMAST, CLS_BKCOMMIT,
 CLS_BKWAIT) = range(34)   # CLS_DMA: dma.get,
# CLS_RMA: rma.get; CLS_MBAR: mbarrier.init / arrive / expect_tx; CLS_CBAR: barrier.cluster; CLS_TMAST: a bulk
# tensor store; CLS_BKCOMMIT / CLS_BKWAIT: cp.async.bulk.commit_group / wait_group

# scoreboard producer kinds (for the stall breakdown)
SRC_FIXED, SRC_SHORT, SRC_LONG = 0, 1, 2

_PIPE_DTYPE = {"b": "b", "i64": "i64", "f32": "f32", "f16x2": "f16x2", "bf16x2": "bf16x2", "f64": "f64",
               "pred": "pred"}
_TENSOR_DTYPE = {"f16": "fp16", "bf16": "bf16", "tf32": "tf32", "f64": "fp64"}


class Decoded(NamedTuple):
    nwr: np.ndarray       # int8 [n]
    wr: np.ndarray        # int16 [n, MAX_WR] registers written (in order: results mark them ready)
    nopd: np.ndarray      # int8 [n]
    opd: np.ndarray       # int16 [n, MAX_RD + MAX_WR] the distinct registers read, then written (first
                          # occurrences): what the scoreboard checks (an mma's C and D are one set)
    prd: np.ndarray       # int8 [n, 2] predicates read (-1 none): guard, source
    pwr: np.ndarray       # int8 [n] predicate written (-1 none)
    cls: np.ndarray       # int8 [n] CLS_*
    pipe: np.ndarray      # int8 [n] pipe index (-1: tensor / dma / rma blocks)
    ii: np.ndarray        # int32 [n] cycles the pipe (or tensor unit) is held
    lat: np.ndarray       # int32 [n] issue -> result, cycles (memory ops: address generation only)
    src_kind: np.ndarray  # int8 [n] SRC_* of the value it produces
    flops: np.ndarray     # int64 [n] flops per active lane
    access: np.ndarray    # int32 [n] bytes per lane of a memory access (wgmma: the scratchpad bytes a warp's
                          # slice reads: its A rows unless .rs, and a quarter of B, read once a warpgroup)
    bcast: np.ndarray     # int8 [n] DMA broadcast mode (archsim.isa.opcodes.BCAST_*; 0: none)


_CLS = {"ld": None, "st": None, "ldmatrix": CLS_LDMATRIX, "cpasync": CLS_CPASYNC, "cpcommit": CLS_CPCOMMIT,
        "cpwait": CLS_CPWAIT, "mma": CLS_TENSOR, "dma_get": CLS_DMA, "dma_put": CLS_DMA_PUT, "dma_wait": CLS_DMAWAIT,
        "rma_put": CLS_RMA_PUT, "rma_get": CLS_RMA, "rma_wait": CLS_RMAWAIT, "bra": CLS_BRANCH, "exit": CLS_EXIT,
        "bar": CLS_BAR, "bargrid": CLS_BARGRID, "nop": CLS_NOP, "wgmma": CLS_WGMMA, "wgfence": CLS_WGFENCE,
        "wgcommit": CLS_WGCOMMIT, "wgwait": CLS_WGWAIT, "mbinit": CLS_MBAR, "mbarrive": CLS_MBAR, "mbtx": CLS_MBAR,
        "mbwait": CLS_MBWAIT, "tma": CLS_TMA, "clusterbar": CLS_CBAR, "dsld": CLS_DSLD, "dsst": CLS_DSST,
        "mbremote": CLS_MBAR, "tmastore": CLS_TMAST, "bkcommit": CLS_BKCOMMIT, "bkwait": CLS_BKWAIT}


def pipe_names(machine) -> list[str]:
    return list(machine.pipes.keys())


def _pipe_for(machine, unit: str, where: str) -> int:
    for i, (name, p) in enumerate(machine.pipes.items()):
        if unit in p.serves:
            return i
    raise InputError(where, f"no pipe of {machine.name} serves unit class {unit!r}",
                     "units served: " + ", ".join(sorted({u for p in machine.pipes.values() for u in p.serves})))


def _lanes(pipe, dtype: str) -> float:
    lanes = pipe.lanes_per_cycle
    if dtype in lanes:
        return float(lanes[dtype])
    if "b" in lanes:
        return float(lanes["b"])
    raise KeyError(dtype)


def _static(op, machine, where: str) -> tuple:
    """What decode gives every instruction of opcode ``op`` on ``machine`` whatever its operands:
    (cls, pipe, ii, lat, src_kind, flops, access, bcast); InputError (naming ``where``, the first
    instruction that uses it) when the machine cannot run it."""
    if op.sem in ("ld", "st"):
        glob = op.space == "global"
        cls = (CLS_LD_GLOBAL if glob else CLS_LD_SHARED) if op.sem == "ld" else (CLS_ST_GLOBAL if glob else CLS_ST_SHARED)
    else:
        cls = _CLS.get(op.sem, CLS_ALU)
    pipe, ii, lat, src_kind = -1, 1, 1, 0
    if op.feature == "tma" and machine.tma is None:
        raise InputError(where, f"{op.mnemonic}: {machine.name} has no tensor memory accelerator",
                         "a machine with tma:")
    if op.feature == "cluster" and machine.clusters is None:
        raise InputError(where, f"{op.mnemonic}: {machine.name} has no thread-block clusters",
                         "a machine with clusters:")
    if op.unit == "tensor":
        t = machine.tensor
        if t is None:
            raise InputError(where, f"{op.mnemonic}: {machine.name} has no tensor units", "a machine with tensor:")
        if op.feature == "wgmma" and t.wgmma is None:
            raise InputError(where, f"{op.mnemonic}: the tensor units of {machine.name} have no warpgroup MMA",
                             "a machine with tensor.wgmma")
    if op.sem in ("wgfence", "wgcommit", "wgwait"):
        pass                            # issue only: their waits are the core's (core.py)
    elif op.unit == "tensor":
        tdt = _TENSOR_DTYPE[op.src_dtype]
        wg = op.sem == "wgmma"          # a warp's 16-row slice of the warpgroup's tile, at the unit's peak
        rate = t.mac_steps_per_cycle.get(tdt) if wg else \
            t.mma_sync_steps_per_cycle.get(tdt, t.mac_steps_per_cycle.get(tdt))
        if rate is None:
            raise InputError(where, f"{op.mnemonic}: the tensor units of {machine.name} do not run {tdt}",
                             "dtypes: " + ", ".join(t.mac_steps_per_cycle))
        m, nn, k = op.shape
        if wg:
            m //= 4
        am, an, ak = t.mac_array
        steps = math.ceil(m / am) * math.ceil(nn / an) * math.ceil(k / ak)
        units = max(t.units_per_core // machine.cores.subcores, 1)
        busy = max(1, math.ceil(steps / (rate * units) - 1e-3))   # a rate such as 16/3 given as 5.3333
        ii, lat, src_kind = busy, busy + (t.wgmma.latency_cycles if wg else t.latency_cycles), SRC_FIXED
    elif op.unit not in ("dma", "rma"):
        pipe = _pipe_for(machine, op.unit, where)
        p = list(machine.pipes.values())[pipe]
        dt = _PIPE_DTYPE[op.dtype]
        try:
            lanes = _lanes(p, dt)
        except KeyError:
            raise InputError(where, f"{op.mnemonic}: pipe {list(machine.pipes)[pipe]!r} of {machine.name} has "
                             f"no rate for dtype {dt}", "dtypes: " + ", ".join(p.lanes_per_cycle))
        ii = max(1, math.ceil(machine.cores.warp_width / lanes))
        lat = p.latency_overrides_cycles.get(op.latency, p.latency_cycles) if op.latency != "mem" \
            else p.latency_cycles
        src_kind = SRC_SHORT if op.unit == "mufu" else SRC_FIXED
    if cls in (CLS_LD_SHARED, CLS_LDMATRIX):
        src_kind = SRC_SHORT
    elif cls in (CLS_LD_GLOBAL, CLS_DSLD):
        src_kind = SRC_LONG
    access = op.access_bytes
    if op.sem == "wgmma":
        m, nn, k = op.shape
        access = (0 if op.operands[1] == "r4" else m // 4 * k * 2) + nn * k * 2 // 4
    return cls, pipe, ii, lat, src_kind, op.flops_per_lane, access, BCAST[op.bcast]


_STATIC_COLS = (("cls", np.int8), ("pipe", np.int8), ("ii", np.int32), ("lat", np.int32), ("src_kind", np.int8),
                ("flops", np.int64), ("access", np.int32), ("bcast", np.int8))   # _static's tuple, in order


def decode(prog: Program, machine) -> Decoded:
    ops = opcodes()
    n = len(prog)
    out = {
        "nwr": np.zeros(n, np.int8), "wr": np.full((n, MAX_WR), -1, np.int16),
        "nopd": np.zeros(n, np.int8), "opd": np.full((n, MAX_RD + MAX_WR), -1, np.int16),
        "prd": np.full((n, 2), -1, np.int8), "pwr": np.full(n, -1, np.int8),
    }
    # the opcode-only columns: one row per distinct opcode, worked out at its first instruction
    # (so an opcode the machine cannot run is reported there, as a walk in program order would)
    opcol = prog.op.astype(np.int64)
    kinds, first, inv = np.unique(opcol, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    table = [None] * len(kinds)
    for j in order:
        table[j] = _static(ops[int(kinds[j])], machine, prog.where(int(first[j])))
    for c, (name, dtype) in enumerate(_STATIC_COLS):
        out[name] = np.array([row[c] for row in table], dtype)[inv.reshape(-1)]
    # the operand columns: the registers and predicates each instruction reads and writes
    nwr, wrm, prd, pwr = out["nwr"], out["wr"], out["prd"], out["pwr"]
    nopd, opdm = out["nopd"], out["opd"]
    dst = prog.dst.tolist()
    srcs = [prog.src0.tolist(), prog.src1.tolist(), prog.src2.tolist(), prog.src3.tolist()]
    flags_l = prog.flags.tolist()
    pred_l = prog.pred.tolist()
    op_l = opcol.tolist()
    for pc in range(n):
        op = ops[op_l[pc]]
        rd, wr = [], []
        slot = 0
        flags = flags_l[pc]
        preds = []
        for kind in op.operands:    # (an accumulator range, Ra, is not scoreboarded: wgmma.fence and
            if kind in ("R", "R2", "R4"):   # wgmma.wait_group order it, core.py)
                wr += range(dst[pc], dst[pc] + operand_width(op, kind))
            elif kind == "P":
                pwr[pc] = dst[pc]
            elif kind in SRC_RANGES + ("ri", "m"):
                r = srcs[slot][pc]
                if r != NONE and not (kind == "ri" and flags & (FLAG_IMM0 << slot)):
                    rd += range(r, r + operand_width(op, kind))
                slot += 1
            elif kind == "p":
                preds.append(srcs[slot][pc])
                slot += 1
        if pred_l[pc] != NONE:
            preds.insert(0, pred_l[pc])
        if wr:
            nwr[pc] = len(wr)
            wrm[pc, :len(wr)] = wr
        if rd or wr:
            both = list(dict.fromkeys(rd + wr))
            nopd[pc] = len(both)
            opdm[pc, :len(both)] = both
        if preds:
            prd[pc, :len(preds)] = preds[:2]
    return Decoded(**out)
