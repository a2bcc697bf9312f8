"""Memory placement of a workload's tensors on a machine with private segments (tiny-sunway):
``scenario.placement`` / ``--placement`` cross (one address space interleaved over every memory
controller) or private (each core group reaches the buffers in its own segment, as a process per
core group does). Private traffic never crosses the ring between core groups; the engine's
per-group translation gives exactly the cycles of a program that addresses each group's segment
itself; a placement a machine lacks is one clear error (run) or a note (compare)."""

from __future__ import annotations

import json

import pytest
import yaml

from archsim.config.load import load_machine
from archsim.engine import dram as DR
from archsim.engine.launch import GLOBAL_BASE
from archsim.engine.timing import Unbacked, time_kernel
from archsim.errors import InputError
from archsim.paths import data_dir
from archsim import micro as MI

from test_cli import cli, one_line_error


@pytest.fixture(scope="module")
def sw():
    return load_machine("tiny-sunway")


def _ring_util(kernel) -> float:
    """Busiest link between two core groups' ring stops (not a stop's own ports)."""
    return max([ln["util"] for ln in kernel["fabric"]["links"] if " ring cg" in ln["name"]] + [0.0])


def test_private_placement_keeps_each_group_on_its_own_controller(capsys, tmp_path):
    docs = {}
    for p in ("cross", "private"):
        out = tmp_path / f"{p}.json"
        code, text, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", "tiny", "--layers", "1",
                              "--placement", p, "--json", str(out))
        assert code == 0, text + err
        docs[p] = json.loads(out.read_text())
        assert docs[p]["workload"]["placement"] == p and "placement_requested" not in docs[p]["workload"]
        assert ("private placement" in text.splitlines()[0]) == (p == "private")
    cross = {k["name"]: k for k in docs["cross"]["kernels"]}
    for k in docs["private"]["kernels"]:
        assert k["bytes"]["dma"] > 0
        assert _ring_util(k) == 0.0, k["name"]          # no request or reply between core groups
        assert _ring_util(cross[k["name"]]) > 0, k["name"]  # the same kernel in the cross segment does
    # launches with blocks in both groups (a small norm spreads its blocks too) read from both
    # controllers, each group from its own (no ring link, above)
    for name in ("ffn1", "norm1"):
        k = next(k for k in docs["private"]["kernels"] if k["name"] == name)
        assert all(mc["gbps"] > 0 for mc in k["memory_controllers"]), name


def test_per_group_translation_equals_a_program_that_addresses_each_segment(sw):
    """micro bandwidth's private layout puts group g's arrays at g x segment in the program's own
    addresses; the same program with a group stride of 0 under the private placement must reach
    the same physical bytes in the same cycles."""
    p = MI.parse_params("bandwidth", {"kind": "copy", "footprint_mib": 1, "placement": "private"})
    prog, launch, args, lay = MI.sw_stream_setup(sw, p)
    assert lay["group_stride_bytes"] == DR.segment_bytes(sw)
    explicit = time_kernel(prog, sw, launch, args)
    region = args["buf"].nbytes - (sw.groups - 1) * lay["group_stride_bytes"]
    same = dict(args, gstride=0, buf=Unbacked(region, at=GLOBAL_BASE))
    placed = time_kernel(prog, sw, launch, same, placement="private")
    assert placed.cycles == explicit.cycles
    assert placed.memory["dram"] == explicit.memory["dram"]
    # without the translation every group would meet at controller 0
    shared = time_kernel(prog, sw, launch, same)
    assert [ch["bytes_read"] > 0 for ch in shared.memory["dram"]] == [True, False]
    assert shared.cycles > explicit.cycles


def test_buffers_beyond_one_segment_are_rejected_before_the_run(sw):
    p = MI.parse_params("bandwidth", {"kind": "read", "footprint_mib": 1, "placement": "private"})
    prog, launch, args, _ = MI.sw_stream_setup(sw, p)
    big = dict(args, gstride=0, buf=Unbacked(DR.segment_bytes(sw), at=GLOBAL_BASE))
    with pytest.raises(InputError) as e:
        time_kernel(prog, sw, launch, big, placement="private")
    assert "beyond one private segment" in str(e.value)


def test_a_machine_without_private_segments(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--placement", "private")
    line = one_line_error(err)
    assert code == 2 and "placement" in line and "no private segments" in line and "cross" in line
    out = tmp_path / "c.json"
    code, text, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny",
                          "--layers", "1", "--placement", "private", "--json", str(out))
    assert code == 0, text + err
    assert "tiny-gpu has no private segments" in err and "tiny-sunway" not in err
    assert "tiny-gpu: cross placement, tiny-sunway: private placement" in text.splitlines()[0]
    res = {r["machine"]["name"]: r["workload"] for r in json.loads(out.read_text())["results"]}
    assert res["tiny-gpu"]["placement"] == "cross" and res["tiny-gpu"]["placement_requested"] == "private"
    assert res["tiny-sunway"]["placement"] == "private" and "placement_requested" not in res["tiny-sunway"]


def test_bad_placement_values(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", "tiny", "--placement", "shared")
    line = one_line_error(err)
    assert code == 2 and "--placement" in line and "cross" in line and "private" in line
    doc = yaml.safe_load((data_dir("workloads") / "tiny.yaml").read_text())
    doc["scenario"]["placement"] = 3
    p = tmp_path / "w.yaml"
    p.write_text(yaml.safe_dump(doc))
    code, _, err = cli(capsys, "run", "--hw", "tiny-sunway", "--workload", str(p))
    line = one_line_error(err)
    assert code == 2 and "scenario.placement" in line
