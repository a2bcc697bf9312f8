"""The value slice (engine/value_slice.py): which instructions' values a timing run needs, and
timing runs that skip the others giving the same records as runs that compute every value."""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.engine import value_slice as VS
from archsim.isa import opcodes as O
from archsim.isa.program import FLAG_NO_VALUE
from archsim.micro import run_micro


def _marks(prog, backed=False) -> dict[str, bool]:
    """needed() by the text of each instruction (the first occurrence of each)."""
    need, _ = VS.needed(prog, backed)
    ops = O.opcodes()
    out = {}
    for pc in range(len(prog)):
        out.setdefault(f"{ops[int(prog.op[pc])].mnemonic}@{pc}", bool(need[pc]))
    return out


def _need_at(prog, pc, backed=False) -> bool:
    return bool(VS.needed(prog, backed)[0][pc])


HEAD = ".kernel k\n.param x\n.param y\n.shared 1024\n.launch grid=1 block=32\n"


def test_loads_that_feed_only_float_math_are_not_needed(asm):
    prog = asm(HEAD + """
        s2r r0, %tid.x
        shl.b64 r0, r0, 2
        ldparam r1, x
        add.i64 r2, r1, r0
        ld.global.b32 r3, [r2]
        ld.global.b32 r4, [r2+4]
        add.f32 r5, r3, r4
        st.global.b32 [r2], r5
        exit
""")
    need = VS.needed(prog, False)[0]
    # addresses: s2r, shl, ldparam, add.i64 are needed; the loads, the FP add and the store are not
    assert need.tolist() == [True, True, True, True, False, False, False, False, True]
    # global memory that holds values (a micro-benchmark reads it back): the store and its chain
    assert VS.needed(prog, True)[0].all()


def test_a_load_that_feeds_an_address_or_a_branch_is_needed(asm):
    prog = asm(HEAD + """
        ldparam r1, x
        ld.global.b64 r2, [r1]
        ld.global.b64 r3, [r2]
        ld.global.b64 r4, [r1+8]
        setp.lt.i64 p0, r4, 3
   @p0  exit
        ld.global.b64 r5, [r1+16]
        exit
""")
    need = VS.needed(prog, False)[0]
    assert need[1] and need[3] and need[4]      # address of a load; the branch's guard
    assert not need[2] and not need[6]          # values nothing reads


def test_a_guarded_definition_kills_nothing(asm):
    prog = asm(HEAD + """
        s2r r0, %tid.x
        setp.lt.i64 p0, r0, 4
        mov.b64 r1, 64
   @p0  mov.b64 r1, 128
        ld.shared.b32 r2, [r1]
        exit
""")
    assert VS.needed(prog, False)[0][2:4].all()   # both definitions may reach the address


def test_scratchpad_values_that_reach_an_address_keep_their_stores(asm):
    prog = asm(HEAD + """
        s2r r0, %tid.x
        shl.b64 r0, r0, 3
        mul.i64 r5, r0, 2
        st.shared.b64 [r0], r5
        bar.sync
        ld.shared.b64 r6, [r0]
        ld.shared.b32 r7, [r6]
        exit
""")
    need = VS.needed(prog, False)[0]
    assert need[2] and need[3] and need[5]       # the store, its value and the load reaching an address
    assert not need[6]


def test_a_needed_shuffle_makes_every_definition_of_its_source_needed(asm):
    prog = asm(HEAD + """
        s2r r0, %tid.x
        setp.lt.i64 p0, r0, 16
   @p0  bra A
        mov.b64 r1, 8
        mov.b64 r1, 16
        bra B
A:      mov.b64 r1, 24
B:      shfl.idx.b64 r2, r1, 0
        ld.shared.b32 r3, [r2]
        exit
""")
    need = VS.needed(prog, False)[0]
    assert need[3]           # dead along its own path, but another lane's shuffle may read it


def test_slots_are_watched_when_only_constant_addresses_reach_the_control(asm):
    prog = asm(SLOT_CLASH)
    P, watch = VS.timing_view(prog, False)
    assert watch == (0, 8)
    flagged = [O.opcodes()[int(prog.op[pc])].mnemonic for pc in range(len(prog)) if P.flags[pc] & FLAG_NO_VALUE]
    assert "st.shared.b64" in flagged            # the store through a register is not needed ...


# ... but it lands on the slot that counts the loop: the run notices, and times the launch again with
# every value computed (without the watch it would loop 5 times instead of once)
SLOT_CLASH = HEAD + """
        mov.b64 r1, 0
        st.shared.b64 [0], r1
        s2r r5, %tid.x
        mul.i64 r6, r5, 0
LOOP:   ld.shared.b64 r2, [0]
        add.i64 r2, r2, 1
        st.shared.b64 [0], r2
        mov.b64 r7, 100
        st.shared.b64 [r6], r7
        ld.shared.b64 r3, [0]
        setp.lt.i64 p0, r3, 5
   @p0  bra LOOP
        exit
"""


def _timing(prog, hw, monkeypatch, enabled):
    from archsim.engine.launch import Unbacked
    from archsim.engine.timing import time_kernel
    from archsim.isa.program import Launch

    monkeypatch.setattr(VS, "ENABLED", enabled)
    t = time_kernel(prog, load_machine(hw), Launch((1, 1, 1), (32, 1, 1)), {"x": Unbacked(64), "y": Unbacked(64)})
    return t.cycles, t.warp_instructions, t.stall.tolist()


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_a_write_on_a_watched_slot_gives_the_run_without_the_slice(asm, hw, monkeypatch):
    prog = asm(SLOT_CLASH)
    full = _timing(prog, hw, monkeypatch, False)
    assert full[1] == 4 + 8 + 1            # one trip: the register store set the counter to 100
    assert _timing(prog, hw, monkeypatch, True) == full


def _records(config, name, params, enabled, monkeypatch) -> list[dict]:
    monkeypatch.setattr(VS, "ENABLED", enabled)
    kernels = run_micro(name, load_machine(config), dict(params)).kernels
    return [{k: v for k, v in r.items() if "wall" not in k and k != "sim"} for r in kernels]


@pytest.mark.parametrize("config,name,params", [
    ("tiny-gpu", "gemm", {"m": 200, "n": 136, "k": 72, "sample": False}),
    ("tiny-gpu", "attention", {"heads": 2, "seq": 128, "head_dim": 64, "fused": True}),
    ("tiny-gpu", "bandwidth", {"kind": "triad", "footprint_mib": 2, "occupancy": 0.25}),
    ("tiny-gpu", "latency", {"footprint_kib": 64, "loads": 200}),
    ("tiny-sunway", "gemm", {"m": 256, "n": 256, "k": 256, "sample": False}),
    ("tiny-sunway", "attention", {"heads": 2, "seq": 128, "head_dim": 64, "fused": True}),
    ("tiny-sunway", "dma", {"direction": "put", "size_bytes": 2048, "cpes": 16, "offset_bytes": 8}),
    ("a100", "gemm", {"m": 256, "n": 256, "k": 128, "sample": False}),
    ("sw26010pro", "gemm", {"m": 256, "n": 256, "k": 128, "sample": False}),
])
def test_skipping_values_nothing_reads_changes_no_record(config, name, params, monkeypatch):
    assert _records(config, name, params, True, monkeypatch) == _records(config, name, params, False, monkeypatch)


def test_the_slice_marks_the_operand_loads_of_both_gemms():
    from archsim.config.derived import capabilities
    from archsim.workloads.emit import gemm_kernel
    from archsim.workloads.emit.gemm_sunway import gemm_kernel as sunway_gemm

    for hw, emit, marked in (("sw26010pro", sunway_gemm, "ld.shared.b32"), ("a100", gemm_kernel, "cp.async.16")):
        prog = emit(capabilities(load_machine(hw)), 256, 256, 256, "fp16", "f32").program
        P, _ = VS.timing_view(prog, False)
        names = np.array([O.opcodes()[int(o)].mnemonic for o in prog.op])
        assert (P.flags[names == marked] & FLAG_NO_VALUE).all(), hw


# a timing run leaves the destination of a floating-point op, an mma and an ldmatrix as it was: the
# integer value before them is what a later address reads
KEEPS_DST = HEAD + """
        s2r r0, %laneid
        shl.b64 r1, r0, 4
        mov.f32 r2, 1.0
        mov.b64 r4, 0
        mov.b64 r5, 0
        mov.b64 r6, 0
        mov.b64 r7, 0
        mov.b64 r8, 0
        mov.b64 r9, 0
        mov.b64 r10, 0
        mov.b64 r11, 0
        {op}
        ld.shared.b32 r3, [r1]
        ld.shared.b32 r3, [r1+4]
        add.i64 r9, r3, r3
        exit
"""

# an ldmatrix reads the address register of lanes that are not running it (here: lanes 8-31 set it
# on another path, which per-lane liveness finds dead)
LDMATRIX_LANES = HEAD + """
        s2r r0, %laneid
        mov.b64 r1, 0
        setp.ge.i64 p0, r0, 8
   @p0  bra B
        ldmatrix.x4 r4, [r1]
        add.i64 r9, r4, r4
        exit
B:      shl.b64 r1, r0, 5
        exit
"""


@pytest.mark.parametrize("text,kept", [(KEEPS_DST.format(op="add.f32 r1, r2, r2"), 1),
                                       (KEEPS_DST.format(op="mma.m16n8k16.f32.f16 r0, r4, r8, r4"), 1),
                                       (KEEPS_DST.format(op="ldmatrix.x1 r1, [r5]"), 1),
                                       (LDMATRIX_LANES, 7),
                                       # an ldmatrix at a constant address reads no slot
                                       (HEAD + "        ldmatrix.x1 r1, [0]\n        ld.shared.b32 r2, [r1]\n"
                                        "        exit\n", 0)])
def test_values_a_timing_run_keeps_in_place_are_needed(asm, text, kept, monkeypatch):
    prog = asm(text)
    assert _timing(prog, "tiny-gpu", monkeypatch, True) == _timing(prog, "tiny-gpu", monkeypatch, False)
    assert VS.needed(prog, False)[0][kept]   # the integer definition an address may read
