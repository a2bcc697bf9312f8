"""Micro-benchmarks on tiny-gpu: each is a real kernel on the timing model, and the figures it
gives must follow from the config (formula oracles) or show the behaviour a real machine shows
(latency steps at the cache capacities, bandwidth growing with occupancy up to a ceiling below
the DRAM peak). Also the result records: stall shares sum to 1, the timeline adds up to the
totals, the same run twice gives the same JSON, and skip-ahead changes nothing."""

import json

import numpy as np
import pytest

from archsim import micro as MI
from archsim.config import load_machine
from archsim.config.derived import capabilities, peak_bandwidth_gbps, peak_tflops
from archsim.errors import InputError
from archsim.isa.asm import assemble
from archsim.isa.program import Launch


@pytest.fixture(scope="module")
def tiny():
    return load_machine("tiny-gpu")


def chase(m, fp_kib, **kw):
    return MI.run_micro("latency", m, dict(footprint_kib=fp_kib, loads=kw.pop("loads", 256), **kw))


def test_pointer_chase_steps_at_cache_capacities(tiny):
    # tiny-gpu: 16 KiB of L1 cache, 256 KiB of L2
    l1 = chase(tiny, 4).value
    l2 = chase(tiny, 96).value
    dram = chase(tiny, 2048, warmup=0).value
    # an L1 hit: the configured hit latency plus the LSU's fixed stages, nothing that grows
    assert tiny.l1.hit_latency_cycles <= l1 <= tiny.l1.hit_latency_cycles + 12
    assert l2 > l1 + 2 * tiny.fabric.router_latency_cycles + tiny.l2.hit_latency_cycles - 5
    assert dram > l2 + tiny.dram.timing.tCL
    # crossing a capacity raises the latency; staying inside does not
    assert abs(chase(tiny, 8).value - l1) < 1.0
    assert abs(chase(tiny, 128).value - l2) < 0.1 * l2


def test_controller_front_end_adds_its_latency_to_every_dram_access(tiny):
    # formula oracle: a cold chase (every load an L2 miss) slows by the front-end pipeline's
    # latency (fabric cycles; tiny-gpu runs the fabric at the core clock) and by nothing else. Refresh
    # is moved out of the chase's span: which loads meet a refresh depends on their phase
    no_refresh = ["dram.timing.tREFI=100000000"]
    base = chase(load_machine("tiny-gpu", sets=no_refresh), 2048, warmup=0).value
    fe = load_machine("tiny-gpu", sets=no_refresh + ["memory_controllers.frontend_latency_cycles=100"])
    assert chase(fe, 2048, warmup=0).value - base == pytest.approx(100, abs=0.5)
    assert abs(chase(fe, 96).value - chase(tiny, 96).value) < 1.0     # L2 hits do not pass it


def test_near_and_far_l2_halves(tiny):
    near = chase(tiny, 96, half="near").value
    far = chase(tiny, 96, half="far").value
    assert far - near == pytest.approx(tiny.l2.far_half_extra_cycles, abs=3)


def test_ffma_and_shared_latency_oracles(tiny):
    out = MI.MicroResult("x", {}, 0.0, "")
    assert MI.ffma_latency(tiny, out) == tiny.pipes["fma"].latency_cycles
    sh = MI.shared_latency(tiny, out)
    assert tiny.scratchpad.latency_cycles <= sh <= tiny.scratchpad.latency_cycles + 12


def test_bandwidth_grows_with_occupancy_and_saturates_below_peak():
    """On the a100 model a read stream's bandwidth follows Little's law up to the DRAM: 1 warp an
    SM keeps too few bytes in flight to cover the DRAM latency, 4 warps nearly do, and a full
    machine saturates below the peak (row switches, refresh, reply ports). tiny-gpu is not used:
    its 32-sector L1 MSHRs (a unit-test machine) bound it far below its DRAM peak by design."""
    a100 = load_machine("a100")
    peak = peak_bandwidth_gbps(a100)["dram"]
    bw = [MI.run_micro("bandwidth", a100, {"footprint_mib": 16, "occupancy": q}).value
          for q in (1 / 64, 4 / 64, 1.0)]
    assert bw[0] < 0.5 * bw[1] and bw[1] <= bw[2] * 1.02
    assert 0.75 * peak < bw[2] < peak


def test_gemm_efficiency_grows_with_size_and_decode_gemms_are_memory_bound():
    """On the a100 model the emitted tensor-core GEMM fills more of the machine as it grows
    (256^3: 16 tiles for 108 SMs; 1024^3: 64 tiles, each with a longer K loop to hide its
    pipeline fill), and a decode-shaped GEMM (one token against a 4096 x 4096 weight) streams its
    weight at most of the DRAM peak while its TFLOP/s stay far below the tensor peak."""
    a100 = load_machine("a100")
    tf = [MI.run_micro("gemm", a100, {"m": s, "n": s, "k": s}).value for s in (256, 512, 1024)]
    assert tf[0] < tf[1] < tf[2] < peak_tflops(a100)["fp16"]
    r = MI.run_micro("gemm", a100, {"m": 1, "n": 4096, "k": 4096})
    dram = r.kernels[0]["bandwidth_gbps"]["dram"]
    assert dram > 0.75 * peak_bandwidth_gbps(a100)["dram"]
    assert r.value < 0.02 * peak_tflops(a100)["fp16"]


def test_stream_grid_is_one_wave_of_what_the_registers_hold():
    """read, write and copy take 32 registers a thread, as their CUDA twins; a launch asks for at
    most the blocks a core holds at once, so a grid-stride stream is one wave (a second, partial
    wave of late blocks would stream alone at the end) and warps_per_core says what ran."""
    from archsim.isa.asm import assemble
    from archsim.engine.timing import blocks_per_core

    assert [assemble(MI._stream_kernel(k)).nregs for k in ("read", "write", "copy", "triad")] == [32, 32, 32, 48]
    # 16 warp slots (two 8-warp blocks wanted per core), registers for 1.5 of read's blocks
    m = load_machine("tiny-gpu", sets=["cores.warp_slots=16", "register_file.regs_per_core=12288"])
    cores = m.groups * m.cores.per_group
    prog = assemble(MI._stream_kernel("read"))
    launch = MI._occupancy_launch(m, 1.0, prog)
    assert launch.blocks == cores * blocks_per_core(prog, m, launch) == cores
    r = MI.run_micro("bandwidth", m, {"footprint_mib": 0.25})
    assert r.extra["warps_per_core"] == 8 and r.kernels[0]["grid"][0] == cores
    full = MI.run_micro("bandwidth", load_machine("tiny-gpu", sets=["cores.warp_slots=16"]), {"footprint_mib": 0.25})
    assert full.extra["warps_per_core"] == 16


def test_stream_unroll_sets_the_loads_in_flight():
    """unroll N: N independent 16-byte loads a thread before the first use (the CUDA twins
    stream_ilp<N>). At 1 warp an SM a stream is latency-bound, so more loads in flight give more
    bandwidth, but less than N times as much (a warp waits for the slowest of its lines); the
    footprint is moved whatever N is. Bad values are refused in one line."""
    body = MI._stream_kernel("read", 2).split("LOOP:")[1].split("\n")
    ops = [ln.split()[0] for ln in body if ln.split() and ln.split()[0] in ("ld.global.v4.b32", "add.f32")]
    assert ops == ["ld.global.v4.b32"] * 2 + ["add.f32"] * 2
    a100 = load_machine("a100")
    bw = {u: MI.run_micro("bandwidth", a100, {"footprint_mib": 8, "occupancy": 1 / 64, "unroll": u})
          for u in (1, 4)}
    assert bw[1].value < bw[4].value < 4 * bw[1].value
    for r in bw.values():   # the footprint, rounded down to whole iterations of every thread
        k = r.kernels[0]
        assert k["bytes"]["dram_read"] == pytest.approx(r.value * 1e9 * k["seconds"], rel=0.001)
        assert 0.95 * (8 << 20) < k["bytes"]["dram_read"] <= 8 << 20
    for bad in ({"unroll": 3}, {"unroll": 0}):
        with pytest.raises(InputError, match="unroll"):
            MI.run_micro("bandwidth", a100, bad)
    with pytest.raises(InputError, match="unroll"):
        MI.run_micro("bandwidth", load_machine("tiny-sunway"), {"unroll": 2})


def test_stream_on_some_cores_moves_what_those_cores_ask(tiny):
    """cores N: only N cores stream (the others idle). On tiny-gpu (2 SMs) each SM's stream is
    bound by the misses its L1 keeps in flight, far below the DRAM, so one SM moves about half of
    what both move (a little less: its sequential stream reaches one channel an 8-KB half chunk
    at a time, where two SMs keep both busy), and never more than its L1 fills a cycle."""
    one = MI.run_micro("bandwidth", tiny, {"footprint_mib": 0.25, "cores": 1})
    every = MI.run_micro("bandwidth", tiny, {"footprint_mib": 0.25})
    cores = tiny.groups * tiny.cores.per_group
    assert cores == 2 and one.kernels[0]["grid"][0] * cores == every.kernels[0]["grid"][0]
    assert 1.6 * one.value < every.value <= 2.1 * one.value
    assert one.value <= tiny.l1.bytes_per_cycle * tiny.clock_ghz
    for bad in (-1, tiny.groups * tiny.cores.per_group + 1):
        with pytest.raises(InputError, match="cores"):
            MI.run_micro("bandwidth", tiny, {"cores": bad})
    with pytest.raises(InputError, match="cores"):
        MI.run_micro("bandwidth", load_machine("tiny-sunway"), {"cores": 1})


def test_latency_beside_a_stream_rises_with_its_occupancy():
    """beside_occupancy: block 0's thread chases while every other block streams (the CUDA twin
    loaded_chase). Queues in the fabric, L2 and DRAM make each chase load wait longer the more
    the streams move, and the streams are still running when the chase ends (so every timed load
    was under load)."""
    a100 = load_machine("a100")
    args = {"footprint_kib": 65536, "warmup": 0, "loads": 24}
    alone = MI.run_micro("latency", a100, dict(args)).value
    light = MI.run_micro("latency", a100, dict(args, beside_occupancy=1 / 64))
    heavy = MI.run_micro("latency", a100, dict(args, beside_occupancy=8 / 64))
    assert alone * 0.95 < light.value < heavy.value
    assert heavy.value > 1.2 * alone
    assert light.extra["stream_gbps"] < heavy.extra["stream_gbps"]
    for r in (light, heavy):
        assert r.kernels[0]["cycles"] > r.extra["chase_end_cycle"]
        assert r.kernels[0]["grid"][0] == 1 + r.extra["stream_warps_per_core"] * 108 // (
            r.kernels[0]["block"][0] // 32)
    with pytest.raises(InputError, match="beside_occupancy"):
        MI.run_micro("latency", a100, dict(args, beside_occupancy=1.5))
    with pytest.raises(InputError, match="warmup"):   # streams as long as a warm-up pass: refused
        MI.run_micro("latency", a100, dict(args, warmup=1, beside_occupancy=0.5))
    with pytest.raises(InputError, match="beside_occupancy"):
        MI.run_micro("latency", load_machine("tiny-sunway"), dict(args, beside_occupancy=0.5))


@pytest.mark.parametrize("kind", ["write", "copy", "triad"])
def test_bandwidth_kinds_move_their_bytes(tiny, kind):
    # a footprint 4x the L2: every byte read comes from DRAM once; written lines go back to DRAM
    # when the write-back L2 evicts them, except those still dirty in it at the end and the
    # write-backs still queued for DRAM when the last warp exits (the run ends there)
    r = MI.run_micro("bandwidth", tiny, {"kind": kind, "footprint_mib": 1})
    k = r.kernels[0]
    useful = {"write": 1, "copy": 2, "triad": 3}[kind]
    reads = {"write": 0, "copy": 1, "triad": 2}[kind]
    total = r.value * 1e9 * k["seconds"]
    assert k["bytes"]["dram_read"] == pytest.approx(total * reads / useful, rel=0.01)
    written = total / useful
    l2 = tiny.l2.size_kib * 1024
    assert 0.8 * (written - l2) <= k["bytes"]["dram_write"] <= written


def test_mma_reaches_the_tensor_peak(tiny):
    r = MI.run_micro("mma", tiny, {"iterations": 32})
    peak = peak_tflops(tiny)["fp16"]
    assert 0.9 * peak < r.value <= peak * 1.0001


def test_wgmma_reaches_the_tensor_peak_and_narrow_tiles_bind_on_shared_memory():
    # h100: a warpgroup's m64n256k16 keeps the SM's tensor units busy (989 TFLOP/s peak); at N = 32
    # the operands read from shared memory bind (Luo et al.: SS below RS under N = 64)
    h100 = load_machine("h100")
    peak = peak_tflops(h100)["fp16"]
    wide = MI.run_micro("wgmma", h100, {"iterations": 8})
    assert 0.9 * peak < wide.value <= peak * 1.0001
    ss = MI.run_micro("wgmma", h100, {"iterations": 8, "n": 32}).value
    rs = MI.run_micro("wgmma", h100, {"iterations": 8, "n": 32, "a": "registers"}).value
    assert ss < 0.8 * rs
    with pytest.raises(InputError, match="warpgroup MMA"):
        MI.run_micro("wgmma", load_machine("a100"), {})
    with pytest.raises(InputError, match="--param n"):
        MI.run_micro("wgmma", h100, {"n": 48})


def test_result_record_fields_and_sums(tiny):
    r = MI.run_micro("bandwidth", tiny, {"footprint_mib": 0.25})
    doc = r.document(tiny)
    assert doc["schema"] == "archsim.micro/1" and doc["result"]["schema"] == "archsim.result/1"
    k = doc["result"]["kernels"][0]
    assert sum(k["stalls"].values()) == pytest.approx(1.0, abs=1e-4)
    assert set(k["bandwidth_gbps"]) == {"l1", "scratch", "l2", "dram", "fabric"}
    assert {"link_util_mean", "link_util_max", "blocked_cycles", "links"} <= set(k["fabric"])
    assert all({"name", "queue_mean", "queue_max", "row_hit_rate", "gbps"} <= set(mc) for mc in k["memory_controllers"])
    # the timeline adds back up to the run's totals
    tl = k["timeline"]
    w = tl["window_cycles"]
    ipc = tl["series"]["ipc"]
    n = len(ipc)
    last = k["cycles"] - (n - 1) * w
    assert sum(ipc[:-1]) * w + ipc[-1] * last == pytest.approx(k["warp_instructions"], rel=1e-3)
    dram = tl["series"]["dram_gbps"]
    tot = (sum(dram[:-1]) * w + dram[-1] * last) / tiny.clock_ghz
    assert tot == pytest.approx(k["bytes"]["dram_read"] + k["bytes"]["dram_write"], rel=1e-3)


def _strip(doc):
    doc = json.loads(json.dumps(doc))
    doc["result"]["sim"] = None
    return doc


def test_same_run_twice_gives_identical_json(tiny):
    a = MI.run_micro("latency", tiny, {"footprint_kib": 64, "loads": 128})
    b = MI.run_micro("latency", tiny, {"footprint_kib": 64, "loads": 128})
    assert _strip(a.document(tiny)) == _strip(b.document(tiny))


def test_skip_ahead_changes_nothing_in_the_record(tiny, monkeypatch):
    import archsim.micro as mod
    from archsim.engine import timing

    a = MI.run_micro("bandwidth", tiny, {"footprint_mib": 0.25, "occupancy": 0.25})
    orig = timing.time_kernel
    monkeypatch.setattr(mod, "time_kernel", lambda *x, **kw: orig(*x, **dict(kw, skip=False)))
    b = MI.run_micro("bandwidth", tiny, {"footprint_mib": 0.25, "occupancy": 0.25})
    da, db = _strip(a.document(tiny)), _strip(b.document(tiny))
    assert da["result"]["kernels"][0].pop("skipped_cycles") > 0
    assert db["result"]["kernels"][0].pop("skipped_cycles") == 0
    assert da == db


def test_skip_ahead_jumps_over_a_request_in_flight(tiny, monkeypatch):
    """A pointer chase has one load in flight at a time: the cycles it spends in the fabric's
    router pipelines, an L2 slice's pipeline or DRAM are jumped over (each has a known cycle),
    and the record is the same as stepping every cycle."""
    import archsim.micro as mod
    from archsim.engine import timing

    p = {"footprint_kib": 64, "loads": 128}
    a = MI.run_micro("latency", tiny, p)
    orig = timing.time_kernel
    monkeypatch.setattr(mod, "time_kernel", lambda *x, **kw: orig(*x, **dict(kw, skip=False)))
    b = MI.run_micro("latency", tiny, p)
    da, db = _strip(a.document(tiny)), _strip(b.document(tiny))
    ka, kb = da["result"]["kernels"][0], db["result"]["kernels"][0]
    assert ka.pop("skipped_cycles") > 0.8 * ka["cycles"]
    assert kb.pop("skipped_cycles") == 0
    assert da == db


@pytest.mark.parametrize("name,params,where", [
    ("latency", {}, "micro latency"),
    ("latency", {"footprint_kib": "x"}, "--param footprint_kib"),
    ("latency", {"footprint_kib": 4, "nope": 1}, "--param nope"),
    ("bandwidth", {"kind": "scatter"}, "--param kind"),
    ("mma", {"dtype": "int4"}, "--param dtype"),
    ("nosuch", {}, "micro"),
])
def test_bad_parameters_are_one_clear_error(tiny, name, params, where):
    with pytest.raises(InputError) as e:
        MI.run_micro(name, tiny, params)
    assert e.value.where == where


# ----------------------------------------------------------------------------- command line
def _cli(capsys, *argv):
    from archsim.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_micro_json(capsys, tmp_path):
    f = tmp_path / "m.json"
    code, out, err = _cli(capsys, "micro", "latency", "--hw", "tiny-gpu", "--param", "footprint_kib=4",
                          "--param", "loads=64", "--json", str(f))
    assert code == 0, err
    assert "cycles" in out
    doc = json.loads(f.read_text())
    assert doc["schema"] == "archsim.micro/1" and doc["unit"] == "cycles" and doc["value"] > 30
    assert doc["result"]["complete"] is True


def test_cli_micro_max_cycles_exits_3_with_partial_json(capsys, tmp_path):
    f = tmp_path / "m.json"
    code, out, err = _cli(capsys, "micro", "bandwidth", "--hw", "tiny-gpu", "--param", "footprint_mib=1",
                          "--max-cycles", "500", "--json", str(f))
    assert code == 3
    assert err.count("\n") == 1 and "max-cycles 500" in err and "core" in err
    doc = json.loads(f.read_text())
    assert doc["complete"] is False and doc["result"]["complete"] is False
    assert doc["result"]["kernels"][0]["cycles"] == 500


def test_cli_micro_bad_param_exits_2(capsys):
    code, out, err = _cli(capsys, "micro", "latency", "--hw", "tiny-gpu", "--param", "footprint_kib")
    assert code == 2 and err.startswith("archsim: error: --param") and err.count("\n") == 1


def test_cli_validate_with_a_reference_file(capsys, tmp_path):
    ref = tmp_path / "ref.yaml"
    ref.write_text("machine: tiny-gpu\nrows:\n"
                   "  - {quantity: ffma_latency, value: 4, unit: cycles, source: tiny-gpu config}\n"
                   "  - {quantity: shared_latency, value: 25, unit: cycles, source: tiny-gpu config}\n")
    f = tmp_path / "v.json"
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--json", str(f),
                          "--plot", "none")
    assert code == 0, err
    doc = json.loads(f.read_text())
    assert doc["schema"] == "archsim.validate/1"
    assert [r["quantity"] for r in doc["rows"]] == ["ffma_latency", "shared_latency"]
    assert doc["rows"][0]["error_pct"] == 0.0
    assert doc["mape_pct"] == pytest.approx(sum(abs(r["error_pct"]) for r in doc["rows"]) / 2, abs=0.01)


@pytest.mark.parametrize("text,where", [
    ("rows: 3\n", "no `rows:` or `curves:` list"),
    ("rows:\n  - {quantity: warp_speed, value: 4, unit: cycles, source: x}\n", "has no probe"),
    ("rows:\n  - {quantity: ffma_latency, value: 4, unit: ns, source: x}\n", "does not match"),
    ("rows:\n  - {quantity: ffma_latency, value: -1, unit: cycles, source: x}\n", "not a positive number"),
])
def test_cli_validate_bad_reference_exits_2(capsys, tmp_path, text, where):
    ref = tmp_path / "ref.yaml"
    ref.write_text(text)
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref))
    assert code == 2 and where in err and err.count("\n") == 1


def test_builtin_references_load():
    from archsim.validate import load_reference, reference_path

    from archsim.validate import FAMILY_PROBES, PROBES

    assert set(FAMILY_PROBES["gpu"]) | set(FAMILY_PROBES["sunway"]) == set(PROBES)
    for name in ("a100", "h100", "sw26010pro"):
        m = load_machine(name)
        rows = load_reference(reference_path(m))
        assert {r["quantity"] for r in rows} == set(FAMILY_PROBES[m.family])


def test_validate_rejects_a_probe_of_the_other_family(capsys, tmp_path):
    ref = tmp_path / "ref.yaml"
    ref.write_text("rows:\n  - {quantity: dma_get_startup, value: 490, unit: cycles, source: x}\n")
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref))
    assert code == 2 and "not a probe of the gpu family" in err and err.count("\n") == 1


def test_gemm_micro_is_the_emitted_tiled_kernel_and_rejects_bad_params(tiny):
    from archsim.workloads.emit import gemm_kernel

    r = MI.run_micro("gemm", tiny, {"m": 128, "n": 64, "k": 64})
    k = r.kernels[0]
    g = gemm_kernel(capabilities(tiny), 128, 64, 64, "fp16")
    assert k["model_flops"] == 2 * 128 * 64 * 64 and k["grid"] == list(g.launch.grid)
    assert r.extra["tile"] == [g.tile.BM, g.tile.BN, g.tile.BK]
    assert 0 < r.value < peak_tflops(tiny)["fp16"]
    assert k["bandwidth_gbps"]["scratch"] > 0  # staged through shared memory
    odd = MI.run_micro("gemm", tiny, {"m": 100, "n": 40, "k": 24})  # edges: predicated, residue k tile
    assert odd.kernels[0]["model_flops"] == 2 * 100 * 40 * 24 and odd.value > 0
    with pytest.raises(InputError) as e:
        MI.run_micro("gemm", tiny, {"m": 0, "n": 64, "k": 64})
    assert e.value.where == "--param m/n/k"
    with pytest.raises(InputError) as e:
        MI.run_micro("gemm", tiny, {"dtype": "int4"})
    assert e.value.where == "--param dtype"


def test_gemm_micro_times_a_given_tile(tiny):
    from archsim.workloads.emit import gemm_kernel
    from archsim.workloads.emit.gemm_gpu import Tile

    r = MI.run_micro("gemm", tiny, {"m": 128, "n": 128, "k": 128, "tile": "64x32x32/4/2"})
    g = gemm_kernel(capabilities(tiny), 128, 128, 128, "fp16", tile=Tile(64, 32, 32, 4, 2))
    assert r.extra["tile"] == [64, 32, 32] and r.extra["stages"] == 2 and r.extra["warps"] == 4
    assert r.kernels[0]["grid"] == list(g.launch.grid) == [4, 2, 1]
    auto = MI.run_micro("gemm", tiny, {"m": 128, "n": 128, "k": 128})
    assert auto.extra["tile"] != [64, 32, 32] or auto.extra["stages"] != 2


@pytest.mark.parametrize("tile,what", [("12x3", "'12x3'"), ("128x128x64", "'128x128x64'"),
                                        ("48x64x32/4/2", "powers of two"), ("1024x64x32/8/2", "to 256"), ("64x64x16/4/2", "BK 32 or 64"),
                                        ("64x64x32/6/2", "4 or 8 warps"), ("64x64x32/4/9", "2-8 stages"),
                                        ("axbxc/4/2", "'axbxc/4/2'")])
def test_gemm_micro_bad_tile_is_one_clear_error(tiny, tile, what):
    with pytest.raises(InputError) as e:
        MI.run_micro("gemm", tiny, {"tile": tile})
    assert e.value.where == "--param tile" and (what in e.value.what or what in e.value.allowed)


def test_gemm_micro_tile_needs_the_tensor_kernel_and_a_gpu(tiny):
    with pytest.raises(InputError, match="vector FFMA kernel"):
        MI.run_micro("gemm", tiny, {"dtype": "fp32", "tile": "64x32x32/4/2"})
    with pytest.raises(InputError, match="does not fit a core"):
        MI.run_micro("gemm", tiny, {"tile": "128x128x64/4/8"})
    with pytest.raises(InputError) as e:
        MI.run_micro("gemm", load_machine("tiny-sunway"), {"tile": "64x32x32/4/2"})
    assert e.value.where == "--param tile"




# ----------------------------------------------------------------------------- micro asm (slope of an ISA kernel)
CHAIN_S = """.kernel chain
.param iters
.launch grid=1 block=32
.arg iters = 8
        mov.f32 r1, 1.0
        mov.f32 r2, 1.0
        ldparam r41, iters
        mov.b64 r40, 0
LOOP:
""" + "        fma.f32 r1, r1, r2, r2\n" * 16 + """        add.i64 r40, r40, 1
        setp.lt.i64 p0, r40, r41
   @p0  bra LOOP
        exit
"""


def test_micro_asm_slope_is_the_loop_body_cost(tiny, tmp_path):
    # formula oracle: 16 dependent FFMA an iteration cost 16 x the pipe latency; the loop's own
    # add/setp/bra run beside the chain but for a branch bubble, and the launch and drain cancel
    f = tmp_path / "chain.s"
    f.write_text(CHAIN_S)
    lat = tiny.pipes["fma"].latency_cycles
    r = MI.run_micro("asm", tiny, {"file": str(f), "iters": 8})
    assert 16 * lat <= r.value <= 16 * lat + 8
    assert r.unit == "cycles" and len(r.kernels) == 2
    c1, c2 = r.extra["cycles"]
    assert r.value == (c2 - c1) / 8
    per = MI.run_micro("asm", tiny, {"file": str(f), "iters": 8, "per_iter": 16})
    assert per.value == pytest.approx(r.value / 16)


def test_micro_asm_finds_builtin_validation_kernels_by_name_and_n(tmp_path):
    from archsim.config.derived import capabilities
    from archsim.isa.asm import assemble_file
    from archsim.isa.check import check
    from archsim.paths import data_dir

    files = sorted((data_dir("isa") / "validation").glob("*.s"))
    assert files
    caps = capabilities(load_machine("h100"))
    for f in files:
        prog = assemble_file(f, {"{n}": "2"})   # micro asm puts n in place of {n} in the text too
        check(prog, caps)
        assert "iters" in {a.name for a in prog.args if not a.is_buffer}, f.name
    assert MI.asm_path("mma_mix_f{n}".replace("{n}", "4")).name == "mma_mix_f4.s"


@pytest.mark.parametrize("params,where,what", [
    ({"file": "no_such_kernel"}, "--param file", "no such .s file"),
    ({"file": "mma_mix_f{n}", "n": 3}, "--param file", "no such .s file"),
    ({"file": "mma_mix_f1", "iters": 0}, "--param iters", "0"),
    ({"file": "mma_mix_f1", "per_iter": 0}, "--param per_iter", "0"),
    ({"file": "mma_mix_f1", "threads": 100000}, "--param threads", "threads per block"),
])
def test_micro_asm_bad_params_are_one_clear_error(tiny, params, where, what):
    with pytest.raises(InputError) as e:
        MI.run_micro("asm", tiny, params)
    assert e.value.where == where and what in e.value.what


NESTED_S = """.kernel nested
.param iters
.param inner
.launch grid=1 block=32
.arg iters = 8
.arg inner = {n}
        mov.f32 r1, 1.0
        mov.f32 r2, 1.0
        ldparam r41, iters
        ldparam r43, inner
        mov.b64 r40, 0
LOOP:
        mov.b64 r42, 0
INNER:
""" + "        fma.f32 r1, r1, r2, r2\n" * 8 + """        add.i64 r42, r42, 1
        setp.lt.i64 p1, r42, r43
   @p1  bra INNER
        add.i64 r40, r40, 1
        setp.lt.i64 p0, r40, r41
   @p0  bra LOOP
        exit
"""


def test_micro_asm_puts_n_in_the_file_text(tiny, tmp_path):
    # {n} in an .arg value: the inner loop's trip count, so the outer loop's slope grows with n
    from archsim.isa.asm import assemble_file

    f = tmp_path / "nested.s"
    f.write_text(NESTED_S)
    one = MI.run_micro("asm", tiny, {"file": str(f), "n": 1})
    three = MI.run_micro("asm", tiny, {"file": str(f), "n": 3})
    lat = tiny.pipes["fma"].latency_cycles
    assert 8 * lat <= one.value and 2.5 * one.value < three.value <= 3 * one.value + 8
    with pytest.raises(InputError):      # {n} left in the text is not an integer
        assemble_file(f)


def test_micro_asm_needs_a_loop_on_iters(tiny, tmp_path):
    f = tmp_path / "noiters.s"
    f.write_text(".kernel k\n.launch grid=1 block=32\n        exit\n")
    with pytest.raises(InputError, match="no scalar .arg iters"):
        MI.run_micro("asm", tiny, {"file": str(f)})
    g = tmp_path / "flat.s"     # reads iters but does not loop on it
    g.write_text(".kernel k\n.param iters\n.launch grid=1 block=32\n.arg iters = 4\n        ldparam r1, iters\n"
                 "        exit\n")
    with pytest.raises(InputError, match="does not grow with iters"):
        MI.run_micro("asm", tiny, {"file": str(g)})


@pytest.mark.parametrize("kind", ["read", "write", "copy", "triad"])
def test_gpu_stream_kernels_compute_what_gpu_benches_computes(kind):
    """The one-element-a-thread kernels (gpu-benches' gpu-stream) on real values: read stores
    nothing (its values are never 123.0), write 0.23, copy 1.2 b, triad 1.2 b + c."""
    from archsim.engine.functional import run_functional

    n = 200                                   # not a whole number of blocks: the guard exits the rest
    rng = np.random.default_rng(1)
    b, c = rng.standard_normal(n), rng.standard_normal(n)
    a = np.full(n, 7.0)
    prog = assemble(MI._thread_stream_kernel(kind, 1024))
    res = run_functional(prog, {"a": a, "b": b, "c": c, "n": n}, Launch((4, 1, 1), (64, 1, 1)))
    want = {"read": a, "write": np.full(n, 0.23), "copy": 1.2 * b, "triad": 1.2 * b + c}[kind]
    np.testing.assert_allclose(res.output("a")[:n], want)


def test_gpu_stream_shape_holds_its_blocks_and_moves_its_bytes(tiny):
    """block > 0: one 8-byte element a thread over the footprint, blocks_per_core blocks on a core
    (its shared memory bounds them); more blocks in flight stream faster; every byte read comes
    from DRAM once."""
    got = {}
    for bpc in (1, 2):
        r = MI.run_micro("bandwidth", tiny, {"block": 64, "blocks_per_core": bpc, "footprint_mib": 1})
        k = r.kernels[0]
        assert k["block"] == [64, 1, 1] and k["grid"] == [2**20 // 8 // 64, 1, 1]
        assert k["bytes"]["dram_read"] == 2**20 and r.extra["warps_per_core"] == 2 * bpc
        got[bpc] = r.value
    assert got[2] > 1.3 * got[1]


def test_gpu_stream_shape_refuses_what_it_cannot_run(tiny):
    for p, what in (({"block": 48}, "block"), ({"block": 64, "blocks_per_core": 0}, "blocks_per_core"),
                    ({"block": 64, "occupancy": 0.5}, "occupancy"), ({"block": -1}, "block"),
                    ({"block": 64, "blocks_per_core": 64}, "block")):
        with pytest.raises(InputError, match=what):
            MI.run_micro("bandwidth", tiny, dict(p, footprint_mib=1))
    with pytest.raises(InputError, match="block"):
        MI.run_micro("bandwidth", load_machine("tiny-sunway"), {"block": 64})
