"""Moved to the shared MPI base: :mod:`g3mpi.mpi.collectives`, :mod:`g3mpi.mpi.ghost`, :mod:`g3mpi.mpi.rss`.
This name stays for existing imports; new code imports from there."""
from g3mpi.mpi.collectives import (RankFailed, agree, allgather_rows, allgather_text, allreduce, alltoallv,
                                   displacements, exchange_counts, rank_bounds)
from g3mpi.mpi.ghost import GhostPlan
from g3mpi.mpi.rss import peak_rss_mib

__all__ = ["RankFailed", "agree", "allgather_rows", "allgather_text", "allreduce", "alltoallv", "displacements",
           "exchange_counts", "rank_bounds", "GhostPlan", "peak_rss_mib"]
