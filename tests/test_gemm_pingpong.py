"""The persistent ping-pong GEMM on h100 (issue 48 item 4, CUTLASS 3's KernelTmaWarpSpecializedPingpong):
numbers against numpy and bit for bit against the TMA kernel, persistent blocks over many tiles,
on clusters of two sharing B, both functional engines, its refusals, and a timing run's copies."""

import dataclasses
import re

import numpy as np
import pytest

import archsim.workloads.emit.gemm_gpu as G
from archsim.config import load_machine
from archsim.config.derived import capabilities
from archsim.engine.functional import run_functional
from archsim.engine.launch import Unbacked
from archsim.engine.timing import time_kernel
from archsim.errors import InputError
from archsim.isa.asm import disassemble
from archsim.isa.program import Launch
from archsim.workloads.emit import gemm_kernel


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
    with pytest.raises(InputError, match="the tma_pingpong kernel"):
        gemm_kernel(no_tma, 256, 256, 256, "fp16", kernel="tma_pingpong")
    with pytest.raises(InputError, match="no tma tile fits"):     # rows of 100 halves: 200 bytes
        gemm_kernel(caps, 256, 256, 100, "fp16", kernel="tma_pingpong")
    with pytest.raises(InputError, match="a tile with kernel tma_pingpong"):
        gemm_kernel(caps, 256, 256, 256, "fp16", tile=G.Tile(128, 128, 64, 4, 3), kernel="tma_pingpong")
    no_clusters = capabilities(load_machine("h100").model_copy(update={"clusters": None}))
    with pytest.raises(InputError, match="the tma_pingpong_multicast kernel .a machine with tma and clusters"):
        gemm_kernel(no_clusters, 256, 256, 256, "fp16", kernel="tma_pingpong_multicast")


def test_a_timing_run_copies_every_tile_once(h100, caps, monkeypatch):
    # 512 x 512 x 192 in 128 x 128 tiles on 3 persistent blocks: 16 tiles x 3 k tiles, each an A box
    # and two B panels; every tile once
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


def test_the_turn_passes_after_the_main_loop(h100, caps, monkeypatch):
    # one block, 8 tiles of 128 x 128 x 128: a warpgroup's epilogue runs beside the other's main loop,
    # against the same kernel handing the turn over only after its epilogue
    monkeypatch.setattr(G, "PINGPONG_TILES", ((128, 128),))
    g = gemm_kernel(caps, 512, 256, 128, "fp16", "f32", kernel="tma_pingpong")
    cfg = G._Cfg("tma", "fp16", "f32", False, 128, 128, 4, 1, g.tile.stages, 16, 16, 128, c_tma=g.c_tma,
                 pingpong=True)
    assert G._emit_wgmma_pingpong(cfg) == g.program
    sizes = g.buffer_bytes()
    cycles = {}
    for overlap in (True, False):
        prog = G._emit_wgmma_pingpong(dataclasses.replace(cfg, pp_overlap=overlap))
        cycles[overlap] = time_kernel(prog, h100, Launch((1, 1, 1), g.launch.block),
                                      g.args(*(Unbacked(sizes[k]) for k in "ABC"))).cycles
    assert cycles[True] < 0.9 * cycles[False]


@pytest.mark.parametrize("out", ["f32", "f16"])
@pytest.mark.parametrize("tile", G.PINGPONG_TILES)
def test_no_epilogue_buffer_is_rewritten_before_its_store_read_it(caps, monkeypatch, tile, out):
    # the epilogue's waits and stores, tile after tile: before a warp writes a buffer, no store still
    # pending after the wait reads that buffer (an odd box count a tile shifts the buffers' parity)
    monkeypatch.setattr(G, "PINGPONG_TILES", (tile,))
    g = gemm_kernel(caps, 512, 512, 128, "fp16", out, kernel="tma_pingpong")
    assert g.c_tma
    text = disassemble(g.program)
    body = text[:text.index("CDONE:")]
    steps = re.findall(r"cp\.async\.bulk\.(wait_group \d+|commit_group)|cp\.async\.bulk\.tensor\.4d\.store "
                       r"\[r\d+(?:\+(\d+))?\]", body)
    assert steps and len(steps) % 3 == 0
    groups, stores = [], []                       # committed groups' buffers; stores not yet committed
    for i, (op, buf) in enumerate(steps * 3):     # three tiles in a row
        if not op:                                # a store from buffer offset buf
            stores.append(int(buf or 0))
        elif op == "commit_group":
            groups.append(stores)
            stores = []
        else:                                     # wait_group n: then the next store's box is written
            n = int(op.split()[1])
            groups = groups[len(groups) - n:] if n else []
            nxt = next(b for o, b in (steps * 4)[i + 1:] if not o)
            assert int(nxt or 0) not in [b for grp in groups for b in grp]


@pytest.mark.parametrize("kernel,out,alpha", [("tma_pingpong", "bf16", 0.5), ("tma_pingpong_multicast", "f32", 2.0)])
def test_alpha_bf16_and_the_default_launch(caps, kernel, out, alpha):
    # the rule's tile and launch (one tile a block here: warpgroup 1 idles), alpha before the stores
    g = gemm_kernel(caps, 256, 384, 192, "bf16", out, kernel=kernel, alpha=alpha)
    assert g.launch.grid[0] == -(-256 // (g.cluster * g.tile.BM)) * -(-384 // g.tile.BN) * g.cluster
    got, want = run(g)
    assert np.allclose(G.to_float(got, out), want, rtol=2e-2, atol=2e-2)
    # and from registers (rows of C not a multiple of 16 bytes)
    r = gemm_kernel(caps, 256, 384, 192, "bf16", out, kernel=kernel, alpha=alpha, ldc=386)
    assert not r.c_tma
    assert np.array_equal(run(r)[0].reshape(got.shape), got)


def test_micro_gemm_runs_and_names_the_kernels_and_stores_f16(h100):
    from archsim.micro import run_micro

    for kernel in ("tma_pingpong", "tma_pingpong_multicast"):
        r = run_micro("gemm", h100, {"m": "256", "n": "256", "k": "128", "kernel": kernel})
        assert r.extra["kernel"] == kernel and r.extra["warps"] == 9 and 0 < r.extra["share_of_peak"] < 1
    with pytest.raises(InputError, match="tma_pingpong or tma_pingpong_multicast"):
        run_micro("gemm", h100, {"kernel": "pingpong"})
    # C in the inputs' own 16-bit type: half the bytes stored
    r = run_micro("gemm", h100, {"m": "256", "n": "256", "k": "128", "kernel": "tma_pingpong", "out": "f16"})
    assert r.kernels[0]["tma"]["store_bytes"] == 256 * 256 * 2
    with pytest.raises(InputError, match="--param out: 'bf16' with dtype fp16 .f32 or f16."):
        run_micro("gemm", h100, {"out": "bf16"})
    with pytest.raises(InputError, match="--param out: 'f16' on tiny-sunway"):
        run_micro("gemm", load_machine("tiny-sunway"), {"out": "f16"})
