"""The package version, at the bottom of the import graph (caches and databases key on it)."""
__version__ = "0.1.0"
