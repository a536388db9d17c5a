"""Scoring node pairs across ranks inside autograd: the pair exchange (``g3mpi.comm.pairs``) run as a halo round.

``PairExchange(graph, src, dst, rel=None)`` plans once (collective) for a fixed set of pairs (new global IDs, src owned by this
rank). Each call ``(h, decoder)`` with the owned embeddings ``h`` [n_owned, d]: posts the receives and sends the
rows other ranks' pairs need, scores the pairs whose dst is owned while those messages travel (pipelined), then
each neighbour's pairs as its rows land, and returns ``decoder(h_src, h_dst)`` of every pair in pair order
(``decoder(h_src, h_dst, rel)`` with each pair's relation ``rel``, if given).
Backward sends each fetched row's gradient (summed over its pairs) back to its owner, which adds it into ``h``'s
gradient: the exchange's ``HaloRound`` with ``grads=True``, as GAT's attention does. ``decoder=None`` returns the
pairs' embeddings ``(h_src, h_dst)`` instead (the same exchange, no overlap: the caller computes afterwards).

The inner-product decoders (``decoder.fused == "dot"``) are scored fused, gathering no rows: the pairs as one
sparse pattern over ``[owned rows | fetched rows]`` (sources as its rows), scored with one sampled dense product
(``torch.sparse.sampled_addmm``, an SDDMM) once every row has landed, backward as two CSR products with the score
gradients at the pattern (:class:`SampledPattern`, :class:`SampledDot`). Pairs given in a few runs of
non-decreasing sources (a training set sorted once: its sampled negatives keep the sources) need no sort; others
are sorted once per plan. Other decoders get each pair's rows: large sets in chunks recomputed in backward
(``CHUNK_PAIRS``), the gathered rows of one chunk at a time, not those of every pair.

Every rank calls each exchange the same number of times, in the same order (a rank without pairs still sends the
rows others need), and runs backward of every training call.
"""
from __future__ import annotations

import numpy as np
import torch

import scipy.sparse as sp
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..comm.pairs import plan_pairs
from ..mpi.collectives import as_watchdog
from .blocks import csr_index_dtype, spmm, spmm_add, torch_csr
from .exchange import HaloRound


#: pairs scored at once under autograd: a larger group is scored in chunks of this many, each recomputed in
#: backward (gathered rows of one chunk at a time: 2 x CHUNK_PAIRS x width floats)
CHUNK_PAIRS = 1 << 18
#: at most this many runs of non-decreasing sources are scored as they come (one pattern each); more are sorted
MAX_RUNS = 8


class SampledPattern:
    """The pattern of pairs (``rows`` [m], non-decreasing, of [n_rows]; ``cols`` [m] of [n_cols]) as a CSR and
    its transpose (built by counting: ``scipy``'s CSR -> CSC, O(m + n)), with ``perm`` [m]: the pair of each
    transposed entry. Entries repeat as the pairs do (each is scored, and its gradient added, once)."""

    def __init__(self, rows: np.ndarray, cols: np.ndarray, n_rows: int, n_cols: int):
        m = len(rows)
        self.shape = (int(n_rows), int(n_cols))
        it = csr_index_dtype(m, (n_rows + 1, n_cols + 1))
        crow = np.zeros(n_rows + 1, dtype=it)
        np.cumsum(np.bincount(rows, minlength=n_rows), out=crow[1:])
        col = np.ascontiguousarray(cols, dtype=it)
        t = sp.csr_matrix((np.arange(m, dtype=it), col, crow), shape=self.shape, copy=False).tocsc()
        self.crow, self.col = torch.from_numpy(crow), torch.from_numpy(col)
        self.crow_t = torch.from_numpy(t.indptr.astype(it, copy=False))
        self.col_t = torch.from_numpy(t.indices.astype(it, copy=False))
        self.perm = torch.from_numpy(t.data.astype(np.int64 if it is np.int64 else np.int32, copy=False))
        self.zeros = torch.zeros(m)
        self.fwd = torch_csr(self.crow, self.col, self.zeros, self.shape)

    def __len__(self) -> int:
        return len(self.zeros)

    def renumbered(self, cols: np.ndarray, n_cols: int) -> "SampledPattern":
        """The same pairs with columns ``cols`` [m] of [n_cols] that order the entries as the old ones did (an
        increasing renumbering: a later plan of a set of pairs that includes these): the transpose's order is kept
        and only its row pointer counted again (no sort)."""
        new = object.__new__(SampledPattern)
        it = self.col.numpy().dtype
        new.shape = (self.shape[0], int(n_cols))
        new.crow, new.col_t, new.perm, new.zeros = self.crow, self.col_t, self.perm, self.zeros
        new.col = torch.from_numpy(np.ascontiguousarray(cols, dtype=it))
        crow_t = np.zeros(n_cols + 1, dtype=it)
        np.cumsum(np.bincount(cols, minlength=n_cols), out=crow_t[1:])
        new.crow_t = torch.from_numpy(crow_t)
        new.fwd = torch_csr(new.crow, new.col, new.zeros, new.shape)
        return new


class SampledDot(torch.autograd.Function):
    """``scores[e] = <a[row_e], b[col_e]>`` of the entries of a :class:`SampledPattern` (a [n_rows, d], b
    [n_cols, d], float32), in pattern order; backward: ``grad_a = W @ b`` and ``grad_b = W^T @ a``, W the pattern
    with the scores' gradients (two CSR products; nothing [m, d] is made either way)."""

    @staticmethod
    def forward(ctx, a, b, pat):
        ctx.save_for_backward(a, b)
        ctx.pat = pat
        if not len(pat):
            return a.new_zeros(0)
        return torch.sparse.sampled_addmm(pat.fwd, a, b.t(), beta=0.0).values()

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        pat = ctx.pat
        g = g.contiguous()
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = spmm(torch_csr(pat.crow, pat.col, g, pat.shape), b)
        if ctx.needs_input_grad[1]:
            w = torch_csr(pat.crow_t, pat.col_t, g.index_select(0, pat.perm), pat.shape[::-1])
            gb = spmm(w, a)
        return ga, gb, None


class SampledDotBCE(torch.autograd.Function):
    """The BCE-with-logits sum of the dot scores of :class:`SampledPattern` s (``pats``, the label of each one's
    entries in ``labels``: 1.0 or 0.0), its gradient made in forward: dL/ds = sigmoid(s) - y is known once s is, so
    the two CSR products run here, straight from the scores (no graph of [m] tensors, no [m] gradient coming back),
    and backward only scales ``grad_a``, ``grad_b`` by the loss's gradient."""

    @staticmethod
    def forward(ctx, a, b, pats, labels):
        loss = a.new_zeros((), dtype=torch.float64)
        ga, gb = torch.zeros_like(a), torch.zeros_like(b)
        for pat, y in zip(pats, labels):
            if not len(pat):
                continue
            s = torch.sparse.sampled_addmm(pat.fwd, a, b.t(), beta=0.0).values()
            # BCE with logits at y = 1: softplus(-s), at y = 0: softplus(s) (log1p(exp(-|s|)) + max(., 0): stable)
            t = s.neg() if y else s
            loss += (t.clamp(min=0) + torch.log1p(torch.exp(-t.abs()))).sum(dtype=torch.float64)
            g = torch.sigmoid(s)
            if y:
                g.sub_(1.0)
            spmm_add(torch_csr(pat.crow, pat.col, g, pat.shape), b, ga)
            spmm_add(torch_csr(pat.crow_t, pat.col_t, g.index_select(0, pat.perm), pat.shape[::-1]), a, gb)
        ctx.save_for_backward(ga, gb)
        return loss.float()

    @staticmethod
    def backward(ctx, go):
        ga, gb = ctx.saved_tensors
        return ga * go, gb * go, None, None


class PairExchange:
    """The exchange of one set of pairs (module docstring); ``free()`` releases its buffers (collective in the sense
    that every rank frees its own, in any order)."""

    def __init__(self, graph, src, dst, name: str = "pairs", rel=None, reuse=None):
        self.graph, self.name = graph, name
        #: (a SampledPattern of an earlier exchange, m): its pairs are these pairs' first m, in order (a training
        #: set's positives, planned again with each epoch's negatives): the fused path renumbers it, no sort
        self.reuse = reuse
        if graph.stager is not None:
            raise NotImplementedError("pair exchange: ranks computing on a device are not supported yet (it moves "
                                      "host rows only; g3-train refuses --task link on a GPU at start-up)")
        self.plan = plan_pairs(graph.ctx.watchdog or as_watchdog(graph.ctx.comm), graph.owned_start,
                               graph.owned_end, src, dst, what=f"{name} plan")
        self._ex = {}   # by row width: the halo exchange moving rows that wide
        self._rel_all = None if rel is None else np.asarray(rel, dtype=np.int64)
        self._grouped = None    # the per-row path's pair groups (_group), made on first use
        self._fused = None      # the fused path's patterns (_patterns), made on first use

    def _group(self) -> None:
        """The per-row path's pairs by where their destination row lives (``PairPlan.groups``)."""
        self.groups = [torch.from_numpy(g) for g in self.plan.groups()]
        order = torch.cat(self.groups) if self.groups else torch.zeros(0, dtype=torch.int64)
        self.inverse = torch.empty_like(order)
        self.inverse[order] = torch.arange(len(order))
        src_rows = torch.from_numpy(self.plan.src_rows)
        dst_rows = torch.from_numpy(self.plan.dst_rows)
        n = self.plan.halo.num_owned
        cuts = n + np.asarray(self.plan.halo.recv_offsets, dtype=np.int64)
        self._src = [src_rows[g] for g in self.groups]
        # dst rows: group 0 as owned rows, group i + 1 as rows of neighbour i's fetched slice
        self._dst = [dst_rows[self.groups[0]]] + [dst_rows[g] - int(cuts[i]) for i, g in enumerate(self.groups[1:])]
        # each pair's relation (a relational decoder's third argument), by group
        self._rel = None if self._rel_all is None else [torch.from_numpy(self._rel_all)[g] for g in self.groups]
        self._grouped = True

    def _patterns(self):
        """The fused path's (patterns, each a run of pairs in order; the inverse order of a sorted set or None)."""
        src, dst = self.plan.src_rows, self.plan.dst_rows
        m, n = len(src), self.plan.halo.num_owned
        shape = (n, n + self.plan.num_fetched)
        brk = np.flatnonzero(src[1:] < src[:-1]) + 1
        inverse = None
        if len(brk) < MAX_RUNS:
            cuts = np.r_[0, brk, m]
        else:
            order = np.argsort(src, kind="stable")
            src, dst, cuts = src[order], dst[order], np.array([0, m])
            inverse = torch.empty(m, dtype=torch.int64)
            inverse[torch.from_numpy(order)] = torch.arange(m)
        pats = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            if a == 0 and self.reuse is not None and b == len(self.reuse[0]) == self.reuse[1]:
                pats.append(self.reuse[0].renumbered(dst[a:b], shape[1]))
            else:
                pats.append(SampledPattern(src[a:b], dst[a:b], *shape))
        self.reuse = None
        self._fused = (pats, inverse)
        return self._fused

    @property
    def num_pairs(self) -> int:
        return self.plan.num_pairs

    def exchange(self, width: int):
        if width not in self._ex:
            sched = self.graph.schedule
            self._ex[width] = self.graph.ctx.exchange(self.plan.halo, width, name=f"{self.name}/{width}",
                                                      piece_rows=sched.rows_per_piece(width))
        return self._ex[width]

    def fuses(self, decoder) -> bool:
        """Whether ``decoder``'s pairs are scored fused (an inner product, no relations)."""
        return decoder is not None and getattr(decoder, "fused", None) == "dot" and self._rel_all is None

    def loss_sum(self, h: torch.Tensor, decoder, num_pos: int) -> torch.Tensor:
        """The summed BCE-with-logits of the pairs (the first ``num_pos`` positives, the rest negatives); fused
        (:class:`SampledDotBCE`) where the decoder is and the pairs come in runs of sources that do not straddle
        the positives' end (a training set's positives and its sampled negatives: two runs)."""
        if self.fuses(decoder):
            pats, inverse = self._fused or self._patterns()
            cut = np.cumsum([0] + [len(p) for p in pats])
            if inverse is None and (num_pos in cut or num_pos >= cut[-1]):
                return self(h, decoder, labels=[1.0 if b <= num_pos else 0.0 for b in cut[1:]])
        z = self(h, decoder)
        y = torch.zeros(len(z), dtype=z.dtype)
        y[:num_pos] = 1
        return F.binary_cross_entropy_with_logits(z, y, reduction="sum")

    def __call__(self, h: torch.Tensor, decoder=None, labels=None):
        n = self.plan.halo.num_owned
        if h.device.type != "cpu":
            raise NotImplementedError(f"pair exchange: embeddings on {h.device} are not supported yet (host rows "
                                      "only)")
        if h.dim() != 2 or h.shape[0] != n:
            raise ValueError(f"pair exchange: expected [{n}, d] rows (this rank's owned nodes), got {tuple(h.shape)}")
        h = h.float().contiguous()
        sched = self.graph.schedule
        rnd = HaloRound(self.exchange(int(h.shape[1])), sched)
        token = rnd.start(h, grads=True)
        k = len(self.plan.halo.recv_parts)
        fetched = [None] * k

        def take(landed):
            for i in landed:
                fetched[i] = rnd.recv(token, i)

        if self.fuses(decoder):
            take(rnd.rest())
            tab = rnd.join(torch.cat([h] + fetched) if k else h, token)
            pats, inverse = self._fused or self._patterns()
            if labels is not None:      # (loss_sum: each pattern's label)
                return SampledDotBCE.apply(h, tab, pats, labels)
            out = [SampledDot.apply(h, tab, p) for p in pats]
            out = torch.cat(out) if len(out) != 1 else out[0]
            return out if inverse is None else out.index_select(0, inverse)
        if self._grouped is None:
            self._group()
        if decoder is None:
            take(rnd.rest())
            pool = torch.cat([h] + fetched) if k else h
            # through the join, so that the exchange's backward always runs
            pool = rnd.join(pool, token)
            rows = torch.from_numpy(self.plan.dst_rows)
            return h.index_select(0, torch.from_numpy(self.plan.src_rows)), pool.index_select(0, rows)
        parts = [None] * (k + 1)

        def rows_scored(a_tab, a_idx, b_tab, b_idx, rel):
            args = (a_tab.index_select(0, a_idx), b_tab.index_select(0, b_idx))
            return decoder(*args) if rel is None else decoder(*args, rel)

        def dec(j, a_tab, b_tab):
            """The scores of group j's pairs: sources rows of ``a_tab``, destinations of ``b_tab``. Under autograd
            a large group goes in chunks recomputed in backward, so that only one chunk's gathered rows live at a
            time (memory O(pairs), not O(pairs x width))."""
            a_idx, b_idx = self._src[j], self._dst[j]
            rel = None if self._rel is None else self._rel[j]
            m = len(a_idx)
            if m <= CHUNK_PAIRS or not torch.is_grad_enabled():
                return rows_scored(a_tab, a_idx, b_tab, b_idx, rel)
            out = []
            for c in range(0, m, CHUNK_PAIRS):
                sl = slice(c, c + CHUNK_PAIRS)
                out.append(checkpoint(rows_scored, a_tab, a_idx[sl], b_tab, b_idx[sl],
                                      None if rel is None else rel[sl], use_reentrant=False))
            return torch.cat(out)

        def score(landed):
            for i in landed:
                take([i])
                parts[i + 1] = dec(i + 1, h, fetched[i])

        if sched.waits_first:
            score(rnd.rest())
        parts[0] = dec(0, h, h)
        score(rnd.landed())
        score(rnd.rest())
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return rnd.join(out.index_select(0, self.inverse), token)

    def dst_values(self, values: np.ndarray) -> np.ndarray:
        """Each pair's destination entry of a per-node array (``values`` [n_owned, ...]: this rank's owned rows,
        any fixed-size dtype), the rows other ranks own fetched once, bit for bit: [m, ...]. Collective (every rank
        calls it for this exchange, in the same order as the other calls)."""
        values = np.ascontiguousarray(values)
        n, tail = self.plan.halo.num_owned, values.shape[1:]
        width = int(np.prod(tail, dtype=np.int64)) * values.dtype.itemsize
        ctx = self.graph.ctx
        ex = ctx.exchange(self.plan.halo, width, dtype=np.uint8, name=f"{self.name}/values")
        try:
            ex.start_forward(values[:n].view(np.uint8).reshape(n, width))
            ex.forward.wait_all()
            fetched = ex.halo.copy().view(values.dtype).reshape((self.plan.num_fetched, *tail))
        finally:
            ctx.release(ex)
        return np.concatenate([values[:n], fetched])[self.plan.dst_rows]

    def first_pattern(self):
        """The fused path's pattern of the first run of pairs, once scored that way (else None)."""
        return None if self._fused is None or self._fused[1] is not None else self._fused[0][0]

    def free(self) -> None:
        for ex in self._ex.values():
            self.graph.ctx.release(ex)
        self._ex = {}
        self._fused = None
