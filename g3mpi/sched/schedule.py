"""The rank-local scheduler: in which order one layer computes its blocks while its messages are in flight.

Modes:
  ``pipelined`` (default): post every receive, send at once, compute the local block chunk by chunk (row
      ranges in order; GCN/SAGE run the inter-layer pipeline instead, boundary rows first across layers:
      ``g3mpi.ops.pipeline``), polling the pending requests between chunks, and compute each neighbour's block
      as soon as its message has landed; the last arrivals are waited for at the end. Backward mirrors it: the
      halo-gradient blocks are computed first and each is sent at once, then the local transpose runs chunk by
      chunk while the gradients for our rows arrive.
  ``blocking``: exchange, wait for everything, then compute (the baseline).
  ``nocomm``: skip the exchange and compute on whatever the halo buffers hold (measurement only: compute time
      without communication; results are wrong, except on one rank, which has no halo).

Pieces: each neighbour's message travels as several messages (pieces: contiguous row ranges of its send list,
about ``piece_bytes`` each, ``Schedule.rows_per_piece``), so that in the pipelined schedule the receiver computes
the rows of the neighbour's block whose last halo row a piece brings as soon as the pieces up to it have landed
(each row whole: ``g3mpi.ops.blocks.ForwardPieces``), and only the rows reading the last piece are left when the
wire is done; in backward the halo gradient is computed piece by piece and each piece sent
at once, and the owner adds each returned piece as it lands. Small messages are one piece. The blocking schedule
waits for every piece and computes each block whole.

Neighbour partial results are computed in arrival order but summed in a fixed order (local, then neighbours by
rank; each neighbour block's rows summed as from one whole message), so the result does not depend on which
message lands first, not even in rounding.

The chunk rule (``Schedule.rows_per_chunk``) and the piece rule (``Schedule.rows_per_piece``) are the only ones:
every chunked product and every exchange asks them (the layer-by-layer aggregation, the inter-layer pipeline,
forward and backward). The products themselves are ``g3mpi.ops``'s.
"""
from __future__ import annotations

MODES = ("pipelined", "blocking", "nocomm")
PIPELINED, BLOCKING, NOCOMM = MODES
#: bytes of float32 output per row chunk when the chunk size follows the feature width
CHUNK_BYTES = 1 << 20
#: fewest rows of an automatic chunk (smaller ones cost more in calls than they gain in polls)
MIN_CHUNK_ROWS = 64
#: bytes per piece of a neighbour's message (``Schedule.rows_per_piece``)
PIECE_BYTES = 2 << 20


class Schedule:
    """How layers interleave computation with their halo exchange (see the module docstring)."""

    def __init__(self, mode: str = PIPELINED, chunk_rows: int = 0, interlayer: bool = True,
                 piece_bytes: int = PIECE_BYTES):
        if mode not in MODES:
            raise ValueError(f"schedule {mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode
        self.chunk_rows = int(chunk_rows)
        self.piece_bytes = int(piece_bytes)
        self.interlayer = bool(interlayer)  # GCN/SAGE: boundary rows first across layers (g3mpi.ops.pipeline)

    @property
    def communicates(self) -> bool:
        return self.mode != NOCOMM

    @property
    def waits_first(self) -> bool:
        """Every message is waited for before the computation that needs it starts (the baseline)."""
        return self.mode == BLOCKING

    @property
    def pipelines(self) -> bool:
        """Row-wise layers run the inter-layer pipeline (``g3mpi.ops.pipeline``)."""
        return self.mode == PIPELINED and self.interlayer

    def rows_per_chunk(self, width: int, pending: int) -> int:
        """The chunk rule: rows per chunk of a product ``width`` floats wide, 0 = one chunk. A positive
        ``chunk_rows`` forces chunks of that size in every mode, a negative one none; automatic chunks (about
        CHUNK_BYTES of output) only in the pipelined schedule with messages to poll for (``pending``)."""
        if self.chunk_rows != 0:
            return max(0, self.chunk_rows)
        if self.mode != PIPELINED or pending == 0:
            return 0
        return max(MIN_CHUNK_ROWS, CHUNK_BYTES // (4 * max(1, int(width))))

    def rows_per_piece(self, width: int, itemsize: int = 4) -> int:
        """The piece rule: rows per piece of a neighbour's message ``width`` values of ``itemsize`` bytes wide
        (about ``piece_bytes`` each; 0 = whole messages). Fixed when an exchange is planned, whatever the mode
        later (a piece is a message: both ends must agree on them), so it does not depend on the mode."""
        if self.piece_bytes <= 0:
            return 0
        return max(1, self.piece_bytes // (itemsize * max(1, int(width))))

    @staticmethod
    def chunk_rows_idle(chunk_rows: int, mode: str, ranks: int) -> str | None:
        """Why a ``chunk_rows`` setting changes nothing under the rule above (None when it does)."""
        if chunk_rows < 0 and (ranks == 1 or mode != PIPELINED):
            who = "one rank, with no messages to poll for," if ranks == 1 else f"the {mode} schedule"
            return f"{who} computes without chunks unless chunk_rows is positive"
        return None

    # -- waiting helpers ----------------------------------------------------------------------------------------
    def poll(self, transfer) -> list:
        return transfer.test() if self.mode == PIPELINED else []

    def arrivals(self, transfer):
        """Batches of the receives not yet landed, each as it lands (blocking for it), until none is left; for
        nocomm, every index in one batch."""
        if not self.communicates:
            yield list(range(transfer.num_recvs))
            return
        while True:
            got = transfer.wait_some()
            if not got:
                return
            yield got

    def rest(self, transfer) -> list:
        """Everything not yet landed (blocking until it has); for nocomm, every index."""
        return [i for batch in self.arrivals(transfer) for i in batch]
