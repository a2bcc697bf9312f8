"""Warpgroup MMA (wgmma.*) on both functional engines: the numba interpreter and its Python twin
(archsim/engine/reference.py), against a numpy oracle written from isa/README.md ("Warpgroup MMA
operands ...": descriptors, K-/MN-major layouts, swizzles, the accumulator fragment)."""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.functional import run_functional
from archsim.engine.launch import bf16_bits_to_f32, f32_to_bf16_bits
from archsim.engine.reference import run_reference
from archsim.errors import InputError, SimulationError
from archsim.isa.asm import assemble
from archsim.isa.check import check_program, check_target

ACC = 16        # first accumulator register of the kernels below
SWIZZLE = {0: 0, 128: 1, 64: 2, 32: 3}   # swizzle width S -> descriptor bits 62-63


@pytest.fixture(params=["reference", "numba"])
def engine(request):
    """Every test here runs on the Python twin and on the numba interpreter."""
    return request.param


def run(engine, prog, args):
    if engine == "numba":
        return run_functional(prog, args)
    return run_reference(prog, args)


# ------------------------------------------------------------------------- the README's layouts
class Tile:
    """A descriptor tile: start, LBO, SBO (bytes), swizzle width S (0: none), MN-major or K-major."""

    def __init__(self, start, lbo=0, sbo=0, S=0, mn_major=False):
        self.start, self.lbo, self.sbo, self.S, self.mn = start, lbo, sbo, S, mn_major

    def desc(self) -> int:
        d = (self.start >> 4) | ((self.lbo >> 4) << 16) | ((self.sbo >> 4) << 32) | (SWIZZLE[self.S] << 62)
        return d - (1 << 64) if d >> 63 else d     # a scalar parameter is a signed 64-bit value

    def addr(self, r, k) -> int:
        """Physical scratchpad address of element (row r, k) (isa/README.md)."""
        s, L, B, S = self.start, self.lbo, self.sbo, self.S
        if not self.mn:
            if S:
                a = s + (r // 8) * B + (r % 8) * S + 2 * k
            else:
                a = s + (r // 8) * B + (2 * k // 16) * L + (r % 8) * 16 + (2 * k) % 16
        else:
            if S:
                a = s + (r // (S // 2)) * L + (k // 8) * B + (k % 8) * S + 2 * (r % (S // 2))
            else:
                a = s + (r // 8) * L + (k // 8) * B + (k % 8) * 16 + 2 * (r % 8)
        if S:
            a ^= ((a >> 7) & (S // 16 - 1)) << 4
        return a


class Image:
    """A scratchpad image built in Python; the kernel copies it into the scratchpad first."""

    def __init__(self, nbytes):
        self.data = np.zeros(nbytes, np.uint8)
        self.used = np.zeros(nbytes, bool)

    def place(self, tile: Tile, bits: np.ndarray):
        """bits[r, k] (uint16, rows x 16) at the tile's addresses."""
        for r in range(bits.shape[0]):
            for k in range(16):
                a = tile.addr(r, k)
                assert not self.used[a:a + 2].any(), f"tiles overlap at {a:#x}"
                self.used[a:a + 2] = True
                self.data[a] = bits[r, k] & 0xFF
                self.data[a + 1] = bits[r, k] >> 8


def halves(rng, shape, dt):
    """Random values of the source format: (uint16 bits, exact float32 values)."""
    x = rng.standard_normal(shape).astype(np.float32)
    if dt == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float32)
    b = f32_to_bf16_bits(x)
    return b, bf16_bits_to_f32(b)


def oracle(A, B, C):
    """D = A*B + C in fp32, k order, each product rounded to fp32 (float32 numpy ops round once)."""
    acc = C.astype(np.float32).copy()
    for k in range(A.shape[1]):
        acc = acc + A[:, k:k + 1] * B[k:k + 1, :]
    return acc


def acc_places(N):
    """(thread, register j of the range, row, column) of the 64 x N accumulator over 128 threads."""
    out = []
    for q in range(4):
        for L in range(32):
            g, t = L // 4, L % 4
            for c in range(N // 8):
                for j, (row, col) in enumerate(((g, 8 * c + 2 * t), (g, 8 * c + 2 * t + 1),
                                                (g + 8, 8 * c + 2 * t), (g + 8, 8 * c + 2 * t + 1))):
                    out.append((32 * q + L, 4 * c + j, 16 * q + row, col))
    return out


def to_raw(M, N):
    """64 x N matrix -> [thread, register] as the accumulator ranges hold it."""
    raw = np.zeros((128, N // 2), np.float32)
    for tid, j, row, col in acc_places(N):
        raw[tid, j] = M[row, col]
    return raw


def from_raw(raw, N):
    M = np.zeros((64, N), np.float32)
    for tid, j, row, col in acc_places(N):
        M[row, col] = raw[tid, j]
    return M


def a_fragments(Abits):
    """The A operand of .rs: thread 32q+L's four registers, mma's A fragment of rows 16q..16q+15."""
    out = np.zeros((128, 4), np.uint32)
    for q in range(4):
        for L in range(32):
            g, t = L // 4, L % 4
            for j, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                lo, hi = int(Abits[16 * q + row, col]), int(Abits[16 * q + row, col + 1])
                out[32 * q + L, j] = lo | (hi << 16)
    return out


# ------------------------------------------------------------------------- the kernel
def kernel(N, dt, shared, *, steps=1, rs=False, layout=0, block=128, guard="", tamper="") -> str:
    """Copy `smem` into the scratchpad, load the accumulators from C ([thread, N/2] f32), run
    `steps` wgmma (descriptors descA<i> / descB<i>; with .rs the A fragments Afrag<i>, [thread, 4]),
    store the accumulators to D ([thread, N/2]). `tamper`: lines put just before each wgmma."""
    rs_sfx = ".rs" if rs else ""
    a_name = "Afrag" if rs else "descA"
    params = ["smem", "C", "D"] + [p + str(i) for i in range(steps) for p in (a_name, "descB")]
    lines = [".kernel wg"] + [f".param {p}" for p in params] + [f".shared {shared}", f".launch grid=1 block={block}"]
    lines.append(f"""
        s2r r0, %tid.x
        s2r r1, %ntid.x
        shl.b64 r1, r1, 4           // bytes a block copies a round
        shl.b64 r3, r0, 4           // this thread's scratchpad offset
        ldparam r2, smem
COPY:   setp.ge.i64 p0, r3, {shared}
   @p0  bra COPIED
        add.i64 r4, r2, r3
        cp.async.16 [r3], [r4]
        add.i64 r3, r3, r1
        bra COPY
COPIED: cp.async.commit
        cp.async.wait 0
        bar.sync
        mul.i64 r5, r0, {2 * N}     // thread * N/2 registers * 4 bytes
        ldparam r6, C
        add.i64 r6, r6, r5""")
    for c in range(N // 8):
        lines.append(f"        ld.global.v4.b32 r{ACC + 4 * c}, [r6+{16 * c}]")
    lines.append("        setp.eq.i64 p1, r0, 5\n        wgmma.fence")
    for i in range(steps):
        if rs:
            lines.append(f"        ldparam r7, Afrag{i}\n        shl.b64 r8, r0, 4\n        add.i64 r7, r7, r8\n"
                         f"        ld.global.v4.b32 r8, [r7]")
            a = "r8"
        else:
            lines.append(f"        ldparam r8, descA{i}")
            a = "r8"
        lines.append(f"        ldparam r12, descB{i}")
        if tamper:
            lines.append(tamper)
        lines.append(f"  {guard:>5} wgmma.m64n{N}k16.f32.{dt}{rs_sfx} r{ACC}, {a}, r12, {layout}")
    lines.append("        wgmma.commit_group\n        wgmma.wait_group 0")
    lines.append("        ldparam r6, D\n        add.i64 r6, r6, r5")
    for c in range(N // 8):
        lines.append(f"        st.global.v4.b32 [r6+{16 * c}], r{ACC + 4 * c}")
    lines.append("        exit\n")
    return "\n".join(lines)


def line_of(src: str, text: str) -> int:
    for i, line in enumerate(src.splitlines(), start=1):
        if text in line:
            return i
    raise AssertionError(text)


def gemm_case(engine, *, N, dt, tiles_a, tiles_b, layout=0, rs=False, seed=0, shared=None, zero_c=False,
              junk=0, tamper=""):
    """Run len(tiles_b) chained wgmma (k tiles 0, 1, ...) and compare with the oracle bit for bit.
    tiles_a[i] / tiles_b[i]: the Tile of A / B of step i (tiles_a unused with rs)."""
    rng = np.random.default_rng(seed)
    steps = len(tiles_b)
    Abits, Af = halves(rng, (64, 16 * steps), dt)
    Bbits, Bf = halves(rng, (N, 16 * steps), dt)           # B stored as N x K: element (n, k) = B[k][n]
    C = np.zeros((64, N), np.float32) if zero_c else rng.standard_normal((64, N)).astype(np.float32)
    if shared is None:
        tiles = [(t, 64) for t in ([] if rs else tiles_a)] + [(t, N) for t in tiles_b]
        top = max(t.addr(r, k) for t, rows in tiles for r in range(rows) for k in range(16)) + 2
        shared = (top + 15) // 16 * 16
    img = Image(shared)
    args = {}
    for i in range(steps):
        ks = slice(16 * i, 16 * i + 16)
        if rs:
            args[f"Afrag{i}"] = a_fragments(Abits[:, ks]).view(np.int32)
        else:
            img.place(tiles_a[i], Abits[:, ks])
            args[f"descA{i}"] = _or_bits(tiles_a[i].desc(), junk)
        img.place(tiles_b[i], Bbits[:, ks])
        args[f"descB{i}"] = _or_bits(tiles_b[i].desc(), junk)
    src = kernel(N, dt, shared, steps=steps, rs=rs, layout=layout, tamper=tamper)
    prog = assemble(src)
    check_program(prog)
    check_target(prog, capabilities(load_machine("h100")))
    args.update(smem=img.data, C=to_raw(C, N), D=np.zeros((128, N // 2), np.float32))
    res = run(engine, prog, {p: args[p] for p in prog.params})
    got = from_raw(res.output("D").reshape(128, N // 2), N)
    want = oracle(Af, Bf.T.copy(), C)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.argwhere(got != want)[:5]
    np.testing.assert_allclose(got, Af.astype(np.float64) @ Bf.T.astype(np.float64) + C, rtol=1e-4, atol=1e-4)


def _or_bits(desc, bits):
    d = (desc | bits) & ((1 << 64) - 1)
    return d - (1 << 64) if d >> 63 else d


def kmajor_sw(base, S, kt=0):
    """A swizzled K-major tile: rows of S bytes, 8-row groups SBO = 8*S apart; k tile kt starts 32*kt
    bytes into the row."""
    return Tile(base + 32 * kt, sbo=8 * S, S=S)


# ------------------------------------------------------------------------- results
def test_ss_f16_n64_kmajor_128b_swizzle(engine):
    gemm_case(engine, N=64, dt="f16", tiles_a=[kmajor_sw(0, 128)], tiles_b=[kmajor_sw(8192, 128)],
              zero_c=True)


def test_bf16_n256_kmajor_128b_swizzle_tile_inside_the_row(engine):
    # k tile 1 of a 128-byte row: start % 128 = 32, still 32 + 32 <= 128
    gemm_case(engine, N=256, dt="bf16", tiles_a=[kmajor_sw(0, 128, kt=1)],
              tiles_b=[kmajor_sw(8192, 128, kt=3)], seed=1)


def test_rs_variant_a_from_registers(engine):
    gemm_case(engine, N=32, dt="f16", tiles_a=None, tiles_b=[kmajor_sw(0, 64)], rs=True, seed=2)


def test_rs_bf16_with_mn_major_b(engine):
    # MN-major B, 128-byte swizzle: 64 n a row, k rows SBO apart per 8 k, n blocks of 64 LBO apart
    gemm_case(engine, N=128, dt="bf16", tiles_a=None, tiles_b=[Tile(1024, lbo=2048, sbo=1024, S=128, mn_major=True)],
              rs=True, layout=2, seed=3)


def test_mn_major_b_128b_swizzle(engine):
    gemm_case(engine, N=128, dt="f16", tiles_a=[kmajor_sw(0, 128)],
              tiles_b=[Tile(8192, lbo=2048, sbo=1024, S=128, mn_major=True)], layout=2, seed=4)


def test_n96_mn_major_b_64b_swizzle(engine):
    # N = 96: three 32-wide n blocks of a 64-byte swizzled MN-major B, LBO = 1024 apart
    gemm_case(engine, N=96, dt="bf16", tiles_a=[kmajor_sw(0, 64)],
              tiles_b=[Tile(4096, lbo=1024, sbo=512, S=64, mn_major=True)], layout=2, seed=10)


def test_mn_major_a_64b_swizzle_and_mn_major_b_unswizzled(engine):
    gemm_case(engine, N=16, dt="bf16", tiles_a=[Tile(0, lbo=1024, sbo=512, S=64, mn_major=True)],
              tiles_b=[Tile(2048, lbo=128, sbo=256, mn_major=True)], layout=3, seed=5)


def test_kmajor_unswizzled_with_lbo_sbo(engine):
    # core matrices of 8 rows x 16 bytes: A k halves LBO = 128 apart, 8-row groups SBO = 256 apart;
    # B the other way round (all row groups of the first k half, then the second)
    gemm_case(engine, N=32, dt="f16", tiles_a=[Tile(0, lbo=128, sbo=256)],
              tiles_b=[Tile(2048, lbo=512, sbo=128)], seed=6)


def test_kmajor_32b_swizzle(engine):
    gemm_case(engine, N=64, dt="bf16", tiles_a=[kmajor_sw(0, 32)], tiles_b=[kmajor_sw(2048, 32)], seed=7)


def test_two_chained_wgmma_accumulate_in_k_order(engine):
    # two k tiles of one 128-byte swizzled K-major operand (start advanced by 32 bytes), one accumulator
    gemm_case(engine, N=64, dt="f16", tiles_a=[kmajor_sw(0, 128, kt=0), kmajor_sw(0, 128, kt=1)],
              tiles_b=[kmajor_sw(8192, 128, kt=0), kmajor_sw(8192, 128, kt=1)], seed=8)


def test_chained_64b_swizzle_rs(engine):
    gemm_case(engine, N=16, dt="f16", tiles_a=None, tiles_b=[kmajor_sw(0, 64, kt=0), kmajor_sw(0, 64, kt=1)],
              rs=True, seed=9)


def test_descriptor_from_lane_0_other_bits_ignored(engine):
    # bits 14-15, 30-31 and 46-61 of a descriptor are ignored; only lane 0's value counts (lanes 1..31
    # hold garbage); unswizzled tiles, so bits 62-63 stay 0
    junk = (3 << 14) | (3 << 30) | (0xFFFF << 46)
    tamper = ("        s2r r9, %laneid\n        setp.ne.i64 p2, r9, 0\n"
              "   @p2  mov.b64 r8, -1\n   @p2  mov.b64 r12, 0x123450")
    gemm_case(engine, N=16, dt="f16", tiles_a=[Tile(0, lbo=128, sbo=256)], tiles_b=[Tile(2048, lbo=128, sbo=256)],
              seed=11, junk=junk, tamper=tamper)


# ------------------------------------------------------------------------- faults
def _fault(engine, src, args):
    prog = assemble(src)
    check_program(prog)
    with pytest.raises(SimulationError) as e:
        run(engine, prog, {p: args[p] for p in prog.params})
    assert e.value.where == f"<asm>:{line_of(src, 'wgmma.m64n')}", (e.value.where, e.value.what)
    assert "block 0 warp 0" in e.value.what, e.value.what
    return e.value


def _fault_args(N, shared, descA, descB):
    return dict(smem=np.zeros(shared, np.uint8), C=np.zeros((128, N // 2), np.float32),
                D=np.zeros((128, N // 2), np.float32), descA0=descA, descB0=descB)


def test_fault_incomplete_warpgroup(engine):
    src = kernel(16, "f16", 4096, block=64)
    e = _fault(engine, src, _fault_args(16, 4096, kmajor_sw(0, 32).desc(), kmajor_sw(2048, 32).desc()))
    assert "warpgroup" in e.what, e.what


def test_fault_guarded_off_lane(engine):
    src = kernel(16, "f16", 4096, guard="@!p1")      # thread 5 (warp 0 lane 5) is guarded off
    e = _fault(engine, src, _fault_args(16, 4096, kmajor_sw(0, 32).desc(), kmajor_sw(2048, 32).desc()))
    assert ("lane 5" if engine == "reference" else "32 lanes") in e.what, e.what


def test_fault_tile_past_the_scratchpad(engine):
    # B: 64 rows of 128 bytes from 8192 needs 16 KiB; the scratchpad has 12 KiB
    src = kernel(64, "f16", 12288)
    e = _fault(engine, src, _fault_args(64, 12288, kmajor_sw(0, 128).desc(), kmajor_sw(8192, 128).desc()))
    assert "outside" in e.what, e.what


def test_fault_misaligned_swizzled_kmajor_start(engine):
    # start % 128 = 112: the 32 bytes of k cross the 128-byte row
    src = kernel(16, "f16", 16384)
    e = _fault(engine, src, _fault_args(16, 16384, Tile(112, sbo=1024, S=128).desc(), kmajor_sw(8192, 128).desc()))
    assert "misaligned" in e.what, e.what


def test_fault_misaligned_swizzled_mn_major_start(engine):
    src = kernel(16, "f16", 16384, layout=2)
    e = _fault(engine, src, _fault_args(16, 16384, kmajor_sw(0, 128).desc(),
                                        Tile(8192 + 64, lbo=2048, sbo=1024, S=128, mn_major=True).desc()))
    assert "misaligned" in e.what, e.what


# ------------------------------------------------------------------------- load-time checks
def test_wgmma_refused_on_a100_accepted_on_h100():
    prog = assemble(kernel(64, "f16", 16384))
    check_program(prog)
    check_target(prog, capabilities(load_machine("h100")))
    with pytest.raises(InputError) as e:
        check_target(prog, capabilities(load_machine("a100")))
    assert "wgmma" in str(e.value)


def test_wait_group_8_refused():
    for n, ok in ((7, True), (8, False)):
        prog = assemble(f".kernel t\n.launch grid=1 block=128\n        wgmma.wait_group {n}\n        exit\n")
        if ok:
            check_program(prog)
        else:
            with pytest.raises(InputError, match="wait_group 8"):
                check_program(prog)


def test_rs_with_mn_major_a_refused():
    check_program(assemble(kernel(16, "f16", 4096, rs=True, layout=2)))
    with pytest.raises(InputError, match="MN-major"):
        check_program(assemble(kernel(16, "f16", 4096, rs=True, layout=1)))
