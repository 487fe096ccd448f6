"""``python -m bench.report``: see :func:`bench.report.cli.main`."""
import sys

from bench.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
