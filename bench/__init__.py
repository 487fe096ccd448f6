"""kbroker benchmarks: trace writer (:mod:`bench.trace`), drivers, and the
PySpark regression report (:mod:`bench.report`). See bench/README.md.

Nothing under ``bench`` is part of the installed broker package.
"""

import importlib.util as _util

# What every driver imports; the report adds pyspark/scipy/matplotlib (same extra).
_NEEDED = ("numpy", "pyarrow", "confluent_kafka")
_missing = [m for m in _NEEDED if _util.find_spec(m) is None]
if _missing:
    raise SystemExit(f"bench needs {', '.join(_missing)}: run  python3 -m pip install '.[bench]'  "
                     "in the repository root (bash tools/test.sh installs it too)")
