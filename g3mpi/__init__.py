"""g3mpi: exact full-graph GNN training over MPI ranks."""
__version__ = "0.1.0"
