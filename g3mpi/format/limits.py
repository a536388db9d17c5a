"""float32's limits on features: values that are not finite as float32 are refused, values whose square
float32 cannot hold are warned about (the one check of every reader and writer of features)."""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from .errors import FormatError

log = logging.getLogger(__name__)

#: 2^64 (about 1.8e19), the square root of float32's largest value (3.4e38): a feature (or a gradient, which the
#: features scale) beyond it has a square that float32 cannot hold, as Adam's second moments must. Measured (one rank,
#: 200 nodes, GCN, SAGE and GAT, Adam, one feature entry set): up to 1e22 trained as before; from 1e23 to 1e37 some
#: of Adam's second moments became infinite, which froze their parameters, and the run exited 0; at 3e38 the loss
#: was NaN. Read-time validation warns about features beyond it; g3-train stops when the summed gradients pass it.
FLOAT32_SQUARE_LIMIT = 2.0 ** 64


class LargeFeatures:
    """The feature rows that reach :data:`FLOAT32_SQUARE_LIMIT` in magnitude, found over row blocks: finite, so
    valid, but too large for float32 training (g3-train stops once the gradients they scale pass the same limit).
    The one check of every reader and writer of features (g3-prepare's writer, a graph file's loaders,
    g3-partition, a part file's reader): :meth:`scan` each block in turn (NaN and Inf are the caller's to refuse,
    by :func:`check_finite_features`, first or when :meth:`scan` returns one), then :meth:`warn` once, one line
    naming the file, the number of such nodes and the first. Two reductions per block (max and min), no
    temporary array unless a block holds such a value."""

    def __init__(self):
        self.nodes = 0               # rows found so far
        self.first: int | None = None   # node ID of the first (``start`` + its row)
        self.peak = 0.0              # the largest magnitude

    def scan(self, block: np.ndarray, start: int = 0) -> float:
        """Count the rows of the 2-D ``block`` (rows ``start``, ``start + 1``, ...) that reach the limit. Returns
        the block's largest magnitude (0 if empty; NaN if it holds a NaN, Inf an Inf: nothing is counted then), so
        that a caller that has not checked the block can refuse it without another pass."""
        if not block.size:
            return 0.0
        peak = max(float(block.max()), -float(block.min()))   # (both NaN if one value is)
        if not FLOAT32_SQUARE_LIMIT <= peak < np.inf:
            return peak
        rows = np.flatnonzero((np.abs(block) >= FLOAT32_SQUARE_LIMIT).any(axis=1))
        if self.first is None:
            self.first = start + int(rows[0])
        self.nodes += len(rows)
        self.peak = max(self.peak, peak)
        return peak

    def warn(self, path, orig_ids: np.ndarray | None = None, offset: int = 0) -> bool:
        """Log the warning for ``path`` if some row reached the limit (True then); ``orig_ids[first - offset]``,
        if given, is the first node's original ID."""
        if self.first is None:
            return False
        orig = "" if orig_ids is None else f", original ID {int(orig_ids[self.first - offset])}"
        log.warning("%s: the features of %d node(s) reach %.3g in magnitude (the first: node %d%s), beyond 2^64 = "
                    "1.8e19, whose square float32 cannot hold: float32 training on them is likely to overflow "
                    "(g3-train stops if the summed gradients pass 2^64); scale them, or replace such values (a fill "
                    "value for missing data?)", path, self.nodes, self.peak, self.first, orig)
        return True


def check_finite_features(path, block: np.ndarray, start: int = 0, rows: str | Callable[[int], str] = "node",
                          note: str = "") -> None:
    """The one check that features are finite, of every reader and writer of features (g3-prepare's importers and
    writer, a graph file's loaders, g3-partition, a part file's reader): FormatError naming ``path``, the first
    row of the 2-D ``block`` (``start`` + its row, called ``rows``: "node" for a graph's or a part's node IDs,
    "row" for an input file's rows; or a function of it that names it, e.g. with its line in a text file), its
    column and its value, if ``block`` holds a value that is not finite as float32: NaN, an infinity, or (in a
    wider type, float64) one beyond float32's range, which float32 would hold as an infinity; ``note`` ends the
    message. Pass the block as read, before any conversion to float32,
    so that the message shows the value the file holds; a caller that has scanned the block with
    :class:`LargeFeatures` calls this only when :meth:`LargeFeatures.scan` returned NaN or Inf."""
    if not np.issubdtype(block.dtype, np.floating):
        return   # integers are finite, and every int64 is within float32's range
    with np.errstate(over="ignore"):
        bad = ~np.isfinite(block.astype(np.float32, copy=False))
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        row = f"{rows} {start + r}" if isinstance(rows, str) else rows(start + r)
        raise FormatError(path, f"features of {row} are not finite as float32 (column {c}: "
                                f"{float(block[r, c]):g}; NaN, Inf or beyond float32's range){note}")

