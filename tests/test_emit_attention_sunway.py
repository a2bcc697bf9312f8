"""The Sunway fused attention emitter (archsim.workloads.emit.attention_sunway) against numpy.

Same tolerance as tests/test_emit_attention.py, per output element (reference in float64 from the
exact inputs):

    |got - ref| <= 2u * (|ref| + (P |V|)) + 1e-6

u is the unit roundoff of the storage dtype (fp16 2^-11, bf16 2^-8, fp32 2^-17). The Sunway kernel
does all its math in fp32 (scores, probabilities, the running max and sum, the accumulators), so
fp16 / bf16 outputs carry their own final rounding (u |O|) and ~1e-6 relative besides; a layout,
mask or rescaling bug gives errors of order |V|.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.check import check
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit import attention_gpu
from archsim.workloads.emit.attention_sunway import flash_attention_kernel

U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -17}
_CAPS = {}


def caps_of(hw: str):
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


def _abs(X, dtype):
    return (X & np.uint16(0x7FFF)) if dtype == "bf16" else np.abs(X)


def run_and_compare(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv=False, seed=0, with_lse=False):
    from archsim.engine.functional import run_functional

    hd = heads * d
    ld = 3 * hd if qkv else None
    k = flash_attention_kernel(caps, batch, heads, q_len, kv_len, d, dtype, causal, q_ld=ld, kv_ld=ld,
                               with_lse=with_lse)
    Q, K, V, O = k.random_inputs(seed)
    extra = {"LSE": k.lse_buffer()} if with_lse else {}
    if qkv:                                     # one [b*s, 3*h*d] buffer, read in place
        offs = {"q_off": 0, "k_off": hd, "v_off": 2 * hd}
        args = k.qkv_args(Q, O, **extra)
        K = V = Q
    else:
        offs = {}
        args = k.args(Q, K, V, O, **extra)
    res = run_functional(k.program, args, k.launch, warp_width=caps.warp_width, ncores=caps.cores_total)
    got = k.output(res.output("O"))
    ref = k.reference(Q, K, V, **offs)
    pv = k.reference(Q, K, _abs(V, k.dtype), **offs)          # P |V|
    err = np.abs(got - ref)
    bad = ~(err <= 2 * U[k.dtype] * (np.abs(ref) + pv) + 1e-6)
    assert not bad.any(), (f"b{batch} h{heads} {q_len}x{kv_len} d{d} {dtype} causal={causal} qkv={qkv} Bc={k.Bc}: "
                           f"{int(bad.sum())} bad, first at {np.argwhere(bad)[0]}, max err {float(err.max()):.3g}")
    rest = np.asarray(res.output("O")).reshape(batch * q_len, k.o_ld)[:, hd:]
    assert not rest.any()                       # the columns past heads*d of every O row stay untouched
    return k, res, (Q, K, V, offs)


# (batch, heads, q_len, kv_len, head_dim, dtype, causal, qkv)
CASES = [
    (2, 3, 37, 37, 64, "fp16", False, False),
    (2, 3, 37, 37, 64, "fp16", True, False),
    (2, 3, 70, 70, 32, "bf16", True, False),
    (1, 2, 70, 70, 64, "fp16", True, True),       # Q, K, V in one fused QKV buffer
    (1, 2, 45, 45, 128, "fp16", True, False),     # d 128: Bc 16 on the 64 KiB LDM
    (1, 2, 45, 45, 128, "bf16", False, False),
    (2, 3, 1, 77, 64, "fp16", True, False),       # decode: one query sees the whole cache (lane = key)
    (1, 2, 1, 77, 32, "bf16", False, False),
    (1, 2, 1, 5, 32, "fp16", True, False),        # decode, a cache shorter than the lanes
    (1, 2, 1, 300, 32, "fp32", False, False),
    (1, 2, 1, 200, 128, "bf16", True, False),     # decode d 128: K^T, V^T do not fit 64 KiB -> row kernel
    (1, 2, 37, 100, 64, "fp16", True, False),     # chunked prefill: kv_len > q_len
    (1, 2, 100, 130, 64, "fp16", False, False),   # several K/V blocks and query blocks, both tails odd
    (1, 2, 37, 37, 64, "fp32", True, False),
    (1, 1, 40, 40, 128, "fp32", False, False),
    (1, 2, 33, 33, 32, "fp32", True, True),
    (4, 4, 130, 130, 64, "fp16", True, True),     # a grid that fills tiny-sunway at 64 rows a CPE
    (2, 8, 100, 130, 32, "bf16", True, False),    # 64 rows a CPE, kv_len > q_len
]


@pytest.mark.parametrize("batch,heads,q_len,kv_len,d,dtype,causal,qkv", CASES,
                         ids=[f"b{c[0]}h{c[1]}-{c[2]}x{c[3]}-d{c[4]}-{c[5]}{'-causal' if c[6] else ''}"
                              f"{'-qkv' if c[7] else ''}" for c in CASES])
def test_sunway_flash_attention_matches_numpy(batch, heads, q_len, kv_len, d, dtype, causal, qkv):
    caps = caps_of("tiny-sunway")
    k, _, _ = run_and_compare(caps, batch, heads, q_len, kv_len, d, dtype, causal, qkv, seed=q_len + 7 * d)
    assert k.kind == ("sunway_decode" if q_len == 1 and (d, dtype) != (128, "bf16") else "sunway")
    rows = 64 if "_br64_" in k.program.name else 32
    assert rows == (64 if batch * heads * -(-q_len // 64) >= caps.cores_total and q_len > 1 else 32)
    assert k.launch.grid == (-(-q_len // rows), heads, batch) and k.launch.block == (32, 1, 1)
    assert isinstance(k, attention_gpu.AttentionKernel)          # the GPU module's kernel object


@pytest.mark.parametrize("batch,heads,seq", [(1, 2, 45), (4, 4, 100)])   # 32 and 64 rows a CPE
def test_with_lse_writes_the_log_sum_exp(batch, heads, seq):
    from archsim.workloads.reference import ref_attention

    caps = caps_of("tiny-sunway")
    k, res, (Q, K, V, offs) = run_and_compare(caps, batch, heads, seq, seq, 64, "fp16", True, qkv=True, seed=3,
                                              with_lse=True)
    hd = k.heads * k.head_dim

    def heads(X, off):
        flat = attention_gpu.to_float(np.asarray(X).ravel(), k.dtype)
        idx = off + np.arange(k.batch * k.q_len)[:, None] * k.q_ld + np.arange(hd)[None, :]
        return flat[idx].reshape(k.batch, k.q_len, k.heads, k.head_dim).transpose(0, 2, 1, 3)

    _, lse = ref_attention(heads(Q, 0), heads(Q, hd), heads(Q, 2 * hd), True, k.scale, return_lse=True)
    got = np.asarray(res.output("LSE")).reshape(lse.shape)
    assert np.allclose(got, lse, rtol=1e-5, atol=1e-5), float(np.abs(got - lse).max())


def test_decode_with_lse_and_a_kv_cache_layout():
    """Decode as the block composer emits it: Q from the fused qkv rows (q_ld = 3h), K and V from
    caches of kv_len rows (kv_ld = h), O rows of h, and the log-sum-exp."""
    from archsim.engine.functional import run_functional
    from archsim.workloads.reference import ref_attention

    caps = caps_of("tiny-sunway")
    b, n, d, kv = 2, 3, 64, 90
    h = n * d
    k = flash_attention_kernel(caps, b, n, 1, kv, d, "fp16", True, q_ld=3 * h, kv_ld=h, o_ld=h, with_lse=True)
    assert k.kind == "sunway_decode"
    rng = np.random.default_rng(5)
    Q = rng.standard_normal((b, 3 * h)).astype(np.float16)
    K, V = (rng.standard_normal((b * kv, h)).astype(np.float16) for _ in range(2))
    O, LSE = np.zeros((b, h), np.float16), k.lse_buffer()
    res = run_functional(k.program, k.args(Q, K, V, O, LSE=LSE), k.launch, warp_width=32, ncores=caps.cores_total)
    ref = k.reference(Q, K, V)
    err = np.abs(k.output(res.output("O")) - ref)
    assert (err <= 2 * U["fp16"] * (np.abs(ref) + k.reference(Q, K, np.abs(V))) + 1e-6).all(), float(err.max())

    def heads(X, rows):                         # the first h columns of each row -> [b, heads, rows, d]
        return X.astype(np.float64)[:, :h].reshape(b, rows, n, d).transpose(0, 2, 1, 3)

    _, lse = ref_attention(heads(Q, 1), heads(K, kv), heads(V, kv), True, k.scale, return_lse=True)
    got = np.asarray(res.output("LSE")).reshape(lse.shape)
    assert np.allclose(got, lse, rtol=1e-5, atol=1e-5), float(np.abs(got - lse).max())


def test_decode_kernel_issues_far_less_than_the_row_kernel():
    """One query: the row kernel (lane = query row) would run 31 idle lanes; lane = key uses all 32."""
    from archsim.engine.functional import run_functional
    from archsim.workloads.emit import attention_sunway as A

    caps = caps_of("tiny-sunway")
    k = flash_attention_kernel(caps, 1, 1, 1, 512, 64)
    Q, K, V, O = k.random_inputs(0)
    dec = run_functional(k.program, k.args(Q, K, V, O), k.launch, warp_width=32, ncores=caps.cores_total)
    _, row_prog = A._choose(caps, "fp16", 64, False, k.scale * attention_gpu.LOG2E, False)
    row = run_functional(row_prog, k.args(Q, K, V, O), k.launch, warp_width=32, ncores=caps.cores_total)
    assert np.abs(k.output(dec.output("O")) - k.output(row.output("O"))).max() < 2e-3   # the same O
    assert dec.warp_instructions * 4 < row.warp_instructions, (dec.warp_instructions, row.warp_instructions)


# ----------------------------------------------------------------------------- what the program is
def test_program_shape_and_instruction_mix():
    caps = caps_of("sw26010pro")
    small = flash_attention_kernel(caps, 1, 1, 37, 37, 64)
    assert small.program == flash_attention_kernel(caps, 2, 3, 300, 500, 64).program   # sizes are parameters
    big = flash_attention_kernel(caps, 8, 16, 4096, 4096, 64)
    assert big.program == flash_attention_kernel(caps, 4, 12, 2048, 2048, 64).program
    assert "_br32_" in small.program.name and small.launch.grid == (2, 1, 1)
    assert "_br64_" in big.program.name and big.launch.grid == (64, 16, 8)   # the grid fills 384 CPEs twice
    bra = SEM["bra"]
    sems = [SEM[opcodes()[int(o)].sem] for o in big.program.op]
    assert any(s == bra and int(big.program.imm[pc]) <= pc for pc, s in enumerate(sems)), "a K/V loop"
    mn = [opcodes()[int(o)].mnemonic for o in big.program.op]
    assert {"dma.get.s", "dma.put.s", "dma.wait", "fma.f32", "ex2.f32", "ld.shared.v4.b32", "cvt.f32.f16",
            "cvt.f16x2.f32", "rcp.f32"} <= set(mn)
    assert not any(opcodes()[int(o)].unit in ("tensor", "shfl") for o in big.program.op)
    assert not any(m.startswith(("st.global", "ld.global")) for m in mn)   # every global byte moves by DMA
    assert "dma.get" not in mn                  # Q, K, V blocks by strided gets, never row by row
    assert big.Bc == 64 and big.program.shared_bytes <= caps.scratchpad_bytes


@pytest.mark.parametrize("hw", ["tiny-sunway", "sw26010pro"])
def test_kernels_fit_and_pass_the_load_time_checks(hw):
    caps = caps_of(hw)
    for d in (32, 64, 128):
        for dt in ("fp16", "bf16", "fp32"):
            for causal in (False, True):
                k = flash_attention_kernel(caps, 1, 1, 100, 100, d, dt, causal)
                check(k.program, caps)
                assert k.program.shared_bytes <= caps.scratchpad_bytes
                assert k.program.nregs <= caps.max_regs_per_thread


def test_block_size_follows_the_ldm():
    """Bc is the largest of 64, 32, 16, 8 whose LDM footprint fits: a smaller LDM gets smaller blocks,
    and one that cannot hold Q^T, O^T and the smallest block is a one-line error."""
    tiny = caps_of("tiny-sunway")
    assert flash_attention_kernel(tiny, 1, 1, 8, 8, 64).Bc == 64       # exactly 64 KiB
    assert flash_attention_kernel(tiny, 1, 1, 8, 8, 128).Bc == 16
    assert flash_attention_kernel(caps_of("sw26010pro"), 1, 1, 8, 8, 128).Bc == 64
    small = dataclasses.replace(tiny, name="tiny-sunway (16 KiB LDM)", scratchpad_bytes=16 * 1024)
    with pytest.raises(InputError, match="no K/V block fits a CPE"):
        flash_attention_kernel(small, 1, 1, 8, 8, 64)


def test_flops_count_the_unmasked_pairs():
    caps = caps_of("tiny-sunway")
    for q_len, kv_len in ((37, 37), (1, 77), (37, 100)):
        g = attention_gpu.flash_attention_kernel(caps_of("a100"), 2, 3, q_len, kv_len, 64, causal=True)
        k = flash_attention_kernel(caps, 2, 3, q_len, kv_len, 64, causal=True)
        assert (k.flops, k.model_flops) == (g.flops, g.model_flops)


def test_causal_blocks_skip_the_key_blocks_above_the_diagonal():
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-sunway")
    n = {}
    for causal in (False, True):
        k = flash_attention_kernel(caps, 1, 1, 256, 256, 32, causal=causal)
        Q, K, V, O = k.random_inputs(0)
        res = run_functional(k.program, k.args(Q, K, V, O), k.launch, warp_width=32, ncores=caps.cores_total)
        n[causal] = res.warp_instructions
    # 8 query blocks x 4 key blocks: non-causal 32 block iterations, causal 1+1+2+2+3+3+4+4 = 20
    assert 0.5 < n[True] / n[False] < 0.75, n


def test_bad_requests_are_clear_errors():
    caps = caps_of("tiny-sunway")
    with pytest.raises(InputError, match="head_dim"):
        flash_attention_kernel(caps, 1, 1, 8, 8, 48)
    with pytest.raises(InputError, match="q_len"):
        flash_attention_kernel(caps, 1, 1, 0, 8, 64)
    with pytest.raises(InputError, match="kv_len >= q_len"):
        flash_attention_kernel(caps, 1, 1, 9, 8, 64, causal=True)
    with pytest.raises(InputError, match="dtype"):
        flash_attention_kernel(caps, 1, 1, 8, 8, 64, "int8")
    with pytest.raises(InputError, match="sunway family"):
        flash_attention_kernel(caps_of("tiny-gpu"), 1, 1, 8, 8, 64)
    with pytest.raises(InputError, match="gpu family"):
        attention_gpu.flash_attention_kernel(caps, 1, 1, 8, 8, 64)
    no_dma = dataclasses.replace(caps, name="tiny-sunway (no DMA)", units=caps.units - {"dma"})
    with pytest.raises(InputError, match="missing: dma"):
        flash_attention_kernel(no_dma, 1, 1, 8, 8, 64)
    no_conv = dataclasses.replace(caps, name="tiny-sunway (no conversions)", units=caps.units - {"conv"})
    with pytest.raises(InputError, match="missing: conv"):
        flash_attention_kernel(no_conv, 1, 1, 8, 8, 64, "bf16")
    assert flash_attention_kernel(no_conv, 1, 1, 8, 8, 64, "fp32").dtype == "fp32"


# ----------------------------------------------------------------------------- timing
def test_timing_smoke_on_tiny_sunway():
    """A small causal prefill on tiny-sunway's timing model: the kernel completes, every global
    byte moves by DMA (Q, O once; K, V once per query block that sees them; no s x s matrix), and
    the CPEs spend their time on the vector pipe, not waiting for DMA."""
    from archsim.engine.warps import STALL_NAMES
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    k = flash_attention_kernel(capabilities(m), 1, 2, 128, 128, 64, causal=True)
    nb = k.buffer_bytes()
    r = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(nb[n]) for n in "QKVO")))
    assert r.outcome == 0 and r.cycles > 0
    b = r.memory["bytes"]
    # K and V blocks of 64 rows: query blocks 0, 1 read block 0; 2, 3 read blocks 0 and 1 -> 6 per head
    kv_reads = 2 * 6 * 64 * 64 * 2 * 2
    assert b["dma"] == nb["Q"] + nb["O"] + kv_reads
    # O(blocks) descriptors: per CPE one strided get of its Q rows, one per K and per V block, one
    # strided put of its O rows (8 CPEs: 2 heads x 4 query blocks; 12 K/V blocks)
    assert (r.memory["dma"]["gets"], r.memory["dma"]["puts"]) == (8 + 2 * 12, 8)
    assert b["l1"] == 0
    stall = r.stall.sum(axis=0)
    share = dict(zip(STALL_NAMES, stall / stall.sum()))
    # the next K/V block's two strided gets go out when the block before is converted; on tiny-sunway's
    # slow DRAM they are not always back when the block after is (row gets showed this as pipe_busy)
    assert share["dma_wait"] < 0.2, share
    assert r.flops >= k.flops
    # the vector pipe is busy most of the time on the CPE with the heaviest query block
    assert r.pipe_busy_cycles[0][0] > 0.6 * r.cycles


def test_decode_timing_reads_the_cache_once():
    """Decode on tiny-sunway's timing model: one CPE per head reads every cached K / V row exactly
    once and the whole query and O row once, by O(blocks) DMA descriptors: one strided get per K or
    V block (rows of the last block past kv_len are not fetched)."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("tiny-sunway")
    k = flash_attention_kernel(capabilities(m), 1, 2, 1, 200, 64, causal=True)
    assert k.kind == "sunway_decode" and k.Bc == 64
    nb = k.buffer_bytes()
    r = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(nb[n]) for n in "QKVO")))
    assert r.outcome == 0 and r.cycles > 0
    assert r.memory["bytes"]["dma"] == 2 * (64 * 2) * 2 + 2 * 2 * 200 * 64 * 2   # Q, O rows + K, V rows
    blocks = -(-200 // 64)                          # 4 blocks of 64 rows
    assert r.memory["dma"]["gets"] == 2 * (1 + 2 * blocks)       # per head: the Q row, a K and a V get a block
    assert r.memory["dma"]["puts"] == 2
    # one get per row (2 x 64 a block, 4 blocks, clamped re-reads past kv_len) took 36,209 cycles here
    # (b0cf29d); two strided gets a block and a bank-spread transpose of the packed rows: ~24,300
    assert r.cycles < 0.75 * 36209, r.cycles
    assert r.flops >= k.flops
