"""Split-K for skinny GEMMs (decode): the slicing rule, the block composition (a batched GEMM of
f32 partial sums and their chunk sum), functional checks against numpy, and the time it saves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.workloads.emit import gemm_gpu as gg
from archsim.workloads.emit.elementwise_gpu import chunk_sum_kernel
from archsim.workloads.emit.common import SPLIT_K_ALIGN, SPLIT_K_MIN
from archsim.workloads.emit.gemm_gpu import gemm_kernel, split_k


@pytest.mark.parametrize("M,N,K,want", [
    (1, 5376, 14336, 2),    # BLOOM's QKV at TP 8: 84 column tiles for 108 SMs -> 168 blocks
    (1, 768, 768, 1),       # GPT-2's proj: 24 tiles, but a reduction costs what slices would save
    (8, 768, 3072, 6),      # GPT-2's ffn2 at batch 8
    (1, 14336, 7168, 1),    # 224 tiles fill the SMs already
    (65, 768, 768, 1),      # not skinny
    (1, 768, 200, 1),       # too short a K to slice
])
def test_split_k_fills_the_cores_with_whole_k_tiles(M, N, K, want):
    caps = capabilities(load_machine("a100"))
    s = split_k(caps, M, N, K, "fp16")
    assert s == want
    if s > 1:
        tiles = np.prod(gemm_kernel(caps, M, N, K, "fp16", "f32").launch.grid)
        assert K % s == 0 and (K // s) % SPLIT_K_ALIGN == 0 and K // s >= SPLIT_K_MIN
        assert tiles * s >= caps.cores_total or K // (s + 1) < SPLIT_K_MIN


def test_chunk_sum_adds_the_partials():
    from archsim.engine.functional import run_functional

    caps = capabilities(load_machine("tiny-gpu"))
    n, chunks = 1000, 5
    k = chunk_sum_kernel(caps, n, chunks, "fp16")
    ws = np.random.default_rng(1).standard_normal((chunks, n)).astype(np.float32)
    y = np.zeros(n, np.float16)
    res = run_functional(k.program, k.args(ws=ws, y=y), k.launch, warp_width=caps.warp_width, ncores=caps.cores_total)
    got = res.output("y").astype(np.float64)
    np.testing.assert_allclose(got, ws.astype(np.float64).sum(0), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("phase,ops", [("decode", {"ffn2"}), ("train", {"ffn2", "ffn1.dgrad"})])
def test_functional_block_with_split_k(capsys, tmp_path, phase, ops):
    """tiny-gpu with 8 SMs and the tiny model's FFN widened to 2048: the skinny GEMMs over that K
    whose tiles leave SMs idle are split along K; every kernel and the whole block match numpy."""
    import yaml

    from test_cli import cli

    from archsim.workloads.model import load_workload

    wl = load_workload("tiny").model_dump(mode="json")
    wl["model"]["ffn_hidden"] = 2048
    wf = tmp_path / "wide.yaml"
    wf.write_text(yaml.safe_dump(wl))
    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "run", "--hw", "tiny-gpu", "--set", "cores.per_group=8", "--workload", str(wf),
                          "--phase", phase, "--mode", "functional", "--workers", "1", "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    names = [k["name"] for k in doc["kernels"]]
    for op in ops:
        assert f"{op}.partial" in names and f"{op}.reduce" in names and op not in names, names
    assert doc["passed"] and doc["block_verification"]["passed"]
    assert all(k["verification"]["passed"] for k in doc["kernels"])


def test_a100_split_k_decode_gemm_is_faster():
    """GPT-2 small's ffn2 in decode (batch 8: 8 x 768 x 3072) on a100: 24 blocks for 108 SMs
    unsplit; six slices of K (144 blocks) and their chunk sum take less time."""
    from archsim.engine.timing import Unbacked, time_kernel

    m = load_machine("a100")
    caps = capabilities(m)
    M, N, K = 8, 768, 3072
    whole = gemm_kernel(caps, M, N, K, "fp16", "f16")
    t_whole = time_kernel(whole.program, m, whole.launch,
                          whole.args(Unbacked(M * K * 2), Unbacked(K * N * 2), Unbacked(M * N * 2))).cycles
    S = split_k(caps, M, N, K, "fp16")
    ks = K // S
    part = gemm_kernel(caps, M, N, ks, "fp16", "f32", lda=K, ldb=N, ldc=N, batch=(S, 1), stride_a=(ks, 0),
                       stride_b=(ks * N, 0), stride_c=(M * N, 0))
    t_part = time_kernel(part.program, m, part.launch,
                         part.args(Unbacked(M * K * 2), Unbacked(K * N * 2), Unbacked(S * M * N * 4))).cycles
    red = chunk_sum_kernel(caps, M * N, S, "fp16")
    t_red = time_kernel(red.program, m, red.launch, red.args(ws=Unbacked(S * M * N * 4), y=Unbacked(M * N * 2))).cycles
    assert np.prod(part.launch.grid) == S * np.prod(whole.launch.grid) >= caps.cores_total
    assert t_part + t_red < t_whole, (t_part, t_red, t_whole)


def test_the_gemm_module_names_split_k():
    assert "split_k" in gg.__all__
