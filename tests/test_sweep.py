"""`archsim sweep`: the grid, run keys, the results store (runs/<key>.json, results.parquet),
skipping finished keys, process-pool and Dask execution, failed points, bad specs, the plot.

Runs use tiny-gpu and the tiny workload with one layer and 5 tokens (a few seconds each)."""

from __future__ import annotations

import itertools
import json
import shutil

import pytest
import yaml

from archsim import sweep as S
from archsim.cli import main
from archsim.config.load import get_value

from test_cli import cli, one_line_error

BASE = {"hw": "tiny-gpu", "workload": "tiny", "phase": "prefill", "layers": 1, "seq": 5}
BANDWIDTHS = [16, 64]          # dram.channel_gbps of tiny-gpu's 2 channels (64 is its own value)


def spec_file(tmp_path, name="spec.yaml", **fields):
    doc = dict(BASE, **fields)
    doc = {k: v for k, v in doc.items() if v is not None}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def run_docs(out):
    """key -> the run's document without its wall-clock record."""
    docs = {}
    for f in sorted((out / "runs").glob("*.json")):
        d = json.loads(f.read_text())
        d.pop("sim")
        docs[f.stem] = d
    return docs


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One finished two-point sweep (in this process, --workers 1)."""
    d = tmp_path_factory.mktemp("sweep")
    spec = spec_file(d, vary={"dram.channel_gbps": BANDWIDTHS})
    out = d / "out"
    assert main(["sweep", str(spec), "--out", str(out)]) == 0
    return spec, out


# ----------------------------------------------------------------------------- grid and keys
def test_grid_is_the_cartesian_product_and_values_reach_machine_and_workload(tmp_path):
    vary = {"dram.channel_gbps": [16, 32], "clock_ghz": [1.0, 1.25, 1.5], "workload.seq": [5, 13]}
    spec = S.load_spec(str(spec_file(tmp_path, hw=["tiny-gpu", "a100"], seq=None, vary=vary)))
    points = S.expand(spec)
    want = [(h, dict(zip(vary, c))) for h in ("tiny-gpu", "a100") for c in itertools.product(*vary.values())]
    assert [(p.hw, p.values) for p in points] == want
    for p in points:
        assert p.machine.name == p.hw
        assert get_value(p.machine, "dram.channel_gbps") == p.values["dram.channel_gbps"]
        assert get_value(p.machine, "clock_ghz") == p.values["clock_ghz"]
        assert p.workload.scenario.seq == p.values["workload.seq"]
        assert p.workload.model.layers == 1 and p.workload.scenario.phase == "prefill"
    assert len({p.key for p in points}) == len(points)


def test_keys_are_stable_and_follow_the_resolved_run(tmp_path):
    vary = {"dram.channel_gbps": BANDWIDTHS, "workload.seq": [5, 13]}
    keys = {(p.hw, json.dumps(p.values, sort_keys=True)): p.key
            for p in S.expand(S.load_spec(str(spec_file(tmp_path, seq=None, vary=vary))))}
    # the same points written in another order resolve to the same keys
    again = S.expand(S.load_spec(str(spec_file(tmp_path, "b.yaml", seq=None, vary=dict(reversed(vary.items()))))))
    assert {(p.hw, json.dumps(p.values, sort_keys=True)): p.key for p in again} == keys
    assert len(set(keys.values())) == 4 and all(len(k) == 16 for k in keys.values())
    # a value equal to the machine's own gives the key of the unchanged machine
    (p64,) = S.expand(S.load_spec(str(spec_file(tmp_path, "c.yaml", vary={"dram.channel_gbps": [64]}))))
    (plain,) = S.expand(S.load_spec(str(spec_file(tmp_path, "d.yaml"))))
    assert p64.key == plain.key == keys[("tiny-gpu", json.dumps({"dram.channel_gbps": 64, "workload.seq": 5}))]
    # run options are part of the key
    (other,) = S.expand(S.load_spec(str(spec_file(tmp_path, "e.yaml", max_cycles=10**6))))
    assert other.key != plain.key


def test_relative_paths_are_taken_from_the_spec_folder(tmp_path, monkeypatch):
    from archsim.paths import data_dir

    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "my-gpu.yaml").write_text((data_dir("configs") / "tiny-gpu.yaml").read_text().replace(
        "name: tiny-gpu", "name: my-gpu"))
    spec = spec_file(folder, hw="my-gpu.yaml", vary={"clock_ghz": [1.0, 2.0]})
    monkeypatch.chdir(tmp_path)
    points = S.expand(S.load_spec(str(spec)))
    assert [(p.hw, p.machine.name, p.machine.clock_ghz) for p in points] == [("my-gpu.yaml", "my-gpu", 1.0),
                                                                             ("my-gpu.yaml", "my-gpu", 2.0)]


def test_the_example_spec_is_valid():
    from pathlib import Path

    spec = S.load_spec(str(Path(__file__).resolve().parents[1] / "examples" / "sweep-a100-dram.yaml"))
    points = S.expand(spec)
    assert [p.values for p in points] == [{"cores.per_group": c, "dram.channel_gbps": g}
                                          for c in (54, 108) for g in (155.5, 203.9)]
    assert all(p.machine.name == "a100" and p.workload.scenario.phase == "decode" for p in points)


def test_placement_is_a_sweep_dimension(tmp_path):
    """workload.placement varies like any scenario field; the Sunway private point keeps its DMA
    off the ring between core groups, and results.parquet names each point's placement."""
    import pandas as pd

    spec = spec_file(tmp_path, hw="tiny-sunway", vary={"workload.placement": ["cross", "private"]})
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out)]) == 0
    df = pd.read_parquet(out / "results.parquet")
    assert list(df["placement"]) == list(df["workload.placement"]) == ["cross", "private"]
    docs = run_docs(out)
    ring = {row["placement"]: max(ln["util"] for k in docs[row["key"]]["kernels"] for ln in k["fabric"]["links"]
                                  if " ring cg" in ln["name"]) for _, row in df.iterrows()}
    assert ring["private"] == 0 < ring["cross"]


# ----------------------------------------------------------------------------- the results store
def test_results_parquet_matches_the_run_jsons(swept):
    import pandas as pd

    spec, out = swept
    df = pd.read_parquet(out / "results.parquet")
    docs = run_docs(out)
    assert len(df) == 2 and set(df["key"]) == set(docs)
    assert list(df["dram.channel_gbps"]) == BANDWIDTHS
    for _, row in df.iterrows():
        d = docs[row["key"]]
        assert d["schema"] == "archsim.result/1" and d["complete"] is True
        assert d["sweep"]["values"] == {"dram.channel_gbps": row["dram.channel_gbps"]}
        # the varied value reached the machine: peak DRAM bandwidth = 2 channels x channel_gbps
        assert d["machine"]["peak_dram_gbps"] == pytest.approx(2 * row["dram.channel_gbps"])
        assert (row["machine"], row["workload"], row["phase"], row["status"]) == ("tiny-gpu", "tiny", "prefill", "ok")
        for f in S.TOTAL_FIELDS:
            assert row[f"total.{f}"] == d["total"][f]
        assert {c[len("cycles."):] for c in df.columns if c.startswith("cycles.")} == {k["name"] for k in d["kernels"]}
        for k in d["kernels"]:
            assert row[f"cycles.{k['name']}"] == k["cycles"]
    slow, fast = (docs[k] for k in df["key"])
    assert slow["total"]["cycles"] > fast["total"]["cycles"]      # a quarter of the DRAM bandwidth costs time
    meta = json.loads((out / "sweep.json").read_text())
    assert meta["schema"] == "archsim.sweep/1" and [p["status"] for p in meta["points"]] == ["ok", "ok"]


def test_parquet_takes_list_and_mixed_values(tmp_path):
    import pandas as pd

    rows = [{"key": "a", "tensor.mac_array": [4, 4, 4], "l2": None, "x": 1, "total.cycles": 10},
            {"key": "b", "tensor.mac_array": [8, 4, 4], "l2": {"size_kib": 128}, "x": "fast", "total.cycles": None}]
    df = pd.read_parquet(S.write_results(tmp_path, rows))
    assert list(df["tensor.mac_array"]) == ["[4, 4, 4]", "[8, 4, 4]"]
    assert list(df["x"]) == ["1", "fast"] and df["l2"][1] == '{"size_kib": 128}'
    assert df["total.cycles"][0] == 10 and pd.isna(df["total.cycles"][1])


def test_a_rerun_skips_finished_keys(swept, tmp_path, monkeypatch, capsys):
    spec, done = swept
    out = tmp_path / "out"
    shutil.copytree(done, out)
    before = run_docs(out)
    calls = []
    real = S.run_workload

    def counting(machine, wl, opts=None, progress=None):
        calls.append(machine.dram.channel_gbps)
        return real(machine, wl, opts, progress)

    monkeypatch.setattr(S, "run_workload", counting)
    code, text, _ = cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 0 and calls == [] and "0 run, 2 finished before" in text
    assert run_docs(out) == before
    # a third value: only its point runs; the parquet holds all three
    spec3 = spec_file(tmp_path, vary={"dram.channel_gbps": BANDWIDTHS + [32]})
    code, text, _ = cli(capsys, "sweep", str(spec3), "--out", str(out))
    assert code == 0 and calls == [32] and "1 run, 2 finished before" in text
    import pandas as pd

    assert list(pd.read_parquet(out / "results.parquet")["dram.channel_gbps"]) == BANDWIDTHS + [32]
    # an interrupted run leaves no runs/<key>.json (written tmp + rename): it runs again next time
    (out / "runs" / f"{S.expand(S.load_spec(str(spec3)))[2].key}.json").unlink()
    assert cli(capsys, "sweep", str(spec3), "--out", str(out))[0] == 0 and calls == [32, 32]


def test_two_workers_give_the_same_results_as_one(swept, tmp_path):
    """... and the spawned workers use the kernel timing cache given to the sweep."""
    from archsim import kernel_cache

    spec, one = swept
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--workers", "2", "--cache", str(tmp_path / "kc")]) == 0
    assert run_docs(out) == run_docs(one)
    assert len(kernel_cache.entries(tmp_path / "kc")) > 0


def test_dask_scheduler_gives_the_same_results(swept, tmp_path):
    distributed = pytest.importorskip("distributed")
    spec, one = swept
    out = tmp_path / "out"
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        assert main(["sweep", str(spec), "--out", str(out), "--scheduler", cluster.scheduler_address]) == 0
    assert run_docs(out) == run_docs(one)


def test_sweep_plot(swept, tmp_path, capsys):
    _, out = swept
    code, text, _ = cli(capsys, "plot", str(out), "--out", str(tmp_path))
    assert code == 0 and (tmp_path / "sweep.png").stat().st_size > 1000


# ----------------------------------------------------------------------------- failures
def test_a_point_that_cannot_finish_is_recorded_and_the_exit_status_says_so(tmp_path, capsys):
    import pandas as pd

    # 0.5 GB/s per channel cannot finish a GEMM in 8000 cycles; 64 GB/s finishes every kernel well inside it
    spec = spec_file(tmp_path, max_cycles=8000, vary={"dram.channel_gbps": [0.5, 64]})
    out = tmp_path / "out"
    code, text, err = cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 3 and "1 failed" in text
    assert "max-cycles" in err and "Traceback" not in err
    df = pd.read_parquet(out / "results.parquet")
    assert list(df["status"]) == ["incomplete", "ok"]
    bad = json.loads((out / "runs" / f"{df['key'][0]}.json").read_text())
    assert bad["complete"] is False and "max-cycles" in bad["error"] and df["error"][0] == bad["error"]
    assert json.loads((out / "runs" / f"{df['key'][1]}.json").read_text())["complete"] is True


def test_a_point_that_raises_is_recorded_and_retried(tmp_path, monkeypatch, capsys):
    real = S.run_workload
    calls = []

    def flaky(machine, wl, opts=None, progress=None):
        calls.append(machine.dram.channel_gbps)
        if machine.dram.channel_gbps == 16:
            raise RuntimeError("worker lost")
        return real(machine, wl, opts, progress)

    monkeypatch.setattr(S, "run_workload", flaky)
    spec = spec_file(tmp_path, vary={"dram.channel_gbps": BANDWIDTHS})
    out = tmp_path / "out"
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 3 and "RuntimeError: worker lost" in err
    import pandas as pd

    df = pd.read_parquet(out / "results.parquet")
    assert list(df["status"]) == ["error", "ok"] and df["error"][0] == "RuntimeError: worker lost"
    assert df["total.cycles"].isna().tolist() == [True, False]
    # the failed key is not finished: the next sweep runs it again, and only it
    code, _, _ = cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 3 and calls == [16, 64, 16]


# ----------------------------------------------------------------------------- bad specs
BAD = [
    ({"frob": 1}, "frob: unknown key 'frob' (known keys: hw, workload, "),
    ({"vary": {"dram.channel_gbps": []}}, "vary.dram.channel_gbps: empty list (a non-empty list of values)"),
    ({"vary": {"dram.channel_gbps": 64}}, "vary.dram.channel_gbps: expected a list of values, got 64"),
    ({"vary": {"dram.channel_gbps": [16, 16]}}, "vary.dram.channel_gbps: value 16 appears twice"),
    ({"vary": {"dram.channel_gbpz": [1, 2]}},
     "vary.dram.channel_gbpz: unknown key 'channel_gbpz' in dram (known keys: "),
    ({"vary": {"dram.channel_gbps": [16, -1]}}, "vary.dram.channel_gbps: value -1 out of range (a number > 0)"),
    ({"vary": {"cores.scheduler": ["gto", "fifo"]}}, "vary.cores.scheduler: unknown value 'fifo' (one of: lrr, gto)"),
    ({"hw": ["tiny-gpu", "tiny-sunway"], "vary": {"l2.size_kib": [128]}},
     "vary.l2.size_kib: tiny-sunway has no l2 block"),
    ({"vary": {"workload.seq": [5, 0]}, "seq": None}, "vary.workload.seq: value 0 out of range (an integer > 0)"),
    ({"vary": {"workload.seq": [5]}}, "vary.workload.seq: seq is both fixed (top-level seq) and varied"),
    ({"vary": {"workload.frob": [1]}}, "vary.workload.frob: unknown workload field 'frob' (workload.<field>, one of: "),
    ({"batch": 0}, "batch: value 0 out of range (an integer > 0)"),
    ({"placement": "private"}, "workload: placement: private: tiny-gpu has no private segments"),
    ({"placement": "shared"}, "placement: "),
    ({"set": {"dram.channels": 3}}, "set.dram.channels: dram.channels 3 is not a multiple of memory_controllers.count"),
    ({"set": {"dram.channel_gbps": 1}, "vary": {"dram.channel_gbps": [1]}},
     "vary.dram.channel_gbps: dram.channel_gbps is both fixed (set) and varied"),
    ({"mode": "fast"}, "mode: unknown value 'fast' (one of: timing, functional)"),
    ({"sample_waves": 2}, "sample_waves: value 2 out of range"),
    ({"sample_max_error": 2}, "sample_max_error: 2 (a fraction in (0, 1)"),
    ({"hw": []}, "hw: empty list"),
    ({"hw": "nope"}, "hw: unknown machine 'nope'"),
    ({"workload": "nope"}, "workload: unknown workload 'nope'"),
    # a Sunway emitter's limit, found when the point's kernels are emitted: the fused backward's
    # fp32 blocks at head_dim 128 do not fit tiny-sunway's 64 KiB LDM
    ({"hw": "tiny-sunway", "phase": "train", "dtype": "fp32",
      "vary": {"workload.head_dim": [128], "workload.hidden": [256]}},
     "vary point {workload.head_dim=128, workload.hidden=256}: workload tiny, op attn.grad (attention_grad): "
     "attention backward on tiny-sunway: head_dim 128 "
     "fp32 (dK, dV kernel): no block fits the 65536 B LDM of a CPE"),
]


@pytest.mark.parametrize("fields,line", BAD, ids=[b[1].split(":")[0] + str(i) for i, b in enumerate(BAD)])
def test_bad_specs_exit_2_with_one_line_before_any_run(tmp_path, monkeypatch, capsys, fields, line):
    monkeypatch.setattr(S, "run_workload", lambda *a, **k: pytest.fail("a run started"))
    spec = spec_file(tmp_path, **fields)
    out = tmp_path / "out"
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(out))
    assert code == 2
    assert one_line_error(err).startswith(f"archsim: error: {spec}: {line}")
    assert not out.exists()


def test_bad_command_lines(tmp_path, capsys):
    spec = spec_file(tmp_path)
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"), "--workers", "0")
    assert code == 2 and one_line_error(err).startswith("archsim: error: --workers: 0 is not a worker count")
    code, _, err = cli(capsys, "sweep", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o"))
    assert code == 2 and "sweep spec not found" in one_line_error(err)


def test_a_grid_beyond_max_points_is_refused_before_it_is_resolved(tmp_path, capsys, monkeypatch):
    """issue 20, item 5: a million-point grid took minutes and 2.5 GB resolving, then wrote nothing."""
    monkeypatch.setattr(S, "_Resolver", lambda *a: pytest.fail("resolved a grid beyond max_points"))
    spec = spec_file(tmp_path, vary={"dram.channel_gbps": list(range(1, 1001)), "clock_ghz": list(range(1, 1001))})
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"))
    assert code == 2 and "1,000,000 points, more than max_points 10,000" in one_line_error(err)
    spec = spec_file(tmp_path, "small.yaml", max_points=1, vary={"dram.channel_gbps": [16, 64]})
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"))
    assert code == 2 and "more than max_points 1" in one_line_error(err)


def test_a_point_beyond_the_device_or_the_instruction_limit_is_refused_before_any_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(S, "run_workload", lambda *a, **k: pytest.fail("a run started"))
    spec = spec_file(tmp_path, seq=None, vary={"workload.seq": [5, 10000000]})
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"))
    line = one_line_error(err)
    assert code == 2 and "workload.seq=10000000" in line and "of DRAM tiny-gpu has" in line
    spec = spec_file(tmp_path, "b.yaml", max_instructions=10)
    code, _, err = cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"))
    assert code == 2 and "max_instructions: N in the spec" in one_line_error(err)
