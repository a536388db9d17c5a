"""Single-process plain-PyTorch references of the public primitives of ``g3mpi.nn`` on the whole graph (the
definitions of docs/MODELS.md, written out edge by edge), for the exactness tests of user models."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from g3mpi.ops.dropout import DropoutKey, edge_keep_mask, node_dropout
from g3mpi.nn.primitives import SITE_BASE


class WholeGraph:
    """The graph of a CSR of in-edges (row v lists the sources of edges into v), the file's self loops left out."""

    def __init__(self, indptr, indices):
        n = len(indptr) - 1
        dst = np.repeat(np.arange(n), np.diff(indptr))
        src = np.asarray(indices, np.int64)
        keep = src != dst
        self.n = n
        self.src, self.dst = torch.from_numpy(src[keep]), torch.from_numpy(dst[keep])
        self.in_degree = torch.bincount(self.dst, minlength=n)
        self.out_degree = torch.bincount(self.src, minlength=n)

    def propagate(self, x, reduce: str, self_loops: bool):
        deg = self.in_degree.to(torch.float64) + float(self_loops)
        if reduce == "gcn":
            dinv = torch.where(deg > 0, deg.clamp(min=1) ** -0.5, torch.zeros_like(deg)).float()
            w = dinv[self.dst] * dinv[self.src]
            out = torch.zeros_like(x).index_add(0, self.dst, w[:, None] * x[self.src])
            return out + (dinv * dinv)[:, None] * x if self_loops else out
        out = torch.zeros_like(x).index_add(0, self.dst, x[self.src])
        if self_loops:
            out = out + x
        return out / deg.clamp(min=1).float()[:, None] if reduce == "mean" else out

    def attention(self, x, a_src, a_dst, p: float = 0.0, key: DropoutKey | None = None, site: int = SITE_BASE):
        """GAT attention with one self loop per node; dropout of the coefficients keyed as ``gnn.Attention``."""
        loop = torch.arange(self.n)
        src, dst = torch.cat([self.src, loop]), torch.cat([self.dst, loop])
        s = F.leaky_relu(a_src[src] + a_dst[dst], 0.2)
        H = s.shape[1]
        m = torch.full((self.n, H), float("-inf")).scatter_reduce(0, dst[:, None].expand(-1, H), s, "amax")
        e = torch.exp(s - m[dst].detach())
        alpha = e / torch.zeros(self.n, H).index_add(0, dst, e)[dst]
        if p > 0 and key is not None:
            alpha = alpha * edge_keep_mask(key, site, dst.numpy(), src.numpy(), H, p)
        return torch.zeros_like(x).index_add(0, dst, alpha[:, :, None] * x[src])

    def dropout(self, x, p: float, key: DropoutKey, site: int):
        return node_dropout(x, key, site, np.arange(self.n), p, True)
