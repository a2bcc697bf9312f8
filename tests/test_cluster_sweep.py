"""Sweeps over clusters and plans: every point checked first, each a whole step as `run --cluster`
simulates it, resumable, one parquet row a point."""

from __future__ import annotations

import json

import pytest
import yaml

from archsim.cli import main

TINY = {"name": "tc", "device": "tiny-gpu", "nodes": 4,
        "node": {"devices": 4, "fabric": {"kind": "switch", "device_gbps": 100.0, "latency_us": 1.0},
                 "nics": {"count": 2, "gbit_per_s": 200.0, "latency_us": 2.0}},
        "network": {"kind": "fat_tree", "group_nodes": 2, "oversubscription": 1.0, "hop_latency_us": 0.5},
        "software": {"collective_step_us": 2.0, "kernel_gap_us": 1.0}}


def _spec(tmp_path, **over):
    (tmp_path / "tc.yaml").write_text(yaml.safe_dump(TINY))
    spec = {"cluster": "tc.yaml", "workload": "tiny", "phase": "train", "plan": "tp=2,pp=2,dp=2,mb=1,gbs=8",
            "vary": {"plan.tp": [1, 2], "cluster.node.fabric.device_gbps": [1.0, 100.0]}, **over}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_cluster_sweep_runs_every_point_once(capsys, tmp_path):
    import pandas as pd

    spec = _spec(tmp_path)
    out = tmp_path / "o"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 0
    assert "4 points: 4 run, 0 finished before" in capsys.readouterr().out
    df = pd.read_parquet(out / "results.parquet")
    assert len(df) == 4 and set(df["plan.tp"]) == {1, 2}
    # a slower node fabric makes every step longer
    for tp in (1, 2):
        slow = df[(df["plan.tp"] == tp) & (df["cluster.node.fabric.device_gbps"] == 1.0)]["step.step_seconds"].item()
        fast = df[(df["plan.tp"] == tp) & (df["cluster.node.fabric.device_gbps"] == 100.0)]["step.step_seconds"].item()
        assert slow > fast
    rec = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert rec["schema"] == "archsim.cluster/1" and set(rec["sweep"]["values"]) == {"plan.tp",
                                                                                   "cluster.node.fabric.device_gbps"}
    assert json.loads((out / "sweep.json").read_text())["points"] == 4
    # again: every point is there already
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "1"]) == 0
    assert "4 points: 0 run, 4 finished before" in capsys.readouterr().out


@pytest.mark.parametrize("over,where,what", [
    ({"vary": {"plan.tp": [3]}}, "point tc.yaml {'plan.tp': 3}", "tp"),
    ({"vary": {"plan.bogus": [1]}}, "vary.plan.bogus", "not a plan key"),
    ({"vary": {"cluster.node.nics.count": [0]}}, "nics.count", ""),
    ({"vary": {"plan.dp": [64]}}, "point tc.yaml {'plan.dp': 64}", "devices"),
    ({"plan": ""}, "plan", "not a plan"),
    ({"hw": "a100"}, "hw", "unknown key 'hw' in a cluster sweep"),
])
def test_bad_cluster_sweep_is_one_line_before_anything_runs(capsys, tmp_path, over, where, what):
    spec = _spec(tmp_path, **over)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "1"]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and where in err and what in err and not cap.out, err
    assert not (tmp_path / "o" / "runs").exists()
