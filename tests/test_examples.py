"""The example kernels of isa/examples/ against numpy, on both interpreters.

- every example at several sizes (non-multiple-of-32 columns for softmax / layernorm, odd tile
  counts for the GEMMs) on the numba engine, within the tolerances of archsim.isa.examples;
- every example with its own .launch / .arg lines (what `archsim asm FILE.s` runs);
- assemble(disassemble(p)) == p for every example;
- differential: the numba engine and the pure-Python reference agree bit for bit on every output
  (and on the number of warp-instructions), on small sizes (the reference is slow).
"""

from __future__ import annotations

import numpy as np
import pytest

from archsim.engine.launch import default_args
from archsim.isa.asm import assemble, disassemble
from archsim.isa.examples import EXAMPLES, example_path, load_example, make_args, verify
from archsim.isa.opcodes import SEM, opcodes
from archsim.paths import data_dir

ENGINES = ("numba", "reference")


def run(prog, args, launch, engine="numba"):
    from archsim.engine.functional import run_functional

    return run_functional(prog, args, launch, engine=engine)


def check(name, sizes, engine="numba", seed=0):
    prog = load_example(name)
    args, launch = make_args(name, seed=seed, **sizes)
    result = run(prog, args, launch, engine)
    report = verify(name, args, result)
    for out, r in report.items():
        atol, rtol = EXAMPLES[name].tol[out]
        assert r["passed"], f"{name} {sizes} [{engine}] {out}: {r} (atol {atol}, rtol {rtol})"
    return result


# (example, sizes) on the numba engine
CASES = [
    ("vector_add", dict(n=1000)),
    ("vector_add", dict(n=1)),
    ("vector_add", dict(n=4099, grid=3, block=96)),   # several trips of the grid-stride loop
    ("vector_add", dict(n=0)),
    ("reduce_sum", dict(n=5000)),
    ("reduce_sum", dict(n=100, grid=3, block=96)),
    ("reduce_sum", dict(n=7, grid=5, block=32)),     # chunks of 2, the last block's is empty
    ("reduce_sum", dict(n=20000, grid=6, block=100)),  # a partial last warp
    ("reduce_sum", dict(n=3000, grid=1, block=1024)),  # 32 warps: every partial slot used
    ("softmax", dict(rows=10, cols=100)),
    ("softmax", dict(rows=3, cols=1)),
    ("softmax", dict(rows=5, cols=31)),
    ("softmax", dict(rows=7, cols=33)),
    ("softmax", dict(rows=4, cols=257)),
    ("softmax", dict(rows=9, cols=64, block=64)),
    ("softmax", dict(rows=2, cols=1000, block=32)),
    ("layernorm", dict(rows=8, cols=200)),
    ("layernorm", dict(rows=3, cols=1)),
    ("layernorm", dict(rows=5, cols=31, block=32)),
    ("layernorm", dict(rows=4, cols=45, block=64)),
    ("layernorm", dict(rows=3, cols=17, block=96)),   # warps with no column at all
    ("layernorm", dict(rows=2, cols=1000, block=256)),
    ("layernorm", dict(rows=2, cols=777, block=1024)),  # 32 warps: every partial slot used
    ("gemm_mma", dict(M=64, N=64, K=64)),
    ("gemm_mma", dict(M=128, N=64, K=96)),              # odd number of k tiles
    ("gemm_mma", dict(M=64, N=128, K=32)),              # one k tile: prefetch never fires
    ("gemm_mma", dict(M=192, N=128, K=256)),
    ("gemm_ffma", dict(M=64, N=64, K=16)),
    ("gemm_ffma", dict(M=128, N=64, K=48)),
]


@pytest.mark.parametrize("name,sizes", CASES, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in s.items())}"
                                                   for n, s in CASES])
def test_example_matches_numpy(name, sizes):
    check(name, sizes, seed=sum(sizes.values()))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_default_launch_and_args(name):
    """What `archsim asm FILE.s --hw HW` runs: the file's own .launch and .arg lines."""
    prog = load_example(name)
    assert prog.launch is not None
    assert {a.name for a in prog.args} == set(prog.params), "every .param has an .arg"
    args = default_args(prog, seed=0)
    report = verify(name, args, run(prog, args, None))
    assert all(r["passed"] for r in report.values()), report


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_round_trips(name):
    prog = load_example(name)
    again = assemble(disassemble(prog), source="<disassembly>")
    assert again == prog
    assert disassemble(again) == disassemble(prog)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_is_a_loop(name):
    """Kernels are loops, not unrolled streams: a backward branch, and a program of fixed size."""
    prog = load_example(name)
    bra = SEM["bra"]
    sems = [SEM[opcodes()[int(o)].sem] for o in prog.op]
    assert any(s == bra and int(prog.imm[pc]) <= pc for pc, s in enumerate(sems))
    assert len(prog) < 200


@pytest.mark.parametrize("hw", ["tiny-gpu", "a100", "tiny-sunway"])
def test_examples_pass_the_load_time_checks(hw):
    """Registers written before read, balanced barriers, scratchpad and registers within the
    target (tiny-gpu: 16 KiB), units the target has: only gemm_mma needs a tensor unit."""
    from archsim.config.derived import capabilities
    from archsim.config.load import load_machine
    from archsim.errors import InputError
    from archsim.isa.check import check

    caps = capabilities(load_machine(hw, [], []))
    for name in EXAMPLES:
        prog = load_example(name)
        if name == "gemm_mma" and hw == "tiny-sunway":
            with pytest.raises(InputError, match="tensor"):
                check(prog, caps)
        else:
            check(prog, caps)


def test_every_example_file_is_registered():
    files = {p.name for p in (data_dir("isa") / "examples").glob("*.s")}
    assert files == {e.file for e in EXAMPLES.values()}
    for name in EXAMPLES:
        assert example_path(name).is_file()


def test_verify_detects_a_wrong_result():
    args, _ = make_args("softmax", rows=3, cols=40)
    good = EXAMPLES["softmax"].ref(args)["out"].astype(np.float32)
    assert verify("softmax", args, {"out": good})["out"]["passed"]
    bad = good.copy()
    bad[1, 7] *= 1.001
    r = verify("softmax", args, {"out": bad})["out"]
    assert not r["passed"] and r["max_rel_err"] > 5e-4
    bad[1, 7] = np.nan
    assert not verify("softmax", args, {"out": bad})["out"]["passed"]


# ----------------------------------------------------------------------------- differential
# small sizes: the reference engine is pure Python
DIFF_CASES = [
    ("vector_add", dict(n=300, grid=2, block=64)),
    ("reduce_sum", dict(n=333, grid=2, block=64)),
    ("softmax", dict(rows=3, cols=45, block=64)),
    ("layernorm", dict(rows=2, cols=70, block=64)),
    ("gemm_mma", dict(M=64, N=64, K=64)),
    ("gemm_ffma", dict(M=64, N=64, K=16)),
]


@pytest.mark.parametrize("name,sizes", DIFF_CASES, ids=[n for n, _ in DIFF_CASES])
def test_engines_agree_bit_for_bit(name, sizes):
    prog = load_example(name)
    args, launch = make_args(name, seed=7, **sizes)
    results = {e: run(prog, {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()},
                      launch, e) for e in ENGINES}
    for e in ENGINES:
        report = verify(name, args, results[e])
        assert all(r["passed"] for r in report.values()), (e, report)
    a, b = results["numba"], results["reference"]
    for out in EXAMPLES[name].outputs:
        x, y = a.output(out), b.output(out)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), f"{name}: {out} differs between engines"
    assert a.warp_instructions == b.warp_instructions
