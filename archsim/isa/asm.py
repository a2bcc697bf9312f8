"""Assembly text <-> Program.  ``assemble(disassemble(p)) == p`` for every program.

Syntax and semantics: isa/README.md.  Every error is an InputError naming ``file:line``, what is
wrong, and what is allowed.
"""

from __future__ import annotations

import difflib
import math
import re
import struct
from pathlib import Path

import numpy as np

from archsim.errors import InputError
from archsim.isa import cfg
from archsim.isa.opcodes import (MAX_PREDS, MAX_REGS, SPECIAL, SPECIAL_NAMES, SRC_RANGES, by_mnemonic, opcodes,
                                 operand_width)
from archsim.isa.program import (ARG_DTYPES, ARG_INITS, FLAG_IMM0, FLAG_PRED_NEG, NONE, ArgSpec, Launch,
                                 Program)

_LABEL_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.$]*)\s*:\s*(.*)$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.$]*$")
_REG_RE = re.compile(r"^r(\d+)$")
_PRED_RE = re.compile(r"^p(\d+)$")
_GUARD_RE = re.compile(r"^@(!?)p(\d+)\s+(.*)$")
_MEM_RE = re.compile(r"^\[\s*(?:(r\d+)\s*(?:([+-])\s*([^\]\s]+))?|([^\]\s]+))\s*\]$")
_DST_KINDS = ("R", "R2", "R4", "P", "Ra")
_SRC_KINDS = ("r", "r2", "r4", "rc", "ri", "p", "m")
DIRECTIVES = (".kernel", ".param", ".regs", ".shared", ".launch", ".arg")


# ----------------------------------------------------------------------------- immediates
def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", np.float32(x)))[0]


def _f16_bits(x: float) -> int:
    return int(np.array([x], dtype=np.float16).view(np.uint16)[0])


def _bf16_bits(x: float) -> int:
    """Round-to-nearest-even float -> bfloat16 bits (NaN stays NaN)."""
    b = _f32_bits(x)
    if (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF):
        return ((b >> 16) | 0x40) & 0xFFFF
    b += 0x7FFF + ((b >> 16) & 1)
    return (b >> 16) & 0xFFFF


def _bits_to_float(bits: int, dtype: str) -> float:
    if dtype == "f32":
        return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
    if dtype == "f64":
        return struct.unpack("<d", struct.pack("<Q", bits & 0xFFFFFFFFFFFFFFFF))[0]
    if dtype == "f16x2":
        return float(np.array([bits & 0xFFFF], dtype=np.uint16).view(np.float16)[0])
    if dtype == "bf16x2":
        return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]
    raise ValueError(dtype)


def _to_signed64(v: int) -> int:
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= (1 << 63) else v


_FLOAT_DTYPES = ("f32", "f64", "f16x2", "bf16x2")


def parse_imm(text: str, dtype: str) -> int:
    """Immediate text -> the signed 64-bit value stored in Program.imm. Raises ValueError."""
    t = text.strip().lower()
    neg = t.startswith("-")
    body = t[1:] if neg or t.startswith("+") else t
    if body.startswith("0x"):
        v = int(body, 16)
        if v >= (1 << 64):
            raise ValueError("hex immediate wider than 64 bits")
        return _to_signed64(-v if neg else v)
    is_int = re.fullmatch(r"\d+", body) is not None
    if dtype not in _FLOAT_DTYPES:
        if not is_int:
            raise ValueError("expected an integer")
        v = -int(body) if neg else int(body)
        if not -(1 << 63) <= v < (1 << 64):
            raise ValueError("integer immediate does not fit 64 bits")
        return _to_signed64(v)
    if body not in ("inf", "nan") and not re.fullmatch(r"(\d+\.?\d*|\.\d+)(e[+-]?\d+)?", body):
        raise ValueError("expected a number")
    x = float(t)
    if dtype == "f32":
        return _f32_bits(x)
    if dtype == "f64":
        return _to_signed64(struct.unpack("<Q", struct.pack("<d", x))[0])
    h = _f16_bits(x) if dtype == "f16x2" else _bf16_bits(x)
    return h | (h << 16)


def format_imm(v: int, dtype: str) -> str:
    """Inverse of parse_imm: a float literal where that round-trips exactly, else hex bits."""
    if dtype not in _FLOAT_DTYPES:
        return str(int(v))
    u = int(v) & 0xFFFFFFFFFFFFFFFF
    if dtype in ("f16x2", "bf16x2") and (u >> 32 or (u & 0xFFFF) != ((u >> 16) & 0xFFFF)):
        return hex(u)
    if dtype == "f32" and u >> 32:
        return hex(u)
    x = _bits_to_float(u, dtype)
    if math.isfinite(x):
        text = repr(x)
        try:
            if parse_imm(text, dtype) == _to_signed64(u):
                return text
        except ValueError:
            pass
    elif math.isinf(x):
        text = "inf" if x > 0 else "-inf"
        if parse_imm(text, dtype) == _to_signed64(u):
            return text
    return hex(u)


# ----------------------------------------------------------------------------- assembler
def _closest(word: str, choices) -> str:
    near = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return ("did you mean " + ", ".join(near) + "?") if near else ""


class _Src:
    """One source file being assembled, for errors."""

    def __init__(self, name: str):
        self.name = name

    def err(self, lineno: int, what: str, allowed: str = "") -> InputError:
        return InputError(f"{self.name}:{lineno}", what, allowed)


def _split_operands(text: str) -> list[str]:
    text = text.strip()
    return [o.strip() for o in text.split(",")] if text else []


def _strip_comment(line: str) -> str:
    cut = len(line)
    for marker in ("//", ";", "#"):
        i = line.find(marker)
        if i >= 0:
            cut = min(cut, i)
    return line[:cut].strip()


def _dims(text: str, src: _Src, lineno: int, what: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise src.err(lineno, f"bad {what} {text!r}", "X or X,Y or X,Y,Z with positive integers")
    if not 1 <= len(vals) <= 3 or any(v <= 0 for v in vals):
        raise src.err(lineno, f"bad {what} {text!r}", "X or X,Y or X,Y,Z with positive integers")
    return tuple(vals + [1] * (3 - len(vals)))


def _int_arg(text: str, src: _Src, lineno: int, what: str, lo: int = 0) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise src.err(lineno, f"{what} needs an integer, got {text!r}", f"an integer >= {lo}")
    if v < lo:
        raise src.err(lineno, f"{what} must be >= {lo}, got {v}", f"an integer >= {lo}")
    return v


def _directive(words: list[str], meta: dict, src: _Src, lineno: int) -> None:
    d = words[0]
    rest = words[1:]
    if d == ".kernel":
        if len(rest) != 1 or not _NAME_RE.match(rest[0]):
            raise src.err(lineno, ".kernel needs one name", "a name of letters, digits, _ . $")
        if meta["name"] is not None:
            raise src.err(lineno, "a second .kernel directive", "one kernel per file")
        meta["name"] = rest[0]
    elif d == ".param":
        if len(rest) != 1 or not _NAME_RE.match(rest[0]):
            raise src.err(lineno, ".param needs one name", "a name of letters, digits, _ . $")
        if rest[0] in meta["params"]:
            raise src.err(lineno, f"parameter {rest[0]!r} declared twice", "unique parameter names")
        meta["params"].append(rest[0])
    elif d == ".regs":
        if len(rest) != 1:
            raise src.err(lineno, ".regs needs one number", f"1..{MAX_REGS}")
        n = _int_arg(rest[0], src, lineno, ".regs", 1)
        if n > MAX_REGS:
            raise src.err(lineno, f".regs {n} is more than the ISA has", f"1..{MAX_REGS}")
        meta["nregs"] = n
    elif d == ".shared":
        if len(rest) != 1:
            raise src.err(lineno, ".shared needs one number of bytes", "an integer >= 0")
        meta["shared"] = _int_arg(rest[0], src, lineno, ".shared")
    elif d == ".launch":
        kv = {}
        for w in rest:
            if "=" not in w:
                raise src.err(lineno, f"bad .launch field {w!r}", "grid=X[,Y,Z] block=X[,Y,Z] [cluster=N]")
            k, v = w.split("=", 1)
            if k not in ("grid", "block", "cluster"):
                raise src.err(lineno, f"unknown .launch field {k!r}", "grid, block, cluster")
            kv[k] = _int_arg(v, src, lineno, ".launch cluster", 1) if k == "cluster" else _dims(v, src, lineno, k)
        if not {"grid", "block"} <= set(kv):
            raise src.err(lineno, ".launch needs both grid= and block=", "grid=X[,Y,Z] block=X[,Y,Z] [cluster=N]")
        if kv["grid"][0] % kv.get("cluster", 1):
            raise src.err(lineno, f".launch cluster={kv['cluster']} does not divide grid x {kv['grid'][0]}",
                          "a cluster size dividing grid x")
        meta["launch"] = Launch(kv["grid"], kv["block"], cluster=kv.get("cluster", 1))
    elif d == ".arg":
        meta["args"].append(_parse_arg(rest, src, lineno))
    else:
        raise src.err(lineno, f"unknown directive {d!r}", ", ".join(DIRECTIVES))


def _parse_arg(rest: list[str], src: _Src, lineno: int) -> ArgSpec:
    usage = ".arg NAME TYPE[N,..] random|zeros|ones|range|unbacked, or .arg NAME = INTEGER"
    if len(rest) == 3 and rest[1] == "=":
        try:
            value = int(rest[2], 0)
        except ValueError:
            raise src.err(lineno, f".arg {rest[0]}: value {rest[2]!r} is not an integer", usage)
        return ArgSpec(name=rest[0], value=value)
    if len(rest) != 3:
        raise src.err(lineno, "malformed .arg", usage)
    name, typ, init = rest
    m = re.fullmatch(r"([a-z0-9]+)\[([0-9, ]+)\]", typ)
    if not m:
        raise src.err(lineno, f".arg {name}: bad type {typ!r}", usage)
    if m.group(1) not in ARG_DTYPES:
        raise src.err(lineno, f".arg {name}: unknown element type {m.group(1)!r}", ", ".join(ARG_DTYPES))
    try:
        shape = tuple(int(x) for x in m.group(2).split(","))
    except ValueError:
        raise src.err(lineno, f".arg {name}: bad shape {m.group(2)!r}", "positive integers")
    if any(s <= 0 for s in shape):
        raise src.err(lineno, f".arg {name}: bad shape {m.group(2)!r}", "positive integers")
    if init not in ARG_INITS:
        raise src.err(lineno, f".arg {name}: unknown init {init!r}", ", ".join(ARG_INITS))
    return ArgSpec(name=name, dtype=m.group(1), shape=shape, init=init)


def _reg(text: str, src: _Src, lineno: int, count: int = 1) -> int:
    m = _REG_RE.match(text)
    if not m:
        raise src.err(lineno, f"expected a register, got {text!r}", f"r0..r{MAX_REGS - 1}")
    n = int(m.group(1))
    if n + count > MAX_REGS:
        what = f"register {text}" if count == 1 else f"register range {text}..r{n + count - 1}"
        raise src.err(lineno, f"{what} is beyond the register file", f"r0..r{MAX_REGS - 1}")
    return n


def _pred(text: str, src: _Src, lineno: int) -> int:
    m = _PRED_RE.match(text)
    if not m:
        raise src.err(lineno, f"expected a predicate, got {text!r}", f"p0..p{MAX_PREDS - 1}")
    n = int(m.group(1))
    if n >= MAX_PREDS:
        raise src.err(lineno, f"predicate {text} does not exist", f"p0..p{MAX_PREDS - 1}")
    return n


def _first_pass(text: str, src, meta: dict, table) -> tuple[list, dict, dict]:
    """Directives into ``meta``; labels -> the index of the instruction after them; instructions as
    (line, guard, mnemonic, operand texts), their operands not yet read."""
    pending = []
    labels: dict[str, int] = {}
    label_lines: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw)
        while line:
            m = _LABEL_RE.match(line)
            if not m or line.startswith("."):
                break
            name = m.group(1)
            if name in labels:
                raise src.err(lineno, f"label {name!r} defined twice (first at line {label_lines[name]})",
                              "unique labels")
            labels[name] = len(pending)
            label_lines[name] = lineno
            line = m.group(2).strip()
        if not line:
            continue
        if line.startswith("."):
            if pending:
                raise src.err(lineno, f"directive {line.split()[0]} after the first instruction",
                              "directives before instructions")
            _directive(line.split(), meta, src, lineno)
            continue
        guard = None
        g = _GUARD_RE.match(line)
        if g:
            guard = (_pred("p" + g.group(2), src, lineno), g.group(1) == "!")
            line = g.group(3).strip()
        elif line.startswith("@"):
            raise src.err(lineno, f"bad guard {line.split()[0]!r}", "@pN or @!pN with N in 0..7")
        parts = line.split(None, 1)
        mn = parts[0]
        if mn not in table:
            hint = _closest(mn, table)
            raise src.err(lineno, f"unknown opcode {mn!r}" + (f"; {hint}" if hint else ""),
                          "see isa/opcodes.yaml")
        pending.append((lineno, guard, mn, _split_operands(parts[1] if len(parts) > 1 else "")))
    return pending, labels, label_lines


def _mem_operand(text: str, mn: str, src, lineno: int) -> tuple[int, int]:
    """``[rN]``, ``[rN+imm]``, ``[rN-imm]`` or ``[imm]`` -> (base register or NONE, offset)."""
    m = _MEM_RE.match(text)
    if not m:
        raise src.err(lineno, f"{mn}: bad memory operand {text!r}", "[rN], [rN+imm], [rN-imm] or [imm]")
    if m.group(1):
        r = _reg(m.group(1), src, lineno)
        off_text = (m.group(2) or "+") + (m.group(3) or "0")
    else:
        r = NONE
        off_text = m.group(4)
    try:
        off = parse_imm(off_text.replace("+", "", 1) if off_text.startswith("+") else off_text, "i64")
    except ValueError:
        if r == NONE:
            raise src.err(lineno, f"{mn}: bad memory operand {text!r}", "[rN], [rN+imm], [rN-imm] or [imm]")
        raise src.err(lineno, f"{mn}: bad offset in {text!r}", "an integer or 0x hex offset")
    return r, off


def _encode(op, lineno: int, guard, mn: str, opnds: list, src, labels: dict, params: dict,
            meta: dict) -> tuple[dict, int]:
    """One instruction's row of the Program arrays, and the highest register it names (-1: none)."""
    if len(opnds) != len(op.operands):
        sig = ", ".join(op.operands) or "no operands"
        raise src.err(lineno, f"{mn} takes {len(op.operands)} operand(s), got {len(opnds)}", f"{mn} {sig}")
    row = {"op": op.code, "line": lineno, "pred": NONE, "flags": 0}
    if guard is not None:
        row["pred"] = guard[0]
        if guard[1]:
            row["flags"] |= FLAG_PRED_NEG
    max_reg = -1
    slot = 0
    nmem = 0
    for kind, text in zip(op.operands, opnds):
        if kind in ("R", "R2", "R4", "Ra"):
            width = operand_width(op, kind)
            row["dst"] = _reg(text, src, lineno, width)
            max_reg = max(max_reg, row["dst"] + width - 1)
        elif kind == "P":
            row["dst"] = _pred(text, src, lineno)
        elif kind in SRC_RANGES:
            r = _reg(text, src, lineno, operand_width(op, kind))
            row[f"src{slot}"] = r
            max_reg = max(max_reg, r + operand_width(op, kind) - 1)
            slot += 1
        elif kind == "ri":
            if _REG_RE.match(text):
                r = _reg(text, src, lineno)
                row[f"src{slot}"] = r
                max_reg = max(max_reg, r)
            elif _PRED_RE.match(text) or text.startswith("%"):
                raise src.err(lineno, f"{mn}: operand {text!r} must be a register or an immediate",
                              f"{mn} {', '.join(op.operands)}")
            else:
                try:
                    row["imm"] = parse_imm(text, op.dtype)
                except ValueError as e:
                    raise src.err(lineno, f"{mn}: bad immediate {text!r}: {e}",
                                  "integer, 0x hex, or float literal" if op.dtype in _FLOAT_DTYPES
                                  else "a 64-bit integer or 0x hex")
                row[f"src{slot}"] = NONE
                row["flags"] |= FLAG_IMM0 << slot
            slot += 1
        elif kind == "p":
            row[f"src{slot}"] = _pred(text, src, lineno)
            slot += 1
        elif kind == "m":
            r, off = _mem_operand(text, mn, src, lineno)
            if r != NONE:
                max_reg = max(max_reg, r)
            row[f"src{slot}"] = r
            row["imm" if nmem == 0 else "imm2"] = off
            nmem += 1
            slot += 1
        elif kind == "l":
            if text not in labels:
                hint = _closest(text, labels)
                raise src.err(lineno, f"{mn}: unknown label {text!r}" + (f"; {hint}" if hint else ""),
                              "a label defined in this file")
            row["imm"] = labels[text]
        elif kind == "s":
            name = text[1:] if text.startswith("%") else None
            if name not in SPECIAL:
                raise src.err(lineno, f"{mn}: unknown special register {text!r}",
                              " ".join("%" + s for s in SPECIAL_NAMES))
            row["imm"] = SPECIAL[name]
        elif kind == "k":
            if text not in params:
                raise src.err(lineno, f"{mn}: unknown parameter {text!r}",
                              "parameters: " + (", ".join(meta["params"]) or "none declared (.param NAME)"))
            row["imm"] = params[text]
        elif kind == "i":
            try:
                row["imm"] = parse_imm(text, "i64")
            except ValueError:
                raise src.err(lineno, f"{mn}: bad immediate {text!r}", "an integer")
    return row, max_reg


def assemble(text: str, source: str = "<asm>") -> Program:
    """Assembly text -> Program (with reconvergence points computed)."""
    src = _Src(source)
    meta = {"name": None, "params": [], "nregs": None, "shared": 0, "launch": None, "args": []}
    table = by_mnemonic()
    pending, labels, label_lines = _first_pass(text, src, meta, table)
    if meta["name"] is None:
        raise src.err(1, "missing .kernel directive", ".kernel NAME before the first instruction")
    for name, pc in labels.items():
        if pc >= len(pending):
            raise src.err(label_lines[name], f"label {name!r} has no instruction after it",
                          "a label names the instruction that follows it")
    params = {n: i for i, n in enumerate(meta["params"])}
    rows = []
    max_reg = -1
    for lineno, guard, mn, opnds in pending:
        row, top = _encode(table[mn], lineno, guard, mn, opnds, src, labels, params, meta)
        rows.append(row)
        max_reg = max(max_reg, top)
    nregs = meta["nregs"]
    if nregs is None:
        nregs = max(1, max_reg + 1)
    elif max_reg >= nregs:
        bad = next(r for r in rows if _max_reg_of(r) >= nregs)
        raise src.err(bad["line"], f"register r{_max_reg_of(bad)} is beyond .regs {nregs}",
                      f"r0..r{nregs - 1}, or raise .regs")
    for a in meta["args"]:
        if a.name not in params:
            raise src.err(1, f".arg {a.name}: no parameter of that name",
                          "parameters: " + (", ".join(meta["params"]) or "none"))
    prog = Program.from_rows(
        meta["name"], rows, params=tuple(meta["params"]), nregs=nregs, shared_bytes=meta["shared"],
        launch=meta["launch"], args=tuple(meta["args"]),
        labels=tuple(sorted((pc, name) for name, pc in labels.items())), source=source)
    cfg.set_reconvergence(prog)
    return prog


def _max_reg_of(row: dict) -> int:
    op = opcodes()[row["op"]]
    best = -1
    slot = 0
    for kind in op.operands:
        if kind in ("R", "R2", "R4", "Ra"):
            best = max(best, row["dst"] + operand_width(op, kind) - 1)
        elif kind in SRC_RANGES + ("ri", "m", "p"):
            v = row.get(f"src{slot}", NONE)
            if kind != "p" and v != NONE:
                best = max(best, v + operand_width(op, kind) - 1)
            slot += 1
    return best


def assemble_file(path: str | Path, subst: dict[str, str] | None = None) -> Program:
    """Assemble a .s file; ``subst`` replaces each key in its text with the value first (micro asm's
    ``{n}``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(str(path), "no such file", "a path to an assembly (.s) file")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"cannot read: {e.__class__.__name__}", "a readable UTF-8 text file")
    for k, v in (subst or {}).items():
        text = text.replace(k, v)
    return assemble(text, source=p.name)


# ----------------------------------------------------------------------------- disassembler
def disassemble_instruction(prog: Program, pc: int, label_of: dict[int, str] | None = None) -> str:
    op = opcodes()[int(prog.op[pc])]
    if label_of is None:
        label_of = {p: n for p, n in prog.labels}
    parts = []
    slot = 0
    nmem = 0
    flags = int(prog.flags[pc])
    for kind in op.operands:
        if kind in ("R", "R2", "R4", "Ra"):
            parts.append(f"r{int(prog.dst[pc])}")
        elif kind == "P":
            parts.append(f"p{int(prog.dst[pc])}")
        elif kind in SRC_RANGES:
            parts.append(f"r{int(getattr(prog, f'src{slot}')[pc])}")
            slot += 1
        elif kind == "ri":
            if flags & (FLAG_IMM0 << slot):
                parts.append(format_imm(int(prog.imm[pc]), op.dtype))
            else:
                parts.append(f"r{int(getattr(prog, f'src{slot}')[pc])}")
            slot += 1
        elif kind == "p":
            parts.append(f"p{int(getattr(prog, f'src{slot}')[pc])}")
            slot += 1
        elif kind == "m":
            base = int(getattr(prog, f"src{slot}")[pc])
            off = int((prog.imm if nmem == 0 else prog.imm2)[pc])
            if base == NONE:
                parts.append(f"[{off}]")
            elif off == 0:
                parts.append(f"[r{base}]")
            else:
                parts.append(f"[r{base}{'+' if off > 0 else '-'}{abs(off)}]")
            nmem += 1
            slot += 1
        elif kind == "l":
            target = int(prog.imm[pc])
            parts.append(label_of.get(target, f"L{target}"))
        elif kind == "s":
            parts.append("%" + SPECIAL_NAMES[int(prog.imm[pc])])
        elif kind == "k":
            parts.append(prog.params[int(prog.imm[pc])])
        elif kind == "i":
            parts.append(str(int(prog.imm[pc])))
    guard = ""
    if int(prog.pred[pc]) != NONE:
        guard = f"@{'!' if flags & FLAG_PRED_NEG else ''}p{int(prog.pred[pc])} "
    return f"{guard}{op.mnemonic}" + (" " + ", ".join(parts) if parts else "")


def _fmt_dims(d) -> str:
    d = list(d)
    while len(d) > 1 and d[-1] == 1:
        d.pop()
    return ",".join(str(x) for x in d)


def disassemble(prog: Program) -> str:
    out = [f".kernel {prog.name}"]
    out += [f".param {p}" for p in prog.params]
    out.append(f".regs {prog.nregs}")
    out.append(f".shared {prog.shared_bytes}")
    if prog.launch is not None:
        out.append(f".launch grid={_fmt_dims(prog.launch.grid)} block={_fmt_dims(prog.launch.block)}"
                   + (f" cluster={prog.launch.cluster}" if prog.launch.cluster > 1 else ""))
    for a in prog.args:
        if a.is_buffer:
            out.append(f".arg {a.name} {a.dtype}[{','.join(str(s) for s in a.shape)}] {a.init}")
        else:
            out.append(f".arg {a.name} = {a.value}")
    label_of: dict[int, list[str]] = {}
    for pc, name in prog.labels:
        label_of.setdefault(pc, []).append(name)
    first = {pc: names[0] for pc, names in label_of.items()}
    for pc in range(len(prog)):
        for name in label_of.get(pc, ()):
            out.append(f"{name}:")
        out.append("    " + disassemble_instruction(prog, pc, first))
    return "\n".join(out) + "\n"
