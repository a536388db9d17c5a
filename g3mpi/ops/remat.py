"""Rematerialisation of the row-wise segments between two aggregations (``--remat cheap``).

Between layer l's aggregation and layer l+1's, a stack computes only row-wise functions of parameters: layer l's
``post``, the stack's activation and dropout, layer l+1's ``pre`` and ``root``. Autograd would keep what each of
them saves for backward: the activation's output, the dropout mask, the dropped rows the next weight product
reads, ~9 bytes per row and hidden unit for a GCN. :func:`segment` instead keeps only the segment's inputs (the
aggregate and the own term; for a cached first layer its input product) and, in backward, computes the segment
again by row chunks with autograd and back-propagates each chunk's share at once:

    forward   out[a:b] = f(rows a..b, in[a:b])             no autograd, chunk by chunk
    backward  recompute f on in[a:b] with autograd, then d in[a:b] and d params (summed over the chunks)

Dropout masks are a function of (seed, epoch, layer, original node ID) (:mod:`g3mpi.ops.dropout`), so the
recomputed segment draws the same masks; nothing is exchanged again. Forward values are the same row-wise functions
computed on fewer rows at a time (equal up to the dense products' rounding); parameter gradients are sums over the
chunks, equal to the whole-tensor ones up to summation order.

``f`` must be a function of its rows alone and of the parameters (no state kept between calls: it runs on one row
to find the parameters, once in forward, and once more, chunk by chunk, in backward).
"""
from __future__ import annotations

import torch

#: rows of a segment computed at a time: its temporaries stay a few MB (4096 rows x 256 wide x 4 B = 4 MiB)
CHUNK_ROWS = 4096


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


class _Segment(torch.autograd.Function):
    @staticmethod
    def forward(ctx, f, rows, n_in, *args):
        inputs = args[:n_in]
        n = next(x.shape[0] for x in inputs if x is not None)
        outs = None
        for a in range(0, max(n, 1), CHUNK_ROWS):
            b = min(n, a + CHUNK_ROWS)
            got = _as_tuple(f(_sub(rows, a, b), *(None if x is None else x[a:b] for x in inputs)))
            if outs is None:
                outs = [None if y is None else y.new_empty((n, *y.shape[1:])) for y in got]
            for o, y in zip(outs, got):
                if o is not None:
                    o[a:b] = y
        ctx.save_for_backward(*(x for x in inputs if x is not None))
        ctx.present = [x is not None for x in inputs]
        ctx.f, ctx.rows, ctx.n, ctx.params = f, rows, n, args[n_in:]
        # bf16-mixed: backward recomputes under the forward's autocast (the same products, the same values)
        ctx.autocast = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")
        ctx.real = [o is not None for o in outs]
        # a None output travels as an empty 1-D placeholder (segment() maps it back)
        return tuple(o if o is not None else torch.empty(0) for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        inputs = [next(saved) if p else None for p in ctx.present]
        n_in, params = len(inputs), ctx.params
        need = [x is not None and ctx.needs_input_grad[3 + i] for i, x in enumerate(inputs)]
        need_p = [ctx.needs_input_grad[3 + n_in + j] for j in range(len(params))]
        g_in = [torch.zeros_like(x) if nd else None for x, nd in zip(inputs, need)]
        g_p = [None] * len(params)
        for a in range(0, ctx.n, CHUNK_ROWS):
            b = min(ctx.n, a + CHUNK_ROWS)
            with torch.enable_grad(), torch.autocast("cpu", dtype=ctx.autocast[1], enabled=ctx.autocast[0]):
                xs = [None if x is None else x[a:b].detach().requires_grad_(nd) for x, nd in zip(inputs, need)]
                got = _as_tuple(ctx.f(_sub(ctx.rows, a, b), *xs))
            pairs = [(y, g[a:b]) for y, g, real in zip(got, grads, ctx.real)
                     if real and g is not None and y.requires_grad]
            wrt = [x for x, nd in zip(xs, need) if nd] + [p for p, nd in zip(params, need_p) if nd]
            if not pairs or not wrt:
                continue
            got_g = iter(torch.autograd.grad([y for y, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True))
            for i, nd in enumerate(need):
                if nd and (g := next(got_g)) is not None:
                    g_in[i][a:b] = g
            for j, nd in enumerate(need_p):
                if nd and (g := next(got_g)) is not None:
                    g_p[j] = g if g_p[j] is None else g_p[j].add_(g)
        return (None, None, None, *g_in, *g_p)


def _sub(rows: slice, a: int, b: int) -> slice:
    return slice(rows.start + a, rows.start + b)


def _parameters(f, rows: slice, inputs) -> list[torch.Tensor]:
    """The tensors requiring a gradient that ``f`` reads besides its inputs (its parameters): the leaves of the
    autograd graph of ``f`` on its first row, in the order they are found."""
    with torch.enable_grad():
        n = min(1, next(x.shape[0] for x in inputs if x is not None))
        outs = _as_tuple(f(_sub(rows, 0, n), *(None if x is None else x[:n].detach() for x in inputs)))
    found, seen = [], set()
    stack = [y.grad_fn for y in outs if y is not None and y.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        v = getattr(fn, "variable", None)       # an AccumulateGrad node: a leaf that requires a gradient
        if v is not None and all(v is not p for p in found):
            found.append(v)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return found


def segment(f, rows: slice, *inputs) -> tuple:
    """``f(rows, *inputs)`` (a tuple of tensors, or None entries) computed by row chunks, with only ``inputs``
    kept for backward (module docstring). ``rows``: the owned rows the inputs hold (a slice; ``f`` gets the
    chunk's rows as a slice of the same numbering). Entries of ``inputs`` may be None (``f`` gets None); an
    output that is None comes back as None. ``f`` must not modify its inputs in place. The parameters ``f``
    reads are found by running it on one row with autograd; their gradients leave backward as the gradients of
    any op's inputs do (once per call, summed over the chunks: hooks on them see one accumulation)."""
    params = _parameters(f, rows, inputs)
    outs = _Segment.apply(f, rows, len(inputs), *inputs, *params)
    return tuple(None if o.dim() == 1 and o.numel() == 0 else o for o in outs)
