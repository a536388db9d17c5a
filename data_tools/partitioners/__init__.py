"""Node→part assignments: METIS (pymetis), KaMinPar (:mod:`.kaminpar`, optional package), random, G3's
locality-aware refinement, and the rank-parallel streaming partitioner (:mod:`.stream`, MPI; imported only by
``data_tools.parallel``).

Each partitioner returns ``(assignment int64 [N], info dict)``; ``data_tools.build.write_partition`` turns an
assignment into a partition directory. The cost model that ranks partitions lives in :mod:`.cost`.
"""
from .cost import CostModel, calibrate, partition_stats, quality
from .metis import BALANCES, OBJECTIVES, metis_partition, symmetrize
from .random import random_partition

#: ``auto`` picks kaminpar (+ g3 refinement) or stream by the graph's size (data_tools.partition.choose_method)
METHODS = ("auto", "kaminpar", "metis", "random", "g3", "stream")
#: what ``--refine`` may run after a method's own assignment
REFINES = ("none", "g3")

__all__ = ["BALANCES", "METHODS", "REFINES", "OBJECTIVES", "CostModel", "calibrate", "metis_partition",
           "partition_stats", "quality", "random_partition", "symmetrize"]
