"""Point-to-point halo exchange between neighbouring ranks (mpi4py + numpy; no torch, no models)."""
from .halo import CommContext, CommStats, HaloExchange, HaloPlan, Transfer
from .simnet import SimNet, parse_sim_net

__all__ = ["CommContext", "CommStats", "HaloExchange", "HaloPlan", "Transfer", "SimNet", "parse_sim_net"]
