"""The MPI base: what every MPI program here needs (torch-free: mpi4py and numpy at most)."""
