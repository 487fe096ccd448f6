"""The report's SparkSession: local by default, spark-submit settings win.

* ``python -m bench.report`` starts a local JVM: master ``local[*]`` (or
  ``--master``), ``spark.driver.memory=1g``, UI off, error-only logging.
* Under ``spark-submit`` (``PYSPARK_GATEWAY_PORT`` is set), every setting
  already given by spark-submit (``--master``, ``--driver-memory``, ``--conf``)
  is kept; only absent defaults are added. No code change is needed.
"""
from __future__ import annotations

import os
from pathlib import Path

LOG4J2 = Path(__file__).with_name("log4j2.properties")

DEFAULTS = {
    "spark.driver.memory": "1g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "true",
}


def get_spark(master: str | None = None, app_name: str = "bench.report"):
    """Return (creating if needed) the SparkSession for the report."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" in os.environ:       # launched by spark-submit
        SparkContext._ensure_initialized()
        have = SparkConf()
        if master:
            builder = builder.master(master)
        for k, v in DEFAULTS.items():
            if k != "spark.driver.memory" and not have.contains(k):
                builder = builder.config(k, v)
    else:
        builder = builder.master(master or "local[*]")
        for k, v in DEFAULTS.items():
            builder = builder.config(k, v)
        if "PYSPARK_SUBMIT_ARGS" not in os.environ:
            builder = builder.config("spark.driver.extraJavaOptions",
                                     f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
