"""The persistent ping-pong GEMM on h100 (issue 48 item 4, CUTLASS 3's KernelTmaWarpSpecializedPingpong):
numbers against numpy and bit for bit against the TMA kernel, persistent blocks over many tiles,
on clusters of two sharing B, both functional engines, its refusals, and a timing run's copies."""

import numpy as np
import pytest

import archsim.workloads.emit.gemm_gpu as G
from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.functional import run_functional
from archsim.engine.launch import Unbacked
from archsim.engine.timing import time_kernel
from archsim.errors import InputError
from archsim.isa.program import Launch
from archsim.workloads.emit import gemm_kernel


@pytest.fixture(scope="module")
def h100():
    return load_machine("h100")


@pytest.fixture(scope="module")
def caps(h100):
    return capabilities(h100)


def run(g, blocks=None, engine="numba", seed=1):
    """C and numpy's product; ``blocks``: a persistent grid of that many blocks instead of the launch's."""
    A, B, C = g.random_inputs(seed)
    launch = g.launch if blocks is None else Launch((blocks, 1, g.launch.grid[2]), g.launch.block)
    r = run_functional(g.program, g.args(A, B, C), launch, warp_width=32, engine=engine)
    return g.view("C", r.output("C")), g.reference(A, B)


@pytest.mark.parametrize("tile", [(128, 128), (64, 256), (128, 64)])
@pytest.mark.parametrize("shape,blocks", [
    (dict(M=384, N=512, K=200), 3),                 # 12 or more tiles on 3 blocks: each warpgroup 2+ tiles
    (dict(M=300, N=520, K=72, out="f16"), 2),       # edge rows and columns, K residue of 8, f16 out
    (dict(M=256, N=512, K=128, trans_b=True), 1),   # B^T; one block takes every tile
])
def test_the_pingpong_kernel_computes_the_product(caps, monkeypatch, tile, shape, blocks):
    monkeypatch.setattr(G, "PINGPONG_TILES", (tile,))
    kw = dict(shape)
    M, N, K, out = kw.pop("M"), kw.pop("N"), kw.pop("K"), kw.pop("out", "f32")
    g = gemm_kernel(caps, M, N, K, "fp16", out, kernel="tma_pingpong", **kw)
    tiles = -(-M // tile[0]) * -(-N // tile[1])
    assert g.pingpong and g.kind == "tma" and g.tile[:2] == tile and g.tile.warps == 9
    assert g.launch.grid == (min(tiles, caps.cores_total), 1, 1) and g.launch.block == (288, 1, 1)
    got, want = run(g, blocks)
    tol = 1e-3 if out == "f32" else 2e-2
    assert np.allclose(got, want, rtol=tol, atol=tol)
    # the same wgmma in the same k order as the TMA kernel of the same tile: the same bits
    monkeypatch.setattr(G, "WGMMA_TILES", (tile,))
    t = gemm_kernel(caps, M, N, K, "fp16", out, kernel="tma", **kw)
    assert np.array_equal(run(t)[0], got)


@pytest.mark.parametrize("tile", [(128, 128), (64, 256)])
@pytest.mark.parametrize("shape,blocks", [
    (dict(M=384, N=512, K=200), 4),                 # 2 clusters over pairs of M tiles
    (dict(M=300, N=520, K=72), 2),                  # the last pair's second tile past M: zeros, not stored
    (dict(M=130, N=256, K=64, trans_b=True), 2),    # B^T halves; one k tile a tile: the producers' tails
])
def test_the_pingpong_kernel_on_clusters_of_two(caps, monkeypatch, tile, shape, blocks):
    monkeypatch.setattr(G, "PINGPONG_TILES", (tile,))
    kw = dict(shape)
    M, N, K = kw.pop("M"), kw.pop("N"), kw.pop("K")
    g = gemm_kernel(caps, M, N, K, "fp16", "f32", kernel="tma_pingpong_multicast", **kw)
    pairs = -(-M // (2 * tile[0])) * -(-N // tile[1])
    assert g.pingpong and g.cluster == 2 == g.launch.cluster and g.launch.grid == (2 * pairs, 1, 1)
    A, B, C = g.random_inputs(1)
    r = run_functional(g.program, g.args(A, B, C), Launch((blocks, 1, 1), g.launch.block, cluster=2),
                       warp_width=32)
    got = g.view("C", r.output("C"))
    assert np.allclose(got, g.reference(A, B), rtol=1e-3, atol=1e-3)
    monkeypatch.setattr(G, "WGMMA_TILES", (tile,))
    assert np.array_equal(run(gemm_kernel(caps, M, N, K, "fp16", "f32", kernel="tma", **kw))[0], got)


@pytest.mark.parametrize("out,ldc,c_tma", [("f16", 264, True), ("f16", 260, False), ("f32", 260, True),
                                            ("f32", 258, False)])
def test_c_leaves_by_bulk_stores_where_its_layout_takes_them(caps, monkeypatch, out, ldc, c_tma):
    # rows of C a multiple of 16 bytes: each warp's boxes through its own buffers (edge tiles: the unit
    # skips what lies past C); otherwise stores from registers; the same bits either way
    monkeypatch.setattr(G, "PINGPONG_TILES", ((128, 128),))
    g = gemm_kernel(caps, 200, 256, 128, "fp16", out, kernel="tma_pingpong", ldc=ldc)
    assert g.c_tma == c_tma and ("mapC" in g.args(*g.random_inputs(0))) == c_tma
    assert g.program.shared_bytes == g.tile.stages * 256 * 128 + c_tma * G.PP_EPI_BYTES + 16 * g.tile.stages + 16
    got, want = run(g, 1)
    tol = 1e-3 if out == "f32" else 2e-2
    assert np.allclose(got, want, rtol=tol, atol=tol)
    monkeypatch.setattr(G, "WGMMA_TILES", ((128, 128),))
    assert np.array_equal(run(gemm_kernel(caps, 200, 256, 128, "fp16", out, kernel="tma", ldc=ldc))[0], got)


def test_batches_and_the_reference_engine(caps, monkeypatch):
    # a (2, 1) batch in grid z, 64 x 64 tiles: 4 a matrix on one block, two a warpgroup; the pure-Python
    # engine gives the same bits
    monkeypatch.setattr(G, "PINGPONG_TILES", ((64, 64),))
    g = gemm_kernel(caps, 128, 128, 96, "bf16", "f32", kernel="tma_pingpong", batch=(2, 1),
                    stride_a=(128 * 96, 0), stride_b=(96 * 128, 0), stride_c=(128 * 128, 0))
    assert g.launch.grid == (4, 1, 2)
    got, want = run(g, 1)
    assert np.allclose(got, want, rtol=1e-3, atol=1e-3)
    assert np.array_equal(run(g, 1, engine="reference")[0], got)


def test_the_pingpong_kernel_is_refused_where_it_cannot_run(caps):
    a100 = capabilities(load_machine("a100"))
    with pytest.raises(InputError, match="tensor.wgmma"):
        gemm_kernel(a100, 256, 256, 256, "fp16", kernel="tma_pingpong")
    no_tma = capabilities(load_machine("h100").model_copy(update={"tma": None}))
    with pytest.raises(InputError, match="the tma kernel"):
        gemm_kernel(no_tma, 256, 256, 256, "fp16", kernel="tma_pingpong")
    with pytest.raises(InputError, match="no tma tile fits"):     # rows of 100 halves: 200 bytes
        gemm_kernel(caps, 256, 256, 100, "fp16", kernel="tma_pingpong")
    with pytest.raises(InputError, match="a tile with kernel tma_pingpong"):
        gemm_kernel(caps, 256, 256, 256, "fp16", tile=G.Tile(128, 128, 64, 4, 3), kernel="tma_pingpong")
    no_clusters = capabilities(load_machine("h100").model_copy(update={"clusters": None}))
    with pytest.raises(InputError, match="a machine with tma and clusters"):
        gemm_kernel(no_clusters, 256, 256, 256, "fp16", kernel="tma_pingpong_multicast")


def test_a_timing_run_copies_every_tile_once(h100, caps, monkeypatch):
    # 512 x 512 x 192 in 128 x 128 tiles on 3 persistent blocks: 16 tiles x 3 k tiles, each an A box
    # and two B panels; C by plain stores, every tile once
    monkeypatch.setattr(G, "PINGPONG_TILES", ((128, 128),))
    g = gemm_kernel(caps, 512, 512, 192, "fp16", "f32", kernel="tma_pingpong")
    sizes = g.buffer_bytes()
    t = time_kernel(g.program, h100, Launch((3, 1, 1), g.launch.block),
                    g.args(*(Unbacked(sizes[k]) for k in "ABC")))
    tma = t.memory["tma"]
    assert tma["copies"] == 16 * 3 * 3 == tma["copies_landed"]
    assert tma["box_bytes"] == 16 * 3 * 256 * 128 and t.flops == 2 * 512 * 512 * 192
    # C by bulk stores: a consumer warp's 2 halves x 4 box columns of 16 rows x 128 bytes a tile
    assert g.c_tma and tma["stores"] == 16 * 4 * 8 and tma["store_bytes"] == 512 * 512 * 4
    # on clusters of two (2 clusters): each k tile of a pair brings two A boxes and one B panel's
    # halves, where the single blocks bring two panels: 3/4 of the line requests
    m = gemm_kernel(caps, 512, 512, 192, "fp16", "f32", kernel="tma_pingpong_multicast")
    tm = time_kernel(m.program, h100, Launch((4, 1, 1), m.launch.block, cluster=2),
                     m.args(*(Unbacked(sizes[k]) for k in "ABC")))
    assert tm.memory["tma"]["copies_landed"] == 16 * 3 * 3 and tm.flops == t.flops
    assert 4 * tm.memory["tma"]["requests"] == 3 * tma["requests"]
