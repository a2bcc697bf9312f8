"""FlashAttention-3's warp-specialized kernel (archsim.workloads.emit.attention_wgmma) against numpy,
on both functional engines, with the tolerance test_emit_attention explains (P rounded once to the
input dtype for the P V wgmma, O once), and its timing on h100."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_emit_attention import caps_of, causal_lse, run_and_compare

from archsim.errors import InputError
from archsim.isa.check import check
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit import attention_wgmma as WG
from archsim.workloads.emit.attention_wgmma import flash_attention3_kernel
from archsim.workloads.emit.block import gpu_flash_attention_kernel


# (batch, heads, q_len, kv_len, head_dim, dtype, causal, qkv)
CASES = [
    (1, 2, 128, 128, 64, "fp16", False, False),     # one block, one K / V tile a head
    (2, 1, 200, 300, 64, "fp16", False, False),     # query and key tails
    (2, 1, 200, 200, 64, "fp16", True, True),       # the fused QKV buffer
    (1, 2, 256, 640, 64, "bf16", True, False),      # causal with kv_len > q_len, stages reused (5 tiles)
    (1, 1, 130, 260, 128, "fp16", True, False),     # two 64-column panels a row, a 2-row last block
    (2, 2, 256, 256, 128, "bf16", False, True),
]


@pytest.mark.parametrize("batch,heads,q_len,kv_len,d,dtype,causal,qkv", CASES)
def test_warp_specialized_kernel_matches_numpy(batch, heads, q_len, kv_len, d, dtype, causal, qkv):
    k, _ = run_and_compare(caps_of("h100"), batch, heads, q_len, kv_len, d, dtype, causal, qkv, seed=3,
                           kernel="wgmma")
    assert k.kind == "wgmma" and k.block_rows == WG.BM and k.Bc == WG.BC
    assert k.launch.block == (WG.THREADS, 1, 1) and k.launch.grid == (-(-q_len // WG.BM), heads, batch)


def test_the_reference_engine_agrees():
    """The pure-Python twin runs the same program to the same tolerance (TMA, mbarriers and wgmma
    included), and to the same bits as the numba engine."""
    k, fast = run_and_compare(caps_of("h100"), 1, 1, 128, 192, 64, "fp16", True, seed=4, kernel="wgmma")
    _, slow = run_and_compare(caps_of("h100"), 1, 1, 128, 192, 64, "fp16", True, seed=4, kernel="wgmma",
                              engine="reference")
    assert np.array_equal(np.asarray(fast.output("O")), np.asarray(slow.output("O")))


def test_o_leaves_by_bulk_stores():
    """Each consumer warp stores its boxes of O by bulk tensor stores: rows past q_len and the
    columns of a wider O row past the heads untouched, at an offset into O too (o_ld and o_off are
    multiples of 16 bytes, as every kernel's 16-byte copies want)."""
    from archsim.engine.functional import run_functional

    caps = caps_of("h100")
    k = flash_attention3_kernel(caps, 1, 2, 200, 256, 64, "fp16", True, o_ld=2 * 64 + 8)
    assert "mapO" in k.program.params
    Q, K, V, O = k.random_inputs(5)
    res = run_functional(k.program, k.args(Q, K, V, O), k.launch, warp_width=32)
    got = np.asarray(res.output("O")).reshape(200, 136)
    assert not got[:, 128:].any()
    ref = k.reference(Q, K, V).reshape(200, 128)
    assert np.allclose(got[:, :128].astype(np.float64), ref, atol=2e-2, rtol=2e-2)
    O2 = np.zeros(O.size + 8, O.dtype)
    res = run_functional(k.program, k.args(Q, K, V, O2, o_off=8), k.launch, warp_width=32)
    assert np.array_equal(np.asarray(res.output("O"))[8:].reshape(200, 136), got)
    assert not np.asarray(res.output("O"))[:8].any()


def test_log_sum_exp_of_each_row():
    from archsim.engine.functional import run_functional

    b, h, q = 1, 2, 150
    k = flash_attention3_kernel(caps_of("h100"), b, h, q, 256, 64, "fp16", causal=True, with_lse=True)
    Q, K, V, O = k.random_inputs(7)
    res = run_functional(k.program, k.args(Q, K, V, O, LSE=k.lse_buffer()), k.launch, warp_width=32)
    assert np.abs(np.asarray(res.output("LSE")).reshape(b, h, q) - causal_lse(k, Q, K)).max() < 1e-4
    assert np.abs(k.output(res.output("O")) - k.reference(Q, K, V)).max() < 1e-2


def test_program_is_warp_specialized_and_passes_the_load_time_checks():
    caps = caps_of("h100")
    for d, causal in ((64, False), (128, True)):
        k = flash_attention3_kernel(caps, 4, 8, 1024, 1024, d, "fp16", causal)
        check(k.program, caps)
        mn = [opcodes()[int(o)].mnemonic for o in k.program.op]
        # a K / V tile: d/16 wgmma for S, 8 for P V (A from registers), written for tile 0 and the
        # loop's two halves (S: each half's next tile; P V: each half and its last-tile exit); the
        # producer's boxes: Q's panels once, then a K and a V box a panel a tile; no cp.async,
        # ldmatrix or mma.sync
        assert mn.count("wgmma.m64n128k16.f32.f16") == 3 * d // 16
        assert mn.count(f"wgmma.m64n{d}k16.f32.f16.rs") == 4 * WG.BC // 16
        assert mn.count("cp.async.bulk.tensor.4d") == 3 * (d // 64)
        assert not any(m.startswith(("cp.async.16", "ldmatrix", "mma.")) for m in mn)
        # O by a bulk store a 64-column panel; global stores only for the LSE (two a thread)
        assert mn.count("cp.async.bulk.tensor.4d.store") == d // 64
        assert sum(m.startswith("st.global") for m in mn) == 0
        lse = flash_attention3_kernel(caps, 4, 8, 1024, 1024, d, "fp16", causal, with_lse=True)
        assert sum(opcodes()[int(o)].mnemonic.startswith("st.global") for o in lse.program.op) == 2
        bra = SEM["bra"]
        loops = sum(SEM[opcodes()[int(o)].sem] == bra and int(k.program.imm[pc]) <= pc
                    for pc, o in enumerate(k.program.op))
        assert loops == 2                          # the producer's and the consumers' K / V loops
        assert k.program.nregs * WG.THREADS <= caps.regs_per_core
        assert k.program.shared_bytes <= caps.scratchpad_bytes


@pytest.mark.parametrize("hw,kw,what", [
    ("a100", {}, "a100 has no tma or wgmma"),
    ("h100", {"q_len": 64}, "q_len 64, kv_len 64"),
    ("h100", {"dtype": "fp32"}, "dtype fp32"),
    ("h100", {"head_dim": 32}, "head_dim 32"),
    ("h100", {"kernel": "fa3"}, "kernel 'fa3'"),
])
def test_what_it_cannot_run_is_one_line(hw, kw, what):
    args = dict(batch=1, heads=2, q_len=kw.get("q_len", 256), kv_len=kw.get("q_len", 256),
                head_dim=kw.get("head_dim", 64), dtype=kw.get("dtype", "fp16"), kernel=kw.get("kernel", "wgmma"))
    with pytest.raises(InputError) as e:
        gpu_flash_attention_kernel(caps_of(hw), **args)
    assert what in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("q_len,kv_len,d,causal", [(384, 384, 64, True), (128, 128, 128, False),
                                                    (256, 640, 128, True)])
def test_timing_runs_every_tile_count_to_the_end(q_len, kv_len, d, causal):
    """The timing engine completes copies and wgmma as they land, not at issue: blocks of one, an
    odd and an even number of tiles (causal: 1, 2, 3 tiles at 384), one tile only, and more tiles
    than stages all end, each block's flops counted."""
    from archsim.config import load_machine
    from archsim.engine.timing import Unbacked, time_kernel

    k = flash_attention3_kernel(caps_of("h100"), 1, 1, q_len, kv_len, d, "bf16", causal, with_lse=causal)
    nb = k.buffer_bytes()
    bufs = [Unbacked(nb[n]) for n in "QKVO"]
    r = time_kernel(k.program, load_machine("h100"), k.launch,
                    k.args(*bufs, LSE=Unbacked(nb["LSE"])) if causal else k.args(*bufs))
    assert r.cycles > 0 and r.flops >= k.flops
    tiles = sum(
        min(-(-(kv_len - q_len + min(q_len, (b + 1) * WG.BM)) // WG.BC), -(-kv_len // WG.BC)) if causal
        else -(-kv_len // WG.BC) for b in range(k.launch.blocks))
    # a box a 64-column panel: Q's once a block, K's and V's once a tile (causal: up to the last visible)
    assert r.memory["tma"]["copies"] == d // 64 * (k.launch.blocks + 2 * tiles)


def test_timing_on_h100_moves_q_k_v_and_o_once_through_dram():
    """The TMA unit brings every box through L2: DRAM reads are about Q + K + V (the other query
    blocks' K and V reads hit L2), O leaves by bulk stores of whole lines (into L2, where they stay
    at the kernel's end: no fetch of partly written sectors), the engine counts every wgmma's flops,
    and the kernel ends."""
    from archsim.config import load_machine
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("h100")
    k = flash_attention3_kernel(caps_of("h100"), 1, 2, 256, 256, 64, "fp16")
    nb = k.buffer_bytes()
    r = time_kernel(k.program, m, k.launch, k.args(*(Unbacked(nb[n]) for n in "QKVO")))
    qkv = nb["Q"] + nb["K"] + nb["V"]
    assert 0.9 * qkv <= r.memory["bytes"]["dram_read"] <= 1.2 * qkv, (r.memory["bytes"], nb)
    assert r.memory["bytes"]["dram_write"] <= 1.2 * nb["O"]
    assert r.flops >= k.flops
    tma = r.memory["tma"]
    assert tma["copies"] == k.launch.blocks * (1 + 2 * 256 // WG.BC)
    # each of the 8 consumer warps of a block stores its 16 rows x 64 columns as one box
    assert tma["stores"] == 8 * k.launch.blocks and tma["store_bytes"] == nb["O"]


def test_micro_attention_compares_the_two_kernels_on_one_chip():
    from archsim import micro as MI
    from archsim.config import load_machine

    h100 = load_machine("h100")
    p = {"batch": 1, "heads": 4, "seq": 256}
    fa2 = MI.run_micro("attention", h100, p)
    fa3 = MI.run_micro("attention", h100, {**p, "kernel": "wgmma"})
    assert fa3.extra["kernels"][0]["program"].startswith("flash_attn3_")
    assert fa2.extra["kernels"][0]["program"].startswith("flash_attn_fp16")
    assert fa3.extra["kernels"][0]["block"] == [WG.THREADS, 1, 1]
    assert fa2.value > 0 and fa3.value > 0
    with pytest.raises(InputError, match="fused attention on a GPU"):
        MI.run_micro("attention", h100, {**p, "kernel": "wgmma", "fused": False})


def test_hopper_runs_fa3_where_its_blocks_fill_the_gpu():
    """The default on h100: FA3's kernel where it applies and its 128-row blocks fill the GPU (FA2's
    own 128-row test), FA2's 64-row blocks on a small grid, and FA2's everywhere without wgmma
    (``--set tensor.wgmma=null``) or on a100."""
    from archsim.config import capabilities, load_machine
    from archsim.workloads.emit.block import attention_kernels

    def program(caps, batch, heads, seq, d=64):
        return attention_kernels(caps, batch, heads, seq, d)[0].program.name

    h100 = caps_of("h100")
    assert program(h100, 32, 16, 512).startswith("flash_attn3_")        # 2048 blocks of 64 rows >= 211
    assert program(h100, 1, 96, 2048, 128).startswith("flash_attn3_")
    assert program(h100, 1, 12, 128).startswith("flash_attn_fp16_d64")  # 24 blocks: FA2's 64 rows
    assert program(h100, 32, 16, 64).startswith("flash_attn_fp16_d64")  # below FA3's 128 rows
    ampere_style = capabilities(load_machine("h100", sets=["tensor.wgmma=null"]))
    assert program(ampere_style, 32, 16, 512).startswith("flash_attn_fp16_d64_br128")
    assert program(caps_of("a100"), 32, 16, 512).startswith("flash_attn_fp16_d64_br128")
    # a core that cannot hold FA3's block: FA2's kernel does the work; asked for, FA3's is one line
    small = dataclasses.replace(h100, name="h100 (half the registers)", regs_per_core=32768)
    assert program(small, 32, 16, 512).startswith("flash_attn_fp16_d64")
    with pytest.raises(InputError, match="registers x 288 threads"):
        gpu_flash_attention_kernel(small, 32, 16, 512, 512, 64, kernel="wgmma")


def test_a_kernel_asked_of_an_attention_that_has_none_is_one_line():
    from archsim.config import capabilities, load_machine
    from archsim.workloads.emit.block import attention_kernels

    with pytest.raises(InputError, match="on a GPU"):
        attention_kernels(capabilities(load_machine("tiny-sunway")), 1, 2, 128, 32, kernel="mma")
    with pytest.raises(InputError, match="unfused"):
        attention_kernels(caps_of("h100"), 1, 2, 128, 64, fused=False, kernel="wgmma")
