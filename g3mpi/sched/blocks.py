"""Column blocks and row chunks of one rank's aggregation matrix.

The aggregation ``out = A @ [h_own; h_halo]`` of a rank splits by columns into the local block (owned sources,
plus the diagonal when the model adds self loops) and one block per receive neighbour (the columns of that
neighbour's halo slice), so each neighbour's block can be computed as soon as its message lands. A neighbour
block keeps only the rows that have an edge from that neighbour (``rows``), so its cost is its own edge count.

The local block is split by rows into chunks so a scheduler can poll pending messages between them; rows that
some neighbour needs (boundary rows) get their own chunks ahead of interior rows. Every block keeps its
transpose, precomputed once, for the backward pass.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch

#: bytes of output per row chunk when the chunk size follows the feature width
CHUNK_BYTES = 1 << 20


def to_torch_csr(m: sp.csr_matrix) -> torch.Tensor:
    """scipy CSR -> torch CSR (int64 indices). Callers pass matrices built from a validated part file."""
    m = m.tocsr()
    m.sort_indices()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                       torch.from_numpy(m.indices.astype(np.int64)),
                                       torch.from_numpy(np.ascontiguousarray(m.data, dtype=np.float32)),
                                       size=m.shape, check_invariants=False)


def chunk_rows_for(width: int, chunk_rows: int) -> int:
    """Rows per chunk: ``chunk_rows`` if positive, else about CHUNK_BYTES of float32 output."""
    if chunk_rows > 0:
        return int(chunk_rows)
    return max(64, CHUNK_BYTES // (4 * max(1, int(width))))


@dataclass
class NeighbourBlock:
    """Block of receive neighbour i: ``rows`` [r] owned rows with an edge from its halo slice;
    ``mat`` [r, slice] and ``mat_t`` [slice, r] as torch CSR; ``src``/``dst`` the same edges as COO
    (source position in the slice, destination position in ``rows``)."""

    rows: torch.Tensor
    mat: torch.Tensor
    mat_t: torch.Tensor
    dst: torch.Tensor
    src: torch.Tensor


class BlockMatrix:
    """One rank's aggregation matrix split into blocks; built once per (part, edge weights).

    ``values`` are the weights of the part's CSR entries (None = 1), ``diag`` the weights of added self loops
    (None = no self loops). Chunks are made on demand per row count and cached.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, num_owned: int, recv_offsets: np.ndarray,
                 boundary_rows: np.ndarray, values: np.ndarray | None = None, diag: np.ndarray | None = None):
        n = int(num_owned)
        self.num_owned = n
        indices = np.asarray(indices, dtype=np.int64)
        indptr = np.asarray(indptr, dtype=np.int64)
        if values is None:
            values = np.ones(len(indices), dtype=np.float32)
        n_halo = int(recv_offsets[-1]) if len(recv_offsets) else 0
        full = sp.csr_matrix((np.asarray(values, np.float32), indices, indptr), shape=(n, n + n_halo))
        local = full[:, :n].tocsr()
        if diag is not None:
            local = (local + sp.diags(np.asarray(diag, np.float32), format="csr", shape=(n, n))).tocsr()
        local.sort_indices()
        self._local_sp = local
        self.local = to_torch_csr(local)
        self.local_t = to_torch_csr(local.T.tocsr())
        rows_all = np.repeat(np.arange(n, dtype=np.int64), np.diff(local.indptr))
        self.local_dst = torch.from_numpy(rows_all)
        self.local_src = torch.from_numpy(local.indices.astype(np.int64))
        self.has_diag = diag is not None
        self.neighbours = []
        self._nb_sp = []
        for i in range(len(recv_offsets) - 1):
            a, b = n + int(recv_offsets[i]), n + int(recv_offsets[i + 1])
            blk = full[:, a:b].tocsr()
            blk.sort_indices()
            rows = np.nonzero(np.diff(blk.indptr))[0].astype(np.int64)
            sub = blk[rows].tocsr()
            sub.sort_indices()
            dst = np.repeat(np.arange(len(rows), dtype=np.int64), np.diff(sub.indptr))
            self._nb_sp.append(sub)
            self.neighbours.append(NeighbourBlock(
                rows=torch.from_numpy(rows), mat=to_torch_csr(sub), mat_t=to_torch_csr(sub.T.tocsr()),
                dst=torch.from_numpy(dst), src=torch.from_numpy(sub.indices.astype(np.int64))))
        self.boundary = np.asarray(boundary_rows, dtype=np.int64)
        self._chunks = {}
        self._tchunks = {}

    def chunks(self, rows_per_chunk: int) -> list:
        """Row chunks of the local block, boundary rows first: list of (rows LongTensor or None, CSR).
        ``rows=None`` means the chunk is every row in order (no chunking)."""
        n = self.num_owned
        if rows_per_chunk <= 0 or rows_per_chunk >= n:
            return [(None, self.local)]
        if rows_per_chunk not in self._chunks:
            is_b = np.zeros(n, dtype=bool)
            is_b[self.boundary] = True
            order = np.concatenate([np.nonzero(is_b)[0], np.nonzero(~is_b)[0]])
            nb = int(is_b.sum())
            cuts = sorted(set(list(range(0, nb, rows_per_chunk)) + list(range(nb, n, rows_per_chunk)) + [n]))
            out = []
            for a, b in zip(cuts[:-1], cuts[1:]):
                r = np.sort(order[a:b])
                out.append((torch.from_numpy(r), to_torch_csr(self._local_sp[r])))
            self._chunks[rows_per_chunk] = out
        return self._chunks[rows_per_chunk]

    def transpose_chunks(self, rows_per_chunk: int) -> list:
        """Contiguous row ranges of the local transpose: list of (start, stop, CSR)."""
        n = self.num_owned
        if rows_per_chunk <= 0 or rows_per_chunk >= n:
            return [(0, n, self.local_t)]
        if rows_per_chunk not in self._tchunks:
            lt = self._local_sp.T.tocsr()
            self._tchunks[rows_per_chunk] = [(a, min(n, a + rows_per_chunk), to_torch_csr(lt[a:a + rows_per_chunk]))
                                             for a in range(0, n, rows_per_chunk)]
        return self._tchunks[rows_per_chunk]


@dataclass
class RowGroup:
    """The aggregation restricted to a sorted set of owned rows (boundary or interior rows).

    ``rows`` [r]; ``local``/``local_t``: the local block's rows [r, n_owned] and its transpose; per receive
    neighbour i, ``nb[i] = (pos, mat, mat_t)``: positions in ``rows`` of the rows with an edge from i, that
    block [len(pos), slice_i] and its transpose (None when no row of the group has an edge from i);
    ``send_pos``: per send neighbour, positions in ``rows`` of the rows it needs (boundary group only).
    """

    rows: torch.Tensor
    local: torch.Tensor
    local_t: torch.Tensor
    nb: list
    send_pos: list | None = None
    local_sp: object = None
    _chunks: dict = field(default_factory=dict)

    def chunks(self, rows_per_chunk: int) -> tuple[list, list]:
        """(forward chunks [(a, b, CSR of group rows a:b)], backward chunks [(a, b, CSR of owned rows a:b of
        the transpose)]) for ``rows_per_chunk`` (0: one chunk each)."""
        if rows_per_chunk <= 0 or len(self.rows) == 0:
            n = self.local.shape[1]
            return [(0, len(self.rows), self.local)], [(0, n, self.local_t)]
        if rows_per_chunk not in self._chunks:
            m = self.local_sp
            mt = m.T.tocsr()
            self._chunks[rows_per_chunk] = (
                [(a, min(a + rows_per_chunk, m.shape[0]), to_torch_csr(m[a:a + rows_per_chunk]))
                 for a in range(0, m.shape[0], rows_per_chunk)],
                [(a, min(a + rows_per_chunk, mt.shape[0]), to_torch_csr(mt[a:a + rows_per_chunk]))
                 for a in range(0, mt.shape[0], rows_per_chunk)])
        return self._chunks[rows_per_chunk]


def row_groups(bm: "BlockMatrix", send_idx: list) -> tuple[RowGroup, RowGroup]:
    """Split ``bm`` into the boundary rows (in some send list) and the interior rows."""
    n = bm.num_owned
    is_b = np.zeros(n, dtype=bool)
    is_b[bm.boundary] = True
    groups = []
    for sel in (is_b, ~is_b):
        rows = np.nonzero(sel)[0].astype(np.int64)
        loc = bm._local_sp[rows].tocsr()
        nb = []
        for blk, sp_blk in zip(bm.neighbours, bm._nb_sp):
            keep = sel[blk.rows.numpy()]
            if not keep.any():
                nb.append(None)
                continue
            sub = sp_blk[np.nonzero(keep)[0]].tocsr()
            pos = np.searchsorted(rows, blk.rows.numpy()[keep])
            nb.append((torch.from_numpy(pos.astype(np.int64)), to_torch_csr(sub), to_torch_csr(sub.T.tocsr())))
        groups.append(RowGroup(rows=torch.from_numpy(rows), local=to_torch_csr(loc),
                               local_t=to_torch_csr(loc.T.tocsr()), nb=nb, local_sp=loc))
    b = groups[0]
    rows_b = b.rows.numpy()
    b.send_pos = [np.ascontiguousarray(np.searchsorted(rows_b, idx)) for idx in send_idx]
    return groups[0], groups[1]
