"""archsim: a cycle-level accelerator architecture simulator (NVIDIA-style GPUs and the Sunway SW26010-Pro)."""

__version__ = "0.1.0"
