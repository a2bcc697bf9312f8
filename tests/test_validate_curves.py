"""`archsim validate` curves: a figure against a swept parameter, run on the model point by point
(the curve's micro kernel and params at the point's clock), with per-curve and overall MAPE, a
plot, and one clear line for a bad reference file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archsim import micro as MI
from archsim.config import load_machine
from archsim.config.derived import memory_clock_ghz
from archsim.errors import InputError
from archsim.validate import at_clock, load_curves, load_reference, pick_curves, reference_path, validate

CHASE = {"name": "chase", "source": "tiny-gpu test", "kernel": "latency",
         "params": {"stride_bytes": 128, "loads": 64, "warmup": 1}, "x": "footprint_kib", "unit": "cycles",
         "points": [[2, 40.0], [64, 300.0]]}
GEMM = {"name": "gemm", "source": "tiny-gpu test", "kernel": "gemm", "params": {"dtype": "fp16", "sample": False},
        "x": ["m", "n", "k"], "unit": "TFLOP/s", "points": [[64, 0.5], [[64, 128, 64], 0.6, 1500]]}


def _ref(tmp_path: Path, curves, rows=None) -> Path:
    doc = {"machine": "tiny-gpu", "curves": curves}
    if rows is not None:
        doc["rows"] = rows
    p = tmp_path / "ref.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _cli(capsys, *argv):
    from archsim.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_curves_run_point_by_point_with_per_curve_and_overall_mape(tmp_path):
    m = load_machine("tiny-gpu")
    ref = _ref(tmp_path, [CHASE, GEMM], rows=[{"quantity": "ffma_latency", "value": 4, "unit": "cycles",
                                              "source": "tiny-gpu config"}])
    doc = validate(m, str(ref))
    chase, gemm = doc["curves"]
    # each point is the curve's micro kernel with the point's params, as `archsim micro` runs it
    direct = MI.run_micro("latency", m, {"footprint_kib": 64, "stride_bytes": 128, "loads": 64, "warmup": 1})
    assert chase["points"][1]["simulated"] == pytest.approx(direct.value, abs=1e-3)
    assert chase["points"][0]["simulated"] < chase["points"][1]["simulated"]   # the L1 and the L2 step
    for c in (chase, gemm):
        errs = [abs(p["error_pct"]) for p in c["points"]]
        assert c["mape_pct"] == pytest.approx(sum(errs) / len(errs), abs=0.01)
        assert c["max_error_pct"] == pytest.approx(max(errs), abs=0.01)
        for p in c["points"]:
            # (the record rounds error_pct to 0.01 from the unrounded simulated value: 0.01 apart at most)
            assert p["error_pct"] == pytest.approx((p["simulated"] - p["reference"]) / p["reference"] * 100, abs=0.0101)
    everything = [abs(r["error_pct"]) for r in doc["rows"]] + [abs(p["error_pct"]) for c in doc["curves"]
                                                               for p in c["points"]]
    assert doc["mape_pct"] == pytest.approx(sum(everything) / len(everything), abs=0.01)
    # a shape point sets m, n, k each; a number sets them all; the third column is the clock
    assert gemm["points"][1]["x"] == [64, 128, 64] and gemm["points"][1]["clock_mhz"] == 1500


def test_at_clock_keeps_the_dram_clock_and_moves_the_core():
    m = load_machine("tiny-gpu")
    f = at_clock(m, m.clock_ghz * 1000 * 2)
    assert f.clock_ghz == pytest.approx(2 * m.clock_ghz)
    assert memory_clock_ghz(f) == pytest.approx(memory_clock_ghz(m))
    assert at_clock(m, None) is m
    # a cold chase: the DRAM part is fixed in ns, so it costs more core cycles at the faster clock;
    # an L1 hit is core cycles either way
    cold = {"footprint_kib": 256, "loads": 32, "warmup": 0}
    assert MI.run_micro("latency", f, cold).value > MI.run_micro("latency", m, cold).value
    hot = {"footprint_kib": 1, "loads": 32}
    assert MI.run_micro("latency", f, hot).value == MI.run_micro("latency", m, hot).value


def test_overrides_change_the_params_from_an_x_on(tmp_path):
    c = dict(CHASE, overrides=[{"from_x": 64, "params": {"warmup": 0}}])
    pts = load_curves(_ref(tmp_path, [c]), "gpu")[0]["points"]
    assert [x["params"]["warmup"] for x in pts] == [1, 0]


def test_a_calls_own_time_is_added_to_its_kernels(tmp_path):
    """A point measured as one call between two CUDA events holds the call's launch: the model's
    figure is the same work over the kernels' time and ``call_overhead_us``."""
    m = load_machine("tiny-gpu")
    base = validate(m, str(_ref(tmp_path, [GEMM])))["curves"][0]
    with_call = validate(m, str(_ref(tmp_path, [dict(GEMM, call_overhead_us=3.0)])))["curves"][0]
    assert "call_overhead_us" not in base and with_call["call_overhead_us"] == 3.0
    for p0, p1, (x, _, *clock) in zip(base["points"], with_call["points"], GEMM["points"]):
        mnk = x if isinstance(x, list) else [x] * 3
        flops = 2 * mnk[0] * mnk[1] * mnk[2]
        kernel_s = flops / (p0["simulated"] * 1e12)          # the kernel alone, as the curve without it
        assert p1["kernels_only"] == pytest.approx(p0["simulated"], rel=1e-6)
        assert p1["simulated"] == pytest.approx(flops / (kernel_s + 3e-6) / 1e12, rel=3e-3)  # (4 decimals)
        assert p1["simulated"] < p0["simulated"]


def test_cli_validate_prints_curves_writes_json_and_plot(capsys, tmp_path):
    ref = _ref(tmp_path, [CHASE])
    png, js = tmp_path / "v.png", tmp_path / "v.json"
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--json", str(js),
                          "--plot", str(png))
    assert code == 0, err
    assert "chase" in out and "MAPE" in out and f"plot: {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(js.read_text())
    assert doc["schema"] == "archsim.validate/1" and [c["name"] for c in doc["curves"]] == ["chase"]
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--curve", "cha",
                          "--plot", "none")
    assert code == 0 and "chase" in out


def _bad(**change):
    c = dict(CHASE, **change)
    return {k: v for k, v in c.items() if v is not None}


@pytest.mark.parametrize("curve,what", [
    (_bad(source=None), "source: missing"),
    (_bad(source="  "), "source: missing"),
    (_bad(points=[[64, 300.0], [2, 40.0]]), "does not increase"),
    (_bad(points=[[2, 40.0], [2, 41.0]]), "does not increase"),
    (_bad(kernel="dma", unit="B/cycle", x="size_bytes", params={}), "a gpu machine cannot run micro dma"),
    (_bad(kernel="warp_drive"), "is not a micro-benchmark"),
    (_bad(unit="ns"), "is not what micro latency measures"),
    (_bad(x="colour"), "is not a parameter of micro latency"),
    (_bad(points=[[2]]), "is not a point"),
    (_bad(points=[[2, -1]]), "is not a positive number"),
    (_bad(points=[[[2, 3], 5.0]]), "does not fit x"),
    (_bad(points=[]), "missing or empty"),
    (_bad(params={"stride_bytes": "wide"}), "(--param stride_bytes)"),
    (_bad(clock_mhz=0), "is not a clock"),
    (_bad(call_overhead_us=5.0), "micro latency's figure is not work over its kernels' time"),
    (dict(GEMM, call_overhead_us=-1), "call_overhead_us: -1 is not a time"),
    (dict(GEMM, call_overhead_us="7 us"), "is not a time"),
    (dict(GEMM, call_overhead_us=True), "is not a time"),
    (_bad(overrides=[{"from": 3}]), "overrides"),
    (_bad(colour="red"), "unknown field 'colour'"),
    (_bad(kernel="asm", unit="cycles", x="n", params={"file": "mma_mix_f{n}"}, points=[[3, 7.0]]),
     "(--param file): 'mma_mix_f3': no such .s file"),
])
def test_a_bad_curve_is_one_line_exit_2(capsys, tmp_path, curve, what):
    ref = _ref(tmp_path, [curve])
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--plot", "none")
    assert code == 2 and what in err and err.count("\n") == 1, err
    assert out == ""   # nothing ran


def test_repeated_curve_names_unknown_filter_and_bad_plot_path(capsys, tmp_path):
    ref = _ref(tmp_path, [CHASE, CHASE])
    code, _, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref))
    assert code == 2 and "missing or repeated" in err
    ref = _ref(tmp_path, [CHASE])
    code, _, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--curve", "nothing",
                        "--plot", "none")
    assert code == 2 and "--curve" in err and err.count("\n") == 1 and _ == ""
    for bad in (str(tmp_path / "v.gif"), str(tmp_path / "no" / "v.png")):
        code, _, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--plot", bad)
        assert code == 2 and err.startswith("archsim: error: --plot") and err.count("\n") == 1


def test_builtin_reference_curves_load_for_their_machine():
    for name in ("a100", "h100", "sw26010pro"):
        m = load_machine(name)
        path = reference_path(m)
        load_reference(path)
        for c in load_curves(path, m.family):
            assert c["source"] and c["points"]


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=4))
_doc = st.recursive(_leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                  st.dictionaries(st.sampled_from(
                                                      ["name", "source", "kernel", "params", "x", "unit",
                                                       "points", "clock_mhz", "overrides", "from_x",
                                                       "call_overhead_us"]), kids,
                                                      max_size=5)), max_leaves=12)


_near = st.fixed_dictionaries(
    {"name": st.just("c"), "source": st.just("s"), "kernel": st.sampled_from(["latency", "gemm", "dma"]),
     "x": st.one_of(st.just("footprint_kib"), st.just(["m", "n", "k"]), _doc),
     "unit": st.sampled_from(["cycles", "TFLOP/s"]), "points": _doc},
    optional={"params": _doc, "overrides": _doc, "clock_mhz": _leaf, "call_overhead_us": _leaf})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(curve=st.one_of(_doc, _near))
def test_any_curve_document_loads_or_is_an_input_error(tmp_path, curve):
    p = tmp_path / "ref.yaml"
    p.write_text(yaml.safe_dump({"curves": [curve]}))
    try:
        load_curves(p, "gpu")
    except InputError:
        pass


def test_curve_filter_repeats_and_each_text_must_match(tmp_path):
    """--curve may be given several times: the curves matching any text run, in file order; a
    text that matches none is an input error naming it (one --curve never silently drops another)."""
    curves = [{"name": "pointer_chase"}, {"name": "stream_vs_footprint"}, {"name": "stream_vs_occupancy"}]
    path = tmp_path / "m.yaml"
    assert [c["name"] for c in pick_curves(curves, ["occ", "chase"], path)] == ["pointer_chase", "stream_vs_occupancy"]
    assert [c["name"] for c in pick_curves(curves, "stream", path)] == ["stream_vs_footprint", "stream_vs_occupancy"]
    with pytest.raises(InputError, match="'gemm'"):
        pick_curves(curves, ["chase", "gemm"], path)


@pytest.mark.parametrize("text,what", [
    ("machine: tiny-gpu\n1: x\nzz: y\nrows: []\ncurves: [{}]\n", "unknown key 1"),
    ("machine: tiny-gpu\nrows: [{quantity: ffma_latency, 2: x, zz: y}]\n", "unknown field 2"),
    ("machine: tiny-gpu\ncurves: [{name: c, 3: x, zz: y}]\n", "unknown field 3"),
])
def test_keys_yaml_reads_as_numbers_are_one_line(capsys, tmp_path, text, what):
    """Unknown keys of mixed types (YAML reads `1:` as a number) sort by their text, not a TypeError."""
    ref = tmp_path / "r.yaml"
    ref.write_text(text)
    code, out, err = _cli(capsys, "validate", "--hw", "tiny-gpu", "--reference", str(ref), "--plot", "none")
    assert code == 2 and what in err and err.count("\n") == 1 and "Traceback" not in err, err
