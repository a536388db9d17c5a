"""Single-process references of the recipe stacks and of appnp / gcn2 (the test oracle): PyG's convolutions,
``APPNP``, ``GCN2Conv`` and ``JumpingKnowledge``, torch's ``BatchNorm1d`` and ``LayerNorm`` on the whole graph,
with the parameter names of ``g3mpi.nn.recipe`` (docs/RECIPES.md gives the stack)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RefFFN(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(width, width), nn.Linear(width, width)


class RefRecipe(nn.Module):
    def __init__(self, cfg, in_dim, out_dim):
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv, JumpingKnowledge, SAGEConv
        self.act = F.elu if cfg.activation == "elu" else F.relu
        self.residual, self.use_ffn = cfg.residual, cfg.ffn
        out_lin = cfg.output_linear or cfg.jk != "none"
        self.lin_in = nn.Linear(in_dim, cfg.hidden) if cfg.input_linear else None
        d = cfg.hidden if cfg.input_linear else in_dim
        convs, norms, ffns, widths = [], [], [], []
        for i in range(cfg.layers):
            last = i == cfg.layers - 1 and not out_lin
            if cfg.model == "gat":
                h, c = (cfg.out_heads, out_dim) if last else (cfg.heads, cfg.hidden)
                convs.append(GATConv(d, c, heads=h, concat=not last))
                d = c if last else h * c
            else:
                o = out_dim if last else cfg.hidden
                convs.append(GCNConv(d, o) if cfg.model == "gcn" else SAGEConv(d, o))
                d = o
            if not last:
                widths.append(d)
                norms.append({"batch": nn.BatchNorm1d, "layer": nn.LayerNorm}.get(cfg.norm, lambda w: nn.Identity())(d))
                ffns.append(RefFFN(d) if cfg.ffn else nn.Identity())
        self.convs, self.norms, self.ffns = nn.ModuleList(convs), nn.ModuleList(norms), nn.ModuleList(ffns)
        self.jk = JumpingKnowledge(cfg.jk) if cfg.jk != "none" else None
        self.lin_out = nn.Linear(sum(widths) if cfg.jk == "cat" else d, out_dim) if out_lin else None

    def forward(self, x, ei):
        h = x if self.lin_in is None else self.act(self.lin_in(x))
        hs = []
        for l, conv in enumerate(self.convs):
            u = conv(h, ei)
            if l == len(self.norms):
                return u
            if self.use_ffn:
                u = self.ffns[l].lin2(self.act(self.ffns[l].lin1(u)))
            u = self.act(self.norms[l](u))
            h = h + u if self.residual and h.shape[1] == u.shape[1] else u
            hs.append(h)
        return self.lin_out(self.jk(hs) if self.jk is not None else h)


class RefAPPNP(nn.Module):
    def __init__(self, cfg, in_dim, out_dim):
        super().__init__()
        from torch_geometric.nn import APPNP
        dims = [in_dim] + [cfg.hidden] * (cfg.layers - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.prop = APPNP(cfg.k, cfg.alpha)

    def forward(self, x, ei):
        for i, lin in enumerate(self.lins):
            x = lin(x)
            if i < len(self.lins) - 1:
                x = F.relu(x)
        return self.prop(x, ei)


class RefGCN2(nn.Module):
    def __init__(self, cfg, in_dim, out_dim):
        super().__init__()
        from torch_geometric.nn import GCN2Conv
        self.lins = nn.ModuleList([nn.Linear(in_dim, cfg.hidden), nn.Linear(cfg.hidden, out_dim)])
        self.convs = nn.ModuleList(GCN2Conv(cfg.hidden, cfg.alpha, cfg.theta, layer=l + 1)
                                   for l in range(cfg.layers))

    def forward(self, x, ei):
        x = x0 = F.relu(self.lins[0](x))
        for conv in self.convs:
            x = F.relu(conv(x, x0, ei))
        return self.lins[1](x)


def reference_model(cfg, in_dim, out_dim) -> nn.Module:
    cls = {"appnp": RefAPPNP, "gcn2": RefGCN2}.get(cfg.model, RefRecipe)
    return cls(cfg, in_dim, out_dim)
