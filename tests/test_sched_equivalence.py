"""The scheduler never changes results: pipelined == blocking, chunked == unchunked, and random per-message
delays (random completion orders) give the same result without deadlock; for GCN, SAGE and GAT, P = 2, 3, 4."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.pyg_reference import assert_variants_equal, rel_err

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)

TOL = 1e-6
MODELS = ("gcn", "sage", "gat")
BASE = "blocking:-1:0"
VARIANTS = ("pipelined:0:0", "pipelined:5:0.004", "pipelined:-1:0.004", "blocking:7:0.002")


@pytest.mark.parametrize("P", [2, 3, 4])
def test_schedules_agree(P, tmp_path):
    g = random_graph(n=160, seed=P)
    partition(g, P, tmp_path / "parts", seed=P)
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join((BASE,) + VARIANTS), "--repeat", "2", timeout=600)
    res = np.load(tmp_path / "out.npz")
    assert_variants_equal(res, BASE, VARIANTS, MODELS, TOL)
    for model in MODELS:
        for v in VARIANTS:
            assert int(res[f"{v}/{model}/bytes_sent"]) == int(res[f"{BASE}/{model}/bytes_sent"])


@pytest.mark.parametrize("P", [2, 3])
def test_pieced_messages_agree(P, tmp_path):
    """Messages in pieces (a few rows each, landing in random orders) give what whole messages give: pipelined
    with pieces == pipelined and blocking without, the same bytes in more messages."""
    g = random_graph(n=160, seed=P + 10)
    partition(g, P, tmp_path / "parts", seed=P)
    whole, pieced = "pipelined:0:0:piece0", ("pipelined:0:0.004:piece64", "pipelined:5:0.002:piece100",
                                             "blocking:-1:0.002:piece64")
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join((BASE, whole) + pieced), "--repeat", "2", timeout=600)
    res = np.load(tmp_path / "out.npz")
    for model in MODELS:
        keys = [k for k in res.files if k.startswith(f"{BASE}/{model}/grad/") or k == f"{BASE}/{model}/logits"]
        for v in (whole,) + pieced:
            for k in keys:
                assert rel_err(res[v + k[len(BASE):]], res[k]) <= TOL, (v, k)
            assert int(res[f"{v}/{model}/bytes_sent"]) == int(res[f"{BASE}/{model}/bytes_sent"])
        assert int(res[f"{pieced[0]}/{model}/messages_sent"]) > int(res[f"{whole}/{model}/messages_sent"]), model


@pytest.mark.parametrize("P", [3, 4])
def test_arrival_order_changes_no_bit(P, tmp_path):
    """The same schedule and chunks with messages landing in random orders give the same logits and gradients bit
    for bit (partials are summed, and gradients accumulated, in a fixed order), for every model."""
    g = random_graph(n=160, seed=P + 20)
    partition(g, P, tmp_path / "parts", seed=P)
    pairs = (("blocking:-1:0", "blocking:-1:0.004"), ("pipelined:0:0", "pipelined:0:0.004"))
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join(v for pair in pairs for v in pair), "--repeat", "2", timeout=600)
    res = np.load(tmp_path / "out.npz")
    for base, jittered in pairs:
        keys = [k[len(base):] for k in res.files if k.startswith(base + "/")]
        assert any("/grad/" in k for k in keys) and any(k.endswith("/logits") for k in keys)
        for k in keys:
            assert np.array_equal(res[jittered + k], res[base + k]), (jittered, k)


@pytest.mark.parametrize("P", [3])
def test_pieces_change_no_bit(P, tmp_path):
    """Messages in pieces landing in random orders give what whole messages give bit for bit, in each schedule and
    under bf16-mixed precision: each neighbour block's row is summed whole once the last piece it reads has
    landed (``g3mpi.ops.blocks.ForwardPieces``), as the whole message's product sums it."""
    g = random_graph(n=160, seed=P + 30)
    partition(g, P, tmp_path / "parts", seed=P)
    pairs = (("pipelined:0:0:piece0", "pipelined:0:0.004:piece64"), ("blocking:-1:0:piece0", "blocking:-1:0.002:piece64"),
             ("pipelined:0:0:nocache:piece0", "pipelined:0:0.002:nocache:piece100"),
             ("pipelined:0:0:piece0:bf16", "pipelined:0:0.004:piece64:bf16"))
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join(v for pair in pairs for v in pair), timeout=600)
    res = np.load(tmp_path / "out.npz")
    for whole, pieced in pairs:
        keys = [k[len(whole):] for k in res.files if k.startswith(whole + "/") and not k.endswith("messages_sent")]
        assert any("/grad/" in k for k in keys) and any(k.endswith("/logits") for k in keys)
        for k in keys:
            assert np.array_equal(res[pieced + k], res[whole + k]), (pieced, k)
        assert int(res[f"{pieced}/gcn/messages_sent"]) > int(res[f"{whole}/gcn/messages_sent"])
