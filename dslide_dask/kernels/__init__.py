"""numba kernels: plain arrays in, plain arrays out; nothing here knows of Dask."""
