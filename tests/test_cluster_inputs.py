"""Bad input to the multi-device commands and the YAML reader: one line, exit 2, before any
kernel is timed; options a cluster command does not use are refused rather than ignored."""

from __future__ import annotations

import json

import pytest
import yaml

from archsim.cli import main
from archsim.cluster.device_collective import _gpcs_less, contended_machine
from archsim.cluster.run import _covered
from archsim.cluster.spec import load_cluster, validate_cluster
from archsim.config.load import load_machine
from archsim.paths import data_dir

TINY = {"name": "tc", "device": "tiny-gpu", "nodes": 4,
        "node": {"devices": 4, "fabric": {"kind": "switch", "device_gbps": 100.0, "latency_us": 1.0},
                 "nics": {"count": 2, "gbit_per_s": 200.0, "latency_us": 2.0}},
        "network": {"kind": "fat_tree", "group_nodes": 2, "oversubscription": 1.0, "hop_latency_us": 0.5},
        "software": {"collective_step_us": 2.0, "kernel_gap_us": 1.0}}
BIG = "1" + "0" * 5000          # past Python's 4,300-digit limit on reading an int from text


def _cluster(tmp_path, name="c.yaml", **changes):
    d = json.loads(json.dumps(TINY))
    for path, v in changes.items():
        *head, last = path.split("__")
        cur = d
        for k in head:
            cur = cur[k]
        cur[last] = v
    p = tmp_path / name
    p.write_text(yaml.safe_dump(d))
    return str(p)


def _workload(tmp_path, base="tiny", **blocks):
    """A copy of a built-in workload with some of its blocks' keys changed."""
    d = yaml.safe_load((data_dir("workloads") / f"{base}.yaml").read_text())
    for block, kv in blocks.items():
        d[block] = {**(d.get(block) or {}), **kv}
    p = tmp_path / f"{base}-changed.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def _one_line(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def test_an_integer_past_the_digit_limit_is_one_line(capsys, tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(f"name: x\nnodes: {BIG}\n")
    _one_line(capsys, ["show-config", str(p)], f"{p}:2", "5001 characters", "4300 decimal digits")
    _one_line(capsys, ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--batch", BIG], "--batch:", "5001")
    wl = _workload(tmp_path)
    wl.write_text(wl.read_text().replace("seq: ", f"seq: {BIG[:4000]} #", 1))
    err = _one_line(capsys, ["run", "--hw", "tiny-gpu", "--workload", str(wl)], "scenario.seq", "(4000 characters)")
    assert "machine" not in err and len(err) < 300


def test_options_a_cluster_run_does_not_use_are_refused(capsys, tmp_path):
    run = ["run", "--workload", "tiny", "--workers", "1"]
    _one_line(capsys, run + ["--cluster", "jean-zay-a100", "--cluster", "dgx-a100-superpod", "--plan", "tp=1"],
              "--cluster: given twice")
    _one_line(capsys, run + ["--cluster", "jean-zay-a100", "--plan", "tp=1", "--plan", "tp=2"], "--plan: given twice")
    for flag in ("--tp", "--ep", "--batch"):
        _one_line(capsys, run + ["--cluster", "jean-zay-a100", "--plan", "tp=1", flag, "2"],
                  f"{flag} does not apply to a cluster run", "the plan's")
    _one_line(capsys, ["plan", "--cluster", "jean-zay-a100", "--workload", "tiny", "--tp", "2"],
              "--tp does not apply to plan")
    wl = _workload(tmp_path, scenario={"tensor_parallel": 2})
    _one_line(capsys, ["run", "--cluster", "jean-zay-a100", "--plan", "tp=1", "--workload", str(wl)],
              "scenario.tensor_parallel", "the plan's tp=")


@pytest.mark.parametrize("plan", ["tp=2_0", "tp=+2", "tp=\uff12", "gbs=1" + "0" * 400])
def test_plan_numbers_are_plain_ascii_digits(capsys, plan):
    err = _one_line(capsys, ["run", "--cluster", "jean-zay-a100", "--workload", "tiny", "--plan", plan],
                    "is not a whole number")
    assert len(err) < 300


def test_plan_names_a_batch_that_no_plan_splits(capsys):
    _one_line(capsys, ["plan", "--cluster", "jean-zay-a100", "--workload", "tiny", "--layers", "1", "--gbs", "7"],
              "--gbs: global batch 7 does not split", "the smallest dp here is 192")


def test_collective_software_is_checked_with_the_cluster(capsys, tmp_path):
    # show-config and run refuse it alike, naming the cluster file, before anything is timed
    bad = _cluster(tmp_path, software__collective_ctas=1, software__collective_unroll=64)
    for argv in (["show-config", bad],
                 ["run", "--cluster", bad, "--workload", "tiny", "--plan", "tp=1", "--workers", "1"]):
        _one_line(capsys, argv, f"{bad}: software.collective_unroll: 64 vectors a thread (1 to 16)")


def test_an_h100_device_gives_the_collectives_ctas_from_its_gpcs():
    # 24 SMs taken one at a time from the GPC holding the most: the largest GPCs shrink first
    assert _gpcs_less((18, 18, 18, 18, 16, 16, 16, 12), 24) == (14, 14, 14, 14, 14, 13, 13, 12)
    assert _gpcs_less((3, 1), 2) == (1, 1) and _gpcs_less((1, 1), 1) == (1,)
    d = json.loads(json.dumps(TINY))
    d.update(device="h100", software={"collective_ctas": 24})
    c = validate_cluster(d)
    h100 = load_machine("h100")
    less = contended_machine(c, h100)
    assert less.cores.per_group == 108 and sum(less.clusters.gpc_sms) == 108
    assert less.clusters.max_blocks == 14


def test_a_relative_device_path_is_the_cluster_files_folders(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "m.yaml").write_text((data_dir("configs") / "tiny-gpu.yaml").read_text())
    p = _cluster(tmp_path, device="dev/m.yaml")
    monkeypatch.chdir("/")
    assert load_cluster(p).device == str(tmp_path / "dev" / "m.yaml")


def test_cluster_files_are_told_from_machines(capsys, tmp_path):
    p = _cluster(tmp_path)
    d = yaml.safe_load(open(p))
    del d["nodes"]
    q = tmp_path / "no_nodes.yaml"
    q.write_text(yaml.safe_dump(d))
    _one_line(capsys, ["show-config", str(q)], "nodes: missing required key 'nodes'")
    own = _cluster(tmp_path, "self.yaml", device=p)
    _one_line(capsys, ["show-config", own], "device:", "is a cluster, not a machine")
    _one_line(capsys, ["run", "--cluster", "", "--workload", "tiny", "--plan", "tp=1"], "--cluster: an empty cluster")


def test_a_capacity_factor_is_a_number(capsys, tmp_path):
    wl = _workload(tmp_path, "tiny-moe", model={"moe": {"experts": 4, "top_k": 2, "capacity_factor": "1.5"}})
    _one_line(capsys, ["run", "--hw", "tiny-gpu", "--workload", str(wl)], "capacity_factor")


def test_no_progress_lines_when_stderr_is_not_a_terminal(capsys, tmp_path):
    assert main(["run", "--cluster", _cluster(tmp_path), "--workload", "tiny", "--phase", "train", "--plan",
                 "dp=2,mb=1,gbs=2", "--workers", "1"]) == 0
    assert capsys.readouterr().err == ""


def test_overlapped_communication_counts_concurrent_calls_once():
    # (kind, bytes, seconds, stage, start): [0, 2] and [1, 4] cover 4 s, [5, 6] one more
    calls = [("a", 1, 2.0, 0, 0.0), ("a", 1, 3.0, 0, 1.0), ("a", 1, 1.0, 0, 5.0), ("a", 1, 0.5, 0, 1.5)]
    assert _covered(calls) == 5.0 and _covered([]) == 0.0


def _sweep_spec(tmp_path, **over):
    (tmp_path / "tc.yaml").write_text(yaml.safe_dump(TINY))
    spec = {"cluster": "tc.yaml", "workload": "tiny", "phase": "train", "plan": "dp=2,mb=1,gbs=2", **over}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def test_yaml_keys_and_hex_numbers_are_one_line(capsys, tmp_path):
    p = tmp_path / "k.yaml"
    p.write_text("? [a, b]\n: 1\n")
    _one_line(capsys, ["show-config", str(p)], f"{p}:1", "a list as a mapping key")
    p.write_text(yaml.safe_dump(TINY).replace("nodes: 4", "nodes: 0x" + "f" * 4000))
    _one_line(capsys, ["show-config", str(p)], "an integer too large to read (4002 characters)")


@pytest.mark.parametrize("over,what", [
    ({"vary": {"plan.tp": ["1,pp=2"]}}, "not one plan value"),
    ({"vary": {"plan.tp": [[1, 2]]}}, "not one plan value"),
    ({"plan": "tp=1,tp=2"}, "tp given twice"),
    ({"max_points": 10 ** 9}, "at most 100,000"),
])
def test_bad_sweep_spec_values_are_one_line(capsys, tmp_path, over, what):
    _one_line(capsys, ["sweep", str(_sweep_spec(tmp_path, **over)), "--out", str(tmp_path / "o")], what)
    assert not (tmp_path / "o").exists()


def test_a_repeat_is_found_in_linear_time():
    from archsim.sweep import first_repeat

    assert first_repeat(list(range(200_000)) + [7]) == 200_000
    assert first_repeat([1, True]) == 1 and first_repeat([None, None]) == 1 and first_repeat([[1], [2]]) == -1


def test_a_damaged_sweep_directory_is_refused_or_run_again(capsys, tmp_path):
    spec = str(_sweep_spec(tmp_path))
    out = tmp_path / "o"
    assert main(["sweep", spec, "--out", str(out), "--workers", "1"]) == 0
    rec = next((out / "runs").glob("*.json"))
    rec.write_text("[]")                        # a damaged record: the point runs again
    assert main(["sweep", spec, "--out", str(out), "--workers", "1"]) == 0
    assert "1 run, 0 finished before" in capsys.readouterr().out
    (out / "sweep.json").unlink()
    (out / "sweep.json").mkdir()
    _one_line(capsys, ["sweep", spec, "--out", str(out)], "sweep.json: a directory where the sweep writes")
    _one_line(capsys, ["sweep", spec, "--out", ""], "--out: an empty path")


def test_plot_refuses_what_it_cannot_draw(capsys, tmp_path):
    import os

    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    _one_line(capsys, ["plot", str(fifo)], "not a regular file")
    _sweep_spec(tmp_path)          # writes tc.yaml
    assert main(["run", "--cluster", str(tmp_path / "tc.yaml"), "--workload", "tiny", "--phase", "train", "--plan",
                 "dp=2,mb=1,gbs=2", "--workers", "1", "--json", str(tmp_path / "x.json")]) == 0
    doc = json.loads((tmp_path / "x.json").read_text())
    doc["timeline"]["bins"] = 10 ** 9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    _one_line(capsys, ["plot", str(bad), "--out", str(tmp_path / "p")], "timeline.bins 1000000000 out of range")
    bad.write_text(json.dumps(doc).replace('"bins": 1000000000', '"bins": 1' + "0" * 5000))
    _one_line(capsys, ["plot", str(bad), "--out", str(tmp_path / "p")], "not a result")


def test_an_empty_curve_text_is_refused(capsys):
    _one_line(capsys, ["validate", "--cluster", "dgx-a100-superpod", "--curve", ""], "--curve: an empty text")
