"""isa/opcodes.yaml -> Python tables and numpy lookup arrays (indexed by opcode number).

The engine never sees mnemonics: it indexes ``SEM``, ``DTYPE``, ``UNIT`` ... with ``Program.op``.
Semantic classes, dtypes and unit classes are small integer codes defined here; the YAML names
them, and an unknown name in the YAML is an error naming the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import yaml

from archsim.errors import InputError
from archsim.paths import data_dir

# ---- semantic classes (execute.py branches on these; numba sees them as integer constants) ----
SEM_NAMES = (
    "nop", "bra", "exit", "bar", "bargrid", "s2r", "ldparam", "mov", "selp",
    "add", "sub", "mul", "min", "max", "fma", "div", "rem", "and", "or", "xor", "not", "shl", "shr", "sra",
    "setp", "pand", "por", "pxor", "pnot", "vote_any", "vote_all", "neg", "abs",
    "ex2", "lg2", "rcp", "rsqrt", "sqrt", "tanh", "cvt",
    "shfl_bfly", "shfl_down", "shfl_up", "shfl_idx",
    "ld", "st", "ldmatrix", "cpasync", "cpcommit", "cpwait", "mma",
    "dma_get", "dma_put", "dma_wait", "rma_put", "rma_get", "rma_wait",
    "wgmma", "wgfence", "wgcommit", "wgwait",
    "mbinit", "mbarrive", "mbtx", "mbwait", "tma",
    "clusterbar", "dsld", "dsst", "mbremote", "tmastore", "bkcommit", "bkwait",
)
SEM = {n: i for i, n in enumerate(SEM_NAMES)}
for _n, _i in SEM.items():
    globals()["S_" + _n.upper()] = _i

# ---- value types ----
DTYPE_NAMES = ("b", "i64", "f32", "f16x2", "bf16x2", "f64", "pred")
DT = {n: i for i, n in enumerate(DTYPE_NAMES)}
DT_B, DT_I64, DT_F32, DT_F16X2, DT_BF16X2, DT_F64, DT_PRED = range(len(DTYPE_NAMES))
# cvt / mma source formats
SRC_DTYPE_NAMES = ("none", "f16", "f16h", "bf16", "bf16h", "f32", "i64", "f64", "tf32")
SDT = {n: i for i, n in enumerate(SRC_DTYPE_NAMES)}
SDT_NONE, SDT_F16, SDT_F16H, SDT_BF16, SDT_BF16H, SDT_F32, SDT_I64, SDT_F64, SDT_TF32 = range(len(SRC_DTYPE_NAMES))

# ---- unit classes (a target must serve an opcode's unit; see config capabilities) ----
UNIT_NAMES = ("int", "fp32", "fp16", "fp64", "mufu", "conv", "shfl", "lsu", "tensor", "ctrl", "sync", "dma", "rma")
UNIT = {n: i for i, n in enumerate(UNIT_NAMES)}

CMP_NAMES = ("none", "eq", "ne", "lt", "le", "gt", "ge")
CMP = {n: i for i, n in enumerate(CMP_NAMES)}
SPACE_NAMES = ("none", "global", "shared")
SPACE = {n: i for i, n in enumerate(SPACE_NAMES)}
SPACE_NONE, SPACE_GLOBAL, SPACE_SHARED = range(3)
# DMA broadcast modes (dma.get.bcast.*); the names are those of the config's dma.broadcast_modes
BCAST_NAMES = ("none", "row", "column", "array")
BCAST = {n: i for i, n in enumerate(BCAST_NAMES)}
BCAST_NONE, BCAST_ROW, BCAST_COLUMN, BCAST_ARRAY = range(4)

OPERAND_KINDS = ("R", "R2", "R4", "r", "r2", "r4", "ri", "P", "p", "m", "l", "s", "k", "i", "Ra", "rc")
DST_RANGES = ("R", "R2", "R4")      # register ranges an instruction writes (Ra: read and written)
SRC_RANGES = ("r", "r2", "r4", "rc")  # register ranges an instruction reads (rc: `rank` coordinates)
# capabilities an opcode needs beyond its unit (archsim.config.derived.Capabilities.features);
# cluster_tma: both a TMA unit and thread-block clusters
FEATURE_NAMES = ("none", "wgmma", "tma", "cluster", "cluster_tma")

SPECIAL_NAMES = (
    "tid.x", "tid.y", "tid.z", "ntid.x", "ntid.y", "ntid.z", "ctaid.x", "ctaid.y", "ctaid.z",
    "nctaid.x", "nctaid.y", "nctaid.z", "laneid", "warpid", "nwarpid", "clock", "coreid", "warpsize",
    "cluster_ctarank", "cluster_nctarank",
)
SPECIAL = {n: i for i, n in enumerate(SPECIAL_NAMES)}

MAX_REGS = 255  # r0 .. r254
MAX_PREDS = 8   # p0 .. p7


@dataclass(frozen=True)
class Opcode:
    code: int
    mnemonic: str
    operands: tuple[str, ...]
    unit: str
    latency: str
    sem: str
    dtype: str
    flops_per_lane: int
    cmp: str = "none"
    space: str = "none"
    access_bytes: int = 0
    signed: int = 0
    src_dtype: str = "none"
    matrices: int = 0
    trans: int = 0
    shape: tuple[int, int, int] = (0, 0, 0)
    strided: int = 0          # dma.get.s / dma.put.s: count blocks of bsize bytes, stride apart in global memory
    bcast: str = "none"       # DMA broadcast mode (BCAST_NAMES)
    feature: str = "none"     # a capability the target must have (FEATURE_NAMES)
    rank: int = 0             # cp.async.bulk.tensor: the box's dimensions (its rc operand's width)
    multicast: int = 0        # cp.async.bulk.tensor.Nd.multicast: a cluster mask register after the coordinates


_FIELDS = {"mnemonic", "operands", "unit", "latency", "sem", "dtype", "flops_per_lane", "cmp", "space",
           "access_bytes", "signed", "src_dtype", "matrices", "trans", "shape",
           "strided", "bcast", "feature", "rank", "multicast"}


def _bad(row: int, what: str, allowed: str) -> InputError:
    return InputError(f"isa/opcodes.yaml: opcode {row}", what, allowed)


def _parse(path) -> tuple[Opcode, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))   # libyaml: fast
        except yaml.YAMLError:
            doc = yaml.safe_load(text)     # raises again, with the pure-Python parser's message
    except yaml.YAMLError as e:
        raise InputError(str(path), f"not valid YAML: {e}".splitlines()[0], "YAML")
    rows = doc.get("opcodes") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise InputError(str(path), "missing the 'opcodes' list", "a mapping with key 'opcodes'")
    out = []
    seen = set()
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise _bad(i, "row is not a mapping", "mnemonic, operands, unit, ...")
        extra = set(r) - _FIELDS
        if extra:
            raise _bad(i, f"unknown field {sorted(extra)[0]!r}", ", ".join(sorted(_FIELDS)))
        mn = r.get("mnemonic")
        if not isinstance(mn, str) or mn in seen:
            raise _bad(i, f"missing or duplicate mnemonic {mn!r}", "a unique string")
        seen.add(mn)
        for key, names in (("sem", SEM), ("dtype", DT), ("unit", UNIT)):
            if r.get(key) not in names:
                raise _bad(i, f"{mn}: unknown {key} {r.get(key)!r}", ", ".join(names))
        for key, names in (("cmp", CMP), ("space", SPACE), ("src_dtype", SDT), ("bcast", BCAST),
                           ("feature", {n: 0 for n in FEATURE_NAMES})):
            if r.get(key, "none") not in names:
                raise _bad(i, f"{mn}: unknown {key} {r.get(key)!r}", ", ".join(names))
        ab = int(r.get("access_bytes", 0))
        if ab & (ab - 1):                 # the engine's alignment checks mask with access_bytes - 1
            raise _bad(i, f"{mn}: access_bytes {ab}", "0 or a power of two")
        ops = tuple(r.get("operands") or ())
        for k in ops:
            if k not in OPERAND_KINDS:
                raise _bad(i, f"{mn}: unknown operand kind {k!r}", " ".join(OPERAND_KINDS))
        out.append(Opcode(
            code=len(out), mnemonic=mn, operands=ops, unit=r["unit"], latency=str(r["latency"]), sem=r["sem"],
            dtype=r["dtype"], flops_per_lane=int(r.get("flops_per_lane", 0)), cmp=r.get("cmp", "none"),
            space=r.get("space", "none"), access_bytes=int(r.get("access_bytes", 0)), signed=int(r.get("signed", 0)),
            src_dtype=r.get("src_dtype", "none"), matrices=int(r.get("matrices", 0)), trans=int(r.get("trans", 0)),
            shape=tuple(r.get("shape", (0, 0, 0))), strided=int(r.get("strided", 0)), bcast=r.get("bcast", "none"),
            feature=r.get("feature", "none"), rank=int(r.get("rank", 0)), multicast=int(r.get("multicast", 0)),
        ))
        if "Ra" in ops and (ops[0] != "Ra" or out[-1].shape[0] * out[-1].shape[1] % 128):
            raise _bad(i, f"{mn}: an accumulator range (Ra) comes first, of a shape whose m x n splits over 128 "
                          "threads", "operands [Ra, ...] and shape [64, N, K]")
        if ("rc" in ops) != (1 <= out[-1].rank <= 5):
            raise _bad(i, f"{mn}: a coordinate range (rc) and a rank go together", "rank 1 .. 5 with an rc operand")
    return tuple(out)


@lru_cache(maxsize=None)
def opcodes() -> tuple[Opcode, ...]:
    return _parse(data_dir("isa") / "opcodes.yaml")


@lru_cache(maxsize=None)
def by_mnemonic() -> dict[str, Opcode]:
    return {o.mnemonic: o for o in opcodes()}


class OpTables(NamedTuple):
    """Per-opcode lookup arrays (from isa/opcodes.yaml); numba passes it to the engine's @njit functions, indexed by Program.op."""

    sem: np.ndarray
    dtype: np.ndarray
    unit: np.ndarray
    cmp: np.ndarray
    space: np.ndarray
    access_bytes: np.ndarray
    signed: np.ndarray
    src_dtype: np.ndarray
    nregs_dst: np.ndarray
    nregs_src: np.ndarray
    matrices: np.ndarray
    trans: np.ndarray
    flops_per_lane: np.ndarray
    shape_m: np.ndarray
    shape_n: np.ndarray
    shape_k: np.ndarray
    strided: np.ndarray       # dma.get.s / dma.put.s
    bcast: np.ndarray         # DMA broadcast mode (archsim.isa.opcodes.BCAST_*)
    wg_rs: np.ndarray         # wgmma whose A comes from registers (.rs)
    rank: np.ndarray          # cp.async.bulk.tensor: dimensions of its box
    multicast: np.ndarray     # cp.async.bulk.tensor.Nd.multicast


@lru_cache(maxsize=None)
def tables():
    """Numpy lookup arrays indexed by opcode number, for the engine."""
    ops = opcodes()

    def arr(f, dtype=np.int32):
        return np.array([f(o) for o in ops], dtype=dtype)

    return OpTables(
        sem=arr(lambda o: SEM[o.sem]),
        dtype=arr(lambda o: DT[o.dtype]),
        unit=arr(lambda o: UNIT[o.unit]),
        cmp=arr(lambda o: CMP[o.cmp]),
        space=arr(lambda o: SPACE[o.space]),
        access_bytes=arr(lambda o: o.access_bytes),
        signed=arr(lambda o: o.signed),
        src_dtype=arr(lambda o: SDT[o.src_dtype]),
        nregs_dst=arr(lambda o: operand_width(o, o.operands[0]) if o.operands and o.operands[0] in DST_RANGES + ("Ra",)
                      else 0),
        nregs_src=arr(lambda o: operand_width(o, o.operands[1]) if o.sem in ("st", "dsst") else 0),
        matrices=arr(lambda o: o.matrices),
        trans=arr(lambda o: o.trans),
        flops_per_lane=arr(lambda o: o.flops_per_lane, np.int64),
        shape_m=arr(lambda o: o.shape[0]),
        shape_n=arr(lambda o: o.shape[1]),
        shape_k=arr(lambda o: o.shape[2]),
        strided=arr(lambda o: o.strided),
        bcast=arr(lambda o: BCAST[o.bcast]),
        wg_rs=arr(lambda o: int(o.sem == "wgmma" and o.operands[1] == "r4")),
        rank=arr(lambda o: o.rank),
        multicast=arr(lambda o: o.multicast),
    )


_WIDTHS = {"R": 1, "R2": 2, "R4": 4, "r": 1, "r2": 2, "r4": 4, "ri": 1, "m": 1}


def operand_width(op: Opcode, kind: str) -> int:
    """Registers an operand of this kind names (0: none, e.g. a predicate or an immediate); an
    accumulator range (Ra) holds one f32 a thread of the m x n tile over a warpgroup's 128 threads;
    a coordinate range (rc) one coordinate a dimension of the box, then (multicast) the cluster mask."""
    if kind == "Ra":
        return op.shape[0] * op.shape[1] // 128
    if kind == "rc":
        return op.rank + op.multicast
    return _WIDTHS.get(kind, 0)
