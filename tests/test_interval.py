"""Interval sampling (archsim.interval) and the resumable launch it rests on (timing.KernelRun)."""

from __future__ import annotations

import json

import numpy as np

from archsim.cli import main
from archsim.config import load_machine
from archsim.engine import timing as TI
from archsim.engine.launch import Unbacked
from archsim.interval import time_interval
from archsim.isa.asm import assemble
from archsim.isa.program import Launch
from archsim.sample import sampled_record

SPIN = """.kernel spin
.param n
.param x
.launch grid=2 block=128
        ldparam r0, n
        mov.b64 r1, 0
        mov.f32 r2, 1.0
LOOP:   fma.f32 r2, r2, r2, r2
        fma.f32 r3, r2, r2, r2
        add.i64 r1, r1, 1
        setp.lt.i64 p0, r1, r0
   @p0  bra LOOP
{tail}        exit
"""
LAUNCH = Launch((2, 1, 1), (128, 1, 1))     # one block a core of tiny-gpu: every warp alike


def _spin(tail: str = ""):
    return assemble(SPIN.format(tail=tail)), {"n": 20000, "x": Unbacked(1 << 16)}


def test_a_launch_run_in_stops_ends_as_one_run():
    machine = load_machine("tiny-gpu")
    prog, args = _spin("        ldparam r4, x\n        st.global.b64 [r4], r1\n")
    whole = TI.time_kernel(prog, machine, LAUNCH, args)
    run = TI.start_kernel(prog, machine, LAUNCH, args)
    for stop in (1, 5000, 5001, 77777, 200000):
        run.advance(stop)
        assert not run.done and run.now >= stop
    run.advance(10**9)
    got = run.finish(10**9)
    assert (got.cycles, got.warp_instructions, got.flops) == (whole.cycles, whole.warp_instructions, whole.flops)
    assert np.array_equal(got.stall, whole.stall) and got.memory["bytes"] == whole.memory["bytes"]


def test_a_steady_launch_is_answered_within_its_error_estimate():
    machine = load_machine("tiny-gpu")
    prog, args = _spin()
    whole = TI.time_kernel(prog, machine, LAUNCH, args)
    got = time_interval(prog, machine, LAUNCH, args, max_error=0.03, stop_cycles=1024)
    assert got.sampled and 0 < got.error_est <= 0.03
    assert abs(got.timing.cycles / whole.cycles - 1) <= got.error_est
    assert got.timing.warp_instructions == whole.warp_instructions       # counted, not extrapolated
    assert got.info["instructions_simulated"] < whole.warp_instructions / 5
    lo, hi = got.info["interval_cycles"]
    assert hi == 2 * lo or hi == 2 * lo + 1 or hi >= 2 * lo
    assert abs(got.timing.flops / whole.flops - 1) < 0.01


def test_a_phase_the_interval_never_saw_is_simulated_to_the_end():
    # the store after the loop is a memory instruction no interval issues: the launch runs whole
    machine = load_machine("tiny-gpu")
    prog, args = _spin("        ldparam r4, x\n        st.global.b64 [r4], r1\n")
    whole = TI.time_kernel(prog, machine, LAUNCH, args)
    got = time_interval(prog, machine, LAUNCH, args, max_error=0.03, stop_cycles=1024)
    assert not got.sampled and got.timing.cycles == whole.cycles
    assert got.info["stops"] and all(s["error_est"] == 1.0 for s in got.info["stops"])


def test_uncountable_launches_are_left_to_the_caller():
    machine = load_machine("tiny-gpu")
    prog = assemble(SPIN.format(tail="").replace("ldparam r0, n", "ldparam r0, x\n        ld.global.b64 r0, [r0]"))
    assert time_interval(prog, machine, LAUNCH, {"n": 1, "x": Unbacked(64)}, max_error=0.03) is None


def test_the_record_says_how_the_launch_was_answered(monkeypatch):
    import archsim.interval as IV

    monkeypatch.setattr(IV, "STOP_CYCLES", 1024)
    machine = load_machine("tiny-gpu")
    prog, args = _spin()
    rec = sampled_record("spin", prog, machine, LAUNCH, args, interval=True)
    assert rec["sampled"] and rec["sample_method"] == "interval"
    assert rec["sample_interval"]["instructions_total"] == rec["warp_instructions"]
    assert 0 < rec["waves_simulated"] < 1
    assert sampled_record("spin", prog, machine, LAUNCH, args)["sample_method"] == "whole"   # opt-in


def test_interval_sampling_needs_sampling_on(tmp_path, capsys):
    assert main(["run", "--hw", "tiny-gpu", "--workload", "gpt2-small", "--layers", "1", "--seq", "64",
                 "--no-sample", "--sample-interval"]) == 2
    assert "--sample-interval" in capsys.readouterr().err
    src = tmp_path / "k.s"
    src.write_text(SPIN.format(tail="") + "")
    assert main(["asm", str(src), "--hw", "tiny-gpu", "--timing", "--sample-interval"]) == 2
    assert "--sample" in capsys.readouterr().err


def test_a_run_with_interval_sampling_names_it_in_its_records(tmp_path):
    out = tmp_path / "r.json"
    assert main(["run", "--hw", "tiny-gpu", "--workload", "gpt2-small", "--layers", "1", "--seq", "64",
                 "--sample-interval", "--json", str(out), "--no-cache"]) == 0
    doc = json.loads(out.read_text())
    assert all(k["sample_method"] in ("whole", "whole_after_fallback", "interval", "sampled")
               for k in doc["kernels"])


def test_a_launch_that_faults_at_once_is_one_line(tmp_path, capsys):
    src = tmp_path / "f.s"
    text = SPIN.format(tail="").replace("ldparam r0, n", "ldparam r0, n\n        ld.global.b64 r9, [r0]")
    src.write_text(text.replace(".launch", ".arg n = 20000\n.arg x f32[16] unbacked\n.launch"))
    assert main(["asm", str(src), "--hw", "tiny-gpu", "--timing", "--sample", "--sample-interval", "--no-cache"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "outside global memory" in err[0]
    assert main(["asm", str(src), "--hw", "tiny-gpu", "--sample-interval"]) == 2


def test_a_sweep_passes_interval_sampling_to_its_runs():
    from archsim.runner import RunOptions
    from archsim.sweep import _options_dict

    assert _options_dict(RunOptions(interval=True))["interval"] is True
    assert "interval" not in _options_dict(RunOptions())      # the keys of sweeps without it are unchanged
    assert RunOptions(**_options_dict(RunOptions(interval=True))).interval
