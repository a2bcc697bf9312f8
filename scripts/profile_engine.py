"""Profile the numba timing engine per function with Linux perf.

perf cannot name code that numba compiled or loaded from its cache. This script warms the engine
up, reads the object code of every library of the engine's jitted functions (compiled here, or
their numba cache entries), lists their functions with ``nm`` and writes ``/tmp/perf-<pid>.map``
(perf's map file for JIT code) so that a perf profile names them. Then it runs one
micro-benchmark, every launch simulated (no kernel cache).

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


def _objects():
    """(entry address, llvm name, ELF object) of every compiled or cache-loaded overload of the
    engine's jitted functions. A function that several libraries define (numba links callees into
    each caller's library as weak symbols) runs from the library loaded first, so every library
    is mapped, not only the loop's."""
    import importlib
    import pkgutil

    import archsim.engine as E
    from numba.core.registry import CPUDispatcher

    seen = set()
    for mi in pkgutil.iter_modules(E.__path__):
        mod = importlib.import_module("archsim.engine." + mi.name)
        for v in vars(mod).values():
            if not isinstance(v, CPUDispatcher) or id(v) in seen:
                continue
            seen.add(id(v))
            for cres in list(v.overloads.values()):
                name = cres.fndesc.llvm_func_name
                entry = cres.library.get_pointer_to_function(name)
                try:
                    obj = cres.library._get_compiled_object()
                except RuntimeError:       # loaded from numba's cache: read the object there
                    obj = _cached_object(v, name.encode())
                if obj is not None:
                    yield entry, name, obj


def _cached_object(disp, name: bytes):
    cache = getattr(disp, "_cache", None)
    path = getattr(cache, "_cache_path", None)
    if not path:
        return None
    for nbc in sorted(glob.glob(os.path.join(path, "*.nbc")), key=os.path.getmtime, reverse=True):
        with open(nbc, "rb") as f:
            raw = f.read()
        if name in raw:
            try:
                obj = _elf(pickle.loads(raw))
            except Exception:  # noqa: BLE001  (another numba version's entry: skip it)
                continue
            if obj is not None and name in obj:
                return obj
    return None


def write_perf_map() -> str:
    path = f"/tmp/engine-{os.getpid()}.o"
    rows = {}
    for entry, fname, obj in _objects():
        with open(path, "wb") as f:
            f.write(obj)
        out = subprocess.run(["nm", "-S", "--defined-only", path], capture_output=True, text=True,
                             check=True).stdout
        syms = []
        for line in out.splitlines():
            p = line.split()
            if len(p) == 4 and p[2] in "tTwW":
                syms.append((int(p[0], 16), int(p[1], 16), p[3]))
        off = [o for o, _, n in syms if n == fname]
        if not off:
            continue
        base = entry - off[0]
        for o, size, name in syms:
            rows[base + o] = (size, _short(name))
    os.remove(path)
    mp = f"/tmp/perf-{os.getpid()}.map"
    with open(mp, "w") as f:
        for a in sorted(rows):
            f.write(f"{a:x} {rows[a][0]:x} {rows[a][1]}\n")
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
