"""The numba engine: state as NamedTuples of numpy arrays, free @njit functions."""
