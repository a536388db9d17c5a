"""The two naive distributed designs the ``bytes`` suite measures against, built from public pieces.

- ``replicate-all``: every layer allgathers the full node-feature matrix at the layer's input width (each rank
  then holds all N rows) and aggregates its owned rows from it; backward reduce-scatters the gradient of the
  full matrix back to the owners. Implemented here with mpi4py collectives (``Allgatherv`` / ``Reduce_scatter``)
  on the rank's CSR in global column numbering. Bytes counted: the payload each rank hands to the collective
  for *other* ranks (allgather: its own block once per other rank; reduce-scatter: the rows it does not own),
  which is what any algorithm for these collectives has to deliver.
- ``g3-original``: the runtime's own point-to-point halo exchange, but every layer exchanges at its INPUT
  width (no transform before the exchange), as the original G3 system does. Implemented by rebuilding each
  layer's aggregation of g3mpi's model at the input width (``as_g3_original``); bytes come from the runtime's
  counters.

Both produce the same logits as g3mpi (checked by the suite) so the byte counts compare equal computations.
"""
from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

from g3mpi.format.features import widen
from g3mpi.nn import specs
from g3mpi.ops import Aggregation, SpMM


def as_g3_original(model) -> None:
    """Make every GCN/SAGE layer of a g3mpi ``GNN`` aggregate (and so exchange) at its input width."""
    graph = model.graph
    for i, conv in enumerate(model.convs):
        if getattr(conv, "transform_first", False):
            kind = specs.spec(model.model).aggregation     # (gcn or mean)
            conv.transform_first = False
            conv.agg = Aggregation(graph, kind, conv.in_dim, name=f"{model.model}{i}.orig")


def _csr(rows, cols, vals, shape):
    import scipy.sparse as sp

    from g3mpi.ops.blocks import to_torch_csr
    m = sp.csr_matrix((vals.astype(np.float32), (rows, cols)), shape=shape)
    m.sum_duplicates()
    return to_torch_csr(m), to_torch_csr(m.T.tocsr())


class Counters:
    def __init__(self):
        self.reset()

    def reset(self):
        self.bytes_sent = 0
        self.bytes_recv = 0
        self.blocked_s = 0.0
        self.messages = 0


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h_own, rt):
        ctx.rt = rt
        w = h_own.shape[1]
        full = np.empty((rt.N, w), dtype=np.float32)
        t0 = time.perf_counter()
        rt.comm.Allgatherv(np.ascontiguousarray(h_own.detach().numpy()),
                           [full, (rt.counts * w).tolist(), (rt.displs * w).tolist(), MPI.FLOAT])
        c = rt.counters
        c.blocked_s += time.perf_counter() - t0
        c.bytes_sent += h_own.shape[0] * w * 4 * (rt.comm.size - 1)
        c.bytes_recv += (rt.N - h_own.shape[0]) * w * 4
        c.messages += rt.comm.size - 1
        return torch.from_numpy(full)

    @staticmethod
    def backward(ctx, g_full):
        rt = ctx.rt
        w = g_full.shape[1]
        out = np.empty((rt.n_own, w), dtype=np.float32)
        t0 = time.perf_counter()
        rt.comm.Reduce_scatter(np.ascontiguousarray(g_full.numpy()), out, (rt.counts * w).tolist(), MPI.SUM)
        c = rt.counters
        c.blocked_s += time.perf_counter() - t0
        c.bytes_sent += (rt.N - rt.n_own) * w * 4
        c.bytes_recv += rt.n_own * w * 4 * (rt.comm.size - 1)
        c.messages += rt.comm.size - 1
        return torch.from_numpy(out), None


class ReplicateAll(nn.Module):
    """GCN / SAGE with replicate-all communication; parameter names as g3mpi's ``GNN`` (load its state_dict)."""

    def __init__(self, part, comm, model: str, dims):
        super().__init__()
        sp = specs.MODELS.get(model)
        if sp is None or sp.aggregation not in ("gcn", "mean") or not sp.recipe:
            raise ValueError("replicate-all is implemented for the GCN and SAGE stacks")
        self.model, self.comm = model, comm
        self.counters = Counters()
        n, self.N = part.num_owned, part.num_nodes
        self.n_own = n
        offsets = np.full(comm.size + 1, part.num_nodes, dtype=np.int64)
        comm.Allgather(np.array([part.owned_start], dtype=np.int64), offsets[:-1])
        self.counts, self.displs = np.diff(offsets), offsets[:-1]
        rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(part.indptr))
        loc = np.asarray(part.indices, dtype=np.int64)
        glob = loc + part.owned_start
        remote = loc >= n   # halo columns (none on a 1-part partition, whose halo list is empty)
        glob[remote] = np.asarray(part.halo_ids, np.int64)[loc[remote] - n]
        self.weighted = specs.spec(model).aggregation == "gcn"     # GCN's normalisation, else SAGE's mean
        if self.weighted:
            dinv = (np.asarray(part.in_degree, np.float64) + 1.0) ** -0.5
            vals = dinv[rows] * dinv[loc]
            rows = np.concatenate([rows, np.arange(n)])
            glob = np.concatenate([glob, np.arange(n) + part.owned_start])
            vals = np.concatenate([vals, dinv[:n] ** 2])
        else:   # SAGE's mean over the in-edges and the node's own self loops (as DistGraph.blocks("mean"))
            loops = np.asarray(part.self_loops, np.float64)
            inv = 1.0 / np.maximum(np.asarray(part.in_degree[:n], np.float64) + loops, 1.0)
            vals = inv[rows]
            if loops.any():
                rows = np.concatenate([rows, np.arange(n)])
                glob = np.concatenate([glob, np.arange(n) + part.owned_start])
                vals = np.concatenate([vals, loops * inv])
        self.mat, self.mat_t = _csr(rows, glob, vals, (n, self.N))
        convs = []
        for a, b in zip(dims[:-1], dims[1:]):
            m = nn.Module()
            if self.weighted:
                m.lin = nn.Linear(a, b, bias=False)
                m.bias = nn.Parameter(torch.zeros(b))
            else:
                m.lin_l = nn.Linear(a, b, bias=True)
                m.lin_r = nn.Linear(a, b, bias=False)
            convs.append(m)
        self.convs = nn.ModuleList(convs)

    def aggregate(self, h):
        return SpMM.apply(_AllGather.apply(h.contiguous(), self), self.mat, self.mat_t)

    def forward(self, x):
        for i, conv in enumerate(self.convs):
            a = self.aggregate(x)
            if self.weighted:
                x = F.linear(a, conv.lin.weight, conv.bias)
            else:
                x = conv.lin_l(a) + conv.lin_r(x)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


class ReplicateAllRunner:
    """Training steps of ``ReplicateAll`` with the same loss, gradient allreduce and optimiser as g3mpi's
    trainer; ``step`` returns the same keys as ``Trainer.train_step``."""

    def __init__(self, part, comm, model: str, dims, state_dict, total_train: int, lr: float = 0.01):
        self.comm = comm
        self.net = ReplicateAll(part, comm, model, dims)
        self.net.load_state_dict(state_dict)
        self.params = list(self.net.parameters())
        self.opt = torch.optim.Adam(self.params, lr=lr)
        self.x = torch.from_numpy(widen(part.features, part.feature_dtype))
        self.y = torch.from_numpy(part.labels)
        self.train = torch.from_numpy(part.train_mask)
        self.total_train = total_train
        self.buf = torch.zeros(sum(p.numel() for p in self.params) + 1)

    def step(self, epoch: int) -> dict:
        c = self.net.counters
        c.reset()
        t0 = time.perf_counter()
        self.net.train()
        self.opt.zero_grad(set_to_none=False)
        out = self.net(self.x)
        loss = F.cross_entropy(out[self.train], self.y[self.train], reduction="sum") / self.total_train
        loss.backward()
        t_ar = time.perf_counter()
        off = 0
        for p in self.params:
            self.buf[off:off + p.numel()] = p.grad.reshape(-1)
            off += p.numel()
        self.buf[off] = loss.detach()
        self.comm.Allreduce(MPI.IN_PLACE, self.buf.numpy())
        off = 0
        for p in self.params:
            p.grad.copy_(self.buf[off:off + p.numel()].view_as(p))
            off += p.numel()
        allreduce_s = time.perf_counter() - t_ar
        self.opt.step()
        dt = time.perf_counter() - t0
        return dict(loss=float(self.buf[off]), epoch_time_s=dt, compute_s=dt - c.blocked_s - allreduce_s,
                    blocked_s=c.blocked_s, comm_s=c.blocked_s, overlap=0.0 if c.blocked_s else None,
                    allreduce_s=allreduce_s, bytes_sent=c.bytes_sent, bytes_recv=c.bytes_recv, messages=c.messages)

    @torch.no_grad()
    def logits(self):
        self.net.eval()
        return self.net(self.x)
