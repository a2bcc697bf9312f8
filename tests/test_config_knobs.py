"""The engine's queue capacities and policies are config fields: each one a sweep sets reaches the
state the engine runs on, the defaults are today's values (the golden baselines hold them), and a
run with a changed value completes."""

from __future__ import annotations

import pytest

from archsim.config.load import load_machine
from archsim.engine import cache as CA
from archsim.engine import dram as DR
from archsim.engine import mem_state as M
from archsim.engine import noc as NC


def _mstate(hw: str, sets: list[str]):
    return M.make_mstate(load_machine(hw, sets=sets), None)


# (config, path, value, what the engine state holds for it)
KNOBS = [
    ("tiny-gpu", "cores.mio_queue_entries", 3, lambda S: S.mio.shape[1]),
    ("tiny-gpu", "cores.load_trackers", 40, lambda S: S.trk.shape[1]),
    ("tiny-gpu", "cores.miss_queue_entries", 5, lambda S: int(S.Q.cap[S.cfg[M.M_Q_MISS]])),
    ("tiny-gpu", "fabric.header_bytes", 16, lambda S: int(S.cfg[M.M_HEADER])),
    ("tiny-gpu", "fabric.lookahead_rounds", 2, lambda S: int(S.req.par[NC.P_ROUNDS])),
    ("tiny-gpu", "memory_controllers.row_hit_cap", 5, lambda S: int(S.Dm.prm[DR.P_HITCAP])),
    ("tiny-gpu", "l1.max_merge", 3, lambda S: int(S.L1.cfg[CA.CFG_MAX_MERGE])),
    ("tiny-gpu", "l2.max_merge", 2, lambda S: int(S.L2.cfg[CA.CFG_MAX_MERGE])),
    ("tiny-gpu", "l2.retry_spare_entries", 40, lambda S: int(S.cfg[M.M_RETRY_GATE]) + 8),
    ("tiny-gpu", "l1.replacement", "fifo", lambda S: "fifo" if S.L1.cfg[CA.CFG_REPL] == CA.REPL_FIFO else "lru"),
    ("tiny-gpu", "l2.replacement", "fifo", lambda S: "fifo" if S.L2.cfg[CA.CFG_REPL] == CA.REPL_FIFO else "lru"),
    ("tiny-sunway", "dma.descriptors_per_engine", 3, lambda S: S.dma.desc.shape[1]),
    ("tiny-sunway", "rma.descriptors_per_engine", 5, lambda S: S.rma.desc.shape[1]),
]


@pytest.mark.parametrize("hw, path, value, held", KNOBS, ids=[k[1] for k in KNOBS])
def test_knob_reaches_the_engine_state(hw, path, value, held):
    assert held(_mstate(hw, [f"{path}={value}"])) == value
    assert held(_mstate(hw, [])) != value          # the default is another value: the set did it


def test_defaults_are_the_values_the_engine_had():
    m = load_machine("a100")
    assert (m.cores.mio_queue_entries, m.cores.load_trackers, m.cores.miss_queue_entries) == (8, 512, 64)
    assert (m.fabric.header_bytes, m.fabric.lookahead_rounds, m.memory_controllers.row_hit_cap) == (8, 3, 16)
    assert (m.l1.replacement, m.l1.max_merge, m.l2.replacement, m.l2.max_merge) == ("lru", 8, "lru", 64)
    assert load_machine("tiny-gpu").l2.max_merge == 4    # the schema's default (a100 / h100 set the measured 64)
    assert m.l2.retry_spare_entries == 256
    s = load_machine("sw26010pro")
    assert (s.dma.descriptors_per_engine, s.rma.descriptors_per_engine) == (8, 8)


def test_fifo_caches_run_a_kernel_to_the_end():
    """FIFO in both cache levels (the victim policy's seam): a GEMM completes, its reads hit."""
    from archsim.micro import run_micro

    m = load_machine("tiny-gpu", sets=["l1.replacement=fifo", "l2.replacement=fifo"])
    res = run_micro("gemm", m, {"m": 64, "n": 64, "k": 128})
    k = res.kernels[0]
    assert res.complete and k["cycles"] > 0
    assert k["caches"]["l2"]["hit_rate"] > 0
