"""Inter-layer pipelining for GCN and SAGE: boundary rows first, their next-layer messages leave at once.

Each layer's owned rows split into the boundary group B (rows some neighbour needs) and the interior group I.
Per layer l (schedule ``pipelined``):

  1. local block of B rows;  2. neighbour blocks as layer l's messages land (for B and I rows);
  3. B rows finished: bias, activation, dropout, layer l+1's weight product -> layer l+1's exchange starts now;
  4. local block of I rows, chunk by chunk, driving MPI progress between chunks, while layer l+1's messages
     travel; then I rows finished likewise.

So each exchange overlaps the interior computation of the previous layer (including its dense part) and the
boundary rows' local block of its own layer. Every operation is an autograd op (sparse products with
precomputed transposes; the exchange Functions of ``g3mpi.ops.exchange``), so backward runs the mirror image:
halo gradients are sent as soon as autograd has summed them from both row groups, and owners sum what they
receive. Partial sums are added in a fixed order: results equal the blocking schedule's up to rounding.
"""
from __future__ import annotations

import torch

from g3mpi.sched.blocks import chunk_rows_for

from .exchange import halo_join, halo_recv, halo_start


class SpMM(torch.autograd.Function):
    """out = mat @ h; grad_h = mat_t @ grad_out (transpose precomputed)."""

    @staticmethod
    def forward(ctx, h, mat, mat_t):
        ctx.mat_t = mat_t
        return torch.sparse.mm(mat, h.detach())

    @staticmethod
    def backward(ctx, g):
        return torch.sparse.mm(ctx.mat_t, g.contiguous()), None, None


class _ChunkedSpMM(torch.autograd.Function):
    """out [r, F] = group's local block @ h [n, F], by row chunks with ``progress()`` between chunks;
    backward by row chunks of the transpose, likewise."""

    @staticmethod
    def forward(ctx, h, fwd_chunks, bwd_chunks, progress):
        ctx.bwd, ctx.progress = bwd_chunks, progress
        h = h.detach()
        if len(fwd_chunks) == 1:
            out = torch.sparse.mm(fwd_chunks[0][2], h)
            progress()
            return out
        out = torch.empty(fwd_chunks[-1][1], h.shape[1], dtype=h.dtype)
        for a, b, m in fwd_chunks:
            out[a:b] = torch.sparse.mm(m, h)
            progress()
        return out

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        if len(ctx.bwd) == 1:
            grad = torch.sparse.mm(ctx.bwd[0][2], g)
            ctx.progress()
            return grad, None, None, None
        grad = torch.empty(ctx.bwd[-1][1], g.shape[1], dtype=g.dtype)
        for a, b, m in ctx.bwd:
            grad[a:b] = torch.sparse.mm(m, g)
            ctx.progress()
        return grad, None, None, None


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
    ob, oi = torch.sparse.mm(B.local, x), torch.sparse.mm(I.local, x)
    k = ex.forward.num_recvs
    halos = [None] * k
    for i in sched.poll(ex.forward) + sched.rest(ex.forward):
        halos[i] = halo_recv(dummy, ex, sched, i)
    for i in range(k):          # fixed order, as forward_pipelined adds them
        if B.nb[i] is not None:
            ob.index_add_(0, B.nb[i][0], torch.sparse.mm(B.nb[i][1], halos[i]))
        if I.nb[i] is not None:
            oi.index_add_(0, I.nb[i][0], torch.sparse.mm(I.nb[i][1], halos[i]))
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
        pay = _merge(n, B.rows, pb, I.rows, pi)
        pb = pi = None   # dead from here on: references to dead tensors are dropped as soon as possible
        ob = SpMM.apply(pay, B.local, B.local_t)
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
        fwd, bwd = I.chunks(chunk_rows_for(pay.shape[1], sched.chunk_rows) if sched.chunk_rows >= 0 else 0)
        oi = _ChunkedSpMM.apply(pay, fwd, bwd, progress)
        for i in range(k):
            if parts_i[i] is not None:
                oi = oi.index_add_(0, I.nb[i][0], parts_i[i])
        yi = conv.post(oi, ai, xi)
        if l == last:
            return _merge(n, B.rows, yb, I.rows, yi)
        xi = node_dropout(model.activation(yi), key, l + 1, ids_i, model.dropout, training)
        pi, ai = convs[l + 1].pre(xi)
