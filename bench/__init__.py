"""kbroker benchmarks: trace writer (:mod:`bench.trace`), drivers, and the
PySpark regression report (:mod:`bench.report`). See bench/README.md.

Nothing under ``bench`` is part of the installed broker package.
"""
