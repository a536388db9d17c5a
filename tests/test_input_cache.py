"""The model's input cache (the first layer's aggregation of a constant input, computed once) changes no result:
cached == recomputed over several passes, in training with and without dropout and in evaluation, on one rank
in-process and on P ranks under every schedule; it is dropped when the input changes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.pyg_reference import assert_variants_equal, rel_err

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_cached_equals_recomputed_multi_rank", "test_kept_input_halo_equals_exchange")

MODELS = ("gcn", "sage")


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    from g3mpi.format import read_meta, read_part
    from g3mpi.ops import DistGraph
    out = tmp_path_factory.mktemp("cache") / "parts"
    partition(random_graph(f=6), 1, out)
    part = read_part(out, 0, read_meta(out))
    ctx = CommContext(MPI.COMM_SELF)
    yield part, DistGraph(part, ctx)
    ctx.free()


def _pair(model, graph, part, dropout):
    from g3mpi.nn import GNN
    nets = []
    for cache in (True, False):
        torch.manual_seed(0)
        nets.append(GNN(graph, model, part.feature_dim, 16, part.num_classes, layers=3, dropout=dropout,
                        input_cache=cache))
    return nets


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_cached_equals_recomputed_in_process(one_rank, model, dropout):
    from g3mpi.ops import DropoutKey
    part, graph = one_rank
    x = torch.from_numpy(part.features.copy())
    y = torch.from_numpy(part.labels).clamp(min=0)
    cached, plain = _pair(model, graph, part, dropout)
    assert cached.input_cache and not plain.input_cache
    opts = [torch.optim.Adam(n.parameters(), lr=0.05) for n in (cached, plain)]
    for epoch in range(3):
        outs = []
        for net, opt in zip((cached, plain), opts):
            net.train()
            opt.zero_grad()
            out = net(x, DropoutKey(7, epoch))
            F.cross_entropy(out, y).backward()
            opt.step()
            outs.append(out.detach())
        assert rel_err(outs[0].numpy(), outs[1].numpy()) <= 1e-6
        for (k, a), (_, b) in zip(cached.named_parameters(), plain.named_parameters()):
            assert torch.equal(a, b), k
        with torch.no_grad():
            cached.eval(), plain.eval()
            assert rel_err(cached(x).numpy(), plain(x).numpy()) <= 1e-6
    # used exactly when the input is constant: in evaluation always, in training only without dropout
    assert cached._cached is not None and cached._cached[0] is x
    # an in-place change of the input drops the cached product
    x.mul_(2.0)
    with torch.no_grad():
        assert rel_err(cached(x).numpy(), plain(x).numpy()) <= 1e-6
    assert cached._cached[1] == x._version


@pytest.mark.parametrize("model", MODELS)
def test_input_that_needs_a_gradient_is_not_cached(one_rank, model):
    """An input that needs a gradient (e.g. features being optimised) is never served from the cache, which is
    computed without autograd: the gradient reaching it equals the uncached model's, in evaluation (where the
    cache applies) as in training (a mutation run found this untested: the cache ignoring requires_grad passed
    every test, and x.grad stayed None)."""
    part, graph = one_rank
    cached, plain = _pair(model, graph, part, 0.0)
    for training in (False, True):
        grads = []
        for net in (cached, plain):
            net.train(training)
            x = torch.from_numpy(part.features.copy()).requires_grad_()
            (net(x) ** 2).sum().backward()
            grads.append(x.grad)
        assert grads[0] is not None and torch.equal(grads[0], grads[1]), training
        assert cached._cached is None


@pytest.mark.parametrize("model", MODELS)
def test_cached_product_is_kept_per_row_grouping(one_rank, model):
    """The cache holds the product either whole (layer-by-layer forward) or split into the pipeline's boundary and
    interior rows; a pass asking for the other layout recomputes it (the bench worker switches one model's graph
    between the pipelined and the blocking schedule from epoch to epoch). A mutation run found this untested:
    ignoring the row groups served the pipeline's (rows, rows) tuple to the layer-by-layer forward."""
    part, graph = one_rank
    cached, plain = _pair(model, graph, part, 0.0)
    cached.eval()
    x = torch.from_numpy(part.features.copy())
    groups = graph.row_groups(cached.convs[0].agg.kind)
    B, I = groups
    want = plain.convs[0].input_product(x)
    for _ in range(2):
        split = cached._input_product(x, None, groups)
        assert isinstance(split, tuple) and len(split) == 2
        assert rel_err(split[0].numpy(), want[B.start:B.stop].numpy()) <= 1e-6
        assert rel_err(split[1].numpy(), want[I.start:I.stop].numpy()) <= 1e-6
        whole = cached._input_product(x, None)
        assert torch.is_tensor(whole) and rel_err(whole.numpy(), want.numpy()) <= 1e-6


def test_not_used_for_transform_first_or_gat(one_rank):
    from g3mpi.nn import GNN
    part, graph = one_rank
    assert not GNN(graph, "gcn", part.feature_dim, 4, part.num_classes).input_cache     # 6 -> 4: transform first
    assert not GNN(graph, "gat", part.feature_dim, 16, part.num_classes).input_cache


@pytest.mark.parametrize("P", [2, 3])
def test_cached_equals_recomputed_multi_rank(P, tmp_path):
    g = random_graph(n=160, f=6, seed=P)
    partition(g, P, tmp_path / "parts", seed=P)
    base = "blocking:-1:0:nocache"
    variants = ("pipelined:0:0", "pipelined:5:0.003", "blocking:-1:0", "pipelined:0:0:nocache")
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join((base,) + variants), "--repeat", "3", "--hidden", "16", timeout=600)
    res = np.load(tmp_path / "out.npz")
    assert_variants_equal(res, base, variants, MODELS)
    for model in MODELS:
        # the first layer's exchange ran once instead of three times
        assert int(res[f"pipelined:0:0/{model}/bytes_sent"]) < int(res[f"pipelined:0:0:nocache/{model}/bytes_sent"])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kept_input_halo_equals_exchange(dtype, tmp_path):
    from g3mpi.format import read_meta

    """The first layer's aggregation from the input halo kept on the rank (fetched once, in the stored dtype)
    equals the one its exchange computes in every pass, with input dropout (keyed by original node ID) and
    without, pipelined and not: logits and every gradient within 1e-6 over three passes; the first layer then
    sends nothing after the one fetch, of half the bytes for float16 features. 14 features: GCN's dropped input
    is made 8 columns at a time (``GNN.DROP_COLUMNS``), the last block narrower."""
    g = random_graph(n=160, f=14, seed=4)
    if dtype == "float16":
        g.features = g.features.astype(np.float16)
        g.attrs["feature_dtype"] = "float16"
    partition(g, 3, tmp_path / "parts", seed=4)
    assert read_meta(tmp_path / "parts")["feature_dtype"] == dtype
    base = "blocking:-1:0:nocache:drop0.4"
    variants = ("pipelined:0:0:halo:drop0.4", "blocking:-1:0:halo:drop0.4", "pipelined:0:0:nocache:drop0.4",
                "pipelined:0:0:halo", "blocking:-1:0:nocache")
    run_mpi(3, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join((base,) + variants), "--repeat", "3", "--hidden", "16", timeout=600)
    res = np.load(tmp_path / "out.npz")
    for model in MODELS:
        keys = [k[len(f"{base}/{model}/"):] for k in res.files if k.startswith(f"{base}/{model}/grad/")]
        for v, ref in [(v, base) for v in variants[:3]] + [(variants[3], variants[4])]:
            assert rel_err(res[f"{v}/{model}/logits"], res[f"{ref}/{model}/logits"]) <= 1e-6, (v, model)
            for k in keys:
                assert rel_err(res[f"{v}/{model}/{k}"], res[f"{ref}/{model}/{k}"]) <= 1e-6, (v, model, k)
        kept, sent = (int(res[f"{v}/{model}/bytes_sent"]) for v in ("pipelined:0:0:halo:drop0.4",
                                                                   "pipelined:0:0:nocache:drop0.4"))
        layer0 = sent - kept    # three passes of float32 input rows, less the one fetch in the stored dtype
        itemsize = 2 if dtype == "float16" else 4
        assert layer0 > 0 and layer0 % (3 * 4 - itemsize) == 0, (model, sent, kept)
