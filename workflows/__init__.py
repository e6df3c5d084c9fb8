"""Runnable jobs, the ``dslide`` command line and benchmarks (package ``dslide_workflows``).

Everything here only wires the library (:mod:`dslide_dask`) together; the numerics live there.
"""
