"""The GPU GEMM emitter's layout options against numpy: leading dimensions (sub-matrices of a fused
[T, 3h] QKV buffer, column slices of a wider output), the 2-level batch (attention's QK^T and AV
per batch and head), trans_a (weight gradients), alpha.

Each case builds its expected result from plain numpy slicing of the same buffers (not from the
kernel's own strides), checks that every element outside the matrices the kernel writes keeps
its sentinel, and uses the tolerances of test_emit_gemm.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.workloads.emit import Tile, gemm_kernel
from archsim.workloads.emit.gemm_gpu import MAX_BATCH, nh_magic, to_float, to_host

TOL = {"f32": (1e-4, 1e-5), "f16": (1e-4, 1e-3), "bf16": (1e-3, 4e-3)}
SENTINEL = -7.0
_CAPS = {}


def caps_of(hw: str):
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


def exact(x: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values of a buffer in the format of dtype."""
    return to_float(x, dtype)


def run(caps, k, A, B, C):
    """Run kernel k functionally; the C buffer as float64."""
    from archsim.engine.functional import run_functional

    res = run_functional(k.program, k.args(A, B, C), k.launch, warp_width=caps.warp_width, ncores=caps.cores_total)
    return to_float(res.output("C"), k.out_dtype)


def assert_close(got, ref, out, what):
    atol, rtol = TOL[out]
    err = np.abs(got - ref)
    bad = ~(err <= atol + rtol * np.abs(ref))
    assert not bad.any(), f"{what}: {int(bad.sum())} bad of {bad.size}, first at {np.argwhere(bad)[0]}, " \
                          f"max err {float(err.max()):.3g}"


def sentinel_buffer(n: int, out: str) -> np.ndarray:
    return to_host(np.full(n, SENTINEL, np.float32), {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[out])


def host(rng, shape, dtype):
    return to_host(rng.standard_normal(shape).astype(np.float32), dtype)


# (dtype, out, hw): mma in fp16 / bf16, FFMA in fp32; f32 and f16 outputs
DTYPES = [("fp16", "f32", "tiny-gpu"), ("fp16", "f16", "a100"), ("bf16", "f32", "a100"),
          ("bf16", "bf16", "tiny-gpu"), ("fp32", "f32", "tiny-gpu"), ("fp32", "f32", "a100")]
IDS = [f"{d}-{o}-{h}" for d, o, h in DTYPES]


# ----------------------------------------------------------------------------- leading dimensions
@pytest.mark.parametrize("dtype,out,hw", DTYPES, ids=IDS)
def test_strided_submatrix_of_a_fused_qkv_buffer_into_a_column_slice(dtype, out, hw):
    """C[:, 5:5+N] of a [T, W] tensor = V @ Wt, V the last h columns of a [T, 3h] buffer."""
    caps = caps_of(hw)
    rng = np.random.default_rng(11)
    T, h, N, W, c0 = 45, 40, 27, 41, 5
    qkv = host(rng, (T, 3 * h), dtype)
    wt = host(rng, (h, N), dtype)
    k = gemm_kernel(caps, T, N, h, dtype, out, lda=3 * h, ldc=W)
    assert k.kind == ("ffma" if dtype == "fp32" else "mma")
    flat_c = sentinel_buffer(T * W, out)             # C is passed from element c0 on
    got_tail = run(caps, k, qkv.reshape(-1)[2 * h:], wt, flat_c[c0:].copy())
    got = np.concatenate([to_float(flat_c[:c0], out), got_tail]).reshape(T, W)
    ref = exact(qkv, dtype)[:, 2 * h:] @ exact(wt, dtype)
    assert_close(got[:, c0:c0 + N], ref, out, "slice")
    outside = np.ones((T, W), bool)
    outside[:, c0:c0 + N] = False
    assert (got[outside] == SENTINEL).all(), "wrote outside its column slice"


@pytest.mark.parametrize("hw,dtype", [("a100", "fp16"), ("tiny-gpu", "bf16"), ("a100", "fp32")])
def test_lda_ldb_with_both_operands_transposed_or_not(hw, dtype):
    """Every combination of trans_a / trans_b with row strides wider than the rows."""
    caps = caps_of(hw)
    for ta in (False, True):
        for tb in (False, True):
            M, N, K = 33, 24, 40
            a_rows, a_cols = (K, M) if ta else (M, K)
            b_rows, b_cols = (N, K) if tb else (K, N)
            lda, ldb, ldc = a_cols + 8, b_cols + 16, N + 3
            rng = np.random.default_rng(3 + 2 * ta + tb)
            A = host(rng, (a_rows, lda), dtype)
            B = host(rng, (b_rows, ldb), dtype)
            k = gemm_kernel(caps, M, N, K, dtype, "f32", tb, trans_a=ta, lda=lda, ldb=ldb, ldc=ldc)
            got = run(caps, k, A, B, sentinel_buffer(M * ldc, "f32")).reshape(M, ldc)
            a = exact(A, dtype)[:, :a_cols]
            b = exact(B, dtype)[:, :b_cols]
            ref = (a.T if ta else a) @ (b.T if tb else b)
            assert_close(got[:, :N], ref, "f32", f"trans_a={ta} trans_b={tb}")
            assert (got[:, N:] == SENTINEL).all()
            assert_close(k.view("C", got.reshape(-1)), k.reference(A, B), "f32", "view/reference")


# ----------------------------------------------------------------------------- attention, unfused
B_, NH, S, D = 2, 3, 37, 32
H = NH * D


def qkv_buffer(rng, dtype, s=S):
    return host(rng, (B_ * s, 3 * H), dtype)


def heads(x: np.ndarray, part: int, s=S) -> np.ndarray:
    """[b*s, 3h] float array -> Q (part 0), K (1) or V (2) as [b, n, s, d] by numpy slicing."""
    return x[:, part * H:(part + 1) * H].reshape(B_, s, NH, D).transpose(0, 2, 1, 3)


def qk_kernel(caps, dtype, out, s=S, **kw):
    return gemm_kernel(caps, s, s, D, dtype, out, True, lda=3 * H, ldb=3 * H, batch=(B_, NH),
                       stride_a=(s * 3 * H, D), stride_b=(s * 3 * H, D), stride_c=(NH * s * s, s * s), **kw)


def av_kernel(caps, dtype, out, s=S, **kw):
    return gemm_kernel(caps, s, D, s, dtype, out, False, lda=s, ldb=3 * H, ldc=H, batch=(B_, NH),
                       stride_a=(NH * s * s, s * s), stride_b=(s * 3 * H, D), stride_c=(s * H, D), **kw)


@pytest.mark.parametrize("dtype,out,hw", DTYPES, ids=IDS)
def test_batched_qk_transpose_from_the_qkv_buffer(dtype, out, hw):
    """S[b, n] = alpha * Q[b, n] @ K[b, n]^T, Q and K read in place from the [b*s, 3h] buffer."""
    caps = caps_of(hw)
    qkv = qkv_buffer(np.random.default_rng(5), dtype)
    alpha = 1 / np.sqrt(D)
    k = qk_kernel(caps, dtype, out, alpha=alpha)
    assert k.launch.grid[2] == B_ * NH and k.flops == 2 * S * S * D * B_ * NH
    flat = qkv.reshape(-1)
    got = run(caps, k, flat, flat[H:], sentinel_buffer(B_ * NH * S * S, out)).reshape(B_, NH, S, S)
    x = exact(qkv, dtype)
    ref = float(np.float32(alpha)) * heads(x, 0) @ heads(x, 1).transpose(0, 1, 3, 2)
    assert_close(got, ref, out, "QK^T")


@pytest.mark.parametrize("dtype,out,hw", DTYPES, ids=IDS)
def test_batched_av_writes_each_head_into_its_columns_of_o(dtype, out, hw):
    """O[b*s, h] with head n's d columns at n*d = P[b, n] @ V[b, n], V read from the QKV buffer."""
    caps = caps_of(hw)
    rng = np.random.default_rng(8)
    qkv = qkv_buffer(rng, dtype)
    P = host(rng, (B_, NH, S, S), dtype)
    k = av_kernel(caps, dtype, out)
    got = run(caps, k, P, qkv.reshape(-1)[2 * H:], sentinel_buffer(B_ * S * H, out)).reshape(B_ * S, H)
    o = exact(P, dtype) @ heads(exact(qkv, dtype), 2)               # [b, n, s, d]
    ref = o.transpose(0, 2, 1, 3).reshape(B_ * S, H)
    assert_close(got, ref, out, "AV")


def test_scores_with_padded_rows_round_trip_through_av():
    """S [b, n, s, 40] (rows padded to 8 halves for s = 37) written by QK^T in f16 and read back by
    AV with lda = 40; the padding columns are never written."""
    caps = caps_of("a100")
    rng = np.random.default_rng(9)
    ld = 40
    qkv = qkv_buffer(rng, "fp16")
    flat = qkv.reshape(-1)
    qk = gemm_kernel(caps, S, S, D, "fp16", "f16", True, lda=3 * H, ldb=3 * H, ldc=ld, batch=(B_, NH),
                     stride_a=(S * 3 * H, D), stride_b=(S * 3 * H, D), stride_c=(NH * S * ld, S * ld))
    s_buf = run(caps, qk, flat, flat[H:], sentinel_buffer(B_ * NH * S * ld, "f16"))
    assert (s_buf.reshape(B_, NH, S, ld)[..., S:] == SENTINEL).all()
    av = gemm_kernel(caps, S, D, S, "fp16", "f32", False, lda=ld, ldb=3 * H, ldc=H, batch=(B_, NH),
                     stride_a=(NH * S * ld, S * ld), stride_b=(S * 3 * H, D), stride_c=(S * H, D))
    got = run(caps, av, s_buf.astype(np.float16), flat[2 * H:], np.zeros(B_ * S * H, np.float32))
    x = exact(qkv, "fp16")
    p16 = (heads(x, 0) @ heads(x, 1).transpose(0, 1, 3, 2)).astype(np.float16).astype(np.float64)
    ref = (p16 @ heads(x, 2)).transpose(0, 2, 1, 3).reshape(B_ * S, H)
    assert_close(got.reshape(B_ * S, H), ref, "f16", "QK^T (f16) then AV")


def test_copy_width_follows_the_alignment_of_rows_and_strides():
    """cp.async.16 when row length, ld and the used strides are multiples of 8 halves; per element
    when a row is odd (s = 37 keys) or a stride is."""
    from archsim.isa.opcodes import opcodes

    caps = caps_of("a100")
    mn = lambda k: {opcodes()[int(o)].mnemonic for o in k.program.op}  # noqa: E731
    qk = qk_kernel(caps, "fp16", "f32")                 # K = d = 32, ld 3h, strides s*3h, d
    assert "cp.async.16" in mn(qk) and "ld.global.u16" not in mn(qk)
    assert "ld.global.u16" in mn(av_kernel(caps, "fp16", "f32"))      # P rows of s = 37 halves
    assert "ld.global.u16" not in mn(av_kernel(caps, "fp16", "f32", s=40))
    odd = gemm_kernel(caps, 64, 64, 64, "fp16", "f32", True, batch=(1, 2), stride_a=(0, 64 * 64 + 1),
                      stride_b=(0, 64 * 64), stride_c=(0, 64 * 64))
    assert "ld.global.u16" in mn(odd)                  # A's head stride is odd
    assert "cp.async.16" in mn(odd)                    # B still 16-byte copies


def test_attention_head_padding_keeps_other_rows_untouched():
    """C with a head stride larger than a head's matrix: the gap rows keep their sentinel."""
    caps = caps_of("tiny-gpu")
    s, gap = 21, 5
    rng = np.random.default_rng(2)
    qkv = host(rng, (B_ * s, 3 * H), "fp16")
    sc = (NH * (s + gap) * s, (s + gap) * s)
    k = gemm_kernel(caps, s, s, D, "fp16", "f32", True, lda=3 * H, ldb=3 * H, batch=(B_, NH),
                    stride_a=(s * 3 * H, D), stride_b=(s * 3 * H, D), stride_c=sc)
    flat = qkv.reshape(-1)
    got = run(caps, k, flat, flat[H:], sentinel_buffer(B_ * NH * (s + gap) * s, "f32")).reshape(B_, NH, s + gap, s)
    x = exact(qkv, "fp16")
    q = x[:, :H].reshape(B_, s, NH, D).transpose(0, 2, 1, 3)
    kk = x[:, H:2 * H].reshape(B_, s, NH, D).transpose(0, 2, 1, 3)
    assert_close(got[:, :, :s], q @ kk.transpose(0, 1, 3, 2), "f32", "padded S")
    assert (got[:, :, s:] == SENTINEL).all()


# ----------------------------------------------------------------------------- trans_a
TA_CASES = [("tiny-gpu", 37, 29, 45, "fp16", "f32"), ("a100", 37, 29, 45, "fp16", "f16"),
            ("a100", 40, 64, 70, "bf16", "f32"), ("tiny-gpu", 77, 45, 19, "bf16", "bf16"),
            ("a100", 128, 72, 96, "fp16", "f32"), ("a100", 33, 40, 21, "tf32", "f32"),
            ("tiny-gpu", 37, 29, 45, "fp32", "f32"), ("a100", 70, 130, 33, "fp32", "f32")]


@pytest.mark.parametrize("hw,M,N,K,dtype,out", TA_CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}-{c[4]}-{c[5]}"
                                                             for c in TA_CASES])
def test_trans_a_weight_gradient(hw, M, N, K, dtype, out):
    """dW[M, N] = X^T @ dY with X [K, M] (K tokens) and dY [K, N], both dense."""
    caps = caps_of(hw)
    rng = np.random.default_rng(M + N + K)
    X, dY = host(rng, (K, M), dtype), host(rng, (K, N), dtype)
    k = gemm_kernel(caps, M, N, K, dtype, out, trans_a=True)
    assert k.a_shape == (K, M) and k.dense
    got = run(caps, k, X, dY, np.zeros((M, N), k.out_host_dtype))
    if dtype == "tf32":                   # inputs truncated to tf32 as the tensor units read them
        ref = k.reference(X, dY)
    else:
        ref = exact(X, dtype).T @ exact(dY, dtype)
    assert_close(got, ref, out, "X^T dY")


def test_trans_a_reads_a_fragments_with_ldmatrix_trans():
    from archsim.isa.opcodes import opcodes

    caps = caps_of("a100")
    names = lambda k: {opcodes()[int(o)].mnemonic for o in k.program.op}  # noqa: E731
    plain, ta = gemm_kernel(caps, 512, 512, 512, "fp16"), gemm_kernel(caps, 512, 512, 512, "fp16", trans_a=True)
    assert "ldmatrix.x4.trans" in names(ta) and "ldmatrix.x4.trans" in names(plain)   # B is k-major in both
    tb = gemm_kernel(caps, 512, 512, 512, "fp16", "f32", True, trans_a=True)
    assert "ldmatrix.x4.trans" in names(tb)                                           # only A^T uses it here
    assert "ldmatrix.x4.trans" not in names(gemm_kernel(caps, 512, 512, 512, "fp16", "f32", True))
    assert "cp.async.16" in names(tb)


def test_alpha_scales_the_result_in_the_epilogue():
    caps = caps_of("tiny-gpu")
    for dtype in ("fp16", "fp32"):
        k1 = gemm_kernel(caps, 45, 33, 24, dtype)
        k2 = gemm_kernel(caps, 45, 33, 24, dtype, alpha=-0.375)
        A, B, C = k2.random_inputs(4)
        got = run(caps, k2, A, B, C)
        assert_close(got, -0.375 * k1.reference(A, B), "f32", f"alpha {dtype}")
        assert len(k2.program) > len(k1.program)      # one mul.f32 per accumulator, only when alpha != 1


# ----------------------------------------------------------------------------- program and launch
def test_program_does_not_depend_on_batch_strides_or_ld():
    caps = caps_of("a100")
    t = Tile(64, 64, 32, 4, 2)
    k1 = qk_kernel(caps, "fp16", "f32", tile=t)
    k2 = gemm_kernel(caps, 4000, 3000, 64, "fp16", "f32", True, Tile(64, 64, 32, 4, 2), lda=3 * 4096, ldb=3 * 4096,
                     batch=(8, 32), stride_a=(4000 * 3 * 4096, 128), stride_b=(4000 * 3 * 4096, 128),
                     stride_c=(32 * 4000 * 3000, 4000 * 3000))
    assert k1.program == k2.program                 # same alignment class: one program
    assert k2.launch.grid == (_ceil(3000, 64), _ceil(4000, 64), 8 * 32)
    nb = k2.buffer_bytes()
    assert nb["A"] == 2 * (7 * 4000 * 3 * 4096 + 31 * 128 + 3999 * 3 * 4096 + 64)
    assert nb["C"] == 4 * 8 * 32 * 4000 * 3000


def _ceil(a, b):
    return -(-a // b)


def test_batched_kernel_runs_on_the_timing_model():
    from archsim.engine.timing import Unbacked, time_kernel

    tiny = load_machine("tiny-gpu")
    caps = capabilities(tiny)
    for k in (qk_kernel(caps, "fp16", "f32"), av_kernel(caps, "fp16", "f16"), av_kernel(caps, "fp32", "f32")):
        args = k.args(*(Unbacked(n) for n in k.buffer_bytes().values()))
        t = time_kernel(k.program, tiny, k.launch, args)
        assert t.cycles > 0 and t.flops >= k.flops


def test_args_check_strided_buffers():
    caps = caps_of("tiny-gpu")
    k = qk_kernel(caps, "fp16", "f32")
    A, B, C = k.random_inputs()
    assert A.size == k.extent("A") == (B_ - 1) * S * 3 * H + (NH - 1) * D + (S - 1) * 3 * H + D
    with pytest.raises(InputError, match="at least"):
        k.args(A[:-1], B, C)
    with pytest.raises(InputError, match="float16"):
        k.args(A.astype(np.float32), B, C)
    with pytest.raises(InputError, match="strided"):
        k.args(np.zeros(2 * A.size, np.float16)[::2], B, C)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,match", [
    (dict(lda=18), "lda"),                                       # A row is K = 19 long
    (dict(trans_a=True, lda=40), "lda"),                         # A^T row is M = 41 long
    (dict(ldb=44), "ldb"),                                       # B row is N = 45 long
    (dict(trans_b=True, ldb=10), "ldb"),
    (dict(ldc=44), "ldc"),
    (dict(batch=(2, 3), stride_c=(3 * 41 * 45, 41 * 45 - 1)), "more than once"),   # heads overlap by one
    (dict(batch=(2, 1), stride_c=(0, 0)), "more than once"),    # both batches on the same C
    (dict(batch=(1, 4), ldc=50, stride_c=(0, 7)), "more than once"),   # heads interleave inside a row
    (dict(batch=(0, 3)), "batch"),
    (dict(batch=(2,)), "batch"),
    (dict(stride_a=(-1, 0)), "stride_a"),
    (dict(batch=(256, 256)), "grid.z"),
    (dict(alpha=float("nan")), "alpha"),
    (dict(alpha=1e39), "alpha"),
])
def test_bad_layouts_are_clear_errors(kw, match):
    caps = caps_of("tiny-gpu")
    tb = kw.pop("trans_b", False)
    with pytest.raises(InputError, match=match) as e:
        gemm_kernel(caps, 41, 45, 19, "fp16", "f32", tb, **kw)
    assert "\n" not in str(e.value)


def test_disjoint_interleaved_c_layouts_are_accepted():
    caps = caps_of("tiny-gpu")
    # heads side by side in a row (attention's O), batches one after another
    gemm_kernel(caps, 37, 32, 37, "fp16", ldc=96, batch=(2, 3), stride_c=(37 * 96, 32))
    # rows of C interleaved with another tensor's rows (ldc twice the row), heads in between
    gemm_kernel(caps, 10, 8, 16, "fp16", ldc=16, batch=(1, 2), stride_c=(0, 8))
    # a stride for a level of one matrix is never used
    gemm_kernel(caps, 10, 8, 16, "fp16", batch=(1, 1), stride_c=(0, 0))


def test_the_magic_division_by_nh_is_exact_for_every_block_of_a_launch():
    """(z * nh_magic(nh)) >> 40 == z // nh for every z < MAX_BATCH (the kernels' batch index)."""
    z = np.arange(MAX_BATCH, dtype=np.int64)
    for nh in [*range(1, 200), 255, 256, 257, 1000, 4095, 4096, 12345, 32768, 65521, 65535]:
        m = nh_magic(nh)
        assert m * MAX_BATCH < 2 ** 63
        assert np.array_equal((z * m) >> 40, z // nh), nh
