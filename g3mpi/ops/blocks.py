"""Column blocks, row ranges and row groups of one rank's aggregation matrix, and the runtime's one sparse product.

The aggregation ``out = A @ [h_own; h_halo]`` of a rank splits by columns into the local block (owned sources,
plus the diagonal when the model adds self loops) and one block per receive neighbour (the columns of that
neighbour's halo slice), so each neighbour's block can be computed as soon as its message lands. A neighbour
block keeps only the rows that have an edge from that neighbour (``rows``), so its cost is its own edge count;
its transpose has the owned rows as columns, so backward multiplies the whole output gradient, gathering nothing.

The local block is split into contiguous row ranges (chunks) so a scheduler can poll pending messages between
them; each range's product is written in place into its rows of the layer's output. The part format puts the
boundary rows first (``PartData.num_boundary``), so the inter-layer pipeline's row groups (boundary, interior:
``RowGroup``, ``row_groups``) are row ranges too. Every block keeps its transpose, precomputed once.

Where the local block equals its transpose (a symmetric graph and weights: GCN's D^-1/2 (A + I) D^-1/2, a sum, a
GAT pattern), the transpose is the block itself, and the row groups' transposes are each other's blocks: no copy.
A weighting ``w_ij = r_i`` (a mean) is stored as its pattern and a row scaling (``BlockMatrix.row_scale``): the
product is ``r * (A @ h)``. A pattern's values are all ones, and every block and transpose of one ``BlockMatrix``
shares one array of them.

A typed block (``BlockMatrix.fold`` = R relations: R-GCN's per-relation aggregation) has one column per (source,
relation) pair, source-major (column j R + r), and one entry per edge: its product takes the per-relation rows
``x [c, R F]`` as the [c R, F] matrix they are in memory, so one sparse product over one block sums every
relation's messages, and its transpose gives the [c R, F] gradient that is ``[c, R F]``. Its rows are the owned
rows as for any block, so its row groups, chunks and neighbour blocks are those of an untyped one; column
ranges (message pieces, row groups' column split) are R times wider.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch

def to_torch_csr(m: sp.csr_matrix) -> torch.Tensor:
    """scipy CSR -> torch CSR (int32 indices where they fit, sharing scipy's arrays then). Callers pass matrices
    built from a validated part file."""
    m = m.tocsr()
    m.sort_indices()
    return torch_csr(m.indptr, m.indices, m.data, m.shape)


def csr_index_dtype(nnz: int, shape) -> type:
    """int32 when the row pointers and the columns of a CSR with ``nnz`` entries and ``shape`` fit in it, else
    int64. torch's CPU CSR product takes both and gives the same values bit for bit; int32 halves the indices'
    bytes and is faster (it converts int64 indices to int32 on every call where they fit: measured 0.6-1.0x the
    time, 1M rows, 8.9M entries, widths 8-32)."""
    return np.int32 if max(int(nnz), *(int(d) for d in shape)) < 2 ** 31 else np.int64


def torch_csr(indptr, indices, data, shape) -> torch.Tensor:
    """torch CSR from CSR arrays, without invariant checks (callers build them from validated parts). numpy
    indices become :func:`csr_index_dtype`'s type (no copy when they have it already), numpy values float32;
    torch tensors pass unchanged."""
    idx = csr_index_dtype(len(indices), shape)

    def as_tensor(a, dtype):
        return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(as_tensor(indptr, idx), as_tensor(indices, idx),
                                       as_tensor(data, np.float32), size=tuple(shape), check_invariants=False)


def _folded(mat: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None):
    """``x`` and ``out`` as the [cols, F] and [rows, F] matrices a typed block (``BlockMatrix.fold``) multiplies:
    rows of R F values read as R rows of F (views: both are contiguous row ranges)."""
    if x.shape[0] != mat.shape[1]:
        x = x.view(mat.shape[1], -1)
    if out is not None and out.shape[0] != mat.shape[0]:
        out = out.view(mat.shape[0], -1)
    return x, out


def spmm(mat: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``mat @ x`` for a torch CSR ``mat`` [r, c] and a dense ``x`` [c, F]: the one sparse product of the runtime.

    Written into ``out`` ([r, F], or a fresh uninitialised tensor when None) with ``out.addmm_(mat, x, beta=0)``:
    with beta=0 the contents of ``out`` are ignored (NaN included), so there is no zero-filled result and, when
    ``out`` is a row range of a larger tensor (a chunk of a layer's output, a slice of an exchange buffer), no
    copy either. ``torch.sparse.mm`` zero-fills a fresh result; the values are the same bit for bit (CPU, float32
    and float64, int32 and int64 indices: ``tests/test_sched_blocks.py``). A typed block's ``x`` [c, R F] and
    ``out`` [r / R, R F] (its transpose's) are read as [c R, F] and [r, F] (:func:`_folded`); ``out`` is returned
    as given."""
    given = out
    if out is not None and (out.numel() == 0 or mat.shape[1] == 0):    # (an empty row group's block)
        return out.zero_()
    x, out = _folded(mat, x, out)
    if x.dtype == torch.bfloat16:
        y = _bag(mat, x)
        out = y if out is None else out.copy_(y)
    else:
        if out is None:
            out = x.new_empty(mat.shape[0], x.shape[1])
        out.addmm_(mat, x, beta=0)
    return out if given is None else given


def spmm_add(mat: torch.Tensor, x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """``acc += mat @ x`` in place (``acc.addmm_``; a bfloat16 ``x``: :func:`_bag`'s product added; a typed
    block's shapes as :func:`spmm`'s)."""
    if mat._nnz() == 0:     # (nothing to add; an empty row group's block has shapes no view can match)
        return acc
    x, a = _folded(mat, x, acc)
    if x.dtype == torch.bfloat16:
        a.add_(_bag(mat, x))
    else:
        a.addmm_(mat, x)
    return acc


def _bag(mat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``mat @ x`` for a bfloat16 ``x`` (bf16-mixed precision, ``g3mpi.ops.precision``), as a weighted
    ``embedding_bag`` sum over the CSR rows: torch's CSR product refuses bfloat16, and this one reads half the bytes
    and accumulates each row in float32 (0.57x the float32 CSR product's time, 200k rows, 4M entries, width 256,
    one thread). The weights are rounded to bfloat16 once per matrix (kept on it)."""
    if mat._nnz() == 0 or mat.shape[0] == 0:
        return x.new_zeros(mat.shape[0], x.shape[1])
    cached = getattr(mat, "_g3_bag", None)
    if cached is None:
        crow, col = mat.crow_indices(), mat.col_indices()
        lo, hi = int(crow[0]), int(crow[-1])
        if lo:      # (a row range of a larger CSR: its pointers start past 0)
            crow, col = crow - lo, col[lo:hi]
        cached = (col[:hi - lo], crow, mat.values()[lo:hi].to(torch.bfloat16))
        mat._g3_bag = cached
    col, crow, w = cached
    return torch.nn.functional.embedding_bag(col, x, crow, mode="sum", per_sample_weights=w,
                                             include_last_offset=True)


class SpMM(torch.autograd.Function):
    """out = mat @ h; grad_h = mat_t @ grad_out (transpose precomputed)."""

    @staticmethod
    def forward(ctx, h, mat, mat_t):
        ctx.mat_t = mat_t
        return spmm(mat, h.detach())

    @staticmethod
    def backward(ctx, g):
        return spmm(ctx.mat_t, g.contiguous()), None, None


def _torch(m: sp.csr_matrix, unit=None) -> torch.Tensor:
    """torch CSR of a scipy CSR; ``unit(nnz)``: a pattern's shared values (all ones), else ``m``'s own."""
    if unit is None:
        return to_torch_csr(m)
    m = m.tocsr()
    m.sort_indices()
    return torch_csr(m.indptr, m.indices, unit(m.nnz), m.shape)


def _scipy_transpose(m: sp.csr_matrix) -> sp.csr_matrix:
    """``m.T`` as a scipy CSR with sorted indices (scipy's CSR -> CSC conversion: columns come out with sorted
    rows)."""
    t = m.T.tocsr()
    t.sort_indices()
    return t


def _transpose(m: sp.csr_matrix, unit=None) -> torch.Tensor:
    """torch CSR of ``m.T``; ``unit``: as :func:`_torch`."""
    return _torch(_scipy_transpose(m), unit)


def _same(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    """Two CSR with sorted indices hold the same entries (values bit for bit: a product with either is the same)."""
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data))


def _row_range(t: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """Rows a:b of a torch CSR, sharing its column indices and values (only the row pointers are new)."""
    crow = t.crow_indices()
    lo, hi = int(crow[a]), int(crow[b])
    return torch_csr(crow[a:b + 1] - lo, t.col_indices()[lo:hi], t.values()[lo:hi], (b - a, t.shape[1]))


class ForwardPieces:
    """A neighbour block's forward product computed as its message's pieces land (``bounds``: the pieces' column
    bounds, in order): the block's rows grouped by the last piece they read, so that group k is computed whole
    once pieces 0 .. k have landed (:meth:`product`), and only the rows that read the last piece follow the wire.
    Each row is summed as in the whole block's product, bit for bit (the blocking schedule's sums), whatever the
    pieces and the order they land in; every entry is multiplied once and no partial sum is added twice.

    ``rows``: the block's rows in group order (the given ``rows``, the output rows of the block's rows, permuted
    the same way): the product's row j is output row ``rows[j]``. ``groups[k]``: (a, b, CSR of product rows a .. b-1
    over the block's columns) or None where no row's last piece is k; the groups share one copy of the entries
    (one piece: the block itself)."""

    def __init__(self, mat: torch.Tensor, bounds, rows: torch.Tensor, unit=None, fold: int = 1):
        self.fold = int(fold)
        kk = len(bounds) - 1
        if kk <= 1:
            self.rows, self.groups = rows, [(0, mat.shape[0], mat)] + [None] * (kk - 1)
            return
        crow, col = mat.crow_indices().numpy(), mat.col_indices().numpy()
        ends = crow[1:]
        last = np.zeros(mat.shape[0], dtype=np.int64)
        full = ends > crow[:-1]     # (a row without entries is computed with the first piece: zeros)
        last[full] = np.searchsorted(np.asarray(bounds, dtype=np.int64), col[ends[full] - 1], side="right") - 1
        order = np.argsort(last, kind="stable")
        at = np.concatenate([[0], np.cumsum(np.bincount(last, minlength=kk))])
        vals = np.ones(len(col), np.int8) if unit is not None else mat.values().numpy()
        # (scipy's row selection keeps each row's entries in their order)
        perm = _torch(sp.csr_matrix((vals, col, crow), shape=tuple(mat.shape), copy=False)[order], unit)
        self.rows = rows[torch.from_numpy(order)]
        self.groups = [None if at[k] == at[k + 1] else (int(at[k]), int(at[k + 1]),
                                                         _row_range(perm, int(at[k]), int(at[k + 1])))
                       for k in range(kk)]

    def product(self, acc: torch.Tensor | None, k: int, halo: torch.Tensor) -> torch.Tensor:
        """``acc`` (None before piece 0: a fresh [rows, F] tensor) with the rows of group k computed from
        ``halo``, the neighbour's whole halo slice, whose pieces 0 .. k have landed (the later ones are not read)."""
        if acc is None:
            acc = halo.new_empty(len(self.rows), halo.shape[1] // self.fold)
        g = self.groups[k]
        if g is not None:
            spmm(g[2], halo, acc[g[0]:g[1]])
        return acc


def block_pieces(mat: torch.Tensor, mat_t: torch.Tensor, bounds, rows: torch.Tensor, unit=None,
                 fold: int = 1) -> tuple:
    """A neighbour block split by the pieces of its message (column bounds ``bounds`` within the halo slice):
    its forward product by the groups of rows each piece completes (``ForwardPieces``; ``rows``: the block's
    output rows) and the row ranges of ``mat_t`` (backward: piece k of the halo gradient; row ranges share
    ``mat_t``'s storage, and each row is computed as in one product, bit for bit). ``unit``: as :func:`_torch`."""
    fwd = ForwardPieces(mat, bounds, rows, unit, fold)
    if len(bounds) <= 2:
        return fwd, [mat_t]
    return fwd, [_row_range(mat_t, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


class _PieceCache:
    """Pieces of blocks (``block_pieces``), made on first use per (block, bounds) and kept; ``fold``: a typed
    block's R (a halo row is R columns)."""

    def __init__(self, unit=None, fold: int = 1):
        self._d = {}
        self.unit, self.fold = unit, int(fold)

    def get(self, key, mat, mat_t, bounds, rows) -> tuple:
        key = (key, tuple(int(b) for b in bounds))
        if key not in self._d:
            self._d[key] = block_pieces(mat, mat_t, [b * self.fold for b in key[1]], rows, self.unit, self.fold)
        return self._d[key]


def _coo_rows(crow: torch.Tensor) -> torch.Tensor:
    """Row of every entry of a CSR, int64 (the destination index of an edge)."""
    return torch.repeat_interleave(torch.arange(len(crow) - 1, dtype=torch.int64), crow.diff())


def _transpose_at(m: sp.csr_matrix, pos: np.ndarray, n: int, unit=None) -> torch.Tensor:
    """torch CSR [m.shape[1], n] of the transpose of ``m`` whose row j is row ``pos[j]`` of an [n, .] matrix."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[np.asarray(pos) + 1] = np.diff(m.indptr)
    np.cumsum(ptr, out=ptr)
    return _transpose(sp.csr_matrix((m.data, m.indices, ptr), shape=(n, m.shape[1]), copy=False), unit)


class NeighbourBlock:
    """Block of receive neighbour i: ``rows`` [r] owned rows with an edge from its halo slice;
    ``mat`` [r, slice] and ``mat_t`` [slice, n_owned] (its transpose, columns = owned rows) as torch CSR;
    ``src``/``dst`` the same edges as COO (source position in the slice, destination position in ``rows``;
    ``src`` shares ``mat``'s column indices, ``dst`` is made on first use)."""

    def __init__(self, rows: torch.Tensor, mat: torch.Tensor, mat_t: torch.Tensor, unit=None, fold: int = 1):
        self.rows, self.mat, self.mat_t = rows, mat, mat_t
        self._dst = None
        self._pieces = _PieceCache(unit, fold)

    def pieces(self, bounds) -> tuple:
        """(``mat``, ``mat_t``) split by the message pieces ``bounds`` (``block_pieces``; cached)."""
        return self._pieces.get(0, self.mat, self.mat_t, bounds, self.rows)

    @property
    def src(self) -> torch.Tensor:
        return self.mat.col_indices()

    @property
    def dst(self) -> torch.Tensor:
        if self._dst is None:
            self._dst = _coo_rows(self.mat.crow_indices())
        return self._dst


class BlockMatrix:
    """One rank's aggregation matrix split into blocks; built once per (part, edge weights).

    ``values`` are the weights of the part's CSR entries (None = 1), or a function of ``(indptr, indices)``
    returning them, called whenever a scipy form is built and not kept (4 bytes an edge less for the rank's whole
    run); ``diag`` the
    weights of added self loops (None = no self loops; a row weighted 0 gets no entry). The arrays are kept by
    reference (the part's own arrays: no copy) until :meth:`release_edges` hands them over to a function that
    reads them again when a form is built later. Where every weight is 1 (``unit``) the torch forms share one
    array of ones.

    ``row_scale`` [n] (float32, or None = 1) completes the weights to ``w_ij = row_scale[i] * A_ij``: the
    aggregation is ``scale_out(A @ [h_own; h_halo])``.

    ``types`` [local edges] (relation IDs in [0, ``fold``), the part's ``edge_type``): a typed block, the part's
    entry (i, j) of relation r becoming column j * fold + r (module docstring); no self loops then.

    Everything else is made on first use and cached, so a rank holds only the forms its layers use: the torch
    CSR blocks and their transposes (``local``, ``local_t``, ``neighbours``: blocking schedule, GAT), the COO
    form of the local block (``local_dst``/``local_src``: GAT only), row chunks, or the row groups of the
    inter-layer pipeline (``row_groups``), which are built from the part's arrays and do not need the blocks.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, num_owned: int, recv_offsets: np.ndarray,
                 num_boundary: int, values: np.ndarray | None = None, diag: np.ndarray | None = None,
                 row_scale: np.ndarray | None = None, types: np.ndarray | None = None, fold: int = 1):
        if fold > 1 and (types is None or diag is not None):
            raise ValueError("a typed block needs its edge types, and has no self loops")
        self.fold = int(fold)
        self._types = types if fold > 1 else None   # (one relation: an untyped block)
        self.num_owned = int(num_owned)
        self._indptr = np.asarray(indptr, dtype=np.int64)
        self._indices = np.asarray(indices)
        self._reload = None     # after release_edges: () -> (indptr, indices), read again
        self._ones_len = None
        self._values = values if values is None or callable(values) else np.asarray(values, dtype=np.float32)
        self._diag = None if diag is None else np.asarray(diag, dtype=np.float32)
        self._recv_offsets = np.asarray(recv_offsets, dtype=np.int64)
        self.has_diag = diag is not None
        # (a diagonal weighted 0 has no entry, so 0/1 diagonals make patterns too)
        self.unit = values is None and (diag is None or bool(np.all((self._diag == 0) | (self._diag == 1))))
        self.row_scale = None if row_scale is None else torch.from_numpy(np.asarray(row_scale, dtype=np.float32))
        self.num_boundary = int(num_boundary)
        self._ones = None
        self.symmetric = None   # whether the local block equals its transpose (known once a form is built)
        self._torch = None
        self._local_dst = None
        self._sizes = None
        self._chunks = {}

    # -- the pattern's shared values and the scalings ---------------------------------------------------------
    def _unit(self, nnz: int) -> torch.Tensor:
        """The first ``nnz`` of the ones every torch form of a unit matrix shares as its values (made once, as
        long as the largest block: the local block with its diagonal, or all halo entries)."""
        if self._ones is None:
            self._ones = torch.ones(self._ones_length())
        return self._ones[:nnz]

    def _ones_length(self) -> int:
        if self._ones_len is None:
            n, idx = self.num_cols, self._edges()[1]
            loc = int(np.count_nonzero(idx < n))
            diag = 0 if self._diag is None else int(np.count_nonzero(self._diag))
            self._ones_len = max(loc + diag, len(idx) - loc, 1)
        return self._ones_len

    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """The part's CSR ``(indptr, indices)``: held, or read again after :meth:`release_edges`; a typed block's
        columns ``j * fold + r`` (a fresh array: the caller drops it)."""
        if self._indptr is not None:
            indptr, indices = self._indptr, self._indices
        else:
            indptr, indices = self._reload()
            indptr, indices = np.asarray(indptr, dtype=np.int64), np.asarray(indices)
        if self._types is not None:
            dt = np.int32 if (int(indices.max(initial=0)) + 1) * self.fold < 2 ** 31 else np.int64
            folded = indices.astype(dt)
            folded *= self.fold
            folded += self._types
            indices = folded
        return indptr, indices

    @property
    def num_cols(self) -> int:
        """Columns of the local block: the owned rows, times R for a typed block."""
        return self.num_owned * self.fold

    def release_edges(self, reload) -> None:
        """Let go of the part's CSR: a form built from now on reads it with ``reload()`` (and drops it after)."""
        self._ones_length()
        self._indptr = self._indices = None
        self._reload = reload

    def held_bytes(self) -> int:
        """Bytes of the torch forms, counted from the part: the blocks and their transposes (a symmetric local
        block once, known once the blocks or row groups are built), row pointers, values (the shared ones, or
        the weights in each) and the row scaling (the sum of :meth:`held_arrays`)."""
        return sum(b for _, _, b in self.held_arrays())

    def held_arrays(self) -> list[tuple[str, int, int]]:
        """What :meth:`held_bytes` counts, array by array, as (what, rows, bytes): ``rows`` is what sizes the array
        (the rows of a row pointer array, without its one extra entry; the entries of an index or value array: n
        + e - c for the local block with its self loops, c for the neighbour blocks, which have the c cut edges;
        n for the row scaling), for g3-bench's attribution of a rank's bytes. Every neighbour block is in one
        item per kind: their transposes' rows are the halo rows, their own the owned rows with a cut edge."""
        sz = self.sizes()
        w = np.dtype(csr_index_dtype(sz["nnz"], (sz["rows"], sz["cols"]))).itemsize
        n, loc = self.num_owned, sz["local_nnz"]
        cut, nb_rows, halo = sz["nnz"] - loc, sz["rows"] - n, sz["cols"] - n
        copies = 1 if self.symmetric else 2     # the local block and its transpose, or one shared
        out = [("local row pointers", n, w * (n + 1)), ("local transpose row pointers", n, w * (n + 1)),
               ("neighbour row pointers", nb_rows, w * nb_rows),
               ("neighbour transpose row pointers", halo, w * halo),
               ("local indices", loc, w * loc * copies), ("neighbour indices", cut, 2 * w * cut)]
        if self.unit:
            out.append(("shared ones", self._ones_length(), 4 * self._ones_length()))
        else:
            out += [("local weights", loc, 4 * loc * copies), ("neighbour weights", cut, 8 * cut)]
        if self.row_scale is not None:
            out.append(("row scaling", len(self.row_scale), 4 * len(self.row_scale)))
        return out

    @property
    def unit_values(self):
        """``_unit`` for a unit matrix (its torch forms share it), else None (each has its own weights)."""
        return self._unit if self.unit else None

    def scale_out(self, y: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """A product's rows ``rows`` times their row scale: the aggregation's result."""
        if self.row_scale is None:
            return y
        return y * self.row_scale[rows].to(device=y.device, dtype=y.dtype).unsqueeze(1)

    # -- scipy forms, built on demand from the part's arrays and dropped by the caller -------------------------
    def _rows_of_edges(self, indptr) -> np.ndarray:
        dt = np.int32 if self.num_owned < 2 ** 31 else np.int64
        return np.repeat(np.arange(self.num_owned, dtype=dt), np.diff(indptr))

    def _edge_values(self, sel, indptr, indices) -> np.ndarray:
        if self._values is None:    # (a unit matrix's scipy forms carry int8 ones: its torch forms share theirs)
            return np.ones(int(np.count_nonzero(sel)) if sel.dtype == bool else len(sel),
                           dtype=np.int8 if self.unit else np.float32)
        values = self._values(indptr, indices) if callable(self._values) else self._values
        return np.asarray(values, dtype=np.float32)[sel]

    def local_scipy(self) -> sp.csr_matrix:
        """The local block [n, n] (owned sources, plus the diagonal), sorted indices. Duplicate edges stay
        separate entries (GAT's attention weighs each copy, as PyG's ``GATConv`` does; the weighted kinds sum
        them in the product either way). A fresh matrix: the caller drops it when done."""
        n = self.num_owned
        indptr, idx = self._edges()
        is_loc = idx < self.num_cols
        rows = self._rows_of_edges(indptr)[is_loc]
        cols = idx[is_loc]
        vals = self._edge_values(is_loc, indptr, idx)
        del is_loc, indptr, idx
        cnt = np.bincount(rows, minlength=n)
        ptr = np.zeros(n + 1, dtype=np.int64)
        if self._diag is None:
            np.cumsum(cnt, out=ptr[1:])
        else:
            # one more slot at the end of each row with a diagonal weight (every row but those weighted 0): the
            # k-th entry of row r moves to k + (rows before r with a slot)
            has = self._diag != 0
            np.cumsum(cnt + has, out=ptr[1:])
            before = np.cumsum(has, dtype=np.int64)
            before -= has
            pos = before[rows]
            pos += np.arange(len(cols), dtype=np.int64)
            del before
            nd = int(np.count_nonzero(has))
            c2 = np.empty(len(cols) + nd, dtype=cols.dtype)
            v2 = np.empty(len(cols) + nd, dtype=vals.dtype)
            c2[pos] = cols
            v2[pos] = vals
            del pos
            last = ptr[1:][has] - 1
            c2[last] = np.nonzero(has)[0].astype(cols.dtype)
            v2[last] = self._diag[has]
            cols, vals = c2, v2
        del rows
        m = sp.csr_matrix((vals, cols, ptr), shape=(n, self.num_cols), copy=False)
        m.has_sorted_indices = False
        m.sort_indices()
        return m

    def neighbour_scipy(self) -> list:
        """Per receive neighbour i: (rows [r] int64: owned rows with an edge from i's halo slice, CSR [r, slice]
        with sorted indices). Fresh arrays."""
        n = self.num_owned
        indptr, idx = self._edges()
        is_halo = idx >= self.num_cols
        hrows = self._rows_of_edges(indptr)[is_halo]
        hcols = idx[is_halo] - self.num_cols
        hvals = self._edge_values(is_halo, indptr, idx)
        del is_halo, indptr, idx
        out = []
        ro = self._recv_offsets * self.fold
        for i in range(len(ro) - 1):
            a, b = int(ro[i]), int(ro[i + 1])
            sel = (hcols >= a) & (hcols < b)
            r = hrows[sel]
            cnt = np.bincount(r, minlength=n)
            rows = np.nonzero(cnt)[0].astype(np.int64)
            ptr = np.zeros(len(rows) + 1, dtype=np.int64)
            np.cumsum(cnt[rows], out=ptr[1:])
            m = sp.csr_matrix((hvals[sel], hcols[sel] - a, ptr), shape=(len(rows), b - a), copy=False)
            m.has_sorted_indices = False
            m.sort_indices()
            out.append((rows, m))
        return out

    # -- torch forms ------------------------------------------------------------------------------------------
    def _materialize(self):
        if self._torch is None:
            unit = self.unit_values
            loc = self.local_scipy()
            local = _torch(loc, unit)
            t = _scipy_transpose(loc)
            self.symmetric = _same(loc, t)
            local_t = local if self.symmetric else _torch(t, unit)
            del loc, t
            nbs = []
            for rows, m in self.neighbour_scipy():
                nbs.append(NeighbourBlock(torch.from_numpy(rows), _torch(m, unit),
                                          _transpose_at(m, rows, self.num_owned, unit), unit, self.fold))
            self._torch = (local, local_t, nbs)
        return self._torch

    @property
    def local(self) -> torch.Tensor:
        """Local block [n, n] as torch CSR."""
        return self._materialize()[0]

    @property
    def local_t(self) -> torch.Tensor:
        """Its transpose, precomputed for backward."""
        return self._materialize()[1]

    @property
    def neighbours(self) -> list:
        """One ``NeighbourBlock`` per receive neighbour, in receive order."""
        return self._materialize()[2]

    @property
    def local_src(self) -> torch.Tensor:
        """Source (column) of every local-block entry: the CSR's own column indices."""
        return self.local.col_indices()

    @property
    def local_dst(self) -> torch.Tensor:
        """Destination (row) of every local-block entry, int64 (made on first use: GAT)."""
        if self._local_dst is None:
            self._local_dst = _coo_rows(self.local.crow_indices())
        return self._local_dst

    def sizes(self) -> dict:
        """Shape figures of the whole aggregation (local + neighbour blocks), without building the torch forms:
        ``nnz`` (self loops included, duplicates summed as stored; ``local_nnz`` of the local block,
        ``neighbour_nnz`` of each neighbour block), ``rows`` (n + rows of every neighbour block), ``cols`` (n +
        width of every neighbour block)."""
        if self._sizes is None:
            if self._torch is not None:
                local, _, nbs = self._torch
                local_nnz = local._nnz()
                nb_nnz = [nb.mat._nnz() for nb in nbs]
                rows = self.num_owned + sum(len(nb.rows) for nb in nbs)
                cols = self.num_owned + sum(nb.mat.shape[1] for nb in nbs)
            else:
                local_nnz = self.local_scipy().nnz
                nbs = self.neighbour_scipy()
                nb_nnz = [m.nnz for _, m in nbs]
                rows = self.num_owned + sum(len(r) for r, _ in nbs)
                cols = self.num_owned + sum(m.shape[1] for _, m in nbs)
            self._sizes = dict(nnz=int(local_nnz + sum(nb_nnz)), local_nnz=int(local_nnz), rows=int(rows),
                               cols=int(cols), neighbour_nnz=[int(x) for x in nb_nnz])
        return self._sizes

    def chunks(self, rows_per_chunk: int) -> list:
        """Contiguous row ranges of the local block: list of (start, stop, CSR rows start:stop), sharing the
        block's indices and values, so each range's product is written in place into its rows of the output."""
        return self._ranges(False, rows_per_chunk)

    def transpose_chunks(self, rows_per_chunk: int) -> list:
        """The same of the local transpose (rows = the local block's columns)."""
        return self._ranges(True, rows_per_chunk)

    def _ranges(self, transposed: bool, rows_per_chunk: int) -> list:
        """Row ranges of about ``rows_per_chunk`` rows (0, or at least n: one range), cached per size."""
        m = self.local_t if transposed else self.local
        if rows_per_chunk <= 0 or rows_per_chunk >= self.num_owned:
            return _split_rows(m, 0)
        key = (transposed, rows_per_chunk)
        if key not in self._chunks:
            self._chunks[key] = _split_rows(m, rows_per_chunk)
        return self._chunks[key]


def _split_rows(m: torch.Tensor, rows_per_chunk: int) -> list:
    """Row ranges of a torch CSR of about ``rows_per_chunk`` rows (0: one range): [(a, b, CSR rows a:b)],
    sharing its indices and values."""
    r = m.shape[0]
    if rows_per_chunk <= 0 or rows_per_chunk >= r:
        return [(0, r, m)]
    return [(a, min(a + rows_per_chunk, r), _row_range(m, a, min(a + rows_per_chunk, r)))
            for a in range(0, r, rows_per_chunk)]


@dataclass
class RowGroup:
    """The aggregation restricted to the owned rows ``start .. stop-1`` (the boundary or the interior rows).

    The inter-layer pipeline keeps a layer's rows as two tensors, boundary rows then interior rows, never
    merged: so the local block of the group's rows is stored split by columns, ``local = (over the boundary
    rows' columns [r, n_b], over the interior rows' columns [r, n_i])``, and ``local_t`` holds their
    transposes ([n_b, r], [n_i, r]). A group's local product is ``local[0] @ x_b + local[1] @ x_i``.

    Per receive neighbour i, ``nb[i] = (pos, mat, mat_t)``: positions in the group of the rows with an edge from
    i, that block [len(pos), slice_i] and its transpose with the group's rows as columns [slice_i, r] (None when
    no row of the group has an edge from i).
    """

    start: int
    stop: int
    local: tuple
    local_t: tuple
    nb: list
    _chunks: dict = field(default_factory=dict)
    _pieces: _PieceCache = field(default_factory=_PieceCache)

    def nb_pieces(self, i: int, bounds) -> tuple:
        """``nb[i]``'s block and transpose split by the message pieces ``bounds`` (``block_pieces``; cached)."""
        pos, mat, mat_t = self.nb[i]
        return self._pieces.get(i, mat, mat_t, bounds, pos)

    @property
    def size(self) -> int:
        return self.stop - self.start

    def chunks(self, rows_per_chunk: int) -> list:
        """Forward chunks of the local block: [(a, b, rows a:b over the boundary columns, over the interior
        columns)], about ``rows_per_chunk`` rows each (0: one chunk). Chunks share the group's indices and
        values."""
        key = ("f", rows_per_chunk)
        if key not in self._chunks:
            cb, ci = (_split_rows(m, rows_per_chunk) for m in self.local)
            self._chunks[key] = [(a, b, mb, mi) for (a, b, mb), (_, _, mi) in zip(cb, ci)]
        return self._chunks[key]

    def t_chunks(self, rows_per_chunk: int) -> tuple[list, list]:
        """Row ranges of the two transposes, ([(a, b, CSR)] of ``local_t[0]``, same of ``local_t[1]``)."""
        key = ("t", rows_per_chunk)
        if key not in self._chunks:
            self._chunks[key] = tuple(_split_rows(m, rows_per_chunk) for m in self.local_t)
        return self._chunks[key]


def row_groups(bm: "BlockMatrix") -> tuple[RowGroup, RowGroup]:
    """Split ``bm`` into its boundary rows ``0 .. num_boundary-1`` and its interior rows, each group's local
    block split by columns at ``num_boundary`` (see ``RowGroup``). Built from the part's arrays
    (``bm.local_scipy``), not from ``bm``'s torch blocks, which stay unbuilt unless something else needs them."""
    n, nb, f = bm.num_owned, bm.num_boundary, bm.fold
    unit = bm.unit_values
    spans = ((0, nb), (nb, n))
    loc_all = bm.local_scipy()
    # sub-block (row group, column group), one copy each (scipy slices rows and columns at once); the whole
    # local block is freed before the neighbour blocks are made
    subs = {(g, c): loc_all[lo:hi, c0 * f:c1 * f].tocsr() for g, (lo, hi) in enumerate(spans)
            for c, (c0, c1) in enumerate(spans)}
    del loc_all
    trans = {key: _scipy_transpose(sub) for key, sub in subs.items()}
    # symmetric where the transpose of every sub-block (g, c) is sub-block (c, g): then it serves as that transpose
    symmetric = bm.symmetric = all(_same(trans[g, c], subs[c, g]) for g, c in subs)
    built = {key: _torch(sub, unit) for key, sub in subs.items()}
    built_t = {(g, c): built[c, g] for g, c in subs} if symmetric else {k: _torch(t, unit) for k, t in trans.items()}
    del subs, trans
    nbs = bm.neighbour_scipy()
    groups = []
    for g, (lo, hi) in enumerate(spans):
        blocks = []
        for nb_rows, sp_blk in nbs:
            a, b = np.searchsorted(nb_rows, (lo, hi))
            if a == b:
                blocks.append(None)
                continue
            sub = sp_blk[a:b]
            pos = nb_rows[a:b] - lo
            blocks.append((torch.from_numpy(pos.astype(np.int64)), _torch(sub, unit),
                           _transpose_at(sub, pos, hi - lo, unit)))
            del sub
        groups.append(RowGroup(start=lo, stop=hi, local=(built[g, 0], built[g, 1]),
                               local_t=(built_t[g, 0], built_t[g, 1]), nb=blocks, _pieces=_PieceCache(unit, f)))
    del nbs
    return groups[0], groups[1]
