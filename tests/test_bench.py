"""`archsim bench`: the record's shape and the median run of repeated cases (no timing is asserted:
speed is measured by the bench itself, never by a test)."""

import pytest

from archsim.bench import SCHEMA, run_bench
from archsim.cli import main

TINY = (("tiny-gemm", "tiny-gpu", "gemm", {"m": 32, "n": 32, "k": 32}),
        ("tiny-stream", "tiny-sunway", "bandwidth", {"footprint_mib": 0.125}))


def test_each_case_runs_repeat_times_and_reports_its_median_run():
    seen = []
    res = run_bench(TINY, progress=seen.append, repeat=3, warmup=())
    assert res["schema"] == SCHEMA and [c["name"] for c in res["cases"]] == ["tiny-gemm", "tiny-stream"]
    assert seen == res["cases"]
    for c in res["cases"]:
        runs = c["wall_seconds_runs"]
        assert c["repeat"] == 3 and len(runs) == 3
        assert c["wall_seconds"] == sorted(runs)[1]                 # the median of three
        assert c["warp_instructions"] > 0 and c["simulated_cycles"] > 0
        w, wi = c["wall_seconds"], c["warp_instructions"]        # (wall seconds are rounded to 1 ms)
        assert wi / (w + 0.0005) <= c["warp_instructions_per_second"] <= wi / max(w - 0.0005, 1e-9)
    rates = sorted(c["warp_instructions_per_second"] for c in res["cases"])
    assert res["warp_instructions_per_second"] == pytest.approx(sum(rates) / 2)     # median of two cases


def test_one_run_is_its_own_median():
    c = run_bench(TINY[:1], repeat=1, warmup=())["cases"][0]
    assert c["wall_seconds_runs"] == [c["wall_seconds"]]


def test_repeat_must_be_positive(capsys):
    with pytest.raises(ValueError):
        run_bench(TINY, repeat=0, warmup=())
    assert main(["bench", "--repeat", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["archsim: error: --repeat: 0 is not a run count (a positive integer)"]


def test_jobs_run_in_one_process_and_on_workers_with_the_same_totals(monkeypatch):
    import archsim.bench as B

    monkeypatch.setattr(B, "JOBS", (("tiny-compare", ("tiny-gpu", "tiny-sunway"), "tiny", {"layers": 1}),))
    [j] = B.run_jobs(workers=2)
    assert j["name"] == "tiny-compare" and j["workers"] == 2
    for side in ("single", "parallel"):
        r = j[side]
        assert r["wall_seconds"] > 0 and r["simulated_cycles"] > 0 and r["warp_instructions"] > 0
    assert j["single"]["simulated_cycles"] == j["parallel"]["simulated_cycles"]
    assert j["single"]["warp_instructions"] == j["parallel"]["warp_instructions"]


def test_an_unknown_job_is_one_line(capsys):
    assert main(["bench", "--job", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown job 'nope'" in err and "compare-gpt2-small" in err
