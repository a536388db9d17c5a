"""The test suite: a package, so that pytest, the mpiexec-started helpers (``python -m mpi4py -m tests.mpi_x``) and
the test modules all import shared code one way, as ``tests.<module>``."""
