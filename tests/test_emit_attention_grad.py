"""Training support for fused attention: the forward's log-sum-exp output and the fused backward
(archsim.workloads.emit.attention_grad_gpu), run functionally on the numba engine against float64
numpy (archsim.workloads.reference).

Tolerances. u is the unit roundoff of the storage dtype (fp16 2^-11, bf16 2^-8).

- LSE (fp32 throughout: fp32 scores of exact inputs, lg2 and the running max in fp32):
  |got - ref| <= 1e-5 (1 + |ref|).
- Gradients, per element, with P the softmax matrix and dS = P o (dP - D) from float64:
  the kernels round P once (to feed dV += P^T dO), dS once (to feed dK += dS^T Q and
  dQ += dS K), read O rounded to the dtype (so D = rowsum(dO o O) is off by up to
  u rowsum(|dO o O|), which dS carries as P times that), and round each output once. So with
  E = |dS| + P o rowsum(|dO o O|):

      dV: |err| <= 2u (|dV| + P^T |dO|) + 1e-5
      dK: |err| <= 2u (|dK| + scale E^T |Q|) + 1e-5
      dQ: |err| <= 2u (|dQ| + scale E |K|) + 1e-5

  Everything else is fp32 (scores, ex2 of c S - LSE log2 e, the mma sums, D): ~1e-6 relative.
  The factor 2 leaves room for those; a layout, mask, scale or LSE bug gives errors of the order
  of the gradients themselves (test_broken_kernels_fail shows three such bugs failing).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.opcodes import opcodes
from archsim.workloads.emit.attention_gpu import causal_pairs, flash_attention_kernel
from archsim.workloads.emit.attention_grad_gpu import flash_attention_grad_kernel
from archsim.workloads.emit.gemm_gpu import to_float
from archsim.workloads.reference import ref_attention, ref_attention_probs, split_heads

U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
_CAPS = {}


def caps_of(hw: str):
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


def run_parts(g, args, caps, parts=None):
    """Run the backward's kernels in order, each on the buffers the previous ones wrote."""
    from archsim.engine.functional import run_functional

    for p in (g.parts if parts is None else parts):
        before = {n: np.array(args[n]).view(np.uint8).reshape(-1) for n in p.outputs}
        r = run_functional(p.program, g.part_args(p, args), p.launch, warp_width=caps.warp_width,
                           ncores=caps.cores_total)
        for name in p.outputs:
            # the engine gets a copy per parameter; dK and dV may be one d_qkv array, so take
            # from each copy only the bytes the kernel changed
            buf = args[name].view(np.uint8).reshape(-1)
            new = np.asarray(r.output(name)).view(np.uint8).reshape(-1)
            changed = new != before[name]
            buf[changed] = new[changed]
    return args


def grad_case(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv=False, seed=0, lse_shift=0.0, parts=None,
              inputs=None):
    """Emit, run and return (kernel, got (dq, dk, dv), ref, tolerance) as [rows, heads*d] float64."""
    hd = heads * d
    ld = 3 * hd if qkv else None
    g = flash_attention_grad_kernel(caps, batch, heads, q_len, kv_len, d, dtype, causal, q_ld=ld, kv_ld=ld)
    Q, K, V, O, dO, LSE = g.random_inputs(seed, qkv=qkv) if inputs is None else inputs(g)
    LSE = np.ascontiguousarray(LSE + np.float32(lse_shift))
    ws = {n: np.zeros(shape, t) for n, (shape, t) in g.workspaces().items()}
    if qkv:                                   # Q, K, V in place in one QKV buffer, grads in one d_qkv
        offs = {"q_off": 0, "k_off": hd, "v_off": 2 * hd}
        dQKV = np.zeros_like(Q)
        args = g.qkv_args(Q, O, dO, LSE, dQKV, ws["D"], ws["NL"])
        K = V = Q
        run_parts(g, args, caps, parts)
        got = g.outputs(args["dQ"], args["dK"], args["dV"], dq_off=0, dk_off=hd, dv_off=2 * hd)
    else:
        offs = {}
        dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
        args = g.args(Q, K, V, O, dO, LSE, dQ, dK, dV, ws["D"], ws["NL"])
        run_parts(g, args, caps, parts)
        got = g.outputs(args["dQ"], args["dK"], args["dV"])
    ref = g.reference(Q, K, V, dO, **offs)
    tol = _tolerance(g, Q, K, V, O, dO, ref, offs)
    return g, args, got, ref, tol


def _tolerance(g, Q, K, V, O, dO, ref, offs):
    q = g._heads(Q, g.q_len, g.q_ld, offs.get("q_off", 0))
    k = g._heads(K, g.kv_len, g.kv_ld, offs.get("k_off", 0))
    v = g._heads(V, g.kv_len, g.kv_ld, offs.get("v_off", 0))
    o = g._heads(O, g.q_len, g.o_ld)
    do = g._heads(dO, g.q_len, g.o_ld)
    p = ref_attention_probs(q, k, g.causal, g.scale)
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    E = np.abs(ds) + p * np.abs(do * o).sum(-1, keepdims=True)
    u = U[g.dtype]
    mag = (g.scale * E @ np.abs(k), g.scale * np.swapaxes(E, -1, -2) @ np.abs(q), np.swapaxes(p, -1, -2) @ np.abs(do))
    from archsim.workloads.emit.attention_grad_gpu import merge_heads as _merge
    return tuple(2 * u * (np.abs(r) + _merge(m)) + 1e-5 for r, m in zip(ref, mag))


def _bad(got, ref, tol):
    return [int((~(np.abs(x - y) <= t)).sum()) for x, y, t in zip(got, ref, tol)]


# (hw, batch, heads, q_len, kv_len, head_dim, dtype, causal, qkv)
CASES = [
    ("a100", 2, 3, 37, 37, 64, "fp16", False, False),
    ("a100", 2, 3, 37, 37, 64, "fp16", True, False),
    ("a100", 2, 3, 37, 37, 32, "bf16", False, False),
    ("a100", 2, 3, 70, 70, 32, "bf16", True, False),
    ("a100", 2, 3, 70, 70, 64, "fp16", True, True),       # in place: qkv [T, 3h] -> d_qkv [T, 3h]
    ("a100", 2, 3, 70, 70, 64, "bf16", False, True),
    ("a100", 1, 2, 37, 100, 64, "fp16", True, False),     # chunked prefill: kv_len > q_len
    ("a100", 1, 2, 1, 77, 32, "bf16", True, False),       # one query row
    ("a100", 1, 2, 70, 70, 128, "fp16", True, False),     # head_dim 128: dkdv keeps K / V in shared memory
    ("a100", 1, 2, 37, 37, 128, "bf16", False, False),
    ("tiny-gpu", 2, 3, 70, 70, 64, "bf16", True, False),
    ("tiny-gpu", 2, 3, 37, 37, 32, "fp16", False, True),
]


@pytest.mark.parametrize("hw,batch,heads,q_len,kv_len,d,dtype,causal,qkv", CASES,
                         ids=[f"{c[0]}-b{c[1]}h{c[2]}-{c[3]}x{c[4]}-d{c[5]}-{c[6]}{'-causal' if c[7] else ''}"
                              f"{'-qkv' if c[8] else ''}" for c in CASES])
def test_attention_grad_matches_numpy(hw, batch, heads, q_len, kv_len, d, dtype, causal, qkv):
    caps = caps_of(hw)
    g, args, got, ref, tol = grad_case(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv,
                                       seed=q_len + 7 * d + causal)
    bad = _bad(got, ref, tol)
    assert bad == [0, 0, 0], (f"{hw} b{batch}h{heads} {q_len}x{kv_len} d{d} {dtype} causal={causal} qkv={qkv} "
                              f"tiles={g.tiles}: bad (dQ, dK, dV) = {bad}, max err "
                              f"{[float(np.abs(x - y).max()) for x, y in zip(got, ref)]}")
    # the check has teeth: all-zero gradients would fail it at most elements
    zeros = _bad([np.zeros_like(r) for r in ref], ref, tol)
    assert all(z > 0.5 * r.size for z, r in zip(zeros, ref)), zeros
    if qkv:                                    # d_qkv's columns past 3h (none here) and nothing else touched
        assert args["dQ"] is args["dK"] is args["dV"]
    else:                                      # the columns past heads*d of every row stay zero
        for n in ("dQ", "dK", "dV"):
            assert not np.asarray(args[n])[:, heads * d:].any()
    # the D / NL workspaces: padding rows hold D = 0 and NL = -inf
    nl = args["NL"]
    assert np.isneginf(nl[:, :, q_len:]).all() and not args["D"][:, :, q_len:].any()


def test_backward_from_the_forward_kernels_lse():
    """Chained as in training: the forward kernel (with_lse) writes O and LSE, the backward reads them."""
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-gpu")

    def from_forward(g):
        f = flash_attention_kernel(caps, g.batch, g.heads, g.q_len, g.kv_len, g.head_dim, g.dtype, g.causal,
                                   with_lse=True)
        Q, K, V, O = f.random_inputs(11)
        LSE = f.lse_buffer()
        r = run_functional(f.program, f.args(Q, K, V, O, LSE=LSE), f.launch, warp_width=32, ncores=caps.cores_total)
        O = np.asarray(r.output("O")).view(O.dtype).reshape(O.shape).copy()
        LSE = np.asarray(r.output("LSE")).view(np.float32).reshape(LSE.shape).copy()
        dO = np.random.default_rng(12).standard_normal(O.shape).astype(np.float32)
        from archsim.workloads.emit.gemm_gpu import to_host
        return Q, K, V, O, to_host(dO, g.dtype), LSE

    g, _, got, ref, tol = grad_case(caps, 1, 2, 70, 70, 32, "fp16", True, inputs=from_forward)
    assert _bad(got, ref, tol) == [0, 0, 0]


def test_broken_kernels_fail():
    """The comparison catches a missing causal mask, a wrong LSE and a skipped dQ kernel."""
    caps = caps_of("a100")
    ok = flash_attention_grad_kernel(caps, 1, 2, 37, 37, 32, "fp16", True)
    nomask = flash_attention_grad_kernel(caps, 1, 2, 37, 37, 32, "fp16", False)
    parts = (ok.parts[0], dataclasses.replace(ok.parts[1], program=nomask.parts[1].program), ok.parts[2])
    *_, got, ref, tol = grad_case(caps, 1, 2, 37, 37, 32, "fp16", True, parts=parts)
    bad = _bad(got, ref, tol)
    assert bad[0] == 0 and bad[1] > 0 and bad[2] > 0, bad           # dK, dV wrong; dQ (own kernel) right
    *_, got, ref, tol = grad_case(caps, 1, 2, 37, 37, 32, "fp16", True, lse_shift=0.05)
    assert all(b > 0 for b in _bad(got, ref, tol))
    *_, got, ref, tol = grad_case(caps, 1, 2, 37, 37, 32, "fp16", True, parts=ok.parts[:2])
    assert _bad(got, ref, tol)[0] > 0


# ----------------------------------------------------------------------------- the forward's LSE
@pytest.mark.parametrize("hw,dtype,d,q_len,kv_len,causal", [
    ("a100", "fp16", 64, 37, 37, True), ("a100", "bf16", 32, 70, 70, False), ("a100", "fp16", 64, 37, 100, True),
    ("a100", "fp32", 64, 37, 37, True), ("tiny-gpu", "bf16", 32, 70, 70, True), ("tiny-gpu", "fp32", 32, 1, 77, True)])
def test_forward_writes_the_log_sum_exp(hw, dtype, d, q_len, kv_len, causal):
    from archsim.engine.functional import run_functional

    caps = caps_of(hw)
    b, n = 2, 3
    k = flash_attention_kernel(caps, b, n, q_len, kv_len, d, dtype, causal, with_lse=True)
    assert k.kind == ("ffma" if dtype == "fp32" else "mma")
    assert "LSE" in k.program.params and k.buffer_bytes()["LSE"] == 4 * b * n * q_len
    Q, K, V, O = k.random_inputs(q_len + d)
    LSE = k.lse_buffer()
    res = run_functional(k.program, k.args(Q, K, V, O, LSE=LSE), k.launch, warp_width=32, ncores=caps.cores_total)
    got = np.asarray(res.output("LSE")).view(np.float32).reshape(b, n, q_len)
    q = split_heads(to_float(Q, k.dtype)[:, :n * d], b, n)
    kk = split_heads(to_float(K, k.dtype)[:, :n * d], b, n)
    v = split_heads(to_float(V, k.dtype)[:, :n * d], b, n)
    _, lse = ref_attention(q, kk, v, causal, return_lse=True)
    assert np.abs(got - lse).max() <= 1e-5 * (1 + np.abs(lse)).min(), float(np.abs(got - lse).max())
    # O is bit for bit what the kernel without LSE writes, and that program has no LSE parameter
    plain = flash_attention_kernel(caps, b, n, q_len, kv_len, d, dtype, causal)
    assert "LSE" not in plain.program.params and plain.program.name + "_lse" == k.program.name
    r2 = run_functional(plain.program, plain.args(Q, K, V, np.zeros_like(O)), plain.launch, warp_width=32,
                        ncores=caps.cores_total)
    assert np.array_equal(np.asarray(r2.output("O")), np.asarray(res.output("O")))


def test_lse_buffer_is_checked():
    caps = caps_of("a100")
    k = flash_attention_kernel(caps, 1, 2, 8, 8, 64, with_lse=True)
    Q, K, V, O = k.random_inputs()
    with pytest.raises(InputError, match="LSE"):
        k.args(Q, K, V, O)
    with pytest.raises(InputError, match="float32"):
        k.args(Q, K, V, O, LSE=np.zeros(16, np.float64))
    with pytest.raises(InputError, match="bytes"):
        k.args(Q, K, V, O, LSE=np.zeros(8, np.float32))
    plain = flash_attention_kernel(caps, 1, 2, 8, 8, 64)
    with pytest.raises(InputError, match="with_lse"):
        plain.args(Q, K, V, O, LSE=k.lse_buffer())


# ----------------------------------------------------------------------------- what the kernels are
def test_parts_flops_and_programs():
    caps = caps_of("a100")
    b, n, d = 2, 3, 64
    for q_len, kv_len, causal in ((37, 37, False), (70, 70, True), (37, 100, True)):
        g = flash_attention_grad_kernel(caps, b, n, q_len, kv_len, d, "fp16", causal)
        assert [p.name for p in g.parts] == ["attn.grad.pre", "attn.grad.dkdv", "attn.grad.dq"]
        pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
        assert g.flops == b * n * (2 * d * q_len + pairs * (14 * d + 8))
        fwd = flash_attention_kernel(caps, b, n, q_len, kv_len, d, "fp16", causal)
        assert g.model_flops == 2 * fwd.model_flops
        w_kv, _ = g.tiles["dkdv"]
        w_q, _ = g.tiles["dq"]
        assert g.part("dkdv").launch.grid == (-(-kv_len // (16 * w_kv)), n, b)
        assert g.part("dq").launch.grid == (-(-q_len // (16 * w_q)), n, b)
        assert g.q_pad % 64 == 0 and g.q_pad >= q_len
    # programs do not depend on the sizes; they are loops over tiles with mma, ldmatrix and cp.async
    assert not flash_attention_grad_kernel(caps, 1, 1, 8, 8, 64).kv_smem
    assert flash_attention_grad_kernel(caps, 1, 1, 8, 8, 128).kv_smem
    small = flash_attention_grad_kernel(caps, 1, 1, 37, 37, 64, "bf16", True)
    big = flash_attention_grad_kernel(caps, 4, 16, 2048, 2048, 64, "bf16", True)
    assert small.programs == big.programs
    for p in big.parts[1:]:
        mn = {opcodes()[int(o)].mnemonic for o in p.program.op}
        assert {"mma.m16n8k16.f32.bf16", "ldmatrix.x4", "ldmatrix.x4.trans", "cp.async.16", "ex2.f32",
                "cvt.bf16x2.f32", "bra"} <= mn
        assert not any(m.startswith("st.global") and m != "st.global.b32" for m in mn)


def test_bad_requests_are_clear_errors():
    caps = caps_of("a100")
    with pytest.raises(InputError, match="no FFMA"):
        flash_attention_grad_kernel(caps, 1, 1, 8, 8, 64, "fp32")
    with pytest.raises(InputError, match="tensor units"):
        flash_attention_grad_kernel(dataclasses.replace(caps, tensor_dtypes=frozenset({"tf32"})), 1, 1, 8, 8, 64)
    with pytest.raises(InputError, match="head_dim"):
        flash_attention_grad_kernel(caps, 1, 1, 8, 8, 48)
    with pytest.raises(InputError, match="no tile fits"):
        flash_attention_grad_kernel(caps_of("tiny-gpu"), 1, 1, 8, 8, 128)
    with pytest.raises(InputError, match="kv_len >= q_len"):
        flash_attention_grad_kernel(caps, 1, 1, 9, 8, 64, causal=True)
    with pytest.raises(InputError, match="q_len"):
        flash_attention_grad_kernel(caps, 1, 1, 0, 8, 64)
    with pytest.raises(InputError, match="gpu family"):
        flash_attention_grad_kernel(caps_of("tiny-sunway"), 1, 1, 8, 8, 64)
    with pytest.raises(InputError, match="o_ld"):
        flash_attention_grad_kernel(caps, 1, 2, 8, 8, 64, o_ld=100)
    g = flash_attention_grad_kernel(caps, 1, 2, 8, 8, 64)
    Q, K, V, O, dO, LSE = g.random_inputs()
    ws = {n: np.zeros(s, t) for n, (s, t) in g.workspaces().items()}
    dQ = np.zeros_like(Q)
    with pytest.raises(InputError, match="float16"):
        g.args(Q, K, V, O, dO, LSE, dQ.astype(np.float32), dQ, dQ, ws["D"], ws["NL"])
    with pytest.raises(InputError, match="bytes"):
        g.args(Q, K, V, O, dO, LSE, dQ, dQ, dQ, ws["D"][:, :, :8].copy(), ws["NL"])
    with pytest.raises(InputError, match="multiple of 8"):
        g.args(Q, K, V, O, dO, LSE, dQ, dQ, dQ, ws["D"], ws["NL"], dk_off=4)
    with pytest.raises(InputError, match="q_len == kv_len"):
        g.qkv_args(Q, O, dO, LSE, dQ, ws["D"], ws["NL"])


def test_timing_runs_every_part():
    """The three kernels complete on the tiny GPU's timing model (no values: Unbacked buffers)."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-gpu")
    g = flash_attention_grad_kernel(capabilities(m), 1, 2, 128, 128, 32, "fp16", True)
    nb = g.buffer_bytes()
    args = g.args(*(Unbacked(nb[n]) for n in ("Q", "K", "V", "O", "dO", "LSE", "dQ", "dK", "dV", "D", "NL")))
    for p in g.parts:
        r = time_kernel(p.program, m, p.launch, g.part_args(p, args))
        assert r.cycles > 0 and r.warp_instructions > 0, p.name
        assert r.flops >= p.flops, p.name          # the engine counts every mma, masked lanes too
