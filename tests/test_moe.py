"""Mixture-of-experts blocks (model.moe): the schema, the op graph, the numpy references, the
routing / dispatch / combine kernels against numpy on tiny-gpu, and whole blocks run functionally
and timed."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from archsim.cli import main
from archsim.config import capabilities, load_machine
from archsim.errors import InputError
from archsim.workloads import reference as R
from archsim.workloads.emit import elementwise_gpu as E
from archsim.workloads.emit.gemm_gpu import to_float
from archsim.workloads.model import load_workload, validate_workload


def _moe(**moe):
    wl = load_workload("tiny-moe")
    d = json.loads(json.dumps({"name": "m", "model": wl.model.model_dump(), "scenario": wl.scenario.model_dump()}))
    d["model"]["moe"].update(moe)
    return d


@pytest.mark.parametrize("change,where,what", [
    ({"top_k": 5}, "model.moe.top_k", "top_k 5 > experts 4"),
    ({"experts": 1}, "model.moe.experts", ""),
    ({"capacity_factor": 0}, "model.moe.capacity_factor", ""),
    ({"bogus": 1}, "model.moe.bogus", "unknown key"),
])
def test_bad_moe_is_one_line(change, where, what):
    with pytest.raises(InputError) as e:
        validate_workload(_moe(**change), "m.yaml")
    line = e.value.line()
    assert where in line and what in line and "\n" not in line


def test_moe_refusals_name_the_option():
    d = _moe()
    d["scenario"]["tensor_parallel"] = 2
    with pytest.raises(InputError, match="tensor_parallel 1 for a mixture-of-experts"):
        validate_workload(d, "m.yaml")


def test_capacity_is_the_factor_times_the_even_share():
    wl = load_workload("tiny-moe")
    assert wl.model.moe.capacity(13) == math.ceil(0.75 * 13 * 2 / 4) == 5
    assert wl.model.moe.capacity(1) == 1
    assert load_workload("olmoe-1b-7b").summary()["moe"] == {"experts": 64, "top_k": 8, "capacity_factor": 1.25,
                                                             "capacity": 320}


def test_moe_op_graph():
    wl = load_workload("tiny-moe")
    ops = {o.name: o for o in wl.block_ops()}
    names = [o.name for o in wl.block_ops()]
    assert names[names.index("norm2") + 1:] == ["gate", "route", "dispatch", "expert1", "expert_act", "expert2",
                                                 "combine", "res2"]
    assert "ffn1" not in ops
    T, h, f, Ex, k, C = 13, 64, 96, 4, 2, 5
    sh = wl.tensor_shapes()
    assert sh["slot_token"] == (Ex * C,) and sh["route_slot"] == (T, k) and sh["w_expert1"] == (Ex, h, f)
    # the kernels compute every slot; the textbook counts the routed tokens
    assert ops["expert1"].flops == 2 * Ex * C * h * f and ops["expert1"].model_flops == 2 * T * k * h * f
    assert ops["gate"].model_flops == 2 * T * h * Ex


def test_route_reference_fills_first_choices_first_and_drops_the_rest():
    logits = np.array([[3.0, 1.0, 2.0], [3.0, 2.0, 1.0], [0.0, 5.0, 5.0]])
    e, w, slot, tok = R.ref_moe_route(logits, 2, 1)
    assert e.tolist() == [[0, 2], [0, 1], [1, 2]]             # ties to the lower expert
    p = R.ref_softmax(logits, axis=1)
    assert np.allclose(w, np.take_along_axis(p, e.astype(int), 1))
    # first choices: token 0 -> expert 0 slot 0, token 1 -> expert 0 (full: dropped), token 2 -> expert 1
    # second choices: token 0 -> expert 2, token 1 -> expert 1 (full: dropped), token 2 -> expert 2 (full)
    assert slot.tolist() == [[0, 2], [-1, -1], [1, -1]] and tok.tolist() == [0, 2, 0]


def test_moe_ffn_with_identical_experts_is_the_dense_ffn_scaled():
    """Every expert the same FFN and room for every choice: each token gets the dense FFN times
    the sum of its chosen probabilities."""
    wl = load_workload("tiny-moe")
    rng = np.random.default_rng(0)
    w = R.random_weights(wl, 1)
    w["w_expert1"][:] = w["w_expert1"][0]
    w["w_expert2"][:] = w["w_expert2"][0]
    x = rng.standard_normal((13, 64))
    d = _moe(capacity_factor=2.0)
    big = validate_workload(d, "m.yaml")
    got = R.moe_ffn(big, x, w)
    dense = R.ref_gelu(x @ w["w_expert1"][0]) @ w["w_expert2"][0]
    probs = R.ref_softmax(x @ w["w_gate"], axis=1)
    share = np.sort(probs, axis=1)[:, -2:].sum(axis=1)
    assert np.allclose(got, dense * share[:, None])


def _compare(k, seed=0, caps=None):
    caps = caps or capabilities(load_machine("tiny-gpu"))
    from archsim.engine.functional import run_functional

    bufs = k.random_inputs(seed)
    ref = k.reference(**bufs)
    res = run_functional(k.program, k.args(**bufs), k.launch, warp_width=32, ncores=caps.cores_total)
    for b in k.outputs:
        got = to_float(res.output(b.name), b.dtype)
        want = np.asarray(ref[b.name], np.float64).reshape(got.shape)
        if b.dtype == "i32":
            assert np.array_equal(got, want), (k.op, b.name)
        else:
            assert np.allclose(got, want, rtol=8e-3, atol=2e-3), (k.op, b.name, float(np.abs(got - want).max()))


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("T,Ex,k", [(1, 2, 1), (13, 8, 2), (40, 5, 3), (7, 4, 4)])
def test_topk_kernel_matches_numpy(dtype, T, Ex, k):
    """bf16 logits tie often: the kernel breaks ties as the reference does (the lower expert)."""
    _compare(E.moe_topk_kernel(capabilities(load_machine("tiny-gpu")), T, Ex, k, dtype))


@pytest.mark.parametrize("T,Ex,k,C", [(13, 8, 2, 4), (40, 5, 3, 30), (7, 4, 4, 1), (300, 6, 2, 50), (1, 2, 1, 1),
                                      (50, 40, 3, 2)])
def test_assign_kernel_matches_numpy(T, Ex, k, C):
    """Slots in priority order, drops past the capacity, empty slots -1; more experts than the
    blocks tiny-gpu holds at once (the grid strides over them)."""
    _compare(E.moe_assign_kernel(capabilities(load_machine("tiny-gpu")), T, Ex, k, C), seed=3)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("T,h,S", [(13, 64, 24), (5, 7, 9), (3, 33, 4)])
def test_dispatch_and_combine_kernels_match_numpy(dtype, T, h, S):
    caps = capabilities(load_machine("tiny-gpu"))
    _compare(E.moe_dispatch_kernel(caps, T, h, S, dtype))
    for k in (1, 3):
        _compare(E.moe_combine_kernel(caps, T, h, k, S, dtype))
        _compare(E.moe_combine_kernel(caps, T, h, k, S, dtype, weighted=False))


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("T,h,S,k", [(13, 64, 24, 2), (5, 7, 9, 1), (3, 33, 12, 3), (40, 1200, 80, 2)])
def test_combine_grad_kernels_match_numpy(dtype, T, h, S, k):
    """Both kernels of combine's backward (rows past 1024 columns take a block a token)."""
    caps = capabilities(load_machine("tiny-gpu"))
    chain = E.moe_combine_grad_kernel(caps, T, h, k, S, dtype)
    from archsim.engine.functional import run_functional

    bufs = chain.random_inputs(1)
    ref = chain.reference(**bufs)
    for i, kk in enumerate(chain.kernels):
        res = run_functional(kk.program, chain.args_for(i, **bufs), kk.launch, warp_width=32, ncores=2)
        for b in kk.outputs:
            bufs[b.name] = res.output(b.name)
    for name in ("d_route_w", "d_expert_out"):
        dt = "fp32" if name == "d_route_w" else dtype
        assert np.allclose(to_float(bufs[name], dt), np.asarray(ref[name]).reshape(np.shape(bufs[name])),
                           rtol=1e-2, atol=3e-2), name


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("T,Ex,k", [(1, 2, 1), (13, 8, 2), (40, 5, 3)])
def test_route_grad_kernel_matches_numpy(dtype, T, Ex, k):
    _compare(E.moe_route_grad_kernel(capabilities(load_machine("tiny-gpu")), T, Ex, k, dtype))


def test_moe_kernel_bad_sizes_are_one_line():
    caps = capabilities(load_machine("tiny-gpu"))
    for make, what in ((lambda: E.moe_topk_kernel(caps, 4, 2, 3), "top_k 3 > experts 2"),
                       (lambda: E.moe_topk_kernel(caps, 4, 40, 17), "1 to 16"),
                       (lambda: E.moe_assign_kernel(caps, 0, 2, 1, 1), "tokens = 0"),
                       (lambda: E.moe_dispatch_kernel(capabilities(load_machine("tiny-sunway")), 4, 8, 2),
                        "gpu-family"),
                       (lambda: E.moe_topk_kernel(capabilities(load_machine("tiny-sunway")), 4, 8, 2, threads=64),
                        "gpu-family")):
        with pytest.raises(InputError) as e:
            make()
        assert what in e.value.line()


@pytest.mark.parametrize("args", [[], ["--phase", "decode", "--batch", "3"], ["--dtype", "bf16", "--seq", "40"],
                                  ["--dtype", "fp32", "--attention", "unfused"], ["--phase", "train"],
                                  ["--phase", "train", "--dtype", "bf16", "--batch", "3"]])
def test_moe_block_runs_functionally(capsys, tmp_path, args):
    out = tmp_path / "f.json"
    assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny-moe", "--mode", "functional", *args,
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    names = {k["name"] for k in doc["kernels"]}
    assert doc["passed"] and {"route.topk", "route.assign", "dispatch", "expert1", "combine"} <= names
    if "train" in args:
        assert {"combine.grad.dw", "combine.grad.dslot", "expert2.wgrad", "dispatch.grad", "route.grad",
                "gate.wgrad", "moe_in.grad"} <= names


def test_moe_block_timing_follows_the_capacity(capsys, tmp_path):
    """The experts' GEMMs run over every slot: a larger capacity factor costs them more cycles."""
    cycles = {}
    for cf in (0.75, 3.0):
        p = tmp_path / f"m{cf}.yaml"
        d = _moe(capacity_factor=cf)
        import yaml

        p.write_text(yaml.safe_dump(d))
        out = tmp_path / f"{cf}.json"
        assert main(["run", "--hw", "tiny-gpu", "--workload", str(p), "--workers", "1", "--json", str(out)]) == 0
        doc = json.loads(out.read_text())
        cycles[cf] = {k["name"]: k["cycles"] for k in doc["kernels"]}
        assert doc["workload"]["moe"]["capacity"] == math.ceil(cf * 13 * 2 / 4)
    assert cycles[3.0]["expert1"] > cycles[0.75]["expert1"]
    assert cycles[3.0]["gate"] == cycles[0.75]["gate"]


@pytest.mark.parametrize("argv,what", [
    (["--hw", "tiny-gpu", "--tp", "2"], "tensor_parallel 1"),
])
def test_moe_refusals_are_one_line(capsys, argv, what):
    assert main(["run", "--workload", "tiny-moe", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert what in err and len(err.splitlines()) == 1, err


def test_moe_backward_graph_is_the_gradient():
    """The backward ops' float64 references against central differences of the forward block:
    sum(y * d_y) moved by one weight or input entry (small enough that no routing changes)."""
    train = load_workload("tiny-moe", {"phase": "train", "dtype": "fp32"})
    fwd = load_workload("tiny-moe", {"dtype": "fp32"})
    rng = np.random.default_rng(5)
    w = R.random_weights(train, 2)
    x = rng.standard_normal((13, 64))
    dy = rng.standard_normal((13, 64))
    env = R.execute_ops(train, {**w, "x": x, "d_y": dy})

    def loss(name, idx, delta):
        ws = {k: v.copy() for k, v in w.items()}
        xx = x.copy()
        (xx if name == "x" else ws[name])[idx] += delta
        return float((R.execute_ops(fwd, {**ws, "x": xx})["y"] * dy).sum())

    eps = 1e-6
    for name, idx in (("w_gate", (3, 1)), ("w_gate", (10, 2)), ("w_expert1", (1, 5, 7)), ("w_expert2", (2, 9, 4)),
                      ("w_expert2", (0, 0, 63)), ("x", (4, 10)), ("x", (12, 0))):
        num = (loss(name, idx, eps) - loss(name, idx, -eps)) / (2 * eps)
        got = env["d_" + name][idx]
        assert got == pytest.approx(num, rel=1e-4, abs=1e-6), (name, idx)


def test_expert_parallel_shard_holds_its_experts_over_the_groups_slots(capsys, tmp_path):
    """--ep 2: a device's experts are half, each over twice the slots; the same rows in all, so
    the experts' GEMMs keep their flops; the shard still checks against numpy."""
    whole = {o.name: o for o in load_workload("tiny-moe").block_ops()}
    half = {o.name: o for o in load_workload("tiny-moe", {"expert_parallel": 2}).block_ops()}
    assert (whole["expert1"].dims["experts"], whole["expert1"].dims["M"]) == (4, 5)
    assert (half["expert1"].dims["experts"], half["expert1"].dims["M"]) == (2, 10)
    assert half["expert1"].flops == whole["expert1"].flops
    assert load_workload("tiny-moe", {"expert_parallel": 2}).tensor_shapes()["w_expert2"] == (2, 96, 64)
    out = tmp_path / "ep.json"
    assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny-moe", "--mode", "functional", "--phase", "train",
                 "--ep", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["passed"]
    for bad, what in ((["--ep", "3"], "does not divide model.moe.experts 4"),
                      (["--workload", "tiny", "--ep", "2"], "without model.moe")):
        argv = ["run", "--hw", "tiny-gpu", "--workload", "tiny-moe", *bad]
        capsys.readouterr()
        assert main(argv) == 2 and what in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_sunway_moe_kernels_match_numpy(dtype):
    """The Sunway module's MoE kernels: the GPU programs at one warp (one CPE) a block, spread."""
    from archsim.engine.functional import run_functional
    from archsim.workloads.emit import elementwise_sunway as SW

    caps = capabilities(load_machine("tiny-sunway"))
    for k in (SW.moe_topk_kernel(caps, 13, 8, 2, dtype), SW.moe_route_grad_kernel(caps, 13, 8, 2, dtype),
              SW.moe_dispatch_kernel(caps, 13, 64, 24, dtype), SW.moe_combine_kernel(caps, 13, 64, 2, 24, dtype),
              SW.moe_combine_kernel(caps, 13, 64, 2, 24, dtype, weighted=False),
              SW.moe_assign_kernel(caps, 50, 40, 3, 2)):
        assert k.launch.spread and k.launch.block == (32, 1, 1)
        _compare(k, caps=caps)
    chain = SW.moe_combine_grad_kernel(caps, 13, 64, 2, 24, dtype)
    bufs = chain.random_inputs(1)
    ref = chain.reference(**bufs)
    for i, kk in enumerate(chain.kernels):
        res = run_functional(kk.program, chain.args_for(i, **bufs), kk.launch, warp_width=32, ncores=caps.cores_total)
        for b in kk.outputs:
            bufs[b.name] = res.output(b.name)
    assert np.allclose(to_float(bufs["d_expert_out"], dtype), ref["d_expert_out"], rtol=1e-2, atol=3e-2)
    with pytest.raises(InputError, match="sunway-family"):
        SW.moe_topk_kernel(capabilities(load_machine("tiny-gpu")), 4, 8, 2)


@pytest.mark.parametrize("args", [[], ["--phase", "train"], ["--phase", "decode", "--batch", "3"],
                                  ["--phase", "train", "--ep", "2"]])
def test_moe_block_runs_functionally_on_sunway(capsys, tmp_path, args):
    out = tmp_path / "s.json"
    assert main(["run", "--hw", "tiny-sunway", "--workload", "tiny-moe", "--mode", "functional", *args,
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["passed"]


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_moe_kernels_at_the_largest_top_k(hw):
    """top_k 8 (OLMoE's) and, on GPUs, 16 (the most the kernels unroll): registers and predicates
    suffice; on Sunway's 64 registers a lane, combine at 16 is one line."""
    from archsim.workloads.emit import elementwise_sunway as SW

    caps = capabilities(load_machine(hw))
    mod = E if hw == "tiny-gpu" else SW
    if hw == "tiny-sunway":
        with pytest.raises(InputError, match="registers"):
            SW.moe_combine_kernel(caps, 9, 64, 16, 40)
    for k in ((8, 16) if hw == "tiny-gpu" else (8,)):
        for kern in (mod.moe_topk_kernel(caps, 9, 16, k), mod.moe_route_grad_kernel(caps, 9, 16, k),
                     mod.moe_combine_kernel(caps, 9, 64, k, 40), mod.moe_assign_kernel(caps, 9, 16, k, 3)):
            _compare(kern, caps=caps)
        assert len(mod.moe_combine_grad_kernel(caps, 9, 64, k, 40).kernels) == 2


def test_moe_train_with_top_8_runs_on_both_families(capsys, tmp_path):
    import yaml

    d = _moe(experts=16, top_k=8, capacity_factor=1.0)
    p = tmp_path / "k8.yaml"
    p.write_text(yaml.safe_dump(d))
    for hw in ("tiny-gpu", "tiny-sunway"):
        out = tmp_path / f"{hw}.json"
        assert main(["run", "--hw", hw, "--workload", str(p), "--phase", "train", "--mode", "functional",
                     "--json", str(out)]) == 0
        assert json.loads(out.read_text())["passed"]
