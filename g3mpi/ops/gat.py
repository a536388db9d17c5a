"""Distributed GAT attention aggregation (PyG ``GATConv`` semantics) with blockwise (online) softmax.

For destination i and head h, over in-edges j -> i plus the self loop:
    e_ij = LeakyReLU_0.2(a_src[j] + a_dst[i]),   alpha_ij = softmax_j(e_ij),   out_i = sum_j drop(alpha_ij) x_j
where ``x`` [n, H, C] are transformed features and ``a_src``/``a_dst`` [n, H] the per-node attention terms.

The edges are split like the sparse aggregation: the local block (with self loops) and one block per receive
neighbour, computed as each neighbour's message (x_j and a_src[j] of its boundary rows, one message) lands. Each
block yields a partial (row max m_b, numerator, denominator); partials are merged with the streaming-softmax
rule ``num = sum_b num_b exp(m_b - M)``, ``den = sum_b den_b exp(m_b - M)``, ``M = max_b m_b`` in a fixed
order, so arrival order does not change the result. Autograd differentiates the whole computation; the
exchange Functions route halo gradients back to their owners.

The numerators are computed without autograd while messages travel; autograd sees each block's product with
the normalised weights ``alpha_ij = p_ij exp(m_b - M) / den_i`` (``head_spmm``'s ``scaled``), as PyG's
``GATConv`` differentiates it. So the gradient of the denominator sums the same per-edge products
<grad out_i, x_j> that the weights' gradients are made of, and their difference (the softmax gradient, which
cancels to zero over a row) stays as exact as PyG's. Differentiating ``num / den`` instead takes the
denominator's share from <grad out_i, out_i>, rounded differently: gradients of ``att_src``/``att_dst`` came
out 10-20x less accurate than PyG's (up to 2e-5 relative on 150-node graphs).

With ``remat`` (``--remat cheap``) nothing of size edges x heads outlives the call: forward keeps the rows' softmax
maximum and inverse denominator [n, H] and the inputs (the halo stays in the exchange's buffer), and backward
computes the per-edge terms again, by row chunks of about ``REMAT_EDGES`` edges, in two passes over the blocks:
    gx_j  = sum_i alpha_ij k_ij g_i                      (the transposed product, one [e, H] weight array at a time)
    u_ij  = alpha_ij k_ij <g_i, x_j>,  t_i = sum_j u_ij    (SDDMM; u kept per block until the last pass)
  (both from one computation of alpha; bf16-mixed keeps alpha and the scores' signs for the second pass), then
    de_ij = (u_ij - alpha_ij t_i) LeakyReLU'(a_src[j] + a_dst[i]),  ga_src[j] += de_ij,  ga_dst[i] += de_ij
k: the attention dropout's keep mask (keyed by both ends' IDs, drawn again). t_i sums the per-edge products as
PyG's autograd does for its denominator, so the softmax gradient keeps PyG's accuracy. Neighbour blocks go first
in the last pass and send their halo gradients (x' and a_src together) as soon as each is complete.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .blocks import spmm
from .dropout import DropoutKey, edge_keep_mask
from .exchange import HaloRound
from .graph import DistGraph
from .heads import HeadPattern, head_spmm

NEGATIVE_SLOPE = 0.2
#: edges a row chunk of the recomputing path (``remat``) holds: its [edges, H] temporaries stay a few MB
REMAT_EDGES = 1 << 17


def _partial(dst, src, pat: HeadPattern, x_src, a_src, a_dst_rows, n_rows: int, keep):
    """One block's edges (dst in [0,r), src into x_src; ``pat``: the block's head-expanded pattern): its row max
    m [r,H], its denominator [r,H], and what ``_normalised`` needs: the unnormalised weights p [e,H] and, without
    autograd, the numerator [r,H,C] of the weights p * keep (a sparse product: no [edges, H, C] tensor)."""
    H = a_src.shape[1]
    s = F.leaky_relu(a_src.index_select(0, src) + a_dst_rows.index_select(0, dst), NEGATIVE_SLOPE)
    with torch.no_grad():
        m = torch.full((n_rows, H), float("-inf")).scatter_reduce(0, dst.unsqueeze(1).expand(-1, H), s,
                                                                   "amax", include_self=True)
    p = torch.exp(s - m.index_select(0, dst))
    den = torch.zeros(n_rows, H).index_add(0, dst, p)
    with torch.no_grad():
        num = head_spmm(pat, p if keep is None else p * keep, x_src)
    return m, den, (dst, pat, x_src, p, keep, num)


def _normalised(block, scale):
    """A block's share of the output [r,H,C] with the row scale [r,H] (exp(m_b - M) / den): its numerator
    scaled, differentiable as the product of the normalised weights (see the module docstring)."""
    dst, pat, x_src, p, keep, num = block
    w = p * scale.index_select(0, dst)
    if keep is not None:
        w = w * keep
    return head_spmm(pat, w, x_src, scaled=(num, scale.detach()))


def _merge(blk, m, den, parts):
    """The blocks' partials merged in a fixed order (local block first, then the neighbours in order): the row max
    ``M = max_b m_b`` [n, H] and the scales ``exp(m_b - M)`` (local block's first, then one per neighbour over its
    rows), both without autograd, and the inverse denominator ``1 / sum_b den_b exp(m_b - M)`` [n, H], which
    keeps the denominators' autograd (the scales are constants to it). ``parts[i]`` starts with neighbour i's
    (m_b, den_b)."""
    with torch.no_grad():
        M = m.clone()
        for i, nb in enumerate(blk.neighbours):
            M[nb.rows] = torch.maximum(M[nb.rows], parts[i][0])
        scales = [torch.exp(m - M)] + [torch.exp(parts[i][0] - M[nb.rows]) for i, nb in enumerate(blk.neighbours)]
    den = den * scales[0]
    for i, nb in enumerate(blk.neighbours):
        den = den.index_add(0, nb.rows, parts[i][1] * scales[i + 1])
    return M, scales, 1.0 / (den + 1e-16)


def _block_ids(agg, i: int | None = None) -> tuple:
    """The original IDs that key a block's attention dropout: (its destination rows', its source rows'); ``i``:
    neighbour i's block, None: the local block."""
    g = agg.graph
    if i is None:
        return g.orig_ids, g.orig_ids
    return g.orig_ids[agg.blocks.neighbours[i].rows], g.halo_orig_ids[agg.ex.plan.recv_slice(i)]


def _keep(drop, ids, dst, src, H: int):
    """The attention dropout's keep mask [e, H] of the edges src -> dst (rows of ``ids``, ``_block_ids``), keyed
    by both ends' original IDs; ``drop``: (key, layer, p), None: no dropout (no mask)."""
    if drop is None:
        return None
    key, layer, p = drop
    return edge_keep_mask(key, layer, ids[0][dst], ids[1][src], H, p)


class GATAggregation:
    """One GAT layer's distributed attention: its own exchange of width H*C + H."""

    def __init__(self, graph: DistGraph, heads: int, channels: int, name: str = "gat"):
        self.graph = graph
        self.H, self.C = int(heads), int(channels)
        self.blocks = graph.blocks("gat")
        self.patterns = graph.head_patterns(self.H)   # (local, one per neighbour), shared by layers with H heads
        self.ex = graph.exchange(self.H * self.C + self.H, name=name)
        self._round = None      # the round of the last ``remat`` forward (its halo is what backward reads)

    def __call__(self, x: torch.Tensor, a_src: torch.Tensor, a_dst: torch.Tensor, *, attn_dropout: float = 0.0,
                 key: DropoutKey | None = None, layer: int = 0, training: bool = False,
                 remat: bool = False) -> torch.Tensor:
        """out [n, H, C] (module docstring); ``remat``: keep no per-edge term for backward, compute them again.
        bf16-mixed (bfloat16 ``x``): x, the message and the output stay bfloat16 (the weighted sums gather
        bfloat16 rows and accumulate in float32, ``g3mpi.ops.blocks.spmm``); the attention terms travel as
        bfloat16 and the scores, softmax and their gradients are float32 [edges, H] arrays."""
        if x.dtype != a_src.dtype:
            a_src = a_src.to(x.dtype)     # (the message is one array; local and halo sources rounded alike)
        g, sched, ex, blk = self.graph, self.graph.schedule, self.ex, self.blocks
        n, H, C = g.num_owned, self.H, self.C
        # the attention dropout, None: none (see ``_keep``)
        drop = (key, layer, attn_dropout) if training and attn_dropout > 0 and key is not None else None
        nb = g.num_boundary      # the message: x' and a_src of the boundary rows (the first rows), one copy
        payload = torch.cat([x[:nb].reshape(nb, H * C), a_src[:nb]], dim=1)
        rnd = HaloRound(ex, sched)
        token = rnd.start(payload, grads=True)
        if remat:
            self._round = rnd
            return _Remat.apply(x, a_src, a_dst, token, self, rnd, drop)
        k = ex.forward.num_recvs
        parts = [None] * k
        # each neighbour's destination terms taken in neighbour order, not arrival order: backward then adds
        # their gradients into a_dst's in a fixed order, so the gradients do not depend on arrivals in rounding
        a_src32, a_dst = a_src.float(), a_dst.float()
        a_dst_nb = [a_dst.index_select(0, nb.rows) for nb in blk.neighbours]

        def compute(landed):
            for i in landed:
                h = rnd.recv(token, i)
                nb = blk.neighbours[i]
                keep = _keep(drop, _block_ids(self, i), nb.dst, nb.src, H) if drop else None
                parts[i] = _partial(nb.dst, nb.src, self.patterns[1][i], h[:, :H * C].reshape(-1, H, C),
                                    h[:, H * C:].float(), a_dst_nb[i], len(nb.rows), keep)

        if sched.waits_first:
            compute(rnd.rest())
        keep = _keep(drop, _block_ids(self), blk.local_dst, blk.local_src, H) if drop else None
        m, den, local = _partial(blk.local_dst, blk.local_src, self.patterns[0], x, a_src32, a_dst, n, keep)
        compute(rnd.landed())
        compute(rnd.rest())
        _, scales, inv = _merge(blk, m, den, parts)
        out = _normalised(local, scales[0] * inv)
        for i, nb in enumerate(blk.neighbours):
            out = out.index_add(0, nb.rows, _normalised(parts[i][2], scales[i + 1] * inv.index_select(0, nb.rows)))
        return rnd.join(out, token)


# -- the recomputing path (``remat``) ------------------------------------------------------------------------------
class _Block:
    """One block of the recomputing path: its pattern, edges (dst in [0, r), src into the source rows), the
    source rows' x [c*H, C] and a_src [c, H], its destination rows (None: all owned rows, the local block) and the
    original IDs that key its attention dropout (``_block_ids``)."""

    def __init__(self, pat: HeadPattern, dst, src, xs, as_src, rows, ids):
        self.pat, self.dst, self.src, self.rows = pat, dst, src, rows
        self.xs = xs.reshape(pat.cols * pat.H, -1).contiguous()
        self.as_src, self.ids = as_src.float(), ids     # (bf16-mixed: scores are float32)
        self._chunks = None

    def chunks(self) -> list:
        """(first row, end row, first edge, end edge) of row chunks of about ``REMAT_EDGES`` edges each, rows
        without edges left out."""
        if self._chunks is None:
            H = self.pat.H
            e = self.pat.crow[::H].numpy() // H if H > 1 else self.pat.crow.numpy()
            self._eptr = e
            cut = np.searchsorted(e, np.arange(REMAT_EDGES, int(e[-1]), REMAT_EDGES))
            bounds = np.unique(np.concatenate([[0], cut, [self.pat.rows]]))
            self._chunks = [(int(a), int(b), int(e[a]), int(e[b])) for a, b in zip(bounds[:-1], bounds[1:])
                            if e[b] > e[a]]
        return self._chunks

    def scores(self, a, b, lo, hi, ad_rows):
        """(z, d): a_src[src] + a_dst[dst] [e, H] of the edges lo..hi (rows a..b) and their rows counted from a."""
        d = self.dst[lo:hi] - a
        z = self.as_src.index_select(0, self.src[lo:hi]).add_(ad_rows[a:b].index_select(0, d))
        return z, d

    def row_reduce(self, a, e, v, mode: str = "sum"):
        """Per-row sums (or maxima: ``mode="max"``, -inf for a row without edges) [e - a, H] of v [edges, H], the
        edges of rows a..e of a chunk (:meth:`chunks`) in row order. bf16-mixed's row reductions: embedding_bag's
        contiguous sums take a fifth of ``index_add_``'s time (the sums' order differs, so not for fp32)."""
        off = torch.from_numpy(self._eptr[a:e + 1] - self._eptr[a])
        out = F.embedding_bag(torch.arange(v.shape[0]), v, off, mode=mode, include_last_offset=True)
        if mode == "max":
            empty = off[1:] == off[:-1]
            if bool(empty.any()):
                out.masked_fill_(empty.unsqueeze(1), float("-inf"))
        return out

    def src_reduce(self, v):
        """Per-source sums [c, H] of v [edges, H] (all the block's edges): bf16-mixed's gather by the sources'
        edge lists (embedding_bag, cached on the pattern), 0.6x a random ``index_add_`` (another order of sums)."""
        got = getattr(self.pat, "_g3_by_src", None)
        if got is None:
            src = self.src.numpy()
            by = np.argsort(src, kind="stable")
            off = np.zeros(self.pat.cols + 1, dtype=np.int64)
            np.cumsum(np.bincount(src, minlength=self.pat.cols), out=off[1:])
            idx = np.int32 if len(src) < 2 ** 31 else np.int64
            got = self.pat._g3_by_src = (torch.from_numpy(by.astype(idx)), torch.from_numpy(off.astype(idx)))
        return F.embedding_bag(got[0], v, got[1], mode="sum", include_last_offset=True)

    def keep(self, drop, lo, hi, H):
        """The attention dropout's keep mask of the edges lo..hi (``_keep``)."""
        return _keep(drop, self.ids, self.dst[lo:hi], self.src[lo:hi], H)


def _local_block(agg: GATAggregation, x, a_src) -> _Block:
    blk = agg.blocks
    return _Block(agg.patterns[0], blk.local_dst, blk.local_src, x, a_src, None, _block_ids(agg))


def _nb_block(agg: GATAggregation, rnd: HaloRound, i: int) -> _Block:
    nb, H, C = agg.blocks.neighbours[i], agg.H, agg.C
    h = rnd.halo(i)
    return _Block(agg.patterns[1][i], nb.dst, nb.src, h[:, :H * C], h[:, H * C:], nb.rows, _block_ids(agg, i))


def _forward_block(b: _Block, ad_rows, drop):
    """A block's row max m, denominator and numerator [r, H, C] (the weights p * keep), by row chunks."""
    r, H = b.pat.rows, b.pat.H
    m, den = torch.full((r, H), float("-inf")), torch.zeros(r, H)
    num = torch.zeros(r * H, b.xs.shape[1], dtype=b.xs.dtype)
    fast = b.xs.dtype != torch.float32      # bf16-mixed: :meth:`_Block.row_reduce`
    for a, e, lo, hi in b.chunks():
        s, d = b.scores(a, e, lo, hi, ad_rows)
        F.leaky_relu_(s, NEGATIVE_SLOPE)
        if fast:
            mc = b.row_reduce(a, e, s, "max")
        else:
            mc = torch.full((e - a, H), float("-inf")).scatter_reduce_(0, d.unsqueeze(1).expand(-1, H), s, "amax",
                                                                        include_self=True)
        p = s.sub_(mc.index_select(0, d)).exp_()
        m[a:e] = mc
        den[a:e] = b.row_reduce(a, e, p) if fast else torch.zeros(e - a, H).index_add_(0, d, p)
        keep = b.keep(drop, lo, hi, H)
        if keep is not None:
            p.mul_(keep)
        spmm(b.pat.row_slice(a, e).matrix(p.to(b.xs.dtype)), b.xs, num[a * H:e * H])
    return m, den, num.view(r, H, -1)


def _alpha(b: _Block, a, e, lo, hi, ad_rows, M_rows, inv_rows):
    """(alpha [e, H], z, d) of the edges lo..hi: the softmax weights without dropout."""
    z, d = b.scores(a, e, lo, hi, ad_rows)
    dst = b.dst[lo:hi]
    alpha = F.leaky_relu(z, NEGATIVE_SLOPE).sub_(M_rows.index_select(0, dst)).exp_().mul_(
        inv_rows.index_select(0, dst))
    return alpha, z, d


class _Remat(torch.autograd.Function):
    """``GATAggregation`` with ``remat``: the module docstring's recomputing path."""

    @staticmethod
    def forward(ctx, x, a_src, a_dst, token, agg, rnd, drop):
        sched, blk = agg.graph.schedule, agg.blocks
        k = len(blk.neighbours)
        for i in range(k):
            rnd.expected[i] += 1
        parts = [None] * k
        a_dst = a_dst.float()
        ad_nb = [a_dst.index_select(0, nb.rows) for nb in blk.neighbours]

        def compute(landed):
            for i in landed:
                parts[i] = _forward_block(_nb_block(agg, rnd, i), ad_nb[i], drop)

        if sched.waits_first:
            compute(rnd.rest())
        m, den, out = _forward_block(_local_block(agg, x, a_src), a_dst, drop)
        compute(rnd.landed())
        compute(rnd.rest())
        M, scales, inv = _merge(blk, m, den, parts)
        out.mul_((scales[0] * inv).unsqueeze(-1))
        for i, nb in enumerate(blk.neighbours):
            out.index_add_(0, nb.rows,
                           parts[i][2].mul_((scales[i + 1] * inv.index_select(0, nb.rows)).unsqueeze(-1)))
        ctx.agg, ctx.rnd, ctx.drop = agg, rnd, drop
        ctx.save_for_backward(x, a_src, a_dst, M, inv)
        return out

    @staticmethod
    def backward(ctx, g):
        agg, rnd, drop = ctx.agg, ctx.rnd, ctx.drop
        if agg._round is not rnd:
            raise RuntimeError("GAT attention with remat: the layer ran forward again before this backward, so the "
                               "halo it recomputes from is gone; run one forward per backward")
        x, a_src, a_dst, M, inv = ctx.saved_tensors
        a_dst = a_dst.float()
        blk, H, C = agg.blocks, agg.H, agg.C
        n = x.shape[0]
        g = g.contiguous()
        nb_rows = [nb.rows for nb in blk.neighbours]
        # per block: its destination rows' terms (g [r*H, C], a_dst, M, inv)
        rows_of = [(g.view(n * H, C), a_dst, M, inv)] + [
            (g.index_select(0, r).view(-1, C), a_dst.index_select(0, r), M.index_select(0, r), inv.index_select(0, r))
            for r in nb_rows]
        blocks = [_local_block(agg, x, a_src)] + [_nb_block(agg, rnd, i) for i in range(len(nb_rows))]
        # pass 1: gx_j = sum_i alpha_ij k_ij g_i (the transposed product of one [e, H] weight array at a time) and
        # u_ij = alpha_ij k_ij <g_i, x_j> (kept per block), t_i = sum_j u_ij; alpha computed once for both.
        # bf16-mixed also keeps alpha and the scores' signs for pass 2 (the speed mode: no third computation)
        # and sums rows with ``_Block.row_reduce``
        keep_alpha = g.dtype != torch.float32
        t = torch.zeros(n, H)
        gxs, us, kept = [], [], []
        for j, (b, (gr, ad, Mr, ir)) in enumerate(zip(blocks, rows_of)):
            w = torch.empty(b.pat.nnz, H, dtype=g.dtype)     # (bf16-mixed: the weights of a bfloat16 product)
            u = torch.empty(b.pat.nnz, H)
            al = (torch.empty(b.pat.nnz, H), torch.empty(b.pat.nnz, H, dtype=torch.bool)) if keep_alpha else None
            tb = t if j == 0 else torch.zeros(b.pat.rows, H)
            xs = b.xs.float()   # (bf16-mixed: once per block, the SDDMM is float32 only)
            for a, e, lo, hi in b.chunks():
                alpha, z, d = _alpha(b, a, e, lo, hi, ad, Mr, ir)
                keep = b.keep(drop, lo, hi, H)
                w[lo:hi] = alpha if keep is None else alpha * keep
                du = b.pat.row_slice(a, e).sddmm(gr[a * H:e * H], xs)
                if keep is not None:
                    du.mul_(keep)
                u[lo:hi] = du.mul_(alpha)
                if keep_alpha:
                    tb[a:e] = b.row_reduce(a, e, u[lo:hi])      # (the chunks' rows are disjoint; tb was zero)
                else:
                    tb[a:e].index_add_(0, d, u[lo:hi])
                if al is not None:
                    al[0][lo:hi] = alpha
                    torch.gt(z, 0, out=al[1][lo:hi])
            gxs.append(spmm(b.pat.matrix_t(w), gr).view(b.pat.cols, H, C) if b.pat.nnz else
                       torch.zeros(b.pat.cols, H, C, dtype=g.dtype))
            del w, xs
            if j:
                t.index_add_(0, nb_rows[j - 1], tb)
            us.append(u)
            kept.append(al)
        # pass 2: the softmax and LeakyReLU gradients; neighbours first, each sends its halo gradient when done
        ga_src, ga_dst = torch.zeros(n, H), torch.zeros(n, H)
        for j in list(range(1, len(blocks))) + [0]:
            b, (gr, ad, Mr, ir) = blocks[j], rows_of[j]
            tr = t if j == 0 else t.index_select(0, nb_rows[j - 1])
            gs = ga_src if j == 0 else torch.zeros(b.pat.cols, H)
            gd = ga_dst if j == 0 else torch.zeros(b.pat.rows, H)
            u = us[j]
            al = kept[j]
            for a, e, lo, hi in b.chunks():
                if al is None:
                    alpha, z, d = _alpha(b, a, e, lo, hi, ad, Mr, ir)
                    pos = z > 0
                else:
                    alpha, pos, d = al[0][lo:hi], al[1][lo:hi], b.dst[lo:hi] - a
                de = u[lo:hi].sub_(alpha.mul_(tr.index_select(0, b.dst[lo:hi])))
                de.mul_(torch.where(pos, 1.0, NEGATIVE_SLOPE))
                if al is None:
                    gs.index_add_(0, b.src[lo:hi], de)
                if al is None:
                    gd[a:e].index_add_(0, d, de)
                else:
                    gd[a:e].add_(b.row_reduce(a, e, de))
            if al is not None and b.pat.nnz:    # (u now holds every edge's de)
                gs.add_(b.src_reduce(u))
            us[j] = kept[j] = None
            if j:
                i = j - 1
                ga_dst.index_add_(0, nb_rows[i], gd)
                _send_halo_grad(rnd, i, gxs[j].view(-1, H * C), gs)
                gxs[j] = None
        return gxs[0], ga_src, ga_dst, g.new_zeros(0), None, None, None


def _send_halo_grad(rnd: HaloRound, i: int, gx, ga) -> None:
    """Neighbour i's halo gradient, x' and a_src side by side as its message carried them, into the exchange."""
    b = rnd.ex.recv_pieces[i]
    w = gx.shape[1]

    def write(k, buf, first):
        rows = slice(b[k], b[k + 1])
        if first:
            buf[:, :w].copy_(gx[rows])
            buf[:, w:].copy_(ga[rows])
        else:
            buf[:, :w].add_(gx[rows])
            buf[:, w:].add_(ga[rows])
    rnd._share(i, write)
