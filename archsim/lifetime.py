"""Helper processes that end with the process that started them.

A worker timing kernels, or a helper compiling part of the engine, has nothing to give once its
parent is gone, however the parent ended (a kill -9 included): each watches its parent and exits
within a second of it.
"""

from __future__ import annotations

import os

PARENT_POLL_SECONDS = 0.5      # how often a helper looks whether its parent is still there


def watch_parent(parent: int | None = None, on_exit=None) -> None:
    """A daemon thread that ends this process once ``parent`` (default: the parent now) has gone
    (the process was reparented), after ``on_exit()`` if given. The engine's jitted loop returns
    to Python several times a second (machine.SLICE_SECONDS), so the thread runs even while a
    kernel is being timed."""
    import threading
    import time

    parent = os.getppid() if parent is None else parent

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_SECONDS)
        if on_exit is not None:
            try:
                on_exit()
            finally:
                os._exit(1)
        os._exit(1)

    threading.Thread(target=watch, name="archsim-parent-watch", daemon=True).start()
