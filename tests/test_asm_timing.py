"""`archsim asm FILE.s --timing`: a user's kernel on the cycle model, with the full
archsim.result/1 record; `.arg NAME TYPE[N] unbacked` buffers are address space only."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "isa" / "examples"


def _cli(capsys, *argv):
    from archsim.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _unbacked_copy(tmp_path: Path, n: int) -> Path:
    """vector_add with its buffers unbacked and n elements."""
    text = (EXAMPLES / "vector_add.s").read_text()
    text = text.replace(".arg x f32[1000] random", f".arg x f32[{n}] unbacked")
    text = text.replace(".arg y f32[1000] random", f".arg y f32[{n}] unbacked")
    text = text.replace(".arg out f32[1000] zeros", f".arg out f32[{n}] unbacked")
    text = text.replace(".arg n = 1000", f".arg n = {n}")
    p = tmp_path / "big_add.s"
    p.write_text(text)
    return p


def test_timing_a_builtin_example_writes_one_kernel_result(capsys, tmp_path):
    js = tmp_path / "r.json"
    code, out, err = _cli(capsys, "asm", "vector_add", "--hw", "tiny-gpu", "--timing", "--json", str(js))
    assert code == 0, err
    doc = json.loads(js.read_text())
    assert doc["schema"] == "archsim.result/1" and doc["complete"] is True
    (k,) = doc["kernels"]
    assert k["name"] == "vector_add" and k["grid"] == [4, 1, 1] and k["block"] == [128, 1, 1]
    assert k["cycles"] > 0 and k["warp_instructions"] > 0
    # 1000 f32 of x and y read, 1000 written: the DRAM saw at least that (cold caches)
    assert k["bytes"]["dram_read"] >= 2 * 4000 and k["bytes"]["dram_write"] + k["bytes"]["l2"] >= 4000
    assert "cycles" in out and "stalls" in out
    # the same kernel timed directly gives the same cycles
    from archsim.config import load_machine
    from archsim.engine.launch import default_args
    from archsim.engine.timing import time_kernel
    from archsim.isa.asm import assemble
    from archsim.isa.program import Launch

    prog = assemble((EXAMPLES / "vector_add.s").read_text())
    t = time_kernel(prog, load_machine("tiny-gpu"), Launch((4, 1, 1), (128, 1, 1)), default_args(prog, timing=True))
    assert t.cycles == k["cycles"]


def test_unbacked_buffers_time_a_large_kernel_without_allocating_it(capsys, tmp_path):
    n = 1 << 26                                  # 3 x 256 MiB of f32 (tiny-gpu has 1 GiB): never allocated
    src = _unbacked_copy(tmp_path, n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    js = tmp_path / "r.json"
    code, out, err = _cli(capsys, "asm", str(src), "--hw", "tiny-gpu", "--timing", "--grid", "2",
                          "--block", "64", "--max-cycles", "20000", "--json", str(js))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 256 * 1024                # far below the 768 MiB the buffers would take
    # 2^26 elements over 128 threads cannot finish in 20000 cycles: exit 3, the partial record
    assert code == 3 and err.count("\n") == 1
    doc = json.loads(js.read_text())
    assert doc["complete"] is False and doc["kernels"][0]["cycles"] >= 20000 and "error" in doc


def test_an_unbacked_buffer_needs_timing_and_timing_rejects_bad_options(capsys, tmp_path):
    src = _unbacked_copy(tmp_path, 1000)
    code, out, err = _cli(capsys, "asm", str(src), "--hw", "tiny-gpu")
    assert code == 2 and "is unbacked" in err and "--timing" in err and err.count("\n") == 1
    code, out, err = _cli(capsys, "asm", str(src), "--hw", "tiny-gpu", "--timing", "--max-cycles", "0")
    assert code == 2 and "--max-cycles" in err
    code, out, err = _cli(capsys, "asm", str(src), "--hw", "tiny-gpu", "--timing", "--engine", "reference")
    assert code == 2 and "--engine" in err
    bad = tmp_path / "bad.s"
    bad.write_text(src.read_text().replace("f32[1000] unbacked", "f32[1000] hollow", 1))
    code, out, err = _cli(capsys, "asm", str(bad), "--hw", "tiny-gpu", "--timing")
    assert code == 2 and "unknown init 'hollow'" in err and "unbacked" in err


@pytest.mark.parametrize("hw", ["tiny-sunway"])
def test_timing_runs_on_the_sunway_family_too(capsys, tmp_path, hw):
    src = _unbacked_copy(tmp_path, 4096)
    js = tmp_path / "r.json"
    code, out, err = _cli(capsys, "asm", str(src), "--hw", hw, "--timing", "--grid", "4", "--block", "1",
                          "--json", str(js))
    assert code == 0, err
    assert json.loads(js.read_text())["kernels"][0]["cycles"] > 0


def test_sample_times_a_many_wave_launch_from_its_head(capsys, tmp_path):
    """--sample: a launch of many waves is timed from heads of waves (archsim.sample, tested on
    its own in test_sample.py) and the record says which were tried; without it every block runs.
    This small launch's heads stay above the 3 % bound, so it ends whole and exact."""
    def run(n, grid, *flag):
        js = tmp_path / "r.json"
        code, out, err = _cli(capsys, "asm", str(_unbacked_copy(tmp_path, n)), "--hw", "tiny-gpu", "--timing",
                              "--grid", str(grid), "--block", "128", "--json", str(js), *flag)
        assert code == 0, err
        return json.loads(js.read_text())["kernels"][0]

    whole, sampled = run(1 << 14, 128), run(1 << 14, 128, "--sample")   # 192 KiB in all: fits the L2
    assert whole["sample_method"] == "whole" and whole["sampled"] is False and whole["sample_attempts"] == []
    assert [a["waves"] for a in sampled["sample_attempts"]] == [6, 12]
    assert all(a["error_est"] > 0.03 for a in sampled["sample_attempts"])
    assert sampled["sample_method"] == "whole_after_fallback"
    assert sampled["cycles"] == whole["cycles"] and sampled["warp_instructions"] == whole["warp_instructions"]


def test_a_head_whose_writes_still_fit_the_l2_is_not_the_launch(capsys, tmp_path):
    """1.5 MiB through a 256-KiB L2 (512 KiB of it written): the first heads wrote nothing back, while later
    waves pay the writebacks (whole: ~18 % slower waves after the L2 fills), so their error is 1
    and the head grows; here up to the whole launch, which answers exactly."""
    src = _unbacked_copy(tmp_path, 1 << 17)
    out = {}
    for flag in ((), ("--sample",)):
        js = tmp_path / "r.json"
        code, _, err = _cli(capsys, "asm", str(src), "--hw", "tiny-gpu", "--timing", "--grid", "1024", "--block",
                            "128", "--json", str(js), *flag)
        assert code == 0, err
        out[flag] = json.loads(js.read_text())["kernels"][0]
    s = out[("--sample",)]
    assert s["sample_attempts"][0]["error_est"] == 1.0
    assert s["sample_method"] == "whole_after_fallback" and s["cycles"] == out[()]["cycles"]


# one warp on tiny-gpu whose lane l copies 16 bytes of `src` (r2, from DRAM) to scratchpad byte 16 l (r1)
CP_ONE_WARP = """
.param src
.shared 512
.launch grid=1 block=32
.arg src f32[32768] zeros
        s2r     r0, %tid.x
        shl.b64 r1, r0, 4
        ldparam r2, src
        add.i64 r2, r2, r1
"""

CP_GROUPS_KERNEL = ".kernel too_many_groups" + CP_ONE_WARP + """
        mov.b64 r3, r1
        mov.b64 r4, 0
LOOP:   cp.async.16 [r3], [r2]
        cp.async.commit
        add.i64 r2, r2, 512
        add.i64 r4, r4, 1
        setp.lt.i64 p0, r4, {groups}
   @p0  bra LOOP
        cp.async.wait 0
        bar.sync
        exit
"""


def _time_one_warp(text: str):
    """time_kernel of a CP_ONE_WARP kernel on tiny-gpu, its buffers as the timing CLI fills them."""
    from archsim.config import load_machine
    from archsim.engine.launch import default_args
    from archsim.engine.timing import time_kernel
    from archsim.isa.asm import assemble
    from archsim.isa.program import Launch

    prog = assemble(text)
    return time_kernel(prog, load_machine("tiny-gpu"), Launch((1, 1, 1), (32, 1, 1)), default_args(prog, timing=True))


@pytest.mark.parametrize("groups, ok", [(7, True), (64, False)])
def test_more_cp_async_groups_in_flight_than_the_ring_holds_is_a_clear_error(groups, ok):
    """A warp keeps 8 cp.async groups in its ring: committing more while an old one still has
    copies in flight (64 groups, each a 512-byte copy from DRAM, back to back) stops the run with
    one line instead of merging the groups' counts; 7 groups run."""
    from archsim.errors import SimulationError

    text = CP_GROUPS_KERNEL.format(groups=groups)
    if ok:
        assert _time_one_warp(text).cycles > 0
    else:
        with pytest.raises(SimulationError, match=r"opens group \d+ while group \d+ still has copies in flight"):
            _time_one_warp(text)


CP_WAIT_ORDER_KERNEL = ".kernel wait_order" + CP_ONE_WARP + """
        cp.async.16 [r1], [r2]
        cp.async.commit
        cp.async.commit
        cp.async.wait {n}
        exit
"""


def test_cp_async_wait_n_waits_for_every_group_but_the_newest_n():
    """PTX cp.async.wait_group: group 0 (a copy from DRAM) is still in flight when the empty group 1
    is done, and `wait 1` must wait for it as `wait 0` does; `wait 2` goes on at once."""

    def cycles(n):
        return _time_one_warp(CP_WAIT_ORDER_KERNEL.format(n=n)).cycles
    c0, c1, c2 = cycles(0), cycles(1), cycles(2)
    assert c1 == c0
    assert c2 < c0 - 100   # the copy's DRAM round trip is hundreds of cycles
