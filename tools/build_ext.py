"""Build Cython kernels in place, optionally only some of them.

    python tools/build_ext.py                 # all kernels
    python tools/build_ext.py crc32c records  # only these

Same Extension definitions as ``pip install .`` (setup.py); useful while
working on one kernel when another one is mid-edit.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    env = dict(os.environ)
    if sys.argv[1:]:
        env["KBROKER_EXT_ONLY"] = ",".join(sys.argv[1:])
    sys.exit(subprocess.call([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=ROOT, env=env))
