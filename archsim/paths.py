"""Where the built-in data lives (configs/, isa/, workloads/).

In a source checkout (or an editable install) the data sits beside the package at the repository
root; a wheel carries the same directories as ``archsim._builtin.*``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_KINDS = ("configs", "isa", "workloads")


@lru_cache(maxsize=None)
def data_dir(kind: str) -> Path:
    if kind not in _KINDS:
        raise ValueError(f"unknown data kind {kind!r}")
    here = Path(__file__).resolve().parent
    installed = here / "_builtin" / kind
    if installed.is_dir():
        return installed
    checkout = here.parent / kind
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"archsim data directory {kind!r} not found beside {here}")


def isa_kernel(folder: str, name: str) -> Path | None:
    """isa/<folder>/NAME.s (a built-in kernel by its bare name), or None when there is none."""
    path = data_dir("isa") / folder / f"{name}.s"
    return path if path.is_file() else None


def isa_kernel_names(folder: str) -> list[str]:
    """The built-in kernels of isa/<folder>, for an error line's list of what is allowed."""
    return sorted(p.stem for p in (data_dir("isa") / folder).glob("*.s"))
