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
    process (parameters within 1e-5), with dropout keyed by node ID and its setting saved in config.toml."""
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
    summary = json.loads((tmp_path / "r3" / "summary.json").read_text())
    assert summary["model"] == "toy"
