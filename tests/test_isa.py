"""The ISA as data, the assembler (round trips, exact error messages), the builder and the checker."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from archsim.errors import InputError
from archsim.isa.asm import assemble, disassemble, format_imm, parse_imm
from archsim.isa.builder import Builder, Pred, Reg
from archsim.isa.check import check, check_program
from archsim.isa.opcodes import OPERAND_KINDS, SEM_NAMES, by_mnemonic, opcodes, tables
from archsim.paths import data_dir

HEADER = ".kernel k\n.param x\n"


def err(text):
    with pytest.raises(InputError) as e:
        check_program(assemble(text, "k.s"))
    return e.value.line()


# ----------------------------------------------------------------------------- the table
def test_opcode_table_covers_design_set():
    names = set(by_mnemonic())
    for needed in ("s2r", "add.i64", "setp.lt.i64", "fma.f32", "fma.f16x2", "fma.bf16x2", "fma.f64", "ex2.f32",
                   "rcp.f32", "rsqrt.f32", "tanh.f32", "cvt.f16x2.f32", "cvt.f32.bf16", "shfl.bfly.b64",
                   "ld.global.v4.b32", "st.shared.b32", "cp.async.16", "cp.async.wait", "dma.get", "dma.wait",
                   "rma.put", "mma.m16n8k16.f32.f16", "mma.m16n8k16.f32.bf16", "bra", "bar.sync", "exit"):
        assert needed in names, needed
    t = tables()
    assert len(t.sem) == len(opcodes()) == len(names)
    assert {o.sem for o in opcodes()} <= set(SEM_NAMES)
    assert all(k in OPERAND_KINDS for o in opcodes() for k in o.operands)
    mma = by_mnemonic()["mma.m16n8k16.f32.f16"]
    assert mma.unit == "tensor" and mma.flops_per_lane * 32 == 2 * 16 * 8 * 16


def test_an_opcode_row_with_an_access_size_that_is_not_a_power_of_two_is_refused(tmp_path):
    from archsim.isa.opcodes import _parse

    f = tmp_path / "opcodes.yaml"
    f.write_text("opcodes:\n  - {mnemonic: ld.global.v3.b32, operands: [r3, m], unit: lsu, latency: mem, sem: ld,"
                 " dtype: b, space: global, access_bytes: 12}\n")
    with pytest.raises(InputError) as e:
        _parse(f)
    assert e.value.line() == ("isa/opcodes.yaml: opcode 0: ld.global.v3.b32: access_bytes 12 (0 or a power of two)")


# ----------------------------------------------------------------------------- immediates
@given(st.floats(width=32, allow_nan=False))
def test_f32_immediates_round_trip(x):
    bits = parse_imm(repr(float(x)), "f32")
    assert parse_imm(format_imm(bits, "f32"), "f32") == bits
    assert np.array([bits], np.uint32).view(np.float32)[0] == np.float32(x)


@given(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1), st.sampled_from(["i64", "b", "f32", "f16x2", "f64"]))
def test_any_bits_round_trip_through_text(v, dtype):
    if dtype in ("f32",):
        v &= 0xFFFFFFFF
    if dtype == "f16x2":
        v &= 0xFFFFFFFF
    assert parse_imm(format_imm(v, dtype), dtype) == parse_imm(hex(v & (2 ** 64 - 1)), dtype) if dtype != "i64" \
        else parse_imm(format_imm(v, dtype), dtype) == v


def test_half_immediates_fill_both_halves():
    assert parse_imm("1.0", "f16x2") == 0x3C003C00
    assert parse_imm("1.0", "bf16x2") == 0x3F803F80
    assert parse_imm("0x3c000000", "f16x2") == 0x3C000000


# ----------------------------------------------------------------------------- round trips
def test_every_example_round_trips():
    files = sorted((data_dir("isa") / "examples").glob("*.s"))
    assert len(files) >= 5
    for f in files:
        p = assemble(f.read_text(), f.name)
        assert assemble(disassemble(p), f.name) == p, f.name


_SIMPLE = [m for m, o in by_mnemonic().items() if o.operands and all(k in ("R", "r", "ri", "P", "p") for k in o.operands)]


@st.composite
def programs(draw):
    """Random well-formed programs through the builder: ALU ops, guards, immediates, memory, branches."""
    b = Builder("h", params=("x", "n"), shared_bytes=draw(st.integers(0, 4096)))
    r = [b.reg() for _ in range(6)]
    p = [b.pred() for _ in range(3)]
    for reg in r:
        b.mov_b64(reg, draw(st.integers(-(2 ** 63), 2 ** 63 - 1)))
    for pr in p:
        b.setp_lt_i64(pr, r[0], draw(st.integers(-5, 5)))
    n = draw(st.integers(1, 25))
    b.label("TOP")
    for i in range(n):
        kind = draw(st.sampled_from(["alu", "alu", "alu", "mem", "special", "branch"]))
        guard = draw(st.sampled_from([None, None, p[0], p[1]]))
        neg = draw(st.booleans())
        if kind == "alu":
            m = draw(st.sampled_from(_SIMPLE))
            dtype = by_mnemonic()[m].dtype
            ops = []
            for k in by_mnemonic()[m].operands:
                if k in ("R", "r"):
                    ops.append(draw(st.sampled_from(r)))
                elif k in ("P", "p"):
                    ops.append(draw(st.sampled_from(p)))
                else:
                    if draw(st.booleans()):
                        ops.append(draw(st.sampled_from(r)))
                    elif dtype in ("f32", "f64", "f16x2", "bf16x2"):
                        ops.append(draw(st.floats(width=16, allow_nan=False)))
                    else:
                        ops.append(draw(st.integers(-1000, 1000)))
            b.emit(m, *ops, pred=guard, neg=neg)
        elif kind == "mem":
            m = draw(st.sampled_from(["ld.global.b32", "st.shared.b64", "ld.shared.v2.b32", "st.global.v4.b32"]))
            off = draw(st.integers(-64, 64))
            if m.startswith("ld"):
                b.emit(m, r[0], b.mem(draw(st.sampled_from(r)), off))
            else:
                b.emit(m, b.mem(draw(st.sampled_from(r + [None])), off), r[1])
        elif kind == "special":
            b.s2r(draw(st.sampled_from(r)), draw(st.sampled_from(["%tid.x", "%laneid", "%ctaid.y", "%clock"])))
            b.ldparam(draw(st.sampled_from(r)), draw(st.sampled_from(["x", "n"])))
        else:
            b.bra(draw(st.sampled_from(["TOP", "END"])), pred=p[2], neg=neg)
    b.label("END")
    b.exit()
    return b.build()


@given(programs())
def test_generated_programs_round_trip(prog):
    text = disassemble(prog)
    again = assemble(text, "gen.s")
    assert again == prog
    assert disassemble(again) == text


# ----------------------------------------------------------------------------- assembler errors
@pytest.mark.parametrize("body,message", [
    ("    frobnicate r1, r2\n    exit\n",
     "k.s:3: unknown opcode 'frobnicate' (see isa/opcodes.yaml)"),
    ("    add.f3 r1, r2, r3\n    exit\n",
     "k.s:3: unknown opcode 'add.f3'; did you mean add.f32, add.f64, add.f16x2? (see isa/opcodes.yaml)"),
    ("    mov.b64 r300, 1\n    exit\n",
     "k.s:3: register r300 is beyond the register file (r0..r254)"),
    ("    mov.b64 x3, 1\n    exit\n",
     "k.s:3: expected a register, got 'x3' (r0..r254)"),
    ("    setp.lt.i64 p9, r1, 0\n    exit\n",
     "k.s:3: predicate p9 does not exist (p0..p7)"),
    ("    add.i64 r1, r2\n    exit\n",
     "k.s:3: add.i64 takes 3 operand(s), got 2 (add.i64 R, r, ri)"),
    ("    bra NOWHERE\n    exit\n",
     "k.s:3: bra: unknown label 'NOWHERE' (a label defined in this file)"),
    ("    s2r r1, %tid.w\n    exit\n",
     "k.s:3: s2r: unknown special register '%tid.w' (%tid.x %tid.y %tid.z %ntid.x %ntid.y %ntid.z %ctaid.x "
     "%ctaid.y %ctaid.z %nctaid.x %nctaid.y %nctaid.z %laneid %warpid %nwarpid %clock %coreid %warpsize "
     "%cluster_ctarank %cluster_nctarank)"),
    ("    ldparam r1, y\n    exit\n",
     "k.s:3: ldparam: unknown parameter 'y' (parameters: x)"),
    ("    ld.global.b32 r1, [r2+]\n    exit\n",
     "k.s:3: ld.global.b32: bad memory operand '[r2+]' ([rN], [rN+imm], [rN-imm] or [imm])"),
    ("    ld.global.b32 r1, [r2+0x]\n    exit\n",
     "k.s:3: ld.global.b32: bad offset in '[r2+0x]' (an integer or 0x hex offset)"),
    ("    exit\n.regs 4\n",
     "k.s:4: directive .regs after the first instruction (directives before instructions)"),
    ("    mov.f32 r1, abc\n    exit\n",
     "k.s:3: mov.f32: bad immediate 'abc': expected a number (integer, 0x hex, or float literal)"),
    ("@p1x exit\n",
     "k.s:3: bad guard '@p1x' (@pN or @!pN with N in 0..7)"),
    ("A: exit\nA: exit\n",
     "k.s:4: label 'A' defined twice (first at line 3) (unique labels)"),
])
def test_assembler_errors_name_line_and_allowed(body, message):
    with pytest.raises(InputError) as e:
        assemble(HEADER + body, "k.s")
    assert e.value.line() == message


def test_missing_kernel_directive():
    with pytest.raises(InputError) as e:
        assemble("exit\n", "k.s")
    assert e.value.line() == "k.s:1: missing .kernel directive (.kernel NAME before the first instruction)"


def test_regs_directive_bounds_registers():
    with pytest.raises(InputError) as e:
        assemble(".kernel k\n.regs 2\n mov.b64 r2, 1\n exit\n", "k.s")
    assert e.value.line() == "k.s:3: register r2 is beyond .regs 2 (r0..r1, or raise .regs)"


# ----------------------------------------------------------------------------- checker
def test_checker_rejects_undefined_register():
    assert err(HEADER + "    mov.b64 r1, 1\n    add.i64 r2, r1, r3\n    exit\n") == \
        "k.s:4: register r3 is read before it is written on some path " \
        "(write a register (mov, ld, ...) on every path before reading it)"


def test_checker_rejects_register_defined_on_one_path_only():
    text = HEADER + """    s2r r0, %tid.x
    setp.lt.i64 p0, r0, 4
@p0 bra SKIP
    mov.b64 r1, 7
SKIP: add.i64 r2, r1, 1
    exit
"""
    assert err(text).startswith("k.s:7: register r1 is read before it is written on some path")


def test_checker_accepts_loop_carried_registers():
    check_program(assemble(HEADER + """    mov.b64 r0, 0
    mov.b64 r1, 0
LOOP: add.i64 r1, r1, r0
    add.i64 r0, r0, 1
    setp.lt.i64 p0, r0, 10
@p0 bra LOOP
    exit
""", "k.s"))


def test_checker_rejects_undefined_predicate():
    assert err(HEADER + "@p2 exit\n    exit\n").startswith("k.s:3: predicate p2 is read before it is set")


def test_checker_rejects_unbalanced_barrier():
    text = HEADER + """    s2r r0, %tid.x
    setp.lt.i64 p0, r0, 32
@p0 bra SKIP
    bar.sync
SKIP: exit
"""
    assert err(text) == ("k.s:6: bar.sync is not reached the same number of times on every path from the branch "
                         "at k.s:5 (unbalanced barrier) (barriers outside divergent branches, or on every path alike)")


def test_checker_accepts_barriers_in_uniform_loops_and_balanced_ifs():
    check_program(assemble(HEADER + """    mov.b64 r0, 0
    s2r r1, %tid.x
LOOP: bar.sync
    setp.lt.i64 p1, r1, 3
@p1 bra A
    bar.sync
    bra B
A:  bar.sync
B:  add.i64 r0, r0, 1
    setp.lt.i64 p0, r0, 4
@p0 bra LOOP
    exit
""", "k.s"))


def test_checker_rejects_running_off_the_end():
    assert err(HEADER + "    mov.b64 r0, 1\n") == \
        "k.s:3: control can run past the last instruction (end the program with an unguarded exit or bra)"



def test_check_remembers_only_programs_that_passed_and_looks_again_when_one_changes(monkeypatch):
    import archsim.isa.check as CK

    calls = []
    real = CK.check_program
    monkeypatch.setattr(CK, "check_program", lambda p: (calls.append(p.name), real(p)))
    good = assemble(HEADER + "    mov.b64 r1, 1\n    add.i64 r2, r1, 1\n    exit\n", "k.s")
    CK._PASSED.clear()
    check(good)
    check(good)
    assert calls == ["k"]                      # the second look was remembered
    bad = assemble(HEADER + "    mov.b64 r1, 1\n    add.i64 r2, r1, r3\n    exit\n", "k.s")
    for _ in range(2):                         # a program that failed fails again, with its message
        with pytest.raises(InputError, match="r3 is read before it is written"):
            check(bad)
    assert calls == ["k", "k", "k"]
    good.src0[1] = 3                           # the accepted program edited in place: checked again
    with pytest.raises(InputError, match="r3 is read before it is written"):
        check(good)

def test_checker_target_capabilities():
    from archsim.config.derived import capabilities
    from archsim.config.load import load_machine

    text = HEADER + """    mov.b64 r0, 0
    mov.b64 r1, 0
    mov.b64 r2, 0
    mov.b64 r3, 0
    mov.b64 r4, 0
    mov.b64 r5, 0
    mov.b64 r6, 0
    mov.b64 r7, 0
    mov.b64 r8, 0
    mov.b64 r9, 0
    mma.m16n8k16.f32.f16 r10, r0, r4, r6
    exit
"""
    prog = assemble(text, "k.s")
    check(prog, capabilities(load_machine("tiny-gpu")))
    sunway = capabilities(load_machine("tiny-sunway"))
    with pytest.raises(InputError) as e:
        check(prog, sunway)
    assert e.value.line().startswith(
        f"k.s:13: mma.m16n8k16.f32.f16: the target {sunway.name} has no tensor unit (units of {sunway.name}: ")
    big = assemble(".kernel k\n.shared 100000000\n exit\n", "k.s")
    with pytest.raises(InputError) as e:
        check(big, sunway)
    assert "needs 100000000 bytes of scratchpad per block" in e.value.line()


# ----------------------------------------------------------------------------- builder
def test_builder_matches_assembler():
    b = Builder("k", params=("x",))
    r0, r1 = b.reg(), b.reg()
    p = b.pred()
    b.s2r(r0, "%tid.x")
    b.ldparam(r1, "x")
    b.setp_ge_i64(p, r0, 4)
    b.exit(pred=p)
    b.label("L")
    b.mul_f32(r0, r0, 0.5)
    b.st_global_b32(b.mem(r1, 8), r0)
    b.bra("L", pred=p, neg=True)
    b.exit()
    built = b.build()
    text = """.kernel k
.param x
    s2r r0, %tid.x
    ldparam r1, x
    setp.ge.i64 p0, r0, 4
@p0 exit
L:  mul.f32 r0, r0, 0.5
    st.global.b32 [r1+8], r0
@!p0 bra L
    exit
"""
    assert assemble(text, "k.s") == built
    assert isinstance(r0, Reg) and isinstance(p, Pred)


def test_builder_rejects_bad_operands():
    b = Builder("k")
    with pytest.raises(InputError) as e:
        b.emit("add.i64", b.reg(), 3, 4)
    assert "operand 3 does not fit kind r" in e.value.line()
    with pytest.raises(AttributeError):
        b.frobnicate()


def test_reconvergence_points():
    p = assemble(HEADER + """    s2r r0, %tid.x
    setp.lt.i64 p0, r0, 4
@p0 bra ELSE
    add.i64 r0, r0, 1
    bra JOIN
ELSE: add.i64 r0, r0, 2
JOIN: exit
""", "k.s")
    assert list(p.reconv) == [-1, -1, 6, -1, 6, -1, -1]
