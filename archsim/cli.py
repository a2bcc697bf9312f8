"""The ``archsim`` command line (docs/commands.md).

Exit status: 0 done; 1 a functional verification failed; 2 bad input (one line on stderr:
``archsim: error: <where>: <what> (<allowed>)``, never a traceback); 3 the simulation could not
finish.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from archsim.version import __version__
from archsim.errors import ArchsimError, InputError, SimulationError, Terminated
from archsim.report import jsonfmt
from archsim.resources import DEFAULT_MAX_INSTRUCTIONS, check_asm_args

COMMANDS_HELP = ("asm: assemble, check and run a kernel functionally; show-config: print a resolved machine; "
                 "micro: a micro-benchmark on the timing model; validate: model vs published figures; "
                 "bench: simulator speed")


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad command lines as one archsim error line (exit 2)."""

    def error(self, message):  # noqa: D401 - argparse API
        raise InputError("command line", message, f"see `{self.prog} --help`")


class _Once(argparse.Action):
    """An option that may be given once (a second one would silently replace the first)."""

    def __call__(self, parser, ns, values, option_string=None):
        if getattr(ns, self.dest, None) is not None:
            raise InputError(option_string, f"given twice ({getattr(ns, self.dest)!r}, then {values!r})",
                             f"one {option_string}")
        setattr(ns, self.dest, values)


def _dims(text: str, option: str) -> tuple[int, int, int]:
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        vals = []
    if not 1 <= len(vals) <= 3 or any(v <= 0 for v in vals):
        raise InputError(option, f"bad value {text!r}", "X[,Y,Z] with positive integers")
    return tuple(vals + [1] * (3 - len(vals)))


def _add_machine_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--hw", required=required, help="machine: a YAML path or a built-in name (a100, h100, sw26010pro, "
                                               "tiny-gpu, tiny-sunway)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE",
                   help="override one config value (dotted path), repeatable")
    p.add_argument("--overlay", dest="overlays", action="append", default=[], metavar="FILE",
                   help="apply an overlay YAML (path or built-in name), repeatable")


def _add_cache_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cache", metavar="DIR", help="the kernel timing cache (default: $ARCHSIM_CACHE_DIR, else "
                                                  "~/.cache/archsim/kernels): identical launches are simulated once")
    g.add_argument("--no-cache", action="store_true", help="simulate every launch, reading and writing no cache")


def _add_workers_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, metavar="N", help="processes the distinct kernels (and plan's steps) are "
                                                            "simulated on (default: the cores available; 1: this "
                                                            "process); results are identical")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="archsim", description="archsim: a cycle-level accelerator architecture simulator")
    parser.add_argument("--version", action="version", version=f"archsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("asm", help="assemble, check and run a kernel functionally; print what it wrote")
    p.add_argument("file", metavar="FILE.s", help="an assembly file, or the name of a built-in example "
                                                 "(isa/examples/NAME.s)")
    _add_machine_options(p)
    p.add_argument("--grid", help="grid X[,Y,Z] (default: the file's .launch)")
    p.add_argument("--block", help="block X[,Y,Z] (default: the file's .launch)")
    p.add_argument("--engine", choices=("numba", "reference"), default="numba",
                   help="functional interpreter: the numba engine or its slow pure-Python twin")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--disassemble", action="store_true", help="print the assembled program first")
    p.add_argument("--timing", action="store_true",
                   help="time the kernel on the machine's cycle model instead (--json: archsim.result/1)")
    p.add_argument("--max-cycles", type=int, default=10**9, metavar="N",
                   help="with --timing: stop after N core cycles (exit 3, partial result)")
    p.add_argument("--max-instructions", type=int, metavar="N",
                   help="functional: stop after N warp-instructions (exit 3; default 2e8, the reference "
                        "engine 1e7)")
    p.add_argument("--sample", action="store_true",
                   help="with --timing: time a launch of many waves from a few of them, extrapolated, as "
                        "`archsim run` does (default: every block)")
    p.add_argument("--sample-interval", action="store_true",
                   help="with --timing --sample: a launch of one wave is extrapolated from an interval of it when "
                        "its work is steady (default: simulated whole)")
    _add_cache_options(p)

    p = sub.add_parser("show-config", help="print a resolved machine or cluster with derived figures")
    p.add_argument("hw", metavar="HW|CLUSTER", help="a YAML path or a built-in machine or cluster name")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE")
    p.add_argument("--overlay", dest="overlays", action="append", default=[], metavar="FILE")
    p.add_argument("--json", metavar="FILE", help="write the resolved machine and derived figures as JSON")

    from archsim.micro_params import PARAMS

    p = sub.add_parser("micro", help="run a micro-benchmark (a real ISA program) on the timing model")
    p.add_argument("name", metavar="NAME", help="one of: " + ", ".join(PARAMS))
    _add_machine_options(p)
    p.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=VALUE",
                   help="a benchmark parameter, repeatable (see docs/commands.md)")
    p.add_argument("--max-cycles", type=int, default=10**9, metavar="N",
                   help="stop a launch after N core cycles (exit 3, partial result)")
    p.add_argument("--json", metavar="FILE", help="write the archsim.micro/1 result")
    p.add_argument("--out", metavar="DIR", help="write micro.json, the plots (PNG) and report.html there")
    _add_cache_options(p)
    _add_workers_option(p)

    p = sub.add_parser("validate", help="simulated vs published figures (configs/reference/<machine>.yaml)")
    _add_machine_options(p, required=False)
    p.add_argument("--cluster", metavar="CLUSTER", help="validate a cluster instead: its collectives and "
                                                       "training steps (configs/reference/clusters/<cluster>.yaml)")
    p.add_argument("--reference", metavar="FILE", help="a reference YAML (default: the machine's built-in one)")
    p.add_argument("--json", metavar="FILE", help="write the archsim.validate/1 result")
    p.add_argument("--plot", metavar="FILE", default="validate.png",
                   help="simulated against measured, log-log (default validate.png; 'none' writes no plot)")
    p.add_argument("--curve", metavar="TEXT", action="append",
                   help="run only the curves whose name contains TEXT (no rows), repeatable")
    _add_cache_options(p)
    p.add_argument("--workers", type=int, metavar="N", help="with --cluster: processes the step curves' kernels are "
                                                            "timed on (default: the cores available; 1: this process)")

    for name, helptext in (("run", "run a workload (decoder blocks of a model) on a machine"),
                           ("compare", "the same workload on several machines, kernel by kernel"),
                           ("plan", "the parallel plans of a model that fit a cluster, ranked by simulated step")):
        p = sub.add_parser(name, help=helptext)
        if name == "plan":
            p.add_argument("--cluster", required=True, metavar="CLUSTER", help="a cluster (YAML path or built-in "
                                                                                "name)")
            p.add_argument("--gbs", type=int, metavar="N", help="global batch in sequences (default: the workload's "
                                                                "batch x the cluster's devices)")
            p.add_argument("--top", type=int, default=10, metavar="N", help="plans to print (default 10)")
        elif name == "run":
            _add_machine_options(p, required=False)
            p.add_argument("--cluster", metavar="CLUSTER", action=_Once,
                           help="a training step on a cluster (YAML path or built-in name) instead of one machine; "
                                "needs --plan")
            p.add_argument("--plan", metavar="PLAN", action=_Once, help="with --cluster: tp=T,pp=P,dp=D[,mb=M,gbs=G,"
                                                         "schedule=gpipe|1f1b|interleaved:V,"
                                                         "recompute=none|selective|full,zero=0..3,sp=on|off,"
                                                         "ep=E,order=tp-dp-pp,grad_reduce=overlap|after,"
                                                         "p2p=wait|overlap,tp_async=on|off]")
        else:
            p.add_argument("--hw", action="append", metavar="HW",
                           help="a machine (YAML path or built-in name); give two or more")
            p.add_argument("--cluster", action="append", metavar="CLUSTER",
                           help="instead of machines: a cluster (YAML path or built-in name); give two or more, "
                                "with --plan")
            p.add_argument("--plan", action="append", metavar="PLAN",
                           help="with --cluster: one plan for every cluster, or one per cluster in their order")
            p.add_argument("--set", dest="sets", action="append", default=[], metavar="PATH=VALUE",
                           help="override one config value of every machine (dotted path), repeatable")
            p.add_argument("--overlay", dest="overlays", action="append", default=[], metavar="FILE",
                           help="apply an overlay YAML to every machine, repeatable")
        p.add_argument("--workload", required=True, metavar="WL",
                       help="a workload YAML or a built-in name (gpt2-small, llama2-7b, gpt3-175b, bloom-176b, tiny)")
        p.add_argument("--phase", help="train | prefill | decode (default: the workload's scenario)")
        p.add_argument("--batch", help="micro-batch size")
        p.add_argument("--seq", help="sequence length (decode: tokens in the KV cache)")
        p.add_argument("--layers", help="decoder blocks")
        p.add_argument("--dtype", help="fp16 | bf16 | fp32")
        p.add_argument("--attention", help="fused | unfused")
        p.add_argument("--causal", help="true | false")
        p.add_argument("--placement", help="cross | private: tensors in the segment interleaved over every memory "
                                           "controller, or in each core group's own segment (Sunway; GPUs have "
                                           "only cross)")
        p.add_argument("--tp", dest="tensor_parallel", metavar="N",
                       help="one device's share of a block split over N devices by tensor parallelism (heads and "
                            "FFN columns; the all-reduces are left out)")
        p.add_argument("--ep", dest="expert_parallel", metavar="N",
                       help="one device's share of a mixture-of-experts block split over N devices by expert "
                            "parallelism (its experts over the group's slots; the all-to-alls are left out)")
        p.add_argument("--mode", choices=("timing", "functional"), default="timing",
                       help="timing (cycle model) or functional (real values, checked against numpy; small shapes)")
        p.add_argument("--no-sample", action="store_true", help="simulate every thread block of big launches "
                                                                "(default: a few waves, extrapolated)")
        p.add_argument("--sample-interval", action="store_true",
                       help="extrapolate a long one-wave launch from an interval of it when its work is steady, "
                            "within --sample-max-error (default: one-wave launches are simulated whole)")
        p.add_argument("--sample-k-loop", action="store_true",
                       help="time a GEMM whose blocks loop over at least 64 k tiles from its loop cut to n, 2n and 4n "
                            "tiles (n = 8, or 4 below 128), carried to its length, within --sample-max-error "
                            "(Sunway GEMMs and one-wave GPU GEMMs; default: the whole loop)")
        p.add_argument("--sample-waves", type=int, default=6, metavar="N",
                       help="waves simulated before a big launch is extrapolated (>= 3; default 6)")
        p.add_argument("--sample-max-error", default="3%", metavar="E",
                       help="largest error estimate a sampled launch may have before more of it is simulated "
                            "(a fraction or a percentage: 0.03, 3%%; default 3%%)")
        p.add_argument("--max-cycles", type=int, default=10**9, metavar="N",
                       help="stop a launch after N core cycles (exit 3, partial result)")
        p.add_argument("--scale", type=int, default=1, metavar="N",
                       help="time each kernel on a 1/N scale model of the machine (a GPU's SMs, L2 slices and "
                            "DRAM channels, or a Sunway's core groups, cut by N; as many waves of the grid's first "
                            "blocks) and read it back, for kernel kinds whose measured error at N is within 3%% "
                            "(docs/scale-models.md); default 1, the whole machine")
        p.add_argument("--max-instructions", type=int, default=DEFAULT_MAX_INSTRUCTIONS, metavar="N",
                       help="refuse a job that simulates more than N warp-instructions, estimated from its flops "
                            "before it starts (default 1e11)")
        p.add_argument("--out", metavar="DIR", help="write result.json and plots (PNG) there")
        p.add_argument("--trace", action="store_true", help="with --out: also trace.json (Perfetto / Chrome trace)")
        p.add_argument("--json", metavar="FILE", help="write the result JSON")
        _add_cache_options(p)
        _add_workers_option(p)

    p = sub.add_parser("sweep", help="a grid of runs from a spec (hw, workload, vary: dotted paths -> lists) on a "
                                     "process pool or a Dask cluster; results.parquet and runs/<key>.json")
    p.add_argument("spec", metavar="SPEC.yaml", help="the sweep spec (README: Sweeps)")
    p.add_argument("--out", required=True, metavar="DIR", help="results.parquet, sweep.json and runs/<key>.json; "
                                                               "finished keys there are skipped")
    p.add_argument("--workers", type=int, metavar="N", help="local worker processes (default 1: in this process; a "
                                                            "cluster sweep: the processes each point's kernels are "
                                                            "timed on, default the cores available)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on the Dask cluster at ADDRESS (dask.distributed)")
    _add_cache_options(p)

    p = sub.add_parser("cache", help="the kernel timing cache: where it is, its size; clear it")
    p.add_argument("action", choices=("info", "clear"), metavar="info|clear")
    p.add_argument("--cache", metavar="DIR", help="a cache directory (default: $ARCHSIM_CACHE_DIR, else "
                                                  "~/.cache/archsim/kernels)")

    p = sub.add_parser("plot", help="plots (PNG) of a result.json / compare.json, a run's --out directory or a "
                                    "sweep's directory")
    p.add_argument("path", metavar="RESULT.json|DIR")
    p.add_argument("--out", metavar="DIR", help="where to write the plots (default: beside the result)")
    p.add_argument("--kernel", metavar="NAME", help="the kernel topology.png shows (default: the busiest)")

    p = sub.add_parser("bench", help="simulator speed: warp-instructions per second on fixed cases")
    p.add_argument("--repeat", type=int, default=3, metavar="N",
                   help="timed runs of each case; its figures are its median run's (default 3)")
    p.add_argument("--json", metavar="FILE", help="write the archsim.bench/1 result")
    p.add_argument("--jobs", action="store_true",
                   help="also whole jobs (a compare, full-size models; minutes to hours), each in one process "
                        "and on --workers processes")
    p.add_argument("--job", action="append", metavar="NAME", help="only this job (implies --jobs), repeatable")
    p.add_argument("--profile", action="store_true",
                   help="per case, the engine's nanoseconds per warp-instruction beside the host's minimal "
                        "loop, and per unit family the units looked at per cycle and the share that changed "
                        "nothing")
    _add_workers_option(p)
    return parser


# ----------------------------------------------------------------------------- commands
def _load_kernel(name: str):
    from archsim.isa.asm import assemble_file
    from archsim.paths import isa_kernel, isa_kernel_names

    path = Path(name)
    if not path.exists() and not name.endswith(".s"):
        builtin = isa_kernel("examples", name)
        if builtin is not None:
            return assemble_file(builtin), name
        raise InputError(name, "no such file or built-in example",
                         "a .s path or one of: " + ", ".join(isa_kernel_names("examples")))
    return assemble_file(path), None


def _summary(arr: np.ndarray, dtype: str) -> dict:
    from archsim.engine.launch import bf16_bits_to_f32

    vals = bf16_bits_to_f32(arr) if dtype == "bf16" else arr
    flat = np.asarray(vals, dtype=np.float64).ravel()
    return {"dtype": dtype, "shape": list(arr.shape), "sum": float(np.sum(flat)),
            "min": float(np.min(flat)) if flat.size else 0.0, "max": float(np.max(flat)) if flat.size else 0.0,
            "head": [float(v) for v in flat[:8]]}


def cmd_asm(a) -> int:
    from archsim.config.derived import capabilities
    from archsim.config.load import load_machine
    from archsim.engine.launch import default_args, resolve_launch
    from archsim.isa.asm import disassemble
    from archsim.isa.check import check
    from archsim.isa.program import Launch

    machine = load_machine(a.hw, a.overlays, a.sets)
    caps = capabilities(machine)
    prog, example = _load_kernel(a.file)
    check(prog, caps)
    launch = resolve_launch(prog, None) if (a.grid is None or a.block is None) and prog.launch else None
    grid = _dims(a.grid, "--grid") if a.grid else (launch.grid if launch else None)
    block = _dims(a.block, "--block") if a.block else (launch.block if launch else None)
    if grid is None or block is None:
        raise InputError(a.file, f"kernel {prog.name} has no .launch directive",
                         "give --grid and --block, or add .launch grid=X block=Y")
    launch = resolve_launch(prog, Launch(grid, block, cluster=prog.launch.cluster if prog.launch else 1))
    if launch.cluster > 1 and "cluster" not in caps.features:
        raise InputError(a.file, f"a launch of clusters of {launch.cluster} on {caps.name}, which has none",
                         "cluster=1, or a machine with clusters: (h100)")
    tpb = launch.threads_per_block
    if tpb > caps.warp_slots * caps.warp_width:
        raise InputError("--block", f"{tpb} threads per block exceed what one core of {caps.name} holds",
                         f"at most {caps.warp_slots * caps.warp_width} threads")
    if a.disassemble:
        print(disassemble(prog))
    if a.max_instructions is not None and a.max_instructions <= 0:
        raise InputError("--max-instructions", f"{a.max_instructions}", "a positive integer")
    check_asm_args(machine, prog, a.timing)
    if a.sample_interval and not a.timing:
        raise InputError("--sample-interval", "interval sampling of a functional run",
                         "--timing --sample --sample-interval")
    if a.timing:
        return _asm_timing(a, machine, prog, launch)
    from archsim.engine.functional import run_functional   # the engine, once the input is checked

    args = default_args(prog)
    before = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray)}
    try:
        result = run_functional(prog, args, launch, warp_width=caps.warp_width, ncores=caps.cores_total,
                                engine=a.engine, max_instructions=a.max_instructions)
    except SimulationError as e:
        if a.json:  # the run could not finish: still write what it did, marked incomplete
            partial = e.partial
            _write_json(a.json, {"schema": "archsim.asm/1", "complete": False, "kernel": prog.name,
                                 "machine": caps.name, "error": e.line(),
                                 "warp_instructions": partial.warp_instructions if partial else 0})
        raise
    written = {}
    for name, old in before.items():
        new = result.output(name)
        if not np.array_equal(new.view(np.uint8), old.view(np.uint8)):
            written[name] = _summary(new, result.memory.buffers[name][2])
    verification = None
    if example is not None:
        from archsim.isa.examples import EXAMPLES, verify

        if example in EXAMPLES:
            verification = verify(example, args_for_ref(prog), result)
    out = {"schema": "archsim.asm/1", "complete": True, "kernel": prog.name, "machine": caps.name,
           "launch": {"grid": list(launch.grid), "block": list(launch.block), "cluster": launch.cluster},
           "warp_instructions": result.warp_instructions, "written": written}
    if verification is not None:
        out["verification"] = verification
    print(f"kernel {prog.name} on {caps.name}: grid {launch.grid} block {launch.block}, "
          f"{result.warp_instructions} warp-instructions")
    if not written:
        print("  (no buffer changed)")
    for name, s in written.items():
        head = ", ".join(f"{v:.6g}" for v in s["head"])
        print(f"  {name}: {s['dtype']}{s['shape']}  sum {s['sum']:.6g}  min {s['min']:.6g}  max {s['max']:.6g}  "
              f"[{head}{', ...' if np.prod(s['shape']) > 8 else ''}]")
    failed = False
    if verification is not None:
        for name, v in verification.items():
            ok = "ok" if v["passed"] else "FAILED"
            failed |= not v["passed"]
            print(f"  check {name} vs numpy: max abs err {v['max_abs_err']:.3g}, max rel err {v['max_rel_err']:.3g}: {ok}")
    if a.json:
        _write_json(a.json, out)
    return 1 if failed else 0


def _asm_timing(a, machine, prog, launch) -> int:
    """`archsim asm FILE --timing`: one launch on the cycle model, as `archsim run` times a kernel;
    the record is the full archsim.result/1 with one kernel."""
    import time

    from archsim import stats
    from archsim.engine.launch import default_args
    from archsim.engine.names import KernelTiming

    if a.max_cycles <= 0:
        raise InputError("--max-cycles", f"{a.max_cycles} is not a cycle count", "a positive integer")
    if a.engine != "numba":
        raise InputError("--engine", "the reference engine is functional only", "numba (the default) with --timing")
    if a.sample_interval and not a.sample:
        raise InputError("--sample-interval", "interval sampling without --sample",
                         "--timing --sample --sample-interval")
    from archsim.sample import sampled_record   # the engine, once the input is checked

    args = default_args(prog, timing=True)
    workload = {"name": f"asm {prog.name}", "params": {"file": a.file, "grid": list(launch.grid),
                                                       "block": list(launch.block)}}
    from archsim.workers import run_task

    t0 = time.perf_counter()
    rec, error, spent = run_task(sampled_record, (prog.name, prog, machine, launch, args),
                                 dict(max_cycles=a.max_cycles, sample=a.sample, interval=a.sample_interval))

    def document(kernels, complete=True):
        wall = time.perf_counter() - t0
        return stats.result(machine, workload, kernels, wall, complete=complete, spent=spent,
                            setup_extra=max(wall - spent["task_seconds"], 0.0))

    if error is not None:
        if a.json and isinstance(error, SimulationError) and isinstance(error.partial, KernelTiming):
            part = stats.kernel_record(prog.name, machine, launch, error.partial)
            _write_json(a.json, dict(document([part], complete=False), error=error.line()))
        raise error
    doc = document([rec])
    stalls = sorted(rec["stalls"].items(), key=lambda kv: -kv[1])[:3]
    bw = rec["bandwidth_gbps"]
    how = f", sampled ({rec['waves_simulated']:g} of {rec['waves']} waves, error est {rec['sample_error_est']:.1%})" \
        if rec["sampled"] else ""
    if rec.get("sample_method") == "interval":
        iv = rec["sample_interval"]
        how = f", interval-sampled ({iv['instructions_simulated'] / iv['instructions_total']:.0%} of its " \
              f"warp-instructions, error est {rec['sample_error_est']:.1%})"
    print(f"kernel {prog.name} on {machine.name}: grid {launch.grid} block {launch.block}, {rec['cycles']} cycles "
          f"({rec['seconds'] * 1e6:.2f} us), {rec['warp_instructions']} warp-instructions{how}")
    print("  stalls: " + ", ".join(f"{k} {v:.0%}" for k, v in stalls)
          + "; GB/s: " + ", ".join(f"{k} {bw[k]:.1f}" for k in ("l1", "scratch", "l2", "dram") if bw.get(k)))
    if a.json:
        _write_json(a.json, doc)
    return 0


def args_for_ref(prog) -> dict:
    """The initial arguments again (the run mutates its copies)."""
    from archsim.engine.launch import default_args

    return default_args(prog)


def cmd_show_config(a) -> int:
    from archsim.cluster.spec import is_cluster_file
    from archsim.config.derived import format_machine, peak_bandwidth_gbps, peak_tflops
    from archsim.config.load import load_machine

    if is_cluster_file(a.hw):
        return _show_cluster(a)
    try:
        machine = load_machine(a.hw, a.overlays, a.sets)
    except InputError as e:
        if e.where == "--hw" and e.what.startswith("unknown machine"):
            from archsim.cluster.spec import builtin_clusters

            raise InputError("show-config", f"unknown machine or cluster {a.hw!r}",
                             f"{e.allowed}; or a cluster: {', '.join(builtin_clusters())}") from None
        raise
    print(format_machine(machine))
    if a.json:
        _write_json(a.json, {"schema": "archsim.machine/1", "machine": machine.model_dump(mode="json"),
                             "derived": {"peak_tflops": peak_tflops(machine),
                                         "peak_bandwidth_gbps": peak_bandwidth_gbps(machine)}})
    return 0


def _show_cluster(a) -> int:
    from archsim.cluster.derived import cluster_figures, format_cluster
    from archsim.cluster.device_collective import check_collective_software
    from archsim.cluster.spec import load_cluster, load_device
    from archsim.config.derived import peak_tflops

    if a.sets or a.overlays:
        raise InputError("--set" if a.sets else "--overlay", f"{a.hw} is a cluster; --set and --overlay change "
                         "machines", "show-config CLUSTER without them")
    cluster = load_cluster(a.hw, "show-config")
    device = load_device(cluster, a.hw)
    check_collective_software(cluster, device, a.hw)
    fig = cluster_figures(cluster)
    peak = {k: v for k, v in peak_tflops(device).items() if k in ("fp16", "bf16", "fp32", "fp64")}
    print(format_cluster(cluster, fig, device.description or device.name, peak))
    if a.json:
        _write_json(a.json, {"schema": "archsim.cluster_config/1", "cluster": cluster.model_dump(mode="json"),
                             "derived": {**fig, "peak_tflops_per_device": peak}})
    return 0


def cmd_micro(a) -> int:
    from archsim.config.load import load_machine
    from archsim.micro_params import check_machine, parse_params
    from archsim.workers import check_workers

    workers = check_workers(a.workers)
    machine = load_machine(a.hw, a.overlays, a.sets)
    check_machine(a.name, machine)  # a benchmark of a block the machine lacks, before its parameters
    parse_params(a.name, a.params)  # bad parameters fail before anything runs
    if a.max_cycles <= 0:
        raise InputError("--max-cycles", f"{a.max_cycles} is not a cycle count", "a positive integer")
    from archsim.micro import run_micro

    try:
        r = run_micro(a.name, machine, a.params, max_cycles=a.max_cycles, workers=workers)
    except SimulationError as e:
        if e.partial is not None and hasattr(e.partial, "document"):
            e.partial.complete = False
            doc = dict(e.partial.document(machine), error=e.line())
            if a.json:
                _write_json(a.json, doc)
            if a.out:
                _write_plot_files(a.out, doc, "micro.json")
        raise
    k = r.kernels[-1]
    print(f"micro {a.name} on {machine.name} ({', '.join(f'{k2}={v}' for k2, v in r.params.items())}): "
          f"{r.value:.4g} {r.unit}")
    print(f"  {len(r.kernels)} launch(es), last: {k['cycles']} cycles, {k['warp_instructions']} warp-instructions, "
          f"DRAM {k['bandwidth_gbps'].get('dram', 0):.1f} GB/s; simulated in {r.wall_seconds:.2f} s")
    if a.json:
        _write_json(a.json, r.document(machine))
    if a.out:
        _write_plot_files(a.out, r.document(machine), "micro.json")
    return 0


def cmd_validate(a) -> int:
    if (a.hw is None) == (a.cluster is None):
        raise InputError("validate", "give a machine (--hw) or a cluster (--cluster)", "exactly one of them")
    if a.cluster is not None:
        return _validate_cluster(a)
    if a.workers is not None:
        raise InputError("--workers", "a machine's curves run in this process",
                         "--workers with --cluster (its step curves' kernels)")
    from archsim.config.load import load_machine
    from archsim.validate import (HEADER, format_curve, format_point, format_row, load_curves, load_reference,
                                  pick_curves, reference_machine, reference_path, validate)

    machine = load_machine(a.hw, a.overlays, a.sets)
    ref = reference_path(machine, a.reference)
    load_reference(ref)  # a bad file, or a --curve that names none of its curves, fails before anything runs
    named = reference_machine(ref)
    if named is not None and named != machine.name:
        print(f"note: {ref} holds figures measured on {named}; the machine validated is {machine.name}",
              file=sys.stderr)
    curves = load_curves(ref, machine.family)
    if a.curve is not None:
        pick_curves(curves, a.curve, ref)
    if a.plot != "none":
        _check_writable(a.plot, "--plot")
    print(f"validate {machine.name}: simulated vs published")
    if a.curve is None:
        print(HEADER)
    res = validate(machine, a.reference, progress=lambda r: print(format_row(r), flush=True),
                   curve_progress=lambda c, p: print(format_point(c, p), flush=True), only=a.curve)
    return _validate_summary(a, res)


def _validate_summary(a, res: dict) -> int:
    """The curves' summary lines, the overall error, and the JSON and plot a validate writes."""
    from archsim.validate import format_curve

    if res["curves"]:
        print("curves:")
        for c in res["curves"]:
            print("  " + format_curve(c))
    print(f"mean absolute percentage error: {res['mape_pct']:.1f}%, worst {res['max_error_pct']:.1f}%  "
          f"({res['wall_seconds']:.1f} s)")
    if a.json:
        _write_json(a.json, res)
    if a.plot != "none":
        from archsim.report.validation import plot_validation

        plot_validation(res, a.plot)
        print(f"plot: {a.plot}")
    return 0


def _validate_cluster(a) -> int:
    from archsim.cluster.validate import format_point, prepare, validate_cluster_curves

    if a.sets or a.overlays:
        raise InputError("--set" if a.sets else "--overlay", "--set and --overlay change machines",
                         "validate --cluster C without them (a curve's own `set` changes its cluster)")
    from archsim.runner import RunOptions
    from archsim.workers import check_workers

    opts = RunOptions(workers=check_workers(a.workers))
    prepare(a.cluster, a.reference, a.curve)      # every input checked before anything prints
    if a.plot != "none":
        _check_writable(a.plot, "--plot")
    print(f"validate {a.cluster}: simulated vs published (collectives' bus bandwidth on the flow model; "
          "training steps with every kernel timed by the engine)")
    res = validate_cluster_curves(a.cluster, a.reference, progress=lambda c, p: print(format_point(c, p), flush=True),
                                  only=a.curve, opts=opts)
    return _validate_summary(a, res)


def cmd_bench(a) -> int:
    from archsim.bench import run_bench
    from archsim.workers import check_workers

    if a.repeat < 1:
        raise InputError("--repeat", f"{a.repeat} is not a run count", "a positive integer")
    workers = check_workers(a.workers)
    if a.job:
        from archsim.bench import check_jobs

        check_jobs(a.job)         # before the cases run
    print(f"{'case':<26} {'warp-instr':>12} {'wall s':>8} {'warp-instr/s':>14}"
          + (f" {'ns/warp-instr':>14}" if a.profile else ""))

    def show(c):
        print(f"{c['name']:<26} {c['warp_instructions']:>12} {c['wall_seconds']:>8.2f} "
              f"{c['warp_instructions_per_second']:>14,.0f}"
              + (f" {c['ns_per_warp_instruction'] or 0:>14,.0f}" if a.profile else ""), flush=True)
        if a.profile:
            print("    " + "  ".join(f"{fam} {v['per_cycle']:.1f}/cycle {v['idle_share']:.0%} idle"
                                    for fam, v in c["visits"].items()), flush=True)

    res = run_bench(repeat=a.repeat, progress=show)
    print(f"median: {res['warp_instructions_per_second']:,.0f} warp-instructions/s")
    if a.profile:
        print(f"host minimal loop: {res['host_loop_ns_per_issue']:.1f} ns per issue (engine ns per warp-instruction "
              "above)")
    if a.jobs or a.job:
        from archsim.bench import run_jobs

        print(f"{'job':<30} {'1 process s':>12} {'workers':>8} {'s':>8} {'speedup':>8} {'Mcycles/s':>10} "
              f"{'warp-instr/s':>14}")
        res["jobs"] = run_jobs(a.job, workers, progress=lambda j: print(
            f"{j['name']:<30} {j['single']['wall_seconds']:>12.1f} {j['workers']:>8} "
            f"{j['parallel']['wall_seconds']:>8.1f} {j['speedup']:>8.2f} "
            f"{j['parallel']['cycles_per_second'] / 1e6:>10.2f} {j['parallel']['warp_instructions_per_second']:>14,.0f}"
            + "".join(f"\n  {k['machine']:<11} {k['kernel']:<16} waves {k['simulated_waves']:>4} of {k['waves']:<5} "
                      f"warp-instr {k['simulated_warp_instructions']:>13,} of {k['warp_instructions']:<15,} "
                      f"{k['wall_seconds']:>8.1f} s" for k in j['parallel']['kernels']),
            flush=True))
    if a.json:
        _write_json(a.json, res)
    return 0


def _load_workload(a):
    from archsim.workloads.model import load_workload

    over = {k: getattr(a, k) for k in ("phase", "batch", "seq", "layers", "dtype", "attention", "causal",
                                       "placement", "tensor_parallel", "expert_parallel")}
    return load_workload(a.workload, over)


def _run_options(a, block_trace: bool = True):
    """The run options of the command line; ``block_trace`` False: --trace is not the kernels'
    block trace (a cluster run's trace is its step's)."""
    from archsim.runner import RunOptions, check_options, parse_error_bound
    from archsim.workers import check_workers

    opts = check_options(RunOptions(mode=a.mode, sample=not a.no_sample, interval=a.sample_interval,
                                    k_loop=a.sample_k_loop, waves=a.sample_waves,
                                    max_error=parse_error_bound("--sample-max-error", a.sample_max_error),
                                    max_cycles=a.max_cycles, trace=a.trace and block_trace,
                                    max_instructions=a.max_instructions, workers=check_workers(a.workers),
                                    scale=a.scale))
    if a.trace and not a.out:
        raise InputError("--trace", "a trace needs an output directory", "give --out DIR too")
    return opts


def _say(text: str) -> None:
    """A line of progress on stderr when it is a terminal (quiet otherwise, as the bars are)."""
    if sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)


def _progress(label: str):
    """A progress bar on a terminal, nothing otherwise (quiet when not a terminal)."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=0, desc=label, unit="kernel", file=sys.stderr, leave=False)

    def update(i, n, name):
        bar.total = n
        bar.n = i
        bar.set_postfix_str(name)
        bar.refresh()

    return update, bar.close


def _out_dir(path: str) -> Path:
    if not str(path).strip():     # Path("") is the working directory
        raise InputError("--out", "an empty path", "a directory path")
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError("--out", f"cannot create {path}: {e.strerror}", "a writable directory path")
    return out


def _write_plot_files(out_dir: str, doc: dict, name: str, kernel: str | None = None) -> Path:
    """The document as `name`, its plots and report.html in out_dir; a line on stderr for each plot
    that could not be drawn."""
    from archsim.report.plots import write_plots

    out = _out_dir(out_dir)
    _write_json(str(out / name), doc)
    _files, missing = write_plots(doc, out, kernel=kernel)
    for m in missing:
        print(f"archsim: not drawn: {m}", file=sys.stderr)
    return out


def _write_outputs(a, doc: dict, results: list[dict], name: str) -> None:
    if a.json:
        _write_json(a.json, doc)
    if not a.out:
        return
    out = _write_plot_files(a.out, doc, name)
    if a.trace:
        from archsim.report.trace import trace_document

        _write_json(str(out / "trace.json"), trace_document([r for r in results if r.get("mode") != "functional"]))


def _run_one(a, machine, wl, opts, label):
    from archsim.runner import run_workload

    update, close = _progress(label)
    try:
        return run_workload(machine, wl, opts, progress=update)
    finally:
        close()


def cmd_run(a) -> int:
    from archsim.config.load import load_machine
    from archsim.report.tables import functional_table, run_table

    if a.cluster is not None or a.plan is not None:
        return _run_cluster(a)
    if a.hw is None:
        raise InputError("run", "give a machine (--hw) or a cluster (--cluster with --plan)", "one of them")
    machine = load_machine(a.hw, a.overlays, a.sets)
    wl = _load_workload(a)
    opts = _run_options(a)
    from archsim.runner import machine_scale

    machine_scale(machine, opts)        # a scale the machine cannot take, before the engine loads
    try:
        doc = _run_one(a, machine, wl, opts, f"{wl.name} on {machine.name}")
    except SimulationError as e:
        partial = getattr(e, "partial_document", None)
        if partial is not None:
            _write_outputs(a, partial, [partial], "result.json")
        raise
    print(functional_table(doc) if opts.mode == "functional" else run_table(doc))
    _write_outputs(a, doc, [doc], "result.json")
    if opts.mode == "functional" and not doc["passed"]:
        print("archsim: functional verification failed (see the table)", file=sys.stderr)
        return 1
    return 0


def _cluster_inputs(a, refused: tuple, what: str, usage: str):
    """What a command that runs cluster steps checks first: the flags that do not apply to it
    ((flag, given) pairs, one line naming the first), timing mode, then the workload, the run
    options (without the kernels' block traces: a cluster's trace is the step's) and the --json
    path. Returns (workload, options)."""
    refused += (("--batch", a.batch), ("--tp", a.tensor_parallel), ("--ep", a.expert_parallel))
    for flag, given in refused:
        if given:
            raise InputError(flag, f"{flag} does not apply to {what}",
                             "the plan's mb=, gbs=, tp= and ep=" if flag in ("--batch", "--tp", "--ep") else usage)
    if a.mode != "timing":
        raise InputError("--mode", "a cluster run is a timing run", "--mode timing")
    wl = _load_workload(a)
    _no_device_split(wl, a.workload)
    opts = _run_options(a, block_trace=False)
    if a.json:
        _check_file_path(a.json, "--json")
    return wl, opts


def _no_device_split(wl, label: str) -> None:
    """A cluster command takes tensor and expert parallelism from its plan, not the workload's scenario."""
    for key, plan_key in (("tensor_parallel", "tp"), ("expert_parallel", "ep")):
        if getattr(wl.scenario, key) != 1:
            raise InputError(f"{label}: scenario.{key}", f"{getattr(wl.scenario, key)} on a cluster",
                             f"1: the plan's {plan_key}= splits the model")


def _run_cluster(a) -> int:
    from archsim.cluster.run import format_cluster_run, prepare, run_cluster
    from archsim.runner import machine_scale

    if a.cluster is None or a.plan is None:
        raise InputError("--cluster" if a.cluster is None else "--plan",
                         "a cluster run needs both --cluster and --plan", "--cluster C --plan tp=T,pp=P,dp=D,...")
    wl, opts = _cluster_inputs(a, (("--hw", a.hw), ("--set", a.sets), ("--overlay", a.overlays)), "a cluster run",
                               "--cluster C --plan ... [--json F] [--out DIR [--trace]] (the cluster names its device)")
    _, device, _, _ = prepare(a.cluster, wl, a.plan)   # every bad input before any kernel is timed
    machine_scale(device, opts)                         # the device takes --scale
    out = _out_dir(a.out) if a.out else None
    doc = run_cluster(a.cluster, wl, a.plan, opts, progress=_say)
    print(format_cluster_run(doc))
    if a.json:
        _write_json(a.json, doc)
    if out is not None:
        from archsim.report.cluster import write_cluster_plots

        _write_json(str(out / "cluster.json"), doc)
        for f in write_cluster_plots(doc, out):
            print(f)
        if a.trace:
            from archsim.report.cluster import cluster_trace_events

            _write_json(str(out / "trace.json"), {"traceEvents": cluster_trace_events(doc), "displayTimeUnit": "ms"})
            print(out / "trace.json")
    return 0


def _compare_clusters(a) -> int:
    from archsim.cluster.run import COMPARE_SCHEMA, format_cluster_compare, prepare, run_cluster
    from archsim.runner import machine_scale

    clusters, plans = a.cluster or [], a.plan or []
    if len(clusters) < 2:
        raise InputError("--cluster", f"compare got {len(clusters)} cluster", "two or more --cluster, with --plan")
    if len(plans) not in (1, len(clusters)):
        raise InputError("--plan", f"{len(plans)} plans for {len(clusters)} clusters",
                         "one plan for every cluster, or one per cluster in their order")
    wl, opts = _cluster_inputs(a, (("--hw", a.hw), ("--set", a.sets), ("--overlay", a.overlays), ("--trace", a.trace),
                                   ("--out", a.out)), "a compare of clusters",
                               "compare --cluster A --cluster B --plan P [--plan Q] --workload WL [--json F]")
    pairs = list(zip(clusters, plans if len(plans) > 1 else plans * len(clusters)))
    for c, p in pairs:
        _, device, _, _ = prepare(c, wl, p)   # every cluster and plan before any kernel is timed
        machine_scale(device, opts)
    docs = [run_cluster(c, wl, p, opts, progress=_say)
            for c, p in pairs]
    print(format_cluster_compare(docs))
    if a.json:
        _write_json(a.json, {"schema": COMPARE_SCHEMA, "runs": docs})
    return 0


def cmd_plan(a) -> int:
    from archsim.cluster.search import format_search, search

    if a.top < 1:
        raise InputError("--top", f"{a.top} is not a count", "a positive integer")
    if a.gbs is not None and not 1 <= a.gbs <= 1 << 40:
        raise InputError("--gbs", f"{a.gbs} is not a batch", "1 to 2^40 sequences")
    for flag, given in (("--out", a.out), ("--trace", a.trace), ("--mode", a.mode != "timing"),
                        ("--tp", a.tensor_parallel), ("--ep", a.expert_parallel)):
        if given:
            raise InputError(flag, f"{flag} does not apply to plan",
                             "none: plan tries every tp and ep itself" if flag in ("--tp", "--ep") else
                             "plan --cluster C --workload WL [--gbs N] [--top N] [--json F]")
    wl = _load_workload(a)
    _no_device_split(wl, a.workload)
    opts = _run_options(a)
    if a.json:
        _check_file_path(a.json, "--json")
    doc = search(a.cluster, wl, opts, a.gbs, a.top, progress=_say)
    print(format_search(doc))
    if a.json:
        _write_json(a.json, doc)
    return 0


def cmd_compare(a) -> int:
    from archsim.config.load import load_machine
    from archsim.report.tables import compare_table, functional_table

    if a.plan and not a.cluster:
        raise InputError("--plan", "a plan applies to a compare of clusters", "--cluster A --cluster B --plan P")
    if a.cluster:
        return _compare_clusters(a)
    a.hw = a.hw or []
    if len(a.hw) < 2:
        raise InputError("--hw", f"compare got {len(a.hw)} machine", "two or more --hw, or two or more --cluster "
                         "with --plan")
    machines = [load_machine(h, a.overlays, a.sets) for h in a.hw]  # every bad input before any run
    wl = _load_workload(a)
    opts = _run_options(a)
    from archsim.runner import compare_document, machine_scale, placement_for, preflight, run_many

    opts.strict_placement = False       # --placement private applies to the machines with private segments
    opts.strict_scale = False           # and --scale N to the machines whose unit counts N divides
    for m in machines:
        preflight(m, wl, opts)  # every machine can run the workload, before any simulation starts
    for m in machines:
        if opts.scale > 1 and machine_scale(m, opts) == 1:
            print(f"note: {m.name}'s unit counts do not divide by {opts.scale}: it runs whole", file=sys.stderr)
    if wl.scenario.placement == "private":
        for m in machines:
            if placement_for(m, wl, strict=False) != "private":
                print(f"note: {m.name} has no private segments (its memory is interleaved over every channel): "
                      "it runs with placement cross", file=sys.stderr)
    results = []
    failed = False
    stopped = []  # machines whose run could not finish: their partial results, and the others', are kept
    for m, r in zip(machines, run_many(machines, wl, opts, lambda m: _progress(f"{wl.name} on {m.name}"))):
        if isinstance(r, SimulationError):
            results.append(r.partial_document)
            stopped.append((m.name, r))
            continue
        results.append(r)
        failed |= opts.mode == "functional" and not r["passed"]
    if stopped:
        _write_outputs(a, compare_document(results, complete=False), results, "compare.json")
        for name, e in stopped[1:]:
            print(f"archsim: also stopped: {name}: {e.line()}", file=sys.stderr)
        name, e = stopped[0]
        raise SimulationError(f"{name}: {e.where}", e.what)
    doc = compare_document(results)
    if opts.mode == "functional":
        for r in results:
            print(functional_table(r))
    else:
        print(compare_table(results))
    _write_outputs(a, doc, results, "compare.json")
    return 1 if failed else 0


def _use_cache(a) -> None:
    """The kernel timing cache this command and its worker processes use."""
    from archsim import kernel_cache

    kernel_cache.configure(a.cache, enabled=not a.no_cache)


def cmd_cache(a) -> int:
    from archsim import kernel_cache

    d = kernel_cache.check_dir(a.cache) if a.cache else kernel_cache.configure(None)
    if d is None:
        print(f"the kernel timing cache is off ({kernel_cache.ENV}={os.environ.get(kernel_cache.ENV)})")
        return 0
    if a.action == "clear":
        n = kernel_cache.clear(d)
        print(f"{d}: removed {n} entries")
        return 0
    i = kernel_cache.info(d)
    print(f"{i['dir']}: {i['entries']} entries, {i['bytes'] / 2**20:.1f} MiB")
    return 0


def cmd_sweep(a) -> int:
    from archsim.cluster.sweep import is_cluster_spec
    from archsim.sweep import expand, load_spec, run_sweep, summary_table

    if a.workers is not None and a.workers < 1:
        raise InputError("--workers", f"{a.workers} is not a worker count", "a positive integer")
    if is_cluster_spec(a.spec):
        return _sweep_clusters(a)
    if a.scheduler is not None and a.workers is not None:
        raise InputError("--workers", "--workers and --scheduler both given", "one of them (a Dask cluster has its "
                                                                             "own workers)")
    spec = load_spec(a.spec)
    points = expand(spec)           # the whole spec is checked before anything runs
    out = _out_dir(a.out)
    update, close = _progress_runs(f"sweep {Path(a.spec).name}")
    try:
        res = run_sweep(spec, out, workers=a.workers or 1, scheduler=a.scheduler, progress=update, points=points)
    finally:
        close()
    print(summary_table(res, spec))
    failed = res.failed()
    print(f"{len(res.points)} points: {len(res.executed)} run, {len(res.skipped)} finished before, "
          f"{len(failed)} failed; {out / 'results.parquet'}")
    for key in failed:
        d = res.docs[key]
        print(f"archsim: run {key} ({d.get('sweep', {}).get('hw', '')} "
              f"{d.get('sweep', {}).get('values', {})}) failed: {d.get('error', 'functional verification failed')}",
              file=sys.stderr)
    return res.exit_status()


def _sweep_clusters(a) -> int:
    from archsim.cluster.sweep import expand_cluster_spec, format_cluster_sweep, load_cluster_spec, run_cluster_sweep
    from archsim.runner import RunOptions
    from archsim.workers import check_workers

    if a.scheduler is not None:
        raise InputError("--scheduler", "a cluster sweep runs its points in this process",
                         "--workers N (the processes each point's kernels are timed on)")
    spec = load_cluster_spec(a.spec)
    points = expand_cluster_spec(spec)      # every point checked before anything runs
    out = _out_dir(a.out)
    opts = RunOptions(workers=check_workers(a.workers))
    res = run_cluster_sweep(spec, points, out, opts,
                            progress=lambda i, n, row: _say(f"  {i}/{n} {row['cluster']} {row['plan']}: step "
                                                            f"{row['step.step_seconds']:.4g} s"))
    print(format_cluster_sweep(res, spec))
    print(f"{len(points)} points: {len(res['ran'])} run, {len(res['skipped'])} finished before; "
          f"{out / 'results.parquet'}")
    return 0


def _progress_runs(label: str):
    """A progress bar over a sweep's runs on a terminal, nothing otherwise."""
    if not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=0, desc=label, unit="run", file=sys.stderr)

    def update(i, n):
        bar.total = n
        bar.n = i
        bar.refresh()

    return update, bar.close


def cmd_plot(a) -> int:
    from archsim.report.plots import write_plots

    path = Path(a.path)
    if path.is_dir() and (path / "results.parquet").exists() and (path / "sweep.json").exists() \
            and not (path / "result.json").exists():
        from archsim.report.plots import write_sweep_plots

        if a.kernel is not None:
            raise InputError("--kernel", "a sweep's directory has no kernel to choose", "a result, compare or micro "
                                                                                         "JSON, or a run's --out")
        for f in write_sweep_plots(path, Path(a.out) if a.out else path):
            print(f)
        return 0
    if path.is_dir():
        cands = [path / "result.json", path / "compare.json", path / "micro.json", path / "cluster.json"]
        path = next((c for c in cands if c.exists()), None)
        if path is None:
            raise InputError(a.path, "no result.json, compare.json, micro.json or results.parquet in this directory",
                             "a run's or a sweep's --out directory")
    if path.exists() and not path.is_file():     # a FIFO would block the read for ever
        raise InputError(str(path), "not a regular file", "a result JSON file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(str(path), f"cannot read: {e}", "a result JSON file") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}", f"not JSON: {e.msg}", "a result JSON file") from None
    except ValueError as e:      # an integer past the digit limit
        raise InputError(str(path), f"not a result: {e}", "a result JSON file") from None
    schemas = ("archsim.result/1", "archsim.compare/1", "archsim.micro/1", "archsim.cluster/1")
    if isinstance(doc, dict) and doc.get("schema") == "archsim.cluster/1":
        from archsim.report.cluster import write_cluster_plots

        try:
            files = write_cluster_plots(doc, _out_dir(a.out) if a.out else path.parent)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise InputError(str(path), f"not a whole archsim.cluster/1 record ({type(e).__name__}: {e})",
                             "a record `run --cluster --json` wrote") from None
        for f in files:
            print(f)
        return 0
    if not isinstance(doc, dict) or doc.get("schema") not in schemas:
        raise InputError(str(path), f"schema {doc.get('schema') if isinstance(doc, dict) else None!r}",
                         ", ".join(schemas))
    _check_plot_document(doc, str(path))
    if a.kernel is not None:
        _check_kernel(doc, a.kernel, str(path))
    files, missing = write_plots(doc, _out_dir(a.out) if a.out else path.parent, kernel=a.kernel)
    for f in files:
        print(f)
    for m in missing:
        print(f"archsim: not drawn: {m}", file=sys.stderr)
    return 0


def _check_plot_document(doc: dict, where: str) -> None:
    """The fields the plots read have their kinds: a machine record with a name, a list of kernels,
    each (timing) with a name, cycles and seconds and, where given, stall shares; else one line."""
    allowed = "a record that archsim run, compare or micro wrote"
    schema = doc.get("schema")
    if schema == "archsim.compare/1":
        rs = doc.get("results")
        if not isinstance(rs, list) or not rs:
            raise InputError(where, "no 'results' list of machine records", allowed)
        named = [(f"results[{i}]", r) for i, r in enumerate(rs)]
    elif schema == "archsim.micro/1":
        named = [("result", doc.get("result"))]
    else:
        named = [("", doc)]
    number = (int, float)
    for at, r in named:
        pre = f"{at}." if at else ""
        if not isinstance(r, dict):
            raise InputError(where, f"{at or 'the document'} is not a result record", allowed)
        if not isinstance(r.get("machine"), dict) or not isinstance(r["machine"].get("name"), str):
            raise InputError(where, f"{pre}machine: no machine record with a name", allowed)
        ks = r.get("kernels")
        if not isinstance(ks, list):
            raise InputError(where, f"{pre}kernels: not a list of kernel records", allowed)
        timing = r.get("mode") != "functional"
        for j, k in enumerate(ks):
            kat = f"{pre}kernels[{j}]"
            if not isinstance(k, dict) or not isinstance(k.get("name"), str):
                raise InputError(where, f"{kat}: not a kernel record with a name", allowed)
            for f in ("cycles", "seconds") if timing else ():
                if isinstance(k.get(f), bool) or not isinstance(k.get(f), number):
                    raise InputError(where, f"{kat}.{f}: {k.get(f)!r} is not a number", allowed)
            st = k.get("stalls", {})
            if not isinstance(st, dict) or any(isinstance(v, bool) or not isinstance(v, number) for v in st.values()):
                raise InputError(where, f"{kat}.stalls: not a mapping of stall names to shares", allowed)


def _check_kernel(doc: dict, name: str, where: str) -> None:
    """--kernel names a kernel of the document (of at least one machine in a compare)."""
    rs = doc.get("results", []) if doc.get("schema") == "archsim.compare/1" else \
        [doc.get("result") or {}] if doc.get("schema") == "archsim.micro/1" else [doc]
    names = []
    for r in rs:
        for k in (r.get("kernels") or []) if isinstance(r, dict) else []:
            if isinstance(k, dict) and k.get("name") not in names:
                names.append(k.get("name"))
    if name not in names:
        shown = ", ".join(str(n) for n in names[:20]) + (" ..." if len(names) > 20 else "")
        raise InputError("--kernel", f"{name!r} is no kernel of {where}", shown or "a result with kernels")


def _check_output_paths(a) -> None:
    """Every output a command was given can be written, checked before any work is done (a run
    must not simulate for minutes and then lose its result): --json a file in a writable folder,
    --out a writable folder or one that can be made."""
    if getattr(a, "json", None):
        _check_file_path(a.json, "--json")
    o = getattr(a, "out", None)
    if o:
        p = Path(o)
        if p.exists() and not p.is_dir():
            raise InputError("--out", f"{o} is a file", "a directory (made when missing)")
        up = p
        while not up.exists() and up != up.parent:  # the nearest folder that exists must take the new one
            up = up.parent
        if not up.is_dir() or not os.access(up, os.W_OK):
            raise InputError("--out", f"cannot write into {o}", "a writable directory (made when missing)")


def _check_file_path(path: str, flag: str) -> None:
    """An output file can be written: not a directory, its folder exists and is writable, and it is
    writable itself when it exists."""
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(flag, f"{path} is a directory", "a file path in a writable folder")
    if not folder.is_dir() or not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(flag, f"cannot write {path}", "a file path in a writable folder")


def _check_writable(path: str, flag: str) -> None:
    """A plot file can be written (_check_file_path) and its suffix is an image format."""
    p = Path(path)
    if p.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise InputError(flag, f"{path}: unknown image format {p.suffix or '(none)'!r}", ".png, .pdf or .svg")
    _check_file_path(path, flag)


def _write_json(path: str, obj) -> None:
    """Write the document whole or not at all (report.files)."""
    from archsim.report.files import write_text

    try:
        write_text(path, jsonfmt.dumps(obj) + "\n")
    except OSError as e:
        raise InputError("--json", f"cannot write {path}: {e.strerror}", "a writable file path")


COMMANDS = {"asm": cmd_asm, "show-config": cmd_show_config, "micro": cmd_micro, "validate": cmd_validate,
            "bench": cmd_bench, "run": cmd_run, "compare": cmd_compare, "sweep": cmd_sweep,
            "plot": cmd_plot, "cache": cmd_cache, "plan": cmd_plan}


class _ClosedPipeSafe:
    """Standard output that stops writing, quietly, once its reader has gone (``archsim run ... |
    head``): the command goes on and still writes its --json / --out files."""

    def __init__(self, inner):
        self._inner, self._closed = inner, False

    def write(self, text):
        if not self._closed:
            try:
                return self._inner.write(text)
            except BrokenPipeError:
                self._closed = True
        return len(text)

    def flush(self):
        if not self._closed:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._closed = True

    def __getattr__(self, name):
        return getattr(self._inner, name)


_NOT_INSTALLED = object()


def _on_sigterm(signum, frame):
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: a second one must not cut the way out short
    raise Terminated()


def _handle_sigterm():
    """SIGTERM ends a command as Ctrl-C does: the worker processes it started are stopped on the
    way out. Returns the handler it replaced (_NOT_INSTALLED off the main thread)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return _NOT_INSTALLED
    return signal.signal(signal.SIGTERM, _on_sigterm)


def main(argv=None) -> int:
    if not isinstance(sys.stdout, _ClosedPipeSafe):
        sys.stdout = _ClosedPipeSafe(sys.stdout)
    previous = _handle_sigterm()
    try:
        return _main(argv)
    except Terminated:              # raised wherever the command stood (main's handler)
        print("archsim: terminated", file=sys.stderr)
        return 143
    finally:
        if previous is not _NOT_INSTALLED:
            import signal

            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _main(argv) -> int:
    try:
        a = build_parser().parse_args(argv)
        _check_output_paths(a)
        if hasattr(a, "no_cache"):
            _use_cache(a)
        return COMMANDS[a.command](a)
    except SimulationError as e:
        print(f"archsim: error: {e.line()}", file=sys.stderr)
        return 3
    except ArchsimError as e:
        print(f"archsim: error: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print("archsim: interrupted", file=sys.stderr)
        return 130
    except MemoryError as e:  # numpy refused an allocation: sizes the schema accepts but this host cannot hold
        print(f"archsim: error: host memory: the simulation needs more than this host has ({e}) (smaller "
              "machine sizes, shapes or footprints)", file=sys.stderr)
        return 2
    except OverflowError as e:  # a number the schema accepts beyond the engine's integer state (clock ratios near 2^53)
        print(f"archsim: error: input: a number too large for the simulator's state ({e}) (smaller values: "
              "a machine's clock, sizes and latencies, a workload's or a reference's figures)", file=sys.stderr)
        return 2
    except RecursionError:  # an input nested so deep that processing it (past parsing) recursed too far
        print("archsim: error: input: nested too deeply to process (a YAML or JSON file, overlay, --set value "
              "or spec hundreds of levels deep; flatten it)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
