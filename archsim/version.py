"""The one version number: the package metadata (pyproject.toml) and every result record read it here."""

__version__ = "0.7.0.dev0"
