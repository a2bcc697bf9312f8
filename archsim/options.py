"""Options of a run (``archsim run`` / ``compare`` / sweeps) and their checks, importable without
the engine: a refused option is answered before numba is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from archsim.errors import InputError
from archsim.resources import DEFAULT_MAX_INSTRUCTIONS

DEFAULT_WAVES = 6          # the warm-up (wave 1, often a second) and four or more steady waves, the last the drain
DEFAULT_MAX_ERROR = 0.03   # a head whose error estimate is above this grows (--sample-max-error)
WAVES_DEFAULT = DEFAULT_WAVES
MAX_ERROR_DEFAULT = DEFAULT_MAX_ERROR


@dataclass
class RunOptions:
    mode: str = "timing"           # timing | functional
    sample: bool = True            # wave sampling of big launches (--no-sample: every block)
    waves: int = WAVES_DEFAULT     # waves simulated before extrapolating
    interval: bool = False         # one-wave launches sampled inside their blocks (archsim.interval)
    k_loop: bool = False           # GEMMs with long k-loops timed from the loop cut short (sample._time_k_loop)
    max_error: float = MAX_ERROR_DEFAULT  # a sampled launch's error bound above this simulates more
    max_cycles: int = 10**9
    seed: int = 0
    trace: bool = False            # keep per-block dispatch/retire cycles (report.trace)
    # placement private on a machine without private segments: an error (run), or that machine
    # runs cross and its result says so (compare, where the option is for the machines that have them)
    strict_placement: bool = True
    # refuse a job whose simulated warp-instructions are estimated above this (resources.check_work)
    max_instructions: int = DEFAULT_MAX_INSTRUCTIONS
    workers: int = 1               # processes the distinct kernels are timed on (results identical)
    scale: int = 1                 # time kernels on a 1/scale model of the machine (archsim.scale_model)
    # a machine whose unit counts the scale does not divide: an error (run), or it runs whole and
    # its note says so (compare, where the scale is for the machines that take it)
    strict_scale: bool = True


def parse_error_bound(where: str, text) -> float:
    """A relative error bound given as a fraction (0.03) or a percentage ("3%")."""
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = float("nan")
    if not 0 < v < 1:
        raise InputError(where, f"{text!r}", "a fraction in (0, 1) or a percentage in (0%, 100%), e.g. 0.03 or 3%")
    return v


def check_options(opts: RunOptions) -> RunOptions:
    """One clear error (named by the command-line option) for options no run can take."""
    if opts.mode not in ("timing", "functional"):
        raise InputError("--mode", f"{opts.mode!r}", "timing or functional")
    if not isinstance(opts.max_cycles, int) or opts.max_cycles <= 0:
        raise InputError("--max-cycles", f"{opts.max_cycles} is not a cycle count", "a positive integer")
    if not isinstance(opts.waves, int) or opts.waves < 3:
        raise InputError("--sample-waves", f"{opts.waves}", "at least 3 (wave 1 is the cold start; two steady waves "
                                                            "give the error estimate)")
    if not 0 < opts.max_error < 1:
        raise InputError("--sample-max-error", f"{opts.max_error!r}", "a fraction in (0, 1)")
    if opts.interval and not opts.sample:
        raise InputError("--sample-interval", "interval sampling with sampling off (--no-sample)",
                         "one of --sample-interval, --no-sample")
    if opts.k_loop and not opts.sample:
        raise InputError("--sample-k-loop", "k-loop sampling with sampling off (--no-sample)",
                         "one of --sample-k-loop, --no-sample")
    if isinstance(opts.max_instructions, bool) or not isinstance(opts.max_instructions, int) \
            or opts.max_instructions <= 0:
        raise InputError("--max-instructions", f"{opts.max_instructions!r}", "a positive integer")
    if isinstance(opts.scale, bool) or not isinstance(opts.scale, int) or opts.scale < 1:
        raise InputError("--scale", f"{opts.scale!r}", "a positive integer (1: the whole machine)")
    if opts.scale > 1 and opts.mode == "functional":
        raise InputError("--scale", "a scale model in a functional run", "--scale with --mode timing")
    if opts.scale > 1 and opts.trace:
        raise InputError("--trace", "a block trace of the whole machine with --scale (blocks run on a scale model)",
                         "one of --trace, --scale")
    from archsim.workers import check_workers

    check_workers(opts.workers)
    return opts
