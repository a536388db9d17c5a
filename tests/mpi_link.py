"""MPI helper for tests/test_link_exact.py: one training forward + backward of a GCN encoder and a link decoder on
pairs scored through ``g3mpi.nn.Pairs``, then the same pairs again without gradients.

mpiexec -n P python -m mpi4py -m tests.mpi_link PARTS PAIRS.npz OUT.npz --decoder dot|hadamard [--embed]
PAIRS.npz: ``pos`` and ``neg`` int64 [2, m] (original node IDs: fixed negatives), ``seed``, ``epoch``: one sampled
negative per positive is added (``g3mpi.ops.negatives``, keyed by the positive's index). ``--embed``: the decoder runs
on ``Pairs``' embeddings (no pipelining) instead of inside it. ``--chunk C``: training pairs scored C at a time,
recomputed in backward. Rank 0 writes OUT.npz: ``init/<name>``, the loss,
``grad/<name>`` summed over ranks, the scores of every pair by index (``score/pos``, ``score/neg``,
``score/sampled``), the evaluation scores, ``fused_loss`` and ``fused_grad/<name>`` (the positives and the
sampled negatives as one training set through ``Pairs.loss_sum``), the pair exchanges' bytes sent and their lower bound (each rank's distinct
destination rows it does not own, times the row bytes), summed over ranks.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi import nn as gnn
from g3mpi.comm import CommContext
from g3mpi.ops.negatives import negative_destinations
from g3mpi.sched import Schedule
from tests.mpi_common import gather_rows, rank_part, summed_grads

HID, OUT = 8, 6


class LinkNet(nn.Module):
    def __init__(self, graph, in_dim, decoder):
        super().__init__()
        self.encoder = gnn.GNN(graph, "gcn", in_dim, HID, OUT, layers=2)
        self.decoder = gnn.DECODERS[decoder](OUT, HID, 2)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("pairs")
    ap.add_argument("out")
    ap.add_argument("--decoder", default="dot")
    ap.add_argument("--embed", action="store_true")
    ap.add_argument("--schedule", default="pipelined")
    ap.add_argument("--chunk", type=int, default=0, help="pairs scored at once under autograd (0: the default)")
    a = ap.parse_args(argv)
    if a.chunk:
        import g3mpi.ops.pairs
        g3mpi.ops.pairs.CHUNK_PAIRS = a.chunk
    comm, meta, part = rank_part(a.parts)
    ctx = CommContext(comm)
    graph = gnn.Graph(part, ctx, Schedule(a.schedule))
    pr = np.load(a.pairs)
    owned = np.asarray(part.orig_ids, dtype=np.int64)
    ids = gnn.NodeIds(graph)
    sets = {}
    for name in ("pos", "neg"):
        e = pr[name]
        mine = np.flatnonzero(np.isin(e[0], owned))
        sets[name] = (mine, e[0, mine], e[1, mine])
    mine = sets["pos"][0]
    neg_dst = negative_destinations(int(pr["seed"]), int(pr["epoch"]), mine, 1, graph.num_nodes)[:, 0]
    sets["sampled"] = (mine, sets["pos"][1], neg_dst)
    pairs, bound = {}, 0
    for name, (idx, s, d) in sets.items():
        pairs[name] = gnn.Pairs(graph, ids.to_new(s), ids.to_new(d), name=f"pairs-{name}")
        bound += len(np.setdiff1d(d, owned)) * OUT * 4
    torch.manual_seed(0)
    net = LinkNet(graph, part.feature_dim, a.decoder)
    init = {k: v.detach().clone().numpy() for k, v in net.state_dict().items()}
    x = torch.from_numpy(part.features)

    def scores(h):
        out = {}
        for name, p in pairs.items():
            if a.embed:
                out[name] = net.decoder(*p(h))
            else:
                out[name] = p(h, net.decoder)
        return out

    net.train()
    sc = scores(net.encoder(x))
    total = comm.allreduce(sum(len(v) for v in sc.values()))
    loss = (F.binary_cross_entropy_with_logits(sc["pos"], torch.ones_like(sc["pos"]), reduction="sum")
            + sum(F.binary_cross_entropy_with_logits(sc[k], torch.zeros_like(sc[k]), reduction="sum")
                  for k in ("neg", "sampled"))) / total
    loss.backward()
    res = {f"init/{k}": v for k, v in init.items()}
    res.update(summed_grads(comm, net))
    res["loss"] = np.array(comm.allreduce(float(loss.detach())))
    sent = sum(v.get("bytes_sent", 0) for k, v in ctx.stats.per_exchange.items()
               if k.startswith("pairs-") and k.endswith(".fwd"))
    res["bytes_sent"] = np.array(comm.allreduce(sent))
    res["bytes_bound"] = np.array(comm.allreduce(bound))
    # again with the training set's layout (positives sorted by source, then their sampled negatives, one
    # exchange) through ``loss_sum``: the dot decoder's BCE fused with its gradient (g3mpi.ops.pairs.SampledDotBCE)
    pos, samp = sets["pos"], sets["sampled"]
    by_src = np.argsort(ids.to_new(pos[1]), kind="stable")
    src = ids.to_new(pos[1])[by_src]
    dst = np.r_[ids.to_new(pos[2])[by_src], ids.to_new(samp[2])[by_src]]
    train = gnn.Pairs(graph, np.r_[src, src], dst, name="train-set")
    net.zero_grad()
    h = net.encoder(x)
    fused = (train.loss_sum(h, net.decoder, len(src)) + F.binary_cross_entropy_with_logits(
        pairs["neg"](h, net.decoder), torch.zeros(len(sets["neg"][0])), reduction="sum")) / total
    fused.backward()
    res.update(summed_grads(comm, net, prefix="fused_"))
    res["fused_loss"] = np.array(comm.allreduce(float(fused.detach())))
    train.free()
    net.eval()
    with torch.no_grad():
        ev = scores(net.encoder(x))
    for name, (idx, _, _) in sets.items():
        m = pr["pos"].shape[1] if name != "neg" else pr["neg"].shape[1]
        res[f"score/{name}"] = gather_rows(comm, idx, sc[name].detach().numpy(), m, np.nan)
        res[f"eval/{name}"] = gather_rows(comm, idx, ev[name].numpy(), m, np.nan)
    for p in pairs.values():
        p.free()
    ctx.free()
    if comm.rank == 0:
        np.savez(a.out, **res)


if __name__ == "__main__":
    main()
