"""`archsim run`, `compare` and `plot` on the tiny model (tests/test_cli.py has the CLI helpers).

Functional runs are the end-to-end proof: every emitted kernel of a block, chained through real
buffers, checked op by op against numpy and as a whole block against a float64 forward pass, for
each phase and for both attention forms and both activation/norm families. Timing runs check the
result document: the fields of docs/records.md, identical kernels simulated once and counted,
totals that sum the kernels, the seed's model_flops, determinism, and the files --out writes.
"""

from __future__ import annotations

import json

import pytest
import yaml

from archsim.cli import main
from archsim.paths import data_dir

from test_cli import cli, one_line_error


def _variant(tmp_path, **changes):
    """The tiny workload with model/scenario fields changed, as a YAML file."""
    doc = yaml.safe_load((data_dir("workloads") / "tiny.yaml").read_text())
    for k, v in changes.items():
        (doc["model"] if k in doc["model"] else doc["scenario"])[k] = v
    p = tmp_path / "variant.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


FUNCTIONAL = [
    ("prefill", {}),
    ("decode", {}),
    ("prefill", {"attention": "unfused"}),
    ("prefill", {"activation": "swiglu", "norm": "rmsnorm", "dtype": "bf16"}),
    ("train", {}),
    ("train", {"attention": "unfused"}),
    ("train", {"causal": False, "activation": "swiglu", "norm": "rmsnorm", "dtype": "bf16"}),
    ("train", {"attention": "unfused", "causal": False, "activation": "relu", "dtype": "fp32"}),
    ("train", {"attention": "unfused", "activation": "swiglu", "norm": "rmsnorm", "dtype": "bf16"}),
    ("prefill", {"tensor_parallel": 2}),
    ("decode", {"tensor_parallel": 2}),
    ("train", {"tensor_parallel": 2, "attention": "unfused"}),
]


@pytest.mark.parametrize("phase,changes", FUNCTIONAL)
def test_functional_block_matches_numpy(capsys, tmp_path, phase, changes):
    wl = _variant(tmp_path, **changes) if changes else "tiny"
    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", wl, "--phase", phase, "--mode",
                          "functional", "--json", str(out))
    assert code == 0, text + err
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["block_verification"]["passed"]
    assert all(k["verification"]["passed"] for k in doc["kernels"])
    assert "block output" in text and "FAILED" not in text


def test_timing_run_document(capsys, tmp_path):
    from archsim.workloads.model import load_workload

    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.result/1" and doc["complete"]
    wl = load_workload("tiny")
    ops = wl.block_ops()
    ks = doc["kernels"]
    # every op is emitted; identical kernels (res1/res2, norm1/norm2: same shapes) are timed once
    assert {k["op"] for k in ks} | {a for k in ks for a in k.get("also", [])} >= {o.name for o in ops}
    from archsim.config import load_machine
    from archsim.runner import emit_block

    emitted = emit_block(load_machine("tiny-gpu"), wl)
    assert len(ks) < len(emitted)  # something was deduplicated
    assert sum(k["count"] for k in ks) == len(emitted) * wl.model.layers
    for k in ks:
        assert k["count"] % wl.model.layers == 0 and k["cycles"] > 0
        assert sum(k["stalls"].values()) == pytest.approx(1.0, abs=1e-4)
        for f in ("grid", "seconds", "flops", "model_flops", "tflops", "warp_instructions", "sampled",
                  "sample_error_est", "bytes", "bandwidth_gbps", "fabric", "memory_controllers", "timeline"):
            assert f in k
    t = doc["total"]
    assert t["cycles"] == sum(k["cycles"] * k["count"] for k in ks)
    assert t["model_flops"] == wl.totals()["model_flops"]
    assert t["flops"] == wl.totals()["flops"]
    assert "total" in text and "top stall" in text


def test_timing_run_is_deterministic(capsys, tmp_path):
    docs = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        assert cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--phase", "decode", "--json",
                   str(out))[0] == 0
        d = json.loads(out.read_text())
        d.pop("sim")
        docs.append(d)
    assert docs[0] == docs[1]


def test_out_dir_plots_and_trace(capsys, tmp_path):
    out = tmp_path / "out"
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--layers", "1", "--out", str(out),
                       "--trace")
    assert code == 0, err
    assert (out / "result.json").exists() and (out / "kernels.png").stat().st_size > 1000
    assert (out / "timeline.png").stat().st_size > 1000
    tr = json.loads((out / "trace.json").read_text())
    names = {e["name"] for e in tr["traceEvents"]}
    assert "qkv" in names and any(n.startswith("qkv block") for n in names)
    (out / "kernels.png").unlink()
    code, text, _ = cli(capsys, "plot", str(out))
    assert code == 0 and (out / "kernels.png").exists()


def test_compare_two_machines(capsys, tmp_path):
    out = tmp_path / "c.json"
    code, text, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--hw", "a100", "--workload", "tiny", "--layers", "1",
                          "--phase", "decode", "--json", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["schema"] == "archsim.compare/1" and doc["machines"] == ["tiny-gpu", "a100"]
    assert all(r["schema"] == "archsim.result/1" for r in doc["results"])
    assert "tiny-gpu time us" in text and "a100 time us" in text and "bound" in text


@pytest.mark.parametrize("argv,where", [
    (["--batch", "0"], "--batch"),
    (["--phase", "serve"], "--phase"),
    (["--sample-waves", "2"], "--sample-waves"),
    (["--sample-max-error", "0"], "--sample-max-error"),
    (["--sample-max-error", "150%"], "--sample-max-error"),
    (["--sample-max-error", "nan"], "--sample-max-error"),
    (["--sample-max-error", "three"], "--sample-max-error"),
    (["--trace"], "--trace"),
    (["--max-cycles", "0"], "--max-cycles"),
])
def test_bad_run_options_are_one_line(capsys, argv, where):
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", *argv)
    assert code == 2
    assert where in one_line_error(err)


def test_sample_max_error_takes_a_fraction_or_a_percentage():
    from archsim.runner import parse_error_bound

    assert parse_error_bound("x", "3%") == pytest.approx(0.03) and parse_error_bound("x", "0.05") == 0.05
    assert parse_error_bound("x", 0.01) == 0.01


def test_bad_workload_file_is_one_line(capsys, tmp_path):
    p = _variant(tmp_path, hidden=65)
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", p)
    assert code == 2 and "hidden" in one_line_error(err)
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "no-such-model")
    assert code == 2 and "tiny" in one_line_error(err)


def test_max_cycles_stops_with_status_3_and_a_partial_result(capsys, tmp_path):
    out = tmp_path / "r.json"
    code, _, err = cli(capsys, "run", "--hw", "tiny-gpu", "--workload", "tiny", "--max-cycles", "50", "--json",
                       str(out))
    assert code == 3 and "max-cycles" in one_line_error(err)
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    st = doc["stopped"]  # the partial record says where and why (issue 20, item 7)
    assert st["kernel"] and "instruction" in st["where"] and "max-cycles" in st["why"] and "core" in st["why"]
    assert "max-cycles" in doc["error"] and len(doc["kernels"]) == st["kernel_index"]


def test_compare_keeps_every_machine_when_one_stops(capsys, tmp_path):
    out = tmp_path / "c.json"
    code, _, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--hw", "tiny-sunway", "--workload", "tiny",
                       "--max-cycles", "3000", "--json", str(out))
    assert code == 3 and "Traceback" not in err and err.strip().splitlines()[-1].startswith("archsim: error: tiny-gpu")
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and [r["machine"]["name"] for r in doc["results"]] == ["tiny-gpu", "tiny-sunway"]
    assert all(r["stopped"]["kernel"] for r in doc["results"])


def test_compare_needs_two_machines(capsys):
    code, _, err = cli(capsys, "compare", "--hw", "tiny-gpu", "--workload", "tiny")
    assert code == 2 and "--hw" in one_line_error(err)


def test_fused_attention_moves_fewer_dram_bytes_and_runs_faster_than_unfused():
    """The seq x seq matrix goes through memory only in the unfused form (s = 512 on tiny-gpu:
    S and P are 1 MiB each against a 256 KiB L2)."""
    from archsim.config import load_machine
    from archsim.micro import run_micro

    m = load_machine("tiny-gpu")
    p = {"seq": 512, "heads": 2, "causal": True}
    fused = run_micro("attention", m, dict(p, fused=True))
    unfused = run_micro("attention", m, dict(p, fused=False))
    assert [k["name"] for k in unfused.kernels] == ["attn.qk", "attn.softmax", "attn.av"]
    assert unfused.extra["dram_bytes"] > 4 * fused.extra["dram_bytes"]
    assert fused.value > 2 * unfused.value
    assert fused.kernels[0]["flops"] == sum(k["flops"] for k in unfused.kernels)


@pytest.mark.parametrize("h,dtype", [(64, "fp16"), (36, "fp16"), (12, "fp32"), (5, "bf16")])
def test_kv_append_copies_the_new_rows_into_the_caches(h, dtype):
    """16-, 8-, 16- and 2-byte copies (the widest that divides a row); every other cache row kept."""
    import numpy as np

    from archsim.config import capabilities, load_machine
    from archsim.engine.functional import run_functional
    from archsim.workloads.emit.kvcache_gpu import kv_append_kernel

    caps = capabilities(load_machine("tiny-gpu"))
    k = kv_append_kernel(caps, 3, 9, h, 7, dtype)
    rng = np.random.default_rng(1)
    host = {"fp16": np.float16, "fp32": np.float32, "bf16": np.uint16}[dtype]
    q = rng.integers(1, 30000, (3, 3 * h)).astype(np.uint16).view(np.uint16).astype(host) if dtype == "bf16" else \
        rng.standard_normal((3, 3 * h)).astype(host)
    kc = rng.standard_normal((3, 9, h)).astype(host) if dtype != "bf16" else np.full((3, 9, h), 7, np.uint16)
    vc = kc.copy()
    r = run_functional(k.program, k.args(q, kc, vc), k.launch, warp_width=32)
    ek, ev = k.reference(q, kc, vc)
    assert np.array_equal(r.output("k_cache").reshape(ek.shape), ek)
    assert np.array_equal(r.output("v_cache").reshape(ev.shape), ev)
    assert not np.array_equal(ek, kc)  # the row changed


@pytest.mark.parametrize("family,stall,label", [("gpu", "long_scoreboard", "long-scoreboard share"),
                                                ("sunway", "dma_wait", "dma-wait share")])
def test_timeline_plots_each_machines_own_memory_stall(monkeypatch, tmp_path, family, stall, label):
    """timeline.png's third panel: a GPU's loads wait on the long scoreboard, a Sunway CPE's on
    DMA; the kernels' legend sits below the panels, off the curves."""
    from archsim.report import plots

    got = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: got.setdefault("fig", fig))
    series = {"ipc": [1.0, 2.0], "dram_gbps": [10.0, 20.0], "stall_long_scoreboard": [0.1, 0.2],
              "stall_dma_wait": [0.6, 0.7]}
    k = {"name": "k", "timeline": {"window_cycles": 100, "series": series}}
    result = {"machine": {"name": "m", "family": family, "clock_ghz": 1.0, "peak_dram_gbps": 100.0},
              "kernels": [k, {**k, "name": "k2"}]}
    plots.plot_timeline(result, tmp_path / "t.png")
    ax = got["fig"].axes[2]
    assert ax.get_ylabel() == label
    assert list(ax.get_lines()[0].get_ydata()) == series[f"stall_{stall}"]
    leg = ax.get_legend()
    assert leg is not None and [t.get_text() for t in leg.get_texts()] == ["k", "k2"]
    assert got["fig"].axes[1].get_legend() is None
