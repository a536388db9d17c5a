"""Rank-local scheduling policy: the modes, the chunk rule, when to poll and when to wait for messages in flight,
and the layer protocol the inter-layer pipeline drives."""
from .schedule import BLOCKING, MODES, NOCOMM, PIPELINED, Schedule

__all__ = ["BLOCKING", "MODES", "NOCOMM", "PIPELINED", "Schedule"]
