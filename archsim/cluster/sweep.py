"""`archsim sweep` over clusters and parallel plans: a grid of cluster steps from one spec.

    cluster: jean-zay-a100            # or a list of clusters
    workload: bloom-176b
    plan: tp=4,pp=12,dp=8,mb=2,gbs=2048,recompute=full,zero=1
    vary:                             # cartesian product
      plan.tp: [2, 4, 8]              # plan.<key>: a key of the plan text (tp, pp, dp, mb, gbs, ...)
      cluster.node.nics.count: [4, 8] # cluster.<dotted path>: a field of the cluster
      workload.seq: [1024, 2048]      # workload.<field>: a scenario field, as `archsim run`'s flags

Every point's cluster, plan and workload are checked before anything runs (devices, divisibility,
memory per device), so a point that cannot run is one input error, not a failed run later. Each
point is a whole step as ``archsim run --cluster`` simulates it, its kernels timed through the
kernel cache (points sharing a shard's shapes share them), run in this process one after
another (``--workers`` times each point's kernels). ``DIR/runs/<key>.json`` holds each point's
``archsim.cluster/1`` record with a ``sweep`` record (key, cluster, varied values); a sweep run
again on the same DIR skips the keys already there. ``DIR/results.parquet``: one row a point
(the varied values and the step's figures); ``DIR/sweep.json`` (``archsim.sweep/1``)."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from archsim.config.load import apply_set, read_yaml
from archsim.errors import InputError

SPEC_KEYS = ("cluster", "workload", "plan", "phase", "batch", "seq", "layers", "dtype", "vary", "max_points",
             "description")
SCENARIO_KEYS = ("phase", "batch", "seq", "layers", "dtype")
STEP_FIELDS = ("step_seconds", "tokens_per_second", "tflops_per_device_model", "tflops_per_device_hardware", "mfu",
               "bubble_share", "comm_exposed_seconds", "comm_overlapped_seconds")
MAX_POINTS = 1000       # choice: each point is a whole step (seconds to minutes warm)
MAX_POINTS_CAP = 100_000    # choice: the most a spec's max_points may allow (every point is checked up front)


@dataclass
class ClusterPoint:
    cluster_label: str      # as written in the spec
    values: dict            # vary key -> value
    cluster: object         # resolved Cluster
    workload: object        # resolved Workload
    plan: str               # plan text
    key: str


def is_cluster_spec(path: str) -> bool:
    """Whether a sweep spec names clusters (a top-level ``cluster`` key) rather than machines."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.stat().st_size > 1 << 20:      # not parsed twice: a top-level `cluster:` line says it
        with open(p, "rb") as f:
            return any(re.match(rb"cluster\s*:", line) for line in f)
    try:
        return "cluster" in (read_yaml(p, str(path)) or {})
    except InputError:
        return False


def _err(label: str, where: str, what: str, allowed: str = "") -> InputError:
    return InputError(f"{label}: {where}" if where else label, what, allowed)


def _plan_items(text: str, label: str) -> dict:
    if not isinstance(text, str) or not text.strip():
        raise _err(label, "plan", f"{text!r} is not a plan", "the text of --plan, tp=T,pp=P,dp=D,...")
    items = {}
    for part in text.split(","):
        k, eq, v = part.strip().partition("=")
        if not eq or not k:
            raise _err(label, "plan", f"{part.strip()!r} is not key=value", "the text of --plan, tp=T,pp=P,dp=D,...")
        if k in items:
            raise _err(label, "plan", f"{k} given twice", "each key once")
        items[k] = v
    return items


def load_cluster_spec(path: str) -> dict:
    """The spec's structure checked (keys, types, lists); its values are checked by expand."""
    from archsim.cluster.plan import KEYS as PLAN_KEYS
    from archsim.sweep import first_repeat

    label = str(path)
    p = Path(path)
    if not p.is_file():
        raise InputError(label, "sweep spec not found", "a path to a YAML file")
    data = read_yaml(p, label)
    unknown = [k for k in data if k not in SPEC_KEYS]
    if unknown:
        raise _err(label, str(unknown[0]), f"unknown key {unknown[0]!r} in a cluster sweep",
                   "known keys: " + ", ".join(SPEC_KEYS))
    for k in ("cluster", "workload", "plan"):
        if k not in data:
            raise _err(label, "", f"missing required key {k!r}", "required: cluster, workload, plan")
    clusters = data["cluster"] if isinstance(data["cluster"], list) else [data["cluster"]]
    if not clusters or not all(isinstance(c, str) and c for c in clusters) or len(set(clusters)) != len(clusters):
        raise _err(label, "cluster", f"{data['cluster']!r}", "a cluster name or path, or a list of distinct ones")
    if not isinstance(data["workload"], str) or not data["workload"]:
        raise _err(label, "workload", f"{data['workload']!r}", "a workload name or path")
    plan = _plan_items(data["plan"], label)
    vary = data.get("vary") or {}
    if not isinstance(vary, dict):
        raise _err(label, "vary", f"{vary!r}", "a mapping of dotted paths to lists")
    for k, vals in vary.items():
        w = f"vary.{k}"
        head, _, rest = str(k).partition(".")
        if head not in ("plan", "cluster", "workload") or not rest or any(not s for s in rest.split(".")):
            raise _err(label, w, f"bad path {k!r}", "plan.<key>, cluster.<dotted field> or workload.<field>")
        if head == "plan" and rest not in PLAN_KEYS:
            raise _err(label, w, f"{rest!r} is not a plan key", ", ".join(PLAN_KEYS))
        if head == "workload" and rest not in SCENARIO_KEYS:
            raise _err(label, w, f"{rest!r} is not a scenario field a cluster sweep varies", ", ".join(SCENARIO_KEYS))
        if head == "workload" and rest in data:
            raise _err(label, w, f"{rest} is both fixed (top-level) and varied", "name it in one place")
        if not isinstance(vals, list) or not vals:
            raise _err(label, w, f"{vals!r}", "a non-empty list of values")
        if first_repeat(vals) >= 0:
            raise _err(label, w, "a value appears twice", "each value once")
        if head == "plan" and not all((isinstance(v, int) and not isinstance(v, bool))
                                      or (isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_:.-]+", v)) for v in vals):
            raise _err(label, w, "a value that is not one plan value", "whole numbers, or words such as 1f1b, "
                       "interleaved:2, full")
    mp = data.get("max_points", MAX_POINTS)
    if isinstance(mp, bool) or not isinstance(mp, int) or not 1 <= mp <= MAX_POINTS_CAP:
        raise _err(label, "max_points", f"{mp!r}" if len(str(mp)) < 30 else "a number too large",
                   f"a positive integer, at most {MAX_POINTS_CAP:,}")
    from archsim.cluster.spec import builtin_clusters
    from archsim.sweep import beside_spec
    from archsim.workloads.model import builtin_workloads

    folder = p.resolve().parent
    return {"label": label, "clusters": [(c, beside_spec(c, folder, builtin_clusters())) for c in clusters],
            "workload": beside_spec(data["workload"], folder, builtin_workloads()),
            "plan": plan, "scenario": {k: data[k] for k in SCENARIO_KEYS if k in data}, "vary": dict(vary),
            "max_points": mp}


def _key(cluster, workload, plan: str) -> str:
    doc = {"cluster": cluster.model_dump(mode="json"), "workload": workload.model_dump(mode="json"), "plan": plan}
    return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def expand_cluster_spec(spec: dict) -> list[ClusterPoint]:
    """Every point resolved and checked (cluster, workload, plan against both, memory) before any runs."""
    from archsim.cluster.run import prepare
    from archsim.cluster.spec import resolve_cluster, validate_cluster
    from archsim.workloads.model import load_workload

    label, vary = spec["label"], spec["vary"]
    n = len(spec["clusters"])
    for vals in vary.values():
        n *= len(vals)
    if n > spec["max_points"]:
        raise _err(label, "vary", f"{n:,} points", f"at most max_points ({spec['max_points']:,})")
    points = []
    for name, arg in spec["clusters"]:         # (as written, resolved beside the spec)
        base = read_yaml(resolve_cluster(arg, f"{label}: cluster"), name)
        for combo in itertools.product(*vary.values()) if vary else [()]:
            values = dict(zip(vary, combo))
            where = f"{label}: point {name} {values}" if values else f"{label}: point {name}"
            data, plan, scen = base, dict(spec["plan"]), dict(spec["scenario"])
            for k, v in values.items():
                head, _, rest = k.partition(".")
                if head == "cluster":
                    data = apply_set(data, tuple(rest.split(".")), v)
                elif head == "plan":
                    plan[rest] = str(v)
                else:
                    scen[rest] = v
            plan_text = ",".join(f"{k}={v}" for k, v in plan.items())
            try:
                cluster = validate_cluster(data, name)
                wl = load_workload(spec["workload"], scen)
                prepare(cluster, wl, plan_text)
            except InputError as e:
                raise InputError(f"{where}: {e.where}", e.what, e.allowed) from None
            points.append(ClusterPoint(name, values, cluster, wl, plan_text, _key(cluster, wl, plan_text)))
    return points


def _row(p: ClusterPoint, doc: dict) -> dict:
    row = {"key": p.key, "cluster": p.cluster_label, "workload": p.workload.name, "plan": p.plan, **p.values}
    st = doc.get("step", {})
    for f in STEP_FIELDS:
        row[f"step.{f}"] = st.get(f)
    row["memory_per_device"] = doc.get("memory_per_device", {}).get("total")
    return row


def _whole(doc) -> bool:
    """A record an earlier run of the sweep finished (a damaged one is simulated again)."""
    if not isinstance(doc, dict) or doc.get("schema") != "archsim.cluster/1" or not isinstance(doc.get("step"), dict):
        return False
    st = doc["step"]
    return all(isinstance(st.get(f), (int, float)) for f in STEP_FIELDS if f != "mfu") and \
        isinstance(doc.get("memory_per_device", {}), dict)


def run_cluster_sweep(spec: dict, points: list[ClusterPoint], out: Path, opts, progress=None) -> dict:
    """Run the points not finished in ``out``; write each record, results.parquet and sweep.json."""
    from archsim.cluster.run import run_cluster
    from archsim.sweep import write_json_atomic, write_results

    runs = out / "runs"
    for f in [runs, *(runs / f"{p.key}.json" for p in points), out / "results.parquet", out / "sweep.json"]:
        want_dir = f == runs
        if f.exists() and (f.is_dir() != want_dir):
            raise InputError(str(f), f"a {'file' if want_dir else 'directory'} where the sweep writes its "
                             f"{'records' if want_dir else 'results'}", "remove it, or another --out")
    runs.mkdir(parents=True, exist_ok=True)
    rows, ran, skipped = [], [], []
    t0 = time.perf_counter()
    for i, p in enumerate(points):
        f = runs / f"{p.key}.json"
        doc = None
        if f.is_file():
            try:
                doc = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                doc = None
        if _whole(doc):
            skipped.append(p.key)
        else:
            doc = run_cluster(p.cluster, p.workload, p.plan, opts)
            doc["sweep"] = {"key": p.key, "cluster": p.cluster_label, "values": p.values}
            write_json_atomic(f, doc)
            ran.append(p.key)
        rows.append(_row(p, doc))
        if progress:
            progress(i + 1, len(points), rows[-1])
    write_results(out, rows)
    summary = {"schema": "archsim.sweep/1", "kind": "cluster", "spec": spec["label"], "points": len(points),
               "run": len(ran), "finished_before": len(skipped), "vary": spec["vary"],
               "wall_seconds": round(time.perf_counter() - t0, 2)}
    write_json_atomic(out / "sweep.json", summary)
    return {"rows": rows, "ran": ran, "skipped": skipped, "summary": summary}


def format_cluster_sweep(res: dict, spec: dict) -> str:
    cols = list(spec["vary"])
    head = f"{'cluster':<22}" + "".join(f"{c[-18:]:>20}" for c in cols) + f"{'step s':>12}{'TFLOP/s':>10}{'MFU':>8}"
    lines = [head]
    for r in res["rows"]:
        mfu = r.get("step.mfu")
        lines.append(f"{r['cluster']:<22}" + "".join(f"{str(r[c]):>20}" for c in cols)
                     + f"{r['step.step_seconds']:>12.4g}{r['step.tflops_per_device_model']:>10.4g}"
                     + (f"{100 * mfu:>7.1f}%" if mfu is not None else f"{'-':>8}"))
    return "\n".join(lines)


__all__ = ["ClusterPoint", "expand_cluster_spec", "format_cluster_sweep", "is_cluster_spec", "load_cluster_spec",
           "run_cluster_sweep"]
