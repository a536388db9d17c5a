"""Recipe blocks (residual, LayerNorm / BatchNorm, input and output linears, feed-forward, jumping knowledge) and
the appnp / gcn2 models, distributed on P = 1..4 ranks, equal a single-process reference on the whole graph (PyG's
convolutions, APPNP, GCN2Conv and JumpingKnowledge, torch's BatchNorm1d and LayerNorm): logits, loss, every
gradient and BatchNorm's running statistics, whole tensors (tests/mpi_recipe.py runs the distributed side)."""
from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from g3mpi.train.config import ConfigError, config_from, settings_without_effect
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.pyg_reference import edge_index_of, rel_err

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_recipes_equal_reference", "test_batchnorm_with_an_empty_rank", "test_recipe_p_independent",
              "test_defaults_build_the_plain_gnn", "test_batchnorm_run_resumes_and_initialises")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None, reason="torch_geometric missing")
TOL = 1e-5


def check(res, g, name):
    """Compare the distributed results of spec ``name`` with the reference in float64 (so that the comparison
    measures g3mpi's rounding, not the reference's). A parameter right before a BatchNorm (a bias) has an exact
    gradient of zero (the normalisation removes any shift): both sides must be rounding noise there, below
    1e-5 of the largest gradient."""
    from tests.mpi_recipe import config
    from tests.recipe_reference import reference_model
    cfg = config(name)
    init = {k[len(f"{name}/init/"):]: res[k] for k in res.files if k.startswith(f"{name}/init/")}
    ref = reference_model(cfg, g.features.shape[1], int(g.attrs["num_classes"]))
    ref.load_state_dict({k: torch.as_tensor(v) for k, v in init.items()})
    ref.double()
    ei = edge_index_of(g.indptr, g.indices)
    x, y, train = torch.as_tensor(g.features).double(), torch.as_tensor(g.labels), torch.as_tensor(g.train_mask)
    ref.train()
    logits = ref(x, ei)
    loss = F.cross_entropy(logits[train], y[train], reduction="sum") / int(train.sum())
    loss.backward()
    assert rel_err(res[f"{name}/logits"], logits.detach().numpy()) <= TOL, name
    assert abs(float(res[f"{name}/loss"]) - float(loss.detach())) <= TOL * abs(float(loss.detach())), name
    grads = {k: p.grad.numpy() for k, p in ref.named_parameters()}
    assert set(grads) == {k[len(f"{name}/grad/"):] for k in res.files if k.startswith(f"{name}/grad/")}, name
    top = max(np.linalg.norm(v) for v in grads.values())
    for k, v in grads.items():
        got = res[f"{name}/grad/{k}"]
        if np.linalg.norm(v) <= 1e-9 * top:     # cancelled by a BatchNorm
            assert np.linalg.norm(got) <= TOL * top, f"{name}: gradient of {k} should vanish"
            continue
        assert rel_err(got, v) <= TOL, f"{name}: gradient of {k}"
    buffers = dict(ref.named_buffers())
    assert set(buffers) == {k[len(f"{name}/buffer/"):] for k in res.files if k.startswith(f"{name}/buffer/")}
    for k, v in buffers.items():
        if k.endswith("num_batches_tracked"):
            assert int(res[f"{name}/buffer/{k}"]) == int(v) == 1, f"{name}: {k}"
        else:
            assert rel_err(res[f"{name}/buffer/{k}"], v.numpy()) <= TOL, f"{name}: {k}"
    assert sum(np.linalg.norm(v) > 1e-9 * top for v in grads.values()) >= len(grads) - 3   # not vacuous
    ref.eval()
    with torch.no_grad():
        assert rel_err(res[f"{name}/eval_logits"], ref(x, ei).numpy()) <= TOL, f"{name}: evaluation logits"
    return buffers


@pytest.fixture(scope="module")
def graph():
    return random_graph()


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_recipes_equal_reference(P, graph, tmp_path):
    from tests.mpi_recipe import SPECS
    partition(graph, P, tmp_path / "parts")
    run_mpi(P, "tests.mpi_recipe", tmp_path / "parts", tmp_path / "out.npz")
    res = np.load(tmp_path / "out.npz")
    seen = set()
    for name in SPECS:
        seen |= {k.rsplit(".", 1)[0] for k in check(res, graph, name)}
    assert any("norms" in k for k in seen)     # BatchNorm's running statistics were compared
    piped = {name for name in SPECS if res[f"{name}/pipelined"]}
    assert piped == ({"gcn_layer_pipe", "sage_res_pipe"} if P > 1 else set())


def test_batchnorm_with_an_empty_rank(graph, tmp_path):
    """A rank that owns no node still takes its part in BatchNorm's reductions, forward and backward: no hang, and
    the statistics are those of the nodes the others own."""
    from data_tools.build import write_partition
    asg = np.random.default_rng(3).integers(0, 2, graph.num_nodes)     # part 2 of 3 owns nothing
    write_partition(graph, asg, 3, tmp_path / "parts", method="random", seed=0, force=True)
    names = ("gcn_all", "gat_batch_max", "gcn_layer_pipe")
    run_mpi(3, "tests.mpi_recipe", tmp_path / "parts", tmp_path / "out.npz", "--specs", ",".join(names), timeout=120)
    res = np.load(tmp_path / "out.npz")
    for name in names:
        check(res, graph, name)


@pytest.mark.parametrize("args", [
    ("--model", "sage", "--norm", "batch", "--residual", "--input-linear", "--ffn", "--jk", "cat"),
    ("--model", "gcn", "--norm", "layer", "--residual", "--input-linear", "--output-linear", "--ffn"),
    ("--model", "gcn2", "--layers", "4", "--alpha", "0.2")], ids=["recipe", "pipelined", "gcn2"])
def test_recipe_p_independent(args, cora_npz, tmp_path):
    """g3-train of a seeded model with dropout on Cora gives the same parameters (BatchNorm's running statistics
    too), predictions and accuracies for P = 1, 2, 4: the masks are keyed by node ID, the statistics and every
    gradient (the recipe's linears and norms outside the layers too) summed over all ranks."""
    import json

    from tests.graphs import cora_graph
    g = cora_graph(cora_npz)
    states, summaries = {}, {}
    for P in (1, 2, 4):
        partition(g, P, tmp_path / f"p{P}")
        run_mpi(P, "g3mpi.cli.train", "--parts", tmp_path / f"p{P}", "--out", tmp_path / f"r{P}", "--no-progress",
                "--no-plots", "--log-level", "WARNING", "--epochs", "6", "--hidden", "16", "--dropout", "0.5",
                "--seed", "3", "--timeline-epoch", "0", *args)
        states[P] = torch.load(tmp_path / f"r{P}" / "model.pt", weights_only=True)
        summaries[P] = json.loads((tmp_path / f"r{P}" / "summary.json").read_text())
    if "batch" in args:
        assert any(k.endswith("running_var") for k in states[1])
    for P in (2, 4):
        assert states[P].keys() == states[1].keys()
        for k, v in states[1].items():
            if v.is_floating_point():
                assert torch.linalg.norm(states[P][k] - v) <= 1e-4 * torch.linalg.norm(v), (P, k)
            else:
                assert torch.equal(states[P][k], v), (P, k)
        for k in ("best_epoch", "test_acc", "val_acc"):
            assert summaries[P][k] == summaries[1][k], (P, k)


def test_defaults_build_the_plain_gnn(tmp_path):
    """Without a recipe option, build_model is today's GNN: the same parameters from the same seed and the same
    logits, bit for bit; any recipe option gives the recipe stack."""
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    from g3mpi.format import read_meta, read_part
    from g3mpi.nn import GNN, RecipeGNN, build_model
    from g3mpi.ops import DistGraph
    from g3mpi.train.config import TrainConfig
    partition(random_graph(n=60, seed=2), 1, tmp_path / "parts")
    part = read_part(tmp_path / "parts", 0, read_meta(tmp_path / "parts"))
    ctx = CommContext(MPI.COMM_SELF)
    try:
        graph = DistGraph(part, ctx)
        x = torch.from_numpy(part.features)
        for model in ("gcn", "sage", "gat"):
            cfg = TrainConfig(model=model, heads=2)
            torch.manual_seed(5)
            a = build_model(graph, cfg, part.feature_dim, part.num_classes)
            torch.manual_seed(5)
            b = GNN(graph, model, part.feature_dim, cfg.hidden, part.num_classes, layers=cfg.layers, heads=2,
                    out_heads=cfg.out_heads, dropout=cfg.dropout, activation=cfg.activation)
            assert type(a) is GNN
            assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
            a.eval(), b.eval()
            assert torch.equal(a(x), b(x))
            assert isinstance(build_model(graph, cfg.replace(residual=True), part.feature_dim, 3), RecipeGNN)
    finally:
        ctx.free()


@pytest.mark.parametrize("key, value, word", [("norm", "group", "expected one of none, layer, batch"),
                                              ("jk", "lstm", "expected one of none, cat, max"),
                                              ("k", 0, "at least 1"), ("k", 5000, "at most 1024"),
                                              ("alpha", 1.5, "[0, 1]"), ("theta", 0.0, "positive"),
                                              ("model", "gin", "appnp, gcn2")])
def test_recipe_settings_are_checked(key, value, word):
    with pytest.raises(ConfigError, match=re.escape(word)) as e:
        config_from(None, {key: value})
    assert str(e.value).startswith(f"--{key}")


@pytest.mark.parametrize("overrides, idle, used", [
    (dict(model="appnp", residual=True, norm="batch", k=3), {"residual", "norm", "theta"}, {"k", "alpha"}),
    (dict(model="gcn2", jk="cat", theta=0.9), {"jk", "k"}, {"alpha", "theta", "activation"}),
    (dict(model="gcn", k=3, alpha=0.2, jk="max", output_linear=True), {"k", "alpha", "output_linear"},
     {"jk", "residual", "norm"}),
    (dict(model="gat", layers=1, output_linear=True), {"input_cache"}, {"heads", "output_linear"})])
def test_recipe_settings_without_effect(overrides, idle, used):
    """Each recipe or appnp / gcn2 setting that a model does not use is named (g3-train warns, a resume may
    change it); the ones it uses are not."""
    why = settings_without_effect(config_from(None, overrides), world_size=2, resuming=False,
                                  input_cache_applies=False)
    assert idle <= set(why) and not used & set(why), why


def test_a_checkpoint_from_before_the_recipe_settings_resumes_with_their_defaults():
    from g3mpi.train.checkpoint import CheckpointError, check_compatible, make_checkpoint
    from g3mpi.train.config import TrainConfig
    meta = dict(partition_id="p1", num_parts=1, method="metis", graph_sha256="g" * 64,
                files={"node_map.h5": "a" * 64, "part-00000.h5": "b" * 64})
    cfg = TrainConfig(parts="PARTS", epochs=10)
    ck = make_checkpoint(epoch=4, model={}, optimizer={}, best=dict(score=0.5, epoch=4, accs={}, state=None),
                         since_best=0, last_loss=1.0, cfg=cfg, meta=meta)
    for k in ("residual", "norm", "input_linear", "output_linear", "ffn", "jk", "k", "alpha", "theta"):
        del ck["config"][k]
    check_compatible("ck.pt", ck, cfg, meta)
    with pytest.raises(CheckpointError, match="norm = 'none' in the checkpoint but 'layer' now"):
        check_compatible("ck.pt", ck, cfg.replace(norm="layer"), meta)


def test_batchnorm_run_resumes_and_initialises(tmp_path):
    """A model with BatchNorm (its integer step counter a buffer in the state) checkpoints, resumes to the same
    parameters and running statistics as a run without a stop, and starts a run with --init-from."""
    partition(random_graph(n=120, seed=8), 2, tmp_path / "p2")
    args = ["--no-progress", "--no-plots", "--log-level", "WARNING", "--timeline-epoch", "0", "--hidden", "8",
            "--norm", "batch", "--residual", "--jk", "max"]

    def train(out, *more):
        run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "p2", "--out", tmp_path / out, *args, *more)
    train("stopped", "--epochs", "3")
    run_mpi(2, "g3mpi.cli.train", "--resume", tmp_path / "stopped", "--epochs", "5", "--no-progress")
    train("straight", "--epochs", "5")
    a, b = (torch.load(tmp_path / r / "checkpoint.pt", weights_only=True)["model"] for r in ("stopped", "straight"))
    assert a.keys() == b.keys() and int(a["norms.0.num_batches_tracked"]) == 5
    assert all(torch.equal(a[k], b[k]) for k in a)
    train("evaluated", "--epochs", "0", "--init-from", tmp_path / "straight" / "model.pt")
    import json
    s, e = (json.loads((tmp_path / r / "summary.json").read_text()) for r in ("straight", "evaluated"))
    assert e["test_acc"] == s["test_acc"]
