"""Performance regression report over benchmark traces (issue 7).

``python -m bench.report --runs DIR [DIR...] [--baseline DIR ...]`` reads run
directories written by :class:`bench.trace.TraceWriter` and Apache Kafka
OpenMessaging-Benchmark result JSONs with PySpark, and writes report.md,
report.html, plots/*.png and verdict.json. See bench/README.md.

Layout: ``spark`` (session), ``schemas`` (explicit Spark schemas),
``sources`` (hardware facts of published results), ``loaders`` (validate in
Python, then read with Spark), ``aggregate`` (Spark aggregations),
``stats`` (numpy/scipy statistics), ``compare`` (verdicts), ``plots``,
``render``, ``cli``. This package never imports ``kbroker``.
"""
