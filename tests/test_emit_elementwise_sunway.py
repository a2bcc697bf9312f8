"""The Sunway elementwise / row-reduction emitter (archsim.workloads.emit.elementwise_sunway) and
the Sunway KV append (kvcache_sunway): functional runs on tiny-sunway (32 CPEs, 64 KiB LDM: grids
are capped, CPEs loop over chunks; long rows are streamed in column chunks) against the GPU
module's float64 references, with the GPU tests' tolerances (the math is the same f32 math).

Tolerance: |got - ref| <= rtol*|ref| + atol*max(1, max|ref|), rtol fp32 1e-5, fp16 1e-3, bf16 8e-3,
atol 1e-5 (see tests/test_emit_elementwise.py for why).
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.opcodes import opcodes
from archsim.workloads.emit import elementwise_gpu as G
from archsim.workloads.emit import elementwise_sunway as E
from archsim.workloads.emit.gemm_gpu import to_float, to_host

TOL = {"fp32": (1e-5, 1e-5), "fp16": (1e-3, 1e-5), "bf16": (8e-3, 1e-5), "u8": (0.0, 0.0)}
_CAPS = {}


def caps_of(hw: str):
    if hw not in _CAPS:
        _CAPS[hw] = capabilities(load_machine(hw))
    return _CAPS[hw]


def run(k, caps, seed=0):
    """Run a kernel (or a chain, kernel by kernel on shared buffers); return (outputs, reference)."""
    from archsim.engine.functional import run_functional

    bufs = k.random_inputs(seed)
    ref = k.reference(**bufs)
    kernels = k.kernels if isinstance(k, E.KernelChain) else (k,)
    for i, kk in enumerate(kernels):
        a = k.args_for(i, **bufs) if isinstance(k, E.KernelChain) else k.args(**bufs)
        res = run_functional(kk.program, a, kk.launch, warp_width=caps.warp_width, ncores=caps.cores_total)
        for b in kk.outputs:
            bufs[b.name] = res.output(b.name)
    return {b.name: to_float(bufs[b.name], b.dtype) for b in k.buffers if b.out and not b.scratch}, ref


def compare(k, caps, seed=0):
    got, ref = run(k, caps, seed)
    assert set(got) == set(ref)
    for b in k.buffers:
        if not b.out or b.scratch:
            continue
        rtol, atol = TOL[b.dtype]
        g, r = got[b.name], np.asarray(ref[b.name], np.float64)
        assert g.shape == r.shape, (b.name, g.shape, r.shape)
        err = np.abs(g - r)
        bad = ~(err <= rtol * np.abs(r) + atol * max(1.0, float(np.abs(r).max())))
        assert not bad.any(), (f"{k.op} {b.name}: {int(bad.sum())} of {bad.size} bad, first at "
                               f"{np.argwhere(bad)[0]}: got {g[tuple(np.argwhere(bad)[0])]}, "
                               f"want {r[tuple(np.argwhere(bad)[0])]}; max err {float(err.max()):.3g}")
    return got, ref


def _ids(cases):
    return [f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" + "".join(f"-{k}{v}" for k, v in c[4].items()) for c in cases]


def _mnemonics(prog):
    return [opcodes()[int(o)].mnemonic for o in prog.op]


# ----------------------------------------------------------------------------- softmax
# (hw, rows, cols, dtype, kwargs): odd shapes, every dtype, causal with q_len != kv_len, strided
# rows, rows streamed in column chunks (team block), rows that do not fit the LDM (5000 fp32)
SOFTMAX = [
    ("tiny-sunway", 1, 1, "fp32", {}),
    ("tiny-sunway", 7, 31, "fp16", dict(causal=True)),
    ("tiny-sunway", 33, 97, "bf16", dict(causal=True, q_len=11, scale=0.125)),
    ("tiny-sunway", 33, 1000, "fp16", {}),
    ("tiny-sunway", 33, 1000, "bf16", dict(team="block", causal=True, q_len=33)),
    ("tiny-sunway", 16, 5, "fp32", dict(causal=True, q_len=8)),                   # empty rows
    ("tiny-sunway", 12, 7, "fp16", dict(causal=True, q_len=6, q_offset=-2, ld=9)),
    ("tiny-sunway", 7, 97, "fp32", dict(causal=True, q_len=1)),
    ("tiny-sunway", 7, 97, "fp16", dict(ld=100, team="block")),
    ("tiny-sunway", 3, 5000, "fp32", {}),                                         # too long: chunks
    ("tiny-sunway", 130, 64, "fp16", {}),                                         # several rows a tile
    ("tiny-sunway", 300, 50, "bf16", dict(ld=53, causal=True, q_len=100)),        # ... put row by row
    ("sw26010pro", 999, 100, "bf16", dict(causal=True, q_len=333)),
]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", SOFTMAX, ids=_ids(SOFTMAX))
def test_softmax_matches_numpy(hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    k = E.softmax_kernel(caps, rows, cols, dtype, **kw)
    assert k.team == ("chunks" if kw.get("team") == "block" or cols * 4 > 16384 else "rows")
    got, ref = compare(k, caps, seed=rows + cols)
    y = got["y"][:, :cols]
    keep = ref["y"][:, :cols] > 0
    full = keep.any(axis=1)
    assert np.allclose(y.sum(axis=1)[full], 1.0, atol=cols * TOL[dtype][0]), "rows sum to 1"
    assert not y[~full].any(), "a row with no kept column is all zeros"
    if kw.get("causal"):
        assert not y[~keep].any(), "masked entries are exactly 0"


@pytest.mark.parametrize("dtype,team", [("fp16", "warp"), ("bf16", "block"), ("fp32", "warp")])
def test_softmax_takes_minus_infinity_as_an_additive_mask(dtype, team):
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-sunway")
    rows, cols = 7, 97
    k = E.softmax_kernel(caps, rows, cols, dtype, team=team)
    x = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    x[:, :40] = -np.inf
    x[2, 41:] = -np.inf
    x[4, ::3] = -np.inf
    x[5, :] = -np.inf
    bufs = {"x": to_host(x, dtype), "y": np.zeros((rows, cols), k.buffers[1].host_dtype)}
    res = run_functional(k.program, k.args(**bufs), k.launch, warp_width=32, ncores=caps.cores_total)
    got = to_float(res.output("y"), dtype)
    want = k.reference(**bufs)["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=TOL[dtype][0], atol=1e-6)
    assert not got[np.isneginf(x)].any() and got[2, 40] == 1.0 and not got[5].any()


SOFTMAX_GRAD = [
    ("tiny-sunway", 1, 1, "fp32", {}),
    ("tiny-sunway", 7, 31, "bf16", dict(causal=True, scale=0.5)),
    ("tiny-sunway", 33, 97, "fp16", dict(causal=True, q_len=11, scale=0.125)),
    ("tiny-sunway", 33, 1000, "fp32", {}),
    ("tiny-sunway", 16, 5, "fp16", dict(causal=True, q_len=8, team="block")),
    ("tiny-sunway", 33, 1000, "bf16", dict(causal=True, q_len=33, team="block")),
    ("tiny-sunway", 7, 97, "fp16", dict(ld=98)),
    ("tiny-sunway", 3, 5000, "fp32", {}),
]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", SOFTMAX_GRAD, ids=_ids(SOFTMAX_GRAD))
def test_softmax_grad_matches_numpy(hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    compare(E.softmax_grad_kernel(caps, rows, cols, dtype, **kw), caps, seed=rows * cols)


# ----------------------------------------------------------------------------- norms
NORMS = [
    ("tiny-sunway", 1, 1, "fp32", {}),
    ("tiny-sunway", 7, 31, "bf16", {}),
    ("tiny-sunway", 33, 97, "fp16", {}),
    ("tiny-sunway", 33, 1000, "fp32", {}),
    ("tiny-sunway", 33, 1000, "fp16", dict(team="block")),   # streamed in column chunks
    ("tiny-sunway", 7, 3000, "fp32", {}),                    # does not fit the LDM: chunks
    ("sw26010pro", 77, 200, "bf16", {}),
]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", NORMS, ids=_ids(NORMS))
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_norms_match_numpy(op, hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    k = getattr(E, f"{op}_kernel")(caps, rows, cols, dtype, **kw)
    got, _ = compare(k, caps, seed=cols + 1)
    assert k.buffer_bytes()["rstd"] == 4 * rows and got["rstd"].shape == (rows,)


# many rows over few columns: the column sums split the rows (a workspace and a third kernel);
# long rows: the column sums work on column chunks as well
NORM_GRADS = NORMS + [("tiny-sunway", 200, 31, "bf16", {}), ("tiny-sunway", 301, 33, "fp16", {}),
                      ("tiny-sunway", 70, 5000, "bf16", {})]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", NORM_GRADS, ids=_ids(NORM_GRADS))
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_norm_grads_match_numpy(op, hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    k = getattr(E, f"{op}_grad_kernel")(caps, rows, cols, dtype, **kw)
    assert [kk.op for kk in k.kernels][:2] == [f"{op}_grad", "colsum_ln" if op == "layernorm" else "colsum_rms"]
    assert k.kernels[1].team == "column"
    split = len(k.kernels) == 3
    assert split == (rows >= 2 * E.COLSUM_MIN_ROWS), [kk.program.name for kk in k.kernels]
    if split:
        assert k.kernels[2].op == "colsum_chunks" and dict(k.kernels[2].scalars)["chunks"] > 1
        assert [b.name for b in k.kernels[2].outputs] == (["dgamma", "dbeta"] if op == "layernorm" else ["dgamma"])
    compare(k, caps, seed=rows)


def test_norm_forward_feeds_its_backward():
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-sunway")
    rows, cols, eps = 9, 45, 1e-5
    f = E.layernorm_kernel(caps, rows, cols, "fp32", eps)
    fb = f.random_inputs(3)
    res = run_functional(f.program, f.args(**fb), f.launch, warp_width=32, ncores=caps.cores_total)
    g = E.layernorm_grad_kernel(caps, rows, cols, "fp32", eps)
    bufs = g.random_inputs(4)
    bufs.update(x=fb["x"], gamma=fb["gamma"], mean=res.output("mean"), rstd=res.output("rstd"))
    for i, kk in enumerate(g.kernels):
        r = run_functional(kk.program, g.args_for(i, **bufs), kk.launch, warp_width=32, ncores=caps.cores_total)
        for b in kk.outputs:
            bufs[b.name] = r.output(b.name)
    x, dy, gam = (fb["x"].astype(np.float64), bufs["dy"].astype(np.float64), fb["gamma"].astype(np.float64))
    mu = x.mean(1, keepdims=True)
    rs = 1 / np.sqrt(((x - mu) ** 2).mean(1, keepdims=True) + eps)
    xh = (x - mu) * rs
    gdy = gam * dy
    dx = rs * (gdy - gdy.mean(1, keepdims=True) - xh * (gdy * xh).mean(1, keepdims=True))
    np.testing.assert_allclose(bufs["dx"], dx, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bufs["dgamma"], (dy * xh).sum(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bufs["dbeta"], dy.sum(0), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- flat and SwiGLU
FLAT = [("tiny-sunway", 1, "fp32"), ("tiny-sunway", 7, "fp16"), ("tiny-sunway", 1023, "bf16"),
        ("tiny-sunway", 40999, "fp32"), ("tiny-sunway", 3 * 31 * 97, "fp16"), ("sw26010pro", 12345, "bf16")]


@pytest.mark.parametrize("hw,n,dtype", FLAT, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in FLAT])
@pytest.mark.parametrize("op", ["gelu", "gelu_grad", "add", "relu", "relu_grad"])
def test_flat_kernels_match_numpy(op, hw, n, dtype):
    caps = caps_of(hw)
    k = getattr(E, f"{op}_kernel")(caps, n, dtype)
    assert k.team == "flat" and k.vector_bytes == 16
    compare(k, caps, seed=n)


@pytest.mark.parametrize("hw,n,step", [("tiny-sunway", 1, 1), ("tiny-sunway", 40999, 2), ("sw26010pro", 12345, 7)])
def test_adamw_matches_the_gpu_reference(hw, n, step):
    """The optimizer step on the CPEs: the same outputs, to f32 rounding, as the float64 update
    (the GPU module's reference, itself checked against torch's formula there)."""
    caps = caps_of(hw)
    k = E.adamw_kernel(caps, n, lr=1e-2, step=step)
    assert k.team == "flat" and k.dtype == "fp32"
    compare(k, caps, seed=n)


@pytest.mark.parametrize("hw,n,dtype", [("tiny-sunway", 1, "fp16"), ("tiny-sunway", 40999, "bf16"),
                                       ("sw26010pro", 12345, "fp16")])
def test_grad_accum_matches_the_gpu_reference(hw, n, dtype):
    """The fp32 gradient accumulation on the CPEs: the 16-bit gradient's chunks come in half as
    many bytes as the buffer's; the same sums as the float64 reference."""
    caps = caps_of(hw)
    k = E.grad_accum_kernel(caps, n, dtype)
    assert k.team == "flat" and [b.dtype for b in k.buffers] == ["fp32", dtype, "fp32"]
    compare(k, caps, seed=n)


@pytest.mark.parametrize("hw,n,dtype", [("tiny-sunway", 1, "fp16"), ("tiny-sunway", 40999, "bf16"),
                                       ("tiny-sunway", 1003, "fp32"), ("sw26010pro", 12345, "fp16")])
def test_dropout_kernels_match_the_gpu_reference(hw, n, dtype):
    """Dropout on the CPEs: the mask's chunks come in a fraction of the data's bytes, and the
    element index the hash takes runs over the whole buffer, so the mask is the GPU kernel's."""
    caps = caps_of(hw)
    got, _ = compare(E.dropout_kernel(caps, n, 0.1, 3, dtype), caps, seed=n)
    assert np.array_equal(got["mask"] != 0, G.dropout_keep(n, 0.1, 3))
    compare(E.dropout_add_kernel(caps, n, 0.2, 4, dtype), caps, seed=n)
    compare(E.dropout_grad_kernel(caps, n, 0.1, dtype), caps, seed=n)


SWIGLU = [("tiny-sunway", 1, 1, "fp32", {}), ("tiny-sunway", 7, 31, "fp16", {}), ("tiny-sunway", 33, 97, "bf16", {}),
          ("tiny-sunway", 7, 1000, "fp16", {}), ("tiny-sunway", 33, 1000, "fp32", dict(team="block")),
          ("tiny-sunway", 5, 4099, "fp16", {})]


@pytest.mark.parametrize("hw,rows,ffn,dtype,kw", SWIGLU, ids=_ids(SWIGLU))
@pytest.mark.parametrize("op", ["swiglu", "swiglu_grad"])
def test_swiglu_matches_numpy(op, hw, rows, ffn, dtype, kw):
    caps = caps_of(hw)
    compare(getattr(E, f"{op}_kernel")(caps, rows, ffn, dtype, **kw), caps, seed=rows + ffn)


# ----------------------------------------------------------------------------- the GPU module's contract
def test_kernels_keep_the_gpu_kernels_contract():
    """Same op, dtype, buffers (names, shapes, dtypes, outputs), scalars, flops and reference as the
    GPU emitter for the same request, so the block composer can swap the module."""
    sw, gpu = caps_of("tiny-sunway"), caps_of("tiny-gpu")
    reqs = [("softmax_kernel", (64, 100, "fp16"), dict(scale=0.3, causal=True, q_len=16, ld=104)),
            ("softmax_grad_kernel", (33, 97, "bf16"), dict(causal=True, q_len=11)),
            ("layernorm_kernel", (9, 45, "fp32"), {}), ("rmsnorm_kernel", (9, 45, "bf16"), {}),
            ("gelu_kernel", (1000, "fp16"), {}), ("gelu_grad_kernel", (1000, "fp32"), {}),
            ("add_kernel", (77, "bf16"), {}),
            ("relu_kernel", (77, "fp16"), {}), ("relu_grad_kernel", (77, "fp16"), {}),
            ("swiglu_kernel", (5, 40, "fp16"), {}), ("swiglu_grad_kernel", (5, 40, "bf16"), {}),
            ("adamw_kernel", (77,), dict(step=3)), ("grad_accum_kernel", (77, "bf16"), {}),
            ("dropout_kernel", (77, 0.1, 3, "fp16"), {}), ("dropout_add_kernel", (77, 0.1, 3, "bf16"), {}),
            ("dropout_grad_kernel", (77, 0.1, "fp32"), {}), ("cast_kernel", (77, "bf16"), {})]
    for fn, a, kw in reqs:
        s, g = getattr(E, fn)(sw, *a, **kw), getattr(G, fn)(gpu, *a, **kw)
        assert isinstance(s, G.ElementwiseKernel)
        assert (s.op, s.dtype, s.buffers, s.scalars, s.flops) == (g.op, g.dtype, g.buffers, g.scalars, g.flops), fn
        assert s.launch.block == (32, 1, 1) and s.launch.blocks <= sw.cores_total
        bufs = g.random_inputs(1)
        for b in s.buffers:
            assert np.array_equal(s.random_inputs(1)[b.name], bufs[b.name])
        rs, rg = s.reference(**bufs), g.reference(**bufs)
        assert all(np.array_equal(rs[n], rg[n]) for n in rg)
    for fn in ("layernorm_grad_kernel", "rmsnorm_grad_kernel"):
        s, g = getattr(E, fn)(sw, 9, 45, "fp16"), getattr(G, fn)(gpu, 9, 45, "fp16")
        assert isinstance(s, G.KernelChain) and s.op == g.op and s.dtype == g.dtype
        assert s.kernels[0].buffers == g.kernels[0].buffers and s.kernels[0].scalars == g.kernels[0].scalars
        finals = lambda c: [b for b in c.buffers if not b.scratch]  # noqa: E731
        assert finals(s) == finals(g)
        bufs = g.random_inputs(2)
        assert all(np.array_equal(s.reference(**bufs)[n], v) for n, v in g.reference(**bufs).items())


# ----------------------------------------------------------------------------- program shape
def test_kernels_move_data_by_dma_and_reduce_in_the_vector():
    caps = caps_of("sw26010pro")
    for k in (E.softmax_kernel(caps, 4096, 1024, "fp16"), E.layernorm_kernel(caps, 4096, 768, "fp32"),
              E.rmsnorm_kernel(caps, 8, 4096, "bf16"), E.softmax_kernel(caps, 64, 100000, "fp32")):
        m = _mnemonics(k.program)
        assert {"dma.get", "dma.put", "dma.wait"} <= set(m), k.program.name
        assert not any(x.startswith(("ld.global", "st.global")) for x in m if k.team == "rows"), "all data by DMA"
        assert "ld.shared.v4.b32" in m and m.count("shfl.bfly.b64") >= 5 and "bar.sync" not in m
        assert k.launch.block == (32, 1, 1) and k.launch.blocks <= caps.cores_total
    assert E.softmax_kernel(caps, 64, 100000, "fp32").team == "chunks"    # 400 KB rows: streamed
    sm = _mnemonics(E.softmax_kernel(caps, 4096, 1024, "fp16").program)
    # rows in the LDM: one ex2 per element, in the sum pass only (8 halves of a 16-byte vector + 1 tail);
    # streamed rows compute it again in the write pass
    assert sm.count("ex2.f32") == 9
    assert _mnemonics(E.softmax_kernel(caps, 4096, 1024, "fp16", team="block").program).count("ex2.f32") == 18


def test_programs_do_not_grow_with_the_shape():
    caps = caps_of("sw26010pro")
    pairs = [(E.softmax_kernel(caps, 64 * 128, 1024, "fp16", causal=True, q_len=128),
              E.softmax_kernel(caps, 64 * 4096, 1024, "fp16", causal=True, q_len=4096)),
             (E.layernorm_kernel(caps, 512, 768, "bf16"), E.layernorm_kernel(caps, 8192, 768, "bf16")),
             (E.add_kernel(caps, 1000, "fp16"), E.add_kernel(caps, 10 ** 9, "fp16")),
             (E.swiglu_kernel(caps, 4, 11008, "fp16"), E.swiglu_kernel(caps, 4096, 11008, "fp16"))]
    for small, big in pairs:
        assert len(small.program.op) == len(big.program.op), small.program.name
        assert big.launch.blocks <= caps.cores_total
    big = pairs[2][1]
    assert big.launch.blocks == caps.cores_total and big.flops == 10 ** 9
    assert big.buffer_bytes() == {"a": 2 * 10 ** 9, "b": 2 * 10 ** 9, "y": 2 * 10 ** 9}


def test_numba_and_reference_engines_agree_bit_for_bit():
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-sunway")
    chain = E.layernorm_grad_kernel(caps, 40, 40, "bf16")
    for k in (E.softmax_kernel(caps, 6, 45, "fp16", causal=True, q_len=3, team="block"), chain.kernels[1],
              E.gelu_kernel(caps, 100, "fp32")):
        bufs = chain.random_inputs(2) if k.team == "column" else k.random_inputs(2)
        args = k.args(**{b.name: bufs[b.name] for b in k.buffers})
        runs = [run_functional(k.program, dict(args), k.launch, warp_width=32, ncores=caps.cores_total, engine=eng)
                for eng in ("numba", "reference")]
        for b in k.outputs:
            assert np.array_equal(runs[0].output(b.name).view(np.uint8), runs[1].output(b.name).view(np.uint8))
        assert runs[0].warp_instructions == runs[1].warp_instructions


# ----------------------------------------------------------------------------- bad input
def test_bad_requests_are_one_line_input_errors():
    caps = caps_of("tiny-sunway")
    cases = [
        (lambda: E.softmax_kernel(caps, 0, 8), "rows = 0"),
        (lambda: E.softmax_kernel(caps, 8, 8, "int8"), "unknown dtype"),
        (lambda: E.layernorm_kernel(caps, 4, -1, "fp16"), "cols = -1"),
        (lambda: E.rmsnorm_grad_kernel(caps, 4, 8, "tf32"), "unknown dtype"),
        (lambda: E.gelu_kernel(caps, 0), "n = 0"),
        (lambda: E.add_kernel(caps, 2.5), "n = 2.5"),
        (lambda: E.swiglu_kernel(caps, 4, 0), "ffn = 0"),
        (lambda: E.softmax_kernel(caps, 10, 8, causal=True, q_len=4), "not a multiple of q_len"),
        (lambda: E.softmax_kernel(caps, 4, 8, ld=7), "ld = 7 < cols = 8"),
        (lambda: E.softmax_kernel(caps, 4, 8, scale=float("nan")), "scale"),
        (lambda: E.layernorm_kernel(caps, 4, 8, eps=-1.0), "eps"),
        (lambda: E.softmax_kernel(caps, 4, 8, team="grid"), "team"),
        (lambda: E.softmax_kernel(caps, 4, 8000, "fp32", team="warp"), "team 'rows' needs one row"),
        (lambda: E.add_kernel(caps_of("tiny-gpu"), 8), "sunway-family"),
        (lambda: E.layernorm_grad_kernel(caps_of("tiny-gpu"), 8, 8), "sunway-family"),
    ]
    for make, text in cases:
        with pytest.raises(InputError) as e:
            make()
        assert text in e.value.line() and "\n" not in e.value.line()
    k = E.add_kernel(caps, 8, "fp16")
    bufs = k.random_inputs()
    with pytest.raises(InputError, match="float16"):
        k.args(bufs["a"].astype(np.float32), bufs["b"], bufs["y"])


# ----------------------------------------------------------------------------- KV append
@pytest.mark.parametrize("batch,kv_len,hidden,pos,dtype", [(2, 5, 64, 4, "fp16"), (3, 7, 12345, 2, "fp32"),
                                                            (1, 3, 7, 0, "bf16"), (40, 2, 96, 1, "fp16")])
def test_kv_append_runs_on_a_cpe_by_dma(batch, kv_len, hidden, pos, dtype):
    """Functional and timing runs write exactly the row `pos` of each sequence's K and V cache (the
    timing engine moves backed buffers' data too), moving 2 x 2 rows per sequence by DMA."""
    from archsim.engine.functional import run_functional
    from archsim.engine.timing import time_kernel
    from archsim.workloads.emit.kvcache_sunway import kv_append_kernel

    m = load_machine("tiny-sunway")
    caps = caps_of("tiny-sunway")
    k = kv_append_kernel(caps, batch, kv_len, hidden, pos, dtype)
    assert k.launch.block == (32, 1, 1) and "dma.get" in _mnemonics(k.program)
    hd = {"fp16": np.float16, "fp32": np.float32, "bf16": np.uint16}[dtype]
    rng = np.random.default_rng(batch)
    q = rng.integers(0, 30000, (batch, 3 * hidden)).astype(hd)
    kc = rng.integers(0, 30000, (batch, kv_len, hidden)).astype(hd)
    vc = rng.integers(0, 30000, (batch, kv_len, hidden)).astype(hd)
    want = k.reference(q, kc, vc)
    r = run_functional(k.program, k.args(q, kc, vc), k.launch, warp_width=32, ncores=caps.cores_total)
    t = time_kernel(k.program, m, k.launch, k.args(q, kc, vc))
    for got in ((r.output("k_cache"), r.output("v_cache")), (t.buffers["k_cache"], t.buffers["v_cache"])):
        for g, w in zip(got, want):
            assert np.array_equal(np.asarray(g).reshape(w.shape).view(np.uint8), w.view(np.uint8))
    assert t.memory["bytes"]["dma"] == 2 * 2 * batch * hidden * np.dtype(hd).itemsize


def test_kv_append_bad_input():
    from archsim.workloads.emit.kvcache_sunway import kv_append_kernel

    for make, text in [(lambda: kv_append_kernel(caps_of("tiny-sunway"), 0, 4, 8, 0), "batch = 0"),
                       (lambda: kv_append_kernel(caps_of("tiny-sunway"), 1, 4, 8, 4), "pos = 4"),
                       (lambda: kv_append_kernel(caps_of("tiny-gpu"), 1, 4, 8, 0), "sunway-family")]:
        with pytest.raises(InputError) as e:
            make()
        assert text in e.value.line()


# ----------------------------------------------------------------------------- timing smoke
def test_kernels_time_on_tiny_sunway_and_move_exactly_their_bytes_by_dma():
    """On tiny-sunway's timing model the kernels complete and the DMA engines move exactly the
    bytes the kernel must: every buffer once, plus one copy of the [cols] parameters (gamma, beta)
    for each further CPE (each CPE fetches its own into its LDM)."""
    from archsim.engine.timing import Unbacked, time_kernel

    tiny = load_machine("tiny-sunway")
    caps = caps_of("tiny-sunway")
    ks = [E.add_kernel(caps, 32768 + 5, "fp16"), E.softmax_kernel(caps, 64, 300, "fp16", ld=301),
          E.layernorm_kernel(caps, 100, 256, "bf16"), E.gelu_kernel(caps, 4099, "fp32"),
          E.softmax_kernel(caps, 4, 1000, "fp32", team="block")]
    for k in ks:
        nb = k.buffer_bytes()
        r = time_kernel(k.program, tiny, k.launch, k.args(**{b: Unbacked(v) for b, v in nb.items()}))
        must = sum(nb.values()) + (k.launch.blocks - 1) * sum(nb.get(p, 0) for p in ("gamma", "beta"))
        if k.team == "chunks":     # streamed: max and sum read the row, the write pass reads it again
            must = 3 * nb["x"] + nb["y"]
        if k.op == "softmax" and k.team == "rows":   # a tile a row (64 rows, 32 CPEs): cols of ld, in and out
            must = 2 * 64 * 300 * 2
        assert r.memory["bytes"]["dma"] == must, (k.program.name, r.memory["bytes"]["dma"], must)
        assert r.cycles > 0 and r.memory["dma"]["gets"] > 0 and r.memory["dma"]["puts"] > 0


def test_timing_is_repeatable_and_independent_of_skip_ahead():
    from archsim.engine.timing import Unbacked, time_kernel

    tiny = load_machine("tiny-sunway")
    chain = E.rmsnorm_grad_kernel(caps_of("tiny-sunway"), 40, 100, "fp16")
    for k in (E.softmax_kernel(caps_of("tiny-sunway"), 40, 100, "bf16", causal=True, q_len=20),) + chain.kernels:
        nb = k.buffer_bytes()
        args = k.args(**{b: Unbacked(v) for b, v in nb.items()})
        runs = [time_kernel(k.program, tiny, k.launch, dict(args), skip=s) for s in (True, True, False)]
        assert len({(r.cycles, r.warp_instructions, r.memory["bytes"]["dma"]) for r in runs}) == 1, k.program.name
