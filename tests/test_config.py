"""The hardware YAML subsystem: every config loads, derived figures match the published ones,
bad input gets one exact line, and --set / overlays behave as documented (hypothesis)."""

from __future__ import annotations

import copy
import pickle
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from archsim.config import (
    Machine,
    builtin_machines,
    builtin_overlays,
    capabilities,
    cores_total,
    deep_merge,
    dram_burst_cycles,
    format_machine,
    get_value,
    l1_cache_kib,
    load_machine,
    machine_fingerprint,
    peak_bandwidth_gbps,
    peak_tflops,
    peak_tflops_detail,
    resolve_hw,
)
from archsim.config.derived import clusters_per_group, scratch_usable_kib
from archsim.errors import InputError
from archsim.paths import data_dir

CONFIGS = data_dir("configs")
MACHINE_FILES = sorted(CONFIGS.glob("*.yaml"))
BUILTINS = ("a100", "h100", "sw26010pro", "tiny-gpu", "tiny-sunway")
HYPO = settings(max_examples=40, deadline=None)


def approx(x, rel=0.005):
    return pytest.approx(x, rel=rel)


def error_line(hw="tiny-gpu", overlays=(), sets=()) -> str:
    with pytest.raises(InputError) as info:
        load_machine(hw, overlays, sets)
    return info.value.line()


# ---- every config loads --------------------------------------------------------------------------

def test_builtins_present():
    assert set(BUILTINS) <= set(builtin_machines())
    assert {"l2-off", "hbm-2x"} <= set(builtin_overlays())


@pytest.mark.parametrize("path", MACHINE_FILES, ids=lambda p: p.stem)
def test_every_config_loads(path):
    by_path = load_machine(str(path))
    by_name = load_machine(path.stem)
    assert by_path == by_name and by_path.name == path.stem
    text = format_machine(by_name)
    assert "derived:" in text and "peak_tflops" in text
    assert yaml.safe_load(text)["name"] == path.stem           # show-config output is valid YAML
    caps = capabilities(by_name)
    assert {"int", "ctrl", "sync"} <= caps.units
    assert len(machine_fingerprint(by_name)) == 64


@pytest.mark.parametrize("overlay", ["l2-off", "hbm-2x"])
@pytest.mark.parametrize("name", BUILTINS)
def test_every_overlay_applies(name, overlay):
    m = load_machine(name, [overlay])
    if overlay == "l2-off":
        assert m.l2 is None and "l2" not in peak_bandwidth_gbps(m)
    else:
        assert m.dram.channel_gbps == 311.0


def test_resolve_hw_forms():
    assert resolve_hw("a100") == CONFIGS / "a100.yaml"
    assert resolve_hw("a100.yaml") == CONFIGS / "a100.yaml"
    assert resolve_hw(str(CONFIGS / "h100.yaml")) == CONFIGS / "h100.yaml"


# ---- published figures come out of the derivation ------------------------------------------------

def test_a100_figures():
    m = load_machine("a100")
    assert m.groups == 1 and m.cores.per_group == 108 and cores_total(m) == 108
    peak, detail = peak_tflops(m), peak_tflops_detail(m)
    assert peak["fp16"] == approx(312) and peak["bf16"] == approx(312)
    assert peak["tf32"] == approx(156)
    assert peak["fp32"] == approx(19.5)
    assert detail["vector"]["fp64"] == approx(9.7, rel=0.01)
    assert detail["tensor"]["fp64"] == approx(19.5)
    assert peak["fp64"] == approx(19.5)
    bw = peak_bandwidth_gbps(m)
    assert bw["dram"] == approx(1555)
    assert bw["l2"] == approx(5120 * 1.41)                     # 5120 B/clk [WP]
    assert l1_cache_kib(m) == 192 - 164
    assert dram_burst_cycles(m) == approx(0.25)                 # 32 B at 128 B per memory cycle


def test_sw26010pro_figures():
    m = load_machine("sw26010pro")
    assert m.groups == 6 and m.cores.per_group == 64 and cores_total(m) == 384
    peak, detail = peak_tflops(m), peak_tflops_detail(m)
    assert peak["fp16"] == approx(55.3)
    assert peak["fp32"] == approx(14.03) and peak["fp64"] == approx(14.03)
    assert detail["tensor"] == {}
    assert peak_bandwidth_gbps(m)["dram"] == approx(307.2)
    assert clusters_per_group(m) == 16
    assert scratch_usable_kib(m) == 256


def test_h100_figures():
    m = load_machine("h100")
    assert m.cores.per_group == 132
    assert peak_tflops(m)["fp16"] == pytest.approx(989, rel=0.01)
    assert peak_tflops(m)["tf32"] == pytest.approx(495, rel=0.01)
    assert peak_bandwidth_gbps(m)["dram"] == approx(3352)


def test_show_config_text():
    a100 = format_machine(load_machine("a100"))
    assert "108 SMs" in a100
    derived = yaml.safe_load(a100)["derived"]
    assert derived["peak_tflops"]["fp16"] == 312 and derived["cores_total"] == 108
    sw = format_machine(load_machine("sw26010pro"))
    assert "6 core groups x 64 CPEs" in sw
    derived = yaml.safe_load(sw)["derived"]
    assert derived["peak_tflops"]["fp16"] == 55.3 and derived["peak_tflops"]["fp32"] == 14.03
    assert derived["peak_bandwidth_gbps"]["dram"] == 307.2


def test_capabilities():
    a100, sw = capabilities(load_machine("a100")), capabilities(load_machine("sw26010pro"))
    assert "tensor" in a100.units and "dma" not in a100.units and a100.has_async_copy
    assert a100.tensor_dtypes == {"fp16", "bf16", "tf32", "fp64", "int8"}
    assert a100.scratchpad_bytes == 164 * 1024 and a100.cores_total == 108 and a100.subcores == 4
    assert "tensor" not in sw.units and {"dma", "rma", "lsu", "fp16"} <= sw.units
    assert sw.has_dma and sw.has_rma and not sw.has_async_copy and sw.tensor_dtypes == frozenset()
    assert sw.dma_broadcast_modes == {"row", "column", "array"}
    assert sw.warp_width == 32 and sw.warp_slots == 1 and sw.scratchpad_bytes == 256 * 1024
    tiny = capabilities(load_machine("tiny-sunway", sets=["scratchpad.cache_kib=32"]))
    assert tiny.scratchpad_bytes == (64 - 32) * 1024


def test_set_replaces_mapping_and_removes_block():
    m = load_machine("tiny-gpu", sets=["pipes.fma.lanes_per_cycle={f32: 32}", "tensor=null"])
    assert dict(m.pipes["fma"].lanes_per_cycle) == {"f32": 32.0}
    assert m.tensor is None and "tensor" not in capabilities(m).units
    assert load_machine("tiny-gpu", sets=["name=123"]).name == "123"       # a str field keeps the text
    assert load_machine("tiny-gpu", sets=["clock_ghz=2e0"]).clock_ghz == 2.0


# ---- bad input: one exact line --------------------------------------------------------------------

def _variant(tmp_path, mutate, base="tiny-gpu") -> str:
    data = yaml.safe_load((CONFIGS / f"{base}.yaml").read_text())
    mutate(data)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(p)


CORE_KEYS = ("kind, per_group, warp_width, warp_slots, max_blocks, subcores, scheduler, issue_per_cycle, "
             "mio_queue_entries, load_trackers, miss_queue_entries, block_launch_cycles, block_interval_cycles")


def test_unknown_key(tmp_path):
    p = _variant(tmp_path, lambda d: d["cores"].update(per_grup=2))
    assert error_line(p) == f"{p}: cores.per_grup: unknown key 'per_grup' (known keys: {CORE_KEYS})"


def test_wrong_type(tmp_path):
    p = _variant(tmp_path, lambda d: d["cores"].update(per_group="two"))
    assert error_line(p) == f"{p}: cores.per_group: expected an integer, got 'two' (an integer > 0)"


def test_missing_block(tmp_path):
    p = _variant(tmp_path, lambda d: d.pop("dram"))
    assert error_line(p) == (
        f"{p}: dram: missing required block 'dram' (required at the top level: name, family, clock_ghz, "
        "clock_ratios, groups, cores, register_file, pipes, scratchpad, fabric, memory_controllers, dram)")


def test_negative_size(tmp_path):
    p = _variant(tmp_path, lambda d: d["l2"].update(size_kib=-4))
    assert error_line(p) == f"{p}: l2.size_kib: value -4 out of range (an integer > 0)"


def test_zero_clock(tmp_path):
    p = _variant(tmp_path, lambda d: d.update(clock_ghz=0))
    assert error_line(p) == f"{p}: clock_ghz: value 0 out of range (a number > 0)"
    assert error_line(sets=["clock_ghz=0"]) == "--set clock_ghz: value 0 out of range (a number > 0)"


def test_shared_larger_than_l1(tmp_path):
    p = _variant(tmp_path, lambda d: d["scratchpad"].update(size_kib=40, carveouts_kib=[0, 40]))
    assert error_line(p) == (f"{p}: scratchpad.size_kib: scratchpad.size_kib 40 exceeds l1.size_kib 32, "
                             "the unified L1/shared array (at most 32 KiB)")
    assert error_line("a100", sets=["l1.size_kib=128"]) == (
        "--set l1.size_kib: scratchpad.size_kib 164 exceeds l1.size_kib 128, the unified L1/shared array "
        "(at most 128 KiB)")


def test_overlay_blamed_for_its_value(tmp_path):
    ov = tmp_path / "small-l1.yaml"
    ov.write_text("l1:\n  size_kib: 8\n")
    assert error_line(overlays=[str(ov)]) == (
        f"{ov}: l1.size_kib: scratchpad.size_kib 16 exceeds l1.size_kib 8, the unified L1/shared array "
        "(at most 8 KiB)")


def test_mma_sync_rate_refusals():
    assert error_line("h100", sets=["tensor.mma_sync_steps_per_cycle.fp16=9"]) == (
        "--set tensor.mma_sync_steps_per_cycle.fp16: 9.0 exceeds mac_steps_per_cycle.fp16 8.0 "
        "(at most 8.0, the unit's own rate)")
    assert error_line("a100", sets=["tensor.mma_sync_steps_per_cycle.fp8=1"]) == (
        "--set tensor.mma_sync_steps_per_cycle.fp8: fp8 has no mac_steps_per_cycle rate "
        "(dtypes of mac_steps_per_cycle: fp16, bf16, tf32, fp64, int8)")
    # lowering the peak below h100's mma.sync rate blames the value the user changed
    assert error_line("h100", sets=["tensor.mac_steps_per_cycle.fp16=4"]) == (
        "--set tensor.mac_steps_per_cycle.fp16: 5.3333 exceeds mac_steps_per_cycle.fp16 4.0 "
        "(at most 4.0, the unit's own rate)")


def test_cross_field_checks(tmp_path):
    assert error_line(sets=["scratchpad.size_kib=12"]) == (
        "--set scratchpad.size_kib: scratchpad.size_kib 12 is not an allowed carveout (one of: 0, 8, 16, 24)")
    assert error_line(sets=["cores.warp_width=64"]) == (
        "--set cores.warp_width: cores.warp_width 64 is not a power of two <= 32 (1, 2, 4, 8, 16 or 32)")
    assert error_line(sets=["cores.subcores=3"]) == (
        "--set cores.subcores: cores.subcores 3 does not divide warp_slots 8 (a divisor of cores.warp_slots)")
    assert error_line(sets=["pipes.fma.serves=[fp32, fp128]"]) == (
        "--set pipes.fma.serves: pipes.fma.serves[1]: unknown value 'fp128' (one of: int, fp32, fp16, fp64, "
        "mufu, conv, shfl, lsu, tensor, ctrl, sync, dma, rma)")
    assert error_line(sets=["pipes.fma.serves=[fp32, tensor]"]) == (
        "--set pipes.fma.serves: unit class 'tensor' is served by the tensor block, not a pipe "
        "(unit classes other than tensor, dma, rma)")
    assert error_line(sets=["dram.timing.tRC=40"]) == (
        "--set dram.timing.tRC: dram.timing.tRC 40 is less than tRAS + tRP = 47 (>= 47)")
    assert error_line("tiny-sunway", sets=["scratchpad.cache_kib=16"]) == (
        "--set scratchpad.cache_kib: scratchpad.cache_kib 16 is not an allowed LDM cache size (one of: 0, 8, 32)")
    assert error_line(sets=["tensor.mac_array=[4, 4]"]) == (
        "--set tensor.mac_array: too few items in tensor.mac_array (a list of 3 items, each an integer > 0)")
    assert error_line("h100", sets=["clusters.max_blocks=17"]) == (   # a multicast mask has 16 bits
        "--set clusters.max_blocks: value 17 out of range (an integer > 0, at most 16)")
    p = _variant(tmp_path, lambda d: d["pipes"].pop("branch"))
    assert error_line(p) == (f"{p}: pipes: no pipe serves unit class 'ctrl' on the core "
                             "(every core needs pipes serving int, ctrl, sync)")


def test_unknown_builtin():
    names = ", ".join(builtin_machines())
    assert error_line("a101") == f"--hw: unknown machine 'a101' (a path to a YAML file or one of: {names})"
    assert error_line("nowhere/x.yaml") == (
        f"--hw: machine file not found: 'nowhere/x.yaml' (a path to a YAML file or one of: {names})")


def test_bad_set_path():
    assert error_line(sets=["cores.per_grup=4"]) == (
        f"--set cores.per_grup: unknown key 'per_grup' in cores (known keys: {CORE_KEYS})")
    assert error_line(sets=["pipes.fmx.latency_cycles=3"]) == (
        "--set pipes.fmx.latency_cycles: unknown key 'fmx' in pipes (known keys: fma, int, fp64, mufu, lsu, branch)")
    assert error_line(sets=["clock_ghz.x=3"]) == "--set clock_ghz.x: clock_ghz is a value, not a block (set clock_ghz itself)"


def test_bad_set_value():
    assert error_line(sets=["cores.scheduler=rr"]) == "--set cores.scheduler: unknown value 'rr' (one of: lrr, gto)"
    assert error_line(sets=["clock_ghz=fast"]) == "--set clock_ghz: expected a number, got 'fast' (a number > 0)"
    assert error_line(sets=["async_copy=maybe"]) == "--set async_copy: expected true or false, got 'maybe' (true or false)"
    assert error_line(sets=["clock_ghz=[1"]) == (
        "--set clock_ghz: cannot parse value '[1': expected ',' or ']', but got '<stream end>' "
        "(a YAML scalar or flow value, e.g. 4, 1.5, true, lrr, [4, 4, 4], {f32: 16})")


def test_malformed_set():
    assert error_line(sets=["clock_ghz"]) == "--set clock_ghz: expected PATH=VALUE (e.g. --set dram.channel_gbps=200)"
    assert error_line(sets=["=3"]) == "--set =3: bad config path '' (dotted keys such as l2.size_kib)"


def test_yaml_syntax_error(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\ncores:\n  a: 1\n b: 2\n")
    assert error_line(str(p)) == (
        f"{p}:4: YAML syntax error at column 2: expected <block end>, but found '<block mapping start>' (valid YAML)")
    p.write_text("name: x\nname: y\n")
    assert error_line(str(p)) == f"{p}:2: YAML syntax error at column 1: duplicate key 'name' (first on line 1) (valid YAML)"
    p.write_text("- 1\n- 2\n")
    assert error_line(str(p)) == (
        f"{p}: expected a mapping of keys at the top level, got list (a YAML mapping such as `name: ...`)")


def test_overlay_not_found(tmp_path):
    names = ", ".join(builtin_overlays())
    assert error_line(overlays=["nope"]) == f"--overlay: unknown overlay 'nope' (a path to a YAML file or one of: {names})"
    missing = str(tmp_path / "missing.yaml")
    assert error_line(overlays=[missing]) == (
        f"--overlay: overlay file not found: '{missing}' (a path to a YAML file or one of: {names})")


# ---- properties --------------------------------------------------------------------------------

def _ints(lo=1, hi=4096):
    return st.integers(lo, hi)


def _floats(lo, hi):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


# numeric fields of tiny-gpu that no cross-field check constrains
FREE_FIELDS = {
    "clock_ghz": _floats(0.05, 5.0),
    "clock_ratios.memory": _floats(0.1, 4.0),
    "fabric.link_bytes_per_cycle": _ints(1, 512),
    "fabric.router_latency_cycles": _ints(),
    "dram.channel_gbps": _floats(0.5, 2000.0),
    "dram.timing.tCL": _ints(1, 100),
    "l1.hit_latency_cycles": _ints(),
    "l1.mshrs": _ints(4),          # at least a line's 4 sectors (the only cross-field check, always met)
    "l2.hit_latency_cycles": _ints(),
    "l2.far_half_extra_cycles": _ints(0, 500),
    "pipes.fma.latency_cycles": _ints(1, 64),
    "pipes.fma.lanes_per_cycle.f32": _floats(0.125, 64.0),
    "pipes.int.latency_overrides_cycles.int_div": _ints(1, 200),
    "scratchpad.latency_cycles": _ints(1, 200),
    "tensor.mac_steps_per_cycle.fp16": _floats(0.125, 32.0),
    "tensor.latency_cycles": _ints(1, 64),
    "memory_controllers.queue_depth": _ints(1, 256),
    "register_file.banks": _ints(1, 16),
}
field_values = st.sampled_from(sorted(FREE_FIELDS)).flatmap(lambda p: st.tuples(st.just(p), FREE_FIELDS[p]))


def _nest(path: str, value) -> dict:
    out = value
    for seg in reversed(path.split(".")):
        out = {seg: out}
    return out


def _overlay(items) -> dict:
    out: dict = {}
    for p, v in items:
        out = deep_merge(out, _nest(p, v))
    return out


@HYPO
@given(field_values)
def test_set_then_get(pv):
    path, value = pv
    m = load_machine("tiny-gpu", sets=[f"{path}={value!r}"])
    assert get_value(m, path) == value


@HYPO
@given(st.lists(field_values, min_size=1, max_size=4), st.lists(field_values, min_size=1, max_size=4))
def test_overlays_associative(a_items, b_items):
    a, b = _overlay(a_items), _overlay(b_items)
    with tempfile.TemporaryDirectory() as d:
        pa, pb, pab = Path(d, "a.yaml"), Path(d, "b.yaml"), Path(d, "ab.yaml")
        pa.write_text(yaml.safe_dump(a))
        pb.write_text(yaml.safe_dump(b))
        pab.write_text(yaml.safe_dump(deep_merge(a, b)))
        assert load_machine("tiny-gpu", [str(pa), str(pb)]) == load_machine("tiny-gpu", [str(pab)])
    base = yaml.safe_load((CONFIGS / "tiny-gpu.yaml").read_text())
    assert deep_merge(deep_merge(base, a), b) == deep_merge(base, deep_merge(a, b))


def _leaves(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, prefix + (k,))
        else:
            yield prefix + (k,), v


_BASES = {n: yaml.safe_load((CONFIGS / f"{n}.yaml").read_text()) for n in BUILTINS}
_BASE_MACHINES = {n: load_machine(n) for n in BUILTINS}


@HYPO
@given(st.sampled_from(BUILTINS).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.sampled_from(sorted(_leaves(_BASES[n]), key=str)), max_size=8))))
def test_overlay_equal_to_base_is_identity(case):
    name, leaves = case
    ov: dict = {}
    for path, value in leaves:
        ov = deep_merge(ov, _nest(".".join(path), copy.deepcopy(value)))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d, "same.yaml")
        p.write_text(yaml.safe_dump(ov, allow_unicode=True))
        m = load_machine(name, [str(p)])
    assert m == _BASE_MACHINES[name] and hash(m) == hash(_BASE_MACHINES[name])


@HYPO
@given(field_values, field_values)
def test_set_order_of_distinct_paths(a, b):
    if a[0] == b[0]:
        return
    sa, sb = f"{a[0]}={a[1]!r}", f"{b[0]}={b[1]!r}"
    assert load_machine("tiny-gpu", sets=[sa, sb]) == load_machine("tiny-gpu", sets=[sb, sa])


@pytest.mark.parametrize("name", BUILTINS)
def test_frozen_hashable_roundtrip(name):
    m = load_machine(name)
    with pytest.raises(ValidationError):
        m.clock_ghz = 2.0
    with pytest.raises(ValidationError):
        m.cores.per_group = 1
    with pytest.raises(TypeError):
        m.pipes["new"] = m.pipes[next(iter(m.pipes))]
    assert hash(m) == hash(load_machine(name))
    assert len({m, load_machine(name)}) == 1
    assert Machine.model_validate(m.model_dump()) == m
    assert Machine.model_validate(m.model_dump(mode="json")) == m
    assert pickle.loads(pickle.dumps(m)) == m
    other = load_machine(name, sets=["clock_ghz=0.5"])
    assert other != m and machine_fingerprint(other) != machine_fingerprint(m)
