"""Offline analysis of kbroker data with PySpark (optional dependency).

``kbroker.analysis.spark_source``: the ``"kbroker"`` Spark data source over
log segment files. Importing this package does not import pyspark.
"""
