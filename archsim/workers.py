"""Worker processes that time kernels in parallel (``--workers N`` on run, compare and micro).

A launch's timing depends only on its program, machine, launch, arguments and options, never on
what ran before it in the process, so distinct kernels can be timed on separate processes and
the records are identical to one process's. Workers are spawned (they inherit no threads or
numba state of the parent), load the engine from numba's on-disk cache, and use the parent's
kernel timing cache. With one worker, or one task, everything runs in this process.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

from archsim.errors import InputError, SimulationError


ENV = "ARCHSIM_WORKERS"


def default_workers() -> int:
    """``ARCHSIM_WORKERS`` if set, else the cores this process may run on."""
    env = os.environ.get(ENV)
    if env is not None:
        try:
            return check_workers(int(env), ENV)
        except ValueError:
            raise InputError(ENV, f"{env!r} is not a worker count", "a positive integer") from None
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_workers(n, option: str = "--workers") -> int:
    if n is None:
        return default_workers()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(option, f"{n!r} is not a worker count", "a positive integer (1: this process only)")
    return n


def worker_init(env: dict) -> None:
    """A spawned worker's start: the parent's kernel timing cache (``kernel_cache.worker_env``)."""
    os.environ.update(env)
    from archsim import kernel_cache

    try:
        kernel_cache.configure(None)
    except InputError:          # the parent's cache went away: this worker simulates without one
        kernel_cache.configure(None, enabled=False)


def spawn_executor(workers: int):
    """A process pool of spawned workers (they inherit no threads or numba state of the parent)
    that use this process's kernel timing cache."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from archsim import kernel_cache

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=worker_init, initargs=(kernel_cache.worker_env(),))


def _call(fn, args, kwargs):
    """Run one task in a worker: (its value, the exception it raised or None, the kernel cache's
    counts for it), so that the parent counts a failed task's simulation too."""
    from archsim import kernel_cache

    before = dict(kernel_cache.stats)
    try:
        value, error = fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  (raised again in the parent, after its counts are added)
        value, error = None, e
    return value, error, {k: kernel_cache.stats[k] - before.get(k, 0) for k in kernel_cache.stats}


class Pool:
    """``submit(fn, *args, **kwargs)`` -> a Future of ``fn``'s value. ``workers`` > 1 starts that
    many spawned processes on the first submit; 1 runs each task in this process when its result
    is asked for (so a task after a failed one never runs)."""

    def __init__(self, workers: int = 1):
        self.workers = int(workers)
        self._ex = None
        self._deferred = []            # (cost, order, _Deferred) not submitted yet

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(cancel=exc[0] is not None)

    def submit(self, fn, *args, **kwargs) -> Future:
        if self.workers <= 1:
            return _Lazy(fn, args, kwargs)
        if self._ex is None:
            self._ex = spawn_executor(self.workers)
        return _Remote(self._ex.submit(_call, fn, args, kwargs))

    def defer(self, cost: float, fn, *args, **kwargs):
        """Like submit, but held back until ``flush`` (or the first result asked for), which
        submits the held tasks costliest first: with tasks of very unequal length (a Sunway GEMM
        against an A100 layernorm) the longest start at once instead of last, and the pool ends
        sooner. Results are unaffected."""
        if self.workers <= 1:
            return _Lazy(fn, args, kwargs)
        d = _Deferred(self, fn, args, kwargs)
        self._deferred.append((-float(cost), len(self._deferred), d))
        return d

    def flush(self) -> None:
        held, self._deferred = sorted(self._deferred, key=lambda x: x[:2]), []
        for _, _, d in held:
            d.fut = self.submit(d.fn, *d.args, **d.kwargs)

    def close(self, cancel: bool = False) -> None:
        """Shut the workers down; ``cancel``: drop the tasks not started and stop the running ones
        (a run that stopped, or an interrupt, does not wait for kernels it will not report)."""
        if self._ex is None:
            return
        ex, self._ex = self._ex, None
        if not cancel:
            ex.shutdown(wait=True)
            return
        procs = list((getattr(ex, "_processes", None) or {}).values())
        ex.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(5)


class _Lazy:
    """A task run in this process when its result is first asked for."""

    def __init__(self, fn, args, kwargs):
        self.task = (fn, args, kwargs)
        self.done = False

    def result(self):
        if not self.done:
            fn, args, kwargs = self.task
            self.done = True
            try:
                self.value, self.error = fn(*args, **kwargs), None
            except Exception as e:  # noqa: BLE001  (raised again to every caller, as a Future does)
                self.value, self.error = None, e
        if self.error is not None:
            raise self.error
        return self.value


class _Deferred:
    """A task held by Pool.defer until the pool's flush."""

    def __init__(self, pool: Pool, fn, args, kwargs):
        self.pool, self.fn, self.args, self.kwargs = pool, fn, args, kwargs
        self.fut = None

    def result(self):
        if self.fut is None:
            self.pool.flush()
        return self.fut.result()


class _Remote:
    """A task on a worker: its value; the worker's cache counts are added to this process's."""

    def __init__(self, fut: Future):
        self.fut = fut
        self.counted = False

    def result(self):
        from archsim import kernel_cache

        try:
            value, error, counts = self.fut.result()
        except BrokenProcessPool:
            raise SimulationError("worker process", "a worker process died (killed for memory, or crashed) "
                                  "before its kernel finished; run with --workers 1 to see the kernel") from None
        if not self.counted:
            for k, v in counts.items():
                kernel_cache.stats[k] = kernel_cache.stats.get(k, 0) + v
            self.counted = True
        if error is not None:
            raise error
        return value
