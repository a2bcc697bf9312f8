"""The GPU GEMM emitter (archsim.workloads.emit.gemm_gpu) against numpy, on the numba engine.

Tolerances (|got - ref| <= atol + rtol*|ref|, reference in float64 from the exact inputs):
- f32 out: fp16 / bf16 / tf32 products are exact in fp32 and the tensor units sum in fp32 in k
  order (FFMA: one rounding per fma): error ~ eps32 * sqrt(K) * |C| ~ 1e-6 here; (1e-4, 1e-5) as
  for isa/examples/gemm_mma.s. A layout or edge bug gives O(1) errors.
- f16 out: the f32 result rounded once to fp16 (relative 2^-11 = 4.9e-4): (1e-4, 1e-3).
- bf16 out: rounded once to bf16 (2^-9 = 2e-3): (1e-3, 4e-3).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.check import check
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit import Tile, gemm_kernel
from archsim.workloads.emit import gemm_gpu as gg
from archsim.workloads.emit.common import blocks_per_core
from archsim.workloads.emit.gemm_gpu import to_float

TOL = {"f32": (1e-4, 1e-5), "f16": (1e-4, 1e-3), "bf16": (1e-3, 4e-3)}
_CAPS = {}


def caps_of(hw: str):
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


def run_and_compare(caps, M, N, K, dtype, out, trans_b, tile=None, seed=0, engine="numba", kernel=None):
    from archsim.engine.functional import run_functional

    k = gemm_kernel(caps, M, N, K, dtype, out, trans_b, tile=tile, kernel=kernel)
    A, B, C = k.random_inputs(seed)
    res = run_functional(k.program, k.args(A, B, C), k.launch, warp_width=caps.warp_width,
                         ncores=caps.cores_total, engine=engine)
    got = to_float(res.output("C"), k.out_dtype)
    ref = k.reference(A, B)
    atol, rtol = TOL[k.out_dtype]
    err = np.abs(got - ref)
    bad = ~(err <= atol + rtol * np.abs(ref))
    assert not bad.any(), (f"{M}x{N}x{K} {dtype}->{out} trans_b={trans_b} tile={k.tile}: {int(bad.sum())} bad, "
                           f"first at {np.argwhere(bad)[0]}, max err {float(err.max()):.3g}")
    return k, res


T128 = Tile(128, 128, 32, 4, 3)
T128x64 = Tile(128, 64, 32, 4, 3)
T64 = Tile(64, 64, 32, 4, 3)
T64S2 = Tile(64, 64, 32, 4, 2)

# (hw, M, N, K, dtype, out, trans_b, tile): aligned and odd shapes; copy widths 16 (K, N multiples
# of 8), 8 (K = 36, 44), 4 (K = 70) and per element (odd K or N); residue k tiles; edge blocks
CASES = [
    ("a100", 128, 128, 64, "fp16", "f32", False, None),
    ("a100", 128, 128, 64, "fp16", "f32", False, T128),
    ("a100", 128, 128, 64, "fp16", "f32", True, T128),
    ("a100", 128, 128, 64, "bf16", "bf16", False, T128),
    ("a100", 130, 66, 40, "fp16", "f32", False, None),
    ("a100", 130, 66, 40, "fp16", "f32", False, T128x64),
    ("a100", 130, 66, 40, "fp16", "f16", True, T128x64),
    ("a100", 77, 45, 19, "fp16", "f32", False, None),
    ("a100", 77, 45, 19, "fp16", "f16", True, None),
    ("a100", 77, 45, 19, "bf16", "bf16", False, T64),
    ("a100", 1, 1, 1, "fp16", "f32", False, None),
    ("a100", 1, 1, 1, "bf16", "bf16", True, None),
    ("a100", 96, 80, 44, "bf16", "f32", False, T64),
    ("a100", 64, 72, 36, "fp16", "f16", False, None),
    ("a100", 50, 64, 70, "bf16", "bf16", False, None),
    ("a100", 64, 64, 96, "fp16", "f16", True, T64S2),
    ("a100", 70, 72, 40, "tf32", "f32", False, Tile(64, 64, 16, 4, 3)),
    ("a100", 33, 40, 21, "tf32", "f32", True, None),
    ("a100", 3, 9, 3, "tf32", "f32", False, None),
    ("tiny-gpu", 128, 128, 64, "fp16", "f32", False, None),
    ("tiny-gpu", 77, 45, 19, "bf16", "f32", True, None),
    ("tiny-gpu", 130, 66, 40, "fp16", "f16", False, None),
]


@pytest.mark.parametrize("hw,M,N,K,dtype,out,trans_b,tile", CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[4]}-{c[5]}{'-tb' if c[6] else ''}"
                              f"{'-%dx%ds%d' % (c[7].BM, c[7].BN, c[7].stages) if c[7] else ''}" for c in CASES])
def test_tensor_core_gemm_matches_numpy(hw, M, N, K, dtype, out, trans_b, tile):
    k, _ = run_and_compare(caps_of(hw), M, N, K, dtype, out, trans_b, tile, seed=M + 3 * N + 7 * K)
    assert k.kind == "mma"
    if tile is not None:
        assert (k.tile.BM, k.tile.BN, k.tile.stages) == (tile.BM, tile.BN, tile.stages)


FFMA_CASES = [
    ("a100", 77, 45, 19, "fp32", "f32", False),
    ("a100", 70, 130, 33, "fp32", "f32", True),
    ("a100", 128, 128, 64, "fp32", "f32", False),
    ("tiny-gpu", 1, 1, 1, "fp32", "f32", False),
    ("tiny-gpu", 65, 64, 48, "fp32", "f32", True),
]


@pytest.mark.parametrize("hw,M,N,K,dtype,out,trans_b", FFMA_CASES,
                         ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}{'-tb' if c[6] else ''}" for c in FFMA_CASES])
def test_ffma_fallback_fp32(hw, M, N, K, dtype, out, trans_b):
    k, _ = run_and_compare(caps_of(hw), M, N, K, dtype, out, trans_b, seed=M + N + K)
    assert k.kind == "ffma"
    assert "fma.f32" in {opcodes()[int(o)].mnemonic for o in k.program.op}


@pytest.mark.parametrize("dtype,out,trans_b,shape", [("fp16", "f16", False, (70, 33, 21)),
                                                     ("bf16", "bf16", True, (64, 64, 40)),
                                                     ("fp16", "f32", True, (66, 64, 64))])
def test_ffma_fallback_when_the_tensor_units_lack_the_dtype(dtype, out, trans_b, shape):
    caps = dataclasses.replace(caps_of("a100"), tensor_dtypes=frozenset({"tf32"}))
    k, _ = run_and_compare(caps, *shape, dtype, out, trans_b, seed=1)
    assert k.kind == "ffma"
    assert not any(opcodes()[int(o)].unit == "tensor" for o in k.program.op)


# ----------------------------------------------------------------------------- tile choice
def test_a100_takes_a_128_wide_tile_for_a_big_gemm():
    caps = caps_of("a100")
    for n in (2048, 4096):
        k = gemm_kernel(caps, n, n, n, "fp16")
        assert (k.tile.BM, k.tile.BN) == (128, 128) and k.tile.BK in (32, 64)
        assert k.tile.warps == 4 and k.tile.stages >= 3
        assert k.launch.grid == (n // 128, n // 128, 1) and k.launch.block == (128, 1, 1)
        assert k.flops == 2 * n ** 3
        assert k.program.nregs <= caps.max_regs_per_thread
        assert k.program.nregs * 128 <= caps.regs_per_core
        assert k.program.shared_bytes == k.tile.stages * (128 + 128) * k.tile.BK * 2 <= caps.scratchpad_bytes
    k = gemm_kernel(caps, 4096, 4096, 4096, "bf16", "bf16", trans_b=True)
    assert (k.tile.BM, k.tile.BN) == (128, 128)


def test_small_problems_spread_over_more_cores():
    caps = caps_of("a100")
    k = gemm_kernel(caps, 512, 512, 512, "fp16")
    assert k.tile.BM * k.tile.BN < 128 * 128
    assert k.launch.blocks >= 64          # 128 x 128 tiles would give 16 blocks for 108 SMs
    small = gemm_kernel(caps, 1, 1, 1, "fp16")
    assert small.launch.blocks == 1


def _waves(caps, k, launches=1):
    slots = blocks_per_core(caps, k.program, 32 * k.tile.warps) * caps.cores_total
    return -(-k.launch.blocks * launches // slots)


@pytest.mark.parametrize("hw,M,N,K,launches", [("h100", 1, 36864, 12288, 1), ("h100", 1, 12288, 12288, 1),
                                               ("h100", 8, 49152, 12288, 1), ("a100", 1, 36864, 12288, 1),
                                               ("a100", 1, 4096, 4096, 12), ("tiny-gpu", 16, 4096, 512, 1)])
def test_a_skinny_gemm_takes_the_stage_count_with_the_fewest_waves(hw, M, N, K, launches):
    """Decode's GEMV streams B: a last wave of a few blocks streams at a few cores' rate, so its
    stage count is the one that gives the fewest waves over every core's block slots, ties to the
    deeper pipeline."""
    caps = caps_of(hw)
    cfg, prog = gg.choose_tile(caps, M, N, K, launches=launches)
    picked = gemm_kernel(caps, M, N, K, "fp16", tile=Tile(cfg.BM, cfg.BN, cfg.kb // 2, 4, cfg.stages))
    w = _waves(caps, picked, launches)
    for BK, stages in ((64, 4), (64, 3), (32, 3), (32, 2)):
        try:
            other = gemm_kernel(caps, M, N, K, "fp16", tile=Tile(cfg.BM, cfg.BN, BK, 4, stages))
        except InputError:
            continue                              # does not fit the core
        assert _waves(caps, other, launches) >= w
        if _waves(caps, other, launches) == w:
            assert BK * stages <= cfg.kb // 2 * cfg.stages
    if (hw, N) == ("h100", 36864):                # the deepest pipeline would take two waves
        assert (cfg.BM, cfg.BN, cfg.stages, w) == (32, 64, 3, 1)
        deep = gemm_kernel(caps, M, N, K, "fp16", tile=Tile(32, 64, 64, 4, 4))
        assert _waves(caps, deep) == 2


def test_a_wide_gemm_keeps_the_deepest_pipeline():
    caps = caps_of("h100")
    k = gemm_kernel(caps, 2048, 36864, 12288, "fp16", kernel="mma")
    assert (k.tile.BM, k.tile.BN, k.tile.BK, k.tile.stages) == (128, 128, 64, 4)
    k = gemm_kernel(caps, 2048, 36864, 12288, "fp16")
    assert (k.kind, k.tile.BM, k.tile.BN, k.tile.BK, k.tile.stages) == ("wgmma", 128, 256, 64, 4)


def test_tiny_gpu_tile_fits_its_small_scratchpad():
    caps = caps_of("tiny-gpu")
    assert caps.scratchpad_bytes == 16 * 1024
    for dt, tb in (("fp16", False), ("bf16", True), ("tf32", False), ("tf32", True)):
        k = gemm_kernel(caps, 1024, 1024, 1024, dt, trans_b=tb)
        assert k.kind == "mma"
        assert k.program.shared_bytes <= caps.scratchpad_bytes
        assert k.tile.stages >= 2
        assert k.program.nregs * 32 * k.tile.warps <= caps.regs_per_core
        check(k.program, caps)
    k = gemm_kernel(caps, 1024, 1024, 1024, "fp16")
    assert (k.tile.BM, k.tile.BN, k.tile.stages) == (64, 64, 2)
    with pytest.raises(InputError, match="does not fit"):
        gemm_kernel(caps, 1024, 1024, 1024, "fp16", tile=T128)


# ----------------------------------------------------------------------------- program shape
def test_program_size_does_not_depend_on_the_problem_size():
    caps = caps_of("a100")
    small = gemm_kernel(caps, 128, 128, 64, "fp16", tile=T128)
    big = gemm_kernel(caps, 8192, 8192, 8192, "fp16", tile=T128)
    assert small.program == big.program            # M, N, K are kernel parameters
    assert big.launch.blocks == 64 * 64
    bra = SEM["bra"]
    sems = [SEM[opcodes()[int(o)].sem] for o in big.program.op]
    assert any(s == bra and int(big.program.imm[pc]) <= pc for pc, s in enumerate(sems)), "a K loop"
    assert len(big.program) < 1500                 # accumulators x (zeroing + 2 epilogues) dominate
    mnems = {opcodes()[int(o)].mnemonic for o in big.program.op}
    assert {"cp.async.16", "ldmatrix.x4", "ldmatrix.x4.trans", "mma.m16n8k16.f32.f16"} <= mnems


@pytest.mark.parametrize("hw", ["a100", "tiny-gpu"])
def test_kernels_pass_the_load_time_checks(hw):
    caps = caps_of(hw)
    for dt, out in (("fp16", "f32"), ("fp16", "f16"), ("bf16", "bf16"), ("tf32", "f32"), ("fp32", "f32")):
        for tb in (False, True):
            for shape in ((2048, 2048, 2048), (77, 45, 19)):
                k = gemm_kernel(caps, *shape, dt, out, tb)
                check(k.program, caps)
                assert k.program.nregs <= caps.max_regs_per_thread
            k = gemm_kernel(caps, 2048, 2048, 2048, dt, out, tb, trans_a=True)
            check(k.program, caps)
            assert k.program.nregs <= caps.max_regs_per_thread
            if dt in ("fp16", "bf16"):      # same scratchpad (tf32 A^T rows are padded: may need a smaller tile)
                assert k.tile == gemm_kernel(caps, 2048, 2048, 2048, dt, out, tb).tile


def test_bad_requests_are_clear_errors():
    caps = caps_of("a100")
    with pytest.raises(InputError, match="M, N, K >= 1"):
        gemm_kernel(caps, 0, 4, 4)
    with pytest.raises(InputError, match="dtype"):
        gemm_kernel(caps, 4, 4, 4, "int4")
    with pytest.raises(InputError, match="out_dtype"):
        gemm_kernel(caps, 4, 4, 4, "fp16", "bf16")
    with pytest.raises(InputError, match="gpu family"):
        gemm_kernel(caps_of("tiny-sunway"), 4, 4, 4)
    k = gemm_kernel(caps, 8, 8, 8)
    A, B, C = k.random_inputs()
    with pytest.raises(InputError, match="float16"):
        k.args(A.T.copy()[:4], B, C)


def test_args_accept_unbacked_buffers():
    from archsim.engine.timing import Unbacked

    k = gemm_kernel(caps_of("a100"), 1000, 512, 256, "bf16", "bf16", trans_b=True)
    nb = k.buffer_bytes()
    assert nb == {"A": 1000 * 256 * 2, "B": 512 * 256 * 2, "C": 1000 * 512 * 2}
    args = k.args(Unbacked(nb["A"]), Unbacked(nb["B"]), Unbacked(nb["C"]))
    assert (args["M"], args["N"], args["K"]) == (1000, 512, 256)
    with pytest.raises(InputError, match="bytes"):
        k.args(Unbacked(nb["A"] - 2), Unbacked(nb["B"]), Unbacked(nb["C"]))


# ----------------------------------------------------------------------------- swizzle
def _wavefronts(addrs, nbytes):
    """Shared-memory wavefronts of one warp access by the engine's rule (cache.shared_bank_conflicts)."""
    from archsim.engine.cache import shared_bank_conflicts

    a = np.zeros(32, np.int64)
    a[:len(addrs)] = addrs
    mask = (1 << len(addrs)) - 1
    return int(shared_bank_conflicts(a, np.int64(mask), nbytes, 32, 4))


@pytest.mark.parametrize("dtype,trans_b,tile,trans_a", [("fp16", False, T128, False), ("fp16", True, T128, False),
                                                        ("fp16", False, Tile(64, 32, 32, 4, 2), False),
                                                        ("tf32", False, Tile(64, 64, 16, 4, 2), False),
                                                        ("tf32", True, Tile(64, 64, 16, 4, 2), False),
                                                        ("fp16", True, T128, True),           # A^T: sw128
                                                        ("bf16", False, Tile(32, 64, 32, 4, 2), True),  # sw64
                                                        ("tf32", True, Tile(64, 64, 16, 4, 2), True)])  # padded
def test_fragment_loads_are_bank_conflict_free(dtype, trans_b, tile, trans_a, monkeypatch):
    """Run one block on the pure-Python reference engine, record the scratchpad addresses of every
    ldmatrix and ld.shared, and count wavefronts by the timing engine's rule: ldmatrix.xN takes N
    (one per 8-lane phase), a 4-byte ld.shared 1. The outputs agree bit for bit with numba's."""
    from archsim.engine import reference as R
    from archsim.engine.functional import run_functional

    caps = caps_of("a100")
    k = gemm_kernel(caps, tile.BM, tile.BN, 2 * tile.BK, dtype, "f32", trans_b, tile=tile, trans_a=trans_a)
    seen = []
    orig_ldm = R._Machine.op_ldmatrix

    def op_ldmatrix(self, w, ins, active, top, clock):
        n = ins.opc.matrices
        seen.append(("ldmatrix", n, [self.addr(w, ins.src[0], ins.imm, l) for l in range(8 * n)]))
        return orig_ldm(self, w, ins, active, top, clock)

    monkeypatch.setattr(R._Machine, "op_ldmatrix", op_ldmatrix)
    orig_ld = R._Machine.op_ld

    def op_ld(self, w, ins, active, top, clock):
        if ins.opc.space == "shared" and ins.opc.access_bytes == 4:  # the epilogue's 16-byte reads: below
            seen.append(("ld", 1, [self.addr(w, ins.src[0], ins.imm, l) for l in self.lanes(active)]))
        return orig_ld(self, w, ins, active, top, clock)

    monkeypatch.setattr(R._Machine, "op_ld", op_ld)
    A, B, C = k.random_inputs(3)
    ref = run_functional(k.program, k.args(A, B, C.copy()), k.launch, engine="reference")
    assert seen
    for kind, n, addrs in seen:
        nbytes = 16 if kind == "ldmatrix" else 4
        assert _wavefronts(addrs, nbytes) == n, (kind, addrs)
    fast = run_functional(k.program, k.args(A, B, C.copy()), k.launch, engine="numba")
    assert np.array_equal(fast.output("C").view(np.uint8), ref.output("C").view(np.uint8))
    assert fast.warp_instructions == ref.warp_instructions
    np.testing.assert_allclose(ref.output("C"), k.reference(A, B), *TOL["f32"][::-1])


@pytest.mark.parametrize("tile,out", [(T128, "f16"), (Tile(64, 32, 32, 4, 2), "bf16"), (T64, "f32"),
                                      (Tile(64, 32, 32, 4, 2), "f32")])
def test_c_is_staged_in_shared_memory_and_stored_16_bytes_a_lane(tile, out, monkeypatch):
    """A full block with 16-byte aligned rows: fragments go to a padded shared tile
    (conflict-free 4-byte f16x2 writes, 8-byte f32 writes in two half-warp phases) and leave as
    whole rows, 16 bytes a lane (ld.shared.v4 at the minimum 4 wavefronts, st.global.v4): no
    16-byte half-sector writes for the L2 to fill (f16), no warp store split over 8 rows (f32)."""
    from archsim.engine import reference as R
    from archsim.engine.functional import run_functional

    caps = caps_of("a100")
    dtype = "bf16" if out == "bf16" else "fp16"
    k = gemm_kernel(caps, tile.BM, tile.BN, 2 * tile.BK, dtype, out, tile=tile)
    mn = [opcodes()[int(o)].mnemonic for o in k.program.op]
    assert "st.global.v4.b32" in mn and "ld.shared.v4.b32" in mn
    write = "st.shared.v2.b32" if out == "f32" else "st.shared.b32"
    seen = []
    orig = {n: getattr(R._Machine, n) for n in ("op_ld", "op_st")}

    def hook(name):
        def op(self, w, ins, active, top, clock):
            if ins.opc.space == "shared" and ins.opc.mnemonic in (write, "ld.shared.v4.b32"):
                seen.append((ins.opc.mnemonic, [self.addr(w, ins.src[0], ins.imm, l) for l in self.lanes(active)]))
            return orig[name](self, w, ins, active, top, clock)
        return op

    for n in orig:
        monkeypatch.setattr(R._Machine, n, hook(n))
    A, B, C = k.random_inputs(5)
    res = run_functional(k.program, k.args(A, B, C), k.launch, engine="reference")
    kinds = {m for m, _ in seen}
    assert kinds == {write, "ld.shared.v4.b32"}, kinds
    for m, addrs in seen:
        nbytes = 16 if m.startswith("ld") else (8 if out == "f32" else 4)
        # f16, BN = 32: two rows of 4 chunks in each 8-lane phase of a 16-byte read share bank
        # groups (the padding is chosen for the 4-byte writes, 4x as many); 2 wavefronts, not 1
        want = nbytes // 4 * (2 if m.startswith("ld") and tile.BN == 32 and out != "f32" else 1)
        assert _wavefronts(addrs, nbytes) == want, (m, addrs)
    np.testing.assert_allclose(to_float(res.output("C"), out), k.reference(A, B), *TOL[out][::-1])


@pytest.mark.parametrize("raster", [(1, 0), (2, 0), (3, 1), (2, 1), (7, 0)])
@pytest.mark.parametrize("dtype,tile", [("fp16", T64S2), ("fp32", None)])
def test_every_block_raster_covers_c_once(raster, dtype, tile):
    """The grouped block raster (groups of `group` tile rows along M, or along N with raster_n)
    maps the grid one to one onto C's tiles, a short last group included: 5 x 7 tiles of 64."""
    from archsim.engine.functional import run_functional

    caps = caps_of("a100")
    k = dataclasses.replace(gemm_kernel(caps, 300, 420, 40, dtype, "f32", tile=tile), raster=raster)
    assert k.launch.grid[:2] == (7, 5)
    A, B, C = k.random_inputs(3)
    res = run_functional(k.program, k.args(A, B, C), k.launch, warp_width=caps.warp_width,
                         ncores=caps.cores_total)
    assert np.allclose(to_float(res.output("C"), "f32"), k.reference(A, B), atol=1e-4, rtol=1e-5)


def test_raster_groups_the_dimension_with_fewer_tiles():
    """A wide GEMM (few M tiles) groups M tiles and sweeps N; a tall one the reverse; the group
    has about sqrt(blocks in flight) rows, at most the rows there are."""
    caps = caps_of("a100")
    wide = gemm_kernel(caps, 2048, 36864, 1024, "fp16", "f32")
    assert wide.raster == (16, 0)                      # all 16 M tiles: each B panel is read once
    tall = gemm_kernel(caps, 36864, 2048, 1024, "fp16", "f32")
    assert tall.raster == (16, 1)
    square = gemm_kernel(caps, 8192, 8192, 1024, "fp16", "f32")
    assert square.raster[1] == 0 and 8 <= square.raster[0] <= 20


# h100 (warpgroup MMA): fp16 / bf16 GEMMs with A row-major take the wgmma kernel; odd shapes,
# residue k tiles, edge blocks, narrow copies and both B layouts, as for mma
WGMMA_CASES = [
    (128, 256, 128, "fp16", "f32", True),
    (128, 256, 128, "fp16", "f32", False),
    (200, 300, 100, "bf16", "bf16", False),
    (96, 64, 64, "fp16", "f16", True),
    (67, 70, 260, "fp16", "f32", False),
    (77, 45, 19, "bf16", "f32", True),
    (65, 1, 1, "fp16", "f16", False),
    (130, 66, 40, "fp16", "f16", False),
]


@pytest.mark.parametrize("M,N,K,dtype,out,trans_b", WGMMA_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}{'-tb' if c[5] else ''}" for c in WGMMA_CASES])
def test_wgmma_gemm_matches_numpy(M, N, K, dtype, out, trans_b):
    k, _ = run_and_compare(caps_of("h100"), M, N, K, dtype, out, trans_b, seed=M + 3 * N + 7 * K, kernel="wgmma")
    assert k.kind == "wgmma"
    assert any(opcodes()[int(c)].sem == "wgmma" for c in k.program.op)


def test_wgmma_kernel_on_the_reference_engine():
    run_and_compare(caps_of("h100"), 70, 130, 72, "fp16", "f32", False, seed=5, engine="reference", kernel="wgmma")


def test_h100_picks_wgmma_for_big_gemms_and_mma_for_skinny_or_small_ones():
    caps = caps_of("h100")
    # decode's GEMMs stream B: an m64 wgmma would compute 64 rows for each of theirs
    assert gemm_kernel(caps, 8, 4096, 4096).kind == "mma"
    assert gemm_kernel(caps, 65, 4096, 4096, kernel="wgmma").kind == "wgmma"
    assert gemm_kernel(caps, 1024, 4096, 4096).kind == "wgmma"
    k = gemm_kernel(caps, 4096, 4096, 4096)
    assert (k.kind, k.tile.BM, k.tile.BN, k.tile.warps) == ("wgmma", 128, 256, 8)
    # 256^3: 64 blocks of 32 x 32 at mma.sync's 2/3 rate beat 16 of 64 x 64 at the peak
    assert gemm_kernel(caps, 256, 256, 256).kind == "mma"
    assert gemm_kernel(caps, 256, 256, 256, kernel="wgmma").kind == "wgmma"
    with pytest.raises(InputError, match="wgmma"):
        gemm_kernel(caps_of("a100"), 512, 512, 512, kernel="wgmma")
    with pytest.raises(InputError, match="wgmma"):
        gemm_kernel(caps, 512, 512, 512, trans_a=True, kernel="wgmma")


def test_h100_without_wgmma_keeps_the_mma_kernel():
    caps = capabilities(load_machine("h100", sets=["tensor.wgmma=null"]))
    assert "wgmma" not in caps.features
    k, _ = run_and_compare(caps, 128, 128, 64, "fp16", "f32", False)
    assert k.kind == "mma"
    # a forced tile is the mma kernel on h100 too (the Ampere-style kernel, for comparison), where the
    # rule would take wgmma
    big = (1024, 4096, 4096)
    assert gemm_kernel(caps_of("h100"), *big).kind == "wgmma"
    assert gemm_kernel(caps_of("h100"), *big, tile=Tile(128, 128, 64, 4, 4)).kind == "mma"
    for bad in ({"kernel": "bogus"}, {"kernel": "wgmma", "tile": T128}, {"kernel": "wgmma", "dtype": "fp32"}):
        with pytest.raises(InputError):
            gemm_kernel(caps_of("h100"), *big, **bad)


def test_wgmma_gemm_skip_ahead_changes_nothing():
    from archsim.engine.timing import Unbacked, time_kernel
    h100 = load_machine("h100")
    k = gemm_kernel(caps_of("h100"), 256, 512, 256, kernel="wgmma")
    args = k.args(*(Unbacked(n) for n in k.buffer_bytes().values()))
    a = time_kernel(k.program, h100, k.launch, args, skip=True)
    b = time_kernel(k.program, h100, k.launch, args, skip=False)
    assert (a.cycles, a.warp_instructions, a.memory["bytes"]) == (b.cycles, b.warp_instructions, b.memory["bytes"])
    assert (a.stall == b.stall).all()
