"""Link prediction through the pair exchange (``g3mpi.nn.Pairs``) equals single-process PyG on the whole graph, for
P = 1..4: a GCN encoder with the dot and the hadamard decoder, fixed and sampled negatives (keyed by edge index, so
the same for every P), BCE loss and every gradient <= 1e-5 relative, every pair's score (also with the training
pairs scored in chunks recomputed in backward); the exchange sends exactly the distinct rows each rank lacks
(tests/mpi_link.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from g3mpi.nn.link import DECODERS
from g3mpi.ops.negatives import negative_destinations
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.mpi_link import HID, OUT
from tests.pyg_reference import PyGStack, edge_index_of, rel_err

SLOW_TESTS = ("test_link_scores_loss_and_gradients_equal_whole_graph",)
TOL = 1e-5


def link_pairs(g, seed=5):
    rng = np.random.default_rng(seed)
    n = g.num_nodes
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    e = np.stack([np.asarray(g.indices, np.int64), dst])
    pos = e[:, rng.choice(e.shape[1], 120, replace=False)]
    neg = rng.integers(0, n, (2, 150))
    return dict(pos=pos, neg=neg, seed=np.array(11), epoch=np.array(2))


def reference(g, pairs, state, decoder):
    enc = PyGStack("gcn", g.features.shape[1], HID, OUT, 2)
    enc.load_state_dict({k[len("encoder."):]: torch.as_tensor(v) for k, v in state.items()
                         if k.startswith("encoder.")})
    dec = DECODERS[decoder](OUT, HID, 2)
    dec.load_state_dict({k[len("decoder."):]: torch.as_tensor(v) for k, v in state.items()
                         if k.startswith("decoder.")})
    h = enc(torch.from_numpy(g.features), edge_index_of(g.indptr, g.indices))
    pos = torch.from_numpy(pairs["pos"])
    sampled = torch.from_numpy(negative_destinations(int(pairs["seed"]), int(pairs["epoch"]),
                                                     np.arange(pos.shape[1]), 1, g.num_nodes)[:, 0])
    neg = torch.from_numpy(pairs["neg"])
    sc = {"pos": dec(h[pos[0]], h[pos[1]]), "neg": dec(h[neg[0]], h[neg[1]]),
          "sampled": dec(h[pos[0]], h[sampled])}
    total = sum(len(v) for v in sc.values())
    loss = (F.binary_cross_entropy_with_logits(sc["pos"], torch.ones_like(sc["pos"]), reduction="sum")
            + sum(F.binary_cross_entropy_with_logits(sc[k], torch.zeros_like(sc[k]), reduction="sum")
                  for k in ("neg", "sampled"))) / total
    loss.backward()
    grads = {f"encoder.{k}": p.grad.numpy() for k, p in enc.named_parameters()}
    grads.update({f"decoder.{k}": p.grad.numpy() for k, p in dec.named_parameters()})
    return float(loss.detach()), grads, {k: v.detach().numpy() for k, v in sc.items()}


@pytest.mark.parametrize("P,decoder,embed,schedule,chunk", [
    (1, "dot", False, "pipelined", 0), (2, "hadamard", False, "pipelined", 0), (3, "dot", True, "pipelined", 0),
    (4, "hadamard", False, "pipelined", 0), (4, "dot", False, "pipelined", 0), (3, "hadamard", False, "blocking", 0),
    (2, "hadamard", False, "pipelined", 7), (3, "dot", False, "pipelined", 16)])
def test_link_scores_loss_and_gradients_equal_whole_graph(P, decoder, embed, schedule, chunk, tmp_path):
    g = random_graph(n=90, seed=11)
    partition(g, P, tmp_path / "parts")
    pairs = link_pairs(g)
    np.savez(tmp_path / "pairs.npz", **pairs)
    run_mpi(P, "tests.mpi_link", tmp_path / "parts", tmp_path / "pairs.npz", tmp_path / "out.npz",
            "--decoder", decoder, "--schedule", schedule, "--chunk", chunk, *(["--embed"] if embed else []))
    res = np.load(tmp_path / "out.npz")
    state = {k[len("init/"):]: res[k] for k in res.files if k.startswith("init/")}
    loss, grads, scores = reference(g, pairs, state, decoder)
    assert abs(float(res["loss"]) - loss) <= TOL * abs(loss)
    assert set(grads) == {k[len("grad/"):] for k in res.files if k.startswith("grad/")}
    for k, v in grads.items():
        assert np.abs(v).sum() > 0, f"reference gradient of {k} is zero (the test would be vacuous)"
        assert rel_err(res[f"grad/{k}"], v) <= TOL, f"P={P}: gradient of {k}"
        assert rel_err(res[f"fused_grad/{k}"], v) <= TOL, f"P={P}: gradient of {k} through loss_sum"
    assert abs(float(res["fused_loss"]) - loss) <= TOL * abs(loss)
    for k, v in scores.items():
        assert rel_err(res[f"score/{k}"], v) <= TOL, f"P={P}: scores of {k}"
        assert rel_err(res[f"eval/{k}"], v) <= TOL, f"P={P}: evaluation scores of {k}"
    assert int(res["bytes_sent"]) == int(res["bytes_bound"])
    if P > 1:
        assert int(res["bytes_bound"]) > 0
