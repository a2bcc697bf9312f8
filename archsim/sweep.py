"""`archsim sweep`: a grid of runs from one spec file, on a local process pool or a Dask cluster.

    hw: a100                      # or a list: [a100, h100]
    workload: llama2-7b
    phase: prefill                # run options, as `archsim run`'s flags (all optional)
    vary:                         # cartesian product
      cores.per_group: [54, 108]  # dotted machine config paths, applied as --set does
      workload.seq: [512, 1024]   # workload.<field>: a scenario or model field of the workload

The whole spec is checked before anything runs: every point's machine and workload are resolved
and validated, and every distinct (capabilities, workload) pair is emitted once, so a point that
cannot run is an input error (exit 2) and not a failed run an hour later.

Each point has a key: a hash of the resolved machine, the resolved workload and the run options.
``DIR/runs/<key>.json`` is the ``archsim.result/1`` document ``run --json`` writes (plus a
``sweep`` record: key, hw, varied values), written atomically (tmp + rename) as each run ends; a
sweep run again on the same DIR skips every key whose JSON is a finished run, so an interrupted
sweep loses only the runs in flight. A run that could not finish (status 3: deadlock, cycle limit)
or raised is written with ``"complete": false`` and its ``error``, and is retried next time.
``DIR/results.parquet`` holds one row per point (written every few seconds during the sweep and
at its end) and ``DIR/sweep.json`` (``archsim.sweep/1``) what was varied and how the runs went.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from archsim.errors import InputError, SimulationError
from archsim.report import jsonfmt
from archsim.report.files import write_atomic, write_text
from archsim.resources import DEFAULT_MAX_INSTRUCTIONS
from archsim.runner import MAX_ERROR_DEFAULT, WAVES_DEFAULT, RunOptions, parse_error_bound, run_workload

SWEEP_SCHEMA = "archsim.sweep/1"
# run options of the spec: the scenario fields `archsim run` overrides, then the run controls
WORKLOAD_OPTIONS = ("phase", "batch", "seq", "layers", "dtype", "attention", "causal", "placement")
RUN_OPTIONS = ("mode", "sample", "sample_interval", "sample_k_loop", "sample_waves", "sample_max_error",
               "max_cycles", "max_instructions", "scale")
SPEC_KEYS = ("hw", "workload", *WORKLOAD_OPTIONS, *RUN_OPTIONS, "max_points", "overlays", "set", "vary",
             "description")
TOTAL_FIELDS = ("cycles", "seconds", "flops", "model_flops", "tflops", "warp_instructions")
MAX_POINTS = 10_000             # choice: a larger grid is refused before it is resolved (spec key max_points)
MAX_POINTS_CAP = 1_000_000      # choice: the most a spec's max_points may allow
PARQUET_EVERY_S = 10.0          # choice: results.parquet is rewritten at most this often during a sweep


# ----------------------------------------------------------------------------- the spec
@dataclass
class Spec:
    label: str                            # the spec file as the user named it (error messages)
    hw: list[str]                         # machine names / paths, resolved against the spec's folder
    hw_labels: list[str]                  # ... as written in the spec (the `hw` column)
    workload: str
    options: dict                         # fixed scenario options (phase, batch, ...)
    run: RunOptions
    overlays: list[str] = field(default_factory=list)
    sets: dict = field(default_factory=dict)       # fixed dotted machine path -> value
    vary: dict = field(default_factory=dict)       # dotted path -> list of values, spec order
    max_points: int = MAX_POINTS          # the largest grid expand() resolves


@dataclass
class Point:
    hw: str                               # as written in the spec
    values: dict                          # vary key -> value
    machine: Any                          # resolved Machine
    workload: Any                         # resolved Workload
    key: str



def first_repeat(vals: list) -> int:
    """The index of the first value of a list that appears earlier in it (1 and true count as one,
    as ``==`` says), else -1; linear in the list, where a search of each prefix was quadratic."""
    seen = set()
    for i, v in enumerate(vals):
        k = v if isinstance(v, (int, float, str)) else json.dumps(v, sort_keys=True, default=str)
        if k in seen:
            return i
        seen.add(k)
    return -1

def _err(spec_label: str, where: str, what: str, allowed: str = "") -> InputError:
    return InputError(f"{spec_label}: {where}" if where else spec_label, what, allowed)


def beside_spec(value: str, folder: Path, builtins: list[str]) -> str:
    """A relative file path in a spec (a sweep's, a reference file's) is taken from the spec's folder
    when it is there (a built-in name stays one, as it does on the command line)."""
    stem = value[:-5] if value.endswith(".yaml") else value
    if "/" not in value and stem in builtins:
        return value
    p = Path(value).expanduser()
    if not p.is_absolute() and (folder / p).is_file():
        return str(folder / p)
    return value


def _typed(label: str, key: str, value, kind, allowed: str):
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise _err(label, key, f"expected {allowed}, got {value!r}", allowed)
    return value


def load_spec(path: str) -> Spec:
    """Read and check the spec's structure (types, keys, empty or repeated values). The values
    themselves are checked against the machine and workload schemas by ``expand``."""
    from archsim.config.load import builtin_machines, read_yaml

    label = str(path)
    p = Path(path)
    if not p.is_file():
        raise InputError(label, "sweep spec not found", "a path to a YAML file")
    data = read_yaml(p, label)
    folder = p.resolve().parent
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise _err(label, str(unknown[0]), f"unknown key {unknown[0]!r}", "known keys: " + ", ".join(SPEC_KEYS))
    for k in ("hw", "workload"):
        if k not in data:
            raise _err(label, "", f"missing required key {k!r}", "required: hw, workload")
    hw = data["hw"]
    hw_list = hw if isinstance(hw, list) else [hw]
    if not hw_list:
        raise _err(label, "hw", "empty list", "a machine name or path, or a non-empty list of them")
    builtins = builtin_machines()
    for h in hw_list:
        if not isinstance(h, str) or not h:
            raise _err(label, "hw", f"expected a machine name or path, got {h!r}",
                       "a YAML path or one of: " + ", ".join(builtins))
    dup = next((h for i, h in enumerate(hw_list) if h in hw_list[:i]), None)
    if dup is not None:
        raise _err(label, "hw", f"{dup!r} appears twice", "each machine once")
    wl = data["workload"]
    if not isinstance(wl, str) or not wl:
        raise _err(label, "workload", f"expected a workload name or path, got {wl!r}", "a YAML path or a built-in name")

    options = {}
    for k in WORKLOAD_OPTIONS:
        if k in data:
            if data[k] is None:
                raise _err(label, k, "no value", f"a value for --{k}")
            options[k] = data[k]          # checked by the workload schema in expand()
    mode = data.get("mode", "timing")
    if mode not in ("timing", "functional"):
        raise _err(label, "mode", f"unknown value {mode!r}", "one of: timing, functional")
    sample = _typed(label, "sample", data.get("sample", True), bool, "true or false")
    interval = _typed(label, "sample_interval", data.get("sample_interval", False), bool, "true or false")
    if interval and not sample:
        raise _err(label, "sample_interval", "true with sample: false", "sample: true, or sample_interval: false")
    k_loop = _typed(label, "sample_k_loop", data.get("sample_k_loop", False), bool, "true or false")
    if k_loop and not sample:
        raise _err(label, "sample_k_loop", "true with sample: false", "sample: true, or sample_k_loop: false")
    waves = _typed(label, "sample_waves", data.get("sample_waves", WAVES_DEFAULT), int, "an integer >= 3")
    if waves < 3:
        raise _err(label, "sample_waves", f"value {waves} out of range",
                   "at least 3 (wave 1 is the cold start; two steady waves give the error estimate)")
    try:
        max_error = parse_error_bound("sample_max_error", data.get("sample_max_error", MAX_ERROR_DEFAULT))
    except InputError as e:
        raise _err(label, "sample_max_error", e.what, e.allowed) from None
    max_cycles = _typed(label, "max_cycles", data.get("max_cycles", 10**9), int, "a positive integer")
    if max_cycles <= 0:
        raise _err(label, "max_cycles", f"value {max_cycles} out of range", "a positive integer")
    max_instructions = _typed(label, "max_instructions", data.get("max_instructions", DEFAULT_MAX_INSTRUCTIONS),
                              int, "a positive integer")
    if max_instructions <= 0:
        raise _err(label, "max_instructions", f"value {max_instructions} out of range", "a positive integer")
    scale = _typed(label, "scale", data.get("scale", 1), int, "a positive integer (1: the whole machine)")
    if scale < 1:
        raise _err(label, "scale", f"value {scale} out of range", "a positive integer (1: the whole machine)")
    if scale > 1 and mode == "functional":
        raise _err(label, "scale", "a scale model in a functional sweep", "scale: 1, or mode: timing")
    max_points = _typed(label, "max_points", data.get("max_points", MAX_POINTS), int, "a positive integer")
    if not 0 < max_points <= MAX_POINTS_CAP:
        raise _err(label, "max_points", "value out of range", f"a positive integer, at most {MAX_POINTS_CAP:,}")

    overlays = data.get("overlays", [])
    if isinstance(overlays, str):
        overlays = [overlays]
    if not isinstance(overlays, list) or not all(isinstance(o, str) and o for o in overlays):
        raise _err(label, "overlays", f"expected a list of overlay names or paths, got {overlays!r}",
                   "e.g. [l2-off]")
    sets = data.get("set", {}) or {}
    if not isinstance(sets, dict):
        raise _err(label, "set", f"expected a mapping of dotted config paths to values, got {sets!r}",
                   "e.g. set: {dram.channels: 20}")
    vary = data.get("vary", {}) or {}
    if not isinstance(vary, dict):
        raise _err(label, "vary", f"expected a mapping of dotted paths to lists, got {vary!r}",
                   "e.g. vary: {dram.channel_gbps: [155.5, 203.9]}")
    for k, vals in vary.items():
        where = f"vary.{k}"
        if not isinstance(k, str) or not k or any(not s for s in k.split(".")):
            raise _err(label, f"vary.{k}", f"bad path {k!r}", "dotted keys such as l2.size_kib or workload.seq")
        if k in sets:
            raise _err(label, where, f"{k} is both fixed (set) and varied", "name it in one of set, vary")
        if not isinstance(vals, list):
            raise _err(label, where, f"expected a list of values, got {vals!r}", "a non-empty list, e.g. [1, 2]")
        if not vals:
            raise _err(label, where, "empty list", "a non-empty list of values")
        i = first_repeat(vals)
        if i >= 0:
            raise _err(label, where, f"value {vals[i]!r} appears twice", "each value once")
        if k.startswith("workload."):
            opt = k[len("workload."):]
            if opt in options:
                raise _err(label, where, f"{opt} is both fixed (top-level {opt}) and varied", "name it in one place")
    for k in sets:
        if not isinstance(k, str) or not k or any(not s for s in k.split(".")):
            raise _err(label, f"set.{k}", f"bad path {k!r}", "dotted config keys such as l2.size_kib")
    from archsim.config.load import builtin_overlays
    from archsim.workloads.model import builtin_workloads

    return Spec(label=label, hw=[beside_spec(h, folder, builtins) for h in hw_list], hw_labels=list(hw_list),
                workload=beside_spec(wl, folder, builtin_workloads()), options=options,
                run=RunOptions(mode=mode, sample=sample, interval=interval, k_loop=k_loop, waves=waves,
                               max_error=max_error, max_cycles=max_cycles, max_instructions=max_instructions,
                               scale=scale),
                max_points=max_points,
                overlays=[beside_spec(o, folder, builtin_overlays()) for o in overlays], sets=dict(sets),
                vary=dict(vary))


# ----------------------------------------------------------------------------- keys
def run_key(machine, workload, opts: RunOptions) -> str:
    """A stable hex key of one run: the resolved machine, the resolved workload and the options
    that change the result (sorted JSON, so neither dict order nor the spec's wording matters)."""
    doc = {"machine": machine.model_dump(mode="json"), "workload": workload.model_dump(mode="json"),
           "options": _options_dict(opts)}
    if opts.scale > 1:      # the measured errors that decide which kernels run on the scale model
        from archsim.scale_model import measured_errors

        doc["scale_errors"] = repr(sorted(measured_errors(machine.name).get(opts.scale, {}).items()))
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- expanding the grid
def _workload_fields() -> tuple[tuple[str, ...], tuple[str, ...]]:
    from archsim.workloads.model import OVERRIDES, ModelSpec

    return tuple(OVERRIDES), tuple(f for f in ModelSpec.model_fields if f not in OVERRIDES)


class _Resolver:
    """Resolves points, reading each machine and workload file once."""

    def __init__(self, spec: Spec):
        from archsim.config.load import load_machine_dict, read_yaml
        from archsim.workloads.model import resolve_workload

        self.spec = spec
        self.machines = {}
        for h, hl in zip(spec.hw, spec.hw_labels):
            try:
                self.machines[h] = load_machine_dict(h, spec.overlays, ())
            except InputError as e:
                raise self._rewrite(e, hl, {}) from None
        try:
            path = resolve_workload(spec.workload)
        except InputError as e:
            raise _err(spec.label, "workload", e.what, e.allowed) from None
        from archsim.paths import data_dir

        self.wl_label = path.name if path.parent == data_dir("workloads") else str(spec.workload)
        self.wl_data = read_yaml(path, self.wl_label)
        self.options_scn, self.options_model = _workload_fields()

    def _rewrite(self, e: InputError, hw_label: str, point: dict) -> InputError:
        """A loader's error -> one line naming the spec key that supplied the bad value."""
        spec = self.spec
        on = f" (hw {hw_label})" if len(spec.hw) > 1 and hw_label else ""
        if e.where.startswith("--set "):
            dotted = e.where[len("--set "):]
            src = f"vary.{dotted}" if dotted in spec.vary else f"set.{dotted}"
            return _err(spec.label, src, (f"{hw_label}: " if on else "") + e.what, e.allowed)
        if e.where == "--hw":
            return _err(spec.label, "hw", e.what, e.allowed)
        if e.where == "--overlay":
            return _err(spec.label, "overlays", e.what, e.allowed)
        if e.where.startswith("--") and e.where[2:] in WORKLOAD_OPTIONS:
            opt = e.where[2:]
            src = f"vary.workload.{opt}" if f"workload.{opt}" in spec.vary else opt
            what = e.what
            for prefix in (f"scenario.{opt}: ", f"model.{opt}: "):
                what = what[len(prefix):] if what.startswith(prefix) else what
            return _err(spec.label, src, what, e.allowed)
        for k in point:                  # a workload file field that a vary key supplied
            if k.startswith("workload.") and e.where == f"{self.wl_label}: model.{k[len('workload.'):]}":
                return _err(spec.label, f"vary.{k}", e.what, e.allowed)
        if point:                        # a combination the schema rejects, blamed on a file field
            pt = ", ".join(f"{k}={v!r}" for k, v in point.items())
            return _err(spec.label, f"vary point {{{pt}}}{on}", f"{e.where}: {e.what}", e.allowed)
        return e

    def machine(self, hw: str, hw_label: str, point: dict):
        from archsim.config import schema_errors as SE
        from archsim.config.load import apply_set, check_set_path, parse_set, validate_machine
        from archsim.config.schema import Machine

        data, origins, base = self.machines[hw]
        origins = list(origins)
        items = [(k, v) for k, v in self.spec.sets.items()]
        items += [(k, v) for k, v in point.items() if not k.startswith("workload.")]
        try:
            for dotted, value in items:
                src = f"vary.{dotted}" if dotted in self.spec.vary else f"set.{dotted}"
                path, val, dotted = parse_set(f"{dotted}={json.dumps(value)}")
                check_set_path(path, dotted, data)
                cur = data                          # the machine must have the block the path is in
                for i, seg in enumerate(path[:-1]):
                    cur = cur.get(seg) if isinstance(cur, dict) else None
                    if not isinstance(cur, dict) and SE.is_model(SE.unwrap(SE.type_at(Machine, path[:i + 1]))):
                        block = ".".join(path[:i + 1])
                        raise _err(self.spec.label, src, f"{data.get('name', hw_label)} has no {block} block",
                                   "paths of blocks the machine has; an overlay can add a block")
                data = apply_set(data, path, val)
                origins.append((path, f"--set {dotted}"))
            return validate_machine(data, base, origins)
        except InputError as e:
            if e.where.startswith(self.spec.label + ":"):
                raise
            raise self._rewrite(e, hw_label, point) from None

    def workload(self, point: dict):
        from archsim.config.load import apply_set
        from archsim.workloads.model import validate_workload

        over = dict(self.spec.options)
        data = copy.deepcopy(self.wl_data)
        for k, v in point.items():
            if not k.startswith("workload."):
                continue
            f = k[len("workload."):]
            if f in self.options_scn:
                over[f] = v
            elif f in self.options_model:
                data = apply_set(data, ("model", f), v)
            else:
                raise _err(self.spec.label, f"vary.{k}", f"unknown workload field {f!r}",
                           "workload.<field>, one of: " + ", ".join(self.options_scn + self.options_model))
        try:
            return validate_workload(data, self.wl_label, over)
        except InputError as e:
            raise self._rewrite(e, "", point) from None


def expand(spec: Spec, check_emit: bool = True) -> list[Point]:
    """Every point of the grid (hw outermost, then the vary keys in spec order), resolved and
    validated; with ``check_emit`` every distinct (capabilities, workload) is emitted once, so a
    point the kernel emitters refuse is an input error before any run."""
    from archsim.config.derived import capabilities
    from archsim.runner import placement_for, preflight
    from archsim.scale_model import check_scale

    keys = list(spec.vary)
    npoints = len(spec.hw) * math.prod(len(spec.vary[k]) for k in keys)
    if npoints > spec.max_points:
        raise _err(spec.label, "vary", f"the grid has {npoints:,} points, more than max_points {spec.max_points:,}",
                   "fewer values, or max_points: N in the spec to raise the limit")
    res = _Resolver(spec)
    combos = list(itertools.product(*(spec.vary[k] for k in keys))) if keys else [()]
    points: list[Point] = []
    emitted: set = set()
    for h, hl in zip(spec.hw, spec.hw_labels):
        for combo in combos:
            values = dict(zip(keys, combo))
            m = res.machine(h, hl, values)
            wl = res.workload(values)
            if check_emit:
                ek = (capabilities(m), m.dram.capacity_gib, wl)
                try:
                    if ek not in emitted:
                        placement_for(m, wl)   # private placement on a machine without segments
                        preflight(m, wl, spec.run, "max_instructions: N in the spec")
                        emitted.add(ek)
                    check_scale(m, spec.run.scale)   # the unit counts a point varies must still divide
                except InputError as e:
                    where = "hw" if e.where.startswith("--hw") else (
                        "vary point {" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + "}"
                        if values else "scale" if e.where == "--scale" else "workload")
                    raise _err(spec.label, where, f"{e.where}: {e.what}", e.allowed) from None
            points.append(Point(hw=hl, values=values, machine=m, workload=wl, key=run_key(m, wl, spec.run)))
    return points


# ----------------------------------------------------------------------------- one run
def _options_dict(o: RunOptions) -> dict:
    d = {"mode": o.mode, "sample": o.sample, "waves": o.waves, "max_error": o.max_error,
         "max_cycles": o.max_cycles, "seed": o.seed}
    if o.interval:          # only when on: the run keys of sweeps without it stay as they were
        d["interval"] = True
    if o.k_loop:
        d["k_loop"] = True
    if o.scale > 1:
        d["scale"] = o.scale
    return d


def execute(task: dict) -> dict:
    """Run one point (in this process, a pool worker or a Dask worker): the machine and workload
    travel as plain JSON and are validated again here. Never raises: a run that cannot finish
    returns its partial document, any other failure a document naming the error; both carry
    ``"complete": false`` and ``error``."""
    from archsim.config.schema import Machine
    from archsim.workloads.model import Workload

    m = Machine.model_validate(task["machine"])
    wl = Workload.model_validate(task["workload"])
    opts = RunOptions(**task["options"])
    t0 = time.perf_counter()
    try:
        return run_workload(m, wl, opts)
    except SimulationError as e:
        doc = getattr(e, "partial_document", None) or _failed_doc(m, wl, t0)
        doc = dict(doc, complete=False, error=e.line(), status="incomplete")
        return doc
    except InputError as e:
        return dict(_failed_doc(m, wl, t0), error=e.line())
    except Exception as e:  # noqa: BLE001 - a sweep records every failure and goes on
        return dict(_failed_doc(m, wl, t0), error=f"{type(e).__name__}: {e}")


def _failed_doc(m, wl, t0: float) -> dict:
    from archsim.version import __version__

    return {"schema": "archsim.result/1", "complete": False, "status": "error",
            "machine": {"name": m.name, "family": m.family, "clock_ghz": m.clock_ghz},
            "workload": wl.summary(), "total": {}, "kernels": [],
            "sim": {"wall_seconds": round(time.perf_counter() - t0, 4), "archsim_version": __version__}}


def status_of(doc: dict) -> str:
    """ok | verification_failed | incomplete | error."""
    if doc.get("complete") and "error" not in doc:
        return "verification_failed" if doc.get("mode") == "functional" and not doc.get("passed", True) else "ok"
    return doc.get("status") if doc.get("status") in ("incomplete", "error") else "incomplete"


def finished(doc: dict | None) -> bool:
    """A run a sweep run again skips: complete (a failed functional check is a finished result)."""
    return bool(doc) and bool(doc.get("complete")) and "error" not in doc


# ----------------------------------------------------------------------------- the results store
def write_json_atomic(path: Path, obj) -> None:
    write_text(path, jsonfmt.dumps(obj) + "\n")


def read_run(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == "archsim.result/1" else None


def result_row(point: Point, doc: dict) -> dict:
    """One results.parquet row: who ran, the varied values, the totals and per-kernel cycles."""
    w = doc.get("workload", {})
    row = {"key": point.key, "hw": point.hw, "machine": doc.get("machine", {}).get("name", point.machine.name),
           "workload": w.get("name", point.workload.name)}
    for f in ("phase", "batch", "seq", "layers", "dtype", "attention", "placement"):
        row[f] = w.get(f)
    row.update(point.values)
    row["status"] = status_of(doc)
    row["complete"] = bool(doc.get("complete"))
    row["error"] = doc.get("error", "")
    tot = doc.get("total", {})
    for f in TOTAL_FIELDS:
        row[f"total.{f}"] = tot.get(f)
    if doc.get("mode") == "functional":
        row["passed"] = bool(doc.get("passed"))
    for k in doc.get("kernels", []):
        if "cycles" in k:                   # timing runs (functional runs count no cycles)
            row[f"cycles.{k['name']}"] = k["cycles"]
    return row


def _frame(rows: list[dict]):
    import pandas as pd

    df = pd.DataFrame(rows)
    for c in df.columns:            # a column parquet cannot type (lists, mixed kinds) becomes JSON text
        vals = [v for v in df[c] if v is not None and not (isinstance(v, float) and v != v)]
        kinds = {("num" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__)
                 for v in vals}
        if len(kinds) > 1 or kinds & {"list", "dict", "tuple"}:
            df[c] = [None if v is None else json.dumps(v) if not isinstance(v, str) else v for v in df[c]]
    return df


def write_results(out: Path, rows: list[dict]) -> Path:
    path = out / "results.parquet"
    frame = _frame(rows)
    write_atomic(path, lambda p: frame.to_parquet(p, index=False, engine="pyarrow"))
    return path


# ----------------------------------------------------------------------------- executors
class _Local:
    """In this process (one worker): runs are executed lazily, one at a time."""

    def __init__(self):
        self.pending = []

    def submit(self, task):
        self.pending.append(task)

    def results(self):
        for task in self.pending:
            yield task, execute(task)

    def close(self, cancel=False):
        pass


class _Pool:
    """A concurrent.futures process pool (spawned workers: they do not inherit the parent's
    threads or numba state; they use the parent's kernel timing cache)."""

    def __init__(self, workers: int, timing: bool = True):
        from archsim.workers import spawn_executor

        self.ex = spawn_executor(workers, warm=timing)   # (a functional sweep needs no timing engine)
        self.futs = {}

    def submit(self, task):
        self.futs[self.ex.submit(execute, task)] = task

    def results(self):
        from concurrent.futures import as_completed

        for f in as_completed(self.futs):
            yield self.futs[f], _future_doc(f, self.futs[f])

    def close(self, cancel=False):
        from archsim.workers import shutdown_executor

        shutdown_executor(self.ex, cancel)


class _Dask:
    """A dask.distributed Client at ADDRESS: each point is one task."""

    def __init__(self, address: str):
        try:
            from distributed import Client
        except ImportError:
            raise InputError("--scheduler", "needs dask.distributed, which is not installed",
                             "pip install 'archsim[sweep-dask]'") from None
        try:
            self.client = Client(address, timeout="20s")
        except (OSError, TimeoutError, ValueError) as e:
            raise InputError("--scheduler", f"cannot connect to {address}: {e}",
                             "the address of a running dask scheduler, e.g. tcp://host:8786") from None
        self.futs = {}

    def submit(self, task):
        f = self.client.submit(execute, task, key=f"archsim-run-{task['key']}", pure=False)
        self.futs[f] = task

    def results(self):
        from distributed import as_completed

        for f in as_completed(list(self.futs)):
            yield self.futs[f], _future_doc(f, self.futs[f])

    def close(self, cancel=False):
        if cancel:
            self.client.cancel(list(self.futs))
        self.client.close()


def _future_doc(fut, task) -> dict:
    """A future's document; a worker that died or a task that raised becomes a failed run."""
    try:
        return fut.result()
    except Exception as e:  # noqa: BLE001
        from archsim.config.schema import Machine
        from archsim.workloads.model import Workload

        m = Machine.model_validate(task["machine"])
        wl = Workload.model_validate(task["workload"])
        return dict(_failed_doc(m, wl, time.perf_counter()), error=f"{type(e).__name__}: {e}")


# ----------------------------------------------------------------------------- the sweep
@dataclass
class SweepResult:
    points: list
    docs: dict                      # key -> document
    executed: list                  # keys run now
    skipped: list                   # keys finished before
    out: Path

    def statuses(self) -> dict:
        return {p.key: status_of(self.docs[p.key]) for p in self.points if p.key in self.docs}

    def failed(self) -> list:
        return [k for k, s in self.statuses().items() if s != "ok"]

    def exit_status(self) -> int:
        """3 if a run could not finish or raised, else 1 if a functional check failed, else 0."""
        st = set(self.statuses().values())
        if st & {"incomplete", "error"}:
            return 3
        return 1 if "verification_failed" in st else 0


def _out_dir(out: Path) -> None:
    try:
        (out / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError("--out", f"cannot create {out}: {e.strerror}", "a writable directory path") from None


def run_sweep(spec: Spec, out: Path, workers: int = 1, scheduler: str | None = None,
              progress: Callable | None = None, points: list | None = None) -> SweepResult:
    """Run every point not finished before; write runs/<key>.json as each ends, results.parquet
    and sweep.json. ``progress(done, total)`` is called as runs end."""
    out = Path(out)
    points = expand(spec) if points is None else points
    _out_dir(out)
    runs = out / "runs"
    docs: dict = {}
    todo: dict = {}                 # key -> the first point with that key (two points may resolve alike)
    skipped = []
    for p in points:
        if p.key in docs or p.key in todo:
            continue
        doc = read_run(runs / f"{p.key}.json")
        if finished(doc):
            docs[p.key] = doc
            skipped.append(p.key)
        else:
            todo[p.key] = p
    by_key = {}
    for p in points:
        by_key.setdefault(p.key, p)

    def rows():
        return [result_row(p, docs[p.key]) for p in points if p.key in docs]

    if scheduler:
        ex = _Dask(scheduler)
    elif workers > 1 and len(todo) > 1:
        ex = _Pool(min(workers, len(todo)), timing=spec.run.mode != "functional")
    else:
        ex = _Local()
    executed = []
    last = time.monotonic()
    try:
        for key, p in todo.items():
            ex.submit({"key": key, "machine": p.machine.model_dump(mode="json"),
                       "workload": p.workload.model_dump(mode="json"), "options": dict(_options_dict(spec.run), max_instructions=spec.run.max_instructions)})
        if progress:
            progress(0, len(todo))
        for task, doc in ex.results():
            key = task["key"]
            p = by_key[key]
            doc = dict(doc, sweep={"key": key, "hw": p.hw, "values": p.values})
            write_json_atomic(runs / f"{key}.json", doc)
            docs[key] = doc
            executed.append(key)
            if progress:
                progress(len(executed), len(todo))
            if time.monotonic() - last > PARQUET_EVERY_S:
                write_results(out, rows())
                last = time.monotonic()
    except BaseException:
        ex.close(cancel=True)
        if docs:
            write_results(out, rows())
        raise
    ex.close()
    res = SweepResult(points=points, docs=docs, executed=executed, skipped=skipped, out=out)
    write_results(out, rows())
    st = res.statuses()
    write_json_atomic(out / "sweep.json", {
        "schema": SWEEP_SCHEMA, "spec": spec.label, "hw": spec.hw_labels, "workload": spec.workload,
        "options": dict(spec.options), "run": _options_dict(spec.run), "vary": spec.vary,
        "points": [{"key": p.key, "hw": p.hw, "values": p.values, "status": st.get(p.key)} for p in points],
        "executed": len(executed), "skipped": len(skipped), "failed": len(res.failed())})
    return res


def summary_table(res: SweepResult, spec: Spec, limit: int = 40) -> str:
    """A short table of the points: hw, varied values, total cycles and time, status."""
    cols = ["hw", *spec.vary]
    head = [*cols, "cycles", "time us", "status", "key"]
    body = []
    for p in res.points[:limit]:
        d = res.docs.get(p.key, {})
        t = d.get("total", {})
        vals = [p.hw, *(json.dumps(v) if isinstance(v, (list, dict)) else str(v) for v in p.values.values())]
        cyc = f"{t['cycles']:,}" if "cycles" in t else "-"
        us = f"{t['seconds'] * 1e6:,.1f}" if "seconds" in t else "-"
        body.append([*vals, cyc, us, status_of(d) if d else "-", p.key])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) if i < len(cols) else str(c).rjust(w) if i < len(cols) + 2 else str(c).ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in [head, *body]]
    if len(res.points) > limit:
        lines.append(f"... {len(res.points) - limit} more rows in results.parquet")
    return "\n".join(lines)


__all__ = ["Point", "Spec", "SweepResult", "beside_spec", "execute", "expand", "load_spec", "result_row", "run_key",
           "run_sweep", "status_of", "summary_table", "write_results"]
