"""The Python API for notebooks (docs/commands.md, "Python API"): the same machines, workloads, runs and
records as the command line, as objects.

    import archsim
    m = archsim.load_machine("sw26010pro", set={"dram.channel_gbps": 30})
    wl = archsim.load_workload("gpt2-small", phase="decode", batch=8, layers=1)
    r = archsim.run(m, wl)
    r.kernels[["name", "cycles", "tflops"]]      # a pandas DataFrame, one row per kernel
    r.plot_contention("contention.png")
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from archsim.errors import InputError


def load_machine(hw: str, set: Mapping[str, Any] | Sequence[str] = (), overlays: Sequence[str] = ()):
    """A machine: a built-in name or YAML path, overlays applied, then ``set`` (a mapping of dotted
    paths to values, or ``PATH=VALUE`` strings as with ``--set``)."""
    from archsim.config.load import load_machine as _load

    sets = [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in set.items()] \
        if isinstance(set, Mapping) else list(set)
    return _load(hw, list(overlays), sets)


def load_workload(wl: str, **scenario):
    """A workload (built-in name or YAML path) with scenario overrides: phase, batch, seq, layers,
    dtype, attention, causal, placement."""
    from archsim.workloads.model import OVERRIDES
    from archsim.workloads.model import load_workload as _load

    bad = sorted(set(scenario) - set(OVERRIDES))
    if bad:
        raise InputError("load_workload", f"unknown scenario option(s) {', '.join(bad)}", ", ".join(OVERRIDES))
    return _load(wl, dict(scenario))


class Result:
    """One run: ``record`` is the ``archsim.result/1`` dict (``--json``), ``kernels`` a DataFrame
    with a row per kernel; the plot methods write a PNG and return its path."""

    def __init__(self, record: dict):
        self.record = record

    @property
    def kernels(self):
        import pandas as pd

        rows = []
        for k in self.record.get("kernels", []):
            row = {c: k.get(c) for c in ("name", "count", "cycles", "seconds", "flops", "tflops",
                                         "warp_instructions", "sampled", "sample_error_est")}
            row.update({f"dram_{x}_bytes": k.get("bytes", {}).get(f"dram_{x}", 0) for x in ("read", "write")})
            row.update({f"{lvl}_gbps": v for lvl, v in k.get("bandwidth_gbps", {}).items()})
            row.update({f"stall_{s}": v for s, v in k.get("stalls", {}).items()})
            row["link_util_max"] = k.get("fabric", {}).get("link_util_max", 0.0)
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def total(self) -> dict:
        return self.record.get("total", {})

    def save(self, path) -> Path:
        from archsim.report import jsonfmt

        Path(path).write_text(jsonfmt.dumps(self.record) + "\n", encoding="utf-8")
        return Path(path)

    def plot_kernels(self, path="kernels.png") -> Path:
        from archsim.report.plots import plot_kernels

        return plot_kernels(self.record, Path(path))

    def plot_timeline(self, path="timeline.png") -> Path:
        from archsim.report.plots import plot_timeline

        return plot_timeline(self.record, Path(path))

    def plot_contention(self, path="contention.png") -> Path:
        from archsim.report.contention import plot_contention

        return plot_contention(self.record, Path(path))

    def plot_topology(self, path="topology.png", kernel: str | None = None) -> Path:
        from archsim.report.contention import plot_topology

        return plot_topology(self.record, Path(path), kernel=kernel)

    def plot_roofline(self, path="roofline.png") -> Path:
        from archsim.report.roofline import plot_roofline

        return plot_roofline([self.record], Path(path))

    def report(self, out_dir) -> Path:
        """Every plot and report.html in out_dir; returns the page's path."""
        return _report(self.record, out_dir)

    def __repr__(self) -> str:
        m, w, t = self.record["machine"]["name"], self.record.get("workload", {}), self.total
        return (f"<archsim.Result {w.get('name')} {w.get('phase')} on {m}: {t.get('seconds', 0) * 1e3:.3f} ms, "
                f"{len(self.record.get('kernels', []))} kernels>")


class Comparison:
    """Several machines on one workload: ``record`` is ``archsim.compare/1``, ``results`` the
    per-machine Results, ``kernels`` one DataFrame with a ``machine`` column."""

    def __init__(self, record: dict):
        self.record = record
        self.results = [Result(r) for r in record["results"]]

    @property
    def kernels(self):
        import pandas as pd

        return pd.concat([r.kernels.assign(machine=r.record["machine"]["name"]) for r in self.results],
                         ignore_index=True)

    def plot_compare(self, path="compare.png") -> Path:
        from archsim.report.plots import plot_compare, timed_results

        return plot_compare(timed_results(self.record), Path(path))

    def plot_roofline(self, path="roofline.png") -> Path:
        from archsim.report.plots import timed_results
        from archsim.report.roofline import plot_roofline

        return plot_roofline(timed_results(self.record), Path(path))

    def report(self, out_dir) -> Path:
        return _report(self.record, out_dir)


def _report(record: dict, out_dir) -> Path:
    """write_plots into out_dir; the page's path, or one error saying why there is none."""
    from archsim.report.plots import write_plots

    files, missing = write_plots(record, Path(out_dir))
    page = Path(out_dir) / "report.html"
    if page not in files:
        raise InputError("report", "; ".join(missing) or "nothing to report", "a timing run with finished kernels")
    return page


def _options(**options):
    from archsim.runner import RunOptions, check_options, parse_error_bound

    known = {f for f in RunOptions.__dataclass_fields__}
    bad = sorted(set(options) - known)
    if bad:
        raise InputError("run", f"unknown option(s) {', '.join(bad)}", ", ".join(sorted(known)))
    if "max_error" in options:
        options["max_error"] = parse_error_bound("max_error", options["max_error"])
    return check_options(RunOptions(**options))


def run(machine, workload, **options) -> Result:
    """Simulate one decoder block's kernels (times `layers`) of `workload` on `machine`. Options as
    archsim.runner.RunOptions: mode, sample, waves, max_error, max_cycles, seed, trace, workers
    (processes the distinct kernels are timed on; default 1), scale (a 1/N scale model where its
    measured error allows, docs/scale-models.md)."""
    from archsim.runner import run_workload

    t0 = time.perf_counter()
    rec = run_workload(machine, workload, _options(**options))
    rec.setdefault("sim", {}).setdefault("wall_seconds", round(time.perf_counter() - t0, 4))
    return Result(rec)


def compare(machines: Sequence, workload, **options) -> Comparison:
    """`run` on each machine (a machine without private segments runs a private placement cross, one
    whose unit counts the scale does not divide runs whole)."""
    from archsim.runner import compare_document, run_many

    opts = _options(**options)
    opts.strict_placement = False
    opts.strict_scale = False
    results = run_many(list(machines), workload, opts)
    for r in results:
        if isinstance(r, Exception):
            raise r
    return Comparison(compare_document(results))
