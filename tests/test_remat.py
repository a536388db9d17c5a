"""``--remat cheap``: the row-wise blocks between two aggregations keep only their inputs for backward and are
computed again there, by row chunks (``g3mpi.ops.remat``). The same logits and gradients as autograd keeping
everything (whole tensors, within 1e-6: parameter gradients are sums over the chunks), in one process and on P
ranks under the pipelined and blocking schedules, with dropout (its masks are drawn again, keyed by node ID),
for the built-in GCN and SAGE and for a user model (docs/examples/user_gcn.py); and what autograd keeps is what
the module says. GAT and the public ``Attention`` keep no per-edge term and compute them again in backward
(``g3mpi.ops.gat``): the same values, and PyG's on several ranks."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.pyg_reference import assert_variants_equal, rel_err

SLOW_TESTS = ("test_remat_equals_kept_multi_rank", "test_g3_train_remat_trains_the_same_model")
EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


@pytest.fixture
def small_chunks(monkeypatch):
    from g3mpi.ops import remat
    monkeypatch.setattr(remat, "CHUNK_ROWS", 7)


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd keeps for backward while ``fn()`` runs (parameters excluded)."""
    seen = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def _saved_shapes(fn):
    """The shapes of the tensors autograd keeps for backward while ``fn()`` runs."""
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        out = fn()
    return out, shapes


def _train_alike(nets, x, y, record, check, steps: int = 3):
    """``steps`` SGD steps of nets[0] (autograd keeping everything) and nets[1] (remat), dropout keyed alike:
    at every step the logits and every parameter gradient within 1e-6 (whole tensors), and ``check(kept,
    remat)`` on what ``record(fn)`` (fn's result and what it records of autograd) saw of each net's forward."""
    from g3mpi.ops import DropoutKey
    opts = [torch.optim.SGD(n.parameters(), lr=0.05) for n in nets]
    for epoch in range(steps):
        outs, saved = [], []
        for net, opt in zip(nets, opts):
            net.train()
            opt.zero_grad()
            out, rec = record(lambda: net(x, DropoutKey(3, epoch)))
            F.cross_entropy(out, y).backward()
            outs.append([out.detach()] + [p.grad.clone() for p in net.parameters()])
            saved.append(rec)
            opt.step()
        assert len(outs[0]) == len(outs[1])
        for a, b in zip(*outs):
            assert rel_err(a.numpy(), b.numpy()) <= 1e-6
        check(*saved)


def test_segment_equals_autograd(small_chunks):
    """A segment with a None input and a None output, an input that needs a gradient, one that does not, and
    parameters: its outputs, the input's gradient and the parameters' gradients equal autograd's."""
    from g3mpi.ops.remat import segment
    torch.manual_seed(0)
    n, F_, H = 50, 5, 6
    c = torch.randn(n, F_)
    o = torch.randn(n, H, requires_grad=True)
    lin0, lin1 = torch.nn.Linear(F_, H), torch.nn.Linear(H, 3)
    rows_seen = []

    def f(rows, c, none, o):
        assert none is None
        rows_seen.append((rows.start, rows.stop))
        keep = (torch.arange(rows.start, rows.stop)[:, None] + torch.arange(H)) % 3 != 0   # a mask by row ID
        return lin1(torch.relu(lin0(c) + o) * keep), None

    results = []
    for use in (False, True):
        for t in (o, *lin0.parameters(), *lin1.parameters()):
            t.grad = None
        rows_seen.clear()
        y, z = segment(f, slice(10, 10 + n), c, None, o) if use else f(slice(10, 10 + n), c, None, o)
        assert z is None
        y.sin().sum().backward()
        results.append([y.detach().clone()] + [t.grad.clone() for t in (o, *lin0.parameters(), *lin1.parameters())])
    # the first row (to find the parameters), forward by chunks of 7 rows (numbered from 10), then each chunk
    # again in backward
    assert rows_seen == [(10, 11)] + [(a, min(60, a + 7)) for a in range(10, 60, 7)] * 2
    for a, b in zip(*results):
        assert rel_err(a.numpy(), b.numpy()) <= 1e-6


def test_segment_keeps_only_its_inputs():
    from g3mpi.ops.remat import segment
    x = torch.randn(100, 8)
    lin = torch.nn.Linear(8, 32)
    lin2 = torch.nn.Linear(32, 4)

    def f(rows, x):
        return (lin2(torch.relu(lin(x)) * 2.0),)
    _, kept = _saved_bytes(lambda: lin2(torch.relu(lin(x)) * 2.0))
    (y,), seg = _saved_bytes(lambda: segment(f, slice(0, 100), x))
    # (beside the input: what the one-row run that finds the parameters keeps while it lives)
    assert kept >= 100 * 4 * (8 + 32 + 32) and 0 <= seg - x.untyped_storage().nbytes() < 1024


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    from g3mpi.format import read_meta, read_part
    from g3mpi.ops import DistGraph
    out = tmp_path_factory.mktemp("remat") / "parts"
    partition(random_graph(n=120, f=6), 1, out)
    part = read_part(out, 0, read_meta(out))
    ctx = CommContext(MPI.COMM_SELF)
    yield part, DistGraph(part, ctx)
    ctx.free()


def _user_gcn():
    spec = importlib.util.spec_from_file_location("user_gcn_remat", EXAMPLES / "user_gcn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.GCN


@pytest.mark.parametrize("model", ["gcn", "sage", "user"])
def test_remat_equals_kept_in_process(one_rank, small_chunks, model):
    """Three training steps with dropout, remat against autograd keeping everything: logits and parameter
    gradients within 1e-6 at every step, and autograd keeps at most a third of the bytes (SAGE: 0.6, it keeps
    each layer's own term beside the aggregate)."""
    from g3mpi.nn import GNN
    part, graph = one_rank
    x = torch.from_numpy(part.features.copy())
    y = torch.from_numpy(part.labels).clamp(min=0)
    nets = []
    for remat in (False, True):
        torch.manual_seed(0)
        if model == "user":
            nets.append(_user_gcn()(graph, part.feature_dim, 32, part.num_classes, layers=3, dropout=0.5,
                                    remat=remat))
        else:
            nets.append(GNN(graph, model, part.feature_dim, 32, part.num_classes, layers=3, dropout=0.5,
                            remat=remat))
    if model == "user":     # dropout sites are numbered per graph in construction order: the second net's are new
        for a, b in zip(nets[0].drops, nets[1].drops):
            b.site = a.site
    assert model == "user" or (not nets[0].remat and nets[1].remat)

    def keeps_less(kept, remat):
        assert remat <= kept * (0.6 if model == "sage" else 1 / 3), (kept, remat)
    _train_alike(nets, x, y, _saved_bytes, keeps_less)


@pytest.fixture
def small_edge_chunks(monkeypatch):
    from g3mpi.ops import gat
    monkeypatch.setattr(gat, "REMAT_EDGES", 40)


@pytest.mark.parametrize("api", ["gat", "attention"])
def test_gat_remat_equals_kept_in_process(one_rank, small_edge_chunks, api):
    """GAT (8 heads) and the public ``Attention`` with ``remat``: three training steps with feature and attention
    dropout, the per-edge terms computed again in backward by chunks of about 40 edges: logits and every gradient
    within 1e-6 of autograd keeping them, evaluation's logits too, and autograd keeps no per-edge tensor."""
    from g3mpi import nn as gnn
    from g3mpi.nn import GNN
    part, graph = one_rank
    x = torch.from_numpy(part.features.copy())
    y = torch.from_numpy(part.labels).clamp(min=0)
    H, C = 8, 4
    edges = graph.blocks("gat").local_dst.shape[0]

    class UserGAT(torch.nn.Module):     # one attention layer written with the public primitives
        def __init__(self, remat):
            super().__init__()
            self.lin = torch.nn.Linear(part.feature_dim, H * C)
            self.att = torch.nn.Parameter(torch.randn(2, H, C) * 0.3)
            self.attention = gnn.Attention(graph, H, C, dropout=0.3, remat=remat)
            self.out = torch.nn.Linear(H * C, part.num_classes)

        def forward(self, x, key=None):
            h = self.lin(x).view(-1, H, C)
            a = (h.unsqueeze(1) * self.att).sum(-1)
            return self.out(F.elu(self.attention(h, a[:, 0], a[:, 1], key).reshape(-1, H * C)))

    nets = []
    for remat in (False, True):
        torch.manual_seed(0)
        nets.append(GNN(graph, "gat", part.feature_dim, C, part.num_classes, layers=2, heads=H, dropout=0.5,
                        attn_dropout=0.3, activation="elu", remat=remat) if api == "gat" else UserGAT(remat))
    if api == "attention":
        nets[1].attention.site = nets[0].attention.site     # (sites are numbered per graph in construction order)

    def no_per_edge_term(kept, remat):
        # without remat autograd keeps [edges, H] tensors (scores, weights, masks); with it, none
        assert [s for s in kept if s[:1] == (edges,)] and not [s for s in remat if s[:1] == (edges,)], remat
    _train_alike(nets, x, y, _saved_shapes, no_per_edge_term)
    with torch.no_grad():
        for net in nets:
            net.eval()
        assert rel_err(nets[0](x).numpy(), nets[1](x).numpy()) <= 1e-6


@pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="torch_geometric missing")
def test_gat_remat_equals_pyg(tmp_path):
    """GAT with ``remat`` on 3 ranks, pipelined and blocking, chunks of about 5 edges: logits and every gradient
    within 1e-5 of PyG's ``GATConv`` stack on the whole graph."""
    from tests.test_models_exact import check_against_pyg
    g = random_graph(seed=5)
    partition(g, 3, tmp_path / "parts")
    variants = ("pipelined:0:0:remat5", "blocking:-1:0:remat5")
    run_mpi(3, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", "gat", "--variants",
            ",".join(variants))
    res = np.load(tmp_path / "out.npz")
    for v in variants:
        check_against_pyg(res, g, f"{v}/gat", "gat")


@pytest.mark.parametrize("P", [2, 3])
def test_remat_equals_kept_multi_rank(P, tmp_path):
    """On P ranks, pipelined (the boundary and interior rows' segments apart) and blocking, with dropout, the
    input halo kept or exchanged, and segments of 5 rows (GAT: attention dropout, chunks of about 5 edges):
    logits and every gradient within 1e-6 of autograd keeping everything."""
    g = random_graph(n=160, f=6, seed=P)
    partition(g, P, tmp_path / "parts", seed=P)
    base = "blocking:-1:0:nocache:drop0.4"
    variants = ("pipelined:0:0:remat5:drop0.4", "pipelined:0:0:halo:remat5:drop0.4", "blocking:-1:0:remat5:drop0.4",
                "blocking:-1:0:nocache:remat5:drop0.4", "pipelined:0:0:nocache:remat5:drop0.4")
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", "gcn,sage,gat",
            "--variants", ",".join((base,) + variants), "--repeat", "2", "--hidden", "16", timeout=600)
    assert_variants_equal(np.load(tmp_path / "out.npz"), base, variants, ("gcn", "sage", "gat"))


@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_memory_model_counts_what_remat_keeps(one_rank, model):
    """RUNTIME.md's activations term with ``remat`` (g3mpi.train.memory.rank_memory) against the bytes autograd
    keeps in a training forward with dropout: within 15 %, and below the term without remat."""
    from g3mpi.nn import GNN
    from g3mpi.ops import DropoutKey
    from g3mpi.train.memory import rank_memory
    part, graph = one_rank
    x = torch.from_numpy(part.features.copy())
    torch.manual_seed(0)
    net = GNN(graph, model, part.feature_dim, 64 if model != "gat" else 16, part.num_classes, layers=3, heads=4,
              dropout=0.5, attn_dropout=0.5, remat=True, activation="elu" if model == "gat" else "relu")
    net.train()
    train = torch.from_numpy(part.train_mask)
    y = torch.from_numpy(part.labels).clamp(min=0)
    _, kept = _saved_bytes(lambda: F.cross_entropy(net(x, DropoutKey(1, 1))[train], y[train]))
    kept -= x.untyped_storage().nbytes()    # the input (the part term holds it)
    n = part.num_owned
    args = dict(owned=n, halo=0, send=0, edges=int(part.indptr[-1]), feature_dim=part.feature_dim,
                hidden=64 if model != "gat" else 16, num_classes=part.num_classes, layers=3, heads=4)
    modelled = rank_memory(model, remat=True, **args)["activations"]
    assert 0.85 * kept <= modelled <= 1.15 * kept, (modelled, kept)
    assert modelled < rank_memory(model, **args)["activations"]


def test_parameter_hooks_see_one_accumulation(one_rank, small_chunks):
    """GradSync starts a bucket's allreduce when every parameter's gradient has been accumulated (a
    post-accumulate hook): with remat each parameter is still accumulated once per backward, whatever the
    number of chunks, so no partial gradient leaves."""
    from g3mpi.nn import GNN
    from g3mpi.ops import DropoutKey
    part, graph = one_rank
    x = torch.from_numpy(part.features.copy())
    torch.manual_seed(0)
    net = GNN(graph, "sage", part.feature_dim, 16, part.num_classes, layers=3, dropout=0.5, remat=True)
    calls = {}
    for name, p in net.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
    net.train()
    net(x, DropoutKey(1, 1)).sum().backward()
    assert calls == {name: 1 for name, _ in net.named_parameters()}


def test_g3_train_remat_trains_the_same_model(tmp_path):
    """g3-train on 2 ranks, rows enough for several 4096-row chunks per segment, dropout on, SGD: ``--remat cheap``
    ends with the parameters of ``--remat none`` (within 1e-5; a partial gradient leaving in the allreduce
    would differ at once)."""
    g = random_graph(n=12000, f=8, c=4, seed=2)
    partition(g, 2, tmp_path / "p2", seed=2)
    runs = {}
    for r in ("none", "cheap"):
        run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "p2", "--out", tmp_path / r, "--no-progress",
                "--no-plots", "--log-level", "WARNING", "--epochs", "3", "--hidden", "16", "--dropout", "0.5",
                "--optimizer", "sgd", "--lr", "0.5", "--timeline-epoch", "0", "--remat", r, timeout=300)
        runs[r] = torch.load(tmp_path / r / "model.pt", weights_only=True)
    assert runs["none"].keys() == runs["cheap"].keys()
    for k, v in runs["none"].items():
        assert torch.linalg.norm(runs["cheap"][k] - v) <= 1e-5 * torch.linalg.norm(v), k


def test_remat_drops_the_evaluation_cache_in_training(one_rank):
    """Evaluation keeps the first layer's input product for the next evaluation; with remat a training step
    with dropout frees it (4F bytes per row through every step), without remat it stays."""
    from g3mpi.nn import GNN
    from g3mpi.ops import DropoutKey
    part, graph = one_rank
    x = torch.from_numpy(part.features.copy())
    for remat in (False, True):
        net = GNN(graph, "gcn", part.feature_dim, 16, part.num_classes, dropout=0.5, remat=remat)
        halo = np.zeros((graph.num_halo, part.feature_dim), dtype=np.float32)   # (one rank: no halo rows)
        net.keep_input_halo(x, halo)
        with torch.no_grad():
            net.eval()
            net(x)
        assert net._cached is not None
        net.train()
        net(x, DropoutKey(0, 1)).sum().backward()
        assert (net._cached is None) == remat
