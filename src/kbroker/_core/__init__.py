"""Compiled hot-path kernels (Cython) and their pure-Python twins (``ref/``).

Nothing in ``kbroker._core`` imports from the rest of ``kbroker``: it is the
bottom layer. Which implementation the broker uses is decided in one place,
:mod:`kbroker.kernels`.
"""
