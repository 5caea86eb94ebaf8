"""The package version (``pyproject.toml``'s), in a leaf module so the command line can print
it without importing the whole public API."""

__version__ = "0.1.0"
