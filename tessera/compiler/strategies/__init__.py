"""The strategies: one module per kind of kernel, each registering itself when imported (see
base.py for what a strategy owns, and README.md for adding one). Every module of this package
is imported here, so a new strategy is its own module and nothing else; the strategies claim
disjoint sets of nodes, so the order they register in changes no kernel."""
import importlib
import pkgutil

from .base import REGISTRY, Strategy, get, of, owner, register, routine_owner  # noqa: F401

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"):
    importlib.import_module(f"{__name__}.{_module}")
