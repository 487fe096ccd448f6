"""One local SparkSession for the whole test session (bench.report and the
kbroker data source tests share it). Import the fixture into a test module:
``from conftest_spark import spark  # noqa: F401``."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spark():
    # Python workers must import kbroker and bench (not installed in the test env)
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from bench.report.spark import get_spark
    session = get_spark("local[2]", app_name="kbroker-tests")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()
