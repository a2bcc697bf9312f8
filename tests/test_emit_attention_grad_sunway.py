"""The Sunway fused attention backward (archsim.workloads.emit.attention_grad_sunway), run
functionally on the numba engine (tiny-sunway) against float64 numpy (reference.ref_attention_grad).

Tolerance: tests/test_emit_attention_grad.py's bound, per element, with u the unit roundoff of the
storage dtype (fp16 2^-11, bf16 2^-8) and E = |dS| + P o rowsum(|dO o O|):

    dV: |err| <= 2u (|dV| + P^T |dO|) + 1e-5
    dK: |err| <= 2u (|dK| + scale E^T |Q|) + 1e-5
    dQ: |err| <= 2u (|dQ| + scale E |K|) + 1e-5

The Sunway kernels compute everything in fp32 (P and dS are never rounded to 16 bits), so for fp16 /
bf16 the error is the read O's rounding (in D) and the output's own rounding, well inside the bound.
fp32 storage takes u = 2^-17, as the Sunway forward's test does: fp32 rounding of every sum (d and
kv_len terms) with room to spare; a layout, mask, scale or LSE bug gives errors of the order of the
gradients (test_broken_kernels_fail).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.check import check
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit import attention_grad_gpu
from archsim.workloads.emit.attention_gpu import causal_pairs
from archsim.workloads.emit.attention_grad_sunway import flash_attention_grad_kernel
from archsim.workloads.emit.attention_sunway import flash_attention_kernel

import test_emit_attention_grad as G

U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -17}
_CAPS = {}


def caps_of(hw: str):
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


@pytest.fixture(autouse=True)
def _fp32_unit(monkeypatch):
    """The GPU test's tolerance helper reads its own U table, which has no fp32 (the GPU backward is
    16-bit only): give it the Sunway one."""
    monkeypatch.setattr(G, "U", U)


def grad_case(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv=False, seed=0, lse_shift=0.0, parts=None,
              inputs=None):
    """Emit, run (every part in order) and return (kernel, args, got, ref, tol) as [rows, heads*d]."""
    hd = heads * d
    ld = 3 * hd if qkv else None
    g = flash_attention_grad_kernel(caps, batch, heads, q_len, kv_len, d, dtype, causal, q_ld=ld, kv_ld=ld)
    Q, K, V, O, dO, LSE = g.random_inputs(seed, qkv=qkv) if inputs is None else inputs(g)
    LSE = np.ascontiguousarray(LSE + np.float32(lse_shift))
    ws = {n: np.zeros(shape, t) for n, (shape, t) in g.workspaces().items()}
    if qkv:
        offs = {"q_off": 0, "k_off": hd, "v_off": 2 * hd}
        dQKV = np.zeros_like(Q)
        args = g.qkv_args(Q, O, dO, LSE, dQKV, ws["D"], ws["NL"])
        K = V = Q
        G.run_parts(g, args, caps, parts)
        got = g.outputs(args["dQ"], args["dK"], args["dV"], dq_off=0, dk_off=hd, dv_off=2 * hd)
    else:
        offs = {}
        dQ, dK, dV = np.zeros_like(Q), np.zeros_like(K), np.zeros_like(V)
        args = g.args(Q, K, V, O, dO, LSE, dQ, dK, dV, ws["D"], ws["NL"])
        G.run_parts(g, args, caps, parts)
        got = g.outputs(args["dQ"], args["dK"], args["dV"])
    ref = g.reference(Q, K, V, dO, **offs)
    tol = G._tolerance(g, Q, K, V, O, dO, ref, offs)
    return g, args, got, ref, tol


# (batch, heads, q_len, kv_len, head_dim, dtype, causal, qkv)
CASES = [
    (2, 3, 37, 37, 64, "fp16", False, False),
    (2, 3, 37, 37, 64, "fp16", True, False),
    (2, 2, 70, 70, 32, "bf16", True, False),       # several query blocks and key blocks
    (1, 2, 45, 45, 32, "bf16", False, False),
    (1, 2, 37, 100, 64, "fp16", True, False),      # chunked prefill: kv_len > q_len, causal offset
    (1, 2, 50, 83, 32, "fp32", False, False),      # q_len != kv_len, fp32 storage
    (1, 2, 33, 33, 64, "fp32", True, False),       # fp32: 16-row query blocks on 64 KiB
    (1, 2, 1, 77, 32, "bf16", True, False),        # one query row
    (2, 1, 3, 5, 32, "fp16", True, False),         # lengths below one block, causal offset 2
    (2, 2, 70, 70, 64, "fp16", True, True),        # in place: qkv [T, 3h] -> d_qkv [T, 3h]
    (1, 2, 45, 45, 32, "fp32", True, True),
    (1, 2, 45, 45, 128, "fp16", True, False),      # head_dim 128: Br 8, Bc 16 on tiny-sunway
    (1, 1, 40, 40, 128, "bf16", False, True),
]


@pytest.mark.parametrize("batch,heads,q_len,kv_len,d,dtype,causal,qkv", CASES,
                         ids=[f"b{c[0]}h{c[1]}-{c[2]}x{c[3]}-d{c[4]}-{c[5]}{'-causal' if c[6] else ''}"
                              f"{'-qkv' if c[7] else ''}" for c in CASES])
def test_sunway_attention_grad_matches_numpy(batch, heads, q_len, kv_len, d, dtype, causal, qkv):
    caps = caps_of("tiny-sunway")
    g, args, got, ref, tol = grad_case(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv,
                                       seed=q_len + 7 * d + causal)
    bad = G._bad(got, ref, tol)
    assert bad == [0, 0, 0], (f"b{batch}h{heads} {q_len}x{kv_len} d{d} {dtype} causal={causal} qkv={qkv} "
                              f"tiles={g.tiles}: bad (dQ, dK, dV) = {bad}, max err "
                              f"{[float(np.abs(x - y).max()) for x, y in zip(got, ref)]}")
    zeros = G._bad([np.zeros_like(r) for r in ref], ref, tol)        # the check has teeth
    assert all(z > 0.5 * r.size for z, r in zip(zeros, ref)), zeros
    if not qkv:                                 # the columns past heads*d of every row stay untouched
        for n in ("dQ", "dK", "dV"):
            assert not np.asarray(args[n])[:, heads * d:].any()
    nl = args["NL"]                             # padding rows of the workspaces: D = 0, NL = -inf
    assert np.isneginf(nl[:, :, q_len:]).all() and not args["D"][:, :, q_len:].any()
    assert isinstance(g, attention_grad_gpu.AttentionGradKernel)      # the GPU module's kernel object


def test_sw26010pro_kernels_match_numpy():
    """The 256 KiB LDM takes the largest blocks (32 query rows, 64 key rows) and fp32 head_dim 128."""
    caps = caps_of("sw26010pro")
    for args in ((1, 2, 70, 70, 64, "fp16", True, False), (1, 1, 37, 37, 128, "fp32", False, False)):
        g, _, got, ref, tol = grad_case(caps, *args, seed=3)
        assert g.tiles == {"dkdv": (32, 8), "dq": (64, 8)}
        assert G._bad(got, ref, tol) == [0, 0, 0], args


def test_backward_from_the_forward_kernels_lse():
    """Chained as in training: the Sunway forward (with_lse) writes O and LSE, the backward reads them."""
    from archsim.engine.functional import run_functional
    from archsim.workloads.emit.gemm_gpu import to_host

    caps = caps_of("tiny-sunway")

    def from_forward(g):
        f = flash_attention_kernel(caps, g.batch, g.heads, g.q_len, g.kv_len, g.head_dim, g.dtype, g.causal,
                                   with_lse=True)
        Q, K, V, O = f.random_inputs(11)
        LSE = f.lse_buffer()
        r = run_functional(f.program, f.args(Q, K, V, O, LSE=LSE), f.launch, warp_width=32, ncores=caps.cores_total)
        O = np.asarray(r.output("O")).view(O.dtype).reshape(O.shape).copy()
        LSE = np.asarray(r.output("LSE")).view(np.float32).reshape(LSE.shape).copy()
        dO = np.random.default_rng(12).standard_normal(O.shape).astype(np.float32)
        return Q, K, V, O, to_host(dO, g.dtype), LSE

    _, _, got, ref, tol = grad_case(caps, 1, 2, 70, 70, 32, "fp16", True, inputs=from_forward)
    assert G._bad(got, ref, tol) == [0, 0, 0]


def test_broken_kernels_fail():
    """The comparison catches a missing causal mask, a wrong LSE and a skipped dQ kernel."""
    caps = caps_of("tiny-sunway")
    ok = flash_attention_grad_kernel(caps, 1, 2, 37, 37, 32, "fp16", True)
    nomask = flash_attention_grad_kernel(caps, 1, 2, 37, 37, 32, "fp16", False)
    parts = (ok.parts[0], dataclasses.replace(ok.parts[1], program=nomask.parts[1].program), ok.parts[2])
    *_, got, ref, tol = grad_case(caps, 1, 2, 37, 37, 32, "fp16", True, parts=parts)
    bad = G._bad(got, ref, tol)
    assert bad[0] == 0 and bad[1] > 0 and bad[2] > 0, bad           # dK, dV wrong; dQ (own kernel) right
    *_, got, ref, tol = grad_case(caps, 1, 2, 37, 37, 32, "fp16", True, lse_shift=0.05)
    assert all(b > 0 for b in G._bad(got, ref, tol))
    *_, got, ref, tol = grad_case(caps, 1, 2, 37, 37, 32, "fp16", True, parts=ok.parts[:2])
    assert G._bad(got, ref, tol)[0] > 0


# ----------------------------------------------------------------------------- what the kernels are
def test_parts_flops_and_grids():
    caps = caps_of("tiny-sunway")
    b, n, d = 2, 3, 64
    for q_len, kv_len, causal in ((37, 37, False), (70, 70, True), (37, 100, True)):
        g = flash_attention_grad_kernel(caps, b, n, q_len, kv_len, d, "fp16", causal)
        assert [p.name for p in g.parts] == ["attn.grad.pre", "attn.grad.dkdv", "attn.grad.dq"]
        gpu = attention_grad_gpu.flash_attention_grad_kernel(caps_of("a100"), b, n, q_len, kv_len, d, "fp16", causal)
        assert [(p.flops, p.model_flops) for p in g.parts] == [(p.flops, p.model_flops) for p in gpu.parts]
        pairs = causal_pairs(q_len, kv_len) if causal else q_len * kv_len
        assert g.flops == b * n * (2 * d * q_len + pairs * (14 * d + 8))
        assert g.part("pre").launch.grid == (-(-q_len // 32), n, b)
        assert g.part("dkdv").launch.grid == (-(-kv_len // 32), n, b)
        assert g.part("dq").launch.grid == (-(-q_len // 32), n, b)
        assert all(p.launch.block == (32, 1, 1) for p in g.parts)
        assert g.q_pad % 32 == 0 and g.q_pad >= q_len
    assert flash_attention_grad_kernel(caps, 1, 1, 8, 8, 64, name="blk.attn.grad").parts[1].name == \
        "blk.attn.grad.dkdv"


def test_program_size_does_not_depend_on_the_problem():
    for hw in ("tiny-sunway", "sw26010pro"):
        caps = caps_of(hw)
        small = flash_attention_grad_kernel(caps, 1, 1, 37, 37, 64, "bf16", True)
        big = flash_attention_grad_kernel(caps, 4, 16, 2048, 4096, 64, "bf16", True, q_ld=3072, kv_ld=3072)
        assert small.programs == big.programs
    for p in big.parts:
        mn = [opcodes()[int(o)].mnemonic for o in p.program.op]
        sems = [SEM[opcodes()[int(o)].sem] for o in p.program.op]
        assert any(s == SEM["bra"] and int(p.program.imm[pc]) <= pc for pc, s in enumerate(sems)), f"{p.name}: a loop"
        assert {"dma.get", "dma.put", "dma.wait"} <= set(mn), p.name
        assert not any(m.startswith(("st.global", "ld.global")) for m in mn), p.name   # every byte by DMA
        assert not any(opcodes()[int(o)].unit == "tensor" for o in p.program.op)
        assert len(mn) < 1000
    for p in big.parts[1:]:
        mn = set(opcodes()[int(o)].mnemonic for o in p.program.op)
        assert {"dma.get.s", "fma.f32", "ex2.f32", "ld.shared.v4.b32", "cvt.f32.bf16", "cvt.bf16x2.f32"} <= mn


@pytest.mark.parametrize("hw", ["tiny-sunway", "sw26010pro"])
def test_kernels_fit_and_pass_the_load_time_checks(hw):
    caps = caps_of(hw)
    for d in (32, 64, 128):
        for dt in ("fp16", "bf16", "fp32"):
            if (hw, d, dt) == ("tiny-sunway", 128, "fp32"):
                continue                                # test_ldm_limit
            for causal in (False, True):
                g = flash_attention_grad_kernel(caps, 1, 1, 100, 100, d, dt, causal)
                for p in g.parts:
                    check(p.program, caps)
                    assert p.program.shared_bytes <= caps.scratchpad_bytes
                    assert p.program.nregs <= caps.max_regs_per_thread


def test_ldm_limit():
    """Blocks shrink with the LDM; when none fits, one line names the LDM size."""
    tiny = caps_of("tiny-sunway")
    assert flash_attention_grad_kernel(tiny, 1, 1, 8, 8, 64).tiles == {"dkdv": (32, 8), "dq": (32, 8)}
    assert flash_attention_grad_kernel(tiny, 1, 1, 8, 8, 128).tiles == {"dkdv": (8, 8), "dq": (16, 8)}
    with pytest.raises(InputError, match=r"head_dim 128 fp32 \(dK, dV kernel\): no block fits the 65536 B LDM"):
        flash_attention_grad_kernel(tiny, 1, 1, 8, 8, 128, "fp32")
    small = dataclasses.replace(tiny, name="tiny-sunway (16 KiB LDM)", scratchpad_bytes=16 * 1024)
    with pytest.raises(InputError, match="no block fits the 16384 B LDM"):
        flash_attention_grad_kernel(small, 1, 1, 8, 8, 64)


def test_bad_requests_are_clear_errors():
    caps = caps_of("tiny-sunway")
    with pytest.raises(InputError, match="head_dim"):
        flash_attention_grad_kernel(caps, 1, 1, 8, 8, 48)
    with pytest.raises(InputError, match="kv_len >= q_len"):
        flash_attention_grad_kernel(caps, 1, 1, 9, 8, 64, causal=True)
    with pytest.raises(InputError, match="q_len"):
        flash_attention_grad_kernel(caps, 1, 1, 0, 8, 64)
    with pytest.raises(InputError, match="dtype"):
        flash_attention_grad_kernel(caps, 1, 1, 8, 8, 64, "int8")
    with pytest.raises(InputError, match="sunway family"):
        flash_attention_grad_kernel(caps_of("tiny-gpu"), 1, 1, 8, 8, 64)
    with pytest.raises(InputError, match="o_ld"):
        flash_attention_grad_kernel(caps, 1, 2, 8, 8, 64, o_ld=100)
    no_dma = dataclasses.replace(caps, name="tiny-sunway (no DMA)", units=caps.units - {"dma"})
    with pytest.raises(InputError, match="missing: dma"):
        flash_attention_grad_kernel(no_dma, 1, 1, 8, 8, 64)
    g = flash_attention_grad_kernel(caps, 1, 2, 8, 8, 64, "fp32")
    Q, K, V, O, dO, LSE = g.random_inputs()
    ws = {n: np.zeros(s, t) for n, (s, t) in g.workspaces().items()}
    dQ = np.zeros_like(Q)
    with pytest.raises(InputError, match="float32"):
        g.args(Q, K, V, O, dO, LSE, dQ.astype(np.float16), dQ, dQ, ws["D"], ws["NL"])
    with pytest.raises(InputError, match="bytes"):
        g.args(Q, K, V, O, dO, LSE, dQ[:4].copy(), dQ, dQ, ws["D"], ws["NL"])   # fp32: 4 bytes an element
    with pytest.raises(InputError, match="q_len == kv_len"):
        g.qkv_args(Q, O, dO, LSE, dQ, ws["D"], ws["NL"])


# ----------------------------------------------------------------------------- timing
def test_timing_smoke_on_tiny_sunway():
    """The three kernels complete on tiny-sunway's timing model; every global byte moves by DMA:
    pre reads O, dO and LSE once and writes D, NL; dkdv reads each K / V row once per (batch, head)
    and each query block's Q, dO, NL, D once per key block that sees it, and writes dK, dV once; dq
    reads Q, dO, NL, D once and each K / V block once per query block that sees it."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    b, n, L, d = 1, 2, 128, 64
    g = flash_attention_grad_kernel(capabilities(m), b, n, L, L, d, "fp16", True)
    assert g.tiles == {"dkdv": (32, 8), "dq": (32, 8)}
    nb = g.buffer_bytes()
    args = g.args(*(Unbacked(nb[x]) for x in ("Q", "K", "V", "O", "dO", "LSE", "dQ", "dK", "dV", "D", "NL")))
    row, ws = d * 2, 4
    nblk = L // 32                                 # 4 key blocks of 32 rows, 4 query blocks of 32 rows
    seen = nblk * (nblk + 1) // 2                  # (key block, query block) pairs a causal CPE visits: 10
    want = {
        "pre": n * L * (2 * row + ws) + 2 * n * L * ws,
        "dkdv": n * (2 * L * row + seen * 32 * (2 * row + 2 * ws) + 2 * L * row),
        "dq": n * (L * (2 * row + 2 * ws) + seen * 32 * 2 * row + L * row),
    }
    for p in g.parts:
        r = time_kernel(p.program, m, p.launch, g.part_args(p, args))
        short = p.name.rsplit(".", 1)[1]
        assert r.outcome == 0 and r.cycles > 0, p.name
        assert r.memory["bytes"]["dma"] == want[short], (p.name, r.memory["bytes"]["dma"], want[short])
        assert r.memory["bytes"]["l1"] == 0
        assert r.flops >= p.flops, p.name
