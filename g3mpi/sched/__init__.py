"""Rank-local scheduling of aggregation blocks and row chunks around in-flight halo messages."""
from .blocks import BlockMatrix, RowGroup, chunk_rows_for, row_groups
from .schedule import MODES, Schedule

__all__ = ["BlockMatrix", "RowGroup", "row_groups", "chunk_rows_for", "MODES", "Schedule"]
