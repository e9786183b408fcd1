"""The seeds' spelling of the PyTorch bridge: ``tessera.migrate.from_pytorch(model, *example)``
is ``ts.from_torch`` (tessera/aten.py), which returns ``(function, params)``."""
from .aten import from_torch as from_pytorch

__all__ = ["from_pytorch"]
