"""docs/records.md keeps up with the records: every key path of a tiny run's archsim.result/1 (GPU
and Sunway) and of show-config's archsim.machine/1 is listed there, and every schema the code
writes has its section.

A path is written as in the doc's tables: keys joined by dots, ``[]`` for each element of a list
of objects, and ``<name>`` for a key that depends on the data (a kernel's name, a dtype, ...).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from test_cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "records.md"

# objects whose keys are data, not field names: their path -> the placeholder the doc uses
RESULT_MAPS = {"sim.kernels": "<kernel>", "sim.visits": "<family>", "machine.peak_tflops": "<dtype>"}
MACHINE_MAPS = {
    "machine.sources": "<tag>", "machine.pipes": "<pipe>", "machine.mpe.pipes": "<pipe>",
    "machine.pipes.<pipe>.lanes_per_cycle": "<dtype>", "machine.mpe.pipes.<pipe>.lanes_per_cycle": "<dtype>",
    "machine.pipes.<pipe>.latency_overrides_cycles": "<key>",
    "machine.mpe.pipes.<pipe>.latency_overrides_cycles": "<key>",
    "machine.tensor.mac_steps_per_cycle": "<dtype>", "machine.tensor.mma_sync_steps_per_cycle": "<dtype>",
    "derived.peak_tflops": "<dtype>", "derived.peak_bandwidth_gbps": "<level>",
}


def documented() -> set[str]:
    """Everything the doc writes in backticks (its tables name each field by its full path)."""
    return set(re.findall(r"`([^`]+)`", DOC.read_text(encoding="utf-8")))


def key_paths(obj, maps: dict, prefix: str = "") -> set[str]:
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{maps.get(prefix, k)}" if prefix else maps.get(prefix, k)
            out.add(p)
            out |= key_paths(v, maps, p)
    elif isinstance(obj, list):
        for v in obj:
            if isinstance(v, (dict, list)):
                out |= key_paths(v, maps, prefix + "[]")
    return out


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_run_record_fields_are_documented(capsys, tmp_path, hw):
    out = tmp_path / "r.json"
    code, _, err = cli(capsys, "run", "--hw", hw, "--workload", "tiny", "--workers", "1", "--no-cache",
                       "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.result/1"
    missing = sorted(key_paths(doc, RESULT_MAPS) - documented())
    assert not missing, f"docs/records.md does not list these fields of a {hw} run record: {missing}"


@pytest.mark.parametrize("hw", ["tiny-gpu", "tiny-sunway"])
def test_machine_record_fields_are_documented(capsys, tmp_path, hw):
    out = tmp_path / "m.json"
    code, _, err = cli(capsys, "show-config", hw, "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.machine/1"
    missing = sorted(key_paths(doc, MACHINE_MAPS) - documented())
    assert not missing, f"docs/records.md does not list these fields of {hw}'s machine record: {missing}"


CLUSTER_MAPS = {"cluster.sources": "<tag>", "derived.peak_tflops_per_device": "<dtype>"}


@pytest.mark.parametrize("name", ["jean-zay-a100", "sunway-supernodes"])
def test_cluster_record_fields_are_documented(capsys, tmp_path, name):
    out = tmp_path / "c.json"
    code, _, err = cli(capsys, "show-config", name, "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.cluster_config/1"
    missing = sorted(key_paths(doc, CLUSTER_MAPS) - documented())
    assert not missing, f"docs/records.md does not list these fields of {name}'s cluster record: {missing}"


def test_cluster_validate_record_fields_are_documented(capsys, tmp_path):
    out = tmp_path / "v.json"
    code, _, err = cli(capsys, "validate", "--cluster", "dgx-a100-superpod", "--curve", "nccl", "--plot", "none",
                       "--json", str(out))
    assert code == 0, err
    missing = sorted(key_paths(json.loads(out.read_text()), {}) - documented())
    assert not missing, f"docs/records.md does not list these fields of a cluster validate record: {missing}"


def _tiny_cluster(tmp_path):
    """Two nodes of two tiny-gpu devices."""
    import yaml

    cl = tmp_path / "c.yaml"
    cl.write_text(yaml.safe_dump({
        "name": "tc", "device": "tiny-gpu", "nodes": 2,
        "node": {"devices": 2, "fabric": {"kind": "switch", "device_gbps": 100.0, "latency_us": 1.0},
                 "nics": {"count": 1, "gbit_per_s": 100.0, "latency_us": 2.0}},
        "network": {"kind": "fat_tree", "group_nodes": 1, "hop_latency_us": 0.5}}))
    return cl


def test_cluster_run_record_fields_are_documented(capsys, tmp_path):
    cl = _tiny_cluster(tmp_path)
    out = tmp_path / "r.json"
    code, _, err = cli(capsys, "run", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--plan",
                       "tp=2,pp=2,mb=1,gbs=2", "--workers", "1", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    kernel_fields = {p for p in key_paths(doc, {}) if p.startswith("stages[].kernels[].")}
    workload_fields = {p for p in key_paths(doc, {}) if p.startswith("workload.") and p != "workload.global_batch"}
    paths = key_paths(doc, {"volumes": "<kind>"}) - kernel_fields - workload_fields
    missing = sorted(paths - documented())
    assert not missing, f"docs/records.md does not list these fields of a cluster run record: {missing}"


def test_plan_record_fields_are_documented(capsys, tmp_path):
    cl = _tiny_cluster(tmp_path)
    out = tmp_path / "p.json"
    code, _, err = cli(capsys, "plan", "--cluster", str(cl), "--workload", "tiny", "--phase", "train", "--gbs", "4",
                       "--workers", "1", "--json", str(out))
    assert code == 0, err
    text = DOC.read_text(encoding="utf-8")
    missing = sorted(p for p in key_paths(json.loads(out.read_text()), {}) if f"`{p}`" not in text)
    assert not missing, f"docs/records.md does not list these fields of a plan record: {missing}"


def test_every_schema_has_a_section():
    text = DOC.read_text(encoding="utf-8")
    schemas = set()
    for f in (ROOT / "archsim").rglob("*.py"):
        schemas |= set(re.findall(r'"(archsim\.[a-z_]+/\d+)"', f.read_text(encoding="utf-8")))
    assert "archsim.result/1" in schemas
    missing = sorted(s for s in schemas if f"\n## {s}\n" not in text)
    assert not missing, f"docs/records.md has no section for {missing}"
