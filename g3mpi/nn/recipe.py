"""Recipe blocks for the built-in layers, and the one function that builds the built-in model of a configuration.

The recipe stack (``RecipeGNN``), with d(h) node dropout keyed by original node ID and act the activation:

    h = act(lin_in(d(x)))                                 with input_linear: x [n, in] -> [n, hidden]
    for each layer l = 0..L-1:
        u = conv_l(d(h))                                  the built-in layer (gcn, sage, gat)
        the last layer without an output linear: return u (the logits)
        u = ffn_l(u) = W2 d(act(W1 u)) + b                with ffn: [n, w] -> [n, w], w the layer's width
        u = act(norm_l(u))                                norm: none, LayerNorm, DistBatchNorm (all nodes)
        h = h + u  if residual and h, u have one width,  else u
    h = cat(h_0, .., h_(L-1))  or  max_l h_l              with jk cat / max (per entry)
    out = lin_out(d(h))                                   with output_linear (always with jk): [n, out]

A hidden layer's width w is ``hidden`` (GAT: heads x hidden); with an output linear every layer is hidden.
Pipelining: every block but BatchNorm and JK is row-wise (a row of h_(l+1) needs only that row of h_l and of u), so a
GCN or SAGE stack without them runs through ``run_stack``, with the inter-layer pipeline, as the plain stack does (the
blocks between two layers are its ``between``, on the boundary rows first). BatchNorm needs every node's row before
any can go on and JK every layer's, so such a stack (and GAT) runs layer by layer, each layer's aggregation still
pipelined inside it (chunks, per neighbour as messages land).

``build_model(graph, cfg, in_dim, out_dim)`` builds the model as its registry entry says (``g3mpi.nn.specs``): for
the stacks of one layer (``build_stack``) the plain ``GNN`` when no recipe option is set, else a ``RecipeGNN``.
Every model has ``convs`` (one entry per propagation layer); parameters outside them (linears, norms) are the
model's own.
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.ops import DistGraph, DropoutKey, node_dropout

from . import specs
from .base import pipelines, run_stack
from .model import ACTIVATIONS, GNN
from .norm import NORMS, make_norm
from .specs import uses_recipe

#: every built-in model (the registry's names, ``g3mpi.nn.specs``)
MODELS = specs.names()
#: --jk: none, concatenation or entry-wise maximum of the hidden layers' outputs
JKS = ("none", "cat", "max")


class FFN(nn.Module):
    """Feed-forward block after propagation: ``lin2(d(act(lin1(u))))``, [n, w] -> [n, w]."""

    def __init__(self, width: int):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, u: torch.Tensor, act, drop) -> torch.Tensor:
        return self.lin2(drop(act(self.lin1(u))))


class RecipeGNN(nn.Module):
    """The recipe stack of the module docstring over ``layers`` built-in ``model`` layers. Dropout sites (the
    ``layer`` of their keys): conv l's input l, ffn l's L + l, the input linear's 2L, the output linear's 2L + 1."""

    def __init__(self, graph: DistGraph, model: str, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 heads: int = 8, out_heads: int = 1, dropout: float = 0.0, attn_dropout: float = 0.0,
                 activation: str = "relu", residual: bool = False, norm: str = "none", input_linear: bool = False,
                 output_linear: bool = False, ffn: bool = False, jk: str = "none", **settings):
        super().__init__()
        stacks = [m for m, sp in specs.MODELS.items() if sp.recipe]
        if model not in stacks:
            raise ValueError(f"model {model!r}: recipe blocks apply to {', '.join(stacks)}")
        make_layer = specs.spec(model).load_layer()
        if norm not in NORMS:
            raise ValueError(f"norm {norm!r}: expected one of {', '.join(NORMS)}")
        if jk not in JKS:
            raise ValueError(f"jk {jk!r}: expected one of {', '.join(JKS)}")
        self.graph, self.model, self.dropout = graph, model, float(dropout)
        self.act = ACTIVATIONS[activation]
        self.residual, self.jk = bool(residual), jk
        output_linear = bool(output_linear) or jk != "none"
        self.lin_in = nn.Linear(in_dim, hidden) if input_linear else None
        d = hidden if input_linear else in_dim
        convs, norms, ffns, widths = [], [], [], []
        for i in range(layers):
            last = i == layers - 1 and not output_linear
            conv, d = make_layer.build(graph, d, hidden, out_dim, last, f"{model}{i}", heads=heads,
                                       out_heads=out_heads, attn_dropout=attn_dropout, **settings)
            convs.append(conv)
            if not last:
                widths.append(d)
                norms.append(make_norm(norm, graph, d))
                ffns.append(FFN(d) if ffn else nn.Identity())
        self.convs = nn.ModuleList(convs)
        self.norms, self.ffns = nn.ModuleList(norms), nn.ModuleList(ffns)
        self.use_ffn = bool(ffn)
        jk_width = sum(widths) if jk == "cat" else d
        self.lin_out = nn.Linear(jk_width, out_dim) if output_linear else None
        #: row-wise between the layers (no BatchNorm, no JK) and row-wise layers: the inter-layer pipeline applies
        self.rowwise = norm != "batch" and jk == "none" and all(c.rowwise for c in convs)

    @property
    def pipelines(self) -> bool:
        """Whether forward runs the inter-layer pipeline (a row-wise stack that ``run_stack`` pipelines)."""
        return self.rowwise and pipelines(self.graph, self.convs)

    def _block(self, l: int, u: torch.Tensor, h: torch.Tensor, drop) -> torch.Tensor:
        """h_(l+1) from layer l's output u and its input h (rows of both): feed-forward, norm, activation,
        residual."""
        if self.use_ffn:
            u = self.ffns[l](u, self.act, lambda t: drop(t, len(self.convs) + l))
        u = self.act(self.norms[l](u))
        return h + u if self.residual and h.shape[1] == u.shape[1] else u

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        ids = self.graph.orig_ids
        L = len(self.convs)

        def drop(h, site, rows=slice(None)):
            return node_dropout(h, key, site, ids[rows], self.dropout, self.training)
        if self.rowwise:
            return self._forward_stack(x, key, drop)
        h = x if self.lin_in is None else self.act(self.lin_in(drop(x, 2 * L)))
        hs = []
        for l, conv in enumerate(self.convs):
            u = conv(drop(h, l), key, l)
            if l == len(self.norms):     # the last layer, without an output linear: the logits
                return u
            h = self._block(l, u, h, drop)
            hs.append(h)
        if self.jk == "cat":
            h = torch.cat(hs, dim=1)
        elif self.jk == "max":
            h = torch.stack(hs, dim=-1).max(dim=-1)[0]     # as PyG's JumpingKnowledge("max")
        return self.lin_out(drop(h, 2 * L + 1))

    def _forward_stack(self, x: torch.Tensor, key: DropoutKey | None, drop) -> torch.Tensor:
        """forward of a row-wise stack through ``run_stack`` (with the inter-layer pipeline where it pipelines): the
        input linear and the blocks after each layer run as its ``between`` on each row group (boundary rows
        first); ``inputs[(l, rows)]`` keeps layer l's input rows h_l (before dropout) for the residual of the
        blocks after it."""
        L = len(self.convs)
        inputs = {}

        def between(l, y, rows):
            if l == 0:
                h = y if self.lin_in is None else self.act(self.lin_in(drop(y, 2 * L, rows)))
            else:
                h_in = inputs.pop((l - 1, rows.start, rows.stop))
                h = self._block(l - 1, y, h_in, lambda t, site: drop(t, site, rows))
            inputs[(l, rows.start, rows.stop)] = h
            return drop(h, l, rows)
        u = run_stack(self.graph, self.convs, x, between, key)
        if self.lin_out is None:
            return u
        h = torch.cat([inputs[k] for k in sorted(inputs)]) if len(inputs) > 1 else next(iter(inputs.values()))
        return self.lin_out(drop(self._block(L - 1, u, h, drop), 2 * L + 1))


def build_model(graph: DistGraph, cfg, in_dim: int, out_dim: int) -> nn.Module:
    """The built-in model of the configuration ``cfg`` (a ``TrainConfig``, or anything with its model fields) for
    ``in_dim`` features and ``out_dim`` outputs, as its registry entry builds it (``g3mpi.nn.specs``); parameters
    drawn from torch's current random state."""
    return specs.spec(cfg.model).load_builder()(graph, cfg, in_dim, out_dim)


def build_stack(graph: DistGraph, cfg, in_dim: int, out_dim: int) -> nn.Module:
    """The builder of a stack of the entry's ``layer``: the plain ``GNN`` when no recipe option is set, else a
    ``RecipeGNN``; the entry's own settings (``ModelSpec.settings``) go to its layers' ``build``."""
    sp = specs.spec(cfg.model)
    own = {k: getattr(cfg, k) for k in sp.settings if k not in specs.ATTENTION_SETTINGS}
    common = dict(layers=cfg.layers, heads=cfg.heads, out_heads=cfg.out_heads, dropout=cfg.dropout,
                  attn_dropout=cfg.attn_dropout, activation=cfg.activation, **own)
    if not uses_recipe(cfg):
        return GNN(graph, cfg.model, in_dim, cfg.hidden, out_dim, input_cache=cfg.input_cache,
                   remat=cfg.remat == "cheap", **common)
    return RecipeGNN(graph, cfg.model, in_dim, cfg.hidden, out_dim, residual=cfg.residual, norm=cfg.norm,
                     input_linear=cfg.input_linear, output_linear=cfg.output_linear, ffn=cfg.ffn, jk=cfg.jk,
                     **common)
