"""Bulk tensor stores (cp.async.bulk.tensor.Nd.store, shared to global; issue 48 item 2) and bulk
groups (cp.async.bulk.commit_group / wait_group) on both functional engines against a numpy oracle
written from isa/README.md (the `tmastore` row), and on h100's timing model: one write request a
line a box row touches, and a wait_group that lasts until the stores' sources have been read."""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.timing import time_kernel
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.check import check_program, check_target
from archsim.isa.program import Launch
from archsim.isa.tensor_map import TensorMap, tensor_map_words
from engine_pair import run_both
from test_cluster_dsmem import fails_both

ROWS, COLS = 40, 64                     # fp16 tensors of 40 x 64: 128-byte rows
ONE_WARP = Launch((1, 1, 1), (32, 1, 1))


def assemble_checked(src: str, machine="h100"):
    prog = assemble(src)
    check_program(prog)
    check_target(prog, capabilities(load_machine(machine)))
    return prog


def box_cols(S: int) -> int:
    """Elements of a box row: a row of the swizzle (128 bytes without one)."""
    return (S or 128) // 2


def maps(box_rows: int, S: int):
    return (TensorMap("a", tensor_map_words([COLS, ROWS], 2, [box_cols(S), box_rows], S)),
            TensorMap("b", tensor_map_words([COLS, ROWS], 2, [box_cols(S), box_rows], S)))


def copy_kernel(box_rows: int, src_row: int, dst_row: int, *, waits: str = "0", S: int = 0) -> str:
    """One warp: copy the box at row src_row of a into the scratchpad (TMA load), store it to b at
    row dst_row (TMA store), commit, wait_group `waits`."""
    return f""".kernel st
.param mapa
.param mapb
.param a
.param b
.shared {1024 + box_rows * 128}
.launch grid=1 block=32
        ldparam r2, mapa
        ldparam r3, mapb
        mov.b64 r1, 1
        mbarrier.init [8], r1
        mov.b64 r4, {box_rows * 2 * box_cols(S)}
        mbarrier.arrive.expect_tx [8], r4
        mov.b64 r10, 0
        mov.b64 r11, {src_row}
        cp.async.bulk.tensor.2d [1024], [8], r2, r10
        mov.b64 r5, 0
        mbarrier.wait [8], r5
        mov.b64 r11, {dst_row}
        cp.async.bulk.tensor.2d.store [1024], r3, r10    // ST
        cp.async.bulk.commit_group
        cp.async.bulk.wait_group {waits}
        exit
"""


def tensors():
    a = (np.arange(ROWS * COLS) % 1999 + 1).astype(np.float16).reshape(ROWS, COLS)
    b = np.full((ROWS, COLS), -1.0, np.float16)
    return a, b


def expected(box_rows, src_row, dst_row, S=0):
    a, b = tensors()
    n = box_cols(S)
    for i in range(box_rows):
        s, d = src_row + i, dst_row + i
        if 0 <= d < ROWS:
            b[d, :n] = a[s, :n] if 0 <= s < ROWS else 0
    return b


@pytest.mark.parametrize("box_rows,src_row,dst_row,S", [(8, 0, 16, 0), (8, 4, 30, 128), (16, 30, -4, 128),
                                                        (4, 2, 38, 64), (8, -3, 0, 32)])
def test_a_stored_box_lands_in_the_tensor(box_rows, src_row, dst_row, S):
    # rows of the box outside the destination are not written; rows read from outside the source are zeros
    ma, mb = maps(box_rows, S)
    a, b = tensors()
    prog = assemble_checked(copy_kernel(box_rows, src_row, dst_row, S=S))
    res = run_both(prog, {"mapa": ma, "mapb": mb, "a": a, "b": b})
    want = expected(box_rows, src_row, dst_row, S)
    for eng, r in res.items():
        assert np.array_equal(r.output("b").view(np.uint16), want.view(np.uint16)), eng


def test_a_stored_box_in_a_timing_run(h100):
    ma, mb = maps(8, 128)
    a, b = tensors()
    prog = assemble_checked(copy_kernel(8, 0, 16, S=128))
    t = time_kernel(prog, h100, ONE_WARP, {"mapa": ma, "mapb": mb, "a": a, "b": b})
    assert np.array_equal(t.buffers["b"].view(np.uint16), expected(8, 0, 16, 128).view(np.uint16))
    tma = t.memory["tma"]
    assert tma["stores"] == 1 and tma["store_bytes"] == 8 * 128 and tma["store_requests"] == 8


# ------------------------------------------------------------------------- faults and refusals
def faults_both(src, marker, *fragments, args):
    """Both engines fault at the line holding `marker` (test_cluster_dsmem.fails_both)."""
    fails_both(assemble_checked(src), args, src, marker, *fragments)


def test_fault_store_source_misaligned():
    ma, mb = maps(8, 0)
    a, b = tensors()
    src = copy_kernel(8, 0, 0).replace("cp.async.bulk.tensor.2d.store [1024]", "cp.async.bulk.tensor.2d.store [1040]")
    faults_both(src, "// ST", "TMA box of 1024 bytes at scratchpad 1040: 128-byte aligned",
                args={"mapa": ma, "mapb": mb, "a": a, "b": b})


def test_fault_store_map_of_another_rank():
    ma, _ = maps(8, 0)
    mb = TensorMap("b", tensor_map_words([COLS, ROWS, 1], 2, [COLS, 8, 1], 0))
    a, b = tensors()
    faults_both(copy_kernel(8, 0, 0), "// ST", "tensor map rank 3 for a 2-d copy", args={"mapa": ma, "mapb": mb,
                                                                                          "a": a, "b": b})


def test_wait_group_counts_are_checked_at_load():
    with pytest.raises(InputError, match="cp.async.bulk.wait_group 8: groups left pending"):
        assemble_checked(copy_kernel(8, 0, 0, waits="8"))
    with pytest.raises(InputError, match="cp.async.bulk.tensor.2d.store: the target a100 has no tma"):
        check_target(assemble(copy_kernel(8, 0, 0).replace("        cp.async.bulk.tensor.2d [1024], [8], r2, r10\n", "")
                              .replace("        mbarrier.wait [8], r5\n", "")
                              .replace("        mbarrier.init [8], r1\n", "")
                              .replace("        mbarrier.arrive.expect_tx [8], r4\n", "")),
                     capabilities(load_machine("a100")))


# ------------------------------------------------------------------------- bulk groups in the timing model
def groups_kernel(stores: int, wait: int) -> str:
    """One warp stores `stores` boxes of 32 rows from the scratchpad, each its own bulk group, then
    wait_group `wait`; out[0] = the cycles from the first store's issue to the wait passing."""
    body = "\n".join(f"""        mov.b64 r11, {8 * (i % 5)}
        cp.async.bulk.tensor.2d.store [{1024 + 4096 * (i % 2)}], r3, r10
        cp.async.bulk.commit_group""" for i in range(stores))
    return f""".kernel g
.param mapb
.param b
.param out
.shared 9216
        ldparam r3, mapb
        ldparam r20, out
        mov.b64 r10, 0
        s2r r30, %clock
{body}
        cp.async.bulk.wait_group {wait}
        s2r r31, %clock
        sub.i64 r31, r31, r30
        st.global.b64 [r20], r31
        exit
"""


def run_groups(h100, stores, wait):
    mb = TensorMap("b", tensor_map_words([COLS, ROWS], 2, [COLS, 32], 0))
    prog = assemble_checked(groups_kernel(stores, wait))
    t = time_kernel(prog, h100, ONE_WARP, {"mapb": mb, "b": np.zeros((ROWS, COLS), np.float16),
                                           "out": np.zeros(1, np.int64)})
    return t, int(t.buffers["out"][0])


def test_wait_group_waits_for_the_sources_of_all_but_the_newest_groups(h100):
    # each store: the unit's start-up, then its 32 rows leave one line a cycle; stores go in turn
    start, rpc = h100.tma.startup_cycles, h100.tma.requests_per_cycle
    _, one = run_groups(h100, 1, 0)
    assert start + 32 // rpc <= one <= start + 32 // rpc + 40
    t, two = run_groups(h100, 2, 0)
    assert two >= one + 32 // rpc - 2                  # the second store's rows after the first's
    _, newest_left = run_groups(h100, 2, 1)            # only the first store's source must be read
    assert newest_left < two and abs(newest_left - one) <= 4
    _, none = run_groups(h100, 2, 2)                   # nothing to wait for
    assert none < 40
    assert t.memory["tma"]["store_requests"] == 2 * 32


def test_a_launch_ends_only_after_its_stores_have_left(h100):
    # a store followed by exit, no wait: the launch still lasts its start-up and its 32 lines
    src = groups_kernel(1, 0).replace("        cp.async.bulk.wait_group 0\n", "")
    mb = TensorMap("b", tensor_map_words([COLS, ROWS], 2, [COLS, 32], 0))
    t = time_kernel(assemble_checked(src), h100, ONE_WARP, {"mapb": mb, "b": np.zeros((ROWS, COLS), np.float16),
                                                            "out": np.zeros(1, np.int64)})
    assert t.memory["tma"]["store_requests"] == 32
    assert t.cycles >= h100.tma.startup_cycles + 32 // h100.tma.requests_per_cycle


def test_wait_group_over_more_groups_than_its_ring(h100):
    # 10 groups of one store each: wait_group 7 waits for the first 3, as long as 3 stores and
    # wait_group 0 (stores leave in turn: the later 7 do not delay them); wait_group 0 for all 10
    _, three = run_groups(h100, 10, 7)
    _, first_three = run_groups(h100, 3, 0)
    _, ten = run_groups(h100, 10, 0)
    assert abs(three - first_three) <= 4 and ten > three + 7 * 8
