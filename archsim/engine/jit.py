"""All numba options in one place, and the clock of the time numba spends compiling.

Numba keys each function's on-disk cache on its own source file only, so a change to a helper in
another file (execute.py under functional.py's loop, say) would leave a stale compiled loop. The
engine therefore keeps its cache in a directory named by a hash of every engine source file and
the opcode module: any change there starts a fresh cache. ``NUMBA_CACHE_DIR`` still wins when set.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numba
from numba.core import event

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


# The jitted entry points whose first compile after an install (or an engine change) takes minutes:
# when one starts compiling, one line says so, with the time the last such compile took here.
ENTRY_POINTS = {"archsim.engine.machine._run_slice": "the timing engine",
                "archsim.engine.functional.run_loop": "the functional engine"}
COMPILE_SECONDS_DEFAULT = {"the timing engine": 60, "the functional engine": 18}   # idle 2-core x86-64 host (the timing engine on two processes: warmup.py)
_RECORD = "compile-seconds.json"


def _say(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


note = _say   # where the compile line goes (tests replace it)


class _CompileClock(event.Listener):
    """Seconds numba spent compiling in this process (loads from its on-disk cache are not
    compiles): the outermost compile of each nested tree is timed once. The compile of an entry
    point is announced (ENTRY_POINTS) and its seconds recorded for the next announcement."""

    def __init__(self):
        self.depth = 0
        self.start = 0.0
        self.seconds = 0.0
        self.entry = None

    def on_start(self, ev):
        if self.depth == 0:
            self.start = time.perf_counter()
            f = ev.data["dispatcher"].py_func
            self.entry = ENTRY_POINTS.get(f"{f.__module__}.{f.__qualname__}")
            if self.entry is not None:
                announce(self.entry)
        self.depth += 1

    def on_end(self, ev):
        self.depth -= 1
        if self.depth == 0:
            took = time.perf_counter() - self.start
            self.seconds += took
            if self.entry is not None and self.entry not in _recorded:
                record_compile(self.entry, took)
            self.entry = None


def _records() -> list[Path]:
    """This engine source's record first, then those of earlier sources, newest first."""
    here = Path(numba.config.CACHE_DIR)
    older = [p for p in here.parent.glob(f"*/{_RECORD}") if p.parent != here]
    return [here / _RECORD] + sorted(older, key=lambda p: p.stat().st_mtime, reverse=True)


def expected_compile_seconds(entry: str) -> int:
    """How long compiling ``entry`` took on this host last time, else COMPILE_SECONDS_DEFAULT."""
    import json

    for p in _records():
        try:
            return max(int(round(float(json.loads(p.read_text())[entry]))), 1)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return COMPILE_SECONDS_DEFAULT[entry]


_announced = set()
_recorded = set()


def announce(entry: str) -> None:
    """Say once per process that ``entry`` (one of ENTRY_POINTS' names) is being compiled."""
    if entry not in _announced:
        _announced.add(entry)
        note(f"archsim: compiling {entry}, once after install: about {expected_compile_seconds(entry)} s "
             "(later runs load it from the cache)")


def record_compile(entry: str, seconds: float, final: bool = False) -> None:
    """Keep how long compiling ``entry`` took, for the next announcement; ``final``: the whole of
    it (warmup.py compiles the timing engine in parts), not to be replaced by the loop's own."""
    if final:
        _recorded.add(entry)
    _record(entry, seconds)


def _record(entry: str, seconds: float) -> None:
    import json

    p = Path(numba.config.CACHE_DIR) / _RECORD
    try:
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            doc = {}
        doc[entry] = round(seconds, 1)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc))
    except (OSError, TypeError):
        pass                    # no record: the next estimate is the default


_clock = _CompileClock()
event.register("numba:compile", _clock)


def compile_seconds() -> float:
    """Seconds this process has spent compiling jitted functions so far (including one in progress)."""
    extra = time.perf_counter() - _clock.start if _clock.depth else 0.0
    return _clock.seconds + extra
