"""The GPU elementwise / row-reduction emitter (archsim.workloads.emit.elementwise_gpu) against
float64 numpy, in functional mode on the numba engine, on tiny-gpu (2 SMs: grids are capped, so
teams loop over rows) and a100 (108 SMs: few rows get a block each).

Tolerance: |got - ref| <= rtol*|ref| + atol*max(1, max|ref|), reference in float64 from the exact
stored inputs. The kernels compute in f32 and round once on the store, so rtol is the storage
format's rounding with margin (fp32 1e-5; fp16 2^-11 -> 1e-3; bf16 2^-9 -> 8e-3) and atol (1e-5 of
the output's scale) covers f32 cancellation where a result is much smaller than its terms
(norm gradients, GELU' near its zero, masked-out softmax mass). A wrong mask, a lost tail element,
a missed reduction step or a mis-scaled exponent gives errors orders of magnitude larger.
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.isa.check import check
from archsim.isa.opcodes import SEM, opcodes
from archsim.workloads.emit import elementwise_gpu as E
from archsim.workloads.emit.gemm_gpu import to_float

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


# ----------------------------------------------------------------------------- softmax
# (hw, rows, cols, dtype, kwargs): odd rows / cols, every dtype, causal with q_len != kv_len
SOFTMAX = [
    ("tiny-gpu", 1, 1, "fp32", {}),
    ("tiny-gpu", 7, 31, "fp16", dict(causal=True)),                        # q_len 7 < kv_len 31
    ("tiny-gpu", 33, 97, "bf16", dict(causal=True, q_len=11, scale=0.125)),  # 3 (b, n) groups
    ("tiny-gpu", 33, 1000, "fp16", {}),                                    # warp rows, 16-byte loads
    ("tiny-gpu", 33, 1000, "bf16", dict(team="block", causal=True, q_len=33)),  # blocks loop over rows
    ("tiny-gpu", 16, 5, "fp32", dict(causal=True, q_len=8)),              # q_len > kv_len: empty rows
    ("tiny-gpu", 12, 7, "fp16", dict(causal=True, q_len=6, q_offset=-2, ld=9)),
    ("tiny-gpu", 7, 97, "fp32", dict(causal=True, q_len=1)),              # decode: one query per (b, n)
    ("a100", 33, 1000, "fp32", dict(causal=True, q_len=33, scale=0.3)),   # few rows: a block each
    ("a100", 7, 97, "fp16", dict(ld=100)),
    ("a100", 1, 2000, "bf16", {}),                                         # a long row
]


def _ids(cases):
    return [f"{c[0]}-{c[1]}x{c[2]}-{c[3]}" + "".join(f"-{k}{v}" for k, v in c[4].items()) for c in cases]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", SOFTMAX, ids=_ids(SOFTMAX))
def test_softmax_matches_numpy(hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    k = E.softmax_kernel(caps, rows, cols, dtype, **kw)
    got, ref = compare(k, caps, seed=rows + cols)
    y = got["y"][:, :cols]
    keep = ref["y"][:, :cols] > 0
    sums = y.sum(axis=1)
    full = keep.any(axis=1)
    assert np.allclose(sums[full], 1.0, atol=cols * TOL[dtype][0]), "rows sum to 1"
    assert not y[~full].any(), "a row with no kept column is all zeros"
    if kw.get("causal"):
        assert not y[~keep].any(), "masked entries are exactly 0"


@pytest.mark.parametrize("dtype,team", [("fp16", "warp"), ("bf16", "block"), ("fp32", "warp")])
def test_softmax_takes_minus_infinity_as_an_additive_mask(dtype, team):
    """-inf scores (a mask added to the scores) give exactly 0; a lane whose first scores are all
    -inf must not turn its running sum into NaN (2^(-inf - -inf))."""
    from archsim.engine.functional import run_functional
    from archsim.workloads.emit.gemm_gpu import to_host

    caps = caps_of("tiny-gpu")
    rows, cols = 7, 97
    k = E.softmax_kernel(caps, rows, cols, dtype, team=team)
    x = np.random.default_rng(5).standard_normal((rows, cols)).astype(np.float32)
    x[:, :40] = -np.inf
    x[2, 41:] = -np.inf                          # one column left
    x[4, ::3] = -np.inf
    x[5, :] = -np.inf                            # nothing left: zeros, as a fully masked causal row
    bufs = {"x": to_host(x, dtype), "y": np.zeros((rows, cols), k.buffers[1].host_dtype)}
    res = run_functional(k.program, k.args(**bufs), k.launch, warp_width=32, ncores=caps.cores_total)
    got = to_float(res.output("y"), dtype)
    want = k.reference(**bufs)["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=TOL[dtype][0], atol=1e-6)
    assert not got[np.isneginf(x)].any() and got[2, 40] == 1.0 and not got[5].any()


SOFTMAX_GRAD = [
    ("tiny-gpu", 1, 1, "fp32", {}),
    ("tiny-gpu", 7, 31, "bf16", dict(causal=True, scale=0.5)),
    ("tiny-gpu", 33, 97, "fp16", dict(causal=True, q_len=11, scale=0.125)),
    ("tiny-gpu", 33, 1000, "fp32", {}),
    ("tiny-gpu", 16, 5, "fp16", dict(causal=True, q_len=8, team="block")),
    ("a100", 33, 1000, "bf16", dict(causal=True, q_len=33)),
    ("a100", 7, 97, "fp16", dict(ld=98)),
]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", SOFTMAX_GRAD, ids=_ids(SOFTMAX_GRAD))
def test_softmax_grad_matches_numpy(hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    compare(E.softmax_grad_kernel(caps, rows, cols, dtype, **kw), caps, seed=rows * cols)


# ----------------------------------------------------------------------------- norms
NORMS = [
    ("tiny-gpu", 1, 1, "fp32", {}),
    ("tiny-gpu", 7, 31, "bf16", {}),
    ("tiny-gpu", 33, 97, "fp16", {}),
    ("tiny-gpu", 33, 1000, "fp32", {}),
    ("tiny-gpu", 33, 1000, "fp16", dict(team="block")),     # blocks loop over rows
    ("a100", 7, 1000, "bf16", {}),
    ("a100", 33, 97, "fp16", {}),
    ("a100", 7, 2000, "fp32", {}),                          # long rows: a block each
]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", NORMS, ids=_ids(NORMS))
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_norms_match_numpy(op, hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    fn = E.layernorm_kernel if op == "layernorm" else E.rmsnorm_kernel
    k = fn(caps, rows, cols, dtype, **kw)
    got, _ = compare(k, caps, seed=cols + 1)
    assert k.buffer_bytes()["rstd"] == 4 * rows and got["rstd"].shape == (rows,)


# many rows over few columns: the column sums split the rows into chunks (a third kernel adds them)
NORM_GRADS = NORMS + [("tiny-gpu", 200, 31, "bf16", {}), ("tiny-gpu", 301, 33, "fp16", {}),
                      ("a100", 520, 40, "fp32", {}), ("a100", 700, 1000, "fp16", {})]


@pytest.mark.parametrize("hw,rows,cols,dtype,kw", NORM_GRADS, ids=_ids(NORM_GRADS))
@pytest.mark.parametrize("op", ["layernorm", "rmsnorm"])
def test_norm_grads_match_numpy(op, hw, rows, cols, dtype, kw):
    caps = caps_of(hw)
    fn = E.layernorm_grad_kernel if op == "layernorm" else E.rmsnorm_grad_kernel
    k = fn(caps, rows, cols, dtype, **kw)
    assert k.kernels[1].team == "column"
    chunked = len(k.kernels) == 3
    assert chunked == (rows >= 200), [kk.program.name for kk in k.kernels]
    if chunked:
        assert dict(k.kernels[1].scalars)["chunks"] > 1
        assert [b.name for b in k.kernels[2].outputs] == (["dgamma", "dbeta"] if op == "layernorm" else ["dgamma"])
    compare(k, caps, seed=rows)


def test_norm_forward_feeds_its_backward():
    """The statistics the forward writes are the ones the backward reads: run layernorm, feed its
    mean / rstd to the backward chain, compare with the float64 gradient from x alone."""
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-gpu")
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
FLAT = [("tiny-gpu", 1, "fp32"), ("tiny-gpu", 7, "fp16"), ("tiny-gpu", 1023, "bf16"), ("tiny-gpu", 4099, "fp32"),
        ("tiny-gpu", 3 * 31 * 97, "fp16"), ("a100", 1000, "bf16"), ("a100", 33 * 97, "fp32")]


@pytest.mark.parametrize("hw,n,dtype", FLAT, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in FLAT])
@pytest.mark.parametrize("op", ["gelu", "gelu_grad", "add"])
def test_flat_kernels_match_numpy(op, hw, n, dtype):
    caps = caps_of(hw)
    k = getattr(E, f"{op}_kernel")(caps, n, dtype)
    assert k.vector_bytes == 16
    compare(k, caps, seed=n)


SWIGLU = [("tiny-gpu", 1, 1, "fp32", {}), ("tiny-gpu", 7, 31, "fp16", {}), ("tiny-gpu", 33, 97, "bf16", {}),
          ("tiny-gpu", 7, 1000, "fp16", {}), ("tiny-gpu", 33, 1000, "fp32", dict(team="block")),
          ("a100", 7, 1000, "bf16", {}), ("a100", 33, 97, "fp32", {})]


@pytest.mark.parametrize("hw,rows,ffn,dtype,kw", SWIGLU, ids=_ids(SWIGLU))
@pytest.mark.parametrize("op", ["swiglu", "swiglu_grad"])
def test_swiglu_matches_numpy(op, hw, rows, ffn, dtype, kw):
    caps = caps_of(hw)
    compare(getattr(E, f"{op}_kernel")(caps, rows, ffn, dtype, **kw), caps, seed=rows + ffn)


def test_numba_and_reference_engines_agree_bit_for_bit():
    """A block-row softmax (shared-memory partials, barriers) and a column-sum kernel on both
    interpreters: the same bytes out and the same warp-instruction count."""
    from archsim.engine.functional import run_functional

    caps = caps_of("tiny-gpu")
    chain = E.layernorm_grad_kernel(caps, 5, 40, "bf16")
    for k in (E.softmax_kernel(caps, 6, 45, "fp16", causal=True, q_len=3, team="block"), chain.kernels[1]):
        bufs = k.random_inputs(2) if k.op == "softmax" else chain.random_inputs(2)
        args = k.args(**{b.name: bufs[b.name] for b in k.buffers})
        runs = [run_functional(k.program, dict(args), k.launch, warp_width=32, ncores=caps.cores_total, engine=eng)
                for eng in ("numba", "reference")]
        for b in k.outputs:
            assert np.array_equal(runs[0].output(b.name).view(np.uint8), runs[1].output(b.name).view(np.uint8))
        assert runs[0].warp_instructions == runs[1].warp_instructions


# ----------------------------------------------------------------------------- program shape
def _mnemonics(prog):
    return [opcodes()[int(o)].mnemonic for o in prog.op]


def test_programs_do_not_grow_with_the_shape():
    caps = caps_of("a100")
    pairs = [
        (E.softmax_kernel(caps, 64 * 128, 1024, "fp16", causal=True, q_len=128),
         E.softmax_kernel(caps, 64 * 4096, 1024, "fp16", causal=True, q_len=4096)),
        (E.layernorm_kernel(caps, 512, 768, "bf16"), E.layernorm_kernel(caps, 8192, 4096, "bf16", team="warp")),
        (E.add_kernel(caps, 1000, "fp16"), E.add_kernel(caps, 10 ** 9, "fp16")),
        (E.swiglu_kernel(caps, 4, 11008, "fp16"), E.swiglu_kernel(caps, 4096, 11008, "fp16")),
    ]
    for small, big in pairs:
        assert small.program == big.program, small.program.name
        assert big.launch.blocks <= caps.cores_total * caps.max_blocks_per_core    # grid-stride loops
    big = pairs[2][1]
    resident = min(caps.max_blocks_per_core, caps.warp_slots // 8, caps.regs_per_core // (big.program.nregs * 256))
    assert big.launch.blocks == caps.cores_total * resident       # one full wave of 256-thread blocks
    assert big.flops == 10 ** 9 and big.buffer_bytes() == {"a": 2 * 10 ** 9, "b": 2 * 10 ** 9, "y": 2 * 10 ** 9}


def test_row_kernels_use_vector_loads_and_warp_shuffles():
    caps = caps_of("a100")
    for k in (E.softmax_kernel(caps, 4096, 1024, "fp16"), E.layernorm_kernel(caps, 4096, 768, "fp32"),
              E.rmsnorm_kernel(caps, 8, 4096, "bf16")):
        m = _mnemonics(k.program)
        assert k.vector_bytes == 16 and "ld.global.v4.b32" in m and "st.global.v4.b32" in m
        assert m.count("shfl.bfly.b64") >= 5
        sems = [SEM[opcodes()[int(o)].sem] for o in k.program.op]
        assert any(s == SEM["bra"] and int(k.program.imm[pc]) <= pc for pc, s in enumerate(sems)), "a loop"
        check(k.program, caps)
    sm = E.softmax_kernel(caps, 4096, 1024, "fp16")
    assert sm.team == "warp" and sm.launch.block == (128, 1, 1)
    assert "ex2.f32" in _mnemonics(sm.program) and "bar.sync" not in _mnemonics(sm.program)
    long_row = E.rmsnorm_kernel(caps, 8, 4096, "bf16")
    assert long_row.team == "block" and "bar.sync" in _mnemonics(long_row.program)
    odd = E.softmax_kernel(caps, 7, 97, "fp32")
    assert odd.vector_bytes == 4                 # 97 * 4 bytes: rows are only 4-byte aligned


def test_causal_flops_count_only_the_kept_entries():
    caps = caps_of("tiny-gpu")
    s = 64
    full = E.softmax_kernel(caps, 2 * s, s, "fp16")
    causal = E.softmax_kernel(caps, 2 * s, s, "fp16", causal=True, q_len=s)
    assert full.flops == E.FLOPS_PER_ELEM["softmax"] * 2 * s * s
    assert causal.flops == E.FLOPS_PER_ELEM["softmax"] * 2 * s * (s + 1) // 2
    decode = E.softmax_kernel(caps, 8, 1000, "fp16", causal=True, q_len=1)
    assert decode.flops == E.FLOPS_PER_ELEM["softmax"] * 8 * 1000


# ----------------------------------------------------------------------------- bad input
def test_bad_requests_are_one_line_input_errors():
    caps = caps_of("tiny-gpu")
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
        (lambda: E.add_kernel(caps_of("tiny-sunway"), 8), "gpu-family"),
    ]
    for make, text in cases:
        with pytest.raises(InputError) as e:
            make()
        assert text in e.value.line() and "\n" not in e.value.line()
    k = E.add_kernel(caps, 8, "fp16")
    bufs = k.random_inputs()
    with pytest.raises(InputError, match="float16"):
        k.args(bufs["a"].astype(np.float32), bufs["b"], bufs["y"])
    with pytest.raises(InputError, match="no buffer 'y'"):
        k.args(a=bufs["a"], b=bufs["b"])


# ----------------------------------------------------------------------------- timing smoke
def test_add_moves_exactly_its_buffers_through_dram():
    """On tiny-gpu's timing model a residual add reads a and b from DRAM exactly once (whole
    32-byte sectors), the L1 data pipe carries a, b and y, and y stays dirty in the write-back L2
    (the three buffers, 3 x 64 KiB, fit its 256 KiB). The L2 allocates on write at sector
    granularity and fetches a sector that a write fills only in part (engine/cache.py), so an
    odd-sized y costs one more sector read: its last one."""
    from archsim.engine.timing import Unbacked, time_kernel

    tiny = load_machine("tiny-gpu")
    for n, dtype in ((16384, "fp32"), (32768 + 5, "fp16")):
        k = E.add_kernel(capabilities(tiny), n, dtype)
        nb = k.buffer_bytes()
        r = time_kernel(k.program, tiny, k.launch, k.args(**{b: Unbacked(v) for b, v in nb.items()}))
        sectors = -(-nb["a"] // 32) * 32
        b = r.memory["bytes"]
        assert b["dram_read"] == 2 * sectors + (32 if nb["y"] % 32 else 0)
        assert b["l1"] == 3 * sectors
        assert b["dram_write"] == 0
        assert r.cycles > 0 and r.warp_instructions > 0


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("unroll", [2, 3])
@pytest.mark.parametrize("n", [1, 8, 1000, 4099])
@pytest.mark.parametrize("grid,threads", [(1, 32), (3, 64)])
def test_unrolled_add_on_any_grid_matches_numpy(dtype, unroll, n, grid, threads):
    """The collectives' reduction: the add with every load of a group of vectors issued first,
    launched on fewer blocks and threads than emitted (the grid-stride loop covers the rest)."""
    import dataclasses

    from archsim.isa.program import Launch

    caps = caps_of("tiny-gpu")
    k = E.add_kernel(caps, n, dtype, unroll=unroll)
    compare(dataclasses.replace(k, launch=Launch((grid, 1, 1), (threads, 1, 1))), caps)


def test_unrolled_add_keeps_more_loads_in_flight():
    """On tiny-gpu's timing model one block of fp16 adds streams faster unrolled (the loads of four
    vectors overlap instead of each waiting for its conversion)."""
    import dataclasses

    from archsim.engine.timing import Unbacked, time_kernel
    from archsim.isa.program import Launch

    tiny = load_machine("tiny-gpu")
    cycles = []
    for u in (1, 4):
        k = E.add_kernel(capabilities(tiny), 1 << 16, "fp16", unroll=u)
        k = dataclasses.replace(k, launch=Launch((1, 1, 1), (64, 1, 1)))
        r = time_kernel(k.program, tiny, k.launch, k.args(**{b: Unbacked(v) for b, v in k.buffer_bytes().items()}))
        cycles.append(r.cycles)
    assert cycles[1] < 0.7 * cycles[0]


# ----------------------------------------------------------------------------- optimizer
def _torch_adamw(x, lr, b1, b2, eps, wd, step):
    """torch.optim.AdamW's update, written out (an oracle independent of the emitter's constants)."""
    p = x["p"] * (1.0 - lr * wd)
    m = b1 * x["m"] + (1.0 - b1) * x["g"]
    v = b2 * x["v"] + (1.0 - b2) * x["g"] ** 2
    denom = np.sqrt(v) / np.sqrt(1.0 - b2 ** step) + eps
    return {"p_out": p - lr / (1.0 - b1 ** step) * m / denom, "m_out": m, "v_out": v}


@pytest.mark.parametrize("hw,n,step,lr", [("tiny-gpu", 1, 1, 1e-2), ("tiny-gpu", 1003, 2, 1e-2),
                                          ("tiny-gpu", 4099, 1000, 6e-5), ("a100", 70001, 5, 1e-3)])
def test_adamw_matches_torch_update(hw, n, step, lr):
    """One AdamW step: the moments and the master weights as torch.optim.AdamW computes them, in
    f32 (an early step, where the bias corrections are far from 1, and a late one)."""
    caps = caps_of(hw)
    k = E.adamw_kernel(caps, n, lr=lr, step=step)
    got, _ = compare(k, caps, seed=n)
    bufs = k.random_inputs(n)
    want = _torch_adamw({b: to_float(bufs[b], "fp32") for b in ("p", "g", "m", "v")}, lr, 0.9, 0.95, 1e-8, 0.1, step)
    for name, w in want.items():
        assert np.allclose(got[name], w, rtol=2e-5, atol=1e-6 * np.abs(w).max()), name   # (f32 cancellation near 0)
    moved = np.abs(got["p_out"] - to_float(bufs["p"], "fp32"))
    assert moved.max() > 10 * np.abs(want["p_out"]).max() * 1e-5, "the update is visible above the tolerance"
    assert k.flops == 14 * n and k.dtype == "fp32"


@pytest.mark.parametrize("hw,n,dtype", [("tiny-gpu", 1, "fp16"), ("tiny-gpu", 1003, "bf16"), ("a100", 40999, "fp16")])
def test_grad_accum_adds_the_half_gradient_into_fp32(hw, n, dtype):
    """A micro-batch's 16-bit gradient added into the fp32 accumulation buffer: numpy's sum of
    the two in f32, exactly (one f32 add of exact values); 10 bytes a parameter."""
    caps = caps_of(hw)
    k = E.grad_accum_kernel(caps, n, dtype)
    got, _ = compare(k, caps, seed=n)
    bufs = k.random_inputs(n)
    want = to_float(bufs["acc"], "fp32").astype(np.float32) + to_float(bufs["g"], dtype).astype(np.float32)
    assert np.array_equal(got["acc_out"].astype(np.float32), want)
    assert not np.array_equal(want, to_float(bufs["acc"], "fp32").astype(np.float32))
    assert sum(b.nbytes for b in k.buffers) == 10 * n and k.flops == n
    with pytest.raises(InputError, match="fp32 gradient"):
        E.grad_accum_kernel(caps, n, "fp32")


@pytest.mark.parametrize("hw,n,dtype", [("tiny-gpu", 1, "fp16"), ("tiny-gpu", 4099, "bf16")])
def test_cast_widens_to_fp32_exactly(hw, n, dtype):
    caps = caps_of(hw)
    k = E.cast_kernel(caps, n, dtype)
    got, _ = compare(k, caps, seed=n)
    assert np.array_equal(got["y"], to_float(k.random_inputs(n)["x"], dtype))
    assert [b.dtype for b in k.buffers] == [dtype, "fp32"]
    with pytest.raises(InputError, match="fp32 input"):
        E.cast_kernel(caps, n, "fp32")


# ----------------------------------------------------------------------------- dropout
@pytest.mark.parametrize("hw,n,dtype,p", [("tiny-gpu", 1, "fp16", 0.1), ("tiny-gpu", 1003, "bf16", 0.5),
                                         ("tiny-gpu", 40999, "fp32", 0.1), ("a100", 70001, "fp16", 0.1)])
def test_dropout_kernels_match_numpy(hw, n, dtype, p):
    """Dropout, dropout-add and dropout's gradient: the kept elements scaled by 1 / (1 - p), the
    mask a byte an element, and the share dropped near p (the hash as the numpy oracle draws it)."""
    caps = caps_of(hw)
    k = E.dropout_kernel(caps, n, p, 11, dtype)
    got, _ = compare(k, caps, seed=n)
    bufs = k.random_inputs(n)
    x = to_float(bufs["x"], dtype)
    keep = got["mask"] != 0
    assert set(np.unique(got["mask"])) <= {0.0, 1.0}
    assert np.array_equal(got["y"][~keep], np.zeros(int((~keep).sum())))
    assert np.allclose(got["y"][keep], x[keep] / (1 - p), rtol=TOL[dtype][0] * 2, atol=0)
    if n > 1000:
        assert abs((~keep).mean() - p) < 0.02
        assert not np.array_equal(keep, E.dropout_keep(n, p, 12)), "the seed moves the mask"
    assert [b.dtype for b in k.buffers] == [E._dtype("dropout", dtype), E._dtype("dropout", dtype), "u8"]
    compare(E.dropout_add_kernel(caps, n, p, 5, dtype), caps, seed=n + 1)
    g = E.dropout_grad_kernel(caps, n, p, dtype)
    got, _ = compare(g, caps, seed=n + 2)
    gb = g.random_inputs(n + 2)
    want = np.where(gb["mask"] != 0, to_float(gb["dy"], dtype) / (1 - p), 0.0)
    assert np.allclose(got["dx"], want, rtol=TOL[dtype][0] * 2, atol=1e-30)


@pytest.mark.parametrize("kw,what", [(dict(p=1.0), "probability"), (dict(p=-0.1), "probability"),
                                     (dict(p="0.1"), "probability"), (dict(seed=-1), "seed"),
                                     (dict(seed=1 << 33), "seed")])
def test_dropout_refuses_bad_arguments(kw, what):
    args = {"p": 0.1, "seed": 1, **kw}
    with pytest.raises(InputError, match=what):
        E.dropout_kernel(caps_of("tiny-gpu"), 8, args["p"], args["seed"])


@pytest.mark.parametrize("kw,what", [({"lr": -1e-3}, "lr"), ({"beta1": 1.0}, "beta1"), ({"beta2": float("nan")}, "beta2"),
                                     ({"step": 0}, "step"), ({"weight_decay": "0.1"}, "weight_decay"),
                                     ({"beta1": 0.0, "step": 1}, None)])
def test_adamw_refuses_bad_hyperparameters(kw, what):
    caps = caps_of("tiny-gpu")
    if what is None:                                  # beta1 = 0: plain RMS scaling, allowed
        assert E.adamw_kernel(caps, 8, **kw).flops == 14 * 8
        return
    with pytest.raises(InputError, match=what):
        E.adamw_kernel(caps, 8, **kw)
