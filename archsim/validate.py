"""`archsim validate`: the machine model against published single-number figures.

configs/reference/<machine>.yaml lists rows (quantity, value, unit, source). Each quantity has a
probe here: a micro-benchmark kernel run on the timing model (micro.py). The report gives the
simulated value, the reference, the error in percent, and the mean absolute percentage error.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from archsim import micro as MI
from archsim.errors import InputError
from archsim.paths import data_dir

SCHEMA = "archsim.validate/1"


def _l1_kib(machine) -> int:
    return machine.l1.size_kib if machine.l1 is not None else 0


def _chase(machine, out, **p) -> float:
    return MI.micro_latency(machine, MI.parse_params("latency", p), out)


def p_ffma_latency(machine, out):
    return MI.ffma_latency(machine, out)


def p_shared_latency(machine, out):
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
    return MI.l1_bandwidth(machine, out)


def p_l2_bandwidth(machine, out):
    return MI.l2_bandwidth(machine, out)


def p_dram_stream_share(machine, out):
    MI.micro_bandwidth(machine, MI.parse_params("bandwidth", {"kind": "read", "footprint_mib": 64}), out)
    return out.extra["share_of_peak"]


def p_mma_fp16_tflops(machine, out):
    return MI.micro_mma(machine, MI.parse_params("mma", {"dtype": "fp16"}), out)


# Sunway (SW26010-Pro): DMA start-up and streaming of one CPE, one core group's DMA peak, the CPEs'
# vector FMA peak (archsim.micro's Sunway probes)
def p_dma_get_startup(machine, out):
    return MI.dma_startup(machine, out, "get")


def p_dma_put_startup(machine, out):
    return MI.dma_startup(machine, out, "put")


def p_dma_get_stream(machine, out):
    return MI.dma_stream_rate(machine, out, "get")


def p_dma_put_stream(machine, out):
    return MI.dma_stream_rate(machine, out, "put")


def p_dma_group_gbps(machine, out):
    return MI.dma_group_gbps(machine, out)


def p_vector_fp16_tflops(machine, out):
    return MI.vector_fma_tflops(machine, out, "f16x2")


def p_vector_fp32_tflops(machine, out):
    return MI.vector_fma_tflops(machine, out, "f32")


def p_rma_latency_cluster(machine, out):
    """8-B blocking RMA put between two CPEs of one cluster (CPE 0 -> CPE 1), cycles."""
    return MI.micro_rma(machine, MI.parse_params("rma", {"src": 0, "dst": 1, "size_bytes": 8}), out)


def p_rma_latency_corner(machine, out):
    """8-B blocking RMA put from the first CPE of a core group to the last (corner to corner)."""
    last = machine.cores.per_group - 1
    return MI.micro_rma(machine, MI.parse_params("rma", {"src": 0, "dst": last, "size_bytes": 8}), out)


def p_rma_bandwidth(machine, out):
    """Point-to-point RMA streaming, B/cycle: d(bytes) / d(cycles) between one blocking put of 16
    and one of 32 KiB to the neighbouring cluster (the start-up and the last trip cancel)."""
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


def load_reference(path: Path) -> list[dict]:
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"{where}:{mark.line + 1}" if mark else where, "not valid YAML", "a YAML mapping") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise InputError(where, "no `rows:` list", "machine: NAME and rows: [{quantity, value, unit, source}]")
    rows = []
    for i, r in enumerate(doc["rows"]):
        w = f"{where}: rows[{i}]"
        if not isinstance(r, dict):
            raise InputError(w, "not a mapping", "quantity, value, unit, source")
        extra = set(r) - {"quantity", "value", "unit", "source"}
        if extra:
            raise InputError(w, f"unknown field {sorted(extra)[0]!r}", "quantity, value, unit, source")
        q = r.get("quantity")
        if q not in PROBES:
            raise InputError(f"{w}.quantity", f"{q!r} has no probe", ", ".join(PROBES))
        v = r.get("value")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise InputError(f"{w}.value", f"{v!r} is not a positive number", "a number > 0")
        if r.get("unit") != PROBES[q][0]:
            raise InputError(f"{w}.unit", f"{r.get('unit')!r} does not match the probe", PROBES[q][0])
        if not isinstance(r.get("source"), str) or not r["source"].strip():
            raise InputError(f"{w}.source", "missing", "where the number was published")
        rows.append(r)
    return rows


def validate(machine, reference: str | None = None, progress=None) -> dict:
    rows = load_reference(reference_path(machine, reference))
    fam = FAMILY_PROBES[machine.family]
    for i, r in enumerate(rows):
        if r["quantity"] not in fam:
            raise InputError(f"{reference or machine.name}: rows[{i}].quantity",
                             f"{r['quantity']!r} is not a probe of the {machine.family} family", ", ".join(fam))
    out_rows = []
    t0 = time.perf_counter()
    for r in rows:
        unit, probe = PROBES[r["quantity"]]
        res = MI.MicroResult(r["quantity"], {}, 0.0, unit)
        sim = float(probe(machine, res))
        err = (sim - r["value"]) / r["value"] * 100.0
        out_rows.append({"quantity": r["quantity"], "simulated": round(sim, 4), "reference": r["value"],
                         "unit": unit, "error_pct": round(err, 2), "source": r["source"]})
        if progress:
            progress(out_rows[-1])
    mape = sum(abs(x["error_pct"]) for x in out_rows) / len(out_rows) if out_rows else 0.0
    return {"schema": SCHEMA, "machine": machine.name, "rows": out_rows, "mape_pct": round(mape, 2),
            "wall_seconds": round(time.perf_counter() - t0, 2)}


def format_row(r: dict) -> str:
    return (f"{r['quantity']:<20} {r['simulated']:>12.4g} {r['reference']:>12.4g} {r['unit']:<15} "
            f"{r['error_pct']:>+8.1f}%")


HEADER = f"{'quantity':<20} {'simulated':>12} {'reference':>12} {'unit':<15} {'error':>9}"
