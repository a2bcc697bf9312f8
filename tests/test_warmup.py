"""The engine's compile: the compile clock, the line that announces a compile (once, with the time
the last one took), and the warm-up that compiles the timing engine before workers start (its small
launches are not counted as simulated work)."""

from __future__ import annotations

import json

import numba
import pytest

from archsim import kernel_cache, warmup
from archsim.engine import jit
from archsim.engine.machine import loop_compiled


def _add_one(x):
    return x + 1


def test_a_compile_is_timed_and_an_entry_point_announced_once(monkeypatch, tmp_path):
    lines = []
    monkeypatch.setattr(jit, "note", lines.append)
    monkeypatch.setattr(jit, "_announced", set())
    monkeypatch.setattr(jit, "_recorded", set())
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba-now"))
    monkeypatch.setitem(jit.ENTRY_POINTS, f"{__name__}._add_one", "the test engine")
    monkeypatch.setitem(jit.COMPILE_SECONDS_DEFAULT, "the test engine", 7)
    f = numba.njit(cache=False)(_add_one)
    before = jit.compile_seconds()
    assert f(1) == 2
    took = jit.compile_seconds() - before
    assert took > 0
    assert lines == ["archsim: compiling the test engine, once after install: about 7 s (later runs load it "
                     "from the cache)"]
    recorded = json.loads((tmp_path / "numba-now" / "compile-seconds.json").read_text())["the test engine"]
    assert recorded == pytest.approx(took, abs=0.06)
    assert f(2.5) == 3.5                         # another specialization: compiled, not announced again
    assert len(lines) == 1
    f(3)                                         # compiled already: the clock does not move
    t = jit.compile_seconds()
    f(4)
    assert jit.compile_seconds() == t
    # a later engine source's first compile is announced with the time recorded here
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba-later"))
    assert jit.expected_compile_seconds("the test engine") == max(round(recorded), 1)


def test_the_warm_up_counts_compile_seconds_only(monkeypatch):
    """Forced to run (as after an install), the warm-up compiles (here: loads from the cache) the
    parts and the loop and times its small launches, but leaves no simulated instruction, cycle or
    visit in the process's counts: only its seconds, as compile seconds."""
    warmup.ensure_timing_engine()                # the engine in the cache (compiled once per session)
    assert loop_compiled()
    monkeypatch.setattr(warmup, "_ready", False)
    monkeypatch.setattr("archsim.engine.machine.loop_compiled", lambda: False)
    before = dict(kernel_cache.stats)
    spent = warmup.ensure_timing_engine()
    assert set(spent) == {"task_seconds", "compile_seconds"} and spent["compile_seconds"] > 0
    for k, v in kernel_cache.stats.items():
        if k in spent:
            assert v == pytest.approx(before.get(k, 0) + spent[k])
        else:
            assert v == before.get(k, 0), k
