"""`archsim validate --cluster C`: the cluster against published measurements
(configs/reference/clusters/<cluster>.yaml), each curve with its source. Two kinds of curve:

- a collective's bus bandwidth against buffer size (``collective``): every point runs the
  collective alone on an idle network, on the cluster as described or with the curve's ``set``
  (a NIC count, say);
- a step (``workload``): each point is a whole step of a model under a plan (training, prefill or a
  decode step), simulated as ``archsim run --cluster`` does (every kernel timed by the engine),
  compared as per-device TFLOP/s (hardware FLOPs: recompute counted, as Megatron-LM logs them), as
  step seconds, or as milliseconds a generated token (the step over the batch, as inference
  benchmarks report throughput), against GPUs or the batch. A point may change the curve's model
  or scenario (``model``: layers, hidden ...; ``scenario``: batch, seq ...), so one curve can follow
  a published weak-scaling table or a batch sweep."""

from __future__ import annotations

import time
from pathlib import Path

from archsim.config.load import apply_set, read_yaml
from archsim.errors import InputError
from archsim.paths import data_dir
from archsim.validate import check_curve_head, is_figure, pick_curves

from . import collectives as C
from .device_collective import device_reduce_rate
from .spec import Cluster, load_device, resolve_cluster, validate_cluster
from .topology import build

SCHEMA = "archsim.validate/1"
MAX_RANKS = 1024        # choice: a ring over 1024 ranks is about 2 million transfers
MAX_A2A_RANKS = 256     # all-to-all sends n(n-1) transfers at once
CURVE_FIELDS = ("name", "source", "collective", "ranks", "algorithm", "set", "x", "unit", "points", "workload")
# a step curve's unit -> the figure of the archsim.cluster/1 step record it reads (ms/token: the
# inverse of tokens_per_second, as inference benchmarks report throughput)
STEP_UNITS = {"TFLOP/s": "tflops_per_device_hardware", "s": "step_seconds", "ms/token": "tokens_per_second"}
STEP_X = ("gpus", "batch")      # a point's x: the plan's devices, or its global batch
STEP_POINT_FIELDS = ("x", "value", "plan", "model", "scenario")


def reference_path(c: Cluster, given: str | None = None) -> Path:
    if given is not None:
        p = Path(given).expanduser()
        if not p.is_file():
            raise InputError("--reference", f"{given!r} is not a file", "a reference YAML path")
        return p
    p = data_dir("configs") / "reference" / "clusters" / f"{c.name}.yaml"
    if not p.is_file():
        have = sorted(x.stem for x in p.parent.glob("*.yaml"))
        raise InputError("--cluster", f"no published figures for cluster {c.name!r}",
                         "a cluster with a reference file: " + ", ".join(have) + ", or --reference FILE")
    return p


def load_curves(path: Path, cluster_data: dict, cluster_label: str) -> list[dict]:
    """The curves of a cluster reference file, checked, each with its (possibly changed) cluster."""
    doc = read_yaml(path, str(path))
    where = str(path)
    extra = set(doc) - {"cluster", "curves"}
    if extra:
        raise InputError(where, f"unknown key {sorted(extra, key=str)[0]!r}", "cluster, curves")
    raw = doc.get("curves")
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: curves", "missing or empty", "a list of curves")
    out, names = [], set()
    for i, c in enumerate(raw):
        name, w = check_curve_head(c, i, where, CURVE_FIELDS, names)
        if "workload" in c:
            out.append(_step_curve(c, name, w, cluster_label, path.parent))
            continue
        kind = c.get("collective")
        if kind not in C.KINDS:
            raise InputError(f"{w}.collective", f"{kind!r} is not a collective", ", ".join(C.KINDS))
        algo = c.get("algorithm", "auto")
        if algo not in C.ALGORITHMS:
            raise InputError(f"{w}.algorithm", f"{algo!r} is not an algorithm", ", ".join(C.ALGORITHMS))
        if c.get("x") != "bytes" or c.get("unit") != "GB/s":
            raise InputError(f"{w}.x", f"x {c.get('x')!r}, unit {c.get('unit')!r}",
                             "x: bytes and unit: GB/s (bus bandwidth against buffer size)")
        data = cluster_data
        changes = c.get("set") or {}
        if not isinstance(changes, dict):
            raise InputError(f"{w}.set", "not a mapping", "{dotted.field: value}")
        for k, v in changes.items():
            if not isinstance(k, str) or not k:
                raise InputError(f"{w}.set", f"{k!r} is not a field path", "dotted paths such as node.nics.count")
            data = apply_set(data, tuple(k.split(".")), v)
        try:
            cluster = validate_cluster(data, f"{cluster_label} with {w}.set" if changes else cluster_label)
        except InputError as e:
            raise InputError(e.where, e.what, e.allowed) from None
        ranks = c.get("ranks")
        most = min(cluster.devices, MAX_A2A_RANKS if kind == "all_to_all" else MAX_RANKS)
        if not isinstance(ranks, int) or isinstance(ranks, bool) or not 2 <= ranks <= most:
            raise InputError(f"{w}.ranks", f"{ranks!r} is not a rank count of this cluster",
                             f"2 to {most} (the cluster's first devices; at most {MAX_RANKS}, all-to-all "
                             f"{MAX_A2A_RANKS}, so a curve's transfers stay in the millions)")
        pts = c.get("points")
        if not isinstance(pts, list) or not pts:
            raise InputError(f"{w}.points", "missing or empty", "[[bytes, GB/s], ...]")
        last = 0.0
        for j, p in enumerate(pts):
            if not isinstance(p, list) or len(p) != 2 or not is_figure(p[0]) or not is_figure(p[1]) or p[0] <= last:
                raise InputError(f"{w}.points[{j}]", f"{p!r} is not a point after the last",
                                 "[bytes > 0, GB/s > 0], bytes increasing, at most 2^40")
            if p[0] > 1 << 40:
                raise InputError(f"{w}.points[{j}]", f"{p[0]!r} bytes is beyond the 1 TiB a point may move",
                                 "at most 2^40 bytes")
            last = p[0]
        out.append({"name": name, "source": c["source"].strip(), "collective": kind, "algorithm": algo,
                    "ranks": ranks, "cluster": cluster, "points": [(float(p[0]), float(p[1])) for p in pts]})
    return out


def _step_curve(c: dict, name: str, w: str, cluster_label: str, folder: Path) -> dict:
    """A step curve, every point's workload and plan checked against the cluster (devices,
    divisibility, memory) before anything runs."""
    from archsim.workloads.model import load_workload, validate_workload

    from .run import prepare as prepare_step

    for k in ("collective", "ranks", "algorithm", "set"):
        if k in c:
            raise InputError(f"{w}.{k}", "a field of collective curves", "workload, x, unit, points (a step curve "
                             "runs on the cluster as described)")
    if c.get("x") not in STEP_X or c.get("unit") not in STEP_UNITS:
        raise InputError(f"{w}.x", f"x {c.get('x')!r}, unit {c.get('unit')!r}",
                         "x: " + " or ".join(STEP_X) + " and unit: " + " or ".join(STEP_UNITS)
                         + " (per-device TFLOP/s, step seconds, or milliseconds a generated token)")
    base = c["workload"]
    if isinstance(base, str) and base:
        from archsim.sweep import beside_spec
        from archsim.workloads.model import builtin_workloads

        try:          # a path is taken from the reference file's folder
            wl0 = load_workload(beside_spec(base, folder, builtin_workloads()))
        except InputError as e:
            raise InputError(f"{w}.workload", e.what, e.allowed) from None
        base_doc = wl0.model_dump(mode="json")
    elif isinstance(base, dict):
        base_doc = base
        for part in ("model", "scenario"):
            if not isinstance(base_doc.get(part, {}), dict):
                raise InputError(f"{w}.workload.{part}", f"{base_doc[part]!r} is not a mapping",
                                 f"{{field: value}} of the {part}")
    else:
        raise InputError(f"{w}.workload", f"{base!r} is neither a workload name nor a mapping",
                         "a built-in workload, a path, or a workload mapping (name, model, scenario)")
    pts = c.get("points")
    if not isinstance(pts, list) or not pts:
        raise InputError(f"{w}.points", "missing or empty",
                         "[{x: gpus or batch, value: figure, plan: text, model: {...}, scenario: {...}}, ...]")
    out, last = [], 0
    for j, p in enumerate(pts):
        wp = f"{w}.points[{j}]"
        if not isinstance(p, dict) or set(p) - set(STEP_POINT_FIELDS) or not {"x", "value", "plan"} <= set(p):
            raise InputError(wp, f"{p!r} is not a step point", "{x: gpus or batch, value: figure > 0, plan: text, "
                             "model: {field: value}, scenario: {field: value} (both optional)}")
        x, v, plan_text = p["x"], p["value"], p["plan"]
        if not isinstance(x, int) or isinstance(x, bool) or x <= last or not is_figure(v) \
                or not isinstance(plan_text, str):
            raise InputError(wp, f"x {x!r}, value {v!r}, plan {plan_text!r}",
                             f"x a {c['x']} above the last point's, value > 0, plan the text of --plan")
        doc = dict(base_doc)
        for part in ("model", "scenario"):
            change = p.get(part) or {}
            if not isinstance(change, dict):
                raise InputError(f"{wp}.{part}", f"{change!r} is not a mapping", f"{{field: value}} of the {part}")
            doc[part] = {**(doc.get(part) or {}), **change}
        wl = validate_workload(doc, f"{wp} (its workload)")
        if c["unit"] == "TFLOP/s" and wl.scenario.phase != "train":
            raise InputError(f"{wp}", f"TFLOP/s of a {wl.scenario.phase} step", "a training workload, or unit s or "
                             "ms/token")
        if c["unit"] == "ms/token" and wl.scenario.phase != "decode":
            raise InputError(f"{wp}", f"ms/token of a {wl.scenario.phase} step", "a decode workload (one generated "
                             "token for the batch), or unit s")
        try:
            _cl, _m, plan, _mem = prepare_step(cluster_label, wl, plan_text)
        except InputError as e:
            raise InputError(f"{wp}: {e.where}", e.what, e.allowed) from None
        if c["x"] == "gpus" and plan.devices != x:
            raise InputError(f"{wp}.x", f"{x} GPUs, but the plan uses {plan.devices}", "the plan's tp x pp x dp")
        if c["x"] == "batch" and plan.batch != x:
            raise InputError(f"{wp}.x", f"batch {x}, but the plan's global batch is {plan.batch}", "the plan's gbs")
        out.append({"x": x, "reference": float(v), "workload": wl, "plan": plan_text})
        last = x
    return {"name": name, "source": c["source"].strip(), "kind": "step", "unit": c["unit"], "x": c["x"],
            "cluster_arg": cluster_label, "points": out}


def run_step_curve(c: dict, opts, progress=None) -> dict:
    from .run import run_cluster

    pts = []
    for p in c["points"]:
        r = run_cluster(c["cluster_arg"], p["workload"], p["plan"], opts)
        sim = float(r["step"][STEP_UNITS[c["unit"]]])
        if c["unit"] == "ms/token":
            sim = 1e3 / sim
        pts.append({"x": p["x"], "simulated": round(sim, 4), "reference": p["reference"],
                    "error_pct": round((sim - p["reference"]) / p["reference"] * 100.0, 2), "clock_mhz": None,
                    "plan": p["plan"], "model": p["workload"].name, "step_seconds": r["step"]["step_seconds"],
                    "tflops_per_device_hardware": r["step"]["tflops_per_device_hardware"],
                    "tflops_per_device_model": r["step"]["tflops_per_device_model"]})
        if progress:
            progress(c, pts[-1])
    errs = [abs(p["error_pct"]) for p in pts]
    return {"name": c["name"], "kind": "step", "x": [c["x"]], "unit": c["unit"], "source": c["source"],
            "points": pts, "mape_pct": round(sum(errs) / len(errs), 2), "max_error_pct": round(max(errs), 2)}


def run_curve(c: dict, progress=None) -> dict:
    """A collective's curve; reductions at the device's reduction rate in fp32, nccl-tests' default
    type (when the cluster says what its collectives run on)."""
    cluster = c["cluster"]
    rate = device_reduce_rate(cluster, load_device(cluster, cluster.name), "fp32")
    topo = build(cluster, rate)
    ranks = list(range(c["ranks"]))
    pts = []
    for x, ref in c["points"]:
        sec, algo = C.time_collective(topo, c["collective"], ranks, x, c["algorithm"])
        sim = C.bus_bandwidth(c["collective"], len(ranks), x, sec) / 1e9
        pts.append({"x": x, "simulated": round(sim, 4), "reference": ref,
                    "error_pct": round((sim - ref) / ref * 100.0, 2), "clock_mhz": None, "algorithm": algo})
        if progress:
            progress(c, pts[-1])
    errs = [abs(p["error_pct"]) for p in pts]
    return {"name": c["name"], "kind": "collective", "collective": c["collective"], "ranks": c["ranks"],
            "x": ["bytes"], "unit": "GB/s",
            "source": c["source"], "points": pts, "mape_pct": round(sum(errs) / len(errs), 2),
            "max_error_pct": round(max(errs), 2)}


def prepare(arg: str, reference: str | None = None, only=None) -> tuple[Cluster, list[dict]]:
    """The cluster and the curves to run (all, or those whose name contains ``only``), every
    input checked before anything runs."""
    path = resolve_cluster(arg)
    label = path.name if "/" not in str(arg) else str(arg)
    data = read_yaml(path, label)
    cluster = validate_cluster(data, label)
    ref = reference_path(cluster, reference)
    curves = load_curves(ref, data, label)
    if only is not None:
        curves = pick_curves(curves, only, ref)
    return cluster, curves


def validate_cluster_curves(arg: str, reference: str | None = None, progress=None, only=None, opts=None) -> dict:
    """Every curve (or those ``only`` names); ``opts`` (RunOptions) for the step curves' kernels."""
    from archsim.runner import RunOptions

    cluster, curves = prepare(arg, reference, only)
    t0 = time.perf_counter()
    opts = opts if opts is not None else RunOptions()
    out = [run_step_curve(c, opts, progress) if c.get("kind") == "step" else run_curve(c, progress) for c in curves]
    errs = [abs(p["error_pct"]) for c in out for p in c["points"]]
    return {"schema": SCHEMA, "machine": cluster.name, "cluster": cluster.name, "rows": [], "curves": out,
            "mape_pct": round(sum(errs) / len(errs), 2), "max_error_pct": round(max(errs), 2),
            "wall_seconds": round(time.perf_counter() - t0, 2)}


def format_point(c: dict, p: dict) -> str:
    if c.get("kind") == "step":
        return (f"  {c['name']:<28} {p['x']:>6} {'GPUs' if c.get('x') == 'gpus' else 'seqs'} {p['model']:<14} {p['simulated']:>9.2f} {p['reference']:>9.2f} "
                f"{c['unit']:<7} {p['error_pct']:>+7.1f}%  ({p['plan']}; step {p['step_seconds']:.2f} s)")
    return (f"  {c['name']:<28} {p['x'] / 2**20:>10,.0f} MiB {p['simulated']:>9.1f} {p['reference']:>9.1f} GB/s "
            f"{p['error_pct']:>+7.1f}%  ({p['algorithm']})")


__all__ = ["format_point", "load_curves", "prepare", "reference_path", "run_curve", "run_step_curve",
           "validate_cluster_curves"]
