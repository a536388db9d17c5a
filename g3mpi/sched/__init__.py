"""Rank-local scheduling of aggregation blocks and row chunks around in-flight halo messages."""
from .blocks import BlockMatrix, chunk_rows_for
from .schedule import MODES, Schedule

__all__ = ["BlockMatrix", "chunk_rows_for", "MODES", "Schedule"]
