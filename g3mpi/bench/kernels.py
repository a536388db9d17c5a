"""Suite ``kernels``: one rank's epoch time against the sum of the kernels the epoch cannot avoid, each timed alone.

The kernels are the ones the model's maths needs, with the shapes g3mpi uses and on the same matrices
(``DistGraph.blocks(kind).local`` and its precomputed transpose ``local_t``), with the runtime's sparse product
(``g3mpi.ops.blocks.spmm``): per layer the SpMM forward
(A @ H), the SpMM backward (A^T @ G, only where a gradient must flow), the GEMMs (X W^T forward; G^T X for
the weight gradient; G W for the input gradient, except in the first layer), the bias and activation forward
and backward; then the loss (cross-entropy over training rows, forward + backward) and the Adam step. Rounds
alternate one training epoch and one run of every kernel, so both see the same machine load; medians over
rounds are compared: ratio = epoch / sum(kernels). 1.0 means the runtime adds nothing around its kernels.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from g3mpi.format.features import widen
from g3mpi.nn import specs
from g3mpi.ops.blocks import spmm

from .common import Sizes, median, progress, ratio
from .pyg import epoch, g3_net, random_graph


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def kernel_list(net, graph, model: str, dims, x, y, train, opt):
    """[(name, callable)] of the isolated kernels of one training epoch of ``net`` (GCN or SAGE)."""
    kind = specs.spec(model).aggregation    # (gcn or mean: the kernels suite's models)
    blk = graph.blocks(kind)
    A, At = blk.local, blk.local_t
    n = x.shape[0]
    ks = []
    L = len(dims) - 1
    # the input cache computes the first layer's aggregation of the constant input once (no input dropout here),
    # so epochs do not run it: it is not one of the epoch's kernels
    cached = bool(getattr(net, "input_cache", False)) and net.dropout == 0
    layer_kernels = _sage_kernels if specs.spec(model).root_weight else _gcn_kernels
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        first, last = i == 0, i == L - 1
        xin = x if first else torch.randn(n, a)
        g = torch.randn(n, b)
        ks += layer_kernels(f"L{i}", net.convs[i], A, At, xin, g, first, first and cached)
        ks.append((f"L{i} bias grad", lambda g=g: g.sum(0)))
        if blk.row_scale is not None:   # a mean's weights as a row scaling: forward and backward, one product each
            ks.append((f"L{i} scale rows", lambda g=g, sc=blk.row_scale[:n, None]: (g * sc, g * sc)))
        if not last:
            h = torch.randn(n, b)
            r = torch.relu(h)
            ks += [(f"L{i} relu", lambda h=h: torch.relu(h)),
                   (f"L{i} relu backward", lambda g=g, r=r: torch.ops.aten.threshold_backward(g, r, 0))]

    logits = torch.randn(n, dims[-1])

    def loss_fb():
        lg = logits.clone().requires_grad_()
        F.cross_entropy(lg[train], y[train]).backward()
    ks.append(("loss forward+backward", loss_fb))
    ks.append(("adam step", lambda: opt.step()))
    return ks


def _gcn_kernels(L: str, conv, A, At, xin, g, first: bool, cached: bool) -> list:
    """A GCN layer's kernels (name prefix ``L``): transform first when it narrows (in > out), else aggregate
    first, the aggregation of the input left out when the input cache holds it (``cached``)."""
    n, a, b = xin.shape[0], xin.shape[1], g.shape[1]
    W, bias = conv.lin.weight.detach(), conv.bias.detach()
    if a > b:
        hw = torch.randn(n, b)
        ks = [(f"{L} gemm X·Wᵀ [{n}x{a}]·[{a}x{b}]", lambda xin=xin, W=W: xin @ W.t()),
              (f"{L} spmm A·H ({b})", lambda hw=hw: spmm(A, hw)),
              (f"{L} bias add", lambda hw=hw, bias=bias: hw + bias),
              (f"{L} spmm Aᵀ·G ({b})", lambda g=g: spmm(At, g)),
              (f"{L} gemm Gᵀ·X (weight grad)", lambda g=g, xin=xin: g.t() @ xin)]
        if not first:
            ks.append((f"{L} gemm G·W (input grad)", lambda g=g, W=W: g @ W))
        return ks
    ax = torch.randn(n, a)
    ks = [] if cached else [(f"{L} spmm A·X ({a})", lambda xin=xin: spmm(A, xin))]
    ks += [(f"{L} gemm+bias AX·Wᵀ [{n}x{a}]·[{a}x{b}]", lambda ax=ax, W=W, bias=bias: torch.addmm(bias, ax, W.t())),
           (f"{L} gemm Gᵀ·AX (weight grad)", lambda g=g, ax=ax: g.t() @ ax)]
    if not first:
        ga = torch.randn(n, a)
        ks += [(f"{L} gemm G·W (input grad)", lambda g=g, W=W: g @ W),
               (f"{L} spmm Aᵀ·G ({a})", lambda ga=ga: spmm(At, ga))]
    return ks


def _sage_kernels(L: str, conv, A, At, xin, g, first: bool, cached: bool) -> list:
    """A SAGE layer's kernels, as :func:`_gcn_kernels`, with the root weight beside the neighbours' one."""
    n, a, b = xin.shape[0], xin.shape[1], g.shape[1]
    bias = conv.lin_l.bias.detach()
    if a > b:
        Wc = torch.cat([conv.lin_l.weight, conv.lin_r.weight]).detach()          # [2b, a]
        hw = torch.randn(n, 2 * b)
        g2 = torch.randn(n, 2 * b)
        ks = [(f"{L} gemm X·[Wl;Wr]ᵀ [{n}x{a}]·[{a}x{2 * b}]", lambda xin=xin, Wc=Wc: xin @ Wc.t()),
              (f"{L} spmm A·H ({b})", lambda hw=hw: spmm(A, hw[:, :b].contiguous())),
              (f"{L} bias+root add", lambda hw=hw, bias=bias: hw[:, :b] + bias + hw[:, b:]),
              (f"{L} spmm Aᵀ·G ({b})", lambda g=g: spmm(At, g)),
              (f"{L} gemm Gᵀ·X (weight grad)", lambda g2=g2, xin=xin: g2.t() @ xin)]
        if not first:
            ks.append((f"{L} gemm G·[Wl;Wr] (input grad)", lambda g2=g2, Wc=Wc: g2 @ Wc))
        return ks
    Wcat = torch.cat([conv.lin_l.weight, conv.lin_r.weight], dim=1).detach()  # [b, 2a]
    ax = torch.randn(n, a)
    z = torch.randn(n, 2 * a)
    ks = [] if cached else [(f"{L} spmm A·X ({a})", lambda xin=xin: spmm(A, xin)),
                            (f"{L} concat [AX, X]", lambda ax=ax, xin=xin: torch.cat([ax, xin], dim=1))]
    ks += [(f"{L} gemm+bias [AX,X]·Wᵀ [{n}x{2 * a}]·[{2 * a}x{b}]", lambda z=z, Wcat=Wcat, bias=bias:
            torch.addmm(bias, z, Wcat.t())),
           (f"{L} gemm Gᵀ·[AX,X] (weight grad)", lambda g=g, z=z: g.t() @ z)]
    if not first:
        ga = torch.randn(n, a)
        ks += [(f"{L} gemm G·W (input grad)", lambda g=g, Wcat=Wcat: g @ Wcat),
               (f"{L} spmm Aᵀ·G ({a})", lambda ga=ga: spmm(At, ga))]
    return ks


def run(sz: Sizes, models=("gcn", "sage"), rounds: int | None = None, seed: int = 0) -> dict:
    torch.set_num_threads(sz.threads)
    dims = list(sz.dims)
    g = random_graph(sz.nodes, sz.edges, dims[0], dims[-1], seed)
    rounds = rounds or sz.epochs
    res = dict(graph=dict(nodes=g.num_nodes, edges=g.num_edges), rounds=rounds, models={})
    for model in models:
        progress(f"kernels: {model}, {rounds} rounds")
        net, order, graph = g3_net(g, model, dims, sz.heads)
        try:
            x = torch.from_numpy(widen(g.features, g.feature_dtype))[order]
            y = torch.from_numpy(g.labels)[order]
            train = torch.from_numpy(g.train_mask)[order]
            opt = torch.optim.Adam(net.parameters(), lr=0.01)
            epoch(net, x, y, train, opt)            # warm-up; also gives every parameter a gradient for Adam
            ks = kernel_list(net, graph, model, dims, x, y, train, opt)
            for _, fn in ks:
                fn()
            ep_t, k_t = [], {name: [] for name, _ in ks}
            for _ in range(rounds):
                ep_t.append(epoch(net, x, y, train, opt)[0])
                for name, fn in ks:
                    k_t[name].append(_timed(fn))
            k_med = {name: median(v) for name, v in k_t.items()}
            total = float(sum(k_med.values()))
            e_med = median(ep_t)
            spmm = sum(v for k, v in k_med.items() if "spmm" in k)
            gemm = sum(v for k, v in k_med.items() if "gemm" in k)
            res["models"][model] = dict(epoch_median_s=e_med, epoch_times_s=ep_t, kernels_median_s=k_med,
                                        kernel_sum_s=total, spmm_sum_s=spmm, gemm_sum_s=gemm,
                                        other_sum_s=total - spmm - gemm, ratio_epoch_vs_kernels=ratio(e_med, total))
            progress(f"kernels: {model}: epoch {e_med:.3f}s, kernel sum {total:.3f}s (spmm {spmm:.3f}, "
                     f"gemm {gemm:.3f}), ratio {e_med / total:.3f}")
        finally:
            graph.ctx.free()   # its exchanges and communicator
        del net, opt, ks
    return res



