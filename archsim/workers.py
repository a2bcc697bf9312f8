"""Worker processes that time kernels in parallel (``--workers N`` on run, compare and micro).

A launch's timing depends only on its program, machine, launch, arguments and options, never on
what ran before it in the process, so distinct kernels can be timed on separate processes and
the records are identical to one process's. Workers are spawned (they inherit no threads or
numba state of the parent), load the engine from numba's on-disk cache (this process compiles it
first when the cache lacks it: archsim.warmup), and use the parent's kernel timing cache. With
one worker, or one task, everything runs in this process.

A worker ends itself within a second of its parent's end, however the parent ended (a kill -9
included): it watches its parent process. A worker that dies ends the run with one line naming
the kernel it was timing.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool

from archsim.errors import InputError, SimulationError
from archsim.lifetime import watch_parent


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


_TASK_DIR = "ARCHSIM_TASK_DIR"  # where a worker notes the task it is running (for a death notice)


def worker_init(env: dict) -> None:
    """A spawned worker's start: the parent's kernel timing cache (``kernel_cache.worker_env``),
    and a watch on the parent: when it is gone the worker exits (its task's result has no reader)."""
    parent = os.getppid()
    os.environ.update(env)
    watch_parent(parent, on_exit=_forget_task)
    from archsim import kernel_cache

    try:
        kernel_cache.configure(None)
    except InputError:          # the parent's cache went away: this worker simulates without one
        kernel_cache.configure(None, enabled=False)


def spawn_executor(workers: int, task_dir: str | None = None, warm: bool = True):
    """A process pool of spawned workers (they inherit no threads or numba state of the parent)
    that use this process's kernel timing cache. With ``warm`` (workers that time kernels) the
    timing engine is compiled here first when numba's cache lacks it (archsim.warmup): the workers
    load it instead of each compiling it. ``task_dir``: where each worker notes the label of the
    task it runs (Pool's death notice)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from archsim import kernel_cache
    from archsim.warmup import ensure_timing_engine

    if warm:
        ensure_timing_engine()
    env = dict(kernel_cache.worker_env())
    if task_dir is not None:
        env[_TASK_DIR] = task_dir
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=worker_init, initargs=(env,))


def shutdown_executor(ex, cancel: bool = False) -> None:
    """Shut a pool of spawn_executor down: wait for its tasks, or (``cancel``) drop the tasks not
    started and stop the workers running the others (SIGTERM, then SIGKILL after a second)."""
    if not cancel:
        ex.shutdown(wait=True)
        return
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(1)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


_nesting = threading.local()      # run_task depth in this thread (a task run inside another)


def run_task(fn, args, kwargs, label: str = "", engine: bool = True):
    """Run one task in this process: (its value, the exception it raised or None, what it spent:
    the changes of kernel_cache.stats, its seconds and its compile seconds among them), so that
    the parent counts a failed task's simulation too. A task run inside another counts in the
    outer one's seconds only. The timing engine is compiled first if numba's cache lacks it
    (warmup: on two processes), its seconds counted with the task's, unless the task does not
    time kernels (``engine`` false)."""
    import time

    from archsim import kernel_cache
    from archsim.engine.jit import compile_seconds

    depth = getattr(_nesting, "depth", 0)
    before = dict(kernel_cache.stats)
    if depth == 0 and engine:
        from archsim.warmup import ensure_timing_engine

        ensure_timing_engine()     # counts its own seconds into kernel_cache.stats
    t0, c0 = time.perf_counter(), compile_seconds()
    note = _note_task(label)
    _nesting.depth = depth + 1
    try:
        value, error = fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001  (raised again where the result is asked for, after its counts are added)
        value, error = None, e
    finally:
        _nesting.depth = depth
        if note:
            _remove(note)
    if depth == 0:
        kernel_cache.stats["task_seconds"] += time.perf_counter() - t0
        kernel_cache.stats["compile_seconds"] += compile_seconds() - c0
    return value, error, kernel_cache.changes_since(before)


def _note_task(label: str) -> str:
    """In a worker of a pool with a task directory: note that this process now runs the task
    ``label`` (the file is removed when the task ends); returns the note's path ("" for none)."""
    d = os.environ.get(_TASK_DIR)
    if not d or not label:
        return ""
    path = os.path.join(d, str(os.getpid()))
    try:
        tmp = os.path.join(d, f".{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            f.write(label)
        os.replace(tmp, path)
    except OSError:
        return ""               # no note: a death is reported without the kernel's name
    return path


def _forget_task() -> None:
    """A worker leaving because its parent is gone: its note goes, and the notes' directory with
    the last worker (the parent that would remove it is gone)."""
    d = os.environ.get(_TASK_DIR)
    if d:
        _remove(os.path.join(d, str(os.getpid())))
        try:
            os.rmdir(d)
        except OSError:
            pass                # another worker's note is still there: that worker removes it


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def add_spent(total: dict, counts: dict) -> dict:
    """Add one task's counts (run_task) into ``total``; returns it."""
    for k, v in counts.items():
        total[k] = total.get(k, 0) + v
    return total


class Pool:
    """``submit(fn, *args, **kwargs)`` -> a Future of ``fn``'s value. ``workers`` > 1 starts that
    many spawned processes on the first submit; 1 runs each task in this process when its result
    is asked for (so a task after a failed one never runs). ``label=`` names a task (its kernel)
    in the line that reports a worker's death. Each future's ``counts`` is what its task spent
    (run_task); ``warm``, what the pool's start spent compiling the engine (warmup). ``engine``
    false: the tasks time no kernels (a plan's step), so the timing engine is not compiled for them."""

    def __init__(self, workers: int = 1, engine: bool = True):
        self.workers = int(workers)
        self.engine = engine
        self._ex = None
        self._deferred = []            # (cost, order, _Deferred) not submitted yet
        self._tasks = None             # the directory where workers note their tasks
        self.warm = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close(cancel=exc[0] is not None)

    def submit(self, fn, *args, label: str = "", **kwargs) -> Future:
        if self.workers <= 1:
            return _Lazy(fn, args, kwargs, self.engine)
        if self._ex is None:
            import tempfile

            from archsim.warmup import ensure_timing_engine

            if self.engine:
                self.warm = ensure_timing_engine()   # here, before the workers start: its seconds, counted once
            self._tasks = tempfile.TemporaryDirectory(prefix="archsim-tasks-")
            self._ex = spawn_executor(self.workers, self._tasks.name, warm=self.engine)
        return _Remote(self._ex.submit(run_task, fn, args, kwargs, label, self.engine), self)

    def defer(self, cost: float, fn, *args, label: str = "", **kwargs):
        """Like submit, but held back until ``flush`` (or the first result asked for), which
        submits the held tasks costliest first: with tasks of very unequal length (a Sunway GEMM
        against an A100 layernorm) the longest start at once instead of last, and the pool ends
        sooner. Results are unaffected."""
        if self.workers <= 1:
            return _Lazy(fn, args, kwargs, self.engine)
        d = _Deferred(self, fn, args, kwargs, label)
        self._deferred.append((-float(cost), len(self._deferred), d))
        return d

    def flush(self) -> None:
        held, self._deferred = sorted(self._deferred, key=lambda x: x[:2]), []
        for _, _, d in held:
            d.fut = self.submit(d.fn, *d.args, label=d.label, **d.kwargs)

    def take_warm(self) -> dict:
        """What the pool's start spent compiling the engine, once (the first run that asks)."""
        warm, self.warm = self.warm, {}
        return warm

    def dead_worker_task(self) -> str:
        """The label of the task a dead worker was running (the one it noted), "" when no worker
        that died by itself (not stopped by the pool after it broke: SIGTERM) left a note."""
        import signal
        import time

        procs = (getattr(self._ex, "_processes", None) or {}) if self._ex is not None else {}
        deadline = time.monotonic() + 2.0      # the pool's manager thread may be reaping them just now
        while any(p.exitcode is None for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        for pid, proc in list(procs.items()):
            if proc.exitcode in (None, 0, -signal.SIGTERM) or self._tasks is None:
                continue
            try:
                with open(os.path.join(self._tasks.name, str(pid))) as f:
                    return f.read()
            except OSError:
                continue
        return ""

    def close(self, cancel: bool = False) -> None:
        """Shut the workers down; ``cancel``: drop the tasks not started and stop the running ones
        (a run that stopped, or an interrupt, does not wait for kernels it will not report)."""
        if self._ex is None:
            return
        ex, self._ex = self._ex, None
        try:
            shutdown_executor(ex, cancel)
        finally:
            if self._tasks is not None:
                self._tasks.cleanup()


class _Lazy:
    """A task run in this process when its result is first asked for."""

    def __init__(self, fn, args, kwargs, engine: bool = True):
        self.task = (fn, args, kwargs)
        self.engine = engine
        self.done = False
        self.counts = {}

    def result(self):
        if not self.done:
            fn, args, kwargs = self.task
            self.value, self.error, self.counts = run_task(fn, args, kwargs, engine=self.engine)
            self.done = True
        if self.error is not None:
            raise self.error
        return self.value


class _Deferred:
    """A task held by Pool.defer until the pool's flush."""

    def __init__(self, pool: Pool, fn, args, kwargs, label: str = ""):
        self.pool, self.fn, self.args, self.kwargs, self.label = pool, fn, args, kwargs, label
        self.fut = None

    def result(self):
        if self.fut is None:
            self.pool.flush()
        return self.fut.result()

    @property
    def counts(self) -> dict:
        return self.fut.counts if self.fut is not None else {}


class _Remote:
    """A task on a worker: its value; the worker's counts are added to this process's."""

    def __init__(self, fut: Future, pool: Pool):
        self.fut, self.pool = fut, pool
        self.counted = False
        self.counts = {}

    def result(self):
        from archsim import kernel_cache

        try:
            value, error, counts = self.fut.result()
        except BrokenProcessPool:
            who = self.pool.dead_worker_task()
            kernel = self.pool.engine             # (a pool without the engine runs other tasks: a plan's step)
            if who:
                raise SimulationError(who, f"the worker process {'timing' if kernel else 'running'} it died (killed "
                                      f"for memory, or crashed) before {'the kernel' if kernel else 'it'} "
                                      "finished") from None
            what = "kernel" if kernel else "task"
            raise SimulationError("worker process", "a worker process died (killed for memory, or crashed) "
                                  f"before its {what} finished; run with --workers 1 to see the {what}") from None
        if not self.counted:
            add_spent(kernel_cache.stats, counts)
            self.counted = True
            self.counts = counts
        if error is not None:
            raise error
        return value
