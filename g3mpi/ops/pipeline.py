"""Inter-layer pipelining for GCN and SAGE: boundary rows first, their next-layer messages leave at once.

Each layer's owned rows split into the boundary group B (rows some neighbour needs) and the interior group I.
Per layer l (schedule ``pipelined``):

  1. local block of B rows;  2. neighbour blocks as layer l's messages land (for B and I rows);
  3. B rows finished: bias, activation, dropout, layer l+1's weight product -> layer l+1's exchange starts now;
  4. local block of I rows, chunk by chunk, driving MPI progress between chunks, while layer l+1's messages
     travel; then I rows finished likewise.

So each exchange overlaps the interior computation of the previous layer (including its dense part) and the
boundary rows' local block of its own layer. The two groups stay two tensors from the first layer to the last
(only the logits are merged): each group's local block is stored split by columns (``RowGroup``), so its product
takes both groups' inputs as they are, written in place into its output. Every operation is an autograd op
(sparse products with precomputed transposes; the exchange Functions of ``g3mpi.ops.exchange``), so backward
runs the mirror image: halo gradients are sent as soon as autograd has summed them from both row groups, both
groups' local transposes run in one pass, and owners sum what they receive. Partial sums are added in a fixed
order: results equal the blocking schedule's up to rounding (the local block's row sums are split in two).
"""
from __future__ import annotations

import torch

from g3mpi.sched.blocks import chunk_rows_for, spmm

from .exchange import halo_join, halo_recv, halo_start


class SpMM(torch.autograd.Function):
    """out = mat @ h; grad_h = mat_t @ grad_out (transpose precomputed)."""

    @staticmethod
    def forward(ctx, h, mat, mat_t):
        ctx.mat_t = mat_t
        return spmm(mat, h.detach())

    @staticmethod
    def backward(ctx, g):
        return spmm(ctx.mat_t, g.contiguous()), None, None


def _product(out, m_b, m_i, xb, xi):
    """out = m_b @ xb + m_i @ xi, written into ``out`` (uninitialised; a row range of a larger tensor is fine):
    no zero-filled result, no temporary, no copy (``spmm``, then an accumulating ``addmm_``)."""
    spmm(m_b, xb, out)
    return out.addmm_(m_i, xi)


class _LocalProduct:
    """One layer's local-block product for both row groups: ``ob = B.local @ [xb; xi]`` first (``_LocalB``),
    ``oi = I.local @ [xb; xi]`` later, by row chunks with ``progress()`` between them (``_LocalI``). The
    inputs stay two tensors (never merged into one [n, F]); each group's block is stored split by columns
    (``RowGroup``), so each output is the sum of two products.

    Backward runs once, in ``_LocalB``'s backward (autograd runs it after ``_LocalI``'s, which only hands over
    the interior rows' gradient): grad_xb = B.local_t[0] @ gb + I.local_t[0] @ gi and grad_xi likewise, each
    accumulated in place chunk by chunk, with ``progress()`` between chunks."""

    def __init__(self, B, I, rows_per_chunk: int, progress):
        self.B, self.I, self.rpc, self.progress = B, I, rows_per_chunk, progress
        self.x = None       # (xb, xi) until the interior rows are computed
        self.gi = None      # the interior rows' output gradient, from _LocalI.backward to _LocalB.backward

    def backward(self, gb):
        gi, self.gi = self.gi, None
        gb = gb.contiguous()
        if gi is None:      # the interior output needed no gradient
            gi = gb.new_zeros(len(self.I.rows), gb.shape[1])
        grads = []
        for tb, ti in zip(self.B.t_chunks(self.rpc), self.I.t_chunks(self.rpc)):
            out = gb.new_empty(tb[-1][1], gb.shape[1])
            for (a, b, mb), (_, _, mi) in zip(tb, ti):
                _product(out[a:b], mb, mi, gb, gi)
                self.progress()
            grads.append(out)
        return grads


class _LocalB(torch.autograd.Function):
    """Boundary rows' local product; returns it and a token that ``_LocalI`` takes, so that autograd runs
    ``_LocalI``'s backward first."""

    @staticmethod
    def forward(ctx, xb, xi, op):
        ctx.op = op
        xb, xi = xb.detach(), xi.detach()
        op.x = (xb, xi)
        m_b, m_i = op.B.local
        out = _product(xb.new_empty(m_b.shape[0], xb.shape[1]), m_b, m_i, xb, xi)
        return out, xb.new_empty(0)

    @staticmethod
    def backward(ctx, g, _):
        gxb, gxi = ctx.op.backward(g)
        return gxb, gxi, None


class _LocalI(torch.autograd.Function):
    """Interior rows' local product, chunk by chunk; its backward hands the gradient to ``_LocalB``'s."""

    @staticmethod
    def forward(ctx, token, op):
        ctx.op = op
        (xb, xi), op.x = op.x, None
        out = xb.new_empty(len(op.I.rows), xb.shape[1])
        for a, b, m_b, m_i in op.I.chunks(op.rpc):
            _product(out[a:b], m_b, m_i, xb, xi)
            op.progress()
        return out

    @staticmethod
    def backward(ctx, g):
        ctx.op.gi = g.contiguous()
        return g.new_zeros(0), None


def _merge(n, rows_b, yb, rows_i, yi):
    """[n, F] with rows ``rows_b`` from yb and ``rows_i`` from yi (the two groups cover every row once)."""
    out = yb.new_empty(n, yb.shape[1])
    out.index_copy_(0, rows_b, yb)
    return out.index_copy_(0, rows_i, yi)


def input_product_groups(model, x):
    """The first layer's input product (``input_product_rows``) of the boundary and of the interior rows, computed
    with the row groups' own matrices (no whole-rank blocks are built for it); no autograd."""
    g = model.graph
    sched = g.schedule
    conv = model.convs[0]
    ex = conv.agg.ex
    B, I = g.row_groups(conv.agg.kind)
    xb, xi = x[B.rows], x[I.rows]
    dummy = halo_start(xb, ex, sched, B.send_pos)
    ob = _product(x.new_empty(len(B.rows), x.shape[1]), *B.local, xb, xi)
    oi = _product(x.new_empty(len(I.rows), x.shape[1]), *I.local, xb, xi)
    k = ex.forward.num_recvs
    halos = [None] * k
    for i in sched.poll(ex.forward) + sched.rest(ex.forward):
        halos[i] = halo_recv(dummy, ex, sched, i)
    for i in range(k):          # fixed order, as forward_pipelined adds them
        if B.nb[i] is not None:
            ob.index_add_(0, B.nb[i][0], spmm(B.nb[i][1], halos[i]))
        if I.nb[i] is not None:
            oi.index_add_(0, I.nb[i][0], spmm(I.nb[i][1], halos[i]))
    return conv.input_product_rows(ob, xb), conv.input_product_rows(oi, xi)


def forward_pipelined(model, x, key, c0=None):
    """The model stack of ``GNN`` (GCN or SAGE) with inter-layer pipelining; same result as the layer-by-layer
    forward. Layers provide ``pre(x_rows) -> (payload_rows, aux_rows)`` and ``post(agg_rows, aux_rows, x_rows)``.
    ``c0``: the first layer's cached input product (``GNN`` input cache) as (boundary rows, interior rows), or
    None; with it the pipeline starts at the second layer."""
    from .dropout import node_dropout
    g = model.graph
    sched = g.schedule
    convs = model.convs
    last = len(convs) - 1
    B, I = g.row_groups(convs[0].agg.kind)
    ids_b, ids_i = g.orig_ids[B.rows], g.orig_ids[I.rows]
    n = g.num_owned
    progress = g.ctx.progress
    training = model.training

    def start(conv, xb):
        pb, ab = conv.pre(xb)
        return pb, ab, halo_start(pb, conv.agg.ex, sched, B.send_pos)

    first = 0
    if c0 is not None:
        yb, yi = (convs[0].from_input_product(c) for c in c0)
        if last == 0:
            return _merge(n, B.rows, yb, I.rows, yi)
        first = 1
        xb = node_dropout(model.activation(yb), key, 1, ids_b, model.dropout, training)
        xi = node_dropout(model.activation(yi), key, 1, ids_i, model.dropout, training)
        yb = yi = None
    else:
        xb = node_dropout(x[B.rows], key, 0, ids_b, model.dropout, training)
        xi = node_dropout(x[I.rows], key, 0, ids_i, model.dropout, training)
    pb, ab, dummy = start(convs[first], xb)
    pi, ai = convs[first].pre(xi)
    for l in range(first, last + 1):
        conv = convs[l]
        ex = conv.agg.ex
        rpc = chunk_rows_for(pb.shape[1], sched.chunk_rows) if sched.chunk_rows >= 0 else 0
        op = _LocalProduct(B, I, rpc, progress)
        ob, token = _LocalB.apply(pb, pi, op)
        pb = pi = None   # dead from here on: references to dead tensors are dropped as soon as possible
        k = ex.forward.num_recvs
        parts_b, parts_i = [None] * k, [None] * k

        def land(landed):
            for i in landed:
                h = halo_recv(dummy, ex, sched, i)
                if B.nb[i] is not None:
                    parts_b[i] = SpMM.apply(h, B.nb[i][1], B.nb[i][2])
                if I.nb[i] is not None:
                    parts_i[i] = SpMM.apply(h, I.nb[i][1], I.nb[i][2])

        land(sched.poll(ex.forward))
        land(sched.rest(ex.forward))
        for i in range(k):
            if parts_b[i] is not None:
                ob = ob.index_add_(0, B.nb[i][0], parts_b[i])
                parts_b[i] = None
        ob = halo_join(ob, dummy)
        yb = conv.post(ob, ab, xb)
        ob = None
        if l < last:
            xb = node_dropout(model.activation(yb), key, l + 1, ids_b, model.dropout, training)
            yb = None
            pb, ab, dummy = start(convs[l + 1], xb)
        oi = _LocalI.apply(token, op)
        token = op = None
        for i in range(k):
            if parts_i[i] is not None:
                oi = oi.index_add_(0, I.nb[i][0], parts_i[i])
        yi = conv.post(oi, ai, xi)
        if l == last:
            return _merge(n, B.rows, yb, I.rows, yi)
        xi = node_dropout(model.activation(yi), key, l + 1, ids_i, model.dropout, training)
        pi, ai = convs[l + 1].pre(xi)
