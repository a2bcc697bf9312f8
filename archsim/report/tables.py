"""Terminal tables for `archsim run` and `archsim compare` (plain text, fixed-width columns).

Bottleneck of a kernel (compare): the resource closest to its peak, as a share of that peak:
compute (achieved TFLOP/s / the machine's peak for the workload's dtype), memory (achieved DRAM
GB/s / peak DRAM bandwidth), fabric (the busiest link's utilization). When none reaches half of
its peak the kernel is bound by latency (dependent memory accesses, too few warps, launch ramp).
"""

from __future__ import annotations

LATENCY_BELOW = 0.5


def _peak(result: dict, dtype: str) -> float:
    p = result["machine"].get("peak_tflops", {})
    return float(p.get(dtype, p.get("fp32", 0.0)) or 0.0)


def utilizations(kernel: dict, result: dict) -> dict:
    dtype = result["workload"].get("dtype", "fp16")
    peak = _peak(result, dtype)
    dram_peak = float(result["machine"].get("peak_dram_gbps", 0.0) or 0.0)
    return {"compute": kernel["tflops"] / peak if peak else 0.0,
            "memory": kernel["bandwidth_gbps"].get("dram", 0.0) / dram_peak if dram_peak else 0.0,
            "fabric": float(kernel.get("fabric", {}).get("link_util_max", 0.0))}


def bottleneck(kernel: dict, result: dict) -> str:
    u = utilizations(kernel, result)
    name = max(u, key=u.get)
    return name if u[name] >= LATENCY_BELOW else "latency"


def top_stall(kernel: dict) -> str:
    st = {k: v for k, v in kernel.get("stalls", {}).items() if k != "issued"}
    if not st:
        return "-"
    k = max(st, key=st.get)
    return f"{k} {st[k] * 100:.0f}%"


def _us(sec: float) -> str:
    us = sec * 1e6
    return f"{us:,.1f}" if us < 1e5 else f"{us:,.0f}"


def _placement(w: dict) -> str:
    """', private placement' when the tensors sat in each core group's own segment (cross, the
    default and a GPU's only layout, goes unsaid)."""
    return ", private placement" if w.get("placement") == "private" else ""


def sample_cell(k: dict) -> str:
    """A kernel's sampling in a table: its error estimate when sampled ("!" past the threshold
    it was held to), "whole*" when heads above the threshold made it simulate the whole launch,
    "-" when it was simulated whole from the start."""
    if k.get("sampled"):
        over = k["sample_error_est"] > k.get("sample_max_error", 1.0)
        return f"{k['sample_error_est'] * 100:.1f}%" + ("!" if over else "")
    return "whole*" if k.get("sample_method") == "whole_after_fallback" else "-"


def run_table(result: dict) -> str:
    """kernel, count, cycles, time, TFLOP/s, DRAM GB/s, (with --scale: the model it ran on,)
    top stall; then the total."""
    w = result["workload"]
    scaled = any("scale" in k for k in result["kernels"])
    lines = [f"{w['name']} {w['phase']} (batch {w['batch']}, seq {w['seq']}, {w['layers']} layers, {w['dtype']}, "
             f"{w['attention']} attention{_placement(w)}) on {result['machine']['name']}",
             f"{'kernel':<22} {'count':>5} {'cycles':>11} {'time us':>11} {'TFLOP/s':>8} {'DRAM GB/s':>10} "
             f"{'sampled':>8}" + (f" {'model':>6}" if scaled else "") + "  top stall"]
    for k in result["kernels"]:
        samp = sample_cell(k)
        model = (f" {'1/' + str(k['scale']) if k.get('scale', 1) > 1 else 'whole':>6}" if scaled else "")
        lines.append(f"{k['name']:<22} {k['count']:>5} {k['cycles']:>11,} {_us(k['seconds']):>11} {k['tflops']:>8.1f} "
                     f"{k['bandwidth_gbps'].get('dram', 0.0):>10.1f} {samp:>8}{model}  {top_stall(k)}")
    t = result["total"]
    lines.append(f"{'total':<22} {'':>5} {t['cycles']:>11,} {_us(t['seconds']):>11} {t['tflops']:>8.1f}")
    sim = result.get("sim", {})
    if sim:
        lines.append(sim_line(sim) + "; time per kernel is per launch, the total counts every launch")
    return "\n".join(lines)


def sim_line(sim: dict) -> str:
    """How long the run took and where: compiling the engine, setting launches up, simulating
    (seconds summed over worker processes), and the rate of the simulation itself."""
    text = f"simulated in {sim['wall_seconds']:.1f} s"
    if "simulate_seconds" not in sim:
        return text + f" ({sim['warp_instructions_per_second']:,.0f} warp-instructions/s)"
    workers = sim.get("kernel_cache", {}).get("workers", 1)
    parts = [f"compile {sim['compile_seconds']:.1f} s"] if sim["compile_seconds"] >= 0.05 else []
    parts += [f"set-up {sim['setup_seconds']:.1f} s", f"simulation {sim['simulate_seconds']:.1f} s"
              + (f" over {workers} workers" if workers > 1 else "")]
    rate = sim["warp_instructions_per_second"]
    return text + f" ({', '.join(parts)}" + (f"; {rate:,.0f} warp-instructions/s simulated)" if rate else ")")


def compare_table(results: list[dict]) -> str:
    """Kernel by kernel and in total: per machine the time of all its launches, TFLOP/s, share of
    the machine's peak for the workload's dtype, and the bottleneck."""
    names = []
    for r in results:
        for k in r["kernels"]:
            if k["name"] not in names:
                names.append(k["name"])
    w = results[0]["workload"]
    head = f"{'kernel':<22}"
    for r in results:
        m = r["machine"]["name"]
        head += f" | {m + ' time us':>16} {'TFLOP/s':>8} {'peak':>6} {'bound':>8}"
    placed = "".join(f", {r['machine']['name']}: {r['workload']['placement']} placement" for r in results
                     if r["workload"].get("placement_requested") or r["workload"].get("placement") == "private")
    lines = [f"{w['name']} {w['phase']} (batch {w['batch']}, seq {w['seq']}, {w['layers']} layers, {w['dtype']}"
             f"{placed})", head]
    for n in names:
        row = f"{n:<22}"
        for r in results:
            k = next((k for k in r["kernels"] if k["name"] == n), None)
            if k is None:
                row += f" | {'-':>16} {'':>8} {'':>6} {'':>8}"
                continue
            share = k["tflops"] / _peak(r, w["dtype"]) if _peak(r, w["dtype"]) else 0.0
            row += (f" | {_us(k['seconds'] * k['count']):>16} {k['tflops']:>8.1f} {share * 100:>5.1f}% "
                    f"{bottleneck(k, r):>8}")
        lines.append(row)
    row = f"{'total':<22}"
    for r in results:
        t = r["total"]
        share = t["tflops"] / _peak(r, w["dtype"]) if _peak(r, w["dtype"]) else 0.0
        # the total's bottleneck: the one that holds the most time
        by = {}
        for k in r["kernels"]:
            b = bottleneck(k, r)
            by[b] = by.get(b, 0.0) + k["seconds"] * k["count"]
        row += f" | {_us(t['seconds']):>16} {t['tflops']:>8.1f} {share * 100:>5.1f}% {max(by, key=by.get) if by else '-':>8}"
    lines.append(row)
    return "\n".join(lines)


def functional_table(result: dict) -> str:
    """`run --mode functional`: per kernel its op's check against numpy, then the whole block."""
    w = result["workload"]
    lines = [f"{w['name']} {w['phase']} (batch {w['batch']}, seq {w['seq']}, {w['dtype']}) on "
             f"{result['machine']['name']}, functional: outputs against float64 numpy",
             f"{'kernel':<22} {'grid':>14} {'warp-instr':>11} {'max abs err':>12} {'max rel err':>12}  check"]
    for k in result["kernels"]:
        v = k["verification"]
        grid = "x".join(str(g) for g in k["grid"])
        lines.append(f"{k['name']:<22} {grid:>14} {k['warp_instructions']:>11,} {v['max_abs_err']:>12.3g} "
                     f"{v['max_rel_err']:>12.3g}  {'ok' if v['passed'] else 'FAILED'}")
    b = result["block_verification"]
    lines.append(f"{'block output':<22} {'':>14} {'':>11} {b['max_abs_err']:>12.3g} {b['max_rel_err']:>12.3g}  "
                 f"{'ok' if b['passed'] else 'FAILED'} ({', '.join(b['tensors'])} against a float64 pass of the block)")
    return "\n".join(lines)
