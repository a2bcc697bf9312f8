"""Output files written whole or not at all: each is written beside its place and renamed onto
it, so an interrupted run leaves no half-written file that looks complete."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomic(path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` writes the content to a temporary path in the same folder, which then
    replaces ``path``; a device or FIFO (not a regular file) is written to directly."""
    p = Path(path)
    if p.exists() and not p.is_file():
        write(p)
        return
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path, text: str) -> None:
    write_atomic(path, lambda p: p.write_text(text, encoding="utf-8"))


def pyplot():
    """matplotlib.pyplot on the Agg backend (works without a display); the report modules import
    matplotlib only through this."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path) -> None:
    """A matplotlib figure as a PNG."""
    write_atomic(path, lambda p: fig.savefig(p, dpi=110, format="png"))
