"""Profile the numba timing engine per function with Linux perf.

numba links every function a jitted loop calls into that loop's library, and perf cannot name
code that was loaded from numba's cache. This script warms the engine up, reads the object code of
the cache entry of ``_run_slice`` (the jitted loop ``run_loop`` calls), lists its functions with
``nm`` and writes ``/tmp/perf-<pid>.map`` (perf's map file for JIT code) so that a perf profile
names them. Then it runs one micro-benchmark, every launch simulated (no kernel cache).

    perf record -e cpu-clock -o perf.data python scripts/profile_engine.py gemm a100 m=1024 n=1024 k=1024
    perf report -i perf.data --sort symbol

Needs perf and binutils' nm. Functions inlined by numba (``inline="always"``) count toward their
callers.
"""

from __future__ import annotations

import glob
import os
import pickle
import subprocess
import sys
import time


def _elf(x):
    """The first ELF object inside a numba cache entry (the library's object code)."""
    if isinstance(x, bytes) and x[:4] == b"\x7fELF":
        return x
    if isinstance(x, (tuple, list)):
        for y in x:
            r = _elf(y)
            if r is not None:
                return r
    return None


def _short(sym: str) -> str:
    """module.function of a numba-mangled name (_ZN<len><name>...)."""
    if not sym.startswith("_ZN"):
        return sym[:60]
    i, parts = 3, []
    while i < len(sym) and sym[i].isdigit():
        j = i
        while sym[j].isdigit():
            j += 1
        n = int(sym[i:j])
        parts.append(sym[j:j + n])
        i = j + n
    return ".".join(parts[-2:])


def write_perf_map() -> str:
    import numba

    from archsim.engine import machine as MA

    cres = next(iter(MA._run_slice.overloads.values()))   # the jitted loop run_loop calls
    entry = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    nbc = glob.glob(os.path.join(numba.config.CACHE_DIR, "engine_*", "machine._run_slice-*.nbc"))
    if not nbc:
        raise SystemExit("no cache entry for _run_slice: run a timing simulation first")
    with open(max(nbc, key=os.path.getmtime), "rb") as f:   # the engine source's newest entry
        obj = _elf(pickle.loads(f.read()))
    path = f"/tmp/run_loop-{os.getpid()}.o"
    with open(path, "wb") as f:
        f.write(obj)
    out = subprocess.run(["nm", "-S", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            syms.append((int(p[0], 16), int(p[1], 16), p[3]))
    off = [o for o, _, n in syms if n == cres.fndesc.llvm_func_name]
    base = entry - (off[0] if off else 0)
    mp = f"/tmp/perf-{os.getpid()}.map"
    with open(mp, "w") as f:
        for o, size, name in syms:
            f.write(f"{base + o:x} {size:x} {_short(name)}\n")
    return mp


def main(argv: list[str]) -> None:
    from archsim import micro as MI
    from archsim.config import load_machine

    if len(argv) < 2:
        raise SystemExit(__doc__)
    name, hw, params = argv[0], argv[1], dict(a.split("=", 1) for a in argv[2:])
    from archsim import kernel_cache

    kernel_cache.configure(None, enabled=False)   # simulate every launch: the engine is loaded and timed
    MI.run_micro("gemm", load_machine("tiny-gpu"), {"m": 64, "n": 64, "k": 64})   # compile / load
    print("perf map:", write_perf_map(), file=sys.stderr)
    m = load_machine(hw)
    t0 = time.perf_counter()
    r = MI.run_micro(name, m, MI.parse_params(name, params))
    print(f"{name} on {hw}: {r.value:.4g} {r.unit} in {time.perf_counter() - t0:.2f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
