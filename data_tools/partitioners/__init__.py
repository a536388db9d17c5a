"""Node→part assignments: METIS (pymetis), random, G3's locality-aware refinement, and the rank-parallel
streaming partitioner (:mod:`.stream`, MPI; imported only by ``data_tools.parallel``).

Each partitioner returns ``(assignment int64 [N], info dict)``; ``data_tools.build.write_partition`` turns an
assignment into a partition directory. The cost model that ranks partitions lives in :mod:`.cost`.
"""
from .cost import CostModel, calibrate, partition_stats, quality
from .metis import BALANCES, OBJECTIVES, metis_partition, symmetrize
from .random import random_partition

METHODS = ("metis", "random", "g3", "stream")

__all__ = ["BALANCES", "METHODS", "OBJECTIVES", "CostModel", "calibrate", "metis_partition",
           "partition_stats", "quality", "random_partition", "symmetrize"]
