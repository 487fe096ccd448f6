import glob
import importlib
import os

import pytest

CORE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src", "kbroker", "_core")


@pytest.fixture(scope="session", autouse=True)
def _extensions_loaded():
    """Guard against a silent fallback to the pure-Python twins (aiokafka's conftest idea):
    with KBROKER_REQUIRE_EXTENSIONS=1 (tools/test.sh sets it) every kernel in
    kbroker/_core/*.pyx must import as a compiled extension."""
    if os.environ.get("KBROKER_REQUIRE_EXTENSIONS") == "1":
        assert os.environ.get("KBROKER_NO_EXTENSIONS") != "1"
        missing = []
        for pyx in sorted(glob.glob(os.path.join(CORE, "*.pyx"))):
            name = os.path.splitext(os.path.basename(pyx))[0]
            try:
                mod = importlib.import_module(f"kbroker._core.{name}")
            except ImportError as e:
                missing.append(f"{name}: {e}")
                continue
            if mod.__file__.endswith(".py"):
                missing.append(f"{name}: imported {mod.__file__}, not an extension")
        assert not missing, "kernels not compiled: " + "; ".join(missing)
    yield
