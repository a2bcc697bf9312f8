"""Transaction barriers (mbarrier.*) and bulk tensor copies (cp.async.bulk.tensor, Hopper TMA) on both
functional engines: the numba interpreter and its Python twin (archsim/engine/reference.py), against a
numpy oracle written from isa/README.md (the `mbinit` .. `tma` rows, "Tensor map", the wgmma swizzle).
Every case runs on both engines; results must equal the oracle and each other (memory image, registers,
warp-instructions), faults must name the same rule at the same instruction."""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.functional import run_functional
from archsim.engine.launch import build_memory
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble
from archsim.isa.check import check_program, check_target
from engine_pair import ENGINES, copy_args, run_both

MB_BIAS = 1 << 20


# ------------------------------------------------------------------------- the README's formats
def mb_word(parity, pending, expected, tx) -> int:
    """A barrier word: bit 0 parity, bits 1-21 pending, 22-42 expected, 43-63 tx + 2^20 (signed int64)."""
    v = parity | (pending << 1) | (expected << 22) | ((tx + MB_BIAS) << 43)
    return v - (1 << 64) if v >> 63 else v


def tensor_map(base, eb, S, dims, strides, box, rank=None) -> np.ndarray:
    """16 int64 words: base, rank, element bytes, swizzle, dims d0..d4, strides of dims 1..4 (bytes),
    box dims b0..b3 in 16-bit fields of word 13, b4 in word 14."""
    w = np.zeros(16, np.int64)
    w[0], w[1], w[2], w[3] = base, len(dims) if rank is None else rank, eb, S
    for k, d in enumerate(dims):
        w[4 + k] = d
    for k, s in enumerate(strides[1:]):
        w[9 + k] = s
    packed = 0
    for k, b in enumerate(box[:4]):
        packed |= int(b) << (16 * k)
    w[13] = packed - (1 << 64) if packed >> 63 else packed
    if len(box) == 5:
        w[14] = box[4]
    return w


def default_strides(eb, dims, pad=16):
    """Byte strides of dims 0.. (dimension 0: eb): rows padded by `pad` bytes, then dense."""
    st = [eb]
    if len(dims) > 1:
        st.append(-(-dims[0] * eb // 16) * 16 + pad)
        for k in range(2, len(dims)):
            st.append(st[-1] * dims[k - 1])
    return st


def tensor_bytes(eb, dims, strides) -> int:
    return sum((d - 1) * s for d, s in zip(dims, strides)) + eb


def oracle_box(buf: np.ndarray, eb, dims, strides, box, coords) -> np.ndarray:
    """The box's bytes as they land, before the swizzle: element (i0, .., iN-1) at linear index
    i0 + b0*(i1 + b1*(...)); global element c + i, zero outside the tensor."""
    N = len(box)
    idx = np.indices(tuple(box[::-1])).reshape(N, -1)[::-1]          # idx[k]: index in dimension k
    g = np.asarray(coords, np.int64)[:, None] + idx
    inside = np.all((g >= 0) & (g < np.asarray(dims, np.int64)[:, None]), axis=0)
    off = (g * np.asarray(strides, np.int64)[:, None]).sum(0)
    out = np.zeros((idx.shape[1], eb), np.uint8)
    sel = np.nonzero(inside)[0]
    out[sel] = buf[off[sel, None] + np.arange(eb)]
    return out.ravel()


def swizzle(addr: np.ndarray, S: int) -> np.ndarray:
    """wgmma's swizzle: physical = logical ^ (((logical >> 7) & (S/16 - 1)) << 4); S = 0: none."""
    if not S:
        return addr
    return addr ^ (((addr >> 7) & (S // 16 - 1)) << 4)


def place(img: np.ndarray, dst: int, data: np.ndarray, S: int) -> None:
    img[swizzle(dst + np.arange(data.size), S)] = data


# ------------------------------------------------------------------------- running both engines
def addresses(prog, args) -> dict:
    """Global address of each buffer parameter (the launch's placement: parameter order, aligned)."""
    _, params, _ = build_memory(prog, args)
    return {p: int(v) for p, v in zip(prog.params, params)}


def faults_both(prog, args, marker: str, src: str, *fragments, lane=None):
    """Both engines fault at the instruction on the line holding `marker`, each naming every fragment."""
    errs = {}
    for eng in ENGINES:
        with pytest.raises(SimulationError) as e:
            run_functional(prog, copy_args(args), engine=eng)
        err = e.value
        assert err.where == f"<asm>:{line_of(src, marker)}", (eng, err.where, err.what)
        for f in fragments:
            assert f in err.what, (eng, f, err.what)
        if lane is not None:
            assert f"block 0 warp 0 lane {lane}:" in err.what, (eng, err.what)
        errs[eng] = err.what
    return errs


def line_of(src: str, text: str) -> int:
    hits = [i for i, line in enumerate(src.splitlines(), start=1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def assemble_checked(src: str):
    prog = assemble(src)
    check_program(prog)
    check_target(prog, capabilities(load_machine("h100")))
    return prog


# ------------------------------------------------------------------------- one warp, one copy
def copy_kernel(N, shared, dst, coords, total, *, bar=0, grid=1, shift=None, guard="", map_add=0,
                init=True, extra="") -> str:
    """One warp: init the barrier at `bar` (1 arrival), arrive.expect_tx(total), copy the box at
    `coords` (shift = (k, n): block b adds b*n to coordinate k) to `dst`, wait for phase 0, dump the
    scratchpad to out (block b at out + b*shared). `guard` prefixes the mbarrier/TMA instructions."""
    lines = [".kernel tma_copy", ".param map", ".param t", ".param out", f".shared {shared}",
             f".launch grid={grid} block=32", "        s2r r0, %laneid", "        s2r r9, %ctaid.x",
             "        setp.ge.i64 p1, r0, 3", f"        mov.b64 r1, {bar}", "        mov.b64 r2, 1",
             f"        mov.b64 r3, {total}", "        ldparam r4, map", f"        mov.b64 r5, {dst}"]
    for k, c in enumerate(coords):
        lines.append(f"        mov.b64 r{10 + k}, {c}")
    if shift is not None:
        k, n = shift
        lines.append(f"        mul.i64 r8, r9, {n}\n        add.i64 r{10 + k}, r{10 + k}, r8")
    if map_add:
        lines.append(f"        add.i64 r4, r4, {map_add}")
    lines.append(extra)
    if init:
        lines.append(f"  {guard:>5} mbarrier.init [r1], r2")
    lines.append(f"  {guard:>5} mbarrier.arrive.expect_tx [r1], r3")
    lines.append(f"  {guard:>5} cp.async.bulk.tensor.{N}d [r5], [r1], r4, r10    // TMA")
    lines.append("        mov.b64 r6, 0")
    lines.append(f"  {guard:>5} mbarrier.wait [r1], r6")
    lines.append(f"""        shl.b64 r7, r0, 4
        ldparam r8, out
        mul.i64 r15, r9, {shared}
        add.i64 r8, r8, r15
LOOP:   setp.ge.i64 p0, r7, {shared}
   @p0  bra DONE
        ld.shared.v4.b32 r20, [r7]
        add.i64 r15, r8, r7
        st.global.v4.b32 [r15], r20
        add.i64 r7, r7, 512
        bra LOOP
DONE:   exit
""")
    return "\n".join(lines)


class Case:
    """A tensor in global memory, a box and where it lands."""

    def __init__(self, eb, dims, box, coords, *, S=0, strides=None, dst=128, seed=0, fp16=False, grid=1,
                 shift=None):
        self.eb, self.dims, self.box, self.coords, self.S = eb, list(dims), list(box), list(coords), S
        self.strides = strides or default_strides(eb, dims)
        self.dst, self.grid, self.shift = dst, grid, shift
        self.total = int(np.prod(box)) * eb
        self.shared = -(-(dst + self.total) // 128) * 128
        rng = np.random.default_rng(seed)
        n = -(-tensor_bytes(eb, dims, self.strides) // 16) * 16
        if fp16:
            self.buf = rng.standard_normal(n // 2).astype(np.float16).view(np.uint8)
        else:
            self.buf = rng.integers(0, 256, n, dtype=np.uint8)

    def block_coords(self, b):
        c = list(self.coords)
        if self.shift is not None:
            c[self.shift[0]] += b * self.shift[1]
        return c

    def expected(self) -> np.ndarray:
        img = np.zeros((self.grid, self.shared), np.uint8)
        word = np.array([mb_word(1, 1, 1, 0)], np.int64).view(np.uint8)
        for b in range(self.grid):
            data = oracle_box(self.buf, self.eb, self.dims, self.strides, self.box, self.block_coords(b))
            place(img[b], self.dst, data, self.S)
            img[b, 0:8] = word
        return img

    def args(self, prog, *, base_add=0, **fields):
        args = {"map": np.zeros(16, np.int64), "t": self.buf, "out": np.zeros(self.grid * self.shared, np.uint8)}
        base = addresses(prog, args)["t"] + base_add
        m = dict(base=base, eb=self.eb, S=self.S, dims=self.dims, strides=self.strides, box=self.box)
        m.update(fields)
        args["map"] = tensor_map(**m)
        return args

    def kernel(self, **kw) -> str:
        kw.setdefault("shift", self.shift)
        return copy_kernel(len(self.box), self.shared, self.dst, self.coords, self.total, grid=self.grid, **kw)

    def check(self):
        src = self.kernel()
        prog = assemble_checked(src)
        res = run_both(prog, self.args(prog))
        want = self.expected()
        for eng, r in res.items():
            got = r.output("out").reshape(self.grid, self.shared)
            assert np.array_equal(got, want), (eng, np.argwhere(got != want)[:8])
        return res


# ------------------------------------------------------------------------- copies
def test_2d_fp16_box_unswizzled():
    # rows of 40 fp16 (80 bytes, padded to 96), box 16 x 8 inside the tensor
    Case(2, (40, 12), (16, 8), (8, 2), fp16=True).check()


@pytest.mark.parametrize("S", [32, 64, 128])
def test_2d_fp16_box_swizzled(S):
    # inner row of exactly S bytes; 16 rows, so the 128-byte XOR pattern repeats
    Case(2, (S // 2 + 8, 24), (S // 2, 16), (4, 3), S=S, dst=256, fp16=True, seed=S).check()


def test_2d_swizzle_128_with_a_narrow_inner_row():
    # inner row of 32 bytes under a 128-byte swizzle: the formula applies to the dense box by address
    Case(2, (32, 40), (16, 32), (16, 0), S=128, dst=384, fp16=True, seed=5).check()


def test_2d_box_partly_outside_both_ends():
    # negative coordinates in dimension 0, past the end in dimension 1: those elements are zero
    Case(2, (24, 10), (16, 8), (-5, 6), S=32, fp16=True, seed=6).check()


def test_box_wholly_outside_is_zeros():
    c = Case(4, (16, 4), (8, 2), (100, -9), seed=7)
    assert not c.expected()[0, c.dst:].any()
    c.check()


def test_1d_box_past_the_end():
    Case(4, (100,), (32,), (80,), seed=8).check()


def test_1d_box_8_byte_elements_negative_start():
    Case(8, (40,), (16,), (-4,), S=128, seed=9).check()


def test_3d_box_bytes():
    Case(1, (48, 5, 4), (32, 3, 2), (-16, 3, 1), seed=10).check()


def test_5d_box():
    Case(2, (16, 3, 2, 3, 2), (8, 2, 2, 2, 2), (4, 2, -1, 1, 0), seed=11, S=64).check()


def test_4d_box_with_padded_strides():
    dims = (8, 3, 4, 2)
    Case(4, dims, (8, 2, 3, 2), (0, 1, 2, -1), strides=[4, 48, 160, 800], seed=12).check()


def test_two_blocks_each_its_own_scratchpad():
    Case(2, (32, 16), (16, 8), (0, 0), grid=2, shift=(1, 8), S=32, seed=13).check()


def test_operands_of_the_lowest_active_lane():
    # lanes 0-2 are guarded off; lane 3's registers give every operand; the others hold garbage
    c = Case(2, (32, 16), (16, 4), (8, 5), S=32, seed=14)
    tamper = ("        setp.ne.i64 p2, r0, 3\n   @p2  mov.b64 r1, 4\n   @p2  mov.b64 r5, 64\n"
              "   @p2  mov.b64 r10, -1000\n   @p2  mov.b64 r4, 0\n   @p2  mov.b64 r3, 7")
    src = c.kernel(guard="@p1", extra=tamper)
    prog = assemble_checked(src)
    res = run_both(prog, c.args(prog))
    want = c.expected()
    for eng, r in res.items():
        assert np.array_equal(r.output("out").reshape(1, c.shared), want), eng


def test_kernel_writes_the_map_base_itself():
    # the map's word 0 is stored by the kernel (st.global.b64) before the copy
    c = Case(2, (24, 8), (16, 8), (0, 0), S=32, seed=15)
    extra = "        ldparam r16, t\n        st.global.b64 [r4], r16"
    src = c.kernel(extra=extra)
    prog = assemble_checked(src)
    args = c.args(prog)
    args["map"][0] = 0x12345670     # wrong until the kernel fixes it
    res = run_both(prog, args)
    for eng, r in res.items():
        assert np.array_equal(r.output("out").reshape(1, c.shared), c.expected()), eng


def test_a_tensor_map_argument_gets_its_buffers_address():
    # launch.TensorMap: the layout fills in word 0 (the buffer's address + offset) and puts the
    # map first; the same copy as with a map built by hand
    from archsim.isa.tensor_map import TensorMap, tensor_map_words

    c = Case(2, (24, 8), (16, 8), (0, 0), S=32, seed=16)
    prog = assemble_checked(c.kernel())
    words = tensor_map_words(c.dims, c.eb, c.box, c.S, strides=c.strides[1:])
    args = {"map": TensorMap("t", words), "t": c.buf, "out": np.zeros(c.shared, np.uint8)}
    res = run_both(prog, args)
    for eng, r in res.items():
        assert np.array_equal(r.output("out").reshape(1, c.shared), c.expected()), eng
    where = addresses(prog, args)
    assert where["map"] < where["t"] < where["out"]
    with pytest.raises(InputError, match="TensorMap of 'nosuch'"):
        run_functional(prog, {**args, "map": TensorMap("nosuch", words)})


def test_a_swizzled_box_needs_its_whole_128_byte_rows_inside_the_scratchpad():
    # 9 rows of 16 bytes (144) at 128 with a 128-byte swizzle: bytes of the last, partial row would
    # move up to 128 + 256 - 1; with 272 bytes of scratchpad that is outside it
    c = Case(2, [8, 9], [8, 9], [0, 0], S=128, dst=128, seed=3)
    src = copy_kernel(2, 272, c.dst, c.coords, c.total)
    prog = assemble_checked(src)
    args = c.args(prog)
    args["out"] = np.zeros(272, np.uint8)
    faults_both(prog, args, "// TMA", src, "TMA box of 144 bytes at scratchpad 128", "(swizzled: rounded up to 128)")


def test_tma_and_mbarrier_need_32_lane_warps():
    c = Case(2, (24, 8), (16, 8), (0, 0), S=32, seed=17)
    prog = assemble_checked(c.kernel())
    for eng in ENGINES:
        with pytest.raises(SimulationError, match="32"):
            run_functional(prog, c.args(prog), engine=eng, warp_width=8)


# ------------------------------------------------------------------------- barrier words and phases
WORDS_SRC = """.kernel words
.param map
.param t
.param out
.shared 256
.launch grid=1 block=32
        ldparam r4, map
        ldparam r14, t
        st.global.b64 [r4], r14
        ldparam r15, out
        mov.b64 r1, 8
        mov.b64 r2, 3
        mov.b64 r5, 128
        mov.b64 r10, 0
        mov.b64 r6, 0
        mov.b64 r7, 1
        mbarrier.init [r1], r2
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15], r20
        mov.b64 r3, 100
        mbarrier.arrive.expect_tx [r1], r3
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15+8], r20
        mov.b64 r3, 28
        mbarrier.expect_tx [r1], r3
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15+16], r20
        mbarrier.arrive [r1]
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15+24], r20
        mbarrier.wait [r1], r7           // parity 1: the phase before phase 0 counts as complete
        cp.async.bulk.tensor.1d [r5], [r1], r4, r10
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15+32], r20
        mbarrier.arrive [r1]
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15+40], r20
        mbarrier.wait [r1], r6           // phase 0 complete: passes
        mov.b64 r3, 0
        mbarrier.expect_tx [r1], r3
        ld.shared.b64 r20, [r1]
        st.global.b64 [r15+48], r20
        mov.b64 r2, 1
        mbarrier.init [r1+8], r2         // a second barrier: the copy lands before the arrival
        cp.async.bulk.tensor.1d [r5], [r1+8], r4, r10
        ld.shared.b64 r20, [r1+8]
        st.global.b64 [r15+56], r20
        mov.b64 r3, 128
        mbarrier.arrive.expect_tx [r1+8], r3
        ld.shared.b64 r20, [r1+8]
        st.global.b64 [r15+64], r20
        mbarrier.wait [r1+8], r6
        ld.shared.v4.b32 r20, [r5]
        st.global.v4.b32 [r15+80], r20
        exit
"""


def test_barrier_word_layout_and_updates():
    prog = assemble_checked(WORDS_SRC)
    t = np.arange(32, dtype=np.int32)
    args = {"map": np.zeros(16, np.int64), "t": t, "out": np.zeros(12, np.int64)}
    args["map"] = tensor_map(0, 4, 0, (32,), [4], (32,))       # 128 bytes; word 0 stored by the kernel
    want = [mb_word(0, 3, 3, 0), mb_word(0, 2, 3, 100), mb_word(0, 2, 3, 128), mb_word(0, 1, 3, 128),
            mb_word(0, 1, 3, 0), mb_word(1, 3, 3, 0), mb_word(1, 3, 3, 0),
            mb_word(0, 1, 1, -128), mb_word(1, 1, 1, 0)]
    for eng, r in run_both(prog, args).items():
        got = r.output("out")
        assert [int(v) for v in got[:9]] == want, (eng, [hex(int(v) & (2**64 - 1)) for v in got[:9]])
        assert np.array_equal(got[10:12].view(np.int32), t[:4]), eng


PRODUCER_CONSUMER_SRC = """.kernel pc
.param map
.param t
.param out
.shared 640
.launch grid=1 block=64
        s2r r0, %laneid
        s2r r1, %warpid
        mov.b64 r2, 0                    // full: the tile has landed
        mov.b64 r3, 8                    // empty: the consumer is done with it
        mov.b64 r4, 128                  // the tile
        mov.b64 r5, 1
        ldparam r6, map
        setp.ne.i64 p0, r1, 0
   @p0  bra SYNC
        mbarrier.init [r2], r5
        mbarrier.init [r3], r5
        ldparam r7, t
        st.global.b64 [r6], r7
SYNC:   bar.sync
        mov.b64 r8, 512
        mov.b64 r9, 0
        setp.ne.i64 p0, r1, 0
   @p0  bra CONSUMER
        mov.b64 r10, 16
        mov.b64 r11, 8
        mbarrier.arrive.expect_tx [r2], r8
        cp.async.bulk.tensor.2d [r4], [r2], r6, r10
        mbarrier.wait [r3], r9           // PRODUCER WAIT
        mov.b64 r10, 0
        mov.b64 r11, 20
        mbarrier.expect_tx [r2], r8
        cp.async.bulk.tensor.2d [r4], [r2], r6, r10
        mbarrier.arrive [r2]
        exit
CONSUMER:
        shl.b64 r13, r0, 4
        ldparam r14, out
        add.i64 r14, r14, r13
        mbarrier.wait [r2], r9           // CONSUMER WAIT 0
        ld.shared.v4.b32 r20, [r13+128]
        st.global.v4.b32 [r14], r20
        mbarrier.arrive [r3]
        mov.b64 r9, 1
        mbarrier.wait [r2], r9           // CONSUMER WAIT 1
        ld.shared.v4.b32 r20, [r13+128]
        st.global.v4.b32 [r14+512], r20
        ldparam r14, out
        ld.shared.b64 r20, [r2]
        st.global.b64 [r14+1024], r20
        ld.shared.b64 r20, [r3]
        st.global.b64 [r14+1032], r20
        exit
"""


def test_producer_consumer_two_phases():
    """Warp 0 produces two 16 x 16 fp16 tiles (32-byte swizzle) into one buffer; warp 1 waits for each
    phase of `full` (parity 0, then 1), copies it out and releases it through `empty`."""
    prog = assemble_checked(PRODUCER_CONSUMER_SRC)
    dims, eb, S = (40, 36), 2, 32
    st = default_strides(eb, dims)
    rng = np.random.default_rng(20)
    buf = rng.standard_normal(tensor_bytes(eb, dims, st) // 2 + 8).astype(np.float16).view(np.uint8)
    args = {"map": tensor_map(0, eb, S, dims, st, (16, 16)), "t": buf, "out": np.zeros(1040, np.uint8)}
    want = np.zeros(1040, np.uint8)
    for i, coords in enumerate(((16, 8), (0, 20))):
        img = np.zeros(640, np.uint8)
        place(img, 128, oracle_box(buf, eb, dims, st, (16, 16), coords), S)
        want[512 * i:512 * i + 512] = img[128:640]
    want[1024:1040] = np.array([mb_word(0, 1, 1, 0), mb_word(1, 1, 1, 0)], np.int64).view(np.uint8)
    for eng, r in run_both(prog, args).items():
        got = r.output("out")
        assert np.array_equal(got, want), (eng, np.argwhere(got != want)[:8])


def test_guarded_off_wait_and_arrive_do_nothing():
    src = """.kernel g
.param out
.shared 64
.launch grid=1 block=32
        mov.b64 r1, 0
        mov.b64 r2, 2
        mov.b64 r3, 0
        setp.ne.i64 p1, r3, 0            // false in every lane
        mbarrier.init [r1], r2
   @p1  mbarrier.arrive [r1]
   @p1  mbarrier.wait [r1], r3
        mbarrier.arrive [r1]
        ld.shared.b64 r4, [r1]
        ldparam r5, out
        st.global.b64 [r5], r4
        exit
"""
    prog = assemble_checked(src)
    for eng, r in run_both(prog, {"out": np.zeros(1, np.int64)}).items():
        assert int(r.output("out")[0]) == mb_word(0, 1, 2, 0), eng


# ------------------------------------------------------------------------- TMA faults
def _tma_fault(case: Case, marker, *fragments, kernel=None, args=None, lane=0):
    src = case.kernel(**(kernel or {}))
    prog = assemble_checked(src)
    return faults_both(prog, case.args(prog, **(args or {})), marker, src, *fragments, lane=lane)


def base_case(**kw):
    p = dict(eb=2, dims=(32, 16), box=(16, 8), coords=(0, 0), seed=30)
    p.update(kw)
    return Case(p.pop("eb"), p.pop("dims"), p.pop("box"), p.pop("coords"), **p)


def test_fault_map_misaligned():
    c = base_case()
    prog = assemble_checked(c.kernel())
    m = addresses(prog, c.args(prog))["map"]
    _tma_fault(c, "// TMA", f"tensor map at {m + 8:#x} is not 64-byte aligned", kernel=dict(map_add=8))


def test_fault_map_past_global_memory():
    # a 64-byte aligned map whose 128 bytes run past the end of global memory
    c = base_case()
    prog = assemble_checked(c.kernel())
    a = addresses(prog, c.args(prog))
    end = a["out"] + c.shared
    assert end % 64 == 0
    _tma_fault(c, "// TMA", f"tensor map at {end - 64:#x} is not 64-byte aligned inside a backed global buffer",
               kernel=dict(map_add=end - 64 - a["map"]))


def test_fault_map_unmapped_address():
    c = base_case()
    prog = assemble_checked(c.kernel())
    m = addresses(prog, c.args(prog))["map"]
    _tma_fault(c, "// TMA", "tensor map at 0x1000 is not", kernel=dict(map_add=0x1000 - m))


def test_fault_rank():
    _tma_fault(base_case(), "// TMA", "tensor map rank 3 for a 2-d copy", args=dict(rank=3))


@pytest.mark.parametrize("eb,S", [(3, 0), (16, 0), (2, 16), (2, 256)])
def test_fault_format(eb, S):
    _tma_fault(base_case(), "// TMA", f"tensor map element size {eb} or swizzle {S} not allowed",
               args=dict(eb=eb, S=S))


def test_fault_base_not_multiple_of_16():
    c = base_case()
    prog = assemble_checked(c.kernel())
    t = addresses(prog, c.args(prog))["t"]
    _tma_fault(c, "// TMA", f"tensor map base or stride {t + 8} (dimension 0; 0: the base) is not a multiple of 16",
               args=dict(base_add=8))


@pytest.mark.parametrize("stride", [40, 0, -96])
def test_fault_stride(stride):
    _tma_fault(base_case(), "// TMA", f"base or stride {stride} (dimension 1; 0: the base) is not a multiple of 16",
               args=dict(strides=[2, stride]))


def test_fault_stride_of_dimension_2():
    c = base_case(dims=(32, 4, 3), box=(16, 2, 2), coords=(0, 0, 0))
    _tma_fault(c, "// TMA", "base or stride 72 (dimension 2; 0: the base)", args=dict(strides=[2, 80, 72]))


@pytest.mark.parametrize("box,dims,k,n", [((0, 8), (32, 16), 0, 0), ((16, 9), (32, 8), 1, 9),
                                          ((16, 257), (32, 300), 1, 257), ((16, 8), (8, 16), 0, 16)])
def test_fault_box_dimension(box, dims, k, n):
    _tma_fault(base_case(), "// TMA", f"TMA box dimension {k} of {n} elements", args=dict(box=box, dims=dims))


@pytest.mark.parametrize("box0,S,inner", [(4, 0, 8), (12, 0, 24), (32, 32, 64), (128, 128, 256)])
def test_fault_inner_row(box0, S, inner):
    _tma_fault(base_case(dims=(256, 16)), "// TMA", f"TMA box inner row of {inner} bytes",
               f"({S} bytes", args=dict(box=(box0, 8), S=S))


def test_fault_destination_misaligned():
    c = base_case()
    _tma_fault(c, "// TMA", f"TMA box of {c.total} bytes at scratchpad 192: 128-byte aligned",
               kernel=dict(extra="        mov.b64 r5, 192"))


def test_fault_destination_past_the_scratchpad():
    c = base_case()
    dst = c.shared - 128
    _tma_fault(c, "// TMA", f"TMA box of {c.total} bytes at scratchpad {dst}:", f"inside the block's {c.shared} bytes",
               kernel=dict(extra=f"        mov.b64 r5, {dst}"))


def test_fault_tma_barrier_misaligned():
    # the barrier's init and arrive sit at 0; the copy names 4
    c = base_case()
    src = c.kernel().replace("[r5], [r1], r4", "[r5], [r1+4], r4")
    prog = assemble_checked(src)
    faults_both(prog, c.args(prog), "// TMA", src, "not aligned", lane=0)


def test_fault_tma_barrier_outside_the_scratchpad():
    c = base_case()
    src = c.kernel().replace("[r5], [r1], r4", f"[r5], [r1+{c.shared}], r4")
    prog = assemble_checked(src)
    faults_both(prog, c.args(prog), "// TMA", src, "outside", lane=0)


def test_fault_tma_on_an_uninitialised_barrier():
    c = base_case()
    src = c.kernel().replace("[r5], [r1], r4", "[r5], [r1+8], r4")
    prog = assemble_checked(src)
    faults_both(prog, c.args(prog), "// TMA", src, "mbarrier at scratchpad 8 is not initialised", lane=0)


def test_fault_in_tensor_element_outside_global_memory():
    # the map claims 64 rows of 80 bytes; the buffer (the last one) holds 4: row 4 of the box starts
    # exactly at the end of global memory
    c = base_case(dims=(32, 4), box=(16, 8), coords=(0, 0))
    src = copy_kernel(2, c.shared, c.dst, c.coords, c.total).replace(".param t\n.param out", ".param out\n.param t")
    prog = assemble_checked(src)
    buf = np.random.default_rng(31).integers(0, 256, 4 * 80, dtype=np.uint8)
    args = {"map": np.zeros(16, np.int64), "out": np.zeros(c.shared, np.uint8), "t": buf}
    a = addresses(prog, args)
    end = a["t"] + buf.size
    args["map"] = tensor_map(a["t"], 2, 0, (32, 64), [2, 80], (16, 8))
    faults_both(prog, args, "// TMA", src, "outside", f"{end:#x}", lane=0)


def test_fault_negative_base_is_outside_global_memory():
    # a base that is a multiple of 16 but negative: the in-tensor elements lie outside global memory
    # (isa/README.md: only elements outside the tensor read as zero)
    c = base_case()
    _tma_fault(c, "// TMA", "outside", "-0x1000", args=dict(base=-4096))


def test_fault_lane_is_the_lowest_active():
    c = base_case()
    _tma_fault(c, "// TMA", "tensor map rank 1 for a 2-d copy", args=dict(rank=1), kernel=dict(guard="@p1"), lane=3)


# ------------------------------------------------------------------------- mbarrier faults
def mb_kernel(body: str, shared=64, block=32) -> str:
    return (f".kernel mb\n.param out\n.shared {shared}\n.launch grid=1 block={block}\n"
            "        mov.b64 r1, 0\n        mov.b64 r2, 1\n        mov.b64 r6, 0\n" + body + "\n        exit\n")


def _mb_fault(body, marker, *fragments, shared=64):
    src = mb_kernel(body, shared)
    prog = assemble_checked(src)
    return faults_both(prog, {"out": np.zeros(1, np.int64)}, marker, src, *fragments, lane=0)


@pytest.mark.parametrize("count", [0, 1 << 20, -1])
def test_fault_init_count(count):
    _mb_fault(f"        mov.b64 r3, {count}\n        mbarrier.init [r1], r3   // X",
              "// X", f"mbarrier at scratchpad 0: count {count} out of range")


@pytest.mark.parametrize("op", ["mbarrier.arrive.expect_tx", "mbarrier.expect_tx"])
@pytest.mark.parametrize("n", [1 << 20, -1])
def test_fault_expect_tx_bytes(op, n):
    _mb_fault(f"        mbarrier.init [r1], r2\n        mov.b64 r3, {n}\n        {op} [r1], r3   // X",
              "// X", f"mbarrier at scratchpad 0: count {n} out of range")


def test_fault_transaction_count_overflow():
    _mb_fault("        mbarrier.init [r1], r2\n        mov.b64 r3, 1048575\n        mbarrier.expect_tx [r1], r3\n"
              "        mbarrier.expect_tx [r1], r3   // X", "// X",
              "mbarrier at scratchpad 0: transaction count 2097150 leaves -(2^20-1) .. 2^20-1")


def test_fault_arrival_with_none_pending():
    _mb_fault("        mbarrier.init [r1], r2\n        mov.b64 r3, 16\n        mbarrier.arrive.expect_tx [r1], r3\n"
              "        mbarrier.arrive [r1]   // X", "// X", "mbarrier at scratchpad 0: an arrival with none pending")


@pytest.mark.parametrize("line", ["mbarrier.arrive [r1+16]", "mbarrier.expect_tx [r1+16], r2",
                                  "mbarrier.arrive.expect_tx [r1+16], r2", "mbarrier.wait [r1+16], r6"])
def test_fault_uninitialised(line):
    _mb_fault(f"        mbarrier.init [r1], r2\n        {line}   // X", "// X",
              "mbarrier at scratchpad 16 is not initialised")


@pytest.mark.parametrize("line", ["mbarrier.init [r1+12], r2", "mbarrier.arrive [r1+4]", "mbarrier.wait [r1+20], r6"])
def test_fault_barrier_misaligned(line):
    _mb_fault(f"        {line}   // X", "// X", "not aligned")


@pytest.mark.parametrize("line", ["mbarrier.init [r1+64], r2", "mbarrier.arrive [r1-8]",
                                  "mbarrier.expect_tx [r1+128], r2"])
def test_fault_barrier_outside_the_scratchpad(line):
    _mb_fault(f"        {line}   // X", "// X", "outside")


# ------------------------------------------------------------------------- deadlocks
def _deadlock(src, marker, text, block_warp="block 0 warp 0"):
    prog = assemble(src)
    for eng in ENGINES:
        with pytest.raises(SimulationError) as e:
            run_functional(prog, {"out": np.zeros(1, np.int64)}, engine=eng)
        err = e.value
        assert err.where == f"<asm>:{line_of(src, marker)}", (eng, err.where, err.what)
        assert err.what.startswith(f"deadlock: {block_warp} {text}"), (eng, err.what)


def test_deadlock_arrival_never_comes():
    src = mb_kernel("        mov.b64 r3, 2\n        mbarrier.init [r1+8], r3\n        mbarrier.arrive [r1+8]\n"
                    "        mbarrier.wait [r1+8], r6   // X")
    _deadlock(src, "// X", "waits at mbarrier.wait forever: the barrier at scratchpad 8 is in phase 0 with 1 "
                           "arrival(s) and 0 transaction byte(s) pending, and no warp left can complete it")


def test_deadlock_bytes_never_land():
    src = mb_kernel("        mbarrier.init [r1], r2\n        mov.b64 r3, 64\n"
                    "        mbarrier.arrive.expect_tx [r1], r3\n        mbarrier.wait [r1], r6   // X")
    _deadlock(src, "// X", "waits at mbarrier.wait forever: the barrier at scratchpad 0 is in phase 0 with 0 "
                           "arrival(s) and 64 transaction byte(s) pending")


def test_deadlock_waiting_for_a_phase_after_the_other_warp_exits():
    # warp 0 completes phase 0 and exits; warp 1 waits for phase 1 (parity 1), which nobody completes
    src = mb_kernel("""        s2r r4, %warpid
        setp.ne.i64 p0, r4, 0
   @p0  bra W1
        mbarrier.init [r1], r2
W1:     bar.sync
   @p0  bra WAIT
        mbarrier.arrive [r1]
        exit
WAIT:   mov.b64 r7, 1
        mbarrier.wait [r1], r6
        mbarrier.wait [r1], r7   // X""", block=64)
    _deadlock(src, "// X", "waits at mbarrier.wait forever: the barrier at scratchpad 0 is in phase 1 with 1 "
                           "arrival(s) and 0 transaction byte(s) pending", block_warp="block 0 warp 1")


def test_deadlock_mbarrier_wait_beside_a_bar_sync():
    # warp 0 waits at the barrier (phase 0 needs an arrival from warp 1); warp 1 waits at bar.sync for
    # warp 0: the first warp that cannot go on is reported
    src = mb_kernel("""        s2r r4, %warpid
        mbarrier.init [r1], r2
        setp.ne.i64 p0, r4, 0
   @p0  bra W1
        mbarrier.wait [r1], r6   // X
        bra END
W1:     bar.sync
        mbarrier.arrive [r1]
END:    nop""", block=64)
    _deadlock(src, "// X", "waits at mbarrier.wait forever: the barrier at scratchpad 0 is in phase 0 with 1 "
                           "arrival(s) and 0 transaction byte(s) pending")


SPIN_SRC = mb_kernel("""        s2r r4, %warpid
        setp.ne.i64 p0, r4, 0
   @p0  bra W1
        mbarrier.init [r1], r2
W1:     bar.sync
   @p0  bra WAIT
        mov.b64 r8, 0
LOOP:   add.i64 r8, r8, 1
        setp.lt.i64 p1, r8, 300
   @p1  bra LOOP
        mbarrier.arrive [r1]
        exit
WAIT:   mbarrier.wait [r1], r6
        s2r r9, %clock""", block=64)


def _spin_runs():
    """Warp 1 waits at mbarrier.wait while warp 0 runs a 300-iteration loop before it arrives."""
    prog = assemble_checked(SPIN_SRC)
    return {eng: run_functional(prog, {"out": np.zeros(1, np.int64)}, engine=eng) for eng in ENGINES}


def test_blocked_wait_is_not_a_warp_instruction():
    # warp 0: 6 + init, bar, bra, mov, 3 x 300, arrive, exit = 912; warp 1: 6 + bar, bra, wait, s2r, exit = 11
    for eng, r in _spin_runs().items():
        assert r.warp_instructions == 923, (eng, r.warp_instructions)


def test_blocked_wait_does_not_advance_clock():
    # %clock in a functional run is the instructions this warp has issued (isa/README.md): 6, bar.sync,
    # bra and the wait itself once; however often the wait found its phase incomplete (that depends on
    # the engine's scheduling quantum) it issued once
    for eng, r in _spin_runs().items():
        assert set(r.regs[1, 9].tolist()) == {9}, (eng, sorted(set(r.regs[1, 9].tolist())))


# ------------------------------------------------------------------------- load-time checks
def test_tma_refused_without_the_feature():
    prog = assemble(base_case().kernel())
    check_program(prog)
    check_target(prog, capabilities(load_machine("h100")))
    with pytest.raises(InputError) as e:
        check_target(prog, capabilities(load_machine("a100")))
    assert "tma" in str(e.value)
