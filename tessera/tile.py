"""The users' `tessera.tile`: re-exports the builtins of tessera/kernel/builtins.py."""
from .kernel.builtins import *  # noqa: F401,F403
from .kernel.builtins import __all__, __getattr__  # noqa: F401
