"""Build the Cython kernels in src/kbroker/_core.

Every ``src/kbroker/_core/*.pyx`` becomes the extension ``kbroker._core.<name>``.
C sources a kernel needs beside its .pyx are listed in EXTRA_SOURCES.

Environment:
  KBROKER_EXT_ONLY=a,b   build only these kernels (tools/build_ext.py uses it)
  KBROKER_DEBUG=1        annotate, line tracing, no -O3
"""
import glob
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join("src", "kbroker", "_core")
EXTRA_SOURCES = {
    "crc32c": [os.path.join(CORE, "src", "crc32c_impl.c")],
}
DEBUG = os.environ.get("KBROKER_DEBUG") == "1"


def extensions():
    only = {n for n in os.environ.get("KBROKER_EXT_ONLY", "").split(",") if n}
    exts = []
    for pyx in sorted(glob.glob(os.path.join(CORE, "*.pyx"), root_dir=HERE)):
        name = os.path.splitext(os.path.basename(pyx))[0]
        if only and name not in only:
            continue
        exts.append(
            Extension(
                f"kbroker._core.{name}",
                [pyx] + EXTRA_SOURCES.get(name, []),
                include_dirs=[os.path.join(CORE, "src"), CORE],
                extra_compile_args=["-O0", "-g"] if DEBUG else ["-O3"],
                define_macros=[("CYTHON_TRACE_NOGIL", "1")] if DEBUG else [],
            )
        )
    return cythonize(
        exts,
        compiler_directives={
            "language_level": "3",
            "binding": False,
            "linetrace": DEBUG,
        },
        annotate=DEBUG,
        include_path=[CORE],
    )


setup(ext_modules=extensions())
