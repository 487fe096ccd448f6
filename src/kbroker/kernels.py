"""The one place that chooses compiled kernels or their pure-Python twins.

``KBROKER_NO_EXTENSIONS=1`` forces the twins. Otherwise the compiled kernel
is used and a missing one is an ImportError (no silent fallback), unless
``KBROKER_ALLOW_FALLBACK=1`` is set.

Usage: ``from kbroker.kernels import crc32c`` gives the selected module.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

NO_EXTENSIONS = os.environ.get("KBROKER_NO_EXTENSIONS") == "1"
ALLOW_FALLBACK = os.environ.get("KBROKER_ALLOW_FALLBACK") == "1"

#: kernel name -> "cython" | "python", for every kernel selected so far
SELECTED: dict[str, str] = {}


def load(name: str) -> ModuleType:
    """Return the selected implementation of kernel ``name``."""
    if not NO_EXTENSIONS:
        try:
            mod = importlib.import_module(f"kbroker._core.{name}")
            SELECTED[name] = "cython"
            return mod
        except ImportError as e:
            if not ALLOW_FALLBACK:
                raise ImportError(
                    f"kbroker's compiled kernel kbroker._core.{name} is missing ({e}): build it with "
                    f"'pip install -e .' (or 'python tools/build_ext.py') in the checkout, or run with "
                    f"KBROKER_NO_EXTENSIONS=1 for the slow pure-Python twins") from e
    mod = importlib.import_module(f"kbroker._core.ref.{name}")
    SELECTED[name] = "python"
    return mod


def __getattr__(name: str) -> ModuleType:
    # ``from kbroker.kernels import crc32c`` -> load("crc32c"), cached.
    if name.startswith("_"):
        raise AttributeError(name)
    mod = load(name)
    globals()[name] = mod
    return mod
