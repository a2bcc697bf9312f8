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
]


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


def test_a_fused_train_step_on_sunway_is_a_clear_error(capsys):
    code, _, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", "tiny", "--phase", "train",
                       "--mode", "functional")
    line = one_line_error(err)
    assert code == 2 and "fused (flash) attention backward" in line and "--attention unfused" in line


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


def test_compare_a_gpu_and_a_sunway_machine(capsys, tmp_path):
    out = tmp_path / "c.json"
    code, text, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny",
                          "--layers", "1", "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    assert doc["machines"] == ["tiny-gpu", "tiny-sunway"]
    assert "tiny-sunway time us" in text and "bound" in text
