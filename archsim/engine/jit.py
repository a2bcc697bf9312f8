"""All numba options in one place.

Numba keys each function's on-disk cache on its own source file only, so a change to a helper in
another file (execute.py under functional.py's loop, say) would leave a stale compiled loop. The
engine therefore keeps its cache in a directory named by a hash of every engine source file and
the opcode module: any change there starts a fresh cache. ``NUMBA_CACHE_DIR`` still wins when set.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

_HERE = Path(__file__).resolve().parent


def _sources_digest() -> str:
    h = hashlib.sha256()
    files = sorted(_HERE.glob("*.py")) + [_HERE.parent / "isa" / "opcodes.py"]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    h.update(numba.__version__.encode())
    return h.hexdigest()[:16]


def _cache_dir() -> str:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "archsim"
    return str(root / f"numba-{_sources_digest()}")


numba.config.CACHE_DIR = _cache_dir()


def njit(*args, nrt: bool = False, **kwargs):
    """numba.njit with the engine's defaults: on-disk cache; no reference counting (``_nrt=False``)
    and numpy's error model (no division-by-zero checks).

    Without NRT a call does not increment and decrement every array of the state tuples it is
    given; with it, each call into a function that takes the memory state (a few hundred arrays)
    cost microseconds even when it had nothing to do. Functions that allocate arrays ask for
    ``nrt=True`` (numba refuses to compile an allocation without it)."""
    kwargs.setdefault("cache", True)
    kwargs.setdefault("error_model", "numpy")
    if not nrt:
        kwargs.setdefault("_nrt", False)
    return numba.njit(*args, **kwargs)
