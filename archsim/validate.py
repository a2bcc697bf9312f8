"""`archsim validate`: the machine model against published and measured figures.

configs/reference/<machine>.yaml holds
- rows (quantity, value, unit, source): single figures, each with a probe here (a micro-benchmark
  kernel run on the timing model, micro.py);
- curves: a figure against a swept parameter, as a microbenchmark paper plots it. A curve names
  its source, the micro-benchmark kernel and its fixed params (the kernel shape the measurement
  used), the swept param(s) `x`, and (x, y) points; `clock_mhz` (per curve, or a third column per
  point) is the core clock the measurement ran at, and the model runs at it with the DRAM clock
  kept (a measured GPU boosts and throttles; the model has no power model).

The report gives the error of every figure, each curve's MAPE and worst point, and the mean
absolute percentage error over every row and point.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from archsim import micro_params as MP
from archsim.config.load import load_yaml_text
from archsim.errors import InputError
from archsim.paths import data_dir

SCHEMA = "archsim.validate/1"
# The probes import archsim.micro (and so the engine) when they run: reading and checking a
# reference file does not load numba, so a bad one is refused at once.


def _l1_kib(machine) -> int:
    return machine.l1.size_kib if machine.l1 is not None else 0


def _chase(machine, out, **p) -> float:
    from archsim import micro as MI

    return MI.micro_latency(machine, MI.parse_params("latency", p), out)


def p_ffma_latency(machine, out):
    from archsim import micro as MI

    return MI.ffma_latency(machine, out)


def p_shared_latency(machine, out):
    from archsim import micro as MI

    return MI.shared_latency(machine, out)


def p_l1_hit_latency(machine, out):
    # a footprint well inside L1: after the warm-up pass every load hits
    return _chase(machine, out, footprint_kib=min(16, max(_l1_kib(machine) // 4, 1)), loads=1024)


def p_l2_hit_latency(machine, out):
    # far beyond L1 (few lucky L1 hits), well inside L2, addresses in the chasing SM's near half
    l2 = machine.l2.size_kib if machine.l2 is not None else 0
    fp = max(64 * _l1_kib(machine), 1024)
    fp = min(fp, l2 // 4) if l2 else fp
    return _chase(machine, out, footprint_kib=fp, loads=2048, half="near")


def p_dram_latency(machine, out):
    # cold misses: the first touch of every line goes to DRAM
    return _chase(machine, out, footprint_kib=32 * 1024, loads=2048, warmup=0)


def p_l1_bandwidth(machine, out):
    from archsim import micro as MI

    return MI.l1_bandwidth(machine, out)


def p_l2_bandwidth(machine, out):
    from archsim import micro as MI

    return MI.l2_bandwidth(machine, out)


def p_dram_stream_share(machine, out):
    from archsim import micro as MI

    # 512 MiB, as the references' benchmarks read (BabelStream's 2^25-element arrays, gpu-stream's largest
    # buffers): a 64-MiB stream on a 3-TB/s machine is ~20 us, where the ramp and the drain weigh
    MI.micro_bandwidth(machine, MI.parse_params("bandwidth", {"kind": "read", "footprint_mib": 512}), out)
    return out.extra["share_of_peak"]


def p_mma_fp16_tflops(machine, out):
    from archsim import micro as MI

    return MI.micro_mma(machine, MI.parse_params("mma", {"dtype": "fp16"}), out)


# Sunway (SW26010-Pro): DMA start-up and streaming of one CPE, one core group's DMA peak, the CPEs'
# vector FMA peak (archsim.micro's Sunway probes)
def p_dma_get_startup(machine, out):
    from archsim import micro as MI

    return MI.dma_startup(machine, out, "get")


def p_dma_put_startup(machine, out):
    from archsim import micro as MI

    # a whole burst, so that the start-up does not include a read-modify-write where the config
    # chooses one (dram.partial_writes: rmw); [M] does not say what sizes its fit used
    return MI.dma_startup(machine, out, "put", nbytes=machine.dram.burst_bytes)


def p_dma_get_stream(machine, out):
    from archsim import micro as MI

    return MI.dma_stream_rate(machine, out, "get")


def p_dma_put_stream(machine, out):
    from archsim import micro as MI

    return MI.dma_stream_rate(machine, out, "put")


def p_dma_group_gbps(machine, out):
    from archsim import micro as MI

    return MI.dma_group_gbps(machine, out)


def p_vector_fp16_tflops(machine, out):
    from archsim import micro as MI

    return MI.vector_fma_tflops(machine, out, "f16x2")


def p_vector_fp32_tflops(machine, out):
    from archsim import micro as MI

    return MI.vector_fma_tflops(machine, out, "f32")


def p_rma_latency_cluster(machine, out):
    """8-B blocking RMA put between two CPEs of one cluster (CPE 0 -> CPE 1), cycles."""
    from archsim import micro as MI

    return MI.micro_rma(machine, MI.parse_params("rma", {"src": 0, "dst": 1, "size_bytes": 8}), out)


def p_rma_latency_corner(machine, out):
    """8-B blocking RMA put from the first CPE of a core group to the last (corner to corner)."""
    from archsim import micro as MI

    last = machine.cores.per_group - 1
    return MI.micro_rma(machine, MI.parse_params("rma", {"src": 0, "dst": last, "size_bytes": 8}), out)


def p_rma_bandwidth(machine, out):
    """Point-to-point RMA streaming, B/cycle: d(bytes) / d(cycles) between one blocking put of 16
    and one of 32 KiB to the neighbouring cluster (the start-up and the last trip cancel)."""
    from archsim import micro as MI

    c = [MI.micro_rma(machine, MI.parse_params("rma", {"src": 0, "dst": 2, "size_bytes": n, "reps": 1}), out)
         for n in (16384, 32768)]
    return 16384 / (c[1] - c[0])


PROBES = {
    "ffma_latency": ("cycles", p_ffma_latency),
    "shared_latency": ("cycles", p_shared_latency),
    "l1_hit_latency": ("cycles", p_l1_hit_latency),
    "l2_hit_latency": ("cycles", p_l2_hit_latency),
    "dram_latency": ("cycles", p_dram_latency),
    "l1_bandwidth": ("bytes/cycle/SM", p_l1_bandwidth),
    "l2_bandwidth": ("bytes/cycle", p_l2_bandwidth),
    "dram_stream_share": ("fraction", p_dram_stream_share),
    "mma_fp16_tflops": ("TFLOP/s", p_mma_fp16_tflops),
    "dma_get_startup": ("cycles", p_dma_get_startup),
    "dma_put_startup": ("cycles", p_dma_put_startup),
    "dma_get_stream": ("bytes/cycle", p_dma_get_stream),
    "dma_put_stream": ("bytes/cycle", p_dma_put_stream),
    "dma_group_gbps": ("GB/s", p_dma_group_gbps),
    "vector_fp16_tflops": ("TFLOP/s", p_vector_fp16_tflops),
    "vector_fp32_tflops": ("TFLOP/s", p_vector_fp32_tflops),
    "rma_latency_cluster": ("cycles", p_rma_latency_cluster),
    "rma_latency_corner": ("cycles", p_rma_latency_corner),
    "rma_bandwidth": ("bytes/cycle", p_rma_bandwidth),
}

# which machine family each probe measures (a GPU has no DMA engine, a CPE no tensor unit)
SUNWAY_PROBES = ("dma_get_startup", "dma_put_startup", "dma_get_stream", "dma_put_stream", "dma_group_gbps",
                 "vector_fp16_tflops", "vector_fp32_tflops", "rma_latency_cluster", "rma_latency_corner",
                 "rma_bandwidth")
FAMILY_PROBES = {"sunway": SUNWAY_PROBES, "gpu": tuple(q for q in PROBES if q not in SUNWAY_PROBES)}


def reference_path(machine, given: str | None = None) -> Path:
    if given:
        p = Path(given)
        if not p.exists():
            raise InputError("--reference", f"{given}: no such file", "a reference YAML path")
        return p
    p = data_dir("configs") / "reference" / f"{machine.name}.yaml"
    if not p.exists():
        known = sorted(x.stem for x in (data_dir("configs") / "reference").glob("*.yaml"))
        raise InputError(f"validate --hw {machine.name}", f"no reference figures for {machine.name}",
                         "one of: " + ", ".join(known))
    return p


def reference_machine(path: Path) -> str | None:
    """The machine a reference file says its figures are for (its ``machine:`` key), if any."""
    m = _read_doc(path).get("machine")
    return str(m) if m is not None else None


def _read_doc(path: Path) -> dict:
    where = str(path)
    try:
        doc = load_yaml_text(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(where, f"cannot read file: {e.strerror or e}", "a readable YAML reference file") from None
    except UnicodeDecodeError as e:
        raise InputError(where, f"not UTF-8 text (byte {e.start})", "a YAML reference file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None)
        raise InputError(f"{where}:{mark.line + 1}" if mark else where,
                         "not valid YAML" + (f": {problem}" if problem else ""), "a YAML mapping") from None
    if not isinstance(doc, dict) or not (isinstance(doc.get("rows"), list) or isinstance(doc.get("curves"), list)):
        raise InputError(where, "no `rows:` or `curves:` list",
                         "machine: NAME, rows: [{quantity, value, unit, source}], curves: [{name, source, kernel, "
                         "params, x, unit, points}]")
    extra = set(doc) - {"machine", "rows", "curves"}
    if extra:
        raise InputError(where, f"unknown key {sorted(extra, key=str)[0]!r}", "machine, rows, curves")
    if not doc.get("rows") and not doc.get("curves"):
        raise InputError(where, "no row and no curve: nothing to validate", "at least one row or curve")
    return doc


def load_reference(path: Path) -> list[dict]:
    """The rows of a reference file, checked (see load_curves for its curves)."""
    doc = _read_doc(path)
    where = str(path)
    rows = []
    for i, r in enumerate(doc.get("rows") or []):
        w = f"{where}: rows[{i}]"
        if not isinstance(r, dict):
            raise InputError(w, "not a mapping", "quantity, value, unit, source")
        extra = set(r) - {"quantity", "value", "unit", "source"}
        if extra:
            raise InputError(w, f"unknown field {sorted(extra, key=str)[0]!r}", "quantity, value, unit, source")
        q = r.get("quantity")
        if q not in PROBES:
            raise InputError(f"{w}.quantity", f"{q!r} has no probe", ", ".join(PROBES))
        v = r.get("value")
        if not is_figure(v):
            raise InputError(f"{w}.value", f"{v!r} is not a positive number", "a number from 1e-9 to 1e15")
        if r.get("unit") != PROBES[q][0]:
            raise InputError(f"{w}.unit", f"{r.get('unit')!r} does not match the probe", PROBES[q][0])
        if not isinstance(r.get("source"), str) or not r["source"].strip():
            raise InputError(f"{w}.source", "missing", "where the number was published")
        rows.append(r)
    return rows


def is_figure(v) -> bool:
    """A number a reference may hold: between 1e-9 and 1e15 in its unit (choice: a smaller one
    makes the error infinite; the machine and cluster references alike)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 1e-9 <= v <= 1e15


# the micro-benchmarks a curve may name, by machine family (dma / rma need a Sunway DMA engine and
# RMA; mma needs tensor units, which a CPE has not)
CURVE_KERNELS = {"gpu": ("latency", "bandwidth", "mma", "wgmma", "tma", "dsmem", "gemm", "attention", "asm"),
                 "sunway": ("latency", "bandwidth", "gemm", "attention", "dma", "rma", "asm")}
CURVE_FIELDS = ("name", "source", "kernel", "params", "x", "unit", "clock_mhz", "call_overhead_us", "points",
                "overrides", "note")
# kernels whose figure is work over their launches' summed time, to which a call's own time can be added
CALL_OVERHEAD_KERNELS = ("gemm", "attention")


def _x_work(x, n: int = 1) -> float:
    """What must increase along a curve: x, or for a shape the product of its n entries (a
    number x for n swept params is the shape x, x, ...)."""
    w = 1.0
    for v in (x if isinstance(x, list) else [x] * n):
        w *= float(v)
    return w


def check_curve_head(c, i: int, where: str, fields, names: set) -> tuple[str, str]:
    """What every reference curve (a machine's or a cluster's) has: a mapping of known fields, a
    name unique in the file (added to ``names``) and a source. Returns the name and the prefix the
    curve's later messages use."""
    w = f"{where}: curves[{i}]"
    if not isinstance(c, dict):
        raise InputError(w, "not a mapping", ", ".join(fields))
    extra = set(c) - set(fields)
    if extra:
        raise InputError(w, f"unknown field {sorted(extra, key=str)[0]!r}", ", ".join(fields))
    name = c.get("name")
    if not isinstance(name, str) or not name.strip() or name in names:
        raise InputError(f"{w}.name", f"{name!r} is missing or repeated", "a name unique in the file")
    names.add(name)
    w = f"{where}: curve {name}"
    if not isinstance(c.get("source"), str) or not c["source"].strip():
        raise InputError(f"{w}.source", "missing", "where the curve was published or how it was measured")
    return name, w


def load_curves(path: Path, family: str | None = None) -> list[dict]:
    """The curves of a reference file, checked: every point's params parse for its kernel, x
    increases, each curve names its source. ``family``: the machine's, whose kernels it can run."""
    doc = _read_doc(path)
    where = str(path)
    curves, names = [], set()
    for i, c in enumerate(doc.get("curves") or []):
        name, w = check_curve_head(c, i, where, CURVE_FIELDS, names)
        k = c.get("kernel")
        if not isinstance(k, str) or k not in MP.PARAMS:
            raise InputError(f"{w}.kernel", f"{k!r} is not a micro-benchmark", ", ".join(MP.PARAMS))
        if family is not None and k not in CURVE_KERNELS[family]:
            raise InputError(f"{w}.kernel", f"a {family} machine cannot run micro {k}",
                             ", ".join(CURVE_KERNELS[family]))
        unit = MP.unit_of(k, c.get("params") if isinstance(c.get("params"), dict) else {})
        if c.get("unit") != unit:
            raise InputError(f"{w}.unit", f"{c.get('unit')!r} is not what micro {k} measures", unit)
        params = c.get("params") or {}
        if not isinstance(params, dict):
            raise InputError(f"{w}.params", "not a mapping", f"parameters of micro {k}: " + ", ".join(MP.PARAMS[k]))
        xs = c.get("x")
        xs = [xs] if isinstance(xs, str) else xs
        if not isinstance(xs, list) or not xs or any(not isinstance(x, str) or x not in MP.PARAMS[k] for x in xs):
            raise InputError(f"{w}.x", f"{c.get('x')!r} is not a parameter of micro {k}",
                             "one of " + ", ".join(MP.PARAMS[k]) + " (or a list of them)")
        clock = c.get("clock_mhz")
        if clock is not None and not is_figure(clock):
            raise InputError(f"{w}.clock_mhz", f"{clock!r} is not a clock", "MHz > 0")
        overhead = c.get("call_overhead_us")
        if overhead is not None:
            if k not in CALL_OVERHEAD_KERNELS:
                raise InputError(f"{w}.call_overhead_us", f"micro {k}'s figure is not work over its kernels' time",
                                 "a curve of micro " + " or ".join(CALL_OVERHEAD_KERNELS))
            if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 <= overhead < 1e6:
                raise InputError(f"{w}.call_overhead_us", f"{overhead!r} is not a time",
                                 "microseconds, 0 <= x < 1e6 (a measured call's time beyond its kernels)")
        overrides = c.get("overrides") or []
        if not isinstance(overrides, list) or any(
                not isinstance(o, dict) or set(o) != {"from_x", "params"} or not isinstance(o["params"], dict)
                or not (is_figure(o["from_x"]) or (isinstance(o["from_x"], list) and len(o["from_x"]) == len(xs)
                                                   and all(is_figure(v) for v in o["from_x"])))
                for o in overrides):
            raise InputError(f"{w}.overrides", "not a list of {from_x, params}",
                             "[{from_x: X, params: {...}}]: params for the points at x >= X")
        pts = c.get("points")
        if not isinstance(pts, list) or not pts:
            raise InputError(f"{w}.points", "missing or empty", "[[x, y], ...] or [[x, y, clock_mhz], ...]")
        out_pts, last = [], None
        for j, pt in enumerate(pts):
            pw = f"{w}.points[{j}]"
            if not isinstance(pt, list) or len(pt) not in (2, 3):
                raise InputError(pw, f"{pt!r} is not a point", "[x, y] or [x, y, clock_mhz]")
            x, y = pt[0], pt[1]
            xv = x if isinstance(x, list) else [x] * len(xs)
            if len(xv) != len(xs) or not all(is_figure(v) for v in xv):
                raise InputError(pw, f"x {x!r} does not fit x: {xs}", f"a number > 0, or {len(xs)} numbers > 0")
            if not is_figure(y):
                raise InputError(pw, f"y {y!r} is not a positive number", "a number > 0")
            pclock = pt[2] if len(pt) == 3 else clock
            if pclock is not None and not is_figure(pclock):
                raise InputError(pw, f"clock {pclock!r} is not a clock", "MHz > 0")
            if last is not None and _x_work(x, len(xs)) <= last:
                raise InputError(pw, f"x {x!r} does not increase", "points in increasing x (a shape: its product)")
            last = _x_work(x, len(xs))
            p = dict(params)
            for o in overrides:
                if _x_work(x, len(xs)) >= _x_work(o["from_x"], len(xs)):
                    p.update(o["params"])
            p.update(dict(zip(xs, xv)))
            try:
                p = MP.parse_params(k, p)
                if k == "asm":     # the kernel file must be there before anything runs
                    MP.asm_path(p["file"].replace("{n}", str(p["n"])))
            except InputError as e:
                raise InputError(f"{pw} ({e.where})", e.what, e.allowed) from None
            out_pts.append({"x": x, "reference": float(y), "clock_mhz": pclock, "params": p})
        curves.append({"name": name, "source": c["source"].strip(), "kernel": k, "x": xs, "unit": c["unit"],
                       "call_overhead_us": float(overhead or 0.0), "points": out_pts})
    return curves


def at_clock(machine, mhz: float | None):
    """The machine with its core clock at ``mhz`` and its DRAM clock unchanged (the fabric and L2
    follow the core clock, as the config's ratio says)."""
    if mhz is None or abs(mhz / 1000.0 - machine.clock_ghz) < 1e-9:
        return machine
    ghz = mhz / 1000.0
    ratios = machine.clock_ratios.model_copy(update={"memory": machine.clock_ratios.memory * machine.clock_ghz / ghz})
    return machine.model_copy(update={"clock_ghz": ghz, "clock_ratios": ratios})


def _err_pct(sim: float, ref: float) -> float:
    return (sim - ref) / ref * 100.0


def with_call_overhead(value: float, kernel_seconds: float, overhead_us: float) -> float:
    """A figure of work over ``kernel_seconds`` as the measurement saw it: over the kernels' time
    and the call's own ``overhead_us`` (a lone call timed between two CUDA events also holds its
    launch: the GPU waits from the first event for the host to submit the kernel)."""
    if overhead_us <= 0 or kernel_seconds <= 0:
        return value
    return value * kernel_seconds / (kernel_seconds + overhead_us * 1e-6)


def run_curve(machine, c: dict, progress=None) -> dict:
    """Every point of one curve on the model: the curve's kernel with the point's params, at the
    point's clock, and the call's own time (``call_overhead_us``) added to its kernels'."""
    from archsim import micro as MI

    pts = []
    overhead = c.get("call_overhead_us", 0.0)
    for p in c["points"]:
        m = at_clock(machine, p["clock_mhz"])
        res = MI.MicroResult(c["kernel"], p["params"], 0.0, c["unit"])
        kernels = float(MI.MICROS[c["kernel"]](m, p["params"], res))
        sim = with_call_overhead(kernels, sum(k["seconds"] for k in res.kernels), overhead)
        pts.append({"x": p["x"], "simulated": round(sim, 4), "reference": p["reference"],
                    "error_pct": round(_err_pct(sim, p["reference"]), 2), "clock_mhz": p["clock_mhz"]})
        if overhead > 0:
            pts[-1]["kernels_only"] = round(kernels, 4)
        if progress:
            progress(c, pts[-1])
    errs = [abs(x["error_pct"]) for x in pts]
    return {"name": c["name"], "kernel": c["kernel"], "x": c["x"], "unit": c["unit"], "source": c["source"],
            **({"call_overhead_us": overhead} if overhead > 0 else {}), "points": pts,
            "mape_pct": round(sum(errs) / len(errs), 2), "max_error_pct": round(max(errs), 2)}


def pick_curves(curves: list[dict], only, path: Path) -> list[dict]:
    """The curves whose name contains ``only`` (--curve; a text or a list of them, each of which
    must match a curve), in file order; a text that matches none is one input error."""
    texts = [only] if isinstance(only, str) else list(only)
    for t in texts:
        if not t.strip():      # "" is in every name: it would run them all
            raise InputError("--curve", "an empty text", "a part of a curve's name: "
                             + (", ".join(c["name"] for c in curves) or "(none)"))
        if not any(t in c["name"] for c in curves):
            raise InputError("--curve", f"no curve of {path.name} matches {t!r}",
                             ", ".join(c["name"] for c in curves) or "(none)")
    return [c for c in curves if any(t in c["name"] for t in texts)]


def validate(machine, reference: str | None = None, progress=None, curve_progress=None,
             only: str | list[str] | None = None) -> dict:
    """Rows and curves of the machine's reference file (or ``reference``) on the model. ``only``:
    run just the curves whose name contains it, or any text of a list (and no rows)."""
    from archsim import micro as MI

    path = reference_path(machine, reference)
    rows = load_reference(path)
    curves = load_curves(path, machine.family)
    fam = FAMILY_PROBES[machine.family]
    for i, r in enumerate(rows):
        if r["quantity"] not in fam:
            raise InputError(f"{reference or machine.name}: rows[{i}].quantity",
                             f"{r['quantity']!r} is not a probe of the {machine.family} family", ", ".join(fam))
    if only is not None:
        rows = []
        curves = pick_curves(curves, only, path)
    out_rows = []
    t0 = time.perf_counter()
    for r in rows:
        unit, probe = PROBES[r["quantity"]]
        res = MI.MicroResult(r["quantity"], {}, 0.0, unit)
        sim = float(probe(machine, res))
        err = _err_pct(sim, r["value"])
        out_rows.append({"quantity": r["quantity"], "simulated": round(sim, 4), "reference": r["value"],
                         "unit": unit, "error_pct": round(err, 2), "source": r["source"]})
        if progress:
            progress(out_rows[-1])
    out_curves = [run_curve(machine, c, curve_progress) for c in curves]
    errs = [abs(x["error_pct"]) for x in out_rows] + [abs(p["error_pct"]) for c in out_curves for p in c["points"]]
    mape = sum(errs) / len(errs) if errs else 0.0
    return {"schema": SCHEMA, "machine": machine.name, "rows": out_rows, "curves": out_curves,
            "mape_pct": round(mape, 2), "max_error_pct": round(max(errs), 2) if errs else 0.0,
            "wall_seconds": round(time.perf_counter() - t0, 2)}


def format_x(x) -> str:
    return "x".join(f"{v:g}" for v in x) if isinstance(x, list) else f"{x:g}"


def format_point(c: dict, p: dict) -> str:
    return (f"  {c['name']:<26} {format_x(p['x']):>18} {p['simulated']:>10.4g} {p['reference']:>10.4g} "
            f"{c['unit']:<8} {p['error_pct']:>+7.1f}%")


def format_curve(c: dict) -> str:
    return f"{c['name']:<28} {len(c['points']):>3} points  MAPE {c['mape_pct']:>5.1f}%  worst {c['max_error_pct']:>5.1f}%"


def format_row(r: dict) -> str:
    return (f"{r['quantity']:<20} {r['simulated']:>12.4g} {r['reference']:>12.4g} {r['unit']:<15} "
            f"{r['error_pct']:>+8.1f}%")


HEADER = f"{'quantity':<20} {'simulated':>12} {'reference':>12} {'unit':<15} {'error':>9}"
