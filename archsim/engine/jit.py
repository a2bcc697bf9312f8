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


def njit(*args, **kwargs):
    """numba.njit with the engine's defaults (on-disk cache)."""
    kwargs.setdefault("cache", True)
    return numba.njit(*args, **kwargs)
