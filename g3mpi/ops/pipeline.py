"""Inter-layer pipelining for row-wise layers (GCN, SAGE): boundary rows first, their next-layer messages leave
at once.

Each layer's owned rows split into the boundary group B (rows some neighbour needs: owned rows
``0 .. num_boundary-1``, the part format's boundary-first order) and the interior group I (the rest).
Per layer l (schedule ``pipelined``):

  1. local block of B rows, then their own term (``root``: SAGE's W_r x; needs no message);
  2. neighbour blocks, each row once the message pieces it reads have landed (for B and I rows);
  3. B rows finished: ``post``, then the model's activation and dropout (``between``), layer l+1's ``pre`` ->
     layer l+1's exchange starts now (the payload's send rows are a view: no gather);
  4. the I rows' own term, then their local block, chunk by chunk, driving MPI progress between chunks, while
     layer l+1's messages travel (chunks of it also fill step 2's waits for a piece); then I rows finished
     likewise.

So each exchange overlaps the interior computation of the previous layer (including its dense part) and the
boundary rows' local block of its own layer. The two groups are row ranges, so the input splits into views and
they stay two tensors from the first layer to the last (only the logits are joined, one ``cat``): each group's
local block is stored split by columns (``RowGroup``), so its product takes both groups' inputs as they are,
written in place into its output. The layers are driven through ``g3mpi.sched.layers.RowwiseLayer``. Every
operation is an autograd op (the exchange of ``g3mpi.ops.exchange``), so backward runs the mirror image: each
neighbour's halo gradient is written in place and sent once both row groups have added their share, both
groups' local transposes run in one pass, and the gradients other ranks send are added in place. Partial sums
are added in a fixed order: results equal the blocking schedule's up to rounding (the local block's row sums are
split in two).
"""
from __future__ import annotations

import torch

from g3mpi.sched.layers import Between, RowwiseLayer

from .blocks import spmm, spmm_add
from .deferred import WeightGrads, deferring
from .exchange import HaloRound


def _product(out, m_b, m_i, xb, xi):
    """out = m_b @ xb + m_i @ xi, written into ``out`` (uninitialised; a row range of a larger tensor is fine):
    no zero-filled result, no temporary, no copy (``spmm``, then an accumulating ``addmm_``)."""
    spmm(m_b, xb, out)
    return spmm_add(m_i, xi, out)


class _LocalProduct:
    """One layer's local-block product for both row groups: ``ob = B.local @ [xb; xi]`` first (``_LocalB``),
    ``oi = I.local @ [xb; xi]`` later, by row chunks with ``progress()`` between them (``_LocalI``). The
    inputs stay two tensors (never merged into one [n, F]); each group's block is stored split by columns
    (``RowGroup``), so each output is the sum of two products.

    Backward runs once, in ``_LocalB``'s backward (autograd runs it after ``_LocalI``'s, which only hands over
    the interior rows' gradient): grad_xb = B.local_t[0] @ gb + I.local_t[0] @ gi and grad_xi likewise, the
    first product chunk by chunk with ``progress()`` between chunks, the second added in place after it."""

    def __init__(self, B, I, rows_per_chunk: int, progress, rnd: HaloRound, fold: int = 1, new_rows=None):
        self.B, self.I, self.rpc, self.progress, self.rnd = B, I, rows_per_chunk, progress, rnd
        self.fold = fold    # a typed block's R: rows of R F values in, of F out
        self.new_rows = new_rows or (lambda shape, like: like.new_empty(shape))   # (the input's gradients)
        self.x = None       # (xb, xi) until the interior rows are computed
        self.oi = None      # the interior rows' product, chunks 0 .. done_i-1 computed
        self.done_i = 0
        self.gi = None      # the interior rows' output gradient, from _LocalI.backward to _LocalB.backward

    def interior_step(self) -> bool:
        """Compute the next chunk of the interior rows' product (work that needs no message: the pipeline does it
        while a message piece travels, ``_LocalI`` the rest); False when every chunk is done."""
        chunks = self.I.chunks(self.rpc)
        if self.done_i >= len(chunks):
            return False
        xb, xi = self.x
        if self.oi is None:
            self.oi = xb.new_empty(self.I.size, xb.shape[1] // self.fold)
        a, b, m_b, m_i = chunks[self.done_i]
        _product(self.oi[a:b], m_b, m_i, xb, xi)
        self.done_i += 1
        return True

    def backward(self, gb):
        gi, self.gi = self.gi, None
        gb = gb.contiguous()
        if gi is None:      # the interior output needed no gradient
            gi = gb.new_zeros(self.I.size, gb.shape[1])
        grads = []
        for tb, ti in zip(self.B.t_chunks(self.rpc), self.I.local_t):
            rows, f = tb[-1][1], self.fold  # (a typed transpose's rows: R per input row)
            out = self.new_rows((rows // f, gb.shape[1] * f), gb).view(rows, gb.shape[1])
            for a, b, mb in tb:
                spmm(mb, gb, out[a:b])
                self.progress()
            # the interior rows' share in one accumulating product (each row's two sums added as by chunks; one
            # call per chunk cost more than the product)
            spmm_add(ti, gi, out)
            grads.append(out.view(out.shape[0] // self.fold, gb.shape[1] * self.fold))
        self.rnd.add_received(grads[0])     # (the send rows are boundary rows)
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
        out = _product(xb.new_empty(m_b.shape[0], xb.shape[1] // op.fold), m_b, m_i, xb, xi)
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
        while op.interior_step():
            op.progress()
        out, op.oi, op.x = op.oi, None, None
        return out

    @staticmethod
    def backward(ctx, g):
        ctx.op.gi = g.contiguous()
        return g.new_zeros(0), None


def _neighbour_products(rnd: HaloRound, op: _LocalProduct, B, I) -> tuple[list, list]:
    """Both row groups' products with each neighbour's block, per neighbour (None where a group has no block),
    as (product, its output rows), the rows each landed piece completes computed when it lands
    (``ForwardPieces``); while nothing has landed, the next chunk of the interior rows' local product (``op``)
    fills the wait."""
    k = len(B.nb)
    parts_b, parts_i = [None] * k, [None] * k
    bounds = rnd.ex.recv_pieces
    while rnd.pieces_left:
        got = rnd.landed_pieces()
        if not got and op.interior_step():
            continue    # nothing landed: the interior rows' product, which needs no message, meanwhile
        for i, p in got or rnd.next_pieces():   # piece p of neighbour i: the rows of both groups it completes
            h = rnd.landed_halo(i, p)
            for grp, parts in ((B, parts_b), (I, parts_i)):
                if grp.nb[i] is not None:
                    fwd = grp.nb_pieces(i, bounds[i])[0]
                    parts[i] = (fwd.product(parts[i][0] if p else None, p, h), fwd.rows)
    return parts_b, parts_i


def input_product_groups(layer, x, schedule, halo=None):
    """The first layer's input product (``input_product_rows``) of the boundary and of the interior rows, computed
    with the row groups' own matrices (no whole-rank blocks are built for it); no autograd. ``halo(i)``: receive
    neighbour i's halo rows of ``x`` where the caller has them (a kept input halo: nothing is sent); None: the
    layer's exchange fetches them."""
    B, I = layer.groups
    xb, xi = x[:B.stop], x[B.stop:]
    if halo is None:
        rnd = HaloRound(layer.exchange, schedule)
        rnd.start(xb)
    ob = _product(x.new_empty(B.size, x.shape[1]), *B.local, xb, xi)
    oi = _product(x.new_empty(I.size, x.shape[1]), *I.local, xb, xi)
    if halo is None:
        rnd.landed()
        rnd.rest()
        halo = rnd.halo
    for i in range(len(B.nb)):          # fixed order, as forward_pipelined adds them
        h = halo(i)
        for grp, o in ((B, ob), (I, oi)):
            if grp.nb[i] is not None:
                o.index_add_(0, grp.nb[i][0], spmm(grp.nb[i][1], h))
        del h
    ob, oi = layer.scale_out(ob, slice(0, B.stop)), layer.scale_out(oi, slice(B.stop, I.stop))
    return layer.input_product_rows(ob, xb), layer.input_product_rows(oi, xi)


def input_product_local(layer, x, halo):
    """The first layer's input product of all owned rows (``input_product_rows``) from the local block and each
    receive neighbour's halo rows ``halo(i)``, which the caller has (nothing is sent); no autograd. The same sums
    as the layer's ``Aggregation`` (local rows by chunks, then each neighbour's block added in order)."""
    agg = layer.aggregation
    blocks, n = agg.blocks, agg.graph.num_owned
    out = x.new_empty(n, x.shape[1])
    for a, b, mat in blocks.chunks(agg.schedule.rows_per_chunk(x.shape[1], 0)):
        spmm(mat, x, out[a:b])
    for i, nb in enumerate(blocks.neighbours):
        out.index_add_(0, nb.rows, spmm(nb.mat, halo(i)))
    return layer.input_product_rows(layer.scale_out(out), x)


def layer_inputs(layer, rows: slice, make_x, *inputs, remat: bool = False):
    """Layer ``layer``'s ``pre`` of the rows ``rows`` and a thunk giving their ``root``, from its input
    ``x = make_x(rows, *inputs)`` (the previous layer's ``post`` and the stack's ``between``, row-wise). With
    ``remat`` the whole segment runs by row chunks keeping only ``inputs`` for backward, and is computed again
    there (:func:`g3mpi.ops.remat.segment`; up to ``x`` for a layer with ``wide_pre``); else ``x`` is kept for
    ``root``, called when the caller asks."""
    if remat:
        from .remat import segment
        if getattr(layer, "wide_pre", False):
            # messages wider than the input (R-GCN's R * out): the segment ends at x, kept for the backward of
            # ``pre`` and ``root``, which run once on the whole rows (not copied by chunks, nor computed again)
            x, = segment(lambda r, *xs: (make_x(r, *xs),), rows, *inputs)
            return layer.pre(x), (lambda: layer.root(x))

        def f(r, *xs):
            x = make_x(r, *xs)
            return layer.pre(x), layer.root(x)
        pre, root = segment(f, rows, *inputs)
        return pre, (lambda: root)
    x = make_x(rows, *inputs)
    return layer.pre(x), (lambda: layer.root(x))


def _split_aggregation(layer, B, I, pb, pi, rnd, token, root_b, schedule, progress, rows_b, rows_i):
    """Layer ``layer``'s aggregate of the boundary rows, their own term, and a thunk that finishes the interior
    rows' aggregate, with the row groups' own blocks: the boundary rows' local block first, each neighbour's
    block as its pieces land (the interior rows' local chunks filling the waits), the interior rows' remaining
    chunks when the thunk is called (after the next layer's messages left)."""
    k = len(B.nb)
    agg = layer.aggregation
    op = _LocalProduct(B, I, schedule.rows_per_chunk(pb.shape[1], k), progress, rnd, agg.blocks.fold,
                       getattr(agg, "new_rows", None))
    ob, tok = _LocalB.apply(pb, pi, op)
    pb = pi = None   # dead from here on: references to dead tensors are dropped as soon as possible
    # the boundary rows' own term while the messages travel; created after _LocalB, so that in backward
    # autograd runs it after the halo gradients left and before _LocalB's wait for the returned ones
    ab = root_b()
    parts_b, parts_i = _neighbour_products(rnd, op, B, I)
    bounds = rnd.ex.recv_pieces
    for i in range(k):
        if parts_b[i] is not None:
            ob = rnd.add(ob, token, i, *parts_b[i], B.nb_pieces(i, bounds[i])[1])
            parts_b[i] = None
    ob = layer.scale_out(rnd.join(ob, token), rows_b)

    def finish_i():
        nonlocal tok, op
        oi = _LocalI.apply(tok, op)
        tok = op = None
        for i in range(k):
            if parts_i[i] is not None:
                oi = rnd.add(oi, token, i, *parts_i[i], I.nb_pieces(i, bounds[i])[1])
                parts_i[i] = None
        return layer.scale_out(oi, rows_i)
    return ob, ab, finish_i


def forward_pipelined(layers: list[RowwiseLayer], between: Between, x, schedule, progress, c0=None,
                      remat: bool = False):
    """The model stack of ``layers`` with inter-layer pipelining; the same result as layer by layer.
    ``between``: the model's activation and dropout (``g3mpi.sched.layers.Between``); ``progress()`` drives MPI
    progress of every exchange in flight. ``c0``: the first layer's cached input product (the model's input cache)
    as (boundary rows, interior rows), or None; with it the pipeline starts at the second layer. ``remat``: the
    row-wise segments between two aggregations are recomputed in backward (:func:`layer_inputs`); ``between``
    must then keep no state between calls.

    Without ``remat``, the weight gradients of the layers' ``post`` products (``g3mpi.ops.deferred.linear``) are
    computed while backward waits for returned halo gradients, not before the next halo gradient is sent."""
    wg = None if remat else WeightGrads()
    with deferring(wg):
        return _forward_pipelined(layers, between, x, schedule, progress, c0, remat, wg)


def _forward_pipelined(layers, between, x, schedule, progress, c0, remat, wg):
    blocks = layers[0].aggregation.blocks
    nb, n = blocks.num_boundary, blocks.num_owned
    rows_b, rows_i = slice(0, nb), slice(nb, n)
    last = len(layers) - 1

    def entry(r, xr):                   # layer 0's input
        return between(0, xr, r)

    def from_c0(r, c):                  # layer 1's input, from layer 0's cached input product
        return between(1, layers[0].from_input_product(c), r)

    def transition(l):                  # layer l+1's input, from layer l's aggregate and own term
        return lambda r, o, a: between(l + 1, layers[l].post(o, a), r)

    if c0 is not None:
        if last == 0:
            return torch.cat([layers[0].from_input_product(c) for c in c0])
        first, make_x, in_b, in_i = 1, from_c0, c0[0], c0[1]
    else:
        first, make_x, in_b, in_i = 0, entry, x[rows_b], x[rows_i]
    pb, root_b = layer_inputs(layers[first], rows_b, make_x, in_b, remat=remat)
    rnd = HaloRound(layers[first].exchange, schedule, wg)
    token = rnd.start(pb)      # the boundary rows' messages leave before the interior rows' input is made
    pi, root_i = layer_inputs(layers[first], rows_i, make_x, in_i, remat=remat)
    in_b = in_i = None
    for l in range(first, last + 1):
        layer = layers[l]
        # (each layer's own row groups: a stack may mix kinds, typed and untyped; the row ranges are the same)
        ob, ab, finish_i = _split_aggregation(layer, *layer.groups, pb, pi, rnd, token, root_b, schedule, progress,
                                              rows_b, rows_i)
        pb = pi = None
        if l < last:
            pb, root_b = layer_inputs(layers[l + 1], rows_b, transition(l), ob, ab, remat=remat)
            rnd_next = HaloRound(layers[l + 1].exchange, schedule, wg)
            token_next = rnd_next.start(pb)
        else:
            yb = layer.post(ob, ab)
        ob = ab = None
        ai = root_i()     # (while the next layer's messages travel)
        oi = finish_i()
        finish_i = None
        if l == last:
            return torch.cat([yb, layer.post(oi, ai)])
        pi, root_i = layer_inputs(layers[l + 1], rows_i, transition(l), oi, ai, remat=remat)
        oi = ai = None
        rnd, token = rnd_next, token_next
