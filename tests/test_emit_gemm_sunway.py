"""The Sunway GEMM emitter (archsim.workloads.emit.gemm_sunway) against numpy, on tiny-sunway
(and sw26010pro-shaped capabilities), in both layouts: the broadcast layout (A panels shared by
mesh-row broadcast, B panels by mesh-column broadcast, persistent blocks over macro tiles) and
the one-tile-a-block fallback with per-CPE gets ("NAME/plain": capabilities without broadcast).
Functional runs treat a broadcast as a plain get, so the timing tests below check what only the
timing engine sees: every line's members issue the same gets (no fault, no deadlock) and DRAM
reads each panel once per line.

Tolerance: the bound that follows from the kernel's accumulation (see the module docstring).
Within a panel of BK k-steps a register accumulates in the input format with one rounding per
fma (f16 / bf16: the even-k and odd-k chains of an element in the two halves of a lane; fp32: one
chain), so each chain's error is at most u_in times the sum of |partial sum| over its k-steps
(first order; fp16 adds 2^-25 absolute per step for subnormal results); after the panel the
chains are added into the f32 tile (u32 per add, times |running sum|); alpha and the output
conversion add u32 + u_out relative. The test computes that bound per element from the exact
partial sums of the exact inputs (float64) and wants every element within it (times 1.01 for
second-order terms): a layout or residue bug gives errors of the size of C itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.opcodes import opcodes
from archsim.workloads.emit import gemm_sunway as SW
from archsim.workloads.emit.gemm_gpu import Tile, to_float, to_host

U_OUT = {"f32": 2.0 ** -24, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}
U32 = 2.0 ** -24
_CAPS = {}


def caps_of(hw: str = "tiny-sunway"):
    """Capabilities of a machine; "NAME/plain" is NAME without DMA broadcast (the emitter falls
    back to one C tile a block with per-CPE gets)."""
    if hw not in _CAPS:
        name, _, plain = hw.partition("/")
        c = capabilities(load_machine(name))
        _CAPS[hw] = dataclasses.replace(c, dma_broadcast_modes=frozenset()) if plain else c
    return _CAPS[hw]


LAYOUTS = ["tiny-sunway", "tiny-sunway/plain"]


def error_bound(a: np.ndarray, b: np.ndarray, k) -> np.ndarray:
    """Per-element bound of |kernel - exact| for one GEMM a[M,K] @ b[K,N] (float64 exact values)."""
    prods = a[:, None, :] * b.T[None, :, :]                      # [M, N, K]
    K, BK, half = k.K, k.tile.BK, k.dtype in ("fp16", "bf16")
    u_in = 2.0 ** -SW.ACC_BITS[k.dtype]
    acc = np.zeros(prods.shape[:2])
    f32 = np.zeros(prods.shape[:2])
    run = np.zeros(prods.shape[:2])
    for k0 in range(0, K, BK):
        panel = prods[:, :, k0:min(K, k0 + BK)]
        chains = (panel[:, :, 0::2], panel[:, :, 1::2]) if half else (panel,)
        for ch in chains:
            if ch.shape[2]:
                acc += np.abs(np.cumsum(ch, axis=2)).sum(axis=2)
                if k.dtype == "fp16":
                    acc += ch.shape[2] * 2.0 ** -25
                run = run + ch.sum(axis=2)
                f32 += np.abs(run)
    c = np.abs(prods.sum(axis=2))
    al = abs(float(np.float32(k.alpha)))
    return 1.01 * (al * (u_in * acc + U32 * f32) + (U32 + U_OUT[k.out_dtype]) * al * c) + 1e-30


def run_kernel(k, A, B, C, hw="tiny-sunway"):
    from archsim.engine.functional import run_functional

    caps = caps_of(hw)
    res = run_functional(k.program, k.args(A, B, C), k.launch, warp_width=caps.warp_width, ncores=caps.cores_total)
    return res.output("C")


def check_against_bound(k, A, B, Cout, what=""):
    """Compare every matrix of the (possibly batched / strided) kernel with the bound."""
    got = to_float(k.view("C", Cout), k.out_dtype)
    ref = k.reference(A, B)
    a = k.view("A", to_float(A, k.dtype))
    b = k.view("B", to_float(B, k.dtype))
    if k.dense:
        got, ref, a, b = got[None, None], ref[None, None], a[None, None], b[None, None]
    for zb in range(k.batch[0]):
        for zh in range(k.batch[1]):
            am, bm = a[zb, zh], b[zb, zh]
            am = am.T if k.trans_a else am
            bm = bm.T if k.trans_b else bm
            tol = error_bound(am, bm, k)
            err = np.abs(got[zb, zh] - ref[zb, zh])
            bad = ~(err <= tol)
            assert not bad.any(), (f"{what} {k.M}x{k.N}x{k.K} {k.dtype}->{k.out_dtype} ta={k.trans_a} "
                                   f"tb={k.trans_b} tile={k.tile} batch ({zb},{zh}): {int(bad.sum())} bad, first at "
                                   f"{np.argwhere(bad)[0]}, err {float(err[bad].max()):.3g}, "
                                   f"tol there {float(tol[bad][0]):.3g}")
    return got, ref


def run_and_compare(M, N, K, dtype="fp16", out="f32", trans_b=False, trans_a=False, seed=0, hw="tiny-sunway", **kw):
    k = SW.gemm_kernel(caps_of(hw), M, N, K, dtype, out, trans_b, trans_a=trans_a, **kw)
    assert k.program.name.endswith("_bcast") == (not hw.endswith("/plain"))
    A, B, C = k.random_inputs(seed)
    Cout = run_kernel(k, A, B, C, hw)
    check_against_bound(k, A, B, Cout)
    return k, Cout


# ----------------------------------------------------------------------------- dtypes, transposes, residues
CASES = [  # (M, N, K, dtype, out, trans_a, trans_b): odd shapes, none a multiple of a tile
    (77, 45, 19, "fp16", "f32", False, False),
    (77, 45, 131, "fp16", "f32", False, True),
    (77, 45, 131, "fp16", "f16", True, False),
    (33, 70, 131, "fp16", "f32", True, True),
    (5, 130, 40, "fp16", "f16", False, False),
    (1, 1, 1, "fp16", "f32", False, False),
    (40, 100, 33, "bf16", "f32", False, False),
    (40, 100, 33, "bf16", "bf16", True, True),
    (61, 37, 70, "bf16", "bf16", False, True),
    (3, 9, 129, "bf16", "f32", True, False),
    (77, 45, 71, "fp32", "f32", False, True),
    (70, 90, 33, "fp32", "f32", True, False),
    (29, 145, 70, "fp32", "f16", True, True),
    (2, 3, 1, "fp32", "bf16", False, False),
]


CASE_IDS = [f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}{'-ta' if c[5] else ''}{'-tb' if c[6] else ''}" for c in CASES]


@pytest.mark.parametrize("hw", LAYOUTS)
@pytest.mark.parametrize("M,N,K,dtype,out,ta,tb", CASES, ids=CASE_IDS)
def test_gemm_matches_numpy_within_the_accumulation_bound(M, N, K, dtype, out, ta, tb, hw):
    k, _ = run_and_compare(M, N, K, dtype, out, tb, ta, seed=M + 3 * N + 7 * K, hw=hw)
    assert k.kind == "vfma" and k.launch.block == (32, 1, 1)
    mn = {opcodes()[int(o)].mnemonic for o in k.program.op}
    assert {"dma.put", "dma.wait", {"fp16": "fma.f16x2", "bf16": "fma.bf16x2", "fp32": "fma.f32"}[dtype]} <= mn
    if hw.endswith("/plain"):                        # per-CPE gets
        assert "dma.get" in mn and not any("bcast" in x for x in mn)
    else:                                            # A panels by row, B panels by column broadcast
        assert {"dma.get.bcast.row", "dma.get.bcast.column"} <= mn and "dma.get" not in mn
        assert k.launch.grid[1:] == (1, 1) and k.launch.blocks % caps_of(hw).cores_per_group == 0
    assert not any(opcodes()[int(o)].unit == "tensor" for o in k.program.op)


def test_the_bound_is_not_vacuous():
    """A wrong k order or a missing panel breaks the bound: shift B by one k-row."""
    k = SW.gemm_kernel(caps_of(), 33, 40, 70, "bf16", "f32")
    A, B, C = k.random_inputs(2)
    Cout = run_kernel(k, A, B, C)
    check_against_bound(k, A, B, Cout)
    with pytest.raises(AssertionError, match="bad"):
        check_against_bound(k, A, np.roll(B, 1, axis=0), Cout)


@pytest.mark.parametrize("hw", LAYOUTS)
def test_forced_tiles_many_panels_and_register_tiles(hw):
    """Several panels (odd K residue last), several register tiles per CPE tile, edge tiles;
    with broadcast, several macro tiles per core group (rounds) and CPEs whose tile lies outside C."""
    for tile, M, N, K, tb in ((Tile(32, 128, 16, 1, 2), 70, 200, 37, False), (Tile(16, 64, 8, 1, 2), 35, 70, 23, True),
                              (Tile(16, 32, 8, 1, 2), 150, 70, 21, False)):
        k, _ = run_and_compare(M, N, K, "fp16", "f16", tb, tile=tile, seed=5, hw=hw)
        assert (k.tile.BM, k.tile.BN, k.tile.BK) == tile[:3]
        if hw.endswith("/plain"):
            assert k.launch.grid == (-(-N // tile.BN), -(-M // tile.BM), 1)
        else:        # 4 x 4 mesh: macro tiles of 4BM x 4BN, one core group (16 CPEs) per macro tile
            macro = -(-M // (4 * tile.BM)) * -(-N // (4 * tile.BN))
            assert k.launch.grid == (16 * min(2, macro), 1, 1)


# ----------------------------------------------------------------------------- layouts
SENT = -7.0


@pytest.mark.parametrize("tile", [None, Tile(16, 32, 8, 1, 2)], ids=["rule", "forced"])
@pytest.mark.parametrize("hw", LAYOUTS)
@pytest.mark.parametrize("dtype,out", [("fp16", "f32"), ("bf16", "bf16"), ("fp32", "f32")])
def test_leading_dimensions_batch_strides_and_alpha(dtype, out, hw, tile):
    """Attention-style batched GEMM: S[b, n] = alpha * Q_bn K_bn^T read in place from a fused
    [b*s, 3h] QKV buffer (lda = ldb = 3h, per-batch and per-head strides), C written with ldc
    into a wider tensor; every element the kernel must not write keeps its sentinel."""
    caps = caps_of(hw)
    b, n, s, d = 2, 3, 19, 24
    h = n * d
    rng = np.random.default_rng(7)
    qkv = to_host(rng.standard_normal((b * s, 3 * h)).astype(np.float32), dtype)
    ldc = s + 3
    k = SW.gemm_kernel(caps, s, s, d, dtype, out, trans_b=True, lda=3 * h, ldb=3 * h, ldc=ldc, batch=(b, n),
                       stride_a=(s * 3 * h, d), stride_b=(s * 3 * h, d), stride_c=(n * s * ldc, s * ldc), alpha=0.125,
                       tile=tile)
    if tile is not None:                             # forced: the broadcast layout where the target has it
        assert k.program.name.endswith("_bcast") == (hw == "tiny-sunway")
    host = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[out]
    C = to_host(np.full(b * n * s * ldc, SENT, np.float32), host)
    flat = qkv.reshape(-1)
    Cout = run_kernel(k, flat, flat[h:].copy(), C, hw)
    got, _ = check_against_bound(k, flat, flat[h:].copy(), Cout)
    q = to_float(qkv, dtype).reshape(b, s, 3, n, d)
    ref = np.einsum("bqnd,bknd->bnqk", q[:, :, 0], q[:, :, 1]) * 0.125  # plain numpy slicing
    np.testing.assert_allclose(got, ref, rtol=0.05, atol=0.05 if dtype == "bf16" else 5e-3)
    full = to_float(Cout, out).reshape(b, n, s, ldc)
    assert np.all(full[..., s:] == SENT)


def test_trans_a_weight_gradient_with_lda_ldb():
    """dW = X^T dY with X, dY column slices of wider tensors (lda, ldb > rows)."""
    caps = caps_of()
    T, din, dout = 37, 21, 45
    rng = np.random.default_rng(3)
    X = to_host(rng.standard_normal((T, din + 5)).astype(np.float32), "fp16")
    dY = to_host(rng.standard_normal((T, dout + 2)).astype(np.float32), "fp16")
    k = SW.gemm_kernel(caps, din, dout, T, "fp16", "f32", trans_a=True, lda=din + 5, ldb=dout + 2)
    C = np.zeros(din * dout, np.float32)
    Cout = run_kernel(k, X.reshape(-1), dY.reshape(-1), C)
    check_against_bound(k, X.reshape(-1), dY.reshape(-1), Cout)
    ref = to_float(X, "fp16")[:, :din].T @ to_float(dY, "fp16")[:, :dout]
    np.testing.assert_allclose(Cout.reshape(din, dout), ref, rtol=1e-2, atol=2e-2)


# ----------------------------------------------------------------------------- tile rule and program
def test_tiles_fit_the_ldm_and_registers_and_the_program_does_not_grow():
    for hw in ("tiny-sunway", "sw26010pro"):
        caps = caps_of(hw)
        for dt in ("fp16", "bf16", "fp32"):
            for ta, tb in ((False, False), (True, True), (False, True)):
                k = SW.gemm_kernel(caps, 2048, 2048, 2048, dt, "f32", tb, trans_a=ta)
                assert k.program.shared_bytes <= caps.scratchpad_bytes
                assert k.program.nregs <= caps.max_regs_per_thread
    for hw in ("sw26010pro", "sw26010pro/plain"):
        caps = caps_of(hw)
        small = SW.gemm_kernel(caps, 100, 300, 64, "fp16", tile=Tile(64, 128, 128, 1, 2))
        big = SW.gemm_kernel(caps, 4096, 4096, 4096, "fp16", tile=Tile(64, 128, 128, 1, 2), batch=(3, 1),
                             stride_a=(4096 * 4096,) * 2, stride_b=(4096 * 4096,) * 2, stride_c=(4096 * 4096,) * 2)
        assert small.program == big.program                # shapes and the batch are kernel parameters
        assert big.launch.grid == ((32, 64, 3) if hw.endswith("/plain") else (384, 1, 1))
    # broadcast layout: persistent blocks, one per CPE of the core groups that get a macro tile
    caps = caps_of("sw26010pro")
    k = SW.gemm_kernel(caps, 1024, 1024, 1024, "fp16")
    assert k.program.name.endswith("_bcast") and k.launch.grid == (384, 1, 1)
    BM, BN = k.tile.BM, k.tile.BN
    assert -(-1024 // (8 * BM)) * -(-1024 // (8 * BN)) % 6 == 0     # whole rounds over the 6 core groups
    assert SW.gemm_kernel(caps_of(), 1, 1, 1).launch.blocks == 16   # one core group of tiny-sunway
    k = SW.gemm_kernel(caps_of("sw26010pro/plain"), 1024, 1024, 1024, "fp16")
    assert caps.cores_total * 0.75 <= k.launch.blocks <= caps.cores_total    # one wave, balanced over 384 CPEs
    assert SW.gemm_kernel(caps_of("tiny-sunway/plain"), 1, 1, 1).launch.blocks == 1


# ----------------------------------------------------------------------------- bad input
def test_bad_requests_are_one_line_errors_naming_the_field():
    caps = caps_of()
    for shape, field in (((0, 4, 4), "M"), ((4, 0, 4), "N"), ((4, 4, 0), "K")):
        with pytest.raises(InputError, match=f"gemm {field}"):
            SW.gemm_kernel(caps, *shape)
    with pytest.raises(InputError, match="dtype"):
        SW.gemm_kernel(caps, 4, 4, 4, "tf32")
    with pytest.raises(InputError, match="out_dtype"):
        SW.gemm_kernel(caps, 4, 4, 4, "fp16", "int8")
    no_half = dataclasses.replace(caps, units=caps.units - {"fp16"})
    with pytest.raises(InputError, match="gemm dtype.*lacks"):
        SW.gemm_kernel(no_half, 4, 4, 4, "bf16")
    with pytest.raises(InputError, match="gemm tile.*does not fit"):
        SW.gemm_kernel(caps, 256, 256, 256, "fp16", tile=Tile(128, 128, 128, 1, 2))
    with pytest.raises(InputError, match="gemm tile"):
        SW.gemm_kernel(caps, 64, 64, 64, "fp16", tile=Tile(12, 64, 64, 1, 2))
    with pytest.raises(InputError, match="sunway family"):
        SW.gemm_kernel(caps_of("tiny-gpu"), 4, 4, 4)
    with pytest.raises(InputError, match="lda"):
        SW.gemm_kernel(caps, 8, 8, 8, lda=4)
    with pytest.raises(InputError, match="stride_c"):
        SW.gemm_kernel(caps, 8, 8, 8, batch=(2, 1), stride_c=(8, 0))
    with pytest.raises(InputError, match="alpha"):
        SW.gemm_kernel(caps, 8, 8, 8, alpha=float("nan"))
    tiny_ldm = dataclasses.replace(caps, scratchpad_bytes=8192)
    with pytest.raises(InputError, match="LDM"):
        SW.gemm_kernel(tiny_ldm, 64, 64, 64)


# ----------------------------------------------------------------------------- timing
@pytest.mark.parametrize("hw", LAYOUTS)
def test_timing_smoke_vector_pipe_busy_matches_the_fmas(hw):
    """The kernel runs on the timing engine; the vector pipe's busy cycles are exactly what its
    vector instructions cost at the configured rates (fma.f16x2: 32 lanes at the f16x2 rate; the
    flush per register and panel: two cvt.f32.f16[h] and two add.f32, at the f32 rate, the
    rate of the opcode's dtype), and the flops counted are 2MNK plus the flush adds (M, N, K
    multiples of the register tile, f32 out, alpha 1: no other vector work)."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    caps = caps_of(hw)
    plain = hw.endswith("/plain")
    M, N, K = 32, 128, 256
    k = SW.gemm_kernel(caps, M, N, K, "fp16", "f32", tile=Tile(16, 128, 64, 1, 2))
    args = k.args(*(Unbacked(n) for n in k.buffer_bytes().values()))
    t = time_kernel(k.program, m, k.launch, args)
    assert t.outcome == 0 and t.cycles > 0
    panels = K // k.tile.BK
    regs_flushed = M * N // 32 * panels              # f16x2 accumulators flushed, one per 32 elements
    assert t.flops == 2 * M * N * K + 2 * 32 * regs_flushed
    vector = list(m.pipes).index("vector")
    n_fma = M * N * K // 64                          # 64 multiply-adds an fma.f16x2
    busy = int(t.pipe_busy_cycles[:, vector].sum())
    lanes = m.pipes["vector"].lanes_per_cycle
    fma_cycles, f32_cycles = 32 / lanes["f16x2"], 32 / lanes["f32"]
    assert busy == n_fma * fma_cycles + regs_flushed * 4 * f32_cycles
    dma = t.memory["dma"]
    k2 = SW.gemm_kernel(caps, M - 3, N, K + 5, "fp16", "f32", tile=Tile(16, 128, 64, 1, 2))
    t2 = time_kernel(k2.program, m, k2.launch, k2.args(*(Unbacked(n) for n in k2.buffer_bytes().values())))
    d2 = t2.memory["dma"]
    assert dma["puts"] == M and d2["puts"] == M - 3   # C: one put per row
    if plain:
        assert t.cycles >= busy / k.launch.blocks    # no CPE beats its own vector pipe
        # full panels: one strided get each for A and B (dma.get.s)
        assert dma["gets"] == k.launch.blocks * panels * 2 and dma["broadcasts"] == 0
        # a K residue panel and an edge tile fetch row by row (their rows are shorter than the pitch)
        # per tile: 4 full panels (2 strided gets each); the residue panel (kn = 5): A's rows are
        # 10 bytes, not the 128-byte pitch, so one get per row (16, or 13 in the edge tile), and B's
        # 5 k-rows are full width: one strided get
        assert d2["gets"] == (panels * 2 + 16 + 1) + (panels * 2 + 13 + 1)
        return
    # broadcast layout, 4 x 4 mesh: one macro tile of 64 x 512 on the 16 CPEs of core group 0;
    # the tiles of mesh rows 0 and 1 (16 rows of C each) and column 0 (128 columns) hold C, the
    # others join their lines and compute nothing
    assert k.launch.grid == (16, 1, 1)
    assert t.cycles >= busy / 2                      # two CPEs did all the FMAs
    # full panels: one strided broadcast a line: A by the 2 rows (4 members each), B by column 0
    # (4 members); rows 2, 3 and columns 1..3 have nothing to fetch. `gets` counts each member's
    assert dma["broadcasts"] == panels * (2 + 1) and dma["gets"] == panels * (2 * 4 + 4)
    assert dma["broadcast_copies"] == dma["gets"]
    assert t.memory["bytes"]["dram_read"] == (M + N) * K * 2     # A and B read once
    # the residue panel (kn = 5): A's rows are 10 bytes, not the pitch: a row broadcast per row
    # (16 in mesh row 0, 13 in row 1), B's 5 k-rows are full width: one strided column broadcast
    assert d2["broadcasts"] == panels * 3 + 16 + 13 + 1
    assert d2["gets"] == panels * 12 + (16 + 13) * 4 + 4
    assert t2.memory["bytes"]["dram_read"] == (M - 3 + N) * (K + 5) * 2


def test_micro_gemm_uses_the_sunway_emitter():
    from archsim.micro import run_micro

    m = load_machine("tiny-sunway")
    r = run_micro("gemm", m, {"m": "100", "n": "70", "k": "64"})
    assert r.extra["kernel"] == "vfma" and r.value > 0
    assert 0 < r.extra["share_of_peak"] < 1
    assert r.kernels[0]["flops"] >= 2 * 100 * 70 * 64
    with pytest.raises(InputError, match="dtype"):
        run_micro("gemm", m, {"m": "8", "n": "8", "k": "8", "dtype": "tf32"})


# ----------------------------------------------------------------------------- broadcast layout
SW_CASES = [  # sw26010pro-shaped capabilities (6 core groups of an 8x8 mesh, 384 CPEs): odd shapes,
    # several macro tiles per core group (the batch), tiles outside C, every dtype
    (70, 45, 131, "fp16", "f32", False, True, (1, 1), None),
    (150, 300, 70, "bf16", "bf16", True, False, (1, 1), None),
    (77, 45, 33, "fp32", "f16", True, True, (1, 1), None),
    (70, 45, 37, "fp16", "f16", False, False, (7, 2), Tile(16, 32, 16, 1, 2)),
    (33, 200, 19, "fp32", "f32", False, True, (3, 1), Tile(8, 128, 8, 1, 2)),
]


def batched(M, N, K, ta, tb, batch):
    """Dense batched layouts: every GEMM's A, B, C one after the other."""
    n = batch[0] * batch[1]
    if n == 1:
        return {}
    sa, sb, sc = M * K, K * N, M * N
    return dict(batch=batch, stride_a=(batch[1] * sa, sa), stride_b=(batch[1] * sb, sb), stride_c=(batch[1] * sc, sc))


@pytest.mark.parametrize("layout", ["", "/plain"])
@pytest.mark.parametrize("M,N,K,dtype,out,ta,tb,batch,tile", SW_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}-b{c[7][0] * c[7][1]}" for c in SW_CASES])
def test_sw26010pro_shaped_gemm_matches_numpy(M, N, K, dtype, out, ta, tb, batch, tile, layout):
    hw = "sw26010pro" + layout
    k, _ = run_and_compare(M, N, K, dtype, out, tb, ta, seed=M + N + K, hw=hw, tile=tile,
                           **batched(M, N, K, ta, tb, batch))
    if not layout:
        mt = -(-M // (8 * k.tile.BM)) * -(-N // (8 * k.tile.BN)) * batch[0] * batch[1]
        assert k.launch.grid == (64 * min(6, mt), 1, 1)


TIMING_CASES = [c + ((1, 1), None) for c in CASES] + [
    (19, 19, 24, "fp16", "f32", False, True, (2, 3), None),
    (19, 19, 24, "bf16", "f16", True, False, (2, 3), Tile(16, 32, 8, 1, 2)),
    (150, 70, 21, "fp16", "f32", False, False, (1, 1), Tile(16, 32, 8, 1, 2)),
    (70, 200, 37, "fp32", "f32", False, False, (3, 1), Tile(16, 128, 8, 1, 2)),
]


@pytest.mark.parametrize("M,N,K,dtype,out,ta,tb,batch,tile", TIMING_CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}{'-ta' if c[5] else ''}{'-tb' if c[6] else ''}"
                              f"-b{c[7][0] * c[7][1]}{'-forced' if c[8] else ''}" for c in TIMING_CASES])
def test_broadcast_lines_are_consistent_in_timing_and_read_each_panel_once(M, N, K, dtype, out, ta, tb, batch, tile):
    """Functional runs treat a broadcast as a plain get; the timing engine holds every get until
    all members of its mesh row / column have issued it with the same operands (a status-3 fault
    otherwise, a deadlock if a member never does). Every odd shape, transpose, batch and dtype
    runs to the end, and DRAM reads are exactly A once per macro-tile column and B once per
    macro-tile row: nz * (tn * M * K + tm * N * K) elements."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    k = SW.gemm_kernel(caps_of(), M, N, K, dtype, out, tb, trans_a=ta, tile=tile, **batched(M, N, K, ta, tb, batch))
    t = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(n) for n in k.buffer_bytes().values())))
    assert t.outcome == 0
    nz = batch[0] * batch[1]
    es = {"fp16": 2, "bf16": 2, "fp32": 4}[dtype]
    if not k.program.name.endswith("_bcast"):
        # the tile rule found one tile a block cheaper (19 x 19 GEMMs: a macro tile would leave
        # most CPEs idle): every tile reads its own panels
        assert (M, N, batch) == (19, 19, (2, 3)) and tile is None
        gx, gy, _ = k.launch.grid
        assert t.memory["bytes"]["dram_read"] == nz * (gx * M * K + gy * N * K) * es
        return
    tm, tn = -(-M // (4 * k.tile.BM)), -(-N // (4 * k.tile.BN))
    assert t.memory["bytes"]["dram_read"] == nz * (tn * M * K + tm * N * K) * es
    assert t.memory["bytes"]["dram_write"] == nz * M * N * {"f32": 4, "f16": 2, "bf16": 2}[out]
    d = t.memory["dma"]
    assert d["broadcast_bytes_read"] == t.memory["bytes"]["dram_read"] and d["broadcast_copies"] == d["gets"]


def test_broadcast_beats_per_cpe_gets_on_a_memory_bound_gemm():
    """256^3 fp16 on tiny-sunway (2 core groups of 4 x 4 CPEs, one DDR4 controller each): with
    per-CPE gets every CPE reads its own A and B panels, 4x the bytes the broadcast layout reads
    (each panel once per mesh line); the broadcast version reads the exact oracle and is faster."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    M = N = K = 256
    res = {}
    for hw in LAYOUTS:
        k = SW.gemm_kernel(caps_of(hw), M, N, K, "fp16", "f32")
        t = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(n) for n in k.buffer_bytes().values())))
        assert t.outcome == 0
        res[hw] = (k, t)
    kb, tb_ = res["tiny-sunway"]
    kp, tp = res["tiny-sunway/plain"]
    tm, tn = -(-M // (4 * kb.tile.BM)), -(-N // (4 * kb.tile.BN))
    assert tb_.memory["bytes"]["dram_read"] == (tn * M * K + tm * N * K) * 2
    gp = kp.launch.grid
    assert tp.memory["bytes"]["dram_read"] == (gp[0] * M * K + gp[1] * N * K) * 2
    assert tp.memory["bytes"]["dram_read"] >= 3 * tb_.memory["bytes"]["dram_read"]
    assert tb_.cycles < 0.7 * tp.cycles


@pytest.mark.parametrize("M,N,K,dtype,out,ta,tb,batch,tile", [SW_CASES[1], SW_CASES[3]],
                         ids=["150x300x70-bf16-ta", "70x45x37-fp16-b14"])
def test_broadcast_lines_on_the_8x8_mesh_of_sw26010pro(M, N, K, dtype, out, ta, tb, batch, tile):
    """The same on sw26010pro (8 x 8 mesh of 2 x 2 clusters, 6 core groups, several macro tiles
    per group): the run completes and reads the oracle's bytes."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("sw26010pro")
    k = SW.gemm_kernel(caps_of("sw26010pro"), M, N, K, dtype, out, tb, trans_a=ta, tile=tile,
                       **batched(M, N, K, ta, tb, batch))
    assert k.program.name.endswith("_bcast")
    t = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(n) for n in k.buffer_bytes().values())))
    assert t.outcome == 0
    tm, tn = -(-M // (8 * k.tile.BM)), -(-N // (8 * k.tile.BN))
    assert t.memory["bytes"]["dram_read"] == batch[0] * batch[1] * (tn * M * K + tm * N * K) * 2


@pytest.mark.parametrize("shape", [(512, 512, 512), (2048, 2048, 1024)])
def test_tile_rule_balances_the_targets_own_dram_rate(shape):
    """The tile rule reads the target's DRAM bytes per CPE-cycle from its capabilities: starved of
    bandwidth it picks a tile that reads no more DRAM bytes per flop, and on tiny-sunway a
    different tile than at its own rate."""
    caps = capabilities(load_machine("tiny-sunway"))
    assert caps.dram_bytes_per_cycle == pytest.approx(51.2 / 2.0 / 32)
    own, _ = SW.choose_tile(caps, *shape)
    starved, _ = SW.choose_tile(dataclasses.replace(caps, dram_bytes_per_cycle=caps.dram_bytes_per_cycle / 16), *shape)
    per_flop = lambda c: (c.BM + c.BN) / (c.BM * c.BN)  # noqa: E731
    assert per_flop(starved) < per_flop(own)
