"""The model registry (``g3mpi.nn.specs``): every built-in model has one entry, and the configuration, g3-train's
options and the model builder read it."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from g3mpi.nn import specs
from g3mpi.train.config import MODELS, TrainConfig

SLOW_TESTS = ("test_every_entry_loads_its_builder_and_layer",    # (imports torch)
              "test_the_input_cache_rule_is_the_built_first_layers",
              "test_a_registered_toy_layer_trains_through_g3_train_exactly")


def test_every_entry_loads_its_builder_and_layer():
    from g3mpi.nn import Layer
    for sp in specs.MODELS.values():
        assert callable(sp.load_builder())
        if sp.layer:
            assert issubclass(sp.load_layer(), Layer) and sp.recipe
        else:
            assert not sp.recipe
        assert set(sp.settings) <= set(specs.SETTINGS)


def test_the_config_and_options_are_the_registrys():
    from g3mpi.cli.train import build_parser
    assert MODELS == tuple(specs.MODELS)
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    options = {a.dest: a for a in build_parser()._actions}
    for s in specs.SETTINGS.values():
        assert defaults[s.name] == s.default and options[s.name].type is s.type
        assert s.help in options[s.name].help and specs.readers(s.name)[0] in options[s.name].help


def test_layer_widths():
    gat, gcn = specs.spec("gat"), specs.spec("gcn")
    assert gcn.layer_widths(10, 16, 3, 3) == [(10, 16, 1), (16, 16, 1), (16, 3, 1)]
    assert gat.layer_widths(10, 4, 3, 2, heads=8, out_heads=2) == [(10, 32, 8), (32, 3, 2)]
    assert specs.spec("gcn2").layer_widths(10, 16, 3, 4) == [(16, 16, 1)] * 4


def test_an_unknown_model_names_the_known_ones():
    with pytest.raises(ValueError, match="model 'gcm': expected one of gcn, sage, gat, rgcn, appnp, gcn2"):
        specs.spec("gcm")


def test_a_registered_toy_layer_trains_through_g3_train_exactly(tmp_path):
    """Adding a built-in layer is its layer file (tests/toy_layer.py) and its registry entry (tests/mpi_toy_model.py,
    in the test only): ``g3-train --model toy --eps E`` then trains it, pipelined, on 2 and 3 ranks as on one
    process (parameters within 1e-5), with dropout keyed by node ID and its setting saved in config.toml and kept by
    a resume."""
    from tests.conftest import run_mpi
    from tests.graphs import partition, random_graph
    g = random_graph(n=90, f=6, c=3, seed=4)
    args = ["--model", "toy", "--eps", "0.25", "--layers", "3", "--hidden", "8", "--epochs", "5", "--dropout", "0.3",
            "--seed", "2", "--no-progress", "--no-plots", "--log-level", "WARNING"]
    params = {}
    for P in (1, 2, 3):
        partition(g, P, tmp_path / f"p{P}", seed=P)
        run_mpi(P, "tests.mpi_toy_model", "--parts", tmp_path / f"p{P}", "--out", tmp_path / f"r{P}", *args)
        params[P] = torch.load(tmp_path / f"r{P}" / "model.pt", weights_only=True)
    assert sorted(params[1]) == [f"convs.{i}.lin.{k}" for i in range(3) for k in ("bias", "weight")]
    for P in (2, 3):
        for k, v in params[1].items():
            np.testing.assert_allclose(params[P][k].numpy(), v.numpy(), rtol=0, atol=1e-5, err_msg=f"P={P}: {k}")
    assert "eps = 0.25" in (tmp_path / "r2" / "config.toml").read_text()
    # the entry's setting is one a resume must keep (checkpoint.resume_keys reads the registry): no third edit
    p = run_mpi(2, "tests.mpi_toy_model", "--resume", tmp_path / "r2", "--epochs", "6", "--eps", "0.5",
                "--no-progress", check=False)
    assert p.returncode != 0 and "incompatible configuration: eps = 0.25 in the checkpoint but 0.5 now" in p.stderr
    # and its range check is the configuration's: one error line, before any rank loads its part
    p = run_mpi(2, "tests.mpi_toy_model", "--parts", tmp_path / "p2", "--out", tmp_path / "bad", "--model", "toy",
                "--eps", "-2", check=False)
    lines = [x for x in p.stderr.splitlines() if "eps" in x]
    assert p.returncode != 0 and len(lines) == 1 and "--eps: eps must be above -1 (got -2.0)" in lines[0], p.stderr
    summary = json.loads((tmp_path / "r3" / "summary.json").read_text())
    assert summary["model"] == "toy"


@pytest.mark.parametrize("key,value,word", [
    ("k", 0, "k must be at least 1 (got 0)"), ("k", 2000, "k must be at most 1024 (got 2000)"),
    ("alpha", 1.5, "alpha must be in [0, 1] (got 1.5)"), ("alpha", float("nan"), "alpha must be in [0, 1] (got nan)"),
    ("theta", 0.0, "theta must be a finite positive number (got 0.0)"),
    ("heads", 0, "heads must be at least 1 (got 0)"), ("out_heads", 2**20, "out_heads must be at most 65536"),
    ("attn_dropout", 1.0, "attn_dropout must be in [0, 1) (got 1.0)"),
    ("num_bases", -1, "num_bases must not be negative (got -1; 0: none)")])
def test_each_model_setting_is_range_checked_by_its_entry(key, value, word):
    """The registry's ``Setting.check`` is the configuration's one error line for a model setting out of range
    (the option named first), whichever model reads it."""
    from g3mpi.train.config import ConfigError, config_from
    assert specs.SETTINGS[key].problem(value) == word or word in specs.SETTINGS[key].problem(value)
    assert specs.SETTINGS[key].problem(specs.SETTINGS[key].default) is None
    with pytest.raises(ConfigError) as e:
        config_from(None, {key: value})
    assert str(e.value) == f"--{key.replace('_', '-')}: {specs.SETTINGS[key].problem(value)}" and e.value.key == key


def test_the_input_cache_rule_is_the_built_first_layers(tmp_path):
    """``specs.input_cache_applies`` (what the trainer and its warnings read, before or without the model) says
    what the built model's first layer says (``Layer.input_product_free``): aggregate-first GCN and SAGE stacks,
    and no model with a recipe block, a node embedding or no cache of its own."""
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    from g3mpi.format import read_meta, read_part
    from g3mpi.nn.recipe import build_model
    from g3mpi.ops import DistGraph
    from tests.graphs import partition, random_graph
    partition(random_graph(n=40, f=6, seed=1), 1, tmp_path / "parts")
    part = read_part(tmp_path / "parts", 0, read_meta(tmp_path / "parts"))
    graph = DistGraph(part, CommContext(MPI.COMM_SELF))
    seen = set()
    for model in ("gcn", "sage", "gat", "appnp", "gcn2"):
        for hidden, layers, extra in ((4, 2, {}), (8, 2, {}), (4, 1, {}), (8, 1, {}), (8, 2, dict(residual=True))):
            cfg = TrainConfig(model=model, hidden=hidden, layers=layers, heads=2, **extra)
            net = build_model(graph, cfg, 6, 7)
            built = bool(getattr(net, "convs", [None])[0] is not None and getattr(net.convs[0], "input_product_free",
                                                                                 False) and not extra)
            assert specs.input_cache_applies(cfg, 6, 7) == built, (model, hidden, layers, extra)
            seen.add(built)
        assert not specs.input_cache_applies(TrainConfig(model=model, node_embedding=4), 6, 7)
        assert not specs.input_cache_applies(TrainConfig(model=model, model_file="m.py:f"), 6, 7)
    assert seen == {True, False}
