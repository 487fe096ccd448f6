"""Pure-Python reference twins of the Cython kernels.

Each module here has the same public functions, classes and exceptions as the
compiled kernel of the same name; tests cross-check the two.
"""
