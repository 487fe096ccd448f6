import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _extensions_loaded():
    """Guard against a silent fallback to the pure-Python twins (aiokafka's conftest idea)."""
    if os.environ.get("KBROKER_REQUIRE_EXTENSIONS") == "1":
        assert os.environ.get("KBROKER_NO_EXTENSIONS") != "1"
    yield
