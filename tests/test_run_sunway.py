"""`archsim run` and `compare` on the Sunway family (tiny-sunway): the block's ops become the Sunway
emitters' kernels (DMA through the LDM, vector FMAs), chained through real buffers and checked
against numpy; timing runs place the tensors in the cross segment, so every memory controller
serves them; a GPU and a Sunway machine compare side by side."""

from __future__ import annotations

import json

import pytest
import yaml

from archsim.paths import data_dir

from test_cli import cli, one_line_error


def _variant(tmp_path, **changes):
    doc = yaml.safe_load((data_dir("workloads") / "tiny.yaml").read_text())
    for k, v in changes.items():
        (doc["model"] if k in doc["model"] else doc["scenario"])[k] = v
    p = tmp_path / "variant.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


FUNCTIONAL = [
    ("prefill", {}),
    ("decode", {}),
    ("prefill", {"attention": "unfused", "activation": "swiglu", "norm": "rmsnorm", "dtype": "bf16"}),
    ("train", {"attention": "unfused"}),
    ("train", {}),                                  # fused attention: the Sunway flash backward
    ("train", {"causal": False, "dtype": "bf16", "seq": 40}),
    ("train", {"tensor_parallel": 2}),
]
GRADS = {"d_x", "d_w_qkv", "d_w_proj", "d_w_ffn1", "d_w_ffn2", "d_norm1_gamma", "d_norm1_beta", "d_norm2_gamma",
         "d_norm2_beta"}


@pytest.mark.parametrize("phase,changes", FUNCTIONAL)
def test_sunway_block_matches_numpy(capsys, tmp_path, phase, changes):
    wl = _variant(tmp_path, **changes) if changes else "tiny"
    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", wl, "--phase", phase, "--layers", "1",
                          "--mode", "functional", "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["block_verification"]["passed"]
    assert all(k["verification"]["passed"] for k in doc["kernels"])
    assert all(k["block"] == [32, 1, 1] for k in doc["kernels"])      # one CPE (one 32-lane vector) a block
    if phase == "train":                        # d_x and every weight gradient checked against numpy
        assert GRADS <= set(doc["block_verification"]["tensors"])
        names = [k["name"] for k in doc["kernels"]]
        fused = changes.get("attention", "fused") == "fused"
        assert ({"attn.grad.pre", "attn.grad.dkdv", "attn.grad.dq"} <= set(names)) == fused
        assert ("attn.grad.softmax" in names) == (not fused)


def test_a_fused_train_step_beyond_the_ldm_is_a_clear_error(capsys, tmp_path):
    """fp32 at head_dim 128: the fused backward's blocks do not fit tiny-sunway's 64 KiB LDM."""
    wl = _variant(tmp_path, head_dim=128, hidden=256, dtype="fp32")
    code, _, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", wl, "--phase", "train",
                       "--mode", "functional")
    line = one_line_error(err)
    assert code == 2 and "attention backward on tiny-sunway" in line and "65536 B LDM" in line


def test_sunway_timing_uses_dma_and_every_controller(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", "tiny", "--layers", "1",
                          "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    assert doc["complete"]
    for k in doc["kernels"]:
        assert k["bytes"]["dma"] > 0, k["name"]
        # the tensors sit in the cross segment: each kernel's traffic reaches both controllers
        assert all(mc["gbps"] > 0 for mc in k["memory_controllers"]), k["name"]
    gemm = next(k for k in doc["kernels"] if k["name"] == "qkv")
    assert gemm["stalls"] and gemm["tflops"] > 0
    for k in doc["kernels"]:  # the MPEs' launch and join of the CPEs (engine/mpe.py)
        mp = k["mpe"]
        assert mp["cpes_launched"] > 0 and mp["launch_cycles"] > 0 and mp["join_cycles"] > 0, k["name"]
        assert mp["launch_cycles"] + mp["join_cycles"] < k["cycles"], k["name"]


def test_compare_a_gpu_and_a_sunway_machine(capsys, tmp_path):
    out = tmp_path / "c.json"
    code, text, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny",
                          "--layers", "1", "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    assert doc["machines"] == ["tiny-gpu", "tiny-sunway"]
    assert "tiny-sunway time us" in text and "bound" in text
