"""Measure the scale model's error (archsim.scale_model) against the whole machine, per kernel.

Each distinct kernel of the given workloads is timed on the whole machine and on its 1/N scale
model (both sampled as `archsim run` samples them, through the kernel cache), and the relative
error of the scale model's cycles is written per kernel and, as the largest per kernel kind, to
configs/reference/scale/<machine>.yaml, which `--scale N` reads (a kind above 3 % is timed whole).
A workload already in the file at that scale is measured again and replaced.

    python scripts/scale_check.py a100 5 gpt2-small:prefill gpt3-175b:prefill [--workers 2]
    python scripts/scale_check.py sw26010pro 6 gpt2-small:prefill:private
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import yaml


def measure(hw: str, scale: int, jobs: list[str], workers: int) -> list[dict]:
    from archsim.config.load import load_machine
    from archsim.runner import distinct_kernels, emit_block, placement_for, timing_args
    from archsim.sample import sampled_record
    from archsim.scale_model import cut_refusal, kernel_kinds, scaled_record
    from archsim.workers import Pool
    from archsim.workloads.model import load_workload

    machine = load_machine(hw)
    rows = []
    for job in jobs:
        name, phase, placement = (job.split(":") + ["", ""])[:3]
        over = {k: v for k, v in (("phase", phase), ("placement", placement)) if v}
        wl = load_workload(name, over or None)
        kernels = [k for k, _ in distinct_kernels(emit_block(machine, wl))]
        kinds = kernel_kinds(wl, kernels)
        placement = placement_for(machine, wl)
        pool = Pool(min(workers, 2 * len(kernels)))
        try:
            futs = []
            for k in kernels:
                args = timing_args(machine, k.params, placement)
                full = pool.submit(sampled_record, k.name, k.program, machine, k.launch, args, flops=k.flops,
                                   placement=placement, label=f"{k.name} whole")
                small = pool.submit(scaled_record, k.name, k.program, machine, k.launch, args, flops=k.flops,
                                    placement=placement, scale=scale, kind=kinds[k.name], check=False,
                                    label=f"{k.name} at 1/{scale}")
                futs.append((k, full, small))
            for k, full, small in futs:
                f, s = full.result(), small.result()
                err = (s["cycles"] - f["cycles"]) / f["cycles"]
                why = cut_refusal(k.program, machine, k.launch, timing_args(machine, k.params, placement), scale,
                                  placement)
                row = {"workload": job, "kernel": k.name, "kind": kinds[k.name], "blocks": k.launch.blocks,
                       "scale_blocks": s["scale_blocks"], "cycles": f["cycles"], "scaled_cycles": s["cycles"],
                       "error": round(err, 5), "warp_instructions": [f["simulated_warp_instructions"],
                                                                     s["simulated_warp_instructions"]]}
                if why:
                    row["refused"] = why         # never scaled at run time: not in its kind's error
                rows.append(row)
                print(f"{job:<24} {k.name:<22} {kinds[k.name]:<11} {f['cycles']:>12,} {s['cycles']:>12,} "
                      f"{err:+8.2%}  warp-instr {f['simulated_warp_instructions']:>13,} -> "
                      f"{s['simulated_warp_instructions']:>13,}" + (f"  (refused: {why})" if why else ""), flush=True)
        finally:
            pool.close()
    return rows


def write(hw: str, scale: int, jobs: list[str], rows: list[dict]) -> Path:
    from archsim.scale_model import table_path

    path = table_path(hw)
    doc = yaml.safe_load(path.read_text()) if path.is_file() else None
    doc = doc or {"machine": hw, "measured_by": "scripts/scale_check.py", "scales": {}}
    entry = doc["scales"].setdefault(scale, {})
    kernels = [r for r in entry.get("kernels", []) if r["workload"] not in jobs] + rows
    kinds: dict = {}
    seen = set()
    for r in kernels:
        same = (r["kernel"], r["blocks"], r["cycles"], r["scaled_cycles"])   # a kernel two phases share
        if "refused" in r or same in seen:
            continue
        seen.add(same)
        k = kinds.setdefault(r["kind"], {"max_error": 0.0, "kernels": 0})
        k["max_error"] = round(max(k["max_error"], abs(r["error"])), 5)
        k["kernels"] += 1
    doc["scales"][scale] = {**{k: kinds[k] for k in sorted(kinds)}, "date": datetime.date.today().isoformat(),
                            "kernels": kernels}
    path.parent.mkdir(parents=True, exist_ok=True)
    head = (f"# {hw} scale models against the whole machine: per kernel kind the largest |error| of the cycles\n"
            "# over the kernels measured below (scripts/scale_check.py; `--scale N` times a kind whole above 3 %)\n")
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("hw")
    ap.add_argument("scale", type=int)
    ap.add_argument("jobs", nargs="+", metavar="WORKLOAD[:PHASE[:PLACEMENT]]")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    rows = measure(a.hw, a.scale, a.jobs, a.workers)
    print(write(a.hw, a.scale, a.jobs, rows))


if __name__ == "__main__":
    main()
