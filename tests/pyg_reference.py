"""Single-process PyTorch Geometric reference models (the test oracle), with the same parameter names and
layer stack as ``g3mpi.nn.GNN``: dropout off, so one forward + backward is deterministic."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class PyGStack(nn.Module):
    def __init__(self, model, in_dim, hidden, out_dim, layers, heads=8, out_heads=1, activation="relu"):
        super().__init__()
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv
        convs, d = [], in_dim
        for i in range(layers):
            last = i == layers - 1
            if model == "gat":
                h = out_heads if last else heads
                c = out_dim if last else hidden
                convs.append(GATConv(d, c, heads=h, concat=not last))
                d = c if last else h * c
            else:
                o = out_dim if last else hidden
                convs.append(GCNConv(d, o) if model == "gcn" else SAGEConv(d, o))
                d = o
        self.convs = nn.ModuleList(convs)
        self.act = F.elu if activation == "elu" else F.relu

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = self.act(x)
        return x


class PyGRGCN(nn.Module):
    """PyG's ``RGCNConv`` (or ``FastRGCNConv``) stack, ReLU between layers, named as ``GNN(model="rgcn")``."""

    def __init__(self, in_dim, hidden, out_dim, layers, num_relations, num_bases=None, num_blocks=None,
                 fast=False):
        super().__init__()
        from torch_geometric.nn import FastRGCNConv, RGCNConv
        conv = FastRGCNConv if fast else RGCNConv
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList(conv(a, b, num_relations, num_bases=num_bases, num_blocks=num_blocks)
                                   for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x, edge_index, edge_type):
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index, edge_type)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def rgcn_reference(state, x, edge_index, edge_type, y, train_mask, **kw):
    """:func:`reference` of :class:`PyGRGCN` (``kw``: its arguments), over ``edge_index`` as given."""
    net = PyGRGCN(**kw)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    logits = net(torch.as_tensor(x), edge_index, torch.as_tensor(edge_type, dtype=torch.int64))
    train = torch.as_tensor(train_mask)
    y = torch.as_tensor(y)
    loss = F.cross_entropy(logits[train], y[train], reduction="sum") / int(train.sum())
    loss.backward()
    return logits.detach().numpy(), float(loss.detach()), {k: p.grad.numpy() for k, p in net.named_parameters()}


def edge_index_of(indptr, indices) -> torch.Tensor:
    """[2, E] (source, target) from a CSR of in-edges (row v lists the sources of edges into v)."""
    dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    return torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))


def reference(model, state, x, edge_index, y, train_mask, **kw):
    """(logits, loss, {param: grad}) of one forward+backward of the PyG stack loaded with ``state``."""
    net = PyGStack(model, **kw)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    logits = net(torch.as_tensor(x), edge_index)
    train = torch.as_tensor(train_mask)
    y = torch.as_tensor(y)
    loss = F.cross_entropy(logits[train], y[train], reduction="sum") / int(train.sum())
    loss.backward()
    return logits.detach().numpy(), float(loss.detach()), {k: p.grad.numpy() for k, p in net.named_parameters()}


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def assert_variants_equal(res, base: str, variants, models, tol: float = 1e-6) -> None:
    """In a tests/mpi_exact.py result ``res``, every variant's logits and every parameter gradient are within
    ``tol`` (relative, whole tensors) of the variant ``base``'s, for each model."""
    for model in models:
        keys = [k[len(f"{base}/{model}/"):] for k in res.files if k.startswith(f"{base}/{model}/grad/")]
        assert keys
        for v in variants:
            assert rel_err(res[f"{v}/{model}/logits"], res[f"{base}/{model}/logits"]) <= tol, (v, model)
            for k in keys:
                assert rel_err(res[f"{v}/{model}/{k}"], res[f"{base}/{model}/{k}"]) <= tol, (v, model, k)
