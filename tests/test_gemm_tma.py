"""The TMA-fed, warp-specialized wgmma GEMM on h100 (issue 48 item 4): numbers against numpy and
bit for bit against the cp.async wgmma kernel, its refusals, and its copies in a timing run."""

import numpy as np
import pytest

import archsim.workloads.emit.gemm_gpu as G
from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.functional import run_functional
from archsim.engine.launch import Unbacked
from archsim.engine.timing import time_kernel
from archsim.errors import InputError
from archsim.workloads.emit import gemm_kernel


@pytest.fixture(scope="module")
def caps(h100):
    return capabilities(h100)


def run(g, seed=1):
    A, B, C = g.random_inputs(seed)
    r = run_functional(g.program, g.args(A, B, C), g.launch, warp_width=32)
    return g.view("C", r.output("C")), g.reference(A, B)


@pytest.mark.parametrize("shape", [
    dict(M=128, N=256, K=128),
    dict(M=200, N=304, K=72),                       # edge rows and columns, K residue of 8
    dict(M=136, N=264, K=88, trans_b=True),
])
def test_the_tma_kernel_computes_the_product(caps, shape):
    kw = dict(shape)
    M, N, K = kw.pop("M"), kw.pop("N"), kw.pop("K")
    g = gemm_kernel(caps, M, N, K, "fp16", "f32", kernel="tma", **kw)
    assert g.kind == "tma" and g.launch.block[0] == 32 * g.tile.warps == 32 * (g.tile.BM // 16 + 1)
    got, want = run(g)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)
    # the same wgmma in the same order as the cp.async kernel: the same bits
    w = gemm_kernel(caps, M, N, K, "fp16", "f32", kernel="wgmma", **kw)
    if w.tile[:2] == g.tile[:2]:
        assert np.array_equal(run(w)[0], got)


def test_the_large_tile_with_batches_and_strides(caps, monkeypatch):
    # 128 x 256 tiles (two consumer warpgroups, B in four 64-column boxes), a (2, 3) batch of
    # matrices inside wider rows: the maps' 4 dimensions
    monkeypatch.setattr(G, "WGMMA_TILES", ((128, 256),))
    g = gemm_kernel(caps, 128, 256, 64, "bf16", "f32", kernel="tma", batch=(2, 3), lda=64 * 3,
                    stride_a=(128 * 64 * 3, 64), ldb=256, stride_b=(3 * 256 * 64, 256 * 64),
                    stride_c=(3 * 128 * 256, 128 * 256))
    assert g.tile[:2] == (128, 256) and g.launch.grid == (1, 1, 6)
    got, want = run(g)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_the_tma_kernel_is_refused_where_it_cannot_run(caps):
    a100 = capabilities(load_machine("a100"))
    with pytest.raises(InputError, match="tensor.wgmma"):
        gemm_kernel(a100, 256, 256, 256, "fp16", kernel="tma")
    with pytest.raises(InputError, match="no tma tile fits"):     # rows of 100 halves: 200 bytes
        gemm_kernel(caps, 256, 256, 100, "fp16", kernel="tma")
    with pytest.raises(InputError, match="no tma tile fits"):     # K below one box of 64
        gemm_kernel(caps, 256, 256, 32, "fp16", kernel="tma")
    with pytest.raises(InputError, match="a tile with kernel tma"):
        gemm_kernel(caps, 256, 256, 256, "fp16", tile=G.Tile(128, 128, 64, 4, 3), kernel="tma")
    with pytest.raises(InputError, match="mma, wgmma, tma, tma_multicast, tma_pingpong or tma_pingpong_multicast"):
        gemm_kernel(caps, 256, 256, 256, "fp16", kernel="tmaa")
    no_clusters = capabilities(load_machine("h100").model_copy(update={"clusters": None}))
    with pytest.raises(InputError, match="the tma_multicast kernel .a machine with tma and clusters"):
        gemm_kernel(no_clusters, 256, 256, 256, "fp16", kernel="tma_multicast")


def test_its_copies_in_a_timing_run(h100, caps):
    # 256 x 256 x 128 in 64 x 64 tiles: 16 blocks x 2 k tiles, each an A box and one B panel of
    # 64 rows of 128 bytes: 64 copies, 4096 line requests of whole lines
    g = gemm_kernel(caps, 256, 256, 128, "fp16", "f32", kernel="tma")
    assert g.tile[:2] == (64, 64)
    sizes = g.buffer_bytes()
    t = time_kernel(g.program, h100, g.launch, g.args(*(Unbacked(sizes[k]) for k in "ABC")))
    tma = t.memory["tma"]
    assert tma["copies"] == 64 == tma["copies_landed"]
    assert tma["requests"] == 16 * 2 * 128 and tma["request_bytes"] == 128 * tma["requests"]
    assert tma["box_bytes"] == 64 * 64 * 128         # 64 copies of 64 rows of 128 bytes
    assert t.flops == 2 * 256 * 256 * 128
    # C by bulk tensor stores: each block's 64 x 64 f32 tile as two boxes of 64 rows x 128 bytes
    assert g.c_tma and tma["stores"] == 32 and tma["store_bytes"] == 256 * 256 * 4
    assert tma["store_requests"] == 32 * 64


# ------------------------------------------------------------------------- on clusters of two, B by multicast
@pytest.mark.parametrize("shape", [
    dict(M=192, N=256, K=192),                      # 3 M tiles: the last pair's second block is past M
    dict(M=200, N=304, K=72),                       # edge rows and columns, K residue of 8
    dict(M=136, N=264, K=88, trans_b=True),         # B^T in two half boxes, one a block
    dict(M=128, N=128, K=64, trans_b=True),         # one k tile: each producer's tail
])
def test_the_multicast_kernel_computes_the_product(caps, shape):
    kw = dict(shape)
    M, N, K = kw.pop("M"), kw.pop("N"), kw.pop("K")
    g = gemm_kernel(caps, M, N, K, "fp16", "f32", kernel="tma_multicast", **kw)
    pairs = -(-M // (2 * g.tile.BM))
    assert g.kind == "tma" and g.cluster == 2 and g.launch.cluster == 2
    assert g.launch.grid == (2 * pairs * -(-N // g.tile.BN), 1, 1)
    got, want = run(g)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)
    t = gemm_kernel(caps, M, N, K, "fp16", "f32", kernel="tma", **kw)
    if t.tile[:2] == g.tile[:2]:                    # the same wgmma in the same order: the same bits
        assert np.array_equal(run(t)[0], got)


def test_the_multicast_kernel_with_large_tiles_and_batches(caps, monkeypatch):
    # 128 x 256 tiles: B in four boxes, two a block; a (2, 3) batch inside wider rows
    monkeypatch.setattr(G, "WGMMA_TILES", ((128, 256),))
    g = gemm_kernel(caps, 256, 256, 64, "bf16", "f32", kernel="tma_multicast", batch=(2, 3), lda=64 * 3,
                    stride_a=(256 * 64 * 3, 64), ldb=256, stride_b=(3 * 256 * 64, 256 * 64),
                    stride_c=(3 * 256 * 256, 256 * 256))
    assert g.tile[:2] == (128, 256) and g.launch.grid == (2, 1, 6)
    got, want = run(g)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_the_multicast_kernel_reads_b_once_a_pair(h100, caps):
    # 256 x 256 x 128 in 64 x 64 tiles, pairs of M tiles: each k tile of a pair brings two A boxes
    # and one B panel, its halves multicast one by each block, where the tma kernel brings two
    # panels: 3/4 of its line requests
    sizes = {}
    got = {}
    for kernel in ("tma", "tma_multicast"):
        g = gemm_kernel(caps, 256, 256, 128, "fp16", "f32", kernel=kernel)
        assert g.tile[:2] == (64, 64)
        sizes = g.buffer_bytes()
        got[kernel] = time_kernel(g.program, h100, g.launch, g.args(*(Unbacked(sizes[k]) for k in "ABC")))
    uni, mc = got["tma"].memory["tma"], got["tma_multicast"].memory["tma"]
    assert uni["copies"] == 64 and mc["copies"] == 64 == mc["copies_landed"]
    assert mc["requests"] == 16 * 2 * 96 and 4 * mc["requests"] == 3 * uni["requests"]
    assert got["tma_multicast"].flops == got["tma"].flops


@pytest.mark.parametrize("out,ldc,c_tma", [("f16", 264, True), ("f16", 260, False), ("f32", 260, True),
                                            ("f32", 258, False)])
def test_c_leaves_by_bulk_tensor_stores_where_its_layout_takes_them(caps, out, ldc, c_tma):
    # rows of C a multiple of 16 bytes: the TMA epilogue (edge tiles: the unit skips what lies past
    # C); otherwise the wgmma kernel's epilogue; the same bits either way
    g = gemm_kernel(caps, 200, 256, 128, "fp16", out, kernel="tma", ldc=ldc)
    assert g.c_tma == c_tma and ("mapC" in g.args(*g.random_inputs(0))) == c_tma
    got, want = run(g)
    tol = 1e-3 if out == "f32" else 2e-2
    assert np.allclose(got, want, rtol=tol, atol=tol)
    w = gemm_kernel(caps, 200, 256, 128, "fp16", out, kernel="wgmma", ldc=ldc)
    if w.tile[:2] == g.tile[:2]:
        assert np.array_equal(run(w)[0], got)


def test_the_multicast_kernel_with_plain_stores_and_an_odd_pair(caps):
    # rows of C of 258 f32 (1032 bytes): no bulk stores; 3 M tiles: the last pair's second block
    # lies past M and stores nothing
    g = gemm_kernel(caps, 192, 256, 128, "fp16", "f32", kernel="tma_multicast", ldc=258)
    assert not g.c_tma and g.cluster == 2 and g.tile[:2] == (64, 64)
    got, want = run(g)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)
