"""Run ``kbroker.tools.dump_log`` from a checkout: ``python tools/dump_log.py --help``
(installed: ``kbroker dump-log --help``)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from kbroker.tools.dump_log import *  # noqa: E402,F401,F403
from kbroker.tools.dump_log import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
