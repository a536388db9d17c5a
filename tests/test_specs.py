"""The model registry (``g3mpi.nn.specs``): every built-in model has one entry, and the configuration, g3-train's
options and the model builder read it."""
from __future__ import annotations

import dataclasses

import pytest

from g3mpi.nn import specs
from g3mpi.train.config import MODELS, TrainConfig

SLOW_TESTS = ("test_every_entry_loads_its_builder_and_layer",)   # (imports torch)


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
    with pytest.raises(ValueError, match="model 'gcm': expected one of gcn, sage, gat, appnp, gcn2"):
        specs.spec("gcm")
