"""g3-bench memory's breakdown: the bytes a rank holds attributed to what sizes them (owned rows, halo rows, send
rows, local edges, or nothing of the graph), measured against the memory model's split of the same terms
(``g3mpi.train.memory.rank_memory_split``), for the built-in GCN and for a model a user writes with the public
layer API (docs/examples/user_gcn.py)."""
from __future__ import annotations

import itertools

import pytest

from g3mpi.bench.attribution import MEASURED, TERMS, Block, Held, RankCounts, attribute
from g3mpi.train.memory import CATEGORIES, by_category, per_unit, rank_memory, rank_memory_split

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_measured_against_modelled",)

#: the terms whose bytes the runtime's structures have at sizes the model computes exactly (but a row pointer's
#: one more entry, GCN's neighbour blocks' row pointers: ``other``): measured within 1 %, and 64 bytes
EXACT, EXACT_REL, EXACT_ABS = ("part", "matrices", "exchange", "params"), 0.01, 64
#: activations, bytes per owned row: the model takes every owned row as a training row (12 C bytes a row for the
#: loss, where the rank keeps 12 C + 12 a training row), so it is above what autograd keeps by up to 15 %
ACT_REL = 0.15


def test_attribution_by_what_sizes_each_array():
    n, h, s, e, c, H = 50, 30, 20, 400, 60, 8
    # the local block: e - c edges and n self loops; one neighbour block of the c cut edges
    counts = RankCounts(owned=n, halo=h, send=s, edges=e, cut_edges=c, boundary=15, train=17,
                        blocks=(Block(e - c + n, n, (c,)),), heads=(H,))
    items = [Held("part", "features", n, 4 * n * 16), Held("part", "indptr", n + 1, 8 * (n + 1)),
             Held("part", "in_degree", n + h, 8 * (n + h)), Held("part", "send_rows", s, 8 * s),
             Held("part", "indices", e, 4 * e), Held("part", "recv_offsets", 2, 16),
             Held("matrices", "local indices", e - c + n, 4 * (e - c + n)),
             Held("matrices", "neighbour row pointers", 20, 80),
             Held("matrices", "head pattern col", (e - c + n) * H, 4 * (e - c + n) * H),
             Held("matrices", "head pattern crow", n * H, 4 * (n * H + 1)),
             Held("exchange", "halo", h, 4 * h * 7), Held("exchange", "send", s, 4 * s * 7),
             Held("exchange", "the same length as the owned rows", n, 1000),
             Held("activations", "boundary rows", 15, 15 * 128), Held("activations", "interior rows", n - 15, 35 * 128),
             Held("activations", "training rows", 17, 17 * 8), Held("activations", "attention", c, c * 32),
             Held("activations", "a scalar", 0, 4), Held("params", "parameters", 0, 4096)]
    a = attribute(items, counts)
    t = a["terms"]
    # the owned + halo degrees split n : h; the row pointers (n + 1 entries) per owned row
    assert t["part"] == dict(owned=4 * n * 16 + 8 * (n + 1) + 8 * n, halo=8 * h, send=8 * s, edge=4 * e, const=0,
                             other=16)
    # the local block's entries split e - c edges : n self loops, also head-expanded
    assert t["matrices"]["owned"] == 4 * n + 4 * n * H + 4 * (n * H + 1)
    assert t["matrices"]["edge"] == 4 * (e - c) * (1 + H) and t["matrices"]["other"] == 80
    # an exchange has halo-sized and send-sized buffers only
    assert t["exchange"] == dict(owned=0, halo=4 * h * 7, send=4 * s * 7, edge=0, const=0, other=1000)
    assert t["activations"] == dict(owned=50 * 128 + 17 * 8, halo=0, send=0, edge=c * 32, const=0, other=4)
    assert t["params"]["const"] == 4096 and a["ambiguous"] == 0
    assert a["total"] == sum(it.nbytes for it in items) == sum(a["categories"].values())
    assert all(sum(t[k].values()) == sum(it.nbytes for it in items if it.term == k) for k in TERMS)
    assert [o[1] for o in a["other"]][:2] == ["the same length as the owned rows", "neighbour row pointers"]
    # as many halo rows as owned rows: the owned rows win, and the bytes are counted as ambiguous
    same = RankCounts(owned=n, halo=n, send=s, edges=e)
    a = attribute([Held("part", "x", n, 100), Held("part", "y", s, 10)], same)
    assert a["terms"]["part"]["owned"] == 100 and a["ambiguous"] == 100


@pytest.mark.parametrize("model, remat, symmetric", list(itertools.product(("gcn", "sage", "gat", "appnp", "gcn2"),
                                                                           (False, True), (False, True))))
def test_model_split_adds_up_to_its_terms(model, remat, symmetric):
    kw = dict(owned=1000, halo=300, send=250, edges=9000, cut_edges=900, symmetric=symmetric, feature_dim=24,
              hidden=8 if model == "gat" else 64, num_classes=5, heads=4, remat=remat)
    split = rank_memory_split(model, **kw)
    terms = rank_memory(model, **kw)
    assert set(split) == set(TERMS)
    for t, v in split.items():
        assert set(v) == set(CATEGORIES) and sum(v.values()) == terms[t], t
    assert split["params"] == dict.fromkeys(CATEGORIES, 0) | dict(const=terms["params"])
    cats = by_category(split)
    assert sum(cats.values()) == terms["peak"] - terms["activations"] - (356 << 20)
    # GAT keeps per-edge attention terms without remat; the others nothing per edge
    assert (split["activations"]["edge"] > 0) is (model == "gat" and not remat)


def test_model_split_per_unit_as_memory_md_states():
    """docs/MEMORY.md: a 2-layer GCN of hidden width H, dropout on: per owned row 75 + 12F + 18H + 24C bytes at the
    peak (the activations twice; on a symmetric graph 8 fewer), per in-edge 20 (8 fewer from an owned row of a
    symmetric graph), per halo row 28 + 4 sum m_l w_l, per send row 8 + 4 sum m_l w_l; with the input cache the
    halo also keeps its F input features."""
    F, H, C = 24, 64, 5
    n, h, s, e, c = 1000, 300, 250, 9000, 900
    for sym in (False, True):
        split = rank_memory_split("gcn", owned=n, halo=h, send=s, edges=e, cut_edges=c, symmetric=sym,
                                  feature_dim=F, hidden=H, num_classes=C, input_cache=True)
        pu = per_unit(by_category(split), owned=n, halo=h, send=s, edges=e)
        act = split["activations"]["owned"] / n
        # (a symmetric graph's local block, self loops included, is stored once: 8 bytes fewer per owned row)
        assert pu["owned_row"] + act == 75 + 12 * F + 18 * H + 24 * C - (8 if sym else 0)
        assert pu["edge"] == (20 * e - (8 * (e - c) if sym else 0)) / e
        mw = 2 * min(H, C)     # layer 1 both ways; layer 0 keeps its input's halo instead
        assert pu["halo_row"] == 28 + 4 * mw + 4 * F and pu["send_row"] == 8 + 4 * mw


@pytest.mark.parametrize("symmetric", [False, True])
def test_propagation_terms_as_memory_md_states(symmetric):
    """docs/MEMORY.md: APPNP and GCNII have GCN's matrices; APPNP exchanges K steps of C columns both ways and keeps
    4n (F + 2.25 sum_{l>=1} a_l + 3C) for its MLP and the loss, nothing per step (a step's own terms and sums save no
    tensor); GCNII exchanges L layers of H both ways and keeps 4n (F + 2.25 H (L + 1) + 3C); neither keeps an
    input halo, and --remat changes neither."""
    F, H, C, L, K = 24, 64, 5, 3, 7
    kw = dict(owned=1000, halo=300, send=250, edges=9000, cut_edges=900, symmetric=symmetric, feature_dim=F,
              hidden=H, num_classes=C, layers=L, k=K)
    gcn = rank_memory_split("gcn", **kw)
    for model, exchanged, rows, params in (
            ("appnp", 2 * K * C, F + 2.25 * H * (L - 1) + 3 * C, F * H + H + (L - 2) * (H * H + H) + H * C + C),
            ("gcn2", 2 * L * H, F + 2.25 * H * (L + 1) + 3 * C, F * H + H + H * C + C + L * H * H)):
        split = rank_memory_split(model, **kw)
        assert split == rank_memory_split(model, **kw, remat=True) == rank_memory_split(model, **kw, input_cache=False)
        assert split["part"] == gcn["part"] and split["matrices"] == gcn["matrices"], model
        assert split["exchange"] == dict.fromkeys(CATEGORIES, 0) | dict(halo=4 * 300 * exchanged,
                                                                          send=4 * 250 * exchanged)
        assert split["activations"] == dict.fromkeys(CATEGORIES, 0) | dict(owned=4 * 1000 * rows), model
        assert split["params"]["const"] == 16 * params, model
    assert rank_memory_split("appnp", **kw | dict(k=2 * K))["exchange"]["halo"] == 4 * 300 * 4 * K * C


@pytest.fixture(scope="module")
def small_parts(tmp_path_factory):
    from g3mpi.bench.common import Sizes, prepare_graph, prepare_parts
    work = tmp_path_factory.mktemp("memory")
    sz = Sizes(nodes=1500, edges=12_000, dims=(16, 32, 4), epochs=1)
    return sz, work, prepare_parts(prepare_graph(sz, work), 2, work)


def _close(measured, modelled, rel, slack=0):
    return abs(measured - modelled) <= rel * max(measured, modelled) + slack


@pytest.mark.mpi
@pytest.mark.parametrize("model", ["gcn", "appnp", "gcn2", "user"])
def test_measured_against_modelled(model, small_parts):
    """2 ranks, default runtime, dropout 0.5, on a 1500-node SBM: every category of the part, matrices, exchange
    and params terms measured within 1 % (and 64 bytes) of the model; GCN's, APPNP's (K = 10 steps) and GCNII's
    activations per owned row within 15 %;
    a user's model's activations measured and not modelled. The categories add up to the attributed bytes, which
    are the theoretical size, and the peak above the baseline is the attributed bytes and the unattributed rest."""
    from g3mpi.bench.memory import _measure
    sz, work, parts = small_parts
    res = _measure(sz, work, parts, 2, model)
    for r in res["ranks"]:
        b, theo = r["breakdown"], r["theoretical"]
        counts = b["counts"]
        units = dict(owned_row=counts["owned"], halo_row=counts["halo"], send_row=counts["send"],
                     edge=counts["edges"])
        assert counts["owned"] == r["owned"] and min(units.values()) > 0
        # every byte attributed once: by term, the categories add up to the theoretical size's term
        assert set(b["measured"]) == set(MEASURED)
        for t in TERMS:
            assert sum(b["measured_terms"][t].values()) == theo[t], t
        assert sum(b["measured"].values()) == b["attributed"] == theo["total"]
        assert b["unattributed"] == r["rss_data"] - b["attributed"]
        assert b["ambiguous"] == 0 and b["measured"]["other"] <= 0.02 * b["attributed"]
        if model == "user":
            assert b["not_modelled"] == ["activations"] and b["modelled"] is None
            assert b["modelled_terms"]["activations"] is None
            assert all(v["modelled"] is None for v in b["per_unit"].values())
            assert b["terms"]["activations"]["owned_row"]["measured"] > 0
            for u, v in b["per_unit_modelled_terms"].items():    # the terms the model has, together
                assert _close(v["measured"] * units[u], v["modelled"] * units[u], EXACT_REL, 4 * EXACT_ABS), (u, v)
        else:
            assert b["not_modelled"] == [] and set(b["modelled"]) == set(CATEGORIES)
            act = b["terms"]["activations"]["owned_row"]
            assert _close(act["measured"], act["modelled"], ACT_REL), act
            assert b["modelled_terms"]["activations"]["edge"] == b["measured_terms"]["activations"]["edge"] == 0
        for t in EXACT:
            meas, mod = b["measured_terms"][t], b["modelled_terms"][t]
            for c in CATEGORIES:
                assert _close(meas[c], mod[c], EXACT_REL, EXACT_ABS), (t, c, meas, mod)
