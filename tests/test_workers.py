"""--workers N: distinct kernels timed on N spawned processes give the same documents as one
process (run, compare, micro, a run that stops), and bad worker counts are one line (exit 2).
Each case runs in this process first, so the spawned workers load the engine from numba's cache."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

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
                            if k not in ("wall_seconds", "warp_instructions_per_second", "kernel_cache",
                                         "compile_seconds", "setup_seconds", "simulate_seconds")}
                for e in (r["sim"].get("kernels") or {}).values():   # per kernel: only the seconds differ
                    e.pop("wall_seconds"), e.pop("simulate_seconds")
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


def test_the_record_splits_compile_set_up_and_simulation(tmp_path):
    out = tmp_path / "r.json"
    assert main(["run", "--hw", "tiny-gpu", "--workload", "tiny", "--workers", "1", "--no-cache",
                 "--json", str(out)]) == 0
    sim = json.loads(out.read_text())["sim"]
    assert sim["simulate_seconds"] > 0 and sim["setup_seconds"] > 0 and sim["compile_seconds"] >= 0
    assert sim["simulated_warp_instructions"] > 0
    # the rate counts the simulation's own seconds, not the wall time (compile and set-up excluded)
    assert sim["warp_instructions_per_second"] == pytest.approx(     # (the seconds are rounded to 0.1 ms)
        sim["simulated_warp_instructions"] / sim["simulate_seconds"], rel=1e-4 / sim["simulate_seconds"] + 1e-6)


# ---------------------------------------------------------------------------- workers' lifetime
# A real run with two workers, started as a command; the tests end it (or one of its workers) while
# it simulates and check what is left. gpt2-small on a100 simulates for several seconds.
_LONG_RUN = [sys.executable, "-m", "archsim", "run", "--hw", "a100", "--workload", "gpt2-small", "--workers", "2",
             "--no-cache"]


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except OSError:
        return ""


def _task_note(pid: int) -> str:
    """The label of the task worker ``pid`` noted it is running (workers._note_task), "" for none."""
    import glob

    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"archsim-tasks-*/{pid}")):
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            pass
    return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_long_run():
    """The run, once its two workers are simulating: (process, worker pids)."""
    from archsim.warmup import ensure_timing_engine

    ensure_timing_engine()          # the command loads the engine from numba's cache
    p = subprocess.Popen(_LONG_RUN, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [c for c in _children(p.pid) if "spawn_main" in _cmdline(c)]
        if len(workers) == 2 and all(_task_note(w) for w in workers):
            return p, workers        # both past their start, each noted the kernel it times
        time.sleep(0.05)
    p.kill()
    pytest.fail("the run's workers did not start")


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(w) for w in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigterm_ends_the_run_and_its_workers():
    p, workers = _start_long_run()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 143
    assert _gone_within(workers, 3.0)
    assert p.stderr.read().strip().splitlines()[-1] == "archsim: terminated"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_end_when_their_parent_is_killed():
    p, workers = _start_long_run()
    p.kill()                          # SIGKILL: no handler runs in the parent
    p.wait(timeout=10)
    assert _gone_within(workers, 3.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_dead_worker_ends_the_run_in_one_line_naming_its_kernel():
    p, workers = _start_long_run()
    label = _task_note(workers[0])
    os.kill(workers[0], signal.SIGKILL)
    assert p.wait(timeout=60) == 3
    err = p.stderr.read().strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert label.startswith("kernel ") and label.endswith(" on a100")
    assert err[0] == f"archsim: error: {label}: the worker process timing it died (killed for memory, or crashed) " \
                     "before the kernel finished"
    assert _gone_within(workers, 3.0)


def test_a_pool_without_the_engine_does_not_compile_it(monkeypatch):
    from archsim import warmup
    from archsim.workers import Pool

    def refuse():
        raise AssertionError("the timing engine was asked for")

    monkeypatch.setattr(warmup, "ensure_timing_engine", refuse)
    with Pool(1, engine=False) as pool:
        assert pool.submit(sum, (1, 2, 3)).result() == 6
    with Pool(1) as pool, pytest.raises(AssertionError, match="timing engine"):
        pool.submit(sum, (1, 2, 3)).result()
