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
    # where the time went, per distinct kernel of each machine: what was simulated of each, and its cost
    for side in ("single", "parallel"):
        rows = j[side]["kernels"]
        assert {r["machine"] for r in rows} == {"tiny-gpu", "tiny-sunway"}
        for r in rows:
            assert 1 <= r["simulated_waves"] <= r["waves"]
            assert 0 < r["simulated_warp_instructions"] <= r["warp_instructions"]
            assert r["wall_seconds"] >= r["simulate_seconds"] > 0
        assert sum(r["simulated_warp_instructions"] for r in rows) == j[side]["warp_instructions"]


def test_an_unknown_job_is_one_line(capsys):
    assert main(["bench", "--job", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown job 'nope'" in err and "compare-gpt2-small" in err


def test_profile_fields_come_with_every_case():
    res = run_bench(TINY, repeat=1, warmup=())
    assert res["host_loop_ns_per_issue"] > 0
    for c in res["cases"]:
        assert c["ns_per_warp_instruction"] > 0 and c["simulate_seconds"] > 0
        v = c["visits"]
        assert {"scheduler", "core_memory", "dram_channel", "fabric_port"} <= set(v)
        for fam in v.values():
            assert fam["visits"] > 0 and fam["per_cycle"] > 0 and 0 <= fam["idle_share"] <= 1


def test_unit_visits_follow_the_units_stepped():
    """With skip-ahead off every unit family that is stepped whole is looked at every cycle of its
    clock: each L2 slice and DRAM-path channel every fabric cycle, each DRAM channel every memory
    cycle, each core's memory side every core cycle (a GPU has no spans of cores)."""
    from archsim.config import load_machine
    from archsim.engine import memory as M
    from archsim.engine.launch import Unbacked
    from archsim.engine.timing import start_kernel
    from archsim.isa.asm import assemble_file
    from archsim.isa.program import Launch
    from archsim.paths import isa_kernel

    m = load_machine("tiny-gpu")
    n = 4096
    run = start_kernel(assemble_file(isa_kernel("examples", "vector_add")), m, Launch((8, 1, 1), (128, 1, 1)),
                       {"x": Unbacked(4 * n), "y": Unbacked(4 * n), "out": Unbacked(4 * n), "n": n}, skip=False)
    run.advance(10**7)
    v = M.visit_counts(run.MS)
    fab, mem = int(run.MS.clocks[M.CK_NOW_FAB]), int(run.MS.clocks[M.CK_NOW_MEM])
    cores = m.groups * m.cores.per_group
    assert v["l2_slice"][0] == m.l2.slices * fab
    assert v["dram_path"][0] == m.dram.channels * fab
    assert v["dram_channel"][0] == m.dram.channels * mem
    assert v["core_memory"][0] == cores * run.now
    assert v["scheduler"][0] == cores * m.cores.subcores * run.now       # every scheduler, every cycle
    for looked, changed in v.values():
        assert 0 <= changed <= looked
    assert v["scheduler"][1] > 0 and v["dram_channel"][1] > 0 and v["fabric_port"][1] > 0
