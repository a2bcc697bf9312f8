"""Scale models (archsim.scale_model, `--scale N`): the cut machine, the cut launch, the read-back
and the refusals.

Oracles: the scale model's unit counts are the machine's over N; a cut launch of all its blocks
is the whole launch, and of its first k blocks is time_kernel's block range (0, k); a GEMM of
uniform blocks read back from the scale model counts the whole launch's warp-instructions and
flops exactly (B / B' is whole) and lands near its cycles; a kernel kind without a measured error
is timed on the whole machine and says why.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from archsim import scale_model as SM
from archsim.config import capabilities, load_machine
from archsim.engine.timing import Unbacked, time_kernel
from archsim.errors import InputError
from archsim.sample import concurrency, sampled_record, time_sampled
from archsim.workloads.emit import Tile, gemm_kernel

# tiny-gpu with every unit count doubled: its 1/2 scale model is tiny-gpu's own layout
TINY4 = ["cores.per_group=4", "l2.slices=8", "l2.size_kib=512", "memory_controllers.count=4", "dram.channels=4"]


@pytest.fixture(scope="module")
def tiny4():
    return load_machine("tiny-gpu", sets=TINY4)


def _gemm(m, M, N, K, tile=None):
    g = gemm_kernel(capabilities(m), M, N, K, "fp16", "f16", tile=tile)
    return g, g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))


def test_scale_model_cuts_every_unit_count():
    a100 = load_machine("a100")
    small = SM.scaled_machine(a100, 5)
    assert (small.cores.per_group, small.l2.slices, small.l2.size_kib, small.memory_controllers.count,
            small.dram.channels) == (22, 16, 8192, 2, 2)
    assert small.l2.halves == 2 and small.l2.size_kib * 1024 // small.l2.slices == a100.l2.size_kib * 1024 // 80
    assert SM.scaled_machine(a100, 1) is a100
    sw = load_machine("sw26010pro")
    s3 = SM.scaled_machine(sw, 3)
    assert (s3.groups, s3.cores.per_group, s3.memory_controllers.count, s3.dram.channels) == (2, 64, 2, 4)
    # each core group keeps its own segment's size
    assert s3.dram.capacity_gib / s3.groups == sw.dram.capacity_gib / sw.groups


@pytest.mark.parametrize("hw,n,what", [
    ("a100", 3, "l2.slices 80 does not divide by 3"),
    ("a100", 2, "is no machine"),                 # 5 channels do not split over the 2 L2 halves
    ("sw26010pro", 4, "groups 6 does not divide by 4"),
    ("a100", 0, "0"),
    ("a100", True, "True"),
])
def test_a_scale_the_machine_cannot_take_is_one_input_error(hw, n, what):
    with pytest.raises(InputError) as e:
        SM.check_scale(load_machine(hw), n)
    assert e.value.where == "--scale" and what in str(e.value) and "\n" not in str(e.value)


def test_a_cut_launch_is_the_block_range_it_names(tiny4):
    g, args = _gemm(tiny4, 256, 256, 64, Tile(32, 32, 32, 4, 2))
    B = g.launch.blocks
    whole = time_kernel(g.program, tiny4, g.launch, args)
    s = time_sampled(g.program, tiny4, g.launch, args, sample=False, upto=B)
    assert s.timing.cycles == whole.cycles and s.timing.warp_instructions == whole.warp_instructions
    part = time_kernel(g.program, tiny4, g.launch, args, blocks=(0, B // 3))
    s = time_sampled(g.program, tiny4, g.launch, args, sample=False, upto=B // 3)
    C = concurrency(g.program, tiny4, g.launch)
    assert s.timing.cycles == part.cycles and s.waves_total == -(-(B // 3) // C)


def test_a_gemm_read_back_from_its_scale_model(tiny4):
    """A GEMM of 32 uniform blocks: the 1/2 model runs the first 16 on half the machine; its
    warp-instructions and flops, doubled, are the whole launch's, and its cycles land near."""
    g, args = _gemm(tiny4, 256, 256, 64, Tile(32, 32, 32, 4, 2))
    whole = sampled_record("g", g.program, tiny4, g.launch, args, sample=False)
    rec = SM.scaled_record("g", g.program, tiny4, g.launch, args, sample=False, scale=2, kind="gemm", check=False)
    assert rec["scale"] == 2 and rec["scale_blocks"] == g.launch.blocks // 2
    assert rec["warp_instructions"] == whole["warp_instructions"] and rec["flops"] == whole["flops"]
    assert rec["grid"] == whole["grid"]
    assert abs(rec["cycles"] - whole["cycles"]) / whole["cycles"] < 0.10
    # the bytes are the scale model's doubled: the same order as the whole launch's
    assert 0.5 < rec["bytes"]["l2"] / whole["bytes"]["l2"] < 2


def test_sunway_scale_model_runs_whole_core_groups():
    from archsim.workloads.emit import gemm_sunway

    sw = load_machine("tiny-sunway")
    caps = capabilities(sw)
    assert SM.scaled_machine(sw, 2).groups == 1
    g = gemm_sunway.gemm_kernel(caps, 256, 256, 64, "fp16", "f16")
    args = g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))
    assert not g.launch.spread and g.launch.blocks == caps.cores_total
    kw = dict(sample=False, scale=2, kind="gemm", check=False)
    # each group in its own segment: the groups are independent, so one of them is exact
    rec = SM.scaled_record("g", g.program, sw, g.launch, args, placement="private", **kw)
    whole = sampled_record("g", g.program, sw, g.launch, args, sample=False, placement="private")
    assert rec["scale"] == 2 and rec["scale_blocks"] == g.launch.blocks // 2
    assert rec["warp_instructions"] == whole["warp_instructions"] and rec["cycles"] == whole["cycles"]
    # the cross segment sends each group's traffic round the ring to every controller: refused
    assert "placement cross" in SM.cut_refusal(g.program, sw, g.launch, args, 2, "cross")
    assert SM.cut_refusal(g.program, sw, g.launch, args, 2, "private") is None
    # a launch that fills group 0 only would have half the controllers behind it: refused
    g = gemm_sunway.gemm_kernel(caps, 64, 64, 64, "fp16", "f16")
    args = g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))
    assert g.launch.blocks < caps.cores_total
    assert "fill the core groups in order" in SM.cut_refusal(g.program, sw, g.launch, args, 2, "private")
    # dealt to the groups in turn, each group's blocks are not the launch's first ones: refused too
    spread = dataclasses.replace(g.launch, spread=True)
    assert "dealt to the groups in turn" in SM.cut_refusal(g.program, sw, spread, args, 2, "private")


def test_an_unmeasured_or_inaccurate_kind_runs_whole(tiny4, monkeypatch):
    g, args = _gemm(tiny4, 128, 128, 64, Tile(32, 32, 32, 4, 2))
    rec = SM.scaled_record("g", g.program, tiny4, g.launch, args, sample=False, scale=2, kind="gemm")
    whole = sampled_record("g", g.program, tiny4, g.launch, args, sample=False)
    assert rec["scale"] == 1 and "never measured at scale 2 on tiny-gpu" in rec["scale_refused"]
    assert rec["cycles"] == whole["cycles"]
    monkeypatch.setattr(SM, "measured_errors", lambda name: {2: {"gemm": (0.05, 9), "elementwise": (0.01, 4),
                                                                  "attention": (0.0, 2)}})
    assert "5.0% off" in SM.refusal(tiny4, 2, "gemm")
    assert SM.refusal(tiny4, 2, "elementwise") is None
    assert "on 2 kernels only" in SM.refusal(tiny4, 2, "attention")
    assert SM.refusal(tiny4, 1, "gemm") is None


def test_kernel_kinds_follow_their_ops():
    from archsim.workloads.model import load_workload
    from archsim.runner import emit_block

    m = load_machine("tiny-gpu")
    wl = load_workload("gpt2-small", {"phase": "train"})
    kinds = SM.kernel_kinds(wl, emit_block(m, wl))
    assert kinds["qkv"] == "gemm" and kinds["norm1"] == "elementwise"
    assert kinds["attn"] == "attention" and all(v == "attention" for k, v in kinds.items() if k.startswith("attn."))
    assert set(kinds.values()) <= set(SM.KINDS)
    wl = load_workload("gpt2-small", {"phase": "decode"})
    kinds = SM.kernel_kinds(wl, emit_block(load_machine("a100"), wl))
    assert kinds["qkv"] == "gemv" and kinds["ffn2.partial"] == "gemv" and kinds["ffn2.reduce"] == "elementwise"
    assert kinds["attn.split"] == "decode_attention" and kinds["attn.combine"] == "decode_attention"


def test_built_in_tables_name_measured_kinds():
    import yaml

    for name in ("a100", "sw26010pro"):
        raw = yaml.safe_load(SM.table_path(name).read_text())
        assert raw["machine"] == name
        table = SM.measured_errors(name)
        assert table and set(table) == {int(s) for s in raw["scales"]}, name
        for scale, kinds in table.items():
            SM.check_scale(load_machine(name), scale)
            # every key of a scale's entry is a kind, its date or its kernels (a misspelt kind fails)
            assert set(raw["scales"][scale]) <= set(SM.KINDS) | {"date", "kernels"}
            assert all(e >= 0 and n > 0 for e, n in kinds.values())
            for r in raw["scales"][scale]["kernels"]:
                assert r["kind"] in SM.KINDS and r["scale_blocks"] <= r["blocks"]


def test_cli_scale(capsys, tmp_path):
    from archsim.cli import main

    def run(*argv):
        code = main(list(argv))
        return code, *capsys.readouterr()

    code, _, err = run("run", "--hw", "tiny-gpu", "--workload", "tiny", "--scale", "2", "--no-cache")
    assert code == 2 and err.strip().count("\n") == 0 and "--scale: 2" in err
    code, _, err = run("run", "--hw", "tiny-gpu", "--workload", "tiny", "--scale", "0")
    assert code == 2 and "--scale: 0" in err and "positive integer" in err
    code, _, err = run("run", "--hw", "tiny-sunway", "--workload", "tiny", "--scale", "2", "--mode", "functional")
    assert code == 2 and "--mode timing" in err
    code, _, err = run("run", "--hw", "tiny-sunway", "--workload", "tiny", "--scale", "2", "--trace", "--out",
                       str(tmp_path / "o"))
    assert code == 2 and "one of --trace, --scale" in err
    f = tmp_path / "r.json"
    code, out, _ = run("run", "--hw", "tiny-sunway", "--workload", "tiny", "--scale", "2", "--no-cache",
                       "--workers", "1", "--json", str(f))
    assert code == 0 and " model " in out.splitlines()[1] and all(ln.split()[7] == "whole" for ln in
                                                                    out.splitlines()[2:-2])
    ks = json.loads(f.read_text())["kernels"]
    assert all(k["scale"] == 1 and "never measured" in k["scale_refused"] for k in ks)


def test_a_run_scales_the_kernels_whose_cut_stands_for_the_launch(monkeypatch, tmp_path):
    """With every kind allowed, a run times its GEMMs on the scale model and the kernels whose
    first blocks do more work than the launch's mean (a grid-stride norm's tail) on the whole
    machine, each record saying which."""
    from archsim.runner import RunOptions, run_workload
    from archsim.workloads.model import load_workload

    monkeypatch.setattr(SM, "measured_errors", lambda name: {2: {k: (0.0, 9) for k in SM.KINDS}})
    m = load_machine("tiny-gpu", sets=TINY4)
    doc = run_workload(m, load_workload("tiny"), RunOptions(scale=2))
    ks = {k["name"]: k for k in doc["kernels"]}
    assert ks["ffn1"]["scale"] == 2 and ks["ffn1"]["scale_blocks"] == 2
    assert ks["norm1"]["scale"] == 1 and "mean work a block" in ks["norm1"]["scale_refused"]
    assert ks["res1"]["scale"] == 2 and ks["res1"]["scale_blocks"] == 1     # one block: all of the launch
    # the plots take records whose timelines are the scale model's units beside whole ones
    from archsim.report.plots import write_plots

    files, missing = write_plots(doc, tmp_path)
    assert files and not missing


def test_compare_scales_the_machines_that_take_the_scale(capsys):
    from archsim.cli import main

    code = main(["compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny", "--scale", "2",
                 "--placement", "private", "--no-cache", "--workers", "1"])
    _, err = capsys.readouterr()
    assert code == 0 and "tiny-gpu's unit counts do not divide by 2: it runs whole" in err


def test_a_sweep_at_a_scale(tmp_path, capsys):
    """A sweep spec's scale reaches every point's run (its key, sweep.json's run, each kernel
    record), and a machine the scale does not divide is one line naming the spec's scale."""
    import yaml

    from archsim import sweep as S
    from archsim.cli import main

    base = {"hw": "tiny-sunway", "workload": "tiny", "phase": "prefill", "layers": 1, "seq": 5,
            "placement": "private"}
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(dict(base, scale=2)))
    (p,) = S.expand(S.load_spec(str(f)))
    g = tmp_path / "plain.yaml"
    g.write_text(yaml.safe_dump(base))
    (q,) = S.expand(S.load_spec(str(g)))
    assert p.key != q.key
    assert main(["sweep", str(f), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["run"]["scale"] == 2
    run = json.loads(next((tmp_path / "out" / "runs").glob("*.json")).read_text())
    assert all(k["scale"] == 1 and "never measured" in k["scale_refused"] for k in run["kernels"])
    capsys.readouterr()
    f.write_text(yaml.safe_dump(dict(base, scale=4)))
    assert main(["sweep", str(f), "--out", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and ": scale: --scale: 4:" in err and "groups 2 does not divide by 4" in err


def test_api_compare_runs_a_machine_the_scale_does_not_divide_whole():
    from archsim import api
    from archsim.workloads.model import load_workload

    c = api.compare([load_machine("tiny-gpu"), load_machine("tiny-sunway")], load_workload("tiny"), scale=2)
    gpu, sw = c.record["results"]
    assert all("scale" not in k for k in gpu["kernels"])
    assert all(k["scale"] == 1 and "never measured" in k["scale_refused"] for k in sw["kernels"])


def test_a_sunway_wave_is_cut_to_groups_that_hold_the_heaviest(monkeypatch):
    """One wave in the groups' own segments: the model's groups must include the heaviest group
    (its work and its longest block); a grid whose first groups hold more tiles is kept, one whose
    last group is heavier is refused."""
    import numpy as np

    from archsim.engine import counts as CO
    from archsim.workloads.emit import gemm_sunway

    sw = load_machine("tiny-sunway")
    g = gemm_sunway.gemm_kernel(capabilities(sw), 256, 256, 64, "fp16", "f16")
    args = g.args(*(Unbacked(n) for n in g.buffer_bytes().values()))
    B = g.launch.blocks

    def fake(per):
        return lambda *a, **k: (CO.Counts(np.asarray(per, np.int64), np.zeros(1, np.int64)), "")

    monkeypatch.setattr(CO, "count_launch", fake([10] * (B // 2) + [6] * (B // 2)))
    assert SM.cut_refusal(g.program, sw, g.launch, args, 2, "private") is None
    monkeypatch.setattr(CO, "count_launch", fake([6] * (B // 2) + [10] * (B // 2)))
    assert "against the heaviest group's" in SM.cut_refusal(g.program, sw, g.launch, args, 2, "private")
    # the same sums with one long block in the second group: its longest block decides
    monkeypatch.setattr(CO, "count_launch", fake([8] * (B // 2) + [2] * (B // 2 - 1) + [8 * B // 2 - 2 * (B // 2 - 1)]))
    assert "longest block" in SM.cut_refusal(g.program, sw, g.launch, args, 2, "private")
