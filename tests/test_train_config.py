"""Training configuration: TOML in, CLI overrides, validation, TOML out."""
from __future__ import annotations

import tomllib

import pytest

from g3mpi.train import ConfigError, TrainConfig, config_from, to_toml


def test_toml_overrides_and_round_trip(tmp_path):
    (tmp_path / "run.toml").write_text('model = "gat"\nlr = 1\nheads = 4\nsim-net = "10Gbit,20us"\n')
    cfg = config_from(tmp_path / "run.toml", dict(parts="p", out="o", heads=2, lr=None))
    assert cfg.model == "gat" and cfg.lr == 1.0 and cfg.heads == 2 and cfg.sim_net == "10Gbit,20us"
    (tmp_path / "back.toml").write_text(to_toml(cfg))
    assert config_from(tmp_path / "back.toml") == cfg
    assert tomllib.loads(to_toml(cfg))["heads"] == 2


def test_round_trip_of_paths_with_any_character(tmp_path):
    """A path with a carriage return, tab, quote, backslash or non-ASCII letter comes back from config.toml as it
    was (only \\n was escaped: a \\r made the saved file invalid TOML)."""
    odd = 'runs/a\rb\tc"d\\e\x7fé\x01'
    cfg = config_from(None, dict(parts=odd, out=odd + "2"))
    assert tomllib.loads(to_toml(cfg))["parts"] == odd
    (tmp_path / "back.toml").write_text(to_toml(cfg), encoding="utf-8")
    assert config_from(tmp_path / "back.toml") == cfg


@pytest.mark.parametrize("text,word", [("bogus = 1", "bogus"), ('epochs = "many"', "epochs"),
                                       ("dropout = 1.0", "dropout"), ('model = "mlp"', "model"),
                                       ('schedule = "fast"', "schedule"), ('sim_net = "fast"', "BANDWIDTH"),
                                       ("epochs = 0", "epochs"), ("lr = nan", "lr"), ("verify = 1", "verify"),
                                       ("time_limit = -1", "time_limit"), ("time-limit = nan", "time_limit"),
                                       ("= broken", "TOML"), ("a = " + "[" * 10**5 + "]" * 10**5, "TOML")])
def test_bad_values_are_named(tmp_path, text, word):
    (tmp_path / "bad.toml").write_text(text + "\n")
    with pytest.raises(ConfigError, match=word) as e:
        config_from(tmp_path / "bad.toml")
    assert str(e.value).startswith(str(tmp_path / "bad.toml")), "the message names the file"


@pytest.mark.parametrize("key,value,word", [("seed", 2**64, "seed must be in"), ("seed", -1, "seed must be in"),
                                            ("log_level", "bogus", "log_level"), ("lr", float("inf"), "lr"),
                                            ("threads", 10**9, "threads must be at most 1024 per rank"),
                                            # found by fuzzing TOML configs: 10^20 hidden channels failed in the
                                            # Trainer with a TypeError traceback (torch's sizes overflow), 10^20
                                            # layers built layers until memory ran out
                                            ("hidden", 10**20, "hidden must be at most 1099511627776"),
                                            ("heads", 2**40, "heads must be at most 65536"),
                                            ("layers", 10**20, "layers must be at most 1024"),
                                            ("epochs", 2**63, "epochs must fit in 64 bits"),
                                            ("chunk_rows", -2**64, "chunk_rows must fit in 64 bits")])
def test_bad_overrides_name_the_option(key, value, word):
    with pytest.raises(ConfigError, match=word) as e:
        config_from(None, {key: value})
    assert str(e.value).startswith(f"--{key.replace('_', '-')}: ")


def test_key_given_twice(tmp_path):
    (tmp_path / "twice.toml").write_text("chunk-rows = 1\nchunk_rows = 2\n")
    with pytest.raises(ConfigError, match="chunk_rows is given twice"):
        config_from(tmp_path / "twice.toml")
    assert config_from(None, {"log_level": "debug"}).log_level == "debug"


def test_byte_order_mark(tmp_path):
    (tmp_path / "bom.toml").write_bytes("\ufeffmodel = 'sage'\n".encode("utf-8"))
    assert config_from(tmp_path / "bom.toml").model == "sage"


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        config_from(tmp_path / "nope.toml")


def test_frozen():
    with pytest.raises(Exception):
        TrainConfig().lr = 3


def test_help_names_every_default():
    """g3-train --help says each setting's default (RUNTIME.md lists them: --layers 2, --hidden 16, --lr 0.01, ...);
    it named only those of the on/off settings."""
    import dataclasses

    from g3mpi.cli.train import build_parser

    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    helps = {a.dest: " ".join((a.help or "").split()) for a in build_parser()._actions}
    for name, default in defaults.items():
        if name in ("parts", "out", "init_from"):      # no default to state: paths the user gives
            continue
        if isinstance(default, bool):
            shown = "on" if default else "off"
        else:
            shown = f"{default:g}" if isinstance(default, float) else default if default != "" else "off"
        assert f"default {shown}" in helps[name], (name, helps[name])
    assert "sgd" in helps["momentum"].lower()
