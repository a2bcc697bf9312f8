"""Split-KV decode attention on the Sunway family (attention_sunway.split_kv_attention_kernel:
attn.split = the decode program over one chunk of the cache per CPE, attn.combine = a CPE per
(batch, head)) against numpy, its split rule, the block composer's choice of it and its timing.

Tolerance as tests/test_emit_attention_sunway.py: |got - ref| <= 2u (|ref| + P|V|) + 1e-6 (the
partials stay f32, the combine rounds once).
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.workloads.emit.attention_gpu import SplitAttentionKernel
from archsim.workloads.emit.attention_sunway import (SPLITS_MAX, flash_attention_kernel, split_kv_attention_kernel,
                                                     sunway_kv_splits)

from test_emit_attention_splitkv import run_split
from test_emit_attention_sunway import U, _abs, caps_of

# (batch, heads, kv_len, head_dim, dtype, causal, layout, splits, with_lse)
# layout: "sep" Q, K, V apart; "decode" Q in a [b, 3h] qkv row, K / V caches [b, kv, h]
CASES = [
    (1, 2, 77, 64, "fp16", True, "sep", 2, False),        # the last chunk: 13 keys of a 64-key block
    (2, 3, 301, 64, "fp16", False, "decode", 3, True),
    (1, 2, 200, 64, "bf16", True, "decode", 4, True),    # one block a split, the last 8 keys
    (1, 2, 300, 32, "fp32", False, "sep", 5, True),
    (2, 1, 129, 32, "fp16", True, "decode", 2, False),    # Bc 128: the second split holds key 128 only
    (1, 1, 1000, 32, "bf16", False, "sep", 3, False),     # chunks of 3 blocks
]


@pytest.mark.parametrize("batch,heads,kv_len,d,dtype,causal,layout,splits,lse", CASES,
                         ids=[f"b{c[0]}h{c[1]}-{c[2]}-d{c[3]}-{c[4]}{'-causal' if c[5] else ''}-{c[6]}-s{c[7]}"
                              f"{'-lse' if c[8] else ''}" for c in CASES])
def test_sunway_split_kv_matches_numpy(batch, heads, kv_len, d, dtype, causal, layout, splits, lse):
    caps = caps_of("tiny-sunway")
    hd = heads * d
    lds = {"sep": {}, "decode": {"q_ld": 3 * hd}}[layout]
    k = split_kv_attention_kernel(caps, batch, heads, 1, kv_len, d, dtype, causal, splits=splits, with_lse=lse,
                                  **lds)
    assert isinstance(k, SplitAttentionKernel) and k.kind == "sunway_decode"
    assert k.splits == splits and (k.splits - 1) * k.chunk * k.Bc < kv_len <= k.splits * k.chunk * k.Bc
    assert [p.name for p in k.parts] == ["attn.split", "attn.combine"]
    assert k.parts[0].launch.grid == (splits, heads, batch) and k.parts[1].launch.grid == (batch * heads, 1, 1)
    Q, K, V, O = k.random_inputs(seed=kv_len + d)
    args = run_split(caps, k, Q, K, V, O)
    got = k.output(args["O"])
    ref = k.reference(Q, K, V)
    pv = k.reference(Q, K, _abs(V, k.dtype))
    err = np.abs(got - ref)
    bad = ~(err <= 2 * U[k.dtype] * (np.abs(ref) + pv) + 1e-6)
    assert not bad.any(), f"{int(bad.sum())} bad, max err {float(err.max()):.3g}, splits {k.splits} chunk {k.chunk}"
    rest = np.asarray(args["O"]).reshape(batch, k.o_ld)[:, hd:]
    assert not rest.any()                                  # only the heads' columns of O are written
    if lse:
        from archsim.workloads.reference import ref_attention

        def heads_of(X, off, rows):
            flat = np.asarray(X).ravel()
            flat = (flat.view(np.uint16).astype(np.uint32) << 16).view(np.float32) if dtype == "bf16" else flat
            idx = off + np.arange(batch * rows)[:, None] * (k.q_ld if rows == 1 else k.kv_ld) + np.arange(hd)[None, :]
            return flat.astype(np.float64)[idx].reshape(batch, rows, heads, d).transpose(0, 2, 1, 3)

        _, want = ref_attention(heads_of(Q, 0, 1), heads_of(K, 0, kv_len), heads_of(V, 0, kv_len), causal, k.scale,
                                return_lse=True)
        got_lse = np.asarray(args["LSE"]).reshape(want.shape)
        assert np.allclose(got_lse, want, rtol=1e-5, atol=1e-5), float(np.abs(got_lse - want).max())


def test_split_rule_on_sw26010pro():
    """sunway_kv_splits on the 384 CPEs: the largest chunk that still gives every CPE a block.
    gpt2-small decode at batch 8 (96 (batch, head) rows, 9 blocks of 128 keys): 5 splits of 2
    blocks (480 CPEs' worth); llama2-7b at batch 1 (32 heads, d 128, 17 blocks): 17 of 1; prefill,
    a full machine of (batch, head)s, or a single block keep the whole kernel."""
    caps = caps_of("sw26010pro")
    g = split_kv_attention_kernel(caps, 8, 12, 1, 1025, 64, causal=True, q_ld=3 * 768, kv_ld=768, o_ld=768)
    assert (g.splits, g.chunk, g.Bc) == (5, 2, 128)
    ll = split_kv_attention_kernel(caps, 1, 32, 1, 2049, 128, causal=True)
    assert (ll.splits, ll.chunk, ll.Bc) == (17, 1, 128)
    for bh, tiles in ((96, 9), (32, 17), (12, 9), (200, 30), (383, 4)):
        n, chunk = sunway_kv_splits(caps, bh, tiles)
        assert (n - 1) * chunk < tiles <= n * chunk
        fill = [c for c in range(1, tiles + 1) if bh * -(-tiles // c) >= caps.cores_total]
        assert chunk == max(fill, default=1)
    assert sunway_kv_splits(caps, 384, 9) == (1, 9) and sunway_kv_splits(caps, 12, 1) == (1, 1)
    assert split_kv_attention_kernel(caps, 1, 12, 7, 1025, 64) is None                # not decode
    assert split_kv_attention_kernel(caps, 32, 12, 1, 1025, 64) is None               # 384 CPEs busy already
    assert split_kv_attention_kernel(caps, 1, 12, 1, 100, 64) is None                 # one block
    assert split_kv_attention_kernel(caps_of("tiny-sunway"), 1, 2, 1, 500, 128, "bf16") is None  # K^T, V^T: no fit
    many = split_kv_attention_kernel(caps, 1, 1, 1, 128 * 200, 64, splits=200)
    assert many.splits <= SPLITS_MAX and (many.splits - 1) * many.chunk < 200 <= many.splits * many.chunk
    with pytest.raises(InputError, match="q_len"):
        split_kv_attention_kernel(caps, 1, 12, 2, 1025, 64, splits=2)
    with pytest.raises(InputError, match="splits"):
        split_kv_attention_kernel(caps, 1, 12, 1, 1025, 64, splits=0)
    a, b = split_kv_attention_kernel(caps, 1, 12, 1, 1025, 64), split_kv_attention_kernel(caps, 2, 7, 1, 3000, 64)
    assert [p.program for p in a.parts] == [p.program for p in b.parts]               # sizes are parameters


def test_block_composer_picks_split_kv_for_sunway_decode():
    from archsim.workloads.emit.block import emit_block
    from archsim.workloads.model import load_workload

    caps = capabilities(load_machine("sw26010pro"))
    for name, batch, heads in (("gpt2-small", 8, 12), ("llama2-7b", 1, 32)):
        wl = load_workload(name, {"phase": "decode", "batch": batch, "seq": 1024, "layers": 1})
        ks = [k for k in emit_block(caps, wl) if k.op == "attn"]
        assert [k.name for k in ks] == ["attn.kv_append", "attn.split", "attn.combine"]
        op = next(o for o in wl.block_ops() if o.name == "attn")
        split, comb = ks[1], ks[2]
        assert split.flops == op.flops and split.model_flops == op.model_flops and comb.model_flops == 0
        assert split.launch.grid[1:] == (heads, batch) and split.launch.grid[0] >= 2
        pre = load_workload(name, {"phase": "prefill", "batch": 1, "seq": 1024, "layers": 1})
        assert [k.name for k in emit_block(caps, pre) if k.op == "attn"] == ["attn"]


def test_functional_decode_block_with_split_kv(capsys, tmp_path):
    """tiny-sunway (32 CPEs), the tiny model's 2 heads and a 301-row cache (3 blocks of 128 keys):
    the composer splits the cache; the functional run checks attn and the whole block."""
    from test_emit_attention_splitkv import check_functional_split_decode

    check_functional_split_decode(capsys, tmp_path, "--hw", "tiny-sunway", "--seq", "300")


def test_sw26010pro_split_kv_decode_is_faster():
    """GPT-2 small's decode attention shape at batch 1 (12 heads, d 64, 1025 cached keys): the
    whole-row decode kernel runs 12 CPEs through 9 blocks each; split-KV 108 CPEs one block each,
    then the combine. The same K / V bytes either way, streamed by 9x the CPEs and 2 core groups."""
    from archsim.engine.dram import cross_base
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("sw26010pro")
    caps = capabilities(m)
    cb = cross_base(m)                                   # the buffers in the cross segment, as a run places them
    full = flash_attention_kernel(caps, 1, 12, 1, 1025, 64, causal=True)
    nb = full.buffer_bytes()
    rf = time_kernel(full.program, m, full.launch, full.args(*(Unbacked(nb[n]) for n in "QKVO")), base=cb)
    sk = split_kv_attention_kernel(caps, 1, 12, 1, 1025, 64, causal=True)
    assert (sk.splits, sk.chunk) == (9, 1)
    nb = sk.buffer_bytes()
    args = sk.args(*(Unbacked(nb[n]) for n in ("Q", "K", "V", "O", "Opart", "LSEpart")))
    rs = [time_kernel(p.program, m, p.launch, sk.part_args(p, args), base=cb) for p in sk.parts]
    kv_bytes = 2 * 12 * 1025 * 64 * 2
    assert rf.memory["dma"]["bytes_get"] == kv_bytes + 12 * 128
    assert rs[0].memory["dma"]["bytes_get"] == kv_bytes + 9 * 12 * 128    # each split reads the Q row
    assert rs[0].memory["dma"]["gets"] == 9 * 12 * 3                       # Q, one K and one V get a CPE
    # ~160 k cycles whole, ~113 k + ~3 k split (measured; 231 k and 137 k with the 16-flit FIFO
    # ring stops of before, which held the 12 CPEs' replies at two stops' links)
    assert sum(r.cycles for r in rs) < 0.8 * rf.cycles, ([r.cycles for r in rs], rf.cycles)
