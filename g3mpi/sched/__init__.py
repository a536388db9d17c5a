"""Rank-local scheduling policy: the modes, the chunk rule, when to poll and when to wait for messages in flight,
and the layer protocol the inter-layer pipeline drives."""
from .schedule import MODES, Schedule

__all__ = ["MODES", "Schedule"]
