"""archsim: a cycle-level accelerator architecture simulator (NVIDIA-style GPUs and the Sunway SW26010-Pro).

The Python API (archsim.api, loaded on first use): ``load_machine``, ``load_workload``, ``run``,
``compare``; see the README.
"""

from archsim.version import __version__  # noqa: F401

_API = ("load_machine", "load_workload", "run", "compare", "Result", "Comparison")


def __getattr__(name):  # the API is imported lazily: the command line does not pay for it
    if name in _API:
        from archsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'archsim' has no attribute {name!r}")
