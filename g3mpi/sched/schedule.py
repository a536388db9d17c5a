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

Neighbour partial results are computed in arrival order but summed in a fixed order (local, then neighbours by
rank), so the result does not depend on which message lands first, not even in rounding.

Every block product is ``blocks.spmm`` (the pipeline's too): written in place, without a zero-filled result;
forward writes each row range of the local block straight into its rows of the output, backward each halo
gradient into its slice of the send buffer and each row range of the local transpose into the gradient.
"""
from __future__ import annotations

import torch

from .blocks import BlockMatrix, chunk_rows_for, spmm

MODES = ("pipelined", "blocking", "nocomm")


class Schedule:
    """How layers interleave computation with their halo exchange (see the module docstring)."""

    def __init__(self, mode: str = "pipelined", chunk_rows: int = 0, interlayer: bool = True):
        if mode not in MODES:
            raise ValueError(f"schedule {mode!r}: expected one of {', '.join(MODES)}")
        self.mode = mode
        self.chunk_rows = int(chunk_rows)
        self.interlayer = bool(interlayer)  # GCN/SAGE: boundary rows first across layers (g3mpi.ops.pipeline)

    @property
    def communicates(self) -> bool:
        return self.mode != "nocomm"

    def rows_per_chunk(self, width: int, pending: int) -> int:
        """0 = one chunk. Automatic chunking only happens in the pipelined schedule with messages to poll for
        (``pending`` receives); a positive ``chunk_rows`` forces chunks of that size in every mode."""
        if self.chunk_rows < 0:
            return 0
        if self.chunk_rows == 0 and (self.mode != "pipelined" or pending == 0):
            return 0
        return chunk_rows_for(width, self.chunk_rows)

    # -- waiting helpers ----------------------------------------------------------------------------------------
    def poll(self, transfer) -> list:
        return transfer.test() if self.mode == "pipelined" else []

    def rest(self, transfer) -> list:
        """Everything not yet landed (blocking until it has); for nocomm, every index."""
        if not self.communicates:
            return list(range(transfer.num_recvs))
        out = []
        while True:
            got = transfer.wait_some()
            if not got:
                return out
            out += got

    # -- sparse aggregation (GCN, SAGE) -------------------------------------------------------------------------
    def spmm_forward(self, blocks: BlockMatrix, ex, h: torch.Tensor) -> torch.Tensor:
        """out [n_own, F] = local @ h + sum_i N_i @ halo_i, with the forward exchange of ``h`` in flight."""
        tr = ex.forward
        if self.communicates:
            ex.start_forward(h.numpy())
        halo = torch.from_numpy(ex.halo)
        slices = [ex.plan.recv_slice(i) for i in range(tr.num_recvs)]
        partial = [None] * tr.num_recvs

        def compute(landed):
            for i in landed:
                partial[i] = spmm(blocks.neighbours[i].mat, halo[slices[i]])

        if self.mode == "blocking":
            compute(self.rest(tr))
        chunks = blocks.chunks(self.rows_per_chunk(h.shape[1], tr.num_recvs))
        out = torch.empty(blocks.num_owned, h.shape[1], dtype=h.dtype)
        for a, b, mat in chunks:
            spmm(mat, h, out[a:b])
            compute(self.poll(tr))
        compute(self.rest(tr))
        for i, nb in enumerate(blocks.neighbours):
            out.index_add_(0, nb.rows, partial[i])
        return out

    def spmm_backward(self, blocks: BlockMatrix, ex, g: torch.Tensor) -> torch.Tensor:
        """grad_h [n_own, F] = local^T @ g + (halo gradients that other ranks send back for our rows)."""
        tr = ex.backward
        if self.communicates:
            tr.post_recvs()
        hg = torch.from_numpy(ex.halo_grad)
        for i, nb in enumerate(blocks.neighbours):
            spmm(nb.mat_t, g.index_select(0, nb.rows), hg[ex.plan.recv_slice(i)])
            if self.communicates:
                tr.send(i)
        if self.mode == "blocking":
            self.rest(tr)
        tchunks = blocks.transpose_chunks(self.rows_per_chunk(g.shape[1], tr.num_recvs))
        if len(tchunks) == 1:
            grad = spmm(tchunks[0][2], g)
            self.poll(tr)
        else:
            grad = torch.empty(blocks.num_owned, g.shape[1], dtype=g.dtype)
            for a, b, mat in tchunks:
                spmm(mat, g, grad[a:b])
                self.poll(tr)
        self.rest(tr)
        for i, idx in enumerate(ex.plan.send_idx):
            grad.index_add_(0, torch.from_numpy(idx), torch.from_numpy(ex.grad_bufs[i]))
        return grad
