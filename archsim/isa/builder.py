"""The emitter API: build a Program in Python, the way workload emitters and tests do.

    b = Builder("vecadd", params=("x", "y", "out", "n"))
    i, n = b.reg(), b.reg()
    b.s2r(i, "%tid.x")                    # any mnemonic: dots become underscores
    b.ldparam(n, "n")
    p = b.pred()
    b.setp_ge_i64(p, i, n)
    b.exit(pred=p)
    ...
    prog = b.build()

Operands: ``Reg`` (from ``b.reg()`` / ``b.regs(k)``), ``Pred`` (``b.pred()``), ``Mem(base, offset)``
(``b.mem(reg, off)``), labels as strings (``b.label("LOOP")`` then ``b.bra("LOOP")``), special
registers as ``"%tid.x"``, parameters by name, immediates as Python ints or floats. The builder
goes through the same operand rules as the assembler, so a built program disassembles to text
that assembles back to an equal program.
"""

from __future__ import annotations

from dataclasses import dataclass

from archsim.errors import InputError
from archsim.isa import cfg
from archsim.isa.asm import parse_imm
from archsim.isa.opcodes import MAX_PREDS, MAX_REGS, SPECIAL, SRC_RANGES, by_mnemonic, operand_width
from archsim.isa.program import FLAG_IMM0, FLAG_PRED_NEG, NONE, ArgSpec, Launch, Program


@dataclass(frozen=True)
class Reg:
    n: int

    def __add__(self, k: int) -> "Reg":
        return Reg(self.n + k)

    def __str__(self) -> str:
        return f"r{self.n}"


@dataclass(frozen=True)
class Pred:
    n: int

    def __str__(self) -> str:
        return f"p{self.n}"


@dataclass(frozen=True)
class Mem:
    base: Reg | None
    offset: int = 0


class Builder:
    def __init__(self, name: str, params=(), shared_bytes: int = 0, launch: Launch | None = None,
                 args: tuple[ArgSpec, ...] = ()):
        self.name = name
        self.params = tuple(params)
        self.shared_bytes = int(shared_bytes)
        self.launch = launch
        self.args = tuple(args)
        self._rows: list[dict] = []
        self._labels: dict[str, int] = {}
        self._fixups: list[tuple[int, str]] = []
        self._next_reg = 0
        self._next_pred = 0
        self._max_reg = -1

    # ---- resources
    def reg(self) -> Reg:
        return self.regs(1)

    def regs(self, k: int) -> Reg:
        """k consecutive registers; returns the first."""
        if self._next_reg + k > MAX_REGS:
            raise InputError(f"kernel {self.name}", f"needs more than {MAX_REGS} registers", f"r0..r{MAX_REGS - 1}")
        r = Reg(self._next_reg)
        self._next_reg += k
        return r

    def pred(self) -> Pred:
        if self._next_pred >= MAX_PREDS:
            raise InputError(f"kernel {self.name}", f"needs more than {MAX_PREDS} predicates", "p0..p7")
        p = Pred(self._next_pred)
        self._next_pred += 1
        return p

    @staticmethod
    def mem(base: Reg | None, offset: int = 0) -> Mem:
        return Mem(base, int(offset))

    def label(self, name: str) -> None:
        if name in self._labels:
            raise InputError(f"kernel {self.name}", f"label {name!r} defined twice", "unique labels")
        self._labels[name] = len(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    # ---- instructions
    def emit(self, mnemonic: str, *operands, pred: Pred | None = None, neg: bool = False) -> None:
        table = by_mnemonic()
        if mnemonic not in table:
            raise InputError(f"kernel {self.name}", f"unknown opcode {mnemonic!r}", "see isa/opcodes.yaml")
        op = table[mnemonic]
        if len(operands) != len(op.operands):
            raise InputError(f"kernel {self.name}", f"{mnemonic} takes {len(op.operands)} operands, got "
                             f"{len(operands)}", f"{mnemonic} {', '.join(op.operands)}")
        row = {"op": op.code, "pred": NONE, "flags": 0, "line": 0}
        if pred is not None:
            row["pred"] = pred.n
            if neg:
                row["flags"] |= FLAG_PRED_NEG
        slot = 0
        nmem = 0

        def bad(kind, v):                 # built only when raised (emit runs thousands of times a kernel)
            return InputError(f"kernel {self.name}", f"{mnemonic}: operand {v!r} does not fit kind {kind}",
                              f"{mnemonic} {', '.join(op.operands)}")

        for kind, v in zip(op.operands, operands):
            if kind in ("R", "R2", "R4", "Ra"):
                if not isinstance(v, Reg):
                    raise bad(kind, v)
                row["dst"] = v.n
                self._max_reg = max(self._max_reg, v.n + operand_width(op, kind) - 1)
            elif kind == "P":
                if not isinstance(v, Pred):
                    raise bad(kind, v)
                row["dst"] = v.n
            elif kind in SRC_RANGES:
                if not isinstance(v, Reg):
                    raise bad(kind, v)
                row[f"src{slot}"] = v.n
                self._max_reg = max(self._max_reg, v.n + operand_width(op, kind) - 1)
                slot += 1
            elif kind == "ri":
                if isinstance(v, Reg):
                    row[f"src{slot}"] = v.n
                    self._max_reg = max(self._max_reg, v.n)
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    row[f"src{slot}"] = NONE
                    is_float_op = op.dtype in ("f32", "f64", "f16x2", "bf16x2")
                    if isinstance(v, float) and not is_float_op:
                        raise bad(kind, v)
                    row["imm"] = parse_imm(repr(float(v)) if is_float_op else str(int(v)), op.dtype)
                    row["flags"] |= FLAG_IMM0 << slot
                else:
                    raise bad(kind, v)
                slot += 1
            elif kind == "p":
                if not isinstance(v, Pred):
                    raise bad(kind, v)
                row[f"src{slot}"] = v.n
                slot += 1
            elif kind == "m":
                if not isinstance(v, Mem):
                    raise bad(kind, v)
                row[f"src{slot}"] = v.base.n if v.base is not None else NONE
                if v.base is not None:
                    self._max_reg = max(self._max_reg, v.base.n)
                row["imm" if nmem == 0 else "imm2"] = v.offset
                nmem += 1
                slot += 1
            elif kind == "l":
                if not isinstance(v, str):
                    raise bad(kind, v)
                self._fixups.append((len(self._rows), v))
            elif kind == "s":
                name = v[1:] if isinstance(v, str) and v.startswith("%") else v
                if name not in SPECIAL:
                    raise bad(kind, v)
                row["imm"] = SPECIAL[name]
            elif kind == "k":
                if v not in self.params:
                    raise InputError(f"kernel {self.name}", f"{mnemonic}: unknown parameter {v!r}",
                                     "parameters: " + ", ".join(self.params))
                row["imm"] = self.params.index(v)
            elif kind == "i":
                row["imm"] = int(v)
        self._rows.append(row)

    def __getattr__(self, name: str):
        """b.add_f32(d, a, b) == b.emit("add.f32", d, a, b)."""
        if name.startswith("_"):
            raise AttributeError(name)
        table = by_mnemonic()
        mnemonic = name.replace("_", ".")
        if mnemonic not in table:
            # mnemonics with underscores of their own (none today) would need emit()
            raise AttributeError(f"no opcode {mnemonic!r} (from Builder.{name})")

        def _emit(*operands, pred=None, neg=False):
            self.emit(mnemonic, *operands, pred=pred, neg=neg)

        return _emit

    # ---- result
    def build(self) -> Program:
        for pc, name in self._fixups:
            if name not in self._labels:
                raise InputError(f"kernel {self.name}", f"unknown label {name!r}", "a label defined with b.label()")
            self._rows[pc]["imm"] = self._labels[name]
        for name, pc in self._labels.items():
            if pc >= len(self._rows):
                raise InputError(f"kernel {self.name}", f"label {name!r} has no instruction after it",
                                 "a label names the instruction that follows it")
        prog = Program.from_rows(
            self.name, self._rows, params=self.params, nregs=max(1, self._max_reg + 1, self._next_reg),
            shared_bytes=self.shared_bytes, launch=self.launch, args=self.args,
            labels=tuple(sorted((pc, n) for n, pc in self._labels.items())), source=f"<kernel {self.name}>")
        cfg.set_reconvergence(prog)
        return prog
