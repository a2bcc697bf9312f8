"""The fused attention emitter (archsim.workloads.emit.attention_gpu) against numpy, on the numba engine.

Tolerance, per output element (reference in float64 from the exact inputs):

    |got - ref| <= 2u * (|ref| + (P |V|)) + 1e-6

u is the unit roundoff of the input dtype (fp16 2^-11, bf16 2^-8). The tensor-core kernel rounds
twice in that format: each probability p once (to feed the P V mma), which moves O by at most
u * sum(p |v|) / l = u * (P|V|), and the output once (u * |O|). Everything else is fp32 (scores,
the running max and sum, the accumulators, ex2 and rcp correctly rounded): ~1e-6 relative here.
The factor 2 leaves room for those fp32 errors; a layout, mask or rescaling bug gives errors of
order |V|. The FFMA kernel keeps p in fp32, so fp32 inputs get u = 2^-17 (~8e-6): fp32 scores of
size ~10 carry ~1e-6 absolute error into ex2, i.e. ~1e-6 relative on each p, and sums over <= 129
keys add a few ulps more.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.check import check
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit.attention_gpu import causal_pairs, flash_attention_kernel
from archsim.workloads.emit.attention_wgmma import flash_attention3_kernel

U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -17}
_CAPS = {}


def caps_of(hw: str):
    """A machine's capabilities; "a100-4sm": an A100 of 4 SMs, whose small grids already fill it (so
    the emitter takes FlashAttention-2's 128-row blocks for them)."""
    if hw not in _CAPS:
        _CAPS[hw] = (dataclasses.replace(caps_of("a100"), name="a100 (4 SMs)", cores_total=4) if hw == "a100-4sm"
                     else capabilities(load_machine(hw)))
    return _CAPS[hw]


def _abs(X, dtype):
    return (X & np.uint16(0x7FFF)) if dtype == "bf16" else np.abs(X)


def _no_fp16_tensor(caps):
    return dataclasses.replace(caps, name=caps.name + " (tensor units without fp16/bf16)",
                               tensor_dtypes=frozenset({"tf32"}))


def run_and_compare(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv=False, seed=0, kernel=None,
                    engine="numba"):
    """Run the kernel (``kernel`` "wgmma": FlashAttention-3's) on one functional engine and check O
    against float64 numpy to the tolerance above; returns (kernel, result)."""
    from archsim.engine.functional import run_functional

    hd = heads * d
    ld = 3 * hd if qkv else None
    emit = flash_attention3_kernel if kernel == "wgmma" else flash_attention_kernel
    k = emit(caps, batch, heads, q_len, kv_len, d, dtype, causal, q_ld=ld, kv_ld=ld)
    Q, K, V, O = k.random_inputs(seed)
    if qkv:                                     # one [b*s, 3*h*d] buffer, read in place
        offs = {"q_off": 0, "k_off": hd, "v_off": 2 * hd}
        args = k.qkv_args(Q, O)
        K = V = Q
    else:
        offs = {}
        args = k.args(Q, K, V, O)
    res = run_functional(k.program, args, k.launch, warp_width=caps.warp_width, ncores=caps.cores_total,
                         engine=engine)
    got = k.output(res.output("O"))
    ref = k.reference(Q, K, V, **offs)
    pv = k.reference(Q, K, _abs(V, k.dtype), **offs)          # P |V|
    err = np.abs(got - ref)
    bad = ~(err <= 2 * U[k.dtype] * (np.abs(ref) + pv) + 1e-6)
    assert not bad.any(), (f"b{batch} h{heads} {q_len}x{kv_len} d{d} {dtype} causal={causal} qkv={qkv} Bc={k.Bc}: "
                           f"{int(bad.sum())} bad, first at {np.argwhere(bad)[0]}, max err {float(err.max()):.3g}")
    # the columns past heads*d of every O row stay untouched
    rest = np.asarray(res.output("O")).reshape(batch * q_len, k.o_ld)[:, hd:]
    assert not rest.any()
    return k, res


# (hw, batch, heads, q_len, kv_len, head_dim, dtype, causal, qkv)
CASES = [
    ("a100", 2, 3, 37, 37, 64, "fp16", False, False),
    ("a100", 2, 3, 37, 37, 64, "fp16", True, False),
    ("a100", 2, 3, 70, 70, 32, "bf16", True, False),
    ("a100", 2, 3, 70, 70, 64, "fp16", True, True),       # Q, K, V in one fused QKV buffer
    ("a100", 2, 3, 129, 129, 128, "fp16", True, False),
    ("a100", 2, 3, 129, 129, 128, "bf16", False, False),
    ("a100", 2, 3, 1, 77, 64, "fp16", True, False),       # decode: one query sees the whole cache
    ("a100", 2, 3, 1, 77, 128, "bf16", False, False),
    ("a100", 1, 2, 37, 100, 64, "fp16", True, False),     # chunked prefill: kv_len > q_len
    ("a100-4sm", 2, 3, 70, 70, 64, "fp16", True, True),  # 128-row blocks: two m-tiles a warp
    ("a100-4sm", 2, 3, 129, 129, 64, "bf16", False, False),
    ("a100-4sm", 1, 4, 200, 250, 32, "fp16", True, False),
    ("a100-4sm", 1, 4, 130, 130, 128, "fp16", True, False),   # head_dim 128: 64-row blocks
    ("tiny-gpu", 2, 3, 70, 70, 64, "fp16", False, False),
    ("tiny-gpu", 2, 3, 129, 129, 32, "bf16", True, False),
    ("tiny-gpu", 2, 3, 37, 37, 64, "bf16", True, True),
    ("tiny-gpu", 2, 3, 1, 77, 32, "fp16", True, False),
]


@pytest.mark.parametrize("hw,batch,heads,q_len,kv_len,d,dtype,causal,qkv", CASES,
                         ids=[f"{c[0]}-b{c[1]}h{c[2]}-{c[3]}x{c[4]}-d{c[5]}-{c[6]}{'-causal' if c[7] else ''}"
                              f"{'-qkv' if c[8] else ''}" for c in CASES])
def test_flash_attention_matches_numpy(hw, batch, heads, q_len, kv_len, d, dtype, causal, qkv):
    k, _ = run_and_compare(caps_of(hw), batch, heads, q_len, kv_len, d, dtype, causal, qkv, seed=q_len + 7 * d)
    assert k.kind == "mma"
    # FlashAttention-2's 128-row blocks (two m-tiles a warp) where 64-row blocks would fill the SMs twice
    # over and 64-key tiles fit (the a100 cases' grids are too small for them)
    rows = 128 if q_len > 64 and hw == "a100-4sm" and d <= 64 else 64
    assert k.block_rows == rows and ("_br128" in k.program.name) == (rows == 128)
    assert k.launch.grid == (-(-q_len // rows), heads, batch) and k.launch.block == (128, 1, 1)


FFMA_CASES = [
    ("a100", 2, 3, 37, 37, 64, "fp32", False, False),
    ("a100", 2, 3, 70, 70, 32, "fp32", True, True),
    ("a100", 1, 1, 129, 129, 128, "fp32", True, False),
    ("a100", 1, 2, 1, 77, 64, "fp32", True, False),
    ("tiny-gpu", 2, 3, 37, 37, 64, "fp32", True, False),
    ("a100-no-f16-tensor", 1, 2, 70, 70, 64, "fp16", True, False),
    ("a100-no-f16-tensor", 1, 2, 37, 100, 32, "bf16", True, True),
]


@pytest.mark.parametrize("hw,batch,heads,q_len,kv_len,d,dtype,causal,qkv", FFMA_CASES,
                         ids=[f"{c[0]}-b{c[1]}h{c[2]}-{c[3]}x{c[4]}-d{c[5]}-{c[6]}{'-causal' if c[7] else ''}"
                              f"{'-qkv' if c[8] else ''}" for c in FFMA_CASES])
def test_ffma_variant_matches_numpy(hw, batch, heads, q_len, kv_len, d, dtype, causal, qkv):
    """fp32, or fp16 / bf16 on tensor units that lack them: the same algorithm on the FFMA pipes."""
    caps = _no_fp16_tensor(caps_of("a100")) if hw == "a100-no-f16-tensor" else caps_of(hw)
    if qkv and q_len != kv_len:
        qkv = False
    k, _ = run_and_compare(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv, seed=q_len + d)
    assert k.kind == "ffma"
    mn = {opcodes()[int(o)].mnemonic for o in k.program.op}
    assert not any(opcodes()[int(o)].unit == "tensor" for o in k.program.op)
    assert {"fma.f32", "ex2.f32", "cp.async.16", "shfl.bfly.b64"} <= mn


# ----------------------------------------------------------------------------- what the program is
def test_program_shape_and_instruction_mix():
    caps = caps_of("a100")
    small = flash_attention_kernel(caps, 2, 48, 200, 200, 64)
    big = flash_attention_kernel(caps, 8, 16, 4096, 4096, 64)
    assert small.program == big.program            # lengths, strides and offsets are kernel parameters
    assert big.launch.grid == (32, 16, 8) and big.block_rows == 128
    # FA2's dispatch: 128-row blocks from 0.8 x 2 x 108 = 172.8 blocks of 64 rows (2 x 48 x 2 = 192 here)
    assert flash_attention_kernel(caps, 1, 87, 100, 100, 64).block_rows == 128     # 174 blocks
    assert flash_attention_kernel(caps, 1, 86, 100, 100, 64).block_rows == 64      # 172 blocks
    assert flash_attention_kernel(caps, 8, 48, 64, 64, 64).block_rows == 64       # one 64-row block holds it
    bra = SEM["bra"]
    sems = [SEM[opcodes()[int(o)].sem] for o in big.program.op]
    assert any(s == bra and int(big.program.imm[pc]) <= pc for pc, s in enumerate(sems)), "a K/V loop"
    mn = [opcodes()[int(o)].mnemonic for o in big.program.op]
    assert {"cp.async.16", "ldmatrix.x4", "ldmatrix.x4.trans", "mma.m16n8k16.f32.f16", "ex2.f32",
            "shfl.bfly.b64", "cvt.f16x2.f32", "rcp.f32"} <= set(mn)
    assert not any(m.startswith("st.global") and m != "st.global.b32" for m in mn)   # only O is stored
    # the loop body: S = Q K^T and O += P V as (d/16)(Bc/8) + (Bc/16)(d/8) mma an m-tile, written once
    assert mn.count("mma.m16n8k16.f32.f16") == 2 * 2 * (64 // 16) * (big.Bc // 8)
    # each K and V fragment loaded once for both m-tiles
    assert mn.count("ldmatrix.x4.trans") == (big.Bc // 16) * (64 // 16)
    bf = flash_attention_kernel(caps, 1, 1, 37, 37, 64, "bf16", causal=True)
    assert "mma.m16n8k16.f32.bf16" in {opcodes()[int(o)].mnemonic for o in bf.program.op}


@pytest.mark.parametrize("hw", ["a100", "tiny-gpu"])
def test_kernels_fit_and_pass_the_load_time_checks(hw):
    caps = caps_of(hw)
    for d in (32, 64, 128):
        for dt in ("fp16", "bf16"):
            for causal in (False, True):
                if hw == "tiny-gpu" and d == 128:
                    continue
                k = flash_attention_kernel(caps, 1, 1, 100, 100, d, dt, causal)
                check(k.program, caps)
                assert k.program.shared_bytes <= caps.scratchpad_bytes
                assert k.program.nregs * 128 <= caps.regs_per_core
    assert flash_attention_kernel(caps_of("a100"), 1, 1, 8, 8, 128).Bc == 64


def test_tiny_gpu_cannot_hold_a_head_dim_128_block():
    with pytest.raises(InputError, match="no K/V tile fits"):
        flash_attention_kernel(caps_of("tiny-gpu"), 1, 1, 64, 64, 128)


def test_flops_count_the_unmasked_pairs():
    caps = caps_of("a100")
    for q_len, kv_len in ((37, 37), (1, 77), (37, 100), (129, 129)):
        vis = np.arange(kv_len)[None, :] <= np.arange(q_len)[:, None] + (kv_len - q_len)
        assert causal_pairs(q_len, kv_len) == int(vis.sum())
        k = flash_attention_kernel(caps, 2, 3, q_len, kv_len, 64, causal=True)
        assert k.flops == 4 * 64 * 2 * 3 * int(vis.sum())
        assert k.model_flops == 4 * 64 * 2 * 3 * q_len * kv_len
        assert flash_attention_kernel(caps, 2, 3, q_len, kv_len, 64).flops == k.model_flops
    assert flash_attention_kernel(caps, 1, 1, 1, 77, 64, causal=True).flops == 4 * 64 * 77   # decode sees all


def test_causal_blocks_skip_the_tiles_above_the_diagonal():
    """Causal prefill executes about half the loop iterations of the non-causal kernel."""
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-gpu")
    n = {}
    for causal in (False, True):
        k = flash_attention_kernel(caps, 1, 1, 256, 256, 32, causal=causal)
        Q, K, V, O = k.random_inputs(0)
        res = run_functional(k.program, k.args(Q, K, V, O), k.launch, warp_width=32, ncores=caps.cores_total)
        n[causal] = res.warp_instructions
    # 4 query blocks x 4 key tiles: non-causal runs 16 tile iterations, causal 1+2+3+4 = 10, of
    # which the 4 diagonal ones also run the mask code; masking all 16 would cost more, not less
    assert 0.6 < n[True] / n[False] < 0.8, n


def test_bad_requests_are_clear_errors():
    caps = caps_of("a100")
    with pytest.raises(InputError, match="head_dim"):
        flash_attention_kernel(caps, 1, 1, 8, 8, 48)
    with pytest.raises(InputError, match="q_len"):
        flash_attention_kernel(caps, 1, 1, 0, 8, 64)
    with pytest.raises(InputError, match="batch"):
        flash_attention_kernel(caps, 0, 1, 8, 8, 64)
    with pytest.raises(InputError, match="kv_len >= q_len"):
        flash_attention_kernel(caps, 1, 1, 9, 8, 64, causal=True)
    with pytest.raises(InputError, match="q_ld"):
        flash_attention_kernel(caps, 1, 2, 8, 8, 64, q_ld=100)
    with pytest.raises(InputError, match="dtype"):
        flash_attention_kernel(caps, 1, 1, 8, 8, 64, "int8")
    with pytest.raises(InputError, match="async copies"):
        flash_attention_kernel(dataclasses.replace(caps, has_async_copy=False), 1, 1, 8, 8, 64)
    with pytest.raises(InputError, match="FFMA kernel"):
        flash_attention_kernel(caps_of("tiny-gpu"), 1, 1, 8, 8, 128, "fp32")
    with pytest.raises(InputError, match="gpu family"):
        flash_attention_kernel(caps_of("tiny-sunway"), 1, 1, 8, 8, 64)
    with pytest.raises(InputError, match="scale"):
        flash_attention_kernel(caps, 1, 1, 8, 8, 64, scale=-1.0)
    k = flash_attention_kernel(caps, 1, 2, 8, 8, 64)
    Q, K, V, O = k.random_inputs()
    with pytest.raises(InputError, match="float16"):
        k.args(Q.astype(np.float32), K, V, O)
    with pytest.raises(InputError, match="bytes"):
        k.args(Q[:4].copy(), K, V, O)
    with pytest.raises(InputError, match="q_len == kv_len"):
        k.qkv_args(Q, O)
    with pytest.raises(InputError, match="multiple of 8"):
        k.args(Q, K, V, O, k_off=4)


# ----------------------------------------------------------------------------- timing
def test_timing_moves_only_q_k_v_and_o_through_dram():
    """A small prefill on the tiny GPU's timing model: the kernel completes, and DRAM traffic is
    about Q + K + V + O (K and V re-reads by the other query blocks hit L2; no s x s matrix goes
    to memory). O's 4-byte stores fill sectors in pieces, so its sectors are read once too."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-gpu")
    k = flash_attention_kernel(capabilities(m), 1, 2, 128, 128, 64, causal=True)
    nb = k.buffer_bytes()
    r = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(nb[n]) for n in "QKVO")))
    assert r.cycles > 0 and r.warp_instructions > 0
    moved = r.memory["bytes"]["dram_read"] + r.memory["bytes"]["dram_write"]
    total = sum(nb.values())
    assert 0.9 * total <= moved <= 1.2 * total, (moved, nb)
    s_matrix = 2 * 128 * 128 * 2                   # the fp16 scores of both heads
    assert moved < total + s_matrix / 4
    assert r.flops >= k.flops                        # the engine counts every mma, masked lanes too


def test_micro_attention_runs_the_fused_kernel():
    from archsim import micro as MI

    tiny = load_machine("tiny-gpu")
    r = MI.run_micro("attention", tiny, {"seq": 100, "heads": 2, "head_dim": 32, "causal": True})
    k = flash_attention_kernel(capabilities(tiny), 1, 2, 100, 100, 32, causal=True)
    assert r.unit == "TFLOP/s" and r.value > 0
    rec = r.kernels[0]
    assert rec["name"] == "attn" and r.extra["kernels"][0]["program"] == k.program.name
    assert rec["grid"] == [2, 2, 1]
    # the record's flops: the matmuls (the kernel's count) plus the softmax, 5 per unmasked pair
    assert rec["flops"] == k.flops + 5 * 2 * causal_pairs(100, 100) and rec["model_flops"] == k.model_flops
    assert r.value == pytest.approx(rec["flops"] / rec["seconds"] / 1e12)
    assert r.document(tiny)["schema"] == "archsim.micro/1"
    with pytest.raises(InputError, match="head_dim"):
        MI.run_micro("attention", tiny, {"head_dim": 48})
    with pytest.raises(InputError, match="seq"):
        MI.run_micro("attention", tiny, {"seq": 0})


def causal_lse(k, Q, K) -> np.ndarray:
    """The natural log-sum-exp of each causal row's scaled scores, [batch, heads, q_len], from the
    exact fp16 inputs of kernel ``k`` (its own Q, K layout: ld = heads*d)."""
    from archsim.workloads.emit.gemm_gpu import to_float

    b, h, q, kv, d = k.batch, k.heads, k.q_len, k.kv_len, k.head_dim
    qf = to_float(Q.ravel(), "fp16").reshape(b, q, h, d).transpose(0, 2, 1, 3)
    kf = to_float(K.ravel(), "fp16").reshape(b, kv, h, d).transpose(0, 2, 1, 3)
    s = k.scale * np.einsum("bhid,bhjd->bhij", qf, kf)
    s = np.where(np.arange(kv)[None, :] <= np.arange(q)[:, None] + (kv - q), s, -np.inf)
    mx = s.max(axis=-1, keepdims=True)
    return (mx + np.log(np.exp(s - mx).sum(axis=-1, keepdims=True)))[..., 0]


def test_two_m_tiles_a_warp_write_each_rows_log_sum_exp():
    from archsim.engine.functional import run_functional

    caps = caps_of("a100-4sm")
    b, h, q, kv, d = 1, 4, 130, 200, 64
    k = flash_attention_kernel(caps, b, h, q, kv, d, "fp16", causal=True, with_lse=True)
    assert k.block_rows == 128
    Q, K, V, O = k.random_inputs(5)
    lse = k.lse_buffer()
    res = run_functional(k.program, k.args(Q, K, V, O, LSE=lse), k.launch, warp_width=32, ncores=4)
    got = np.asarray(res.output("LSE")).reshape(b, h, q)
    assert np.abs(got - causal_lse(k, Q, K)).max() < 1e-4
    assert np.abs(k.output(res.output("O")) - k.reference(Q, K, V)).max() < 1e-2
