"""Shared set-up of the Python benchmarks.

OpenBLAS starts worker threads when numpy is imported; after numpy calls they spin for a
while, and on a two-core machine they took 6 % of the samples of a benchmark run (perf),
time taken from the thread being timed. No benchmark here uses BLAS: one thread."""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
