"""Run ``kbroker.tools.storage`` from a checkout: ``python tools/kbroker_storage.py --help``
(installed: ``kbroker storage --help``)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from kbroker.tools.storage import *  # noqa: E402,F401,F403
from kbroker.tools.storage import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
