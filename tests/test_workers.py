"""--workers N: distinct kernels timed on N spawned processes give the same documents as one
process (run, compare, micro, a run that stops), and bad worker counts are one line (exit 2).
Each case runs in this process first, so the spawned workers load the engine from numba's cache."""

from __future__ import annotations

import json

import pytest

from archsim.cli import main


@pytest.mark.parametrize("argv", [
    ["run", "--hw", "tiny-gpu", "--workload", "tiny", "--phase", "train"],
    ["compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny"],
    ["micro", "attention", "--hw", "tiny-gpu", "--param", "heads=2", "--param", "seq=128", "--param", "fused=false"],
])
def test_workers_give_the_same_document(argv, tmp_path):
    docs = []
    for n in (1, 2):
        out = tmp_path / f"w{n}.json"
        assert main(argv + ["--workers", str(n), "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text()))
    a, b = docs

    def strip(d):
        for r in [d, d.get("result", {})] + list(d.get("results", [])):
            if isinstance(r, dict) and isinstance(r.get("sim"), dict):
                r["sim"] = {k: v for k, v in r["sim"].items()
                            if k not in ("wall_seconds", "warp_instructions_per_second", "kernel_cache")}
        d.pop("wall_seconds", None)
        return d

    workers = [r["sim"]["kernel_cache"]["workers"] for r in [b] + b.get("results", []) if "kernel_cache" in r.get("sim", {})]
    assert all(w == 2 for w in workers)
    assert strip(a) == strip(b)


def test_a_run_that_stops_on_a_worker_keeps_the_same_partial_result(tmp_path, capsys):
    docs, errs = [], []
    for n in (1, 2):
        out = tmp_path / f"w{n}.json"
        assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny", "--max-cycles", "3000", "--workers", str(n),
                     "--json", str(out)]) == 3
        errs.append(capsys.readouterr().err.strip())
        d = json.loads(out.read_text())
        d.pop("sim")
        docs.append(d)
    assert docs[0] == docs[1] and not docs[0]["complete"]
    assert errs[0] == errs[1] and errs[0].count("\n") == 0 and "--max-cycles 3000" in errs[0]


@pytest.mark.parametrize("cmd", [
    ["run", "--hw", "tiny-gpu", "--workload", "tiny"],
    ["compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny"],
    ["micro", "latency", "--hw", "tiny-gpu"],
])
@pytest.mark.parametrize("bad", ["0", "-2"])
def test_bad_worker_counts_are_one_line(cmd, bad, capsys):
    assert main(cmd + ["--workers", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("archsim: error: --workers:") and "positive integer" in err


def test_the_api_takes_workers():
    import archsim

    m = archsim.load_machine("tiny-gpu")
    wl = archsim.load_workload("tiny")
    one = archsim.run(m, wl, workers=1).record
    two = archsim.run(m, wl, workers=2).record
    for r in (one, two):
        r.pop("sim")
    assert one == two


def test_the_default_comes_from_the_environment(monkeypatch, capsys):
    from archsim.workers import default_workers

    monkeypatch.setenv("ARCHSIM_WORKERS", "3")
    assert default_workers() == 3
    monkeypatch.setenv("ARCHSIM_WORKERS", "many")
    assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "ARCHSIM_WORKERS" in err
