"""Point-to-point halo exchange between neighbouring ranks (mpi4py + numpy; no torch, no models)."""
from .halo import CommContext, CommStats, HaloExchange, HaloPlan, SendQueue, Transfer, piece_bounds
from .simnet import DirectNet, SimNet, parse_sim_net

__all__ = ["CommContext", "CommStats", "HaloExchange", "HaloPlan", "SendQueue", "Transfer", "DirectNet", "SimNet",
           "parse_sim_net", "piece_bounds"]
