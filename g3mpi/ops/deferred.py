"""Weight gradients computed off the backward's critical path (the inter-layer pipeline's ``linear``).

In backward, a layer's halo gradient waits only for its input gradient; the weight gradient of the same product
(as costly) is not needed until the optimiser step. Inside ``deferring(queue)`` (``forward_pipelined``, fp32,
no remat), :func:`linear` is ``F.linear`` whose backward returns the input and bias gradients at once and queues
the weight's product: computed while a wait for returned gradients would otherwise idle (``HaloRound``'s
``fill``), the rest at the end of the backward pass (an autograd engine callback), where each weight's products
are summed in the order autograd would have summed them and added to ``.grad`` once: the same bits.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

_queue = None   # the WeightGrads of the forward running now (None: plain F.linear)


class WeightGrads:
    """One pass's queued weight products: ``(weight, x, g)`` whose gradient ``g.t() @ x`` goes to ``weight``.

    A weight's products are summed and added to ``.grad`` (its post-accumulate hooks then fire, as autograd's
    would: the gradient allreduce's buckets, ``g3mpi.train.gradsync``) once as many have been computed as the
    forward made uses of it; ``finish`` adds whatever is left (uses that backward never reached)."""

    def __init__(self):
        self._uses = {}     # id(weight) -> uses of it in this forward
        self._todo = []     # [weight, x, g, product or None], in the order backward reached them
        self._armed = False

    def expect(self, weight) -> None:
        self._uses[id(weight)] = self._uses.get(id(weight), 0) + 1

    def put(self, weight, x, g) -> None:
        self._todo.append([weight, x, g, None])
        if not self._armed:
            self._armed = True
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def step(self) -> bool:
        """Compute the next queued product (work that waits for nothing); False when none is left."""
        for item in self._todo:
            if item[3] is None:
                weight, x, g, _ = item
                item[3] = g.t().mm(x)   # (as autograd's backward of F.linear computes it)
                item[1] = item[2] = None
                mine = [it for it in self._todo if it[0] is weight]
                if len(mine) == self._uses.get(id(weight), 0) and all(it[3] is not None for it in mine):
                    self._apply(weight)
                return True
        return False

    def finish(self) -> None:
        """Every product left, then their weights' gradients."""
        while self.step():
            pass
        for weight in list({id(it[0]): it[0] for it in self._todo}.values()):
            self._apply(weight)
        self._armed = False

    def _apply(self, weight) -> None:
        """Sum the weight's products in queue order (as autograd's input buffer sums them), add the sum to .grad."""
        mine = [it for it in self._todo if it[0] is weight]
        self._todo = [it for it in self._todo if it[0] is not weight]
        self._uses.pop(id(weight), None)
        total = mine[0][3]
        for it in mine[1:]:
            total = total + it[3]
        with torch.no_grad():
            if weight.grad is None:
                weight.grad = total
            else:
                weight.grad += total
        for hook in getattr(weight, "_post_accumulate_grad_hooks", None) or {}:
            weight._post_accumulate_grad_hooks[hook](weight)


@contextmanager
def deferring(queue: WeightGrads | None):
    """:func:`linear` queues its weight gradients on ``queue`` (None: it is ``F.linear``) while the block runs."""
    global _queue
    prev, _queue = _queue, queue
    try:
        yield
    finally:
        _queue = prev


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; inside :func:`deferring` (2-D float32 input, no autocast) its weight
    gradient is queued there."""
    q = _queue
    if q is None or x.dim() != 2 or x.dtype != torch.float32 or weight.dtype != torch.float32 or \
            torch.is_autocast_enabled("cpu") or not (torch.is_grad_enabled() and weight.requires_grad) or \
            not (x.requires_grad or (bias is not None and bias.requires_grad)):
        # (an input and bias needing no gradient: with the weight detached, backward would never reach it)
        return F.linear(x, weight, bias)
    q.expect(weight)
    # the weight enters detached: autograd has no edge to it, so its accumulation (and hooks) run only here
    return _Linear.apply(x, weight.detach(), bias, q, (weight,))


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, q, param):
        ctx.q, ctx.param, ctx.has_bias = q, param[0], bias is not None
        ctx.save_for_backward(x, w)
        return F.linear(x, w, bias)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g.mm(w) if ctx.needs_input_grad[0] else None
        gb = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        ctx.q.put(ctx.param, x, g)
        return gx, None, gb, None, None
