"""The kernel timing cache: a timed launch (or range of its blocks) is simulated once per machine,
program, launch, arguments, options and engine source, and read back after that.

An entry is the pickled ``KernelTiming`` of one ``timing.time_kernel`` call, in one file named by
the SHA-256 of its key:

- the program's instruction arrays, registers and shared memory; the launch;
- the resolved machine (``config.load.machine_fingerprint``);
- the arguments in order: an address-space buffer's size and address, a backed buffer's dtype,
  shape and bytes, a scalar's type and value;
- the call's options (block range, layout base, placement, skip-ahead, window, max cycles);
- the timing code: a digest of the ``.py`` files of ``archsim/engine``, ``archsim/isa``,
  ``archsim/config`` and this module, of ``isa/opcodes.yaml``, and the Python, numpy and numba versions, so a change of
  that code gives new keys and an old entry is never read (the emitters need not be in it: the
  programs they emit are).

A hit returns what the simulation returned, so no number changes. Writes go to a temporary file
beside the entry and are renamed into place: concurrent writers (worker processes, sweeps) leave
one whole entry. An entry that cannot be read (cut short, another format) is a miss and is
rewritten. A launch that stops (deadlock, fault, ``--max-cycles``) is not cached.

Where: ``--cache DIR`` / ``--no-cache`` on the command line; else ``ARCHSIM_CACHE_DIR`` (``off``
disables it); else ``$XDG_CACHE_HOME/archsim/kernels`` (``~/.cache/archsim/kernels``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import re
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from archsim.errors import InputError

FORMAT = 1                      # bump when an entry's layout changes
SUFFIX = ".kt"
MAX_BACKED_BYTES = 64 << 20     # a launch with more backed argument bytes than this is not cached
ENV = "ARCHSIM_CACHE_DIR"
TMP_PREFIX = ".archsim-"
_ENTRY = re.compile(r"[0-9a-f]{64}" + re.escape(SUFFIX))
_SUBDIR = re.compile(r"[0-9a-f]{2}")

_dir: Path | None = None        # the cache in use (None: off)
_configured = False
# this process's lookups, the warp-instructions it simulated (every launch not read from the cache),
# and the seconds its timing tasks took (workers.run_task): in all, compiling the engine, and in the
# jitted loop less compiling (timing.KernelRun.advance); set-up is the rest. Also the cycles it
# simulated and its unit visits ("visits.<family>", "changed.<family>": memory.visit_counts).
# Worker processes send theirs back with each task (workers.py).
stats = {"hits": 0, "misses": 0, "simulated_warp_instructions": 0, "task_seconds": 0.0, "compile_seconds": 0.0,
         "simulate_seconds": 0.0, "simulated_cycles": 0}


def changes_since(before: dict) -> dict:
    """What ``stats`` gained since the copy ``before`` (keys added since count from 0)."""
    return {k: v - before.get(k, 0) for k, v in stats.items()}


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "archsim" / "kernels"


def check_dir(path: str | os.PathLike, option: str = "--cache") -> Path:
    """The cache directory, created if missing; InputError if it is a file or cannot be written."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise InputError(option, f"{path} is not a directory", "a writable directory path, or --no-cache")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(option, f"cannot create {path}: {e.strerror}", "a writable directory path, or --no-cache") \
            from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise InputError(option, f"{path} is not writable", "a writable directory path, or --no-cache")
    return p


def configure(path: str | os.PathLike | None, enabled: bool = True) -> Path | None:
    """Use the cache at ``path`` (None: the environment's or the default), or none."""
    global _dir, _configured
    _configured = True
    if not enabled:
        _dir = None
        return None
    if path is None:
        env = os.environ.get(ENV)
        if env is not None and env.strip().lower() in ("off", "0", "none", ""):
            _dir = None
            return None
        if env is not None:
            _dir = check_dir(env, ENV)
            return _dir
        try:
            _dir = check_dir(default_dir(), "the default cache directory")
        except (InputError, RuntimeError) as e:   # a read-only or unknown home: run without a cache
            print(f"archsim: note: no kernel timing cache ({e}; --cache DIR names another)", file=sys.stderr)
            _dir = None
        return _dir
    _dir = check_dir(path)
    return _dir


@contextlib.contextmanager
def disabled():
    """No cache inside the block (the one in use before it afterwards)."""
    global _dir, _configured
    saved = (_dir, _configured)
    _dir, _configured = None, True
    try:
        yield
    finally:
        _dir, _configured = saved


def directory() -> Path | None:
    """The cache in use: configured, or from the environment on first use (a worker process gets
    ``ARCHSIM_CACHE_DIR`` from the pool that started it, workers.worker_init)."""
    if not _configured:
        try:
            configure(None)
        except InputError:
            configure(None, enabled=False)
    return _dir


def worker_env() -> dict:
    """The environment a worker process needs to use this process's cache."""
    d = directory()
    return {ENV: str(d) if d is not None else "off"}


# the code a launch's timing comes from: the engine, the ISA tables and checks, the machine's
# resolution and derived figures, interval sampling (its answers are cached) and this module (the
# emitters are not: their programs are in the key)
TIMING_CODE = ("engine", "isa", "config", "kernel_cache.py", "interval.py")


@lru_cache(maxsize=1)
def source_digest() -> str:
    """The timing code's .py files and the versions that run it."""
    import numba

    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    files = []
    for part in TIMING_CODE:
        files += sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]
    for f in files:
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    from archsim.paths import data_dir

    h.update(b"isa/opcodes.yaml\0")                 # the opcode table (latencies, units, flops) is data
    h.update((data_dir("isa") / "opcodes.yaml").read_bytes())
    h.update(repr((FORMAT, sys.version_info[:2], np.__version__, numba.__version__)).encode())
    return h.hexdigest()


def _arg_key(h, name: str, v) -> bool:
    """Feed one argument to the key; False if it cannot be keyed (the call is not cached)."""
    from archsim.engine.launch import Unbacked
    from archsim.isa.tensor_map import TensorMap

    h.update(name.encode() + b"\0")
    if isinstance(v, Unbacked):
        h.update(repr(("U", int(v.nbytes), v.at)).encode())
    elif isinstance(v, TensorMap):
        h.update(repr(("T", v.of, tuple(int(x) for x in v.words), v.offset)).encode())
    elif isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        h.update(repr(("A", a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())
    elif isinstance(v, (bool, int, float, np.integer, np.floating)):
        h.update(repr((type(v).__name__, v.item() if isinstance(v, np.generic) else v)).encode())
    else:
        return False
    return True


def key(prog, machine, launch, args: dict, options: tuple) -> str | None:
    """The entry's name, or None when the call is not cached (no cache, an argument of a kind the
    key cannot hold, or backed buffers beyond MAX_BACKED_BYTES)."""
    from archsim.config.load import machine_fingerprint

    if directory() is None:
        return None
    if sum(v.nbytes for v in args.values() if isinstance(v, np.ndarray)) > MAX_BACKED_BYTES:
        return None
    h = hashlib.sha256()
    h.update(source_digest().encode())
    h.update(machine_fingerprint(machine).encode())
    h.update(prog.content_digest())
    h.update(repr((launch, options)).encode())
    for name, v in args.items():
        if not _arg_key(h, str(name), v):
            return None
    return h.hexdigest()


def _path(k: str) -> Path:
    return _dir / k[:2] / (k + SUFFIX)


def load(k: str | None):
    """The cached timing for key k, or None (no entry, or one that cannot be read)."""
    if k is None or _dir is None:
        return None
    try:
        with open(_path(k), "rb") as f:
            tag, value = pickle.load(f)
    except Exception:  # noqa: BLE001  (none yet, cut short, another format: simulate again and rewrite it)
        tag = None
    if tag != (FORMAT, k):
        stats["misses"] += 1
        return None
    stats["hits"] += 1
    return value


def store(k: str | None, value) -> None:
    """Write the entry whole (temporary file, then rename); a failed write leaves no entry."""
    if k is None or _dir is None:
        return
    path = _path(k)
    tmp = None
    try:
        path.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".tmp", dir=path.parent)
        os.fchmod(fd, 0o666 & ~_umask())       # as a plain file would be (mkstemp makes it private)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(((FORMAT, k), value), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        tmp = None
    except Exception as e:  # noqa: BLE001  (a full disk, a value pickle cannot hold: no entry, same result)
        print(f"archsim: kernel cache: cannot write {path}: {getattr(e, 'strerror', None) or e} "
              "(the result is unaffected)", file=sys.stderr)
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def entries(d: Path) -> list[Path]:
    """The cache's entry files (two-hex-digit folders, 64-hex-digit names): nothing else in ``d``."""
    d = Path(d)
    if not d.is_dir():
        return []
    return [p for sub in d.iterdir() if sub.is_dir() and _SUBDIR.fullmatch(sub.name)
            for p in sub.iterdir() if _ENTRY.fullmatch(p.name) and p.is_file()]


def info(d: Path) -> dict:
    total = 0
    files = entries(d)
    for p in files:
        try:
            total += p.stat().st_size
        except OSError:         # removed meanwhile
            pass
    return {"dir": str(d), "entries": len(files), "bytes": total}


def clear(d: Path) -> int:
    """Remove every entry and leftover temporary file of the cache (nothing else); the number of
    entries removed."""
    n = 0
    for p in entries(d):
        p.unlink(missing_ok=True)
        n += 1
    for sub in Path(d).iterdir():
        if sub.is_dir() and _SUBDIR.fullmatch(sub.name):
            for t in sub.iterdir():
                if t.name.startswith(TMP_PREFIX) and t.name.endswith(".tmp"):
                    t.unlink(missing_ok=True)
            try:
                sub.rmdir()             # only when nothing else is left in it
            except OSError:
                pass
    return n
