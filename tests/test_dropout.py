"""Dropout in training (Megatron-LM's attention and hidden dropout): the op graph, the kernels as
the block runs them on both machine families, the activations it keeps, and its refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from archsim.cli import main
from archsim.errors import InputError
from archsim.workloads.model import load_workload, validate_workload
from archsim.workloads.reference import dropout_keep, ref_dropout


def _doc(pa=0.1, ph=0.2, **scenario):
    d = load_workload("tiny").model_dump(mode="json")
    d["name"] = "tiny-drop"
    d["model"].update(attention_dropout=pa, hidden_dropout=ph)
    d["scenario"].update({"phase": "train", "attention": "unfused", **scenario})
    return d


def _wl(pa=0.1, ph=0.2, **scenario):
    return validate_workload(_doc(pa, ph, **scenario))


def test_dropout_ops_in_the_training_graph():
    """Attention's probabilities dropped (and kept with their mask for the backward), the residual
    adds become dropout-adds, and the backward drops the gradients through the same masks; none of
    it outside training or at probability 0."""
    w = _wl()
    ops = {o.name: o for o in w.block_ops()}
    assert ops["attn"].outputs == ("attn_out", "attn_probs", "attn_drop", "attn_mask")
    assert ops["res1"].kind == ops["res2"].kind == "dropout_add"
    assert ops["res2.dropout.grad"].inputs == ("d_y", "res2_mask")
    assert ops["res2.dropout.grad"].outputs == ("d_ffn2_out",)
    assert ops["ffn2.dgrad"].inputs[0] == "d_ffn2_out" and ops["proj.wgrad"].inputs[1] == "d_proj_out"
    assert ops["attn.grad"].inputs == ("qkv", "attn_probs", "attn_drop", "attn_mask", "d_attn_out")
    b, n, s, T, h = 1, 2, 13, 13, 64
    plain = {o.name: o for o in _wl(0.0, 0.0).block_ops()}
    assert ops["attn"].flops - plain["attn"].flops == b * n * s * s          # one flop an element
    assert ops["res1"].flops == 2 * T * h and ops["attn"].model_flops == plain["attn"].model_flops
    assert "res1.dropout.grad" not in plain and plain["res1"].kind == "add"
    pre = {o.name: o for o in _wl(phase="prefill").block_ops()}
    assert pre["res1"].kind == "add" and pre["attn"].outputs == ("attn_out",)
    assert w.summary()["dropout"] == {"attention": 0.1, "hidden": 0.2} and "dropout" not in _wl(0, 0).summary()


@pytest.mark.parametrize("doc,where", [(_doc(attention="fused"), "model.attention_dropout"),
                                       (_doc(pa=1.0), "attention_dropout"), (_doc(ph=-0.1), "hidden_dropout"),
                                       (_doc(ph="x"), "hidden_dropout")])
def test_bad_dropout_is_one_line(doc, where):
    with pytest.raises(InputError) as e:
        validate_workload(doc)
    assert where in e.value.where
    fused_prefill = _doc(attention="fused", phase="prefill")
    assert validate_workload(fused_prefill).scenario.attention == "fused"     # no dropout out of training


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_dropout_block_matches_numpy(capsys, tmp_path, hw):
    """Every kernel of a training block with dropout against float64 numpy (the masks exactly),
    and the whole block's outputs and weight gradients against a float64 pass."""
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(_doc()))
    out = tmp_path / "f.json"
    assert main(["run", "--hw", hw, "--workload", str(f), "--mode", "functional", "--workers", "1",
                 "--json", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    names = {k["name"] for k in doc["kernels"]}
    assert doc["passed"]
    assert {"attn.dropout", "attn.grad.dropout", "res1", "res2", "res1.dropout.grad", "res2.dropout.grad"} <= names


def test_dropout_keeps_what_the_kernels_read():
    """Stored activations: attention's dropped probabilities (the storage type) and its mask and
    the two residual masks (a byte an element) come on top; selective recompute drops attention's."""
    from archsim.cluster.plan import stored_activations

    b, n, s, T, h, e = 1, 2, 13, 13, 64, 2
    base = stored_activations(_wl(0.0, 0.0), "none", False, 1)
    assert stored_activations(_wl(), "none", False, 1) - base == b * n * s * s * (e + 1) + 2 * T * h
    assert stored_activations(_wl(), "selective", False, 1) - stored_activations(_wl(0.0, 0.0), "selective", False,
                                                                                1) == 2 * T * h
    assert stored_activations(_wl(), "full", False, 1) == stored_activations(_wl(0.0, 0.0), "full", False, 1)


def test_reference_dropout_drops_about_p():
    keep = dropout_keep(100_000, 0.1, 1)
    assert abs((~keep).mean() - 0.1) < 0.005
    y, m = ref_dropout(np.ones((10, 10)), 0.5, 3)
    assert set(np.unique(y)) <= {0.0, 2.0} and np.array_equal(y, 2.0 * m)


def test_dropout_costs_time():
    """Timed on tiny-gpu, a training block with dropout launches its dropout kernels and takes
    longer than the same block without."""
    from archsim.config import load_machine
    from archsim.runner import RunOptions, run_workload

    tiny = load_machine("tiny-gpu")
    opts = RunOptions(workers=1)
    with_d = run_workload(tiny, _wl(), opts)
    without = run_workload(tiny, _wl(0.0, 0.0), opts)
    cyc = {n: r["cycles"] for r in with_d["kernels"] for n in [r["name"]] + r.get("also", [])}
    assert cyc["attn.dropout"] > 0 and cyc["attn.grad.dropout"] > 0 and cyc["res1.dropout.grad"] > 0
    assert with_d["total"]["cycles"] > without["total"]["cycles"]


def test_dropout_in_a_cluster_step_with_sequence_parallelism(capsys, tmp_path):
    """A training step of a model with dropout under tp 2 and sequence parallelism: the residual
    dropout-adds and their gradients run on the device's share of the tokens, like the adds."""
    from test_step import TINY

    cl, wf, out = tmp_path / "tc.yaml", tmp_path / "w.yaml", tmp_path / "c.json"
    cl.write_text(yaml.safe_dump(TINY))
    wf.write_text(yaml.safe_dump(_doc(seq=16)))
    assert main(["run", "--cluster", str(cl), "--workload", str(wf), "--plan", "tp=2,pp=2,dp=2,mb=1,gbs=8,sp=on",
                 "--workers", "1", "--json", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["workload"]["dropout"] == {"attention": 0.1, "hidden": 0.2} and doc["step"]["step_seconds"] > 0
    ops = {k["op"] for k in doc["stages"][0]["kernels"]}
    assert {"res1.dropout.grad", "res2.dropout.grad"} <= ops | {o for k in doc["stages"][0]["kernels"]
                                                                 for o in k.get("also_ops", [])}
