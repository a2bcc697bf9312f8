"""The Sunway GEMM emitter (archsim.workloads.emit.gemm_sunway) against numpy, on tiny-sunway.

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
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


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


def run_and_compare(M, N, K, dtype="fp16", out="f32", trans_b=False, trans_a=False, seed=0, **kw):
    k = SW.gemm_kernel(caps_of(), M, N, K, dtype, out, trans_b, trans_a=trans_a, **kw)
    A, B, C = k.random_inputs(seed)
    Cout = run_kernel(k, A, B, C)
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


@pytest.mark.parametrize("M,N,K,dtype,out,ta,tb", CASES,
                         ids=[f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}{'-ta' if c[5] else ''}{'-tb' if c[6] else ''}"
                              for c in CASES])
def test_gemm_matches_numpy_within_the_accumulation_bound(M, N, K, dtype, out, ta, tb):
    k, _ = run_and_compare(M, N, K, dtype, out, tb, ta, seed=M + 3 * N + 7 * K)
    assert k.kind == "vfma" and k.launch.block == (32, 1, 1)
    mn = {opcodes()[int(o)].mnemonic for o in k.program.op}
    assert {"dma.get", "dma.put", "dma.wait", {"fp16": "fma.f16x2", "bf16": "fma.bf16x2",
                                                "fp32": "fma.f32"}[dtype]} <= mn
    assert not any(opcodes()[int(o)].unit == "tensor" for o in k.program.op)


def test_the_bound_is_not_vacuous():
    """A wrong k order or a missing panel breaks the bound: shift B by one k-row."""
    k = SW.gemm_kernel(caps_of(), 33, 40, 70, "bf16", "f32")
    A, B, C = k.random_inputs(2)
    Cout = run_kernel(k, A, B, C)
    check_against_bound(k, A, B, Cout)
    with pytest.raises(AssertionError, match="bad"):
        check_against_bound(k, A, np.roll(B, 1, axis=0), Cout)


def test_forced_tiles_many_panels_and_register_tiles():
    """Several panels (odd K residue last), several register tiles per CPE tile, edge tiles."""
    for tile, M, N, K, tb in ((Tile(32, 128, 16, 1, 2), 70, 200, 37, False), (Tile(16, 64, 8, 1, 2), 35, 70, 23, True)):
        k, _ = run_and_compare(M, N, K, "fp16", "f16", tb, tile=tile, seed=5)
        assert (k.tile.BM, k.tile.BN, k.tile.BK) == tile[:3]
        assert k.launch.grid == (-(-N // tile.BN), -(-M // tile.BM), 1)


# ----------------------------------------------------------------------------- layouts
SENT = -7.0


@pytest.mark.parametrize("dtype,out", [("fp16", "f32"), ("bf16", "bf16"), ("fp32", "f32")])
def test_leading_dimensions_batch_strides_and_alpha(dtype, out):
    """Attention-style batched GEMM: S[b, n] = alpha * Q_bn K_bn^T read in place from a fused
    [b*s, 3h] QKV buffer (lda = ldb = 3h, per-batch and per-head strides), C written with ldc
    into a wider tensor; every element the kernel must not write keeps its sentinel."""
    caps = caps_of()
    b, n, s, d = 2, 3, 19, 24
    h = n * d
    rng = np.random.default_rng(7)
    qkv = to_host(rng.standard_normal((b * s, 3 * h)).astype(np.float32), dtype)
    ldc = s + 3
    k = SW.gemm_kernel(caps, s, s, d, dtype, out, trans_b=True, lda=3 * h, ldb=3 * h, ldc=ldc, batch=(b, n),
                       stride_a=(s * 3 * h, d), stride_b=(s * 3 * h, d), stride_c=(n * s * ldc, s * ldc), alpha=0.125)
    host = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[out]
    C = to_host(np.full(b * n * s * ldc, SENT, np.float32), host)
    flat = qkv.reshape(-1)
    Cout = run_kernel(k, flat, flat[h:].copy(), C)
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
    caps = caps_of("sw26010pro")
    small = SW.gemm_kernel(caps, 100, 300, 64, "fp16", tile=Tile(64, 128, 128, 1, 2))
    big = SW.gemm_kernel(caps, 4096, 4096, 4096, "fp16", tile=Tile(64, 128, 128, 1, 2))
    assert small.program == big.program                    # shapes are kernel parameters
    assert big.launch.grid == (32, 64, 1)
    k = SW.gemm_kernel(caps, 1024, 1024, 1024, "fp16")
    tiles = k.launch.blocks
    assert caps.cores_total * 0.75 <= tiles <= caps.cores_total    # one wave, balanced over 384 CPEs
    assert SW.gemm_kernel(caps_of(), 1, 1, 1).launch.blocks == 1


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
def test_timing_smoke_vector_pipe_busy_matches_the_fmas():
    """The kernel runs on the timing engine; the vector pipe's busy cycles are exactly what its
    vector instructions cost at the configured rates (fma.f16x2: 32 lanes at the f16x2 rate; the
    flush per register and panel: two cvt.f32.f16[h] and two add.f32, at the f32 rate, the
    rate of the opcode's dtype), and the flops counted are 2MNK plus the flush adds (M, N, K
    multiples of the register tile, f32 out, alpha 1: no other vector work)."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    caps = caps_of()
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
    assert t.cycles >= busy / k.launch.blocks        # no CPE beats its own vector pipe
    dma = t.memory["dma"]
    # full panels: one strided get each for A and B (dma.get.s); C: one put per row
    assert dma["gets"] == k.launch.blocks * panels * 2 and dma["puts"] == M
    # a K residue panel and an edge tile fetch row by row (their rows are shorter than the pitch)
    k2 = SW.gemm_kernel(caps, M - 3, N, K + 5, "fp16", "f32", tile=Tile(16, 128, 64, 1, 2))
    t2 = time_kernel(k2.program, m, k2.launch, k2.args(*(Unbacked(n) for n in k2.buffer_bytes().values())))
    # per tile: 4 full panels (2 strided gets each); the residue panel (kn = 5): A's rows are
    # 10 bytes, not the 128-byte pitch, so one get per row (16, or 13 in the edge tile), and B's
    # 5 k-rows are full width: one strided get
    assert t2.memory["dma"]["gets"] == (panels * 2 + 16 + 1) + (panels * 2 + 13 + 1)


def test_micro_gemm_uses_the_sunway_emitter():
    from archsim.micro import run_micro

    m = load_machine("tiny-sunway")
    r = run_micro("gemm", m, {"m": "100", "n": "70", "k": "64"})
    assert r.extra["kernel"] == "vfma" and r.value > 0
    assert 0 < r.extra["share_of_peak"] < 1
    assert r.kernels[0]["flops"] >= 2 * 100 * 70 * 64
    with pytest.raises(InputError, match="dtype"):
        run_micro("gemm", m, {"m": "8", "n": "8", "k": "8", "dtype": "tf32"})
