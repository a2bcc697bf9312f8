"""Split-KV decode attention (attention_gpu.split_kv_attention_kernel: attn.split + attn.combine)
against numpy on the numba engine, the block composer's choice of it, and its timing on a100.

Tolerance as tests/test_emit_attention.py: |got - ref| <= 2u (|ref| + P|V|) + 1e-6. The split
kernel keeps its partial O in f32 (no extra rounding in the storage dtype) and the combine rounds
once, so the whole-row kernel's bound holds.
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit.attention_gpu import (BR, flash_attention_kernel, kv_splits,
                                                  split_kv_attention_kernel)

from test_emit_attention import U, _abs, caps_of


def run_split(caps, k, Q, K, V, O, **offs):
    from archsim.engine.functional import run_functional

    Op, Lp = k.workspace_buffers()
    LSE = k.lse_buffer() if k.with_lse else None
    args = k.args(Q, K, V, O, Op, Lp, LSE=LSE, **offs)
    for p in k.parts:
        res = run_functional(p.program, k.part_args(p, args), p.launch, warp_width=caps.warp_width,
                             ncores=caps.cores_total)
        for o in p.outputs:
            args[o] = np.asarray(res.output(o)).reshape(np.asarray(args[o]).shape)
    return args


# (hw, batch, heads, q_len, kv_len, head_dim, dtype, causal, layout, splits)
# layout: "sep" Q, K, V apart; "decode" Q in a [b, 3h] qkv row, K / V caches [b, kv, h] (as the
# block composer binds a decode step); "qkv" Q, K, V read in place from one [b*s, 3h] buffer
CASES = [
    ("tiny-gpu", 1, 2, 1, 77, 32, "fp16", True, "sep", 2),
    ("tiny-gpu", 2, 3, 1, 101, 64, "fp16", False, "decode", 3),
    ("tiny-gpu", 2, 2, 2, 101, 64, "bf16", True, "sep", 4),     # row 0 misses the last key
    ("tiny-gpu", 1, 2, 2, 65, 32, "fp16", True, "decode", 2),   # the last chunk: only key 64, row 0 sees none
    ("tiny-gpu", 1, 2, 45, 45, 64, "fp16", True, "qkv", 2),     # causal q = kv: rows 0..31 see nothing in chunk 1
    ("tiny-gpu", 2, 1, 1, 77, 32, "fp32", True, "decode", 3),   # FFMA kernel
    ("tiny-gpu", 1, 2, 2, 65, 64, "fp32", False, "sep", 5),
    ("tiny-gpu", 1, 2, 2, 65, 32, "fp32", True, "sep", 5),
    ("a100", 1, 2, 1, 333, 128, "bf16", True, "decode", None),
    ("a100", 1, 1, 2, 199, 128, "fp16", False, "sep", 3),
]


@pytest.mark.parametrize("hw,batch,heads,q_len,kv_len,d,dtype,causal,layout,splits", CASES,
                         ids=[f"{c[0]}-b{c[1]}h{c[2]}-{c[3]}x{c[4]}-d{c[5]}-{c[6]}{'-causal' if c[7] else ''}-{c[8]}"
                              f"-s{c[9]}" for c in CASES])
def test_split_kv_matches_numpy(hw, batch, heads, q_len, kv_len, d, dtype, causal, layout, splits):
    caps = caps_of(hw)
    hd = heads * d
    lds = {"sep": {}, "decode": {"q_ld": 3 * hd}, "qkv": {"q_ld": 3 * hd, "kv_ld": 3 * hd}}[layout]
    k = split_kv_attention_kernel(caps, batch, heads, q_len, kv_len, d, dtype, causal, splits=splits, **lds)
    assert k is not None and k.splits >= 2 and (k.splits - 1) * k.chunk * k.Bc < kv_len
    assert [p.name for p in k.parts] == ["attn.split", "attn.combine"]
    assert k.parts[0].launch.grid == (k.splits, heads, batch)
    Q, K, V, O = k.random_inputs(seed=kv_len + d)
    offs = {}
    if layout == "qkv":
        K = V = Q
        offs = {"k_off": hd, "v_off": 2 * hd}
    args = run_split(caps, k, Q, K, V, O, **offs)
    got = k.output(args["O"])
    ref = k.reference(Q, K, V, **offs)
    pv = k.reference(Q, K, _abs(V, k.dtype), **offs)
    err = np.abs(got - ref)
    bad = ~(err <= 2 * U[k.dtype] * (np.abs(ref) + pv) + 1e-6)
    assert not bad.any(), (f"{int(bad.sum())} bad, first at {np.argwhere(bad)[0]}, max err {float(err.max()):.3g}, "
                           f"splits {k.splits} chunk {k.chunk} Bc {k.Bc} {k.kind}")
    rest = np.asarray(args["O"]).reshape(batch * q_len, k.o_ld)[:, hd:]
    assert not rest.any()                                  # only the heads' columns of O are written
    assert k.kind == ("ffma" if dtype == "fp32" else "mma")


def test_with_lse_writes_the_log_sum_exp():
    caps = caps_of("tiny-gpu")
    k = split_kv_attention_kernel(caps, 2, 2, 2, 77, 32, "fp16", True, splits=3, with_lse=True)
    Q, K, V, O = k.random_inputs(3)
    args = run_split(caps, k, Q, K, V, O)
    q, kk = (np.asarray(X, np.float64).reshape(2, -1, 2, 32).transpose(0, 2, 1, 3) for X in (Q, K))
    s = k.scale * np.einsum("bhid,bhjd->bhij", q, kk)
    vis = np.arange(77)[None, :] <= np.arange(2)[:, None] + 75
    s = np.where(vis, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    want = (mx[..., 0] + np.log(np.exp(s - mx).sum(-1)))
    assert np.allclose(np.asarray(args["LSE"]).reshape(2, 2, 2), want, atol=1e-4)


def test_programs_are_loops_independent_of_the_sizes():
    caps = caps_of("a100")
    a = split_kv_attention_kernel(caps, 1, 12, 1, 1025, 64)
    b = split_kv_attention_kernel(caps, 2, 32, 2, 4097, 64, splits=7)
    for pa, pb in zip(a.parts, b.parts):
        assert pa.program == pb.program
        bra = SEM["bra"]
        sems = [SEM[opcodes()[int(o)].sem] for o in pa.program.op]
        assert any(s == bra and int(pa.program.imm[pc]) <= pc for pc, s in enumerate(sems)), pa.name
    # the split kernel is the whole-row kernel's flash loop: the same mma count
    full = flash_attention_kernel(caps, 1, 12, 1, 1025, 64)
    mn = lambda p: [opcodes()[int(o)].mnemonic for o in p.op]          # noqa: E731
    assert mn(a.parts[0].program).count("mma.m16n8k16.f32.f16") == mn(full.program).count("mma.m16n8k16.f32.f16")
    assert a.Bc == full.Bc


def test_splits_follow_the_machine():
    """The chunk minimises waves x (chunk + 1) (the critical path in tiles, one block an SM at a
    time, a block's start about a tile), which beats the whole-row kernel when batch*heads blocks
    leave many SMs idle; no split when the query blocks (nearly) fill the machine, for long queries
    or a single tile."""
    caps = caps_of("a100")                                     # 108 SMs
    cores = caps.cores_total

    def cost(bh, tiles, chunk):
        return -(-bh * -(-tiles // chunk) // cores) * (chunk + 1)

    for heads, kv in ((12, 1025), (32, 1025), (12, 4097), (1, 200), (3, 64 * 40), (50, 64 * 9)):
        n, chunk = kv_splits(caps, 1, heads, 1, kv, 64)
        tiles = -(-kv // 64)
        assert n >= 2 and chunk >= 1 and (n - 1) * chunk < tiles <= n * chunk
        assert cost(heads, tiles, chunk) == min(cost(heads, tiles, c) for c in range(1, tiles + 1)) < tiles + 1
    assert kv_splits(caps, 1, 12, 1, 1025, 64) == (9, 2)        # GPT-2 small decode: 108 blocks
    assert kv_splits(caps, 1, 32, 1, 1025, 64) == (3, 6)        # llama2-7b decode: 96 blocks
    assert kv_splits(caps, 1, 100, 1, 64 * 9, 64) == (1, 9)     # 2 splits: 200 blocks, 2 waves of 5 tiles
    assert kv_splits(caps, 8, 12, 1, 1025, 64) == (1, 17)       # gpt2-small decode, batch 8: 96 blocks
    assert kv_splits(caps, 4, 32, 1, 4096, 64)[0] == 1          # 128 blocks >= 108 SMs
    assert split_kv_attention_kernel(caps, 4, 32, 1, 4096, 64) is None
    assert split_kv_attention_kernel(caps, 1, 12, BR + 1, 1025, 64) is None
    assert split_kv_attention_kernel(caps, 1, 12, 1, 60, 64) is None    # one tile
    with pytest.raises(InputError, match="q_len"):
        split_kv_attention_kernel(caps, 1, 12, BR + 1, 1025, 64, splits=4)
    with pytest.raises(InputError, match="splits"):
        split_kv_attention_kernel(caps, 1, 12, 1, 1025, 64, splits=0)


def test_block_composer_picks_split_kv_for_decode_and_keeps_the_flops():
    from archsim.config import capabilities
    from archsim.workloads.emit.block import emit_block
    from archsim.workloads.model import load_workload

    m = load_machine("a100")
    for name, heads in (("gpt2-small", 12), ("llama2-7b", 32)):
        wl = load_workload(name, {"phase": "decode", "batch": 1, "seq": 1024, "layers": 1})
        ks = [k for k in emit_block(capabilities(m), wl) if k.op == "attn"]
        assert [k.name for k in ks] == ["attn.kv_append", "attn.split", "attn.combine"]
        op = next(o for o in wl.block_ops() if o.name == "attn")
        split, comb = ks[1], ks[2]
        assert split.flops == op.flops and split.model_flops == op.model_flops and comb.model_flops == 0
        assert 0 < comb.flops < op.flops // 10
        assert split.launch.grid[1:] == (heads, 1) and split.launch.grid[0] >= 2
        # prefill keeps the whole-row kernel
        pre = load_workload(name, {"phase": "prefill", "batch": 1, "seq": 1024, "layers": 1})
        assert [k.name for k in emit_block(capabilities(m), pre) if k.op == "attn"] == ["attn"]


def check_functional_split_decode(capsys, tmp_path, *argv):
    """`archsim run --workload tiny --phase decode --mode functional` with ``argv`` (machine, cache
    length): the composer split the cache, and attn and the whole block match numpy."""
    import json

    from test_cli import cli

    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "run", "--workload", "tiny", "--phase", "decode", "--mode", "functional", *argv,
                          "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    names = [k["name"] for k in doc["kernels"]]
    assert "attn.split" in names and "attn.combine" in names and "attn" not in names
    assert doc["passed"] and doc["block_verification"]["passed"]
    assert all(k["verification"]["passed"] for k in doc["kernels"])


def test_functional_decode_block_with_split_kv(capsys, tmp_path):
    """tiny-gpu with 8 SMs and a 101-row cache: 2 heads cannot fill it, so the block composer
    splits the cache; the functional run checks attn (and the whole block) against numpy."""
    check_functional_split_decode(capsys, tmp_path, "--hw", "tiny-gpu", "--seq", "100", "--set", "cores.per_group=8")


def test_a100_split_kv_decode_is_faster_and_streams_more():
    """GPT-2 small's decode attention shape (12 heads, d 64, 1025 cached keys) on a100: split-KV
    (204 blocks + combine) against the whole-row kernel (12 blocks on 108 SMs)."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("a100")
    caps = capabilities(m)
    full = flash_attention_kernel(caps, 1, 12, 1, 1025, 64, causal=True)
    nb = full.buffer_bytes()
    rf = time_kernel(full.program, m, full.launch, full.args(*(Unbacked(nb[n]) for n in "QKVO")))
    sk = split_kv_attention_kernel(caps, 1, 12, 1, 1025, 64, causal=True)
    nb = sk.buffer_bytes()
    args = sk.args(*(Unbacked(nb[n]) for n in ("Q", "K", "V", "O", "Opart", "LSEpart")))
    rs = [time_kernel(p.program, m, p.launch, sk.part_args(p, args)) for p in sk.parts]

    def dram(r):
        return r.memory["bytes"]["dram_read"] + r.memory["bytes"]["dram_write"]

    split_cycles = sum(r.cycles for r in rs)
    assert split_cycles < 0.5 * rf.cycles, (split_cycles, rf.cycles)
    # the split kernel reads the same K / V bytes at more than twice the rate
    assert dram(rs[0]) / rs[0].cycles > 2 * dram(rf) / rf.cycles
    assert dram(rs[0]) < 1.05 * dram(rf)
